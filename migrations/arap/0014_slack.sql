-- Slack (package slackapp, through notify). A delivery remembers the message
-- it posted (for Slack: "<channel> <ts>"), so that later events about the
-- same request update that message instead of posting another.
ALTER TABLE arap.notification_deliveries ADD COLUMN ref text;

-- Signatures of accepted Slack interactivity requests, so that a replay of
-- one inside the timestamp tolerance is refused. Rows older than the
-- tolerance are useless (the timestamp check refuses those) and are purged.
CREATE TABLE arap.slack_signatures (
    signature text PRIMARY KEY,
    seen_at   timestamptz NOT NULL
);
CREATE INDEX slack_signatures_seen ON arap.slack_signatures (seen_at);
