"""Async providers as data (issue 4): every shipped profile end to end against the mock's
personalities, stored poll URLs, cancel, poll deadlines, and verified webhooks."""

import base64
import hashlib
import hmac
import json
import os
import re
import time
import uuid

import pytest

from conftest import ROOT, free_port

PROFILES = os.path.join(ROOT, "deploy", "providers")
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()

# name → (route, mock path prefix for base_url)
SHIPPED_ASYNC = {
    "openai-videos": ("videos", ""),
    "replicate": ("flux-schnell", ""),
    "fal-queue": ("flux-dev", "/fal"),
    "runway": ("image_to_video", ""),
    "luma": ("generations", ""),
    "vertex-veo": ("veo", ""),
    "keyed-async": ("generations", ""),
}
SECRETS = {"OPENAI_API_KEY": "sk-o", "REPLICATE_API_TOKEN": "r8-x", "FAL_KEY": "fal-x",
           "RUNWAYML_API_SECRET": "rw-x", "LUMAAI_API_KEY": "luma-x",
           "GOOGLE_ACCESS_TOKEN": "ya29-x", "KEYED_API_KEY": "k-x",
           "REPLICATE_WEBHOOK_SECRET": WHSEC, "OPENAI_WEBHOOK_SECRET": WHSEC,
           "KEYED_WEBHOOK_SECRET": "mock-hmac-secret"}


def profile(name):
    with open(os.path.join(PROFILES, name + ".json")) as f:
        return json.load(f)


def entry(name, mock, poll_interval_ms=50, **over):
    """A provider entry using the shipped profile, pointed at the mock, polling fast."""
    route, prefix = SHIPPED_ASYNC[name]
    poll = profile(name)["poll"]
    poll.update(interval_ms=poll_interval_ms, max_interval_ms=max(poll_interval_ms, 200))
    e = {"name": name.replace("-", ""), "profile": os.path.join(PROFILES, name + ".json"),
         "base_url": mock.url + prefix, "poll": poll,
         "timeouts": {"connect_ms": 1000, "total_ms": 5000}}
    e.update(over)
    return e, f"{e['name']}/{route}"


def start(gateway_factory, entries, **settings):
    env = dict(SECRETS, **settings.pop("env", {}))
    return gateway_factory(providers=entries, env=env, **settings)


def body(**mock):
    return {"prompt": "a fox " + uuid.uuid4().hex[:6], "_mock": mock}


# The shipped price tables, priced end to end: request values added to the body, and the price
# of one output (the mock delivers two). Profiles without a table have no cost.
SHIPPED_PRICES = {
    "openai-videos": ({"model": "sora-2-pro", "size": "1280x720", "seconds": "8"}, 2400000),
    "replicate": ({}, 3000),
    "fal-queue": ({"image_size": "square_hd"}, 50000),
    "runway": ({"model": "gen4_turbo", "duration": 5}, 250000),
}


@pytest.mark.parametrize("name", sorted(SHIPPED_ASYNC))
def test_shipped_profile_end_to_end(gateway_factory, token, mock, name):
    e, route = entry(name, mock)
    gw = start(gateway_factory, [e])
    values, each = SHIPPED_PRICES.get(name, ({}, None))
    # respond-async: the shipped OpenAI profiles wait by default (for SDKs); this is the job.
    ok = gw.submit(token, "ok-" + uuid.uuid4().hex, dict(body(polls=2, outputs=2), **values),
                   route=route, headers={"Prefer": "respond-async"})
    bad = gw.submit(token, "bad-" + uuid.uuid4().hex,
                    body(polls=1, outcome="failed", error="mock says no"), route=route,
                    headers={"Prefer": "respond-async"})
    assert ok.status == 202 and bad.status == 202, (ok, bad)
    j = gw.wait_state(token, ok.json()["id"], {"completed", "failed", "unknown", "review"}, 30)
    assert j["state"] == "completed", j
    assert j["remote_id"], j
    outs = j["result"]["outputs"]
    # Veo without a storageUri answers the bytes inline (base64); the others hand back URLs.
    if name == "vertex-veo":
        assert outs and all(o.get("kind") == "b64" for o in outs), j["result"]
    else:
        assert outs and all(o.get("url") for o in outs), j["result"]
    assert j["polls"] >= 2
    assert len([c for c in mock.creates_for(j["id"]) if not c.get("replay")]) == 1
    if each is None:
        assert j["cost"] is None, j["cost"]
    else:
        assert j["cost"] == {"currency": "USD", "estimate_micros": each,
                             "micros": each * len(outs)}, (j["cost"], len(outs))
    f = gw.wait_state(token, bad.json()["id"], {"completed", "failed", "unknown", "review"}, 30)
    assert f["state"] == "failed", f
    assert "mock says no" in f["last_error"], f
    assert len([c for c in mock.creates_for(f["id"]) if not c.get("replay")]) == 1


def test_a_veo_task_whose_videos_were_all_filtered_completes_empty(gateway_factory, token,
                                                                     mock):
    """Veo ends a task whose every video its safety filter withheld with `done: true`, no videos
    and `raiMediaFilteredCount`. Before, that answer was read as a success whose outputs were
    not where the profile reads them: polled again until the poll deadline (an hour), then
    handed to an operator's review — for a task that had ended with nothing to deliver. Now the
    profile's `result.filtered` says so: `completed` at once, no output, the reason kept. A task
    that returns some videos and withholds others completes with those it returned, as before;
    one that returns none and says nothing of a filter is still read again (never completed
    empty on a profile's mistake)."""
    e, route = entry("vertex-veo", mock)
    gw = start(gateway_factory, [e])
    jobs = {}
    for case, ctl in (("all", dict(outputs=0, filtered=2)), ("some", dict(outputs=1, filtered=1)),
                      ("silent", dict(outputs=0))):
        r = gw.submit(token, f"veo-{case}-" + uuid.uuid4().hex, body(polls=1, **ctl), route=route)
        assert r.status == 202, r
        jobs[case] = r.json()["id"]
    ended = {"completed", "failed", "unknown", "review"}
    j = gw.wait_state(token, jobs["all"], ended, 30)
    assert j["state"] == "completed", j
    assert j["result"]["outputs"] == [], j["result"]
    assert "withheld all 2" in j["last_error"], j
    assert len([c for c in mock.creates_for(j["id"]) if not c.get("replay")]) == 1
    j = gw.wait_state(token, jobs["some"], ended, 30)
    assert j["state"] == "completed" and len(j["result"]["outputs"]) == 1, j
    assert not j.get("last_error"), j
    silent = gw.wait_state(token, jobs["silent"], ended, 2)  # a bound, not a measure
    assert silent["state"] == "accepted", silent
    assert silent["polls"] >= 2, silent  # read again after it said done


def test_a_veo_request_counts_the_videos_it_asks_for(gateway_factory, token, mock):
    """Veo makes `parameters.sampleCount` videos (1 when absent), priced per second of each:
    the profile reads that count (`outputs.requested`). Before, every request was estimated as
    one video — a tenant's budget reserved a quarter of a four-video job — and "all withheld"
    could not tell a task that withheld every video asked for from one that withheld some and
    put the others where the profile does not read them. Now the estimate counts the videos
    asked for, the job says how many it asked for and got, and a task that withheld fewer than
    were asked for, with none delivered, is read again rather than completed empty."""
    rate = 100000  # micro-USD a second of video: a test's price, not Google's
    pricing = {"currency": "USD", "per_second": rate, "seconds": "$.parameters.durationSeconds",
               "default_seconds": 8}
    e, route = entry("vertex-veo", mock, pricing=pricing)
    gw = start(gateway_factory, [e])

    def submit(case, count, **ctl):
        b = dict(body(polls=1, **ctl), parameters={"durationSeconds": 4})
        if count is not None:
            b["parameters"]["sampleCount"] = count
        r = gw.submit(token, f"veo-{case}-" + uuid.uuid4().hex, b, route=route)
        assert r.status == 202, r
        return r.json()["id"]

    jobs = {"two": submit("two", 2, outputs=2), "one": submit("one", None, outputs=1),
            "all": submit("all", 2, outputs=0, filtered=2),
            "short": submit("short", 3, outputs=0, filtered=2)}
    ended = {"completed", "failed", "unknown", "review"}
    j = gw.wait_state(token, jobs["two"], ended, 30)
    assert j["state"] == "completed" and len(j["result"]["outputs"]) == 2, j
    assert j["outputs"] == {"requested": 2, "received": 2, "shortfall": 0}, j["outputs"]
    assert j["cost"] == {"currency": "USD", "estimate_micros": 2 * 4 * rate,
                         "micros": 2 * 4 * rate}, j["cost"]
    j = gw.wait_state(token, jobs["one"], ended, 30)
    assert j["state"] == "completed", j
    assert j["outputs"]["requested"] == 1 and j["cost"]["estimate_micros"] == 4 * rate, j
    j = gw.wait_state(token, jobs["all"], ended, 30)
    assert j["state"] == "completed" and j["result"]["outputs"] == [], j
    assert "withheld all 2" in j["last_error"], j
    assert j["outputs"] == {"requested": 2, "received": 0, "shortfall": 2}, j["outputs"]
    assert j["cost"]["micros"] == 0, j["cost"]
    short = gw.wait_state(token, jobs["short"], ended, 2)  # a bound, not a measure
    assert short["state"] == "accepted" and short["polls"] >= 2, short
    for job_id in jobs.values():
        assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1


def test_poll_url_and_profile_are_used_as_stored(gateway_factory, token, mock, psql):
    e, route = entry("replicate", mock, poll_interval_ms=50)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "stored-" + uuid.uuid4().hex, body(polls=1000), route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"accepted"}, 15)
    row = psql(f"SELECT profile_id, poll_url, req_credential FROM operations WHERE id = '{job_id}'")
    # The profile's id and the digest of its reference placement and search (profile.h).
    assert re.fullmatch(r"replicate#[0-9a-f]{12}", row[0][0]), row
    assert row[0][1].startswith(mock.url + "/v1/predictions/")
    assert row[0][2] == "REPLICATE_API_TOKEN"
    gw.proc.terminate()
    gw.proc.wait(timeout=15)
    # The configuration changes under the job: a wrong poll template. The stored URL still works.
    broken = dict(e, poll=dict(e["poll"], path="/v1/nowhere/{id}"))
    gw2 = start(gateway_factory, [broken], admin_token_sha256=ADMIN_SHA)
    before = gw2.job(token, job_id).json()["polls"]
    deadline = time.monotonic() + 10
    while gw2.job(token, job_id).json()["polls"] < before + 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert gw2.job(token, job_id).json()["provider_status"] in ("queued", "running")


def test_a_replica_never_claims_the_polls_of_a_provider_it_does_not_poll(gateway_factory, token,
                                                                         mock, psql):
    """A job accepted by a replica that polls replicate; that replica stops, and another that
    polls only fal-queue runs on: it never claims the job's polls (it used to, and wrote each
    back "not configured" for a minute, delaying the replica that can poll it). Once a
    replicate replica is back, the polls go on."""
    e, route = entry("replicate", mock)
    a = start(gateway_factory, [e])
    r = a.submit(token, "notmine-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    a.wait_state(token, job_id, {"accepted"}, 15)
    a.proc.terminate()
    a.proc.wait(timeout=15)
    q = f"SELECT polls, coalesce(provider_status, '') FROM operations WHERE id = '{job_id}'"
    [[polls, _]] = psql(q)
    other, _ = entry("fal-queue", mock)
    b = start(gateway_factory, [other])
    time.sleep(2)  # 40 of its poll intervals
    after = psql(q)
    assert after[0][0] == polls and after[0][1] != "not_configured", after
    assert b.proc.poll() is None, b.log()[-2000:]
    a2 = start(gateway_factory, [e])
    deadline = time.monotonic() + 15
    while int(psql(q)[0][0]) <= int(polls):
        assert time.monotonic() < deadline, a2.log()[-2000:]
        time.sleep(0.05)


def test_cancel_is_idempotent_and_reaches_the_provider_once(gateway_factory, token, mock):
    e, route = entry("replicate", mock)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "cancel-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"accepted"}, 15)
    h = {"Authorization": f"Bearer {token}"}
    results = [gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h) for _ in range(5)]
    assert all(x.status in (200, 202) for x in results), results
    j = gw.wait_state(token, job_id, {"failed", "completed", "canceled"}, 15)
    # The task existed and the provider ended it on our request: canceled, never failed
    # (issue 21 item 1), with its remote id kept.
    assert j["state"] == "canceled" and "cancel" in j["last_error"] and j["remote_id"], j
    again = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h)
    assert again.status == 200 and again.json()["state"] == "canceled"
    task = mock.http.request("GET", f"/v1/predictions/{j['remote_id']}").json()
    assert task["status"] == "canceled" and task.get("cancels", 1) == 1, task


def test_a_cancel_the_provider_failed_is_sent_again(gateway_factory, token, mock):
    """The provider answers the first two cancels 503 and cancels nothing (mock cancel_fails):
    the cancel is not marked sent until it is answered for good, so later polls send it again,
    and the task ends canceled — marked sent at the claim, the one failed cancel was the last,
    and the task ran on (and was billed)."""
    e, route = entry("replicate", mock)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "cancel-again-" + uuid.uuid4().hex, body(polls=100000, cancel_fails=2),
                  route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"accepted"}, 15)
    h = {"Authorization": f"Bearer {token}"}
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    j = gw.wait_state(token, job_id, {"failed", "completed", "canceled"}, 20)
    assert j["state"] == "canceled" and j["remote_id"], j
    task = mock.http.request("GET", f"/v1/predictions/{j['remote_id']}").json()
    assert task["status"] == "canceled" and task["cancels"] == 3, task


def test_a_cancel_after_the_task_ended_keeps_its_result(gateway_factory, token, mock):
    """Luma's cancel is a DELETE of the generation: sent to one that had finished, it destroyed
    the paid result, and every later read was a 404 (the job held `accepted` for the cancel's
    hour, then review). A due cancel is now sent only after a status read shows the task still
    running: one that ended is concluded as it ended, its result kept, nothing deleted."""
    e, route = entry("luma", mock, poll_interval_ms=60000)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "late-cancel-" + uuid.uuid4().hex, body(polls=2), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted" and j["remote_id"], j
    # The task ends at the provider before this gateway reads it again (its next poll is a
    # minute away): read to its end here.
    path = f"/dream-machine/v1/generations/{j['remote_id']}"
    for _ in range(3):
        task = mock.http.request("GET", path).json()
    assert task["state"] == "completed", task
    h = {"Authorization": f"Bearer {token}"}
    c = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h)
    assert c.status in (200, 202), c
    j = gw.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 20)
    assert j["state"] == "completed" and j["result"], j
    task = mock.http.request("GET", path)
    assert task.status == 200 and task.json().get("cancels", 0) == 0, task
    # A task still running is cancelled (the read before it shows it running): Luma's cancel
    # deletes it, and the read after it is a 404 — `canceled` (the profile's cancel.deletes),
    # where it was read as unreadable for the cancel's hour, then sent to review.
    r = gw.submit(token, "run-cancel-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted", j
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    j = gw.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 20)
    assert j["state"] == "canceled" and j["remote_id"], j
    # ...saying that a task which finished between that read and the DELETE went with it, and
    # may be billed (the read cannot tell)
    assert "may be billed" in j["last_error"], j["last_error"]
    gone = mock.http.request("GET", f"/dream-machine/v1/generations/{j['remote_id']}")
    assert gone.status == 404, gone


def test_a_deleting_cancel_acknowledged_before_a_failed_read_ends_canceled(gateway_factory,
                                                                           token, mock, psql):
    """Luma's cancel deletes the generation. Acknowledged (2xx), but the status read just after
    it failed in passing (503): the cancel was marked sent, and every later read answered 404 —
    the task our cancel deleted — read as an unreadable task for the cancel's hour, then
    `review`. The acknowledgement is kept (migration 0043): a later read's 404 is the cancel's,
    and the job ends `canceled`."""
    e, route = entry("luma", mock)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "ack-cancel-" + uuid.uuid4().hex,
                  body(polls=100000, reads_fail_after_cancel=1), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted" and j["remote_id"], j
    h = {"Authorization": f"Bearer {token}"}
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    j = gw.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 20)
    assert j["state"] == "canceled", j
    task = mock.http.request("GET", f"/_tasks/{j['remote_id']}").json()
    # One cancel, and the read after it did fail (the mock's failure was spent).
    assert task["cancels"] == 1 and task["deleted"], task
    assert psql(f"SELECT cancel_acknowledged FROM operations WHERE id = '{job_id}'") == [["t"]]
    fails = psql(f"SELECT count(*) FROM attempts WHERE operation_id = '{job_id}' "
                 "AND kind = 'poll' AND http_status = 503")
    assert fails == [["1"]], fails


def test_a_deleting_cancel_is_marked_before_the_read_after_it(gateway_factory, token, mock,
                                                                psql):
    """Luma's cancel deletes the generation. Its acknowledgement was written only after the
    status read that follows it: a replica dying during that read left the cancel unmarked, the
    next replica sent it again (404: the task is gone) and read 404 for the cancel's hour, then
    `review`. The acknowledgement is written before that read: the next replica reads the
    deleted task as canceled, and sends no second cancel."""
    e, route = entry("luma", mock, poll_interval_ms=200,
                     timeouts={"connect_ms": 1000, "total_ms": 2000})
    a = start(gateway_factory, [e], lease_seconds=4,
              env={"IDEMGATE_CRASH": "poll_after_cancel_mark"})
    r = a.submit(token, "mark-cancel-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    j = a.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted" and j["remote_id"], j
    h = {"Authorization": f"Bearer {token}"}
    assert a.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    a.proc.wait(timeout=20)  # killed at the point, the read after the cancel not yet made
    assert '"point":"poll_after_cancel_mark"' in a.log(), a.log()[-2000:]
    b = start(gateway_factory, [e], lease_seconds=4)
    j = b.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 30)
    assert j["state"] == "canceled", j
    task = mock.http.request("GET", f"/_tasks/{j['remote_id']}").json()
    assert task["cancels"] == 1 and task["deleted"], task


def test_a_replica_without_the_credential_does_not_poll(gateway_factory, token, mock, psql):
    """A replica whose environment lacks a provider's secret claimed that provider's polls: each
    read was refused before it left (unreadable), and a job past its poll deadline whose one
    read fell to it went to review, while a replica with the secret could have read it. It
    polls none of them now, and says so (log, /metrics)."""
    e, route = entry("luma", mock, poll_interval_ms=200,
                     timeouts={"connect_ms": 1000, "total_ms": 1500})
    a = start(gateway_factory, [e], lease_seconds=4)
    r = a.submit(token, "no-cred-poll-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    assert a.wait_state(token, job_id, {"accepted"}, 15)["state"] == "accepted"
    a.proc.kill()
    a.proc.wait(timeout=10)
    b = start(gateway_factory, [e], lease_seconds=4, env={"LUMAAI_API_KEY": ""})
    deadline = time.monotonic() + 10
    while "provider_credential_unusable" not in b.log():
        assert time.monotonic() < deadline, b.log()[-2000:]
        time.sleep(0.05)
    polls = psql(f"SELECT polls FROM operations WHERE id = '{job_id}'")
    time.sleep(6)  # past the dead replica's poll lease (4 s): due for any replica's claim
    assert psql(f"SELECT polls FROM operations WHERE id = '{job_id}'") == polls
    assert re.search(r'^idemgate_provider_credential_unusable\{provider="%s"\} 1$' % e["name"],
                     b.http.request("GET", "/metrics").body.decode(), re.M)
    c = start(gateway_factory, [e], lease_seconds=4)  # one that has it reads the task
    deadline = time.monotonic() + 15
    while psql(f"SELECT polls FROM operations WHERE id = '{job_id}'") == polls:
        assert time.monotonic() < deadline, c.log()[-2000:]
        time.sleep(0.1)
    assert psql(f"SELECT state FROM operations WHERE id = '{job_id}'") == [["accepted"]]


def test_a_deleting_cancel_never_leaves_on_a_stale_read(gateway_factory, token, mock):
    """Luma's cancel deletes the generation, sent only after a read shows it running. A poller
    held up between that read and its DELETE (its answers queued behind a slow database: a pause
    point here, 3 s, well inside its lease) sent the DELETE anyway: a task that finished
    meanwhile went with its paid outputs. A deleting cancel now leaves only within 2 s of that
    read; refused, the task is read again — finished here — and its result kept."""
    e, route = entry("luma", mock, poll_interval_ms=60000)
    gw = start(gateway_factory, [e], lease_seconds=60,
               env={"IDEMGATE_PAUSE": "poll_before_cancel:3000"})
    r = gw.submit(token, "stale-read-" + uuid.uuid4().hex, body(polls=2), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted" and j["remote_id"], j
    h = {"Authorization": f"Bearer {token}"}
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    j = gw.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 30)
    assert '"event":"pause_point"' in gw.log(), gw.log()[-2000:]
    assert j["state"] == "completed" and j["result"], j
    task = mock.http.request("GET", f"/dream-machine/v1/generations/{j['remote_id']}")
    assert task.status == 200 and task.json().get("cancels", 0) == 0, task


def test_a_cancel_is_never_sent_once_the_polls_lease_is_over(gateway_factory, token, mock):
    """A poller frozen between the read that shows a task running and the cancel it then sends
    (a process stopped, a thread blocked on the database: a pause point here) wakes up after its
    lease. Another replica owns the job by then, read the task finished and completed the job;
    Luma's cancel is a DELETE, which would destroy the outputs of that completed job. The cancel
    is sent only while the poll's lease holds: nothing is sent, the result is kept."""
    e, route = entry("luma", mock, poll_interval_ms=60000,
                     timeouts={"connect_ms": 1000, "total_ms": 2000})
    stale = start(gateway_factory, [e], lease_seconds=4,
                  env={"IDEMGATE_PAUSE": "poll_before_cancel:7000"})
    # The first status read (the stale poller's, before its cancel) shows the task running;
    # the next one (the other replica's) shows it completed.
    r = stale.submit(token, "stale-cancel-" + uuid.uuid4().hex, body(polls=2), route=route)
    job_id = r.json()["id"]
    j = stale.wait_state(token, job_id, {"accepted"}, 15)
    assert j["state"] == "accepted" and j["remote_id"], j
    h = {"Authorization": f"Bearer {token}"}
    assert stale.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    deadline = time.time() + 15
    while '"event":"pause_point"' not in stale.log() and time.time() < deadline:
        time.sleep(0.05)
    assert '"event":"pause_point"' in stale.log(), stale.log()[-2000:]
    # Past the stale poller's lease, another replica claims the poll: the task has finished.
    other = start(gateway_factory, [e], lease_seconds=4)
    j = other.wait_state(token, job_id, {"completed", "failed", "canceled", "review"}, 30)
    assert j["state"] == "completed" and j["result"], j
    # The stale poller wakes (its pause is 7 s, its lease 4 s) and must not send its cancel.
    deadline = time.time() + 15
    while '"cancel_not_sent"' not in stale.log() and '"cancel_sent"' not in stale.log() and \
            time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    task = mock.http.request("GET", f"/dream-machine/v1/generations/{j['remote_id']}")
    assert task.status == 200 and task.json().get("cancels", 0) == 0, task
    assert task.json()["state"] == "completed", task.json()
    assert '"cancel_not_sent"' in stale.log(), stale.log()[-3000:]


def test_cancel_before_sending_fails_it_without_a_create(gateway_factory, token, mock):
    e, route = entry("replicate", mock)
    gw = start(gateway_factory, [e], dispatch_workers=0)
    r = gw.submit(token, "cancel0-" + uuid.uuid4().hex, body(), route=route)
    c = gw.http.request("POST", f"/v1/jobs/{r.json()['id']}/cancel", "",
                        {"Authorization": f"Bearer {token}"})
    assert c.status == 200 and c.json()["state"] == "failed"
    assert mock.creates_for(r.json()["id"]) == []


def metric(gw, name):
    text = gw.http.request("GET", "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def test_a_job_past_its_poll_deadline_goes_to_review_and_resumes(gateway_factory, token, mock):
    """A task still running at the job's poll deadline: the job is handed to an operator
    (review: invariant 2, every accepted job ends or reaches one), polled no more, and counted;
    the admin's resume polls it again to its end. Before, it stayed accepted and unpolled for
    ever, where no metric saw it."""
    e, route = entry("runway", mock)
    e["poll"]["deadline_seconds"] = 1
    gw = start(gateway_factory, [e], admin_token_sha256=ADMIN_SHA)
    before = metric(gw, "idemgate_review_entered_total")
    r = gw.submit(token, "deadline-" + uuid.uuid4().hex, body(polls=60), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review" and j["remote_id"], j
    assert "poll deadline" in j["last_error"], j
    polls = j["polls"]
    time.sleep(0.6)
    assert gw.job(token, job_id).json()["polls"] == polls
    assert metric(gw, "idemgate_review_entered_total") == before + 1
    res = gw.http.request("POST", f"/v1/admin/jobs/{job_id}/resume", "",
                          {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert res.status == 200
    j = gw.wait_state(token, job_id, {"completed"}, 30)
    assert j["state"] == "completed", j
    assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1


def test_an_operators_found_polls_under_a_new_deadline(gateway_factory, token, mock, psql):
    """An operator resolves `found` a job its poll deadline sent to review: it is polled again
    under a deadline of an hour (before: the old one, passed — one read, then review again — or,
    from a review that was never accepted, none at all: polled for ever)."""
    e, route = entry("runway", mock)
    e["poll"]["deadline_seconds"] = 1
    gw = start(gateway_factory, [e], admin_token_sha256=ADMIN_SHA)
    job_id = gw.submit(token, "found-" + uuid.uuid4().hex, body(polls=40), route=route).json()["id"]
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review", j
    res = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve",
                          json.dumps({"outcome": "found", "remote_id": j["remote_id"]}),
                          {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert res.status == 200, res
    [[left]] = psql("SELECT extract(epoch FROM poll_deadline_at - now())::int FROM operations "
                    f"WHERE id = '{job_id}'")
    assert 3000 < int(left) <= 3600, left
    j = gw.wait_state(token, job_id, {"completed", "failed", "review"}, 30)
    assert j["state"] == "completed", j


def test_a_task_that_succeeded_without_its_outputs_is_never_completed_empty(
        gateway_factory, token, mock):
    # Replicate's profile counts the outputs asked for (one by default) and reads them at
    # $.output[*]; the mock's task succeeds with none there. The job is not completed with
    # nothing (the paid outputs may show a moment later, or an operator finds them): it is read
    # again until its poll deadline, then handed to an operator.
    e, route = entry("replicate", mock)
    e["poll"]["deadline_seconds"] = 2
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "noout-" + uuid.uuid4().hex, body(polls=1, outputs=0), route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review" and j["remote_id"], j
    assert "none of its outputs" in (j["last_error"] or ""), j
    assert j["polls"] >= 3, j  # read again after the first "succeeded"
    assert "succeeded_without_outputs" in gw.log()
    assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1


def test_a_cancel_after_the_poll_deadline_is_sent(gateway_factory, token, mock):
    """Past its poll deadline a job goes to review and is polled no more; a cancel acknowledged
    then must still reach the provider (the task runs on, billed). The cancel brings the job
    back to accepted: the poller sends the cancel and follows the task to its end. Before (with
    the job left accepted past its deadline), the poll claim skipped it: the acknowledged cancel
    was never sent."""
    e, route = entry("replicate", mock)
    e["poll"]["deadline_seconds"] = 1
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "cancel-late-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review", j
    polls = j["polls"]
    time.sleep(0.5)
    assert gw.job(token, job_id).json()["polls"] == polls
    h = {"Authorization": f"Bearer {token}"}
    assert gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", h).status in (200, 202)
    j = gw.wait_state(token, job_id, {"failed", "completed", "canceled"}, 15)
    assert j["state"] == "canceled" and j["remote_id"], j
    task = mock.http.request("GET", f"/v1/predictions/{j['remote_id']}").json()
    assert task["status"] == "canceled" and task.get("cancels", 1) == 1, task


def sign_standard(body_bytes, msg_id, ts, secret=WHSEC):
    key = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body_bytes, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def post_hook(gw, provider, body_bytes, msg_id, ts=None, sig=None):
    ts = str(int(time.time())) if ts is None else str(ts)
    h = {"webhook-id": msg_id, "webhook-timestamp": ts,
         "webhook-signature": sig or sign_standard(body_bytes, msg_id, ts),
         "Content-Type": "application/json"}
    return gw.http.request("POST", f"/v1/webhooks/{provider}", body_bytes, h)


def test_webhook_signatures_are_checked(gateway_factory, token, mock):
    e, route = entry("replicate", mock)
    gw = start(gateway_factory, [e])
    b = json.dumps({"id": "p_unknown", "status": "succeeded"}).encode()
    assert post_hook(gw, "replicate", b, "msg_ok").status == 200
    assert post_hook(gw, "replicate", b, "msg_1",
                     sig=sign_standard(b, "msg_1", int(time.time()),
                                       "whsec_" + base64.b64encode(b"wrong").decode())).status == 401
    altered = post_hook(gw, "replicate", b + b" ", "msg_2",
                        sig=sign_standard(b, "msg_2", int(time.time())))
    assert altered.status == 401
    stale = int(time.time()) - 301
    assert post_hook(gw, "replicate", b, "msg_3", ts=stale,
                     sig=sign_standard(b, "msg_3", stale)).status == 401
    assert post_hook(gw, "replicate", b, "msg_4", sig="v1,AAAA").status == 401
    assert gw.http.request("POST", "/v1/webhooks/nope", b, {}).status == 404


def test_webhook_hint_completes_without_waiting_for_the_poll(gateway_factory, token, mock):
    # Polling every minute: only the verified webhook can make the job complete quickly.
    e, route = entry("replicate", mock, poll_interval_ms=60000)
    port = free_port()
    gw = start(gateway_factory, [e], listen=f"127.0.0.1:{port}",
               public_url=f"http://127.0.0.1:{port}")
    r = gw.submit(token, "hook-" + uuid.uuid4().hex,
                  body(webhook={"auto_complete_ms": 300}), route=route,
                  headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["state"] == "completed"
    assert job["polls"] <= 2, "completed by the webhook's hint, not by the minute-long poll"


def hooked_gateway(gateway_factory, mock, poll_interval_ms=60000, **settings):
    e, route = entry("replicate", mock, poll_interval_ms=poll_interval_ms)
    port = free_port()
    gw = start(gateway_factory, [e], listen=f"127.0.0.1:{port}",
               public_url=f"http://127.0.0.1:{port}", **settings)
    return gw, route


def test_a_webhook_after_the_poll_deadline_reads_the_task_again(gateway_factory, token, mock):
    """A job its poll deadline sent to review, whose task then ends: the provider's signed
    webhook makes it accepted for one read, which finds the result. A stale event first (the
    task still running) sends it back to review after that read."""
    e, route = entry("replicate", mock)
    e["poll"]["deadline_seconds"] = 1
    port = free_port()
    gw = start(gateway_factory, [e], listen=f"127.0.0.1:{port}",
               public_url=f"http://127.0.0.1:{port}")
    r = gw.submit(token, "late-hook-" + uuid.uuid4().hex, body(polls=100000), route=route)
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review" and j["remote_id"], j
    polls = j["polls"]
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": j["remote_id"], "status": "running"})).json()
    assert sent["statuses"] == [200], sent
    deadline = time.monotonic() + 15
    while gw.job(token, job_id).json()["polls"] == polls:
        assert time.monotonic() < deadline, "the webhook did not bring a read"
        time.sleep(0.05)
    j = gw.wait_state(token, job_id, {"review", "completed", "failed"}, 15)
    assert j["state"] == "review", j
    sent = mock.http.request("POST", "/_webhooks/send", json.dumps(
        {"task_id": j["remote_id"], "status": "succeeded"})).json()
    assert sent["statuses"] == [200], sent
    j = gw.wait_state(token, job_id, {"completed", "failed"}, 15)
    assert j["state"] == "completed" and j["result"]["outputs"], j
    assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1


def test_early_webhook_is_parked_then_applied(gateway_factory, token, mock, psql):
    # The webhook arrives before the create's answer, so before the remote id is committed.
    gw, route = hooked_gateway(gateway_factory, mock)
    r = gw.submit(token, "early-" + uuid.uuid4().hex, body(webhook={"early": True}),
                  route=route, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["state"] == "completed" and job["polls"] <= 2, job
    hooks = mock.http.request("GET", f"/_webhooks?task_id={job['remote_id']}").json()
    assert hooks["deliveries"] and all(d["status"] == 200 for d in hooks["deliveries"])
    assert psql(f"SELECT count(*) FROM webhook_parked WHERE remote_id = '{job['remote_id']}'") \
        == [["0"]], "the parked hint was consumed"


def test_a_webhook_reaches_every_tenant_holding_its_task(gateway_factory, mock, psql):
    """The webhook's read of which tenants hold the task feeds its writes (tenant_id = ANY …):
    however many tenants, none is left out (the list was cut at 512 bytes: 149 of these 300)."""
    gw, _ = hooked_gateway(gateway_factory, mock)
    task = "p_shared_" + uuid.uuid4().hex[:10]
    n = 300
    names = [f"shared{task[-10:]}{i}" for i in range(n)]
    psql("INSERT INTO tenants (name, token_sha256) SELECT x, md5(x) || md5(x) "
         f"FROM unnest(ARRAY{names}) x")
    # Accepted with their poll deadline passed: nothing polls them; only the hint moves them.
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         "state, expires_at, next_attempt_at, poll_deadline_at, remote_id) "
         f"SELECT t.id, 'job_' || t.name, 'k', '\\x00', 1, 'replicate', 'r', 'POST', 'http://x', "
         "'', '\\x00', 'accepted', now() + interval '1 day', now() + interval '1 day', "
         f"now() - interval '1 hour', '{task}' FROM tenants t WHERE t.name = ANY (ARRAY{names})")
    try:
        b = json.dumps({"id": task, "status": "succeeded"}).encode()
        assert post_hook(gw, "replicate", b, "msg_" + task).status == 200
        # Every one was made due (its read, a day away, brought to now); a poller may already
        # have claimed one since (its next read then at its lease's end, or in review): none is
        # still a day away.
        left = psql("SELECT count(*) FROM operations WHERE remote_id = "
                    f"'{task}' AND next_attempt_at > now() + interval '12 hours'")
        assert left == [["0"]], left
        assert psql(f"SELECT count(*) FROM operations WHERE remote_id = '{task}'") == [[str(n)]]
    finally:
        psql(f"DELETE FROM operations WHERE remote_id = '{task}'")
        psql(f"DELETE FROM tenants WHERE name = ANY (ARRAY{names})")


def test_a_webhook_that_overtakes_a_poll_in_flight_is_not_lost(gateway_factory, token, mock):
    """A signed webhook announcing the end while a status read is out — the read saw the task
    still running — moves the next read to now; the poll's "still running" must not push it a
    whole poll interval (60 s here) away. Before migration 0021 the job stayed accepted for the
    interval; now a second read follows at once and finds the end."""
    gw, route = hooked_gateway(gateway_factory, mock)
    r = gw.submit(token, "overtaken-" + uuid.uuid4().hex, body(polls=100000, poll_delay_ms=2000),
                  route=route)
    job_id = r.json()["id"]
    remote = gw.wait_state(token, job_id, {"accepted"}, 20)["remote_id"]

    def task():
        t = mock.http.request("GET", f"/_tasks/{remote}").json()
        assert "polls" in t, (remote, t)
        return t

    def send(word):
        res = mock.http.request("POST", "/_webhooks/send",
                                json.dumps({"task_id": remote, "status": word})).json()
        assert res["statuses"] == [200], res

    polls = task()["polls"]
    send("running")  # a hint: the status read goes out now and answers 2 s later
    deadline = time.monotonic() + 10
    while task()["polls"] == polls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert task()["polls"] == polls + 1, "the hint sent a status read"
    send("succeeded")  # while that read is out: its answer says running
    j = gw.wait_state(token, job_id, {"completed", "failed"}, 20)
    assert j["state"] == "completed", j
    assert task()["polls"] == polls + 2, "one more read, made at once"


def test_1000_duplicate_reordered_late_webhooks_apply_once_and_never_regress(
        gateway_factory, token, mock, psql):
    gw, route = hooked_gateway(gateway_factory, mock)
    n_jobs = 20
    jobs = []
    for i in range(n_jobs):
        outcome = "failed" if i % 5 == 0 else "succeeded"
        r = gw.submit(token, f"flood-{i}-" + uuid.uuid4().hex,
                      body(polls=100000, outcome=outcome), route=route)
        jobs.append((r.json()["id"], outcome))
    remote = {}
    for job_id, _ in jobs:
        remote[job_id] = gw.wait_state(token, job_id, {"accepted"}, 20)["remote_id"]
    seen = {job_id: ["accepted"] for job_id, _ in jobs}
    order = {"prepared": 0, "sending": 1, "accepted": 2, "completed": 3, "failed": 3}
    deliveries = fresh = 0
    events = set()
    # 1,000 deliveries: stale "processing" events, the final event, each duplicated; half the
    # final events come late (after stale ones), some arrive twice over.
    rounds = [("processing", 9), (None, 9), ("processing", 9), (None, 9), ("processing", 9)]
    for status_word, dups in rounds:
        for job_id, outcome in jobs:
            word = status_word or outcome
            res = mock.http.request("POST", "/_webhooks/send", json.dumps(
                {"task_id": remote[job_id], "status": word, "duplicates": dups})).json()
            deliveries += len(res["statuses"])
            assert all(s == 200 for s in res["statuses"]), res
            events.add(res["event_id"])
            st = gw.job(token, job_id).json()["state"]
            assert order[st] >= order[seen[job_id][-1]], (job_id, seen[job_id], st)
            seen[job_id].append(st)
    assert deliveries == 1000
    finals = {}
    for job_id, outcome in jobs:
        j = gw.wait_state(token, job_id, {"completed", "failed"}, 30)
        finals[job_id] = j["state"]
        task = mock.http.request("GET", f"/_tasks/{remote[job_id]}").json()
        want = "completed" if task["status"] == "succeeded" else "failed"
        assert j["state"] == want, (j, task)
        assert (outcome == "succeeded") == (j["state"] == "completed")
    rows = psql("SELECT count(*) FROM webhook_events WHERE provider = 'replicate' AND "
                "remote_id IN (" + ",".join(f"'{r}'" for r in remote.values()) + ")")
    assert int(rows[0][0]) == len(events), "each event id recorded once"
    # The hints never created work: one create per job, and polls only a handful per job.
    for job_id, _ in jobs:
        assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1
        assert gw.job(token, job_id).json()["polls"] <= 6


def test_shipped_sync_profile_end_to_end(gateway_factory, token, mock):
    e = {"name": "openaiimages", "profile": os.path.join(PROFILES, "openai-images.json"),
         "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 5000}}
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "img-" + uuid.uuid4().hex,
                  {"prompt": "x", "n": 2, "model": "gpt-image-1", "quality": "low",
                   "size": "1024x1024"},
                  route="openaiimages/images/generations", headers={"Prefer": "wait=20"})
    assert r.status == 200 and len(r.json()["data"]) == 2, r
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["outputs"] == {"requested": 2, "received": 2, "shortfall": 0}
    assert job["profile"] == "openai-images"
    # Estimated per image ($0.011 each), settled by the usage's tokens ($5/M in, $40/M out).
    u = job["usage"]
    assert u.get("output_tokens"), u
    assert job["cost"] == {"currency": "USD", "estimate_micros": 22000,
                           "micros": u.get("input_tokens", 0) * 5 + u["output_tokens"] * 40}
    # A model the table does not list costs nothing, and the metrics count it so.
    r2 = gw.submit(token, "img-" + uuid.uuid4().hex, {"prompt": "x", "model": "gpt-image-2"},
                   route="openaiimages/images/generations", headers={"Prefer": "wait=20"})
    assert r2.status == 200, r2
    j2 = gw.job(token, r2.headers["x-idemgate-job-id"]).json()
    assert j2["cost"] == {"currency": "USD", "estimate_micros": 0, "micros": 0}
    metrics = gw.http.request("GET", "/metrics").body.decode()
    assert 'idemgate_settled_operations_total{provider="openaiimages",currency="USD"} 2' in metrics
    assert 'idemgate_unpriced_operations_total{provider="openaiimages",currency="USD"} 1' in metrics
    mock.script([{"status": 400}])
    bad = gw.submit(token, "img-" + uuid.uuid4().hex, {"prompt": "y"},
                    route="openaiimages/images/generations", headers={"Prefer": "wait=20"})
    assert bad.status == 400, bad
    jb = gw.job(token, bad.headers["x-idemgate-job-id"]).json()
    assert jb["state"] == "failed" and "HTTP 400" in jb["last_error"]


@pytest.mark.parametrize("name", ["replicate", "fal-queue", "keyed-async", "luma"])
def test_each_webhook_scheme_end_to_end(gateway_factory, token, mock, name):
    # Polling every minute: each job completes through its provider's signed webhook.
    e, route = entry(name, mock, poll_interval_ms=60000)
    port = free_port()
    keys = mock.http.request("GET", "/_webhook_keys").json()
    gw = start(gateway_factory, [e], listen=f"127.0.0.1:{port}",
               public_url=f"http://127.0.0.1:{port}",
               env={"FAL_WEBHOOK_PUBLIC_KEY": keys["ed25519_public_key"]})
    r = gw.submit(token, "scheme-" + uuid.uuid4().hex, body(webhook={"auto_complete_ms": 300}),
                  route=route, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["state"] == "completed" and job["polls"] <= 2, job
    hooks = mock.http.request("GET", f"/_webhooks?task_id={job['remote_id']}").json()
    assert hooks["deliveries"] and all(d["status"] == 200 for d in hooks["deliveries"]), hooks


def test_found_at_an_async_provider_is_polled_to_its_result(gateway_factory, token, mock):
    # The create hangs; the operator finds the task; polling then brings the result.
    # The task read by id carries the job's client reference: that proves the tenant's claim.
    e, route = entry("keyed-async", mock,
                     reconcile={"strategy": "none", "window_seconds": 2,
                                "task": {"client_ref": "$.metadata.client_ref"}},
                     timeouts={"connect_ms": 1000, "total_ms": 1000})
    gw = start(gateway_factory, [e])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, "found-" + uuid.uuid4().hex, body(polls=2), route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"review"}, 20)
    [create] = [c for c in mock.creates_for(job_id) if not c.get("replay")]
    res = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve",
                          json.dumps({"outcome": "found", "remote_id": create["task_id"]}),
                          {"Authorization": f"Bearer {token}"})
    assert res.status == 200 and res.json()["state"] == "accepted", res
    j = gw.wait_state(token, job_id, {"completed", "failed"}, 20)
    assert j["state"] == "completed" and j["result"]["outputs"], j


def adopted_by_the_operator(gateway_factory, token, mock, name, remote_id):
    """A job of the shipped profile `name` whose create hung (reconcile none: review), then
    resolved `found` by the operator with remote_id (None: the task its create made): accepted,
    polled from there. Returns (gateway, job id)."""
    e, route = entry(name, mock, reconcile={"strategy": "none", "window_seconds": 2},
                     timeouts={"connect_ms": 1000, "total_ms": 1000})
    gw = start(gateway_factory, [e], admin_token_sha256=ADMIN_SHA)
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, "adopted-" + uuid.uuid4().hex, body(polls=2), route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"review"}, 20)
    if remote_id is None:
        [create] = [c for c in mock.creates_for(job_id) if not c.get("replay")]
        remote_id = create["task_id"]
    res = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve",
                          json.dumps({"outcome": "found", "remote_id": remote_id,
                                      "operator": "ops"}),
                          {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert res.status == 200 and res.json()["state"] == "accepted", res
    return gw, job_id


def test_a_found_fal_task_reads_its_result_where_its_status_url_says(gateway_factory, token,
                                                                    mock):
    """fal's result is read from its status URL with "/status" cut off
    (`fetch_from_poll_url_strip`). A task an operator found (or a webhook named) has no stored
    status URL — its create's answer never came: the URL its polls are made from is cut instead.
    Before: no result URL, the job polled COMPLETED to its deadline, then review."""
    gw, job_id = adopted_by_the_operator(gateway_factory, token, mock, "fal-queue", None)
    j = gw.wait_state(token, job_id, {"completed", "failed", "review"}, 20)
    assert j["state"] == "completed" and j["result"]["outputs"], j
    assert len([c for c in mock.creates_for(job_id) if not c.get("replay")]) == 1


def test_a_task_failing_with_a_long_non_ascii_message_ends_failed(gateway_factory, token, mock):
    """A failed task's message is kept cut to a bound: here inside a two-byte character at the
    byte count. Before: PostgreSQL refused the cut text (22021, not UTF-8), the write was
    dropped on every poll, the job stayed `accepted` for ever and its in-flight slot held. Now
    it is cut between characters (and a diagnostic text that is not UTF-8 anyway is written
    with U+FFFD: src/db.c, p_text_lossy)."""
    e, route = entry("keyed-async", mock)
    gw = start(gateway_factory, [e])
    msg = "x" + "\u00e9" * 400  # 801 bytes: the stored message is cut inside an "\u00e9"
    r = gw.submit(token, "utf8-" + uuid.uuid4().hex,
                  body(polls=1, outcome="failed", error=msg), route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    j = gw.wait_state(token, r.json()["id"], {"failed", "completed", "review"}, 20)
    assert j["state"] == "failed", j
    assert j["last_error"].startswith("task failed: x\u00e9\u00e9"), j["last_error"][:40]
    assert j["last_error"].endswith("\u00e9"), j["last_error"][-10:]  # cut between characters


def test_a_waiter_on_a_failed_task_is_told_why(gateway_factory, token, mock):
    """`Prefer: wait` on an async job whose task fails: `502 job-failed` whose detail carries
    the provider's reason, as api.md says. Before: a waiter answered from memory (the replica
    that polled it) was told only "job ... ended failed"."""
    e, route = entry("keyed-async", mock)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "why-" + uuid.uuid4().hex,
                  body(polls=1, outcome="failed", error="mock says no"), route=route,
                  headers={"Prefer": "wait=20"})
    assert r.status == 502, r
    assert "mock says no" in r.json()["detail"], r.json()


@pytest.mark.parametrize("name", ["runway", "keyed-async"])
def test_a_success_without_outputs_is_never_completed_empty(gateway_factory, token, mock, name):
    """These profiles (and Luma's) count no outputs asked for (no outputs.requested; the mock's
    Luma always shows its one video, so it is not among them). A task that succeeds
    with none where the profile reads them — a result not yet filled in, a shape it does not
    know — is read again, then an operator's (review at the poll deadline). Before: `completed`
    with nothing to archive, the paid result left at the provider."""
    e, route = entry(name, mock)
    e["poll"]["deadline_seconds"] = 2
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "empty-" + uuid.uuid4().hex, body(polls=1, outputs=0), route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    j = gw.wait_state(token, r.json()["id"], {"completed", "failed", "review"}, 20)
    assert j["state"] == "review", j
    assert '"event":"succeeded_without_outputs"' in gw.log()


def test_status_reads_the_provider_refuses_are_counted(gateway_factory, token, mock):
    """A job polled for a task the provider does not know (here: an operator adopted a wrong
    id; a credential rotated answers 401 alike) stays `accepted` until its poll deadline: the
    reads are counted by what came back (idemgate_poll_reads_total), which an alert watches —
    before, nothing said so for the deadline's hour."""
    gw, job_id = adopted_by_the_operator(gateway_factory, token, mock, "keyed-async",
                                         "no_such_task")
    name = "keyedasync"
    pattern = rb'^idemgate_poll_reads_total\{provider="' + name.encode() + \
        rb'",outcome="not_found"\} (\d+)$'
    deadline = time.monotonic() + 20
    while True:
        m = re.search(pattern, gw.http.request("GET", "/metrics").body, re.M)
        if m and int(m.group(1)) >= 2:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.1)
    assert gw.job(token, job_id).json()["state"] == "accepted"


def test_cancel_at_a_provider_that_cannot_stop_a_task_says_so(gateway_factory, token, mock,
                                                             psql):
    """fal-queue's profile has no cancel endpoint: a cancel of its accepted job is answered
    409 cancel-unsupported, nothing is recorded, and the job goes on to its result (before: 202,
    as if it were being stopped, while it kept running and was paid)."""
    e, route = entry("fal-queue", mock)
    gw = start(gateway_factory, [e])
    r = gw.submit(token, "nocancel-" + uuid.uuid4().hex, body(polls=6), route=route)
    job_id = r.json()["id"]
    assert gw.wait_state(token, job_id, {"accepted"}, 15)["state"] == "accepted"
    c = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "",
                        {"Authorization": f"Bearer {token}"})
    assert c.status == 409, c
    assert c.json()["type"] == "urn:idemgate:problem:cancel-unsupported", c
    assert psql(f"SELECT cancel_requested_at IS NULL FROM operations WHERE id = '{job_id}'") == \
        [["t"]]
    assert gw.wait_state(token, job_id, {"completed", "failed"}, 30)["state"] == "completed"
