-- A key outlives its job (DESIGN.md §1: "expired terminal rows deleted in batches; tombstone kept
-- for the key"). Before, the janitor deleted a job past its expiry and the key was free: the same
-- request retried after that (an offline client's queue, a batch run again) was a new job, and a
-- second paid create. Now the janitor first leaves a tombstone — the key, the request's
-- fingerprint, the job's id and how it ended — and deletes the job only in a later sweep, once
-- the tombstone is 10 minutes old. An INSERT that waited on the job's delete proceeds once it
-- commits: the intake function checks tombstones after its insert, in a snapshot of its own,
-- which sees the tombstone (committed before the delete) whatever the timing; the plain and
-- batched statements (src/store.c) check in their own snapshot, so only one that had started
-- before the tombstone was written and still runs 10 minutes later could miss it (a server
-- stalled that long mid-statement). Intake answers a key
-- under a tombstone 410 (the same request: its job is gone, a new generation needs a new key)
-- or 422 (another request), and records nothing. A tombstone is kept 30 days after it was
-- written, then deleted by the janitor; the key is free after that.
CREATE TABLE key_tombstones (
    tenant_id           bigint NOT NULL,
    idempotency_key     text NOT NULL,
    fingerprint         bytea NOT NULL,
    fingerprint_version smallint NOT NULL,
    provider            text NOT NULL,
    route               text NOT NULL,
    job_id              text NOT NULL,
    state               text NOT NULL,
    written_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX key_tombstones_expiry ON key_tombstones (expires_at);
CREATE INDEX key_tombstones_job ON key_tombstones (tenant_id, job_id);

-- On a database already distributed (idemgate migrate --citus), the table is distributed at once,
-- beside the operations it comes from: the functions below run on the tenant's worker, where a
-- table of the coordinator's own is not.
-- (Citus's catalog is read by EXECUTE: without Citus it does not exist.)
DO $$
DECLARE
    v_distributed boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition '
                'WHERE logicalrelid = ''operations''::regclass)' INTO v_distributed;
    END IF;
    IF v_distributed THEN
        EXECUTE 'SELECT create_distributed_table(''key_tombstones'', ''tenant_id'', '
                'colocate_with => ''operations'')';
    END IF;
END
$$;

-- The janitor of 0030 in three steps, each bounded by p_limit, for one tenant: its tombstones past
-- their 30 days deleted; a tombstone written for each expired job that has none; and the expired
-- jobs whose tombstone was written more than 10 minutes ago deleted, with their attempt and
-- archive rows. Returns the rows it deleted or wrote (a sweep goes on while they fill p_limit).
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
        ORDER BY o.expires_at LIMIT p_limit
        FOR UPDATE OF o SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN v_done;
    END IF;
    DELETE FROM attempts WHERE tenant_id = p_tenant AND operation_id = ANY (v_ids);
    DELETE FROM archive_outputs WHERE tenant_id = p_tenant AND op_id = ANY (v_ids);
    DELETE FROM operations WHERE tenant_id = p_tenant AND id = ANY (v_ids);
    RETURN v_done + cardinality(v_ids);
END
$$;

-- The intake of 0014, answering 't' (nothing written) for a key under a tombstone whose job is
-- gone: checked after the insert (a key whose job still exists is replayed, '0', whatever the
-- janitor wrote meanwhile), in a snapshot of its own, the row just inserted deleted again; and
-- before a budget's refusal (a 410 before a 402).
CREATE OR REPLACE FUNCTION idemgate_intake(
    p_tenant bigint, p_key text, p_id text, p_fingerprint text, p_fp_version smallint,
    p_provider text, p_route text, p_method text, p_url text, p_credential text, p_body bytea,
    p_ttl_hours integer, p_idem_header text, p_strategy text, p_outputs integer,
    p_profile text, p_owner text, p_lease_s integer, p_reserve bigint, p_currency text,
    p_unpriced boolean, p_at timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    v_today date := (v_now AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', v_now AT TIME ZONE 'UTC')::date;
    b tenant_budgets%ROWTYPE;
    v_verdict integer := 0;
    v_blocked text;
    v_go boolean;
BEGIN
    SELECT * INTO b FROM tenant_budgets WHERE tenant_id = p_tenant FOR UPDATE;
    IF FOUND THEN
        IF b.max_inflight IS NOT NULL AND b.inflight >= b.max_inflight THEN
            v_verdict := 4;
        ELSIF b.currency IS DISTINCT FROM p_currency THEN
            v_verdict := 1;
        ELSIF coalesce(p_unpriced, false)
              AND (b.day_limit_micros IS NOT NULL OR b.month_limit_micros IS NOT NULL) THEN
            v_verdict := 5;
        ELSIF b.day_limit_micros IS NOT NULL AND p_reserve
              + (CASE WHEN b.day = v_today THEN b.day_micros ELSE 0 END) > b.day_limit_micros THEN
            v_verdict := 2;
        ELSIF b.month_limit_micros IS NOT NULL AND p_reserve
              + (CASE WHEN b.month = v_month THEN b.month_micros ELSE 0 END)
              > b.month_limit_micros THEN
            v_verdict := 3;
        ELSE
            v_verdict := 1;
        END IF;
        IF v_verdict >= 2 THEN
            -- A key that exists is replayed as always, never refused nor charged again.
            PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND idempotency_key = p_key;
            IF FOUND THEN
                RETURN '0';
            END IF;
            PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
            RETURN CASE WHEN FOUND THEN 't' ELSE 'r' || v_verdict END;
        END IF;
    END IF;
    SELECT reason INTO v_blocked FROM provider_breakers WHERE provider = p_provider;
    v_go := p_owner IS NOT NULL AND v_blocked IS NULL;
    INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, fingerprint_version,
        provider, route, req_method, req_url, req_credential, req_body, state, created_at,
        updated_at, expires_at, req_idem_header, reconcile_strategy, outputs_requested,
        profile_id, lease_owner, lease_version, lease_expires_at, next_attempt_at,
        reserved_micros, currency, budgeted, unpriced)
    VALUES (p_tenant, p_id, p_key, decode(p_fingerprint, 'hex'), p_fp_version, p_provider,
        p_route, p_method, p_url, p_credential, p_body, 'prepared', p_at, p_at,
        p_at + make_interval(hours => p_ttl_hours), p_idem_header, p_strategy, p_outputs,
        p_profile, CASE WHEN v_go THEN p_owner END, CASE WHEN v_go THEN 1 ELSE 0 END,
        CASE WHEN v_go THEN v_now + make_interval(secs => p_lease_s) END,
        CASE WHEN v_go THEN v_now + make_interval(secs => p_lease_s) ELSE v_now END,
        p_reserve, p_currency, v_verdict = 1, p_unpriced)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN '0';
    END IF;
    PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
    IF FOUND THEN
        DELETE FROM operations WHERE tenant_id = p_tenant AND id = p_id;
        RETURN 't';
    END IF;
    IF v_verdict = 1 THEN
        UPDATE tenant_budgets SET inflight = inflight + 1,
            day_micros = (CASE WHEN day = v_today THEN day_micros ELSE 0 END)
                + (CASE WHEN currency = p_currency THEN p_reserve ELSE 0 END),
            month_micros = (CASE WHEN month = v_month THEN month_micros ELSE 0 END)
                + (CASE WHEN currency = p_currency THEN p_reserve ELSE 0 END),
            day = v_today, month = v_month, updated_at = v_now
        WHERE tenant_id = p_tenant;
    END IF;
    RETURN (CASE WHEN v_go THEN '2' ELSE '1' END) || coalesce(':' || v_blocked, '');
END
$$;

-- The regeneration of 0023, with the intake's tombstone checks: a regeneration's key whose job
-- retention deleted answers 't', nothing written.
CREATE OR REPLACE FUNCTION idemgate_regenerate(p_tenant bigint, p_parent text, p_id text, p_key text,
    p_fingerprint text, p_fp_version smallint, p_ttl_hours integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    v_today date := (v_now AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', v_now AT TIME ZONE 'UTC')::date;
    p operations%ROWTYPE;
    b tenant_budgets%ROWTYPE;
    v_verdict integer := 0;
BEGIN
    SELECT * INTO p FROM operations WHERE tenant_id = p_tenant AND id = p_parent
        AND state IN ('completed', 'failed', 'canceled');
    IF NOT FOUND THEN
        PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND idempotency_key = p_key;
        IF FOUND THEN
            RETURN '0';
        END IF;
        -- (a parent gone before its child: the child's key answered by its tombstone)
        PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
        RETURN CASE WHEN FOUND THEN 't' ELSE 'n' END;
    END IF;
    SELECT * INTO b FROM tenant_budgets WHERE tenant_id = p_tenant FOR UPDATE;
    IF FOUND THEN
        IF b.max_inflight IS NOT NULL AND b.inflight >= b.max_inflight THEN
            v_verdict := 4;
        ELSIF b.currency IS DISTINCT FROM p.currency THEN
            v_verdict := 1;
        ELSIF coalesce(p.unpriced, false)
              AND (b.day_limit_micros IS NOT NULL OR b.month_limit_micros IS NOT NULL) THEN
            v_verdict := 5;
        ELSIF b.day_limit_micros IS NOT NULL AND p.reserved_micros
              + (CASE WHEN b.day = v_today THEN b.day_micros ELSE 0 END) > b.day_limit_micros THEN
            v_verdict := 2;
        ELSIF b.month_limit_micros IS NOT NULL AND p.reserved_micros
              + (CASE WHEN b.month = v_month THEN b.month_micros ELSE 0 END)
              > b.month_limit_micros THEN
            v_verdict := 3;
        ELSE
            v_verdict := 1;
        END IF;
        IF v_verdict >= 2 THEN
            -- A key that exists is answered as it is, never refused nor charged again.
            PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND idempotency_key = p_key;
            IF FOUND THEN
                RETURN '0';
            END IF;
            PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
            RETURN CASE WHEN FOUND THEN 't' ELSE 'r' || v_verdict END;
        END IF;
    END IF;
    INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, fingerprint_version,
        provider, route, req_method, req_url, req_credential, req_body, req_idem_header,
        reconcile_strategy, outputs_requested, state, expires_at, parent_id,
        generation_attempts, profile_id, reserved_micros, currency, budgeted, unpriced)
    VALUES (p_tenant, p_id, p_key, decode(p_fingerprint, 'hex'), p_fp_version, p.provider,
        p.route, p.req_method, p.req_url, p.req_credential, p.req_body, p.req_idem_header,
        p.reconcile_strategy, p.outputs_requested, 'prepared',
        v_now + make_interval(hours => p_ttl_hours), p.id, p.generation_attempts + 1,
        p.profile_id, p.reserved_micros, p.currency, v_verdict = 1, p.unpriced)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN '0';
    END IF;
    PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
    IF FOUND THEN
        DELETE FROM operations WHERE tenant_id = p_tenant AND id = p_id;
        RETURN 't';
    END IF;
    IF v_verdict = 1 THEN
        UPDATE tenant_budgets SET inflight = inflight + 1,
            day_micros = (CASE WHEN day = v_today THEN day_micros ELSE 0 END)
                + (CASE WHEN currency = p.currency THEN p.reserved_micros ELSE 0 END),
            month_micros = (CASE WHEN month = v_month THEN month_micros ELSE 0 END)
                + (CASE WHEN currency = p.currency THEN p.reserved_micros ELSE 0 END),
            day = v_today, month = v_month, updated_at = v_now
        WHERE tenant_id = p_tenant;
    END IF;
    RETURN '1';
END
$$;
