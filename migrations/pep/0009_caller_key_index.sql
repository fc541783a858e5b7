-- The live callers by principal key (pep.Principal.Key, callerKey in SQL):
-- the execution claim checks in its own statement that the task's caller
-- still has a live token, and that check read every caller (0.4 ms a claim
-- with 2,000 callers, docs/performance.md "approve-to-complete").
-- Rollback: an added index; older binaries' statements use it as well.
-- compatible-with: 0007
CREATE INDEX callers_live_key ON pep.callers ((subject_type || ':' || subject_id || '|' || actor_id)) WHERE revoked_at IS NULL;
