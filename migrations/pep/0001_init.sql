-- The MCP front-end (the PEP). It shares no table with the backend: it talks
-- to it over HTTP, as a separate party would.

-- mcp (callers): MCP bearer tokens and the principal each one stands for.
CREATE TABLE pep.callers (
    token_hash   bytea PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    subject_type text NOT NULL,
    subject_id   text NOT NULL,
    actor_id     text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);

-- tasks: MCP tasks (SEP-2663), generic part. status is the wire status;
-- everything a tasks/get returns is here.
CREATE TABLE pep.tasks (
    id               text PRIMARY KEY,
    principal        text NOT NULL,
    kind             text NOT NULL,
    status           text NOT NULL CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
    status_message   text NOT NULL DEFAULT '',
    input_requests   jsonb,
    answered_keys    text[] NOT NULL DEFAULT '{}',
    result           jsonb,
    error            jsonb,
    meta             jsonb,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    ttl_ms           bigint,
    poll_interval_ms int NOT NULL,
    terminal_at      timestamptz
);
CREATE INDEX tasks_principal ON pep.tasks (principal, created_at DESC);

-- mcp (approval tasks): the three kinds of state SEP-2848 asks for.
CREATE TABLE pep.approval_tasks (
    task_id        text PRIMARY KEY REFERENCES pep.tasks (id) ON DELETE CASCADE,
    -- Immutable call binding: tool, full arguments (sealed, AAD = task id),
    -- their JCS SHA-256 digest, and the originating principal.
    tool           text NOT NULL,
    args_sealed    bytea NOT NULL,
    args_digest    text NOT NULL,
    principal      text NOT NULL,
    dedup_key      text NOT NULL,
    -- Mutable approval-workflow state.
    phase          text NOT NULL CHECK (phase IN ('submitting', 'pending', 'input', 'claimed', 'done')),
    generation     int NOT NULL,
    backend_id     text,
    status_url     text,
    cancel_url     text,
    deadline       timestamptz,
    chained        int NOT NULL DEFAULT 0,
    -- While phase = 'input': the schema the outstanding answers must meet.
    input_schema   jsonb,
    -- Mutable execution state.
    claimed_at     timestamptz,
    exec_deadline  timestamptz,
    disposition    text,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);
-- Deduplication: one live approval task per principal, tool and arguments.
CREATE UNIQUE INDEX approval_tasks_dedup ON pep.approval_tasks (dedup_key) WHERE phase <> 'done';
CREATE INDEX approval_tasks_backend ON pep.approval_tasks (backend_id);
CREATE INDEX approval_tasks_claimed ON pep.approval_tasks (exec_deadline) WHERE phase = 'claimed';

-- Submission intents: written (and committed) before the backend is
-- contacted, under a fresh key, with the exact body (sealed, AAD = key).
CREATE TABLE pep.intents (
    key         text PRIMARY KEY,
    task_id     text NOT NULL REFERENCES pep.tasks (id) ON DELETE CASCADE,
    generation  int NOT NULL,
    submit_url  text NOT NULL,
    body_sealed bytea NOT NULL,
    -- intent: written, maybe submitted; bound: handle persisted; abandoned: the
    -- task ended before binding, so a request made under the key must be
    -- found (by resubmitting it: the key replays) and cancelled; failed: the
    -- backend refused it, nothing exists.
    state       text NOT NULL CHECK (state IN ('intent', 'bound', 'abandoned', 'failed')),
    backend_id  text,
    status_url  text,
    cancel_url  text,
    deadline    timestamptz,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (task_id, generation)
);
CREATE INDEX intents_open ON pep.intents (updated_at) WHERE state IN ('intent', 'abandoned');

-- Single-use MRTR requestState values (their nonce), until they expire.
CREATE TABLE pep.used_states (
    nonce      text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

-- The demo tools' side effects, so tests can count executions.
CREATE TABLE pep.ledger (
    id        bigserial PRIMARY KEY,
    task_id   text,
    tool      text NOT NULL,
    principal text NOT NULL,
    effect    jsonb NOT NULL,
    at        timestamptz NOT NULL
);
CREATE INDEX ledger_task ON pep.ledger (task_id);
