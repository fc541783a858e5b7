-- Notifications (package notify): an outbox of events for people, written in
-- the transaction of the request's state change, and one delivery per
-- (event, recipient, channel), so that replicas and retries tell each person
-- once per event and channel.
CREATE TABLE arap.notification_events (
    id          text PRIMARY KEY,
    request_id  text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('created', 'decided', 'ended')),
    voter       text NOT NULL DEFAULT '',
    decision    text NOT NULL DEFAULT '',
    status      text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    -- set once the deliveries were fanned out (recipients resolved)
    fanned_out_at timestamptz
);
CREATE INDEX notification_events_request ON arap.notification_events (request_id);

CREATE TABLE arap.notification_deliveries (
    event_id    text NOT NULL REFERENCES arap.notification_events (id) ON DELETE CASCADE,
    recipient   text NOT NULL,  -- a directory user name
    channel     text NOT NULL,
    address     text NOT NULL,
    role        text NOT NULL CHECK (role IN ('decider', 'requester')),
    status      text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts    int NOT NULL DEFAULT 0,
    last_error  text,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    sent_at     timestamptz,
    PRIMARY KEY (event_id, recipient, channel)
);
