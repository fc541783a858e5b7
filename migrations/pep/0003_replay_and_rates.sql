-- The MCP front-end's rate-limit counters (internal/ratelimit; see
-- arap/0007 for why the table is UNLOGGED).
CREATE UNLOGGED TABLE pep.rate_counters (
    key        text        NOT NULL,
    window_end timestamptz NOT NULL,
    n          integer     NOT NULL CHECK (n > 0),
    granted    integer     NOT NULL,
    PRIMARY KEY (key, window_end)
) WITH (fillfactor = 50);

-- Webhook ids of the backend's callbacks claimed by any replica (the replay
-- memory of callbacks.Verifier, mcp.WebhookIDs): an id is claimed with one
-- INSERT before its handler runs, so of two simultaneous copies only one gets
-- through; released again if the handling failed. Logged: a replay must stay
-- refused across a crash. Rows past expires_at are purged.
CREATE TABLE pep.webhook_ids (
    id         text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
