-- qlactors schema 5 (issue 9 §1): an attempt whose offer cannot be built or encoded ends
-- `failed` (OFFER_UNENCODABLE) straight from `claimed`, so it never had a callback token.

ALTER TABLE run_attempts DROP CONSTRAINT ck_run_attempts_token_after_claim;

ALTER TABLE run_attempts ADD CONSTRAINT ck_run_attempts_token_after_claim CHECK (status = 'claimed' OR callback_token_hash IS NOT NULL OR status IN ('cancelled', 'lost') OR (status = 'failed' AND error_code = 'OFFER_UNENCODABLE'));
