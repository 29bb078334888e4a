"""The call engine (engine.h, dispatcher.c): provider calls in flight hold no thread and no
database connection; their number is a setting (max_inflight_calls, globally and per provider);
calls in flight at SIGTERM end and are recorded, never dropped.

Slow providers are made with the mock's per-request delay; counts come from the gateway's
`idemgate_provider_calls_in_flight[_peak]` gauges, /proc and pg_stat_activity. No test asserts a
duration."""
import json
import os
import signal
import sys
import threading
import time
import uuid

from conftest import ROOT, provider

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos.harness import wait_until  # noqa: E402


def metric(gw, name):
    text = gw.http.request("GET", "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def connections(psql, app):
    return int(psql("SELECT count(*) FROM pg_stat_activity "
                    f"WHERE application_name = '{app}'")[0][0])


def submit_all(gw, tok, keys, delay_ms, route="mock-images/images/generations"):
    """Submits one job per key (no wait: 202 once recorded) from a few threads; returns ids."""
    ids, errors = {}, []

    def one(k):
        body = {"prompt": "engine " + k, "n": 1, "_mock": {"delay_ms": delay_ms}}
        r = gw.submit(tok, k, body, route=route)
        if r.status != 202:
            errors.append((k, r.status, r.body[:200]))
        else:
            ids[k] = r.json()["id"]

    ts = [threading.Thread(target=lambda ks=keys[i::8]: [one(k) for k in ks]) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return [ids[k] for k in keys]


def states(psql, ids):
    inlist = ",".join(f"'{i}'" for i in ids)
    return dict(psql(f"SELECT id, state FROM operations WHERE id IN ({inlist})"))


def settle(psql, ids, timeout=60):
    assert wait_until(lambda: set(states(psql, ids).values()) <= {"completed"}, timeout), \
        states(psql, ids)


def test_calls_in_flight_hold_no_thread_and_no_database_connection(
        gateway_factory, mock, token, psql, database_url):
    """One dispatcher thread keeps N slow calls in flight at once; while they wait the gateway
    has no more threads than when idle, and no more PostgreSQL connections than its fixed budget
    (deploy/SCALING.md: db_workers + intake_writers + dispatch_workers + reconcile_workers +
    poll_workers + archive_workers + 3, whatever is in flight). Each job is created exactly once.
    (Before the engine, one dispatch worker made one call at a time: a peak of 1.)"""
    app = "engine-" + uuid.uuid4().hex[:8]
    gw = gateway_factory(dispatch_workers=1, db_workers=4, intake_writers=2,
                         reconcile_workers=1, poll_workers=1, archive_workers=1,
                         env={"DATABASE_URL": f"{database_url}&application_name={app}"})
    budget = 4 + 2 + 1 + 1 + 1 + 1 + 3
    # Warm up every path the flight will use (intake, dispatch, result, read), then measure idle.
    first = submit_all(gw, token, [f"warm-{uuid.uuid4().hex[:6]}-{i}" for i in range(16)], 0)
    settle(psql, first)
    assert all(gw.job(token, i).status == 200 for i in first)
    time.sleep(0.5)
    idle_threads, idle_conns = threads_of(gw.proc.pid), connections(psql, app)
    assert 0 < idle_conns <= budget, (idle_conns, budget)

    n = 60
    keys = [f"fly-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
    ids = submit_all(gw, token, keys, 3500)  # under the provider's 5 s total timeout
    assert wait_until(lambda: metric(gw, "idemgate_provider_calls_in_flight") >= n, 30), \
        metric(gw, "idemgate_provider_calls_in_flight")
    flying_threads, flying_conns = threads_of(gw.proc.pid), connections(psql, app)
    assert metric(gw, "idemgate_provider_calls_in_flight_peak") >= n
    assert flying_threads == idle_threads, (idle_threads, flying_threads)
    assert flying_conns <= budget, (idle_conns, flying_conns, budget)
    settle(psql, ids)
    for job_id in ids:
        assert len(mock.creates_for(job_id)) == 1, job_id
    assert metric(gw, "idemgate_provider_calls_in_flight") == 0


def test_max_inflight_calls_bounds_the_calls_and_every_job_still_goes(gateway_factory, mock,
                                                                        token, psql):
    """max_inflight_calls 4: never more than 4 calls at once; the other jobs wait `prepared` (not
    claimed, no lease running) and all go, once each."""
    gw = gateway_factory(dispatch_workers=2, max_inflight_calls=4)
    ids = submit_all(gw, token, [f"cap-{uuid.uuid4().hex[:6]}-{i}" for i in range(16)], 1500)
    assert wait_until(lambda: metric(gw, "idemgate_provider_calls_in_flight") >= 4, 20)
    sending = int(psql("SELECT count(*) FROM operations WHERE state = 'sending' AND id IN (%s)"
                       % ",".join(f"'{i}'" for i in ids))[0][0])
    assert sending <= 4, sending
    settle(psql, ids)
    assert metric(gw, "idemgate_provider_calls_in_flight_peak") == 4
    for job_id in ids:
        assert len(mock.creates_for(job_id)) == 1, job_id


def test_a_providers_own_limit_leaves_room_for_the_others(gateway_factory, mock, token, psql):
    """A provider with max_inflight_calls 2 never has more than 2 calls in flight, and its backlog
    does not hold back another provider's jobs (those are claimed past it)."""
    slow = provider("mock-images", mock.url, max_inflight_calls=2,
                    auth={"header": "Authorization", "prefix": "Bearer ",
                          "secret_env": "MOCK_IMAGES_API_KEY"})
    other = provider("mock-keyed", mock.url, path="/v2/generations", route="generations",
                     idempotency={"header": "Idempotency-Key"})
    gw = gateway_factory(dispatch_workers=1, providers=[slow, other])
    slow_ids = submit_all(gw, token, [f"own-{uuid.uuid4().hex[:6]}-{i}" for i in range(6)], 2000)
    other_ids = submit_all(gw, token, [f"oth-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)], 0,
                           route="mock-keyed/generations")
    inlist = ",".join(f"'{i}'" for i in slow_ids)
    samples = []

    def sample():
        samples.append(dict((r[0], int(r[1])) for r in psql(
            f"SELECT state, count(*) FROM operations WHERE id IN ({inlist}) GROUP BY state")))
        return set(samples[-1]) <= {"completed"}

    # The other provider's jobs complete while the limited one's backlog is still waiting.
    settle(psql, other_ids, timeout=30)
    sample()
    assert samples[-1].get("prepared", 0) > 0, samples[-1]
    assert wait_until(sample, 60, interval=0.1), samples[-1]
    # Never more than its limit in flight; a claim racing the intake's own reservation may pass
    # it by one per dispatcher thread (dispatcher.c), never by the backlog.
    assert max(x.get("sending", 0) for x in samples) <= 2 + 1, samples
    assert any(x.get("sending", 0) and x.get("prepared", 0) for x in samples), samples
    for job_id in slow_ids + other_ids:
        assert len(mock.creates_for(job_id)) == 1, job_id


def test_calls_in_flight_at_sigterm_end_and_are_recorded(gateway_factory, mock, token, psql):
    """SIGTERM while calls are in flight: the gateway stops taking work, lets each call end,
    writes its result and only then exits. Every job is completed, created once; none unknown."""
    gw = gateway_factory(dispatch_workers=1)
    ids = submit_all(gw, token, [f"term-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)], 3000)
    assert wait_until(lambda: metric(gw, "idemgate_provider_calls_in_flight") >= 20, 20)
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=60) == 0
    assert set(states(psql, ids).values()) == {"completed"}, states(psql, ids)
    for job_id in ids:
        assert len(mock.creates_for(job_id)) == 1, job_id
    assert "dispatch_draining" in gw.log()


def test_waiting_client_is_answered_when_its_slow_call_ends(gateway_factory, mock, token):
    """Prefer: wait on a slow provider with one dispatcher thread and many calls in flight:
    each waiting client gets its completed job (not a 202 at its deadline)."""
    gw = gateway_factory(dispatch_workers=1)
    out, lock = [], threading.Lock()

    def one(i):
        r = gw.submit(token, f"wait-{uuid.uuid4().hex[:6]}-{i}",
                      {"prompt": f"w{i}", "n": 1, "_mock": {"delay_ms": 2000}},
                      headers={"Prefer": "wait=30"}, timeout=40)
        with lock:
            out.append((r.status, r.headers.get("x-idemgate-state")))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out.count((200, "completed")) == 40, out
    assert metric(gw, "idemgate_provider_calls_in_flight_peak") > 1


def test_reconcile_lookups_run_side_by_side_on_the_engine(gateway_factory, mock, token, psql):
    """One reconciler thread, N unknown jobs, a provider that takes 2 s to answer a lookup: the
    lookups are in flight together (before the engine, one reconciler thread made one lookup at
    a time, outside the in-flight gauge), and each job is found and completed with one create."""
    rec = {"strategy": "get_by_client_id", "window_seconds": 60, "interval_ms": 200,
           "absent_grace_ms": 1000, "found_result": "$.result",
           "lookup": {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                      "client_ref": "$.client_ref",
                      "absent": {"path": "$.error.code", "equals": "not_found"}}}
    p = provider("mock-images", mock.url, timeouts={"connect_ms": 1000, "total_ms": 3000},
                 client_ref={"header": "X-Client-Ref"}, reconcile=rec)
    gw = gateway_factory(dispatch_workers=1, reconcile_workers=1, providers=[p])
    assert mock.http.request("POST", "/_config",
                             json.dumps({"lookup_delay_ms": 2000})).status == 200
    n = 30
    mock.script([{"fault": "hang"}] * n)  # each create is made, then its answer never comes
    ids = submit_all(gw, token, [f"rec-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)], 0)
    inlist = ",".join(f"'{i}'" for i in ids)

    def lookups_together():
        # No create is in flight once no row is `sending`: what the gauge counts is lookups.
        sending = int(psql("SELECT count(*) FROM operations WHERE state = 'sending' "
                           f"AND id IN ({inlist})")[0][0])
        return sending == 0 and metric(gw, "idemgate_provider_calls_in_flight") >= n // 2

    assert wait_until(lookups_together, 30, interval=0.05), states(psql, ids)
    settle(psql, ids, timeout=60)
    for job_id in ids:
        assert len(mock.creates_for(job_id)) == 1, job_id
    assert "reconciled" in gw.log()


def test_one_providers_slow_searches_do_not_hold_up_another(gateway_factory, mock, token, psql):
    """reconcile_max_inflight is per provider: with a cap of 2, eight unknown jobs whose lookups
    take 1.5 s each keep two lookups in flight, and a keyed provider's unknown jobs — made unknown
    after them — are resent and completed while half of the eight still wait. (Served in claim
    order by one queue under one cap, they would wait for all eight lookups.) One create each."""
    lookup = {"strategy": "get_by_client_id", "window_seconds": 120, "interval_ms": 200,
              "absent_grace_ms": 1000, "found_result": "$.result",
              "lookup": {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                         "client_ref": "$.client_ref",
                         "absent": {"path": "$.error.code", "equals": "not_found"}}}
    slow = provider("slowsearch", mock.url, timeouts={"connect_ms": 1000, "total_ms": 3000},
                    client_ref={"header": "X-Client-Ref"}, reconcile=lookup)
    keyed = provider("keyedresend", mock.url, path="/v2/generations", route="generations",
                     idempotency={"header": "Idempotency-Key"},
                     timeouts={"connect_ms": 1000, "total_ms": 1000},
                     reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200,
                                "window_seconds": 120})
    gw = gateway_factory(dispatch_workers=1, reconcile_workers=1, reconcile_max_inflight=2,
                         providers=[slow, keyed])
    assert mock.http.request("POST", "/_config",
                             json.dumps({"lookup_delay_ms": 1500})).status == 200
    mock.script([{"fault": "hang"}] * 8)
    slow_ids = submit_all(gw, token, [f"ss-{uuid.uuid4().hex[:6]}-{i}" for i in range(8)], 0,
                          route="slowsearch/images/generations")
    slow_in = ",".join(f"'{i}'" for i in slow_ids)
    assert wait_until(lambda: int(psql("SELECT count(*) FROM operations WHERE state = 'unknown' "
                                       f"AND id IN ({slow_in})")[0][0]) >= 6, 30)
    mock.script([{"fault": "hang"}] * 3)
    keyed_ids = submit_all(gw, token, [f"kr-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)], 0,
                           route="keyedresend/generations")
    settle(psql, keyed_ids, timeout=60)
    still = int(psql("SELECT count(*) FROM operations WHERE state = 'unknown' "
                     f"AND id IN ({slow_in})")[0][0])
    assert still >= 4, still
    settle(psql, slow_ids, timeout=120)
    for job_id in slow_ids + keyed_ids:
        assert len(mock.creates_for(job_id)) == 1, job_id


def test_archive_copies_are_in_flight_together(gateway_factory, mock, token, psql, tmp_path):
    """One archive thread, N completed jobs whose output URLs take 2 s to answer: the copies are
    in flight together on the call engine (before, one archive thread made one copy at a time,
    outside the gauge), and every output is archived."""
    name = "engarch" + uuid.uuid4().hex[:6]
    e = {"name": name, "profile": os.path.join(ROOT, "deploy", "providers", "openai-images.json"),
         "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 5000},
         "archive": {"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True}}
    gw = gateway_factory(providers=[e], archive_workers=1, archive_dir=str(tmp_path / "archive"),
                         env={"OPENAI_API_KEY": "sk-x"})
    assert mock.http.request("POST", "/_files", json.dumps({"delay_ms": 2000})).status == 200
    n = 12
    ids = []
    for i in range(n):
        r = gw.submit(token, f"arch-{uuid.uuid4().hex[:6]}-{i}",
                      {"prompt": f"a cat {i}", "n": 1, "response_format": "url"},
                      route=name + "/images/generations", headers={"Prefer": "respond-async"})
        assert r.status == 202, r.body
        ids.append(r.json()["id"])
    settle(psql, ids)  # every create has ended: what the gauge counts now is copies
    assert wait_until(lambda: metric(gw, "idemgate_provider_calls_in_flight") >= n // 2, 30,
                      interval=0.05), metric(gw, "idemgate_provider_calls_in_flight")
    inlist = ",".join(f"'{i}'" for i in ids)
    assert wait_until(lambda: int(psql(
        "SELECT count(*) FROM archive_outputs WHERE state = 'archived' "
        f"AND op_id IN ({inlist})")[0][0]) == n, 60)
