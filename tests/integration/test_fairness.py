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
