-- An output the profile's archive policy refuses for what its URL says (its scheme, credentials
-- in it, a host not declared) is planned already ended: the plan carries `"state": "failed"` and
-- the reason, and the row is inserted failed with it — never claimed, copied or written again
-- (each such output cost a claim, a wake-up of an archive thread and the write of its end; every
-- output of a shipped profile without `archive.hosts`). The plain statements (src/lease.c,
-- FINISH_PLAIN_SQL and finish_rows; src/archive.c, archive_plan_write) read the same members;
-- this is the function a distributed database runs. The rest of idemgate_finish is as in 0034.
-- Never edit this file once applied (migrate.c records its SHA-256).
CREATE OR REPLACE FUNCTION idemgate_finish(
    p_tenant bigint, p_id text, p_lease bigint, p_state text, p_status integer,
    p_headers jsonb, p_body bytea, p_error text, p_remote text, p_started float8,
    p_finished float8, p_outcome text, p_curl integer, p_bytes bigint, p_retry_ms float8,
    p_from text, p_kind text, p_received integer, p_requested integer, p_usage jsonb,
    p_poll_url text, p_poll_deadline_ms bigint, p_provider_status text, p_outputs jsonb,
    p_may_have_created boolean, p_cost bigint, p_plan jsonb)
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
        -- A create whose task a signed webhook named while it was in flight never ends
        -- prepared or failed on its own answer: unknown, reconciled by the hint at once.
        state = CASE WHEN p_kind = 'create' AND p_state IN ('prepared', 'failed')
                          AND webhook_hint IS NOT NULL THEN 'unknown'
                     WHEN p_kind = 'poll' AND p_state = 'review'
                          AND next_attempt_at >= updated_at THEN 'accepted'
                     WHEN p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                     THEN CASE WHEN p_may_have_created OR ambiguous_at IS NOT NULL
                               THEN 'unknown' ELSE 'failed' END
                     ELSE p_state END,
        resp_status = coalesce(p_status, resp_status),
        resp_headers = coalesce(p_headers, resp_headers),
        resp_body = coalesce(p_body, resp_body),
        last_error = CASE WHEN p_kind = 'create' AND p_state IN ('prepared', 'failed')
                               AND webhook_hint IS NOT NULL
                          THEN 'a signed webhook named a task of this job while it was sent: '
                               'reconciled by it, never sent again'
                          WHEN p_kind = 'poll' AND p_state = 'review'
                               AND next_attempt_at >= updated_at THEN last_error
                          WHEN p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                          THEN CASE WHEN p_may_have_created OR ambiguous_at IS NOT NULL
                                    THEN 'canceled; not sent again (an attempt may have made '
                                         'the task: reconciliation decides)'
                                    ELSE 'canceled; not sent again' END
                          ELSE p_error END,
        remote_id = coalesce(p_remote, remote_id),
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = v_now,
        -- A signed webhook's hint that came while this poll was out (it moved the row's next
        -- attempt to its own instant, after the claim's) is kept: the poll may have read the
        -- task before the change the webhook announced.
        next_attempt_at = CASE WHEN p_kind = 'poll' AND p_state = 'accepted'
                                    AND next_attempt_at >= updated_at
                               THEN least(next_attempt_at, v_next)
                               -- A create left ambiguous whose task a signed webhook named
                               -- meanwhile (webhook_signed keeps the hint on a row in flight):
                               -- read by that id at once, not at the end of the window.
                               WHEN p_kind = 'create'
                                    AND p_state IN ('unknown', 'prepared', 'failed')
                                    AND webhook_hint IS NOT NULL
                               THEN v_now ELSE v_next END,
        outputs_received = coalesce(p_received, outputs_received),
        outputs_requested = coalesce(p_requested, outputs_requested),
        usage = coalesce(p_usage, usage),
        poll_url = coalesce(p_poll_url, poll_url),
        poll_deadline_at = coalesce(v_deadline, poll_deadline_at),
        provider_status = coalesce(p_provider_status, provider_status),
        outputs = coalesce(p_outputs, outputs),
        ambiguous_at = CASE WHEN p_may_have_created OR (p_kind = 'create' AND p_state = 'unknown')
                                 OR (p_kind = 'create' AND p_state IN ('prepared', 'failed')
                                     AND webhook_hint IS NOT NULL)
                            THEN v_now ELSE ambiguous_at END,
        webhook_hint = CASE WHEN p_kind = 'reconcile' AND p_outcome IS DISTINCT FROM 'hint_unread'
                            THEN NULL ELSE webhook_hint END,
        -- The settle (the trigger's before 0025): a row that ends completed or canceled costs
        -- what was recorded, else its reservation; one that ends failed costs nothing.
        cost_micros = CASE WHEN operations.state IN ('completed', 'failed', 'canceled')
                           THEN coalesce(p_cost, cost_micros)
                           WHEN p_kind = 'create' AND p_state IN ('prepared', 'failed')
                                AND webhook_hint IS NOT NULL
                           THEN cost_micros
                           WHEN p_state IN ('completed', 'canceled')
                           THEN coalesce(p_cost, cost_micros, reserved_micros)
                           WHEN p_state = 'failed'
                                OR (p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                                    AND NOT (p_may_have_created OR ambiguous_at IS NOT NULL))
                           THEN 0
                           ELSE coalesce(p_cost, cost_micros) END,
        finished_at = CASE WHEN p_kind = 'create' AND p_state IN ('prepared', 'failed')
                                AND webhook_hint IS NOT NULL THEN NULL
                           WHEN p_state IN ('completed', 'failed', 'canceled')
                                OR (p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                                    AND NOT (p_may_have_created OR ambiguous_at IS NOT NULL))
                           THEN v_now END,
        archive_planned_at = CASE WHEN p_plan IS NOT NULL AND p_state = 'completed'
                                  THEN v_now ELSE archive_planned_at END
    WHERE tenant_id = p_tenant AND id = p_id AND lease_version = p_lease
      AND (operations.state = p_from
           OR (p_from = 'sending' AND operations.state = 'unknown'
               AND operations.lease_owner IS NULL AND operations.lease_expires_at IS NOT NULL))
    RETURNING operations.state, operations.budgeted, operations.currency,
              operations.cost_micros, operations.reserved_micros, operations.created_at,
              operations.provider
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
        IF p_plan IS NOT NULL AND o.state = 'completed' THEN
            INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url,
                                         credential, expires_at, state, last_error)
            SELECT p_tenant, p_id, x.n, o.provider, x.kind, x.url, x.credential,
                   CASE WHEN x.expires > 0 THEN to_timestamp(x.expires) END,
                   coalesce(x.state, 'pending'), x.error
            FROM jsonb_to_recordset(p_plan)
                 AS x(n integer, kind text, url text, credential text, expires float8,
                      state text, error text)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    IF v_state IS NULL THEN
        PERFORM 1 FROM operations WHERE tenant_id = p_tenant AND id = p_id FOR KEY SHARE;
        IF NOT FOUND THEN
            RETURN v_decision || ' ';
        END IF;
    END IF;
    INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, finished_at,
                          outcome, http_status, curl_code, bytes_sent, decision, error)
    VALUES (p_tenant, p_id, p_lease, p_kind, to_timestamp(p_started), to_timestamp(p_finished),
            p_outcome, p_status, p_curl, p_bytes, v_decision, p_error);
    RETURN v_decision || ' ' || coalesce(v_state, '');
END
$$;
