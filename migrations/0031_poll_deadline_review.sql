-- A job past its poll deadline goes to review (invariant 2: every accepted job ends or reaches an
-- operator). Before, it stayed `accepted` and unpolled for ever, seen by no poll, webhook or
-- metric. The poller now reads such a job once more and hands it to an operator when that read
-- does not show the task's end (lease.c, poll_claim's `overdue`). A client's cancel of such a job
-- must still reach the provider (a task left running is billed): a job in review that its poll
-- deadline put there (it has a poll deadline and its task's id) and whose cancel was never
-- answered goes back to `accepted`, due at once, so the poller sends the cancel and reads the
-- task again, its cancel followed for an hour from this request. The rest of idemgate_cancel is
-- as in 0029.
CREATE OR REPLACE FUNCTION idemgate_cancel(p_tenant bigint, p_id text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    o record;
BEGIN
    UPDATE operations x SET
        -- (a job its deadline sent to review: the cancel followed for an hour from now)
        cancel_requested_at = CASE WHEN x.state = 'review' AND x.poll_deadline_at IS NOT NULL
                                        AND x.remote_id IS NOT NULL AND x.cancel_sent_at IS NULL
                                   THEN v_now
                                   ELSE coalesce(x.cancel_requested_at, v_now) END,
        state = CASE WHEN x.state = 'prepared' AND x.ambiguous_at IS NULL THEN 'failed'
                     WHEN x.state = 'prepared' THEN 'unknown'
                     WHEN x.state = 'review' AND x.poll_deadline_at IS NOT NULL
                          AND x.remote_id IS NOT NULL AND x.cancel_sent_at IS NULL
                     THEN 'accepted'
                     ELSE x.state END,
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
        next_attempt_at = CASE WHEN x.state = 'unknown' AND x.lease_owner IS NULL
                                    AND x.lease_expires_at IS NOT NULL
                               THEN x.next_attempt_at
                               WHEN x.state IN ('accepted', 'unknown', 'prepared') THEN v_now
                               WHEN x.state = 'review' AND x.poll_deadline_at IS NOT NULL
                                    AND x.remote_id IS NOT NULL AND x.cancel_sent_at IS NULL
                               THEN v_now
                               ELSE x.next_attempt_at END,
        cost_micros = CASE WHEN x.state = 'prepared' AND x.ambiguous_at IS NULL THEN 0
                           ELSE x.cost_micros END,
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

-- An operator's `abandon` proves nothing about the task: the job is failed, but what its
-- reservation held stays counted (the cost recorded, else the reservation), as a cancel's end
-- does. Before, it settled at 0: a job in review has usually made its task (an ambiguous create,
-- a task found, or now a poll deadline passed), and the budget forgot paid work that the tenant
-- could then spend again. Only `absent` (proven by an operator) settles at 0. A resolution to
-- accepted (an async task found) is polled under a deadline of an hour — before, none: a task
-- whose outputs never show was read for ever —, and any other clears the deadline, which marks
-- the poller's reviews. The rest of idemgate_resolve is as in 0030.
CREATE OR REPLACE FUNCTION idemgate_resolve(p_tenant bigint, p_id text, p_outcome text, p_state text,
    p_by text, p_remote text, p_tenant_name text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    -- (computed here: a distributed database refuses timestamptz arithmetic inside CASE)
    v_poll_deadline timestamptz := v_now + interval '1 hour';
    o record;
BEGIN
    UPDATE operations x SET
        state = CASE WHEN p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL
                     THEN 'failed' ELSE p_state END,
        resolution = p_outcome,
        resolved_by = p_tenant_name || coalesce(' (' || p_by || ')', ''),
        resolved_at = v_now,
        remote_id = coalesce(p_remote, x.remote_id),
        -- An async task found is polled for an hour (then review, as at any poll deadline); any
        -- other resolution clears the deadline, which marks a review the poller made (a cancel,
        -- a webhook or a resume takes such a review back to accepted).
        poll_deadline_at = CASE WHEN p_state = 'accepted' THEN v_poll_deadline END,
        cost_micros = CASE WHEN p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL THEN 0
                           WHEN p_state IN ('completed', 'canceled') OR p_outcome = 'abandon'
                           THEN coalesce(x.cost_micros, x.reserved_micros)
                           WHEN p_state = 'failed' THEN 0
                           ELSE x.cost_micros END,
        updated_at = v_now,
        -- An operator's `absent` overrides a webhook's hint kept on the row (reconciler.c,
        -- keep_hint): left there, the resend's back-off would be read as a hinted create's
        -- (FINISH_HINTED) and the hint read again, the job back in review.
        webhook_hint = CASE WHEN p_state = 'unknown' THEN p_remote
                            WHEN p_outcome = 'absent' THEN NULL ELSE x.webhook_hint END,
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

-- A poll that would send its job to review at the deadline while a cancel, a verified webhook or
-- the admin's resume made the row due again (each moves the next attempt past the claim's
-- instant) leaves it accepted for the poll that follows: the cancel is sent, the webhook's change
-- read, the resume's deadline polled — never review over them (lease.c, FINISH_DUE_AGAIN; the
-- same in the plain statement and the batch). The rest of idemgate_finish is as in 0030.
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
        webhook_hint = CASE WHEN p_kind = 'reconcile' THEN NULL ELSE webhook_hint END,
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
                                         credential, expires_at)
            SELECT p_tenant, p_id, x.n, o.provider, x.kind, x.url, x.credential,
                   CASE WHEN x.expires > 0 THEN to_timestamp(x.expires) END
            FROM jsonb_to_recordset(p_plan)
                 AS x(n integer, kind text, url text, credential text, expires float8)
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
