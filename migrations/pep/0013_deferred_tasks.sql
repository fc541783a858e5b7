-- Approval as ordinary tools (--approval-tools), for clients that do not
-- drive tasks: their approval task is deferred, run not when approved but
-- when the caller makes the same call again, and approved_until is the
-- approval its generation holds while it waits for that call (NULL until
-- then, and again when a new request is opened).
-- Rollback: two added columns; an older binary ignores them and runs a
-- deferred task's call as soon as it is approved, as for a tasks client:
-- the call runs once, without waiting for the caller's repeat.
-- compatible-with: 0012
ALTER TABLE pep.approval_tasks ADD COLUMN deferred boolean NOT NULL DEFAULT false, ADD COLUMN approved_until timestamptz;
