-- The approved call's delegation chain (authzen.ActorHash), bound beside
-- binding_hash, which leaves subject.properties.act out. Approvals issued
-- before this have none ('') and no longer cover any call: re-evaluation
-- answers out_of_scope and the PEP asks again.
ALTER TABLE arap.approvals ADD COLUMN actor_hash text NOT NULL DEFAULT '';
DROP INDEX arap.approvals_binding;
CREATE INDEX approvals_binding ON arap.approvals (client_id, binding_hash, actor_hash) WHERE status = 'active';
