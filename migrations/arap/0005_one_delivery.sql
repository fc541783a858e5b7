-- one delivery per (request, event), as 0003 meant: a request ends once, so
-- its callback is enqueued once, whichever path ended it.
DROP INDEX arap.deliveries_request;
CREATE UNIQUE INDEX deliveries_request_event ON arap.deliveries (request_id, event);
