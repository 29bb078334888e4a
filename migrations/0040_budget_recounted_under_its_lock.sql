-- A budget's counters recounted under its row's lock, after `idemgate tenant budget` wrote it.
-- The write (src/store.c, budget_set) counts a new budget's jobs in flight and its spend from
-- its statement's snapshot: a budgeted job that ended between that snapshot and the new row's
-- commit found no row to take itself off (its settle updates a row it cannot see), and stayed
-- counted in flight for good — a tenant whose budget allows one job at a time was then refused
-- every job (429) until the budget was set again. Every write that counts a job in or out of a
-- budget (the budgeted intake, the settle of an end) updates the budget's row in the transaction
-- that moves the job: with the row locked first, the counts below, each a statement of its own
-- and so read after the lock, see every such write either committed or still to come (waiting
-- for this lock, then applying its step to the recounted value).
-- p_spend: the day's and month's spend counted again too, as budget_set counts a new budget's
-- (a new budget, or a changed currency); else only the jobs in flight.
-- Never edit this file once applied (migrate.c records its SHA-256).
CREATE OR REPLACE FUNCTION idemgate_budget_recount(p_tenant bigint, p_spend boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    -- Every instant is computed here: a distributed database refuses a non-immutable
    -- expression (timestamptz arithmetic) inside CASE or COALESCE of an UPDATE.
    v_now timestamptz := now();
    v_day date := (v_now AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', v_now AT TIME ZONE 'UTC')::date;
    v_currency text;
    v_inflight integer;
    v_day_micros bigint;
    v_month_micros bigint;
BEGIN
    SELECT b.currency INTO v_currency FROM tenant_budgets b
     WHERE b.tenant_id = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL; -- cleared meanwhile
    END IF;
    SELECT count(*)::integer INTO v_inflight FROM operations o
     WHERE o.tenant_id = p_tenant AND o.budgeted
       AND o.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review');
    IF NOT p_spend THEN
        UPDATE tenant_budgets SET inflight = v_inflight WHERE tenant_id = p_tenant;
        RETURN v_inflight;
    END IF;
    SELECT coalesce(sum(coalesce(o.cost_micros, o.reserved_micros))
                    FILTER (WHERE o.created_at >= v_day::timestamp AT TIME ZONE 'UTC'), 0),
           coalesce(sum(coalesce(o.cost_micros, o.reserved_micros)), 0)
      INTO v_day_micros, v_month_micros
      FROM operations o
     WHERE o.tenant_id = p_tenant AND o.currency = v_currency
       AND o.created_at >= v_month::timestamp AT TIME ZONE 'UTC';
    SELECT v_day_micros + coalesce(sum(x.micros) FILTER (WHERE x.day >= v_day), 0),
           v_month_micros + coalesce(sum(x.micros), 0)
      INTO v_day_micros, v_month_micros
      FROM tenant_spend_retired x
     WHERE x.tenant_id = p_tenant AND x.currency = v_currency AND x.day >= v_month;
    UPDATE tenant_budgets SET inflight = v_inflight, day = v_day, day_micros = v_day_micros,
           month = v_month, month_micros = v_month_micros
     WHERE tenant_id = p_tenant;
    RETURN v_inflight;
END $$;
