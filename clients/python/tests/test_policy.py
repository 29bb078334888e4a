"""Pure unit tests of the client's decisions: no gateway, no network, no clock, no sleep.
Run: python3 -m pytest -q clients/python/tests"""

import email.utils
import hashlib
import http.client
import json
import os
import socket
import sys
import urllib.error

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import (BudgetExceeded, Client, InvalidRequest, KeyReused, NotFound,  # noqa: E402
                      RateLimited, Rejected, RetryPolicy, Unauthorized, Unavailable,
                      canonical_json, derive_key)
from idemgate import batch, policy  # noqa: E402
from idemgate.client import Answer, Job  # noqa: E402
from idemgate.errors import error_for  # noqa: E402

PROBLEM = "urn:idemgate:problem:"


# --- what an answer means --------------------------------------------------------------------

@pytest.mark.parametrize("status,headers,kind", [
    (202, {}, policy.JOB),
    (200, {}, policy.JOB),
    (201, {}, policy.JOB),
    (503, {"retry-after": "2"}, policy.RETRY),
    (500, {}, policy.RETRY),
    (502, {}, policy.RETRY),
    (504, {}, policy.RETRY),
    (429, {"retry-after": "2"}, policy.RETRY),
    (408, {}, policy.RETRY),
    (422, {}, policy.FAIL),
    (400, {}, policy.FAIL),
    (401, {}, policy.FAIL),
    (402, {}, policy.FAIL),
    (403, {}, policy.FAIL),
    (404, {}, policy.FAIL),
    (409, {}, policy.FAIL),
    (413, {}, policy.FAIL),
    (301, {}, policy.FAIL),
    # A terminal job's stored provider answer (Prefer: wait): final whatever its status.
    (200, {"x-idemgate-job-id": "job_a"}, policy.JOB_ANSWER),
    (400, {"x-idemgate-job-id": "job_a"}, policy.JOB_ANSWER),
    (503, {"x-idemgate-job-id": "job_a", "retry-after": "1"}, policy.JOB_ANSWER),
    (402, {"x-idemgate-job-id": "job_a"}, policy.JOB_ANSWER),
])
def test_classify(status, headers, kind):
    assert policy.classify(status, headers) == kind


@pytest.mark.parametrize("exc,retry", [
    (ConnectionRefusedError(), True),
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (socket.timeout(), True),
    (http.client.RemoteDisconnected("closed"), True),
    (http.client.IncompleteRead(b"x"), True),
    (urllib.error.URLError("refused"), True),
    (OSError(101, "Network is unreachable"), True),
    (http.client.LineTooLong("header"), True),
    (ValueError("bug"), False),
    (KeyError("x"), False),
])
def test_transport_errors(exc, retry):
    assert policy.is_transport_error(exc) is retry


NOW = 1_800_000_000.0


@pytest.mark.parametrize("value,want", [
    (None, None),
    ("", None),
    ("0", 0.0),
    ("7", 7.0),
    (" 12 ", 12.0),
    ("-3", None),
    ("1.5", None),
    ("soon", None),
    (email.utils.formatdate(NOW + 30, usegmt=True), 30.0),
    (email.utils.formatdate(NOW - 30, usegmt=True), 0.0),   # a date past: no wait
    ("Sunday, 06-Nov-94 08:49:37 GMT", 0.0),               # RFC 850 form, long past
])
def test_parse_retry_after(value, want):
    assert policy.parse_retry_after(value, NOW) == want


def test_retry_after_is_a_floor_that_jitter_never_shortens():
    p = RetryPolicy(max_attempts=5, deadline=600, base=0.5, cap=8)
    for rnd in (0.0, 0.3, 0.999):
        assert p.delay(1, 5.0, rnd) >= 5.0
        assert p.delay(4, 5.0, rnd) >= 5.0
    # Without a hint: full jitter below min(cap, base·2^(n-1)).
    assert p.delay(1, None, 0.999) < 0.5
    assert p.delay(3, None, 0.999) < 2.0
    assert p.delay(30, None, 0.999) < 8.0
    assert p.delay(3, None, 0.0) == 0.0
    # An absurd hint is capped.
    assert RetryPolicy(hint_cap=60).delay(1, 10_000.0, 0.5) == 60.0


def test_retries_are_bounded_by_attempts_and_deadline():
    p = RetryPolicy(max_attempts=3, deadline=10, base=1, cap=4)
    assert p.next_delay(1, 0.0, None, 0.5) is not None
    assert p.next_delay(2, 0.0, None, 0.5) is not None
    assert p.next_delay(3, 0.0, None, 0.5) is None          # 3 attempts made: no fourth
    assert p.next_delay(1, 0.0, 11.0, 0.5) is None          # the hint passes the deadline
    assert p.next_delay(1, 9.9, 1.0, 0.5) is None
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_poll_delay_grows_and_is_capped():
    d = [policy.poll_delay(n, "sending") for n in range(12)]
    assert d == sorted(d) and d[0] > 0 and max(d) == 5.0
    assert policy.poll_delay(40, "accepted") == 15.0
    assert policy.poll_delay(0, "accepted") == policy.poll_delay(0, "prepared")


# --- which exception --------------------------------------------------------------------------

@pytest.mark.parametrize("status,ptype,cls", [
    (401, "unauthorized", Unauthorized),
    (402, "budget-exceeded", BudgetExceeded),
    (422, "idempotency-key-reused", KeyReused),
    (422, "client-ref-unplaceable", Rejected),
    (429, "too-many-in-flight", RateLimited),
    (404, "job-not-found", NotFound),
    (400, "invalid-json", InvalidRequest),
    (409, "not-in-review", Rejected),
    (413, "payload-too-large", Rejected),
    (503, "store-unavailable", Unavailable),
])
def test_error_for(status, ptype, cls):
    e = error_for(status, {"type": PROBLEM + ptype, "detail": "d", "request_id": "r1"}, key="k")
    assert type(e) is cls
    assert e.type == ptype and e.status == status and e.key == "k" and e.request_id == "r1"
    assert ptype in str(e)


def test_client_ref_unplaceable_is_not_key_reused():
    assert not isinstance(error_for(422, {"type": PROBLEM + "client-ref-unplaceable"}), KeyReused)


@pytest.mark.parametrize("exc,job,stop", [
    (Unauthorized("x", status=401), None, True),
    (BudgetExceeded("x", status=402), None, True),
    (KeyReused("x", status=422), None, False),
    (InvalidRequest("x", status=400), None, False),
    (Unavailable("x"), None, False),
    (None, {"state": "failed", "result": {"status": 402}}, True),
    (None, {"state": "failed", "result": {"status": 401}}, True),
    (None, {"state": "failed", "result": {"status": 400}}, False),
    (None, {"state": "prepared", "blocked": {"reason": "tripped"}}, True),
    (None, {"state": "completed", "result": {"status": 200}}, False),
    # A task the provider ended on a cancel says nothing about the account.
    (None, {"state": "canceled", "result": {"status": 200}, "remote_id": "t"}, False),
])
def test_what_stops_a_batch(exc, job, stop):
    assert policy.must_stop_run(exc=exc, job=job) is stop


@pytest.mark.parametrize("job,terminal", [
    ({"state": "completed", "terminal": True}, True),
    ({"state": "failed", "terminal": True}, True),
    ({"state": "canceled", "terminal": True}, True),
    ({"state": "canceled"}, True),   # the state alone says so
    ({"state": "accepted", "terminal": False}, False),
    ({"state": "unknown", "terminal": False, "cancel_requested_at": "t"}, False),
    ({"state": "review", "terminal": False}, False),
    ({"state": "prepared"}, False),
])
def test_terminal_states(job, terminal):
    assert policy.is_terminal(job) is terminal
    assert Job(job).terminal is terminal


# --- keys --------------------------------------------------------------------------------------

def test_key_is_stable_and_ignores_member_order():
    a = derive_key({"product": "sku-1", "template_version": 3, "variant": 1})
    b = derive_key({"variant": 1, "template_version": 3, "product": "sku-1"})
    assert a == b
    assert a == hashlib.sha256(b'{"product":"sku-1","template_version":3,"variant":1}').hexdigest()
    assert derive_key({"product": "sku-1", "template_version": 3, "variant": 2}) != a
    assert derive_key({"product": "sku-1", "template_version": 3, "variant": "1"}) != a


def test_key_from_named_fields_only():
    row = {"product": "sku-1", "variant": 1, "trace_id": "changes-every-time"}
    k = derive_key(row, fields=["product", "variant"], prefix="poster-")
    assert k == derive_key({"variant": 1, "product": "sku-1", "trace_id": "other"},
                           fields=["variant", "product"], prefix="poster-")
    assert k.startswith("poster-") and len(k) == len("poster-") + 64
    with pytest.raises(KeyError, match="language"):
        derive_key(row, fields=["product", "language"])


@pytest.mark.parametrize("identity,exc", [
    ({"ratio": 1.5}, TypeError),
    ({"n": 2 ** 60}, TypeError),
    ({"x": object()}, TypeError),
    ({1: "x"}, TypeError),
    ({}, ValueError),
    ("sku-1", TypeError),
])
def test_identities_that_are_refused(identity, exc):
    with pytest.raises(exc):
        derive_key(identity)


@pytest.mark.parametrize("prefix", ["has space", "é", "x" * 129, "a/b"])
def test_prefixes_that_are_refused(prefix):
    with pytest.raises(ValueError):
        derive_key({"a": 1}, prefix=prefix)


def test_canonical_json_follows_rfc8785():
    # RFC 8785 §3.2.3: members sorted by their UTF-16 code units, not by code points.
    names = ["\u20ac", "\r", "\ufb33", "1", "\U0001F600", "\u0080", "\u00f6"]
    text = canonical_json({n: i for i, n in enumerate(names)})
    order = [k for k in json.loads(text, object_pairs_hook=lambda p: [k for k, _ in p])]
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001F600", "\ufb33"]
    assert canonical_json({"s": "a\u001fb\"\\/\n\u2028é"}) == '{"s":"a\\u001fb\\"\\\\/\\n\u2028é"}'
    assert canonical_json({"b": [True, None, {"y": 1, "x": -0}], "a": "x"}) == \
        '{"a":"x","b":[true,null,{"x":0,"y":1}]}'


# --- the client's retry loop, on scripted answers (no network) --------------------------------

def scripted(answers):
    """A Client whose transport plays answers (Answer or exception) in order."""
    calls, sleeps = [], []
    c = Client("http://gateway.invalid", "tok", sleep=sleeps.append, rnd=lambda: 0.5,
               retry=RetryPolicy(max_attempts=4, deadline=1000))

    def once(method, path, body, headers, timeout):
        calls.append((method, path, dict(headers or {})))
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    c._once = once
    return c, calls, sleeps


def job_answer(state="prepared", replayed=False):
    h = {"location": "/v1/jobs/job_x"}
    if replayed:
        h["idempotent-replayed"] = "true"
    return Answer(202, h, json.dumps({"id": "job_x", "state": state, "terminal": False,
                                      "idempotency_key": "k1"}).encode())


def problem(status, ptype, retry_after=None):
    h = {"content-type": "application/problem+json"}
    if retry_after is not None:
        h["retry-after"] = str(retry_after)
    return Answer(status, h, json.dumps({"type": PROBLEM + ptype, "status": status,
                                         "detail": "d"}).encode())


def test_503_then_success_resends_the_same_key_after_retry_after():
    c, calls, sleeps = scripted([problem(503, "store-unavailable", 3), job_answer()])
    job = c.submit("p/r", {"prompt": "x"}, "k1")
    assert job.id == "job_x"
    assert [h["Idempotency-Key"] for _, _, h in calls] == ["k1", "k1"]
    assert len(sleeps) == 1 and sleeps[0] >= 3


def test_timeouts_then_replay_keep_the_key():
    c, calls, sleeps = scripted([TimeoutError(), ConnectionResetError(), job_answer(replayed=True)])
    job = c.submit("p/r", b'{"prompt":"x"}', "k1")
    assert job.replayed and len(calls) == 3 and len(sleeps) == 2
    assert {h["Idempotency-Key"] for _, _, h in calls} == {"k1"}
    assert {m for m, _, _ in calls} == {"POST"}


@pytest.mark.parametrize("status,ptype,cls", [
    (422, "idempotency-key-reused", KeyReused),
    (400, "invalid-json", InvalidRequest),
    (401, "unauthorized", Unauthorized),
    (402, "budget-exceeded", BudgetExceeded),
    (404, "unknown-route", NotFound),
])
def test_a_4xx_is_never_retried(status, ptype, cls):
    c, calls, sleeps = scripted([problem(status, ptype), job_answer()])
    with pytest.raises(cls):
        c.submit("p/r", {"prompt": "x"}, "k1")
    assert len(calls) == 1 and sleeps == []


def test_retries_run_out_with_the_key_in_the_error():
    c, calls, sleeps = scripted([ConnectionRefusedError()] * 4)
    with pytest.raises(Unavailable) as e:
        c.submit("p/r", {"prompt": "x"}, "k1")
    assert e.value.key == "k1" and isinstance(e.value.cause, ConnectionRefusedError)
    assert len(calls) == 4 and len(sleeps) == 3


def test_429_every_time_is_rate_limited_with_the_hint():
    c, calls, sleeps = scripted([problem(429, "too-many-in-flight", 2)] * 4)
    with pytest.raises(RateLimited) as e:
        c.submit("p/r", {"prompt": "x"}, "k1")
    assert e.value.retry_after == 2.0 and len(calls) == 4 and all(s >= 2 for s in sleeps)


def test_a_stored_provider_503_is_the_jobs_answer_not_a_retry():
    failed = {"id": "job_x", "state": "failed", "terminal": True, "idempotency_key": "k1",
              "result": {"status": 503}}
    c, calls, sleeps = scripted([
        Answer(503, {"x-idemgate-job-id": "job_x", "x-idemgate-state": "failed",
                     "retry-after": "1"}, b"{}"),
        Answer(200, {}, json.dumps(failed).encode())])
    job = c.submit("p/r", {"prompt": "x"}, "k1", wait=5)
    assert job.state == "failed" and job.answer[0] == 503
    assert [m for m, _, _ in calls] == ["POST", "GET"] and sleeps == []
    assert calls[0][2]["Prefer"] == "wait=5"


def test_a_canceled_job_ends_the_wait_and_is_neither_ok_nor_raised():
    """The provider ended the task on our cancel: wait() returns it at the first read (no
    more reads, no sleep, no exception), with its remote id and cost; it is not `ok`."""
    canceled = {"id": "job_x", "state": "canceled", "terminal": True, "idempotency_key": "k1",
                "remote_id": "task_1", "cancel_requested_at": "t",
                "cost": {"currency": "USD", "estimate_micros": 500, "micros": 500}}
    c, calls, sleeps = scripted([Answer(200, {}, json.dumps(canceled).encode())])
    job = c.wait("job_x", timeout=5)
    assert job.state == "canceled" and job.canceled and job.terminal and not job.ok
    assert job.remote_id == "task_1" and job.spend == (500, "USD")
    assert [m for m, _, _ in calls] == ["GET"] and sleeps == []


def test_a_submit_without_a_wait_asks_for_the_job_at_once():
    """Without `wait`, the gateway is asked for the job at once (`Prefer: respond-async`):
    without a Prefer header it holds the request for the route's default wait (120–300 s in the
    shipped profiles, up to max_wait_seconds), past the attempt's 30 s timeout — each attempt
    ended unanswered and the client raised Unavailable for a job that runs."""
    c, calls, _ = scripted([job_answer()])
    c.submit("p/r", {"prompt": "x"}, "k1")
    assert calls[0][2]["Prefer"] == "respond-async"
    c, calls, _ = scripted([job_answer()])
    c.submit("p/r", {"prompt": "x"}, "k1", wait=0)
    assert calls[0][2]["Prefer"] == "respond-async"


def test_submit_refuses_a_missing_key():
    c, calls, _ = scripted([])
    with pytest.raises(ValueError):
        c.submit("p/r", {}, "")
    assert calls == []


# --- the batch runner's pure parts ---------------------------------------------------------

def write(tmp_path, lines):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(p)


def test_manifest_keys_come_from_the_identity(tmp_path):
    p = write(tmp_path, [{"route": "p/r", "identity": {"sku": "a"}, "body": {"prompt": "1"}},
                         {"route": "p/r", "identity": {"sku": "b"}, "body": {"prompt": "1"}}])
    rows = batch.read_manifest(p)
    again = batch.read_manifest(p)
    assert [r.key for r in rows] == [r.key for r in again]
    assert rows[0].key == derive_key({"route": "p/r", "identity": {"sku": "a"}})
    # The body is not the identity: a new wording under the same identity keeps the key.
    p2 = write(tmp_path, [{"route": "p/r", "identity": {"sku": "a"}, "body": {"prompt": "2"}}])
    assert batch.read_manifest(p2)[0].key == rows[0].key


def test_manifest_key_fields_and_refusals(tmp_path):
    p = write(tmp_path, [{"sku": "a", "body": {"prompt": "x", "n": 1}}])
    [r] = batch.read_manifest(p, default_route="p/r", key_fields=["sku", "body.n"])
    assert r.key == derive_key({"route": "p/r", "identity": {"sku": "a", "body.n": 1}})
    with pytest.raises(batch.ManifestError, match="no \"identity\""):
        batch.read_manifest(p, default_route="p/r")
    with pytest.raises(batch.ManifestError, match="body.size"):
        batch.read_manifest(p, default_route="p/r", key_fields=["body.size"])
    dup = write(tmp_path, [{"route": "p/r", "identity": {"sku": "a"}, "body": {"prompt": "1"}},
                           {"route": "p/r", "identity": {"sku": "a"}, "body": {"prompt": "2"}}])
    with pytest.raises(batch.ManifestError, match="line 1, with another body"):
        batch.read_manifest(dup)
    bad = write(tmp_path, [{"route": "p/r", "identity": {"w": 0.5}, "body": {}}])
    with pytest.raises(batch.ManifestError, match="float"):
        batch.read_manifest(bad)


@pytest.mark.parametrize("states,stopped,code", [
    (["completed", "completed"], False, batch.EXIT_OK),
    (["completed", "failed"], False, batch.EXIT_FAILED),
    (["completed", "canceled"], False, batch.EXIT_FAILED),
    # A row still running wins over a failed one: run again to collect it (was EXIT_FAILED, and a
    # wrapper rerunning on 4 left the paid job uncollected).
    (["canceled", "submitted"], False, batch.EXIT_UNFINISHED),
    (["error", "pending"], False, batch.EXIT_UNFINISHED),
    (["completed", "error"], False, batch.EXIT_FAILED),
    (["completed", "submitted"], False, batch.EXIT_UNFINISHED),
    (["completed", "pending"], False, batch.EXIT_UNFINISHED),
    (["completed", "pending"], True, batch.EXIT_STOPPED),
])
def test_exit_codes(states, stopped, code):
    assert batch.exit_code([{"state": s} for s in states], stopped) == code
