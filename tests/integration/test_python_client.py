"""The Python client (clients/python, package `idemgate`) and its batch runner `idemgate-batch`
against the real gateway and the counting mock (issue 15 §2).

The client runs in process (imported from the source tree); the batch runner runs as the
console script of the package installed with pip, offline, into a virtual environment — the way
a user runs it. Faults between client and gateway (a 503, an answer lost after the gateway
recorded the job) come from a small forwarding proxy on 127.0.0.1; what the provider received
comes from the mock's ledger. Every wait and loop here is bounded."""

import hashlib
import http.client
import http.server
import json
import re
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import pytest

from conftest import ROOT, provider

PKG = os.path.join(ROOT, "clients", "python")
sys.path.insert(0, PKG)

from idemgate import (Client, KeyReused, OutputsUnavailable, RetryPolicy,  # noqa: E402
                      Unauthorized, Unknown, derive_key)

ROUTE = "mock-images/images/generations"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
FAST_RETRY = {"max_attempts": 50, "deadline_seconds": 120, "base_ms": 100, "cap_ms": 500}


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def batch_bin(tmp_path_factory):
    """The package installed into a fresh virtual environment, the way a user does it:
    `pip install --no-index` from a copy of the source (the tree stays clean), nothing from
    the system's site-packages. Returns the path of the console script."""
    from test_python_install import install
    d = tmp_path_factory.mktemp("pyclient")
    src = d / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = install(sys.executable, d / "venv", [str(src)])
    script = venv / "bin" / "idemgate-batch"
    assert script.exists()
    return str(script)


class FaultProxy:
    """Forwards to the gateway; plan(n, method, path) decides the fate of the nth request:
    "forward", ("status", code, retry_after) answered here without forwarding, or
    "forward_then_lose": forwarded (the gateway records it), then the answer is held back until
    the next request arrives and the connection is closed without it."""

    def __init__(self, target_port, plan):
        self.records, self.lock, self.plan = [], threading.Lock(), plan
        self.next_request = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def handle_one(self):
                n_body = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n_body) if n_body else None
                with proxy.lock:
                    n = len(proxy.records)
                    rec = {"method": self.command, "path": self.path,
                           "key": self.headers.get("Idempotency-Key"), "fate": None}
                    proxy.records.append(rec)
                    proxy.next_request.set()
                    proxy.next_request = threading.Event()
                    waiter = proxy.next_request
                fate = proxy.plan(n, self.command, self.path)
                rec["fate"] = fate if isinstance(fate, str) else fate[0]
                if isinstance(fate, tuple) and fate[0] == "status":
                    data = json.dumps({"type": "urn:idemgate:problem:store-unavailable",
                                       "title": "Store unavailable", "status": fate[1],
                                       "detail": "injected by the test proxy",
                                       "request_id": "proxy"}).encode()
                    self.send_response(fate[1])
                    self.send_header("Content-Type", "application/problem+json")
                    if fate[2] is not None:
                        self.send_header("Retry-After", str(fate[2]))
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                rec["status"] = resp.status
                if fate == "forward_then_lose":
                    waiter.wait(timeout=60)  # the client timed out and sent its retry
                    self.close_connection = True
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self):
        with self.lock:
            return [dict(r) for r in self.records if r["method"] == "POST"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def fault_proxy():
    started = []

    def start(gw, plan):
        p = FaultProxy(gw.port, plan)
        started.append(p)
        return p
    yield start
    for p in started:
        p.close()


def client(url, token, **kw):
    kw.setdefault("retry", RetryPolicy(max_attempts=5, deadline=60, base=0.2, cap=1))
    return Client(url, token, **kw)


def identity(**extra):
    return dict({"product": "sku-" + uuid.uuid4().hex[:10], "template_version": 3,
                 "variant": 1}, **extra)


# --- the client -----------------------------------------------------------------------------

def test_submit_wait_get_and_replay(gateway, token, mock):
    c = client(f"http://127.0.0.1:{gateway.port}", token)
    ident = identity()
    key = derive_key(ident, prefix="poster-")
    body = {"prompt": "a lighthouse at dawn", "n": 2}
    job = c.submit(ROUTE, body, key)
    assert job.id.startswith("job_") and job.key == key and not job.replayed

    done = c.wait(job, timeout=30)
    assert done.id == job.id and done.state == "completed" and done.ok
    assert c.get(job.id).state == "completed"

    # The same identity, derived again in another process's way (member order differs),
    # is the same key: the gateway replays the job, the provider is not called again.
    again_key = derive_key(dict(reversed(list(ident.items()))), prefix="poster-")
    again = c.submit(ROUTE, {"n": 2, "prompt": "a lighthouse at dawn"}, again_key, wait=5)
    assert again_key == key and again.id == job.id and again.replayed and again.ok
    assert again.answer[0] == 200, "Prefer: wait returned the provider's own answer"
    assert len(mock.creates_for(job.id)) == 1


def test_a_503_then_success_resends_the_same_key(gateway, token, mock, fault_proxy):
    proxy = fault_proxy(gateway, lambda n, m, p: ("status", 503, 1) if n == 0 else "forward")
    sleeps = []
    c = client(proxy.url, token, sleep=lambda s: (sleeps.append(s), time.sleep(s)))
    key = derive_key(identity())
    job = c.wait(c.submit(ROUTE, {"prompt": "retry me"}, key), timeout=30)
    assert job.state == "completed"
    posts = proxy.posts()
    assert [p["fate"] for p in posts[:2]] == ["status", "forward"]
    assert {p["key"] for p in posts} == {key}, "every attempt carried the same key"
    assert sleeps[0] >= 1, "Retry-After: 1 is a floor of the first delay"
    assert len(mock.creates_for(job.id)) == 1


def test_an_answer_lost_after_the_gateway_recorded_it_is_a_replay(gateway, token, mock,
                                                                   fault_proxy):
    """The first POST reaches the gateway (the job is recorded and sent to the provider) but its
    answer never comes back: the client's timeout fires, it resends with the same key and
    gets the same job. One create at the provider."""
    proxy = fault_proxy(gateway, lambda n, m, p: "forward_then_lose" if n == 0 else "forward")
    c = client(proxy.url, token, timeout=2)
    key = derive_key(identity())
    job = c.submit(ROUTE, {"prompt": "lost answer"}, key)
    assert job.replayed, "the second attempt found the job the first one made"
    posts = proxy.posts()
    assert [p["fate"] for p in posts[:2]] == ["forward_then_lose", "forward"]
    assert posts[0]["status"] == 202 and {p["key"] for p in posts} == {key}
    job = c.wait(job, timeout=30)
    assert job.state == "completed" and len(mock.creates_for(job.id)) == 1


def test_422_is_raised_and_never_retried(gateway, token, mock, fault_proxy):
    proxy = fault_proxy(gateway, lambda n, m, p: "forward")
    c = client(proxy.url, token)
    key = derive_key(identity())
    first = c.submit(ROUTE, {"prompt": "version 1"}, key)
    before = len(proxy.posts())
    with pytest.raises(KeyReused) as e:
        c.submit(ROUTE, {"prompt": "version 1, edited"}, key)
    assert e.value.status == 422 and e.value.type == "idempotency-key-reused" and e.value.key == key
    assert len(proxy.posts()) == before + 1, "a 422 is sent once, never retried"
    c.wait(first, timeout=30)
    assert len(mock.creates_for(first.id)) == 1


def test_unauthorized_is_raised_at_once(gateway, fault_proxy):
    proxy = fault_proxy(gateway, lambda n, m, p: "forward")
    with pytest.raises(Unauthorized):
        client(proxy.url, "not-a-token").submit(ROUTE, {"prompt": "x"}, derive_key(identity()))
    assert len(proxy.posts()) == 1


def test_unknown_carries_the_job_id(gateway, token, mock):
    """A create that hangs at the provider: the wait ends before the job does. The exception
    names the job, which can be read (and waited for) by id; its state is never `failed`."""
    c = client(f"http://127.0.0.1:{gateway.port}", token)
    job = c.submit(ROUTE, {"prompt": "hang", "_mock": {"fault": "hang"}}, derive_key(identity()))
    with pytest.raises(Unknown) as e:
        c.wait(job, timeout=2)
    assert e.value.job_id == job.id and e.value.state in ("prepared", "sending", "unknown")
    # The job lives on: after the gateway's 5 s call timeout it is `unknown`, never resent.
    deadline = time.monotonic() + 30
    state = c.get(e.value.job_id).state
    while state not in ("unknown", "review") and time.monotonic() < deadline:
        time.sleep(0.2)
        state = c.get(e.value.job_id).state
    assert state in ("unknown", "review")
    with pytest.raises(Unknown) as again:
        c.wait(e.value.job_id, timeout=1)
    assert again.value.job_id == job.id
    assert len(mock.creates_for(job.id)) == 1


def test_cancel(gateway_factory, token, mock):
    gw = gateway_factory(dispatch_workers=0)  # nothing is sent: the job stays prepared
    c = client(f"http://127.0.0.1:{gw.port}", token)
    job = c.submit(ROUTE, {"prompt": "never mind"}, derive_key(identity()))
    assert job.state == "prepared"
    gone = c.cancel(job)
    assert gone.state == "failed" and gone.terminal and gone.get("cancel_requested_at")
    assert c.cancel(job.id).state == "failed", "cancel is idempotent"
    assert c.wait(job.id, timeout=5).state == "failed"
    assert mock.creates_for(job.id) == []


def test_cancel_of_a_running_task_ends_canceled(gateway_factory, token, mock):
    """An accepted async task cancelled through the client: the provider ends it, and wait()
    returns it `canceled` — terminal, not ok, not raised — with its remote id; the provider
    got one cancel (issue 21 item 1)."""
    from test_async import SECRETS, entry
    e, route = entry("replicate", mock)
    gw = gateway_factory(providers=[e], env=SECRETS)
    c = client(f"http://127.0.0.1:{gw.port}", token)
    job = c.submit(route, {"prompt": "long", "_mock": {"polls": 100000}}, derive_key(identity()))
    deadline = time.monotonic() + 15
    while job.state != "accepted" and time.monotonic() < deadline:
        time.sleep(0.05)
        job = c.get(job.id)
    assert job.state == "accepted", job.data
    asked = c.cancel(job)
    assert asked.get("cancel_requested_at") and not asked.terminal, asked.data
    done = c.wait(job.id, timeout=15)
    assert done.state == "canceled" and done.canceled and done.terminal and not done.ok, done.data
    assert done.remote_id and done.remote_id == job.remote_id
    assert c.cancel(job.id).state == "canceled", "cancel is idempotent"
    task = mock.http.request("GET", f"/v1/predictions/{done.remote_id}").json()
    assert task["status"] == "canceled" and task.get("cancels", 1) == 1, task


def archiving_gateway(gateway_factory, mock):
    """A gateway whose archive copies the mock's outputs (served over http on 127.0.0.1, which
    the archive refuses unless the provider's archive profile allows it)."""
    return gateway_factory(providers=[provider(
        "mock-images", mock.url,
        auth={"header": "Authorization", "prefix": "Bearer ", "secret_env": "MOCK_IMAGES_API_KEY"},
        archive={"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True})])


def test_outputs_right_after_wait_are_the_archived_bytes(gateway_factory, token, mock, tmp_path,
                                                         fault_proxy):
    """outputs() called at once after wait() — when the gateway has not archived the outputs
    yet (the mock's file server is slowed down so that the copies are still to be made) — waits
    for the archive and downloads the gateway's archived bytes through
    GET /v1/jobs/{id}/outputs/{n} (never the provider's URLs), each checked against its
    SHA-256 (the ETag and the job's record) and saved with its type's extension (issue 24 §8:
    it returned [] here)."""
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 1500}))
    gw = archiving_gateway(gateway_factory, mock)
    proxy = fault_proxy(gw, lambda n, m, p: "forward")
    c = client(proxy.url, token)
    job = c.wait(c.submit(ROUTE, {"prompt": "keep me", "n": 2}, derive_key(identity())),
                 timeout=30)
    assert job.ok
    assert not job.get("archive") or any(o["state"] != "archived" for o in job.get("archive")), \
        "the archive is not done when wait() returns: what this test is about"
    got = c.outputs(job, str(tmp_path / "out"))
    assert [o.index for o in got] == [0, 1]
    assert [os.path.basename(o.path) for o in got] == [f"{job.id}-0.png", f"{job.id}-1.png"]
    assert sorted(os.listdir(tmp_path / "out")) == [f"{job.id}-0.png", f"{job.id}-1.png"]
    record = c.get(job.id).get("archive")
    stored = {}
    for d, _, files in os.walk(tmp_path / "archive" / "objects"):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                stored[f] = fh.read()
    for o, rec in zip(got, record):
        with open(o.path, "rb") as f:
            data = f.read()
        assert hashlib.sha256(data).hexdigest() == o.sha256 == rec["sha256"]
        assert stored[rec["sha256"]] == data, "the archive's own object"
        assert o.content_type == "image/png"
    gets = [r["path"] for r in proxy.records if r["method"] == "GET"]
    for n in (0, 1):
        assert gets.count(f"/v1/jobs/{job.id}/outputs/{n}") >= 1
    # Called again, the archive is settled: the same files, at once.
    again = c.outputs(job.id, str(tmp_path / "out"))
    assert [o.path for o in again] == [o.path for o in got]


def test_outputs_the_gateway_will_not_archive_raise(gateway, token, mock, tmp_path):
    """The default archive profile refuses the mock's http://127.0.0.1 URLs: the outputs end
    `failed`, and outputs() raises OutputsUnavailable (not pending: never) naming the output's
    state — it never returns [] for a job that has outputs."""
    c = client(f"http://127.0.0.1:{gateway.port}", token)
    job = c.wait(c.submit(ROUTE, {"prompt": "not kept", "n": 1}, derive_key(identity())),
                 timeout=30)
    assert job.ok
    with pytest.raises(OutputsUnavailable) as e:
        c.outputs(job, str(tmp_path / "out"))
    assert e.value.pending is False and e.value.job_id == job.id
    assert "output 0 is failed" in str(e.value), str(e.value)
    assert not os.path.exists(tmp_path / "out") or os.listdir(tmp_path / "out") == []


# --- the batch runner ---------------------------------------------------------------------------

def write_manifest(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_batch(batch_bin, url, token, manifest, *args, timeout=180):
    env = dict(os.environ, IDEMGATE_TOKEN=token)
    p = subprocess.run([batch_bin, "run", manifest, "--url", url, *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p


def results(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def state_rows(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute("SELECT line, state, job_id, submits FROM rows ORDER BY line").fetchall()
    finally:
        db.close()


def test_batch_kill9_mid_run_then_rerun_creates_each_row_once(batch_bin, gateway, token, mock,
                                                              tmp_path):
    run = uuid.uuid4().hex[:8]
    n = 12
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"route": ROUTE, "identity": {"run": run, "sku": f"sku-{i}", "variant": 1},
         "body": {"prompt": f"product {i}", "n": 1, "_mock": {"delay_ms": 600}}}
        for i in range(n)])
    state = manifest + ".state.sqlite"
    env = dict(os.environ, IDEMGATE_TOKEN=token)
    proc = subprocess.Popen([batch_bin, "run", manifest, "--url",
                             f"http://127.0.0.1:{gateway.port}", "--concurrency", "2",
                             "--wait", "10"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # Kill it once some rows are done and one is being submitted (bounded: 60 s).
        deadline = time.monotonic() + 60
        at_kill = None
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(state):
                try:
                    rows = state_rows(state)
                except sqlite3.OperationalError:  # the runner is creating its schema
                    time.sleep(0.05)
                    continue
                states = [r[1] for r in rows]
                if states.count("completed") >= 2 and "submitting" in states:
                    proc.send_signal(signal.SIGKILL)
                    at_kill = rows
                    break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and at_kill is None:
            proc.kill()
        proc.wait(timeout=30)
    assert at_kill is not None, "the runner finished (or never started) before it could be killed"
    assert proc.returncode == -signal.SIGKILL
    in_doubt = {line for line, st, _, _ in at_kill if st == "submitting"}
    assert in_doubt and sum(1 for r in at_kill if r[1] == "completed") < n

    again = run_batch(batch_bin, f"http://127.0.0.1:{gateway.port}", token, manifest,
                      "--concurrency", "2", "--wait", "10")
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    res = results(manifest + ".results.jsonl")
    assert [r["line"] for r in res] == list(range(1, n + 1))
    assert all(r["state"] == "completed" and r["job_id"] for r in res), res
    # The rows that were in flight when the runner died were sent again — with their key.
    assert all(r["submits"] == 2 for r in res if r["line"] in in_doubt), res
    # And the provider saw exactly one create per row.
    ledger = mock.ledger()
    for r in res:
        creates = [e for e in ledger if e["client_ref"] == r["job_id"] and not e.get("replay")]
        assert len(creates) == 1, (r, creates)
    assert len([e for e in ledger if not e.get("replay")]) == n
    # It said that it resumed, and what it would do with the rows in doubt.
    assert "resuming from " + state in again.stderr and "in doubt" in again.stderr, again.stderr
    # A progress line with rate, ETA and states; a summary table.
    assert "rows/s" in again.stderr and "ETA" in again.stderr and "completed" in again.stderr
    assert any(line.split() == ["completed", str(n)] for line in again.stdout.splitlines()), \
        again.stdout
    assert any(line.split() == ["total", str(n)] for line in again.stdout.splitlines())

    # A third run has nothing to do and sends nothing.
    before = len(mock.ledger())
    third = run_batch(batch_bin, f"http://127.0.0.1:{gateway.port}", token, manifest)
    assert third.returncode == 0 and len(mock.ledger()) == before


def test_batch_runs_a_csv_manifest_and_says_when_it_resumes(batch_bin, gateway, token, mock,
                                                           tmp_path):
    """A CSV manifest (dotted, typed columns) runs as its JSONL twin would: the same keys, one
    create per row; run again, it says it resumes from the earlier run's state and sends
    nothing."""
    run = uuid.uuid4().hex[:8]
    url = f"http://127.0.0.1:{gateway.port}"
    csv_path = tmp_path / "posters.csv"
    csv_path.write_text("identity.run,identity.sku,body.prompt,body.n:int\n"
                        f"{run},sku-1,\"poster, sku-1\",1\n"
                        f"{run},sku-2,poster sku-2,1\n")
    first = run_batch(batch_bin, url, token, str(csv_path), "--route", ROUTE)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "resuming" not in first.stderr
    res = results(str(csv_path) + ".results.jsonl")
    assert [r["state"] for r in res] == ["completed", "completed"]
    assert [r["key"] for r in res] == [
        derive_key({"route": ROUTE, "identity": {"run": run, "sku": f"sku-{i}"}})
        for i in (1, 2)], "the keys of the equivalent JSONL rows"
    assert [len(mock.creates_for(r["job_id"])) for r in res] == [1, 1]
    before = len(mock.ledger())
    again = run_batch(batch_bin, url, token, str(csv_path), "--route", ROUTE)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    said = [line for line in again.stderr.splitlines() if "resuming from" in line]
    assert len(said) == 1 and str(csv_path) + ".state.sqlite" in said[0], again.stderr
    assert "2 finished (left alone)" in said[0], said
    assert len(mock.ledger()) == before, "nothing sent again"


def test_batch_row_errors_and_a_402_stops_the_run(batch_bin, gateway_factory, token, mock,
                                                  tmp_path):
    acct = "acct" + uuid.uuid4().hex[:8]
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[
        provider("mock-images", mock.url),
        provider(acct, mock.url, retry=FAST_RETRY)])
    url = f"http://127.0.0.1:{gw.port}"
    run = uuid.uuid4().hex[:8]

    def row(i, route=ROUTE, **body):
        return {"route": route, "identity": {"run": run, "row": i},
                "body": dict({"prompt": f"row {i}"}, **body)}
    manifest = write_manifest(tmp_path / "m.jsonl", [
        row(1),
        row(2, route="no-such-provider/images/generations"),      # that row's 404
        row(3, route=f"{acct}/images/generations", _mock={"status": 402}),  # the account's 402
        row(4), row(5)])
    try:
        p = run_batch(batch_bin, url, token, manifest, "--concurrency", "1")
        assert p.returncode == 2, p.stdout + p.stderr[-3000:]
        assert "STOPPED" in p.stdout and "402" in p.stdout
        res = {r["line"]: r for r in results(manifest + ".results.jsonl")}
        assert res[1]["state"] == "completed"
        assert res[2]["state"] == "error" and "unknown-route" in res[2]["error"]
        assert res[3]["state"] == "failed" and res[3]["job_id"]
        assert res[4]["state"] == res[5]["state"] == "pending"
        assert res[4]["job_id"] is None and res[5]["job_id"] is None
        creates = [e for e in mock.ledger() if not e.get("replay")]
        assert sorted(e["client_ref"] for e in creates) == sorted([res[1]["job_id"],
                                                                   res[3]["job_id"]])
    finally:
        gw.http.request("POST", f"/v1/admin/providers/{acct}/reset",
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def test_batch_a_401_stops_before_anything_is_sent(batch_bin, gateway, mock, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"route": ROUTE, "identity": {"row": i}, "body": {"prompt": str(i)}} for i in range(3)])
    p = run_batch(batch_bin, f"http://127.0.0.1:{gateway.port}", "wrong-token", manifest)
    assert p.returncode == 2 and "unauthorized" in p.stdout, p.stdout + p.stderr[-2000:]
    assert [r["state"] for r in results(manifest + ".results.jsonl")] == ["pending"] * 3
    assert mock.ledger() == []


def test_batch_a_changed_body_under_the_same_identity_keeps_its_job_or_is_a_422(
        batch_bin, gateway, token, mock, tmp_path):
    url = f"http://127.0.0.1:{gateway.port}"
    run = uuid.uuid4().hex[:8]
    rows = [{"route": ROUTE, "identity": {"run": run, "row": i}, "body": {"prompt": f"v1 {i}"}}
            for i in range(2)]
    m1 = write_manifest(tmp_path / "m1.jsonl", rows)
    first = run_batch(batch_bin, url, token, m1)
    assert first.returncode == 0, first.stdout + first.stderr[-2000:]
    jobs = [r["job_id"] for r in results(m1 + ".results.jsonl")]

    rows[1]["body"]["prompt"] = "v1 1, edited without a new identity"
    m2 = write_manifest(tmp_path / "m2.jsonl", rows)
    # Another machine (its own state file): the gateway answers row 2 with 422.
    p = run_batch(batch_bin, url, token, m2, "--state", str(tmp_path / "other.sqlite"))
    assert p.returncode == 1, p.stdout + p.stderr[-2000:]
    res = results(m2 + ".results.jsonl")
    assert res[0]["state"] == "completed" and res[0]["job_id"] == jobs[0]
    assert res[1]["state"] == "error" and "idempotency-key-reused" in res[1]["error"]
    assert res[1]["submits"] == 1, "a 422 is not retried"
    # The same machine's state file knows the row's old body and the job its key holds: that
    # job is kept and collected, with a warning — never a final error that invites a new
    # identity (a second payment) — and nothing is sent.
    p = run_batch(batch_bin, url, token, m2, "--state", m1 + ".state.sqlite")
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert "body changed since an earlier run" in p.stderr, p.stderr[-2000:]
    res = results(m2 + ".results.jsonl")
    assert res[1]["state"] == "completed" and res[1]["job_id"] == jobs[1], res[1]
    assert "earlier body's job" in res[1]["warning"], res[1]
    assert len([e for e in mock.ledger() if not e.get("replay")]) == 2


# --- the README's examples, as written ---------------------------------------------------------

def readme_block(name, lang):
    with open(os.path.join(ROOT, "docs", "clients.md")) as f:
        text = f.read()
    m = re.search(rf"<!-- tested: {name} -->\n```{lang}\n(.*?)\n```\n", text, re.S)
    assert m, f"docs/clients.md has no '<!-- tested: {name} -->' {lang} block"
    return m.group(1)


def test_readme_examples_run_as_written(batch_bin, gateway, token, mock, tmp_path):
    venv_bin = os.path.dirname(batch_bin)
    env = dict(os.environ, IDEMGATE_URL=f"http://127.0.0.1:{gateway.port}", IDEMGATE_TOKEN=token,
               PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""))
    py = subprocess.run([os.path.join(venv_bin, "python"), "-c",
                         readme_block("python-client", "python")], env=env, cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=180)
    assert py.returncode == 0, py.stdout + py.stderr[-3000:]
    job_id, state, url = py.stdout.split()
    assert state == "completed" and url.startswith("http")
    assert len(mock.creates_for(job_id)) == 1

    sh = subprocess.run(["bash", "-euc", readme_block("batch", "sh")], env=env, cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=300)
    assert sh.returncode == 0, sh.stdout + sh.stderr[-3000:]
    res = results(str(tmp_path / "posters.jsonl.results.jsonl"))
    assert [r["state"] for r in res] == ["completed", "completed"]
    assert sh.stdout.count("completed") == 2, "two runs, each with its summary"
    assert len([e for e in mock.ledger() if not e.get("replay")]) == 3, \
        "one create for the client example, one per manifest row, none for the second run"


def test_the_client_streams_and_a_new_process_resumes_by_key(gateway_factory, mock, token):
    """Issue 25 §6: Client.stream yields the provider's events as they arrive; a consumer that
    stops half-way (a crash) and one that starts again with the same key get, together, the
    whole stream once, from one create (the second reads the record)."""
    from idemgate import Event  # noqa: F401 — the public name
    profile = os.path.join(ROOT, "deploy", "providers", "openai-chat.json")
    name = "pychat" + uuid.uuid4().hex[:6]
    gw = gateway_factory(providers=[{"name": name, "profile": profile, "base_url": mock.url,
                                     "timeouts": {"connect_ms": 1000, "total_ms": 8000}}],
                         env={"OPENAI_API_KEY": "sk-test"})
    c = Client(f"http://127.0.0.1:{gw.port}", token)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
            "_mock": {"events": 5, "event_delay_ms": 100}}
    key = "py-stream-" + uuid.uuid4().hex
    first = []
    for ev in c.stream(f"{name}/chat/completions", body, key, wait=30):
        first.append(ev)
        if len(first) == 2:
            break  # the consumer goes away; the generation goes on and is recorded
    again = list(c.stream(f"{name}/chat/completions", body, key, wait=30))
    assert again[:2] == first
    assert again[-1].data == "[DONE]"
    text = "".join(json.loads(e.data)["choices"][0]["delta"].get("content", "")
                   for e in again if e.data != "[DONE]" and json.loads(e.data)["choices"])
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    creates = [e for e in mock.ledger()
               if e["route"] == "/v1/chat/completions" and not e["replay"]]
    assert len(creates) == 1, creates
