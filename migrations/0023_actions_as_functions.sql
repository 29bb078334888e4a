-- A client's cancel, an operator's resolution and a regeneration as per-tenant functions (issue
-- 23 §3): each was one statement of modifying CTEs (the update, the budget's settle or take, the
-- row as written or as it was), which a distributed database (Citus) never plans as one: 6 and
-- 10 steps, each a round trip between the coordinator and the tenant's worker. Called alone,
-- each function is one command on the tenant's worker; every table it touches is the tenant's
-- own shard or a reference table. The logic is the statements' (store.c before 0023), unchanged;
-- the gateway reads the job row afterwards (job_get, by_key), one more single-tenant read.
--
-- Each returns '1' when it wrote, '0' when the row exists and was left as it was, 'n' when there
-- is no such row; regenerate also 'r' and the budget's verdict (2 day, 3 month, 4 most in
-- flight, 5 unpriced under an amount budget) when the budget refused a key nobody holds.
-- now() is read once (v_now): never inside CASE or COALESCE of an UPDATE.

-- Settles the budget of a budgeted operation that has just ended (the finish function's
-- settle; STORE_SETTLE_CTE's): one job fewer in flight, the estimate replaced by the cost in the
-- day and month the job was created in.
CREATE FUNCTION idemgate_settle_ended(p_tenant bigint, p_state text, p_budgeted boolean,
    p_currency text, p_cost bigint, p_reserved bigint, p_created timestamptz, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_day date := (p_created AT TIME ZONE 'UTC')::date;
    v_month date := date_trunc('month', p_created AT TIME ZONE 'UTC')::date;
    v_delta bigint := p_cost - p_reserved;
BEGIN
    IF NOT p_budgeted OR p_state NOT IN ('completed', 'failed', 'canceled') THEN
        RETURN;
    END IF;
    UPDATE tenant_budgets b SET
        inflight = greatest(b.inflight - 1, 0),
        day_micros = CASE WHEN b.day = v_day AND b.currency = p_currency
                          THEN greatest(b.day_micros + v_delta, 0) ELSE b.day_micros END,
        month_micros = CASE WHEN b.month = v_month AND b.currency = p_currency
                            THEN greatest(b.month_micros + v_delta, 0) ELSE b.month_micros END,
        updated_at = p_now
    WHERE b.tenant_id = p_tenant;
END
$$;

-- Cancel: recorded once. A job never sent is failed at once; one waiting to be sent again after
-- an attempt that may have made its task (prepared with ambiguous_at) is unknown — never sent
-- again, reconciliation decides; an accepted one has its provider cancel sent by the poller,
-- once. Other live states keep theirs. A terminal job is left as it is.
CREATE FUNCTION idemgate_cancel(p_tenant bigint, p_id text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    o record;
BEGIN
    UPDATE operations x SET
        cancel_requested_at = coalesce(x.cancel_requested_at, v_now),
        state = CASE WHEN x.state = 'prepared' AND x.ambiguous_at IS NULL THEN 'failed'
                     WHEN x.state = 'prepared' THEN 'unknown' ELSE x.state END,
        finished_at = CASE WHEN x.state = 'prepared' AND x.ambiguous_at IS NULL THEN v_now
                           ELSE x.finished_at END,
        last_error = CASE WHEN x.state = 'prepared' AND x.ambiguous_at IS NULL
                          THEN 'canceled before it was sent'
                          WHEN x.state = 'prepared'
                          THEN 'canceled before it was sent again (an earlier attempt may have '
                               'made the task: reconciliation decides)'
                          ELSE x.last_error END,
        lease_owner = CASE WHEN x.state = 'prepared' THEN NULL ELSE x.lease_owner END,
        lease_expires_at = CASE WHEN x.state = 'prepared' THEN NULL ELSE x.lease_expires_at END,
        lease_version = CASE WHEN x.state = 'prepared' THEN x.lease_version + 1
                             ELSE x.lease_version END,
        next_attempt_at = CASE WHEN x.state IN ('accepted', 'unknown', 'prepared') THEN v_now
                               ELSE x.next_attempt_at END,
        updated_at = v_now
    WHERE x.tenant_id = p_tenant AND x.id = p_id
      AND x.state NOT IN ('completed', 'failed', 'canceled')
    RETURNING x.state, x.budgeted, x.currency, x.cost_micros, x.reserved_micros, x.created_at
    INTO o;
    IF NOT FOUND THEN
        PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND id = p_id;
        RETURN CASE WHEN FOUND THEN '0' ELSE 'n' END;
    END IF;
    PERFORM idemgate_settle_ended(p_tenant, o.state, o.budgeted, o.currency, o.cost_micros,
                                  o.reserved_micros, o.created_at, v_now);
    RETURN '1';
END
$$;

-- An operator's decision on a job in review (p_state: st_resolve_target's), applied once; a
-- cancelled job proven absent is failed, never sent again.
CREATE FUNCTION idemgate_resolve(p_tenant bigint, p_id text, p_outcome text, p_state text,
    p_by text, p_remote text, p_tenant_name text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    o record;
BEGIN
    UPDATE operations x SET
        state = CASE WHEN p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL
                     THEN 'failed' ELSE p_state END,
        resolution = p_outcome,
        resolved_by = p_tenant_name || coalesce(' (' || p_by || ')', ''),
        resolved_at = v_now,
        remote_id = coalesce(p_remote, x.remote_id),
        updated_at = v_now,
        webhook_hint = CASE WHEN p_state = 'unknown' THEN p_remote ELSE x.webhook_hint END,
        next_attempt_at = v_now,
        lease_owner = NULL,
        lease_expires_at = NULL,
        lease_version = x.lease_version + 1,
        finished_at = CASE WHEN p_state IN ('completed', 'failed')
                                OR (p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL)
                           THEN v_now END,
        last_error = CASE WHEN p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL
                          THEN 'canceled; not sent again'
                          WHEN p_outcome = 'abandon' THEN 'abandoned by an operator'
                          WHEN p_outcome = 'absent' THEN 'proven absent by an operator'
                          ELSE x.last_error END
    -- (the state as an expression: the plan is the primary key's, never the review index's)
    WHERE x.tenant_id = p_tenant AND x.id = p_id AND (x.state || '') = 'review'
    RETURNING x.state, x.budgeted, x.currency, x.cost_micros, x.reserved_micros, x.created_at
    INTO o;
    IF NOT FOUND THEN
        PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND id = p_id;
        RETURN CASE WHEN FOUND THEN '0' ELSE 'n' END;
    END IF;
    PERFORM idemgate_settle_ended(p_tenant, o.state, o.budgeted, o.currency, o.cost_micros,
                                  o.reserved_micros, o.created_at, v_now);
    RETURN '1';
END
$$;

-- A deliberate new paid creation from a terminal job (p_parent): a new operation p_id with its
-- own key, linked to its parent, one more generation, its parent's estimate reserved against the
-- tenant's budget as at intake. The parent is only read. 'n': the parent is not a terminal job
-- of this tenant (nothing written).
CREATE FUNCTION idemgate_regenerate(p_tenant bigint, p_parent text, p_id text, p_key text,
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
        RETURN CASE WHEN FOUND THEN '0' ELSE 'n' END;
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
            RETURN CASE WHEN FOUND THEN '0' ELSE 'r' || v_verdict END;
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
