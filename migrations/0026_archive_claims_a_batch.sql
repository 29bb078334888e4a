-- The archive claims a batch of a tenant's outputs in one call (issue 23: executor time per job).
-- One output a claim cost three statements per output (the ring read of tenants with due copies,
-- the claim, the copy's end); measured in `make bench`'s end-to-end run, ~0.12 ms of the
-- ~0.49 ms of executor time per job. One plain statement cannot claim several rows with a plan
-- that stays a key lookup: a generic plan built while the table is small scans the tenant's
-- whole history for rows named by an array or a join (checked with plan_cache_mode =
-- force_generic_plan on an empty table), the failure lease.c's CLAIM_ON_PICKED describes. Here
-- each picked row is updated by its whole primary key, a plan no table size changes.
--
-- Picks up to p_limit of the tenant's due pending outputs of the given providers, most overdue
-- first, skipping rows another worker holds; each gets a new lease and fencing token and its
-- attempt counted. Returns the rows with what a copy needs (the stored result for a base64
-- output, the remote id for a content endpoint). On Citus it runs on the tenant's worker.
CREATE OR REPLACE FUNCTION idemgate_archive_claim(
    p_tenant bigint, p_owner text, p_lease_seconds integer, p_providers text[], p_limit integer)
RETURNS TABLE (tenant_id bigint, op_id text, n integer, lease_version bigint, provider text,
               kind text, source_url text, credential text, expires float8, claimed_at float8,
               attempts integer, resp_body bytea, remote_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_at timestamptz := now();
    v_until timestamptz := now() + make_interval(secs => p_lease_seconds);
    r record;
BEGIN
    FOR r IN
        SELECT a.op_id, a.n FROM archive_outputs a
        WHERE a.tenant_id = p_tenant AND a.state = 'pending' AND a.next_attempt_at <= v_at
          AND (a.lease_expires_at IS NULL OR a.lease_expires_at < v_at)
          AND a.provider = ANY (p_providers)
        ORDER BY a.next_attempt_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE archive_outputs a SET lease_owner = p_owner, lease_version = a.lease_version + 1,
               lease_expires_at = v_until, attempts = a.attempts + 1
        WHERE a.tenant_id = p_tenant AND a.op_id = r.op_id AND a.n = r.n
        RETURNING a.tenant_id, a.op_id, a.n, a.lease_version, a.provider, a.kind, a.source_url,
                  a.credential,
                  coalesce(extract(epoch FROM a.expires_at - 'epoch'::timestamptz)::float8, 0),
                  extract(epoch FROM v_at - 'epoch'::timestamptz)::float8, a.attempts,
                  (SELECT o.resp_body FROM operations o
                   WHERE a.kind = 'b64' AND o.tenant_id = p_tenant AND o.id = a.op_id),
                  (SELECT o.remote_id FROM operations o
                   WHERE o.tenant_id = p_tenant AND o.id = a.op_id)
        INTO tenant_id, op_id, n, lease_version, provider, kind, source_url, credential, expires,
             claimed_at, attempts, resp_body, remote_id;
        RETURN NEXT;
    END LOOP;
END
$$;
