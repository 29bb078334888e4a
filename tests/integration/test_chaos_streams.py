"""Streams under faults (issue 25 §5), checked Jepsen-style. Many streamed chat requests, each
key sent by several clients at once (they join one live stream or read its record), clients that
leave mid-stream, and a gateway killed with -9 in the middle of it all; a second gateway on the
same database, the clients retrying with the same key. Then the checker:

- at most one create per key at the provider (the mock's ledger, by the SHA-256 of the body);
- every whole stream a client received is byte for byte the record the job replays, and every
  replay of a completed job is identical to the next;
- every key a client got an answer for has its job; a job whose stream was cut by the kill is
  in doubt (`unknown`/`review`), never `failed` and never sent again.

CI-sized by default; CHAOS_FULL=1 runs more keys and clients."""

import hashlib
import http.client
import json
import os
import random
import sys
import threading
import time
import uuid

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import harness, report  # noqa: E402

KEYS = harness.size(16, 120)
CLIENTS_PER_KEY = harness.size(2, 3)
PROFILE = os.path.join(ROOT, "deploy", "providers", "openai-chat.json")


def body_of(i, run):
    b = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{run} {i}"}],
         "stream": True, "_mock": {"events": 6, "event_delay_ms": 60}}
    return json.dumps(b, separators=(",", ":")).encode()


class Result:
    def __init__(self):
        self.lock = threading.Lock()
        self.streams = {}   # key -> [whole bodies received]
        self.answered = set()  # keys that got any 200/202 answer


def one_client(port, token, route, key, body, res, leave_after, attempts=4):
    for attempt in range(attempts):
        conn = http.client.HTTPConnection("127.0.0.1", port(), timeout=40)
        try:
            conn.request("POST", f"/v1/providers/{route}", body,
                         {"Authorization": f"Bearer {token}", "Idempotency-Key": key,
                          "Content-Type": "application/json", "Prefer": "wait=8"})
            r = conn.getresponse()
            if r.status in (200, 202):
                with res.lock:
                    res.answered.add(key)
            if r.status == 200 and r.getheader("Content-Type", "").startswith("text/event-stream"):
                if leave_after is not None and attempt == 0:
                    r.read1(leave_after)  # a client that goes away mid-stream
                    return
                data = r.read()
                with res.lock:
                    res.streams.setdefault(key, []).append(data)
                return
            r.read()
            if r.status == 202:
                return  # the job, not yet whole (or in doubt): nothing more to read here
        except (OSError, http.client.HTTPException):
            time.sleep(0.3 + random.random() * 0.5)  # the gateway died: the same key again
        finally:
            conn.close()


def test_streams_under_kill_9_and_leaving_clients(gateway_factory, mock, token, psql):
    run = uuid.uuid4().hex[:8]
    name = "chaoschat" + run[:6]
    entry = {"name": name, "profile": PROFILE, "base_url": mock.url,
             "timeouts": {"connect_ms": 1000, "total_ms": 3000}}
    env = {"OPENAI_API_KEY": "sk-test"}
    # A short lease (over the 3 s timeout): the calls cut by the kill are in doubt sooner.
    gws = [gateway_factory(providers=[entry], env=env, lease_seconds=5)]
    route = name + "/chat/completions"
    res = Result()
    rnd = random.Random(run)
    threads = []
    for i in range(KEYS):
        key, body = f"cs-{run}-{i}", body_of(i, run)
        for c in range(CLIENTS_PER_KEY):
            leave = rnd.choice([None, None, 50, 300])
            t = threading.Thread(target=one_client, daemon=True,
                                 args=(lambda: gws[-1].port, token, route, key, body, res, leave))
            threads.append(t)
    rnd.shuffle(threads)
    for n, t in enumerate(threads):
        t.start()
        time.sleep(0.01)
        if n == len(threads) // 2:
            gws[0].proc.kill()  # -9, mid-stream for many of them
            gws[0].proc.wait()
            gws.append(gateway_factory(providers=[entry], env=env, lease_seconds=5))
    for t in threads:
        t.join(timeout=120)
    gw = gws[-1]

    # Drain: every job whole, or in doubt once its lease ran out.
    deadline = time.monotonic() + 60
    jobs = {}
    while time.monotonic() < deadline:
        rows = psql(f"SELECT idempotency_key, id, state FROM operations "
                    f"WHERE idempotency_key LIKE 'cs-{run}-%'")
        jobs = {k: (i, s) for k, i, s in rows}
        if all(s in ("completed", "unknown", "review", "failed") for _, s in jobs.values()):
            break
        time.sleep(0.5)

    ledger = [c for c in mock.ledger() if c["route"] == "/v1/chat/completions" and not c["replay"]]
    creates = {}
    for c in ledger:
        creates[c["body_sha256"]] = creates.get(c["body_sha256"], 0) + 1
    summary = {"scenario": "S1-streams-kill9", "keys": KEYS, "clients": len(threads),
               "answered": len(res.answered), "jobs": len(jobs), "lost": 0, "duplicates": 0,
               "replay_mismatch": 0, "failed": 0, "completed": 0, "in_doubt": 0}
    for i in range(KEYS):
        key, body = f"cs-{run}-{i}", body_of(i, run)
        n = creates.get(hashlib.sha256(body).hexdigest(), 0)
        summary["duplicates"] += max(0, n - 1)
        if key in res.answered and key not in jobs:
            summary["lost"] += 1
        if key not in jobs:
            continue
        state = jobs[key][1]
        summary["failed"] += state == "failed"
        summary["in_doubt"] += state in ("unknown", "review")
        if state != "completed":
            continue
        summary["completed"] += 1
        a = gw.submit(token, key, body, route=route, headers={"Prefer": "wait=10"})
        b = gw.submit(token, key, body, route=route, headers={"Prefer": "wait=10"})
        whole = [s for s in res.streams.get(key, []) if s.endswith(b"data: [DONE]\n\n")]
        if a.body != b.body or not a.body.endswith(b"data: [DONE]\n\n") or \
                any(s != a.body for s in whole):
            summary["replay_mismatch"] += 1
    report.emit(summary)
    assert summary["lost"] == 0, summary
    assert summary["duplicates"] == 0, summary
    assert summary["replay_mismatch"] == 0, summary
    assert summary["failed"] == 0, summary
    assert summary["completed"] + summary["in_doubt"] == len(jobs), summary
    assert summary["completed"] > 0, summary
