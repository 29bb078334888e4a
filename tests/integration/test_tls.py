"""A provider reached over TLS (issue 23's left-overs): `tls.ca_file` authenticates a provider's
origin by a CA of its own, and a kept-alive TLS connection with bytes waiting never carries a
request — bytes OpenSSL has already read into its own buffer included, which no peek of the
socket sees (connguard.h)."""

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid

import pytest

from conftest import provider


def key():
    return "tls-" + uuid.uuid4().hex


def certificate(tmp_path, name):
    """A self-signed certificate for 127.0.0.1 (its own CA): the paths of its PEM and its key."""
    cert, key_ = str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key")
    subprocess.check_call(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", key_, "-out", cert, "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"], stderr=subprocess.DEVNULL)
    return cert, key_


def answer(text):
    body = json.dumps({"created": 1, "data": [{"url": "https://cdn.example/x.png"}],
                       "answer": text}).encode()
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head, body


class TlsProvider:
    """An HTTPS provider on loopback, its certificate its own CA. Every POST is answered 200
    with `"answer": "<n>"` (n counts the requests); with `excess` set, the next answer's body is
    followed by a whole second answer nobody asked for (`"answer": "stale"`), written with the
    body's last bytes in one TLS record: the head goes first, on its own, so that libcurl reads
    the body by its length and leaves the rest in OpenSSL's buffer."""

    def __init__(self, tmp_path):
        self.cert, self.key = certificate(tmp_path, "ca")
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(self.cert, self.key)
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.srv.settimeout(0.2)
        self.requests = []  # (connection number, request number)
        self.excess = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.conns = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"https://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.stop.is_set():
            try:
                s, _ = self.srv.accept()
            except OSError:
                continue
            with self.lock:
                self.conns += 1
                cid = self.conns
            threading.Thread(target=self._serve, args=(s, cid), daemon=True).start()

    def _serve(self, raw, cid):
        try:
            s = self.ctx.wrap_socket(raw, server_side=True)
            buf = b""
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    chunk = s.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                buf = buf[length:]
                with self.lock:
                    self.requests.append(cid)
                    n, excess, self.excess = len(self.requests), self.excess, False
                h, b = answer(str(n))
                if excess:
                    s.sendall(h)
                    time.sleep(0.2)  # the head is read alone; the body then by its length
                    s.sendall(b + b"".join(answer("stale")))
                else:
                    s.sendall(h + b)
        except (OSError, ssl.SSLError):
            pass
        finally:
            raw.close()

    def close(self):
        self.stop.set()
        self.srv.close()


@pytest.fixture
def tls_provider(tmp_path):
    p = TlsProvider(tmp_path)
    yield p
    p.close()


def metric(gw, name):
    for line in gw.http.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def submit(gw, token, prompt):
    r = gw.submit(token, key(), {"prompt": prompt}, route="tls/images/generations",
                  headers={"Prefer": "wait=15"})
    assert r.status == 200, (r.status, r.body[:300])
    return r.json()


def test_a_provider_with_a_private_ca_is_reached_and_a_wrong_ca_is_refused(
        gateway_factory, token, tls_provider, tmp_path):
    gw = gateway_factory(providers=[provider("tls", tls_provider.url,
                                             tls={"ca_file": tls_provider.cert})])
    assert submit(gw, token, "one")["answer"] == "1"
    # Without it the system's bundle is used, which does not know this CA: nothing is sent.
    # (A provider name of its own: the first gateway would claim and send its jobs.)
    other = gateway_factory(providers=[provider("tlsx", tls_provider.url)])
    refused_everywhere(other, token, "tlsx", tls_provider)


def refused_everywhere(gw, token, name, tls_provider):
    """A create whose every sending fails the provider's certificate: the job is never completed
    (its sendings are refused before any byte leaves, and it waits to be sent again), and the
    provider receives nothing more."""
    seen = list(tls_provider.requests)
    r = gw.submit(token, key(), {"prompt": "refused"}, route=f"{name}/images/generations",
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    time.sleep(3)
    job = gw.job(token, r.json()["id"]).json()
    # Between two refused sendings it may be read `sending` (the next one is under way).
    assert job["state"] in ("prepared", "sending", "failed"), job
    assert '"curl_code":60' in gw.log(), gw.log()[-1500:]  # the peer's certificate refused
    assert tls_provider.requests == seen, tls_provider.requests


def test_bytes_waiting_in_the_tls_buffer_are_never_read_as_the_next_answer(
        gateway_factory, token, tls_provider):
    """The provider's answer is followed, in the same TLS record, by a second answer nobody
    asked for. libcurl reads the body by its length and keeps the connection; the rest sits in
    OpenSSL's buffer, where a peek of the socket finds nothing. Sent on that connection, the
    next create would read the stale answer as its own (another job's result, perhaps another
    tenant's) while the provider makes its task. The gateway sees the bytes OpenSSL holds and
    sends the create on a new connection: its own answer, one create."""
    gw = gateway_factory(call_threads=1, providers=[provider(
        "tls", tls_provider.url, tls={"ca_file": tls_provider.cert},
        timeouts={"connect_ms": 1000, "total_ms": 5000, "keepalive_seconds": 60})])
    before = metric(gw, "idemgate_stale_connections_refused_total")
    tls_provider.excess = True
    assert submit(gw, token, "first")["answer"] == "1"
    second = submit(gw, token, "second")
    assert second["answer"] == "2", second
    assert tls_provider.requests == [1, 2], tls_provider.requests  # a new connection
    assert metric(gw, "idemgate_stale_connections_refused_total") == before + 1
    # A clean kept-alive TLS connection still carries the next create (nothing is pending once
    # its answer is read whole: no refusal of every reuse).
    assert submit(gw, token, "third")["answer"] == "3"
    assert tls_provider.requests == [1, 2, 2], tls_provider.requests
    assert metric(gw, "idemgate_stale_connections_refused_total") == before + 1


def test_a_provider_s_ca_file_replaces_the_system_s_certificates(gateway_factory, token,
                                                                  tls_provider, tmp_path):
    """`tls.ca_file` pins the provider to its own CA: a certificate the system trusts is no
    longer enough. The gateways run in a mount namespace of the test's own whose system
    certificate directory (/etc/ssl/certs, Debian's libcurl reads it besides its bundle) holds
    the provider's certificate: a gateway without `ca_file` reaches the provider through it (the
    namespace works), one whose `ca_file` names another CA refuses it. (This machine's libcurl
    already leaves the directory out once a CA file is set — the test passes without the
    gateway's explicit `CURLOPT_CAPATH` of NULL too; it holds the contract, whatever a build.)"""
    if subprocess.call(["unshare", "-m", "true"], stderr=subprocess.DEVNULL) != 0:
        pytest.skip("no mount namespace here (unshare -m needs root or user namespaces)")
    certs = tmp_path / "certs"
    certs.mkdir()
    h = subprocess.check_output(["openssl", "x509", "-hash", "-noout", "-in", tls_provider.cert],
                                text=True).strip()
    with open(tls_provider.cert) as f, open(certs / f"{h}.0", "w") as out:
        out.write(f.read())
    # libcurl's bundle lives in that directory too: the system's own, which lacks this CA.
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", certs / "ca-certificates.crt")
    wrap = ["unshare", "-m", "sh", "-c",
            f"mount --bind {certs} /etc/ssl/certs && exec \"$@\"", "wrapped"]
    plain = gateway_factory(wrap=wrap, providers=[provider("tls", tls_provider.url)])
    assert submit(plain, token, "trusted by the system")["answer"] == "1"
    other, _ = certificate(tmp_path, "other")
    pinned = gateway_factory(wrap=wrap, providers=[provider("tlspin", tls_provider.url,
                                                            tls={"ca_file": other})])
    refused_everywhere(pinned, token, "tlspin", tls_provider)
