#!/usr/bin/env python3
"""`make bench-citus`: what idemgate does on a Citus cluster as workers are added, and what one
hot tenant costs (deploy/SCALING.md reports it).

CITUS_DATABASE_URL is a superuser URL of a Citus coordinator with its workers added (as for
`make test-citus`); without it this says so and exits 0. The project never builds nor downloads
Citus. First on one PostgreSQL (a database of the coordinator's own server, nothing
distributed: the baseline), then for W = 1 … the number of workers: a database of its own on the
coordinator with only the first W workers added (Citus keeps its node list per database), the
schema distributed with `idemgate migrate --citus`. Each gets BENCH_CITUS_TENANTS tenants and a
gateway in front of the repository's mock provider (the intake runs on a gateway without dispatch
workers, so that nothing sends meanwhile). Then, with wrk, for BENCH_SECONDS each after a
warm-up:
  e2e-spread     new keys with `Prefer: wait`, the connections shared by every tenant (a wrk
                 per tenant)
  e2e-hot        the same connections, all from one tenant
  intake-spread  new keys, answered 202, every tenant
  intake-hot     the same, one tenant
It prints a table and writes BENCH_CITUS_OUT (JSON). Numbers are reported, never asserted; every
node of a loopback cluster shares this machine's cores, so more workers add no CPU here: the
figures show what routing costs and where a tenant's rows live, not a scale-out."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit, urlunsplit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URL = os.environ.get("CITUS_DATABASE_URL", "").strip()
SECS = int(os.environ.get("BENCH_SECONDS", "10"))
WARM = int(os.environ.get("BENCH_WARMUP_SECONDS", "2"))
CONNS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
TENANTS = int(os.environ.get("BENCH_CITUS_TENANTS", "8"))
HTTP_THREADS = os.environ.get("BENCH_HTTP_THREADS", "4")
DISPATCH = os.environ.get("BENCH_DISPATCH_WORKERS", "4")
OUT = os.environ.get("BENCH_CITUS_OUT", os.path.join(REPO, "bench/results/citus-latest.json"))
GATEWAY = os.path.join(REPO, "build/idemgate")
MOCK = os.path.join(REPO, "build/idemgate-mock")
PATH = "/v1/providers/mock-images/images/generations"


def log(msg):
    print("bench-citus: " + msg, file=sys.stderr, flush=True)


def sql(url, q):
    return subprocess.run(["psql", url, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", q], check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()


def with_db(url, host=None, port=None, dbname=None):
    u = urlsplit(url)
    netloc = u.netloc
    if host is not None:
        netloc = (u.username + "@" if u.username else "") + "%s:%s" % (host, port)
    return urlunsplit((u.scheme, netloc, "/" + (dbname or u.path.lstrip("/")), u.query, ""))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_http(url, secs, proc):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if 200 <= r.status < 300:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wrk(url, token, prefer, nonce, conns, secs, log_path):
    threads = 2 if conns >= 2 else 1
    env = dict(os.environ, BENCH_WRK_DIR=os.path.join(REPO, "bench/wrk"), BENCH_TOKEN=token,
               BENCH_PREFER=prefer, BENCH_NONCE=nonce, BENCH_KEY="")
    out = open(log_path, "w")
    return subprocess.Popen(["timeout", str(secs + 60), "wrk", "-t%d" % threads, "-c%d" % conns,
                             "-d%ds" % secs, "--timeout", "35s", "-s",
                             os.path.join(REPO, "bench/wrk/unique.lua"), url],
                            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def wrk_result(path):
    for line in open(path):
        if line.startswith("@@BENCH "):
            return json.loads(line[len("@@BENCH "):])
    return None


def load(gw, tokens, prefer, name, tmp):
    """Runs CONNS connections split evenly over tokens (a wrk each): the warm-up, then the
    measured run. Returns the summed figures."""
    per = max(1, CONNS // len(tokens))
    for phase, secs in (("warm", WARM), ("run", SECS)):
        if secs <= 0:
            continue
        procs = [wrk(gw + PATH, t, prefer, "%s-%d-%s-%d" % (name, os.getpid(), phase, i), per,
                     secs, os.path.join(tmp, "wrk-%s-%s-%d.out" % (name, phase, i)))
                 for i, t in enumerate(tokens)]
        for p in procs:
            p.wait()
    res = [wrk_result(os.path.join(tmp, "wrk-%s-run-%d.out" % (name, i)))
           for i in range(len(tokens))]
    res = [r for r in res if r]
    if not res:
        return None
    codes = {}
    for r in res:
        for c, n in r.get("codes", {}).items():
            codes[c] = codes.get(c, 0) + n
    errors = sum(sum(r.get("errors", {}).values()) for r in res)
    return {"rps": round(sum(r["rps"] for r in res), 1),
            "requests": sum(r["requests"] for r in res),
            "p50_us": max(r["p50_us"] for r in res), "p99_us": max(r["p99_us"] for r in res),
            "codes": codes, "errors": errors, "connections": per * len(tokens),
            "tenants": len(tokens)}


def make_database(workers, w):
    name = "idemgate_bench_citus_w%d_%d" % (w, os.getpid())
    coord = urlsplit(URL)
    sql(URL, "CREATE DATABASE " + name)
    url = with_db(URL, dbname=name)
    if w == 0:
        # The baseline: one PostgreSQL (the coordinator's own server), nothing distributed.
        subprocess.run([GATEWAY, "migrate"], env=dict(os.environ, DATABASE_URL=url), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        return name, url
    for host, port in workers:
        sql(with_db(URL, host, port, name), "CREATE EXTENSION IF NOT EXISTS citus")
    sql(url, "CREATE EXTENSION IF NOT EXISTS citus")
    sql(url, "SELECT citus_set_coordinator_host('%s', %d)" % (coord.hostname, coord.port or 5432))
    for host, port in workers[:w]:
        sql(url, "SELECT citus_add_node('%s', %s)" % (host, port))
    subprocess.run([GATEWAY, "migrate", "--citus"], env=dict(os.environ, DATABASE_URL=url),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return name, url


def drop_database(name):
    sql(URL, "ALTER DATABASE %s WITH ALLOW_CONNECTIONS false" % name)
    sql(URL, "DROP DATABASE %s WITH (FORCE)" % name)


def pgss_reset(url):
    """Whether the coordinator keeps pg_stat_statements (then reset for the next run)."""
    try:
        sql(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        sql(url, "SELECT pg_stat_statements_reset()")
        return True
    except subprocess.CalledProcessError:
        return False


def pgss_top(url, n=6):
    """The coordinator's statements by total time over the run: calls and mean ms (a
    distributed statement's time includes its round trips to the workers)."""
    rows = sql(url, "SELECT coalesce(json_agg(s), '[]') FROM (SELECT left(regexp_replace(query, "
               "'\\s+', ' ', 'g'), 60) AS query, calls, round(mean_exec_time::numeric, 3) AS "
               "mean_ms, round(total_exec_time::numeric, 1) AS total_ms FROM pg_stat_statements "
               "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
               "AND query NOT LIKE '%%pg_stat_statements%%' ORDER BY total_exec_time DESC "
               "LIMIT %d) s" % n)
    return json.loads(rows)


def placement(url):
    """tenant id -> worker "host:port" holding its operations shard."""
    rows = sql(url, "SELECT t.id, s.nodename || ':' || s.nodeport FROM tenants t JOIN "
               "citus_shards s ON s.table_name = 'operations'::regclass AND s.shardid = "
               "get_shard_id_for_distribution_column('operations', t.id)")
    return {int(a): b for a, b in (r.split("|") for r in rows.split())}


def WHAT(w):
    return "%d worker(s)" % w if w else "one PostgreSQL"


def RUNS(tokens):
    # End to end first: the intake runs leave jobs to send that would queue ahead of them.
    every = (("e2e-spread", tokens, "wait=30"), ("e2e-hot", tokens[:1], "wait=30"),
             ("intake-spread", tokens, ""), ("intake-hot", tokens[:1], ""))
    only = os.environ.get("BENCH_CITUS_ONLY", "").split()
    return [r for r in every if not only or r[0] in only]


def run_cluster(workers, w, mock_url, tmp):
    name, url = make_database(workers, w)
    gw_proc = None
    try:
        env = dict(os.environ, DATABASE_URL=url)
        tokens = []
        for i in range(TENANTS):
            tokens.append(subprocess.run([GATEWAY, "tenant", "add", "bench-citus-%d" % i],
                                         env=env, check=True, capture_output=True, text=True,
                                         timeout=60).stdout.strip())
        where = placement(url) if w else {}
        cfg = os.path.join(tmp, "gateway.json")
        with open(os.path.join(REPO, "bench/idemgate.bench.json")) as f:
            text = f.read().replace("@MOCK_URL@", mock_url).replace(
                "@PROFILES@", os.path.join(REPO, "deploy/providers"))
        with open(cfg, "w") as f:
            f.write(text)
        runs = {}
        # End to end first, with dispatch workers; intake on a gateway without any, so that no
        # run sends the jobs an earlier one left.
        for dispatch, kinds in ((DISPATCH, ("e2e-spread", "e2e-hot")),
                                ("0", ("intake-spread", "intake-hot"))):
            todo = [r for r in RUNS(tokens) if r[0] in kinds]
            if not todo:
                continue
            port = free_port()
            genv = dict(env, IDEMGATE_CONFIG=cfg,
                        IDEMGATE_BENCH_PROVIDER_KEY="sk-bench-not-a-secret",
                        IDEMGATE_LISTEN="127.0.0.1:%d" % port, IDEMGATE_HTTP_THREADS=HTTP_THREADS,
                        IDEMGATE_DISPATCH_WORKERS=dispatch,
                        IDEMGATE_INSTANCE_ID="bench-citus-%d-%s" % (w, dispatch),
                        IDEMGATE_ARCHIVE_DIR=os.path.join(tmp, "archive-%d" % w))
            gw_log = open(os.path.join(tmp, "gateway-w%d-d%s.log" % (w, dispatch)), "w")
            gw_proc = subprocess.Popen([GATEWAY, "serve"], env=genv, stdout=gw_log,
                                       stderr=subprocess.STDOUT)
            gw = "http://127.0.0.1:%d" % port
            if not wait_http(gw + "/readyz", 120, gw_proc):
                raise RuntimeError("the gateway did not become ready (see %s)" % gw_log.name)
            for label, toks, prefer in todo:
                log("%s: %s" % (WHAT(w), label))
                stats = pgss_reset(url)
                runs[label] = load(gw, toks, prefer, "w%d-%s" % (w, label), tmp)
                if runs[label] and stats:
                    runs[label]["statements"] = pgss_top(url)
                urllib.request.urlopen(urllib.request.Request(mock_url + "/_reset",
                                                              method="POST"), timeout=10).close()
            stop(gw_proc)
            gw_proc = None
        per_worker = {}
        for tid, node in where.items():
            per_worker[node] = per_worker.get(node, 0) + 1
        hot = where.get(min(where)) if where else None
        return {"workers": w, "runs": runs, "tenants_per_worker": per_worker,
                "hot_tenant_worker": hot}
    finally:
        if gw_proc:
            stop(gw_proc)
        drop_database(name)


def main():
    if not URL:
        print("bench-citus: skipped: CITUS_DATABASE_URL is not set (a superuser URL of a Citus "
              "coordinator with its workers added; see deploy/SCALING.md)")
        return 0
    for b in (GATEWAY, MOCK):
        if not os.access(b, os.X_OK):
            log("%s is missing: run `make all` first" % b)
            return 1
    if not shutil.which("wrk"):
        log("wrk is missing (scripts/bench-deps.sh installs it)")
        return 1
    workers = [tuple(w.split("|")) for w in sql(
        URL, "SELECT nodename || '|' || nodeport FROM pg_dist_node WHERE groupid <> 0 AND "
        "isactive AND noderole = 'primary' ORDER BY nodeid").split()]
    if not workers:
        log("the coordinator of CITUS_DATABASE_URL has no active worker")
        return 1
    version = sql(URL, "SELECT extversion FROM pg_extension WHERE extname = 'citus'")
    tmp = tempfile.mkdtemp(prefix="idemgate-bench-citus-")
    mock_port = free_port()
    mock = subprocess.Popen([MOCK, "--listen", "127.0.0.1:%d" % mock_port],
                            stdout=open(os.path.join(tmp, "mock.out"), "w"),
                            stderr=subprocess.DEVNULL)
    results = []
    try:
        mock_url = "http://127.0.0.1:%d" % mock_port
        if not wait_http(mock_url + "/_health", 20, mock):
            log("the mock did not start")
            return 1
        for w in range(0, len(workers) + 1):
            results.append(run_cluster(workers, w, mock_url, tmp))
    finally:
        stop(mock)
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip(),
           "citus": version, "cores": os.cpu_count(), "seconds": SECS, "connections": CONNS,
           "tenants": TENANTS, "clusters": results}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
    print("Citus %s, %d cores, %d connections, %d s per run, %d tenants (%s)"
          % (version, os.cpu_count(), CONNS, SECS, TENANTS, doc["date"]))
    print("%-15s %-14s %10s %10s %10s %s" % ("database", "run", "req/s", "p50 ms", "p99 ms",
                                            "codes"))
    for c in results:
        for label, r in c["runs"].items():
            if r:
                print("%-15s %-14s %10.1f %10.1f %10.1f %s" % (
                    WHAT(c["workers"]), label, r["rps"], r["p50_us"] / 1000, r["p99_us"] / 1000,
                    r["codes"]))
        if not c["workers"]:
            continue
        print("         tenants per worker: %s; the hot tenant's worker: %s"
              % (c["tenants_per_worker"], c["hot_tenant_worker"]))
    if os.environ.get("BENCH_KEEP") == "1":
        log("logs kept in " + tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    log("written to " + OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
