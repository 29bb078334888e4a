-- A budget set after retention deleted some of this month's jobs counted from the jobs left: the
-- spend of the deleted ones was forgotten, and the tenant could spend it again past its limit
-- (a new budget, a change of currency, a budget set again after --clear). The janitor now adds
-- what each job it deletes counted (its settled cost, else its reservation) to a per-tenant,
-- per-currency, per-day sum that outlives the job, kept back to the first day of last month;
-- budget_set's seed adds it to what the remaining jobs count. The rest of idemgate_janitor is as
-- in 0033. Never edit this file once applied (migrate.c records its SHA-256).
CREATE TABLE IF NOT EXISTS tenant_spend_retired (
    tenant_id bigint NOT NULL,
    currency  text NOT NULL,
    day       date NOT NULL, -- the UTC day the deleted jobs were created
    micros    bigint NOT NULL,
    PRIMARY KEY (tenant_id, currency, day)
);
-- On a distributed database already distributed (`migrate --citus` ran before), a replica's own
-- start applies this migration without distributing anything: the table is distributed here,
-- before the janitor that writes it runs on the tenant's worker.
DO $$
BEGIN
    -- (Citus's catalog named only once Citus is known to be there: plain PostgreSQL has none)
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT create_distributed_table(''tenant_spend_retired'', ''tenant_id'', '
                'colocate_with => ''operations'') '
                'WHERE EXISTS (SELECT 1 FROM pg_dist_partition '
                '              WHERE logicalrelid = ''operations''::regclass) '
                '  AND NOT EXISTS (SELECT 1 FROM pg_dist_partition '
                '                  WHERE logicalrelid = ''tenant_spend_retired''::regclass)';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idemgate_janitor(p_tenant bigint, p_limit integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    -- (every instant computed here: a distributed database refuses timestamptz arithmetic in a
    -- statement it runs on a shard)
    v_now timestamptz := now();
    v_written timestamptz := clock_timestamp(); -- (not the transaction's start: the gap counts
                                                -- from the write)
    v_kept timestamptz := v_now + interval '30 days';
    v_settled timestamptz := v_now - interval '10 minutes';
    -- (the first day of last month: no budget counts further back)
    v_oldest date := (date_trunc('month', v_now AT TIME ZONE 'UTC') - interval '1 month')::date;
    v_ids text[];
    v_done bigint := 0;
    v_n bigint;
BEGIN
    DELETE FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key IN (
        SELECT idempotency_key FROM key_tombstones
        WHERE tenant_id = p_tenant AND expires_at < v_now LIMIT p_limit);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_done := v_done + v_n;
    INSERT INTO key_tombstones (tenant_id, idempotency_key, fingerprint, fingerprint_version,
        provider, route, job_id, state, written_at, expires_at)
    SELECT o.tenant_id, o.idempotency_key, o.fingerprint, o.fingerprint_version, o.provider,
        o.route, o.id, o.state, v_written, v_kept
    FROM operations o
    WHERE o.tenant_id = p_tenant AND o.state IN ('completed', 'failed', 'canceled')
      AND o.expires_at < v_now
      AND greatest(o.expires_at, o.finished_at + (o.expires_at - o.created_at)) < v_now
      AND NOT EXISTS (SELECT 1 FROM key_tombstones t WHERE t.tenant_id = p_tenant
                      AND t.idempotency_key = o.idempotency_key)
    ORDER BY o.expires_at LIMIT p_limit
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_done := v_done + v_n;
    SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT o.id FROM operations o
        WHERE o.tenant_id = p_tenant AND o.state IN ('completed', 'failed', 'canceled')
          AND o.expires_at < now()
          AND greatest(o.expires_at, o.finished_at + (o.expires_at - o.created_at)) < now()
          AND EXISTS (SELECT 1 FROM key_tombstones t WHERE t.tenant_id = p_tenant
                      AND t.idempotency_key = o.idempotency_key AND t.job_id = o.id
                      AND t.written_at < v_settled)
          AND NOT EXISTS (SELECT 1 FROM archive_outputs a WHERE a.tenant_id = p_tenant
                          AND a.op_id = o.id AND a.state = 'pending'
                          AND (a.lease_expires_at > v_now
                               OR ((a.expires_at IS NULL OR a.expires_at > v_now)
                                   AND greatest(o.expires_at, o.finished_at
                                                + (o.expires_at - o.created_at))
                                       + (o.expires_at - o.created_at) > v_now)))
        ORDER BY o.expires_at LIMIT p_limit
        FOR UPDATE OF o SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN v_done;
    END IF;
    -- Read again once the jobs are locked, in a snapshot of its own: an output planned between
    -- the statement's snapshot and its lock (an archive planner's write, committed meanwhile)
    -- keeps its job too. No output can be planned for a job once it is locked here.
    SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT o.id FROM operations o
        WHERE o.tenant_id = p_tenant AND o.id = ANY (v_ids)
          AND NOT EXISTS (SELECT 1 FROM archive_outputs a WHERE a.tenant_id = p_tenant
                          AND a.op_id = o.id AND a.state = 'pending'
                          AND (a.lease_expires_at > v_now
                               OR ((a.expires_at IS NULL OR a.expires_at > v_now)
                                   AND greatest(o.expires_at, o.finished_at
                                                + (o.expires_at - o.created_at))
                                       + (o.expires_at - o.created_at) > v_now)))) x;
    IF v_ids IS NULL THEN
        RETURN v_done;
    END IF;
    -- What the deleted jobs counted against a budget outlives them (budget_set's seed).
    INSERT INTO tenant_spend_retired (tenant_id, currency, day, micros)
    SELECT p_tenant, o.currency, (o.created_at AT TIME ZONE 'UTC')::date,
        sum(coalesce(o.cost_micros, o.reserved_micros, 0))
    FROM operations o
    WHERE o.tenant_id = p_tenant AND o.id = ANY (v_ids) AND o.currency IS NOT NULL
    GROUP BY o.currency, (o.created_at AT TIME ZONE 'UTC')::date
    ON CONFLICT (tenant_id, currency, day)
        DO UPDATE SET micros = tenant_spend_retired.micros + EXCLUDED.micros;
    DELETE FROM tenant_spend_retired WHERE tenant_id = p_tenant AND day < v_oldest;
    DELETE FROM attempts WHERE tenant_id = p_tenant AND operation_id = ANY (v_ids);
    DELETE FROM archive_outputs WHERE tenant_id = p_tenant AND op_id = ANY (v_ids);
    DELETE FROM operations WHERE tenant_id = p_tenant AND id = ANY (v_ids);
    RETURN v_done + cardinality(v_ids);
END
$$;
