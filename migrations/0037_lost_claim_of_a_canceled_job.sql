-- A dispatcher's claim whose answer was lost may have committed: the row it moved is written back
-- to `prepared` (never sent). A row whose cancel was acknowledged meanwhile (the client was told
-- 202, its job `sending`) was left to its lease: the reaper made it `unknown` and, under a profile
-- that cannot look a task up, an operator's review — though nothing was ever sent. Now it is
-- given back too and then cancelled as a job never sent is: `failed` at cost 0 (its reservation
-- settled), or `unknown` when an earlier attempt may have made its task (reconciliation decides,
-- as idemgate_cancel does for any `prepared` row); its first send, when this claim was its first
-- attempt, is cleared (none happened). A row a signed webhook hinted meanwhile is
-- still left to its lease. One per-tenant function (lease.c's claim_lost). Never edit this file
-- once applied (migrate.c records its SHA-256).
CREATE OR REPLACE FUNCTION idemgate_claim_lost(p_tenant bigint, p_owner text)
RETURNS TABLE (job_id text, job_state text) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        UPDATE operations x SET state = 'prepared', lease_owner = NULL,
            lease_expires_at = NULL, next_attempt_at = now(), updated_at = now(),
            transport_attempts = greatest(x.transport_attempts - 1, 0),
            -- (the claim set it when this was the first attempt; a cancel acknowledged since
            -- moved updated_at, so the two instants are not compared)
            first_sent_at = CASE WHEN x.transport_attempts <= 1 THEN NULL
                                 ELSE x.first_sent_at END
        WHERE x.tenant_id = p_tenant AND x.state = 'sending' AND x.lease_owner = p_owner
          AND x.webhook_hint IS NULL
        RETURNING x.id, x.cancel_requested_at IS NOT NULL AS canceled
    LOOP
        IF r.canceled THEN
            PERFORM idemgate_cancel(p_tenant, r.id);
        END IF;
        job_id := r.id;
        SELECT o.state INTO job_state FROM operations o
         WHERE o.tenant_id = p_tenant AND o.id = r.id;
        RETURN NEXT;
    END LOOP;
END
$$;
-- On a distributed database already distributed (`migrate --citus` ran before), a replica's own
-- start applies this migration without distributing anything: the function is distributed here,
-- to run on the tenant's worker (as distribute.c does for a database distributed later).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT create_distributed_function(''idemgate_claim_lost(bigint, text)''::regprocedure, '
                '''$1'', colocate_with := ''operations'') '
                'WHERE EXISTS (SELECT 1 FROM pg_dist_partition '
                '              WHERE logicalrelid = ''operations''::regclass)';
    END IF;
END
$$;
