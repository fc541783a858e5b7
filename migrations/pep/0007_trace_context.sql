-- The W3C traceparent of the tools/call that opened an approval task, so
-- that the work done for it later (the callback, the re-evaluation, the
-- execution; perhaps in another process, after a restart) links to that
-- call's trace. NULL when the call was not traced, or for tasks opened
-- before this was recorded.
-- Rollback: an added nullable column: older binaries never read it, and their inserts leave it NULL.
-- compatible-with: 0006
ALTER TABLE pep.approval_tasks ADD COLUMN trace_parent text;
