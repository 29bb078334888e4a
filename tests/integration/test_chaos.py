"""The crash matrix (C1–C6), random kill -9 across two replicas, and R1 (replicas racing on
duplicates), checked Jepsen-style: clients retry with the same key, then a bounded drain, then
the checker compares answers, PostgreSQL and the mock's ledger and prints one JSON line per
scenario (also in build-test/chaos-summary.jsonl and in pytest's terminal summary).

CI-sized by default; CHAOS_FULL=1 runs the sizes of ../shared/TESTING.md."""

import base64
import hashlib
import hmac
import json
import os
import random
import sys
import threading
import time
import uuid

import pytest

from conftest import ROOT, free_port, tenant_token

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import checker, harness, providers, report  # noqa: E402
from chaos.client import Client, Outcome, RetryPolicy, run_all, fan_out  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

size = harness.size
CRASH_RUNS = size(2, 10)
DISPATCH_RUNS = size(3, 10)  # three: the op the dispatcher dies on cycles plain, lookup, keyed
LEASE = 3  # seconds: the smallest lease the 1 s provider timeouts allow


@pytest.fixture(scope="session", autouse=True)
def _chaos_report(pytestconfig):
    report.install(pytestconfig)


@pytest.fixture
def tokens(token, database_url):
    return [token, tenant_token(database_url)]


def reset(mock):
    mock.http.request("POST", "/_reset")


wait_until = harness.wait_until


def stop_clean(reps):
    codes = reps.stop_all()
    assert all(c == 0 for c in codes.values()), f"unclean exits after SIGTERM: {codes}"


def reaped(psql, pfx):
    """The operations whose lease expired while sending (a worker died holding them)."""
    return [r[0] for r in psql(
        "SELECT DISTINCT a.operation_id FROM attempts a JOIN operations o "
        "ON o.tenant_id = a.tenant_id AND o.id = a.operation_id "
        f"WHERE a.outcome = 'lease_expired' AND o.idempotency_key LIKE '{pfx}-%'")]


def job_row(psql, job_id):
    r = psql(f"SELECT state, provider, coalesce(remote_id, '') FROM operations WHERE id = '{job_id}'")
    return dict(zip(("state", "provider", "remote_id"), r[0])) if r else None


def paid(entries, job_id):
    return [e for e in entries if e["client_ref"] == job_id and not e["replay"] and e["task_id"]]


# --- C1, C2, C5: crash points on the intake path -------------------------------------------------

INTAKE_CASES = {
    # scenario: (point, the victim's dispatch workers, client header)
    "C1": ("before_intent_commit", 2, {}),
    "C2": ("after_intent_commit", 0, {}),
    "C5-intake": ("after_intent_commit", 2, {}),
    "C5-result": ("after_result_commit", 2, {"Prefer": "wait=10"}),
}


@pytest.mark.parametrize("scenario", sorted(INTAKE_CASES))
def test_crash_on_the_intake_path(scenario, gateway_factory, mock, psql, tokens):
    point, workers, headers = INTAKE_CASES[scenario]
    entries = providers.all_three(mock.url, providers.tag())
    summaries, n_intents, answered_first, claimed_first = [], 4, [], []
    try:
        intake_runs(scenario, point, workers, headers, gateway_factory, mock, psql, tokens,
                    entries, summaries, n_intents, answered_first, claimed_first)
    finally:
        extra = {"waiter_answered_before_kill": sum(answered_first)} if answered_first else {}
        if workers:
            extra["claimed_before_kill"] = len(claimed_first)
        s = harness.merge(scenario, summaries, point=point, crashes=len(summaries), **extra)
        harness.emit(s)
    harness.assert_clean(s)


def intake_runs(scenario, point, workers, headers, gateway_factory, mock, psql, tokens, entries,
                summaries, n_intents, answered_first, claimed_first):
    for run in range(CRASH_RUNS):
        reset(mock)
        reps = Replicas(gateway_factory, free_port)
        hit = run % n_intents + 1
        v = reps.start("v", first_env={"IDEMGATE_CRASH": f"{point}:{hit}"}, providers=entries,
                       lease_seconds=LEASE, dispatch_workers=workers)
        if workers == 0:  # C2: the intake replica sends nothing; another one dispatches
            reps.start("w", providers=entries, lease_seconds=LEASE)
        reps.supervise()
        pfx = harness.prefix(scenario.lower())
        its = harness.intents(pfx, tokens, entries, n_intents)
        for i in its:
            i.headers.update(headers)
        # One client at a time: only the request that reached the crash point is cut off.
        outs = run_all(Client(lambda: [v.port], RetryPolicy(max_seconds=40)), its, concurrency=1)
        assert wait_until(lambda: v.crashes >= 1, 15), f"{point}:{hit} never fired"
        s = harness.conclude(scenario, outs, psql, mock.url, pfx, drain_timeout=30, emit=False)
        reps.stop_supervising()
        stop_clean(reps)
        summaries.append(s)
        harness.assert_clean(s)

        cut = [o for o in outs if any(a.error for a in o.attempts)]
        if not cut and point == "after_result_commit":
            # The dispatcher dies after the result commit, not in a request: its waiting client
            # may be answered (by the result's NOTIFY) before the SIGKILL lands, and then no
            # request at all is in flight when it does. Nothing to cut; the checker decides.
            answered_first.append(1)
            continue
        assert len(cut) == 1, [(o.intent.key, [(a.status, a.error) for a in o.attempts])
                               for o in outs]
        o = cut[0]
        final = o.attempts[-1]
        entries_ = checker.ledger(mock.url)
        assert o.result == "ok" and all(a.status is None for a in o.attempts[:-1]), o.attempts
        if point == "before_intent_commit":
            # The process died before the commit: nothing was answered, nothing was stored, and
            # the retry is the creation (not a replay of an earlier row).
            assert final.status == 202 and not final.replayed, final
        elif point == "after_intent_commit":
            # The intent was committed, the answer lost: the retry gets the stored job.
            assert final.status == 202 and final.replayed, final
        elif final.replayed:
            # The result was committed, the waiting client's answer lost: the retry gets the
            # provider's stored answer, replayed, and nothing new is sent.
            assert final.status == 200 and final.state == "completed", final
            answered_first.append(0)
        else:
            # The race the other way: the waiter (woken by the result's NOTIFY) answered its
            # client before the SIGKILL landed, and the request cut off was the next intent's,
            # reset before it reached the intake: its row was created by the retry.
            created = float(psql("SELECT extract(epoch FROM created_at) FROM operations "
                                 f"WHERE id = '{final.job_id}'")[0][0])
            assert created > o.attempts[-2].t1, (o.attempts, created)
            answered_first.append(1)
        row = job_row(psql, final.job_id)
        if final.job_id in reaped(psql, pfx):
            # The victim's own dispatcher claimed the job between the commit and the SIGKILL
            # (a real race on a busy machine): then it is the dispatch crash of C3, never sent
            # blindly — in review without keys or lookup, else completed once.
            claimed_first.append(1)
            want = "review" if providers.kind(row["provider"]) == "plain" else "completed"
            assert row["state"] == want, row
            assert len(paid(entries_, final.job_id)) <= 1
            continue
        assert row["state"] == "completed", row
        assert len(paid(entries_, final.job_id)) == 1, "exactly one create for the cut-off intent"


# --- C3, C4: crash points on the dispatch path ---------------------------------------------------

# What the operation the dispatcher died on must end as, by provider.
#   C3: nothing left (killed after the `sending` commit, or in PREREQFUNCTION before any byte):
#       the takeover never blind-sends. plain (no keys, no lookup) → review with 0 creates;
#       lookup → proven absent, sent once → completed; keyed → resent under the same key.
#   C4: the provider accepted, the result was never committed: reconciliation links the task.
DISPATCH_CASES = {
    "C3-after_sending_commit": "after_sending_commit",
    "C3-before_send": "before_send",
    "C4-after_response": "after_response",
}
EXPECT = {
    ("C3", "plain"): ("review", 0), ("C3", "lookup"): ("completed", 1),
    ("C3", "keyed"): ("completed", 1),
    ("C4", "plain"): ("review", 1), ("C4", "lookup"): ("completed", 1),
    ("C4", "keyed"): ("completed", 1),
}


@pytest.mark.parametrize("scenario", sorted(DISPATCH_CASES))
def test_crash_on_the_dispatch_path(scenario, gateway_factory, mock, psql, tokens):
    point = DISPATCH_CASES[scenario]
    entries = providers.all_three(mock.url, providers.tag())
    summaries = []
    try:
        dispatch_runs(scenario, point, gateway_factory, mock, psql, tokens, entries, summaries)
    finally:
        s = harness.merge(scenario, summaries, point=point, crashes=len(summaries))
        harness.emit(s)
    harness.assert_clean(s)


def dispatch_runs(scenario, point, gateway_factory, mock, psql, tokens, entries, summaries):
    for run in range(DISPATCH_RUNS):
        reset(mock)
        reps = Replicas(gateway_factory, free_port)
        # The victim is the only dispatcher, with one worker and room for one call: its n-th
        # claim is the n-th intent, and a single operation is in flight when it dies. The intake
        # replica takes the clients.
        hit = run % 3 + 1
        v = reps.start("v", first_env={"IDEMGATE_CRASH": f"{point}:{hit}"}, providers=entries,
                       lease_seconds=LEASE, dispatch_workers=1, max_inflight_calls=1)
        i = reps.start("i", providers=entries, lease_seconds=LEASE, dispatch_workers=0)
        reps.supervise()
        pfx = harness.prefix(scenario.lower().replace("_", ""))
        its = harness.intents(pfx, tokens, entries, 3)
        outs = run_all(Client(lambda: [i.port], RetryPolicy(max_seconds=40)), its, concurrency=1)
        assert wait_until(lambda: v.crashes >= 1, 20), f"{point}:{hit} never fired"
        s = harness.conclude(scenario, outs, psql, mock.url, pfx, drain_timeout=40, emit=False)
        reps.stop_supervising()
        stop_clean(reps)
        summaries.append(s)
        harness.assert_clean(s)

        died_on = reaped(psql, pfx)
        assert len(died_on) == 1, died_on
        row = job_row(psql, died_on[0])
        assert row["provider"] == entries[hit - 1]["name"], (row, hit)
        kind = providers.kind(row["provider"])
        want_state, want_creates = EXPECT[(scenario[:2], kind)]
        led = checker.ledger(mock.url)
        assert row["state"] == want_state, (scenario, kind, row)
        assert len(paid(led, died_on[0])) == want_creates, (scenario, kind, led)
        if scenario.startswith("C4") and kind == "lookup":
            assert row["remote_id"] == paid(led, died_on[0])[0]["task_id"], "the task was linked"
        if scenario.startswith("C4") and kind == "keyed":
            assert any(e["replay"] for e in led if e["client_ref"] == died_on[0]), \
                "the resend went under the same key and was replayed by the provider"


# --- C6: crash inside webhook handling ------------------------------------------------------------

WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ASYNC_SECRETS = {"REPLICATE_API_TOKEN": "r8-x", "REPLICATE_WEBHOOK_SECRET": WHSEC}
ORDER = {"prepared": 0, "sending": 1, "unknown": 1, "accepted": 2, "completed": 3, "failed": 3,
         "review": 3}


def replicate_entry(mock):
    path = os.path.join(ROOT, "deploy", "providers", "replicate.json")
    with open(path) as f:
        poll = json.load(f)["poll"]
    # Polls every minute: within the test only a webhook's hint makes the job complete.
    poll.update(interval_ms=60000, max_interval_ms=60000)
    return {"name": "replicate", "profile": path, "base_url": mock.url, "poll": poll,
            "timeouts": {"connect_ms": 1000, "total_ms": 1000}}


def signed_hook(gw_port, body, msg_id):
    import http.client
    ts = str(int(time.time()))
    key = base64.b64decode(WHSEC[len("whsec_"):])
    sig = "v1," + base64.b64encode(
        hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10)
    try:
        conn.request("POST", "/v1/webhooks/replicate", body,
                     {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": sig,
                      "Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    except OSError as e:
        return None, type(e).__name__
    finally:
        conn.close()


class StateWatch:
    """Samples a job's state (from the database) until stopped; the sequence must never go back."""

    def __init__(self, psql, job_id):
        self.seen, self.stop_ev = [], threading.Event()
        self.t = threading.Thread(target=self.run, args=(psql, job_id), daemon=True)
        self.t.start()

    def run(self, psql, job_id):
        deadline = time.monotonic() + 120
        while not self.stop_ev.is_set() and time.monotonic() < deadline:
            r = psql(f"SELECT state FROM operations WHERE id = '{job_id}'")
            if r and (not self.seen or self.seen[-1] != r[0][0]):
                self.seen.append(r[0][0])
            time.sleep(0.05)

    def stop(self):
        self.stop_ev.set()
        self.t.join(timeout=10)
        return self.seen


@pytest.mark.parametrize("point", ["webhook_before_dedupe", "webhook_after_dedupe"])
def test_crash_inside_webhook_handling(point, gateway_factory, mock, psql, tokens):
    entry = replicate_entry(mock)
    summaries = []
    try:
        webhook_runs(point, gateway_factory, mock, psql, tokens, entry, summaries)
    finally:
        s = harness.merge(f"C6-{point.replace('webhook_', '')}", summaries, point=point,
                          crashes=len(summaries))
        harness.emit(s)
    harness.assert_clean(s)


def webhook_runs(point, gateway_factory, mock, psql, tokens, entry, summaries):
    for run in range(CRASH_RUNS):
        reset(mock)
        reps = Replicas(gateway_factory, free_port)
        w = reps.start("w", env=ASYNC_SECRETS, providers=[entry], lease_seconds=LEASE)
        v = reps.start("v", env=ASYNC_SECRETS, first_env={"IDEMGATE_CRASH": f"{point}:1"},
                       providers=[entry], lease_seconds=LEASE, dispatch_workers=0)
        reps.supervise()
        pfx = harness.prefix("c6")
        its = harness.intents(pfx, tokens, [{"name": "replicate", "routes": [
            {"route": "flux-schnell"}]}], 1, mock={"polls": 0})
        outs = run_all(Client(lambda: [w.port]), its, concurrency=1)
        job_id = outs[0].job_id
        assert job_id, outs[0].attempts
        assert wait_until(lambda: job_row(psql, job_id)["state"] == "accepted", 15)
        watch = StateWatch(psql, job_id)
        remote = job_row(psql, job_id)["remote_id"]
        body = json.dumps({"id": remote, "status": "succeeded"}).encode()
        msg = f"msg_{uuid.uuid4().hex}"
        status, _ = signed_hook(v.port, body, msg)
        assert status is None, "the replica died while handling the webhook"
        assert wait_until(lambda: v.crashes >= 1 and v.alive(), 15)
        # The provider redelivers (same event id) until it gets a 2xx.
        status, ans = signed_hook(v.port, body, msg)
        assert status == 200, ans
        assert ans["duplicate"] is (point == "webhook_after_dedupe"), ans
        assert wait_until(lambda: job_row(psql, job_id)["state"] == "completed", 20), \
            job_row(psql, job_id)
        done = psql(f"SELECT updated_at, polls FROM operations WHERE id = '{job_id}'")
        # Late duplicates change nothing.
        for _ in range(3):
            status, ans = signed_hook(random.choice([v.port, w.port]), body, msg)
            assert status == 200 and ans["duplicate"] is True, ans
        time.sleep(0.5)
        assert psql(f"SELECT updated_at, polls FROM operations WHERE id = '{job_id}'") == done
        assert psql("SELECT count(*) FROM webhook_events WHERE provider = 'replicate' "
                    f"AND event_id = '{msg}'") == [["1"]]
        seen = watch.stop()
        assert [ORDER[s] for s in seen] == sorted(ORDER[s] for s in seen), seen
        s = harness.conclude("C6", outs, psql, mock.url, pfx, drain_timeout=20, emit=False)
        reps.stop_supervising()
        stop_clean(reps)
        summaries.append(s)
        harness.assert_clean(s)


# --- random kill -9 across two replicas ----------------------------------------------------------

def test_random_kill9_across_two_replicas(gateway_factory, mock, psql, tokens):
    n = size(400, 2000)
    target_kills = size(10, 40)
    entries = providers.all_three(mock.url, providers.tag())
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b"):
        reps.start(name, providers=entries, lease_seconds=LEASE)
    reps.supervise(restart_delay=0.3)
    pfx = harness.prefix("kill9")
    # A small provider delay widens the windows a kill can land in.
    its = harness.intents(pfx, tokens, entries, n,
                          mock=lambda i: {"delay_ms": random.randint(0, 60)})
    done = threading.Event()
    kills, finished = [], [0]
    lock = threading.Lock()

    class Counting(Client):
        def perform(self, intent, first=None):
            o = super().perform(intent, first)
            with lock:
                finished[0] += 1
            return o

    def killer():
        # A kill every n/(target+1) finished intents, at a random moment after that point, of a
        # random replica — while the other one is up, so that clients have somewhere to go.
        step = max(1, n // (target_kills + 1))
        next_at = step
        deadline = time.monotonic() + 900
        while not done.is_set() and time.monotonic() < deadline and len(kills) < target_kills:
            if finished[0] < next_at or not all(reps[r].alive() for r in ("a", "b")):
                done.wait(0.02)
                continue
            done.wait(random.uniform(0, 0.2))
            name = random.choice(("a", "b"))
            reps.kill(name)
            kills.append((time.time(), name))
            next_at = finished[0] + step

    kt = threading.Thread(target=killer, daemon=True)
    kt.start()
    # Paced so that the load lasts about 1.2 s per kill: a killed replica needs ~0.5 s to be
    # back before the next kill may take the other one.
    conc = 8
    outs = run_all(Counting(lambda: reps.ports(), RetryPolicy(max_seconds=60, timeout=10)), its,
                   concurrency=conc, pace=1.2 * target_kills * conc / n)
    done.set()
    kt.join(timeout=30)
    s = harness.conclude("kill9", outs, psql, mock.url, pfx, drain_timeout=60, emit=False,
                         kills=len(kills))
    harness.emit(s)
    reps.stop_supervising()
    stop_clean(reps)
    harness.assert_clean(s)
    assert len(kills) >= target_kills // 2, f"only {len(kills)} kills"
    assert s["unknown_after_drain"] == 0, s.get("unknown_keys")


# --- R1: three replicas, concurrent duplicates -----------------------------------------------------

def test_r1_concurrent_duplicates_across_three_replicas(gateway_factory, mock, psql, tokens):
    keys = size(40, 200)
    dups = 20
    entries = [providers.plain(mock.url, "plain" + providers.tag())]
    reps = Replicas(gateway_factory, free_port)
    for name in ("a", "b", "c"):
        reps.start(name, providers=entries, lease_seconds=LEASE)
    ports = reps.ports()
    pfx = harness.prefix("r1")
    its = harness.intents(pfx, tokens, entries, keys)
    client = Client(ports, RetryPolicy(max_seconds=60))
    outs = []
    batch = 5  # keys raced at once: 5 × 20 requests in flight
    for b in range(0, keys, batch):
        group = its[b:b + batch]
        res = fan_out(len(group) * dups,
                      lambda j: client.perform(group[j // dups], first=j % len(ports)))
        for k, intent in enumerate(group):
            merged = Outcome(intent)
            per_key = res[k * dups:(k + 1) * dups]
            for o in per_key:
                merged.attempts.extend(o.attempts if o else [])
            merged.result = "ok" if all(o and o.result == "ok" for o in per_key) else "unknown"
            outs.append(merged)
    s = harness.conclude("R1", outs, psql, mock.url, pfx, drain_timeout=60, emit=False,
                         replicas=3, duplicates_per_key=dups, requests=keys * dups)
    harness.emit(s)
    stop_clean(reps)
    harness.assert_clean(s)
    assert s["creates"] == keys, s
    for o in outs:
        assert o.result == "ok", o.intent.key
        created = [a for a in o.attempts if a.status == 202 and not a.replayed]
        assert len(created) == 1, (o.intent.key, "exactly one answer is the creation")
