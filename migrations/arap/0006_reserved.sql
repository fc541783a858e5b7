-- Placeholder so the h/limits-store branch migrates on its own: version 0006
-- belongs to another branch. Drop this file when merging that one.
SELECT 1;
