-- A budget's counters recounted, after `idemgate tenant budget` wrote it. The write (src/store.c,
-- budget_set) counts a new budget's jobs in flight and its spend from its statement's snapshot: a
-- budgeted job that ended between that snapshot and the new row's commit found no row to take
-- itself off (its settle updates a row it cannot see), and stayed counted in flight for good — a
-- tenant whose budget allows one job at a time was then refused every job (429) until the budget
-- was set again.
-- Every write that takes a job out of a budget's count (the settle of an end: idemgate_finish,
-- idemgate_settle_ended, the plain finish of src/lease.c) locks the job's row before the budget's
-- row, both until it commits; one that adds a job (idemgate_intake, idemgate_regenerate) locks the
-- budget's row and inserts a new one. So, in that order here: the tenant's budgeted jobs in
-- flight are locked first (FOR SHARE: an end under way is waited for, and a job it ended no
-- longer matches once read again; none of those locked can end until this commits), then the
-- budget's row (an intake under way is waited for); the counts that follow, statements of their
-- own, see every such write committed or still to come (waiting for these locks, then applying
-- its step to the recounted value). A statement that locks several of the tenant's jobs in
-- another order (the start of sending of a batch, begin_send_rows; on a distributed database a
-- batch of ends, one transaction that holds the budget's row while it waits for a job locked
-- here) can deadlock with this: PostgreSQL breaks it, after deadlock_timeout, by failing one of
-- the two — the batch is written again one row at a time, or this is run again (store.c).
-- p_spend: the day's and month's spend counted again too, as budget_set counts a new budget's
-- (a new budget, or a changed currency) — in one statement, so that a retention run between two
-- reads cannot count a deleted job in both the jobs and the retired spend; else only the jobs in
-- flight. Never edit this file once applied (migrate.c records its SHA-256).
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
-- On a distributed database already distributed (`migrate --citus` ran before), a replica's own
-- start applies this migration without distributing anything: the function is distributed here,
-- to run on the tenant's worker (as distribute.c does for a database distributed later).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT create_distributed_function(''idemgate_budget_recount(bigint, boolean)'''
                '::regprocedure, ''$1'', colocate_with := ''operations'') '
                'WHERE EXISTS (SELECT 1 FROM pg_dist_partition '
                '              WHERE logicalrelid = ''operations''::regclass)';
    END IF;
END
$$;
