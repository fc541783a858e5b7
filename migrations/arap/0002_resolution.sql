-- directory: people who approve (and request) and the groups they are in.
CREATE TABLE arap.users (
    name          text PRIMARY KEY,
    display_name  text NOT NULL,
    email         text,
    password_hash bytea,
    created_at    timestamptz NOT NULL,
    disabled_at   timestamptz
);
CREATE TABLE arap.groups (
    name       text PRIMARY KEY,
    created_at timestamptz NOT NULL
);
CREATE TABLE arap.group_members (
    group_name text NOT NULL REFERENCES arap.groups (name) ON DELETE CASCADE,
    user_name  text NOT NULL REFERENCES arap.users (name) ON DELETE CASCADE,
    PRIMARY KEY (group_name, user_name)
);

-- attributes: deployment-wide facts the policy reads (risk levels, freezes).
CREATE TABLE arap.attributes (
    key        text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);

-- requests: the approval policy in force when the request was submitted, so
-- an edit to the policy file never changes the quorum of a pending request.
ALTER TABLE arap.requests ADD COLUMN approval_policy jsonb NOT NULL DEFAULT '{}';

-- One vote per approver per request.
CREATE TABLE arap.votes (
    request_id     text NOT NULL REFERENCES arap.requests (id) ON DELETE CASCADE,
    voter          text NOT NULL,
    voter_kind     text NOT NULL,
    decision       text NOT NULL CHECK (decision IN ('approve', 'deny')),
    reason         text NOT NULL DEFAULT '',
    approved_until timestamptz,
    at             timestamptz NOT NULL,
    PRIMARY KEY (request_id, voter)
);

-- Approvals issued when a request is approved; the PDP checks their current
-- status at every re-evaluation.
CREATE TABLE arap.approvals (
    id                      text PRIMARY KEY,
    request_id              text NOT NULL UNIQUE REFERENCES arap.requests (id) ON DELETE CASCADE,
    client_id               text NOT NULL,
    rule                    text NOT NULL,
    binding_hash            text NOT NULL,
    binding_context_members text[] NOT NULL,
    status                  text NOT NULL CHECK (status IN ('active', 'revoked', 'superseded')),
    approved_at             timestamptz NOT NULL,
    approved_until          timestamptz NOT NULL,
    grant_ready_at          timestamptz NOT NULL,
    revoked_at              timestamptz,
    revoked_by              text,
    revoke_reason           text
);
CREATE INDEX approvals_binding ON arap.approvals (client_id, binding_hash) WHERE status = 'active';
CREATE INDEX requests_status_created ON arap.requests (status, created_at DESC);
