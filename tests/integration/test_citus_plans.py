"""On a Citus coordinator (`make test-citus`, CITUS_DATABASE_URL): every request-path statement
is planned onto the tenant's worker alone (issue 23 §3). Each statement's text comes from the
binary (`idemgate statements`); EXPLAIN of it, with its tenant's id bound, must show one step
of one task on the one worker holding that tenant's shards. A statement of modifying CTEs (each
run as a subplan of its own: a round trip between the coordinator and the worker per step) fails
here, as does one that reads or writes every shard (`Task Count: 32`).

Without Citus (CI has none) the module is skipped and says why."""

import json
import re
import subprocess
import uuid

import pytest

from conftest import CITUS_URL, GATEWAY_BIN, tenant_token

pytestmark = pytest.mark.skipif(not CITUS_URL, reason="CITUS_DATABASE_URL is not set: "
                                "the plans are Citus's (make test-citus)")

T = "$TENANT"  # the tenant's id, bound when the test runs

# Each request-path step with sample arguments (None: SQL NULL). The values need not match a
# row: EXPLAIN plans, it does not run.
STEPS = {
    "intake": [T, "k", "job_new", "00", 1, "mock", "r", "POST", "/", "c", "\\x00", 24, None,
               "none", None, None, None, None, 0, None, "false", "2026-12-02T00:00:00Z"],
    "by_key": [T, "k"],                                     # replay
    "job_get": [T, "job_x"],                                # read
    "jobs_list": [T, None, "infinity", "", 10],
    "jobs_in_state": [T, None, "infinity", "", "prepared", 10],
    "jobs_by_key": [T, None, "infinity", "", "k", None],
    "job_attempts": [T, "job_x"],
    "cancel": [T, "job_x"],
    "resolve": [T, "job_x", "abandon", "failed", "op", None, "t", 1],
    "regenerate": [T, "job_x", "job_new", "k2", "00", 1, 24],
    "claim": ["me", 30, "{mock}", T, '{"mock": "mock#0123456789ab"}'],
    "begin_send": [T, "job_x", 1, 30],
    "claim_lost": [T, "me~00000000000000ff"],             # a claim whose answer was lost
    "finish": [T, "job_x", 1, "completed", 200, "{}", "\\x00", None, None, 1, 2, "ok", 0, 0, 0,
               "sending", "create", None, None, None, None, None, None, None, "false", None,
               '[{"n": 0, "kind": "url", "url": "https://x/0.png", "expires": 0}]'],
    "reconcile_claim": ["me", 30, "{mock}", T],
    "reconcile_send": [T, "job_x", 1, 30, "mock#0123456789ab"],
    "lease_renew": [T, "job_x", 1, 30],                     # a long create keeps its lease
    "job_hint": [T, "job_x", "{found_without_id}"],   # resolve: a webhook's unread task, a verdict
    "poll_claim": ["me", 30, "{mock}", T],
    "poll_cancel_sent": [T, "job_x", 1, "true"],
    "unparked_poll": [T, "job_x"],
    "note_remote": [T, "job_x", 1, "resp_x"],
    "keep_hint": [T, "job_x", 1, "task_x"],
    "partial_record": [T, "job_x", 1],
    "note_partial": [T, "job_x", 1, "\\x00", 0],
    "archive_plan_write": [T, "job_x", "[]"],
    "archive_claim": ["me", 30, "{mock}", T, 8],
    "archive_finish": [T, "job_x", 0, 1, "archived", None, 0, None, None, None, None, None,
                       False],
    "archive_job_outputs": [T, "job_x"],
    "archive_output_get": [T, "job_x", 0],
    # retention: a tenant's expired jobs with their attempt and archive rows (migration 0030)
    "janitor": [10, T],
}


def statements():
    out = subprocess.run([GATEWAY_BIN, "statements"], capture_output=True, text=True, check=True)
    return {s["name"]: s for s in map(json.loads, out.stdout.splitlines())}


def literal(v, tenant):
    if v is None:
        return "NULL"
    v = str(tenant) if v == T else str(v)
    return "'" + v.replace("'", "''") + "'"


def plan_nodes(lines, coordinator):
    """The task counts of every step, and the worker nodes the steps go to."""
    tasks, workers = [], set()
    for line in lines:
        line = line.strip()
        if line.startswith("Task Count:"):
            tasks.append(int(line.split(":")[1]))
        elif line.startswith("Node: host="):
            fields = dict(f.split("=", 1) for f in line[len("Node: "):].split())
            host, port = fields["host"], int(fields["port"])
            if not (port == coordinator[1] and host in (coordinator[0], "localhost")):
                workers.add((host, port))
    return tasks, workers


def test_every_request_path_step_runs_on_the_tenants_worker_alone(database_url, psql):
    tenant = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name(database_url)}'")[0][0]
    host, port = psql("SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0")[0]
    coordinator = (host, int(port))
    known = statements()
    report, wrong = [], []
    for name, args in STEPS.items():
        assert name in known, f"no statement named {name} in `idemgate statements`"
        # The values in place of $n, as the gateway's custom plans see them (EXPLAIN of a
        # prepared INSERT … SELECT from a modifying CTE fails on Citus with parameters).
        values = [literal(a, tenant) for a in args]
        sql = "EXPLAIN " + re.sub(r"\$(\d+)", lambda m: values[int(m.group(1)) - 1],
                                  known[name].get("sql_distributed", known[name]["sql"]))
        lines = [r[0] for r in psql(sql)]
        tasks, workers = plan_nodes(lines, coordinator)
        report.append(f"{name:22} steps {len(tasks):2}  tasks {tasks}  workers {sorted(workers)}")
        if len(tasks) != 1 or tasks[0] != 1 or len(workers) > 1:
            wrong.append(name)
    print("\n" + "\n".join(report))
    assert not wrong, "not on one worker: " + ", ".join(wrong) + "\n" + "\n".join(report)


_names = {}


def tenant_name(database_url):
    """One tenant of this module's own, made once."""
    if database_url not in _names:
        _names[database_url] = "plans-" + uuid.uuid4().hex[:10]
        tenant_token(database_url, _names[database_url])
    return _names[database_url]


# The reads across tenants (a /metrics scrape, the operator's console): they read every shard,
# so they are not in STEPS, but each must run. A statement Citus refuses (0A000) makes /readyz
# unready (stmthealth.h): the terminal counts, read at a scrape, were such a statement.
ACROSS = {
    "gauges": [],
    "gauges_terminal": [],
    "admin_overview": [],
    "admin_jobs_list": [None, None, "infinity", "", 10],
    "admin_jobs_in_state": [None, None, "infinity", "", 10, "review"],
    "admin_jobs_by_key": [None, None, "infinity", "", 10, "k", None],
    # `idemgate unreferenced`: the archive's deletion hook (outputs and stored upload parts)
    "unreferenced_sha256": ["{" + "0" * 64 + "}"],
    # The rings' reads of which tenants have due work, the reaper's, retention's and the
    # archive planner's.
    "claim_due": ["{mock}"],
    "reconcile_due": ["{mock}"],
    "poll_due": ["{mock}"],
    "reap_due": [],
    "janitor_due": [],
    "archive_plan_pick": ["{mock}"],
}


def test_every_read_across_tenants_runs(database_url, psql):
    tenant = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name(database_url)}'")[0][0]
    known = statements()
    failed = []
    for name, args in ACROSS.items():
        assert name in known, f"no statement named {name} in `idemgate statements`"
        values = [literal(a, tenant) for a in args]
        sql = re.sub(r"\$(\d+)", lambda m: values[int(m.group(1)) - 1],
                     known[name].get("sql_distributed", known[name]["sql"]))
        try:
            psql(sql)
        except subprocess.CalledProcessError as e:
            failed.append(f"{name}: exit {e.returncode}")
    assert not failed, failed
