-- qlactors schema 9 (issue 17, SEMANTICS.md §10): evidence is bound to a lease generation. The
-- generation the recorded fact speaks of (recovery trusts only the attempt's current one; a new
-- lease or an activation clears the fact), who said it (`qlactors confirm-stopped RUN`: the
-- operator's name), and the operator's fact `confirmed_stopped`. Facts recorded before this
-- schema carry no generation, so recovery no longer trusts them: such an attempt waits (shown by
-- `status`) for its worker's next attestation or an operator, never ends on a stale fact.

ALTER TABLE run_attempts ADD COLUMN evidence_lease_generation INTEGER CONSTRAINT ck_run_attempts_evidence_lease_generation_positive CHECK (evidence_lease_generation IS NULL OR evidence_lease_generation >= 1);

ALTER TABLE run_attempts ADD COLUMN evidence_by VARCHAR(128);

ALTER TABLE run_attempts DROP CONSTRAINT ck_run_attempts_evidence;

ALTER TABLE run_attempts ADD CONSTRAINT ck_run_attempts_evidence CHECK (evidence IS NULL OR evidence IN ('stopped', 'ended', 'ended_with_receipt', 'never_launched', 'launch_unknown', 'rebooted', 'retired', 'confirmed_stopped'));
