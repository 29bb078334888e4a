"""Client.wait against a small local HTTP server on 127.0.0.1 that plays scripted answers and
records every request it received: what wait() does when its held request (`Prefer: wait`, the
same request again) is refused in passing on every attempt."""

import http.server
import json
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import Client, RetryPolicy  # noqa: E402

JOB = {"id": "job_w", "object": "job", "state": "prepared", "terminal": False}
LIMITED = (429, {"type": "urn:idemgate:problem:rate-limited", "status": 429})


@pytest.fixture
def scripted():
    seen, answers = [], []

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(n)
            seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
            status, doc = answers.pop(0)
            body = json.dumps(doc).encode()
            self.send_response(status)
            ctype = "application/problem+json" if status >= 400 else "application/json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()

    def start(*script):
        answers.extend(script)
        return f"http://127.0.0.1:{s.server_address[1]}", seen
    yield start
    s.shutdown()
    s.server_close()


def test_a_held_wait_refused_in_passing_each_time_reads_the_job_by_id(scripted):
    """submit() → 202; wait() sends the same request again with Prefer: wait, refused 429 on
    every attempt (too many waits on the replica): the job exists, so it is read by its id.
    Before, RateLimited came out of wait() — "nothing recorded" — for a job that was paid."""
    url, seen = scripted((202, JOB), LIMITED, LIMITED,
                         (200, dict(JOB, state="completed", terminal=True)))
    c = Client(url, "tok", sleep=lambda s: None, retry=RetryPolicy(max_attempts=2))
    job = c.submit("p/images/generations", {"prompt": "x"}, "key-w")
    done = c.wait(job, timeout=30)
    assert done.state == "completed"
    assert [(m, p) for m, p, _ in seen] == [("POST", "/v1/providers/p/images/generations")] * 3 \
        + [("GET", "/v1/jobs/job_w")]
    assert [k for m, _, k in seen if m == "POST"] == ["key-w"] * 3
