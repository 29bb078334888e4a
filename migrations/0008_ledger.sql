-- Cost ledger, tenant budgets and retention (issue 13, sections 2–4).

ALTER TABLE operations
    -- The currency of the provider's price table (NULL: the provider has none), the estimate
    -- reserved at intake and the cost settled when the operation ended (completed: what the
    -- provider charges for what it delivered; failed: 0), integer micro-units of the currency.
    ADD COLUMN currency         text,
    ADD COLUMN reserved_micros  bigint NOT NULL DEFAULT 0,
    ADD COLUMN cost_micros      bigint,
    -- Counted in its tenant's tenant_budgets row (in flight, and its reservation) until it ends.
    ADD COLUMN budgeted         boolean NOT NULL DEFAULT false;

-- GET /v1/usage reads a tenant's completed operations by when they finished.
CREATE INDEX operations_spend ON operations (tenant_id, finished_at) WHERE state = 'completed';

-- A tenant's limits and what counts against them. Intake locks this row (one tenant's intakes
-- queue behind each other, never another tenant's), reserves the estimate and counts the
-- operation in flight in the same commit as the intent; the trigger below settles or releases
-- the reservation when the operation ends. Amounts count against the period (UTC day, UTC month)
-- the operation was recorded in; a period that has passed starts again at 0.
CREATE TABLE tenant_budgets (
    tenant_id           bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    currency            text NOT NULL,
    day_limit_micros    bigint CHECK (day_limit_micros >= 0),
    month_limit_micros  bigint CHECK (month_limit_micros >= 0),
    max_inflight        integer CHECK (max_inflight >= 0),
    day                 date NOT NULL,
    day_micros          bigint NOT NULL DEFAULT 0,
    month               date NOT NULL,
    month_micros        bigint NOT NULL DEFAULT 0,
    inflight            integer NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- An operation that ends: its cost is settled (completed: the cost computed from the recorded
-- usage and outputs, or the reservation when none was computed — an operator's "found";
-- failed: 0), and a budgeted one leaves its tenant's in-flight count, the difference between
-- its reservation and its cost going back to the periods it was recorded in. Every statement
-- that ends an operation goes through here, whichever file it is in.
CREATE FUNCTION idemgate_settle() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d date := (NEW.created_at AT TIME ZONE 'UTC')::date;
    delta bigint;
BEGIN
    NEW.cost_micros := CASE WHEN NEW.state = 'completed'
                            THEN coalesce(NEW.cost_micros, NEW.reserved_micros) ELSE 0 END;
    IF NEW.budgeted THEN
        delta := NEW.cost_micros - NEW.reserved_micros;
        UPDATE tenant_budgets b SET
            inflight = greatest(b.inflight - 1, 0),
            day_micros = CASE WHEN b.day = d AND b.currency = NEW.currency
                              THEN greatest(b.day_micros + delta, 0) ELSE b.day_micros END,
            month_micros = CASE WHEN b.month = date_trunc('month', d)::date
                                 AND b.currency = NEW.currency
                                THEN greatest(b.month_micros + delta, 0) ELSE b.month_micros END,
            updated_at = now()
        WHERE b.tenant_id = NEW.tenant_id;
        NEW.budgeted := false;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER operations_settle
    BEFORE UPDATE OF state ON operations
    FOR EACH ROW
    WHEN (OLD.state NOT IN ('completed', 'failed') AND NEW.state IN ('completed', 'failed'))
    EXECUTE FUNCTION idemgate_settle();

-- Retention: the janitor deletes terminal operations past expires_at. Parked webhook hints are
-- deleted by age (they have no expiry of their own).
CREATE INDEX webhook_parked_age ON webhook_parked (received_at);
CREATE INDEX webhook_events_expiry ON webhook_events (expires_at);
