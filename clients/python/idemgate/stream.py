"""Streamed LLM calls through the gateway: server-sent events as they arrive, resumed by key.

A dropped connection is not a lost generation: the gateway records the stream, so the same key
and body sent again replays it from the record (or joins it while it is still live on that
replica). The replay is byte for byte the same events, so the ones already handed to the caller
are skipped and each event is seen once — each is checked to be the one given, and a record that
differs raises StreamDiverged rather than skip on a guess. A stream cut at the provider (no
terminal event) was paid for and is in doubt: the job is `unknown`; StreamCut says so, with the
job's id."""

import http.client
import json
import time

from . import policy
from .errors import IdemgateError, Unavailable, Unknown, error_for


class Event:
    """One server-sent event: `event` (its type, or None) and `data` (its data lines, joined)."""

    __slots__ = ("event", "data")

    def __init__(self, event, data):
        self.event, self.data = event, data

    def __eq__(self, other):
        return isinstance(other, Event) and (self.event, self.data) == (other.event, other.data)

    def __repr__(self):
        return f"Event({self.event!r}, {self.data[:60]!r})"


class StreamCut(IdemgateError):
    """The stream ended without being whole and the record holds no whole stream either: the
    provider generated (and billed) part of it. `job_id` names the job, now in doubt."""

    def __init__(self, message, job_id=None, **kw):
        super().__init__(message, **kw)
        self.job_id = job_id


class JobEnded(IdemgateError):
    """The key's job has ended without a stream to give: the answer is its stored end — the
    provider's own refusal (any status, 4xx and 5xx too) or the gateway's `502 job-failed` /
    `409 job-canceled`. Final: not an outage to retry, nothing to resend. `job_id` names the
    job, `state` is its X-Idemgate-State, `status` the answer's, `body` its bytes."""

    def __init__(self, message, job_id=None, state=None, body=b"", **kw):
        super().__init__(message, **kw)
        self.job_id, self.state, self.body = job_id, state, body


class StreamDiverged(IdemgateError):
    """The record replayed after a cut is not the stream already given: its first events differ
    from those yielded (the provider refused the first attempt with an error event before any
    output and a later attempt generated, or the cut stream was read back whole from the
    provider). Nothing is skipped on a guess: call stream() again with the same key to read the
    record from its start. `job_id` names the job."""

    def __init__(self, message, job_id=None, **kw):
        super().__init__(message, **kw)
        self.job_id = job_id


def parse_events(lines):
    """Events from an iterable of lines (bytes, as read: each with its line end, the last one
    maybe without), WHATWG's event stream: a blank line dispatches, `:` is a comment, an event
    cut off before its blank line is never yielded."""
    event, data, have = None, [], False
    for raw in lines:
        if not raw.endswith((b"\n", b"\r")):
            return  # cut inside a line: that event is not whole
        line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
        if line == "":
            if have or event is not None:
                yield Event(event, "\n".join(data))
            event, data, have = None, [], False
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
            have = True


class _Cut(Exception):
    """The connection ended before the body did."""


def _lines(resp):
    """The response's lines as they arrive; raises _Cut when the body never ended: a chunked
    body without its last chunk, or one shorter than its Content-Length. Read with read1, which
    raises on a cut chunked body: readline() returns b"" there, as at the body's end (its peek
    swallows the IncompleteRead and closes the connection), and a cut stream looked whole."""
    buf = b""
    while True:
        try:
            piece = resp.read1(65536)
        except (http.client.IncompleteRead, OSError, http.client.HTTPException) as e:
            raise _Cut(repr(e)) from e
        if not piece:
            if getattr(resp, "length", None):  # bytes of its Content-Length never came
                raise _Cut("the body ended before its Content-Length")
            if buf:
                yield buf  # a last line without its end (an event cut off: never given)
            return
        buf += piece
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            yield buf[start:nl + 1]
            start = nl + 1
        buf = buf[start:]


# What an answer that is not an event stream means (answer_kind).
ENDED = "ended"      # the job's stored end: final, never retried
CUT = "cut"          # the job is in doubt (`unknown`, `review`): its stream was cut at the provider
PENDING = "pending"  # the job is on its way (the wait ran out first): open again, same key
RETRY = "retry"      # the gateway's passing refusal (429, 5xx): back off, open again, same key
FAIL = "fail"        # the request is wrong: raise its error

IN_DOUBT = frozenset({"unknown", "review"})


def answer_kind(status, headers, data, had_job=False):
    """What a stream's open answered without an event stream means, and the job's state when
    it names one (kind, state). Pure. A job document (202: the wait ran out before the first
    output — a model thinking, a provider's 429 backed off, the record on another replica — or
    a 2xx job) is read by its state: ended, in doubt, or still on its way. Before, every 202
    was a StreamCut ("paid and in doubt"), and a caller that took it for a failure and asked
    again under a new key paid twice; a 503 or a 429 was raised at once, never retried."""
    job = None
    if 200 <= status < 300:
        try:
            doc = json.loads(data or b"null")
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("state"), str) and "id" in doc:
            job = doc
    if job is not None:
        state = job["state"]
        if policy.is_terminal(job):
            return ENDED, state
        return (CUT if state in IN_DOUBT else PENDING), state
    if status == 202 or (200 <= status < 300 and (had_job or "x-idemgate-job-id" in headers)):
        return CUT, None  # a job answered without a document to read: in doubt, as before
    if "x-idemgate-job-id" in headers:
        # The job's stored end, whatever the status (policy.classify): not the gateway's
        # refusal, never an outage to retry.
        return ENDED, headers.get("x-idemgate-state")
    return (RETRY if policy.classify(status, headers) == policy.RETRY else FAIL), None


def stream_events(client, route, body, key, wait, open_stream=None):
    """The generator behind Client.stream (see there). open_stream(route, body, key, wait) →
    (status, headers, lines, close) may be replaced (tests).

    The stream is opened at most client.retry.max_attempts times in all, the first included,
    whatever ends each opening (a transport error, a cut, a wait that ran out, a passing
    refusal), as the Node client's streamEvents does. Before, a stream cut, waited out or
    unreachable on every opening was opened max_attempts + 1 times."""
    opener = open_stream or client._open_stream
    given, attempt, job_id = [], 0, None  # the events the caller has, to check replays against
    start = time.monotonic()
    while True:
        attempt += 1
        try:
            status, headers, lines, close = opener(route, body, key, wait)
        except Exception as e:  # noqa: BLE001 — a transport error: the same key again
            if not policy.is_transport_error(e) or attempt >= client.retry.max_attempts:
                raise
            client._sleep(min(1.0, 0.05 * attempt))
            continue
        retry_in = None
        try:
            job_id = headers.get("x-idemgate-job-id", job_id)
            ctype = headers.get("content-type", "")
            if not ctype.startswith("text/event-stream"):
                data = b"".join(lines)
                kind, state = answer_kind(status, headers, data, had_job=job_id is not None)
                if kind == ENDED:
                    raise JobEnded(f"job {job_id} ended {state or ''} (HTTP {status})",
                                   job_id=job_id, state=state, body=data, status=status,
                                   key=key)
                if kind == CUT:
                    raise StreamCut(f"job {job_id}: no whole stream to give (HTTP {status})",
                                    job_id=job_id, status=status, key=key)
                try:
                    problem = json.loads(data or b"{}")
                except ValueError:
                    problem = {}
                if not isinstance(problem, dict):
                    problem = {}
                if kind == PENDING:
                    job_id = problem.get("id", job_id)
                    if attempt >= client.retry.max_attempts:
                        raise Unknown(f"job {job_id} is still {state} after {attempt} waits: "
                                      "its stream has not begun; stream it again with the same "
                                      "key, or wait for the job by id — never a new key",
                                      job_id=job_id, state=state, job=problem, key=key)
                    if client._log:
                        client._log(f"stream {key}: job {job_id} still {state}; again with the "
                                    "same key")
                    continue
                hint = policy.parse_retry_after(headers.get("retry-after"), time.time())
                if kind == RETRY:
                    retry_in = client.retry.next_delay(attempt, time.monotonic() - start, hint,
                                                       client._rnd())
                if retry_in is None:
                    err = error_for(status, problem, key=key, retry_after=hint)
                    if kind == RETRY:
                        err.args = (f"{err.args[0]} (after {attempt} attempts with the same "
                                    "key)",)
                    raise err
                if client._log:
                    client._log(f"stream {key}: {status}; again in {retry_in:.1f}s, same key")
                continue
            n = 0
            try:
                for ev in parse_events(lines):
                    n += 1
                    if n > len(given):
                        given.append(ev)
                        yield ev
                    elif given[n - 1] != ev:
                        raise StreamDiverged(
                            f"stream {key}: the record differs from the {len(given)} events "
                            f"already given (event {n}); read it again from the start",
                            job_id=job_id, key=key)
                return  # the body ended: the stream is whole
            except _Cut:
                pass
        finally:
            close()
            if retry_in:
                client._sleep(retry_in)
        if attempt >= client.retry.max_attempts:
            raise Unavailable(f"stream {key}: cut on each of {attempt} attempts", key=key)
        if client._log:
            client._log(f"stream {key}: cut after {len(given)} events; again with the same key")

