"""Database failover (issue 14 §3): a PostgreSQL primary with a streaming standby, two gateway
replicas on a multi-host connection string, the primary killed with SIGKILL and the standby
promoted under load.

F1  synchronous replication (`synchronous_standby_names` names the standby,
    `synchronous_commit = on`): every acknowledged intent is on the new primary, nothing is
    created twice, every job finishes; the replicas reach the new primary by themselves
    (`host=A,B … target_session_attrs=read-write`), never restarted.
F2  asynchronous replication: the standby's WAL receiver is stopped, the primary acknowledges
    and finishes intents only it holds, then dies: after the promotion the checker finds every
    one of them lost, and a client that resubmits its key pays the provider a second time.
    The same checker that passes F1 fails here: F1 would catch a lost intent."""

import os
import sys
import threading
import time
import uuid

import pytest

from conftest import GATEWAY_BIN, ROOT, free_port

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import checker, harness, providers, report  # noqa: E402
from chaos.client import Client, Outcome, RetryPolicy, post, run_all  # noqa: E402
from chaos.replication import Replicated  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

size = harness.size
LEASE = 3


@pytest.fixture(scope="session", autouse=True)
def _chaos_report(pytestconfig):
    report.install(pytestconfig)


@pytest.fixture
def pair():
    r = Replicated().start_primary()
    yield r
    r.destroy()


def prepare(pair, synchronous):
    """A migrated database with two tenants on the primary, then the standby and the mode."""
    db = "fo_" + uuid.uuid4().hex[:10]
    pair.primary.create_db(db)
    url = pair.url(db)
    pair.primary.migrate(GATEWAY_BIN, url)
    tokens = [pair.primary.tenant(GATEWAY_BIN, "fo-" + uuid.uuid4().hex[:10], url)
              for _ in range(2)]
    pair.start_standby()
    pair.set_synchronous(synchronous)
    return db, url, tokens


def stop_clean(reps):
    codes = reps.stop_all()
    assert all(c == 0 for c in codes.values()), f"unclean exits after SIGTERM: {codes}"


def server_port(q):
    return int(q("SELECT current_setting('port')")[0][0])


def is_503_problem(a):
    return (a.status == 503 and a.retry_after and a.content_type
            and "problem+json" in a.content_type)


# --- F1 -----------------------------------------------------------------------------------------

def test_f1_synchronous_standby_promoted_under_load_loses_nothing(gateway_factory, mock, pair):
    failover_under_load(gateway_factory, mock, pair, "F1-failover-sync", pair.kill_primary)


def test_f3_fenced_primary_is_left_for_the_promoted_standby(gateway_factory, mock, pair):
    """A switchover: the primary is fenced (it stays up, its sessions open, but accepts no more
    writes), then the standby is promoted. Every replica's connections to the fenced primary
    must be given up for the new primary: a write refused as read-only (SQLSTATE 25006) is the
    server's way of saying the primary moved, like a lost connection — 503 and reconnect,
    never 500 — and a connection whose server reports itself read-only is replaced before
    use. Before that change, the replicas kept their sessions on the fenced primary and
    answered 500 to every write, after the promotion too."""
    failover_under_load(gateway_factory, mock, pair, "F3-switchover-fenced", pair.fence_primary,
                        fence=True)


def failover_under_load(gateway_factory, mock, pair, scenario, fault_primary, fence=False):
    """fence: the primary is fenced, not killed. Its backends take the reload each at its next
    statement, so a write may still commit on it (and reach the synchronous standby) a moment
    after the fence: a 202 in the window is then no fault — the checker proves the row is on the
    new primary — but a 500 is."""
    db, url, tokens = prepare(pair, synchronous=True)
    tag = providers.tag()
    entries = [providers.lookup(mock.url, "lookup" + tag), providers.keyed(mock.url, "keyed" + tag)]
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b"):
        reps.start(name, env={"DATABASE_URL": url}, providers=entries, lease_seconds=LEASE)
    pfx = harness.prefix("f1")
    before, after = size(150, 1500), size(150, 1500)
    # A pool larger than the run needs: the clients stop taking intents once `after` more were
    # acknowledged by the new primary (or the time is up).
    pool = harness.intents(pfx, tokens, entries, size(1500, 8000),
                           mock=lambda i: {"delay_ms": (i * 7) % 40})
    for k, it in enumerate(pool):
        if k % 10 == 0:  # a few clients wait for their result across the failover
            it.headers["Prefer"] = "wait=5"
    lock = threading.Lock()
    acks = []  # wall time of every acknowledgement
    phase = {}
    stop = threading.Event()

    refused = []  # start time of every 5xx answer

    def on_attempt(intent, a):
        with lock:
            if a.status in (200, 202) and a.job_id:
                acks.append(a.t1)
            elif a.status is not None and a.status >= 500:
                refused.append(a.t0)

    def acked():
        with lock:
            return len(acks)

    def fault():
        try:
            harness.wait_until(lambda: acked() >= before, size(60, 300), interval=0.05)
            phase["acked_before_kill"] = acked()
            fault_primary()
            phase["killed"] = time.time()
            # No primary at all for a while: every replica must say so (503), never 202. The
            # standby is promoted once requests that started after the kill were refused.
            harness.wait_until(lambda: sum(1 for t in list(refused) if t > phase["killed"]) >= 8,
                               size(30, 60), interval=0.05)
            phase["promoting"] = time.time()
            pair.promote()
            phase["promoted"] = time.time()
            n = acked()
            harness.wait_until(lambda: acked() >= n + after, size(90, 300), interval=0.05)
        finally:
            stop.set()

    ft = threading.Thread(target=fault, daemon=True)
    ft.start()
    client = Client(lambda: reps.ports(),
                    RetryPolicy(max_seconds=120, retry_after_cap=1.0), on_attempt=on_attempt)
    outs = run_all(client, pool, concurrency=8, stop=stop, pace=0.01)
    ft.join(timeout=120)
    outs = [o for o in outs if o.attempts]
    assert pair.killed and pair.promoted, phase

    q = pair.writable(db)  # the new primary, found the way the gateway finds it
    during = [a for o in outs for a in o.attempts
              if phase["killed"] < a.t0 and a.t1 < phase["promoting"]]
    accepted_without_primary = [a for a in during if a.status in (200, 202) and not a.replayed]
    s = harness.conclude(scenario, outs, q, mock.url, pfx, drain_timeout=90,
                         emit=False,
                         acked_before_kill=phase["acked_before_kill"],
                         acked_after_promotion=sum(1 for t in acks if t > phase["promoted"]),
                         answers_without_primary=len(during),
                         answered_503_without_primary=sum(1 for a in during
                                                          if is_503_problem(a)),
                         promote_s=round(phase["promoted"] - phase["promoting"], 2))
    starts = {n: reps[n].starts for n in ("a", "b")}
    alive = {n: reps[n].alive() for n in ("a", "b")}
    ready = [get_status(reps[n].port, "/readyz") for n in ("a", "b")]
    reconnects = sum(reps[n].log().count('"db_reconnect"') + reps[n].log().count("db_unavailable")
                     for n in ("a", "b"))
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert server_port(q) == pair.standby.port, "the writable server is not the promoted standby"
    assert starts == {"a": 1, "b": 1} and all(alive.values()), (starts, alive)
    assert ready == [200, 200], ready
    assert reconnects > 0, "the replicas never noticed the primary was gone"
    assert s["acked_before_kill"] >= 1 and s["acked_after_promotion"] >= 1, s
    assert during, "no request was answered while there was no primary"
    if not fence:
        assert not accepted_without_primary, accepted_without_primary[:5]
    not_503 = [a for a in during if a.status is not None and not is_503_problem(a)
               and not a.replayed and not (fence and a.status in (200, 202))]
    assert not not_503, not_503[:5]
    assert s["completed"] == s["intents"] == s["acknowledged"], s
    assert s["unknown_after_drain"] == 0 and s["review"] == 0, s


def get_status(port, path):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    except OSError:
        return None
    finally:
        conn.close()


# --- F2 -----------------------------------------------------------------------------------------

def test_f2_asynchronous_standby_promoted_loses_acknowledged_intents(gateway_factory, mock, pair):
    db, url, tokens = prepare(pair, synchronous=False)
    entry = providers.lookup(mock.url, "lookup" + providers.tag())
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b"):
        reps.start(name, env={"DATABASE_URL": url}, providers=[entry], lease_seconds=LEASE)
    pfx = harness.prefix("f2")
    n1, n2 = size(20, 200), size(20, 200)
    its = harness.intents(pfx, tokens, [entry], n1 + n2)
    client = Client(lambda: reps.ports(), RetryPolicy(max_seconds=60))
    q_primary = pair.admin(pair.primary, db)

    # Streaming (asynchronously): these reach the standby, which is waited for.
    first = run_all(client, its[:n1], concurrency=4)
    checker.drain(q_primary, pfx, 60)
    lsn = q_primary("SELECT pg_current_wal_lsn()")[0][0]
    q_standby = pair.admin(pair.standby, db)
    assert harness.wait_until(lambda: q_standby(
        f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn") == [["t"]], 60)

    # The standby falls behind (here: its WAL receiver stopped), which asynchronous replication
    # lets happen without telling anyone: the primary still acknowledges, and the jobs run.
    pair.detach_standby()
    second = run_all(client, its[n1:], concurrency=4)
    assert all(o.result == "ok" for o in first + second), [o.attempts[-1] for o in first + second
                                                           if o.result != "ok"][:3]
    checker.drain(q_primary, pfx, 60)
    done = q_primary(f"SELECT count(*) FROM operations WHERE idempotency_key LIKE '{pfx}-%' "
                     "AND state = 'completed'")[0][0]
    assert int(done) == n1 + n2, done

    pair.kill_primary()
    pair.promote()
    q = pair.writable(db)
    assert server_port(q) == pair.standby.port
    s = harness.conclude("F2-failover-async", first + second, q, mock.url, pfx, drain_timeout=30,
                         emit=False, replication="async, standby receiver stopped")
    harness.emit(s)
    # The checker that passes F1 fails here: every intent acknowledged after the standby fell
    # behind is gone from the new primary, though the provider made each one's task.
    v = checker.violations(s)
    assert v.get("lost") == n2, s
    assert s["_detail"]["lost"] == [i.key for i in its[n1:]][:20], s["_detail"]
    assert s["unexpected"] == n2, s  # creates the surviving database knows nothing of

    # The clients poll their jobs: 404. A client that resubmits its key gets a new job, and the
    # provider a second, paid create for one intended operation.
    resub = run_all(client, its[n1:], concurrency=4)
    again = [Outcome(o.intent, o.attempts + r.attempts, r.result) for o, r in zip(second, resub)]
    s2 = harness.conclude("F2-failover-async-resubmitted", first + again, q, mock.url, pfx,
                          drain_timeout=60, emit=False)
    harness.emit(s2)
    stop_clean(reps)
    v2 = checker.violations(s2)
    assert v2.get("duplicates") == n2 and v2.get("id_mismatch") == n2, s2
    assert s2["completed"] == n1 + n2 and s2["creates"] == n1 + 2 * n2, s2
