"""Tenant isolation (issue 14 §2). Fair dispatch: one tenant's queue of prepared jobs does not delay
another tenant's first job by more than a few claims. The claim serves the tenant whose
turn comes next (turns.h: one claim per tenant with due work in turn), not the most overdue row of
the whole table."""

import threading
import time
import uuid

from conftest import tenant_token


def sha(token):
    return f"encode(sha256(convert_to('{token}', 'UTF8')), 'hex')"


def test_a_flooding_tenant_does_not_delay_a_quiet_tenants_first_job(gateway_factory,
                                                                      database_url, psql):
    flood, quiet = tenant_token(database_url), tenant_token(database_url)
    # Room for one call in flight: the flood becomes a backlog of `prepared` rows, claimed one
    # at a time by the fair claim (with room for all of them, none would wait).
    gw = gateway_factory(dispatch_workers=1, max_inflight_calls=1)
    n = 120
    # Every create takes 100 ms at the provider: a backlog of 12 s, so that most of it still
    # waits when the quiet job comes however slowly the 120 intakes are recorded (at 30 ms a
    # create, a slower machine's Citus had sent ~90 of them by then). The test does not wait
    # for the backlog: its cost is the quiet job's few claims.
    for i in range(n):
        r = gw.submit(flood, f"flood-{uuid.uuid4().hex}", {"prompt": f"flood {i}",
                                                           "_mock": {"delay_ms": 100}})
        assert r.status == 202, r
    r = gw.submit(quiet, f"quiet-{uuid.uuid4().hex}", {"prompt": "the quiet tenant's first"})
    assert r.status == 202, r
    quiet_id = r.json()["id"]
    assert gw.wait_state(quiet, quiet_id, ("completed",), 60)["state"] == "completed"

    flood_tenant = f"(SELECT id FROM tenants WHERE token_sha256 = {sha(flood)})"
    quiet_row = f"(SELECT created_at, first_sent_at FROM operations WHERE id = '{quiet_id}')"
    ahead = int(psql(f"SELECT count(*) FROM operations a, {quiet_row} q "
                     f"WHERE a.tenant_id = {flood_tenant} "
                     f"AND a.first_sent_at > q.created_at AND a.first_sent_at < q.first_sent_at")
                [0][0])
    waiting = int(psql(f"SELECT count(*) FROM operations a, {quiet_row} q "
                      f"WHERE a.tenant_id = {flood_tenant} "
                      f"AND (a.first_sent_at IS NULL OR a.first_sent_at > q.created_at)")[0][0])
    # The scenario happened: most of the flood was still waiting when the quiet job came.
    assert waiting >= n // 2, (ahead, waiting)
    # And the quiet tenant's first job waited for at most a few of the flood's claims.
    assert ahead <= 3, (ahead, waiting)


def test_a_lock_timeout_is_a_retryable_503_never_a_500(gateway_factory, database_url, psql):
    """A statement that gives up on a lock (lock_timeout) did nothing: the client gets 503
    store-busy with Retry-After and may send the same request again; never a 500. The operations
    table is held by another session for a few seconds while the gateway reads and records."""
    import subprocess
    import time
    tok = tenant_token(database_url)
    sep = "&" if "?" in database_url else "?"  # the Citus suite's URLs have no query string
    gw = gateway_factory(env={"DATABASE_URL": database_url + sep +
                              "options=-c%20lock_timeout%3D200"})
    r = gw.submit(tok, f"lock-{uuid.uuid4().hex}", {"prompt": "before the lock"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert gw.wait_state(tok, job_id, ("completed",))["state"] == "completed"
    holder = subprocess.Popen(["psql", database_url, "-qtAX", "-c",
                               "BEGIN; LOCK TABLE operations IN ACCESS EXCLUSIVE MODE; "
                               "SELECT pg_sleep(4); COMMIT;"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not psql("SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                       "WHERE c.relname = 'operations' AND l.mode = 'AccessExclusiveLock' "
                       "AND l.granted"):
            assert time.monotonic() < deadline, "the lock was never taken"
            time.sleep(0.05)
        answers = [gw.http.request("GET", "/v1/jobs?limit=5",
                                   headers={"Authorization": f"Bearer {tok}"}),
                   gw.submit(tok, f"lock-{uuid.uuid4().hex}", {"prompt": "during the lock"})]
        held = holder.poll() is None
    finally:
        holder.wait(30)
    assert held, "the lock ended before the requests were answered"
    for a in answers:
        assert a.status == 503, a
        assert a.headers.get("retry-after"), a
        assert a.json()["type"] == "urn:idemgate:problem:store-busy", a


def test_a_client_that_leaves_a_wait_frees_its_connection_at_once(gateway_factory, token, psql):
    """A client that goes away while its `Prefer: wait` is suspended is let go within a fraction
    of a second (its connection answered and closed: the access line is logged), not held until
    the job ends or the wait's deadline. The job itself goes on: it is still at the provider when
    the gateway lets the connection go."""
    import json as _json
    import socket
    import time
    gw = gateway_factory()
    rid = "leave-" + uuid.uuid4().hex[:12]
    key = "leave-" + uuid.uuid4().hex
    body = _json.dumps({"prompt": "slow", "_mock": {"delay_ms": 20000}}).encode()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(b"POST /v1/providers/mock-images/images/generations HTTP/1.1\r\n"
              b"Host: 127.0.0.1\r\nAuthorization: Bearer " + token.encode() + b"\r\n"
              b"Idempotency-Key: " + key.encode() + b"\r\nPrefer: wait=60\r\n"
              b"X-Request-Id: " + rid.encode() + b"\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 15
    while not psql(f"SELECT 1 FROM operations WHERE idempotency_key = '{key}' "
                   f"AND state = 'sending'"):
        assert time.monotonic() < deadline, "the job never reached the provider"
        time.sleep(0.05)
    s.close()  # the client leaves while its wait is suspended

    def access_line():
        for line in gw.log().splitlines():
            if f'"request_id":"{rid}"' in line and '"event":"http"' in line:
                return line
        return None
    deadline = time.monotonic() + 40
    while access_line() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    state = psql(f"SELECT state FROM operations WHERE idempotency_key = '{key}'")[0][0]
    assert access_line() is not None, "the connection was never let go"
    assert state == "sending", f"let go only when the job ended ({state})"


def set_limits(database_url, name, *args):
    import os
    import subprocess
    from conftest import GATEWAY_BIN
    subprocess.check_call([GATEWAY_BIN, "tenant", "limits", name, *args],
                          env=dict(os.environ, DATABASE_URL=database_url))


def test_tenant_rate_limit_answers_429_and_records_nothing(gateway_factory, database_url, psql):
    """A tenant over its requests per second gets 429 rate-limited with Retry-After, and nothing
    is recorded for it; another tenant, without a limit of its own, is not slowed."""
    name = "rl-" + uuid.uuid4().hex[:10]
    limited = tenant_token(database_url, name)
    other = tenant_token(database_url)
    set_limits(database_url, name, "--rps", "1", "--burst", "2")
    gw = gateway_factory()
    answers = []
    for i in range(60):  # the limits are read on the first request: a 429 comes soon after
        r = gw.submit(limited, f"rl-{uuid.uuid4().hex}", {"prompt": f"rl {i}"})
        answers.append(r)
        if r.status == 429:
            break
    limited_429 = [a for a in answers if a.status == 429]
    assert limited_429, [a.status for a in answers]
    a = limited_429[0]
    assert int(a.headers["retry-after"]) >= 1, a
    assert a.json()["type"] == "urn:idemgate:problem:rate-limited", a
    accepted = sum(1 for a in answers if a.status == 202)
    assert accepted + 1 == len(answers), [a.status for a in answers]
    rows = psql(f"SELECT count(*) FROM operations WHERE tenant_id = "
                f"(SELECT id FROM tenants WHERE name = '{name}')")
    assert rows == [[str(accepted)]], (rows, accepted)
    others = [gw.submit(other, f"free-{uuid.uuid4().hex}", {"prompt": f"free {i}"}).status
              for i in range(20)]
    assert others == [202] * 20, others


def test_tenant_wait_connections_limit(gateway_factory, database_url, psql):
    """A tenant holding as many `Prefer: wait` connections as it may gets 429 for one more
    (nothing recorded), and the slot is its again once the held wait is over."""
    import threading
    import time
    name = "wl-" + uuid.uuid4().hex[:10]
    tok = tenant_token(database_url, name)
    set_limits(database_url, name, "--waits", "1")
    gw = gateway_factory()
    assert gw.submit(tok, f"wl-{uuid.uuid4().hex}", {"prompt": "first"}).status == 202
    held, held_key = {}, f"wl-held-{uuid.uuid4().hex}"

    def hold():
        held["r"] = gw.submit(tok, held_key,
                              {"prompt": "held", "_mock": {"delay_ms": 3000}},
                              headers={"Prefer": "wait=20"}, timeout=40)
    t = threading.Thread(target=hold)
    t.start()
    deadline = time.monotonic() + 20
    while not psql(f"SELECT 1 FROM operations WHERE idempotency_key = '{held_key}'"):
        assert time.monotonic() < deadline, "the held request was never recorded"
        time.sleep(0.02)  # recorded: its wait was counted before (the limit step comes first)
    refused = None
    for _ in range(40):  # bounded: until the held wait is counted and a second one refused
        r = gw.submit(tok, f"wl-{uuid.uuid4().hex}", {"prompt": "second"},
                      headers={"Prefer": "wait=1"}, timeout=20)
        if r.status == 429:
            refused = r
            break
        time.sleep(0.05)
    t.join(60)
    assert refused is not None, "a second wait was never refused"
    assert "Prefer: wait" in refused.json()["detail"], refused
    assert held["r"].status == 200, held["r"]
    again = gw.submit(tok, f"wl-{uuid.uuid4().hex}", {"prompt": "after"},
                      headers={"Prefer": "wait=20"}, timeout=40)
    assert again.status == 200, again


def test_an_admins_absent_passes_the_jobs_tenants_rate(gateway_factory, database_url, psql):
    """An operator's `absent` sends the job again: the admin token resolves it, and the rate
    that applies is the job's tenant's, whoever resolves it. With the tenant at 1 request per
    second (burst 1), resolving as fast as possible meets its 429 within a bounded number of
    tries; a gateway that applied the admin's own (unlimited) rate never would."""
    import hashlib
    admin = "admin-" + uuid.uuid4().hex
    name = "rla-" + uuid.uuid4().hex[:10]
    tok = tenant_token(database_url, name)
    set_limits(database_url, name, "--rps", "1", "--burst", "1")
    gw = gateway_factory(admin_token_sha256=hashlib.sha256(admin.encode()).hexdigest())
    r = None
    for i in range(60):  # the limits are read on the first request
        r = gw.submit(tok, f"rla-{uuid.uuid4().hex}", {"prompt": f"rla {i}"})
        if r.status == 202:
            break
    assert r is not None and r.status == 202, r
    job = r.json()["id"]
    gw.wait_state(tok, job, {"completed"})
    statuses = []
    # By tenant and id: one shard on Citus, where an update of every shard took ~0.5 s, long
    # enough for the tenant's bucket to refill between two tries.
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    for _ in range(60):
        psql(f"UPDATE operations SET state = 'review', finished_at = NULL "
             f"WHERE tenant_id = {tid} AND id = '{job}'")
        # (forced: the job's create was answered 200, its task known — the admin's word)
        a = gw.http.request("POST", f"/v1/jobs/{job}/resolve",
                            '{"outcome":"absent","force":true}',
                            {"Authorization": f"Bearer {admin}",
                             "Content-Type": "application/json"})
        statuses.append(a.status)
        if a.status == 429:
            break
    assert statuses[-1] == 429, statuses


def test_the_ring_read_finds_the_same_tenants_as_the_grouped_read(database_url, psql):
    """A ring's read on PostgreSQL is a skip scan (turns.h, TURNS_DUE); a distributed database
    gets the grouped read. Both must name the same tenants: rows of each kind due and not due,
    held by a lease, of another provider, in several tenants with gaps between their ids."""
    import json
    import subprocess
    from conftest import GATEWAY_BIN
    tenants = [psql(f"SELECT id FROM tenants WHERE token_sha256 = {sha(tenant_token(database_url))}")
               [0][0] for _ in range(6)]
    prov = "ring" + uuid.uuid4().hex[:8]
    rows = []
    # tenant index, state, due, leased, provider
    shapes = [(0, "prepared", True, False, prov), (1, "prepared", False, False, prov),
              (2, "unknown", True, False, prov), (2, "unknown", True, True, prov),
              (3, "accepted", True, False, prov), (3, "prepared", True, False, "other"),
              (4, "unknown", False, False, prov), (4, "accepted", True, True, prov),
              (5, "prepared", True, False, prov), (5, "accepted", False, False, prov)]
    for i, (t, state, due, leased, p) in enumerate(shapes):
        rows.append(f"({tenants[t]}, 'job_ring{prov}{i}', 'k{prov}{i}', '\\x00', 1, '{p}', 'r', "
                    f"'POST', 'http://x', '', '\\x00', '{state}', now() + interval '1 day', "
                    f"now() {'-' if due else '+'} interval '1 hour', "
                    f"{'now() + interval' + chr(39) + '1 hour' + chr(39) if leased else 'NULL'})")
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         "state, expires_at, next_attempt_at, lease_expires_at) VALUES " + ", ".join(rows))
    for i, due in ((0, True), (1, False), (2, True), (4, False)):  # tenants 0, 1, 2, 3
        psql("INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, next_attempt_at) "
             f"VALUES ({tenants[shapes[i][0]]}, 'job_ring{prov}{i}', 0, '{prov}', 'url', "
             f"now() {'-' if due else '+'} interval '1 hour')")
    try:
        out = subprocess.run([GATEWAY_BIN, "statements"], capture_output=True, text=True,
                             check=True).stdout
        known = {s["name"]: s for s in map(json.loads, out.splitlines())}
        # On Citus (make test-citus) only the grouped read runs: the skip scan is refused there.
        citus = psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1"

        def read(sql):
            return {r[0] for r in psql(sql.replace("$1", "'{" + prov + "}'"))} & set(tenants)
        want = {"claim_due": {0, 5}, "reconcile_due": {2}, "poll_due": {3},
                "archive_claim_due": {0, 2}}
        for name, idx in want.items():
            s = known[name]
            assert "sql_distributed" in s and s["sql"] != s["sql_distributed"], name
            grouped = read(s["sql_distributed"])
            assert grouped == {tenants[i] for i in idx}, (name, grouped)
            if not citus:
                assert read(s["sql"]) == grouped, name
    finally:
        psql(f"DELETE FROM operations WHERE provider IN ('{prov}', 'other') "
             f"AND id LIKE 'job_ring{prov}%'")


def test_a_quiet_gateways_tenant_is_not_queued_behind_unknown_tokens(gateway_factory,
                                                                      database_url):
    """The database workers serve their queue one caller at a time in turn (offload.h), every
    token no tenant holds sharing one lane. A tenant's token is its own lane from the directory
    as last read, however long ago: after more than TENANTS_MAX_AGE_S without a read (a quiet
    gateway), its request was queued in the unknown tokens' lane, behind all of them. With one
    worker held (a pause point), twenty requests with made-up tokens, then the tenant's, are
    queued; once the worker is free, the tenant's is answered among the first few."""
    token = tenant_token(database_url)
    gw = gateway_factory(db_workers=1, max_connections=256,
                         env={"IDEMGATE_PAUSE": "offloaded_run:8000"})
    done = []
    lock = threading.Lock()

    def get(name, tok):
        r = gw.http.request("GET", "/v1/jobs", headers={"Authorization": f"Bearer {tok}"},
                            timeout=60)
        with lock:
            done.append((name, r.status, r.headers.get("x-request-id")))

    holder = threading.Thread(target=get, args=("holder", uuid.uuid4().hex))
    holder.start()
    deadline = time.monotonic() + 10
    while '"offloaded_run"' not in gw.log():
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.02)
    time.sleep(2.2)  # the directory's last read is now older than TENANTS_MAX_AGE_S
    threads = [threading.Thread(target=get, args=(f"unknown{i}", uuid.uuid4().hex))
               for i in range(20)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # queued behind the held worker (held 8 s in all)
    mine = threading.Thread(target=get, args=("tenant", token))
    mine.start()
    for t in [holder, mine] + threads:
        t.join(60)
    assert '"offloaded_run"' in gw.log() and len(done) == 22, done
    status = {name: st for name, st, _ in done}
    assert status["tenant"] == 200 and status["unknown0"] == 401, done
    # The order the gateway answered them in: its access log's, one line each when answered.
    log = gw.log()
    at = {name: log.find(f'"event":"http","request_id":"{rid}"') for name, _, rid in done}
    assert all(v >= 0 for v in at.values()), at
    order = sorted(at, key=at.get)
    ahead = sum(1 for name in order[:order.index("tenant")] if name.startswith("unknown"))
    assert ahead <= 3, order
