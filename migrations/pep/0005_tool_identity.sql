-- The identity of the tool a task's call was approved for (pep.Tool.Digest,
-- over its whole definition, and which upstream and upstream tool it is),
-- recorded when the task opens. At the claim the current definition must
-- have the same digest, or the task ends without running: an approval never
-- carries over to a changed tool. NULL on tasks opened before this
-- migration (their arguments are still checked against the current schema).
ALTER TABLE pep.approval_tasks
    ADD COLUMN tool_digest   text,
    ADD COLUMN upstream      text,
    ADD COLUMN upstream_tool text;
