"""Cost ledger, budgets and retention (issue 13 §2–4), against the counting mock.

Prices are the tests' own (the mock is ours); every expected figure is computed here from the
price table and what the mock's ledger says it received and delivered."""

import hashlib
import json
import os
import subprocess
import threading
import time
import uuid

import pytest

from conftest import (CITUS_URL, GATEWAY_BIN, ROOT, provider, settle_tombstones,
                      tenant_token)

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()

# Micro-units of USD per image by quality (size fixed), and per request on the keyed provider.
IMAGE_PRICES = {"low": 11000, "medium": 42000, "high": 167000}
IMAGES_PRICING = {
    "currency": "USD",
    "per_output": 40000,
    "per_output_by": {"keys": ["$.quality"], "defaults": ["medium"],
                      "prices": dict(IMAGE_PRICES)},
}
KEYED_PER_REQUEST = 250000
KEYED_PRICING = {"currency": "USD", "per_request": KEYED_PER_REQUEST}


def key():
    return "ledger-" + uuid.uuid4().hex


def priced_gateway(gateway_factory, mock, **settings):
    providers = [
        provider("mock-images", mock.url, pricing=IMAGES_PRICING,
                 auth={"header": "Authorization", "prefix": "Bearer ",
                       "secret_env": "MOCK_IMAGES_API_KEY"}),
        provider("mock-keyed", mock.url, path="/v2/generations", route="generations",
                 idempotency={"header": "Idempotency-Key"}, pricing=KEYED_PRICING),
    ]
    settings.setdefault("admin_token_sha256", ADMIN_SHA)
    return gateway_factory(providers=providers, **settings)


def cli(database_url, *args):
    return subprocess.run([GATEWAY_BIN, *args], capture_output=True, text=True,
                          env=dict(os.environ, DATABASE_URL=database_url))


def new_tenant(database_url):
    name = "led-" + uuid.uuid4().hex[:10]
    return name, tenant_token(database_url, name)


def usage(gw, token, **query):
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return gw.http.request("GET", "/v1/usage" + ("?" + q if q else ""),
                           headers={"Authorization": f"Bearer {token}"})


def wait_until(pred, timeout):
    """True as soon as pred() is; False once timeout seconds passed (a bound, not a threshold
    the test measures)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def image_cost(quality, delivered):
    return IMAGE_PRICES.get(quality, IMAGE_PRICES["medium"]) * delivered


def test_usage_sums_equal_the_priced_creates(gateway_factory, mock, database_url, psql):
    started = psql("SELECT now()")[0][0]
    gw = priced_gateway(gateway_factory, mock)
    tenants = [new_tenant(database_url) for _ in range(2)]
    plans = [  # (route, body)
        ("mock-images/images/generations", {"prompt": "a", "n": 2, "quality": "high"}),
        ("mock-images/images/generations", {"prompt": "b", "n": 1, "quality": "low"}),
        ("mock-images/images/generations", {"prompt": "c", "n": 1}),
        # Partial: three asked, one delivered; only the delivered output is paid.
        ("mock-images/images/generations",
         {"prompt": "d", "n": 3, "quality": "high", "_mock": {"n_out": 1}}),
        ("mock-keyed/generations", {"prompt": "e"}),
    ]
    expected = {}
    jobs = {}
    for t, (name, token) in enumerate(tenants):
        for route, body in plans[t:]:  # the two tenants make different sets
            r = gw.submit(token, key(), body, route=route, headers={"Prefer": "wait=20"})
            assert r.status == 200, (r.status, r.body[:300])
            job_id = r.headers["x-idemgate-job-id"]
            job = gw.job(token, job_id).json()
            assert job["state"] == "completed", job
            creates = mock.creates_for(job_id)
            assert len(creates) == 1
            delivered = job["outputs"]["received"]
            prov = route.split("/")[0]
            cost = (KEYED_PER_REQUEST if prov == "mock-keyed"
                    else image_cost(body.get("quality"), delivered))
            assert job["cost"]["currency"] == "USD"
            assert job["cost"]["micros"] == cost, job["cost"]
            expected.setdefault(name, {}).setdefault(prov, [0, 0])
            expected[name][prov][0] += 1
            expected[name][prov][1] += cost
            jobs[job_id] = (name, prov, cost)
    # Each tenant sees its own sums, by provider; the admin sees both tenants.
    for name, token in tenants:
        doc = usage(gw, token).json()
        got = {row["provider"]: [row["jobs"], row["cost_micros"]] for row in doc["data"]}
        assert got == expected[name], (doc, expected[name])
        assert {row["tenant"] for row in doc["data"]} == {name}
    admin = usage(gw, ADMIN_TOKEN, group_by="route").json()
    mine = [row for row in admin["data"] if row["tenant"] in expected]
    for name in expected:
        total = sum(row["cost_micros"] for row in mine if row["tenant"] == name)
        assert total == sum(v[1] for v in expected[name].values())
    assert {row["route"] for row in mine} == {"mock-images/images/generations",
                                               "mock-keyed/generations"}
    # By day: everything finished today (UTC), and from/to bound it.
    today = time.strftime("%Y-%m-%d", time.gmtime())
    name, token = tenants[0]
    by_day = usage(gw, token, group_by="day").json()["data"]
    assert [(r["day"], r["cost_micros"]) for r in by_day] == \
        [(today, sum(v[1] for v in expected[name].values()))]
    assert usage(gw, token, to="2000-01-01").json()["data"] == []
    assert usage(gw, token, group_by="tenant").status == 400
    assert usage(gw, "not-a-token").status == 401

    # Prometheus: spend by provider on this replica (the only one running) equals what it
    # settled: these jobs, and any another test left for it to finish.
    metrics = gw.http.request("GET", "/metrics").body.decode()
    spent = {}
    for line in metrics.splitlines():
        if line.startswith("idemgate_spend_micros_total{"):
            prov = line.split('provider="')[1].split('"')[0]
            spent[prov] = int(line.rsplit(" ", 1)[1])
    for prov in ("mock-images", "mock-keyed"):
        settled = psql(f"SELECT coalesce(sum(cost_micros), 0) FROM operations WHERE "
                       f"provider = '{prov}' AND state = 'completed' "
                       f"AND finished_at >= '{started}'")[0][0]
        assert spent[prov] == int(settled)
        assert spent[prov] >= sum(c for (_, p, c) in jobs.values() if p == prov)

    # The CLI prints the same document.
    out = cli(database_url, "usage", "--tenant", name)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {r["provider"]: [r["jobs"], r["cost_micros"]] for r in doc["data"]} == expected[name]


def test_budget_exceeded_at_intake_records_and_sends_nothing(gateway_factory, mock, database_url,
                                                            psql):
    gw = priced_gateway(gateway_factory, mock)
    name, token = new_tenant(database_url)
    # 0.10 USD a day: two medium images (0.042 each) fit, a third does not.
    out = cli(database_url, "tenant", "budget", name, "--currency", "USD", "--day", "0.10",
              "--in-flight", "7")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (f"budget of {name}: USD 0.100000 a day, no limit a month, "
                                  "7 in flight")
    keys = [key() for _ in range(3)]
    ok = [gw.submit(token, k, {"prompt": "p", "n": 1}, headers={"Prefer": "wait=20"})
          for k in keys[:2]]
    assert [r.status for r in ok] == [200, 200]
    before = len(mock.ledger())
    r = gw.submit(token, keys[2], {"prompt": "p", "n": 1})
    assert r.status == 402, (r.status, r.body[:300])
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"] == "urn:idemgate:problem:budget-exceeded"
    assert "0.042000 USD" in problem["detail"] and "daily" in problem["detail"]
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{keys[2]}'") == [["0"]]
    assert len(mock.ledger()) == before  # nothing was sent
    # A key that exists still replays, and is not charged again.
    used = usage(gw, token).json()["budgets"][0]["day_used_micros"]
    assert used == 2 * IMAGE_PRICES["medium"]
    again = gw.submit(token, keys[0], {"prompt": "p", "n": 1})
    assert again.status == 202 and again.headers.get("idempotent-replayed") == "true"
    assert usage(gw, token).json()["budgets"][0]["day_used_micros"] == used
    assert len(mock.ledger()) == before
    # A cheaper request that fits is taken (0.084 + 0.011 <= 0.10).
    r = gw.submit(token, key(), {"prompt": "p", "n": 1, "quality": "low"})
    assert r.status == 202, r.body[:300]
    # The month's limit refuses the same way.
    assert cli(database_url, "tenant", "budget", name, "--day", "none",
               "--month", "0.05").returncode == 0
    r = gw.submit(token, key(), {"prompt": "p", "n": 1, "quality": "low"})
    assert r.status == 402 and "monthly" in r.json()["detail"]
    # Without a budget the same request is taken.
    assert cli(database_url, "tenant", "budget", name, "--clear").returncode == 0
    assert gw.submit(token, key(), {"prompt": "p", "n": 1}).status == 202


def test_a_budget_set_after_retention_counts_the_jobs_it_deleted(gateway_factory, mock,
                                                                  database_url, psql):
    """A budget set, or its currency changed, starts from what the tenant's jobs of this day and
    month count. Retention (the janitor) deletes ended jobs after job_ttl_hours; their spend was
    forgotten with them, and the tenant could spend it again past its limit. What a deleted job
    counted outlives it (migration 0036)."""
    gw = priced_gateway(gateway_factory, mock)
    name, token = new_tenant(database_url)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    done = [gw.submit(token, key(), {"prompt": "p", "n": 1}, headers={"Prefer": "wait=20"})
            for _ in range(2)]
    assert [r.status for r in done] == [200, 200]
    assert psql(f"SELECT count(*), sum(cost_micros) FROM operations WHERE tenant_id = {tid} "
                "AND state = 'completed'") == [["2", str(2 * IMAGE_PRICES["medium"])]]
    # Past their expiry (created today, this month): the janitor writes their tombstones, then
    # deletes them.
    psql("UPDATE operations SET expires_at = timestamptz '2000-01-01 00:00:00+00' "
         f"WHERE tenant_id = {tid}")
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    settle_tombstones(psql)
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert psql(f"SELECT count(*) FROM operations WHERE tenant_id = {tid}") == [["0"]]
    # 0.10 USD a day, set now: the two deleted jobs count (0.084); a third does not fit.
    out = cli(database_url, "tenant", "budget", name, "--currency", "USD", "--day", "0.10")
    assert out.returncode == 0, out.stderr
    assert usage(gw, token).json()["budgets"][0]["day_used_micros"] == \
        2 * IMAGE_PRICES["medium"]
    before = len(mock.ledger())
    r = gw.submit(token, key(), {"prompt": "p", "n": 1})
    assert r.status == 402 and "daily" in r.json()["detail"], (r.status, r.body[:300])
    assert len(mock.ledger()) == before


def test_a_budget_update_keeps_what_it_leaves_out(database_url, psql):
    """`tenant budget NAME --day 50` on a EUR budget switched it to USD — every EUR job then
    passed unchecked (a budget counts only its own currency) — and removed the month's and the
    in-flight limits. What an update leaves out is now kept; `none` removes a limit."""
    name, _ = new_tenant(database_url)

    def budget(*args):
        out = cli(database_url, "tenant", "budget", name, *args)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert budget("--currency", "EUR", "--day", "10", "--month", "100", "--in-flight", "3") == \
        f"budget of {name}: EUR 10.000000 a day, 100.000000 a month, 3 in flight"
    assert budget("--day", "50") == \
        f"budget of {name}: EUR 50.000000 a day, 100.000000 a month, 3 in flight"
    assert psql("SELECT b.currency, b.day_limit_micros, b.month_limit_micros, b.max_inflight "
                "FROM tenant_budgets b JOIN tenants t ON t.id = b.tenant_id "
                f"WHERE t.name = '{name}'") == [["EUR", "50000000", "100000000", "3"]]
    assert budget("--month", "none") == \
        f"budget of {name}: EUR 50.000000 a day, no limit a month, 3 in flight"
    # A change of currency keeps no amount: 50 EUR would become 50 of the new unit.
    out = cli(database_url, "tenant", "budget", name, "--currency", "JPY", "--day", "5000")
    assert out.returncode == 2 and "--month" in out.stderr, out
    assert budget("--currency", "JPY", "--day", "5000", "--month", "none") == \
        f"budget of {name}: JPY 5000.000000 a day, no limit a month, 3 in flight"
    other, _ = new_tenant(database_url)
    out = cli(database_url, "tenant", "budget", other, "--day", "1")
    assert out.stdout.strip() == f"budget of {other}: USD 1.000000 a day, no limit a month, " \
        "any in flight", out


def test_in_flight_limit_is_429_and_released_by_cancel(gateway_factory, mock, database_url):
    # No dispatcher: jobs stay in flight until cancelled.
    gw = priced_gateway(gateway_factory, mock, dispatch_workers=0)
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--in-flight", "1").returncode == 0
    first = gw.submit(token, key(), {"prompt": "p"})
    assert first.status == 202
    k2 = key()
    r = gw.submit(token, k2, {"prompt": "p"})
    assert r.status == 429, r.body[:300]
    assert r.json()["type"] == "urn:idemgate:problem:too-many-in-flight"
    assert int(r.headers["retry-after"]) >= 1
    # Another tenant is not held back by this one's limit.
    _, other = new_tenant(database_url)
    assert gw.submit(other, key(), {"prompt": "p"}).status == 202
    # The cancel fails the first job and releases its place and its reservation.
    c = gw.http.request("POST", f"/v1/jobs/{first.json()['id']}/cancel",
                        headers={"Authorization": f"Bearer {token}"})
    assert c.status == 200 and c.json()["state"] == "failed"
    assert c.json()["cost"]["micros"] == 0
    b = usage(gw, token).json()["budgets"][0]
    assert b["in_flight"] == 0 and b["day_used_micros"] == 0
    second = gw.submit(token, k2, {"prompt": "p"})
    assert second.status == 202
    assert mock.ledger() == []
    # Nothing is left for another test's dispatchers.
    for t, j in ((token, second.json()["id"]), (other, None)):
        if j:
            gw.http.request("POST", f"/v1/jobs/{j}/cancel",
                            headers={"Authorization": f"Bearer {t}"})
    for j in gw.http.request("GET", "/v1/jobs?state=prepared",
                             headers={"Authorization": f"Bearer {other}"}).json()["data"]:
        gw.http.request("POST", f"/v1/jobs/{j['id']}/cancel",
                        headers={"Authorization": f"Bearer {other}"})


def test_concurrent_intakes_from_two_replicas_take_exactly_the_affordable(
        gateway_factory, mock, database_url, psql):
    gws = [priced_gateway(gateway_factory, mock, intake_batch_max=16) for _ in range(2)]
    name, token = new_tenant(database_url)
    affordable = 5
    limit = affordable * IMAGE_PRICES["medium"]
    assert cli(database_url, "tenant", "budget", name, "--day",
               f"{limit / 1e6:.6f}").returncode == 0
    n = 24
    results = [None] * n
    start = threading.Barrier(n)

    def one(i):
        start.wait()
        results[i] = gws[i % 2].submit(token, f"race-{name}-{i}", {"prompt": "p", "n": 1}).status

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(202) == affordable, results
    assert results.count(402) == n - affordable, results
    rows = psql(f"SELECT count(*), sum(reserved_micros) FROM operations o JOIN tenants t "
                f"ON t.id = o.tenant_id WHERE t.name = '{name}'")
    assert rows == [[str(affordable), str(limit)]]
    # Every accepted job completes; the settled total never passes the limit.
    ids = [r[0] for r in psql(f"SELECT o.id FROM operations o JOIN tenants t ON t.id = "
                              f"o.tenant_id WHERE t.name = '{name}'")]
    for job_id in ids:
        assert gws[0].wait_state(token, job_id, {"completed"})["state"] == "completed"
    b = usage(gws[0], token).json()["budgets"][0]
    assert b["day_used_micros"] == limit and b["in_flight"] == 0
    assert all(len(mock.creates_for(i)) == 1 for i in ids)


def test_reservation_released_on_failure_and_settled_at_completion(gateway_factory, mock,
                                                                   database_url):
    gw = priced_gateway(gateway_factory, mock)
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    # A definite refusal by the provider: failed, nothing charged.
    r = gw.submit(token, key(), {"prompt": "p", "n": 2, "_mock": {"status": 400}},
                  headers={"Prefer": "wait=20"})
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["state"] == "failed", job
    assert job["cost"] == {"currency": "USD", "estimate_micros": 2 * IMAGE_PRICES["medium"],
                           "micros": 0}
    b = usage(gw, token).json()["budgets"][0]
    assert b["day_used_micros"] == 0 and b["in_flight"] == 0
    # A partial result: reserved for three, settled to the one delivered.
    r = gw.submit(token, key(), {"prompt": "p", "n": 3, "quality": "high",
                                 "_mock": {"n_out": 1}}, headers={"Prefer": "wait=20"})
    job = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert job["state"] == "completed"
    assert job["cost"]["estimate_micros"] == 3 * IMAGE_PRICES["high"]
    assert job["cost"]["micros"] == IMAGE_PRICES["high"]
    b = usage(gw, token).json()["budgets"][0]
    assert b["day_used_micros"] == IMAGE_PRICES["high"] and b["in_flight"] == 0
    assert b["month_used_micros"] == IMAGE_PRICES["high"]


def test_a_new_budget_counts_the_jobs_an_earlier_one_left_in_flight(gateway_factory, mock,
                                                                     database_url):
    """Two jobs under a budget are still running (in review) when the budget is cleared and a new
    one set. Each still settles against the tenant's budget row when it ends. Before, the new
    row started with none in flight: each end took one off a count that had not counted it, and
    the tenant could pass its in-flight limit by as many. Now the new budget counts them."""
    rev = provider("rev-inflight", mock.url, pricing=IMAGES_PRICING,
                   timeouts={"connect_ms": 1000, "total_ms": 1000},
                   reconcile={"strategy": "none", "window_seconds": 2})
    gw = gateway_factory(providers=[rev])
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    for _ in range(2):
        mock.script([{"fault": "hang"}])
        r = gw.submit(token, key(), {"prompt": "p"}, route="rev-inflight/images/generations")
        assert r.status == 202, r
        assert gw.wait_state(token, r.json()["id"], {"review"}, timeout=20)["state"] == "review"
    assert usage(gw, token).json()["budgets"][0]["in_flight"] == 2
    assert cli(database_url, "tenant", "budget", name, "--clear").returncode == 0
    assert cli(database_url, "tenant", "budget", name, "--day", "10", "--in-flight", "2"
               ).returncode == 0
    b = usage(gw, token).json()["budgets"][0]
    assert b["in_flight"] == 2, b


def test_a_new_budget_adopts_the_jobs_running_without_one(gateway_factory, mock, database_url):
    """A job recorded while its tenant had no budget is still running (in review) when a budget is
    set: the budget counted its reservation in the day's spend — and, not budgeted, its end never
    settled against the budget row: ended at no cost (cancelled, proven absent) it stayed counted
    for the rest of the day and the month, and it was never counted in flight. A new budget adopts
    it now: in flight while it runs, its reservation replaced by its cost (0) when it ends."""
    rev = provider("rev-adopt", mock.url, pricing=IMAGES_PRICING,
                   timeouts={"connect_ms": 1000, "total_ms": 1000},
                   reconcile={"strategy": "none", "window_seconds": 2})
    gw = gateway_factory(providers=[rev])
    name, token = new_tenant(database_url)
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, key(), {"prompt": "p"}, route="rev-adopt/images/generations")
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert gw.wait_state(token, job_id, {"review"}, timeout=20)["state"] == "review"
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    b = usage(gw, token).json()["budgets"][0]
    assert b["day_used_micros"] == IMAGE_PRICES["medium"] and b["in_flight"] == 1, b
    # Cancelled, then resolved `absent`: failed, nothing charged (an `abandon` would charge
    # the estimate: a task may exist).
    auth = {"Authorization": f"Bearer {token}"}
    c = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "", auth)
    assert c.status == 202, c
    res = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve", json.dumps({"outcome": "absent"}),
                          auth)
    assert res.status == 200 and res.json()["state"] == "failed", res
    assert res.json()["cost"]["micros"] == 0, res
    b = usage(gw, token).json()["budgets"][0]
    assert b["day_used_micros"] == 0 and b["month_used_micros"] == 0, b
    assert b["in_flight"] == 0, b


def test_a_job_is_never_priced_in_another_currency(gateway_factory, mock, database_url):
    """A job recorded under a USD price table is found by another replica whose table for the
    provider is in JPY (a rolling deploy, a restart with the new table): its cost was computed in
    yen and written on the dollar row — 9 000 000 micro-yen counted as nine dollars against the
    tenant's dollar budget. A job is priced only in its own currency now: it keeps its estimate
    as its cost, and the budget counts that."""
    listing = {"strategy": "list_match", "found_result": "$.result", "window_seconds": 60,
               "interval_ms": 300, "absent_grace_ms": 4000,
               "list": {"path": "/v1/images/tasks?since={since}&until={until}",
                        "items": "$.data[*]", "match": "$.client_ref", "id": "$.id",
                        "next_cursor": "$.next_cursor"}}

    def entry(pricing):
        return provider("cur-moved", mock.url, pricing=pricing, reconcile=listing,
                        client_ref={"body_field": "metadata.client_ref"},
                        timeouts={"connect_ms": 1000, "total_ms": 2000})

    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    first = gateway_factory(providers=[entry(IMAGES_PRICING)], lease_seconds=4)
    mock.script([{"fault": "hang"}])  # the task is made; its answer never comes
    r = first.submit(token, key(), {"prompt": "p"}, route="cur-moved/images/generations",
                     headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert wait_until(lambda: mock.creates_for(job_id), 10)
    first.proc.kill()  # mid-create: the row stays sending under the dead replica's lease
    first.proc.wait()
    yen = {"currency": "JPY", "per_output": 9000000}
    second = gateway_factory(providers=[entry(yen)], lease_seconds=4)
    job = second.wait_state(token, job_id, {"completed", "failed", "review"}, timeout=60)
    assert job["state"] == "completed", job
    assert job["cost"]["currency"] == "USD", job["cost"]
    assert job["cost"]["micros"] == IMAGE_PRICES["medium"], job["cost"]  # its estimate
    b = usage(second, token).json()["budgets"][0]
    assert b["day_used_micros"] == IMAGE_PRICES["medium"], b
    assert len(mock.creates_for(job_id)) == 1


def test_a_job_ending_while_its_budget_is_set_again_is_not_left_in_flight(gateway_factory,
                                                                            mock, database_url,
                                                                            psql):
    """A budgeted job ends while a new budget of its tenant is being written: the budget's write
    counted it in flight from its snapshot, and the job's settle found no row to take itself off
    (the new row not yet committed). Before, the job stayed counted for good: with an in-flight
    limit of 1 every later job of the tenant was refused (429) until the budget was set again.
    Now the new budget's counters are counted again under its row's lock once it is written
    (migration 0040). The interleaving is held in place with two transactions of the test's own:
    one locks the job's row (its result's write waits), one holds the budget's key (the budget's
    write waits, its snapshot taken)."""
    prov = provider("mid-budget", mock.url, pricing=IMAGES_PRICING,
                    timeouts={"connect_ms": 1000, "total_ms": 20000})
    gw = gateway_factory(providers=[prov], lease_seconds=30)
    name, token = new_tenant(database_url)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    assert cli(database_url, "tenant", "budget", name, "--in-flight", "1").returncode == 0
    mock.script([{"delay_ms": 8000}])  # the row is locked long before (a bound, not a measure)
    r = gw.submit(token, key(), {"prompt": "p"}, route="mid-budget/images/generations")
    assert r.status == 202, r
    job = r.json()["id"]
    assert gw.wait_state(token, job, {"sending"}, timeout=20)["state"] == "sending"
    assert cli(database_url, "tenant", "budget", name, "--clear").returncode == 0

    def session():
        return subprocess.Popen(["psql", database_url, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def say(s, sql, answer):
        s.stdin.write(sql + f"\nSELECT '{answer}';\n")
        s.stdin.flush()
        assert s.stdout.readline().strip() == answer

    row, held, setter = session(), session(), None
    try:
        say(row, f"BEGIN; SELECT FROM operations WHERE tenant_id = {tid} AND id = '{job}' "
            "FOR UPDATE;", "locked")
        # the create's answer is still to come: its result is written after the row is let go
        assert psql(f"SELECT state, budgeted FROM operations WHERE tenant_id = {tid} "
                    f"AND id = '{job}'") == [["sending", "t"]]
        say(held, f"BEGIN; INSERT INTO tenant_budgets (tenant_id, currency, day, month) "
            f"VALUES ({tid}, 'USD', current_date, current_date);", "held")
        setter = subprocess.Popen([GATEWAY_BIN, "tenant", "budget", name, "--in-flight", "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, DATABASE_URL=database_url))
        # the budget's write waits (its text as pg_stat_activity keeps it: the first 1 kB)
        assert wait_until(lambda: psql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'WITH c AS MATERIALIZED (SELECT now() AS at, %'") == [["1"]], 20), \
            setter.poll()
        say(row, "COMMIT;", "released")
        assert wait_until(lambda: psql(
            f"SELECT state FROM operations WHERE tenant_id = {tid} AND id = '{job}'"
        ) == [["completed"]], 30)
        say(held, "ROLLBACK;", "let go")
        out, err = setter.communicate(timeout=30)
        assert setter.returncode == 0, (out, err)
    finally:
        for s in (row, held, setter):
            if s is not None and s.poll() is None:
                s.kill()
                s.wait()
    assert psql(f"SELECT inflight FROM tenant_budgets WHERE tenant_id = {tid}") == [["0"]]
    assert usage(gw, token).json()["budgets"][0]["in_flight"] == 0
    r = gw.submit(token, key(), {"prompt": "p"}, route="mid-budget/images/generations")
    assert r.status == 202, r  # one job in flight is allowed again


def test_usage_dates_are_utc_midnights_whatever_the_sessions_zone(gateway_factory, mock,
                                                                  database_url):
    """`from` and `to` given as dates are UTC midnights (docs/api.md). They were cast by the
    database session's TimeZone: on a server set to another zone the report counted another
    day than the budgets do. Run here on a session in a zone far from UTC (PGOPTIONS): a job
    finished now is outside [tomorrow's UTC date, …) and inside [today's, …) whatever the zone."""
    gw = priced_gateway(gateway_factory, mock)
    name, token = new_tenant(database_url)
    r = gw.submit(token, key(), {"prompt": "tz", "n": 1}, route="mock-images/images/generations",
                  headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    now = time.time()
    today = time.strftime("%Y-%m-%d", time.gmtime(now))
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(now + 86400))
    hour = time.gmtime(now).tm_hour
    # A zone whose midnight of the date asked falls before now (UTC+14 after 10:00 UTC, for
    # tomorrow's date), or after it (UTC-11 before 11:00 UTC, for today's date as `to`).
    zone, args = (("Pacific/Kiritimati", ["--from", tomorrow]) if hour >= 10 else
                  ("Pacific/Pago_Pago", ["--to", today]))

    def jobs(env_zone, extra):
        out = subprocess.run([GATEWAY_BIN, "usage", "--tenant", name, *extra],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, DATABASE_URL=database_url,
                                      PGOPTIONS=f"-c TimeZone={env_zone}"))
        assert out.returncode == 0, out
        return sum(row["jobs"] for row in json.loads(out.stdout)["data"])

    assert jobs("UTC", ["--from", today]) == 1
    assert jobs(zone, args) == 0, (zone, args)


def test_a_budget_whose_recount_fails_is_reported_written(gateway_factory, mock, database_url,
                                                         psql):
    """The budget's counters are counted again once it is written (migration 0040), and that
    recount waits for the tenant's jobs in flight. When it cannot (their rows stay locked past
    the session's lock_timeout, three tries), the budget is written all the same: before,
    `idemgate tenant budget` said it "cannot set the budget" of a tenant whose new limit was
    already in force. Now it prints the budget, says that its jobs in flight were not counted
    again and to run it again (exit 1), and the same command run again counts them."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("the session's lock_timeout (PGOPTIONS) does not reach a Citus worker's "
                    "locks: the recount waits there instead of failing")
    prov = provider("recount-held", mock.url, pricing=IMAGES_PRICING,
                    timeouts={"connect_ms": 1000, "total_ms": 20000})
    gw = gateway_factory(providers=[prov], lease_seconds=30)
    name, token = new_tenant(database_url)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    assert cli(database_url, "tenant", "budget", name, "--in-flight", "5").returncode == 0
    mock.script([{"delay_ms": 8000}])  # the job stays in flight (a bound, not a measure)
    r = gw.submit(token, key(), {"prompt": "p"}, route="recount-held/images/generations")
    assert r.status == 202, r
    job = r.json()["id"]
    assert gw.wait_state(token, job, {"sending"}, timeout=20)["state"] == "sending"
    row = subprocess.Popen(["psql", database_url, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        row.stdin.write(f"BEGIN; SELECT FROM operations WHERE tenant_id = {tid} AND id = '{job}' "
                        "FOR UPDATE;\nSELECT 'locked';\n")
        row.stdin.flush()
        assert row.stdout.readline().strip() == "locked"
        held = subprocess.run([GATEWAY_BIN, "tenant", "budget", name, "--in-flight", "2"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, DATABASE_URL=database_url,
                                       PGOPTIONS="-c lock_timeout=200"))
        assert held.returncode == 1, held
        assert "budget of " + name + ": USD" in held.stdout, held
        assert "is written, but its jobs in flight could not be counted again" in held.stderr, held
        assert psql(f"SELECT max_inflight FROM tenant_budgets WHERE tenant_id = {tid}") == [["2"]]
    finally:
        row.stdin.write("ROLLBACK;\n")
        row.stdin.close()
        row.wait(timeout=10)
    again = cli(database_url, "tenant", "budget", name, "--in-flight", "2")
    assert again.returncode == 0 and "could not" not in again.stderr, again
    assert psql(f"SELECT max_inflight, inflight FROM tenant_budgets WHERE tenant_id = {tid}") \
        == [["2", "1"]]


def test_an_operators_resolution_settles_the_budget_once(gateway_factory, mock, database_url):
    """The budget row is settled by the statement that ends an operation (migration 0018, no
    trigger writes it): a job in review resolved `found` is charged its reservation (the provider
    made a task nobody priced), and so is one resolved `abandon` (giving up proves nothing about
    the task, which the provider made here: before migration 0031 its reservation was released,
    and the tenant could spend it again); the same decision again, and a cancel after it, change
    nothing."""
    rev = provider("rev-priced", mock.url, pricing=IMAGES_PRICING,
                   timeouts={"connect_ms": 1000, "total_ms": 1000},
                   reconcile={"strategy": "none", "window_seconds": 2})
    gw = gateway_factory(providers=[rev], admin_token_sha256=ADMIN_SHA)
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    jobs = []
    for _ in range(2):
        mock.script([{"fault": "hang"}])
        r = gw.submit(token, key(), {"prompt": "p", "n": 2}, route="rev-priced/images/generations")
        assert r.status == 202, r
        j = gw.wait_state(token, r.json()["id"], {"review"}, timeout=20)
        assert j["state"] == "review", j
        jobs.append(j["id"])
    b = usage(gw, token).json()["budgets"][0]
    reserved = 2 * IMAGE_PRICES["medium"]
    assert b["in_flight"] == 2 and b["day_used_micros"] == 2 * reserved, b

    def resolve(job_id, body):
        return gw.http.request("POST", f"/v1/jobs/{job_id}/resolve", json.dumps(body),
                               {"Authorization": f"Bearer {ADMIN_TOKEN}"})

    found, abandon = jobs
    for _ in range(2):
        assert resolve(found, {"outcome": "found", "remote_id": "task_x"}).status == 200
        assert resolve(abandon, {"outcome": "abandon"}).status == 200
        for j in jobs:
            assert gw.http.request("POST", f"/v1/jobs/{j}/cancel", "",
                                   {"Authorization": f"Bearer {token}"}).status in (200, 409)
    b = usage(gw, token).json()["budgets"][0]
    assert b["in_flight"] == 0, b
    assert b["day_used_micros"] == 2 * reserved and b["month_used_micros"] == 2 * reserved, b
    assert gw.job(token, found).json()["cost"]["micros"] == reserved
    assert gw.job(token, abandon).json()["cost"]["micros"] == reserved
    assert gw.job(token, abandon).json()["state"] == "failed"
    # The usage report sums what the budget counts: the abandoned job's charge too (it summed
    # completed and canceled jobs only, one reservation less than the budget).
    rows = usage(gw, token).json()["data"]
    assert [(r["jobs"], r["cost_micros"]) for r in rows] == [(2, 2 * reserved)], rows


def test_retention_deletes_each_kind_and_keeps_a_tombstone(gateway_factory, mock, database_url,
                                                          psql):
    name, token = new_tenant(database_url)
    # A job that is not terminal is kept whatever its age (its key guards against a second
    # create): recorded by a gateway without dispatchers and made due only tomorrow, before any
    # dispatcher runs, so it stays prepared.
    idle = priced_gateway(gateway_factory, mock, dispatch_workers=0)
    live = idle.submit(token, key(), {"prompt": "p"}).json()["id"]
    psql(f"UPDATE operations SET next_attempt_at = now() + interval '1 day' WHERE id = '{live}'")
    # No job cache: a deleted job is not answered from memory either.
    gw = priced_gateway(gateway_factory, mock, janitor_interval_ms=100, janitor_batch=2,
                        job_cache_entries=0)
    keys = [key() for _ in range(4)]
    done = []
    for k in keys:
        r = gw.submit(token, k, {"prompt": "p"}, headers={"Prefer": "wait=20"})
        assert r.status == 200
        done.append(r.headers["x-idemgate-job-id"])
    # A job that ended long after it was recorded (in review for days, then resolved; a task
    # the provider ran for longer than the ttl) is kept a ttl after its end: deleted at once,
    # its key was free and a client's retry paid again.
    late_key, late = keys.pop(), done.pop()
    psql(f"UPDATE operations SET created_at = now() - interval '10 days', "
         f"expires_at = now() - interval '3 days', finished_at = now() WHERE id = '{late}'")
    tag = uuid.uuid4().hex[:8]
    ids = ",".join(f"'{i}'" for i in done + [live])
    assert int(psql(f"SELECT count(*) FROM attempts WHERE operation_id IN ({ids})")[0][0]) >= 3
    # Their outputs' archive rows go with them too (the janitor's own deletes since migration
    # 0030 dropped the foreign keys' cascade).
    assert int(psql(f"SELECT count(*) FROM archive_outputs WHERE op_id IN ({ids})")[0][0]) >= 3
    psql(f"UPDATE operations SET expires_at = now() - interval '1 hour' WHERE id IN ({ids})")
    psql(f"INSERT INTO webhook_events (provider, event_id, remote_id, expires_at) "
         f"SELECT 'mock-images', '{tag}-' || g, 'r', now() - interval '1 minute' "
         f"FROM generate_series(1, 5) g")
    psql(f"INSERT INTO webhook_events (provider, event_id, remote_id, expires_at) "
         f"VALUES ('mock-images', '{tag}-fresh', 'r', now() + interval '1 hour')")
    psql(f"INSERT INTO webhook_parked (provider, remote_id, received_at) "
         f"SELECT 'mock-images', '{tag}-' || g, now() - interval '2 days' "
         f"FROM generate_series(1, 5) g")

    def gone():
        settle_tombstones(psql)
        rows = psql(
            f"SELECT (SELECT count(*) FROM operations WHERE id IN ({ids}) AND id <> '{live}'), "
            f"(SELECT count(*) FROM attempts WHERE operation_id IN ({ids})), "
            f"(SELECT count(*) FROM archive_outputs WHERE op_id IN ({ids})), "
            f"(SELECT count(*) FROM webhook_events WHERE event_id LIKE '{tag}-%' "
            f" AND event_id <> '{tag}-fresh'), "
            f"(SELECT count(*) FROM webhook_parked WHERE remote_id LIKE '{tag}-%')")
        return rows == [["0", "0", "0", "0", "0"]]

    assert wait_until(gone, 30), psql(
        f"SELECT id, state, expires_at < now() FROM operations WHERE id IN ({ids})")
    # Each kind needed several batches of 2: the sweep went on while batches were full.
    assert psql(f"SELECT count(*) FROM operations WHERE id = '{live}'") == [["1"]]
    assert psql(f"SELECT count(*) FROM operations WHERE id = '{late}'") == [["1"]], \
        "a job that ended after its ttl was deleted at once"
    r = gw.submit(token, late_key, {"prompt": "p"}, headers={"Prefer": "wait=20"})
    assert r.headers["x-idemgate-job-id"] == late and r.headers.get("idempotent-replayed"), r
    expires = psql(f"SELECT extract(epoch FROM now() + interval '6 days')")[0][0]
    shown = gw.job(token, late).json()["expires_at"]
    assert shown > psql(f"SELECT to_char(to_timestamp({expires}) AT TIME ZONE 'UTC', "
                        "'YYYY-MM-DD\"T\"HH24:MI:SS')")[0][0], shown
    assert psql(f"SELECT count(*) FROM webhook_events WHERE event_id = '{tag}-fresh'") == [["1"]]
    # The key is not free (migration 0032): the same request under it is told its job is gone
    # (410), another one that the key was used (422); nothing is recorded, nothing sent. Before,
    # the same request was a new job, and a second paid create.
    creates = len(mock.ledger())
    for i in range(2):
        r = gw.submit(token, keys[i], {"prompt": "p"}, headers={"Prefer": "wait=20"})
        assert r.status == 410, r
        assert r.json()["type"] == "urn:idemgate:problem:idempotency-key-expired", r.json()
        assert done[i] in r.json()["detail"] and "completed" in r.json()["detail"], r.json()
    r = gw.submit(token, keys[0], {"prompt": "another"}, headers={"Prefer": "wait=20"})
    assert r.status == 422 and done[0] in r.json()["detail"], r
    assert len(mock.ledger()) == creates
    [[n, kept]] = psql(f"SELECT count(*), bool_and(expires_at > now() + interval '29 days') "
                       f"FROM key_tombstones WHERE job_id IN ({ids})")
    assert (n, kept) == ("3", "t"), (n, kept)
    # (The late job, expired a ttl after its end only, has no tombstone yet.)
    assert psql(f"SELECT count(*) FROM key_tombstones WHERE job_id = '{late}'") == [["0"]]
    # A tombstone past its time is deleted by the janitor; the key is then free.
    psql(f"UPDATE key_tombstones SET expires_at = now() - interval '1 second' "
         f"WHERE job_id = '{done[0]}'")
    assert wait_until(lambda: psql(f"SELECT count(*) FROM key_tombstones "
                                   f"WHERE job_id = '{done[0]}'") == [["0"]], 30)
    r = gw.submit(token, keys[0], {"prompt": "p"}, headers={"Prefer": "wait=20"})
    assert r.status == 200 and r.headers.get("idempotent-replayed") is None, r
    assert r.headers["x-idemgate-job-id"] != done[0]
    assert len(mock.creates_for(r.headers["x-idemgate-job-id"])) == 1
    gw.http.request("POST", f"/v1/jobs/{live}/cancel", headers={"Authorization": f"Bearer {token}"})


def test_a_reservation_counts_in_its_jobs_day(database_url, psql):
    """Migration 0045, in SQL: a request the gateway stamped just before UTC midnight whose intake
    committed after it. Its reservation was counted in the database's new day (and new month at a
    month's end) while every settle reads the day and month of the job's created_at: a job that
    then failed at no cost left its whole estimate counted for the day (and the month). Now it
    counts in its job's day: with the budget row already on the new day, in neither counter of
    the new day, and settled in neither — both end at 0. A job stamped on the row's own day is
    counted and settled there as before."""
    name = "midnight-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    assert cli(database_url, "tenant", "budget", name, "--day", "10").returncode == 0
    midnight = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"

    def intake(job_id, at):
        return psql(f"SELECT idemgate_intake({tid}, 'k-{job_id}', '{job_id}', '00', 1::smallint, "
                    "'mid-prov', 'r', 'POST', 'http://x', '', '\\x00'::bytea, 24, NULL, "
                    f"'none', NULL, NULL, NULL, 60, 5000000, 'USD', false, {at})")[0][0]

    def counters():
        return psql(f"SELECT day_micros, month_micros, inflight FROM tenant_budgets "
                    f"WHERE tenant_id = {tid}")[0]

    assert counters() == ["0", "0", "0"]
    # Stamped a second before midnight, committed after it (the budget row is on today).
    assert intake("job_late", f"{midnight} - interval '1 second'") == "1"
    late = counters()
    assert late[0] == "0" and late[2] == "1", late  # not in today's count
    assert psql(f"SELECT idemgate_cancel({tid}, 'job_late')")[0][0]
    assert psql(f"SELECT state, cost_micros FROM operations WHERE id = 'job_late'") == \
        [["failed", "0"]]
    assert counters() == ["0", "0", "0"], counters()
    # Stamped today: counted today, its end settles it there.
    assert intake("job_today", "now()") == "1"
    assert counters() == ["5000000", "5000000", "1"], counters()
    psql(f"SELECT idemgate_cancel({tid}, 'job_today')")
    assert counters() == ["0", "0", "0"], counters()
    # A replica whose clock runs ahead moves the row on to its day; a regeneration (stamped by
    # the database's clock) never moves it back — it did, zeroing the counters each time.
    assert intake("job_ahead", "now() + interval '1 day'") == "1"
    tomorrow = psql("SELECT ((now() + interval '1 day') AT TIME ZONE 'UTC')::date")[0][0]
    day = f"SELECT day FROM tenant_budgets WHERE tenant_id = {tid}"
    assert psql(day) == [[tomorrow]]
    assert psql(f"SELECT idemgate_regenerate({tid}, 'job_late', 'job_regen', 'k-regen', '00', "
                "1::smallint, 24)")[0][0] == "1"
    assert psql(day) == [[tomorrow]], "moved back by a regeneration"
    assert counters()[2] == "2", counters()


def test_a_key_under_a_tombstone_is_never_a_new_job(database_url, psql):
    """Migration 0032, in SQL: the janitor writes a job's tombstone a sweep before it deletes
    the job (10 minutes after, so that no intake statement older than the tombstone still runs);
    the intake function checks tombstones after its insert, in a snapshot of its own (an insert
    that waited on the janitor's delete proceeds once it commits): a key whose job is gone is
    answered 't' and nothing stays written; a key whose job still exists is replayed ('0'),
    tombstone or not; a regeneration's key likewise."""
    name = "tomb-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]

    def intake(key, job_id):
        return psql(f"SELECT idemgate_intake({tid}, '{key}', '{job_id}', '00', 1::smallint, "
                    "'tomb-prov', 'r', 'POST', 'http://x', '', '\\x00'::bytea, 24, NULL, "
                    "'none', NULL, NULL, NULL, 60, 0, NULL, false, now())")[0][0]

    def count(sql):
        return int(psql(sql)[0][0])

    assert intake("k1", "job_t1") == "1"
    psql(f"UPDATE operations SET state = 'completed', finished_at = now() - interval '9 days', "
         f"created_at = now() - interval '9 days', expires_at = now() - interval '1 day', "
         f"archive_planned_at = now() - interval '9 days' "
         f"WHERE tenant_id = {tid} AND id = 'job_t1'")
    # First sweep: the tombstone, the job kept; the same key is the job's, replayed.
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert count(f"SELECT count(*) FROM key_tombstones WHERE tenant_id = {tid} "
                 "AND idempotency_key = 'k1' AND job_id = 'job_t1'") == 1
    assert count(f"SELECT count(*) FROM operations WHERE id = 'job_t1'") == 1
    assert intake("k1", "job_t2") == "0"
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert count(f"SELECT count(*) FROM operations WHERE id = 'job_t1'") == 1, "deleted at once"
    # Ten minutes on, the job is deleted; its key is answered by its tombstone, nothing kept.
    psql(f"UPDATE key_tombstones SET written_at = now() - interval '11 minutes' "
         f"WHERE tenant_id = {tid}")
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert count(f"SELECT count(*) FROM operations WHERE id = 'job_t1'") == 0
    assert intake("k1", "job_t3") == "t"
    assert count(f"SELECT count(*) FROM operations WHERE tenant_id = {tid} "
                 "AND idempotency_key = 'k1'") == 0
    # A regeneration under that key: the same.
    assert intake("k2", "job_p") == "1"
    psql(f"UPDATE operations SET state = 'completed', finished_at = now() "
         f"WHERE tenant_id = {tid} AND id = 'job_p'")
    assert psql(f"SELECT idemgate_regenerate({tid}, 'job_p', 'job_r', 'k1', '00', "
                "1::smallint, 24)")[0][0] == "t"
    assert count(f"SELECT count(*) FROM operations WHERE id = 'job_r'") == 0


def test_an_expired_job_is_kept_while_an_output_is_still_to_be_archived(database_url, psql):
    """Migration 0033, in SQL: an expired job whose output is still `pending` (a backlog older
    than the ttl, a copy under a worker's lease) is kept, its archive row with it, until the copy
    ends; the next sweep then deletes both. Before, the janitor deleted the pending row with its
    job: the paid output was never archived and nothing counted it. A copy that can no longer be
    made, and that no worker is making, keeps nothing: its URL expired, or a second ttl has
    passed since the job could first be deleted (no replica archives it: kept for ever, the
    tables would only grow)."""
    name = "tomb-" + uuid.uuid4().hex[:8]
    tenant_token(database_url, name)
    tid = psql(f"SELECT id FROM tenants WHERE name = '{name}'")[0][0]
    # what: (output state, its URL's expiry, the job's age in days, days since its expiry,
    # a worker's lease on the copy)
    gone = "now() - interval '1 hour'"
    kinds = {"held": ("pending", "NULL", 9, 1, True), "free": ("archived", "NULL", 9, 1, False),
             "url-gone": ("pending", gone, 9, 1, False),
             "twice-expired": ("pending", "NULL", 25, 15, False),
             "copying": ("pending", gone, 25, 15, True),
             # not planned yet (migration 0038): no output row, kept like a pending one
             "unplanned": (None, "NULL", 9, 1, False),
             "unplanned-twice-expired": (None, "NULL", 25, 15, False)}
    jobs = {what: f"job_{what[:4]}{uuid.uuid4().hex[:8]}" for what in kinds}
    for i, (what, job_id) in enumerate(jobs.items()):
        state, url_expiry, age, expired, leased = kinds[what]
        assert psql(f"SELECT idemgate_intake({tid}, 'k{i}', '{job_id}', '00', 1::smallint, "
                    "'tomb-prov', 'r', 'POST', 'http://x', '', '\\x00'::bytea, 24, NULL, "
                    "'none', NULL, NULL, NULL, 60, 0, NULL, false, now())")[0][0] == "1"
        planned = "NULL" if state is None else "now()"
        psql(f"UPDATE operations SET state = 'completed', archive_planned_at = {planned}, "
             f"finished_at = now() - interval '{age} days', "
             f"created_at = now() - interval '{age} days', "
             f"expires_at = now() - interval '{expired} days' "
             f"WHERE tenant_id = {tid} AND id = '{job_id}'")
        if state is None:
            continue
        # One output each, some under a worker's lease (a copy in progress).
        owner, until = ("'w1'", "now() + interval '1 minute'") if leased else ("NULL", "NULL")
        psql(f"INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
             f"state, lease_owner, lease_version, lease_expires_at, expires_at) VALUES ({tid}, "
             f"'{job_id}', 0, 'tomb-prov', 'url', 'http://x/o.png', '{state}', {owner}, 1, "
             f"{until}, {url_expiry})")

    def kept(what):
        return psql(f"SELECT (SELECT count(*) FROM operations WHERE tenant_id = {tid} "
                    f"AND id = '{jobs[what]}'), (SELECT count(*) FROM archive_outputs "
                    f"WHERE tenant_id = {tid} AND op_id = '{jobs[what]}')")[0]

    psql(f"SELECT idemgate_janitor({tid}, 10)")  # the tombstones
    settle_tombstones(psql)
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert kept("held") == ["1", "1"], "a pending output was deleted with its job"
    assert kept("copying") == ["1", "1"], "an output was deleted while a worker copied it"
    assert kept("unplanned") == ["1", "0"], "a job was deleted before its outputs were planned"
    for what in ("free", "url-gone", "twice-expired", "unplanned-twice-expired"):
        assert kept(what) == ["0", "0"], what
    # Planned at last, its copy made: the next sweep deletes it.
    psql(f"UPDATE operations SET archive_planned_at = now() "
         f"WHERE tenant_id = {tid} AND id = '{jobs['unplanned']}'")
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert kept("unplanned") == ["0", "0"]
    # The copy ends (its output expired at the provider): the next sweep deletes both.
    psql(f"UPDATE archive_outputs SET state = 'expired', lease_owner = NULL, "
         f"lease_expires_at = NULL WHERE tenant_id = {tid} AND op_id = '{jobs['held']}'")
    psql(f"SELECT idemgate_janitor({tid}, 10)")
    assert kept("held") == ["0", "0"]


def test_regeneration_is_a_paid_creation_within_the_budget(gateway_factory, mock, database_url):
    gw = priced_gateway(gateway_factory, mock)
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--day", "0.05").returncode == 0
    r = gw.submit(token, key(), {"prompt": "p", "n": 1}, headers={"Prefer": "wait=20"})
    parent = r.headers["x-idemgate-job-id"]
    auth = {"Authorization": f"Bearer {token}"}
    k = key()
    regen = gw.http.request("POST", f"/v1/jobs/{parent}/regenerate",
                            headers={**auth, "Idempotency-Key": k})
    assert regen.status == 402, regen.body[:300]
    assert regen.json()["type"] == "urn:idemgate:problem:budget-exceeded"
    assert len(mock.ledger()) == 1
    assert cli(database_url, "tenant", "budget", name, "--day", "0.10").returncode == 0
    regen = gw.http.request("POST", f"/v1/jobs/{parent}/regenerate",
                            headers={**auth, "Idempotency-Key": k})
    assert regen.status == 202, regen.body[:300]
    job = gw.wait_state(token, regen.json()["id"], {"completed"})
    assert job["cost"]["micros"] == IMAGE_PRICES["medium"]
    assert usage(gw, token).json()["budgets"][0]["day_used_micros"] == 2 * IMAGE_PRICES["medium"]
    # Its replay is not charged again, even with the budget spent.
    again = gw.http.request("POST", f"/v1/jobs/{parent}/regenerate",
                            headers={**auth, "Idempotency-Key": k})
    assert again.status == 202 and again.json()["id"] == job["id"]


# A table per model and nothing at the top level, like the shipped openai-images table: a model
# it does not list is unpriced.
MODEL_PRICING = {"currency": "USD",
                 "variants": {"keys": ["$.model"], "defaults": ["listed"],
                              "tables": {"listed": {"per_output": 40000}}}}


def test_unpriced_model_refused_under_budget(gateway_factory, mock, database_url, psql):
    """Issue 21 §7: a model the price table does not list was estimated at 0 and passed any budget
    (n=10 of an unlisted model: 202, of a listed one: 402). Under a budget it is refused — 402
    unpriced-under-budget, nothing recorded or sent — unless the profile sets a fallback price,
    which then prices it against the budget like any other. Without a budget it still passes and
    is counted in idemgate_unpriced_operations_total. A regeneration of an unpriced parent is
    refused the same way once the tenant has a budget."""
    strict, fallback = "unp-" + uuid.uuid4().hex[:8], "fbk-" + uuid.uuid4().hex[:8]
    gw = gateway_factory(providers=[
        provider(strict, mock.url, pricing=MODEL_PRICING),
        provider(fallback, mock.url, pricing=dict(MODEL_PRICING, fallback_per_output=500000))])
    budgeted, tok = new_tenant(database_url)
    free_name, free_tok = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", budgeted, "--day", "1.00").returncode == 0

    def submit(token, prov, body, k=None):
        return gw.submit(token, k or key(), body, route=f"{prov}/images/generations",
                         headers={"Prefer": "wait=20"})

    # Before a request is sent at all: a parent the free tenant made, then it gets a budget.
    parent = submit(free_tok, strict, {"prompt": "p", "model": "unlisted"})
    assert parent.status == 200, parent
    parent_id = parent.headers["x-idemgate-job-id"]

    k = key()
    r = submit(tok, strict, {"prompt": "ten", "model": "unlisted", "n": 10}, k)
    assert r.status == 402, r.body[:300]
    assert r.json()["type"] == "urn:idemgate:problem:unpriced-under-budget", r.json()
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{k}'") == [["0"]]
    # The listed model is priced and held by the budget as before.
    over = submit(tok, strict, {"prompt": "ten", "model": "listed", "n": 30})
    assert over.status == 402 and over.json()["type"].endswith("budget-exceeded"), over
    ok = submit(tok, strict, {"prompt": "one", "model": "listed", "n": 1})
    assert ok.status == 200, ok

    # A fallback price: the unlisted model is estimated by it and held by the budget.
    one = submit(tok, fallback, {"prompt": "one", "model": "unlisted", "n": 1})
    assert one.status == 200, one
    job = gw.job(tok, one.headers["x-idemgate-job-id"]).json()
    assert job["cost"] == {"currency": "USD", "estimate_micros": 500000, "micros": 500000}, job
    ten = submit(tok, fallback, {"prompt": "ten", "model": "unlisted", "n": 10})
    assert ten.status == 402 and ten.json()["type"].endswith("budget-exceeded"), ten

    # Without a budget an unpriced request passes, costs 0 and is counted.
    before = metric_value(gw, f'idemgate_unpriced_operations_total{{provider="{strict}",'
                              f'currency="USD"}}')
    free = submit(free_tok, strict, {"prompt": "free", "model": "unlisted", "n": 2})
    assert free.status == 200, free
    assert metric_value(gw, f'idemgate_unpriced_operations_total{{provider="{strict}",'
                            f'currency="USD"}}') == before + 1

    # The unpriced parent's regeneration, once its tenant has a budget: refused, not recorded.
    assert cli(database_url, "tenant", "budget", free_name, "--day", "1.00").returncode == 0
    rk = key()
    regen = gw.http.request("POST", f"/v1/jobs/{parent_id}/regenerate",
                            headers={"Authorization": f"Bearer {free_tok}",
                                     "Idempotency-Key": rk})
    assert regen.status == 402, regen.body[:300]
    assert regen.json()["type"] == "urn:idemgate:problem:unpriced-under-budget"
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key = '{rk}'") == [["0"]]
    sent = [e["client_ref"] for e in mock.ledger() if not e.get("replay")]
    assert len(sent) == 4, sent  # the parent, the listed one, the fallback one, the free one


def metric_value(gw, name):
    for line in gw.http.request("GET", "/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.mark.skipif(bool(CITUS_URL), reason="makes a plain PostgreSQL database of its own; "
                    "`migrate --citus` is what runs on Citus")
def test_a_migration_numbered_below_the_newest_applied_is_still_applied(database_url, psql):
    """Migration numbers are handed to branches worked on side by side (0008 here, while main
    reached 0010): a database already at a newer version still gets the lower ones it lacks."""
    name = "mig_" + uuid.uuid4().hex[:8]
    assert database_url.startswith("postgresql:///idemgate?"), database_url
    url = database_url.replace("postgresql:///idemgate?", f"postgresql:///{name}?", 1)
    psql(f"CREATE DATABASE {name}")
    try:
        newest = max(int(f[:4]) for f in os.listdir(os.path.join(ROOT, "migrations"))
                     if f[:4].isdigit())
        subprocess.run(["psql", url, "-qtAX", "-c",
                        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text "
                        "NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()); "
                        f"INSERT INTO schema_migrations VALUES ({newest + 1}, 'from the future')"],
                       check=True, capture_output=True)
        out = cli(url, "migrate")
        assert out.returncode == 0, out.stderr
        tables = subprocess.check_output(
            ["psql", url, "-qtAX", "-c", "SELECT count(*) FROM pg_tables WHERE tablename IN "
             "('operations', 'tenant_budgets')"], text=True).strip()
        assert tables == "2"
        # Run again: every migration is recorded once, nothing is applied twice.
        assert cli(url, "migrate").returncode == 0
        count = subprocess.check_output(["psql", url, "-qtAX", "-c",
                                         "SELECT count(*) FROM schema_migrations"], text=True)
        assert int(count) == len([f for f in os.listdir(os.path.join(ROOT, "migrations"))
                                  if f.endswith(".sql")]) + 1
    finally:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.skipif(bool(CITUS_URL), reason="makes a plain PostgreSQL database of its own; "
                    "`migrate --citus` is what runs on Citus")
def test_a_migration_changed_after_it_was_applied_stops_the_migration(database_url, psql):
    """A migration applied is never run again, so one edited in place after it was applied
    left the databases that ran the older text without the change, silently (a column renamed,
    a function's guard added: every such database behaved as before). Each migration's SHA-256
    is recorded as it is applied (or, applied by an older binary, on the first run that can) and
    compared at every run: a difference stops `migrate`, naming the migration."""
    name = "mig_" + uuid.uuid4().hex[:8]
    assert database_url.startswith("postgresql:///idemgate?"), database_url
    url = database_url.replace("postgresql:///idemgate?", f"postgresql:///{name}?", 1)
    psql(f"CREATE DATABASE {name}")

    def sql(text):
        return subprocess.check_output(["psql", url, "-qtAX", "-c", text], text=True).strip()
    try:
        assert cli(url, "migrate").returncode == 0
        assert sql("SELECT count(*) FROM schema_migrations WHERE sha256 ~ '^[0-9a-f]{64}$'") == \
            sql("SELECT count(*) FROM schema_migrations")
        # Applied by a binary older than the record: recorded as it is now, no complaint.
        sql("UPDATE schema_migrations SET sha256 = NULL WHERE version = 5")
        assert cli(url, "migrate").returncode == 0
        assert sql("SELECT sha256 IS NOT NULL FROM schema_migrations WHERE version = 5") == "t"
        # Its text differs from the one applied (here: the record says so); a later migration
        # this database lacks is still applied (the binary's statements need it).
        sql("UPDATE schema_migrations SET sha256 = repeat('0', 64) WHERE version = 5")
        newest = sql("SELECT max(version) FROM schema_migrations")
        sql(f"DELETE FROM schema_migrations WHERE version = {newest}")
        out = cli(url, "migrate")
        assert out.returncode != 0, out
        assert "migration_changed" in out.stderr and '"version":5' in out.stderr, out.stderr
        assert sql(f"SELECT count(*) FROM schema_migrations WHERE version = {newest}") == "1"
    finally:
        psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_no_trigger_nor_value_check_is_rebuilt_on_each_write(psql):
    # A trigger's WHEN clause and a CHECK constraint are parsed and compiled again by every
    # statement that writes the table (migration 0025). The statements that end an operation
    # settle its cost themselves (the budget tests above prove the amounts); the one check left
    # guards the state machine.
    # (the schema's own tables: a distributed database keeps triggers on its catalogs)
    assert psql("SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal "
                "AND tgrelid IN (SELECT oid FROM pg_class "
                "WHERE relnamespace = 'public'::regnamespace)") == []
    checks = psql("SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'c' "
                  "AND conrelid IN ('operations'::regclass, 'archive_outputs'::regclass, "
                  "'attempts'::regclass) ORDER BY 1, 2")
    assert checks == [["operations", "operations_state_check"]]


def test_jobs_priced_at_the_most_in_flight_never_overflow_the_budget(gateway_factory,
                                                                    database_url):
    """An estimate saturates at PRICE_MAX rather than overflow; the budget row sums the
    reservations of the jobs in flight (bigint). At 2^60 a job, the eighth such job in flight
    overflowed the row and every intake of the tenant answered 500 until they ended; at 2^53,
    twelve are recorded (none is sent: nothing listens at the provider's address)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    huge = provider("huge-price", nowhere,
                    pricing={"currency": "USD", "per_output": 9000000000000000})
    gw = gateway_factory(providers=[huge])
    name, token = new_tenant(database_url)
    assert cli(database_url, "tenant", "budget", name, "--in-flight", "50").returncode == 0
    for i in range(12):
        r = gw.submit(token, key(), {"prompt": f"p{i}", "n": 1000},
                      route="huge-price/images/generations")
        assert r.status == 202, (i, r.status, r.body[:300])
    b = usage(gw, token).json()["budgets"][0]
    assert b["in_flight"] == 12, b
