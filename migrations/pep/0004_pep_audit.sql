-- The enforcement point's own audit trail (mcp/audit.go): what it did with
-- each approval task, in the transaction that did it. One hash chain per task
-- (chain = task id): each event's hash is SHA-256(prev_hash || JCS of every
-- other column), see internal/chain. Events outlive their task (no foreign
-- key): pep.tasks is purged after retention, the trail is not.
CREATE TABLE pep.audit_events (
    chain     text        NOT NULL,
    seq       bigint      NOT NULL CHECK (seq > 0),
    at        timestamptz NOT NULL,
    kind      text        NOT NULL,
    actor     text        NOT NULL,
    data      jsonb       NOT NULL,
    prev_hash bytea,
    hash      bytea       NOT NULL,
    PRIMARY KEY (chain, seq)
);

-- Each chain's head (its last seq and hash), written in the same transaction
-- as the event: a chain whose last events were deleted still links, but no
-- longer reaches its head.
CREATE TABLE pep.audit_heads (
    chain text   PRIMARY KEY,
    seq   bigint NOT NULL CHECK (seq > 0),
    hash  bytea  NOT NULL
);

-- The end of the window this server accepts for the task's current request
-- (bound + --max-window): a later deadline the backend reports while the
-- request is pending moves approval_tasks.deadline up to it, never past it.
-- NULL on rows bound before this column existed: their deadline stays.
ALTER TABLE pep.approval_tasks ADD COLUMN window_end timestamptz;
