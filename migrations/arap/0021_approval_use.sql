-- An approval's use: the first re-evaluation that allowed a call with it
-- (used_at, and used_by, that evaluation's id), marked under the row lock
-- a revocation takes. A used approval is no longer revoked (409
-- approval_already_used): the call it allowed may be running.
-- Rollback: two added nullable columns; an older binary never reads them,
-- and revokes a used approval as it did before.
-- compatible-with: 0020
ALTER TABLE arap.approvals ADD COLUMN used_at timestamptz, ADD COLUMN used_by text;
