-- Reminders and escalation (requests/remind.go). Each is scheduled on the
-- request when it is submitted, from the rule's approval policy, and moved
-- by one conditional UPDATE of the sweep that acts on it, so however many
-- replicas sweep, a reminder is recorded once per interval and an
-- escalation once.
ALTER TABLE arap.requests
    -- when the next reminder is due; NULL when the rule sends none
    ADD COLUMN next_reminder_at timestamptz,
    -- when the escalation group becomes eligible; NULL when the rule has none
    ADD COLUMN escalate_at      timestamptz,
    -- when it did (set once, by the sweep, with the escalated event)
    ADD COLUMN escalated_at     timestamptz;

CREATE INDEX requests_reminder_due ON arap.requests (next_reminder_at) WHERE status = 'pending' AND next_reminder_at IS NOT NULL;
CREATE INDEX requests_escalation_due ON arap.requests (escalate_at) WHERE status = 'pending' AND escalated_at IS NULL AND escalate_at IS NOT NULL;

ALTER TABLE arap.notification_events DROP CONSTRAINT notification_events_kind_check,
    ADD CONSTRAINT notification_events_kind_check CHECK (kind IN ('created', 'decided', 'ended', 'reminder', 'escalated'));
