-- Every write of an operation paid for expressions PostgreSQL rebuilds on each statement (issue
-- 23: executor time per job). A row trigger's WHEN clause and each CHECK constraint are stored as
-- text and parsed again (stringToNode), planned and compiled for every INSERT or UPDATE that can
-- fire them — with cached plans too. Measured on this machine (one client, the three statements
-- of a job: intake, send, finish; pg_stat_statements executor time), the settle trigger and four
-- of the five CHECK constraints of the two tables a job writes cost ~13 % of the job's executor
-- time (222 -> 194 µs).
--
-- The settle trigger goes: the three functions that end an operation (finish, cancel, resolve)
-- set the ending row's cost in their own UPDATE, as the trigger did — completed or canceled: the
-- cost written, else the reservation; failed: nothing. The constraints on values only the
-- gateway's enums write (a resolution, a reconcile strategy, an output's kind and state) go; the
-- one on an operation's state stays: it guards the state machine against any SQL that names a
-- state that does not exist. No trigger remains in the schema.
DROP TRIGGER IF EXISTS operations_settle ON operations;
DROP FUNCTION IF EXISTS idemgate_settle();
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_resolution_check,
                       DROP CONSTRAINT IF EXISTS operations_reconcile_strategy_check;
ALTER TABLE archive_outputs DROP CONSTRAINT IF EXISTS archive_outputs_state_check,
                            DROP CONSTRAINT IF EXISTS archive_outputs_kind_check;

-- idemgate_finish as in 0021, the ending row's cost set by its UPDATE (was the trigger's).
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
        -- A signed webhook's hint that came while this poll was out (it moved the row's next
        -- attempt to its own instant, after the claim's) is kept: the poll may have read the
        -- task before the change the webhook announced.
        next_attempt_at = CASE WHEN p_kind = 'poll' AND p_state = 'accepted'
                                    AND next_attempt_at > updated_at
                               THEN least(next_attempt_at, v_next) ELSE v_next END,
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
        -- The settle (the trigger's before 0025): a row that ends completed or canceled costs
        -- what was recorded, else its reservation; one that ends failed costs nothing.
        cost_micros = CASE WHEN operations.state IN ('completed', 'failed', 'canceled')
                           THEN coalesce(p_cost, cost_micros)
                           WHEN p_state IN ('completed', 'canceled')
                           THEN coalesce(p_cost, cost_micros, reserved_micros)
                           WHEN p_state = 'failed'
                                OR (p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                                    AND NOT (p_may_have_created OR ambiguous_at IS NOT NULL))
                           THEN 0
                           ELSE coalesce(p_cost, cost_micros) END,
        finished_at = CASE WHEN p_state IN ('completed', 'failed', 'canceled')
                                OR (p_state = 'prepared' AND cancel_requested_at IS NOT NULL
                                    AND NOT (p_may_have_created OR ambiguous_at IS NOT NULL))
                           THEN v_now END,
        archive_planned_at = CASE WHEN p_plan IS NOT NULL AND p_state = 'completed'
                                  THEN v_now ELSE archive_planned_at END
    WHERE tenant_id = p_tenant AND id = p_id AND lease_version = p_lease
      AND operations.state = p_from
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
    INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, finished_at,
                          outcome, http_status, curl_code, bytes_sent, decision, error)
    VALUES (p_tenant, p_id, p_lease, p_kind, to_timestamp(p_started), to_timestamp(p_finished),
            p_outcome, p_status, p_curl, p_bytes, v_decision, p_error);
    RETURN v_decision || ' ' || coalesce(v_state, '');
END
$$;

-- idemgate_cancel as in 0023: a job never sent, failed at once, costs nothing.
CREATE OR REPLACE FUNCTION idemgate_cancel(p_tenant bigint, p_id text)
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

-- idemgate_resolve as in 0023: found (completed) costs what was recorded, else the
-- reservation; abandoned or proven absent (failed) costs nothing.
CREATE OR REPLACE FUNCTION idemgate_resolve(p_tenant bigint, p_id text, p_outcome text, p_state text,
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
        cost_micros = CASE WHEN p_state = 'prepared' AND x.cancel_requested_at IS NOT NULL THEN 0
                           WHEN p_state IN ('completed', 'canceled')
                           THEN coalesce(x.cost_micros, x.reserved_micros)
                           WHEN p_state = 'failed' THEN 0
                           ELSE x.cost_micros END,
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
