-- audit: a stream order for GET /v1/audit. Events are appended by
-- concurrent transactions, which may commit out of id order, so a cursor
-- over ids could pass an event that commits later with a smaller id. Each
-- event records the transaction that wrote it; the stream serves, in
-- (txid, id) order, only events of transactions older than every
-- transaction still in flight (pg_snapshot_xmin): whatever commits later
-- has a larger txid than anything already served.
-- Events written before this migration get txid 0 (no table rewrite): they
-- come first, in id order.
-- Rollback: an added column with a default and an index: older binaries' inserts get their txid from the default.
-- compatible-with: 0017
ALTER TABLE arap.audit_events ADD COLUMN txid xid8 NOT NULL DEFAULT '0';
ALTER TABLE arap.audit_events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
CREATE INDEX audit_events_stream ON arap.audit_events (txid, id);
