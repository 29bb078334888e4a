"""Fixtures for the integration tests: a real PostgreSQL cluster, the real counting mock
provider and real gateway processes, all on loopback or Unix sockets in temporary folders.

Everything a test starts is stopped by the fixture that started it, by PID."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pytest

import pqtext

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from chaos.ports import free_port  # noqa: E402,F401 (the tests import it from here)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GATEWAY_BIN = os.environ.get("IDEMGATE_BIN", os.path.join(ROOT, "build-test", "idemgate"))
MOCK_BIN = os.environ.get("IDEMGATE_MOCK_BIN", os.path.join(ROOT, "build", "idemgate-mock"))
PG_SH = os.path.join(ROOT, "scripts", "pg.sh")


# The files are handed to the test workers (`--dist loadfile`) longest first: the last ones a
# worker takes are then short, and none waits long for the others at the end. durations.json
# holds each file's seconds from a JUnit report (scripts/test-durations.py); a file it does not
# know counts as DEFAULT_FILE_S.
DEFAULT_FILE_S = 30


def pytest_collection_modifyitems(session, config, items):
    try:
        with open(os.path.join(os.path.dirname(__file__), "durations.json")) as f:
            took = json.load(f)
    except (OSError, ValueError):
        return
    # A stable sort on the file's seconds keeps each file's tests together and in their order.
    items.sort(key=lambda item: -took.get(os.path.basename(str(item.fspath)), DEFAULT_FILE_S))




def wait_for_line(proc, needle, timeout=15.0):
    """Reads proc's stdout until a line holds needle; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            if needle.encode() in buf:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before '{needle}'")
        time.sleep(0.02)
    raise TimeoutError(f"no '{needle}' within {timeout}s")


class Http:
    """A minimal HTTP client on the standard library that never raises on 4xx/5xx."""

    def __init__(self, base):
        self.base = base

    def request(self, method, path, body=None, headers=None, timeout=30):
        data = body.encode() if isinstance(body, str) else body
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return Response(r.status, dict(r.headers), r.read())
        except urllib.error.HTTPError as e:
            return Response(e.code, dict(e.headers), e.read())


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


# `make test-citus`: the superuser URL of a Citus coordinator with its workers added. The suite
# makes its own database there (and in it the extension on every node, and the nodes), as it
# makes its own cluster on plain PostgreSQL, and the gateway distributes the schema.
CITUS_URL = os.environ.get("CITUS_DATABASE_URL")


def _sql(url, sql, options=None):
    env = dict(os.environ, PGOPTIONS=options) if options else None
    return subprocess.run(["psql", url, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                          check=True, capture_output=True, text=True, env=env).stdout.strip()


# CREATE and DROP DATABASE reach the workers only with this setting (off by default in Citus
# 12.1+): without it the workers have no such database and the extension cannot be made there.
CITUS_DDL = "-c citus.enable_create_database_propagation=on"


def _with_db(url, host=None, port=None, dbname=None):
    from urllib.parse import urlsplit, urlunsplit
    u = urlsplit(url)
    netloc = u.netloc
    if host is not None:
        netloc = (u.username + "@" if u.username else "") + "%s:%s" % (host, port)
    return urlunsplit((u.scheme, netloc, "/" + (dbname or u.path.lstrip("/")), u.query, ""))


def citus_database():
    """A fresh database on the Citus coordinator of CITUS_URL, ready for distributed tables:
    yields its URL; dropped after (connections refused first: Citus keeps its own open)."""
    from urllib.parse import urlsplit
    name = "idemgate_citus_" + uuid.uuid4().hex[:10]
    workers = [w.split("|") for w in _sql(CITUS_URL, "SELECT nodename || '|' || nodeport FROM "
                                          "pg_dist_node WHERE groupid <> 0 AND isactive "
                                          "AND noderole = 'primary' ORDER BY nodeid").split()]
    coord = urlsplit(CITUS_URL)
    _sql(CITUS_URL, "CREATE DATABASE " + name, CITUS_DDL)
    url = _with_db(CITUS_URL, dbname=name)
    try:
        for host, port in workers:
            _sql(_with_db(CITUS_URL, host, port, name), "CREATE EXTENSION IF NOT EXISTS citus")
        _sql(url, "CREATE EXTENSION IF NOT EXISTS citus")
        _sql(url, "SELECT citus_set_coordinator_host('%s', %d)"
             % (coord.hostname, coord.port or 5432))
        for host, port in workers:
            _sql(url, "SELECT citus_add_node('%s', %s)" % (host, port))
        subprocess.run([GATEWAY_BIN, "migrate", "--citus"], env=dict(os.environ, DATABASE_URL=url),
                       check=True, stdout=subprocess.DEVNULL)
        yield url
    finally:
        _sql(CITUS_URL, "ALTER DATABASE %s WITH ALLOW_CONNECTIONS false" % name)
        _sql(CITUS_URL, "DROP DATABASE %s WITH (FORCE)" % name, CITUS_DDL)


@pytest.fixture(scope="session")
def database_url():
    """A throwaway PostgreSQL 15 cluster (initdb as the unprivileged postgres user when root),
    or, under `make test-citus`, a throwaway database on the Citus coordinator."""
    if CITUS_URL:
        yield from citus_database()
        return
    d = tempfile.mkdtemp(prefix="idemgate-pg-")
    os.chmod(d, 0o755)
    port = str(free_port())
    url = subprocess.check_output([PG_SH, "start", d, port], text=True).strip()
    try:
        subprocess.check_call([GATEWAY_BIN, "migrate"], env=dict(os.environ, DATABASE_URL=url),
                              stdout=subprocess.DEVNULL)
    except BaseException:
        # A migration that fails fails the session: the cluster started for it is stopped
        # here, by its folder (it was left running before, as no teardown follows a failed
        # setup).
        subprocess.call([PG_SH, "stop", d])
        shutil.rmtree(d, ignore_errors=True)
        raise
    yield url
    subprocess.call([PG_SH, "stop", d])
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def mock_server():
    port = free_port()
    # Room for thousands of slow calls at once (the slow-provider campaign, test_engine).
    proc = subprocess.Popen([MOCK_BIN, "--listen", f"127.0.0.1:{port}", "--threads", "6000"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    wait_for_line(proc, "listening")
    yield {"port": port, "url": f"http://127.0.0.1:{port}", "http": Http(f"http://127.0.0.1:{port}")}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


class Mock:
    def __init__(self, info):
        self.url = info["url"]
        self.port = info["port"]
        self.http = info["http"]

    def ledger(self):
        return self.http.request("GET", "/_ledger").json()["creates"]

    def creates_for(self, job_id):
        """Real creates (not provider-side replays) the mock received for one operation."""
        return [c for c in self.ledger() if c["client_ref"] == job_id and not c.get("replay")]

    def script(self, faults):
        return self.http.request("POST", "/_script", json.dumps({"faults": faults}))


@pytest.fixture
def mock(mock_server):
    m = Mock(mock_server)
    m.http.request("POST", "/_reset")
    return m


def tenant_token(database_url, name=None):
    name = name or "t-" + uuid.uuid4().hex[:12]
    out = subprocess.check_output([GATEWAY_BIN, "tenant", "add", name], text=True,
                                  env=dict(os.environ, DATABASE_URL=database_url))
    return out.strip()


@pytest.fixture
def token(database_url):
    return tenant_token(database_url)


class Gateway:
    def __init__(self, proc, port, log_path):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.http = Http(f"http://127.0.0.1:{port}")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def submit(self, token, key, body, route="mock-images/images/generations", headers=None,
               timeout=30):
        h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if key is not None:
            h["Idempotency-Key"] = key
        h.update(headers or {})
        if not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        return self.http.request("POST", f"/v1/providers/{route}", body, h, timeout=timeout)

    def job(self, token, job_id):
        return self.http.request("GET", f"/v1/jobs/{job_id}",
                                 headers={"Authorization": f"Bearer {token}"})

    def wait_state(self, token, job_id, states, timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(token, job_id).json()
            if j["state"] in states or time.monotonic() > deadline:
                return j
            time.sleep(0.05)


def provider(name, base_url, path="/v1/images/generations", route="images/generations", **extra):
    """A provider entry for a gateway configuration; extra keys are merged in."""
    p = {"name": name, "base_url": base_url, "mode": "sync",
         "timeouts": {"connect_ms": 1000, "total_ms": 5000},
         "routes": [{"route": route, "method": "POST", "path": path}],
         "outputs": {"requested": "$.n", "received": "$.data[*]", "usage": "$.usage"}}
    p.update(extra)
    return p


class PortTaken(RuntimeError):
    """The gateway could not listen on its address: another process holds it."""


@pytest.fixture
def gateway_factory(database_url, mock, tmp_path):
    """Starts gateway processes on free ports; settings override the defaults below."""
    started = []

    def start(**settings):
        # A port of our choosing another process took between free_port() and the gateway's
        # bind (it refuses a shared address): another port, a few times.
        for left in range(2, -1, -1):
            try:
                return start_once(dict(settings, env=dict(settings.get("env", {}))))
            except PortTaken:
                if "listen" in settings or not left:
                    raise

    def start_once(settings):
        port = int(settings["listen"].rsplit(":", 1)[1]) if "listen" in settings else free_port()
        cfg = {
            "listen": f"127.0.0.1:{port}",
            "http_threads": 4,
            "dispatch_workers": 2,
            "lease_seconds": 10,
            "reaper_interval_ms": 200,
            "poll_interval_ms": 500,
            "log_level": "info",
            "archive_dir": str(tmp_path / "archive"),
            "providers": [
                provider("mock-images", mock.url,
                         auth={"header": "Authorization", "prefix": "Bearer ",
                               "secret_env": "MOCK_IMAGES_API_KEY"}),
                provider("mock-keyed", mock.url, path="/v2/generations", route="generations",
                         idempotency={"header": "Idempotency-Key"}),
            ],
        }
        env_extra = settings.pop("env", {})
        wrap = settings.pop("wrap", [])  # a command the gateway runs under (it must exec it)
        cfg.update(settings)
        n = len(started)
        cfg_path = tmp_path / f"gateway{n}.json"
        cfg_path.write_text(json.dumps(cfg))
        log_path = tmp_path / f"gateway{n}.log"
        env = dict(os.environ, DATABASE_URL=database_url, MOCK_IMAGES_API_KEY="sk-mock-secret")
        env.pop("IDEMGATE_CRASH", None)
        env.pop("IDEMGATE_PAUSE", None)
        env.update(env_extra)
        proc = subprocess.Popen(wrap + [GATEWAY_BIN, "--config", str(cfg_path), "serve"],
                                stdout=subprocess.PIPE, stderr=open(log_path, "w"), env=env)
        try:
            wait_for_line(proc, "listening")
        except (RuntimeError, TimeoutError) as e:
            # A gateway that never said it listens (e.g. waiting on the migration lock) is not
            # in `started`, so the teardown below would never stop it: stop it here, by PID.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log = log_path.read_text()
            if '"event":"http_start_failed"' in log:
                raise PortTaken(f"{e}: {log[-2000:]}") from None
            raise RuntimeError(f"{e}: {log[-2000:]}") from None
        gw = Gateway(proc, port, str(log_path))
        started.append(gw)
        return gw

    yield start
    unclean = []
    try:
        stop_all(started, unclean)
    finally:
        retire_shared_work(database_url)
    assert not unclean, unclean


# Every test's default gateway names its providers mock-images and mock-keyed, in one database
# shared by the session: work a test left unfinished under those names would be claimed by the
# next test's gateway and sent to the (reset) mock, taking its scripted faults and its time. Once
# a test's gateways have stopped, that work is renamed out of reach of every later gateway.
SHARED_PROVIDERS = "('mock-images', 'mock-keyed')"


def settle_tombstones(psql):
    """The janitor deletes an expired job a sweep after it wrote the key's tombstone, once that is
    10 minutes old (migration 0032): tests that wait for a deletion age the tombstones written."""
    # (Constants only: a distributed database refuses arithmetic on a column in an UPDATE.)
    psql("UPDATE key_tombstones SET written_at = timestamptz '2000-01-01 00:00:00+00' "
         "WHERE written_at > timestamptz '2000-01-01 00:00:00+00'")


def retire_shared_work(database_url):
    subprocess.call(
        ["psql", database_url, "-qtAX", "-c",
         "UPDATE operations SET provider = provider || '.retired' "
         f"WHERE provider IN {SHARED_PROVIDERS} AND state NOT IN ('completed', 'failed'); "
         "UPDATE archive_outputs SET provider = provider || '.retired' "
         f"WHERE provider IN {SHARED_PROVIDERS} AND state = 'pending'"],
        stdout=subprocess.DEVNULL)


def stop_all(started, unclean):
    for gw in started:
        if gw.proc.poll() is None:
            gw.proc.send_signal(signal.SIGTERM)
            try:
                # A clean shutdown exits 0; under ASan a leak or memory error does not.
                if gw.proc.wait(timeout=15) != 0:
                    unclean.append((gw.proc.returncode, gw.log()[-3000:]))
            except subprocess.TimeoutExpired:
                gw.proc.kill()
                gw.proc.wait()
                unclean.append(("no exit within 15 s of SIGTERM", gw.log()[-3000:]))
        if "AddressSanitizer" in gw.log() or "runtime error:" in gw.log():
            unclean.append(("sanitizer report", gw.log()[-3000:]))


@pytest.fixture
def gateway(gateway_factory):
    return gateway_factory()


@pytest.fixture
def psql(database_url):
    """Runs one SQL string against the test database as `psql -qtAX -c` would (pqtext.py);
    returns rows as lists of strings."""
    def run(sql):
        return [line.split("\t") for line in pqtext.run(database_url, sql).splitlines() if line]
    return run


@contextlib.contextmanager
def pg_proxy(database_url):
    """A protocol proxy (tests/chaos/pgproxy.py) in front of the suite's database, and the
    database URL through it. Skips on a database reached over TCP."""
    from urllib.parse import parse_qs, urlsplit
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from chaos.pgproxy import PgProxy
    q = parse_qs(urlsplit(database_url).query)
    if not q.get("host", [""])[0].startswith("/"):
        pytest.skip("the protocol proxy speaks Unix sockets; this database is reached over TCP")
    sock_dir, port = q["host"][0], q["port"][0]
    d = tempfile.mkdtemp(prefix="idemgate-pgproxy-")
    os.chmod(d, 0o755)
    px = PgProxy(sock_dir, d, port).start()
    try:
        yield px, database_url.replace(sock_dir, d)
    finally:
        px.close()
