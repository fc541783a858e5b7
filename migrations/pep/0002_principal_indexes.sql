-- The per-caller limits (mcp.Gate.limited) count a principal's recent and
-- live approval tasks on every gated call; without these indexes each count
-- read the whole table (arapbench: the gate slowed as tasks accumulated).
CREATE INDEX approval_tasks_principal_recent ON pep.approval_tasks (principal, created_at);
CREATE INDEX approval_tasks_principal_live ON pep.approval_tasks (principal) WHERE phase <> 'done';
