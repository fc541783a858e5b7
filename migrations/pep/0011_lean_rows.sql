-- Two things a gated call wrote and nothing read (docs/performance.md,
-- "gate"):
-- - approval_tasks_backend: every statement finds an approval task by its
--   task id. Its entry was written at the task's insert and again at each
--   update that is not HOT (the bind, the claim, the end).
-- - the sealed submission body of a settled intent (bound or failed): only
--   open and abandoned intents are submitted, so the move that settles an
--   intent drops its body (pep.intentMove). The bind no longer writes the
--   body a second time (about 1 KB of WAL a gated call), and a tool's
--   arguments are kept, sealed, in one place fewer.
-- Rollback: an older binary never reads the body of a settled intent and
-- finds none of its rows by backend id; its `keys reseal --check` counts an
-- emptied body as a stale value, so retire previous master keys once
-- upgraded again.
-- compatible-with: 0007
DROP INDEX pep.approval_tasks_backend;
ALTER TABLE pep.intents ALTER COLUMN body_sealed DROP NOT NULL;
