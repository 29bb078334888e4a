-- The day and the month a budgeted intake's reservation counts in are its job's: those of the
-- job's created_at (p_at, the gateway's clock when it recorded the request), the instant every
-- settle of the job's end reads them from (idemgate_finish, idemgate_settle_ended, the plain finish
-- of src/lease.c). They were the database's now(): a request stamped 23:59:59.98 UTC whose batch
-- committed at 00:00:00.01 was counted in the new day (and, at a month's end, the new month) and
-- settled against the old one — a job that failed at no cost left its whole estimate counted for
-- the day and the month; and a replica whose clock ran ahead took its reservations off the next
-- day's count, which it never held, letting the tenant past its limit. Now a reservation is
-- counted in its job's day when the budget row is on that day; a row still on an earlier day is
-- moved on to it; a row already on a later one (another replica's clock ahead, or the midnight
-- passed between stamp and commit) keeps its counters, and the job, then counted nowhere for the
-- day, is settled nowhere either. The limits are checked against the counters of the job's day
-- when the row is on it; against none of that day when the row has moved past it (by the skew
-- between the replicas' clocks, or the instant between stamp and commit).
-- Never edit this file once applied (migrate.c records its SHA-256).
CREATE OR REPLACE FUNCTION idemgate_intake(
    p_tenant bigint, p_key text, p_id text, p_fingerprint text, p_fp_version smallint,
    p_provider text, p_route text, p_method text, p_url text, p_credential text, p_body bytea,
    p_ttl_hours integer, p_idem_header text, p_strategy text, p_outputs integer,
    p_profile text, p_owner text, p_lease_s integer, p_reserve bigint, p_currency text,
    p_unpriced boolean, p_at timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    v_today date := (coalesce(p_at, v_now) AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', coalesce(p_at, v_now) AT TIME ZONE 'UTC')::date;
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
            day_micros = CASE WHEN day > v_today THEN day_micros
                ELSE (CASE WHEN day = v_today THEN day_micros ELSE 0 END)
                    + (CASE WHEN currency = p_currency THEN p_reserve ELSE 0 END) END,
            month_micros = CASE WHEN month > v_month THEN month_micros
                ELSE (CASE WHEN month = v_month THEN month_micros ELSE 0 END)
                    + (CASE WHEN currency = p_currency THEN p_reserve ELSE 0 END) END,
            day = greatest(day, v_today), month = greatest(month, v_month), updated_at = v_now
        WHERE tenant_id = p_tenant;
    END IF;
    RETURN (CASE WHEN v_go THEN '2' ELSE '1' END) || coalesce(':' || v_blocked, '');
END
$$;

-- The regeneration of 0032 (its job's created_at is the database's now(), its day and month
-- those of now()), moving the budget's day and month on as the intake does and never back:
-- written as before, a regeneration on a day an intake stamped by a replica whose clock ran
-- ahead had already moved the row past set it back, its counters zeroed, and the next intake
-- moved it on again, zeroing them once more.
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
            day_micros = CASE WHEN day > v_today THEN day_micros
                ELSE (CASE WHEN day = v_today THEN day_micros ELSE 0 END)
                    + (CASE WHEN currency = p.currency THEN p.reserved_micros ELSE 0 END) END,
            month_micros = CASE WHEN month > v_month THEN month_micros
                ELSE (CASE WHEN month = v_month THEN month_micros ELSE 0 END)
                    + (CASE WHEN currency = p.currency THEN p.reserved_micros ELSE 0 END) END,
            day = greatest(day, v_today), month = greatest(month, v_month), updated_at = v_now
        WHERE tenant_id = p_tenant;
    END IF;
    RETURN '1';
END
$$;
