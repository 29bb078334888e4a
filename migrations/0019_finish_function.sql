-- An attempt's outcome as one per-tenant function (issue 23 §3), like intake (0014): the
-- operation's update, the settle of the tenant's budget row when this update ends a budgeted
-- operation, and the attempt row, in one call. As one statement of data-modifying CTEs, a
-- distributed database (Citus) ran it as four separate steps, each pulled to the coordinator
-- (26–44 ms a call on a loopback cluster); here each statement names the tenant, so each runs
-- on the tenant's shard, and a call outside a transaction is one command on the tenant's worker.
--
-- The update is fenced: it applies only to the row of this lease (p_lease) still in p_from.
-- A cancel acknowledged while the create was being prepared turns a "back to prepared" into
-- unknown when an attempt may have made the task (never sent again: reconciliation decides), or
-- failed when none can have. A terminal state written here settles a budgeted operation once:
-- one fewer in flight, and the day and month it was reserved in charged its cost (the trigger of
-- 0018 set cost_micros) instead of its reservation. The attempt row is written either way, with
-- the decision: p_state, or 'fenced'. Returns that decision, a space and the state written
-- (nothing when fenced): one value, no row set to build. now() is read once; the caller's
-- instants (p_started, p_finished) are Unix seconds.
CREATE FUNCTION idemgate_finish(
    p_tenant bigint, p_id text, p_lease bigint, p_state text, p_status integer,
    p_headers jsonb, p_body bytea, p_error text, p_remote text, p_started float8,
    p_finished float8, p_outcome text, p_curl integer, p_bytes bigint, p_retry_ms float8,
    p_from text, p_kind text, p_received integer, p_requested integer, p_usage jsonb,
    p_poll_url text, p_poll_deadline_ms bigint, p_provider_status text, p_outputs jsonb,
    p_may_have_created boolean, p_cost bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    -- Every instant is computed here: a distributed database refuses a non-immutable
    -- expression (timestamptz arithmetic) inside CASE or COALESCE of an UPDATE.
    v_now timestamptz := now();
    v_next timestamptz := v_now + make_interval(secs => p_retry_ms / 1000);
    v_deadline timestamptz := v_now + make_interval(secs => p_poll_deadline_ms::float8 / 1000);
    v_day date;
    v_month date;
    v_delta bigint;
    o record;
    v_decision text := 'fenced';
    v_state text;
BEGIN
    UPDATE operations SET
        state = CASE WHEN p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                     THEN CASE WHEN p_may_have_created OR ambiguous_at IS NOT NULL
                               THEN 'unknown' ELSE 'failed' END
                     ELSE p_state END,
        resp_status = coalesce(p_status, resp_status),
        resp_headers = coalesce(p_headers, resp_headers),
        resp_body = coalesce(p_body, resp_body),
        last_error = CASE WHEN p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                          THEN CASE WHEN p_may_have_created OR ambiguous_at IS NOT NULL
                                    THEN 'canceled; not sent again (an attempt may have made '
                                         'the task: reconciliation decides)'
                                    ELSE 'canceled; not sent again' END
                          ELSE p_error END,
        remote_id = coalesce(p_remote, remote_id),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = v_now,
        next_attempt_at = v_next,
        outputs_received = coalesce(p_received, outputs_received),
        outputs_requested = coalesce(p_requested, outputs_requested),
        usage = coalesce(p_usage, usage),
        poll_url = coalesce(p_poll_url, poll_url),
        poll_deadline_at = coalesce(v_deadline, poll_deadline_at),
        provider_status = coalesce(p_provider_status, provider_status),
        outputs = coalesce(p_outputs, outputs),
        ambiguous_at = CASE WHEN p_may_have_created OR (p_kind = 'create' AND p_state = 'unknown')
                            THEN v_now ELSE ambiguous_at END,
        webhook_hint = CASE WHEN p_kind = 'reconcile' THEN NULL ELSE webhook_hint END,
        cost_micros = coalesce(p_cost, cost_micros),
        finished_at = CASE WHEN p_state IN ('completed', 'failed', 'canceled')
                                OR (p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                                    AND NOT (p_may_have_created OR ambiguous_at IS NOT NULL))
                           THEN v_now END
    WHERE tenant_id = p_tenant AND id = p_id AND lease_version = p_lease
      AND operations.state = p_from
    RETURNING operations.state, operations.budgeted, operations.currency,
              operations.cost_micros, operations.reserved_micros, operations.created_at
    INTO o;
    IF FOUND THEN
        v_decision := p_state;
        v_state := o.state;
        IF o.budgeted AND o.state IN ('completed', 'failed', 'canceled') THEN
            v_day := (o.created_at AT TIME ZONE 'UTC')::date;
            v_month := date_trunc('month', o.created_at AT TIME ZONE 'UTC')::date;
            v_delta := o.cost_micros - o.reserved_micros;
            UPDATE tenant_budgets b SET
                inflight = greatest(b.inflight - 1, 0),
                day_micros = CASE WHEN b.day = v_day AND b.currency = o.currency
                                  THEN greatest(b.day_micros + v_delta, 0)
                                  ELSE b.day_micros END,
                month_micros = CASE WHEN b.month = v_month AND b.currency = o.currency
                                    THEN greatest(b.month_micros + v_delta, 0)
                                    ELSE b.month_micros END,
                updated_at = v_now
            WHERE b.tenant_id = p_tenant;
        END IF;
    END IF;
    INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, finished_at,
                          outcome, http_status, curl_code, bytes_sent, decision, error)
    VALUES (p_tenant, p_id, p_lease, p_kind, to_timestamp(p_started), to_timestamp(p_finished),
            p_outcome, p_status, p_curl, p_bytes, v_decision, p_error);
    RETURN v_decision || ' ' || coalesce(v_state, '');
END
$$;
