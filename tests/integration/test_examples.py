"""The client examples (examples/curl.sh, python_client.py, node_client.mjs) against a live
gateway. Each client talks to the gateway through a recording proxy, so the tests see every
request a client made (and can tell a retry from none) as well as what the provider received
(the mock's ledger)."""

import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid

import pytest

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples")
CLIENTS = {
    "curl": ["bash", os.path.join(EXAMPLES, "curl.sh")],
    "python": ["/usr/bin/python3", os.path.join(EXAMPLES, "python_client.py")],
    "node": ["node", os.path.join(EXAMPLES, "node_client.mjs")],
}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class RecordingProxy:
    """A forwarding HTTP proxy on 127.0.0.1 that records (time, method, path, key, status)."""

    def __init__(self, target_port):
        self.records = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                    status = resp.status
                finally:
                    conn.close()
                with proxy.lock:
                    proxy.records.append({"time": time.monotonic(), "method": self.command,
                                          "path": self.path, "status": status,
                                          "key": self.headers.get("Idempotency-Key"),
                                          "retry_after": resp.getheader("Retry-After")})

            do_GET = do_POST = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self):
        with self.lock:
            return [r for r in self.records if r["method"] == "POST"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def proxy_for():
    started = []

    def start(gw):
        p = RecordingProxy(gw.port)
        started.append(p)
        return p
    yield start
    for p in started:
        p.close()


class Run:
    def __init__(self, proc, out, err):
        self.code = proc.returncode
        self.stdout = out
        self.stderr = err
        lines = [ln for ln in out.splitlines() if ln.strip()]
        self.summary = json.loads(lines[-1]) if lines else None

    def __repr__(self):
        return f"<exit {self.code} {self.summary} stderr={self.stderr[-1500:]!r}>"


def start_client(name, url, token, product, *args):
    env = dict(os.environ, IDEMGATE_URL=url, IDEMGATE_TOKEN=token)
    cmd = CLIENTS[name] + ["--product", product, "--deadline", "60", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_client(name, url, token, product, *args):
    p = start_client(name, url, token, product, *args)
    out, err = p.communicate(timeout=120)
    return Run(p, out, err)


def product_id():
    return "sku-" + uuid.uuid4().hex[:10]


IDENTITY = ["--template-version", "3", "--prompt-version", "2", "--language", "de",
            "--aspect-ratio", "16:9", "--variant", "1"]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_example_completes_and_a_second_run_is_the_same_job(client, gateway, token, mock,
                                                            proxy_for, tmp_path):
    proxy = proxy_for(gateway)
    source = tmp_path / "photo.jpg"
    source.write_bytes(b"\xff\xd8 a product photo")
    product = product_id()
    first = run_client(client, proxy.url, token, product, *IDENTITY, "--source", str(source))
    assert first.code == 0, first
    s = first.summary
    assert s["state"] == "completed" and s["replayed"] is False, first
    assert s["job_id"].startswith("job_") and s["outputs"], first
    assert re.fullmatch(rf"poster-{product}-[0-9a-f]{{32}}", s["key"])

    again = run_client(client, proxy.url, token, product, *IDENTITY, "--source", str(source))
    assert again.code == 0, again
    assert again.summary["job_id"] == s["job_id"] and again.summary["key"] == s["key"]
    assert again.summary["replayed"] is True
    assert again.summary["outputs"] == s["outputs"], "the stored result, not a new one"

    assert len(mock.creates_for(s["job_id"])) == 1, "two runs, one paid creation"
    assert {r["key"] for r in proxy.posts()} == {s["key"]}
    job = gateway.job(token, s["job_id"]).json()
    assert job["idempotency_key"] == s["key"] and job["state"] == "completed"

    # The source file is part of the identity: another photo is another output.
    source.write_bytes(b"\xff\xd8 a new product photo")
    other = run_client(client, proxy.url, token, product, *IDENTITY, "--source", str(source))
    assert other.code == 0, other
    assert other.summary["key"] != s["key"] and other.summary["job_id"] != s["job_id"]
    assert len(mock.creates_for(other.summary["job_id"])) == 1


def test_all_three_clients_derive_the_same_key_for_the_same_output(gateway, token, mock,
                                                                   proxy_for):
    proxy = proxy_for(gateway)
    product = product_id()
    runs = {c: run_client(c, proxy.url, token, product, *IDENTITY) for c in
            ("python", "node", "curl")}
    assert all(r.code == 0 for r in runs.values()), runs
    assert len({r.summary["key"] for r in runs.values()}) == 1, runs
    assert len({r.summary["job_id"] for r in runs.values()}) == 1, runs
    assert [runs[c].summary["replayed"] for c in ("python", "node", "curl")] == \
        [False, True, True]
    assert len(mock.creates_for(runs["python"].summary["job_id"])) == 1

    # Each part of the identity changes the key.
    base = runs["python"].summary["key"]
    for i in range(0, len(IDENTITY), 2):
        changed = list(IDENTITY)
        other = {"--language": "fr", "--aspect-ratio": "9:16"}
        changed[i + 1] = other[changed[i]] if changed[i] in other else \
            str(int(changed[i + 1]) + 1)
        r = run_client("python", proxy.url, token, product, *changed, "--wait", "0",
                       "--deadline", "0")
        assert r.summary["key"] != base, changed[i]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_changed_body_under_the_same_key_is_422_and_never_retried(client, gateway, token, mock,
                                                                  proxy_for):
    proxy = proxy_for(gateway)
    product = product_id()
    ok = run_client(client, proxy.url, token, product, *IDENTITY)
    assert ok.code == 0, ok
    posts_before = len(proxy.posts())

    # The caller edited the prompt but not --prompt-version: same identity, different body.
    bad = run_client(client, proxy.url, token, product, *IDENTITY,
                     "--prompt-override", 'a "different" prompt')
    assert bad.code == 3, bad
    assert bad.summary["key"] == ok.summary["key"] and bad.summary["state"] == "rejected"
    assert "422" in bad.stderr and "idempotency-key-reused" in bad.stderr
    new_posts = proxy.posts()[posts_before:]
    assert [r["status"] for r in new_posts] == [422], "one request, no retry"
    assert len(mock.ledger()) == 1, "the provider never saw the changed request"
    assert len(mock.creates_for(ok.summary["job_id"])) == 1


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_503_is_retried_after_retry_after_with_the_same_key(client, gateway_factory,
                                                            database_url, token, mock,
                                                            proxy_for):
    """A gateway whose database socket does not exist yet answers 503 store-unavailable with
    Retry-After. Once the client has seen one, the socket appears (a symbolic link to the
    test cluster's), and the client's retry — same key, after Retry-After — succeeds."""
    q = urllib.parse.parse_qs(urllib.parse.urlparse(database_url).query)
    real_socket = os.path.join(q["host"][0], f".s.PGSQL.{q['port'][0]}")
    assert os.path.exists(real_socket)
    sockdir = tempfile.mkdtemp(prefix="ig-sock-")
    try:
        url = database_url.replace(f"host={q['host'][0]}", f"host={sockdir}")
        gw = gateway_factory(env={"DATABASE_URL": url})
        proxy = proxy_for(gw)
        product = product_id()
        p = start_client(client, proxy.url, token, product, *IDENTITY)
        try:
            deadline = time.monotonic() + 60
            while not any(r["status"] == 503 for r in proxy.posts()):
                assert p.poll() is None, p.communicate()
                assert time.monotonic() < deadline, "the client never got a 503"
                time.sleep(0.02)
            os.symlink(real_socket, os.path.join(sockdir, os.path.basename(real_socket)))
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        run = Run(p, out, err)
        assert run.code == 0, run
        assert run.summary["state"] == "completed"
        posts = proxy.posts()
        statuses = [r["status"] for r in posts]
        first_ok = next(i for i, s in enumerate(statuses) if s in (200, 202))
        assert first_ok >= 1 and set(statuses[:first_ok]) == {503}, statuses
        assert {r["key"] for r in posts} == {run.summary["key"]}, "every retry, the same key"
        hint = int(posts[first_ok - 1]["retry_after"])
        assert hint >= 1
        assert posts[first_ok]["time"] - posts[first_ok - 1]["time"] >= hint, \
            "the client waited Retry-After before retrying"
        assert "503" in run.stderr and "same key" in run.stderr
        assert len(mock.creates_for(run.summary["job_id"])) == 1
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_failures_exit_non_zero(client, gateway, token, mock, proxy_for):
    proxy = proxy_for(gateway)
    # A token the gateway does not know: 401, not retried, exit 2.
    r = run_client(client, proxy.url, "not-a-tenant-token", product_id())
    assert r.code == 2, r
    assert [p["status"] for p in proxy.posts()] == [401]
    assert mock.ledger() == []

    # The provider refuses the request (a definite 400): the job fails, exit 1, one create.
    mock.script([{"status": 400}])
    r = run_client(client, proxy.url, token, product_id(), *IDENTITY)
    assert r.code == 1, r
    assert r.summary["state"] == "failed" and r.summary["job_id"].startswith("job_")
    assert len(mock.creates_for(r.summary["job_id"])) == 1

    # Polling instead of waiting reaches the same verdict.
    mock.script([{"status": 400}])
    r = run_client(client, proxy.url, token, product_id(), *IDENTITY, "--wait", "0")
    assert r.code == 1, r
    assert r.summary["state"] == "failed"
    assert any(p["method"] == "GET" and p["path"] == f"/v1/jobs/{r.summary['job_id']}"
               for p in proxy.records)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_usage_errors_exit_2_without_a_request(client, gateway, token, proxy_for):
    proxy = proxy_for(gateway)
    r = run_client(client, proxy.url, token, "no spaces allowed")
    assert r.code == 2, r
    env = dict(os.environ, IDEMGATE_URL=proxy.url)
    env.pop("IDEMGATE_TOKEN", None)
    p = subprocess.run(CLIENTS[client] + ["--product", "sku-1"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "IDEMGATE_TOKEN" in p.stderr
    assert proxy.records == []
