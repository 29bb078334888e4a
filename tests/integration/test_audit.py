"""Issue 10 (the outside audit): one named regression test per item of sections A-D.

Items 5 (proxies) and 12 (use-after-free at shutdown) are covered elsewhere. Every test here
failed on the code before the fixes, for the reason the issue gives (see each docstring), and
asserts what the gateway does after them: on the mock's ledger (what the provider received),
the job as the API shows it, and the database where the fact lives there.

The profile settings introduced by the fixes (reconcile.list.next_cursor/cursor_param/
max_pages, reconcile.absent_grace_ms, reconcile.task, retry.not_created_statuses,
auth.trip_statuses, max_response_bytes, webhook.client_ref) are used by name; a gateway that
predates them ignores unknown provider members, so the same scenario shows the old behaviour."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import GATEWAY_BIN, ROOT, free_port, provider

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos.cluster import Cluster  # noqa: E402

PROFILES = os.path.join(ROOT, "deploy", "providers")
HANG = {"connect_ms": 1000, "total_ms": 1000}
FAST_RETRY = {"max_attempts": 50, "deadline_seconds": 120, "base_ms": 100, "cap_ms": 500}
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
SECRETS = {"OPENAI_API_KEY": "sk-o", "KEYED_API_KEY": "k-x", "LUMAAI_API_KEY": "luma-x",
           "KEYED_WEBHOOK_SECRET": "mock-hmac-secret",
           "OPENAI_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
LOOKUP = {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id", "client_ref": "$.client_ref",
          "absent": {"path": "$.error.code", "equals": "not_found"}}
TASK_READ = {"path": "/v1/images/tasks/{id}", "client_ref": "$.client_ref"}
# A found task (lookup, list item, task read) is the mock's task object; the create's answer,
# with its outputs, is its `result` member (reconcile.found_result).
FOUND = {"found_result": "$.result"}
SETTLED = {"completed", "failed", "review"}


# --- helpers ------------------------------------------------------------------------------------

def key(prefix="audit"):
    return f"{prefix}-{uuid.uuid4().hex}"


def ledger_all(mock, job_id):
    """Every create the mock received for one operation, provider-side replays included: a
    replay is still a send."""
    return [e for e in mock.ledger() if e["client_ref"] == job_id]


def real_creates(mock, job_id):
    return [e for e in ledger_all(mock, job_id) if not e.get("replay")]


def wait_ledger(mock, job_id, n=1, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(ledger_all(mock, job_id)) < n:
        assert time.monotonic() < deadline, f"the mock never saw {n} create(s) for {job_id}"
        time.sleep(0.02)
    return ledger_all(mock, job_id)


def wait_job(gw, token, job_id, states, timeout=20.0, pred=None):
    """Like Gateway.wait_state, but a 503 (database restarting) is waited out, and pred (a
    function of the job) may replace the state test."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        r = gw.job(token, job_id)
        if r.status == 200:
            last = r.json()
            if (pred(last) if pred else last["state"] in states):
                return last
        if time.monotonic() > deadline:
            return last
        time.sleep(0.05)


def mock_config(mock, **settings):
    r = mock.http.request("POST", "/_config", json.dumps(settings))
    assert r.status == 200, f"mock lacks /_config {sorted(settings)}: {r}"


def script(mock, faults):
    r = mock.script(faults)
    assert r.status == 200, f"mock refused the script {faults}: {r}"


def require_control(mock, control, value, path="/v1/images/generations"):
    """Fails loudly (not as the gateway's fault) when the mock predates a control."""
    r = mock.http.request("POST", path, json.dumps({"prompt": "probe", "_mock": {control: value}}))
    assert r.status < 300, f"mock lacks the control {control}: {r}"
    mock.http.request("POST", "/_reset")


def problem_type(r):
    try:
        return r.json().get("type")
    except ValueError:
        return None


def cancel(gw, token, job_id):
    return gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "",
                           {"Authorization": f"Bearer {token}"})


def resolve(gw, token, job_id, body):
    return gw.http.request("POST", f"/v1/jobs/{job_id}/resolve", json.dumps(body),
                           {"Authorization": f"Bearer {token}"})


def stop(gw):
    """SIGTERM one gateway and require a clean exit (the factory skips it afterwards)."""
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=15) == 0, gw.log()[-2000:]


def profile(name):
    with open(os.path.join(PROFILES, name + ".json")) as f:
        return json.load(f)


def async_entry(name, mock, route, **over):
    """A shipped async profile pointed at the mock, polling fast."""
    poll = dict(profile(name)["poll"], interval_ms=50, max_interval_ms=200)
    e = {"name": name.replace("-", ""), "profile": os.path.join(PROFILES, name + ".json"),
         "base_url": mock.url, "poll": poll, "timeouts": {"connect_ms": 1000, "total_ms": 5000}}
    e.update(over)
    return e, f"{e['name']}/{route}"


def no_duplicate_members(pairs):
    names = [k for k, _ in pairs]
    assert len(names) == len(set(names)), f"duplicate JSON members {names}"
    return dict(pairs)


# --- A. Duplicate paid creates (reproduced) ----------------------------------------------------

@pytest.mark.parametrize("strategy", ["idempotent_resubmit", "get_by_client_id"])
def test_a1_cancel_on_unknown_is_never_resent(gateway_factory, token, mock, strategy):
    """Item 1. A create times out (unknown), the client cancels (202), then the reconciler runs.
    Before: the keyed provider's create was resent (completed), the found task completed the
    job. After: nothing is sent again; idempotent_resubmit cannot look without sending, so the
    job ends in review; a lookup that finds the finished task completes the job with its result
    (issue 21 item 1: before, it was failed, its paid result lost)."""
    if strategy == "idempotent_resubmit":
        entry = provider("a1", mock.url, path="/v2/generations", route="generations",
                         idempotency={"header": "Idempotency-Key"}, timeouts=HANG,
                         retry=FAST_RETRY,
                         reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200,
                                    "window_seconds": 3})
        route = "a1/generations"
    else:
        entry = provider("a1", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
                         reconcile={"strategy": "get_by_client_id", "window_seconds": 30,
                                    "interval_ms": 200, "lookup": LOOKUP, **FOUND})
        route = "a1/images/generations"
    # No reconciler in the first replica: the cancel lands while the job is surely unknown.
    gw1 = gateway_factory(providers=[entry], reconcile_workers=0)
    script(mock, [{"fault": "hang"}])
    job_id = gw1.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    j = wait_job(gw1, token, job_id, {"unknown"}, 15)
    assert j["state"] == "unknown", j
    c = cancel(gw1, token, job_id)
    assert c.status == 202 and c.json().get("cancel_requested_at"), c
    stop(gw1)
    gw2 = gateway_factory(providers=[entry])
    j = wait_job(gw2, token, job_id, SETTLED, 20)
    sends = ledger_all(mock, job_id)
    assert len(sends) == 1, f"a cancelled operation was sent again: {sends}"
    if strategy == "idempotent_resubmit":
        # It cannot look without sending: never resent, an operator decides.
        assert j["state"] == "review", j
    else:
        # A found task is the truth (issue 21 item 1): it finished at the provider, so the job is
        # completed with its result, and says the cancel came too late. Never failed.
        assert j["state"] == "completed" and "cancel came too late" in j["last_error"], j
    time.sleep(0.5)
    assert len(ledger_all(mock, job_id)) == 1


def test_a_found_result_is_planned_for_the_archive_where_it_is_written(gateway_factory, token,
                                                                       mock, psql):
    """A synchronous task the reconciler finds is written with its outputs' archive plan, as a
    dispatched create's result is. Before, it was left unplanned for a replica archiving that
    provider to plan: on replicas without archive threads, never — the job then outlives its
    expiry (migration 0038) and the archive's gauges count it late."""
    entry = provider("planfound", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
                     reconcile={"strategy": "get_by_client_id", "window_seconds": 30,
                                "interval_ms": 200, "lookup": LOOKUP, **FOUND})
    gw1 = gateway_factory(providers=[entry], reconcile_workers=0, archive_workers=0)
    script(mock, [{"fault": "hang"}])
    job_id = gw1.submit(token, key(), {"prompt": "x", "n": 2},
                        route="planfound/images/generations").json()["id"]
    assert wait_job(gw1, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    stop(gw1)
    gw2 = gateway_factory(providers=[entry], archive_workers=0)
    j = wait_job(gw2, token, job_id, SETTLED, 20)
    assert j["state"] == "completed", j
    assert len(ledger_all(mock, job_id)) == 1
    planned = psql(f"SELECT archive_planned_at IS NOT NULL, (SELECT count(*) FROM archive_outputs "
                   f"a WHERE a.op_id = o.id) FROM operations o WHERE o.id = '{job_id}'")
    assert planned == [["t", "2"]], planned


def test_a1_resolve_absent_on_a_cancelled_job_never_sends(gateway_factory, token, mock):
    """Item 1, the operator's path: a job in review whose cancel was acknowledged is resolved
    `absent`. It is failed, never sent again (the provider's creates stay at 1)."""
    gw = gateway_factory(providers=[provider(
        "a1r", mock.url, timeouts=HANG, reconcile={"strategy": "none", "window_seconds": 1})])
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="a1r/images/generations").json()["id"]
    assert wait_job(gw, token, job_id, {"review"}, 15)["state"] == "review"
    c = cancel(gw, token, job_id)
    assert c.status == 202 and c.json().get("cancel_requested_at"), c
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 200 and r.json()["state"] == "failed", r
    time.sleep(1.5)  # a dispatcher would have claimed a prepared job by now
    assert len(ledger_all(mock, job_id)) == 1, "sent again after an acknowledged cancel"
    assert gw.job(token, job_id).json()["state"] == "failed"


def test_found_on_a_replica_without_the_provider_is_refused(gateway_factory, token, mock,
                                                            database_url):
    """The admin's `found` reached a replica whose configuration lacks the job's provider (it was
    removed, or this replica configures a subset): with no profile to say what the task becomes,
    the job was ended `completed` at once — an async task never polled for its outputs, a
    cancel never sent, a task readable by id never read. Now 409 `provider-not-configured`, the
    job left in review for a replica that configures it; the CLI, run with such a configuration,
    refuses it too (it completed the job)."""
    a = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        "subset", mock.url, timeouts=HANG, reconcile={"strategy": "none", "window_seconds": 1})])
    script(mock, [{"fault": "hang"}])
    job_id = a.submit(token, key(), {"prompt": "x"}, route="subset/images/generations").json()["id"]
    assert wait_job(a, token, job_id, {"review"}, 15)["state"] == "review"
    b = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider("other", mock.url)])
    r = resolve(b, ADMIN_TOKEN, job_id, {"outcome": "found", "remote_id": "task_1"})
    assert r.status == 409, r
    assert r.json()["type"] == "urn:idemgate:problem:provider-not-configured", r
    assert b.job(token, job_id).json()["state"] == "review"
    res = subprocess.run([GATEWAY_BIN, "--config", b.log_path[:-len(".log")] + ".json", "jobs",
                          "resolve", job_id, "found", "--remote-id", "task_1"],
                         capture_output=True, text=True,
                         env=dict(os.environ, DATABASE_URL=database_url))
    assert res.returncode == 1 and "does not name the provider" in res.stderr, res
    assert b.job(token, job_id).json()["state"] == "review"
    r = resolve(a, ADMIN_TOKEN, job_id, {"outcome": "found", "remote_id": "task_1"})
    assert r.status == 200 and r.json()["state"] == "completed", r


@pytest.mark.parametrize("seen", ["row", "verdict"])
def test_resolve_absent_on_a_job_whose_task_was_seen_never_sends(gateway_factory, token, mock,
                                                                 database_url, psql, seen):
    """A job goes to review with its task seen. `row`: its id known — the reconciler found the
    task but could not read its status or result (`found_unreadable`), or a cut stream named
    it. `verdict`: no id on the row — the reconciler saw the task without one to adopt it by (a
    list with several tasks carrying the job's reference, `several_matches`; a task whose id or
    result the profile cannot read, `found_without_id`, `found_unreadable`), the guard's proof
    being the verdict's attempt row. `absent` from the tenant's token (or the console's button)
    sent it again: a second paid task, and the known one overwritten. Now 409 `task-known`, and
    the CLI refuses it without --force; only the admin's `force` (the id is not this job's)
    sends it again."""
    name = "seen" + seen
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        name, mock.url, timeouts=HANG, reconcile={"strategy": "none", "window_seconds": 1})])
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"},
                       route=f"{name}/images/generations").json()["id"]
    assert wait_job(gw, token, job_id, {"review"}, 15)["state"] == "review"
    if seen == "row":
        # What the reconciler's found_unreadable write leaves: review, the task's id kept.
        # (and a webhook's hint the reconciler kept when it could not read the task)
        psql(f"UPDATE operations SET remote_id = 'task_seen', webhook_hint = 'task_seen', "
             f"poll_url = '{mock.url}/v1/tasks/task_seen' WHERE id = '{job_id}'")
    else:
        # What write_look leaves when the list holds two tasks with this job's reference (the
        # strategy here is none: the verdict's attempt row is written by hand).
        psql("INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, outcome, "
             "decision) SELECT tenant_id, id, lease_version, 'reconcile', 'several_matches', "
             f"'review' FROM operations WHERE id = '{job_id}'")
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 409 and problem_type(r) == "urn:idemgate:problem:task-known", r
    assert ("task_seen" if seen == "row" else "several_matches") in r.json()["detail"], r.json()
    forced = resolve(gw, token, job_id, {"outcome": "absent", "force": True})
    assert forced.status == 409, "a tenant's force was honoured"
    env = dict(os.environ, DATABASE_URL=database_url)
    out = subprocess.run([GATEWAY_BIN, "jobs", "resolve", job_id, "absent"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "--force" in out.stderr, out
    assert gw.job(token, job_id).json()["state"] == "review"
    time.sleep(1.5)  # a dispatcher would have claimed a prepared job by now
    assert len(ledger_all(mock, job_id)) == 1, "sent again with its task known"
    # The admin's word that the id is not this job's: sent again.
    r = resolve(gw, ADMIN_TOKEN, job_id, {"outcome": "absent", "force": True, "operator": "ops"})
    assert r.status == 200 and r.json()["state"] in ("prepared", "sending", "completed"), r
    assert wait_job(gw, token, job_id, {"completed"}, 15)["state"] == "completed"
    assert len(ledger_all(mock, job_id)) == 2
    # The operator's `absent` overrode the hint: left on the row, a back-off of the resend was
    # read as a hinted create's (unknown), the hint read again and the job back in review. And
    # the disowned task's id and poll URL (migration 0042): kept, a resend whose answer was lost
    # was reconciled by reading that task and adopting its answer as this job's.
    row = psql(f"SELECT webhook_hint IS NULL, remote_id IS DISTINCT FROM 'task_seen', "
               f"poll_url IS NULL FROM operations WHERE id = '{job_id}'")
    assert row == [["t", "t", "t"]], row


def refd_provider(mock, name="refd"):
    """A synchronous provider on the mock's luma route, whose 201 body echoes the request it
    received (`request`, duplicates kept), reconciled by list_match on a body reference."""
    return provider(
        name, mock.url, path="/dream-machine/v1/generations", route="generations",
        client_ref={"body_field": "metadata.client_ref"}, outputs={},
        reconcile={"strategy": "list_match", "window_seconds": 4, "interval_ms": 300,
                   "list": {"path": "/dream-machine/v1/generations?since={since}&until={until}",
                            "items": "$.generations[*]",
                            "match": "$.request.metadata.client_ref", "id": "$.id",
                            "next_cursor": "$.next_cursor"}})


UNPLACEABLE = {
    "member_present": '{"prompt":"x","metadata":{"client_ref":"my-own"}}',
    "member_present_escaped_name": '{"prompt":"x","metadata":{"client\\u005fref":"my-own"}}',
    "parent_null": '{"prompt":"x","metadata":null}',
    "parent_string": '{"prompt":"x","metadata":"tag"}',
    "parent_number": '{"prompt":"x","metadata":7}',
    "parent_array": '{"prompt":"x","metadata":[{"client_ref":"x"}]}',
    "body_array": '[{"prompt":"x"}]',
}


@pytest.mark.parametrize("strategy", ["list_match", "none"])
@pytest.mark.parametrize("case", sorted(UNPLACEABLE))
def test_a2_unplaceable_client_ref_is_refused_at_intake(gateway_factory, token, mock, case,
                                                        strategy):
    """Item 2. Before: the create went out without the reference (202; list_match later
    'proved' absence and resent). After: 422 client-ref-unplaceable, nothing recorded, the
    provider untouched; an unauthenticated caller still gets 401 first. Under every strategy:
    with `none`, a reference the client wrote there (another job's id) was sent as it was, and
    a webhook or a task read echoing it proved the client's task to be that job's."""
    entry = refd_provider(mock)
    if strategy == "none":
        entry["reconcile"] = {"strategy": "none", "window_seconds": 4}
    gw = gateway_factory(providers=[entry])
    body = UNPLACEABLE[case]
    k = key()
    assert gw.submit("igt_not_a_tenant", k, body, route="refd/generations").status == 401
    r = gw.submit(token, k, body, route="refd/generations")
    assert r.status == 422, f"accepted a create whose reference cannot be placed: {r}"
    assert problem_type(r) == "urn:idemgate:problem:client-ref-unplaceable", r
    listed = gw.http.request("GET", "/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert listed.status == 200 and listed.json()["data"] == [], listed
    time.sleep(0.3)
    assert mock.ledger() == [], "the provider was called"
    # The key was not consumed: a placeable body under it is a new job — waited for, so that
    # it is not left `prepared` for the next case's gateway (same provider name) to send into
    # that case's ledger.
    ok = gw.submit(token, k, {"prompt": "x"}, route="refd/generations",
                   headers={"Prefer": "wait=20"})
    assert ok.status == 201 and ok.headers["x-idemgate-job-id"], ok
    assert len(real_creates(mock, ok.headers["x-idemgate-job-id"])) == 1


def test_a2_escaped_member_name_takes_the_reference_inside(gateway_factory, token, mock):
    """Item 2, escaped names. Before: `"metad\\u0061ta"` was not recognised as `metadata`, so a
    second `metadata` member was added and the provider saw the member twice. After: the
    reference goes inside the client's own object."""
    gw = gateway_factory(providers=[refd_provider(mock)])
    raw = '{"prompt":"x","metad\\u0061ta":{"user":"u1"}}'
    r = gw.submit(token, key(), raw, route="refd/generations", headers={"Prefer": "wait=20"})
    assert r.status == 201, r
    job_id = r.headers["x-idemgate-job-id"]
    sent = json.loads(r.body, object_pairs_hook=no_duplicate_members)["request"]
    assert sent["metadata"] == {"user": "u1", "client_ref": job_id}, sent
    [create] = real_creates(mock, job_id)
    assert create["client_ref_source"] == "body"


LIST_PAGED = {"path": "/v1/images/tasks?since={since}&until={until}", "items": "$.data[*]",
              "match": "$.client_ref", "id": "$.id", "next_cursor": "$.next_cursor",
              "cursor_param": "cursor", "max_pages": 50}


@pytest.mark.parametrize("case", ["followed", "page_limit", "page_error"])
def test_a3_list_match_reads_every_page(gateway_factory, token, mock, case):
    """Item 3. 101 other tasks push ours off the first page. Before: one page was read, the
    job declared absent and resent (2 creates). After: the cursor is followed to the task
    (completed, 1 create); a page limit reached or a failing page proves nothing (review,
    1 create)."""
    mock_config(mock, list_page_max=50)
    if case == "page_error":
        mock_config(mock, list_page_status=500)
    lst = dict(LIST_PAGED, max_pages=2 if case == "page_limit" else 50)
    gw = gateway_factory(providers=[provider(
        "a3", mock.url, timeouts=HANG, client_ref={"body_field": "metadata.client_ref"},
        reconcile={"strategy": "list_match", "window_seconds": 4, "interval_ms": 300,
                   "absent_grace_ms": 2000, "list": lst, **FOUND})])
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="a3/images/generations").json()["id"]
    [first] = wait_ledger(mock, job_id)
    seeded = mock.http.request("POST", "/_tasks/seed",
                               json.dumps({"provider": "openai-images", "count": 101}))
    assert seeded.status == 200, f"mock lacks /_tasks/seed: {seeded}"
    j = wait_job(gw, token, job_id, SETTLED, 25)
    creates = real_creates(mock, job_id)
    assert len(creates) == 1, f"resent after reading part of the list: {creates}"
    if case == "followed":
        assert j["state"] == "completed" and j["remote_id"] == first["task_id"], j
    else:
        assert j["state"] == "review", j


# --- B. Duplicate paid creates (traced) --------------------------------------------------------

@pytest.mark.parametrize("status", [500, 502, 504, 522])
def test_b4_5xx_after_create_is_unknown_not_resent(gateway_factory, token, mock, status):
    """Item 4. The origin made the task, then a 5xx came back. Before: any 5xx was a back-off,
    so a provider without keys got the create again (a second paid task). After: ambiguous →
    unknown → the lookup finds the one task (1 create). Under a native key the resend is still
    a safe transport retry (replayed, 1 real create)."""
    gw = gateway_factory(providers=[
        provider("b4", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
                 retry={"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50, "cap_ms": 100},
                 reconcile={"strategy": "get_by_client_id", "window_seconds": 30,
                            "interval_ms": 200, "lookup": LOOKUP, **FOUND}),
        provider("b4k", mock.url, path="/v2/generations", route="generations",
                 idempotency={"header": "Idempotency-Key"}, timeouts=HANG, retry=FAST_RETRY,
                 reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200})])
    fault = {"status": status, "task_made": True}
    # The keyed job's fault is scripted (one create), so that the resend is a clean replay;
    # the keyless job carries its fault in the body, so any resend of it meets the 5xx again.
    script(mock, [fault])
    keyed = gw.submit(token, key(), {"prompt": "y"}, route="b4k/generations")
    wait_ledger(mock, keyed.json()["id"])
    nokey = gw.submit(token, key(), {"prompt": "x", "_mock": fault}, route="b4/images/generations")
    assert nokey.status == 202, f"mock or gateway refused the task_made control: {nokey}"
    j = wait_job(gw, token, nokey.json()["id"], SETTLED, 20)
    creates = real_creates(mock, j["id"])
    assert len(creates) == 1, f"HTTP {status} after the origin accepted was resent: {creates}"
    assert creates[0]["status"] == status and creates[0]["task_id"], creates
    assert j["state"] == "completed" and j["remote_id"] == creates[0]["task_id"], j
    k = wait_job(gw, token, keyed.json()["id"], SETTLED, 20)
    assert k["state"] == "completed", k
    assert len(real_creates(mock, k["id"])) == 1
    assert len(ledger_all(mock, k["id"])) >= 2, "under a native key the resend is safe"


def test_a_keyed_resend_due_past_its_recovery_window_is_not_sent(gateway_factory, token, mock):
    """Under a native key a 5xx is backed off (`prepared` again, the attempt ambiguous: the task
    may exist) and resent with the same key — safe while the provider still knows that key.
    Here the resend falls due after the recovery window (the server's Retry-After is longer; in
    production: a row held in `prepared` by a provider tripped by another job's refusal, or a
    credential missing on the replicas that claim it). Before, the dispatcher sent it whenever
    it was claimed, however late (the reconciler's resends check the window, the dispatcher's
    did not): once the provider forgot the key, a second paid task. Now it is not sent: the
    reconciler takes it, and with its window closed, review."""
    gw = gateway_factory(providers=[
        provider("kwin", mock.url, path="/v2/generations", route="generations",
                 idempotency={"header": "Idempotency-Key"}, timeouts=HANG, retry=FAST_RETRY,
                 reconcile={"strategy": "idempotent_resubmit", "window_seconds": 2,
                            "interval_ms": 200})])
    script(mock, [{"status": 502, "task_made": True, "retry_after": "4"}])
    job_id = gw.submit(token, key(), {"prompt": "y"}, route="kwin/generations").json()["id"]
    wait_ledger(mock, job_id)
    j = wait_job(gw, token, job_id, {"review", "completed", "failed"}, 20)
    assert j["state"] == "review", j
    time.sleep(1)
    sends = ledger_all(mock, job_id)
    assert len(sends) == 1, f"sent again past its recovery window: {sends}"


def test_a_success_status_whose_answer_is_not_json_is_not_the_result(gateway_factory, token,
                                                                     mock):
    """A synchronous create answered 200 with an HTML page (an egress proxy's or a CDN's, in
    front of a provider that made the task). Before, the job was `completed` with the page as
    its result and no outputs: the paid images unreadable, nobody told. Now it is `unknown`
    (its task may exist) and reconciled: here the lookup by client reference finds the task and
    the job completes with its real result; the create is sent once."""
    gw = gateway_factory(providers=[
        provider("html", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
                 reconcile={"strategy": "get_by_client_id", "window_seconds": 30,
                            "interval_ms": 200, "lookup": LOOKUP, **FOUND})])
    script(mock, [{"fault": "html"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="html/images/generations").json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    [create] = real_creates(mock, job_id)
    assert create["status"] == 200, create
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], \
        f"a 200 whose answer is an HTML page was taken for the result: {j}"
    assert j["result"]["body"].get("data"), j["result"]
    assert len(ledger_all(mock, job_id)) == 1


def test_b4_declared_not_created_status_is_resent_but_others_are_not(gateway_factory, token,
                                                                      mock):
    """Item 4, retry.not_created_statuses. A 503 the profile declares "not created" is resent;
    the 502 that follows (task made) is not. Before: both were resent (3 creates, 2 paid)."""
    gw = gateway_factory(providers=[provider(
        "b4d", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
        retry=dict(FAST_RETRY, not_created_statuses=[408, 425, 429, 503]),
        reconcile={"strategy": "get_by_client_id", "window_seconds": 30, "interval_ms": 200,
                   "lookup": LOOKUP, **FOUND})])
    script(mock, [{"status": 503, "retry_after": "1"}, {"status": 502, "task_made": True}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="b4d/images/generations").json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    creates = real_creates(mock, job_id)
    assert [c["status"] for c in creates] == [503, 502], \
        f"want the declared 503 resent once and the 502 (task made) never: {creates}"
    assert creates[0]["task_id"] is None and creates[1]["task_id"], creates
    assert j["state"] == "completed" and j["remote_id"] == creates[1]["task_id"], j


def test_b6_ambiguous_then_409s_never_end_failed(gateway_factory, token, mock, psql):
    """Item 6. Keyed provider: the create times out while the provider works on it (the key is
    in flight), every resend meets 409 and the budget runs out. Before: `failed` (budget) while
    the provider holds a task. After: `review` (or completed once the key replays), and the
    ambiguity is stored on the row (ambiguous_at)."""
    gw = gateway_factory(providers=[provider(
        "b6", mock.url, path="/v2/generations", route="generations",
        idempotency={"header": "Idempotency-Key"}, timeouts=HANG,
        retry={"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50, "cap_ms": 100},
        reconcile={"strategy": "idempotent_resubmit", "interval_ms": 100, "window_seconds": 3})])
    script(mock, [{"delay_ms": 6000}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="b6/generations").json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] != "failed", f"failed while the provider holds a task: {j}"
    assert j["state"] in ("review", "completed"), j
    assert len(real_creates(mock, job_id)) == 1
    assert any(e["status"] == 409 for e in ledger_all(mock, job_id)), "no 409 was provoked"
    assert psql(f"SELECT ambiguous_at IS NOT NULL FROM operations WHERE id = '{job_id}'") \
        == [["t"]]


def test_b6_5xx_under_a_native_key_then_spent_budget_is_review(gateway_factory, token, mock,
                                                               psql):
    """Item 6, found by the randomised campaign (seed 1101): a keyed create is answered 502 after
    the origin made the task; a resend under the same key is safe, but the provider then refuses
    connections until the budget is spent. Before: `failed` ("retry budget exhausted") while the
    provider holds the task. After: the 502 is remembered (ambiguous_at) and the job ends in
    `review` (or `completed` if a resend got through), never `failed`."""
    gw = gateway_factory(providers=[provider(
        "b6k", mock.url, path="/v2/generations", route="generations",
        idempotency={"header": "Idempotency-Key"}, timeouts=HANG,
        retry={"max_attempts": 3, "deadline_seconds": 60, "base_ms": 300, "cap_ms": 300},
        reconcile={"strategy": "idempotent_resubmit", "interval_ms": 100, "window_seconds": 2})])
    script(mock, [{"status": 502, "task_made": True}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="b6k/generations").json()["id"]
    wait_ledger(mock, job_id, 1)
    refused = mock.http.request("POST", "/_refuse", json.dumps({"ms": 4000}))
    until = time.monotonic() + 4.2
    assert refused.status == 200, refused
    j = wait_job(gw, token, job_id, SETTLED, 30)
    time.sleep(max(0.0, until - time.monotonic()))  # the mock answers its ledger again
    assert j["state"] != "failed", f"failed while the provider holds a task: {j}"
    assert j["state"] in ("review", "completed"), j
    assert len(real_creates(mock, job_id)) == 1
    assert psql(f"SELECT ambiguous_at IS NOT NULL FROM operations WHERE id = '{job_id}'") \
        == [["t"]]


def test_b7_lookup_404_within_the_grace_is_not_absent(gateway_factory, token, mock):
    """Item 7. The provider commits the task after our timeout: lookups answer 404 for a while.
    Before: the first 404 was absence, and the create was sent again (2 creates). After: no
    absence before reconcile.absent_grace_ms since the last ambiguous send; the task shows up
    and is adopted (1 create)."""
    gw = gateway_factory(providers=[provider(
        "b7", mock.url, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
        reconcile={"strategy": "get_by_client_id", "window_seconds": 30, "interval_ms": 200,
                   "absent_grace_ms": 6000, "lookup": LOOKUP, **FOUND})])
    script(mock, [{"fault": "hang", "visible_after_ms": 2500}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="b7/images/generations").json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    creates = real_creates(mock, job_id)
    assert len(creates) == 1, f"declared absent within the grace period and resent: {creates}"
    assert j["state"] == "completed" and j["remote_id"] == creates[0]["task_id"], j


def test_b7_list_after_a_later_ambiguous_send_waits_the_grace(gateway_factory, token, mock):
    """Item 7, lists. The first create made no task (proven absent, resent); the resend is
    ambiguous too and its task reaches the list 1.5 s late. Before: the recovery window, counted
    from the first send, was already closed, so a single empty list proved absence and the
    create went out a third time. After: absence needs absent_grace_ms since the LAST ambiguous
    send; the task is found (2 creates, the second adopted)."""
    gw = gateway_factory(providers=[provider(
        "b7l", mock.url, timeouts=HANG, client_ref={"body_field": "metadata.client_ref"},
        reconcile={"strategy": "list_match", "window_seconds": 10, "interval_ms": 200,
                   "absent_grace_ms": 4000, "list": LIST_PAGED, **FOUND})])
    script(mock, [{"fault": "hang", "status": 503},
                  {"fault": "hang", "visible_after_ms": 1500}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="b7l/images/generations").json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 30)
    creates = real_creates(mock, job_id)
    assert len(creates) == 2, f"the later ambiguous send got a single look: {creates}"
    assert creates[0]["task_id"] is None and creates[1]["task_id"], creates
    assert j["state"] == "completed" and j["remote_id"] == creates[1]["task_id"], j


# --- C. Lost paid results ------------------------------------------------------------------------

def test_c8_postgres_restart_during_a_create_keeps_the_result(gateway_factory, mock):
    """Item 8. PostgreSQL restarts while the create is at the provider. Before: the first
    fenced write after it failed on the dead connection (dispatch_result_lost); the paid
    result was dropped and the job ended in review. After: reconnect, re-run, completed."""
    c = Cluster(prefix="idemgate-audit-pg-")
    gw = None
    try:
        url = c.start()
        c.migrate(GATEWAY_BIN, url)
        tok = c.tenant(GATEWAY_BIN, "audit-" + uuid.uuid4().hex[:8], url)
        gw = gateway_factory(env={"DATABASE_URL": url}, lease_seconds=20, providers=[provider(
            "c8", mock.url, timeouts={"connect_ms": 1000, "total_ms": 10000},
            reconcile={"strategy": "none", "window_seconds": 2})])
        r = gw.submit(tok, key(), {"prompt": "x", "_mock": {"delay_ms": 4000}},
                      route="c8/images/generations")
        job_id = r.json()["id"]
        wait_ledger(mock, job_id)  # the create is at the provider, its answer 4 s away
        c.stop_immediate()
        c.start()
        j = wait_job(gw, tok, job_id, SETTLED, 40)
        assert "dispatch_result_lost" not in gw.log(), "the paid result was dropped"
        assert j["state"] == "completed", j
        assert len(real_creates(mock, job_id)) == 1
        assert j["result"]["body"]["data"], j
        stop(gw)
        gw = None
    finally:
        if gw is not None and gw.proc.poll() is None:
            gw.proc.kill()
            gw.proc.wait()
        c.destroy()


def test_c9_cli_resolve_found_on_async_job_polls_it(gateway_factory, token, mock,
                                                    database_url):
    """Item 9. Before: `idemgate jobs resolve ID found --remote-id R` completed an async job with
    no outputs (the API made it accepted and polled it; the CLI did not). After: accepted, then
    polled to its result."""
    e, route = async_entry("keyed-async", mock, "generations", timeouts=HANG,
                           reconcile={"strategy": "none", "window_seconds": 2})
    gw = gateway_factory(providers=[e], env=SECRETS)
    script(mock, [{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x", "_mock": {"polls": 2}}, route=route)
    job_id = r.json()["id"]
    assert wait_job(gw, token, job_id, {"review"}, 20)["state"] == "review"
    [create] = real_creates(mock, job_id)
    cfg_path = gw.log_path[:-len(".log")] + ".json"
    res = subprocess.run([GATEWAY_BIN, "--config", cfg_path, "jobs", "resolve", job_id, "found",
                          "--remote-id", create["task_id"], "--operator", "audit"],
                         capture_output=True, text=True,
                         env=dict(os.environ, DATABASE_URL=database_url, **SECRETS))
    assert res.returncode == 0, res
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "completed" and j["result"] and j["result"].get("outputs"), \
        f"completed without its outputs: {j}"
    assert j["polls"] >= 1 and j["remote_id"] == create["task_id"], j


@pytest.mark.parametrize("case", ["over_16MiB_completes_whole", "over_profile_limit_not_completed"])
def test_c10_large_responses_are_stored_whole_or_not_completed(gateway_factory, token, mock,
                                                               case):
    """Item 10. Before: a response over a fixed 16 MiB was truncated and the job ended unknown
    (review); a profile could not set its own limit. After: max_response_bytes (default 256 MiB)
    decides; a result under it is stored whole, one over it is never completed."""
    require_control(mock, "pad_bytes", 1)
    if case == "over_16MiB_completes_whole":
        pad = 17 * 1024 * 1024
        gw = gateway_factory(providers=[provider(
            "c10", mock.url, timeouts={"connect_ms": 1000, "total_ms": 5000},
            reconcile={"strategy": "none", "window_seconds": 2})])
    else:
        pad = 2 * 1024 * 1024
        gw = gateway_factory(providers=[provider(
            "c10", mock.url, timeouts={"connect_ms": 1000, "total_ms": 5000},
            max_response_bytes=1024 * 1024, reconcile={"strategy": "none", "window_seconds": 2})])
    r = gw.submit(token, key(), {"prompt": "x", "_mock": {"pad_bytes": pad}},
                  route="c10/images/generations")
    assert r.status == 202, f"mock or gateway refused pad_bytes: {r}"
    job_id = r.json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 30)
    assert len(real_creates(mock, job_id)) == 1
    if case == "over_16MiB_completes_whole":
        assert j["state"] == "completed", \
            f"a {pad}-byte result was not stored whole: {j['state']}: {j['last_error']}"
        assert len(j["result"]["body"]["pad"]) == pad
    else:
        assert j["state"] == "review", \
            f"a result over max_response_bytes was taken: {j['state']}: {j['last_error']}"
        # The provider answered the create 200: its task exists, though its answer was not
        # read. Before, nothing on the job said so, and a tenant's `absent` sent it again.
        r = resolve(gw, token, job_id, {"outcome": "absent"})
        assert r.status == 409 and problem_type(r) == "urn:idemgate:problem:task-known", r
        assert "create answered HTTP 200" in r.json()["detail"], r.json()
        time.sleep(0.5)
        assert len(real_creates(mock, job_id)) == 1, "absent sent the create again"


def test_c11_numeric_async_id_is_read_exactly(gateway_factory, token, mock):
    """Item 11, numeric ids. The provider's task id is a JSON integer above 2^53. Before: read
    through a double and printed with %.0f, so polls went to another task. After: the integer
    token's digits are the id."""
    e, route = async_entry("keyed-async", mock, "generations")
    gw = gateway_factory(providers=[e], env=SECRETS)
    # The mock numbers tasks 2^53 + 1 + n; the next one must not be a double (an odd id).
    for _ in range(3):
        probe = mock.http.request("POST", "/v1/keyed/generations", json.dumps(
            {"prompt": "probe", "_mock": {"id_numeric": True, "polls": 2}}))
        assert probe.status == 202, f"mock lacks id_numeric: {probe}"
        nxt = probe.json()["id"] + 1
        assert isinstance(nxt, int) and nxt > 2 ** 53
        if float(nxt) != nxt:
            break
    assert float(nxt) != nxt
    r = gw.submit(token, key(), {"prompt": "x", "_mock": {"id_numeric": True, "polls": 1}},
                  route=route)
    job_id = r.json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 15, pred=lambda x: x["remote_id"] or
                 x["state"] in SETTLED)
    [create] = real_creates(mock, job_id)
    assert str(create["task_id"]) == str(nxt), create
    assert j["remote_id"] == str(nxt), f"the id was rounded: {j['remote_id']} != {nxt}"
    j = wait_job(gw, token, job_id, SETTLED, 15)
    assert j["state"] == "completed" and j["result"]["outputs"], j


def test_c11_async_found_without_an_id_is_review(gateway_factory, token, mock):
    """Item 11, no id. list_match finds our task at an async provider, but the profile gives no
    id path. Before: the job was `completed` with the task still queued (no outputs). After:
    review; never completed without its id."""
    e, route = async_entry(
        "openai-videos", mock, "videos", timeouts=HANG, client_ref={"header": "X-Client-Ref"},
        reconcile={"strategy": "list_match", "window_seconds": 30, "interval_ms": 200,
                   "list": {"path": "/v1/videos?since={since}&until={until}",
                            "items": "$.data[*]", "match": "$.metadata.client_ref",
                            "next_cursor": "$.next_cursor"}})
    gw = gateway_factory(providers=[e], env=SECRETS)
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route,
                       headers={"Prefer": "respond-async"}).json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] != "completed", f"completed with the task still queued: {j}"
    assert j["state"] == "review", j
    assert len(real_creates(mock, job_id)) == 1


# --- D. Isolation and integrity ------------------------------------------------------------------

def test_d13_large_integers_have_distinct_fingerprints(gateway, token, mock):
    """Item 13. Before: 9007199254740993 and 9007199254740992 canonicalised to one double, so
    the second body under the same key silently replayed the first. After: 422 on reuse; key
    order and whitespace still do not matter."""
    k = key()
    a = gateway.submit(token, k, '{"prompt":"x","seed":9007199254740993}')
    assert a.status == 202, a
    b = gateway.submit(token, k, '{"prompt":"x","seed":9007199254740992}')
    assert b.status == 422 and problem_type(b) == "urn:idemgate:problem:idempotency-key-reused", \
        f"a different seed replayed the first job: {b}"
    same = gateway.submit(token, k, '{ "seed" : 9007199254740993,\n "prompt":"x" }')
    assert same.status == 202 and same.json()["id"] == a.json()["id"], same
    other = gateway.submit(token, key(), '{"prompt":"x","seed":9007199254740992}')
    assert other.status == 202 and other.json()["id"] != a.json()["id"]
    ja = gateway.wait_state(token, a.json()["id"], {"completed"})
    jo = gateway.wait_state(token, other.json()["id"], {"completed"})
    [ca], [co] = real_creates(mock, ja["id"]), real_creates(mock, jo["id"])
    assert ca["body_sha256"] == hashlib.sha256(
        b'{"prompt":"x","seed":9007199254740993}').hexdigest()
    assert co["body_sha256"] == hashlib.sha256(
        b'{"prompt":"x","seed":9007199254740992}').hexdigest()


def test_d14_resolve_found_needs_proof_or_the_admin_token(gateway_factory, mock, database_url):
    """Item 14. Before: a tenant could resolve its job `found` with any remote_id, adopting
    another tenant's task on the shared account. After: 403 adoption-not-proven unless the task
    read by id carries this job's client reference; the admin token may adopt any id."""
    from conftest import tenant_token
    alice, bob = tenant_token(database_url), tenant_token(database_url)
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        "d14", mock.url, timeouts=HANG,
        reconcile={"strategy": "none", "window_seconds": 2, "task": TASK_READ, **FOUND})])
    route = "d14/images/generations"
    b = gw.submit(bob, key(), {"prompt": "bob's"}, route=route).json()["id"]
    assert wait_job(gw, bob, b, {"completed"}, 15)["state"] == "completed"
    [bob_create] = real_creates(mock, b)
    bob_task = bob_create["task_id"]
    script(mock, [{"fault": "hang"}, {"fault": "hang"}])
    a1 = gw.submit(alice, key(), {"prompt": "a1"}, route=route).json()["id"]
    a2 = gw.submit(alice, key(), {"prompt": "a2"}, route=route).json()["id"]
    for jid in (a1, a2):
        assert wait_job(gw, alice, jid, {"review"}, 20)["state"] == "review"
    stolen = resolve(gw, alice, a1, {"outcome": "found", "remote_id": bob_task})
    assert stolen.status == 403, f"adopted another tenant's task: {stolen}"
    assert problem_type(stolen) == "urn:idemgate:problem:adoption-not-proven", stolen
    assert gw.job(alice, a1).json()["state"] == "review"
    [own] = real_creates(mock, a1)
    # A proven adoption (the task read by id carries a1's reference) is applied; a synchronous
    # job may pass through unknown while the task's result is read by id, then completes.
    mine = resolve(gw, alice, a1, {"outcome": "found", "remote_id": own["task_id"]})
    assert mine.status == 200 and mine.json()["remote_id"] == own["task_id"], mine
    j = wait_job(gw, alice, a1, SETTLED, 15)
    assert j["state"] == "completed" and j["remote_id"] == own["task_id"], j
    admin = resolve(gw, ADMIN_TOKEN, a2, {"outcome": "found", "remote_id": bob_task,
                                          "operator": "ops"})
    assert admin.status == 200 and admin.json()["remote_id"] == bob_task, admin
    j = wait_job(gw, alice, a2, SETTLED, 15)
    assert j["state"] == "completed" and j["remote_id"] == bob_task, j
    assert len(real_creates(mock, a1)) == 1 and len(real_creates(mock, a2)) == 1


def test_d15_unsigned_webhooks_for_unknown_tasks_write_nothing(gateway_factory, token, mock,
                                                              psql):
    """Item 15. Luma's webhooks are unsigned (verify none). Before: every delivery wrote a
    webhook_events row and parked a hint, for any task id anyone made up. After: 200 with
    nothing written unless the id belongs to an operation of that provider."""
    e, route = async_entry("luma", mock, "generations")
    gw = gateway_factory(providers=[e], env=SECRETS)
    tag = "ghost-" + uuid.uuid4().hex[:8]
    for i in range(20):
        body = json.dumps({"id": f"{tag}-{i}", "state": "completed"})
        r = gw.http.request("POST", "/v1/webhooks/luma", body,
                            {"Content-Type": "application/json"})
        assert r.status == 200, r
    rows = psql(f"SELECT (SELECT count(*) FROM webhook_events WHERE remote_id LIKE '{tag}-%'), "
                f"(SELECT count(*) FROM webhook_parked WHERE remote_id LIKE '{tag}-%')")
    assert rows == [["0", "0"]], f"unsigned deliveries for unknown tasks wrote rows: {rows}"
    # A delivery naming our own task is still a hint.
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"polls": 100000}},
                       route=route).json()["id"]
    remote = wait_job(gw, token, job_id, {"accepted"}, 15)["remote_id"]
    r = gw.http.request("POST", "/v1/webhooks/luma",
                        json.dumps({"id": remote, "state": "dreaming"}),
                        {"Content-Type": "application/json"})
    assert r.status == 200, r


def referenced_webhooks(gateway_factory, mock, timeouts=HANG, reconcile=None, env=None,
                        provider_name=None, **over):
    """A gateway with keyed-async whose signed webhooks carry our reference in metadata, and
    which cannot reconcile otherwise (strategy none): (gateway, route). over: more members of
    the provider's entry; env: more environment; provider_name: the provider's own name."""
    hook = dict(profile("keyed-async")["webhook"], client_ref="$.metadata.client_ref")
    e, route = async_entry("keyed-async", mock, "generations", timeouts=timeouts, webhook=hook,
                           reconcile=reconcile or {"strategy": "none", "window_seconds": 120},
                           **over)
    if provider_name:
        e["name"], route = provider_name, f"{provider_name}/generations"
    port = free_port()
    return gateway_factory(providers=[e], env=dict(SECRETS, **(env or {})),
                           listen=f"127.0.0.1:{port}", public_url=f"http://127.0.0.1:{port}"), route


def send_task_webhook(mock, job_id):
    """The provider's signed webhook, succeeded, for the one task the job's create made (it
    carries our reference in metadata): that create's ledger entry."""
    [create] = real_creates(mock, job_id)
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    return create


def test_d16_late_webhook_rescues_unknown_job_by_client_ref(gateway_factory, token, mock):
    """Item 16. The create's answer is lost (unknown, no remote id); later the provider's signed
    webhook names the task and carries our reference in metadata. Before: webhooks matched by
    remote id only, so the job stayed unknown. After: the task is read by id, carries the
    reference, is adopted and polled to completion."""
    gw, route = referenced_webhooks(gateway_factory, mock)
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    assert wait_job(gw, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    [create] = real_creates(mock, job_id)
    task = mock.http.request("GET", f"/v1/keyed/generations/{create['task_id']}").json()
    assert task.get("metadata", {}).get("client_ref") == job_id, f"mock lacks metadata: {task}"
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    j = wait_job(gw, token, job_id, SETTLED, 10)
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], \
        f"a verified webhook naming our reference did not rescue the job: {j}"
    assert len(real_creates(mock, job_id)) == 1


def test_a_webhook_that_comes_while_the_create_is_in_flight_rescues_it(gateway_factory, token,
                                                                       mock):
    """As d16, but the signed webhook comes while the create is still in flight (`sending`),
    and the create's answer is then lost. Before: the hint was parked under the task's id, which
    the row never got; the provider does not deliver that event again, and the job (reconcile
    `none`) waited out its window for review. Now the hint is kept on the row and read once it is
    unknown."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    timeouts={"connect_ms": 1000, "total_ms": 3000})
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    deadline = time.monotonic() + 10
    while not real_creates(mock, job_id):
        assert time.monotonic() < deadline, "the create never reached the provider"
        time.sleep(0.02)
    [create] = real_creates(mock, job_id)
    assert gw.job(token, job_id).json()["state"] == "sending"
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], \
        f"a verified webhook that came during the create did not rescue the job: {j}"
    assert len(real_creates(mock, job_id)) == 1


@pytest.mark.parametrize("status", [429, 400])
def test_a_create_refused_after_its_task_was_made_in_flight_is_never_sent_again(
        gateway_factory, token, mock, status):
    """The provider makes the task, its signed webhook names it while the create is in flight,
    then the create is answered 429 (a back-off: would be sent again) or 400 (a refusal: would
    be failed at cost 0) — a gateway or CDN in front of the provider answering after the origin
    took the work. The provider here has no idempotency key, so a second send is a second paid
    task. The webhook is the proof a task exists: the job ends unknown (FINISH_HINTED), is
    reconciled by the hint, polled to its result, and the provider sees one create."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    timeouts={"connect_ms": 1000, "total_ms": 5000},
                                    idempotency={}, retry=FAST_RETRY)
    script(mock, [{"status": status, "task_made": True, "delay_ms": 1500, "retry_after": "0"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    deadline = time.monotonic() + 10
    while not real_creates(mock, job_id):
        assert time.monotonic() < deadline, "the create never reached the provider"
        time.sleep(0.02)
    [create] = real_creates(mock, job_id)
    assert create.get("idempotency_key") is None, create
    assert gw.job(token, job_id).json()["state"] == "sending"
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], j
    time.sleep(1)  # a resend, had the back-off made the job prepared, comes within its retry
    assert len(real_creates(mock, job_id)) == 1, real_creates(mock, job_id)


def test_a_create_refused_after_its_task_was_made_then_named_is_never_sent_again(
        gateway_factory, token, mock, psql):
    """As above, but the signed webhook comes after the answer, as webhooks usually do: the 429
    made the job `prepared`, to be sent again after its Retry-After. Before: the webhook found no
    row to rescue (only `unknown` and `sending` rows were) and was parked under a task id no job
    holds; the back-off then sent the create again — a second paid task. Now a verified webhook
    naming a job that was sent and waits to be sent again makes it `unknown`, reconciled by the
    hint: one create, the task's result."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    timeouts={"connect_ms": 1000, "total_ms": 5000},
                                    idempotency={}, retry=FAST_RETRY)
    script(mock, [{"status": 429, "task_made": True, "retry_after": "5"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    deadline = time.monotonic() + 10
    while psql(f"SELECT state FROM operations WHERE id = '{job_id}'") != [["prepared"]] \
            or not real_creates(mock, job_id):
        assert time.monotonic() < deadline, "the 429 never made the job prepared"
        time.sleep(0.02)
    [create] = real_creates(mock, job_id)
    assert create.get("idempotency_key") is None, create
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], j
    time.sleep(5)  # past the Retry-After (counted from before the job was seen prepared)
    assert len(real_creates(mock, job_id)) == 1, real_creates(mock, job_id)


def test_a_task_named_after_its_job_failed_is_said(gateway_factory, token, mock, psql):
    """A create answered 400 although the provider made its task (a proxy's refusal after the
    origin accepted): the job is `failed` — a refusal proves no task, and a terminal state never
    changes. The provider's signed webhook then names the task by our reference. Before: parked
    under a task id no job would ever hold, answered 200 — the only proof of a paid task dropped.
    Now it is said — logged with the job and the task, counted (an alert) — and the job's row is
    not written: it stays failed. Said again by each delivery of the event: the first's answer
    can be lost after its commit (the provider then delivers again, a duplicate), and with it
    the only saying (before, a duplicate said nothing)."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    timeouts={"connect_ms": 1000, "total_ms": 5000},
                                    idempotency={}, retry=FAST_RETRY)
    script(mock, [{"status": 400, "task_made": True}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "failed", j
    [create] = real_creates(mock, job_id)
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": create["task_id"], "status": "succeeded", "duplicates": 1})).json()
    assert sent["statuses"] == [200, 200], sent
    deadline = time.monotonic() + 10
    while '"task_after_failure"' not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    line = [x for x in gw.log().splitlines() if '"task_after_failure"' in x][0]
    assert job_id in line and create["task_id"] in line, line
    assert psql(f"SELECT state, coalesce(webhook_hint, '') FROM operations "
                f"WHERE id = '{job_id}'") == [["failed", ""]]
    assert psql(f"SELECT count(*) FROM webhook_parked WHERE remote_id = '{create['task_id']}'") \
        == [["0"]]
    m = re.search(rb"^idemgate_tasks_after_failure_total (\d+)$",
                  gw.http.request("GET", "/metrics").body, re.M)
    assert m and int(m.group(1)) == 2, m
    time.sleep(0.5)
    assert wait_job(gw, token, job_id, SETTLED, 5)["state"] == "failed"
    assert len(real_creates(mock, job_id)) == 1


def test_a_webhook_during_a_lookup_is_never_erased_by_its_verdict(gateway_factory, token, mock,
                                                                  psql):
    """A create times out (unknown); the reconciler's lookup by our reference is out — slow, and
    behind the provider's own events, so it will answer 404 — when the provider's signed webhook
    names the task. Before: the lookup's verdict was written over the hint the webhook had just
    stored (every reconcile write cleared it): `absent` made the job `prepared`, `not_yet` left it
    to a later lookup that proved it absent, and the create was sent a second time (the provider
    has no idempotency key here). Now the webhook takes the row from the reconciler (its lease
    ends, its token moves on): the verdict's write is fenced, the hint is read, the task adopted;
    one create."""
    # The provider's search is behind its events: here it never finds the task (the lookup asks
    # for a reference no create carried), while a read by the task's id does.
    rec = {"strategy": "get_by_client_id", "window_seconds": 120, "interval_ms": 200,
           "absent_grace_ms": 500, "lookup": {"path": "/v1/keyed/by-ref/behind-{client_ref}",
                                              "id": "$.id", "client_ref": "$.client_ref",
                                              "absent": {"path": "$.error.code",
                                                         "equals": "not_found"}}}
    gw, route = referenced_webhooks(gateway_factory, mock, idempotency={}, reconcile=rec,
                                    client_ref={"header": "X-Client-Ref"},
                                    timeouts={"connect_ms": 1000, "total_ms": 6000})
    # Every lookup takes 3 s (inside the 6 s timeout): the webhook comes while one is out.
    assert mock.http.request("POST", "/_config",
                             json.dumps({"lookup_delay_ms": 3000})).status == 200
    try:
        script(mock, [{"fault": "hang"}])
        job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
        assert wait_job(gw, token, job_id, {"unknown"}, 20)["state"] == "unknown"
        [create] = real_creates(mock, job_id)
        assert create.get("idempotency_key") is None, create
        leased = (f"SELECT count(*) FROM operations WHERE id = '{job_id}' AND state = 'unknown' "
                  "AND lease_owner IS NOT NULL AND lease_expires_at > now()")
        deadline = time.monotonic() + 15
        while psql(leased) != [["1"]]:
            assert time.monotonic() < deadline, "no reconciler took the job"
            time.sleep(0.02)
        sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
            {"task_id": create["task_id"], "status": "succeeded"})).json()
        assert sent["statuses"] == [200], sent
        j = wait_job(gw, token, job_id, SETTLED, 30)
    finally:
        mock.http.request("POST", "/_config", json.dumps({"lookup_delay_ms": 0}))
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], (j, psql(
        f"SELECT kind, outcome, decision, error FROM attempts WHERE operation_id = '{job_id}'"))
    assert len(real_creates(mock, job_id)) == 1, real_creates(mock, job_id)
    # The lookup that was out when the webhook came answers later: its verdict is fenced.
    fenced = (f"SELECT count(*) FROM attempts WHERE operation_id = '{job_id}' "
              "AND kind = 'reconcile' AND decision = 'fenced'")
    deadline = time.monotonic() + 15
    while psql(fenced) == [["0"]]:
        assert time.monotonic() < deadline, ("the lookup's verdict was never written", psql(
            f"SELECT kind, outcome, decision FROM attempts WHERE operation_id = '{job_id}'"))
        time.sleep(0.1)
    assert gw.job(token, job_id).json()["state"] == "completed"
    assert len(real_creates(mock, job_id)) == 1, real_creates(mock, job_id)


@pytest.mark.parametrize("crash", [False, True], ids=["kept", "killed-after-the-verdict"])
def test_a_webhook_hint_whose_task_read_fails_is_kept(gateway_factory, token, mock, psql, crash):
    """The reconciler reads the task a signed webhook named, and the read fails (here it times
    out: the provider holds its status answers). That says nothing of the task: the hint is
    kept for the next look. Before, the verdict's write cleared it ("not ours"), and the
    provider never delivers that event again: a job whose profile cannot reconcile otherwise
    lost its only proof of a paid task. `killed-after-the-verdict`: the replica dies just after
    the verdict's write — the hint was put back by a second statement, and a death between the
    two lost it; the verdict's own write keeps it now."""
    # (The replica that dies has a provider of its own: its reconciler takes no other test's
    # hinted job, which would kill it before this test's webhook.)
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    reconcile={"strategy": "none", "window_seconds": 120,
                                               "interval_ms": 500},
                                    env={"IDEMGATE_CRASH": "before_keep_hint"} if crash else None,
                                    provider_name="keyedkill" + uuid.uuid4().hex[:6] if crash
                                    else None)
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"poll_delay_ms": 5000}},
                       route=route).json()["id"]
    assert wait_job(gw, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    create = send_task_webhook(mock, job_id)
    unread = (f"SELECT count(*) FROM attempts WHERE operation_id = '{job_id}' "
              "AND outcome IN ('hint_unread', 'hint_unproven')")
    deadline = time.monotonic() + 20
    while psql(unread) == [["0"]]:
        assert time.monotonic() < deadline, "the hinted task was never read"
        time.sleep(0.1)
    row = psql(f"SELECT state, webhook_hint FROM operations WHERE id = '{job_id}'")
    assert row == [["unknown", create["task_id"]]], row
    assert len(real_creates(mock, job_id)) == 1


def test_a_signed_webhook_for_a_task_the_profile_cannot_read_restarts_the_absent_grace(
        gateway_factory, token, mock, psql):
    """A synchronous profile that cannot read a task by its id (no `reconcile.task`), whose
    strategy can still settle the job (here a resend under the provider's key; a lookup or a
    list the same way). The create's answer is lost (unknown); the provider's signed webhook then
    names the task by our reference. The hint is dropped for the strategy — and the job is now
    ambiguous as of the webhook: a lookup or list that lags the provider's own webhook counts its
    absent grace from there. Before, the grace counted from the first send, long past, and a
    search that did not show the task yet proved it absent: sent again, a second paid task."""
    hook = dict(profile("keyed-async")["webhook"], client_ref="$.metadata.client_ref")
    name = "syncref" + uuid.uuid4().hex[:6]
    e = provider(name, mock.url, path="/v1/keyed/generations", route="generations",
                 timeouts=HANG, webhook=hook, idempotency={"header": "Idempotency-Key"},
                 outputs={}, reconcile={"strategy": "idempotent_resubmit", "window_seconds": 120,
                                        "interval_ms": 60000})
    port = free_port()
    gw = gateway_factory(providers=[e], env=dict(SECRETS), listen=f"127.0.0.1:{port}",
                         public_url=f"http://127.0.0.1:{port}")
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=f"{name}/generations").json()["id"]
    assert wait_job(gw, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    before = psql(f"SELECT ambiguous_at FROM operations WHERE id = '{job_id}'")[0][0]
    send_task_webhook(mock, job_id)
    unproven = (f"SELECT count(*) FROM attempts WHERE operation_id = '{job_id}' "
                "AND outcome = 'signed_task_unread'")
    deadline = time.monotonic() + 20
    while psql(unproven) == [["0"]]:
        assert time.monotonic() < deadline, psql(
            f"SELECT kind, outcome, decision, error FROM attempts WHERE operation_id = '{job_id}'")
        time.sleep(0.1)
    row = psql(f"SELECT state, webhook_hint IS NULL, ambiguous_at > '{before}'::timestamptz "
               f"FROM operations WHERE id = '{job_id}'")
    assert row == [["unknown", "t", "t"]], (row, before)
    # Should the search not settle it before its window closes (the job in review, written
    # here as the reconciler would), the verdict is the proof of the task: `absent` is refused.
    # Before, nothing on the job said a task was signed for, and `absent` sent it again.
    psql(f"UPDATE operations SET state = 'review', lease_version = lease_version + 1 "
         f"WHERE id = '{job_id}' AND state = 'unknown'")
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 409 and problem_type(r) == "urn:idemgate:problem:task-known", r
    time.sleep(0.5)
    assert len(real_creates(mock, job_id)) == 1


def test_a_task_of_an_abandoned_job_is_said_when_its_webhook_comes(gateway_factory, token, mock):
    """A job in review after its poll deadline (its task known, still running) is resolved
    `abandon`: failed, its task linked. The provider's signed webhook then says the task
    succeeded (paid). Before, it was answered 200 and nothing said (the task linked: nothing
    parked, no state a hint moves). Now it is said, like a task named after its job failed:
    logged with the job and the task, counted."""
    poll = dict(profile("keyed-async")["poll"], interval_ms=50, max_interval_ms=200,
                deadline_seconds=1)
    gw, route = referenced_webhooks(gateway_factory, mock, poll=poll)
    # A task the provider failed, read by the poller first: its own `failed` webhook after it
    # is no news (no alert for every ordinary failure).
    failing = gw.submit(token, key(), {"prompt": "f", "_mock": {"polls": 1, "outcome": "failed"}},
                        route=route).json()["id"]
    f = wait_job(gw, token, failing, {"review", "completed", "failed"}, 20)
    assert f["state"] == "failed" and f["remote_id"], f
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": f["remote_id"], "status": "failed", "duplicates": 0})).json()
    assert sent["statuses"] == [200], sent
    assert '"task_after_failure"' not in gw.log()
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"polls": 100000}},
                       route=route).json()["id"]
    j = wait_job(gw, token, job_id, {"review", "completed", "failed"}, 20)
    assert j["state"] == "review" and j["remote_id"], j
    r = resolve(gw, token, job_id, {"outcome": "abandon"})
    assert r.status == 200 and r.json()["state"] == "failed", r
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": j["remote_id"], "status": "succeeded", "duplicates": 0})).json()
    assert sent["statuses"] == [200], sent
    deadline = time.monotonic() + 10
    while '"task_after_failure"' not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    line = [x for x in gw.log().splitlines() if '"task_after_failure"' in x][0]
    assert job_id in line and j["remote_id"] in line, line
    assert wait_job(gw, token, job_id, SETTLED, 5)["state"] == "failed"


def test_a_late_webhook_rescues_a_job_in_review(gateway_factory, token, mock):
    """As d16, but the webhook comes after the job's recovery window sent it to review (no
    remote id: the create's answer was lost). Before, the event was parked under a task id the
    row never got and answered 200 (the provider does not deliver it again): the job stayed in
    review, and an operator's `absent` paid a second task. Now the job is unknown again with the
    hint, its task read, proven ours and adopted."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    reconcile={"strategy": "none", "window_seconds": 2,
                                               "interval_ms": 300})
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    j = wait_job(gw, token, job_id, {"review"}, 20)
    assert j["state"] == "review" and not j.get("remote_id"), j
    create = send_task_webhook(mock, job_id)
    j = wait_job(gw, token, job_id, {"completed", "failed"}, 20)
    assert j["state"] == "completed" and j["remote_id"] == create["task_id"], \
        f"a verified webhook naming our reference did not rescue the job in review: {j}"
    assert len(real_creates(mock, job_id)) == 1


def test_absent_is_refused_while_a_webhooks_task_is_unread(gateway_factory, token, mock, psql):
    """A verified webhook named the job's task and the reconciler could not read it (the
    provider holds its status answers): the hint is kept on the row, the job's only proof of a
    paid task, and the job reaches review at the end of its window with it. Before, an `absent`
    cleared the hint and sent the create again — a second paid task. Now it is refused (409
    task-known, naming the task) unless the admin forces it; `found` with that id is the way."""
    gw, route = referenced_webhooks(gateway_factory, mock,
                                    reconcile={"strategy": "none", "window_seconds": 4,
                                               "interval_ms": 300})
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"poll_delay_ms": 60000}},
                       route=route).json()["id"]
    assert wait_job(gw, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    create = send_task_webhook(mock, job_id)
    j = wait_job(gw, token, job_id, {"review", "completed", "failed"}, 30)
    assert j["state"] == "review", j
    row = psql(f"SELECT webhook_hint, remote_id FROM operations WHERE id = '{job_id}'")
    assert row == [[create["task_id"], ""]], row
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 409 and problem_type(r) == "urn:idemgate:problem:task-known", r
    assert create["task_id"] in r.json()["detail"], r.json()
    time.sleep(1)
    assert gw.job(token, job_id).json()["state"] == "review"
    assert len(real_creates(mock, job_id)) == 1, "absent sent the create again"


@pytest.mark.parametrize("strategy", ["none", "idempotent_resubmit"])
def test_a_hint_a_profile_cannot_read_by_id_is_kept_and_absent_refused(gateway_factory, token,
                                                                      mock, psql, strategy):
    """A synchronous profile whose signed webhooks carry our reference, with no way to read a
    task by its id: the create's answer is lost (unknown), the provider's webhook names the
    job's task (kept as the hint; its event is deduped, never delivered again). Before, the
    reconciler, unable to read it, wrote it "unproven" and cleared the hint; the job reached
    review with nothing on it, and an `absent` sent the create again — a second paid task. Now
    the hint is kept and the job goes to review at once; `absent` is refused (409 task-known).
    With a strategy that can search (idempotent_resubmit: a lookup or a list the same way), the
    webhook comes after the recovery window closed (the job in review, taken back to unknown by
    it): no search runs any more. Before, the hint was dropped "for the strategy" all the same,
    and `absent` sent the create again; now it is kept as with strategy none."""
    reconcile = ({"strategy": "none", "window_seconds": 3, "interval_ms": 300}
                 if strategy == "none" else
                 {"strategy": strategy, "window_seconds": 1, "interval_ms": 300})
    gw, route = referenced_webhooks(gateway_factory, mock, mode="sync", reconcile=reconcile,
                                    idempotency={"header": "Idempotency-Key"})
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route=route).json()["id"]
    waited = {"unknown"} if strategy == "none" else {"review"}
    assert wait_job(gw, token, job_id, waited, 15)["state"] in waited
    create = send_task_webhook(mock, job_id)
    j = wait_job(gw, token, job_id, {"review", "completed", "failed"}, 20)
    assert j["state"] == "review", j
    row = psql(f"SELECT webhook_hint, coalesce(remote_id, '') FROM operations "
               f"WHERE id = '{job_id}'")
    assert row == [[create["task_id"], ""]], f"the only proof of the task was dropped: {row}"
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 409 and problem_type(r) == "urn:idemgate:problem:task-known", r
    time.sleep(1)
    assert len(real_creates(mock, job_id)) == 1, "absent sent the create again"


def test_a_resolve_is_written_only_under_the_token_it_read(gateway_factory, token, mock, psql):
    """A resolve reads the job in review, decides, then writes. Meanwhile the job may leave
    review and come back (a verified webhook's rescue takes it to unknown with the task it
    named, the reconciler cannot read it and writes review again, the hint kept): a decision
    made on the first read — an `absent` without the hint — would clear the hint and send the
    create again. The write names the fencing token read (migration 0035): under another one it
    is not applied."""
    gw = gateway_factory(providers=[provider(
        "rtok", mock.url, timeouts=HANG, reconcile={"strategy": "none", "window_seconds": 2,
                                                    "interval_ms": 300})])
    script(mock, [{"fault": "hang"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="rtok/images/generations").json()["id"]
    assert wait_job(gw, token, job_id, {"review"}, 20)["state"] == "review"
    [[tenant, version]] = psql(f"SELECT tenant_id, lease_version FROM operations "
                               f"WHERE id = '{job_id}'")
    call = ("SELECT idemgate_resolve({t}, '{j}', 'abandon', 'failed', 'op', NULL, 't', {v})")
    assert psql(call.format(t=tenant, j=job_id, v=int(version) - 1)) == [["0"]]
    assert psql(f"SELECT state FROM operations WHERE id = '{job_id}'") == [["review"]]
    assert psql(call.format(t=tenant, j=job_id, v=version)) == [["1"]]
    assert psql(f"SELECT state FROM operations WHERE id = '{job_id}'") == [["failed"]]
    assert len(real_creates(mock, job_id)) == 1


def test_d17_long_bearer_credentials_are_sent_whole(gateway_factory, token, mock):
    """Item 17. Before: the Authorization header was built in 1 KB buffers, so a 2 KB provider
    token was cut (401 at a real provider, tripping it for everyone). After: sent whole."""
    secret = "sk-" + "A" * 2045
    gw = gateway_factory(env={"MOCK_IMAGES_API_KEY": secret})
    r = gw.submit(token, key(), {"prompt": "x"}, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    [create] = real_creates(mock, r.headers["x-idemgate-job-id"])
    assert "auth_sha256" in create, f"mock lacks auth_sha256: {create}"
    assert create["auth_sha256"] == hashlib.sha256(("Bearer " + secret).encode()).hexdigest(), \
        "the provider credential was not sent whole"


def test_d18_trip_statuses_are_the_profiles_to_say(gateway_factory, mock, database_url):
    """Item 18. A provider that answers 403 for one request's content. Before: one 403 tripped
    the credential for every tenant. After: auth.trip_statuses (here 401, 402) decide; the 403
    fails that job only and others go on."""
    from conftest import tenant_token
    t1, t2 = tenant_token(database_url), tenant_token(database_url)
    gw = gateway_factory(providers=[provider(
        "d18", mock.url, retry=FAST_RETRY,
        auth={"header": "Authorization", "prefix": "Bearer ", "secret_env": "MOCK_IMAGES_API_KEY",
              "trip_statuses": [401, 402]})])
    route = "d18/images/generations"
    script(mock, [{"status": 403}])
    j1 = gw.submit(t1, key(), {"prompt": "content the provider refuses"}, route=route).json()
    j1 = wait_job(gw, t1, j1["id"], SETTLED, 15)
    assert j1["state"] == "failed" and j1["result"]["status"] == 403, j1
    tripped = [t["provider"] for t in gw.http.request("GET", "/readyz").json()["tripped_providers"]]
    assert "d18" not in tripped, "a 403 outside trip_statuses tripped the provider"
    j2 = gw.submit(t2, key(), {"prompt": "fine"}, route=route).json()
    j2 = wait_job(gw, t2, j2["id"], SETTLED, 15)
    assert j2["state"] == "completed", j2
