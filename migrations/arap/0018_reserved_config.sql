-- Placeholder on branch obs only: versions must be contiguous, and this
-- number is assigned to another helper of issue 21 (config). At the merge,
-- replace it with theirs.
SELECT 1;
