"""The control side: the actors that decide from the database (the Gateway and its session
policy, the Scheduler, Retry, edge and cluster Recovery). It never imports the executor side."""
