"""Store, admin: the operator's view and records of the cluster: worker keys, a worker's
retirement, the workers read model, control replicas, the HTTP API's tokens. May import
store.dispatch."""
