"""docs/walkthrough.md, followed: its configuration loads, every variable it exports is one the
gateway or a shipped profile reads, and its shell lines run in the doc's order — every
`build/idemgate …` line against the suite's database (each option one its command's usage
names), every `curl` line as written against a gateway started with the doc's configuration
whose providers (OpenAI images, Replicate, Runway) are the bundled mock playing each, and whose
archive is a local folder instead of the bucket."""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time

import pytest

from conftest import GATEWAY_BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(ROOT, "docs", "walkthrough.md")
PROFILES = os.path.join(ROOT, "deploy", "providers")


def blocks(lang):
    with open(DOC) as f:
        text = f.read()
    return [m.group(1) for m in re.finditer(r"^```" + lang + r"\n(.*?)^```", text, re.M | re.S)]


def shell_lines():
    """Each command of the doc's sh blocks, continuation lines joined, comments dropped."""
    out = []
    for b in blocks("sh"):
        for line in b.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append((line, words))
    return out


def doc_config():
    (cfg,) = [json.loads(b) for b in blocks("json") if '"providers"' in b]
    return cfg


def profile_of(entry):
    with open(os.path.join(PROFILES, os.path.basename(entry["profile"]))) as f:
        merged = json.load(f)
    merged.update(entry)
    return merged


def help_text(*cmd):
    r = subprocess.run([GATEWAY_BIN] + list(cmd), capture_output=True, text=True)
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("walkthrough")
    shutil.copytree(PROFILES, d / "providers")
    (d / "idemgate.json").write_text(json.dumps(doc_config()))
    return d


def test_the_exported_variables_are_the_ones_read(config_dir):
    exported = [w[1].split("=", 1)[0] for _, w in shell_lines() if w[0] == "export"]
    cfg = doc_config()
    secrets = {profile_of(p)["auth"]["secret_env"] for p in cfg["providers"]}
    assert secrets == {"OPENAI_API_KEY", "REPLICATE_API_TOKEN", "RUNWAYML_API_SECRET"}
    settings_env = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", help_text("config-reference")))
    webhook = {profile_of(p).get("webhook", {}).get("secret_env") for p in cfg["providers"]}
    for name in exported:
        assert name in settings_env | secrets or name == "IDEMGATE_CONFIG", name
    assert secrets <= set(exported)
    # The archive's key pair, by the names the s3 settings default to.
    assert cfg["archive_backend"] == "s3" and "archive_s3_access_key_env" not in cfg
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(exported) & settings_env
    # The webhook secret the text names is the one Replicate's profile reads.
    with open(DOC) as f:
        assert "`REPLICATE_WEBHOOK_SECRET`" in f.read()
    assert "REPLICATE_WEBHOOK_SECRET" in webhook

    env = dict(os.environ, **{n: "placeholder" for n in secrets})
    r = subprocess.run([GATEWAY_BIN, "--config", str(config_dir / "idemgate.json"),
                        "check-config"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "ok (3 providers)" in r.stdout and not r.stderr, r


def test_the_admin_token_lines_make_a_token_and_its_sha256():
    lines = [line for line, w in shell_lines() if "ADMIN_TOKEN" in line and w[0] != "curl"]
    r = subprocess.run(["sh", "-c", "\n".join(lines) +
                        '\nprintf "%s %s" "$ADMIN_TOKEN" "$IDEMGATE_ADMIN_TOKEN_SHA256"'],
                       capture_output=True, text=True, check=True)
    token, digest = r.stdout.split()
    assert len(token) >= 32 and hashlib.sha256(token.encode()).hexdigest() == digest


def curl(words, base, env, cwd):
    """Runs a curl line of the doc, with its address and variables made this test's; its
    answer's headers are on stdout."""
    argv = []
    for w in words:
        w = w.replace("http://127.0.0.1:8080", base)
        for k in sorted(env, key=len, reverse=True):
            w = w.replace("$" + k, env[k])
        argv.append(w)
    assert "$" not in " ".join(argv[1:]), argv
    return argv, subprocess.run(argv + ["-D", "-"], capture_output=True, text=True,
                                timeout=150, cwd=cwd)


def wait_archived(gw, token, job_id, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        j = gw.job(token, job_id).json()
        if j["archive"] and all(o["state"] != "pending" for o in j["archive"]):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def test_the_walkthrough_runs(config_dir, gateway_factory, mock, database_url, tmp_path):
    cfg = doc_config()
    shutil.copytree(PROFILES, tmp_path / "providers")
    admin = "walkthrough-admin-token"
    # The doc's providers, aimed at the mock (which plays OpenAI images, Replicate and Runway)
    # and allowed to archive from it; the doc's settings but for the bucket.
    providers = [dict(p, base_url=mock.url,
                      archive={"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True})
                 for p in cfg["providers"]]
    settings = {k: v for k, v in cfg.items()
                if k != "providers" and not k.startswith("archive_")}
    secrets = {profile_of(p)["auth"]["secret_env"]: "sk-mock" for p in cfg["providers"]}
    gw = gateway_factory(providers=providers, lease_seconds=180,
                         admin_token_sha256=hashlib.sha256(admin.encode()).hexdigest(),
                         **{k: v for k, v in settings.items() if k != "listen"},
                         env=secrets)
    base = f"http://127.0.0.1:{gw.port}"

    env = dict(os.environ, DATABASE_URL=database_url, IDEMGATE_CONFIG=str(config_dir /
                                                                          "idemgate.json"),
               **secrets)
    helps = help_text("--help") + help_text("tenant", "--help") + help_text("jobs", "--help")
    vars_ = {"ADMIN_TOKEN": admin}
    ran = {"cli": 0, "submit": 0, "curl": 0}
    jobs = []
    for line, words in shell_lines():
        if words[0] == "build/idemgate":
            args = [vars_.get(w[1:], w) if w.startswith("$") else w for w in words[1:]]
            for w in args:
                if w.startswith("--"):
                    assert w in helps, (w, line)
            assert args[0] in helps, line
            if args[0] == "serve":  # the gateway above runs it
                continue
            r = subprocess.run([GATEWAY_BIN] + args, capture_output=True, text=True, env=env,
                               timeout=60)
            if args[:2] == ["jobs", "resolve"]:
                # A completed job is no operator's to decide: refused, but not as a usage error.
                assert r.returncode == 1 and "usage" not in r.stderr, (line, r)
            else:
                assert r.returncode == 0, (line, r)
            if args[:2] == ["tenant", "add"]:
                vars_["TOKEN"] = r.stdout.strip()
            ran["cli"] += 1
        elif words[0] == "curl":
            url = next(w for w in words if w.startswith("http"))
            if "/outputs/" in url:
                wait_archived(gw, vars_["TOKEN"], vars_["JOB"])
            argv, r = curl(words, base, vars_, tmp_path)
            m = re.search(r"^HTTP/1.1 (\d+)", r.stdout, re.M)
            assert r.returncode == 0 and m, (argv, r)
            status = int(m.group(1))
            if "/v1/providers/" in url:
                assert status == 200, (argv, r.stdout[-2000:])
                assert re.search(r"^X-Idemgate-State: completed", r.stdout, re.M | re.I)
                jobs.append(re.search(r"^X-Idemgate-Job-Id: (\S+)", r.stdout,
                                      re.M | re.I).group(1))
                vars_["JOB"] = jobs[-1]
                ran["submit"] += 1
            else:
                assert status == 200, (argv, r.stdout[-2000:])
            ran["curl"] += 1
        elif words[0] in ("make", "scripts/pg.sh"):
            # What builds and where the database comes from: targets and a script that exist.
            for w in words:
                if w in ("deps-run", "all") or w.startswith("scripts/"):
                    assert w.startswith("scripts/") and os.access(os.path.join(ROOT, w), os.X_OK) \
                        or subprocess.run(["make", "-n", "-C", ROOT, w], capture_output=True
                                          ).returncode == 0, (w, line)
    assert ran["cli"] >= 10 and ran["submit"] == 3 and ran["curl"] >= 8, ran

    # Each provider's outputs were archived, and the outputs line downloaded the last one.
    for job_id in jobs:
        j = wait_archived(gw, vars_["TOKEN"], job_id)
        assert j["state"] == "completed" and all(o["state"] == "archived"
                                                 for o in j["archive"]), j
    assert {gw.job(vars_["TOKEN"], j).json()["provider"] for j in jobs} == \
        {"openai", "replicate", "runway"}
    assert len(mock.ledger()) == 3
