-- One stored result per archive claim (issue 23, a review of 0026). A base64 output's row carries
-- its operation's whole stored answer (the bytes are in it): a claim of 8 such outputs of one job
-- returned that answer 8 times — a job of 8 images of 3 MB each, ~200 MB in one result. A claim
-- now takes at most one base64 output; the others of the batch wait, due, for the next claim (one
-- a claim, as before 0026). URL and endpoint outputs are batched as they were.
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
        ORDER BY a.next_attempt_at LIMIT p_limit FOR UPDATE SKIP LOCKED
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
