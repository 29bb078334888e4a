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
