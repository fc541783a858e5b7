-- webui: failed sign-ins slow the client that made them instead of locking
-- the account (see webui/throttle.go). The old per-account failure log goes.
DROP TABLE arap.ui_login_failures;

-- Attempts per (account, client), where client is a browser known for the
-- account ("device:...") or else an address ("addr:...", IPv6 by /64).
-- attempts counts since the client's last success; blocked_until is when the
-- next attempt may be made.
CREATE TABLE arap.ui_login_clients (
    user_name     text NOT NULL,
    client        text NOT NULL,
    attempts      integer NOT NULL,
    last_at       timestamptz NOT NULL,
    blocked_until timestamptz NOT NULL,
    PRIMARY KEY (user_name, client)
);
CREATE INDEX ui_login_clients_last ON arap.ui_login_clients (last_at);

-- Each account's budget of password checks for browsers not known for it,
-- as a generic cell rate: tat is the budget's theoretical arrival time.
CREATE TABLE arap.ui_login_accounts (
    user_name text PRIMARY KEY,
    tat       timestamptz NOT NULL
);

-- Browsers that have signed in as an account: the arap_device cookie holds a
-- random id; only its SHA-256 is stored.
CREATE TABLE arap.ui_devices (
    id_hash    bytea NOT NULL,
    user_name  text NOT NULL REFERENCES arap.users (name) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (id_hash, user_name)
);
CREATE INDEX ui_devices_expires ON arap.ui_devices (expires_at);
