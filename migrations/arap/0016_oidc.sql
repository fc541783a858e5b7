-- directory: people who sign in through an OpenID provider. The link from
-- (issuer, subject) to a user is the identity: never an e-mail address or a
-- name, which providers let people change and reuse.
CREATE TABLE arap.user_identities (
    issuer          text NOT NULL,
    subject         text NOT NULL,
    user_name       text NOT NULL REFERENCES arap.users (name) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL,
    last_sign_in_at timestamptz NOT NULL,
    PRIMARY KEY (issuer, subject)
);
CREATE INDEX user_identities_user ON arap.user_identities (user_name);

-- webui: a session opened through a provider keeps the provider's subject
-- (both NULL for a local password sign-in).
ALTER TABLE arap.ui_sessions
    ADD COLUMN oidc_issuer text,
    ADD COLUMN oidc_subject text,
    ADD CONSTRAINT ui_sessions_oidc CHECK ((oidc_issuer IS NULL) = (oidc_subject IS NULL));

-- webui: sign-ins through a provider in progress (state, nonce and PKCE
-- verifier of the authorization request). The browser's flow cookie holds a
-- random id; only its SHA-256 is stored. Each row is used once.
CREATE TABLE arap.ui_oidc_flows (
    id_hash    bytea PRIMARY KEY,
    state      text NOT NULL,
    nonce      text NOT NULL,
    verifier   text NOT NULL,
    next       text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX ui_oidc_flows_expires ON arap.ui_oidc_flows (expires_at);
