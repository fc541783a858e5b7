-- notify: a change records its events in the outbox and nothing more; each
-- replica's dispatch enqueues the fan-out of every event not yet dispatched
-- and marks it dispatched in the same transaction. This version inserts
-- dispatched_at NULL; the default marks as dispatched the events written
-- before this migration and those older binaries write, which enqueue
-- their own fan-out (a default with no table rewrite).
-- Rollback: an added column and index; older binaries enqueue a fan-out
-- with each event and never read dispatched_at. Events this version
-- recorded in the last second before a rollback, not yet dispatched, wait
-- until a version with the dispatch runs again.
-- compatible-with: 0017
ALTER TABLE arap.notification_events ADD COLUMN dispatched_at timestamptz DEFAULT '-infinity';
CREATE INDEX notification_events_undispatched ON arap.notification_events (created_at) WHERE dispatched_at IS NULL;
