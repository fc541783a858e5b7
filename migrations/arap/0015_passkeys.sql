-- Passkeys (package passkeys): the WebAuthn credentials approvers register
-- in the web UI, with which they sign decisions on rules that require it.
-- Registration and removal are also audit events in the system chain, with
-- the public key, so the audit log alone carries what verifying a signed
-- decision needs.
CREATE TABLE arap.passkeys (
    credential_id   bytea PRIMARY KEY,
    user_name       text NOT NULL,
    public_key      bytea NOT NULL,    -- COSE_Key
    sign_count      bigint NOT NULL DEFAULT 0,
    aaguid          bytea,
    backup_eligible boolean NOT NULL DEFAULT false,
    name            text NOT NULL,
    created_at      timestamptz NOT NULL,
    last_used_at    timestamptz
);
CREATE INDEX passkeys_user ON arap.passkeys (user_name);

-- Ceremonies in progress: a registration (its go-webauthn session data) or
-- a signed decision (the request, the decision and the approval window the
-- server fixed). Short-lived, single use (taken with DELETE ... RETURNING),
-- bound to the web UI session that began it.
CREATE TABLE arap.passkey_ceremonies (
    id             text PRIMARY KEY,
    session_hash   bytea NOT NULL,
    user_name      text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('register', 'decide')),
    request_id     text,
    decision       text,
    approved_until timestamptz,
    session_data   jsonb,
    expires_at     timestamptz NOT NULL
);
CREATE INDEX passkey_ceremonies_expires ON arap.passkey_ceremonies (expires_at);
