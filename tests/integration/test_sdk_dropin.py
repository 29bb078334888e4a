"""Drop-in for an existing SDK (issue 15 §4): the OpenAI Node SDK from npm, unmodified, changes
only its base URL (and passes an Idempotency-Key through its per-request headers option). It
cannot send `Prefer`, so the route's `default_wait_seconds` makes the gateway answer with the
provider's own body when the job ends in time; the same key again is a replay (one create at
the provider); a job that does not end in time is answered 202 with the job (the documented
answer), which the SDK returns as it is.

Issue 24 §1, §2, §6: every problem the gateway answers reaches an SDK caller as its message
(the SDKs read only `error.message`, never RFC 9457's members); the README's drop-in lines, as
written, work against the configuration `make run` uses; the admin 401 says when the admin API
is off and how to turn it on."""

import glob
import hashlib
import json
import os
import re
import subprocess
import uuid

from conftest import GATEWAY_BIN, ROOT, free_port, provider, tenant_token

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


# ---------------------------------------------------------------------------------------------
# Issue 24 §1: what the SDK tells its caller about each problem.
# ---------------------------------------------------------------------------------------------

def run_sdk_calls(calls):
    """Each call made with the unmodified SDK (tests/sdk/errors.mjs); one outcome per call."""
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), SDK_DIR], check=True,
                   timeout=600)
    r = subprocess.run(["node", os.path.join(SDK_DIR, "errors.mjs"), json.dumps(calls)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPENAI_LOG="off"))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def cli(database_url, *args):
    subprocess.run([GATEWAY_BIN, *args], check=True, capture_output=True,
                   env=dict(os.environ, DATABASE_URL=database_url))


def new_tenant(database_url):
    name = "sdk-" + uuid.uuid4().hex[:12]
    return name, tenant_token(database_url, name)


# OpenAI's error types, by status (src/problem.c).
ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error",
              402: "insufficient_quota", 404: "invalid_request_error",
              405: "invalid_request_error", 409: "invalid_request_error",
              413: "invalid_request_error", 422: "invalid_request_error",
              429: "rate_limit_error"}


def assert_sdk_reads(outcome, status, code):
    """The SDK's error carries our text: "<status> <error.message>", the problem's code and
    type, never "<status> status code (no body)"."""
    assert not outcome["ok"], outcome
    err = outcome["error"]
    assert outcome["status"] == status, outcome
    assert isinstance(err, dict) and set(err) == {"message", "type", "code"}, outcome
    assert err["message"] and outcome["message"] == f"{status} {err['message']}", outcome
    assert "no body" not in outcome["message"], outcome
    assert outcome["code"] == code and err["code"] == code, outcome
    assert outcome["type"] == ERROR_TYPE[status] == err["type"], outcome


def test_sdk_callers_read_the_message_of_every_problem(gateway_factory, mock, database_url,
                                                       token):
    priced = provider("sdk-priced", mock.url,
                      pricing={"currency": "USD", "source": "test", "per_output": 40000})
    gw = gateway_factory(max_body_bytes=4096, max_json_depth=8,
                         providers=[provider("mock-images", mock.url), priced])
    root = f"http://127.0.0.1:{gw.port}"
    images = root + "/v1/providers/mock-images"
    gen = {"model": "gpt-image-1", "prompt": "a lighthouse at dawn", "n": 1}

    def key():
        return "sdk-err-" + uuid.uuid4().hex

    # A key already taken by another body; a job that ended (not in review).
    taken = key()
    first = gw.submit(token, taken, {"prompt": "the first body", "n": 1},
                      headers={"Prefer": "wait=10"})
    assert first.status == 200, first
    done_id = first.headers["x-idemgate-job-id"]
    # A tenant allowed no job in flight; a tenant whose day's budget is spent.
    held_name, held = new_tenant(database_url)
    cli(database_url, "tenant", "budget", held_name, "--in-flight", "0")
    budget_name, budgeted = new_tenant(database_url)
    cli(database_url, "tenant", "budget", budget_name, "--day", "0")

    deep = {"a": [[[[[[[[[[1]]]]]]]]]]}
    cases = [
        (422, "idempotency-key-reused",
         {"base": images, "token": token, "kind": "images", "body": gen,
          "headers": {"Idempotency-Key": taken}}),
        (400, "missing-idempotency-key",
         {"base": images, "token": token, "kind": "images", "body": gen}),
        (400, "invalid-idempotency-key",
         {"base": images, "token": token, "kind": "images", "body": gen,
          "headers": {"Idempotency-Key": "k" * 256}}),
        (400, "invalid-json",
         {"base": images, "token": token, "kind": "images", "body": {**gen, "extra": deep},
          "headers": {"Idempotency-Key": key()}}),
        (401, "unauthorized",
         {"base": images, "token": "sk-no-such-tenant", "kind": "images", "body": gen,
          "headers": {"Idempotency-Key": key()}}),
        (404, "unknown-route",
         {"base": root + "/v1/providers/openai-nope", "token": token, "kind": "images",
          "body": gen, "headers": {"Idempotency-Key": key()}}),
        (413, "payload-too-large",
         {"base": images, "token": token, "kind": "images", "body": {**gen, "prompt": "x" * 5000},
          "headers": {"Idempotency-Key": key()}}),
        (429, "too-many-in-flight",
         {"base": images, "token": held, "kind": "images", "body": gen,
          "headers": {"Idempotency-Key": key()}}),
        (402, "budget-exceeded",
         {"base": root + "/v1/providers/sdk-priced", "token": budgeted, "kind": "images",
          "body": gen,
          "headers": {"Idempotency-Key": key()}}),
        (404, "not-found", {"base": root, "token": token, "kind": "get", "path": "/v1/nothing"}),
        (404, "job-not-found",
         {"base": root, "token": token, "kind": "get", "path": "/v1/jobs/job_0000000000000000"}),
        (405, "method-not-allowed",
         {"base": root, "token": token, "kind": "post", "path": "/healthz", "body": {}}),
        (409, "not-in-review",
         {"base": root, "token": token, "kind": "post", "path": f"/v1/jobs/{done_id}/resolve",
          "body": {"outcome": "abandon"}}),
        (400, "invalid-resolution",
         {"base": root, "token": token, "kind": "post", "path": f"/v1/jobs/{done_id}/resolve",
          "body": {"outcome": "maybe"}}),
        (401, "unauthorized",
         {"base": root, "token": token, "kind": "get", "path": "/v1/admin/jobs"}),
    ]
    outcomes = run_sdk_calls([c for _, _, c in cases])
    for (status, code, _), outcome in zip(cases, outcomes):
        assert_sdk_reads(outcome, status, code)
    # Nothing refused reached the provider: the only create is the first body's.
    assert len([c for c in mock.ledger() if not c.get("replay")]) == 1

    # The extension leaves RFC 9457's members as they were, and says the same thing.
    raw = gw.submit(token, taken, {"prompt": "yet another body", "n": 1})
    p = raw.json()
    assert raw.status == 422 and raw.headers["content-type"] == "application/problem+json"
    assert set(p) == {"type", "title", "status", "detail", "request_id", "error"}, p
    assert p["type"] == "urn:idemgate:problem:idempotency-key-reused" and p["status"] == 422
    assert p["request_id"] == raw.headers["x-request-id"]
    assert p["error"] == {"message": f"{p['title']}: {p['detail']}",
                          "type": "invalid_request_error", "code": "idempotency-key-reused"}
    assert outcomes[0]["message"] == f"422 {p['title']}: {p['detail']}"


def test_every_problem_body_is_made_by_the_one_renderer():
    """The SDK test above reaches most problem types; the rest are made by the same function:
    no source writes a problem body but src/problem.c's problem_render (reply.c's
    reply_problem, and api.c's answer to a handler that answered nothing)."""
    senders = set()
    for path in glob.glob(os.path.join(ROOT, "src", "*.c")):
        with open(path) as f:
            text = f.read()
        name = os.path.basename(path)
        assert "application/problem+json" not in text, name  # only as PROBLEM_CONTENT_TYPE
        if name != "problem.c":
            assert "urn:idemgate:problem" not in text, name
        if "PROBLEM_CONTENT_TYPE" in text:
            assert "problem_render(" in text, name
            senders.add(name)
    assert senders == {"reply.c", "api.c"}, senders


# ---------------------------------------------------------------------------------------------
# Issue 24 §6: the admin API's 401.
# ---------------------------------------------------------------------------------------------

def test_admin_401_says_the_admin_api_is_off_and_how_to_turn_it_on(gateway_factory, token):
    off = gateway_factory()
    admin_token = "adm-" + uuid.uuid4().hex
    on = gateway_factory(admin_token_sha256=hashlib.sha256(admin_token.encode()).hexdigest())
    calls = [{"base": f"http://127.0.0.1:{gw.port}", "token": t, "kind": "get",
              "path": "/v1/admin/jobs"} for gw, t in ((off, token), (on, token), (on, admin_token))]
    told_off, told_on, admitted = run_sdk_calls(calls)
    assert_sdk_reads(told_off, 401, "unauthorized")
    assert_sdk_reads(told_on, 401, "unauthorized")
    msg = told_off["message"]
    assert "admin API is off" in msg, msg
    assert "admin_token_sha256" in msg and "IDEMGATE_ADMIN_TOKEN_SHA256" in msg, msg
    # With the admin API on, a wrong token is told only that the admin token is required.
    assert "off" not in told_on["message"] and "admin token" in told_on["message"], told_on
    assert admitted["ok"], admitted


# ---------------------------------------------------------------------------------------------
# Issue 24 §2: the README's drop-in, as written, against `make run`'s configuration.
# ---------------------------------------------------------------------------------------------

EXAMPLE_CONFIG = os.path.join(ROOT, "deploy", "idemgate.example.json")
README_BASE = "http://127.0.0.1:8080"


def readme_dropin_lines():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Drop-in for an OpenAI-style SDK", 1)[1]
    return re.search(r"```js\n(.*?)```", section, re.S).group(1)


def make_run_config(mock_url, port):
    """deploy/idemgate.example.json, the file scripts/run.sh starts the gateway with, on a free
    port and with its mock at the test's: nothing else changes (profiles resolved as the
    gateway resolves them, relative to the file)."""
    with open(EXAMPLE_CONFIG) as f:
        cfg = json.load(f)
    with open(os.path.join(ROOT, "scripts", "run.sh")) as f:
        assert "EXAMPLE=deploy/idemgate.example.json" in f.read()
    assert cfg["listen"] == "127.0.0.1:8080"  # the address the README's lines name
    cfg["listen"] = f"127.0.0.1:{port}"
    for p in cfg["providers"]:
        assert p["base_url"] == "http://127.0.0.1:9090", p  # run.sh's mock
        p["base_url"] = mock_url
        if "profile" in p and not os.path.isabs(p["profile"]):
            p["profile"] = os.path.join(os.path.dirname(EXAMPLE_CONFIG), p["profile"])
    return cfg


def test_readme_dropin_lines_work_against_make_runs_configuration(gateway_factory, mock,
                                                                   database_url):
    lines = readme_dropin_lines()
    assert f'baseURL: "{README_BASE}/v1/providers/openai"' in lines, lines
    gw = gateway_factory(**make_run_config(mock.url, free_port()))
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), SDK_DIR], check=True,
                   timeout=600)
    # The README's lines verbatim but for the port; `prompt` and `key` are the reader's own.
    script = ("const prompt = process.argv[2];\nconst key = process.argv[3];\n"
              + lines.replace(README_BASE, f"http://127.0.0.1:{gw.port}")
              + "\nconsole.log(JSON.stringify(image));\n")
    path = os.path.join(SDK_DIR, f".readme-dropin-{uuid.uuid4().hex}.mjs")
    with open(path, "w") as f:
        f.write(script)
    try:
        env = dict(os.environ, OPENAI_LOG="off", IDEMGATE_TOKEN=tenant_token(database_url))

        def run(key):
            r = subprocess.run(["node", path, "a lighthouse at dawn", key], capture_output=True,
                               text=True, timeout=120, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
            return json.loads(r.stdout)

        key = "readme-" + uuid.uuid4().hex
        image = run(key)
        again = run(key)
    finally:
        os.unlink(path)
    # The provider's own body (an image), not the gateway's job; the same key is a replay.
    assert image.get("object") != "job" and image["data"][0]["url"], image
    assert again == image
    assert len([c for c in mock.ledger() if not c.get("replay")]) == 1


def test_shipped_openai_profiles_answer_an_sdk_with_the_providers_body():
    """An SDK cannot send `Prefer`: every route of the OpenAI-style profiles that ship waits."""
    paths = glob.glob(os.path.join(ROOT, "deploy", "providers", "openai-*.json"))
    assert len(paths) >= 2, paths
    for path in paths:
        with open(path) as f:
            for route in json.load(f)["routes"]:
                assert route.get("default_wait_seconds", 0) > 0, (path, route)


def test_unmodified_openai_sdk_streams_and_replays_the_same_tokens(gateway_factory, mock, token):
    """Issue 25 §6: `stream: true` through the SDK: the first call streams from the provider,
    the same key again replays the same chunks from the record; the mock saw one create."""
    profile = os.path.join(ROOT, "deploy", "providers", "openai-chat.json")
    name = "chatsdk" + uuid.uuid4().hex[:6]
    gw = gateway_factory(providers=[{"name": name, "profile": profile, "base_url": mock.url,
                                     "timeouts": {"connect_ms": 1000, "total_ms": 8000}}],
                         env={"OPENAI_API_KEY": "sk-test"})
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), SDK_DIR], check=True,
                   timeout=600)
    base = f"http://127.0.0.1:{gw.port}/v1/providers/{name}"
    key = "sdk-stream-" + uuid.uuid4().hex

    def stream():
        r = subprocess.run(["node", os.path.join(SDK_DIR, "stream.mjs"), base, token, key,
                            json.dumps({"_mock": {"events": 4, "event_delay_ms": 50}})],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OPENAI_LOG="off"))
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    first = stream()
    assert first["text"] == "tok0 tok1 tok2 tok3 ", first
    assert first["usage"]["completion_tokens"] == 4, first
    again = stream()
    assert (again["chunks"], again["text"], again["usage"]) == \
        (first["chunks"], first["text"], first["usage"])
    creates = [e for e in mock.ledger()
               if e["route"] == "/v1/chat/completions" and not e["replay"]]
    assert len(creates) == 1, creates
