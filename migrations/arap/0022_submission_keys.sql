-- requests: a submission's Idempotency-Key (with the hash of its body) and
-- its binding_token's jti become columns of the request row, enforced by
-- two partial unique indexes, instead of rows of arap.idempotency_keys and
-- arap.binding_jtis: a submission writes one row instead of three (and
-- two foreign-key checks fewer), and the request's INSERT is itself the
-- idempotency and replay check (docs/performance.md, "submit").
-- Retention: a key is still reclaimable once its request ended more than
-- the idempotency retention ago (24 h): a submission that finds it so
-- clears it from the old row and takes it (requests.Service.Submit),
-- instead of an hourly purge deleting it. A jti stays on its row: a token
-- is refused as expired before its jti is looked at, so remembering a jti
-- past its token's exp changes no answer.
-- Rollback: none across this migration (no compatible-with line). Older
-- binaries write and read the dropped tables: they refuse to start on this
-- schema, and one still running when it is applied fails every submission
-- (500, nothing written) until it is stopped. Stop the previous version's
-- `arapd serve` replicas before migrating (docs/operations.md).
ALTER TABLE arap.requests
    ADD COLUMN idempotency_key  text,
    ADD COLUMN idempotency_hash bytea,
    ADD COLUMN binding_jti      text,
    ADD CONSTRAINT requests_idempotency_hash CHECK ((idempotency_key IS NULL) = (idempotency_hash IS NULL));

-- Every recorded key and unexpired jti moves to its request, each row
-- written once. Keys are scoped to the client, and a key's client is its
-- request's (create writes both from the caller).
UPDATE arap.requests r
SET idempotency_key = m.key, idempotency_hash = m.body_hash, binding_jti = m.jti
FROM (
    SELECT r.id, k.key, k.body_hash, j.jti
    FROM arap.requests r
    LEFT JOIN arap.idempotency_keys k ON k.request_id = r.id AND k.client_id = r.client_id
    LEFT JOIN arap.binding_jtis j ON j.request_id = r.id
    WHERE k.request_id IS NOT NULL OR j.request_id IS NOT NULL
) m
WHERE r.id = m.id;

CREATE UNIQUE INDEX requests_idempotency_key ON arap.requests (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX requests_binding_jti ON arap.requests (binding_jti) WHERE binding_jti IS NOT NULL;

DROP TABLE arap.idempotency_keys;
DROP TABLE arap.binding_jtis;
