-- A budget adopts the tenant's jobs still running in its currency each time it is written
-- (`idemgate tenant budget`, which then recounts it here). The command counts a new budget's
-- spend from every job of the day and the month — a job still running at its reservation —
-- but a job recorded while the tenant had no budget is not `budgeted`, and only a budgeted
-- job's end settles against the budget row
-- (idemgate_finish, idemgate_settle_ended, the plain finish of src/lease.c): its reservation
-- stayed counted for the rest of the day and the month however little it cost (a job that failed
-- at no cost still counted its whole estimate), and it was not counted in flight either. Adopted
-- here, under the budget row's lock, each such job counts in flight and replaces its reservation
-- by its cost when it ends, as a job recorded under the budget does. A job's end under way is
-- waited for (its row's lock); one that ended first no longer matches, and is counted at its cost.
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
    PERFORM 1 FROM operations o
     WHERE o.tenant_id = p_tenant AND o.budgeted
       AND o.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review')
       FOR SHARE;
    SELECT b.currency INTO v_currency FROM tenant_budgets b
     WHERE b.tenant_id = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL; -- cleared meanwhile
    END IF;
    -- Every recount adopts them, not only a new budget's: a recount the command could not
    -- finish (it says so; run again, the budget exists and its spend is not recounted) adopts
    -- them all the same. Locked in key order, as the batches of ends and of starts of sending
    -- lock theirs: a deadlock with one of them is still possible (PostgreSQL fails one of the
    -- two; the batch is written again row by row, or this is run again: store.c).
    UPDATE operations o SET budgeted = true
     WHERE o.tenant_id = p_tenant AND o.id IN (
           SELECT x.id FROM operations x
            WHERE x.tenant_id = p_tenant AND NOT x.budgeted AND x.currency = v_currency
              AND x.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review')
            ORDER BY x.id FOR UPDATE)
       AND NOT o.budgeted
       AND o.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review');
    SELECT count(*)::integer INTO v_inflight FROM operations o
     WHERE o.tenant_id = p_tenant AND o.budgeted
       AND o.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review');
    IF NOT p_spend THEN
        UPDATE tenant_budgets SET inflight = v_inflight WHERE tenant_id = p_tenant;
        RETURN v_inflight;
    END IF;
    SELECT s.day_micros + r.day_micros, s.month_micros + r.month_micros
      INTO v_day_micros, v_month_micros
      FROM (SELECT coalesce(sum(coalesce(o.cost_micros, o.reserved_micros))
                            FILTER (WHERE o.created_at >= v_day::timestamp AT TIME ZONE 'UTC'),
                            0) AS day_micros,
                   coalesce(sum(coalesce(o.cost_micros, o.reserved_micros)), 0) AS month_micros
              FROM operations o
             WHERE o.tenant_id = p_tenant AND o.currency = v_currency
               AND o.created_at >= v_month::timestamp AT TIME ZONE 'UTC') s,
           (SELECT coalesce(sum(x.micros) FILTER (WHERE x.day >= v_day), 0) AS day_micros,
                   coalesce(sum(x.micros), 0) AS month_micros
              FROM tenant_spend_retired x
             WHERE x.tenant_id = p_tenant AND x.currency = v_currency
               AND x.day >= v_month) r;
    UPDATE tenant_budgets SET inflight = v_inflight, day = v_day, day_micros = v_day_micros,
           month = v_month, month_micros = v_month_micros
     WHERE tenant_id = p_tenant;
    RETURN v_inflight;
END $$;
