"""Storage behaviour: migrations under concurrency, wake-ups, an unreachable database."""

import os
import subprocess
import threading
import uuid

from conftest import GATEWAY_BIN


def other_database(database_url, psql, name):
    psql(f"CREATE DATABASE {name}")
    return database_url.replace("/idemgate?", f"/{name}?")


def test_replicas_migrating_at_once_apply_each_migration_once(database_url, psql):
    url = other_database(database_url, psql, "mig_" + uuid.uuid4().hex[:8])
    env = dict(os.environ, DATABASE_URL=url)
    procs = [subprocess.Popen([GATEWAY_BIN, "migrate"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(6)]
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0] * 6
    rows = subprocess.check_output(
        ["psql", url, "-qtAX", "-c", "SELECT version, count(*) FROM schema_migrations GROUP BY 1"],
        text=True).split()
    assert rows and all(r.endswith("|1") for r in rows), rows
    tables = subprocess.check_output(
        ["psql", url, "-qtAX", "-c",
         "SELECT count(*) FROM pg_tables WHERE tablename IN ('operations','attempts','tenants')"],
        text=True).strip()
    assert tables == "3"


def test_notify_wakes_an_idle_dispatcher(gateway_factory, token, mock):
    # The fallback poll is a minute away: only the wake-up the intake gives (in process, see
    # src/wake.c) can wake the worker within the 20 s the client is willing to wait.
    gw = gateway_factory(poll_interval_ms=60000, dispatch_workers=1)
    r = gw.submit(token, "wake-" + uuid.uuid4().hex, {"prompt": "x"},
                  headers={"Prefer": "wait=20"})
    assert r.status == 200, r


def test_database_unreachable_is_503_and_never_202(gateway_factory, token, mock, tmp_path):
    gw = gateway_factory(env={"DATABASE_URL": f"postgresql:///idemgate?host={tmp_path}&port=1"})
    assert gw.http.request("GET", "/healthz").status == 200
    ready = gw.http.request("GET", "/readyz")
    assert ready.status == 503 and ready.json()["database"] is False
    r = gw.submit(token, "down-" + uuid.uuid4().hex, {"prompt": "x"})
    assert r.status == 503, r
    assert r.json()["type"] == "urn:idemgate:problem:store-unavailable"
    assert int(r.headers["retry-after"]) > 0
    assert mock.ledger() == []
    assert gw.proc.poll() is None, "the gateway keeps running"
