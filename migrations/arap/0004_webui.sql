-- webui: approver sign-in sessions (the cookie holds a random id; only its
-- SHA-256 is stored) and failed sign-ins, for lock-out.
CREATE TABLE arap.ui_sessions (
    id_hash    bytea PRIMARY KEY,
    user_name  text NOT NULL REFERENCES arap.users (name) ON DELETE CASCADE,
    csrf       text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ui_sessions_expires ON arap.ui_sessions (expires_at);

CREATE TABLE arap.ui_login_failures (
    user_name text NOT NULL,
    at        timestamptz NOT NULL
);
CREATE INDEX ui_login_failures_user ON arap.ui_login_failures (user_name, at);
