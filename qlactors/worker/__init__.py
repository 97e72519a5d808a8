"""Everything executor-local: the journal, local receipts, the state directory, the evidence
probes that become `Attest` facts, log shipping's file half and the file half of retention.

On edge the journal is a table in the edge file; on a cluster worker it is a SQLite file of its
own in the worker's state directory. Nothing here talks to the control side.
"""
