-- An archive claim takes a tenant's due copies whose URLs expire first, first. It took them by
-- when they became due: a claim holds a few (archive_claim_batch) while the engine has room, so
-- under a backlog a provider's ten-minute signed URLs waited behind another provider's outputs
-- good for a day, and behind retried rows, and ended `expired` — paid outputs lost while the
-- ones that could wait were copied (0007 meant "most urgent expiry first"; 0016's per-tenant
-- index kept the due order). Rows without an expiry (base64 in a stored result, an endpoint
-- without one) come after those with one; among equals, the longest due first. The due rows of
-- one tenant are sorted per claim (a backlog of thousands is sorted in a few milliseconds; an
-- index on the expiry would cost every output's insert an entry). Never edit this file once
-- applied (migrate.c records its SHA-256).
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
    v_b64 boolean := false;
    r record;
BEGIN
    FOR r IN
        SELECT a.op_id, a.n, a.kind FROM archive_outputs a
        WHERE a.tenant_id = p_tenant AND a.state = 'pending' AND a.next_attempt_at <= v_at
          AND (a.lease_expires_at IS NULL OR a.lease_expires_at < v_at)
          AND a.provider = ANY (p_providers)
        -- the URL that stops working first, first; then the longest due
        ORDER BY a.expires_at NULLS LAST, a.next_attempt_at LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
        IF r.kind = 'b64' THEN
            CONTINUE WHEN v_b64; -- left pending and due: the next claim takes it
            v_b64 := true;
        END IF;
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
-- On a distributed database the function stays distributed (CREATE OR REPLACE keeps its
-- distribution; Citus propagates the new body to the workers).
