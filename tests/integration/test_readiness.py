"""Readiness when the database refuses a statement (issue 23 §5).

A replica whose claims or result writes fail on every call — a schema the binary does not match,
a database that does not support a statement's shape — used to say it was ready throughout. The
database here refuses one statement class for a while (a table it names is renamed away); /readyz
must say 503 and name the statement, and be ready again once that statement runs."""

import time


def readyz(gw):
    r = gw.http.request("GET", "/readyz")
    return r.status, r.json()


def until(gw, status, seconds=30):
    deadline = time.monotonic() + seconds
    while True:
        got = readyz(gw)
        if got[0] == status:
            return got[1]
        assert time.monotonic() < deadline, got
        time.sleep(0.1)


def test_readyz_is_not_ready_while_the_database_refuses_a_statement(gateway_factory, psql):
    gw = gateway_factory(janitor_interval_ms=100)
    ready = until(gw, 200)
    assert ready["failing_statements"] == [], ready
    psql("ALTER TABLE webhook_parked RENAME TO webhook_parked_away")
    try:
        body = until(gw, 503)
        # The database is reachable: what is wrong is one statement, named with its SQLSTATE.
        assert body["database"] is True, body
        failing = {f["statement"]: f["sqlstate"] for f in body["failing_statements"]}
        assert failing.get("janitor_webhooks") == "42P01", body
    finally:
        psql("ALTER TABLE webhook_parked_away RENAME TO webhook_parked")
    body = until(gw, 200)
    assert body["failing_statements"] == [], body
    log = gw.log()
    assert '"statement":"janitor_webhooks","sqlstate":"42P01"' in log
