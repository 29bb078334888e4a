"""The container image, built and run for real with podman (`make test-image`, also run by
`make chaos`): it takes minutes (debootstrap, apt-get and a compile inside the build), so the
ordinary integration run skips this file unless IDEMGATE_TEST_IMAGE=1.

No registry is reachable from the machines the tests run on, so the base image is Debian 12
(bookworm) made by debootstrap from the Debian mirror and imported into podman
(scripts/image-base.sh, cached as a tarball under .cache/image/ and as an image in podman's
storage). The shipped docker/Dockerfile pins debian:12.12-slim by digest and stays so: the test
builds from a copy of it whose FROM lines name the imported base instead, and changes nothing
else. Everything else (the stages, the packages, the user, the HEALTHCHECK) is the shipped file.

What runs: a network of its own; the counting mock from the Dockerfile's `mock` stage as the
provider; a PostgreSQL 15 the test starts on the host, listening only on that network's gateway
address, with a password role; `migrate` and `tenant add` from the image; two gateway replicas,
each with a read-only root filesystem (no tmpfs either), no capabilities, no-new-privileges and a
volume only at the archive folder. Every container, volume and network the test makes is removed
after it; the built images stay (podman's layer cache makes the next build quick)."""

import json
import os
import resource
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest

from conftest import ROOT, Http, free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("IDEMGATE_TEST_IMAGE") != "1",
    reason="builds and runs the container image with podman (minutes): run `make test-image` "
           "(or `make chaos`), or set IDEMGATE_TEST_IMAGE=1")

PG_SH = os.path.join(ROOT, "scripts", "pg.sh")
PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
IGNOREFILE = os.path.join(ROOT, "docker", "Dockerfile.dockerignore")
SHIPPED_BASE = "debian:12.12-slim@sha256:"
GATEWAY_IMAGE = "localhost/idemgate:test-image"
MOCK_IMAGE = "localhost/idemgate-mock:test-image"
ARCHIVE_DIR = "/var/lib/idemgate/archive"
UID = 65532


def _run_flags():
    """Flags for every container podman starts here, builds' RUN steps included.

    runc, not crun: crun 1.8 (Debian 12) refuses a host whose cgroup v1 hierarchy sits beside a
    cgroup2 mount holding a controller ("cgroups in hybrid mode not supported"), which is what
    this project's machines are; runc runs on both layouts. Resource limits no higher than this
    process's own: podman's defaults (open files 1048576, processes) are above them where the
    machine is itself a container without CAP_SYS_RESOURCE, and setrlimit then fails."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(4096, nproc)
    return ["--runtime", "runc", "--ulimit", f"nofile={nofile}:{nofile}",
            "--ulimit", f"nproc={nproc}:{nproc}"]


def podman(*args, check=True, timeout=120, **kw):
    return subprocess.run(["podman", *args], check=check, timeout=timeout, text=True,
                          capture_output=True, **kw)


def podman_run_cmd(*args):
    return ["podman", "run", *_run_flags(), *args]


# `podman run` flags of a production container: read-only root, and not even podman's default
# tmpfs on /tmp, /var/tmp and /run; no capabilities; no privilege escalation.
HARDENED = ["--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges"]


# ---------------------------------------------------------------------------------------------
# The images.
# ---------------------------------------------------------------------------------------------

def test_copy_of_the_dockerfile_changes_only_the_base():
    """What the test builds is the shipped Dockerfile but for the FROM lines' base."""
    shipped = open(DOCKERFILE).read()
    copy = dockerfile_copy(shipped, "localhost/idemgate-base:bookworm")
    a, b = shipped.splitlines(), copy.splitlines()
    assert len(a) == len(b)
    changed = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(changed) == 3 and all(x.startswith("FROM " + SHIPPED_BASE) for x, _ in changed)
    assert all(y.startswith("FROM localhost/idemgate-base:bookworm AS ") for _, y in changed)


def dockerfile_copy(text, base):
    out = []
    for line in text.splitlines():
        if line.startswith("FROM " + SHIPPED_BASE):
            rest = line.split(None, 2)[2]          # "AS stage"
            line = f"FROM {base} {rest}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Builds the gateway (`runtime`, the default target) and the mock (`mock`) from a copy of
    docker/Dockerfile whose FROM lines name the debootstrapped base."""
    base = subprocess.run([os.path.join(ROOT, "scripts", "image-base.sh")], check=True,
                          text=True, stdout=subprocess.PIPE, timeout=1800).stdout.strip()
    d = tmp_path_factory.mktemp("image-build")
    dockerfile = d / "Dockerfile"
    dockerfile.write_text(dockerfile_copy(open(DOCKERFILE).read(), base))
    # npm inside the build stage (the console's charting library) trusts what this machine
    # trusts: its CA bundle, as npm's cafile, mounted into the build stage's RUN steps only.
    # Where the way out goes through a TLS-inspecting proxy (as on this project's machines),
    # npm's own CA list refuses the registry otherwise. The mounts are left out of the second
    # pass, which takes the build stage from the cache, so no stage the images are made of has
    # them.
    npmrc = d / "npmrc"
    npmrc.write_text("cafile=/run/idemgate-host-ca/ca-certificates.crt\n")
    host_ca = ["-v", "/etc/ssl/certs/ca-certificates.crt:/run/idemgate-host-ca/"
               "ca-certificates.crt:ro", "-v", f"{npmrc}:/root/.npmrc:ro"]
    builds = [("build", "localhost/idemgate-build:test-image", host_ca),
              ("runtime", GATEWAY_IMAGE, []), ("mock", MOCK_IMAGE, [])]
    for target, tag, extra in builds:
        # --format docker: the OCI image format has no HEALTHCHECK (buildah drops it).
        r = subprocess.run(["podman", "build", *_run_flags(), "--format", "docker",
                            "--ignorefile", IGNOREFILE, *extra, "-f", str(dockerfile),
                            "--target", target, "-t", tag, ROOT],
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=3600)
        assert r.returncode == 0, r.stdout[-6000:]
    return {"base": base}


def inspect_image(tag):
    return json.loads(podman("image", "inspect", tag).stdout)[0]


def test_image_builds_with_the_shipped_runtime_contract(images):
    img = inspect_image(GATEWAY_IMAGE)
    cfg = img["Config"]
    assert cfg["User"] == f"{UID}:{UID}"
    assert cfg["Entrypoint"] == ["/usr/local/bin/idemgate"] and cfg["Cmd"] == ["serve"]
    assert "IDEMGATE_CONFIG=/etc/idemgate/idemgate.json" in cfg["Env"]
    assert cfg["StopSignal"] == "SIGTERM"
    assert img["Healthcheck"]["Test"] == ["CMD", "/usr/local/bin/idemgate-healthcheck",
                                          "/healthz"]
    mock = inspect_image(MOCK_IMAGE)["Config"]
    assert mock["User"] == f"{UID}:{UID}"
    assert mock["Entrypoint"] == ["/usr/local/bin/idemgate-mock"]
    # No compiler reached the runtime image: the build stage stayed behind.
    r = subprocess.run(podman_run_cmd("--rm", "--network", "none", "--entrypoint", "sh",
                                      GATEWAY_IMAGE, "-c",
                                      "command -v gcc cc make; ls /usr/include | head -1"),
                       text=True, capture_output=True, timeout=60)
    assert r.stdout.strip() == "", r.stdout
    # The image's own configuration passes the gateway's own check.
    r = subprocess.run(podman_run_cmd("--rm", "--network", "none", *HARDENED,
                                      GATEWAY_IMAGE, "check-config"),
                       text=True, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# The running stack: a network, the mock, PostgreSQL on the host, two replicas.
# ---------------------------------------------------------------------------------------------

class Stack:
    pass


def wait_healthy(name, timeout=60):
    """`podman healthcheck run` (the image's HEALTHCHECK, run on demand: no systemd timers
    here) until it says healthy; returns the last result."""
    deadline = time.monotonic() + timeout
    while True:
        r = podman("healthcheck", "run", name, check=False, timeout=30)
        if r.returncode == 0 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def host_port(name, port):
    out = podman("port", name, f"{port}/tcp").stdout.strip().splitlines()[0]
    return int(out.rsplit(":", 1)[1])


def wait_http(http, path, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = http.request("GET", path, timeout=5)
            if r.status == 200 or time.monotonic() > deadline:
                return r
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.3)


@pytest.fixture(scope="module")
def stack(images, tmp_path_factory):
    s = Stack()
    tag = "idemgate-test-" + uuid.uuid4().hex[:8]
    s.tag = tag
    s.containers, s.volumes = [], []
    tmp = tmp_path_factory.mktemp("image-stack")
    pgdir = tempfile.mkdtemp(prefix="idemgate-image-pg-")
    pg_started = False
    podman("network", "create", tag)
    try:
        net = json.loads(podman("network", "inspect", tag).stdout)[0]
        subnet = net["subnets"][0]
        s.gateway_ip = subnet["gateway"]

        # The provider first: its container brings the network's bridge up, so that the
        # host's PostgreSQL can listen on the bridge's address.
        s.mock = f"{tag}-mock"
        # It listens on its own name (its address on the network), because the mock writes
        # its listening address into the output URLs it hands out: the replicas fetch the
        # outputs from there into their archives. (Its image's HEALTHCHECK probes 127.0.0.1,
        # which this mock does not listen on: it is polled on its published port instead.)
        podman("run", *_run_flags(), "-d", "--name", s.mock, "--network", tag,
               "-p", "127.0.0.1::9090", *HARDENED, MOCK_IMAGE, "--listen", f"{s.mock}:9090")
        s.containers.append(s.mock)
        s.mock_http = Http(f"http://127.0.0.1:{host_port(s.mock, 9090)}")
        assert wait_http(s.mock_http, "/_health").status == 200, logs(s.mock)

        # PostgreSQL on the host, reachable from the containers over the network's gateway
        # address only, as a role with a password (scram): initdb and a role over the Unix
        # socket, then a restart listening on the bridge.
        port = str(free_port())
        local = subprocess.check_output([PG_SH, "start", pgdir, port], text=True).strip()
        pg_started = True
        password = secrets.token_urlsafe(18)
        subprocess.run(["psql", local, "-qtAX", "-v", "ON_ERROR_STOP=1"], check=True,
                       input="CREATE ROLE idemgate LOGIN PASSWORD '%s';\n"
                             "ALTER DATABASE idemgate OWNER TO idemgate;\n" % password,
                       text=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(pgdir, "data", "pg_hba.conf"), "a") as f:
            f.write(f"host idemgate idemgate {subnet['subnet']} scram-sha-256\n")
        subprocess.check_call([PG_SH, "stop", pgdir])
        subprocess.check_output([PG_SH, "start", pgdir, port], text=True,
                                env=dict(os.environ, PG_EXTRA_OPTS="-c listen_addresses='%s'"
                                         % s.gateway_ip))
        env_file = tmp / "idemgate.env"
        env_file.write_text(
            f"DATABASE_URL=postgresql://idemgate:{password}@{s.gateway_ip}:{port}/idemgate\n"
            "MOCK_IMAGES_API_KEY=sk-mock-test-only\n")
        os.chmod(env_file, 0o600)  # read by podman (root); never mounted into a container

        config = {
            "http_threads": 4, "dispatch_workers": 2, "lease_seconds": 10,
            "log_level": "info",
            "providers": [{
                "name": "mock-images", "base_url": f"http://{s.mock}:9090", "mode": "sync",
                "auth": {"header": "Authorization", "prefix": "Bearer ",
                         "secret_env": "MOCK_IMAGES_API_KEY"},
                "timeouts": {"connect_ms": 2000, "total_ms": 5000},
                "routes": [{"route": "images/generations", "method": "POST",
                            "path": "/v1/images/generations"}],
                "outputs": {"requested": "$.n", "received": "$.data[*]", "usage": "$.usage"},
                "archive": {"hosts": [s.mock], "allow_http": True, "allow_private": True},
            }],
        }
        cfg_path = tmp / "idemgate.json"
        cfg_path.write_text(json.dumps(config))
        os.chmod(cfg_path, 0o644)
        common = ["--network", tag, "--env-file", str(env_file),
                  "-v", f"{cfg_path}:/etc/idemgate/idemgate.json:ro"]

        # The one-shot migration and a tenant, from the image itself (as compose.yaml's
        # `migrate` service does), hardened like the replicas.
        r = subprocess.run(podman_run_cmd("--rm", *HARDENED, *common,
                                          GATEWAY_IMAGE, "migrate"),
                           text=True, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        r = subprocess.run(podman_run_cmd("--rm", *HARDENED, *common,
                                          GATEWAY_IMAGE, "tenant", "add", "image-test"),
                           text=True, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        s.token = r.stdout.strip()
        assert s.token

        s.replicas = []
        for i in (1, 2):
            name, vol = f"{tag}-gw{i}", f"{tag}-archive{i}"
            podman("volume", "create", vol)
            s.volumes.append(vol)
            podman("run", *_run_flags(), "-d", "--name", name, *common,
                   "-p", "127.0.0.1::8080", "-v", f"{vol}:{ARCHIVE_DIR}", *HARDENED,
                   GATEWAY_IMAGE)
            s.containers.append(name)
            s.replicas.append(name)
        s.http = {}
        for name in s.replicas:
            s.http[name] = Http(f"http://127.0.0.1:{host_port(name, 8080)}")
        yield s
    finally:
        for c in reversed(s.containers):
            podman("rm", "-f", "-t", "5", c, check=False)
        for v in s.volumes:
            podman("volume", "rm", "-f", v, check=False)
        podman("network", "rm", "-f", tag, check=False)
        if pg_started:
            subprocess.call([PG_SH, "stop", pgdir])
        shutil.rmtree(pgdir, ignore_errors=True)


def logs(name):
    r = podman("logs", name, check=False)
    return (r.stdout + r.stderr)[-3000:]


def test_replicas_start_and_answer_health_and_readiness(stack):
    for name in stack.replicas:
        r = wait_http(stack.http[name], "/readyz")
        assert r.status == 200, (r, logs(name))
        assert stack.http[name].request("GET", "/healthz").status == 200
        # The image's HEALTHCHECK (idemgate-healthcheck /healthz), run by podman.
        hc = wait_healthy(name)
        assert hc.returncode == 0, (hc.stdout, hc.stderr, logs(name))
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["Running"] and state["Health"]["Status"] == "healthy", state["Health"]


def test_runs_as_the_non_root_uid(stack):
    for name in stack.replicas + [stack.mock]:
        pid = json.loads(podman("inspect", name).stdout)[0]["State"]["Pid"]
        with open(f"/proc/{pid}/status") as f:
            ids = {line.split(":")[0]: line.split()[1:] for line in f
                   if line.startswith(("Uid:", "Gid:", "CapEff:", "NoNewPrivs:"))}
        # Real, effective, saved and file-system ids, as the kernel sees the process.
        assert ids["Uid"] == [str(UID)] * 4 and ids["Gid"] == [str(UID)] * 4, ids
        assert int(ids["CapEff"][0], 16) == 0, ids
        assert ids["NoNewPrivs"] == ["1"], ids


def test_root_filesystem_is_read_only_and_only_the_archive_volume_is_writable(stack):
    name = stack.replicas[0]
    probe = ("for d in / /etc/idemgate /usr/local/bin /tmp /var/tmp /run /nonexistent; do "
             "  if touch \"$d/.w\" 2>/dev/null; then echo \"writable $d\"; fi; done; "
             f"touch {ARCHIVE_DIR}/.w && rm {ARCHIVE_DIR}/.w && echo archive-ok; id -u")
    r = podman("exec", name, "bash", "-c", probe)
    assert r.stdout.split() == ["archive-ok", str(UID)], r.stdout
    inspect = json.loads(podman("inspect", name).stdout)[0]
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    mounts = {m["Destination"]: m for m in inspect["Mounts"]}
    assert mounts[ARCHIVE_DIR]["Type"] == "volume" and mounts[ARCHIVE_DIR]["RW"]
    assert not mounts["/etc/idemgate/idemgate.json"]["RW"]


def test_a_job_submitted_through_one_replica_is_read_through_the_other(stack):
    a, b = (stack.http[n] for n in stack.replicas)
    key = "image-" + uuid.uuid4().hex[:12]
    headers = {"Authorization": f"Bearer {stack.token}", "Idempotency-Key": key,
               "Content-Type": "application/json"}
    body = json.dumps({"prompt": "a lighthouse at dawn", "n": 1})
    r = a.request("POST", "/v1/providers/mock-images/images/generations", body, headers)
    assert r.status == 202, (r, logs(stack.replicas[0]))
    job_id = r.json()["id"]
    auth = {"Authorization": f"Bearer {stack.token}"}
    deadline = time.monotonic() + 30
    while True:
        j = b.request("GET", f"/v1/jobs/{job_id}", headers=auth)
        assert j.status == 200, j
        arch = j.json().get("archive") or []
        if (j.json()["state"] == "completed" and arch
                and all(o["state"] == "archived" for o in arch)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert j.json()["state"] == "completed", (j, logs(stack.replicas[0]))
    # The output was fetched from the mock and written to a replica's archive volume.
    assert arch and all(o["state"] == "archived" for o in arch), \
        json.dumps(arch) + "".join(line for n in stack.replicas for line in
                                   logs(n).splitlines(True) if "archiv" in line)
    # The same key through the other replica: the same job, replayed, no second create.
    r2 = b.request("POST", "/v1/providers/mock-images/images/generations", body, headers)
    assert r2.status in (200, 202) and r2.json()["id"] == job_id, r2
    assert r2.headers.get("idempotent-replayed") == "true", r2.headers
    creates = [c for c in stack.mock_http.request("GET", "/_ledger").json()["creates"]
               if c["client_ref"] == job_id and not c.get("replay")]
    assert len(creates) == 1, creates


def test_sigterm_stops_each_replica_cleanly(stack):
    """`podman stop` sends the image's STOPSIGNAL (SIGTERM) and waits up to 30 s before
    SIGKILL: a serving replica drains and exits 0 well within that."""
    for name in stack.replicas:
        assert wait_http(stack.http[name], "/readyz").status == 200, logs(name)
        r = podman("stop", "--time", "30", name, check=False, timeout=90)
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert r.returncode == 0 and state["ExitCode"] == 0, (r.stderr, state, logs(name))
        assert '"stopped"' in logs(name), logs(name)
