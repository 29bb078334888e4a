"""The client's download checks (Client.download_output / outputs) against a small local HTTP
server on 127.0.0.1 that plays a gateway's output endpoint: bytes kept only when their SHA-256
equals the ETag and the job's record, nothing half-written left behind, a 503 retried. This
tests the client's checking, not the gateway's endpoint (that test is
tests/integration/test_python_client.py::test_outputs_are_downloaded_and_checked)."""

import hashlib
import http.server
import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import (Client, IntegrityError, Job, OutputsUnavailable,  # noqa: E402
                      RetryPolicy)

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
    pending = Job({"id": "job_x", "state": "completed", "terminal": True,
                   "archive": [{"index": 0, "state": "pending", "sha256": None}]})
    with pytest.raises(OutputsUnavailable, match="pending"):
        client(url).outputs(pending, str(tmp_path))
    with pytest.raises(OutputsUnavailable):
        client(url).download_output("job_x", 5, str(tmp_path / "z"))
