-- Decisions record the channel they came through (web, api, on_behalf) and,
-- for a client deciding on a person's behalf, that client: the vote itself
-- is the person's (voter = 'user:<name>', voter_kind = 'human').
ALTER TABLE arap.votes
    ADD COLUMN channel         text,
    ADD COLUMN via_client_id   text,
    ADD COLUMN via_client_name text,
    ADD COLUMN via_client_kind text,
    ADD CONSTRAINT votes_via_whole CHECK (
        (via_client_id IS NULL) = (via_client_name IS NULL) AND (via_client_id IS NULL) = (via_client_kind IS NULL));

-- Votes from before: people decided in the web UI, clients as themselves,
-- resolvers (the rule itself) through no channel.
UPDATE arap.votes SET channel = CASE
    WHEN voter LIKE 'user:%' THEN 'web'
    WHEN voter LIKE 'client:%' THEN 'api'
END;
