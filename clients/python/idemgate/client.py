"""The idemgate client: submit, wait, get, cancel, outputs. Standard library only.

Retries follow policy.py: the same request with the same key, bounded, after max(Retry-After,
full jitter); a 4xx is raised at once (errors.py says which)."""

import hashlib
import http.client
import json
import mimetypes
import os
import random
import tempfile
import time
import urllib.parse

from . import policy
from .stream import _lines, stream_events
from .errors import (IdemgateError, IntegrityError, OutputsUnavailable, RateLimited, Unavailable,
                     Unknown, error_for)

__all__ = ["Client", "Job", "Output", "OUTPUTS_TIMEOUT", "extension_for"]


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return {}


class Job:
    """A job as the gateway last showed it. `data` is the gateway's JSON object; `replayed` is
    True when the answer said `Idempotent-Replayed: true`; `answer` is the provider's own answer
    (status, headers, body bytes) when a `Prefer: wait` returned it."""

    def __init__(self, data, replayed=False, submission=None, answer=None):
        self.data = data
        self.replayed = replayed
        self.submission = submission  # (route, body bytes, key): lets wait() replay it
        self.answer = answer

    id = property(lambda self: self.data.get("id"))
    state = property(lambda self: self.data.get("state"))
    terminal = property(lambda self: policy.is_terminal(self.data))
    key = property(lambda self: self.data.get("idempotency_key"))
    ok = property(lambda self: self.data.get("state") == "completed")
    # The provider ended the task on our cancel: terminal, not failed (a task existed; remote_id
    # and the billed cost are kept), and never something to resubmit.
    canceled = property(lambda self: self.data.get("state") == "canceled")
    remote_id = property(lambda self: self.data.get("remote_id"))

    def get(self, name, default=None):
        return self.data.get(name, default)

    @property
    def spend(self):
        """(micros, currency) of the job's settled cost when the gateway reports one, else None."""
        c = self.data.get("cost")
        if isinstance(c, dict) and isinstance(c.get("micros"), (int, float)) and c.get("currency"):
            return int(c["micros"]), c["currency"]
        return None

    def __repr__(self):
        return f"<Job {self.id} {self.state}{' replayed' if self.replayed else ''}>"


class Output:
    """One downloaded output: where it is, its SHA-256 (checked) and size."""

    def __init__(self, index, path, sha256, size, content_type):
        self.index, self.path, self.sha256, self.bytes = index, path, sha256, size
        self.content_type = content_type

    def __repr__(self):
        return f"<Output {self.index} {self.path} {self.bytes} bytes>"

    def as_dict(self):
        return {"index": self.index, "path": self.path, "sha256": self.sha256,
                "bytes": self.bytes, "content_type": self.content_type}


# How long outputs() waits for the gateway to archive a completed job's outputs, by default.
OUTPUTS_TIMEOUT = 120.0

# The extension of a saved output by its content type: the common types of generated media
# first (mimetypes' own table differs between Pythons and systems), then mimetypes.
_EXTENSIONS = {
    "image/png": ".png", "image/jpeg": ".jpg", "image/jpg": ".jpg", "image/webp": ".webp",
    "image/gif": ".gif", "image/avif": ".avif", "image/heic": ".heic", "image/svg+xml": ".svg",
    "image/tiff": ".tif", "image/bmp": ".bmp", "video/mp4": ".mp4", "video/webm": ".webm",
    "video/quicktime": ".mov", "audio/mpeg": ".mp3", "audio/wav": ".wav",
    "audio/x-wav": ".wav", "audio/ogg": ".ogg", "audio/flac": ".flac", "audio/mp4": ".m4a",
    "application/json": ".json", "text/plain": ".txt", "model/gltf-binary": ".glb",
    "application/pdf": ".pdf", "application/zip": ".zip",
}


def extension_for(content_type):
    """The file extension (with its dot) of a content type: `image/png` .png, `image/jpeg`
    .jpg, `video/mp4` .mp4…; `.bin` for a missing, unknown or generic
    (application/octet-stream) type."""
    t = (content_type or "").split(";", 1)[0].strip().lower()
    if t in _EXTENSIONS:
        return _EXTENSIONS[t]
    if not t or t == "application/octet-stream":
        return ".bin"
    return mimetypes.guess_extension(t, strict=True) or ".bin"


def _archive_settled(job):
    """Whether a Job's archive view can no longer change (then it need not be read again)."""
    archive = job.data.get("archive")
    return job.state == "completed" and isinstance(archive, list) and bool(archive) and \
        all(o.get("state") in ("archived", "failed", "expired") for o in archive)


def _job_id(job_or_id):
    return job_or_id.id if isinstance(job_or_id, Job) else str(job_or_id)


class Client:
    """Client(base_url, token). timeout: seconds per attempt (a `Prefer: wait` adds its N);
    retry: a policy.RetryPolicy; sleep and rnd can be replaced (tests, simulations)."""

    def __init__(self, base_url, token, timeout=30.0, retry=None, max_wait=60,
                 sleep=time.sleep, rnd=random.random, log=None):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("base_url must be http(s)://host[:port][/prefix]")
        if not token:
            raise ValueError("a tenant token is required")
        self._scheme, self._host, self._port = u.scheme, u.hostname, u.port
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        self.retry = retry or policy.RetryPolicy()
        self.max_wait = max_wait
        self._sleep, self._rnd, self._log = sleep, rnd, log

    # -- transport ------------------------------------------------------------------------

    def _connect(self, timeout):
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _once(self, method, path, body, headers, timeout):
        """One request on a fresh connection. Raises transport errors as they come."""
        h = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
             "User-Agent": "idemgate-python/0.1"}
        h.update(headers or {})
        conn = self._connect(timeout)
        try:
            conn.request(method, self._prefix + path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
        finally:
            conn.close()

    def _call(self, method, path, body=None, headers=None, key=None, timeout=None):
        """The request with retries (policy.classify): returns an Answer that is a job or a
        terminal job's stored answer; raises the errors.py exception otherwise."""
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            hint, last_exc = None, None
            try:
                a = self._once(method, path, body, headers, timeout or self.timeout)
            except Exception as e:  # noqa: BLE001 — sorted just below
                if not policy.is_transport_error(e):
                    raise
                last_exc, a = e, None
            if a is not None:
                kind = policy.classify(a.status, a.headers)
                if kind in (policy.JOB, policy.JOB_ANSWER):
                    return a
                hint = policy.parse_retry_after(a.headers.get("retry-after"), time.time())
                if kind == policy.FAIL:
                    raise error_for(a.status, a.json(), key=key, retry_after=hint)
            d = self.retry.next_delay(attempt, time.monotonic() - start, hint, self._rnd())
            if d is None:
                if a is None:
                    raise Unavailable(f"{method} {path}: {last_exc!r} on each of {attempt} "
                                      "attempts (the same key may be sent again later)",
                                      cause=last_exc, key=key)
                err = error_for(a.status, a.json(), key=key, retry_after=hint)
                err.args = (f"{err.args[0]} (after {attempt} attempts with the same key)",)
                raise err
            if self._log:
                why = repr(last_exc) if a is None else f"{a.status} {a.headers.get('retry-after', '')}"
                self._log(f"{method} {path}: {why}; retry {attempt + 1} in {d:.1f}s, same key")
            self._sleep(d)

    # -- the API ----------------------------------------------------------------------------

    def submit(self, provider_route, body, key, wait=None):
        """POST /v1/providers/{provider_route} with Idempotency-Key: key. body: a dict/list
        (sent as compact JSON) or str/bytes sent as they are. wait: seconds for `Prefer: wait`.
        Returns a Job (replayed when the key already had one). Raises KeyReused, Unauthorized,
        BudgetExceeded, InvalidRequest, NotFound…; Unavailable/RateLimited when the retries with
        the same key ran out."""
        if not key or not isinstance(key, str):
            raise ValueError("an Idempotency-Key is required: derive it with derive_key()")
        if isinstance(body, (dict, list)):
            body = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if isinstance(body, str):
            body = body.encode("utf-8")
        return self._submit((provider_route.strip("/"), body, key), wait)

    def _submit(self, submission, wait):
        route, body, key = submission
        h = {"Content-Type": "application/json", "Idempotency-Key": key}
        timeout = self.timeout
        if wait:
            n = max(1, min(int(wait), self.max_wait))
            h["Prefer"] = f"wait={n}"
            timeout += n
        else:
            # Never the route's default wait (a profile's default_wait_seconds, up to the
            # gateway's max_wait_seconds): held past this attempt's timeout, every attempt would
            # end unanswered and the job be reported unreachable while it runs, paid.
            h["Prefer"] = "respond-async"
        a = self._call("POST", f"/v1/providers/{route}", body, h, key=key, timeout=timeout)
        replayed = a.headers.get("idempotent-replayed") == "true"
        if policy.classify(a.status, a.headers) == policy.JOB_ANSWER:
            job = self.get(a.headers["x-idemgate-job-id"])
            job.replayed, job.submission = replayed, submission
            job.answer = (a.status, a.headers, a.body)
            return job
        return Job(a.json(), replayed=replayed, submission=submission)

    def stream(self, provider_route, body, key, wait=None):
        """A streamed LLM call (`"stream": true` is set in a dict body): yields stream.Event
        objects as the provider sends them. A dropped connection is resumed with the same key:
        the gateway replays its record (or joins the live stream), and the events already
        yielded are skipped, so each is seen once. A wait that ran out before the first output
        (the job still on its way) and the gateway's passing refusals (429, 503) are opened
        again with the same key; the stream is opened at most retry.max_attempts times in all,
        the first included. Raises stream.StreamCut when no whole stream exists (cut at the
        provider: the job is in doubt), Unknown (with the job id) when the job is still on its
        way after every wait, and the errors of submit()."""
        if not key or not isinstance(key, str):
            raise ValueError("an Idempotency-Key is required: derive it with derive_key()")
        if isinstance(body, dict):
            body = dict(body, stream=True)
        if isinstance(body, (dict, list)):
            body = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if isinstance(body, str):
            body = body.encode("utf-8")
        return stream_events(self, provider_route.strip("/"), body, key,
                             max(1, min(int(wait or self.max_wait), self.max_wait)))

    def _open_stream(self, route, body, key, wait):
        """POSTs a streamed create and returns (status, headers, lines, close)."""
        h = {"Authorization": f"Bearer {self._token}", "Accept": "text/event-stream",
             "User-Agent": "idemgate-python/0.1", "Content-Type": "application/json",
             "Idempotency-Key": key, "Prefer": f"wait={wait}"}
        conn = self._connect(self.timeout + wait)
        try:
            conn.request("POST", f"{self._prefix}/v1/providers/{route}", body=body, headers=h)
            r = conn.getresponse()
        except Exception:
            conn.close()
            raise
        return r.status, {k.lower(): v for k, v in r.getheaders()}, _lines(r), conn.close

    def get(self, job_or_id):
        """GET /v1/jobs/{id} (retried on 5xx/transport errors; a GET is always safe)."""
        a = self._call("GET", f"/v1/jobs/{urllib.parse.quote(_job_id(job_or_id), safe='')}")
        return Job(a.json())

    def cancel(self, job_or_id):
        """POST /v1/jobs/{id}/cancel (idempotent, so retried like a GET). A job never sent is
        `failed` at once; one that may have reached the provider is never sent again and ends
        `canceled` (the provider ended its task) or `completed` (it finished first): wait() for
        it."""
        jid = urllib.parse.quote(_job_id(job_or_id), safe="")
        return Job(self._call("POST", f"/v1/jobs/{jid}/cancel", b"").json())

    def wait(self, job_or_id, timeout):
        """Waits up to timeout seconds for the job to be terminal and returns it (completed,
        failed or canceled: see Job.ok and Job.canceled; none of them is raised). A job this client submitted is first waited for with `Prefer: wait`
        (the same request again, which is a replay: nothing is created); after that, or for a
        bare id, the job is read with growing delays (policy.poll_delay), each read retried on
        503 after Retry-After. Raises Unknown (with the job id) when the time runs out."""
        deadline = time.monotonic() + timeout
        job = job_or_id if isinstance(job_or_id, Job) else self.get(job_or_id)
        submission = job.submission
        polls = 0
        while not job.terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unknown(f"job {job.id} is still {job.state} after {timeout:.0f}s: its "
                              f"outcome is not known yet; wait for it again by id",
                              job_id=job.id, state=job.state, job=job, key=job.key)
            if submission is not None and left >= 1 and not job.get("blocked"):
                n = int(min(left, self.max_wait))
                submission, held = None, submission  # one held request; after it, reads
                try:
                    job = self._submit(held, wait=n)
                except (RateLimited, Unavailable) as e:
                    # The held request refused in passing each time (too many waits, the store
                    # busy): the job exists all the same, read by its id. Raised, it read as
                    # "nothing recorded" to a caller holding a paid job's id.
                    if self._log:
                        self._log(f"wait {job.id}: {e}; reading the job instead")
                continue
            self._sleep(min(policy.poll_delay(polls, job.state), left))
            polls += 1
            job = self.get(job.id)
        return job

    # -- outputs ------------------------------------------------------------------------------

    def outputs(self, job_or_id, dest_dir, timeout=OUTPUTS_TIMEOUT):
        """The archived bytes of every output of a completed job — the gateway's own copies
        (GET /v1/jobs/{id}/outputs/{n}), never the provider's expiring URLs — saved in dest_dir
        as `{job_id}-{n}{ext}`, the extension from the archived content type (`.png`, `.jpg`,
        `.mp4`…; `.bin` when the type says nothing). Each file is checked against its SHA-256
        (the ETag and the job's archive record) and renamed into place only then. Returns a
        list of Output, in index order ([] for a completed job that has no outputs).

        The gateway archives a job's outputs after the job completed: right after wait() they
        are usually not planned (`archive: []`) or still `pending`. outputs() waits for them,
        reading the job with growing delays, for at most `timeout` seconds (default
        OUTPUTS_TIMEOUT, 120 s; 0: do not wait). Raises OutputsUnavailable — its `pending`
        says whether calling again later can succeed — when the time runs out (pending=True),
        when an output ended `failed` or `expired` or the job is not `completed`
        (pending=False); IntegrityError on a digest mismatch."""
        deadline = time.monotonic() + max(0.0, timeout)
        job = job_or_id if isinstance(job_or_id, Job) and _archive_settled(job_or_id) \
            else self.get(job_or_id)
        polls = 0
        while True:
            ready = self._archive_ready(job)
            if ready is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                archive = job.get("archive") or []
                waiting = [o for o in archive if o.get("state") == "pending"]
                what = (f"output {waiting[0].get('index')} is still pending"
                        + (f" (last error: {waiting[0]['last_error']})"
                           if waiting[0].get("last_error") else "")) if waiting else \
                    "its outputs are not planned for archiving yet"
                raise OutputsUnavailable(
                    f"job {job.id}: {what} after {timeout:g}s; call outputs() again later",
                    job_id=job.id, pending=True, archive=archive)
            self._sleep(min(policy.poll_delay(polls, "completed"), left))
            polls += 1
            job = self.get(job.id)
        os.makedirs(dest_dir, exist_ok=True)
        return [self.download_output(job.id, o["index"],
                                     os.path.join(dest_dir, f"{job.id}-{o['index']}"),
                                     expected_sha256=o.get("sha256"), extension=True)
                for o in ready]

    def _archive_ready(self, job):
        """The archive records to download when the job's archive is settled and every output
        is archived; None while it may still change; raises OutputsUnavailable when it never
        will."""
        if job.state != "completed":
            raise OutputsUnavailable(
                f"job {job.id} is {job.state}: only a completed job has outputs"
                + ("" if job.terminal else "; wait() for it first"),
                job_id=job.id, pending=not job.terminal)
        archive = job.get("archive")
        if not isinstance(archive, list):
            raise OutputsUnavailable(f"job {job.id}: the gateway reports no archive of its "
                                     "outputs (no output archival on this gateway)",
                                     job_id=job.id, pending=False)
        lost = [o for o in archive if o.get("state") in ("failed", "expired")]
        if lost:
            o = lost[0]
            raise OutputsUnavailable(
                f"job {job.id}: output {o.get('index')} is {o.get('state')}"
                + (f": {o['last_error']}" if o.get("last_error") else "")
                + " (the gateway will not archive it)", job_id=job.id, pending=False,
                archive=archive)
        if archive:
            return sorted(archive, key=lambda o: o["index"]) \
                if all(o.get("state") == "archived" for o in archive) else None
        # `archive: []` is both "not planned yet" and "planned: the job has no outputs". The
        # output endpoint tells them apart: output 0 of a planned job without outputs is
        # `output-not-found`, of a job not planned yet `output-not-archived`.
        kind = self._probe_output(job.id, 0)
        if kind == "output-not-found":
            return []
        return None  # not planned yet, or planned since the read: read the job again

    def _probe_output(self, job_id, index):
        """The problem type of GET output index without its bytes (If-None-Match: * answers
        304 for an archived output), or '' for any other answer."""
        jid = urllib.parse.quote(job_id, safe="")
        try:
            a = self._once("GET", f"/v1/jobs/{jid}/outputs/{int(index)}", None,
                           {"If-None-Match": "*"}, self.timeout)
        except Exception as e:  # noqa: BLE001
            if policy.is_transport_error(e):
                return ""
            raise
        if a.status == 404:
            t = a.json().get("type", "") if isinstance(a.json(), dict) else ""
            return t.rsplit(":", 1)[-1]
        if a.status in (401, 403):
            raise error_for(a.status, a.json())
        return ""

    def download_output(self, job_id, index, path, expected_sha256=None, extension=False):
        """Streams output index of job_id to path (via a temporary file beside it, fsynced and
        renamed only when its SHA-256 equals the ETag and expected_sha256). extension=True
        appends the extension of the answer's Content-Type to path (extension_for). Retried on
        5xx and transport errors; a 404 raises NotFound/OutputsUnavailable."""
        jid = urllib.parse.quote(job_id, safe="")
        start, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                return self._download_once(f"/v1/jobs/{jid}/outputs/{int(index)}", index, path,
                                           expected_sha256, extension)
            except _RetryDownload as r:
                d = self.retry.next_delay(attempt, time.monotonic() - start, r.hint, self._rnd())
                if d is None:
                    raise Unavailable(f"output {index} of {job_id}: {r.why} on each of "
                                      f"{attempt} attempts", cause=r.cause) from None
                self._sleep(d)

    def _download_once(self, path_q, index, path, expected, extension=False):
        conn = self._connect(self.timeout)
        tmp = None
        try:
            try:
                conn.request("GET", self._prefix + path_q,
                             headers={"Authorization": f"Bearer {self._token}"})
                r = conn.getresponse()
            except Exception as e:  # noqa: BLE001
                if policy.is_transport_error(e):
                    raise _RetryDownload(repr(e), None, e) from None
                raise
            headers = {k.lower(): v for k, v in r.getheaders()}
            if r.status != 200:
                body = r.read()
                hint = policy.parse_retry_after(headers.get("retry-after"), time.time())
                if policy.classify(r.status, headers) == policy.RETRY:
                    raise _RetryDownload(f"HTTP {r.status}", hint, None)
                try:
                    problem = json.loads(body)
                except ValueError:
                    problem = {}
                err = error_for(r.status, problem)
                if r.status == 404 and err.type in ("output-not-archived", "output-not-found"):
                    raise OutputsUnavailable(str(err), status=404, problem=problem,
                                             pending=err.type == "output-not-archived")
                raise err
            if extension:
                path += extension_for(headers.get("content-type"))
            etag = headers.get("etag", "").strip().removeprefix("W/").strip('"')
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".part-", dir=d)
            h, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as f:  # a local write error is raised, never retried
                while True:
                    try:
                        chunk = r.read(1 << 16)
                    except Exception as e:  # noqa: BLE001
                        if policy.is_transport_error(e):
                            raise _RetryDownload(repr(e), None, e) from None
                        raise
                    if not chunk:
                        break
                    h.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            want = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
            if want is not None and want != size:
                raise _RetryDownload(f"{size} of {want} bytes", None, None)
            digest = h.hexdigest()
            for name, value in (("ETag", etag), ("the job's record", expected)):
                if value and value != digest:
                    raise IntegrityError(f"output {index}: SHA-256 {digest} differs from {name} "
                                         f"{value}; the download was discarded")
            os.replace(tmp, path)
            tmp = None
            return Output(index, path, digest, size, headers.get("content-type"))
        finally:
            conn.close()
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


class _RetryDownload(Exception):
    def __init__(self, why, hint, cause):
        super().__init__(why)
        self.why, self.hint, self.cause = why, hint, cause


# Re-exported for callers that catch everything of ours.
__all__ += ["IdemgateError", "RateLimited"]
