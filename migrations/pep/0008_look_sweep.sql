-- When the front-end next looks at an approval task (reads its request's
-- status, or reaps an overdue execution claim). Each replica's look sweep
-- takes the due tasks, leasing each for one look, instead of a River
-- tracking job per task. Only tasks waiting (pending) or running (claimed)
-- are swept; the index holds only those, so a task leaves it when it moves
-- on, whatever binary moved it. The live tasks of older binaries are looked
-- at once, at once.
-- Rollback: an added nullable column and a partial index; older binaries
-- never read look_at, and the tracking jobs they enqueue are taken by this
-- version (it brings the task's look forward and finishes the job). Tasks
-- bound by this version have no tracking job, which is all older binaries
-- look at a task through: run deploy/rollback/pep-0008.sql once after
-- rolling back, or those tasks advance on their callbacks alone.
-- compatible-with: 0007
ALTER TABLE pep.approval_tasks ADD COLUMN look_at timestamptz;
CREATE INDEX approval_tasks_look ON pep.approval_tasks (look_at) WHERE phase IN ('pending', 'claimed');
UPDATE pep.approval_tasks SET look_at = now() WHERE phase IN ('pending', 'claimed');
