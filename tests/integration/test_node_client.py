"""The Node/TypeScript client (clients/node, issue 15 §3 and §5): its types are generated from
docs/openapi.yaml and checked against it, and its tests — Node's own runner, `node --test` — run
against the real gateway and the counting mock started here.

The npm packages it needs to build (typescript, openapi-typescript, @types/node) are pinned by
clients/node/package-lock.json and installed by scripts/npm-tools.sh; the client itself has no
runtime dependency (Node 20's fetch)."""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid

import pytest

from conftest import GATEWAY_BIN, ROOT, provider, tenant_token
from test_archive import MOCK_ARCHIVE, arch_entry
from test_async import SECRETS

NODE_DIR = os.path.join(ROOT, "clients", "node")
SPEC = os.path.join(ROOT, "docs", "openapi.yaml")
BIN = os.path.join(NODE_DIR, "node_modules", ".bin")


@pytest.fixture(scope="module")
def built():
    """Installs the pinned dev dependencies and compiles the client into clients/node/dist."""
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), NODE_DIR], check=True, timeout=900)
    r = subprocess.run([os.path.join(BIN, "tsc"), "-p", "tsconfig.json"], cwd=NODE_DIR,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return NODE_DIR


def node_test(files, env=None, timeout=600):
    """Runs `node --test` over files (one at a time) and returns its summary counts; fails on any
    failed, cancelled or skipped test, or on none at all."""
    r = subprocess.run(["node", "--test", "--test-reporter=tap", *files],
                       cwd=NODE_DIR, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    out = r.stdout + r.stderr
    counts = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$",
                                               r.stdout, re.M)}
    assert r.returncode == 0, out[-6000:]
    assert counts.get("tests", 0) > 0 and counts["pass"] == counts["tests"], (counts, out[-4000:])
    assert counts["skipped"] == 0 and counts["todo"] == 0, (counts, out[-4000:])
    return counts


# --- the spec as the contract (issue 15 §5) ----------------------------------------------------

def check_generated(spec, generated=None):
    args = ["node", os.path.join(NODE_DIR, "scripts", "check-generated.mjs"), spec]
    if generated:
        args.append(generated)
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_the_clients_types_are_the_specs(built):
    """The committed src/generated/openapi.ts is exactly what openapi-typescript makes of the
    spec, and the whole client type-checks against it (tsc --noEmit)."""
    r = check_generated(SPEC)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([os.path.join(BIN, "tsc"), "-p", "tsconfig.json", "--noEmit"], cwd=NODE_DIR,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("change, what", [
    # A member of Job the client reads is renamed.
    (("        terminal: {type: boolean,", "        finished: {type: boolean,"), "terminal"),
    # A problem type the client tells apart is renamed.
    (("problem:idempotency-key-reused", "problem:key-reused"), "idempotency-key-reused"),
    # A response header the client reads is renamed.
    (("X-Idemgate-Job-Id", "X-Idemgate-Job"), "X-Idemgate-Job-Id"),
])
def test_a_spec_change_that_forgets_the_client_fails(built, tmp_path, change, what):
    """The checks above can fail: a spec changed without the client fails the generated-file
    check, and once the types are regenerated the client no longer type-checks."""
    old, new = change
    with open(SPEC) as f:
        text = f.read()
    assert text.count(old) >= 1, old
    spec = tmp_path / "openapi.yaml"
    spec.write_text(text.replace(old, new))
    r = check_generated(str(spec))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "is not generated from" in r.stderr, r.stderr

    copy = tmp_path / "client"
    shutil.copytree(os.path.join(NODE_DIR, "src"), copy / "src")
    shutil.copy(os.path.join(NODE_DIR, "tsconfig.json"), copy / "tsconfig.json")
    os.symlink(os.path.join(NODE_DIR, "node_modules"), copy / "node_modules")
    subprocess.run([os.path.join(BIN, "openapi-typescript"), str(spec), "-o",
                    str(copy / "src" / "generated" / "openapi.ts")],
                   check=True, capture_output=True, timeout=300)
    r = subprocess.run([os.path.join(BIN, "tsc"), "-p", "tsconfig.json", "--noEmit"], cwd=copy,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, "the client still type-checks against a spec it does not fit"
    assert what in r.stdout, r.stdout


# --- the client's rules, and the client against the gateway ------------------------------------

def test_node_client_unit(built):
    node_test(["test/unit.test.mjs"])


def set_limits(database_url, name, *args):
    subprocess.check_call([GATEWAY_BIN, "tenant", "limits", name, *args],
                          env=dict(os.environ, DATABASE_URL=database_url))


def start_gateway(gateway_factory, mock, database_url, **settings):
    """A gateway whose archive copies the mock's outputs (served over http on 127.0.0.1, which
    an archive profile refuses unless it allows it), as `make run`'s configuration does; the
    async provider under a name of its own, so no other test's gateway archives its outputs."""
    e, async_route = arch_entry("replicate", mock)
    chat = {"name": CHAT, "profile": os.path.join(ROOT, "deploy", "providers", "openai-chat.json"),
            "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 8000}}
    gw = gateway_factory(
        providers=[provider("mock-images", mock.url, client_ref={"header": "X-Client-Ref"},
                            archive=dict(MOCK_ARCHIVE)), e, chat],
        env=dict(SECRETS, OPENAI_API_KEY="sk-test",
                 DATABASE_URL=database_url + "&options=-c%20lock_timeout%3D200"),
        **settings)
    return gw, async_route


CHAT = "nodechat" + uuid.uuid4().hex[:6]


def client_env(gw, mock, token, database_url, async_route, **extra):
    return dict({"IDEMGATE_URL": f"http://127.0.0.1:{gw.port}", "IDEMGATE_TOKEN": token,
                 "IDEMGATE_MOCK_URL": mock.url, "DATABASE_URL": database_url,
                 "IDEMGATE_SYNC_ROUTE": "mock-images/images/generations",
                 "IDEMGATE_ASYNC_ROUTE": async_route,
                 "IDEMGATE_CHAT_ROUTE": CHAT + "/chat/completions"}, **extra)


def test_node_client_against_the_gateway(built, gateway_factory, mock, token, database_url):
    """submit+wait → the provider's body; the same key twice → one create; 422 → KeyReused,
    not retried; 503 (store busy under a held lock) → retried after Retry-After with the same
    key; 429 → RateLimited without retries, accepted after Retry-After with them; Unknown with
    the job id; Unauthorized; an async job's outputs; cancel (test/gateway.test.mjs)."""
    limited = "node-rl-" + uuid.uuid4().hex[:10]
    limited_token = tenant_token(database_url, limited)
    set_limits(database_url, limited, "--rps", "1", "--burst", "1")  # read when the gateway starts
    gw, async_route = start_gateway(gateway_factory, mock, database_url)
    node_test(["test/gateway.test.mjs"],
              client_env(gw, mock, token, database_url, async_route,
                         IDEMGATE_LIMITED_TOKEN=limited_token))


def test_node_client_cancel_before_sending(built, gateway_factory, mock, token, database_url):
    gw, async_route = start_gateway(gateway_factory, mock, database_url, dispatch_workers=0)
    node_test(["test/cancel-idle.test.mjs"], client_env(gw, mock, token, database_url, async_route))


def readme_block(name):
    with open(os.path.join(ROOT, "docs", "clients.md")) as f:
        text = f.read()
    m = re.search(r"<!-- tested: " + re.escape(name) + r" -->\n```js\n(.*?)```", text, re.S)
    assert m, f"docs/clients.md has no '<!-- tested: {name} -->' js block"
    return m.group(1)


def test_readme_node_example_runs_as_written(built, gateway_factory, mock, token, database_url,
                                             tmp_path):
    """The README's example, as written, installed as an application would have the package;
    run twice, it is the same job (the derived key) and one create at the provider, and the
    file it saves is the gateway's archived copy."""
    gw, _ = start_gateway(gateway_factory, mock, database_url)
    app = tmp_path / "app"
    (app / "node_modules" / "@idemgate").mkdir(parents=True)
    os.symlink(NODE_DIR, app / "node_modules" / "@idemgate" / "client")
    (app / "example.mjs").write_text(readme_block("node-client"))
    env = dict(os.environ, IDEMGATE_URL=f"http://127.0.0.1:{gw.port}", IDEMGATE_TOKEN=token)
    outs = []
    for _ in range(2):
        r = subprocess.run(["node", "example.mjs"], cwd=app, env=env, capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(r.stdout.split())
    assert outs[0] == outs[1], outs
    job_id, state, path = outs[0]
    assert job_id.startswith("job_") and state == "completed", outs
    # The gateway's archived copy, saved with its type's extension, not a provider URL.
    assert path == f"out/{job_id}-0.png", outs
    assert archived_objects(tmp_path)[sha256_of(app / path)] == (app / path).read_bytes()
    assert len(mock.creates_for(job_id)) == 1


# --- outputs: the gateway's archived bytes (issue 24 §8) ---------------------------------------

def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def archived_objects(tmp_path):
    """The gateway's archive folder (gateway_factory's archive_dir): {sha256: bytes}."""
    stored = {}
    for d, _, files in os.walk(tmp_path / "archive" / "objects"):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                stored[f] = fh.read()
    return stored


# Phase "save": submit, wait, note the job's archive as wait() left it, then saveOutputs() at
# once. Phase "again": outputs() in memory for the same job. Phase "refused": saveOutputs() of a
# job whose outputs the gateway will not archive, and the error. Prints one JSON line.
OUTPUTS_SCRIPT = """
import { Client, deriveKey } from %(dist)s;
const env = process.env;
const c = new Client({ baseUrl: env.IDEMGATE_URL, token: env.IDEMGATE_TOKEN });
if (env.PHASE === "save") {
  const key = deriveKey({ test: "outputs-after-wait", run: env.RUN }, { prefix: "node-" });
  const job = await c.wait(await c.submit(env.ROUTE, { prompt: "keep me", n: 2 }, key),
                           { timeoutSeconds: 30 });
  const atWait = job.job.archive ?? null;
  const saved = await c.saveOutputs(job, env.OUT);
  console.log(JSON.stringify({ id: job.id, state: job.state, urls: job.job.result.body.data.map((d) => d.url),
                               atWait, saved }));
} else if (env.PHASE === "refused") {
  const key = deriveKey({ test: "outputs-refused", run: env.RUN }, { prefix: "node-" });
  const job = await c.wait(await c.submit(env.ROUTE, { prompt: "not kept", n: 1 }, key),
                           { timeoutSeconds: 30 });
  const e = await c.saveOutputs(job, env.OUT, { timeoutSeconds: 60 }).then(() => null, (e) => e);
  console.log(JSON.stringify({ id: job.id, state: job.state, name: e?.name, message: e?.message,
                               jobId: e?.jobId, pending: e?.pending, archive: e?.archive }));
} else {
  const outs = await c.outputs(env.JOB_ID, { timeoutSeconds: 0 });
  console.log(JSON.stringify(outs.map((o) => ({ ...o, data: Buffer.from(o.data).toString("base64") }))));
}
"""


def run_outputs_script(tmp_path, env, **phase):
    script = tmp_path / "outputs.mjs"
    dist = "file://" + os.path.join(NODE_DIR, "dist", "index.js")
    script.write_text(OUTPUTS_SCRIPT % {"dist": json.dumps(dist)})
    r = subprocess.run(["node", str(script)], env=dict(os.environ, **env, **phase),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return json.loads(r.stdout)


def test_outputs_right_after_wait_are_the_archived_bytes(built, gateway_factory, mock, token,
                                                         database_url, tmp_path):
    """saveOutputs() called at once after wait() — when the gateway has not archived the outputs
    yet (the mock's file server is slowed down, so the copies are still to be made) — waits for
    the archive and saves the gateway's archived bytes as {job}-{n}.png, each the archive's own
    object and its SHA-256 the job's record; the provider's URLs are handed out nowhere (issue 24
    §8: outputs() returned them). Once those URLs are dead, outputs() still gives the bytes:
    they come from the gateway, not the provider."""
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 1500}))
    gw, _ = start_gateway(gateway_factory, mock, database_url)
    env = {"IDEMGATE_URL": f"http://127.0.0.1:{gw.port}", "IDEMGATE_TOKEN": token,
           "ROUTE": "mock-images/images/generations", "RUN": uuid.uuid4().hex,
           "OUT": str(tmp_path / "out")}
    first = run_outputs_script(tmp_path, env, PHASE="save")
    job_id = first["id"]
    assert first["state"] == "completed"
    assert not first["atWait"] or any(o["state"] != "archived" for o in first["atWait"]), \
        "the archive is not done when wait() returns: what this test is about"
    saved = first["saved"]
    assert [o["index"] for o in saved] == [0, 1]
    assert [o["path"] for o in saved] == [str(tmp_path / "out" / f"{job_id}-{n}.png") for n in (0, 1)]
    assert sorted(os.listdir(tmp_path / "out")) == [f"{job_id}-0.png", f"{job_id}-1.png"]
    assert all(set(o) == {"index", "path", "sha256", "bytes", "contentType"} for o in saved), saved
    record = gw.job(token, job_id).json()["archive"]
    stored = archived_objects(tmp_path)
    for o, rec in zip(saved, record):
        with open(o["path"], "rb") as f:
            data = f.read()
        assert hashlib.sha256(data).hexdigest() == o["sha256"] == rec["sha256"]
        assert stored[rec["sha256"]] == data, "the archive's own object"
        assert o["bytes"] == len(data) == rec["bytes"] and o["contentType"] == "image/png"
    assert len(mock.creates_for(job_id)) == 1

    # The provider's URLs stop working (as they expire): the outputs are still there.
    mock.http.request("POST", "/_files", json.dumps({"fault": "status_404"}))
    assert all(mock.http.request("GET", "/" + u.split("/", 3)[3]).status == 404
               for u in first["urls"]), first["urls"]
    again = run_outputs_script(tmp_path, env, PHASE="again", JOB_ID=job_id)
    assert [o["index"] for o in again] == [0, 1]
    for o, rec in zip(again, record):
        assert "url" not in o, o
        data = base64.b64decode(o["data"])
        assert stored[rec["sha256"]] == data and o["sha256"] == rec["sha256"]
        assert o["fileName"] == f"{job_id}-{o['index']}.png"


def test_outputs_the_gateway_will_not_archive_reject_not_pending(built, gateway_factory, mock,
                                                                 token, tmp_path):
    """The default archive profile refuses the mock's http://127.0.0.1 URLs: the output ends
    `failed`, and saveOutputs() rejects with OutputsUnavailable — pending false (never), with the
    job id and its archive record — instead of handing out the provider's URL; nothing is
    saved."""
    gw = gateway_factory()
    env = {"IDEMGATE_URL": f"http://127.0.0.1:{gw.port}", "IDEMGATE_TOKEN": token,
           "ROUTE": "mock-images/images/generations", "RUN": uuid.uuid4().hex,
           "OUT": str(tmp_path / "out")}
    r = run_outputs_script(tmp_path, env, PHASE="refused")
    assert r["state"] == "completed"
    assert r["name"] == "OutputsUnavailable", r
    assert r["pending"] is False and r["jobId"] == r["id"], r
    assert "output 0 is failed" in r["message"], r["message"]
    assert [(o["index"], o["state"]) for o in r["archive"]] == [(0, "failed")], r["archive"]
    assert not os.path.exists(tmp_path / "out") or os.listdir(tmp_path / "out") == []
