"""GET /metrics: Prometheus text, bounded labels, and safety counters that move when their event
happens. Logs: one JSON object per line, never a prompt, token, key or provider secret."""

import json
import re
import time
import uuid

from conftest import provider


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
    assert labels <= {"route", "status", "le", "outcome", "state", "provider", "result"}, labels

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
