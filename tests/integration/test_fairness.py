"""Fair dispatch across tenants (issue 14 §2): one tenant's queue of prepared jobs does not delay
another tenant's first job by more than a few claims. The claim serves the tenant whose last
turn is oldest (dispatch_turns), not the most overdue row of the whole table."""

import uuid

from conftest import tenant_token


def sha(token):
    return f"encode(sha256(convert_to('{token}', 'UTF8')), 'hex')"


def test_a_flooding_tenant_does_not_delay_a_quiet_tenants_first_job(gateway_factory,
                                                                      database_url, psql):
    flood, quiet = tenant_token(database_url), tenant_token(database_url)
    gw = gateway_factory(dispatch_workers=1)
    n = 120
    for i in range(n):  # every create takes 30 ms at the provider: a backlog of seconds
        r = gw.submit(flood, f"flood-{uuid.uuid4().hex}", {"prompt": f"flood {i}",
                                                           "_mock": {"delay_ms": 30}})
        assert r.status == 202, r
    r = gw.submit(quiet, f"quiet-{uuid.uuid4().hex}", {"prompt": "the quiet tenant's first"})
    assert r.status == 202, r
    quiet_id = r.json()["id"]
    assert gw.wait_state(quiet, quiet_id, ("completed",), 60)["state"] == "completed"

    flood_tenant = f"(SELECT id FROM tenants WHERE token_sha256 = {sha(flood)})"
    quiet_row = f"(SELECT created_at, first_sent_at FROM operations WHERE id = '{quiet_id}')"
    ahead = int(psql(f"SELECT count(*) FROM operations a, {quiet_row} q "
                     f"WHERE a.tenant_id = {flood_tenant} "
                     f"AND a.first_sent_at > q.created_at AND a.first_sent_at < q.first_sent_at")
                [0][0])
    waiting = int(psql(f"SELECT count(*) FROM operations a, {quiet_row} q "
                      f"WHERE a.tenant_id = {flood_tenant} "
                      f"AND (a.first_sent_at IS NULL OR a.first_sent_at > q.created_at)")[0][0])
    # The scenario happened: most of the flood was still waiting when the quiet job came.
    assert waiting >= n // 2, (ahead, waiting)
    # And the quiet tenant's first job waited for at most a few of the flood's claims.
    assert ahead <= 3, (ahead, waiting)


def test_a_lock_timeout_is_a_retryable_503_never_a_500(gateway_factory, database_url, psql):
    """A statement that gives up on a lock (lock_timeout) did nothing: the client gets 503
    store-busy with Retry-After and may send the same request again; never a 500. The operations
    table is held by another session for a few seconds while the gateway reads and records."""
    import subprocess
    import time
    tok = tenant_token(database_url)
    gw = gateway_factory(env={"DATABASE_URL": database_url +
                              "&options=-c%20lock_timeout%3D200"})
    r = gw.submit(tok, f"lock-{uuid.uuid4().hex}", {"prompt": "before the lock"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert gw.wait_state(tok, job_id, ("completed",))["state"] == "completed"
    holder = subprocess.Popen(["psql", database_url, "-qtAX", "-c",
                               "BEGIN; LOCK TABLE operations IN ACCESS EXCLUSIVE MODE; "
                               "SELECT pg_sleep(4); COMMIT;"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not psql("SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                       "WHERE c.relname = 'operations' AND l.mode = 'AccessExclusiveLock' "
                       "AND l.granted"):
            assert time.monotonic() < deadline, "the lock was never taken"
            time.sleep(0.05)
        answers = [gw.http.request("GET", "/v1/jobs?limit=5",
                                   headers={"Authorization": f"Bearer {tok}"}),
                   gw.submit(tok, f"lock-{uuid.uuid4().hex}", {"prompt": "during the lock"})]
        held = holder.poll() is None
    finally:
        holder.wait(30)
    assert held, "the lock ended before the requests were answered"
    for a in answers:
        assert a.status == 503, a
        assert a.headers.get("retry-after"), a
        assert a.json()["type"] == "urn:idemgate:problem:store-busy", a
