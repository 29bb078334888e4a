"""The client driver.

An *intent* is one intended paid operation: a unique (tenant, key) with its body and route. A
client performs it against one or more gateway replicas and retries with the **same key** on
anything that is not a definite answer: connection refused/reset/closed, timeouts, 5xx, 408, 409
and 429 (honouring Retry-After, capped). Retries are bounded in count and in time.

Every operation ends, from the client's point of view, as
  ok      – a 202 (or, with `Prefer: wait`, the provider's answer) carrying a job id;
  failed  – a definite 4xx refusal (400, 401, 404, 413, 422 …);
  unknown – the retry budget ran out without a definite answer.
Every attempt is recorded, so the checker can compare what the client was told with what the
database and the provider saw.
"""

import hashlib
import http.client
import json
import random
import socket
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


def jcs(body):
    """RFC 8785 canonical bytes of a body made of ASCII strings, integers, lists and objects
    (all the harness sends): sorted keys, no whitespace. The gateway sends exactly these bytes
    when the profile injects nothing into the body, so their SHA-256 is the ledger's body_sha256."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(b):
    return hashlib.sha256(b).hexdigest()


@dataclass
class Intent:
    token: str
    key: str
    body: dict
    route: str
    kind: str = ""
    headers: dict = field(default_factory=dict)
    # A body sent as these bytes instead of jcs(body) (a multipart upload), with its type.
    raw: bytes = None
    content_type: str = None
    # Keep every answer's bytes (Attempt.body), and on a body cut after its headers record the
    # answer (status, job id) with what arrived (error "cut"): streamed LLM answers.
    capture: bool = False
    leave_after: int = None   # with capture: read this many bytes, then go away ("left")

    @property
    def token_sha256(self):
        return sha256_hex(self.token.encode())

    @property
    def wire(self):
        """The bytes a POST of this intent sends."""
        return self.raw if self.raw is not None else jcs(self.body)

    @property
    def body_sha256(self):
        return sha256_hex(self.wire)


@dataclass
class Attempt:
    t0: float
    t1: float
    port: int
    status: int = None        # None: no HTTP answer (see error)
    error: str = None
    job_id: str = None
    replayed: bool = False
    retry_after: str = None
    problem_type: str = None
    content_type: str = None
    state: str = None         # the job's state in the answer, when there is one
    body: bytes = None        # the answer's bytes (Intent.capture only)
    doc_job_id: str = None    # a 200 carrying a job document instead of the provider's answer


@dataclass
class Outcome:
    intent: Intent
    attempts: list = field(default_factory=list)
    result: str = "unknown"   # ok | failed | unknown

    @property
    def acknowledged(self):
        return any(a.status in (200, 202) and a.job_id for a in self.attempts)

    @property
    def job_ids(self):
        return {a.job_id for a in self.attempts if a.status in (200, 202) and a.job_id}

    @property
    def job_id(self):
        ids = self.job_ids
        return next(iter(ids)) if len(ids) == 1 else None

    @property
    def any_job_id(self):
        """A job id any answer named (a failed job's replayed refusal names one too)."""
        return self.job_id or next((a.job_id or a.doc_job_id for a in self.attempts
                                    if a.job_id or a.doc_job_id), None)


@dataclass
class RetryPolicy:
    max_attempts: int = 60
    max_seconds: float = 45.0
    timeout: float = 10.0          # per HTTP attempt
    base_backoff: float = 0.05
    cap_backoff: float = 1.0
    retry_after_cap: float = 2.0   # a server's Retry-After is honoured up to this
    # An answer about a job that failed (its replayed refusal, X-Idemgate-State: failed) is
    # definite: the job will not change, asking again gets the same answer.
    job_failed_final: bool = False


def _read_captured(r, leave_after):
    """The body of r as far as it arrives: (bytes, None), or (what arrived, "cut" | "left")."""
    data = b""
    try:
        while True:
            if leave_after is not None and len(data) >= leave_after:
                return data, "left"
            piece = r.read1(65536) if leave_after is None else \
                r.read1(max(1, leave_after - len(data)))
            if not piece:
                return data, None
            data += piece
    except http.client.IncompleteRead as e:
        return data + (e.partial or b""), "cut"
    except (OSError, http.client.HTTPException):
        return data, "cut"


def post(port, intent, timeout, extra_headers=None):
    """One HTTP attempt on a fresh connection. Never raises for network trouble."""
    body = intent.wire
    h = {"Authorization": f"Bearer {intent.token}", "Idempotency-Key": intent.key,
         "Content-Type": intent.content_type or "application/json", "Connection": "close"}
    h.update(intent.headers or {})
    h.update(extra_headers or {})
    a = Attempt(t0=time.time(), t1=0.0, port=port)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", f"/v1/providers/{intent.route}", body=body, headers=h)
        r = conn.getresponse()
        cut = None
        if intent.capture:
            data, cut = _read_captured(r, intent.leave_after)
            a.body = data
        else:
            data = r.read()
        a.status = r.status
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        if cut:
            # The answer began (its status and job id are known) and its body ended early: a
            # stream cut by the gateway (no terminal event) or a client that went away.
            a.error = cut
            a.job_id = hdrs.get("x-idemgate-job-id")
            a.state = hdrs.get("x-idemgate-state")
            a.content_type = hdrs.get("content-type")
            a.replayed = hdrs.get("idempotent-replayed") == "true"
            return a
        a.retry_after = hdrs.get("retry-after")
        a.content_type = hdrs.get("content-type")
        a.replayed = hdrs.get("idempotent-replayed") == "true"
        doc = None
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = None
        if r.status == 202 and isinstance(doc, dict):
            a.job_id = doc.get("id")
            a.state = doc.get("state")
        elif r.status in (200, 202) and "x-idemgate-job-id" in hdrs:
            a.job_id = hdrs["x-idemgate-job-id"]
            a.state = hdrs.get("x-idemgate-state")
        elif isinstance(doc, dict) and a.content_type and "problem+json" in a.content_type:
            a.problem_type = doc.get("type")
        elif "x-idemgate-job-id" in hdrs:
            # `Prefer: wait` on a job that failed replays the provider's own 4xx/5xx, with the
            # job's headers: an answer about that job (acknowledgement still needs a 200/202).
            a.job_id = hdrs["x-idemgate-job-id"]
            a.state = hdrs.get("x-idemgate-state")
        if r.status == 200 and not a.job_id:
            # `Prefer: wait` returns the provider's status; without a job id it is no answer.
            a.error = "200 without X-Idemgate-Job-Id"
            if isinstance(doc, dict) and doc.get("object") == "job":
                # The job's document instead: the gateway's answer to `Prefer: wait` on a job
                # that ended without any provider answer (failed before one was read).
                a.state = doc.get("state")
                a.doc_job_id = doc.get("id")
    except (socket.timeout, TimeoutError):
        a.error = "timeout"
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        a.error = type(e).__name__
    finally:
        conn.close()
        a.t1 = time.time()
    return a


def definite_failure(status):
    return status is not None and 400 <= status < 500 and status not in (408, 409, 429)


class Client:
    """Performs intents against the ports that targets() returns (read at every attempt, so a
    replica set can change under the client). The first attempt goes to a port chosen from the
    key; every retry moves to the next port."""

    def __init__(self, targets, policy=None, on_attempt=None):
        self.targets = targets if callable(targets) else (lambda: targets)
        self.policy = policy or RetryPolicy()
        self.on_attempt = on_attempt

    def perform(self, intent, first=None):
        p = self.policy
        out = Outcome(intent)
        start = time.monotonic()
        i = first if first is not None else zlib.crc32(intent.key.encode())
        while True:
            ports = list(self.targets())
            port = ports[i % len(ports)]
            a = post(port, intent, p.timeout)
            out.attempts.append(a)
            if self.on_attempt:
                self.on_attempt(intent, a)
            if a.status in (200, 202) and a.job_id:
                out.result = "ok"
                return out
            if definite_failure(a.status) or (p.job_failed_final and a.state == "failed" and
                                              (a.job_id or a.doc_job_id)):
                out.result = "failed"
                return out
            i += 1
            elapsed = time.monotonic() - start
            if len(out.attempts) >= p.max_attempts or elapsed >= p.max_seconds:
                out.result = "unknown"
                return out
            delay = min(p.cap_backoff, p.base_backoff * (2 ** min(len(out.attempts), 8)))
            delay = random.uniform(0, delay)
            if a.retry_after:
                try:
                    delay = max(delay, min(float(a.retry_after), p.retry_after_cap))
                except ValueError:
                    pass
            time.sleep(min(delay, max(0.0, p.max_seconds - elapsed)))


def run_all(client, intents, concurrency=16, stop=None, pace=0.0):
    """Performs every intent, at most `concurrency` at once; returns outcomes in intent order.
    `stop` (a threading.Event) makes the intents not yet started end without any attempt (the
    caller leaves them out); `pace` seconds pass between two intents of one client thread."""
    results = [None] * len(intents)

    def one(ix):
        if stop is not None and stop.is_set():
            results[ix] = Outcome(intents[ix])
            return
        results[ix] = client.perform(intents[ix])
        if pace:
            time.sleep(pace)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
        list(ex.map(one, range(len(intents))))
    return results


def fan_out(n, fn, timeout=120):
    """Runs fn(i) on n threads released together by a barrier; returns results in order."""
    results = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    return results
