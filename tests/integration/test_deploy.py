"""Deployment artefacts (issue 6): the container image, Compose, Kubernetes, systemd and the env
examples are checked statically (no Docker engine runs here), and the image's runtime contract is
proved on the real binary: run as an unprivileged uid with no passwd entry, from a read-only copy
of its files, against the test database and the mock, it serves a request end to end and writes
nothing to the filesystem (every file-related system call is traced with strace)."""

import hashlib
import json
import os
import pwd
import grp
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest
import yaml

from conftest import ROOT, free_port, provider, wait_for_line

RELEASE_BIN = os.path.join(ROOT, "build", "idemgate")
MOCK_BIN_RELEASE = os.path.join(ROOT, "build", "idemgate-mock")
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
DOCKERIGNORE = os.path.join(ROOT, "docker", "Dockerfile.dockerignore")
COMPOSE = os.path.join(ROOT, "docker", "compose.yaml")
HEALTHCHECK = os.path.join(ROOT, "docker", "healthcheck.sh")
K8S_DIR = os.path.join(ROOT, "deploy", "kubernetes")
UNIT = os.path.join(ROOT, "deploy", "systemd", "idemgate.service")

SECRET_NAME = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE)",
                         re.I)
PLACEHOLDER = "replace-me"


def read(path):
    with open(path) as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# A small Dockerfile reader and the static rules.
# ---------------------------------------------------------------------------------------------

def dockerfile_instructions(text):
    """[(INSTRUCTION, args, line)] with continuation lines joined and comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, args = buf.partition(" ")
        out.append((word.upper(), args.strip(), start))
        buf = ""
    if buf:
        word, _, args = buf.partition(" ")
        out.append((word.upper(), args.strip(), start))
    return out


def dockerfile_stages(text):
    """[{name, base, instructions}] in order."""
    stages = []
    for ins, args, line in dockerfile_instructions(text):
        if ins == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append({"name": name, "base": words[0], "line": line, "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((ins, args, line))
    return stages


def exact_image_ref(ref):
    """None when ref is pinned to an exact version tag (optionally with a digest), else why."""
    name, _, digest = ref.partition("@")
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return f"{ref}: malformed digest"
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{ref}: no tag (means latest)"
    tag = last.split(":", 1)[1]
    if tag == "latest" or "latest" in tag.split("-"):
        return f"{ref}: the latest tag is not a pin"
    if not re.match(r"^v?\d+\.\d+", tag):
        return f"{ref}: tag {tag!r} is not an exact version (major.minor at least)"
    if "$" in ref:
        return f"{ref}: a variable base cannot be checked"
    return None


def env_pairs(args):
    """KEY=VALUE pairs of an ENV or ARG instruction (also the legacy `ENV KEY VALUE`)."""
    pairs = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|\'[^\']*\'|\S*)', args)
    if not pairs and args.split():
        words = args.split(None, 1)
        pairs = [(words[0], words[1] if len(words) > 1 else "")]
    return [(k, v.strip("'\"")) for k, v in pairs]


PIPE_TO_SHELL = re.compile(
    r"(curl|wget|fetch)\b[^|;&]*\|\s*(sudo\s+)?(ba|da|z|k|a)?sh\b"
    r"|(ba|da|z|k)?sh\s+(-c\s+)?[\"']?\$\((curl|wget)"
    r"|(ba|da|z|k)?sh\s+<\(\s*(curl|wget)", re.I)


def dockerfile_problems(text):
    """Every violation of the image rules in a Dockerfile's text."""
    problems = []
    stages = dockerfile_stages(text)
    if not stages:
        return ["no FROM"]
    names = {s["name"] for s in stages if s["name"]}
    m = re.match(r"\s*#\s*syntax\s*=\s*(\S+)", text)
    if m and exact_image_ref(m.group(1)) and "@sha256:" not in m.group(1):
        problems.append(f"syntax directive {m.group(1)} pulls a frontend by a floating tag")
    for s in stages:
        if s["base"].lower() in names:
            continue
        why = exact_image_ref(s["base"])
        if why:
            problems.append(f"line {s['line']}: base image {why}")
    for s in stages:
        for ins, args, line in s["instructions"]:
            if ins in ("ENV", "ARG"):
                for k, v in env_pairs(args):
                    if SECRET_NAME.search(k) and v:
                        problems.append(f"line {line}: {ins} {k} carries a value: secrets "
                                        "belong in the runtime environment, never the image")
            if ins == "RUN" and PIPE_TO_SHELL.search(args):
                problems.append(f"line {line}: a download piped to a shell")
            if ins == "ADD" and re.search(r"\b(https?|ftp)://", args):
                problems.append(f"line {line}: ADD from a URL (unverified download)")
    final = stages[-1]
    runnable = [s for s in stages if s is final or any(
        i[0] in ("ENTRYPOINT", "CMD") for i in s["instructions"])]
    for s in runnable:
        users = [a for i, a, _ in s["instructions"] if i == "USER"]
        label = s["name"] or "final"
        if not users:
            problems.append(f"stage {label}: no USER (runs as root)")
            continue
        user = users[-1]
        uid, _, gid = user.partition(":")
        if not uid.isdigit():
            problems.append(f"stage {label}: USER {user} is not numeric (runAsNonRoot cannot "
                            "verify a name)")
        elif int(uid) == 0 or (gid and (not gid.isdigit() or int(gid) == 0)):
            problems.append(f"stage {label}: USER {user} is root")
    checks = [a for i, a, _ in final["instructions"] if i == "HEALTHCHECK"]
    if not checks or checks[-1].upper().startswith("NONE"):
        problems.append("final stage: no HEALTHCHECK")
    return problems


def stage_packages(stages, name):
    """Packages apt-get installs in a stage and the stages it is built FROM."""
    by_name = {s["name"]: s for s in stages if s["name"]}
    pkgs = set()
    s = by_name[name]
    while s is not None:
        for ins, args, _ in s["instructions"]:
            if ins == "RUN":
                for cmd in re.split(r"&&|;", args):
                    m = re.search(r"apt-get\s+install\s+(.*)", cmd)
                    if m:
                        pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
        s = by_name.get(s["base"].lower())
    return pkgs


def needed_packages(binary):
    """Debian packages providing the NEEDED shared libraries of binary (libc6 excluded)."""
    dyn = subprocess.check_output(["readelf", "-d", binary], text=True)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    paths = {}
    for line in subprocess.check_output(["ldd", binary], text=True).splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            paths[m.group(1)] = m.group(2)
    pkgs = {}
    for so in needed:
        path = paths[so]
        candidates = {path, os.path.realpath(path)}
        for c in list(candidates):
            if c.startswith("/lib/"):
                candidates.add("/usr" + c)
            elif c.startswith("/usr/lib/"):
                candidates.add(c[4:])
        owner = None
        for c in sorted(candidates):
            r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
            if r.returncode == 0:
                owner = r.stdout.split(":", 1)[0].strip()
                break
        assert owner, f"no Debian package owns {so} ({path})"
        pkgs[so] = owner
    return {so: p for so, p in pkgs.items() if p != "libc6"}


def dockerignore_allows(patterns, path):
    """Whether a path survives an allow-list .dockerignore ("*" then "!path" lines)."""
    allowed = True
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        if pat == "*" or path == pat or path.startswith(pat + "/"):
            allowed = neg
    return allowed


@pytest.fixture(scope="module")
def dockerfile():
    return read(DOCKERFILE)


def test_dockerfile_meets_the_image_rules(dockerfile):
    assert dockerfile_problems(dockerfile) == []
    stages = dockerfile_stages(dockerfile)
    assert [s["name"] for s in stages] == ["build", "runtime-base", "mock", "s3-build", "s3",
                                           "runtime"]
    # Multi-stage: compilers stay in the build stage; the runtime stages descend from a base
    # that installs no -dev package and no compiler.
    runtime_pkgs = stage_packages(stages, "runtime")
    assert runtime_pkgs and not any(p.endswith("-dev") or p in ("gcc", "make", "curl", "wget")
                                    for p in runtime_pkgs), runtime_pkgs
    assert "gcc" in stage_packages(stages, "build")
    # Pinned by exact point release and by digest, the same base everywhere (ABI of the
    # build stage = ABI of the runtime).
    bases = {s["base"] for s in stages if s["base"].lower() not in ("build", "runtime-base")}
    assert len(bases) == 1, bases
    assert re.fullmatch(r"debian:12\.\d+-slim@sha256:[0-9a-f]{64}", bases.pop())
    # The gateway is the final stage: configuration from a mounted file and the environment.
    final = stages[-1]
    env = dict(kv for i, a, _ in final["instructions"] if i == "ENV" for kv in env_pairs(a))
    assert env["IDEMGATE_CONFIG"] == "/etc/idemgate/idemgate.json"
    assert env["IDEMGATE_LISTEN"].startswith("0.0.0.0:")
    entry = [a for i, a, _ in final["instructions"] if i == "ENTRYPOINT"][-1]
    assert json.loads(entry) == ["/usr/local/bin/idemgate"]
    assert json.loads([a for i, a, _ in final["instructions"] if i == "CMD"][-1]) == ["serve"]
    health = [a for i, a, _ in final["instructions"] if i == "HEALTHCHECK"][-1]
    assert '"/usr/local/bin/idemgate-healthcheck", "/healthz"' in health


@pytest.mark.parametrize("bad, expected", [
    ("FROM debian:latest\nUSER 1000\nHEALTHCHECK CMD true\n", "latest"),
    ("FROM debian\nUSER 1000\nHEALTHCHECK CMD true\n", "no tag"),
    ("FROM debian:bookworm-slim\nUSER 1000\nHEALTHCHECK CMD true\n", "not an exact version"),
    ("FROM debian:12.12-slim\nHEALTHCHECK CMD true\n", "no USER"),
    ("FROM debian:12.12-slim\nUSER root\nHEALTHCHECK CMD true\n", "not numeric"),
    ("FROM debian:12.12-slim\nUSER 0:0\nHEALTHCHECK CMD true\n", "is root"),
    ("FROM debian:12.12-slim AS b\nUSER 1000\nFROM b\nUSER 0\nHEALTHCHECK CMD true\n", "is root"),
    ("FROM debian:12.12-slim\nUSER 1000\n", "no HEALTHCHECK"),
    ("FROM debian:12.12-slim\nUSER 1000\nHEALTHCHECK NONE\n", "no HEALTHCHECK"),
    ("FROM debian:12.12-slim\nENV OPENAI_API_KEY=sk-live-123\nUSER 1\nHEALTHCHECK CMD t\n",
     "OPENAI_API_KEY carries a value"),
    ("FROM debian:12.12-slim\nARG DB_PASSWORD=hunter2\nUSER 1\nHEALTHCHECK CMD t\n",
     "DB_PASSWORD carries a value"),
    ("FROM debian:12.12-slim\nENV GITHUB_TOKEN abc\nUSER 1\nHEALTHCHECK CMD t\n",
     "GITHUB_TOKEN carries a value"),
    ("FROM debian:12.12-slim\nRUN curl -fsSL https://x.example/i.sh | sh\nUSER 1\n"
     "HEALTHCHECK CMD t\n", "piped to a shell"),
    ("FROM debian:12.12-slim\nRUN apt-get update && \\\n  wget -qO- https://x.example/i \\\n"
     "  | sudo bash -s\nUSER 1\nHEALTHCHECK CMD t\n", "piped to a shell"),
    ("FROM debian:12.12-slim\nRUN sh -c \"$(curl -fsSL https://x.example/i)\"\nUSER 1\n"
     "HEALTHCHECK CMD t\n", "piped to a shell"),
    ("FROM debian:12.12-slim\nADD https://x.example/tool /usr/bin/tool\nUSER 1\n"
     "HEALTHCHECK CMD t\n", "ADD from a URL"),
    ("# syntax=docker/dockerfile:1\nFROM debian:12.12-slim\nUSER 1\nHEALTHCHECK CMD t\n",
     "floating tag"),
])
def test_the_rules_catch_what_they_claim_to(bad, expected):
    problems = dockerfile_problems(bad)
    assert any(expected in p for p in problems), problems


def test_the_rules_accept_arg_names_without_values_and_ordinary_env():
    ok = ("FROM debian:12.12-slim@sha256:" + "a" * 64 + "\nARG API_KEY\nENV LANG=C.UTF-8 "
          "TOKEN_FILE=\nUSER 65532:65532\nHEALTHCHECK CMD [\"true\"]\n")
    assert dockerfile_problems(ok) == []


def test_runtime_stages_install_every_library_the_binaries_link(dockerfile):
    stages = dockerfile_stages(dockerfile)
    for stage, binary in (("runtime", RELEASE_BIN), ("mock", MOCK_BIN_RELEASE)):
        have = stage_packages(stages, stage)
        missing = {so: p for so, p in needed_packages(binary).items() if p not in have}
        assert not missing, f"stage {stage} lacks the packages of {missing}"
        copies = [a for i, a, _ in next(s for s in stages if s["name"] == stage)["instructions"]
                  if i == "COPY" and "--from=build" in a]
        assert any(os.path.basename(binary) in a for a in copies), copies


def test_everything_the_image_copies_exists_and_passes_the_context_filter(dockerfile):
    patterns = [ln.strip() for ln in read(DOCKERIGNORE).splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert patterns[0] == "*", "the context filter is an allow-list"
    # What must never reach a builder.
    for secret_path in (".pgdata/data", ".run/demo.token", "docker/idemgate.env",
                        "docker/postgres.env", ".git/config", "build/idemgate"):
        assert not dockerignore_allows(patterns, secret_path), secret_path
    for stage in dockerfile_stages(dockerfile):
        for ins, args, line in stage["instructions"]:
            if ins not in ("COPY", "ADD") or "--from=" in args:
                continue
            words = [w for w in args.split() if not w.startswith("--")]
            for src in words[:-1]:
                src = src.rstrip("/")
                assert os.path.exists(os.path.join(ROOT, src)), f"line {line}: {src} missing"
                assert dockerignore_allows(patterns, src), f"line {line}: {src} filtered out"
    # The provider profiles the configurations name by their image path are shipped there.
    assert re.search(r"COPY\s+deploy/providers/\s+" + re.escape(IMAGE_PROFILES), dockerfile)
    # The probe the HEALTHCHECKs and the probes call is the script in this directory.
    assert re.search(r"COPY\s+--chmod=0555\s+docker/healthcheck\.sh\s+"
                     r"/usr/local/bin/idemgate-healthcheck", dockerfile)


def run_probe(*args, env=None, uid=None):
    cmd = [HEALTHCHECK, *args]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] + cmd
    return subprocess.run(cmd, env=dict(os.environ, **(env or {})), capture_output=True,
                          timeout=30).returncode


def test_healthcheck_probe_answers_like_the_gateway(gateway, mock):
    port = gateway.port
    assert run_probe("/healthz", f"127.0.0.1:{port}") == 0
    assert run_probe("/readyz", f"0.0.0.0:{port}") == 0
    assert run_probe(env={"IDEMGATE_LISTEN": f"0.0.0.0:{port}"}) == 0
    assert run_probe("/no-such-endpoint", f"127.0.0.1:{port}") == 1   # 404
    assert run_probe("/healthz", f"127.0.0.1:{free_port()}") == 1     # nothing listens
    assert run_probe("/_health", f"127.0.0.1:{mock.port}") == 0       # the mock's probe
    assert run_probe("/healthz", f"127.0.0.1:{mock.port}") == 1       # the mock has no /healthz
    assert run_probe("healthz", f"127.0.0.1:{port}") == 1             # not a path


# ---------------------------------------------------------------------------------------------
# Configuration files and env examples.
# ---------------------------------------------------------------------------------------------

def config_env_names():
    out = subprocess.check_output([RELEASE_BIN, "config-reference"], text=True)
    names = set(re.findall(r"^\|\s*`[a-z_0-9]+`\s*\|\s*`([A-Z_0-9]+)`", out, re.M))
    assert "DATABASE_URL" in names and "IDEMGATE_LISTEN" in names, out
    return names


IMAGE_PROFILES = "/usr/share/idemgate/providers/"   # where the image ships deploy/providers/


def on_host(cfg_text):
    """A configuration written for the image, with its profile paths mapped to the repository."""
    return cfg_text.replace(IMAGE_PROFILES, os.path.join(ROOT, "deploy", "providers") + "/")


def check_config(cfg_text, extra_env=None):
    # Written beside the shipped configuration, so that a profile it names relative to itself
    # (deploy/idemgate.example.json's providers/openai-images.json) is found as `make run` finds it.
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False,
                                     dir=os.path.join(ROOT, "deploy")) as f:
        f.write(on_host(cfg_text))
    try:
        env = {"PATH": os.environ["PATH"], **(extra_env or {})}
        return subprocess.run([RELEASE_BIN, "--config", f.name, "check-config"], env=env,
                              capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(f.name)


def secret_envs(cfg, base_dir=os.path.join(ROOT, "deploy")):
    """The variables a configuration reads secrets from (auth and webhook, profiles included,
    and the archive bucket's key pair when it archives to s3)."""
    names = set()
    if cfg.get("archive_backend") == "s3":
        names.add(cfg.get("archive_s3_access_key_env", "AWS_ACCESS_KEY_ID"))
        names.add(cfg.get("archive_s3_secret_key_env", "AWS_SECRET_ACCESS_KEY"))
    for entry in cfg.get("providers", []):
        merged = {}
        if "profile" in entry:
            path = on_host(entry["profile"])
            with open(path if os.path.isabs(path) else os.path.join(base_dir, path)) as f:
                merged.update(json.load(f))
        merged.update(entry)
        for section in ("auth", "webhook"):
            if merged.get(section, {}).get("secret_env"):
                names.add(merged[section]["secret_env"])
    return names


def parse_env_file(path):
    """{KEY: value} of an env file, commented-out `#KEY=value` examples included."""
    out = {}
    for line in read(path).splitlines():
        m = re.match(r"^#?([A-Z][A-Z0-9_]*)=(.*)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.mark.parametrize("env_file, config", [
    ("docker/idemgate.env.example", "docker/idemgate.compose.json"),
    ("deploy/idemgate.env.example", "deploy/idemgate.example.json"),
])
def test_env_examples_name_only_real_settings_and_hold_only_placeholders(env_file, config):
    cfg = json.loads(read(os.path.join(ROOT, config)))
    known = config_env_names() | secret_envs(cfg)
    env = parse_env_file(os.path.join(ROOT, env_file))
    assert "DATABASE_URL" in env
    assert secret_envs(cfg) <= set(env), "every provider secret has its line"
    unknown = set(env) - known
    assert not unknown, f"{env_file} names variables idemgate does not read: {unknown}"
    for k, v in env.items():
        if SECRET_NAME.search(k) and not k.endswith("_SHA256") and v:
            assert PLACEHOLDER in v, f"{k} in {env_file} must be a placeholder"
    pw = re.match(r"postgresql://[^:/@]+:([^@]+)@", env["DATABASE_URL"])
    assert pw and PLACEHOLDER in pw.group(1), "the database password is a placeholder"


def test_compose_env_examples_agree_on_the_database_password():
    gw = parse_env_file(os.path.join(ROOT, "docker", "idemgate.env.example"))
    pg = parse_env_file(os.path.join(ROOT, "docker", "postgres.env.example"))
    assert set(pg) == {"POSTGRES_PASSWORD"}
    assert f":{pg['POSTGRES_PASSWORD']}@postgres:5432/" in gw["DATABASE_URL"]
    ignored = read(os.path.join(ROOT, "docker", ".gitignore"))
    assert re.search(r"^\*\.env$", ignored, re.M), "real env files are git-ignored"


@pytest.mark.parametrize("config", ["docker/idemgate.compose.json", "deploy/idemgate.example.json"])
def test_shipped_configurations_pass_check_config(config):
    text = read(os.path.join(ROOT, config))
    env = {k: "placeholder" for k in secret_envs(json.loads(text))}
    r = check_config(text, env)
    assert r.returncode == 0 and ": ok (" in r.stdout, (r.stdout, r.stderr)
    assert "warning" not in r.stderr


def test_check_config_rejects_a_broken_configuration():
    # The configuration checks above can fail: a lease shorter than a provider call is refused.
    cfg = json.loads(read(os.path.join(ROOT, "docker", "idemgate.compose.json")))
    cfg["lease_seconds"] = 5
    r = check_config(json.dumps(cfg), {"MOCK_IMAGES_API_KEY": "x"})
    assert r.returncode == 1 and "lease_seconds" in r.stderr


# ---------------------------------------------------------------------------------------------
# Compose.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(read(COMPOSE))


def gateway_services(compose):
    return {n: s for n, s in compose["services"].items()
            if s.get("build", {}).get("target") == "runtime" and s.get("command") is None}


def test_compose_runs_postgres_a_one_shot_migration_two_replicas_and_the_mock(compose,
                                                                             dockerfile):
    services = compose["services"]
    stage_names = {s["name"] for s in dockerfile_stages(dockerfile)}
    gws = gateway_services(compose)
    assert len(gws) >= 2, "two gateway replicas"
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, s in gws.items():
        assert s["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert s["environment"]["IDEMGATE_LISTEN"].startswith("0.0.0.0:")
    mock = services["mock"]
    assert mock["build"]["target"] == "mock"
    for s in services.values():
        if "build" in s:
            assert s["build"]["dockerfile"] == "docker/Dockerfile"
            assert s["build"]["target"] in stage_names
            assert os.path.isfile(os.path.join(ROOT, "docker", s["build"]["context"],
                                               s["build"]["dockerfile"]))
    # Published ports are for this host only.
    for name, s in services.items():
        for p in s.get("ports", []):
            assert str(p).startswith("127.0.0.1:"), (name, p)
    host_ports = [str(p).split(":")[1] for s in gws.values() for p in s.get("ports", [])]
    assert len(set(host_ports)) == len(host_ports) == len(gws)


def test_compose_hardens_every_service(compose, dockerfile):
    stages = {s["name"]: s for s in dockerfile_stages(dockerfile)}
    for name, s in compose["services"].items():
        assert s.get("read_only") is True, f"{name}: read_only"
        assert "ALL" in s.get("cap_drop", []), f"{name}: cap_drop ALL"
        assert "no-new-privileges:true" in s.get("security_opt", []), f"{name}: no-new-privileges"
        assert "privileged" not in s and "cap_add" not in s, name
        if "user" in s:
            uid = str(s["user"]).split(":")[0]
            assert uid.isdigit() and int(uid) != 0, f"{name}: user {s['user']}"
        else:
            target = s["build"]["target"]
            users = [a for i, a, _ in stages[target]["instructions"] if i == "USER"]
            assert users and users[-1].split(":")[0] not in ("0", "root"), name
        long_running = s.get("restart") != "no"
        if long_running:
            hc = s.get("healthcheck", {})
            assert hc.get("test") and not hc.get("disable"), f"{name}: healthcheck"
        for v in s.get("volumes", []):
            if isinstance(v, dict) and v.get("type") == "bind":
                assert v.get("read_only") is True, f"{name}: bind mount {v['target']} writable"
                assert os.path.exists(os.path.join(ROOT, "docker", v["source"])), v["source"]
    gw = next(iter(gateway_services(compose).values()))
    assert gw["healthcheck"]["test"] == ["CMD", "/usr/local/bin/idemgate-healthcheck", "/readyz"]
    # A gateway writes nowhere but its archive folder (the spool of copies in progress): no
    # tmpfs, every other volume read-only, and no two replicas on one spool.
    spools = []
    for name, g in gateway_services(compose).items():
        assert "tmpfs" not in g, name
        writable = [v for v in g.get("volumes", []) if not v.get("read_only")]
        assert [v["target"] for v in writable] == ["/var/lib/idemgate/archive"], (name, writable)
        assert writable[0]["type"] == "volume", name
        spools.append(writable[0]["source"])
    assert len(set(spools)) == len(spools)


def test_compose_keeps_secrets_out_of_the_file(compose):
    raw = read(COMPOSE)
    assert PLACEHOLDER not in raw and "sk-" not in raw
    for name, s in compose["services"].items():
        env = s.get("environment", {})
        if isinstance(env, list):
            env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
        for k, v in env.items():
            assert not (SECRET_NAME.search(k) and v), f"{name}: {k} inline"
            assert not re.search(r"://[^/\s:@]+:[^@\s]+@", str(v or "")), f"{name}: {k} has a password"
        for f in s.get("env_file", []):
            assert f.endswith(".env"), f
            assert os.path.isfile(os.path.join(ROOT, "docker", f + ".example")), f


COMPOSE_LINT = os.path.join(ROOT, "tests", "compose")


def compose_lint(path):
    """dclint (npm, pinned by tests/compose/package-lock.json) on a Compose file: the YAML merge
    keys resolved, then the Compose Specification's JSON schema (the schema Docker Compose v2's
    parser validates with, top-level `name:` included), then its correctness rules
    (tests/compose/dclint.json turns off the ordering and quoting style rules, and
    no-build-and-image: Compose tags what it builds with `image:`). Any warning fails."""
    subprocess.run([os.path.join(ROOT, "scripts", "npm-tools.sh"), COMPOSE_LINT], check=True,
                   timeout=900)
    return subprocess.run([os.path.join(COMPOSE_LINT, "node_modules", ".bin", "dclint"),
                           "-c", os.path.join(COMPOSE_LINT, "dclint.json"), "--max-warnings", "0",
                           "--color=false", path], capture_output=True, text=True, timeout=120)


def test_compose_file_passes_the_compose_specification():
    r = compose_lint(COMPOSE)
    assert r.returncode == 0, r.stdout + r.stderr
    # The project name stays: the specification has it (only the v1 tool refused it).
    assert yaml.safe_load(read(COMPOSE))["name"] == "idemgate"


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("  restart: unless-stopped\n  stop_grace_period",
                         "  restart: unless-stopped\n  bogus_key: 1\n  stop_grace_period"),
     "must NOT have additional properties"),
    (lambda t: t.replace("condition: service_completed_successfully",
                         "condition: service_finished"), "must be equal to one of"),
    (lambda t: t.replace("name: idemgate\n", "name: [idemgate]\n"), "must be string"),
])
def test_compose_check_catches_what_the_specification_forbids(tmp_path, edit, expected):
    text = read(COMPOSE)
    bad = edit(text)
    assert bad != text
    path = tmp_path / "compose.yaml"
    path.write_text(bad)
    r = compose_lint(str(path))
    assert r.returncode != 0 and "invalid-schema" in r.stdout, r.stdout + r.stderr


def test_compose_images_are_pinned(compose):
    for name, s in compose["services"].items():
        if "build" in s:
            assert s["image"].endswith(":local"), f"{name}: a locally built image"
        else:
            assert exact_image_ref(s["image"]) is None, exact_image_ref(s["image"])
            assert "@sha256:" in s["image"], f"{name}: pinned by digest too"


def test_compose_config_mount_is_the_checked_configuration(compose):
    gw = next(iter(gateway_services(compose).values()))
    mount = next(v for v in gw["volumes"] if v["target"] == gw["environment"]["IDEMGATE_CONFIG"])
    cfg = json.loads(read(os.path.join(ROOT, "docker", mount["source"])))
    assert "listen" not in cfg, "the listen address comes from IDEMGATE_LISTEN"
    assert {p["base_url"] for p in cfg["providers"]} == {"http://mock:9090"}
    assert "mock" in compose["services"]
    # The outputs the replicas archive and serve (the compose file's promise) are copied from
    # the URLs the mock hands out: they name it as the replicas reach it, and the images entry
    # allows that host. Before, the mock named itself by its listen address (0.0.0.0) and the
    # entry allowed no host: every output ended `failed` in the archive, 404 to the client.
    command = compose["services"]["mock"]["command"]
    public = command[command.index("--public-url") + 1]
    assert public == "http://mock:9090"
    images = next(p for p in cfg["providers"] if p["name"] == "mock-images")
    host = public[len("http://"):].rsplit(":", 1)[0]
    assert host in images["archive"]["hosts"] and images["archive"]["allow_http"], images


def test_the_mock_hands_out_its_public_url():
    """--public-url: the outputs' URLs name the mock as its clients reach it (Compose's
    http://mock:9090), not its listen address; a URL with a path or without a port is refused."""
    port = free_port()
    proc = subprocess.Popen([MOCK_BIN_RELEASE, "--listen", f"127.0.0.1:{port}",
                             "--public-url", "http://mock:9090"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert f"listening on 127.0.0.1:{port}" in proc.stdout.readline()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/images/generations",
                                     data=b'{"prompt":"a","n":2}', method="POST",
                                     headers={"Authorization": "Bearer x",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            urls = [d["url"] for d in json.loads(r.read())["data"]]
        assert len(urls) == 2 and all(u.startswith("http://mock:9090/files/") for u in urls), urls
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    for bad in ("http://mock/x", "http://mock", "https://mock:9090", "http://mock:9090/x"):
        r = subprocess.run([MOCK_BIN_RELEASE, "--public-url", bad], capture_output=True,
                           text=True, timeout=10)
        assert r.returncode != 0 and "--public-url" in r.stderr, (bad, r.stderr)


# ---------------------------------------------------------------------------------------------
# Kubernetes.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def k8s():
    docs = {}
    for fn in sorted(os.listdir(K8S_DIR)):
        if fn.endswith(".yaml"):
            docs[fn] = [d for d in yaml.safe_load_all(read(os.path.join(K8S_DIR, fn))) if d]
    return docs


def k8s_objects(k8s, kind):
    return [d for docs in k8s.values() for d in docs if d.get("kind") == kind]


def test_kustomization_lists_every_manifest(k8s):
    kust = k8s["kustomization.yaml"][0]
    files = {fn for fn in k8s if fn != "kustomization.yaml"}
    assert set(kust["resources"]) == files
    for docs in k8s.values():
        for d in docs:
            assert d.get("apiVersion") and d.get("kind"), d


def pod_containers(pod):
    return [(c, True) for c in pod.get("initContainers", [])] + \
           [(c, False) for c in pod.get("containers", [])]


def assert_hardened(pod, where):
    psc = pod.get("securityContext", {})
    assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
    assert pod.get("automountServiceAccountToken") is False, where
    for c, _ in pod_containers(pod):
        sc = c.get("securityContext", {})
        label = f"{where}/{c['name']}"
        assert sc.get("allowPrivilegeEscalation") is False, label
        assert sc.get("readOnlyRootFilesystem") is True, label
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], label
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, label
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        assert isinstance(uid, int) and uid > 0, label
        assert exact_image_ref(c["image"]) is None, exact_image_ref(c["image"])
        assert c.get("resources", {}).get("limits", {}).get("memory"), label


def test_application_pod_runs_idemgate_as_a_localhost_sidecar(k8s):
    dep = k8s_objects(k8s, "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    assert_hardened(pod, "Deployment")
    sidecars = [c for c, init in pod_containers(pod) if "idemgate" in c["image"].split("/")[-1]
                and c.get("args") != ["migrate"]]
    assert len(sidecars) == 1
    sc = sidecars[0]
    assert sc in pod.get("initContainers", []) and sc["restartPolicy"] == "Always", \
        "a native sidecar: up before the application, down after it"
    env = {e["name"]: e for e in sc["env"]}
    listen = env["IDEMGATE_LISTEN"]["value"]
    assert listen.startswith("127.0.0.1:"), "reachable from the pod only"
    assert sc["securityContext"]["runAsUser"] == 65532
    probe = lambda p: sc[p]["exec"]["command"]  # noqa: E731
    assert probe("readinessProbe") == ["/usr/local/bin/idemgate-healthcheck", "/readyz"]
    assert probe("livenessProbe") == ["/usr/local/bin/idemgate-healthcheck", "/healthz"]
    # Configuration: the ConfigMap file at IDEMGATE_CONFIG, secrets from the Secret.
    cfg_path = env["IDEMGATE_CONFIG"]["value"]
    mount = next(m for m in sc["volumeMounts"] if cfg_path.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cms = {c["metadata"]["name"]: c for c in k8s_objects(k8s, "ConfigMap")}
    assert os.path.basename(cfg_path) in cms[vol["configMap"]["name"]]["data"]
    secrets = {s["metadata"]["name"] for s in k8s_objects(k8s, "Secret")}
    assert {r["secretRef"]["name"] for r in sc["envFrom"]} <= secrets
    # The application talks to the sidecar on localhost with its own token.
    apps = [c for c, init in pod_containers(pod) if not init]
    assert len(apps) == 1
    app_env = {e["name"]: e.get("value") for e in apps[0]["env"]}
    assert app_env["IDEMGATE_URL"] == f"http://{listen}"
    assert {r["secretRef"]["name"] for r in apps[0]["envFrom"]} <= secrets
    assert dep["spec"]["replicas"] >= 2


def test_migrations_run_in_the_pod_before_the_gateway(k8s):
    """`idemgate migrate` is the pod's first init container, from the gateway's image, and no
    Job: a Job's pod template is immutable, so a Job of a fixed name, kept for its
    ttlSecondsAfterFinished, made the next release's `kubectl apply -k` (a new image) fail."""
    assert not k8s_objects(k8s, "Job"), "a Job of a fixed name refuses the next image"
    pod = k8s_objects(k8s, "Deployment")[0]["spec"]["template"]["spec"]
    c, *later = pod["initContainers"]
    assert c["args"] == ["migrate"] and "restartPolicy" not in c, \
        "a plain init container: it has ended before the sidecar starts"
    sidecar = next(s for s in later if s.get("restartPolicy") == "Always")
    assert c["image"] == sidecar["image"], "the migrations of the gateway's own release"
    db = next(e for e in c["env"] if e["name"] == "DATABASE_URL")["valueFrom"]["secretKeyRef"]
    secret = next(s for s in k8s_objects(k8s, "Secret") if s["metadata"]["name"] == db["name"])
    assert db["key"] in secret["stringData"]


def test_secrets_hold_placeholders_only_and_cover_the_providers(k8s):
    secrets = k8s_objects(k8s, "Secret")
    assert secrets
    for s in secrets:
        assert "data" not in s, "no base64 blobs: they hide what is committed"
        for k, v in s["stringData"].items():
            assert PLACEHOLDER in v, f"{s['metadata']['name']}.{k} is not a placeholder"
    cm = k8s_objects(k8s, "ConfigMap")[0]
    cfg = json.loads(cm["data"]["idemgate.json"])
    gw_secret = next(s for s in secrets if "DATABASE_URL" in s["stringData"])
    assert secret_envs(cfg) <= set(gw_secret["stringData"])


def test_configmap_configuration_passes_check_config(k8s):
    cm = k8s_objects(k8s, "ConfigMap")[0]
    text = cm["data"]["idemgate.json"]
    r = check_config(text, {k: "x" for k in secret_envs(json.loads(text))})
    assert r.returncode == 0 and ": ok (" in r.stdout, (r.stdout, r.stderr)


# ---------------------------------------------------------------------------------------------
# systemd.
# ---------------------------------------------------------------------------------------------

def unit_sections(text):
    out, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        k, _, v = line.partition("=")
        out[section].setdefault(k.strip(), []).append(v.strip())
    return out


def test_systemd_unit_is_hardened():
    u = unit_sections(read(UNIT))
    s = {k: v[-1] for k, v in u["Service"].items()}
    assert s["ExecStart"].split()[-1] == "serve"
    assert s.get("DynamicUser") == "yes" or (s.get("User") not in (None, "root", "0"))
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "CapabilityBoundingSet": "",
                       "AmbientCapabilities": "", "RestrictSUIDSGID": "yes",
                       "MemoryDenyWriteExecute": "yes", "KillSignal": "SIGTERM"}.items():
        assert s.get(key) == value, f"{key}={s.get(key)!r}, expected {value!r}"
    assert set(s["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert "@system-service" in u["Service"]["SystemCallFilter"]
    # It writes nowhere but its archive (proved below for the rest): the state directory
    # /var/lib/idemgate, where archive_dir's default lives, and no other writable path.
    assert s.get("StateDirectory") == "idemgate"
    for key in ("ReadWritePaths", "LogsDirectory", "CacheDirectory"):
        assert key not in s, key
    assert s["EnvironmentFile"] == "/etc/idemgate/idemgate.env"
    assert s["Environment"] == "IDEMGATE_CONFIG=/etc/idemgate/idemgate.json"
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


def test_connection_budget_of_a_replica_is_what_scaling_md_says(gateway_factory, database_url,
                                                                token, psql):
    """SCALING.md: a replica holds at most db_workers + intake_writers + dispatch_workers +
    reconcile_workers + poll_workers + 3 connections (waiters' LISTEN, reaper, wake signaller).
    Measured on a live replica whose connections carry their own application_name, before and
    after every database worker has served requests."""
    formula = ("db_workers + intake_writers + dispatch_workers + reconcile_workers + "
               "poll_workers +\n    archive_workers + 3")
    assert formula in read(os.path.join(ROOT, "deploy", "SCALING.md"))
    settings = {"db_workers": 3, "intake_writers": 2, "dispatch_workers": 2,
                "reconcile_workers": 1, "poll_workers": 1, "archive_workers": 1}
    budget = sum(settings.values()) + 3
    background = budget - settings["db_workers"]
    app = "budget_" + uuid.uuid4().hex[:10]
    gw = gateway_factory(**settings, env={"DATABASE_URL": database_url +
                                          f"&application_name={app}"})

    def held():
        return int(psql(f"SELECT count(*) FROM pg_stat_activity "
                        f"WHERE application_name = '{app}'")[0][0])

    deadline = time.monotonic() + 20
    while held() < background and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held() == background, \
        "workers, reaper, waiters and the wake signaller hold theirs from the start"
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as ex:
        answers = list(ex.map(lambda _: gw.http.request(
            "GET", "/v1/jobs?limit=1", headers={"Authorization": f"Bearer {token}"}).status,
            range(120)))
    assert answers == [200] * 120
    assert background < held() <= budget


# ---------------------------------------------------------------------------------------------
# Highly available PostgreSQL (deploy/ha/, issue 14 §3): the settings the promise needs.
# ---------------------------------------------------------------------------------------------

HA_DIR = os.path.join(ROOT, "deploy", "ha")
BUDGET_SETTINGS = ("db_workers", "intake_writers", "dispatch_workers", "reconcile_workers",
                   "poll_workers", "archive_workers")


def per_replica_budget():
    """db_workers + intake_writers + dispatch_workers + reconcile_workers + poll_workers +
    archive_workers + 3, from the defaults the binary itself prints (`idemgate
    config-reference`). Before, archive_workers was left out: the budget said 13 where a
    replica holds 14."""
    out = subprocess.check_output([RELEASE_BIN, "config-reference"], text=True, timeout=30)
    defaults = {}
    for line in out.splitlines():
        cells = [c.strip().strip("`") for c in line.split("|")]
        if len(cells) > 4 and cells[1] in BUDGET_SETTINGS:
            defaults[cells[1]] = int(cells[3])
    assert set(defaults) == set(BUDGET_SETTINGS), defaults
    return sum(defaults.values()) + 3


def ha_example_budget():
    """The example of deploy/ha/README.md and SCALING.md: 20 replicas with the defaults,
    maxSurge 25 % (5 more), 10 for admin."""
    return (20 + 5) * per_replica_budget() + 10


# SECRET_NAME without KEY: these files have keys named *Key (topologyKey) that hold none.
HA_SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE)", re.I)


def assert_no_secret_values(doc, where):
    if isinstance(doc, dict):
        for k, v in doc.items():
            if HA_SECRET_NAME.search(str(k)) and isinstance(v, (str, int)):
                assert v == PLACEHOLDER, f"{where}: {k} holds a value"
            assert_no_secret_values(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            assert_no_secret_values(v, f"{where}[{i}]")


def test_ha_readme_states_the_budget_the_binary_has():
    text = read(os.path.join(HA_DIR, "README.md"))
    per = per_replica_budget()
    assert ("db_workers + intake_writers + dispatch_workers + reconcile_workers + "
            "poll_workers + archive_workers + 3") in " ".join(text.split())
    assert f"({per} with the defaults" in text
    assert f"(20 + 5) × {per} + 10 = {ha_example_budget()}" in text


def test_patroni_example_keeps_acknowledged_intents_across_a_failover():
    p = yaml.safe_load(read(os.path.join(HA_DIR, "patroni.yml")))
    dcs = p["bootstrap"]["dcs"]
    # Only a synchronous standby is promoted, and without one writes wait.
    assert dcs["synchronous_mode"] is True
    assert dcs["synchronous_mode_strict"] is True
    assert dcs.get("synchronous_node_count", 1) >= 1
    pg = dcs["postgresql"]
    assert pg["parameters"]["synchronous_commit"] in ("on", "remote_apply")
    assert int(pg["parameters"]["max_connections"]) >= ha_example_budget()
    assert pg["use_pg_rewind"] is True  # the old primary rejoins as a standby
    assert "data-checksums" in p["bootstrap"]["initdb"]
    assert_no_secret_values(p, "patroni.yml")
    assert all("password" not in str(v).lower() for v in p["postgresql"]["authentication"]
               .values()), "passwords come from PATRONI_*_PASSWORD"


def test_cloudnative_pg_example_keeps_acknowledged_intents_across_a_failover():
    docs = [d for d in yaml.safe_load_all(read(os.path.join(HA_DIR,
                                                            "cloudnative-pg-cluster.yaml"))) if d]
    clusters = [d for d in docs if d.get("kind") == "Cluster"]
    assert len(clusters) == 1 and clusters[0]["apiVersion"] == "postgresql.cnpg.io/v1"
    spec = clusters[0]["spec"]
    assert spec["instances"] >= 3  # a synchronous standby to spare
    sync = spec["postgresql"]["synchronous"]
    assert sync["method"] in ("any", "first") and sync["number"] >= 1
    assert sync["dataDurability"] == "required"
    params = spec["postgresql"]["parameters"]
    assert params["synchronous_commit"] in ("on", "remote_apply")
    assert int(params["max_connections"]) >= ha_example_budget()
    assert exact_image_ref(spec["imageName"]) is None, spec["imageName"]
    assert_no_secret_values(clusters[0], "cloudnative-pg-cluster.yaml")


def test_ha_connection_string_names_every_node_and_wants_the_writable_one():
    text = read(os.path.join(HA_DIR, "README.md"))
    block = text[text.index("DATABASE_URL='") + len("DATABASE_URL='"):]
    conninfo = " ".join(block[:block.index("'")].split())
    kv = dict(item.split("=", 1) for item in conninfo.split())
    assert kv["target_session_attrs"] == "read-write"
    assert len(kv["host"].split(",")) == len(kv["port"].split(",")) >= 2
    assert int(kv["connect_timeout"]) > 0 and "password" not in kv
    for key in ("keepalives_idle", "keepalives_interval", "keepalives_count",
                "tcp_user_timeout"):
        assert int(kv[key]) > 0, key


# ---------------------------------------------------------------------------------------------
# The runtime contract, without Docker.
# ---------------------------------------------------------------------------------------------

WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND", "O_TMPFILE")
# System calls that change the filesystem whatever their arguments (when they succeed).
MUTATING = {"mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat",
            "renameat2", "link", "linkat", "symlink", "symlinkat", "truncate", "chmod",
            "fchmodat", "fchmodat2", "chown", "fchownat", "lchown", "mknod", "mknodat",
            "utime", "utimes", "utimensat", "futimesat", "setxattr", "lsetxattr",
            "removexattr", "lremovexattr", "mount", "umount2", "swapon", "acct", "chroot",
            "pivot_root", "quotactl", "inotify_add_watch"}
# Opening these for writing is not writing to the filesystem.
WRITE_OK = {"/dev/null", "/dev/tty", "/dev/urandom", "/dev/random"}


def trace_calls(trace_text):
    """(name, args, result) of each system call in an strace log, with the halves of a call
    that another thread interrupted (`<unfinished ...>` / `<... name resumed>`) joined."""
    pending = {}
    for line in trace_text.splitlines():
        m = re.match(r"^(\d+\s+)?(.*)$", line)
        pid, rest = (m.group(1) or "").strip(), m.group(2)
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        r = re.match(r"^<\.\.\. (\w+) resumed>(.*)$", rest)
        if r:
            rest = pending.pop(pid, r.group(1) + "(") + r.group(2)
        c = re.match(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)", rest)
        if c:
            yield c.group(1), c.group(2), c.group(3), line


def filesystem_writes(trace_text):
    """The successful system calls in an strace log that write to the filesystem."""
    bad = []
    for name, args, result, line in trace_calls(trace_text):
        if result == "?" or result.startswith("-"):
            continue  # failed calls change nothing
        if name in ("open", "openat", "openat2", "creat"):
            path = re.search(r'"((?:[^"\\]|\\.)*)"', args)
            path = path.group(1) if path else "?"
            if name == "creat" or any(f in args for f in WRITE_FLAGS):
                if path not in WRITE_OK:
                    bad.append(line)
        elif name in MUTATING:
            bad.append(line)
        elif name == "bind" and "AF_INET" not in args:
            bad.append(line)  # an AF_UNIX bind creates a socket file
    return bad


def test_write_detector_sees_writes():
    trace = "\n".join([
        '10 openat(AT_FDCWD, "/etc/passwd", O_RDONLY|O_CLOEXEC) = 3',
        '10 openat(AT_FDCWD, "/var/lib/x", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 4',
        '11 openat(AT_FDCWD, "/tmp/nope", O_RDWR|O_CREAT, 0600) = -1 EACCES (Permission denied)',
        '11 mkdir("/tmp/d", 0700) = 0',
        '12 bind(5, {sa_family=AF_UNIX, sun_path="/tmp/s"}, 110) = 0',
        '12 bind(6, {sa_family=AF_INET, sin_port=htons(8080)}, 16) = 0',
        '13 openat(AT_FDCWD, "/dev/null", O_WRONLY) = 5',
        '13 renameat2(AT_FDCWD, "/a", AT_FDCWD, "/b", 0) = 0',
        # Interrupted by another thread: the two halves are one call.
        '14 openat(AT_FDCWD, "/var/log/gw.log", O_WRONLY|O_APPEND <unfinished ...>',
        '15 futex(0x7f, FUTEX_WAKE_PRIVATE, 1) = 0',
        '14 <... openat resumed>) = 7',
        # strace -ff: no pid column.
        'unlink("/tmp/pidfile") = 0',
    ])
    found = filesystem_writes(trace)
    assert len(found) == 6, found
    assert "/var/lib/x" in found[0] and "mkdir" in found[1] and "AF_UNIX" in found[2]
    assert "renameat2" in found[3] and "resumed" in found[4] and "unlink" in found[5]


def uid_without_account():
    """A uid and gid that no passwd or group entry names: like USER 65532:65532 in an image
    built FROM scratch-like bases, nothing may depend on a name lookup."""
    for uid in range(65532, 60000, -1):
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(uid)
            continue
        except KeyError:
            return uid
    raise AssertionError("no free uid between 60001 and 65532")


def tree_snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    return fields


def test_runs_unprivileged_from_a_read_only_copy_and_writes_nowhere(database_url, mock, token,
                                                                    tmp_path):
    """The container's runtime contract on the host: a read-only root filesystem, a numeric
    uid without an account, no capabilities, no-new-privileges, configuration from a file and
    the environment only. strace records every file-related system call of the gateway and its
    threads; a successful one that could create, change or remove a file fails the test. An
    fd-level write (write(2)) can only reach a file opened for writing, so checking the opens,
    creates, renames, links, unlinks, chmods and AF_UNIX binds covers every way to the disk;
    the inherited stdout/stderr pipes are the only declared outputs."""
    uid = uid_without_account()
    ro = tempfile.mkdtemp(prefix="idemgate-ro-")
    trace = tmp_path / "strace.log"
    port = free_port()
    try:
        shutil.copy2(RELEASE_BIN, os.path.join(ro, "idemgate"))
        shutil.copy2(HEALTHCHECK, os.path.join(ro, "idemgate-healthcheck"))
        # archive_workers 0: a replica that archives writes its copies' spool and, with the
        # local backend, its objects under archive_dir (a volume: test_archive.py, and the
        # archive volumes of docker/compose.yaml and deploy/kubernetes/); everything else
        # writes nothing, which is what this proves.
        cfg = {"http_threads": 2, "dispatch_workers": 1, "lease_seconds": 10,
               "reaper_interval_ms": 200, "log_level": "info", "archive_workers": 0,
               "providers": [provider("mock-images", mock.url,
                                      auth={"header": "Authorization", "prefix": "Bearer ",
                                            "secret_env": "MOCK_IMAGES_API_KEY"})]}
        with open(os.path.join(ro, "idemgate.json"), "w") as f:
            json.dump(cfg, f)
        os.chmod(os.path.join(ro, "idemgate"), 0o555)
        os.chmod(os.path.join(ro, "idemgate-healthcheck"), 0o555)
        os.chmod(os.path.join(ro, "idemgate.json"), 0o444)
        os.chmod(ro, 0o555)
        before = tree_snapshot(ro)

        env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": database_url,
               "IDEMGATE_CONFIG": os.path.join(ro, "idemgate.json"),
               "IDEMGATE_LISTEN": f"127.0.0.1:{port}", "MOCK_IMAGES_API_KEY": "sk-ro-canary"}
        # -ff: one log per thread, so no call is split between two lines of one file.
        cmd = ["strace", "-ff", "-qq", "-o", str(trace),
               "-e", "trace=%file,bind,socket,connect",
               "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
               "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--",
               os.path.join(ro, "idemgate"), "serve"]
        proc = subprocess.Popen(cmd, cwd=ro, env=env, stdout=subprocess.PIPE,
                                stderr=open(tmp_path / "gateway.log", "w"))
        try:
            wait_for_line(proc, "listening")
            children = read(f"/proc/{proc.pid}/task/{proc.pid}/children").split()
            assert len(children) == 1, children
            st = proc_status(children[0])
            assert os.readlink(f"/proc/{children[0]}/exe") == os.path.join(ro, "idemgate")
            assert st["Uid"].split() == [str(uid)] * 4
            assert st["Gid"].split() == [str(uid)] * 4
            assert st["Groups"] == ""
            assert int(st["CapEff"], 16) == int(st["CapPrm"], 16) == 0
            assert int(st["CapBnd"], 16) == 0 and int(st["CapAmb"], 16) == 0
            assert st["NoNewPrivs"] == "1"

            base = f"http://127.0.0.1:{port}"
            key = "ro-" + uuid.uuid4().hex
            req = urllib.request.Request(
                base + "/v1/providers/mock-images/images/generations",
                data=b'{"prompt": "read-only", "n": 1}', method="POST",
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key,
                         "Prefer": "wait=10", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                job_id = r.headers["X-Idemgate-Job-Id"]
                assert json.loads(r.read())["data"]
            assert len(mock.creates_for(job_id)) == 1
            with urllib.request.urlopen(base + "/readyz", timeout=10) as r:
                assert json.loads(r.read())["ready"] is True
            # The probe works as the same unprivileged user, from the read-only copy.
            probe = subprocess.run(
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 os.path.join(ro, "idemgate-healthcheck"), "/readyz", f"127.0.0.1:{port}"],
                env={"PATH": "/usr/bin:/bin"}, timeout=30)
            assert probe.returncode == 0
        finally:
            for child in read(f"/proc/{proc.pid}/task/{proc.pid}/children").split() \
                    if proc.poll() is None else []:
                os.kill(int(child), signal.SIGTERM)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        assert code == 0, f"exit {code}: {read(tmp_path / 'gateway.log')[-2000:]}"

        logs = sorted(tmp_path.glob("strace.log.*"))
        assert len(logs) > 3, "one log per thread: server, workers, reaper, waiters"
        log = "\n".join(p.read_text() for p in logs)
        # The trace saw the gateway itself, not only setpriv.
        assert re.search(r'execve\("' + re.escape(os.path.join(ro, "idemgate")) + '"', log)
        calls = list(trace_calls(log))
        assert any(n == "openat" and os.path.join(ro, "idemgate.json") in a and r != "-1"
                   for n, a, r, _ in calls), "the configuration was read from the copy"
        assert any(n == "bind" and f"htons({port})" in a and r == "0" for n, a, r, _ in calls)
        assert any(n == "connect" and "AF_UNIX" in a and ".s.PGSQL." in a
                   for n, a, r, _ in calls), "the database was reached over its Unix socket"
        writes = filesystem_writes(log)
        assert writes == [], "the gateway wrote to the filesystem:\n" + "\n".join(writes[:20])
        assert tree_snapshot(ro) == before
        assert "sk-ro-canary" not in read(tmp_path / "gateway.log")
    finally:
        os.chmod(ro, 0o755)
        shutil.rmtree(ro, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Issue 21 item 11: metrics on a listener of their own in the shipped deployments.
# ---------------------------------------------------------------------------------------------

def test_metrics_on_own_listener_in_kubernetes_and_compose(k8s, compose):
    """The Kubernetes sidecar keeps its API on loopback and puts only the metrics listener on
    the pod IP, as a named port behind the metrics token (from the Secret); Compose runs the
    metrics listener on its network without publishing it."""
    cm = k8s_objects(k8s, "ConfigMap")[0]
    cfg = json.loads(cm["data"]["idemgate.json"])
    assert cfg["listen"].startswith("127.0.0.1:")
    mhost, mport = cfg["metrics_listen"].rsplit(":", 1)
    assert mhost == "0.0.0.0" and mport != cfg["listen"].rsplit(":", 1)[1]
    dep = k8s_objects(k8s, "Deployment")[0]
    pod = dep["spec"]["template"]
    (sc,) = [c for c, _ in pod_containers(pod["spec"]) if "idemgate" in c["image"]
             and c.get("args") != ["migrate"]]
    env = {e["name"]: e.get("value") for e in sc["env"]}
    assert env["IDEMGATE_LISTEN"].startswith("127.0.0.1:")
    assert "IDEMGATE_METRICS_LISTEN" not in env or env["IDEMGATE_METRICS_LISTEN"] == \
        cfg["metrics_listen"]
    ports = {p["name"]: p["containerPort"] for p in sc["ports"]}
    assert ports == {"metrics": int(mport)}, "only the metrics listener is on the pod IP"
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == mport and ann["prometheus.io/path"] == "/metrics"
    secret = next(s for s in k8s_objects(k8s, "Secret")
                  if s["metadata"]["name"] in {r["secretRef"]["name"] for r in sc["envFrom"]})
    assert "IDEMGATE_METRICS_TOKEN_SHA256" in secret["stringData"]
    for name, s in gateway_services(compose).items():
        listen = s["environment"]["IDEMGATE_METRICS_LISTEN"]
        assert listen.startswith("0.0.0.0:"), name
        port = listen.rsplit(":", 1)[1]
        assert not any(str(p).endswith(":" + port) for p in s.get("ports", [])), \
            f"{name}: the metrics listener is not published"
    # The configuration with the metrics listener is valid.
    r = check_config(cm["data"]["idemgate.json"], {k: "x" for k in secret_envs(cfg)})
    assert r.returncode == 0, r.stderr



# ---------------------------------------------------------------------------------------------
# Issue 21 item 13: the shipped multi-replica deployments share their archive.
# ---------------------------------------------------------------------------------------------

def test_archive_across_replicas_in_compose_and_kubernetes(compose, k8s, dockerfile):
    """Compose and Kubernetes run several replicas: their archive is a bucket they share
    (archive_backend s3; in Compose an S3-compatible server of its own that every replica waits
    for), each replica spools copies in progress in a writable folder of its own at
    archive_dir, and the README no longer says nothing is written."""
    # Compose.
    gws = gateway_services(compose)
    assert len(gws) >= 2
    mount = next(v for v in next(iter(gws.values()))["volumes"]
                 if v["target"] == "/etc/idemgate/idemgate.json")
    cfg = json.loads(read(os.path.join(ROOT, "docker", mount["source"])))
    assert cfg["archive_backend"] == "s3"
    host = re.match(r"https?://([^:/]+)", cfg["archive_s3_endpoint"]).group(1)
    s3 = compose["services"][host]
    assert s3["build"]["target"] == "s3" and "s3" in {st["name"] for st in
                                                       dockerfile_stages(dockerfile)}
    assert any(v["target"] == "/data" and v["type"] == "volume" for v in s3["volumes"])
    for name, g in gws.items():
        assert g["depends_on"][host]["condition"] == "service_healthy", name
        assert not any(str(p).split(":")[-1] == "9000" for p in g.get("ports", []))
    assert not s3.get("ports"), "the archive server is internal"
    # The server accepts the key pair of its env file, which the replicas hold too.
    pair = parse_env_file(os.path.join(ROOT, "docker", "s3.env.example"))
    gw_env = parse_env_file(os.path.join(ROOT, "docker", "idemgate.env.example"))
    assert pair["S3_ACCESS_KEY_ID"] == gw_env["AWS_ACCESS_KEY_ID"]
    assert pair["S3_SECRET_ACCESS_KEY"] == gw_env["AWS_SECRET_ACCESS_KEY"]
    assert all(PLACEHOLDER in v for v in pair.values())
    server = read(os.path.join(ROOT, "docker", "s3", "server.js"))
    assert "S3_ACCESS_KEY_ID" in server and "revokeAccessKey('S3RVER')" in server
    lock = json.loads(read(os.path.join(ROOT, "docker", "s3", "package-lock.json")))
    assert lock["packages"]["node_modules/s3rver"]["version"] == \
        json.loads(read(os.path.join(ROOT, "docker", "s3", "package.json")))["dependencies"]["s3rver"]
    # The image's archive folder belongs to the gateway's user (a volume there starts writable).
    assert re.search(r"install -d -o 65532 -g 65532 -m 0750 /var/lib/idemgate/archive", dockerfile)
    # Kubernetes.
    cm = k8s_objects(k8s, "ConfigMap")[0]
    kcfg = json.loads(cm["data"]["idemgate.json"])
    assert kcfg["archive_backend"] == "s3" and kcfg["archive_s3_bucket"]
    dep = k8s_objects(k8s, "Deployment")[0]
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    (sc,) = [c for c, _ in pod_containers(pod) if "idemgate" in c["image"]
             and c.get("args") != ["migrate"]]
    spool = next(m for m in sc["volumeMounts"]
                 if m["mountPath"] == kcfg.get("archive_dir", "/var/lib/idemgate/archive"))
    assert not spool.get("readOnly")
    vol = next(v for v in pod["volumes"] if v["name"] == spool["name"])
    assert "emptyDir" in vol and vol["emptyDir"].get("sizeLimit")
    secret = next(s for s in k8s_objects(k8s, "Secret") if "DATABASE_URL" in s["stringData"])
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])
    # The documentation says what is written.
    text = read(os.path.join(ROOT, "deploy", "README.md"))
    assert "nothing written to disk," not in text
    assert "output-in-other-replica" in text and "/readyz" in text
