"""The gateway's network path to providers and the credentials on it (issue 10, B5 and D17).

B5: libcurl honours http_proxy / HTTPS_PROXY / ALL_PROXY from the environment; a proxy nobody
configured could turn an upstream timeout into a definite 502/504 and would see the provider's
credential. Only a provider's own `proxy` setting is ever used.
D17: no fixed-size buffer may cut a credential or a header line: 2 KB provider tokens and long
tenant tokens exist, and a cut token reads as 401 (which trips the provider for everyone).
"""

import hashlib
import json
import os
import socket
import threading
import time
import uuid

import pytest

from conftest import provider


class FakeProxy:
    """A TCP listener that records every connection. With forward=True it is a minimal HTTP
    forward proxy (absolute-form request line → origin-form to the target, one request per
    connection); otherwise it closes each connection without a byte."""

    def __init__(self, forward=False):
        self.forward = forward
        self.lock = threading.Lock()
        self.connections = 0
        self.request_lines = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self.handle, args=(c,), daemon=True).start()

    def handle(self, c):
        try:
            c.settimeout(10)
            if not self.forward:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = c.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, body = head.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            with self.lock:
                self.request_lines.append(lines[0])
            headers = [ln for ln in lines[1:] if not ln.lower().startswith(("proxy-", "connection:"))]
            length = next((int(ln.split(":", 1)[1]) for ln in headers
                           if ln.lower().startswith("content-length:")), 0)
            while len(body) < length:
                chunk = c.recv(65536)
                if not chunk:
                    return
                body += chunk
            assert target.startswith("http://"), target
            hostport, _, path = target[len("http://"):].partition("/")
            host, _, port = hostport.partition(":")
            up = socket.create_connection((host, int(port or 80)), timeout=30)
            up.sendall(f"{method} /{path} {version}\r\n".encode() +
                       "\r\n".join(headers + ["Connection: close"]).encode() + b"\r\n\r\n" + body)
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                c.sendall(chunk)
            up.close()
        except (OSError, AssertionError, ValueError):
            pass
        finally:
            c.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def fake_proxy():
    proxies = []

    def make(forward=False):
        p = FakeProxy(forward)
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.close()


def proxy_env(url):
    return {name: url for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                                   "all_proxy", "ALL_PROXY")}


def test_environment_proxies_are_ignored(gateway_factory, mock, token, fake_proxy):
    trap = fake_proxy()
    gw = gateway_factory(env=proxy_env(trap.url))
    r = gw.submit(token, "env-proxy-" + uuid.uuid4().hex, {"prompt": "direct", "n": 1})
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], ("completed", "failed", "unknown", "review"))
    assert job["state"] == "completed", job
    assert len(mock.creates_for(job["id"])) == 1, "the create reached the provider directly"
    assert trap.connections == 0, "the environment's proxy was used"


def test_configured_proxy_is_the_only_one_and_carries_every_call(
        gateway_factory, mock, token, fake_proxy):
    trap = fake_proxy()
    configured = fake_proxy(forward=True)
    env = proxy_env(trap.url)
    env["NO_PROXY"] = env["no_proxy"] = "*"  # would exempt every host from a proxy
    gw = gateway_factory(env=env, providers=[provider(
        "mock-images", mock.url, proxy=configured.url,
        auth={"header": "Authorization", "prefix": "Bearer ",
              "secret_env": "MOCK_IMAGES_API_KEY"})])
    r = gw.submit(token, "conf-proxy-" + uuid.uuid4().hex, {"prompt": "via proxy", "n": 1})
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], ("completed", "failed", "unknown", "review"))
    assert job["state"] == "completed", job
    assert len(mock.creates_for(job["id"])) == 1
    assert configured.request_lines == [f"POST {mock.url}/v1/images/generations HTTP/1.1"], \
        configured.request_lines
    assert trap.connections == 0


def test_long_provider_credential_is_sent_whole(gateway_factory, mock, token):
    # 2 KB and more: real provider tokens of that size exist. A cut one reads as 401.
    secret = "sk-" + "A1b2C3d4" * 512  # 4099 bytes
    gw = gateway_factory(env={"MOCK_IMAGES_API_KEY": secret})
    r = gw.submit(token, "long-secret-" + uuid.uuid4().hex, {"prompt": "auth", "n": 1})
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], ("completed", "failed", "unknown", "review"))
    assert job["state"] == "completed", job
    (create,) = mock.creates_for(job["id"])
    assert create["auth_sha256"] == hashlib.sha256(b"Bearer " + secret.encode()).hexdigest()
    assert secret not in gw.log()


def test_a_credential_ending_in_a_line_end_is_never_sent(gateway_factory, mock, token):
    """A secret made from a file ends with a line end. Written into the header block as it is,
    it ended the headers early: the create reached the provider without its body, its own
    idempotency key or our reference, the rest read as a second request smuggled on the
    connection. Such a secret is never sent: the job waits, `prepared`, for it to be fixed."""
    secret = "sk-mock-secret\n"
    gw = gateway_factory(env={"MOCK_IMAGES_API_KEY": secret})
    r = gw.submit(token, "nl-secret-" + uuid.uuid4().hex, {"prompt": "auth", "n": 1})
    assert r.status == 202, r
    job_id = r.json()["id"]
    deadline = time.monotonic() + 10
    while "holds a control character" not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    assert mock.creates_for(job_id) == []
    assert gw.wait_state(token, job_id, ("prepared",), 5)["state"] == "prepared"
    assert "sk-mock-secret" not in gw.log()


def test_a_credential_file_replaced_is_used_by_the_next_call(gateway_factory, mock, token,
                                                             tmp_path):
    """auth.secret_file: a token an agent replaces (a Vertex AI access token lasts an hour) is
    read again once replaced, so the next create carries the new one without a restart; its line
    end is not part of it. Gone, nothing is sent: the job waits, `prepared`. Neither token is
    ever logged. With secret_env alone, a rotated key needed a restart of every replica."""
    path = tmp_path / "provider-token"

    def replace(text):
        tmp = tmp_path / ".provider-token.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)

    def create_auth(key):
        r = gw.submit(token, key + uuid.uuid4().hex, {"prompt": "auth", "n": 1})
        assert r.status == 202, r
        job = gw.wait_state(token, r.json()["id"], ("completed", "failed", "unknown", "review"))
        assert job["state"] == "completed", job
        (create,) = mock.creates_for(job["id"])
        return create["auth_sha256"]

    replace("tok-first-1a2b\n")
    gw = gateway_factory(providers=[provider(
        "mock-images", mock.url,
        auth={"header": "Authorization", "prefix": "Bearer ", "secret_file": str(path)})])
    assert create_auth("file-one-") == hashlib.sha256(b"Bearer tok-first-1a2b").hexdigest()
    replace("tok-second-3c4d\n")
    assert create_auth("file-two-") == hashlib.sha256(b"Bearer tok-second-3c4d").hexdigest()
    path.unlink()
    r = gw.submit(token, "file-gone-" + uuid.uuid4().hex, {"prompt": "auth", "n": 1})
    assert r.status == 202, r
    deadline = time.monotonic() + 10
    while "credential is not set" not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    assert mock.creates_for(r.json()["id"]) == []
    assert gw.wait_state(token, r.json()["id"], ("prepared",), 5)["state"] == "prepared"
    for secret in ("tok-first-1a2b", "tok-second-3c4d"):
        assert secret not in gw.log()


def test_a_replica_without_the_credential_leaves_the_jobs_unsent_and_uncounted(
        gateway_factory, mock, token, psql, tmp_path):
    """A replica whose environment lacks a provider's secret (its file not mounted yet) takes
    none of that provider's jobs: it recorded each born reserved for itself, or claimed it, and
    gave it back a moment later, counting a transport attempt and a first send that never
    happened — every few seconds, against the job's retry budget and recovery window. Now the
    rows wait `prepared`, unowned and uncounted, and go the moment the secret can be read."""
    path = tmp_path / "provider-token"
    gw = gateway_factory(providers=[provider(
        "mock-images", mock.url,
        auth={"header": "Authorization", "prefix": "Bearer ", "secret_file": str(path)})])
    ids = []
    for _ in range(3):
        r = gw.submit(token, "no-cred-" + uuid.uuid4().hex, {"prompt": "cred", "n": 1})
        assert r.status == 202, r
        ids.append(r.json()["id"])
    deadline = time.monotonic() + 10
    while "provider_credential_unusable" not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    assert "credential is not set" in gw.log()
    listed = ",".join(f"'{i}'" for i in ids)
    rows = f"SELECT count(*) FROM operations WHERE id IN ({listed})"
    untouched = (rows + " AND state = 'prepared' AND transport_attempts = 0 "
                 "AND first_sent_at IS NULL")
    def cpu_s():  # the gateway's CPU time so far (utime + stime)
        with open(f"/proc/{gw.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = cpu_s()
    time.sleep(3)  # several of the dispatcher's claim rounds and born reservations
    # Idle, not spinning: a claim that found no provider's credential readable took an engine
    # slot and gave it back, which woke the same thread to claim again at once (one core busy
    # for as long as the secret was missing). An idle gateway spends a few hundredths of a
    # second in 3 s; the spin spent about 3.
    assert cpu_s() - before < 1.0, cpu_s() - before
    assert psql(untouched) == [["3"]], psql(
        f"SELECT id, state, transport_attempts, first_sent_at, lease_owner FROM operations "
        f"WHERE id IN ({listed})")
    assert psql(f"SELECT count(*) FROM attempts WHERE operation_id IN ({listed})") == [["0"]]
    assert all(mock.creates_for(i) == [] for i in ids)
    path.write_text("tok-arrived-5e6f\n")
    for i in ids:
        job = gw.wait_state(token, i, ("completed", "failed", "unknown", "review"), 30)
        assert job["state"] == "completed", job
        assert len(mock.creates_for(i)) == 1
    assert psql(rows + " AND transport_attempts = 1") == [["3"]]
    assert "tok-arrived-5e6f" not in gw.log()


@pytest.mark.parametrize("size", [513, 4096, 16384])
def test_long_tenant_token_is_accepted(gateway_factory, psql, size):
    # A tenant's bearer token is only ever hashed: its length is no reason to refuse it.
    tok = ("tk" + uuid.uuid4().hex * (size // 32 + 1))[:size]
    name = "long-" + uuid.uuid4().hex[:12]
    digest = hashlib.sha256(tok.encode()).hexdigest()
    psql(f"INSERT INTO tenants (name, token_sha256) VALUES ('{name}', '{digest}')")
    gw = gateway_factory()
    r = gw.submit(tok, "long-token-" + uuid.uuid4().hex, {"prompt": "tenant", "n": 1})
    assert r.status == 202, r
    assert gw.job(tok, r.json()["id"]).status == 200
    # The same token one character short is another tenant's (none): 401, not a crash.
    assert gw.job(tok[:-1], r.json()["id"]).status == 401


def test_an_abandoned_create_is_reset_not_closed(gateway_factory, token):
    """A create abandoned before its answer ends its connection with a reset. After a graceful
    close the kernel goes on retransmitting whatever the provider has not acknowledged, and a
    provider that was not reading (a full accept queue, a lost segment) could receive the
    request after the reconciler had proved the task absent and resent it. A reset drops it:
    the bytes of an attempt travel only while it runs."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(15)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    gw = gateway_factory(providers=[provider("silent", url, timeouts={"connect_ms": 1000,
                                                                      "total_ms": 1000})])
    try:
        r = gw.submit(token, "reset-" + uuid.uuid4().hex, {"prompt": "never answered"},
                      route="silent/images/generations")
        assert r.status == 202, r
        conn, _ = srv.accept()
        conn.settimeout(15)
        seen = b""
        while b"\r\n\r\n" not in seen:  # the request arrives; no answer is ever sent
            chunk = conn.recv(65536)
            assert chunk, seen
            seen += chunk
        assert seen.startswith(b"POST /v1/images/generations ")
        with pytest.raises(ConnectionResetError):
            while True:  # the rest of the body, then the end of the connection
                assert conn.recv(65536), "closed gracefully: unacknowledged bytes could follow"
        job = gw.wait_state(token, r.json()["id"], ("unknown", "review"))
        assert job["state"] in ("unknown", "review"), job
        conn.close()
    finally:
        srv.close()
