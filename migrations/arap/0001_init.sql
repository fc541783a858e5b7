-- The backend's schema. Each table is owned by one Go package (named in the
-- comment); other packages use that package's API, not these tables.

-- clients: API clients (PEPs, resolvers, ITSM systems) and their tokens.
CREATE TABLE arap.api_clients (
    id            text PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    token_hash    bytea NOT NULL UNIQUE,
    scopes        text[] NOT NULL,
    resolver_kind text NOT NULL CHECK (resolver_kind IN ('human', 'automation', 'agent', 'itsm')),
    -- Actor ids (glob patterns) this client may assert in client.actor or
    -- subject.properties.act; empty means none.
    actors        text[] NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);

-- signing: ES256 keys for binding_token and approval.state.
CREATE TABLE arap.signing_keys (
    kid         text PRIMARY KEY,
    alg         text NOT NULL,
    -- PKCS#8 private key sealed with AES-256-GCM under the master key, AAD = kid.
    private_key bytea NOT NULL,
    public_jwk  jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    retired_at  timestamptz,   -- stops signing
    expires_at  timestamptz    -- stops verifying; set at retirement
);

-- audit: hash-chained events, one chain per request plus a "system" chain.
CREATE TABLE arap.audit_events (
    id        bigserial PRIMARY KEY,
    chain     text NOT NULL,
    seq       bigint NOT NULL,
    at        timestamptz NOT NULL,
    kind      text NOT NULL,
    actor     text NOT NULL,
    data      jsonb NOT NULL,
    prev_hash bytea,
    hash      bytea NOT NULL,
    UNIQUE (chain, seq)
);

-- requests: access requests and their lifecycle.
CREATE TABLE arap.requests (
    id                      text PRIMARY KEY,
    client_id               text NOT NULL REFERENCES arap.api_clients (id),
    status                  text NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired', 'cancelled', 'failed')),
    status_reason           text,
    rule                    text NOT NULL,
    subject                 jsonb NOT NULL,
    resource                jsonb NOT NULL,
    action                  jsonb NOT NULL,
    context                 jsonb,
    requested_access        jsonb,
    client_info             jsonb,
    denial                  jsonb NOT NULL,
    evaluation_id           text NOT NULL,
    binding_hash            text NOT NULL,
    binding_context_members text[] NOT NULL,
    display                 jsonb,
    expires_at              timestamptz NOT NULL,
    created_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL,
    terminal_at             timestamptz,
    result                  jsonb,
    CHECK ((status = 'pending') = (terminal_at IS NULL))
);
CREATE INDEX requests_pending_expiry ON arap.requests (expires_at) WHERE status = 'pending';
CREATE INDEX requests_client_created ON arap.requests (client_id, created_at DESC);
CREATE INDEX requests_terminal_at ON arap.requests (terminal_at) WHERE terminal_at IS NOT NULL;

-- Idempotency keys, scoped to the client. The foreign key is deferred so the
-- key row can be written first: it is the lock that serializes duplicates.
CREATE TABLE arap.idempotency_keys (
    client_id  text NOT NULL REFERENCES arap.api_clients (id),
    key        text NOT NULL,
    body_hash  bytea NOT NULL,
    request_id text NOT NULL REFERENCES arap.requests (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (client_id, key)
);

-- binding_token jti values seen, kept until the token expires.
CREATE TABLE arap.binding_jtis (
    jti        text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    request_id text NOT NULL
);
CREATE INDEX binding_jtis_expires ON arap.binding_jtis (expires_at);
