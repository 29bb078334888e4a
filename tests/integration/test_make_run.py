"""`make run` as a newcomer uses it: started in the background on free ports with its own data
folders (RUN_DIR, PGDATA_DIR, MOCK_PORT: never the user's .pgdata, .run or ports 8080/9090), its
printed lines read, the printed admin token used against the admin API and the console, the
printed DATABASE_URL used with the CLI, then stopped as Ctrl-C stops it (SIGINT to its process
group, which holds only what this test started); its PostgreSQL is stopped by the test."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pytest

from conftest import Http, free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.path.join(ROOT, "build", "idemgate")
PG_SH = os.path.join(ROOT, "scripts", "pg.sh")
DEPS_SH = os.path.join(ROOT, "scripts", "deps.sh")


def clean_env(**extra):
    """The environment of a user's shell: nothing of the suite's make, database or gateway."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKE", "MFLAGS", "IDEMGATE_", "PG")) and
           k not in ("DATABASE_URL", "CONFIG", "PORT", "MOCK_PORT", "RUN_DIR", "PGDATA_DIR")}
    env.update(extra)
    return env


class MakeRun:
    """`make run ARGS` in a process group of its own, with its printed lines parsed."""

    def __init__(self, args, env):
        self.dir = tempfile.mkdtemp(prefix="idemgate-makerun-")
        os.chmod(self.dir, 0o755)  # the cluster's owner (postgres, when root) must reach it
        self.run_dir = os.path.join(self.dir, "run")
        self.pgdata = os.path.join(self.dir, "pg")
        self.out_path = os.path.join(self.dir, "make.out")
        env = dict(env, RUN_DIR=self.run_dir, PGDATA_DIR=self.pgdata)
        self.proc = subprocess.Popen(["make", "--no-print-directory", "-C", ROOT, "run"] + args,
                                     stdout=open(self.out_path, "w"), stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.pids = []

    def output(self):
        with open(self.out_path) as f:
            return f.read()

    def wait_ready(self, timeout=600):
        """Waits for make run's last line; returns its output. (The timeout only bounds a hang:
        `make run` may build first.)"""
        deadline = time.monotonic() + timeout
        while "Ctrl-C stops" not in self.output():
            assert self.proc.poll() is None, "make run exited:\n" + self.output()[-4000:]
            assert time.monotonic() < deadline, "make run printed nothing ready:\n" + self.output()
            time.sleep(0.2)
        self.pids = self.started()
        return self.output()

    def started(self):
        """The PIDs of the gateway and mock make run wrote down so far."""
        pids = []
        for name in ("gateway.pid", "mock.pid"):
            p = os.path.join(self.run_dir, name)
            try:
                pids.append(int(open(p).read()))
            except (OSError, ValueError):
                pass
        return pids

    def interrupt(self):
        """Ctrl-C: SIGINT to the process group make run was started in (only this test's)."""
        os.killpg(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=120)

    def cleanup(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        # The gateway and mock it started, by PID, if still there — read again here: a test that
        # failed before wait_ready returned never read them, and they outlived it.
        for pid in set(self.pids) | set(self.started()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.call([PG_SH, "stop", self.pgdata])
        shutil.rmtree(self.dir, ignore_errors=True)


def field(out, pattern):
    m = re.search(pattern, out, re.M)
    assert m, f"{pattern!r} not in make run's output:\n{out}"
    return m.group(1)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cli(env, *args):
    return subprocess.run([CLI] + list(args), env=env, capture_output=True, text=True,
                          timeout=60)


def submit(http, token, provider, route, body, key, headers=None):
    h = {"Authorization": "Bearer " + token, "Idempotency-Key": key}
    h.update(headers or {})
    return http.request("POST", f"/v1/providers/{provider}/{route}", json.dumps(body), h)


def test_make_run_prints_what_the_admin_api_console_and_cli_need():
    port, mock_port = free_port(), free_port()
    run = MakeRun([f"PORT={port}"], clean_env(MOCK_PORT=str(mock_port)))
    try:
        out = run.wait_ready()
        url = field(out, r"^idemgate is listening on (http://\S+) ")
        assert url == f"http://127.0.0.1:{port}", out
        console = field(out, r"^console:\s+(\S+)$")
        admin = field(out, r"^admin token:\s+(iga_[0-9a-f]{64})$")
        tenant = field(out, r"^tenant token:\s+(igt_\S+)$")
        db_url = field(out, r"^  export DATABASE_URL='([^']+)'$")
        config = field(out, r"^  export IDEMGATE_CONFIG='([^']+)'$")
        assert "local development token make run created" in out, out
        # Its own folders, never the user's .pgdata and .run.
        assert run.pgdata in db_url and config.startswith(run.run_dir), out
        admin_file = os.path.join(run.run_dir, "admin.token")
        assert open(admin_file).read().strip() == admin
        assert os.stat(admin_file).st_mode & 0o077 == 0
        assert len(run.pids) == 2 and all(alive(p) for p in run.pids)

        http = Http(url)
        # The console is served, and the admin API takes the printed token (and only it).
        r = http.request("GET", console[len(url):])
        assert r.status == 200 and "text/html" in r.headers["content-type"], r
        assert http.request("GET", "/v1/admin/providers").status == 401
        assert http.request("GET", "/v1/admin/providers",
                            headers={"Authorization": "Bearer " + tenant}).status == 401
        r = http.request("GET", "/v1/admin/providers",
                         headers={"Authorization": "Bearer " + admin})
        assert r.status == 200, r
        assert {"mock-images", "openai"} <= {p["name"] for p in r.json()["data"]}, r

        # The CLI with the printed DATABASE_URL and configuration: a new tenant whose token the
        # gateway accepts at once, a job the CLI then reads, the admin API too.
        env = clean_env(DATABASE_URL=db_url, IDEMGATE_CONFIG=config)
        name = "alice-" + uuid.uuid4().hex[:8]
        r = cli(env, "tenant", "add", name)
        assert r.returncode == 0, r.stderr
        alice = r.stdout.strip()
        assert name in cli(env, "tenant", "list").stdout
        r = submit(http, alice, "mock-images", "images/generations",
                   {"prompt": "a lighthouse at dawn", "n": 2}, "poster-42-v1",
                   {"Prefer": "wait=30"})
        assert r.status == 200, r
        job = r.headers["x-idemgate-job-id"]
        r = cli(env, "jobs", "show", job)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "completed", r.stdout
        assert job in cli(env, "jobs", "list", "--state", "completed").stdout
        r = http.request("GET", f"/v1/admin/jobs/{job}",
                         headers={"Authorization": "Bearer " + admin})
        assert r.status == 200 and r.json()["job"]["id"] == job, r

        # The example's providers point at the mock on MOCK_PORT (the copy of the example
        # configuration make run wrote): the OpenAI drop-in route waits for the image, and
        # the create went to that mock.
        r = submit(http, tenant, "openai", "images/generations",
                   {"model": "gpt-image-1", "prompt": "a lighthouse", "n": 1}, "dropin-1")
        assert r.status == 200 and len(r.json()["data"]) == 1, r
        ledger = Http(f"http://127.0.0.1:{mock_port}").request("GET", "/_ledger").json()
        assert len(ledger["creates"]) == 2, ledger

        # Ctrl-C: the gateway drains and stops, the mock stops, nothing else of make run stays.
        run.interrupt()
        assert not any(alive(p) for p in run.pids), run.pids
        with open(os.path.join(run.run_dir, "gateway.log")) as f:
            assert '"event":"stopped"' in f.read()
        with pytest.raises(OSError):
            http.request("GET", "/healthz", timeout=5)
    finally:
        run.cleanup()


def test_make_run_takes_a_users_config_and_port():
    """`make run CONFIG=… PORT=…`: the user's own file (its providers, its admin token) on the
    port asked for, whatever its `listen` says; the mock is started on MOCK_PORT because the
    file names it."""
    port, mock_port = free_port(), free_port()
    d = tempfile.mkdtemp(prefix="idemgate-usercfg-")
    try:
        own_admin = "my-own-admin-" + uuid.uuid4().hex
        cfg = {
            "listen": "127.0.0.1:1",
            "admin_token_sha256": hashlib.sha256(own_admin.encode()).hexdigest(),
            "providers": [{
                "name": "mine", "base_url": f"http://127.0.0.1:{mock_port}", "mode": "sync",
                "timeouts": {"connect_ms": 2000, "total_ms": 30000},
                "routes": [{"route": "images", "method": "POST",
                            "path": "/v1/images/generations"}],
            }],
        }
        path = os.path.join(d, "my.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        run = MakeRun([f"CONFIG={path}", f"PORT={port}"], clean_env(MOCK_PORT=str(mock_port)))
        try:
            out = run.wait_ready()
            assert field(out, r"^idemgate is listening on (http://\S+) ") == \
                f"http://127.0.0.1:{port}"
            assert f"(configuration: {path};" in out
            assert field(out, r"^  export IDEMGATE_CONFIG='([^']+)'$") == path
            # The configuration's admin token is kept: none is made.
            assert "iga_" not in out and not os.path.exists(
                os.path.join(run.run_dir, "admin.token")), out
            assert len(run.pids) == 2, run.pids
            http = Http(f"http://127.0.0.1:{port}")
            r = http.request("GET", "/v1/admin/providers",
                             headers={"Authorization": "Bearer " + own_admin})
            assert r.status == 200 and [p["name"] for p in r.json()["data"]] == ["mine"], r
            tenant = field(out, r"^tenant token:\s+(igt_\S+)$")
            r = submit(http, tenant, "mine", "images", {"prompt": "x", "n": 1}, "mine-1",
                       {"Prefer": "wait=30"})
            assert r.status == 200, r
            ledger = Http(f"http://127.0.0.1:{mock_port}").request("GET", "/_ledger").json()
            assert len(ledger["creates"]) == 1, ledger
            run.interrupt()
            assert not any(alive(p) for p in run.pids)
        finally:
            run.cleanup()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_make_run_installs_only_what_running_needs():
    """`make run` asks deps.sh for the run set; `make test` (through `deps`) for everything."""
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-C", ROOT, "deps-run", "deps"],
                         capture_output=True, text=True, env=clean_env(), check=True).stdout
    assert "scripts/deps.sh run" in dry and "scripts/deps.sh test" in dry, dry
    with open(os.path.join(ROOT, "Makefile")) as f:
        mk = f.read()
    assert re.search(r"^run: deps-run$", mk, re.M) and re.search(r"^test: deps$", mk, re.M)

    def pkgs(s):
        return subprocess.run([DEPS_SH, s, "--list"], capture_output=True, text=True,
                              check=True).stdout.split()
    run, test = pkgs("run"), pkgs("test")
    for p in ("gcc", "make", "pkg-config", "libmicrohttpd-dev", "libcurl4-openssl-dev",
              "libcjson-dev", "libpq-dev", "libssl-dev", "postgresql-15", "nodejs"):
        assert p in run, (p, run)
    for p in ("clang", "libclang-rt-14-dev", "pgbouncer", "faketime", "strace",
              "libcmocka-dev", "python3-pytest"):
        assert p not in run and p in test, (p, run, test)
    assert set(run) <= set(test)
