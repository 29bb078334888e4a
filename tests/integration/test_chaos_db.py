"""PostgreSQL faults (D1, D2) and the gateway's lifecycle, on clusters of the test's own (the
session's shared cluster is never stopped).

D1  `pg_ctl stop -m immediate` under load: while it is down every intake answer is a 503
    problem+json with Retry-After; no 202 without a durable row; after the restart everything
    completes, once.
D2  connections lost in the middle of a COMMIT. A protocol proxy between the gateways and
    PostgreSQL (tests/chaos/pgproxy.py) closes a connection either before a chosen statement
    reaches the server, or after the server committed it and before its answer reaches the
    gateway — the two cases the gateway cannot tell apart. A re-read must decide: one row per
    key, the 202 names that row, nothing is dispatched twice.
Lifecycle: SIGTERM (stop accepting, answer waiting clients, drain, release leases, exit 0);
    started with PostgreSQL down (not ready, no crash, ready and migrated once it is up); a
    database connection lost mid-request (a read runs once more on a new connection; lost twice,
    503 problem+json, then reconnected); PostgreSQL restarted (fast and immediate) under a
    running gateway: every request afterwards succeeds at its first attempt."""

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from conftest import GATEWAY_BIN, ROOT, free_port

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import harness, providers, report  # noqa: E402
from chaos.client import Client, Intent, RetryPolicy, post, run_all  # noqa: E402
from chaos.cluster import Cluster, sql  # noqa: E402
from chaos.pgproxy import PgProxy  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

size = harness.size
LEASE = 3


@pytest.fixture(scope="session", autouse=True)
def _chaos_report(pytestconfig):
    report.install(pytestconfig)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    c.start()
    yield c
    c.destroy()


class Own:
    """A fresh, migrated database of the module's cluster, with two tenants."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.db = "chaos_" + uuid.uuid4().hex[:10]
        self.url = cluster.create_db(self.db)
        cluster.migrate(GATEWAY_BIN, self.url)
        self.q = sql(self.url)
        self.tokens = [cluster.tenant(GATEWAY_BIN, "chaos-" + uuid.uuid4().hex[:10], self.url)
                       for _ in range(2)]


@pytest.fixture
def own(cluster):
    if not cluster.is_running():
        cluster.start()
    return Own(cluster)


wait_until = harness.wait_until


def stop_clean(reps):
    codes = reps.stop_all()
    assert all(c == 0 for c in codes.values()), f"unclean exits after SIGTERM: {codes}"


def get(port, path, token=None, timeout=5):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except OSError as e:
        return None, {}, type(e).__name__.encode()
    finally:
        conn.close()


def is_503_problem(a):
    return (a.status == 503 and a.retry_after and a.content_type
            and "application/problem+json" in a.content_type
            and a.problem_type == "urn:idemgate:problem:store-unavailable")


# --- D1 -----------------------------------------------------------------------------------------

def test_d1_immediate_stop_under_load(gateway_factory, mock, own):
    cluster, q, tokens = own.cluster, own.q, own.tokens
    tag = providers.tag()
    entries = [providers.lookup(mock.url, "lookup" + tag), providers.keyed(mock.url, "keyed" + tag)]
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b"):
        reps.start(name, env={"DATABASE_URL": own.url}, providers=entries, lease_seconds=LEASE)
    pfx = harness.prefix("d1")
    # A pool larger than the run needs; clients stop taking new intents once the last outage is
    # over and a little more load has gone through.
    pool = harness.intents(pfx, tokens, entries, size(2000, 6000),
                           mock=lambda i: {"delay_ms": random.randint(0, 40)})
    outages = []  # (stopped, restarting) wall times: the database is surely down in between
    ready_while_down = []
    stop = threading.Event()

    def fault():
        try:
            for _ in range(size(1, 3)):
                time.sleep(1.5)
                cluster.stop_immediate()
                stopped = time.time()
                for _ in range(10):  # the replicas say so while it is down
                    st, _, body = get(reps["a"].port, "/readyz")
                    ready_while_down.append((st, json.loads(body) if st else None))
                    time.sleep(0.25)
                outages.append((stopped, time.time()))
                cluster.start()
            time.sleep(1.5)
        finally:
            stop.set()

    ft = threading.Thread(target=fault, daemon=True)
    ft.start()
    client = Client(lambda: reps.ports(), RetryPolicy(max_seconds=120, retry_after_cap=1.0))
    outs = run_all(client, pool, concurrency=8, stop=stop, pace=0.02)
    ft.join(timeout=120)
    outs = [o for o in outs if o.attempts]  # the intents never started are not part of the run
    assert outages, "the database was never stopped"
    if not cluster.is_running():
        cluster.start()

    during = [a for o in outs for a in o.attempts
              if any(s < a.t0 and a.t1 < u for s, u in outages)]
    # A replay of a job already finished may be answered from a replica's memory (the terminal-
    # job cache) while the database is down; a new intent never may.
    accepted_while_down = [a for a in during if a.status in (200, 202) and not a.replayed]
    not_503 = [a for a in during if a.status is not None and not is_503_problem(a)]
    s = harness.conclude("D1", outs, q, mock.url, pfx, drain_timeout=60, emit=False,
                         outages=len(outages),
                         answers_while_down=len(during),
                         answered_503_while_down=sum(1 for a in during if is_503_problem(a)))
    alive = all(reps[n].alive() for n in ("a", "b"))
    restarts = sum(reps[n].starts - 1 for n in ("a", "b"))
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert alive and restarts == 0, "a replica crashed while the database was down"
    assert during, "no request was answered while the database was down"
    assert not accepted_while_down, accepted_while_down[:5]
    assert not not_503, not_503[:5]
    assert all(st == 503 and b["ready"] is False for st, b in ready_while_down), ready_while_down
    assert s["completed"] == s["intents"] and s["unknown_after_drain"] == 0, s


# --- D2 -----------------------------------------------------------------------------------------

@pytest.fixture
def proxy(own):
    cluster = own.cluster
    d = tempfile.mkdtemp(prefix="idemgate-pgproxy-")
    os.chmod(d, 0o755)
    p = PgProxy(cluster.sock_dir, d, cluster.port).start()
    yield p, cluster.url_for(d, own.db)
    p.close()
    os.rmdir(d) if not os.listdir(d) else None


def test_d2_connection_lost_during_commit_re_read_decides(gateway_factory, mock, own, proxy):
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    tag = providers.tag()
    entries = [providers.lookup(mock.url, "lookup" + tag), providers.keyed(mock.url, "keyed" + tag)]
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b"):
        reps.start(name, env={"DATABASE_URL": via_proxy}, providers=entries, lease_seconds=LEASE)
    pfx = harness.prefix("d2")
    n = size(150, 600)
    its = harness.intents(pfx, tokens, entries, n)
    px.randomly(budget=size(60, 240), intake=(0.15, 0.2), claim=(0.05, 0.08),
                finish=(0.05, 0.08), reconcile_claim=(0.05, 0.05))
    outs = run_all(Client(lambda: reps.ports(), RetryPolicy(max_seconds=60)), its,
                   concurrency=8)
    px.quiet()
    faults = {f"{stmt}:{mode}{'+committed' if c else ''}": 0 for _, stmt, mode, c in px.injected}
    for _, stmt, mode, c in px.injected:
        faults[f"{stmt}:{mode}{'+committed' if c else ''}"] += 1
    s = harness.conclude("D2", outs, q, mock.url, pfx, drain_timeout=60, emit=False,
                         faults=faults,
                         client_503=sum(1 for o in outs for a in o.attempts if a.status == 503))
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    committed_lost = px.count("intake", "after")
    assert committed_lost > 0, "no intake COMMIT was lost: the scenario did not happen"
    assert s["completed"] == n and s["creates"] == n, s
    rows = q(f"SELECT count(*), count(DISTINCT idempotency_key) FROM operations "
             f"WHERE idempotency_key LIKE '{pfx}-%'")
    assert rows == [[str(n), str(n)]], rows


def test_d2_lost_commit_answers_with_the_committed_row(gateway_factory, mock, own, proxy):
    """Deterministic D2: the first intake COMMIT (the group commit's) is lost; the gateway's
    re-run on a new connection finds the row it proposed and answers 202 (a creation, not a
    replay). The group commit and both single re-runs lost: 503 problem+json with Retry-After —
    and the client's retry gets the committed row."""
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE)
    pfx = harness.prefix("d2det")
    its = harness.intents(pfx, tokens, [entry], 2)

    px.fail_next("intake", "after")
    a = post(g.port, its[0], 10)
    assert a.status == 202 and not a.replayed, a
    assert px.count("intake", "after") == 1
    assert q(f"SELECT id FROM operations WHERE idempotency_key = '{its[0].key}'") == [[a.job_id]]

    px.fail_next("intake", "after", "after", "after")
    b = post(g.port, its[1], 10)
    assert is_503_problem(b), b
    row = q(f"SELECT id FROM operations WHERE idempotency_key = '{its[1].key}'")
    assert len(row) == 1, "the first try committed"
    b2 = post(g.port, its[1], 10)
    assert b2.status == 202 and b2.replayed and b2.job_id == row[0][0], b2

    from chaos.client import Outcome
    outs = [Outcome(its[0], [a], "ok"), Outcome(its[1], [b, b2], "ok")]
    s = harness.conclude("D2-deterministic", outs, q, mock.url, pfx, drain_timeout=30,
                         emit=False)
    s["faults"] = px.count()
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 2 and s["creates"] == 2, s


def test_a_born_send_whose_start_is_lost_is_given_back_at_once(gateway_factory, mock, own,
                                                                 proxy):
    """A new job is reserved for this replica's dispatcher at intake (a born claim); the
    statement starting its send loses its connection before it runs. Nothing was sent, and the
    row is still the reservation. Before: it waited for the reservation to end (lease_seconds
    after the intake: 120 s here) before any dispatcher could send it. Now it is given back, due
    at once: sent once, completed well inside that time."""
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=120)
    pfx = harness.prefix("bornlost")
    [it] = harness.intents(pfx, tokens, [entry], 1)
    px.fail_next("begin_send", "before")
    a = post(g.port, it, 10, extra_headers={"Prefer": "respond-async"})
    assert a.status == 202 and a.job_id, a
    deadline = time.monotonic() + 40
    while q(f"SELECT state FROM operations WHERE id = '{a.job_id}'") != [["completed"]]:
        assert time.monotonic() < deadline, (
            "still waiting for its reservation to end",
            q(f"SELECT state, lease_owner, next_attempt_at - created_at FROM operations "
              f"WHERE id = '{a.job_id}'"), px.count("begin_send", "before"))
        time.sleep(0.1)
    assert px.count("begin_send", "before") == 1, "the start was never lost"
    from chaos.client import Outcome
    s = harness.conclude("born-start-lost", [Outcome(it, [a], "ok")], q, mock.url, pfx,
                         drain_timeout=30, emit=False)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 1 and s["creates"] == 1, s


def test_a_claim_whose_answer_was_lost_is_given_back_and_sent_once(gateway_factory, mock, own,
                                                                      proxy):
    """A dispatcher's claim commits — the row `sending` under a new lease — and its answer is
    lost with its connection: the gateway never learns which row it took, and nothing was sent.
    Before: the row waited out its lease, the reaper made it `unknown` and, with reconcile
    `none`, it went to review though the provider never saw it. Now every claim names itself (a
    random suffix to its owner); the row that claim moved is written back to `prepared` on a new
    connection and sent once: completed, never ambiguous."""
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    entry = providers.plain(mock.url, "plain" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    # A replica without dispatchers records the job: `prepared`, for any replica's claim.
    a = reps.start("a", env={"DATABASE_URL": own.url}, providers=[entry], dispatch_workers=0,
                   lease_seconds=LEASE)
    pfx = harness.prefix("claimlost")
    [it] = harness.intents(pfx, tokens, [entry], 1)
    r = post(a.port, it, 10, extra_headers={"Prefer": "respond-async"})
    assert r.status == 202 and r.job_id, r
    row = f"SELECT state, lease_owner IS NULL FROM operations WHERE id = '{r.job_id}'"
    assert q(row) == [["prepared", "t"]]
    px.fail_next("claim", "after")
    reps.start("b", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE)
    deadline = time.monotonic() + 30
    while q(f"SELECT state FROM operations WHERE id = '{r.job_id}'") not in (
            [["completed"]], [["review"]]):
        assert time.monotonic() < deadline, q(row)
        time.sleep(0.1)
    assert px.count("claim", "after") == 1, "no claim's answer was lost"
    from chaos.client import Outcome
    s = harness.conclude("claim-answer-lost", [Outcome(it, [r], "ok")], q, mock.url, pfx,
                         drain_timeout=30, emit=False)
    stop_clean(reps)
    decisions = q(f"SELECT decision FROM attempts WHERE operation_id = '{r.job_id}'")
    assert ["unknown"] not in decisions, decisions  # never ambiguous: it never left
    harness.assert_clean(s)
    assert s["completed"] == 1 and s["creates"] == 1, s


@pytest.mark.skipif(not harness.FULL, reason="make chaos only (CHAOS_FULL=1): about 3 minutes")
def test_a_result_whose_write_waits_past_two_minutes_inside_its_lease_is_kept(
        gateway_factory, mock, own, proxy):
    """A paid answer arrived; every write of it fails for 135 s (the database unreachable from
    this replica) while its lease (170 s) still holds. Before, the write gave up after 120 s:
    the answer was dropped, the job reaped to `unknown` and, with no way to look the task up
    (reconcile `none`), it went to review — a paid result lost. Now the write keeps trying for
    as long as it may still be accepted: the job ends `completed` with its result, sent once.
    (The tenant has a budget: its results are written one by one, by the statement whose window
    this is; a batch's failed write is then retried row by row, each with a window of its own.)"""
    q = own.q
    px, via_proxy = proxy
    name = "longwrite-" + uuid.uuid4().hex[:8]
    tokens = [own.cluster.tenant(GATEWAY_BIN, name, own.url)]
    subprocess.check_call([GATEWAY_BIN, "tenant", "budget", name, "--in-flight", "100"],
                          env=dict(os.environ, DATABASE_URL=own.url), timeout=60,
                          stdout=subprocess.DEVNULL)
    entry = providers.plain(mock.url, "plain" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=170)
    pfx = harness.prefix("longwrite")
    [it] = harness.intents(pfx, tokens, [entry], 1)
    px.fail_next("finish", *(["before"] * 2000))
    a = post(g.port, it, 10, extra_headers={"Prefer": "respond-async"})
    assert a.status == 202 and a.job_id, a
    assert wait_until(lambda: px.count("finish", "before") >= 1, 30), "no write was refused"
    first = time.monotonic()
    while time.monotonic() - first < 135:
        assert q(f"SELECT state FROM operations WHERE id = '{a.job_id}'") == [["sending"]]
        time.sleep(1)
    px.quiet()
    refused = px.count("finish", "before")
    assert wait_until(lambda: q(f"SELECT state FROM operations WHERE id = '{a.job_id}'")
                      != [["sending"]], 30), "the result was never written"
    [[state, body]] = q(f"SELECT state, resp_body IS NOT NULL FROM operations "
                        f"WHERE id = '{a.job_id}'")
    assert (state, body) == ("completed", "t"), (state, body, refused)
    from chaos.client import Outcome
    s = harness.conclude("long-result-write", [Outcome(it, [a], "ok")], q, mock.url, pfx,
                         drain_timeout=30, emit=False)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 1 and s["creates"] == 1, s


@pytest.mark.skipif(not harness.FULL, reason="make chaos only (CHAOS_FULL=1): about 2.5 minutes")
def test_a_result_whose_write_waits_out_a_whole_database_outage_is_kept(gateway_factory, mock,
                                                                        own):
    """A paid answer arrives while PostgreSQL itself is down (stopped at once), and stays down
    past the write's window (120 s here: a 20 s lease). Before, the write gave up at the window
    as if another replica could have moved the job on — nobody could — the answer was dropped,
    the job reaped to `unknown` once the database was back and, with no way to look the task up
    (reconcile `none`), sent to review: a paid result lost. Now a write that cannot reach the
    database at all keeps trying until it can: `completed` with its result, sent once."""
    cluster, q, tokens = own.cluster, own.q, own.tokens
    entry = providers.plain(mock.url, "plain" + providers.tag(),
                            timeouts={"connect_ms": 1000, "total_ms": 10000})
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": own.url}, providers=[entry], lease_seconds=20)
    pfx = harness.prefix("outage")
    [it] = harness.intents(pfx, tokens, [entry], 1, mock={"delay_ms": 3000})
    a = post(g.port, it, 10, extra_headers={"Prefer": "respond-async"})
    assert a.status == 202 and a.job_id, a
    # The create has reached the provider (its answer comes 3 s later): the database goes.
    assert wait_until(lambda: len(mock.creates_for(a.job_id)) == 1, 20), "never sent"
    cluster.stop_immediate()
    try:
        time.sleep(135)
    finally:
        cluster.start()
    assert wait_until(lambda: q(f"SELECT state FROM operations WHERE id = '{a.job_id}'")
                      not in ([["sending"]], [["unknown"]]), 60), "the result was never written"
    [[state, body]] = q(f"SELECT state, resp_body IS NOT NULL FROM operations "
                        f"WHERE id = '{a.job_id}'")
    assert (state, body) == ("completed", "t"), (state, body, g.log()[-3000:])
    from chaos.client import Outcome
    s = harness.conclude("outage-result-write", [Outcome(it, [a], "ok")], q, mock.url, pfx,
                         drain_timeout=30, emit=False)
    stop_clean(reps)
    harness.assert_clean(s)


def test_l1_stall_between_the_claim_commit_and_its_answer(gateway_factory, mock, own, proxy):
    """L1 at another place: the dispatcher's claim commits (`sending`, lease 3 s) but its answer
    reaches the worker 4.5 s later — a stall between the COMMIT and the worker reading it (a
    frozen process, a slow network, a CPU-starved host). By then the lease is over: another
    replica reaped it (unknown), looked the task up (404: proven absent) and made it due again.
    The stale worker must not send: its lease ended before it even learnt it had one.

    Found by this test on the gateway before c0c7186 (two paid creates: the send deadline was
    anchored at a monotonic time taken *after* store_claim() returned, so the delay between the
    COMMIT and its answer was added to the lease). c0c7186 takes that time before the claim is
    sent; this test keeps it that way."""
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    # The takeover replica talks to PostgreSQL directly: intake, reaper, reconciler, dispatcher.
    t = reps.start("takeover", env={"DATABASE_URL": own.url}, providers=[entry],
                   lease_seconds=LEASE, dispatch_workers=0)
    pfx = harness.prefix("l1claim")
    its = harness.intents(pfx, tokens, [entry], 1)
    first = post(t.port, its[0], 10)
    assert first.status == 202, first
    px.delay_next("claim", LEASE + 1.5)
    reps.start("stale", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE,
               dispatch_workers=1)
    assert wait_until(lambda: px.count("claim", "delay") == 1, 10), "the claim was not delayed"
    outs = [run_all(Client([t.port]), its, 1)[0]]
    s = harness.conclude("L1-claim-answer-delayed", outs, q, mock.url, pfx, drain_timeout=30,
                         emit=False)
    s["stale_sends"] = max(0, s["creates"] - 1)
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 1 and s["creates"] == 1, s


# --- lifecycle ----------------------------------------------------------------------------------

def test_connection_lost_mid_request_is_503_and_workers_reconnect(gateway_factory, mock, own,
                                                                  proxy):
    q, tokens = own.q, own.tokens
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    # One HTTP thread (one database connection) and no dispatcher in this replica.
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE,
                   http_threads=1, dispatch_workers=0)
    pfx = harness.prefix("lost")
    its = harness.intents(pfx, tokens, [entry], 2)
    first = post(g.port, its[0], 10)
    assert first.status == 202
    # A read whose connection dies is run once more on a new connection (it only reads:
    # rerun_safe), so the client gets its answer.
    px.fail_next("job_get", "before")
    st, _, body = get(g.port, f"/v1/jobs/{first.job_id}", its[0].token)
    assert st == 200, body
    # Lost twice in a row: 503 problem+json, Retry-After; the next read reconnects.
    px.fail_next("job_get", "before", "before")
    st, h, body = get(g.port, f"/v1/jobs/{first.job_id}", its[0].token)
    assert st == 503 and "retry-after" in h and "problem+json" in h["content-type"], (st, body)
    assert json.loads(body)["type"] == "urn:idemgate:problem:store-unavailable"
    st, _, body = get(g.port, f"/v1/jobs/{first.job_id}", its[0].token)
    assert st == 200, body
    # A dispatcher whose claims die with their connection: it reconnects and dispatches. The
    # second lost claim committed: its lease expires, the job is reconciled (proven absent at
    # the provider) and then sent, once.
    second = post(g.port, its[1], 10)
    assert second.status == 202
    px.fail_next("claim", "before", "after")
    reps.start("w", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE,
               dispatch_workers=1)
    outs = [run_all(Client([g.port]), [i], 1)[0] for i in its]
    s = harness.conclude("lifecycle-db-lost", outs, q, mock.url, pfx, drain_timeout=30,
                         emit=False)
    s["faults"] = px.count()
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert px.count("claim") == 2 and px.count("job_get") == 3, px.injected
    assert s["completed"] == 2 and s["creates"] == 2, s


@pytest.mark.parametrize("stop_mode", ["fast", "immediate"])
def test_postgres_restart_under_a_running_gateway_every_request_succeeds(gateway_factory, mock,
                                                                        own, stop_mode):
    """Issue 14 §5: after PostgreSQL came back, each server thread's first statement on its
    dead connection failed with 503 store-unavailable. A connection the server closed while it
    sat idle is now found dead before anything is sent on it and replaced, so every request
    after the restart succeeds at its first attempt: reads (GET, list), new intents (group
    commit) and a cancel (a write that is never rerun blindly)."""
    cluster, tokens = own.cluster, own.tokens
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    threads = 4
    reps = Replicas(gateway_factory, free_port)
    # No workers: the jobs stay `prepared`, so every read goes to the database (a terminal job
    # could be answered from the job cache).
    g = reps.start("g", env={"DATABASE_URL": own.url}, providers=[entry], lease_seconds=LEASE,
                   http_threads=threads, dispatch_workers=0, reconcile_workers=0,
                   poll_workers=0, reaper_interval_ms=0)
    pfx = harness.prefix(f"pgrestart-{stop_mode}")
    its = harness.intents(pfx, tokens, [entry], 8)
    first = [post(g.port, i, 10) for i in its[:4]]
    assert all(a.status == 202 for a in first), first
    jobs = [(i.token, a.job_id) for i, a in zip(its, first)]

    def burst(n):
        """n concurrent reads on fresh connections: every server thread takes some."""
        out = [None] * n
        def one(k):
            tok, job = jobs[k % len(jobs)]
            path = f"/v1/jobs/{job}" if k % 2 == 0 else "/v1/jobs?limit=5"
            out[k] = get(g.port, path, tok, timeout=10)[0]
        ts = [threading.Thread(target=one, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    # Every server thread holds an open connection before the restart.
    assert burst(8 * threads) == [200] * (8 * threads)
    backends = own.q("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid()")[0][0]
    assert int(backends) >= threads, backends

    if stop_mode == "fast":
        cluster.stop()
    else:
        cluster.stop_immediate()
    assert not cluster.is_running()
    cluster.start()

    # No retry anywhere below: each request is answered at its first attempt.
    reads = burst(8 * threads)
    assert reads == [200] * (8 * threads), reads
    news = [post(g.port, i, 10) for i in its[4:]]
    assert [a.status for a in news] == [202] * 4, news
    tok, job = jobs[0]
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
    conn.request("POST", f"/v1/jobs/{job}/cancel", headers={"Authorization": f"Bearer {tok}"})
    r = conn.getresponse()
    r.read()
    conn.close()
    assert r.status in (200, 202), r.status
    log = g.log()
    assert "store-unavailable" not in log and '"status":503' not in log, log[-3000:]
    assert '"db_reconnect"' in log
    stop_clean(reps)


def test_sigterm_drains_answers_waiters_releases_leases(gateway_factory, mock, psql, token):
    entry = providers.lookup(mock.url, "lookup" + providers.tag(),
                             timeouts={"connect_ms": 1000, "total_ms": 3000})
    reps = Replicas(gateway_factory, free_port)
    # Room for two calls in flight: the third and fourth intents wait `prepared`, unclaimed.
    g = reps.start("g", providers=[entry], lease_seconds=5, dispatch_workers=2,
                   max_inflight_calls=2)
    pfx = harness.prefix("term")
    its = harness.intents(pfx, [token], [entry], 4, mock={"delay_ms": 2000})
    for i in its[:2]:  # waiting clients, their jobs in flight at the provider
        i.headers["Prefer"] = "wait=60"
    answers = {}

    def wait_client(i):
        answers[i.key] = post(g.port, i, 90)

    waiters = [threading.Thread(target=wait_client, args=(i,), daemon=True) for i in its[:2]]
    for t in waiters:
        t.start()
    assert wait_until(lambda: len(mock.ledger()) == 2, 10), "two creates are in flight"
    queued = [post(g.port, i, 10) for i in its[2:]]  # no room for their calls: they stay prepared
    assert all(a.status == 202 for a in queued), queued

    g.gw.proc.send_signal(15)
    assert wait_until(lambda: '"shutdown"' in g.log(), 10)
    late = Intent(token, f"{pfx}-late", {"prompt": f"chaos {pfx}-late", "n": 1},
                  providers.route(entry))
    late_answer = post(g.port, late, 3)
    code = g.gw.proc.wait(timeout=60)
    exited = time.time()
    for t in waiters:
        t.join(timeout=10)

    assert code == 0, g.log()[-3000:]
    assert late_answer.status not in (200, 202), late_answer
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{late.key}'") == [["0"]]
    # Waiting clients were answered during the shutdown (with the state then), not dropped.
    for i in its[:2]:
        a = answers.get(i.key)
        assert a is not None and a.status in (200, 202) and a.job_id, a
        assert a.t1 <= exited
    # In-flight calls finished and were written; nobody holds a lease.
    rows = psql("SELECT state, coalesce(lease_owner, '') FROM operations "
                f"WHERE idempotency_key LIKE '{pfx}-%' ORDER BY idempotency_key")
    states = sorted(r[0] for r in rows)
    assert states == ["completed", "completed", "prepared", "prepared"], rows
    assert all(r[1] == "" for r in rows), rows
    # Nothing is lost: another replica dispatches what was queued.
    reps.start("h", providers=[entry], lease_seconds=5)
    outs = [run_all(Client([reps["h"].port]), [i], 1)[0] for i in its]
    s = harness.conclude("lifecycle-sigterm", outs, psql, mock.url, pfx, drain_timeout=30,
                         emit=False, waiting_answered=len(answers), exit_code=code)
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 4 and s["creates"] == 4, s


def test_a_shutdown_leaves_a_request_its_database_worker_holds_to_that_worker(
        gateway_factory, mock, own, proxy):
    """A request on a database worker when the drain's 5 s run out, whose client has gone (a
    reset): the drain resumed every suspended request, this one too, and libmicrohttpd closed
    its connection at once and freed the request under the worker still reading the database
    for it — which then wrote its answer into freed memory, before any result still in flight
    was written. Now the drain leaves it to its worker, which lets go of it once the read
    returns: the gateway exits 0 after the stalled read, and still answers a client that
    stayed."""
    import socket
    import struct
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE,
                   db_workers=2)
    token = own.tokens[0]
    seen = px.statements.get("job_get", 0)
    px.delay_next("job_get", 10)  # the gone client's read
    px.delay_next("job_get", 10)  # the staying client's read
    missing = "job_" + "".join(random.choice("abcdefghijklmnopqrstuvwxyz234567")
                               for _ in range(26))
    gone = socket.create_connection(("127.0.0.1", g.port), timeout=5)
    gone.sendall(f"GET /v1/jobs/{missing} HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    staying = []
    t = threading.Thread(target=lambda: staying.append(
        get(g.port, f"/v1/jobs/{missing}", token, timeout=60)), daemon=True)
    t.start()
    assert wait_until(lambda: px.statements.get("job_get", 0) >= seen + 2, 20), \
        "both reads are held on the database workers"
    # The gone client resets its connection while its read is held.
    gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()
    g.gw.proc.send_signal(15)
    code = g.gw.proc.wait(timeout=60)
    t.join(timeout=10)
    assert code == 0, g.log()[-3000:]
    assert "http_drain_timeout" in g.log(), "the drain ran out while the reads were held"
    assert staying and staying[0][0] == 404, staying


def test_started_with_the_database_down(gateway_factory, mock):
    c = Cluster()
    try:
        c.start()   # a cluster with an empty database: never migrated
        c.stop()
        entry = providers.lookup(mock.url, "lookup" + providers.tag())
        reps = Replicas(gateway_factory, free_port)
        g = reps.start("g", env={"DATABASE_URL": c.url}, providers=[entry], lease_seconds=LEASE)
        st, _, body = get(g.port, "/readyz")
        assert st == 503 and json.loads(body)["ready"] is False, body
        assert get(g.port, "/healthz")[0] == 200
        a = post(g.port, Intent("no-such-token", "k-down", {"prompt": "x"}, providers.route(entry)),
                 10)
        assert is_503_problem(a), a
        time.sleep(2.0)  # it keeps retrying in the background
        assert g.alive(), g.log()[-2000:]
        c.start()
        assert wait_until(lambda: get(g.port, "/readyz")[0] == 200, 30), g.log()[-2000:]
        # Migrated by the replica once the database came up; now it takes work.
        token = c.tenant(GATEWAY_BIN, "late-" + uuid.uuid4().hex[:8])
        pfx = harness.prefix("down")
        its = harness.intents(pfx, [token], [entry], 3)
        outs = run_all(Client([g.port]), its, 1)
        s = harness.conclude("lifecycle-db-down-at-start", outs, sql(c.url), mock.url, pfx,
                             drain_timeout=30, emit=False,
                             db_unavailable_logs=g.log().count("db_unavailable"))
        harness.emit(s)
        stop_clean(reps)
        harness.assert_clean(s)
        assert s["completed"] == 3 and s["creates"] == 3, s
    finally:
        c.destroy()


# --- a slow database -----------------------------------------------------------------------------

def test_slow_database_stalls_no_server_thread(gateway_factory, mock, own, proxy):
    """No server thread waits on the database: while every database worker (and more) is stuck
    on a job read whose answer the database holds back, /healthz, a replay of a finished job and
    a read of it — both answered from memory — still answer, before any stuck read returns.
    With server threads reading the database themselves, two stuck reads took both threads and
    everything behind them waited."""
    tokens = own.tokens
    px, via_proxy = proxy
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], lease_seconds=LEASE,
                   http_threads=2, db_workers=2)
    pfx = harness.prefix("slowdb")
    it = harness.intents(pfx, tokens, [entry], 1)[0]
    done = post(g.port, it, 30, {"Prefer": "wait=20"})
    assert done.status == 200 and done.job_id, done

    def settled():
        # A completed job's view is kept in memory for long once its archive no longer changes
        # (planned, no output pending); this read then caches it by id.
        st, _, b = get(g.port, f"/v1/jobs/{done.job_id}", it.token)
        arch = json.loads(b).get("archive") if st == 200 else None
        return bool(arch) and all(o["state"] != "pending" for o in arch)
    assert wait_until(settled, 20)

    stuck = 4
    for _ in range(stuck):
        px.delay_next("job_get", 8)
    seen = px.statements.get("job_get", 0)
    finished = []

    def slow_read(i):
        missing = "job_" + "".join(random.choice("abcdefghijklmnopqrstuvwxyz234567")
                                   for _ in range(26))
        st, _, _ = get(g.port, f"/v1/jobs/{missing}", it.token, timeout=60)
        finished.append((time.monotonic(), st))

    threads = [threading.Thread(target=slow_read, args=(i,)) for i in range(stuck)]
    for t in threads:
        t.start()
    # Both database workers hold a stuck read; the other two wait in their queue.
    assert wait_until(lambda: px.statements.get("job_get", 0) >= seen + 2, 20)

    health = get(g.port, "/healthz", timeout=60)
    replay = post(g.port, it, 60, {"Prefer": "wait=20"})
    cached = get(g.port, f"/v1/jobs/{done.job_id}", it.token, timeout=60)
    answered_before = len(finished)
    for t in threads:
        t.join(90)
    stop_clean(reps)
    assert health[0] == 200, health
    assert replay.status == 200 and replay.replayed and replay.job_id == done.job_id, replay
    assert cached[0] == 200, cached
    assert answered_before == 0, "a stuck read returned before the answers from memory"
    assert [st for _, st in finished] == [404] * stuck, finished


def test_a_wait_ends_at_its_deadline_while_the_waiters_read_stalls(gateway_factory, mock, own,
                                                                   proxy):
    """A `Prefer: wait` is answered at its deadline whatever the database does: the waiters'
    thread reads the jobs of new waiters (terminal_ids) and listens, and while one of its reads
    waited on a database that held its answer back, no deadline was kept — every wait on the
    replica was answered only once the read returned (up to tcp_user_timeout, a minute, on a
    silent peer). The deadlines now run on a thread of their own."""
    tokens = own.tokens
    px, via_proxy = proxy
    # Slow creates, and a timeout above them: neither job ends before its wait does.
    entry = providers.lookup(mock.url, "lookup" + providers.tag(),
                             timeouts={"connect_ms": 1000, "total_ms": 8000})
    reps = Replicas(gateway_factory, free_port)
    g = reps.start("g", env={"DATABASE_URL": via_proxy}, providers=[entry], wait_poll_ms=100)
    pfx = harness.prefix("waitstall")
    its = harness.intents(pfx, tokens, [entry], 2, mock={"delay_ms": 6000})
    px.delay_next("terminal_ids", 15)
    first = []
    t = threading.Thread(target=lambda: first.append(post(g.port, its[0], 60,
                                                          {"Prefer": "wait=30"})))
    t.start()
    # The waiters' thread reads the first job's state; the proxy holds the answer back.
    assert wait_until(lambda: px.count("terminal_ids", "delay") == 1, 20), \
        "the waiters' read was not delayed"
    second = post(g.port, its[1], 60, {"Prefer": "wait=1"})
    released_when_answered = list(px.released)
    t.join(90)
    stop_clean(reps)
    assert second.status == 202 and second.job_id, second
    assert released_when_answered == [], \
        "the wait was answered only once the waiters' stalled read returned"
    # The first wait, registered before the stall, is answered too (its job ends at 6 s).
    assert first and first[0].status == 200 and first[0].state == "completed", first
