"""The executor side (edge's and a worker host's): the Executor, the ReceiptConsumer, log shipping,
the disk reserve, the evidence an Attest reports, local retention and the journal. On edge the
journal is a table in the edge file; on a cluster worker a SQLite file of its own in its state
directory. It never imports the control side."""
