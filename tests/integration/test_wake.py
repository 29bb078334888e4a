"""Wake-ups without pg_notify in request commits: the replica that writes a state wakes its own
dispatchers and waiters in process; the other replicas learn through its signaller (one
coalesced transaction of NOTIFYs); a lost signal costs latency only."""

import threading
import time
import uuid


def test_the_notify_trigger_is_gone(psql):
    assert psql("SELECT tgname FROM pg_trigger WHERE tgname = 'operations_notify'") == []
    assert psql("SELECT proname FROM pg_proc WHERE proname = 'idemgate_notify'") == []
    assert psql("SELECT 1 FROM schema_migrations WHERE version = 6") == [["1"]]


def test_a_waiting_client_is_answered_when_another_replica_does_the_work(
        gateway_factory, token, mock, psql):
    # A takes requests only; B only dispatches. Both poll once a minute, well past the client's
    # deadline: A's work signal must wake B's idle dispatcher, and B's done signal A's waiter.
    a = gateway_factory(dispatch_workers=0, poll_interval_ms=60000, wait_poll_ms=60000)
    b = gateway_factory(dispatch_workers=1, poll_interval_ms=60000, wait_poll_ms=60000)
    answers = []
    for i in range(3):  # each job after an idle spell: every signal is needed again
        r = a.submit(token, f"remote-{i}-" + uuid.uuid4().hex, {"prompt": str(i)},
                     headers={"Prefer": "wait=20"}, timeout=40)
        answers.append(r)
    assert [r.status for r in answers] == [200] * 3, answers
    for r in answers:
        assert r.headers["x-idemgate-state"] == "completed", r  # the provider's, not a 202
        job_id = r.headers["x-idemgate-job-id"]
        assert len(mock.creates_for(job_id)) == 1
        assert psql(f"SELECT state FROM operations WHERE id = '{job_id}'") == [["completed"]]
        assert f'"event":"dispatched","job_id":"{job_id}"' in b.log(), "B made the attempt"
        attempts = psql(f"SELECT decision FROM attempts WHERE operation_id = '{job_id}'")
        assert attempts == [["completed"]]


def test_many_jobs_finished_elsewhere_wake_every_waiter(gateway_factory, token, mock):
    # Results written together reach the other replica joined in few payloads; each waiter is
    # woken by its own job's id.
    a = gateway_factory(dispatch_workers=0, poll_interval_ms=60000, wait_poll_ms=60000,
                        http_threads=2)
    gateway_factory(dispatch_workers=4, poll_interval_ms=60000, wait_poll_ms=60000)
    results = {}

    def waiter(i):
        results[i] = a.submit(token, f"many-{i}-" + uuid.uuid4().hex,
                              {"prompt": str(i), "_mock": {"delay_ms": 300}},
                              headers={"Prefer": "wait=20"}, timeout=40)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(20))
    assert {r.status for r in results.values()} == {200}, results
    assert {r.headers["x-idemgate-state"] for r in results.values()} == {"completed"}


def test_a_lost_signal_costs_at_most_wait_poll_ms(gateway_factory, token, psql):
    # Nothing signals a state written behind the gateway's back (the trigger is gone): only the
    # waiters' poll of their jobs can answer this client before its deadline.
    gw = gateway_factory(dispatch_workers=0, wait_poll_ms=200)
    key = "lost-" + uuid.uuid4().hex
    out = []
    t = threading.Thread(target=lambda: out.append(
        gw.submit(token, key, {"prompt": "x"}, headers={"Prefer": "wait=20"}, timeout=40)))
    t.start()
    job_id = None
    deadline = time.monotonic() + 10
    while job_id is None and time.monotonic() < deadline:
        rows = psql(f"SELECT id FROM operations WHERE idempotency_key = '{key}'")
        job_id = rows[0][0] if rows else None
        time.sleep(0.02)
    assert job_id, "the intent was recorded"
    assert out == [], "the client is waiting"
    psql("UPDATE operations SET state = 'failed', finished_at = now(), "
         f"last_error = 'failed elsewhere' WHERE id = '{job_id}'")
    t.join(timeout=30)
    assert len(out) == 1
    r = out[0]
    # Failed without a provider answer: a 502 naming the job (never a 200 an SDK would take
    # for a success).
    assert r.status == 502, r
    assert r.headers["x-idemgate-job-id"] == job_id and "failed elsewhere" in r.json()["detail"], r
