"""The client's download checks (Client.download_output / outputs) against a small local HTTP
server on 127.0.0.1 that plays a gateway's output endpoint: bytes kept only when their SHA-256
equals the ETag and the job's record, nothing half-written left behind, a 503 retried. This
tests the client's checking, not the gateway's endpoint (that test is
tests/integration/test_python_client.py::test_outputs_right_after_wait_are_the_archived_bytes)."""

import hashlib
import http.server
import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import (Client, IntegrityError, Job, OutputsUnavailable,  # noqa: E402
                      RetryPolicy)
from idemgate.client import extension_for  # noqa: E402

DATA = b"\x89PNG pretend image bytes" * 100
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def server():
    hits = {}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            n = hits[self.path] = hits.get(self.path, 0) + 1
            etag = {"/v1/jobs/job_x/outputs/0": SHA, "/v1/jobs/job_x/outputs/2": SHA,
                    "/v1/jobs/job_x/outputs/1": "0" * 64}.get(self.path)
            if self.path.endswith("/2") and n == 1:
                self.send_response(503)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if etag is None:
                body = json.dumps({"type": "urn:idemgate:problem:output-not-archived"}).encode()
                self.send_response(404)
                self.send_header("Content-Type", "application/problem+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(DATA)))
            self.end_headers()
            self.wfile.write(DATA)

    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{s.server_address[1]}", hits
    s.shutdown()
    s.server_close()


def client(url):
    return Client(url, "tok", sleep=lambda s: None, retry=RetryPolicy(max_attempts=3))


def test_a_checked_download_lands_whole(server, tmp_path):
    url, _ = server
    o = client(url).download_output("job_x", 0, str(tmp_path / "a.png"), expected_sha256=SHA)
    assert o.sha256 == SHA and o.bytes == len(DATA) and o.content_type == "image/png"
    assert (tmp_path / "a.png").read_bytes() == DATA
    assert os.listdir(tmp_path) == ["a.png"]


@pytest.mark.parametrize("n,expected", [(1, SHA), (0, "f" * 64)])
def test_a_digest_mismatch_is_refused_and_leaves_nothing(server, tmp_path, n, expected):
    url, _ = server
    with pytest.raises(IntegrityError):
        client(url).download_output("job_x", n, str(tmp_path / "a.png"), expected_sha256=expected)
    assert os.listdir(tmp_path) == []


def test_a_503_is_retried(server, tmp_path):
    url, hits = server
    client(url).download_output("job_x", 2, str(tmp_path / "c.png"))
    assert hits["/v1/jobs/job_x/outputs/2"] == 2 and (tmp_path / "c.png").read_bytes() == DATA


def test_outputs_follow_the_jobs_archive_record(server, tmp_path):
    url, _ = server
    job = Job({"id": "job_x", "state": "completed", "terminal": True,
               "archive": [{"index": 0, "state": "archived", "sha256": SHA}]})
    [o] = client(url).outputs(job, str(tmp_path))
    assert open(o.path, "rb").read() == DATA
    assert os.path.basename(o.path) == "job_x-0.png", "saved with its type's extension"
    with pytest.raises(OutputsUnavailable) as e:
        client(url).download_output("job_x", 5, str(tmp_path / "z"))
    assert e.value.pending, "output-not-archived: it may be archived later"


@pytest.mark.parametrize("ct,ext", [("image/png", ".png"), ("image/jpeg", ".jpg"),
                                    ("image/webp", ".webp"), ("video/mp4", ".mp4"),
                                    ("IMAGE/PNG; charset=binary", ".png"), (None, ".bin"),
                                    ("application/octet-stream", ".bin"),
                                    ("application/x-no-such-type", ".bin")])
def test_extension_for(ct, ext):
    assert extension_for(ct) == ext


# --- outputs() waits for the archive ------------------------------------------------------------

class Gateway:
    """Plays GET /v1/jobs/job_g (the nth read answers views[min(n, last)]) and its outputs:
    output n is served when the current view has it `archived`, else 404 with the gateway's
    problem types (`output-not-archived` until planned, `output-not-found` past the planned
    outputs)."""

    def __init__(self, views, planned_empty=False, state="completed"):
        self.views, self.reads, self.planned_empty, self.state = views, 0, planned_empty, state
        self.lock = threading.Lock()

    def current(self):
        return self.views[min(max(self.reads - 1, 0), len(self.views) - 1)]


@pytest.fixture
def gateway():
    holder = {}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, status, body, ctype="application/json", headers=()):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            g = holder["g"]
            with g.lock:
                if self.path == "/v1/jobs/job_g":
                    g.reads += 1
                    view = {"id": "job_g", "state": g.state, "terminal": True,
                            "archive": g.current()}
                    return self.reply(200, json.dumps(view).encode())
                n = int(self.path.rsplit("/", 1)[1])
                archive = g.current()
            rec = next((o for o in archive if o["index"] == n), None)
            if rec is None or rec["state"] != "archived":
                kind = "output-not-found" if (rec is None and (archive or g.planned_empty)) \
                    else "output-not-archived"
                return self.reply(404, json.dumps({"type": "urn:idemgate:problem:" + kind})
                                  .encode(), "application/problem+json")
            if self.headers.get("If-None-Match") == "*":
                return self.reply(304, b"")
            self.reply(200, DATA, rec["content_type"], [("ETag", f'"{SHA}"')])

    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()

    def start(g):
        holder["g"] = g
        return f"http://127.0.0.1:{s.server_address[1]}"
    yield start
    s.shutdown()
    s.server_close()


def rec(n, state, ct="image/png"):
    return {"index": n, "state": state, "sha256": SHA if state == "archived" else None,
            "content_type": ct if state == "archived" else None,
            "last_error": "HTTP 403 from the provider" if state == "failed" else None}


def slow_client(url):
    return Client(url, "tok", sleep=lambda s: time.sleep(0.005),
                  retry=RetryPolicy(max_attempts=3))


def test_outputs_right_after_wait_waits_for_the_archive(gateway, tmp_path):
    """The job as wait() returns it (`archive: []`: not planned yet), then pending, then
    archived: outputs() reads the job again until every output is archived and downloads
    them, each with its type's extension — never `[]`."""
    g = Gateway([[], [], [rec(0, "pending"), rec(1, "pending")],
                 [rec(0, "archived"), rec(1, "pending")],
                 [rec(0, "archived"), rec(1, "archived", "image/jpeg")]])
    url = gateway(g)
    just_waited = Job({"id": "job_g", "state": "completed", "terminal": True, "archive": []})
    got = slow_client(url).outputs(just_waited, str(tmp_path), timeout=60)
    assert [os.path.basename(o.path) for o in got] == ["job_g-0.png", "job_g-1.jpg"]
    assert all(open(o.path, "rb").read() == DATA and o.sha256 == SHA for o in got)
    assert g.reads == 5
    assert sorted(os.listdir(tmp_path)) == ["job_g-0.png", "job_g-1.jpg"]


def test_a_job_planned_without_outputs_has_none(gateway, tmp_path):
    g = Gateway([[]], planned_empty=True)
    assert slow_client(gateway(g)).outputs("job_g", str(tmp_path), timeout=60) == []
    assert g.reads == 1, "output 0 is output-not-found: planned, nothing to wait for"


@pytest.mark.parametrize("views", [[[]], [[rec(0, "archived"), rec(1, "pending")]]])
def test_an_archive_that_does_not_settle_in_time_raises_pending(gateway, tmp_path, views):
    g = Gateway(views)
    with pytest.raises(OutputsUnavailable) as e:
        slow_client(gateway(g)).outputs("job_g", str(tmp_path), timeout=0.3)
    assert e.value.pending and e.value.job_id == "job_g"
    assert ("pending" if views[0] else "not planned") in str(e.value)
    assert g.reads >= 2, "it waited: the job was read again"
    assert os.listdir(tmp_path) == [], "nothing is saved until every output is archived"


@pytest.mark.parametrize("state", ["failed", "expired"])
def test_an_output_the_gateway_will_not_archive_raises_at_once(gateway, tmp_path, state):
    g = Gateway([[rec(0, "archived"), rec(1, state)]])
    with pytest.raises(OutputsUnavailable) as e:
        slow_client(gateway(g)).outputs("job_g", str(tmp_path), timeout=60)
    assert not e.value.pending and f"output 1 is {state}" in str(e.value)
    assert g.reads == 1


def test_a_job_that_did_not_complete_has_no_outputs(gateway, tmp_path):
    g = Gateway([[]], state="failed")
    with pytest.raises(OutputsUnavailable) as e:
        slow_client(gateway(g)).outputs("job_g", str(tmp_path), timeout=60)
    assert not e.value.pending and "failed" in str(e.value)
