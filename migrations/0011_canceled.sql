-- The terminal state `canceled` (issue 21 §1): a task existed at the provider and the provider
-- ended it on our request. It keeps its remote id and what the provider bills for it; `failed`
-- stays "no task exists" (or the task itself failed).

ALTER TABLE operations DROP CONSTRAINT operations_state_check;
ALTER TABLE operations ADD CONSTRAINT operations_state_check
    CHECK (state IN ('prepared', 'sending', 'accepted', 'unknown', 'review', 'completed',
                     'failed', 'canceled'));

-- Settling: completed costs what was computed (or the reservation: an operator's "found");
-- canceled costs what was computed, else the reservation — providers do not report what a
-- cancelled task was billed, and a budget must never count less than was spent; failed: 0.
CREATE OR REPLACE FUNCTION idemgate_settle() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d date := (NEW.created_at AT TIME ZONE 'UTC')::date;
    delta bigint;
BEGIN
    NEW.cost_micros := CASE WHEN NEW.state IN ('completed', 'canceled')
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

DROP TRIGGER operations_settle ON operations;
CREATE TRIGGER operations_settle
    BEFORE UPDATE OF state ON operations
    FOR EACH ROW
    WHEN (OLD.state NOT IN ('completed', 'failed', 'canceled')
          AND NEW.state IN ('completed', 'failed', 'canceled'))
    EXECUTE FUNCTION idemgate_settle();

-- Spend (GET /v1/usage) counts what cancelled tasks cost too.
CREATE INDEX operations_spend_settled ON operations (tenant_id, finished_at)
    WHERE state IN ('completed', 'canceled');
DROP INDEX operations_spend;
