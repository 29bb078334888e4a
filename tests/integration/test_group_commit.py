"""Group commit at intake (issue 12): concurrent intents share one transaction and one WAL flush,
and each still gets exactly the answer a commit of its own would have given it — duplicates in a
batch and across replicas, a bad row among good ones, a kill between a batch's commit and its
answers."""

import os
import re
import sys
import time
import uuid

import pytest

from conftest import ROOT, free_port, tenant_token

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos import harness, providers  # noqa: E402
from chaos.client import Client, RetryPolicy, fan_out, run_all  # noqa: E402
from chaos.replicas import Replicas  # noqa: E402

# Work the default gateway's dispatchers could still claim (earlier tests' unfinished work under
# these provider names is retired by the gateway factory when they end).
IDLE_SQL = ("SELECT count(*) FROM operations WHERE state IN ('prepared', 'sending') "
            "AND provider IN ('mock-images', 'mock-keyed')")


wait_until = harness.wait_until


def batch_counters(gw):
    text = gw.http.request("GET", "/metrics").body.decode()
    def value(pattern):
        m = re.search(pattern + r" (\d+)", text)
        assert m, pattern
        return int(m.group(1))
    return (value(r'idemgate_intake_batches_total\{result="committed"\}'),
            value(r'idemgate_intake_batches_total\{result="split"\}'),
            value(r"idemgate_intake_batched_intents_total"))


def test_a_burst_shares_commits_and_each_key_gets_one_job(gateway_factory, database_url, psql):
    """48 clients at once on one writer: 16 keys, each sent twice with one body and once with
    another. Per key: one row; every 202 names that row; every other request is the 422 of a
    different fingerprint. Some commit carried more than one intent."""
    gw = gateway_factory(intake_writers=1, dispatch_workers=0)
    tok = tenant_token(database_url)
    pfx = "gc-" + uuid.uuid4().hex[:8]

    def one(i):
        k, variant = divmod(i, 3)
        body = {"prompt": f"lighthouse {k}", "n": 1, "seed": 1 if variant < 2 else 2}
        r = gw.submit(tok, f"{pfx}-{k}", body)
        return k, 1 if variant < 2 else 2, r.status, r.json().get("id")

    answers = fan_out(48, one)
    assert all(a is not None for a in answers)
    rows = dict((key, jid) for key, jid in psql(
        f"SELECT idempotency_key, id FROM operations WHERE idempotency_key LIKE '{pfx}-%'"))
    assert len(rows) == 16
    for k in range(16):
        mine = [a for a in answers if a[0] == k]
        ok = [a for a in mine if a[2] == 202]
        assert ok and all(a[3] == rows[f"{pfx}-{k}"] for a in ok), mine
        assert len({a[1] for a in ok}) == 1, mine  # one fingerprint won
        assert all(a[2] == 422 for a in mine if a[1] != ok[0][1]), mine
    committed, split, intents = batch_counters(gw)
    assert split == 0
    assert intents == 48 and committed < intents, (committed, intents)


def test_one_bad_row_never_fails_its_neighbours(gateway_factory, database_url, psql):
    """A row the database refuses (here: a trigger made to fail for one key) aborts its batch's
    transaction; every other row of the batch is then decided on its own and recorded."""
    pfx = "gcbad-" + uuid.uuid4().hex[:8]
    poison = f"{pfx}-poison"
    fn = "gc_poison_" + uuid.uuid4().hex[:8]
    psql(f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         f"IF NEW.idempotency_key = '{poison}' THEN RAISE EXCEPTION 'refused for the test'; END IF; "
         "RETURN NEW; END $$")
    psql(f"CREATE TRIGGER {fn} BEFORE INSERT ON operations FOR EACH ROW EXECUTE FUNCTION {fn}()")
    try:
        gw = gateway_factory(intake_writers=1, dispatch_workers=0)
        tok = tenant_token(database_url)
        keys = [poison if i % 8 == 0 else f"{pfx}-{i}" for i in range(32)]
        answers = fan_out(32, lambda i: gw.submit(tok, keys[i], {"prompt": f"p{i}"}).status)
    finally:
        psql(f"DROP TRIGGER {fn} ON operations")
        psql(f"DROP FUNCTION {fn}()")
    for key, status in zip(keys, answers):
        assert status == (500 if key == poison else 202), (key, status)
    n = psql(f"SELECT count(*) FROM operations WHERE idempotency_key LIKE '{pfx}-%'")[0][0]
    assert int(n) == 28
    committed, split, intents = batch_counters(gw)
    assert split >= 1 and intents == 32, (committed, split, intents)


def test_a_kill_between_a_batch_commit_and_its_answers_loses_nothing(gateway_factory, mock, psql,
                                                                       database_url):
    """SIGKILL right after a group commit returned, before any of its clients was answered: the
    clients retry with their keys (on the restarted replica) and get the jobs that commit
    recorded; the checker finds every intent acknowledged once, and no create paid twice."""
    entries = providers.all_three(mock.url, providers.tag())
    tokens = [tenant_token(database_url), tenant_token(database_url)]
    summaries = []
    for run, hit in enumerate((3, 17)):
        mock.http.request("POST", "/_reset")
        reps = Replicas(gateway_factory, free_port)
        v = reps.start("v", first_env={"IDEMGATE_CRASH": f"after_intent_commit:{hit}"},
                       providers=entries, lease_seconds=3, intake_writers=1)
        reps.supervise()
        pfx = harness.prefix(f"gc-kill{run}")
        its = harness.intents(pfx, tokens, entries, 40)
        outs = run_all(Client(lambda: [v.port], RetryPolicy(max_seconds=40)), its, concurrency=16)
        assert wait_until(lambda: v.crashes >= 1, 15), "the crash point never fired"
        s = harness.conclude("G1-kill-after-batch-commit", outs, psql, mock.url, pfx,
                             drain_timeout=30, emit=False)
        reps.stop_supervising()
        codes = reps.stop_all()
        assert all(c == 0 for c in codes.values()), codes
        summaries.append(s)
        # Requests of the killed batch were cut off and retried: their retry is a replay of the
        # row the batch committed, never a second row.
        cut = [o for o in outs if any(a.error for a in o.attempts)]
        assert cut, "no request was in flight at the kill"
        for o in cut:
            assert o.result == "ok" and o.job_id, o.attempts
    s = harness.merge("G1-kill-after-batch-commit", summaries)
    harness.emit(s)
    harness.assert_clean(s)


def test_a_writer_held_up_by_a_lock_holds_up_no_other_intent(gateway_factory, database_url,
                                                              psql):
    """Group commit (gcommit.h): while one writer records, what arrives waits for its next commit
    — unless it is held up. Here a session of the test has inserted, and not committed, a row
    with key K: the writer whose batch holds K's intent waits on it. An intent for another key,
    sent meanwhile, is recorded by the second writer (the oldest intent behind a busy writer is
    taken after GC_STALL_MS) and answered while the lock is still held; K's is recorded once the
    session rolls back."""
    import hashlib
    import subprocess
    import threading
    gw = gateway_factory(intake_writers=2, dispatch_workers=0)
    tok = tenant_token(database_url)
    digest = hashlib.sha256(tok.encode()).hexdigest()
    tenant = psql(f"SELECT id FROM tenants WHERE token_sha256 = '{digest}'")
    assert len(tenant) == 1, tenant
    pfx = "gcheld-" + uuid.uuid4().hex[:8]
    held_key = f"{pfx}-held"
    holder = subprocess.Popen(["psql", database_url, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    answers = {}
    try:
        holder.stdin.write(
            "BEGIN;\nINSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
            "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
            f"state, expires_at) VALUES ({tenant[0][0]}, 'job_{pfx}', '{held_key}', '\\x00', 1, "
            "'mock-images', 'images/generations', 'POST', '/', '', '', 'prepared', "
            "now() + interval '1 day');\n\\echo inserted\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "inserted"
        t = threading.Thread(target=lambda: answers.__setitem__(
            "held", gw.submit(tok, held_key, {"prompt": "behind the lock"}, timeout=60)))
        t.start()
        assert wait_until(lambda: psql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%INSERT INTO operations%'") != [["0"]], 20), "no writer waited"
        other = gw.submit(tok, f"{pfx}-free", {"prompt": "beside the lock"}, timeout=20)
        still_held = holder.poll() is None and "held" not in answers
    finally:
        if holder.poll() is None:
            holder.stdin.write("ROLLBACK;\n\\q\n")
            holder.stdin.close()
            holder.wait(15)
    assert other.status == 202, other
    assert still_held, "the held intent was answered before the lock ended"
    t.join(60)
    assert answers["held"].status == 202, answers["held"]
    rows = psql(f"SELECT idempotency_key FROM operations WHERE idempotency_key LIKE '{pfx}-%' "
                "ORDER BY 1")
    assert rows == [[f"{pfx}-free"], [held_key]], rows


def test_a_new_intent_with_an_idle_dispatcher_is_sent_without_a_claim_query(
        gateway_factory, mock, database_url, psql):
    """With a dispatch worker idle, the intent is recorded born reserved for this replica
    (`prepared`, its lease, fencing token 1, due only when the reservation ends) in the commit
    that records it; the worker moves it to `sending` with one conditional statement right before
    the send — no claim query, and the ambiguous window is the send itself. Without a dispatcher
    on the replica the row is `prepared` for any replica, as before."""
    tok = tenant_token(database_url)
    gw = gateway_factory(dispatch_workers=2, instance_id="born-" + uuid.uuid4().hex[:6])
    # The workers must be idle first.
    assert wait_until(lambda: psql(IDLE_SQL) == [["0"]], 60)
    time.sleep(0.2)  # they have gone back to waiting
    key = "born-" + uuid.uuid4().hex[:8]
    r = gw.submit(tok, key, {"prompt": "born claimed", "n": 1}, headers={"Prefer": "wait=10"})
    assert r.status == 200, r
    row = psql("SELECT state, lease_version, transport_attempts, first_sent_at >= created_at "
               f"FROM operations WHERE idempotency_key = '{key}'")
    assert row == [["completed", "1", "1", "t"]], row
    attempts = psql("SELECT a.kind, a.lease_version, a.decision FROM attempts a JOIN operations o "
                    "ON o.id = a.operation_id WHERE o.idempotency_key = '" + key + "'")
    assert attempts == [["create", "1", "completed"]], attempts
    job = psql(f"SELECT id FROM operations WHERE idempotency_key = '{key}'")[0][0]
    assert len(mock.creates_for(job)) == 1  # the provider saw exactly one create
    text = gw.http.request("GET", "/metrics").body.decode()
    assert re.search(r"^idemgate_intake_born_claimed_total 1$", text, re.M), text[-600:]

    idle = gateway_factory(dispatch_workers=0)
    key2 = "born-" + uuid.uuid4().hex[:8]
    r2 = idle.submit(tok, key2, {"prompt": "for any replica", "n": 1})
    assert r2.status == 202 and r2.json()["state"] in ("prepared", "sending", "completed"), r2
    row2 = psql("SELECT first_sent_at IS NULL OR first_sent_at > created_at "
                f"FROM operations WHERE idempotency_key = '{key2}'")
    assert row2 == [["t"]], row2


def test_a_tripped_credential_is_never_born_claimed(gateway_factory, mock, database_url, psql):
    """A provider whose credential is tripped gets no row born claimed, even with every
    dispatcher idle: the intent is recorded `prepared`, nothing is sent, and it goes out once
    the breaker is reset — exactly once."""
    tok = tenant_token(database_url)
    gw = gateway_factory(dispatch_workers=2)
    assert wait_until(lambda: psql(IDLE_SQL) == [["0"]], 60)
    time.sleep(0.2)
    psql("INSERT INTO provider_breakers (provider, http_status, reason) "
         "VALUES ('mock-images', 401, 'tripped for the test')")
    try:
        r = gw.submit(tok, "trip-" + uuid.uuid4().hex[:8], {"prompt": "not yet", "n": 1})
        assert r.status == 202 and r.json()["state"] == "prepared", r
        job = r.json()["id"]
        time.sleep(0.5)  # an idle dispatcher had every chance to send it
        assert psql(f"SELECT state FROM operations WHERE id = '{job}'") == [["prepared"]]
        assert mock.creates_for(job) == []
    finally:
        psql("DELETE FROM provider_breakers WHERE provider = 'mock-images'")
    assert wait_until(lambda: psql(f"SELECT state FROM operations WHERE id = '{job}'")
                      == [["completed"]], 20)
    assert len(mock.creates_for(job)) == 1


def test_an_intent_without_room_is_cancelled_before_it_is_sent(gateway_factory, mock,
                                                               database_url, psql):
    """With no room for its call (max_inflight_calls reached), a new intent is recorded
    `prepared` for any replica — not reserved — and waits unclaimed; a cancel acknowledged while
    it waits means it is never sent (invariant 8). One slot, taken by a slow create; the second
    intent is recorded, then cancelled: it ends failed and the provider never sees it."""
    tok = tenant_token(database_url)
    gw = gateway_factory(dispatch_workers=1, max_inflight_calls=1,
                         instance_id="queued-" + uuid.uuid4().hex[:6])
    busy, job = _busy_then_waiting(gw, tok, psql, {"prompt": "takes the one slot",
                                                   "_mock": {"delay_ms": 3000}})
    c = gw.http.request("POST", f"/v1/jobs/{job}/cancel", "", {"Authorization": f"Bearer {tok}"})
    # Nothing was sent: the cancel ends it at once, and nobody ever sends it.
    assert c.status in (200, 202) and c.json()["state"] == "failed", c
    done = gw.wait_state(tok, job, ("completed", "failed"), 30)
    assert done["state"] == "failed", done
    assert gw.wait_state(tok, busy, ("completed",), 30)["state"] == "completed"
    assert mock.creates_for(job) == [], "a create after an acknowledged cancel"


def _busy_then_waiting(gw, tok, psql, busy_body):
    """The gateway's one call slot taken by a slow create; a second intent recorded `prepared`
    for any replica (fencing token 0: no room, so not reserved) and not sent. Returns (busy job
    id, waiting job id)."""
    assert wait_until(lambda: psql(IDLE_SQL) == [["0"]], 60)
    slow = gw.submit(tok, "busy-" + uuid.uuid4().hex[:8], busy_body)
    assert slow.status == 202, slow
    busy = slow.json()["id"]
    assert wait_until(lambda: psql(f"SELECT state FROM operations WHERE id = '{busy}'")
                      == [["sending"]], 20)
    r = gw.submit(tok, "queued-" + uuid.uuid4().hex[:8], {"prompt": "waits for room"})
    assert r.status == 202, r
    job = r.json()["id"]
    born = psql("SELECT state, lease_version, first_sent_at IS NULL FROM operations "
                f"WHERE id = '{job}'")
    assert born == [["prepared", "0", "t"]], born
    return busy, job


def test_item3_born_claim_never_sent_is_sent_by_another_replica_after_a_death(
        gateway_factory, mock, database_url, psql):
    """Issue 21 item 3. A born claim is handed to a dispatcher thread; the replica is killed
    (SIGKILL, crash point `before_begin_send`: before the statement that starts its send).
    Before: it was recorded `sending`, the reaper made it `unknown` and — reconcile `none` — it
    ended in `review` though the provider never saw it. After: it is still `prepared` (nothing
    left), and another replica sends it once its reservation ends: completed with exactly one
    create, never unknown or review."""
    tok = tenant_token(database_url)
    assert wait_until(lambda: psql(IDLE_SQL) == [["0"]], 60)
    gw = gateway_factory(dispatch_workers=1, instance_id="dies-" + uuid.uuid4().hex[:6],
                         env={"IDEMGATE_CRASH": "before_begin_send:1"})
    key = "dies-" + uuid.uuid4().hex[:8]
    try:  # the replica may die before its 202 leaves: the row is what counts
        gw.submit(tok, key, {"prompt": "born, never begun"})
    except OSError:
        pass
    gw.proc.wait(20)
    rows = psql(f"SELECT id FROM operations WHERE idempotency_key = '{key}'")
    assert len(rows) == 1, rows
    job = rows[0][0]
    assert "crash_point" in gw.log()
    row = psql(f"SELECT state, lease_version FROM operations WHERE id = '{job}'")
    assert row == [["prepared", "1"]], row  # born reserved, and never begun
    assert mock.creates_for(job) == []
    other = gateway_factory(dispatch_workers=2, instance_id="heir-" + uuid.uuid4().hex[:6])
    done = other.wait_state(tok, job, ("completed", "failed", "review"), 60)
    assert done["state"] == "completed", done
    assert len(mock.creates_for(job)) == 1
    states = psql("SELECT a.decision FROM attempts a WHERE a.operation_id = '" + job + "'")
    assert ["unknown"] not in states, states  # never ambiguous: it never left before its send


def test_item4_waiting_job_is_not_sent_after_its_credential_tripped(
        gateway_factory, mock, database_url, psql):
    """Issue 21 item 4, with the call engine. Job B waits for room while A's create is in
    flight; A answers 401 and trips the credential. B is not sent (claims skip a tripped provider;
    a born claim's begin_send checks the breaker too), stays `prepared`, and goes out exactly once
    after the reset."""
    tok = tenant_token(database_url)
    gw = gateway_factory(dispatch_workers=1, max_inflight_calls=1,
                         instance_id="trip-" + uuid.uuid4().hex[:6])
    try:
        a, b = _busy_then_waiting(gw, tok, psql, {"prompt": "refused",
                                                  "_mock": {"delay_ms": 1500, "status": 401}})
        assert gw.wait_state(tok, a, ("failed",), 30)["state"] == "failed"
        time.sleep(1.0)  # the dispatcher had every chance to send B
        assert mock.creates_for(b) == [], "sent after the credential was refused"
        assert psql(f"SELECT state FROM operations WHERE id = '{b}'") == [["prepared"]]
    finally:
        psql("DELETE FROM provider_breakers WHERE provider = 'mock-images'")
    assert gw.wait_state(tok, b, ("completed",), 30)["state"] == "completed"
    assert len(mock.creates_for(b)) == 1


def statement_sql(name, text="sql"):
    import json
    import subprocess
    from conftest import GATEWAY_BIN
    out = subprocess.check_output([GATEWAY_BIN, "statements"], text=True)
    for line in out.splitlines():
        s = json.loads(line)
        if s["name"] == name:
            return s[text]
    raise AssertionError(f"no statement {name}")


def execute(psql, sql, args):
    """Runs sql (a statement's text) with args (its parameters as SQL literals, parenthesised)."""
    name = "p" + uuid.uuid4().hex[:8]
    return psql(f"PREPARE {name} AS {sql}; EXECUTE {name}{args}")


# An intake's row, column for column, where two runs of it may differ only in their clock.
INTAKE_COMPARED = ("tenant_id, fingerprint, fingerprint_version, provider, route, req_method, "
                   "req_url, req_credential, req_body, state, req_idem_header, reconcile_strategy, "
                   "outputs_requested, profile_id, lease_owner, lease_version, reserved_micros, "
                   "currency, budgeted, unpriced, transport_attempts, generation_attempts, "
                   "cost_micros, expires_at - created_at, updated_at = created_at, "
                   "lease_expires_at IS NULL, next_attempt_at > created_at + interval '30 seconds'")


def test_the_plain_intake_writes_what_the_function_writes_or_nothing(database_url, psql):
    """The group commit's intake (intake_plain, one INSERT) stands for idemgate_intake in its
    common case only: the same row, column for column, with and without a claim owner; and no
    row — the function then decides — for a tenant with a budget, a tripped breaker or a key
    taken."""
    tenant_name = "eq-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    prov = "eq-prov-" + uuid.uuid4().hex[:6]
    plain, function = statement_sql("intake_plain"), statement_sql("intake")

    def args(key, owner):
        return (f"({tid}, '{key}', 'job_{key}', '{'ab' * 32}', 1, '{prov}', 'images/generations', "
                f"'POST', 'http://127.0.0.1:1/v1/x', 'ENV_NAME', '\\x7b7d'::bytea, 24, NULL, 'none', 2, "
                f"'openai-images', {owner}, 60, 7, 'USD', false, now())")

    def run(sql, key, owner="NULL"):
        return execute(psql, sql, args(key, owner))

    def row(key):
        return psql(f"SELECT {INTAKE_COMPARED} FROM operations WHERE tenant_id = {tid} "
                    f"AND idempotency_key = '{key}'")

    for owner, answer in (("NULL", "1"), ("'replica-a'", "2")):
        k1, k2 = uuid.uuid4().hex, uuid.uuid4().hex
        assert run(plain, k1, owner) == [[answer]]
        assert run(function, k2, owner) == [[answer]]
        assert row(k1) == row(k2) and len(row(k1)) == 1
    # A key taken: no row from the plain insert (the function answers '0').
    k = uuid.uuid4().hex
    assert run(plain, k) == [["1"]]
    assert run(plain, k) == []
    assert run(function, k) == [["0"]]
    # A tripped breaker: the function's answer names it; the plain insert writes nothing.
    psql(f"INSERT INTO provider_breakers (provider, reason) VALUES ('{prov}', 'test trip')")
    k = uuid.uuid4().hex
    assert run(plain, k) == [] and row(k) == []
    assert run(function, k) == [["1:test trip"]]
    psql(f"DELETE FROM provider_breakers WHERE provider = '{prov}'")
    # A tenant with a budget: only the function reserves against it.
    psql(f"INSERT INTO tenant_budgets (tenant_id, currency, day, month) "
         f"VALUES ({tid}, 'USD', current_date, date_trunc('month', current_date))")
    k = uuid.uuid4().hex
    assert run(plain, k) == [] and row(k) == []
    assert run(function, k) == [["1"]]
    assert psql(f"SELECT inflight, day_micros FROM tenant_budgets WHERE tenant_id = {tid}") == \
        [["1", "7"]]


def rows_args(rows):
    """The parameters of a statement over a batch (db_run_rows): rows is a list of tuples of SQL
    literals, one tuple a row; each parameter becomes the array of that column, text[] — or
    bytea[] for a bytea literal."""
    cols = []
    for values in zip(*rows):
        kind = "bytea[]" if any("::bytea" in v for v in values) else "text[]"
        cols.append("ARRAY[" + ", ".join(v if "::bytea" in v or v == "NULL" else f"{v}::text"
                                          for v in values) + f"]::{kind}")
    return "(" + ", ".join(cols) + ")"


def test_the_rows_intake_writes_what_the_plain_intake_writes(database_url, psql):
    """A batch of intents is one statement (intake_rows, each parameter an array of the rows'
    values): each row it writes is intake_plain's row, column for column, and answers its place
    in the batch with intake_plain's answer; a key taken earlier in the same batch, a tripped
    breaker, a tenant with a budget: no answer for that row (it is then decided alone), and the
    rows around it are written all the same."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("on Citus a batch is intake_plain's rows (the function), one by one")
    tenant_name = "rows-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    other = "rows-b-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, other)
    bid = psql(f"SELECT id FROM tenants WHERE name = '{other}'")[0][0]
    psql(f"INSERT INTO tenant_budgets (tenant_id, currency, day, month) "
         f"VALUES ({bid}, 'USD', current_date, date_trunc('month', current_date))")
    prov, tripped = "rows-prov-" + uuid.uuid4().hex[:6], "rows-trip-" + uuid.uuid4().hex[:6]
    psql(f"INSERT INTO provider_breakers (provider, reason) VALUES ('{tripped}', 'test trip')")
    plain, rows_sql = statement_sql("intake_plain"), statement_sql("intake_rows")

    def values(t, key, owner, provider=prov, body="'\\x7b00ff7d'::bytea"):
        return (f"'{t}'", f"'{key}'", f"'job_{key}'", f"'{'ab' * 32}'", "'1'", f"'{provider}'",
                "'images/generations'", "'POST'", "'http://127.0.0.1:1/v1/x'", "'ENV_NAME'", body,
                "'24'", "NULL", "'none'", "'2'", "'openai-images'", owner, "'60'", "'7'", "'USD'",
                "'f'", "now()")

    def run(sql, args):
        return execute(psql, sql, args)

    def row(key):
        return psql(f"SELECT {INTAKE_COMPARED} FROM operations WHERE idempotency_key = '{key}'")

    k = [uuid.uuid4().hex for _ in range(5)]
    batch = [values(tid, k[0], "NULL"), values(tid, k[1], "'replica-a'"),
             values(tid, k[0], "'replica-a'"),            # taken by row 1 of this batch
             values(tid, k[2], "NULL", provider=tripped),  # breaker tripped
             values(bid, k[3], "NULL"),                    # a tenant with a budget
             values(tid, k[4], "'replica-b'", body="'\\x'::bytea")]
    assert sorted(run(rows_sql, rows_args(batch))) == [["1", "1"], ["2", "2"], ["6", "2"]]
    assert row(k[2]) == [] and row(k[3]) == []
    for key, args in ((k[0], batch[0]), (k[1], batch[1]), (k[4], batch[5])):
        twin = uuid.uuid4().hex
        plain_args = [a.replace(key, twin) for a in args]
        assert run(plain, "(" + ", ".join(plain_args) + ")") == [["2" if "replica" in args[16]
                                                                  else "1"]]
        assert len(row(key)) == 1 and row(key) == row(twin)
    psql(f"DELETE FROM provider_breakers WHERE provider = '{tripped}'")


def test_a_webhook_begun_before_a_poll_claim_still_makes_the_poll_due_again(database_url, psql):
    """A signed webhook's hint makes a poll in flight due again: the poll's result sees
    next_attempt_at at or after the claim's instant (FINISH_DUE_AGAIN) and keeps the job
    `accepted` for a read at once — never `review` at its deadline over a task the webhook says
    ended. The webhook's statement may begin before the claim and write after it (its insert of
    the event waited on the same event's other delivery): before, it wrote its own older instant,
    read as no hint, and a poll past its deadline sent the job to review."""
    import subprocess
    tenant_name = "hint-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    tag = uuid.uuid4().hex[:8]
    prov, job, task = f"hint-{tag}", f"hint_{tag}", f"task_{tag}"
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         "state, expires_at, remote_id, next_attempt_at, poll_deadline_at) VALUES "
         f"({tid}, '{job}', '{job}', '\\x00', 1, '{prov}', 'r', 'POST', 'http://x', '', "
         "'\\x00', 'accepted', now() + interval '1 day', "
         f"'{task}', now() - interval '1 second', now() + interval '1 hour')")
    hook = statement_sql("webhook_signed")
    w = subprocess.Popen(["psql", database_url, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        w.stdin.write("BEGIN; SELECT 'begun';\n")  # the webhook's transaction: its now() fixed
        w.stdin.flush()
        assert w.stdout.readline().strip() == "begun"
        time.sleep(0.05)
        got = execute(psql, statement_sql("poll_claim"), f"('poller', 60, '{{{prov}}}', {tid})")
        assert len(got) == 1 and got[0][1] == job, got
        out, _ = w.communicate(
            f"PREPARE w AS {hook};\n"
            f"EXECUTE w('{prov}', 'evt-{tag}', '{task}', 24, NULL, '{{{tid}}}', true);\n"
            "COMMIT;\n", timeout=30)
        assert w.returncode == 0, out
        assert out.split()[0].startswith("t|1|"), out  # recorded, one row hinted
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    assert psql(f"SELECT next_attempt_at >= updated_at, lease_owner FROM operations "
                f"WHERE tenant_id = {tid} AND id = '{job}'") == [["t", "poller"]]


def test_a_lost_claims_give_back_moves_only_its_own_unsent_row(database_url, psql):
    """claim_lost (lease.c) writes back to `prepared` the row a claim whose answer was lost moved,
    as it was: unowned, due now, its transport attempt and first send uncounted (a first send of
    an earlier attempt kept). A row whose cancel was acknowledged meanwhile is cancelled as a job
    never sent: `failed` at cost 0 — or `unknown` when an earlier attempt may have made its task
    (before, both were left to their lease, then the reaper's `unknown` and, with no lookup, an
    operator's review of a job never sent). It leaves alone a row claimed under another name and
    a row a signed webhook hinted meanwhile (a task of the job exists: the reaper and the
    reconciler decide)."""
    tenant_name = "lost-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    claim, lost = statement_sql("claim"), statement_sql("claim_lost")
    tag = uuid.uuid4().hex[:6]
    kinds = ("plain", "earlier", "other", "hinted", "cancelled", "cancelled_ambiguous")
    ids = {k: f"lost_{k}_{tag}" for k in kinds}
    cols = ("tenant_id, id, idempotency_key, fingerprint, fingerprint_version, provider, route, "
            "req_method, req_url, req_credential, req_body, state, expires_at, first_sent_at, "
            "transport_attempts")
    psql(f"INSERT INTO operations ({cols}) VALUES " + ", ".join(
        f"({tid}, '{i}', '{i}', '\\x00', 1, 'lost-{k}-{tag}', 'r', 'POST', 'http://x', '', "
        f"'\\x00', 'prepared', now() + interval '1 day', "
        f"{'now() - interval ' + repr('1 hour') if k == 'earlier' else 'NULL'}, "
        f"{1 if k == 'earlier' else 0})" for k, i in ids.items()))
    compared = ("state, lease_owner IS NULL, transport_attempts, first_sent_at IS NULL, "
                "next_attempt_at <= now(), lease_expires_at IS NULL")

    def row(k):
        return psql(f"SELECT {compared} FROM operations WHERE tenant_id = {tid} "
                    f"AND id = '{ids[k]}'")[0]

    before = {k: row(k) for k in kinds}
    for k in kinds:  # each claimed by a claim of its own name
        got = execute(psql, claim, f"('r~{k}', 60, '{{lost-{k}-{tag}}}', {tid}, '{{}}')")
        assert len(got) == 1 and got[0][1] == ids[k], got
    psql(f"UPDATE operations SET webhook_hint = 'task_1' WHERE id = '{ids['hinted']}'")
    psql(f"UPDATE operations SET ambiguous_at = now() WHERE id = '{ids['cancelled_ambiguous']}'")
    for k in ("cancelled", "cancelled_ambiguous"):  # acknowledged while `sending`
        assert psql(f"SELECT idemgate_cancel({tid}, '{ids[k]}')") == [["1"]]
    claimed = {k: row(k) for k in kinds}
    assert all(claimed[k][0] == "sending" for k in kinds), claimed
    answers = {}
    for k in ("plain", "earlier", "hinted", "cancelled", "cancelled_ambiguous"):
        answers[k] = execute(psql, lost, f"({tid}, 'r~{k}')")
    assert execute(psql, lost, f"({tid}, 'r~nobody')") == []  # "other" was claimed as r~other
    assert answers["plain"] == [[ids["plain"], "prepared"]], answers
    assert answers["cancelled"] == [[ids["cancelled"], "failed"]], answers
    assert answers["cancelled_ambiguous"] == [[ids["cancelled_ambiguous"], "unknown"]], answers
    assert answers["hinted"] == [], answers
    assert row("plain") == before["plain"] == ["prepared", "t", "0", "t", "t", "t"]
    assert row("earlier") == before["earlier"] == ["prepared", "t", "1", "f", "t", "t"]
    for k in ("other", "hinted"):
        assert row(k) == claimed[k], (k, row(k))
    ended = psql(f"SELECT state, lease_owner IS NULL, cost_micros, finished_at IS NOT NULL, "
                 f"last_error, first_sent_at IS NULL, transport_attempts FROM operations "
                 f"WHERE tenant_id = {tid} AND id = '{ids['cancelled']}'")
    assert ended == [["failed", "t", "0", "t", "canceled before it was sent", "t", "0"]], ended
    ambiguous = psql(f"SELECT state, lease_owner IS NULL, finished_at IS NULL FROM operations "
                     f"WHERE tenant_id = {tid} AND id = '{ids['cancelled_ambiguous']}'")
    assert ambiguous == [["unknown", "t", "t"]], ambiguous


def test_the_rows_begin_send_writes_what_begin_send_writes(database_url, psql):
    """The sends of a batch of born reservations are begun by one statement (begin_send_rows):
    each row it moves is begin_send's row, column for column, and answers its place in the batch
    with begin_send's answer; a reservation taken by another version, a cancelled one and a
    tripped credential's are left as they are and answer nothing."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("on Citus a batch is begin_send's rows, one by one")
    tenant_name = "rbs-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    prov, tripped = "rbs-prov-" + uuid.uuid4().hex[:6], "rbs-trip-" + uuid.uuid4().hex[:6]
    psql(f"INSERT INTO provider_breakers (provider, reason) VALUES ('{tripped}', 'test trip')")
    one, rows_sql = statement_sql("begin_send"), statement_sql("begin_send_rows")
    ids = ["rbs_" + uuid.uuid4().hex for _ in range(6)]
    cols = ("tenant_id, id, idempotency_key, fingerprint, fingerprint_version, provider, route, "
            "req_method, req_url, req_credential, req_body, state, expires_at, lease_owner, "
            "lease_version, lease_expires_at, next_attempt_at, cancel_requested_at")
    psql(f"INSERT INTO operations ({cols}) VALUES " + ", ".join(
        f"({tid}, '{i}', '{i}', '\\x00', 1, '{tripped if n == 5 else prov}', 'r', 'POST', "
        f"'http://x', '', '\\x00', 'prepared', now() + interval '1 day', 'replica-a', 1, "
        f"now() + interval '1 minute', now() + interval '1 minute', "
        f"{'now()' if n == 4 else 'NULL'})" for n, i in enumerate(ids)))

    def run(sql, args):
        return execute(psql, sql, args)

    compared = ("state, lease_owner, lease_version, transport_attempts, first_sent_at = updated_at, "
                "lease_expires_at - updated_at, cancel_requested_at IS NULL")

    def row(i):
        return psql(f"SELECT {compared} FROM operations WHERE tenant_id = {tid} AND id = '{i}'")

    before = {i: row(i) for i in ids}
    answer = run(one, f"({tid}, '{ids[0]}', 1, 60)")
    assert len(answer) == 1 and answer[0][1] == "1"
    batch = [(f"'{tid}'", f"'{ids[1]}'", "'1'", "'60'"),
             (f"'{tid}'", f"'{ids[2]}'", "'2'", "'60'"),  # another version holds it
             (f"'{tid}'", f"'{ids[3]}'", "'1'", "'60'"),
             (f"'{tid}'", f"'{ids[4]}'", "'1'", "'60'"),  # cancelled
             (f"'{tid}'", f"'{ids[5]}'", "'1'", "'60'")]  # its credential tripped
    answers = run(rows_sql, rows_args(batch))
    assert sorted(a[0] for a in answers) == ["1", "3"]
    assert all(len(a) == 5 and a[2] == "1" for a in answers)
    assert row(ids[1]) == row(ids[0]) == row(ids[3])
    assert row(ids[0])[0][0] == "sending"
    for i in (ids[2], ids[4], ids[5]):
        assert row(i) == before[i]
    psql(f"DELETE FROM provider_breakers WHERE provider = '{tripped}'")


@pytest.mark.parametrize("verdict", ["prepared", "unknown"], ids=["absent", "not_yet"])
def test_a_verdict_written_again_after_a_lost_answer_never_erases_a_webhooks_rescue(
        database_url, psql, verdict):
    """A reconciler's verdict commits (`absent`: prepared, to be sent again; `not_yet`: unknown),
    its answer is lost with the connection; a signed webhook naming the job's task is rescued
    onto the row; finish_run then writes the verdict again on a new connection. Before, the
    second write matched again (same token, the state it came from) and wrote `prepared` over the
    rescue, clearing the hint: the dispatcher sent the create a second time (or a later lookup,
    behind the provider's events, proved it absent). Now the rescue moves the token on: the
    second write is fenced, the row keeps the hint, `unknown`."""
    tenant_name = "rerun-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    op_id = "job_rerun" + uuid.uuid4().hex[:12]
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         "state, expires_at, lease_owner, lease_version, lease_expires_at, next_attempt_at, "
         "first_sent_at, ambiguous_at) VALUES "
         f"({tid}, '{op_id}', '{op_id}', '\\x00', 1, 'rerun-prov', 'r', 'POST', 'http://x', '', "
         "'\\x00', 'unknown', now() + interval '1 day', 'replica-a', 3, "
         "now() + interval '1 minute', now(), now() - interval '1 minute', "
         "now() - interval '1 minute')")
    finish = statement_sql("finish")
    # The verdict: kind reconcile, from unknown, under token 3 (FINISH_PARAMS' order).
    fargs = (f"({tid}, '{op_id}', 3, '{verdict}', NULL, NULL, NULL, NULL, NULL, 1700000000.5, "
             "1700000001.25, 'absent', 0, 0, 0, 'unknown', 'reconcile', NULL, NULL, NULL, NULL, "
             "NULL, NULL, NULL, false, NULL, NULL)")
    assert execute(psql, finish, fargs)[0][0] == f"{verdict} {verdict}"
    hook = statement_sql("webhook_signed")
    hargs = (f"('rerun-prov', 'ev-{op_id}', 'task-{op_id}', 24, '{op_id}', '{{{tid}}}', false)")
    assert execute(psql, hook, hargs)[0][:2] == ["t", "1"]
    # The same verdict, written again on a new connection (finish_run after a lost answer).
    assert execute(psql, finish, fargs)[0][0] == "fenced "
    assert psql(f"SELECT state, webhook_hint, lease_owner IS NULL FROM operations "
                f"WHERE tenant_id = {tid} AND id = '{op_id}'") == \
        [["unknown", f"task-{op_id}", "t"]]


def test_the_plain_finish_writes_what_the_function_writes(database_url, psql):
    """On PostgreSQL a result is written by one statement (finish's CTEs); on Citus by
    idemgate_finish. Two rows alike, one written by each with the same values: the same row
    after, column for column, the same attempt row, archive rows and budget settle, the same
    answer — for every kind of finish (a create's result, with and without a budget; a cancel
    met on the way back to prepared, with and without a possible task; a fenced write; a poll
    that keeps a webhook's earlier hint; a reconcile that clears it; an ambiguous create). A
    batch of results (finish_rows, one statement over arrays) writes each row the same, in one
    statement for all the cases, and leaves alone — no answer, no attempt row, no settle — the
    budgeted and the fenced ones, which `finish` then writes."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("on Citus both texts are the function")
    tenant_name = "fin-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, tenant_name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{tenant_name}'")[0][0]
    plain, function = statement_sql("finish"), statement_sql("finish", "sql_distributed")
    assert plain != function and "idemgate_finish" in function
    psql(f"INSERT INTO tenant_budgets (tenant_id, currency, day, month, day_micros, month_micros, "
         f"inflight) VALUES ({tid}, 'USD', (now() AT TIME ZONE 'UTC')::date, "
         f"date_trunc('month', now() AT TIME ZONE 'UTC')::date, 1000, 1000, 50)")

    def make(tag, state, extra="", sides=("p", "f"), insert=True):
        """Operations alike (p_tag and f_tag; r_tag for the batch), leased under version 3.
        Each side is made right before its write: a value kept from the insert (a hint's
        next_attempt_at) is compared relative to the write's instant, and a batch made with the
        first rows was written tens of seconds after them on a slow machine (its bucket of
        10 s then differed from theirs). insert=False: the rows' VALUES, inserted by the
        caller (the batch's, all in one statement right before it)."""
        cols = ("tenant_id, id, idempotency_key, fingerprint, fingerprint_version, provider, "
                "route, req_method, req_url, req_credential, req_body, state, expires_at, "
                "lease_owner, lease_version, lease_expires_at, next_attempt_at, updated_at, "
                "currency, reserved_micros, budgeted, cancel_requested_at, ambiguous_at, "
                "webhook_hint")
        base = {"currency": "'USD'", "reserved_micros": "7", "budgeted": "false",
                "cancel_requested_at": "NULL", "ambiguous_at": "NULL", "webhook_hint": "NULL",
                "next_attempt_at": "now()", "updated_at": "now()"}
        for kv in filter(None, extra.split(";")):
            k, v = kv.split("=", 1)
            base[k.strip()] = v.strip()
        rows = []
        for side in sides:
            rows.append(f"({tid}, '{side}_{tag}', '{side}_{tag}', '\\x00', 1, 'fin-prov', 'r', "
                        f"'POST', 'http://x', '', '\\x00', '{state}', now() + interval '1 day', "
                        f"'replica-a', 3, now() + interval '1 minute', {base['next_attempt_at']}, "
                        f"{base['updated_at']}, {base['currency']}, {base['reserved_micros']}, "
                        f"{base['budgeted']}, {base['cancel_requested_at']}, "
                        f"{base['ambiguous_at']}, {base['webhook_hint']})")
        if not insert:
            return cols, rows
        psql(f"INSERT INTO operations ({cols}) VALUES " + ", ".join(rows))

    def args(op_id, a):
        return "(" + ", ".join(values(op_id, a)) + ")"

    def values(op_id, a):
        v = dict(lease="3", state="'completed'", status="200",
                 headers="'{\"content-type\": \"application/json\"}'", body="'\\x7b7d'::bytea",
                 error="NULL", remote="NULL", retry_ms="0", frm="'sending'", kind="'create'",
                 received="1", requested="1", usage="NULL", poll_url="NULL", deadline="NULL",
                 pstatus="NULL", outputs="NULL", ambiguous="false", cost="NULL", plan="NULL",
                 outcome="'ok'")
        v.update(a)
        return [str(tid), f"'{op_id}'", v["lease"], v["state"], v["status"], v["headers"],
                v["body"], v["error"], v["remote"], "1700000000.5", "1700000001.25", v["outcome"],
                "0",
                "42", v["retry_ms"], v["frm"], v["kind"], v["received"], v["requested"],
                v["usage"], v["poll_url"], v["deadline"], v["pstatus"], v["outputs"],
                v["ambiguous"], v["cost"], v["plan"]]

    def run(sql, op_id, a):
        name = "p" + uuid.uuid4().hex[:8]
        return psql(f"PREPARE {name} AS {sql}; EXECUTE {name}{args(op_id, a)}")

    def rel(col):
        return (f"{col} IS NULL, round(extract(epoch FROM {col} - updated_at) / 10)")
    compared = ", ".join([
        "state, resp_status, resp_headers, encode(resp_body, 'hex'), last_error, remote_id, "
        "lease_owner, lease_expires_at IS NULL, outputs_received, outputs_requested, usage, "
        "poll_url, provider_status, outputs, webhook_hint, cost_micros, reserved_micros, "
        "lease_version, updated_at > now() - interval '1 minute'",
        rel("next_attempt_at"), rel("poll_deadline_at"), rel("ambiguous_at"),
        rel("finished_at"), rel("archive_planned_at")])

    def row(op_id):
        return psql(f"SELECT {compared} FROM operations WHERE tenant_id = {tid} AND id = '{op_id}'")

    def attempts(op_id):
        return psql("SELECT lease_version, kind, started_at, finished_at, outcome, http_status, "
                    "curl_code, bytes_sent, decision, error FROM attempts "
                    f"WHERE tenant_id = {tid} AND operation_id = '{op_id}' ORDER BY seq")

    def archive(op_id):
        return psql("SELECT n, provider, kind, source_url, credential, expires_at, state, "
                    "last_error, attempts, lease_owner, lease_version "
                    f"FROM archive_outputs WHERE tenant_id = {tid} AND op_id = '{op_id}' "
                    "ORDER BY n")

    def budget():
        return [int(x) for x in psql("SELECT inflight, day_micros, month_micros FROM "
                                     f"tenant_budgets WHERE tenant_id = {tid}")[0]]

    plan = ("'[{\"n\": 0, \"kind\": \"url\", \"url\": \"https://cdn.example/a.png\", "
            "\"credential\": null, \"expires\": 1900000000}, {\"n\": 1, \"kind\": \"b64\", "
            "\"url\": null, \"credential\": null, \"expires\": 0}, {\"n\": 2, \"kind\": \"url\", "
            "\"url\": \"http://cdn.example/c.png\", \"expires\": 0, \"state\": \"failed\", "
            "\"error\": \"scheme http is not allowed for outputs\"}]'")
    cases = [
        # tag, state, row setup, finish's values
        ("done", "sending", "", {"outputs": "'[{\"url\": \"https://cdn.example/a.png\"}]'",
                                 "plan": plan, "cost": "12"}),
        ("budget_done", "sending", "budgeted=true", {"cost": "5"}),
        ("budget_reserved", "sending", "budgeted=true", {}),
        ("budget_failed", "sending", "budgeted=true",
         {"state": "'failed'", "status": "400", "error": "'bad request'"}),
        ("canceled", "sending", "cancel_requested_at=now()",
         {"state": "'prepared'", "status": "503", "retry_ms": "2000"}),
        ("canceled_maybe", "sending", "cancel_requested_at=now()",
         {"state": "'prepared'", "status": "NULL", "ambiguous": "true", "retry_ms": "2000"}),
        ("fenced", "sending", "", {"lease": "2"}),
        # A poll past its deadline that did not see the task end: review; unless a cancel, a
        # webhook or a resume made the row due again while it read — then accepted, its error
        # unchanged, due at once, for the poll that follows.
        ("poll_review", "accepted", "next_attempt_at=now() - interval '1 hour';"
                                    "updated_at=now() - interval '1 minute'",
         {"state": "'review'", "frm": "'accepted'", "kind": "'poll'", "pstatus": "'running'",
          "remote": "'task-2'", "error": "'the poll deadline passed'"}),
        ("poll_review_due", "accepted", "next_attempt_at=now() + interval '100 seconds';"
                                        "updated_at=now() - interval '1 hour'",
         {"state": "'review'", "frm": "'accepted'", "kind": "'poll'", "pstatus": "'running'",
          "remote": "'task-3'", "error": "'the poll deadline passed'"}),
        ("poll_hint", "accepted", "next_attempt_at=now() + interval '100 seconds';"
                                  "updated_at=now() - interval '1 hour';webhook_hint='done'",
         {"state": "'accepted'", "frm": "'accepted'", "kind": "'poll'", "retry_ms": "600000",
          "pstatus": "'running'", "remote": "'task-1'"}),
        ("reconcile", "unknown", "webhook_hint='done';ambiguous_at=now()",
         {"state": "'unknown'", "frm": "'unknown'", "kind": "'reconcile'", "retry_ms": "30000",
          "status": "NULL"}),
        # A verdict whose read of the hinted task failed: the hint is kept by the write itself
        # (migration 0034), not put back by a statement of its own.
        ("reconcile_unread", "unknown", "webhook_hint='done';ambiguous_at=now()",
         {"state": "'unknown'", "frm": "'unknown'", "kind": "'reconcile'", "retry_ms": "30000",
          "status": "NULL", "outcome": "'hint_unread'"}),
        ("ambiguous", "sending", "", {"state": "'unknown'", "status": "NULL", "retry_ms": "5000",
                                      "deadline": "3600000", "error": "'timeout'"}),
        # A signed webhook named the task while the create was in flight: due at once; and
        # never prepared (sent again) nor failed on the create's own answer (a task exists).
        ("hinted", "sending", "webhook_hint='task-9'",
         {"state": "'unknown'", "status": "NULL", "retry_ms": "60000", "error": "'timeout'"}),
        ("hinted_backoff", "sending", "webhook_hint='task-8'",
         {"state": "'prepared'", "status": "429", "retry_ms": "60000"}),
        ("hinted_refused", "sending", "webhook_hint='task-7'",
         {"state": "'failed'", "status": "400", "error": "'bad request'", "cost": "0"}),
    ]
    run_answer = {}
    for tag, state, setup, a in cases:
        make(tag, state, setup)
        b0 = budget()
        answer_plain = run(plain, f"p_{tag}", a)
        run_answer[tag] = answer_plain[0]
        b1 = budget()
        answer_function = run(function, f"f_{tag}", a)
        b2 = budget()
        # The plain statement answers one more column: the outputs it inserted claimed by the
        # writing replica (born claims, archive.h) — none here, the plans name no owner.
        assert [r[:1] for r in answer_plain] == answer_function and len(answer_plain) == 1, tag
        assert answer_plain[0][1:] == [""], tag
        assert row(f"p_{tag}") == row(f"f_{tag}") and len(row(f"p_{tag}")) == 1, tag
        assert attempts(f"p_{tag}") == attempts(f"f_{tag}") and attempts(f"p_{tag}"), tag
        assert archive(f"p_{tag}") == archive(f"f_{tag}"), tag
        assert [x - y for x, y in zip(b1, b0)] == [x - y for x, y in zip(b2, b1)], tag
    # An output the plan ended (refused by the archive policy: archive.c's plan_refused) is
    # inserted failed with its reason, unclaimed; the others pending.
    assert [r[6:8] + r[9:] for r in archive("p_done")] == [
        ["pending", "", "", "0"], ["pending", "", "", "0"],
        ["failed", "scheme http is not allowed for outputs", "", "0"]], archive("p_done")
    # One batch over the same cases (finish_rows): each row it writes is the plain statement's.
    made = [make(tag, state, setup, sides=("r",), insert=False) for tag, state, setup, _ in cases]
    psql(f"INSERT INTO operations ({made[0][0]}) VALUES "
         + ", ".join(r for _, rs in made for r in rs))
    before = {tag: row(f"r_{tag}") for tag, _, _, _ in cases}
    b0 = budget()
    answers = {a[0]: a[1:] for a in psql(
        f"PREPARE rows_{tid} AS {statement_sql('finish_rows')}; EXECUTE rows_{tid}"
        + rows_args([tuple(values(f"r_{tag}", a)) for tag, _, _, a in cases]))}
    assert budget() == b0
    left = {"budget_done", "budget_reserved", "budget_failed", "fenced"}
    for n, (tag, _, _, _) in enumerate(cases, 1):
        if tag in left:
            assert str(n) not in answers, tag
            assert row(f"r_{tag}") == before[tag] and attempts(f"r_{tag}") == [], tag
            assert archive(f"r_{tag}") == [], tag
            continue
        assert answers[str(n)] == run_answer[tag], tag
        assert row(f"r_{tag}") == row(f"p_{tag}"), tag
        assert attempts(f"r_{tag}") == attempts(f"p_{tag}"), tag
        assert archive(f"r_{tag}") == archive(f"p_{tag}"), tag
    assert len(answers) == len(cases) - len(left)
    # The cases wrote what each is for (a comparison of two writes that did nothing proves
    # nothing).
    assert row("p_fenced")[0][0] == "sending" and attempts("p_fenced")[0][8] == "fenced"
    # A reconcile verdict clears the hint, but one whose read of the hinted task failed keeps it.
    assert row("p_reconcile")[0][14] == "" and row("p_reconcile_unread")[0][14] == "done"
    assert len(archive("p_done")) == 3 and row("p_done")[0][15] == "12"
    assert row("p_canceled")[0][0] == "failed" and row("p_canceled_maybe")[0][0] == "unknown"
    assert row("p_hinted")[0][14] == "task-9" and row("p_hinted")[0][20] == "0", row("p_hinted")
    for tag in ("hinted_backoff", "hinted_refused"):
        r = row("p_" + tag)[0]
        # unknown, due now, ambiguous, not finished, nothing settled
        assert (r[0], r[20], r[23], r[25], r[15]) == ("unknown", "0", "f", "t", ""), (tag, r)
    assert row("p_ambiguous")[0][20] != "0", row("p_ambiguous")
    r = row("p_poll_review")[0]
    assert (r[0], r[4]) == ("review", "the poll deadline passed"), r
    r = row("p_poll_review_due")[0]
    assert (r[0], r[4], r[20]) == ("accepted", "", "0"), r
    # A result that comes back after its job was deleted (retention) is fenced and leaves no
    # attempt row behind: no foreign key refuses it since migration 0030, so both texts check.
    for sql, op_id in ((plain, "p_gone"), (function, "f_gone")):
        assert [r[:1] for r in run(sql, op_id, {})] == [["fenced "]], sql
        assert attempts(op_id) == [] and archive(op_id) == [], sql

    # Born claims (plain statement only): the URL output whose plan entry names an owner is
    # inserted under that owner's lease (fencing token 1, one attempt counted, the lease's length
    # from the plan) and named in the answer; the base64 one is left to a claim. The function
    # (Citus) inserts both unclaimed and names none: any replica's claim takes them. A fenced
    # write inserts nothing and names nothing.
    born_plan = ("'[{\"n\": 0, \"kind\": \"url\", \"url\": \"https://cdn.example/a.png\", "
                 "\"credential\": null, \"expires\": 1900000000, \"owner\": \"replica-b\", "
                 "\"lease\": 60}, {\"n\": 1, \"kind\": \"b64\", \"url\": null, "
                 "\"credential\": null, \"expires\": 0}]'")

    def leases(op_id):
        return psql("SELECT n, lease_owner, lease_version, attempts, "
                    "lease_expires_at BETWEEN now() + interval '50 seconds' "
                    "AND now() + interval '70 seconds', state "
                    f"FROM archive_outputs WHERE tenant_id = {tid} AND op_id = '{op_id}' "
                    "ORDER BY n")
    make("born", "sending")
    assert run(plain, "p_born", {"plan": born_plan}) == [["completed completed", "0"]]
    assert leases("p_born") == [["0", "replica-b", "1", "1", "t", "pending"],
                                ["1", "", "0", "0", "", "pending"]]
    assert run(function, "f_born", {"plan": born_plan}) == [["completed completed"]]
    assert leases("f_born") == [["0", "", "0", "0", "", "pending"],
                                ["1", "", "0", "0", "", "pending"]]
    make("born_fenced", "sending")
    assert run(plain, "p_born_fenced", {"plan": born_plan, "lease": "2"}) == [["fenced ", ""]]
    assert leases("p_born_fenced") == []
    assert row("p_poll_hint")[0][14] == "done" and row("p_reconcile")[0][14] == ""
    # Each side settled three budgeted rows: written cost 5 of 7 reserved (-2), the reservation
    # (0), failed (-7); one in flight fewer each.
    assert budget() == [50 - 2 * 3, 1000 - 2 * 9, 1000 - 2 * 9]
