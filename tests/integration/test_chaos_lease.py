"""Leases under stalls and skewed clocks.

L1  a lease holder is frozen (SIGSTOP) past its lease, another replica takes over, then the
    holder resumes (SIGCONT): its writes must affect 0 rows (recorded as `fenced`) and it must not
    send anything. Two places to freeze it: while the provider holds its create (in flight), and
    between its `sending` commit and the first byte (its connect() held open by a gate).
K1  replicas whose wall clocks run 300 s ahead and behind (libfaketime): leases are database
    time, so nothing expires early and nobody takes over; and reconciliation by the provider's
    task list must not be misled by the replica's clock."""

import json
import os
import sys
import time

import pytest

from conftest import ROOT, free_port, tenant_token

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import harness, providers, report  # noqa: E402
from chaos.client import Client, RetryPolicy, run_all  # noqa: E402
from chaos.gate import Gate  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

size = harness.size
STALLS = size(2, 10)  # per L1 variant: 20 stalls in all at full size
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


@pytest.fixture(scope="session", autouse=True)
def _chaos_report(pytestconfig):
    report.install(pytestconfig)


@pytest.fixture
def tokens(token, database_url):
    return [token, tenant_token(database_url)]


def wait_until(pred, timeout):
    return harness.wait_until(pred, timeout, interval=0.02)


def op(psql, job_id):
    r = psql("SELECT state, lease_version, coalesce(remote_id, ''), updated_at, "
             f"coalesce(lease_owner, '') FROM operations WHERE id = '{job_id}'")
    return dict(zip(("state", "lease_version", "remote_id", "updated_at", "owner"), r[0]))


def attempts(psql, job_id):
    return psql("SELECT lease_version, kind, coalesce(outcome, ''), decision FROM attempts "
                f"WHERE operation_id = '{job_id}' ORDER BY seq")


def stop_clean(reps):
    codes = reps.stop_all()
    assert all(c == 0 for c in codes.values()), f"unclean exits after SIGTERM: {codes}"


# --- L1 ---------------------------------------------------------------------------------------

def test_l1_stall_while_the_provider_holds_the_create(gateway_factory, mock, psql, tokens):
    """Frozen with its create in flight: the takeover reconciles (lookup finds the task); the
    stale worker's result, when it resumes, is fenced; nothing is sent again."""
    entry = providers.lookup(mock.url, "lookup" + providers.tag(),
                             timeouts={"connect_ms": 1000, "total_ms": 2000})
    reps = Replicas(gateway_factory, free_port)
    reps.start("stale", providers=[entry], lease_seconds=4, dispatch_workers=1)
    take = reps.start("takeover", providers=[entry], lease_seconds=4, dispatch_workers=0)
    pfx = harness.prefix("l1a")
    its = harness.intents(pfx, tokens, [entry], STALLS, mock={"delay_ms": 1500})
    client = Client(lambda: [take.port], RetryPolicy(max_seconds=30))
    outs, fenced, stale_sends = [], 0, 0
    for intent in its:
        o = client.perform(intent)
        outs.append(o)
        job = o.job_id
        assert job, o.attempts
        assert wait_until(lambda: mock.creates_for(job), 10), "the stale worker sent the create"
        reps.sigstop("stale")
        claimed = op(psql, job)
        # A claim names itself: the replica's name, then a suffix of its own (lease.c).
        assert claimed["state"] == "sending" and claimed["owner"].split("~")[0] == "stale", \
            claimed
        # Past its lease the takeover replica reaps it (unknown) and looks the task up: found.
        assert wait_until(lambda: op(psql, job)["state"] == "completed", 30), op(psql, job)
        before = op(psql, job)
        sent_before = len(mock.creates_for(job))
        reps.sigcont("stale")
        # The stale worker wakes up with its answer (or its timeout) and writes it: 0 rows.
        assert wait_until(lambda: any(a[3] == "fenced" for a in attempts(psql, job)), 10), \
            attempts(psql, job)
        time.sleep(0.5)
        after = op(psql, job)
        assert after == before, (before, after)
        stale_versions = [a for a in attempts(psql, job) if a[0] == claimed["lease_version"]]
        assert [a[3] for a in stale_versions] == ["fenced"] or \
            [a[3] for a in stale_versions] == ["unknown", "fenced"], stale_versions
        fenced += sum(1 for a in attempts(psql, job) if a[3] == "fenced")
        stale_sends += len(mock.creates_for(job)) - sent_before
    s = harness.conclude("L1-inflight", outs, psql, mock.url, pfx, drain_timeout=20, emit=False,
                         stalls=len(its), fenced_writes=fenced, stale_sends=stale_sends)
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert stale_sends == 0 and fenced == len(its), s
    assert s["completed"] == len(its) and s["creates"] == len(its), s


def test_l1_stall_between_the_sending_commit_and_the_first_byte(gateway_factory, mock, psql,
                                                               tokens):
    """Frozen after its `sending` commit, its connect() held by the gate. Its lease runs out, the
    takeover reaps it (unknown) and, with no way to look (plain provider), puts it in review.
    When the stale worker resumes its connection is there, but its lease is not: it must send
    nothing (PREREQFUNCTION checks the lease), and its `not sent` result must not move the job
    back to prepared."""
    gate = Gate()
    entry = providers.plain(gate.url, "plain" + providers.tag(),
                            timeouts={"connect_ms": 2000, "total_ms": 2000})
    reps = Replicas(gateway_factory, free_port)
    reps.start("stale", providers=[entry], lease_seconds=4, dispatch_workers=1)
    take = reps.start("takeover", providers=[entry], lease_seconds=4, dispatch_workers=0)
    pfx = harness.prefix("l1b")
    its = harness.intents(pfx, tokens, [entry], STALLS)
    client = Client(lambda: [take.port], RetryPolicy(max_seconds=30))
    outs, fenced, stale_bytes = [], 0, 0
    try:
        for intent in its:
            o = client.perform(intent)
            outs.append(o)
            job = o.job_id
            assert job, o.attempts
            assert wait_until(lambda: op(psql, job)["state"] == "sending", 10), op(psql, job)
            time.sleep(0.2)  # its connect() is waiting for a SYN-ACK that does not come
            reps.sigstop("stale")
            claimed = op(psql, job)
            gate.open()  # the kernel completes the handshake while the worker is frozen
            assert wait_until(lambda: op(psql, job)["state"] == "review", 30), op(psql, job)
            before = op(psql, job)
            reps.sigcont("stale")
            assert wait_until(lambda: any(a[3] == "fenced" for a in attempts(psql, job)), 10), \
                attempts(psql, job)
            got = gate.drain(wait=1.0, read_for=1.0)
            stale_bytes += got
            assert got == 0, f"the stale worker sent {got} bytes past its lease"
            assert op(psql, job) == before, "a stale write changed the job"
            rows = [a for a in attempts(psql, job) if a[0] == claimed["lease_version"]]
            assert [a[3] for a in rows] == ["unknown", "fenced"], rows
            assert rows[1][2] == "not_sent", rows
            fenced += 1
            gate.rearm()
    finally:
        gate.close()
    s = harness.conclude("L1-presend", outs, psql, mock.url, pfx, drain_timeout=20, emit=False,
                         stalls=len(its), fenced_writes=fenced, stale_bytes=stale_bytes)
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["review"] == len(its) and s["creates"] == 0, s


# --- K1 ---------------------------------------------------------------------------------------

def skewed(offset):
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": offset, "FAKETIME_NO_CACHE": "1"}


@pytest.fixture(scope="module")
def faketime_works():
    import subprocess
    if not os.path.exists(FAKETIME_LIB):
        pytest.fail("libfaketime is missing: apt-get install faketime")
    out = subprocess.check_output(["date", "+%s"], env=dict(os.environ, **skewed("+300s")),
                                  text=True)
    assert int(out) - time.time() > 250, "libfaketime does not skew the clock"


def test_k1_skewed_replicas_take_no_lease_early(gateway_factory, mock, psql, tokens,
                                                faketime_works):
    """Three replicas dispatching and reaping, two of them 300 s off. Every create takes 1 s of
    a 4 s lease: with database time no lease looks expired, so nothing is reaped, fenced or sent
    twice."""
    entry = providers.lookup(mock.url, "lookup" + providers.tag(),
                             timeouts={"connect_ms": 1000, "total_ms": 2000})
    reps = Replicas(gateway_factory, free_port)
    for name, env in (("true", {}), ("ahead", skewed("+300s")), ("behind", skewed("-300s"))):
        reps.start(name, env=env, providers=[entry], lease_seconds=4, dispatch_workers=3)
    pfx = harness.prefix("k1")
    its = harness.intents(pfx, tokens, [entry], size(24, 120), mock={"delay_ms": 1000})
    outs = run_all(Client(lambda: reps.ports(), RetryPolicy(max_seconds=60)), its,
                   concurrency=6)
    s = harness.conclude("K1-leases", outs, psql, mock.url, pfx, drain_timeout=60, emit=False,
                         skew_s=[0, 300, -300])
    early = psql("SELECT count(*) FILTER (WHERE a.outcome = 'lease_expired'), "
                 "count(*) FILTER (WHERE a.decision = 'fenced') FROM attempts a "
                 "JOIN operations o ON o.tenant_id = a.tenant_id AND o.id = a.operation_id "
                 f"WHERE o.idempotency_key LIKE '{pfx}-%'")[0]
    s["reaped"], s["fenced"] = int(early[0]), int(early[1])
    s["dispatched_by"] = {n: reps[n].log().count('"event":"dispatched"')
                          for n in ("true", "ahead", "behind")}
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["reaped"] == 0 and s["fenced"] == 0, s
    assert s["completed"] == len(its) and s["creates"] == len(its), s
    assert all(s["dispatched_by"].values()), "every replica, skewed or not, dispatched"


@pytest.mark.parametrize("offset", ["+0s", "+300s", "-300s"])
def test_k1_list_reconciliation_ignores_the_replica_clock(offset, gateway_factory, mock, psql,
                                                          tokens, faketime_works):
    """A create whose answer is lost (the provider holds it past our timeout) is reconciled by
    listing the provider's recent tasks around the first send. The replica doing it runs 300 s
    off: the task is there all along, so it must be adopted — never "proven absent" and created
    a second time. (+0s is the control: the same replica under libfaketime, no skew.)

    Found by this test before a8ffdf6: reconciler.c look() built the list's `since`/`until`
    from the replica's wall clock (`time(NULL)`) widened by LIST_SLACK_S = 120 s, so a replica
    more than 120 s off asked for minutes that missed the task, found 0 matches and, once the
    recovery window closed, called it absent and created it a second time. The window now comes
    from the database's clock (first_sent_at, now())."""
    entry = providers.listed(mock.url, "listed" + providers.tag(), window_seconds=4)
    reps = Replicas(gateway_factory, free_port)
    reps.start("skewed", env=skewed(offset), providers=[entry], lease_seconds=3)
    pfx = harness.prefix("k1list")
    its = harness.intents(pfx, tokens, [entry], 1)
    mock.script([{"delay_ms": 2500}])  # past the 1 s timeout: ambiguous, the task exists
    outs = run_all(Client(lambda: reps.ports()), its, concurrency=1)
    s = harness.conclude(f"K1-list{offset[:-1]}", outs, psql, mock.url, pfx, drain_timeout=30,
                         emit=False, skew_s=int(offset[:-1]))
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["completed"] == 1, s


@pytest.mark.parametrize("offset", ["+0s", "+300s"])
def test_k1_retry_after_date_is_not_read_on_the_replica_clock(offset, gateway_factory, mock, psql,
                                                             tokens, faketime_works):
    """A 503 whose Retry-After is an HTTP-date 3 s ahead: the next try comes no earlier than
    that, whatever the replica's clock says. (+0s: control.)

    Found by this test before a8ffdf6: attempt.c server_hint_ms() read the date against the
    replica's own clock (bo_retry_after_ms(ra, time(NULL))); 300 s ahead, the date looked 297 s
    past, the hint became 0 and the create was resent after 0.5 s (−300 s would have waited
    303 s). The date is now read against the response's own Date header."""
    # This provider documents its 503 as "overloaded, nothing was made": a resend is safe.
    entry = providers.plain(mock.url, "plain" + providers.tag(),
                            retry=dict(providers.FAST_RETRY,
                                       not_created_statuses=[408, 425, 429, 503]))
    reps = Replicas(gateway_factory, free_port)
    reps.start("skewed", env=skewed(offset), providers=[entry], lease_seconds=3)
    pfx = harness.prefix("k1date")
    its = harness.intents(pfx, tokens, [entry], 1)
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3))
    mock.script([{"status": 503, "retry_after": date}])
    outs = run_all(Client(lambda: reps.ports()), its, concurrency=1)
    s = harness.conclude(f"K1-retry-after-date{offset[:-1]}", outs, psql, mock.url, pfx,
                         drain_timeout=30, emit=False, skew_s=int(offset[:-1]))
    entries = mock.creates_for(outs[0].job_id)
    gap = entries[1]["time"] - entries[0]["time"] if len(entries) == 2 else None
    s["retry_gap_s"] = round(gap, 3) if gap is not None else None
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert [e["status"] for e in entries] == [503, 200], entries
    # The date has whole seconds: the hint is between 2 and 3 s.
    assert gap >= 2.0, f"resent {gap:.3f} s after a 503 that asked for about 3 s"


@pytest.mark.parametrize("offset", ["+400s", "-400s"])
def test_k1_webhook_timestamps_are_judged_by_database_time(offset, gateway_factory, mock,
                                                           psql, faketime_works):
    """Issue 14 §4: a Standard Webhooks timestamp may be 300 s from now, and "now" is the
    database's clock, like leases. A replica whose own clock is 400 s off accepts a delivery
    signed at the true time and refuses one signed at its own (skewed) time; judged by its own
    clock it did the opposite."""
    from test_async import entry, post_hook, sign_standard, start
    e, _ = entry("replicate", mock)
    gw = start(gateway_factory, [e], env=skewed(offset))
    db_now = int(psql("SELECT floor(extract(epoch FROM clock_timestamp()))::bigint")[0][0])
    local_skew = int(offset[:-1])
    b = json.dumps({"id": "p_unknown_" + offset[1:], "status": "succeeded"}).encode()
    fresh = post_hook(gw, "replicate", b, f"msg_db_{offset}", ts=db_now,
                      sig=sign_standard(b, f"msg_db_{offset}", db_now))
    assert fresh.status == 200, fresh
    at_replica = db_now + local_skew
    skewed_ts = post_hook(gw, "replicate", b, f"msg_local_{offset}", ts=at_replica,
                          sig=sign_standard(b, f"msg_local_{offset}", at_replica))
    assert skewed_ts.status == 401, skewed_ts
