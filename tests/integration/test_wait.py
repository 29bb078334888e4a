"""Prefer: wait (RFC 7240): the connection is held, suspended, until the job is terminal."""

import threading
import time
import uuid


def test_prefer_wait_returns_the_provider_body(gateway, token, mock):
    k = "wait-" + uuid.uuid4().hex
    body = {"prompt": "wait for me", "n": 2, "_mock": {"delay_ms": 800}}
    t0 = time.monotonic()
    r = gateway.submit(token, k, body, headers={"Prefer": "wait=10"})
    waited = time.monotonic() - t0
    assert r.status == 200, r
    assert waited >= 0.8, "the answer came after the provider's"
    out = r.json()
    assert len(out["data"]) == 2 and out["usage"]["output_tokens"] == 200
    assert r.headers["location"].startswith("/v1/jobs/job_")
    assert "idempotent-replayed" not in r.headers
    job_id = r.headers["x-idemgate-job-id"]

    dup = gateway.submit(token, k, body, headers={"Prefer": "wait=10"})
    assert dup.status == 200
    assert dup.body == r.body
    assert dup.headers["idempotent-replayed"] == "true"
    assert len(mock.creates_for(job_id)) == 1


def test_prefer_wait_times_out_with_202(gateway, token):
    k = "wait-timeout-" + uuid.uuid4().hex
    r = gateway.submit(token, k, {"prompt": "slow", "_mock": {"delay_ms": 3000}},
                       headers={"Prefer": "wait=1"})
    assert r.status == 202, r
    assert r.json()["state"] in ("prepared", "sending")


def test_a_wait_whose_job_is_gone_is_answered_404(gateway, token, psql):
    """The job is deleted while its client waits (retention, an operator): when the wait ends
    the client is told the job is gone — 404 — not that its token was refused (401)."""
    k = "wait-gone-" + uuid.uuid4().hex
    answer = []
    t = threading.Thread(target=lambda: answer.append(gateway.submit(
        token, k, {"prompt": "slow", "_mock": {"delay_ms": 3000}}, headers={"Prefer": "wait=2"})))
    t.start()
    deadline = time.monotonic() + 10
    while psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{k}'") == [["0"]]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    psql(f"DELETE FROM operations WHERE idempotency_key = '{k}'")
    t.join(timeout=30)
    assert answer and answer[0].status == 404, answer
    assert answer[0].json()["type"].endswith("job-not-found"), answer[0].json()


def test_waiting_clients_do_not_block_server_threads(gateway_factory, token):
    # One server thread; ten clients wait on slow jobs while a GET still gets through at once.
    gw = gateway_factory(http_threads=1, dispatch_workers=4)
    results = []

    def waiter(i):
        results.append(gw.submit(token, f"park-{uuid.uuid4().hex}",
                                 {"prompt": str(i), "_mock": {"delay_ms": 1500}},
                                 headers={"Prefer": "wait=10"}))

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    health = gw.http.request("GET", "/healthz", timeout=1)
    assert health.status == 200
    assert len(results) == 0, "the waiters are still waiting"
    for t in threads:
        t.join(timeout=30)
    assert [r.status for r in results] == [200] * 10


def wait_answers(gw):
    """idemgate_wait_answers_total by source."""
    text = gw.http.request("GET", "/metrics").body.decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("idemgate_wait_answers_total{source="):
            out[line.split('"')[1]] = float(line.split()[1])
    assert set(out) == {"memory", "read"}, text[-2000:]
    return out


def test_a_waiter_is_answered_from_the_memory_of_the_replica_that_finished_its_job(
        gateway_factory, token, mock):
    """Issue 22 item 3: the replica whose commit ended the job answers its waiting client from
    memory (no read of the job), with exactly what a read of the row answers; a waiter on
    another replica, woken by the database's signal, reads the job."""
    a = gateway_factory()
    b = gateway_factory()
    body = {"prompt": "answer me from memory", "n": 2, "_mock": {"delay_ms": 400}}
    before = wait_answers(a)
    k = "mem-" + uuid.uuid4().hex
    r = a.submit(token, k, body, headers={"Prefer": "wait=10"})
    assert r.status == 200, r
    after = wait_answers(a)
    assert after["memory"] == before["memory"] + 1, (before, after)
    assert after["read"] == before["read"], (before, after)
    # The same job read from the database by the other replica: the same answer.
    dup = b.submit(token, k, body, headers={"Prefer": "wait=10"})
    assert dup.status == r.status == 200
    assert dup.body == r.body
    assert dup.headers["content-type"] == r.headers["content-type"]
    assert dup.headers["x-idemgate-job-id"] == r.headers["x-idemgate-job-id"]
    assert dup.headers["x-idemgate-state"] == r.headers["x-idemgate-state"] == "completed"

    # A waiter on b for a job a is sending: b is woken by the signal and reads the job.
    k2 = "mem-other-" + uuid.uuid4().hex
    slow = dict(body, _mock={"delay_ms": 1500})
    first = a.submit(token, k2, slow)
    assert first.status == 202, first
    before_b = wait_answers(b)
    waited = b.submit(token, k2, slow, headers={"Prefer": "wait=10"})
    assert waited.status == 200, waited
    after_b = wait_answers(b)
    assert after_b["read"] == before_b["read"] + 1, (before_b, after_b)
    assert after_b["memory"] == before_b["memory"], (before_b, after_b)
    assert len(mock.creates_for(r.headers["x-idemgate-job-id"])) == 1
    assert len(mock.creates_for(first.json()["id"])) == 1
