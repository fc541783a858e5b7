-- Webhook targets (package callbacks): named outgoing webhooks, such as an
-- ITSM system's, that rules name in notify.webhooks. Each belongs to an API
-- client, whose callback allow-list (prefixes, networks) the URL must pass
-- and whose webhook secrets sign what is sent, as for callbacks.
CREATE TABLE arap.webhook_targets (
    name       text PRIMARY KEY,
    client_id  text NOT NULL REFERENCES arap.api_clients (id),
    url        text NOT NULL,
    created_at timestamptz NOT NULL,
    created_by text NOT NULL
);

-- A delivery to a webhook target has the target's name as its recipient.
ALTER TABLE arap.notification_deliveries DROP CONSTRAINT notification_deliveries_role_check,
    ADD CONSTRAINT notification_deliveries_role_check CHECK (role IN ('decider', 'requester', 'webhook'));
