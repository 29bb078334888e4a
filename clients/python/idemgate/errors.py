"""What can go wrong, said precisely. Every exception is an IdemgateError.

Answers of the gateway that are not retried raise at once; answers that are retried (503, 429,
5xx, timeouts, refused connections) raise only when the retries are spent, and then say so.
"""


class IdemgateError(Exception):
    """Base class. `status` is the HTTP status when there was an answer, else None; `problem`
    the gateway's problem+json body (a dict, possibly empty); `key` the Idempotency-Key of the
    request when it had one."""

    def __init__(self, message, status=None, problem=None, key=None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}
        self.key = key

    @property
    def type(self):
        """The problem type's short name (`idempotency-key-reused`), or ''."""
        t = self.problem.get("type", "") if isinstance(self.problem, dict) else ""
        return t.rsplit(":", 1)[-1] if t.startswith("urn:idemgate:problem:") else ""

    @property
    def request_id(self):
        return self.problem.get("request_id") if isinstance(self.problem, dict) else None


class Rejected(IdemgateError):
    """A 4xx: the request itself is wrong. Retrying it unchanged changes nothing."""


class InvalidRequest(Rejected):
    """400: missing or invalid key, invalid JSON, bad framing."""


class Unauthorized(Rejected):
    """401: the tenant token is missing, unknown or revoked. Nothing else will work either."""


class BudgetExceeded(Rejected):
    """402 `budget-exceeded`: the tenant's budget would be passed; nothing was sent."""


class NotFound(Rejected):
    """404: no such job for this tenant, unknown route or provider, no such output."""


class KeyReused(Rejected):
    """422 `idempotency-key-reused`: the key already names a request with other parameters.
    A bug in the caller (the body changed, the identity did not): never retried."""


class RateLimited(IdemgateError):
    """429 (e.g. `too-many-in-flight`) answered on every attempt until the retries ran out.
    `retry_after` is the gateway's last hint in seconds, or None."""

    def __init__(self, message, retry_after=None, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(IdemgateError):
    """The gateway could not be reached or answered 5xx (503 `store-unavailable`, `store-busy`,
    `shutting-down`…) on every attempt. Nothing is lost: sending the same request with the
    same key later is safe (`key`). `cause` is the last transport error, if any."""

    def __init__(self, message, cause=None, **kw):
        super().__init__(message, **kw)
        self.cause = cause


class Unknown(IdemgateError):
    """The job exists (`job_id`) but had not finished when the wait ended: its outcome is not
    known yet (it may be `prepared`, `sending`, `accepted`, `unknown` or `review`). Do NOT
    submit it again under a new key: wait for `job_id` later (or resolve it if in `review`)."""

    def __init__(self, message, job_id, state=None, job=None, **kw):
        super().__init__(message, **kw)
        self.job_id = job_id
        self.state = state
        self.job = job


class OutputsUnavailable(IdemgateError):
    """The job's archived outputs cannot be downloaded. `pending` True: not yet — the job is
    not finished, or its outputs are still being archived after outputs() waited its timeout:
    calling again later can succeed. `pending` False: never — the job did not complete, an
    output ended `failed` or `expired` (its `last_error` in the message), or the gateway
    archives nothing. `job_id` names the job; `archive` is its archive records as last read."""

    def __init__(self, message, job_id=None, pending=False, archive=None, **kw):
        super().__init__(message, **kw)
        self.job_id = job_id
        self.pending = pending
        self.archive = archive or []


class IntegrityError(IdemgateError):
    """Downloaded bytes whose SHA-256 differs from the ETag or the job's record: discarded."""


def error_for(status, problem, key=None, retry_after=None):
    """The exception for a final, non-retried answer (or the last of a retried one)."""
    problem = problem if isinstance(problem, dict) else {}
    name = problem.get("type", "").rsplit(":", 1)[-1]
    detail = problem.get("detail") or problem.get("title") or ""
    msg = f"{status} {name}: {detail}".strip() if name else f"HTTP {status}: {detail}".strip()
    kw = {"status": status, "problem": problem, "key": key}
    if status == 401:
        return Unauthorized(msg, **kw)
    if status == 402 or name == "budget-exceeded":
        return BudgetExceeded(msg, **kw)
    if status == 422 and name == "idempotency-key-reused":
        return KeyReused(msg, **kw)
    if status == 429:
        return RateLimited(msg, retry_after=retry_after, **kw)
    if status == 404:
        return NotFound(msg, **kw)
    if status == 400:
        return InvalidRequest(msg, **kw)
    if 400 <= status < 500:
        return Rejected(msg, **kw)
    return Unavailable(msg, **kw)
