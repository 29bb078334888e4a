"""Drop-in for an existing SDK (issue 15 §4): the OpenAI Node SDK from npm, unmodified, changes
only its base URL (and passes an Idempotency-Key through its per-request headers option). It
cannot send `Prefer`, so the route's `default_wait_seconds` makes the gateway answer with the
provider's own body when the job ends in time; the same key again is a replay (one create at
the provider); a job that does not end in time is answered 202 with the job (the documented
answer), which the SDK returns as it is."""

import json
import os
import subprocess
import uuid

from conftest import ROOT, provider

SDK_DIR = os.path.join(ROOT, "tests", "sdk")


def run_sdk(gw, provider_name, token, key, prompt, extra=None):
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), SDK_DIR], check=True,
                   timeout=600)
    base = f"http://127.0.0.1:{gw.port}/v1/providers/{provider_name}"
    r = subprocess.run(["node", os.path.join(SDK_DIR, "dropin.mjs"), base, token, key, prompt,
                        json.dumps(extra or {})],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OPENAI_LOG="off"))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def route(wait):
    return [{"route": "images/generations", "method": "POST", "path": "/v1/images/generations",
             "default_wait_seconds": wait}]


def test_unmodified_openai_sdk_gets_the_providers_body_and_a_replay(gateway_factory, mock,
                                                                    token, psql):
    gw = gateway_factory(providers=[
        provider("sdk", mock.url, routes=route(20), client_ref={"header": "X-Client-Ref"}),
        provider("sdk-short", mock.url, routes=route(1), client_ref={"header": "X-Client-Ref"})])
    key = "sdk-" + uuid.uuid4().hex
    first = run_sdk(gw, "sdk", token, key, "a lighthouse at dawn")
    assert first["data"] and first["data"][0]["url"], first  # the provider's own shape
    again = run_sdk(gw, "sdk", token, key, "a lighthouse at dawn")
    assert again == first, (first, again)
    job = psql(f"SELECT id, state FROM operations WHERE idempotency_key = '{key}'")
    assert len(job) == 1 and job[0][1] == "completed", job
    creates = [e for e in mock.ledger() if e["client_ref"] == job[0][0] and not e.get("replay")]
    assert len(creates) == 1, creates

    # Not finished within the route's default wait: the documented answer, the job itself.
    slow_key = "sdk-slow-" + uuid.uuid4().hex
    body = run_sdk(gw, "sdk-short", token, slow_key, "slow", {"_mock": {"delay_ms": 4000}})
    assert body["id"].startswith("job_") and body["state"] in ("sending", "prepared"), body
