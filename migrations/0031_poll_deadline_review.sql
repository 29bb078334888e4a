-- A job past its poll deadline goes to review (invariant 2: every accepted job ends or reaches an
-- operator). Before, it stayed `accepted` and unpolled for ever, seen by no poll, webhook or
-- metric. The poller now reads such a job once more and hands it to an operator when that read
-- does not show the task's end (lease.c, poll_claim's `overdue`). A client's cancel of such a job
-- must still reach the provider (a task left running is billed): a job in review that its poll
-- deadline put there (it has a poll deadline and its task's id) and whose cancel was never
-- answered goes back to `accepted`, due at once, so the poller sends the cancel and reads the
-- task again. The rest of idemgate_cancel is as in 0029.
CREATE OR REPLACE FUNCTION idemgate_cancel(p_tenant bigint, p_id text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now();
    o record;
BEGIN
    UPDATE operations x SET
        cancel_requested_at = coalesce(x.cancel_requested_at, v_now),
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
-- could then spend again. Only `absent` (proven by an operator) settles at 0. The rest of
-- idemgate_resolve is as in 0030.
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
