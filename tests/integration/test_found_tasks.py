"""Issue 21 items 1 and 2: a task found by reconciliation is the truth, whatever the client asked
meanwhile, and its result is read where the profile says. Each test failed on the code before
the fix, for the reason its docstring gives."""

import hashlib
import json
import os
import time
import uuid

from conftest import ROOT, provider

PROFILES = os.path.join(ROOT, "deploy", "providers")
HANG = {"connect_ms": 1000, "total_ms": 1000}
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
SECRETS = {"OPENAI_API_KEY": "sk-o", "RUNWAYML_API_SECRET": "rw-x"}
LOOKUP = {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id", "client_ref": "$.client_ref",
          "absent": {"path": "$.error.code", "equals": "not_found"}}
SETTLED = {"completed", "failed", "review", "canceled"}


def key():
    return "found-" + uuid.uuid4().hex


def wait_job(gw, token, job_id, states, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        r = gw.job(token, job_id)
        j = r.json() if r.status == 200 else None
        if (j and j["state"] in states) or time.monotonic() > deadline:
            return j
        time.sleep(0.05)


def cancel(gw, token, job_id):
    return gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "",
                           {"Authorization": f"Bearer {token}"})


def real_creates(mock, job_id):
    return [e for e in mock.ledger() if e["client_ref"] == job_id and not e.get("replay")]


def lookup_entry(name, **reconcile):
    rec = {"strategy": "get_by_client_id", "window_seconds": 30, "interval_ms": 200,
           "absent_grace_ms": 1000, "lookup": LOOKUP}
    rec.update(reconcile)
    return lambda mock: provider(name, mock.url, timeouts=HANG,
                                 client_ref={"header": "X-Client-Ref"}, reconcile=rec)


def shipped(name, mock, **over):
    with open(os.path.join(PROFILES, name + ".json")) as f:
        poll = dict(json.load(f)["poll"], interval_ms=50, max_interval_ms=200)
    e = {"name": name.replace("-", "") + uuid.uuid4().hex[:4],
         "profile": os.path.join(PROFILES, name + ".json"), "base_url": mock.url, "poll": poll,
         "timeouts": {"connect_ms": 1000, "total_ms": 5000}}
    e.update(over)
    return e


def unknown_then_cancelled(gateway_factory, token, mock, entry, route, body):
    """A create that hangs after the provider made its task (unknown), cancelled by the client
    while nobody reconciles it; then a replica that reconciles. Returns (that replica, job id)."""
    gw1 = gateway_factory(providers=[entry], reconcile_workers=0, env=SECRETS)
    mock.script([{"fault": "hang"}])
    # respond-async: a shipped OpenAI profile waits by default (for SDKs); this is the job.
    job_id = gw1.submit(token, key(), body, route=route,
                        headers={"Prefer": "respond-async"}).json()["id"]
    assert wait_job(gw1, token, job_id, {"unknown"}, 15)["state"] == "unknown"
    c = cancel(gw1, token, job_id)
    assert c.status == 202 and c.json().get("cancel_requested_at"), c
    gw1.proc.terminate()
    assert gw1.proc.wait(15) == 0
    return gateway_factory(providers=[entry], env=SECRETS), job_id


def test_item1_cancel_then_found_finished_is_completed_with_outputs_and_cost(
        gateway_factory, token, mock, psql):
    """Before: the lookup found the finished (paid) task, recon_found_state ended the job
    `failed`: cost 0, outputs never recorded nor archived. After: completed with its output,
    its cost, archived like a dispatched job, and it says the cancel came too late."""
    entry = lookup_entry("f1", found_result="$.result")(mock)
    entry["pricing"] = {"currency": "USD", "per_output": 40000}
    entry["archive"] = {"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True}
    gw, job_id = unknown_then_cancelled(gateway_factory, token, mock, entry,
                                        "f1/images/generations", {"prompt": "x", "n": 1})
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "completed", j
    assert "cancel came too late" in j["last_error"], j
    assert len(real_creates(mock, job_id)) == 1
    row = psql(f"SELECT outputs_received, cost_micros FROM operations WHERE id = '{job_id}'")
    assert row == [["1", "40000"]], row
    deadline = time.monotonic() + 20
    while psql(f"SELECT state FROM archive_outputs WHERE op_id = '{job_id}'") != [["archived"]]:
        assert time.monotonic() < deadline, psql(
            f"SELECT state, last_error FROM archive_outputs WHERE op_id = '{job_id}'")
        time.sleep(0.1)


def test_item1_found_running_after_cancel_is_cancelled_there_and_canceled(
        gateway_factory, token, mock):
    """The async case, through an operator's `found`: the create hung (review), the client
    cancelled, the operator names the task, which still runs. Before: the poller sent the
    provider's cancel and the job ended `failed` (invariant 8: a failed job has no task). After:
    the provider's cancel is sent once and the job ends `canceled`, its remote id kept."""
    e = shipped("runway", mock, timeouts=HANG,
                reconcile={"strategy": "none", "window_seconds": 1})
    route = f"{e['name']}/image_to_video"
    gw = gateway_factory(providers=[e], env=SECRETS, admin_token_sha256=ADMIN_SHA)
    mock.script([{"fault": "hang"}])
    body = {"model": "gen4_turbo", "promptImage": "https://example.com/a.png", "duration": 5,
            "_mock": {"polls": 100000}}
    job_id = gw.submit(token, key(), body, route=route).json()["id"]
    assert wait_job(gw, token, job_id, {"review"}, 20)["state"] == "review"
    c = cancel(gw, token, job_id)
    assert c.status == 202, c
    [create] = real_creates(mock, job_id)
    r = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve",
                        json.dumps({"outcome": "found", "remote_id": create["task_id"],
                                    "operator": "ops"}),
                        {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status == 200, r
    j = wait_job(gw, token, job_id, SETTLED, 20)
    assert j["state"] == "canceled" and j["remote_id"] == create["task_id"], j
    task = mock.http.request("GET", f"/v1/tasks/{create['task_id']}",
                             headers={"X-Runway-Version": "2024-11-06",
                                      "Authorization": "Bearer rw-x"}).json()
    assert task["status"] == "CANCELLED", task
    assert len(real_creates(mock, job_id)) == 1


def test_item1_found_running_without_cancel_is_followed_to_its_end(gateway_factory, token,
                                                                   mock):
    """An async task found by list after the client cancelled, at a provider that cannot cancel
    (OpenAI videos). Before: `failed`, the paid video lost. After: it is followed to its end and
    completed with its output, saying the cancel came too late."""
    e = shipped("openai-videos", mock, timeouts=HANG, client_ref={"header": "X-Client-Ref"},
                reconcile={"strategy": "list_match", "window_seconds": 30, "interval_ms": 200,
                           "list": {"path": "/v1/videos?since={since}&until={until}",
                                    "items": "$.data[*]", "match": "$.metadata.client_ref",
                                    "id": "$.id", "next_cursor": "$.next_cursor"}})
    gw, job_id = unknown_then_cancelled(gateway_factory, token, mock, e,
                                        f"{e['name']}/videos",
                                        {"prompt": "x", "_mock": {"polls": 3}})
    j = wait_job(gw, token, job_id, SETTLED, 30)
    assert j["state"] == "completed", j
    assert "cancel came too late" in j["last_error"], j
    assert j["result"]["outputs"], j
    assert len(real_creates(mock, job_id)) == 1


def test_item2_found_task_shaped_unlike_its_create_keeps_its_outputs(gateway_factory, token,
                                                                      mock, psql):
    """The mock's lookup answers a task object whose `result` is the create's answer. Before:
    the whole task object was stored as the result: completed, 0 of 1 outputs received, nothing
    planned for archive. After: with reconcile.found_result the create-shaped result is stored,
    1 output received and archived; without it, the job is never written completed with fewer
    outputs than its result holds — it goes to review."""
    shaped = lookup_entry("f2", found_result="$.result")(mock)
    shaped["archive"] = {"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True}
    blind = lookup_entry("f2b")(mock)
    gw = gateway_factory(providers=[shaped, blind])
    mock.script([{"fault": "hang"}, {"fault": "hang"}])
    a = gw.submit(token, key(), {"prompt": "x", "n": 1}, route="f2/images/generations")
    b = gw.submit(token, key(), {"prompt": "y", "n": 1}, route="f2b/images/generations")
    ja = wait_job(gw, token, a.json()["id"], SETTLED, 20)
    jb = wait_job(gw, token, b.json()["id"], SETTLED, 20)
    assert ja["state"] == "completed" and len(ja["result"]["body"]["data"]) == 1, ja
    assert psql(f"SELECT outputs_requested, outputs_received FROM operations "
                f"WHERE id = '{ja['id']}'") == [["1", "1"]]
    deadline = time.monotonic() + 20
    while psql(f"SELECT state FROM archive_outputs WHERE op_id = '{ja['id']}'") != [["archived"]]:
        assert time.monotonic() < deadline, "the found task's output was never archived"
        time.sleep(0.1)
    assert jb["state"] == "review", jb
    assert "found_result" in jb["last_error"], jb
    for j in (ja, jb):
        assert len(real_creates(mock, j["id"])) == 1
