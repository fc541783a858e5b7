-- Rate-limit counters (internal/ratelimit) of the backend and the web UI:
-- one row per limiter key per fixed window, shared by every replica, so a
-- limit holds across replicas and restarts. A replica takes units (one, or a
-- batch for large limits) with one INSERT ... ON CONFLICT DO UPDATE that adds
-- to n only up to the limit; granted is what that statement took.
--
-- UNLOGGED: the evaluation path takes a unit on every request, and a counter
-- is not worth a WAL flush each time. The table survives a clean restart of
-- PostgreSQL; a crash (or a fail-over to a standby) empties it, which gives
-- every key a fresh window once. fillfactor leaves room for HOT updates of n.
CREATE UNLOGGED TABLE arap.rate_counters (
    key        text        NOT NULL,
    window_end timestamptz NOT NULL,
    n          integer     NOT NULL CHECK (n > 0),
    granted    integer     NOT NULL,
    PRIMARY KEY (key, window_end)
) WITH (fillfactor = 50);
