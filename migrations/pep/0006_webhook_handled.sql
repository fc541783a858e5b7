-- A callback whose handling succeeded is remembered as handled, so that a
-- copy of it (the sender died before recording the delivery, and retries
-- under the same webhook-id) is answered 200 instead of 409 "being handled":
-- otherwise the sender keeps the delivery pending and retries for as long
-- as the claim lasts.
ALTER TABLE pep.webhook_ids ADD COLUMN handled boolean NOT NULL DEFAULT false;
