-- A task waiting for in-task input (phase input) is looked at too: asking
-- for input sets its deadline (the requestable denial's expiry, within the
-- window) and its look to that deadline, in the transition's own UPDATE,
-- and the look ends it (denied-not-executed, expired) if no answer came.
-- Before, nothing looked at it, so an unanswered question waited for ever.
-- The input tasks already waiting get a deadline ten minutes (the default
-- denial lifetime) after they started to wait, and a look at once.
-- Rollback: the index is wider; older binaries never look at input tasks
-- (and leave them waiting, as they did).
-- compatible-with: 0011
DROP INDEX pep.approval_tasks_look;
CREATE INDEX approval_tasks_look ON pep.approval_tasks (look_at) WHERE phase IN ('pending', 'claimed', 'input');
UPDATE pep.approval_tasks SET deadline = least(coalesce(window_end, 'infinity'), updated_at + interval '10 minutes'), look_at = now()
	WHERE phase = 'input';
