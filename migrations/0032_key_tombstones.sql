-- A key outlives its job (DESIGN.md §1: "expired terminal rows deleted in batches; tombstone kept
-- for the key"). Before, the janitor deleted a job past its expiry and the key was free: the same
-- request retried after that (an offline client's queue, a batch run again) was a new job, and a
-- second paid create. Now the janitor leaves a tombstone — the key, the request's fingerprint,
-- the job's id and how it ended — for 30 days after the deletion; intake
-- answers a key under a tombstone 410 (the same request: its job is gone, a new generation needs
-- a new key) or 422 (another request: the key was used), and records nothing. Tombstones past
-- their time are deleted by the janitor, per tenant, as jobs are. Distributed by tenant on Citus
-- (src/distribute.c), beside the operations they came from.
CREATE TABLE key_tombstones (
    tenant_id           bigint NOT NULL,
    idempotency_key     text NOT NULL,
    fingerprint         bytea NOT NULL,
    fingerprint_version smallint NOT NULL,
    provider            text NOT NULL,
    route               text NOT NULL,
    job_id              text NOT NULL,
    state               text NOT NULL,
    deleted_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX key_tombstones_expiry ON key_tombstones (tenant_id, expires_at);

-- The janitor of 0030, leaving a tombstone for each job it deletes (in the same transaction:
-- there is no instant where the key is free), and deleting up to p_limit of the tenant's
-- tombstones past their time. Returns the jobs deleted.
CREATE OR REPLACE FUNCTION idemgate_janitor(p_tenant bigint, p_limit integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    v_ids text[];
BEGIN
    DELETE FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key IN (
        SELECT idempotency_key FROM key_tombstones
        WHERE tenant_id = p_tenant AND expires_at < v_now LIMIT p_limit);
    SELECT array_agg(x.id) INTO v_ids FROM (
        SELECT id FROM operations
        WHERE tenant_id = p_tenant AND state IN ('completed', 'failed', 'canceled')
          AND expires_at < now()
          AND greatest(expires_at, finished_at + (expires_at - created_at)) < now()
        ORDER BY expires_at LIMIT p_limit
        FOR UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO key_tombstones (tenant_id, idempotency_key, fingerprint, fingerprint_version,
        provider, route, job_id, state, deleted_at, expires_at)
    SELECT tenant_id, idempotency_key, fingerprint, fingerprint_version, provider, route, id,
        state, v_now, v_now + interval '30 days'
    FROM operations WHERE tenant_id = p_tenant AND id = ANY (v_ids)
    ON CONFLICT (tenant_id, idempotency_key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint, fingerprint_version = EXCLUDED.fingerprint_version,
        provider = EXCLUDED.provider, route = EXCLUDED.route, job_id = EXCLUDED.job_id,
        state = EXCLUDED.state, deleted_at = EXCLUDED.deleted_at,
        expires_at = EXCLUDED.expires_at;
    DELETE FROM attempts WHERE tenant_id = p_tenant AND operation_id = ANY (v_ids);
    DELETE FROM archive_outputs WHERE tenant_id = p_tenant AND op_id = ANY (v_ids);
    DELETE FROM operations WHERE tenant_id = p_tenant AND id = ANY (v_ids);
    RETURN cardinality(v_ids);
END
$$;

-- The intake of 0014, answering 't' (nothing written) for a key under a tombstone, before
-- anything else: the key was used, and its job deleted.
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
    PERFORM 1 FROM key_tombstones WHERE tenant_id = p_tenant AND idempotency_key = p_key;
    IF FOUND THEN
        RETURN 't';
    END IF;
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
            RETURN CASE WHEN FOUND THEN '0' ELSE 'r' || v_verdict END;
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
