-- Async providers: profiles, polling, webhooks, cancel.

ALTER TABLE operations
    -- The profile the operation was created under and the poll URL the provider gave: polls use
    -- them as stored, never derived again from the current configuration.
    ADD COLUMN profile_id          text,
    ADD COLUMN poll_url            text,
    ADD COLUMN poll_deadline_at    timestamptz,
    ADD COLUMN polls               integer NOT NULL DEFAULT 0,
    ADD COLUMN provider_status     text,           -- canonical: queued, running, succeeded, …
    ADD COLUMN outputs             jsonb,          -- [{"url":…, "expires_at":…}]
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancel_sent_at      timestamptz;

CREATE INDEX operations_accepted_due ON operations (next_attempt_at) WHERE state = 'accepted';
CREATE INDEX operations_remote ON operations (provider, remote_id) WHERE remote_id IS NOT NULL;

-- Webhook deliveries already seen, kept at least as long as the provider redelivers.
CREATE TABLE webhook_events (
    provider     text NOT NULL,
    event_id     text NOT NULL,
    remote_id    text,
    received_at  timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (provider, event_id)
);

-- Webhooks for a task whose create has not committed its remote id yet. Applied (a poll is
-- scheduled at once) when the link appears.
CREATE TABLE webhook_parked (
    provider     text NOT NULL,
    remote_id    text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, remote_id)
);

-- When a create commits a remote id, a parked webhook for it becomes an immediate poll.
CREATE FUNCTION idemgate_unpark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.remote_id IS NOT NULL AND NEW.state = 'accepted'
       AND (OLD.remote_id IS DISTINCT FROM NEW.remote_id OR OLD.state IS DISTINCT FROM NEW.state)
    THEN
        DELETE FROM webhook_parked WHERE provider = NEW.provider AND remote_id = NEW.remote_id;
        IF FOUND THEN
            NEW.next_attempt_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER operations_unpark
    BEFORE UPDATE OF state, remote_id ON operations
    FOR EACH ROW EXECUTE FUNCTION idemgate_unpark();
