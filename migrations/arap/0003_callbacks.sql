-- clients: where each client may ask to be called back, and which internal
-- networks (loopback, private, link-local) those callbacks may reach.
ALTER TABLE arap.api_clients
    ADD COLUMN callback_prefixes text[] NOT NULL DEFAULT '{}',
    ADD COLUMN callback_networks text[] NOT NULL DEFAULT '{}';

-- requests: the callback a submission registered.
ALTER TABLE arap.requests ADD COLUMN callback jsonb;

-- callbacks: per-client webhook secrets (sealed with the master key). Two
-- live at once during a rotation; both sign.
CREATE TABLE arap.webhook_secrets (
    id         text PRIMARY KEY,
    client_id  text NOT NULL REFERENCES arap.api_clients (id),
    sealed     bytea NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz
);
CREATE INDEX webhook_secrets_client ON arap.webhook_secrets (client_id);

-- callbacks: one delivery per (request, terminal event); its id is the
-- webhook-id, stable across retries. body is kept byte for byte.
CREATE TABLE arap.deliveries (
    id              text PRIMARY KEY,
    request_id      text NOT NULL REFERENCES arap.requests (id) ON DELETE CASCADE,
    client_id       text NOT NULL,
    endpoint        text NOT NULL,
    event           text NOT NULL,
    body            text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'delivered', 'failed', 'gone')),
    attempts        int NOT NULL DEFAULT 0,
    last_status     int,
    last_error      text,
    next_attempt_at timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL
);
CREATE INDEX deliveries_request ON arap.deliveries (request_id);
CREATE INDEX deliveries_pending_endpoint ON arap.deliveries (client_id, endpoint) WHERE status = 'pending';

CREATE TABLE arap.delivery_attempts (
    id          bigserial PRIMARY KEY,
    delivery_id text NOT NULL REFERENCES arap.deliveries (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    status_code int,
    latency_ms  double precision NOT NULL,
    error       text
);
CREATE INDEX delivery_attempts_delivery ON arap.delivery_attempts (delivery_id, at);
