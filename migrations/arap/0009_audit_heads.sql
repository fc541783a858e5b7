-- audit: each chain's head, its last event's seq and hash, written in the
-- transaction that appends the event. A chain's hashes link each event to
-- the one before, so removing events from the middle breaks a link; removing
-- them from the end does not. The head does: audit.Verify compares each
-- chain's last event with its head, and reports a head without events.
CREATE TABLE arap.audit_heads (
    chain text PRIMARY KEY,
    seq   bigint NOT NULL CHECK (seq > 0),
    hash  bytea NOT NULL
);

-- Chains written before heads existed: their last event as it stands now
-- (an end removed before this migration cannot be told from here on).
INSERT INTO arap.audit_heads (chain, seq, hash)
SELECT DISTINCT ON (chain) chain, seq, hash FROM arap.audit_events ORDER BY chain, seq DESC;
