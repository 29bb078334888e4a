"""The client's decisions, as pure functions (no I/O, no clock, no randomness of their own):
what an answer means, when to retry, how long to wait. Unit-tested without a gateway.

The one rule behind them: a retry is only ever the SAME request with the SAME Idempotency-Key,
so the worst a retry can do is get the existing job back (a replay). That makes 5xx, 429,
timeouts and refused connections safe to retry; a 4xx (400, 401, 402, 404, 422…) says the
request itself is wrong, and sending it again cannot change the answer.
"""

import email.utils
import http.client
import urllib.error

# What an answer is.
JOB = "job"                # 200/201/202 with a job: done
JOB_ANSWER = "job_answer"  # `Prefer: wait` on a terminal job: the provider's own answer (any status)
RETRY = "retry"            # nothing durable was decided: send the same request again, same key
FAIL = "fail"              # the request is wrong: raise, never retry

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

# The job states that never change again: `completed` (the provider's result is stored),
# `failed` (a rejection or a failed task: no task exists) and `canceled` (a task existed and the
# provider ended it on our cancel; its remote id and billed cost are kept). Only `completed` has
# a result to use; none of them is an error to retry: a new generation is a deliberate new key.
TERMINAL_STATES = frozenset({"completed", "failed", "canceled"})


def is_terminal(job):
    """Does this job (the gateway's JSON object) never change again? The gateway's own
    `terminal` says so; a state known to be terminal does too, whatever the flag."""
    return bool(job.get("terminal")) or job.get("state") in TERMINAL_STATES


def classify(status, headers):
    """What an answer of the gateway means. headers: a dict with lower-case names.

    An answer carrying X-Idemgate-Job-Id is the stored answer of a terminal job (after
    `Prefer: wait`), whatever its status — a provider's 400 or 503 there is the job's result,
    not the gateway's: it is never retried."""
    if "x-idemgate-job-id" in headers:
        return JOB_ANSWER
    if status in (200, 201, 202):
        return JOB
    if status in RETRY_STATUSES:
        return RETRY
    return FAIL


def is_transport_error(exc):
    """True for the failures of a request that left (or may have left) without an answer:
    refused, reset, closed, timed out. Retried with the same key: at worst a replay."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return True
    # OSError: unreachable network, TLS errors (ssl.SSLError) and the like, raised by sockets;
    # HTTPException: a broken status line or headers, an incomplete body.
    return isinstance(exc, (OSError, http.client.HTTPException))


def parse_retry_after(value, now):
    """Retry-After as seconds to wait (RFC 9110: delta-seconds or an HTTP-date), or None when
    absent or unreadable. now: the current Unix time, for a date."""
    if value is None:
        return None
    v = value.strip()
    if v.isdigit():
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


class RetryPolicy:
    """Bounded retries with full-jitter exponential backoff; the server's Retry-After is a floor
    (itself capped at hint_cap seconds). Gives up after max_attempts attempts in all, or when
    the next attempt would start after `deadline` seconds from the first."""

    def __init__(self, max_attempts=6, deadline=120.0, base=0.5, cap=30.0, hint_cap=300.0):
        if max_attempts < 1 or deadline < 0 or base <= 0 or cap < base or hint_cap < 0:
            raise ValueError("invalid retry policy")
        self.max_attempts = max_attempts
        self.deadline = deadline
        self.base = base
        self.cap = cap
        self.hint_cap = hint_cap

    def delay(self, attempt, retry_after, rnd):
        """Seconds before attempt number attempt+1 (attempt counts from 1). rnd: a number in
        [0, 1) drawn by the caller. A hint (Retry-After) is a floor, never shortened by jitter."""
        ceiling = min(self.cap, self.base * (2 ** min(attempt - 1, 30)))
        d = rnd * ceiling
        if retry_after is not None:
            d = max(d, min(retry_after, self.hint_cap))
        return d

    def next_delay(self, attempt, elapsed, retry_after, rnd):
        """The delay before the next attempt, or None when the budget is spent."""
        if attempt >= self.max_attempts:
            return None
        d = self.delay(attempt, retry_after, rnd)
        if elapsed + d > self.deadline:
            return None
        return d


def poll_delay(polls, state, base=0.25, cap=5.0, async_cap=15.0):
    """How long to wait before reading a job again after polls reads: doubling from base, up to
    cap; an `accepted` job (an async task at the provider, polled by the gateway on the
    provider's own hints) is read less often, up to async_cap."""
    top = async_cap if state == "accepted" else cap
    return min(top, base * (2 ** min(polls, 30)))


def must_stop_run(exc=None, job=None):
    """For a batch: does this stop the whole run rather than fail one row? The seed's rule: a
    401 or 402 is the account's, not the row's — the next row would fail the same way.
    Also a job the gateway holds back because the provider's credential is tripped (`blocked`),
    or a job the provider answered 401/402 (that is what tripped it)."""
    from .errors import BudgetExceeded, Unauthorized
    if exc is not None and isinstance(exc, (Unauthorized, BudgetExceeded)):
        return True
    if job is not None:
        if job.get("blocked"):
            return True
        result = job.get("result") or {}
        if job.get("state") == "failed" and result.get("status") in (401, 402):
            return True
    return False
