-- Run once when rolling arapd mcp back to a version without
-- migrations/pep/0008 (the look sweep), after the newer replicas have
-- stopped: those versions look at an approval task only through its River
-- tracking job, which the newer version does not enqueue. This gives every
-- task that waits or runs one, due now (a task that has one keeps it).
-- docs/operations.md, "Upgrades and rollback"; pep.TestRollbackSQL runs it.
INSERT INTO pep_river.river_job (kind, args, queue, max_attempts, state, scheduled_at)
SELECT 'pep.track', jsonb_build_object('task_id', a.task_id), 'pep', 1000, 'available', now()
FROM pep.approval_tasks a
WHERE a.phase IN ('pending', 'claimed')
  AND NOT EXISTS (SELECT 1 FROM pep_river.river_job j
                  WHERE j.kind = 'pep.track' AND j.args->>'task_id' = a.task_id
                    AND j.state NOT IN ('completed', 'cancelled', 'discarded'));
