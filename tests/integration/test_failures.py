"""Failure semantics (issue 3): every outcome class, backoff, budgets, tripped credentials,
partial results, review and regeneration. Every test asserts on the mock's ledger: what the
provider actually received."""

import hashlib
import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from conftest import GATEWAY_BIN, MOCK_BIN, free_port, pg_proxy, provider, tenant_token, wait_for_line

FAST_RETRY = {"max_attempts": 50, "deadline_seconds": 120, "base_ms": 100, "cap_ms": 500}
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()


def key(prefix="f"):
    return f"{prefix}-{uuid.uuid4().hex}"


def real_creates(entries):
    return [e for e in entries if not e.get("replay")]


def test_connect_refused_is_resent_and_created_once(gateway_factory, token, tmp_path):
    port = free_port()  # nothing listens here yet: connect() is refused
    gw = gateway_factory(providers=[provider("late", f"http://127.0.0.1:{port}",
                                             retry=FAST_RETRY)])
    r = gw.submit(token, key(), {"prompt": "x"}, route="late/images/generations")
    job_id = r.json()["id"]
    deadline = time.monotonic() + 20
    while gw.job(token, job_id).json()["attempts"]["transport"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job = gw.job(token, job_id).json()
    assert job["state"] in ("prepared", "sending"), job
    assert "not sent" in (job["last_error"] or "") or job["state"] == "sending"

    proc = subprocess.Popen([MOCK_BIN, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_line(proc, "listening")
        done = gw.wait_state(token, job_id, {"completed"}, timeout=20)
        assert done["state"] == "completed", done
        import urllib.request
        ledger = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/_ledger"))["creates"]
        assert len([e for e in ledger if e["client_ref"] == job_id]) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)


def test_a_job_the_provider_never_answered_is_not_a_200(gateway_factory, token):
    """`Prefer: wait` on a terminal job without the provider's answer: `failed` is a 502
    `job-failed` (never a 200 an SDK would read as the provider's success), with the job's
    headers; the job document says the rest. (`canceled` is 409 `job-canceled`: a job is
    canceled only by the provider, whose answer is then stored.)"""
    port = free_port()  # nothing listens: every attempt refused at the connection
    gw = gateway_factory(providers=[
        provider("nowhere", f"http://127.0.0.1:{port}",
                 retry={"max_attempts": 2, "deadline_seconds": 60, "base_ms": 10, "cap_ms": 20}),
        provider("slowly", f"http://127.0.0.1:{port}",
                 retry={"max_attempts": 50, "deadline_seconds": 600, "base_ms": 20000,
                        "cap_ms": 30000})])
    k = key("never")
    r = gw.submit(token, k, {"prompt": "x"}, route="nowhere/images/generations",
                  headers={"Prefer": "wait=10"})
    assert r.status == 502, r
    p = r.json()
    assert p["type"] == "urn:idemgate:problem:job-failed" and "failed" in p["detail"], p
    assert r.headers["x-idemgate-state"] == "failed" and r.headers["x-idemgate-job-id"], r
    again = gw.submit(token, k, {"prompt": "x"}, route="nowhere/images/generations",
                      headers={"Prefer": "wait=10"})
    assert again.status == 502 and again.headers.get("idempotent-replayed") == "true", again
    # Cancelled while backing off after a refused connection: never sent again.
    k = key("cancelled")
    r = gw.submit(token, k, {"prompt": "x"}, route="slowly/images/generations")
    job_id = r.json()["id"]
    deadline = time.monotonic() + 20
    while gw.job(token, job_id).json()["attempts"]["transport"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    h = {"Authorization": f"Bearer {token}"}
    c = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h)
    assert c.status in (200, 202), c
    j = gw.wait_state(token, job_id, ("canceled", "failed"))
    assert j["state"] == "failed", j  # proven never created: failed, "canceled; not sent again"
    waited = gw.submit(token, k, {"prompt": "x"}, route="slowly/images/generations",
                       headers={"Prefer": "wait=5"})
    assert waited.status == 502 and "canceled" in waited.json()["detail"], waited
    assert waited.headers["x-idemgate-job-id"] == job_id, waited


def test_hang_without_keys_or_lookup_is_unknown_then_review_never_resent(gateway_factory, token,
                                                                        mock):
    gw = gateway_factory(providers=[provider(
        "nolookup", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 3})])
    r = gw.submit(token, key(), {"prompt": "x", "_mock": {"fault": "hang"}},
                  route="nolookup/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"unknown", "review"}, timeout=15)
    assert job["state"] == "unknown", job
    job = gw.wait_state(token, job_id, {"review"}, timeout=15)
    assert job["state"] == "review", job
    assert len(real_creates(mock.creates_for(job_id))) == 1
    listed = gw.http.request("GET", "/v1/jobs?state=review",
                             headers={"Authorization": f"Bearer {token}"}).json()["data"]
    assert job_id in [j["id"] for j in listed]


def test_close_after_request_is_unknown_with_no_hidden_resend(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider("closer", mock.url,
                                             reconcile={"strategy": "none",
                                                        "window_seconds": 600})])
    r = gw.submit(token, key(), {"prompt": "x", "_mock": {"fault": "close"}},
                  route="closer/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"unknown"}, timeout=15)
    assert job["state"] == "unknown", job
    time.sleep(1.0)
    assert len(mock.creates_for(job_id)) == 1


def kept_alive_pair(gw, token, mock, route, second):
    """A finished create, then `second` on the same route: the two jobs' ledger entries."""
    r = gw.submit(token, key(), {"prompt": "warm"}, route=route)
    first = gw.wait_state(token, r.json()["id"], {"completed"}, timeout=15)
    assert first["state"] == "completed", first
    r = gw.submit(token, key(), second, route=route)
    return first, r.json()["id"]


def test_a_kept_alive_connection_that_dies_is_never_sent_again_by_libcurl(gateway_factory, token,
                                                                          mock):
    # One call thread: the second create goes over the connection the first one left alive.
    # The provider reads it and closes without an answer. libcurl would send it again on a new
    # connection by itself (STYLE.md), and the provider would get it twice; the gateway refuses
    # that re-send: one create, and the job is unknown, as after any close.
    gw = gateway_factory(call_threads=1, providers=[provider(
        "kept", mock.url, reconcile={"strategy": "none", "window_seconds": 600})])
    first, job_id = kept_alive_pair(gw, token, mock, "kept/images/generations",
                                    {"prompt": "x", "_mock": {"fault": "close"}})
    job = gw.wait_state(token, job_id, {"unknown"}, timeout=15)
    assert job["state"] == "unknown", job
    time.sleep(1.0)
    entries = mock.creates_for(job_id)
    assert len(entries) == 1, entries
    assert entries[0]["remote_port"] == mock.creates_for(first["id"])[0]["remote_port"]


def test_keepalive_zero_gives_every_call_a_connection_of_its_own(gateway_factory, token, mock):
    gw = gateway_factory(call_threads=1, providers=[provider(
        "fresh", mock.url, timeouts={"connect_ms": 1000, "total_ms": 5000,
                                     "keepalive_seconds": 0})])
    first, job_id = kept_alive_pair(gw, token, mock, "fresh/images/generations", {"prompt": "y"})
    job = gw.wait_state(token, job_id, {"completed"}, timeout=15)
    assert job["state"] == "completed", job
    ports = [mock.creates_for(j)[0]["remote_port"] for j in (first["id"], job_id)]
    assert ports[0] != ports[1], ports


def test_an_answer_waiting_on_a_kept_alive_connection_is_never_read_as_the_next_one(
        gateway_factory, token, mock):
    # One call thread: the second create would go over the connection the first one left alive.
    # After answering the first, the provider writes a second answer nobody asked for (a 429)
    # onto that idle connection. libcurl 7.88 reuses it and reads the 429 as the second create's
    # answer: "not made", sent again, while the provider did get it — two creates; and every
    # later call on that connection reads the answer of the one before. The gateway sees the
    # bytes waiting before anything leaves and sends the create on a new connection instead.
    gw = gateway_factory(call_threads=1, providers=[provider(
        "kept", mock.url, retry=FAST_RETRY)])
    before = metric(gw, "idemgate_stale_connections_refused_total")
    r = gw.submit(token, key(), {"prompt": "warm", "_mock": {"fault": "stray"}},
                  route="kept/images/generations")
    first = gw.wait_state(token, r.json()["id"], {"completed"}, timeout=15)
    assert first["state"] == "completed", first
    time.sleep(0.5)  # the stray answer (100 ms after the first) is waiting on the connection
    r = gw.submit(token, key(), {"prompt": "second"}, route="kept/images/generations")
    job = gw.wait_state(token, r.json()["id"], {"completed"}, timeout=15)
    assert job["state"] == "completed", job
    time.sleep(0.5)
    entries = mock.creates_for(job["id"])
    assert len(entries) == 1, entries
    assert entries[0]["remote_port"] != mock.creates_for(first["id"])[0]["remote_port"]
    assert metric(gw, "idemgate_stale_connections_refused_total") == before + 1
    # One transport attempt, answered by its own 200 (the refused connection sent nothing).
    assert job["attempts"]["transport"] == 1, job
    assert entries[0]["status"] == 200, entries


@pytest.mark.parametrize("status,retry_after", [(503, "2"), (503, "date"), (429, "2"),
                                                (429, "date")])
def test_503_with_retry_after_waits_at_least_the_hint(gateway_factory, token, mock, status,
                                                      retry_after):
    # This provider documents its 503 as "overloaded, nothing was made" (429 is so by default).
    gw = gateway_factory(providers=[provider(
        "busy", mock.url, retry=dict(FAST_RETRY, not_created_statuses=[408, 425, 429, 503]))])
    if retry_after == "date":
        # An HTTP-date 3 s ahead: whole seconds, so the hint is between 2 and 3 s. Taken once the
        # gateway is up (its start on a loaded machine once ate more than a second of it).
        retry_after = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3))
    mock.script([{"status": status, "retry_after": retry_after}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="busy/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed"}, timeout=30)
    assert job["state"] == "completed", job
    entries = mock.creates_for(job_id)
    assert [e["status"] for e in entries] == [status, 200]
    gap = entries[1]["time"] - entries[0]["time"]
    assert gap >= 2.0, f"retried after {gap:.3f}s, before the server's hint"
    assert job["attempts"]["transport"] == 2 and job["attempts"]["generation"] == 1


def test_retry_budget_exhausted_is_failed_not_unknown(gateway_factory, token, mock):
    # Every answer proved that nothing was made (429, and a 503 the profile declares so): once
    # the budget is spent the job is failed. (A 5xx that is not declared so is ambiguous and
    # never ends failed: see test_audit.py.)
    gw = gateway_factory(providers=[provider(
        "down", mock.url, retry={"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50,
                                 "cap_ms": 100, "not_created_statuses": [429, 503]})])
    mock.script([{"status": 503}, {"status": 429}, {"status": 503}, {"status": 503}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="down/images/generations")
    job = gw.wait_state(token, r.json()["id"], {"completed", "failed"}, timeout=20)
    assert job["state"] == "failed", job
    assert "budget" in job["last_error"]
    assert [e["status"] for e in mock.creates_for(job["id"])] == [503, 429, 503]


def test_401_fails_and_trips_the_provider_until_reset(gateway_factory, token, mock):
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA,
                         providers=[provider("acct", mock.url, retry=FAST_RETRY)])
    mock.script([{"status": 401}])
    r1 = gw.submit(token, key(), {"prompt": "first"}, route="acct/images/generations")
    j1 = gw.wait_state(token, r1.json()["id"], {"failed", "completed"})
    assert j1["state"] == "failed" and j1["result"]["status"] == 401

    ready = gw.http.request("GET", "/readyz").json()
    assert [t["provider"] for t in ready["tripped_providers"]] == ["acct"]

    r2 = gw.submit(token, key(), {"prompt": "second"}, route="acct/images/generations")
    j2_id = r2.json()["id"]
    time.sleep(1.5)
    j2 = gw.job(token, j2_id).json()
    assert j2["state"] == "prepared", j2
    assert "credential" in j2["blocked"]["reason"]
    assert mock.creates_for(j2_id) == []

    bad = gw.http.request("POST", "/v1/admin/providers/acct/reset",
                          headers={"Authorization": f"Bearer {token}"})
    assert bad.status == 401, "a tenant token is not an admin token"
    ok = gw.http.request("POST", "/v1/admin/providers/acct/reset",
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status == 200 and ok.json()["cleared"] is True
    j2 = gw.wait_state(token, j2_id, {"completed"}, timeout=15)
    assert j2["state"] == "completed"
    assert len(mock.creates_for(j2_id)) == 1
    assert gw.http.request("GET", "/readyz").json()["tripped_providers"] == []


def metric(gw, name):
    """The value of one counter line of /metrics (0 when absent)."""
    for line in gw.http.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def tripped(gw):
    return [t["provider"] for t in gw.http.request("GET", "/readyz").json()["tripped_providers"]]


def test_403_without_marker_fails_only_that_job(gateway_factory, token, mock, database_url):
    """Issue 21 §5: a 403 about one request (a model the account may not use, a content policy)
    fails that job alone. Nothing in its body says the credential is refused (the profile
    declares no marker), so the provider is not tripped and another tenant's job is sent."""
    name = "perreq-" + uuid.uuid4().hex[:8]
    gw = gateway_factory(providers=[provider(name, mock.url, retry=FAST_RETRY)])
    other = tenant_token(database_url)
    counted = f'idemgate_attempts_total{{provider="{name}",outcome="rejected_unmarked"}}'
    before = metric(gw, counted)
    mock.script([{"status": 403}])
    r1 = gw.submit(token, key(), {"prompt": "a model this account may not use"},
                   route=f"{name}/images/generations")
    j1 = gw.wait_state(token, r1.json()["id"], {"failed", "completed"})
    assert j1["state"] == "failed" and j1["result"]["status"] == 403, j1
    assert "not tripped" in j1["last_error"], j1
    assert name not in tripped(gw)
    # Counted: the refusals that failed only their job.
    assert metric(gw, counted) == before + 1
    # Another tenant's job goes out at once, not held behind a breaker.
    r2 = gw.submit(other, key(), {"prompt": "fine"}, route=f"{name}/images/generations")
    j2 = gw.wait_state(other, r2.json()["id"], {"completed", "failed"}, timeout=15)
    assert j2["state"] == "completed", j2
    assert len(mock.creates_for(r1.json()["id"])) == 1
    assert len(mock.creates_for(j2["id"])) == 1


def test_403_with_a_declared_marker_trips_unless_the_probe_refutes_it(gateway_factory, token,
                                                                      mock):
    """A 403 whose body carries a marker the profile declares (the mock's code "mock_403") is
    evidence about the credential. Before blocking every tenant the profile's probe is asked:
    one that answers 2xx (the mock's /_health) refutes it — only the job fails, counted in
    idemgate_trips_refuted_total; without a probe, or with one that proves nothing (a 404), the
    evidence trips the provider."""
    auth = {"header": "Authorization", "prefix": "Bearer ", "secret_env": "MOCK_IMAGES_API_KEY",
            "trip_markers": ["mock_403"]}
    refuted, unprobed, broken = ("mark-" + uuid.uuid4().hex[:8] for _ in range(3))
    gw = gateway_factory(providers=[
        provider(refuted, mock.url, retry=FAST_RETRY, auth=auth, probe={"path": "/_health"}),
        provider(unprobed, mock.url, retry=FAST_RETRY, auth=auth),
        provider(broken, mock.url, retry=FAST_RETRY, auth=auth, probe={"path": "/_no_such"})])
    before = metric(gw, "idemgate_trips_refuted_total")
    jobs = {}
    for name in (refuted, unprobed, broken):
        mock.script([{"status": 403}])
        r = gw.submit(token, key(), {"prompt": "x"}, route=f"{name}/images/generations")
        jobs[name] = gw.wait_state(token, r.json()["id"], {"failed", "completed"})
        assert jobs[name]["state"] == "failed", jobs[name]
    assert "its probe shows the credential works" in jobs[refuted]["last_error"]
    assert metric(gw, "idemgate_trips_refuted_total") == before + 1
    now = tripped(gw)
    assert refuted not in now and unprobed in now and broken in now, now


def test_partial_outputs_complete_with_the_shortfall(gateway, token, mock):
    r = gateway.submit(token, key(), {"prompt": "three please", "n": 3, "_mock": {"n_out": 1}})
    job = gateway.wait_state(token, r.json()["id"], {"completed", "failed"})
    assert job["state"] == "completed", job
    assert job["outputs"] == {"requested": 3, "received": 1, "shortfall": 2}
    assert job["usage"]["output_tokens"] == 100
    assert "partial" in job["last_error"]
    assert len(mock.creates_for(job["id"])) == 1


def review_job(gw, token, mock, route):
    # The fault comes from the mock's script, not the body, so that a resend does not hang.
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route=route)
    job = gw.wait_state(token, r.json()["id"], {"review"}, timeout=20)
    assert job["state"] == "review", job
    return job["id"]


def resolve(gw, token, job_id, body):
    """POST /v1/jobs/{id}/resolve with a tenant's token or the admin token."""
    return gw.http.request("POST", f"/v1/jobs/{job_id}/resolve", json.dumps(body),
                           {"Authorization": f"Bearer {token}"})


def test_a_job_resolved_found_never_replays_its_attempts_refusal(gateway_factory, token, mock):
    """A create answered 502 (ambiguous: the provider may have made the task) goes to review;
    an operator resolves it `found`: `completed`, its result not read (the profile cannot read a
    task). Before: the row kept the attempt's 502 and a replay of the key was answered that 502
    with `X-Idemgate-State: completed` — an SDK retried it for ever, for a job billed as made.
    Now a completed job whose stored answer is no success is answered with the job document."""
    route = "rev502/images/generations"
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        "rev502", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 2})])
    mock.script([{"status": 502}])
    k = key()
    r = gw.submit(token, k, {"prompt": "x"}, route=route)
    job = gw.wait_state(token, r.json()["id"], {"review", "completed", "failed"}, timeout=20)
    assert job["state"] == "review", job
    res = resolve(gw, ADMIN_TOKEN, job["id"], {"outcome": "found", "remote_id": "task_seen",
                                               "operator": "ops"})
    assert res.status == 200 and res.json()["state"] == "completed", res
    again = gw.submit(token, k, {"prompt": "x"}, route=route, headers={"Prefer": "wait=5"})
    assert again.status == 200, again
    doc = again.json()
    assert doc["object"] == "job" and doc["state"] == "completed", doc
    assert len(real_creates(mock.creates_for(job["id"]))) == 1


def test_review_resolutions_do_what_they_say_once(gateway_factory, token, mock):
    route = "rev/images/generations"
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        "rev", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 2})])
    found, absent, abandon = [review_job(gw, token, mock, route) for _ in range(3)]

    # A tenant cannot adopt a task the provider does not show as this job's (this profile has
    # no way to read one by id): only the admin token may.
    r = resolve(gw, token, found, {"outcome": "found", "remote_id": "task_from_dashboard"})
    assert r.status == 403 and r.json()["type"].endswith("adoption-not-proven"), r
    r = resolve(gw, ADMIN_TOKEN, found, {"outcome": "found", "remote_id": "task_from_dashboard",
                                         "operator": "alice"})
    assert r.status == 200, r
    j = r.json()
    assert j["state"] == "completed" and j["remote_id"] == "task_from_dashboard"
    assert j["resolution"]["outcome"] == "found" and "alice" in j["resolution"]["by"]
    again = resolve(gw, ADMIN_TOKEN, found,
                    {"outcome": "found", "remote_id": "task_from_dashboard"})
    assert again.status == 200 and again.json()["resolution"] == j["resolution"]
    assert again.json()["updated_at"] == j["updated_at"], "the same decision changes nothing"
    other = resolve(gw, token, found, {"outcome": "abandon"})
    assert other.status == 409

    r = resolve(gw, token, abandon, {"outcome": "abandon"})
    assert r.status == 200 and r.json()["state"] == "failed"
    assert resolve(gw, token, abandon, {"outcome": "abandon"}).json()["state"] == "failed"

    r = resolve(gw, token, absent, {"outcome": "absent"})
    assert r.status == 200
    # Proven absent by an operator: sent again (this time without a fault), and completed.
    j = gw.wait_state(token, absent, {"completed", "failed"}, timeout=20)
    assert j["state"] == "completed", j
    again = resolve(gw, token, absent, {"outcome": "absent"})
    assert again.status == 200 and again.json()["state"] == "completed"

    assert len(real_creates(mock.creates_for(found))) == 1
    assert len(real_creates(mock.creates_for(abandon))) == 1
    assert len(real_creates(mock.creates_for(absent))) == 2  # the operator's decision
    assert resolve(gw, token, "job_nonexistent", {"outcome": "abandon"}).status == 404
    assert resolve(gw, token, found, {"outcome": "maybe"}).status == 400


def test_regenerate_is_a_new_linked_operation(gateway, token, mock):
    r = gateway.submit(token, key(), {"prompt": "x"})
    parent = gateway.wait_state(token, r.json()["id"], {"completed"})
    k = key("regen")
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": k}
    g1 = gateway.http.request("POST", f"/v1/jobs/{parent['id']}/regenerate", "", h)
    assert g1.status == 202, g1
    child = g1.json()
    assert child["parent_id"] == parent["id"] and child["id"] != parent["id"]
    assert child["attempts"]["generation"] == 2
    g2 = gateway.http.request("POST", f"/v1/jobs/{parent['id']}/regenerate", "", h)
    assert g2.status == 202 and g2.json()["id"] == child["id"]
    assert g2.headers["idempotent-replayed"] == "true"
    done = gateway.wait_state(token, child["id"], {"completed"})
    assert done["state"] == "completed"
    assert len(mock.creates_for(parent["id"])) == 1 and len(mock.creates_for(child["id"])) == 1
    nokey = gateway.http.request("POST", f"/v1/jobs/{parent['id']}/regenerate", "",
                                 {"Authorization": f"Bearer {token}"})
    assert nokey.status == 400


def set_limits(database_url, name, *args):
    subprocess.check_call([GATEWAY_BIN, "tenant", "limits", name, *args],
                          env=dict(os.environ, DATABASE_URL=database_url))


def test_regenerate_passes_tenant_gate(gateway_factory, mock, database_url, psql):
    """Issue 21 §6: a regeneration is a new paid creation, so it passes the tenant gate like an
    intake: over its requests per second the tenant gets 429 rate-limited with Retry-After and
    nothing is recorded (before: every regeneration of a tenant limited to 1/s was accepted)."""
    name = "rg-" + uuid.uuid4().hex[:10]
    tok = tenant_token(database_url, name)
    set_limits(database_url, name, "--rps", "1", "--burst", "1")
    gw = gateway_factory()
    r = gw.submit(tok, key(), {"prompt": "parent"}, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    parent = r.headers["x-idemgate-job-id"]
    answers = []
    for _ in range(60):  # bounded: until the gate refuses one
        g = gw.http.request("POST", f"/v1/jobs/{parent}/regenerate", "",
                            {"Authorization": f"Bearer {tok}", "Idempotency-Key": key("regen")})
        answers.append(g)
        if g.status == 429:
            break
    refused = [a for a in answers if a.status == 429]
    assert refused, [a.status for a in answers]
    assert refused[0].json()["type"] == "urn:idemgate:problem:rate-limited", refused[0]
    assert int(refused[0].headers["retry-after"]) >= 1
    accepted = [a for a in answers if a.status == 202]
    assert len(accepted) + 1 == len(answers), [a.status for a in answers]
    rows = psql(f"SELECT count(*) FROM operations WHERE parent_id = '{parent}'")
    assert rows == [[str(len(accepted))]], (rows, len(accepted))


def test_resolve_absent_passes_tenant_gate(gateway_factory, mock, database_url):
    """Issue 21 §6: an operator's `absent` sends the operation again — a creation at the provider
    — so it passes the tenant gate of the job's tenant, even with the admin token: over the rate,
    429 rate-limited and the job stays in review, not sent; after Retry-After it goes."""
    name = "ra-" + uuid.uuid4().hex[:10]
    tok = tenant_token(database_url, name)
    set_limits(database_url, name, "--rps", "1", "--burst", "1")
    route = "gated/images/generations"
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=[provider(
        "gated", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 2})])
    mock.script([{"fault": "hang"}] * 4)
    jobs = []
    for i in range(4):
        for _ in range(60):  # the intake passes the same gate: wait out its Retry-After
            r = gw.submit(tok, key(), {"prompt": f"r{i}"}, route=route)
            if r.status != 429:
                break
            time.sleep(int(r.headers["retry-after"]))
        assert r.status == 202, r
        jobs.append(r.json()["id"])
    for j in jobs:
        assert gw.wait_state(tok, j, {"review"}, timeout=30)["state"] == "review"
    answers = {}
    for i, j in enumerate(jobs):  # alternately the tenant and the admin
        answers[j] = resolve(gw, tok if i % 2 == 0 else ADMIN_TOKEN, j, {"outcome": "absent"})
    refused = [j for j, a in answers.items() if a.status == 429]
    assert refused, {j: a.status for j, a in answers.items()}
    for j in refused:
        a = answers[j]
        assert a.json()["type"] == "urn:idemgate:problem:rate-limited", a
        assert gw.job(tok, j).json()["state"] == "review"
        assert len(real_creates(mock.creates_for(j))) == 1, "sent again over the gate"
    for j, a in answers.items():
        assert a.status in (200, 429), (j, a)
    # Once the rate allows it, the same decision is taken and the job is sent again.
    j = refused[0]
    for _ in range(60):
        a = resolve(gw, tok, j, {"outcome": "absent"})
        if a.status != 429:
            break
        time.sleep(int(a.headers["retry-after"]))
    assert a.status == 200, a
    done = gw.wait_state(tok, j, {"completed", "failed"}, timeout=20)
    assert done["state"] == "completed", done
    assert len(real_creates(mock.creates_for(j))) == 2


def test_keyed_provider_hang_is_resent_under_the_same_key(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider(
        "keyed", mock.url, path="/v2/generations", route="generations",
        idempotency={"header": "Idempotency-Key"},
        timeouts={"connect_ms": 1000, "total_ms": 1000},
        retry=FAST_RETRY, reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200})])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="keyed/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=30)
    assert job["state"] == "completed", job
    entries = mock.creates_for(job_id) + [e for e in mock.ledger()
                                          if e["client_ref"] == job_id and e.get("replay")]
    keys = {e["idempotency_key"] for e in entries}
    assert keys == {job_id}, "every transport retry carried the same provider key"
    assert len(real_creates(mock.creates_for(job_id))) == 1
    assert job["attempts"]["transport"] >= 2 and job["attempts"]["generation"] == 1


def test_a_resubmit_asked_to_wait_stays_unknown(gateway_factory, token, mock, psql):
    """The reconciler's resend of an unknown create under the provider's key is answered 429:
    nothing proved the first create absent, so the row stays `unknown`, for the reconciler to
    resend inside its window. As `prepared` (before) any dispatcher sent it later as a new
    create — perhaps after the provider forgot the key, a second paid task."""
    gw = gateway_factory(providers=[provider(
        "keyed3", mock.url, path="/v2/generations", route="generations",
        idempotency={"header": "Idempotency-Key"},
        timeouts={"connect_ms": 1000, "total_ms": 1000},
        retry=FAST_RETRY, reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200})])
    mock.script([{"fault": "hang"}, {"status": 429, "retry_after": "1"}])
    job_id = gw.submit(token, key(), {"prompt": "x"}, route="keyed3/generations").json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=30)
    assert job["state"] == "completed", job
    told = psql(f"SELECT decision FROM attempts WHERE operation_id = '{job_id}' "
                "AND http_status = 429")
    assert told == [["unknown"]], told
    assert len(real_creates(mock.creates_for(job_id))) == 1


def test_a_resubmit_stopped_before_it_was_sent_stays_unknown(gateway_factory, token, mock,
                                                             psql):
    """A replica dies while its create hangs; another replica, whose environment lacks the
    provider's credential, reaps the row `unknown` and its reconciler's resubmit stops before
    sending (the credential is not set). Nothing proved the first create absent, so the row goes
    back to `unknown` — never to `prepared`, which a dispatcher would send later as a new create,
    perhaps after the provider forgot the key."""
    secret = "KEYED_SECRET_" + uuid.uuid4().hex[:8].upper()
    entry = provider("keyed2", mock.url, path="/v2/generations", route="generations",
                     idempotency={"header": "Idempotency-Key"},
                     auth={"header": "Authorization", "prefix": "Bearer ", "secret_env": secret},
                     timeouts={"connect_ms": 1000, "total_ms": 5000},
                     reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200,
                                "window_seconds": 120})
    a = gateway_factory(providers=[entry], lease_seconds=8, env={secret: "sk-test"})
    mock.script([{"fault": "hang"}])
    job_id = a.submit(token, key(), {"prompt": "x"}, route="keyed2/generations").json()["id"]
    deadline = time.monotonic() + 10
    while not mock.creates_for(job_id):
        assert time.monotonic() < deadline, "the create never reached the provider"
        time.sleep(0.02)
    a.proc.kill()
    a.proc.wait(timeout=10)
    b = gateway_factory(providers=[entry], lease_seconds=8)
    q = ("SELECT count(*) FROM attempts WHERE operation_id = '%s' AND error LIKE "
         "'%%credential is not set%%'" % job_id)
    deadline = time.monotonic() + 30
    while psql(q) == [["0"]]:
        assert time.monotonic() < deadline, b.log()[-3000:]
        time.sleep(0.05)
    state = psql(f"SELECT state FROM operations WHERE id = '{job_id}'")
    assert state == [["unknown"]], (state, b.log()[-3000:])
    assert len(mock.creates_for(job_id)) == 1


@pytest.mark.parametrize("then", [None, "cancel"])
def test_a_result_written_after_its_lease_was_reaped_is_kept(gateway_factory, token, mock,
                                                            database_url, psql, then):
    """The create is answered at once, but its result's write cannot reach the database for
    longer than the lease (the protocol proxy closes the connection before each of nine writes):
    the reaper makes the row `unknown` meanwhile. Nobody claimed it since — the reconciler waits
    a grace after a reap — so the write that finally gets through is taken there: the job is
    completed with its result, one create. Fenced by the reap, the result the gateway held was
    lost, and the job (reconcile `none`) left to review.
    `cancel`: the client cancels once the row is reaped. The cancel keeps the reaper's grace
    (migration 0029); it made the row due at once, the reconciler claimed it, and the late
    result was fenced — the job went to review though its result was in hand. A found result is
    the truth: the job is completed, the cancel came too late."""
    with pg_proxy(database_url) as (px, url):
        gw = gateway_factory(providers=[provider(
            "late", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
            reconcile={"strategy": "none", "window_seconds": 60})],
            lease_seconds=4, env={"DATABASE_URL": url})
        px.fail_next("finish", *["before"] * 9)
        r = gw.submit(token, key(), {"prompt": "x", "n": 1}, route="late/images/generations",
                      headers={"Prefer": "respond-async"})
        assert r.status == 202, r
        job_id = r.json()["id"]
        reaped_sql = (f"SELECT count(*) FROM attempts WHERE operation_id = '{job_id}' "
                      "AND outcome = 'lease_expired'")
        if then == "cancel":
            deadline = time.monotonic() + 30
            while psql(reaped_sql) != [["1"]] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert psql(reaped_sql) == [["1"]], "never reaped"
            assert px.count("finish", "before") < 9, "the write got through before the cancel"
            c = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "",
                                {"Authorization": f"Bearer {token}"})
            assert c.status in (200, 202), c
        job = gw.wait_state(token, job_id, {"completed", "failed", "review", "canceled"},
                            timeout=40)
        assert job["state"] == "completed", (job, gw.log()[-3000:])
        assert px.count("finish", "before") == 9
        assert psql(reaped_sql) == [["1"]], "the lease was not reaped before the write got through"
        assert len(real_creates(mock.creates_for(job_id))) == 1
        assert len(job["result"]["body"]["data"]) == 1, job["result"]


# A found task is the mock's task object; the create's answer is its `result` member.
LIST = {"strategy": "list_match", "found_result": "$.result", "window_seconds": 30,
        "interval_ms": 300, "absent_grace_ms": 4000,
        "list": {"path": "/v1/images/tasks?since={since}&until={until}", "items": "$.data[*]",
                 "match": "$.client_ref", "id": "$.id", "next_cursor": "$.next_cursor"}}
LOOKUP = {"strategy": "get_by_client_id", "found_result": "$.result", "window_seconds": 30,
          "interval_ms": 300, "absent_grace_ms": 1000,
          "lookup": {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                     "client_ref": "$.client_ref",
                     "absent": {"path": "$.error.code", "equals": "not_found"}}}
REF = {"body_field": "metadata.client_ref"}
HANG_TIMEOUTS = {"connect_ms": 1000, "total_ms": 1000}


def test_hang_with_a_list_endpoint_is_adopted_without_a_second_create(gateway_factory, token,
                                                                      mock):
    gw = gateway_factory(providers=[provider("listed", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref=REF, reconcile=LIST)])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x", "n": 1}, route="listed/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=20)
    assert job["state"] == "completed", job
    creates = real_creates(mock.creates_for(job_id))
    assert len(creates) == 1
    assert creates[0]["client_ref_source"] == "body", "the reference went in metadata"
    assert job["remote_id"] == creates[0]["task_id"]
    # The stored result is the create's answer (found_result), with its output.
    assert len(job["result"]["body"]["data"]) == 1, job["result"]


def test_list_match_none_found_after_the_window_is_proven_absent_and_resent(
        gateway_factory, token, mock):
    # A 503 with a hang: the mock made no task, the gateway could not tell. The list stays empty
    # for the grace period after the ambiguous send, which proves absence: only then is it sent
    # again.
    gw = gateway_factory(providers=[provider("listed2", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref=REF, reconcile=LIST)])
    mock.script([{"fault": "hang", "status": 503}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="listed2/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=30)
    assert job["state"] == "completed", job
    entries = mock.creates_for(job_id)
    assert len(entries) == 2 and entries[0]["task_id"] is None and entries[1]["task_id"]
    assert entries[1]["time"] - entries[0]["time"] >= 4.0, "resent only after the grace period"


def test_a_search_under_a_changed_reference_placement_proves_nothing(gateway_factory, token,
                                                                       mock):
    """A create in doubt was recorded (and sent) with the reference in the body; the gateway
    is restarted with the provider's profile placing it in a header instead. The new profile's
    search looks where the create put nothing: its empty answer proved the job absent and the
    create was sent again — against a real provider that lists the reference where it was put, a
    second paid task. Absence is proven only under the placement and search the job was
    recorded under: the job goes to review when its window closes, one create."""
    rec = dict(LIST, window_seconds=6, absent_grace_ms=1000)
    first = gateway_factory(providers=[provider("moved", mock.url, timeouts=HANG_TIMEOUTS,
                                                client_ref=REF, reconcile=rec)])
    mock.script([{"fault": "hang", "status": 503}])
    r = first.submit(token, key(), {"prompt": "x"}, route="moved/images/generations",
                     headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    deadline = time.monotonic() + 10
    while not mock.creates_for(job_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(timeout=30) == 0
    second = gateway_factory(providers=[provider("moved", mock.url, timeouts=HANG_TIMEOUTS,
                                                 client_ref={"header": "X-Client-Ref"},
                                                 reconcile=rec)])
    job = second.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=40)
    assert job["state"] == "review", job
    assert len(mock.creates_for(job_id)) == 1, "sent again on a search under another placement"
    assert '"event":"absence_unproven_profile_changed"' in second.log()


def test_a_job_sent_under_another_profile_is_searched_under_that_one(gateway_factory, token,
                                                                       mock, psql):
    """A rolling change of a provider's profile: the job is recorded by a replica still on the
    old profile (reference in the body) and sent by one on the new (reference in a header),
    which times out. A replica on the old profile then searched the old placement — the stamp
    it compared was the intake's, which matched — proved the job absent and sent it again. The
    row keeps the stamp of the profile each send went under: the old profile's search proves
    nothing, the job goes to review, one create."""
    rec = dict(LIST, window_seconds=8, absent_grace_ms=1000)
    old = provider("rolled", mock.url, timeouts=HANG_TIMEOUTS, client_ref=REF, reconcile=rec)
    new = dict(old, client_ref={"header": "X-Client-Ref"})
    recorder = gateway_factory(providers=[old], dispatch_workers=0)  # records, never sends
    r = recorder.submit(token, key(), {"prompt": "x"}, route="rolled/images/generations",
                        headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    stamp = psql(f"SELECT profile_id FROM operations WHERE id = '{job_id}'")[0][0]
    recorder.proc.send_signal(signal.SIGTERM)
    assert recorder.proc.wait(timeout=30) == 0
    mock.script([{"fault": "hang", "status": 503}])
    sender = gateway_factory(providers=[new], reconcile_workers=0)
    deadline = time.monotonic() + 15
    while not mock.creates_for(job_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sender.wait_state(token, job_id, {"unknown"}, timeout=20)["state"] == "unknown"
    sent_under = psql(f"SELECT profile_id FROM operations WHERE id = '{job_id}'")[0][0]
    assert sent_under != stamp and sent_under.startswith("inline#"), (stamp, sent_under)
    sender.proc.send_signal(signal.SIGTERM)
    assert sender.proc.wait(timeout=30) == 0
    searcher = gateway_factory(providers=[old])
    job = searcher.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=40)
    assert job["state"] == "review", job
    assert len(mock.creates_for(job_id)) == 1, "sent again on a search under the old placement"


def test_list_match_a_page_without_its_list_proves_nothing(gateway_factory, token, mock):
    """The list answers 200 with an error envelope and no list (mock `list_envelope`): no page
    was read, so absence is never proven — the job goes to review when its window closes and
    is never sent again (read as an empty page, it was proven absent and resent)."""
    r = mock.http.request("POST", "/_config", json.dumps({"list_envelope": True}))
    assert r.status == 200, r
    rec = dict(LIST, window_seconds=4, absent_grace_ms=1000)
    gw = gateway_factory(providers=[provider("listed4", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref=REF, reconcile=rec)])
    mock.script([{"fault": "hang", "status": 503}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="listed4/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=30)
    assert job["state"] == "review", job
    assert len(mock.creates_for(job_id)) == 1, "sent again on a page that held no list"
    assert '"event":"list_page_unreadable"' in gw.log()


def test_list_match_items_without_the_match_path_prove_nothing(gateway_factory, token, mock):
    """The profile matches `$.metadata.client_ref`, which the provider's list view does not show
    (here the mock lists the reference at the top level): every item read as "not ours", and the
    empty count proved absence — the create was sent again. No item showing the match path proves
    nothing: review when the window closes, one create."""
    rec = dict(LIST, window_seconds=4, absent_grace_ms=1000,
               list=dict(LIST["list"], match="$.metadata.client_ref"))
    gw = gateway_factory(providers=[provider("listed5", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref=REF, reconcile=rec)])
    # A task in the list's window, as any other client's would be.
    mock.http.request("POST", "/v1/images/generations",
                      json.dumps({"prompt": "other", "metadata": {"client_ref": "someone"}}))
    mock.script([{"fault": "hang", "status": 503}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="listed5/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=30)
    assert len(mock.creates_for(job_id)) == 1, "sent again on items that could not be matched"
    assert job["state"] == "review", job
    assert '"event":"list_match_unreadable"' in gw.log()


def test_list_match_several_tasks_go_to_review(gateway_factory, token, mock, psql):
    gw = gateway_factory(providers=[provider("listed3", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref=REF, reconcile=LIST)])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="listed3/images/generations")
    job_id = r.json()["id"]
    deadline = time.monotonic() + 10
    while not mock.creates_for(job_id):  # the scripted hang is the gateway's, not ours
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # Someone else created a task carrying the same reference (e.g. a buggy earlier client).
    mock.http.request("POST", "/v1/images/generations",
                      json.dumps({"prompt": "y", "metadata": {"client_ref": job_id}}))
    job = gw.wait_state(token, job_id, {"completed", "review"}, timeout=20)
    assert job["state"] == "review", job


def test_hang_with_lookup_by_client_reference_is_found(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider("looked", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref={"header": "X-Client-Ref"},
                                             reconcile=LOOKUP)])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="looked/images/generations")
    job_id = r.json()["id"]
    job = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=20)
    assert job["state"] == "completed", job
    creates = real_creates(mock.creates_for(job_id))
    assert len(creates) == 1 and creates[0]["client_ref_source"] == "x-client-ref"
    assert job["remote_id"] == creates[0]["task_id"]


def test_lookup_404_is_proven_absent_and_resent_once(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider("looked2", mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref={"header": "X-Client-Ref"},
                                             reconcile=LOOKUP)])
    mock.script([{"fault": "close", "status": 502}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="looked2/images/generations")
    job = gw.wait_state(token, r.json()["id"], {"completed", "failed", "review"}, timeout=20)
    assert job["state"] == "completed", job
    entries = mock.creates_for(job["id"])
    assert [e["task_id"] is not None for e in entries] == [False, True]


def test_lookup_failing_keeps_unknown_then_review(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider(
        "looked3", mock.url, timeouts=HANG_TIMEOUTS, client_ref={"header": "X-Client-Ref"},
        reconcile=dict(LOOKUP, window_seconds=3))])
    mock.http.request("POST", "/_config", json.dumps({"lookup_status": 503}))
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route="looked3/images/generations")
    job = gw.wait_state(token, r.json()["id"], {"completed", "review"}, timeout=20)
    assert job["state"] == "review", job
    assert len(real_creates(mock.creates_for(job["id"]))) == 1


def hung_lookup_job(gateway_factory, token, mock, name, reconcile):
    """A create that hangs at a provider reconciled by lookup (reconcile): the gateway and the
    job once it settled."""
    gw = gateway_factory(providers=[provider(name, mock.url, timeouts=HANG_TIMEOUTS,
                                             client_ref={"header": "X-Client-Ref"},
                                             reconcile=reconcile)])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "x"}, route=name + "/images/generations")
    return gw, gw.wait_state(token, r.json()["id"], {"completed", "failed", "review"}, timeout=20)


def test_a_lookup_404_that_is_not_the_providers_own_proves_nothing(gateway_factory, token, mock):
    """A 404 is absence only when its body is the provider's own "no such task" (lookup.absent):
    a renamed route, an egress proxy's page, a gateway in front answer 404 too. Before: any 404
    was absence and the create was sent again — here over a task the provider had made."""
    lookup = dict(LOOKUP, window_seconds=4,
                  lookup=dict(LOOKUP["lookup"], path="/v1/images/by-reference/{client_ref}"))
    gw, job = hung_lookup_job(gateway_factory, token, mock, "looked4", lookup)
    assert job["state"] == "review", job
    assert len(real_creates(mock.creates_for(job["id"]))) == 1
    assert '"event":"lookup_absence_unproven"' in gw.log()


def test_a_lookup_answering_another_task_is_not_adopted(gateway_factory, token, mock):
    """A 2xx is our task only when it carries our reference (lookup.client_ref): a lookup whose
    filter the provider ignores answers another task. Before: that task was adopted — the job
    completed with another request's result."""
    seeded = mock.http.request("POST", "/_tasks/seed",
                               json.dumps({"provider": "openai-images", "count": 1}))
    assert seeded.status == 200, seeded
    [other] = seeded.json()["tasks"]
    lookup = dict(LOOKUP, window_seconds=4, lookup=dict(
        LOOKUP["lookup"], path="/v1/images/by-ref/" + other["client_ref"] + "?ref={client_ref}"))
    gw, job = hung_lookup_job(gateway_factory, token, mock, "looked5", lookup)
    assert job["state"] == "review" and job["remote_id"] != other["id"], job
    assert len(real_creates(mock.creates_for(job["id"]))) == 1
    assert '"event":"lookup_not_ours"' in gw.log()


def test_a_cancelled_job_is_never_sent_again(gateway_factory, token, mock):
    gw = gateway_factory(providers=[provider(
        "cx", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 2})])
    job_id = review_job(gw, token, mock, "cx/images/generations")
    h = {"Authorization": f"Bearer {token}"}
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status == 202
    r = resolve(gw, token, job_id, {"outcome": "absent"})
    assert r.status == 200 and r.json()["state"] == "failed", r
    time.sleep(1.0)
    assert len(real_creates(mock.creates_for(job_id))) == 1


def test_big_numbers_reach_the_provider_as_written(gateway, token, mock):
    raw = '{ "prompt": "x",  "seed": 12345678901234567890, "cfg": 7.50 }'
    r = gateway.submit(token, key(), raw)
    job = gateway.wait_state(token, r.json()["id"], {"completed"})
    sent = '{"prompt":"x","seed":12345678901234567890,"cfg":7.50}'
    [create] = mock.creates_for(job["id"])
    assert create["body_sha256"] == hashlib.sha256(sent.encode()).hexdigest()
    # The fingerprint is still canonical: another spelling of the same value is a replay.
    again = gateway.submit(token, job["idempotency_key"],
                           '{"seed":12345678901234567890,"cfg":7.5,"prompt":"x"}')
    assert again.status == 202 and again.json()["id"] == job["id"]


# A create that may run longer than the replica's lease (a long LLM stream): total_ms 2 s (inside
# the 4 s lease, as every other call), create_total_ms 30 s.
LONG_CREATE = {"connect_ms": 1000, "total_ms": 2000, "create_total_ms": 30000}


def create_attempts(psql, job_id):
    return psql(f"SELECT outcome, coalesce(http_status, 0), coalesce(curl_code, 0), decision "
                f"FROM attempts WHERE operation_id = '{job_id}' AND kind = 'create' ORDER BY seq")


def test_a_create_longer_than_its_lease_keeps_it_and_completes(gateway_factory, token, mock,
                                                               psql):
    """The provider answers after 9 s; the replica's lease is 4 s. The dispatcher renews the
    row's lease while the call runs (every ~1 s here), so no reaper takes the row and no
    reconciler acts on a call still running: the job completes with the one answer, one create,
    one attempt. Before, a create could not outlive the lease (total_ms had to fit in it): a
    reasoning model's stream longer than 170 s was cut, unknown, then review."""
    gw = gateway_factory(lease_seconds=4, providers=[
        provider("longcall", mock.url, timeouts=LONG_CREATE,
                 reconcile={"strategy": "none", "window_seconds": 60})])
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"delay_ms": 9000}},
                       route="longcall/images/generations").json()["id"]
    j = gw.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=40)
    assert j["state"] == "completed", j
    assert create_attempts(psql, job_id) == [["success", "200", "0", "completed"]]
    assert len(mock.creates_for(job_id)) == 1
    assert j["attempts"]["transport"] == 1, j


def test_a_create_whose_lease_cannot_be_kept_is_cut_at_its_end(gateway_factory, token, mock,
                                                               psql):
    """As above, but the row's lease is ended under the call (here by hand: what a replica that
    lost its database for longer than the lease sees — the reaper of another replica takes the
    row). The renewal finds the row no longer the call's, and the call is cut at the lease's end
    as last written: it never runs on while another replica may act on its row. The cut call is
    ambiguous (its bytes left): unknown, never failed, never sent again."""
    gw = gateway_factory(lease_seconds=4, providers=[
        provider("cutcall", mock.url, timeouts=LONG_CREATE,
                 reconcile={"strategy": "none", "window_seconds": 60})])
    job_id = gw.submit(token, key(), {"prompt": "x", "_mock": {"delay_ms": 12000}},
                       route="cutcall/images/generations").json()["id"]
    deadline = time.monotonic() + 10
    while not mock.creates_for(job_id) and gw.job(token, job_id).json()["state"] != "sending":
        assert time.monotonic() < deadline, "the create never started"
        time.sleep(0.02)
    psql(f"UPDATE operations SET lease_expires_at = now() - interval '1 second' "
         f"WHERE id = '{job_id}' AND state = 'sending'")
    # The reaper records its own row (lease_expired); the call's end is the other one.
    deadline = time.monotonic() + 20
    while not [a for a in create_attempts(psql, job_id) if a[0] != "lease_expired"]:
        assert time.monotonic() < deadline, "the create's end was never recorded"
        time.sleep(0.1)
    [attempt] = [a for a in create_attempts(psql, job_id) if a[0] != "lease_expired"]
    assert attempt[1] == "0" and attempt[2] == "28", \
        f"the call ran on past its lease (want a cut: no status, curl 28): {attempt}"
    j = gw.job(token, job_id).json()
    assert j["state"] in ("unknown", "review"), j
    # The mock records the create when it answers (after its 12 s): exactly one, never sent
    # again.
    deadline = time.monotonic() + 20
    while not mock.creates_for(job_id):
        assert time.monotonic() < deadline, "the mock never recorded the create"
        time.sleep(0.2)
    time.sleep(2)
    assert len(mock.creates_for(job_id)) == 1, mock.creates_for(job_id)
    assert gw.job(token, job_id).json()["state"] in ("unknown", "review")
