-- A forced `absent` (the admin's word that the task known on the job is not this job's) kept
-- that task's id and poll URL on the row. Sent again, a resend whose answer was lost (unknown,
-- no id of its own: a non-streamed attempt writes none) was reconciled by reading that foreign
-- task by its id and adopting its answer as the job's result — another job's output, perhaps
-- another tenant's on a shared provider account — while the job's own new task was never read;
-- a resend accepted without a poll URL of its own was polled at the old task's. An `absent` now
-- clears both. The rest of idemgate_resolve is as in 0035.
CREATE OR REPLACE FUNCTION idemgate_resolve(p_tenant bigint, p_id text, p_outcome text, p_state text,
    p_by text, p_remote text, p_tenant_name text, p_version bigint)
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
        -- An `absent` (forced past a known task: the admin's word that it is not this job's)
        -- leaves no trace of that task to be read as the resend's: its id and poll URL cleared.
        remote_id = CASE WHEN p_outcome = 'absent' THEN NULL
                         ELSE coalesce(p_remote, x.remote_id) END,
        poll_url = CASE WHEN p_outcome = 'absent' THEN NULL ELSE x.poll_url END,
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
      AND x.lease_version = p_version
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
