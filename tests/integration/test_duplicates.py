"""Duplicates and durability: concurrent identical requests, several replicas, tenants, and a
gateway killed while the provider holds the create. Every assertion is on the mock's ledger,
which counts what the provider actually received."""

import json
import os
import signal
import threading
import time
import uuid


def fan_out(n, fn):
    """Runs fn(i) on n threads released together; returns the results in order."""
    results = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def check_one_job(results, mock, psql, gw, token, k):
    assert all(r is not None and r.status == 202 for r in results), results
    ids = {r.json()["id"] for r in results}
    assert len(ids) == 1, ids
    job_id = ids.pop()
    created = [r for r in results if r.headers.get("idempotent-replayed") != "true"]
    assert len(created) == 1, "exactly one answer is the creation, every other one a replay"
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{k}'") == [["1"]]
    assert gw.wait_state(token, job_id, {"completed"})["state"] == "completed"
    time.sleep(0.3)  # anything sent late would show in the ledger now
    assert len(mock.creates_for(job_id)) == 1
    assert len(mock.ledger()) == 1
    return job_id


def test_50_concurrent_identical_requests_one_create(gateway, token, mock, psql):
    k = "dup-" + uuid.uuid4().hex
    body = {"prompt": "one lighthouse", "n": 1}
    results = fan_out(50, lambda i: gateway.submit(token, k, body))
    check_one_job(results, mock, psql, gateway, token, k)


def test_50_concurrent_identical_requests_two_gateways(gateway_factory, token, mock, psql):
    gws = [gateway_factory(), gateway_factory()]
    k = "dup2-" + uuid.uuid4().hex
    body = {"prompt": "two replicas", "n": 2}
    results = fan_out(50, lambda i: gws[i % 2].submit(token, k, body))
    check_one_job(results, mock, psql, gws[0], token, k)


def test_same_key_two_tenants_two_jobs(gateway, mock, database_url):
    from conftest import tenant_token
    a, b = tenant_token(database_url), tenant_token(database_url)
    k = "shared-key"
    ra = gateway.submit(a, k, {"prompt": "a"})
    rb = gateway.submit(b, k, {"prompt": "b"})
    assert ra.status == 202 and rb.status == 202
    assert "idempotent-replayed" not in ra.headers and "idempotent-replayed" not in rb.headers
    ja, jb = ra.json()["id"], rb.json()["id"]
    assert ja != jb
    assert gateway.wait_state(a, ja, {"completed"})["state"] == "completed"
    assert gateway.wait_state(b, jb, {"completed"})["state"] == "completed"
    assert len(mock.creates_for(ja)) == 1 and len(mock.creates_for(jb)) == 1
    # Tenant-scoped reads: the other tenant's job does not exist for you.
    assert gateway.job(a, jb).status == 404
    assert gateway.job(b, ja).status == 404
    assert gateway.job(a, ja).status == 200


def test_intent_accepted_without_workers_is_dispatched_by_a_later_gateway(
        gateway_factory, token, mock, psql):
    intake_only = gateway_factory(dispatch_workers=0)
    r = intake_only.submit(token, "later-" + uuid.uuid4().hex, {"prompt": "durable intent"})
    assert r.status == 202
    job_id = r.json()["id"]
    time.sleep(0.5)
    assert intake_only.job(token, job_id).json()["state"] == "prepared"
    assert mock.ledger() == []
    # The first process goes away; the intent is in PostgreSQL, not in its memory.
    intake_only.proc.send_signal(signal.SIGKILL)
    intake_only.proc.wait()
    worker = gateway_factory(dispatch_workers=1)
    job = worker.wait_state(token, job_id, {"completed"})
    assert job["state"] == "completed"
    assert len(mock.creates_for(job_id)) == 1


def test_killed_while_provider_holds_the_create_is_never_resent(gateway_factory, token, mock,
                                                                psql):
    # The mock holds the create 3 s; the gateway dies meanwhile. Its lease (8 s) then expires.
    gw = gateway_factory(lease_seconds=8)
    r = gw.submit(token, "kill-" + uuid.uuid4().hex,
                  {"prompt": "slow", "_mock": {"delay_ms": 3000}})
    job_id = r.json()["id"]
    deadline = time.monotonic() + 10
    while not mock.creates_for(job_id) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(mock.creates_for(job_id)) == 1, "the create reached the provider"
    gw.proc.send_signal(signal.SIGKILL)
    gw.proc.wait()

    restarted = gateway_factory(lease_seconds=8)
    job = restarted.wait_state(token, job_id, {"unknown"}, timeout=15)
    assert job["state"] == "unknown", job
    time.sleep(1.0)
    assert len(mock.creates_for(job_id)) == 1, "nothing was sent again"
    assert restarted.job(token, job_id).json()["state"] == "unknown"
    rows = psql(f"SELECT kind, outcome, decision FROM attempts WHERE operation_id = '{job_id}' "
                "ORDER BY seq")
    assert rows[0] == ["create", "lease_expired", "unknown"]
    # After it, only reconciliation looks (this provider has none: it waits for its window).
    assert all(r[0] == "reconcile" and r[2] == "unknown" for r in rows[1:]), rows
