"""Store, dispatch: the executor-facing exchange: worker sessions, heartbeats, attestations,
offers, fenced reports (one or a batch), completion by receipt, log chunks and the answer
ledger, gathered by the Dispatch record. Imports no other store sub-package."""
