-- A completed job whose outputs were never planned for the archive (a result written without
-- its plan, by an older replica, is planned by an archive worker afterwards: none runs for that
-- provider, or none had planned it yet) was deleted at its expiry with its outputs never copied,
-- nothing counted or alerted: the janitor kept only jobs with a `pending` output. Such a job is
-- now kept as those are — until it is planned, or a second ttl has passed since it could first
-- be deleted — and the archive's gauges count it (store.c's gauges_terminal:
-- idemgate_archive_pending_copies and _oldest_pending_seconds, whose alert then fires). The rest
-- of idemgate_janitor is as in 0036. Never edit this file once applied (migrate.c records its
-- SHA-256).
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
          AND NOT (o.state = 'completed' AND o.archive_planned_at IS NULL
                   AND greatest(o.expires_at, o.finished_at + (o.expires_at - o.created_at))
                       + (o.expires_at - o.created_at) > v_now)
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
                                       + (o.expires_at - o.created_at) > v_now)))
          AND NOT (o.state = 'completed' AND o.archive_planned_at IS NULL
                   AND greatest(o.expires_at, o.finished_at + (o.expires_at - o.created_at))
                       + (o.expires_at - o.created_at) > v_now)) x;
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
