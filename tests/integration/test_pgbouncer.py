"""The gateway behind PgBouncer (Debian's 1.18; issue 14 §3). Migrations run on a direct
connection (they hold a session advisory lock); everything else goes through PgBouncer.

Transaction pooling does not work, and this test shows how it breaks: the gateway prepares each
statement once per connection (named, protocol-level PREPARE) and keeps one LISTEN connection
per replica, both session state. Behind transaction pooling a PREPARE lands on a server
connection another client already prepared it on (`42P05 prepared statement "claim" already
exists`), or an EXECUTE on one where it was never prepared (`26000`): statements fail at
random — 500 answers, results and reconciliations not written, jobs left `unknown`.

Session pooling works — the checker finds nothing wrong, and a waiting client on one replica
is woken by another replica's NOTIFY through PgBouncer — but it multiplexes nothing: every
gateway connection pins one server connection for its whole life (SHOW POOLS: as many server
connections as client connections), so the pool must hold the whole connection budget of
every replica (deploy/SCALING.md) and PostgreSQL sees as many connections as without it."""

import collections
import json
import os
import sys
import uuid

import pytest

from conftest import GATEWAY_BIN, ROOT, free_port

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import harness, providers, report  # noqa: E402
from chaos.client import Client, RetryPolicy, run_all  # noqa: E402
from chaos.cluster import Cluster, sql  # noqa: E402
from chaos.pgbouncer import PgBouncer  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

# A replica with the defaults holds 13 connections (deploy/SCALING.md): a session pool must
# hold every replica's; the transaction pool below has 4 for a replica's 13.
BUDGET = 13


@pytest.fixture(scope="session", autouse=True)
def _chaos_report(pytestconfig):
    report.install(pytestconfig)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefix="idemgate-pgb-pg-")
    c.start()
    yield c
    c.destroy()


def own_db(cluster):
    db = "pgb_" + uuid.uuid4().hex[:10]
    direct = cluster.create_db(db)
    cluster.migrate(GATEWAY_BIN, direct)
    tokens = [cluster.tenant(GATEWAY_BIN, "pgb-" + uuid.uuid4().hex[:10], direct)
              for _ in range(2)]
    return db, direct, tokens


def db_errors(reps, names):
    """{sqlstate: count} of the replicas' db_error lines."""
    out = collections.Counter()
    for n in names:
        for line in reps[n].log().splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("event") == "db_error":
                out[d.get("sqlstate")] += 1
    return out


def test_transaction_pooling_breaks_prepared_statements(gateway_factory, mock, cluster):
    db, direct, tokens = own_db(cluster)
    pgb = PgBouncer(cluster, db, "transaction", pool_size=4).start()
    try:
        entry = providers.lookup(mock.url, "lookup" + providers.tag())
        reps = Replicas(gateway_factory, free_port)
        # One replica: its own dozen connections share the pool's few. (A second replica's
        # start can wait forever here: the migration check's session advisory lock may be
        # taken on one server connection and "released" on another.)
        reps.start("a", env={"DATABASE_URL": pgb.url}, providers=[entry], lease_seconds=3)
        pfx = harness.prefix("pgbtx")
        its = harness.intents(pfx, tokens, [entry], harness.size(60, 300))
        outs = run_all(Client(lambda: reps.ports(), RetryPolicy(max_seconds=20)), its,
                       concurrency=8)
        s = harness.conclude("pgbouncer-transaction", outs, sql(direct), mock.url, pfx,
                             drain_timeout=5, emit=False)
        errors = db_errors(reps, ("a",))
        s["db_errors"] = dict(errors)
        s["answers_5xx"] = sum(1 for o in outs for a in o.attempts
                               if a.status is not None and a.status >= 500)
        harness.emit(s)
        reps.stop_all()
    finally:
        pgb.close()
    # Session state does not survive transaction pooling: statements prepared on one server
    # connection are met again (42P05) or missed (26000) on another.
    assert errors.get("42P05", 0) + errors.get("26000", 0) > 0, errors
    # What that costs varies from run to run (the summary line reports it): statements that
    # fail, 500 answers, results and reconciliations not written, jobs left `unknown`.


def test_session_pooling_works_and_pins_a_server_connection_each(gateway_factory, mock,
                                                                 cluster):
    db, direct, tokens = own_db(cluster)
    pgb = PgBouncer(cluster, db, "session", pool_size=2 * BUDGET + 4).start()
    try:
        entry = providers.lookup(mock.url, "lookup" + providers.tag())
        reps = Replicas(gateway_factory, free_port)
        # a takes requests only and never looks at the database on its own for waiting
        # clients (wait_poll_ms: a minute); b dispatches. A waiting client on a is answered
        # only through b's NOTIFY, which must pass PgBouncer to a's LISTEN connection.
        reps.start("a", env={"DATABASE_URL": pgb.url}, providers=[entry], lease_seconds=3,
                   dispatch_workers=0, wait_poll_ms=60000, poll_interval_ms=60000)
        reps.start("b", env={"DATABASE_URL": pgb.url}, providers=[entry], lease_seconds=3,
                   dispatch_workers=2, wait_poll_ms=60000, poll_interval_ms=60000)
        pfx = harness.prefix("pgbsess")
        its = harness.intents(pfx, tokens, [entry], harness.size(60, 600))
        waiting = its[:4]
        for it in waiting:
            it.headers["Prefer"] = "wait=30"
        outs = run_all(Client([reps["a"].port], RetryPolicy(max_seconds=60, timeout=45)),
                       waiting, concurrency=4)
        outs += run_all(Client(lambda: reps.ports(), RetryPolicy(max_seconds=60)), its[4:],
                        concurrency=8)
        pools = pgb.pools()
        s = harness.conclude("pgbouncer-session", outs, sql(direct), mock.url, pfx,
                             drain_timeout=60, emit=False, pools=pools,
                             db_errors=dict(db_errors(reps, ("a", "b"))))
        harness.emit(s)
        codes = reps.stop_all()
    finally:
        pgb.close()
    harness.assert_clean(s)
    assert codes == {"a": 0, "b": 0}, codes
    assert s["completed"] == s["intents"], s
    assert not s["db_errors"], s
    woken = [o.attempts[-1] for o in outs[:len(waiting)]]
    assert [(a.status, a.state) for a in woken] == [(200, "completed")] * len(waiting), woken
    # Nothing is multiplexed: each client connection holds a server connection of its own.
    assert pools["cl_active"] >= 2 and pools["sv_active"] == pools["cl_active"], pools
