"""GET /metrics: Prometheus text, bounded labels, and safety counters that move when their event
happens. Logs: one JSON object per line, never a prompt, token, key or provider secret."""

import hashlib
import json
import os
import re
import subprocess
import time
import uuid

from conftest import GATEWAY_BIN, Http, free_port, provider


def scrape(gw):
    r = gw.http.request("GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values, r.body.decode()


def test_a_scrape_counts_the_waiting_states_along_their_indexes(gateway, psql):
    """/metrics counts prepared, sending, accepted, unknown and review at every scrape: each
    count must be able to run along a partial index of its state (seq scans off, the planner
    still takes one where no index serves), never over the whole history. Review had none
    before migration 0022: a scrape at 1 M operations read them all (0.4-0.6 s)."""
    del gateway  # migrated
    out = subprocess.run([GATEWAY_BIN, "statements"], capture_output=True, text=True, check=True)
    sql = {s["name"]: s["sql"] for s in map(json.loads, out.stdout.splitlines())}["gauges"]
    plan = "\n".join(r[0] for r in psql("SET enable_seqscan = off; EXPLAIN " + sql))
    scans = re.findall(r"(Seq Scan|Index Only Scan|Index Scan|Bitmap Heap Scan)(?: using (\w+))? "
                       r"on operations", plan)
    partial = {r[0]: r[1] for r in psql("SELECT indexname, indexdef FROM pg_indexes "
                                         "WHERE tablename = 'operations'")}
    # Along an index that holds only its state's rows (operations_by_state leads with the
    # tenant: a count of one state along it reads every entry).
    assert len(scans) == 5, plan
    for kind, index in scans:
        assert index and "WHERE (state = '" in partial.get(index, ""), (kind, index, plan)


def test_metrics_move_with_their_events(gateway_factory, token, mock):
    gw = gateway_factory(providers=[
        provider("m", mock.url, auth={"header": "Authorization", "prefix": "Bearer ",
                                      "secret_env": "MOCK_IMAGES_API_KEY"},
                 timeouts={"connect_ms": 1000, "total_ms": 1000},
                 reconcile={"strategy": "none", "window_seconds": 2})])
    before, _ = scrape(gw)
    secret_prompt = "canary-prompt-" + uuid.uuid4().hex
    k = "canary-key-" + uuid.uuid4().hex
    ok = gw.submit(token, k, {"prompt": secret_prompt}, route="m/images/generations")
    gw.wait_state(token, ok.json()["id"], {"completed"})
    mock.script([{"fault": "hang"}])
    hang = gw.submit(token, "hang-" + uuid.uuid4().hex, {"prompt": "x"},
                     route="m/images/generations")
    gw.wait_state(token, hang.json()["id"], {"review"}, timeout=20)
    mock.script([{"status": 401}])
    bad = gw.submit(token, "acct-" + uuid.uuid4().hex, {"prompt": "x"},
                    route="m/images/generations")
    gw.wait_state(token, bad.json()["id"], {"failed"})
    gw.submit(token, k, {"prompt": "different"}, route="m/images/generations")  # 422
    after, text = scrape(gw)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta('idemgate_http_requests_total{route="intake",status="2xx"}') >= 3
    assert delta('idemgate_http_requests_total{route="intake",status="4xx"}') == 1
    assert delta('idemgate_attempts_total{outcome="success"}') == 1
    assert delta('idemgate_attempts_total{outcome="ambiguous"}') == 1
    assert delta('idemgate_attempts_total{outcome="rejected_account"}') == 1
    assert delta("idemgate_ambiguous_submissions_total") == 1
    assert delta("idemgate_review_entered_total") == 1
    assert after['idemgate_operations{state="review"}'] >= 1
    # A gauge for every state, 0 when none: the terminal canceled included (issue 21 item 1).
    states = ("prepared", "sending", "accepted", "unknown", "review", "completed", "failed",
              "canceled")
    assert [s for s in states if f'idemgate_operations{{state="{s}"}}' not in after] == []
    assert after["idemgate_review_backlog"] >= 1
    assert after['idemgate_provider_tripped{provider="m"}'] == 1
    assert after["idemgate_database_up"] == 1
    assert after['idemgate_http_request_duration_seconds_count{route="intake"}'] >= 4
    # Bounded labels: no key, token, job id or prompt ever appears in the metrics.
    for needle in (k, token, ok.json()["id"], secret_prompt, "sk-mock-secret"):
        assert needle not in text
    labels = set(re.findall(r'(\w+)="', text))
    assert labels <= {"route", "status", "le", "outcome", "state", "provider", "result",
                      "reason", "source"}, labels

    log = gw.log()
    lines = [l for l in log.splitlines() if l.strip()]
    events = [json.loads(l) for l in lines]  # every line is one JSON object
    assert all("ts" in e and "level" in e and "event" in e for e in events)
    assert any(e["event"] == "http" and e.get("request_id") for e in events)
    for needle in (secret_prompt, token, k, "sk-mock-secret"):
        assert needle not in log, needle


def test_webhook_refusals_are_counted(gateway_factory, mock):
    gw = gateway_factory(providers=[provider(
        "hooked", mock.url, webhook={"verify": "hmac_sha256_hex", "secret_env": "HOOK_SECRET",
                                     "signature_header": "X-Signature", "task_id": "$.id"})],
        env={"HOOK_SECRET": "s3cret"})
    before, _ = scrape(gw)
    r = gw.http.request("POST", "/v1/webhooks/hooked", '{"id":"t1"}', {"X-Signature": "00"})
    assert r.status == 401
    after, _ = scrape(gw)
    assert after["idemgate_webhook_refused_total"] - before["idemgate_webhook_refused_total"] == 1


# ---- issue 21 item 11: metrics on a listener of their own, optionally behind a token --------

def sha256_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


def test_metrics_on_own_listener(gateway_factory, token):
    """metrics_listen: /metrics, /healthz and /readyz on a second address, nothing of the API
    there; the API's listener answers /metrics 404 (like any path it does not serve) except to
    the admin token (the console's safety view), and still answers its probes."""
    admin = "adm-" + uuid.uuid4().hex
    mport = free_port()
    gw = gateway_factory(metrics_listen=f"127.0.0.1:{mport}",
                         admin_token_sha256=sha256_hex(admin))
    m = Http(f"http://127.0.0.1:{mport}")
    r = m.request("GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
    assert "idemgate_database_up 1" in r.body.decode()
    assert m.request("HEAD", "/metrics").status == 200
    assert m.request("GET", "/healthz").status == 200
    assert m.request("GET", "/readyz").json()["ready"] is True
    # Nothing of the API on the metrics listener, whatever the credentials.
    auth = {"Authorization": f"Bearer {token}"}
    assert m.request("GET", "/v1/jobs", headers=auth).status == 404
    assert m.request("POST", "/v1/providers/mock-images/images/generations", "{}",
                     dict(auth, **{"Idempotency-Key": "k"})).status == 404
    assert m.request("GET", "/console").status == 404
    assert m.request("POST", "/metrics", "").status == 405
    # The API's listener: /metrics is not there for tenants or anonymous callers...
    for headers in ({}, auth):
        r = gw.http.request("GET", "/metrics", headers=headers)
        assert r.status == 404, r
        assert r.json()["type"] == "urn:idemgate:problem:not-found"
        assert b"idemgate_" not in r.body
    # ...only for the operator's console, with the admin token; the probes stay.
    r = gw.http.request("GET", "/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert r.status == 200 and "idemgate_database_up" in r.body.decode()
    assert gw.http.request("GET", "/healthz").status == 200
    assert gw.http.request("GET", "/readyz").status == 200
    # The metrics listener's requests are counted and logged like the API's.
    values, _ = scrape_at(m)
    assert values['idemgate_http_requests_total{route="metrics",status="2xx"}'] >= 3
    events = [json.loads(line) for line in gw.log().splitlines() if line.strip()]
    assert any(e["event"] == "metrics_listening" and e["port"] == mport for e in events)
    assert any(e["event"] == "http" and e.get("listener") == "metrics" for e in events)


def test_metrics_token(gateway_factory, token):
    """metrics_token_sha256: /metrics answers only the metrics token (or the admin token), on
    the API's listener and on the metrics listener alike; the probes need none; the token is
    never logged."""
    secret = "mt-" + uuid.uuid4().hex
    admin = "adm-" + uuid.uuid4().hex
    mport = free_port()
    settings = {"metrics_token_sha256": sha256_hex(secret), "admin_token_sha256": sha256_hex(admin)}
    plain = gateway_factory(**settings)
    split = gateway_factory(metrics_listen=f"127.0.0.1:{mport}", **settings)
    for http in (plain.http, Http(f"http://127.0.0.1:{mport}")):
        for headers in ({}, {"Authorization": f"Bearer {token}"},
                        {"Authorization": "Bearer " + secret + "x"},
                        {"Authorization": secret}):
            r = http.request("GET", "/metrics", headers=headers)
            assert r.status == 401, (headers, r)
            assert r.json()["type"] == "urn:idemgate:problem:unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert b"idemgate_" not in r.body
        for t in (secret, admin):
            r = http.request("GET", "/metrics", headers={"Authorization": f"Bearer {t}"})
            assert r.status == 200 and "idemgate_database_up 1" in r.body.decode(), r
        assert http.request("GET", "/healthz").status == 200
        assert http.request("GET", "/readyz").status == 200
    for gw in (plain, split):
        assert secret not in gw.log() and admin not in gw.log()
    # A malformed hash is a configuration error, not a metrics endpoint open to anyone.
    bad = subprocess.run([GATEWAY_BIN, "check-config"], capture_output=True, text=True,
                         env=dict(os.environ, IDEMGATE_METRICS_TOKEN_SHA256=secret))
    assert bad.returncode == 1 and "metrics_token_sha256" in bad.stderr
    assert secret not in bad.stderr + bad.stdout


def scrape_at(http):
    r = http.request("GET", "/metrics")
    assert r.status == 200, r
    values = {}
    for line in r.body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values, r.body.decode()
