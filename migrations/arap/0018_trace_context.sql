-- The W3C traceparent of the submission that created a request (the ARAP
-- submit carries one when the requester traces its calls), so that its
-- decision, made later in the web UI or through the decision API, links to
-- the requester's trace. NULL when the submission was not traced.
-- Rollback: an added nullable column: older binaries never read it, and their inserts leave it NULL.
-- compatible-with: 0017
ALTER TABLE arap.requests ADD COLUMN trace_parent text;
