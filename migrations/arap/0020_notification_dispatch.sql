-- notify: a change records its events in the outbox and nothing more; a
-- periodic dispatch enqueues the fan-out of each event not yet dispatched
-- and marks it dispatched in the same transaction. Events written before
-- this migration were enqueued with their change: they count as dispatched.
-- Rollback: an added column and index; older binaries enqueue a fan-out
-- with each event and never read dispatched_at. Events this version
-- recorded in the last second before a rollback, not yet dispatched, wait
-- until a version with the dispatch runs again.
-- compatible-with: 0017
ALTER TABLE arap.notification_events ADD COLUMN dispatched_at timestamptz;
UPDATE arap.notification_events SET dispatched_at = created_at;
CREATE INDEX notification_events_undispatched ON arap.notification_events (created_at) WHERE dispatched_at IS NULL;
