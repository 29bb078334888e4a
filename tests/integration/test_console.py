"""The operator console (issue 15 §1, issue 24 §7): its files are served from the binary with a
strict Content-Security-Policy, the admin reads it uses answer only the admin token, and a real
headless Chromium (Debian's, driven by playwright-core from npm: tests/console/console.mjs) signs
in on the overview (jobs in doubt, jobs of 24 h by state, 30-day spend by provider and model with
the budget line, time to complete), finds a job in review, resolves it, sees the state change,
resets a tripped provider, reads a priced tenant's spend and budget, pages through the jobs
newest first, finds one by its idempotency key and previews a job's archived outputs.
Screenshots of every step are written under build-test/console-shots/ (printed)."""

import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid

from conftest import GATEWAY_BIN, ROOT, provider, tenant_token
from test_archive import archived, images_entry
from test_async import SECRETS, SHIPPED_ASYNC, entry

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
CONSOLE_DIR = os.path.join(ROOT, "tests", "console")
SHOTS = os.path.join(ROOT, "build-test", "console-shots")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
       "media-src blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")


def admin(token=ADMIN_TOKEN):
    return {"Authorization": f"Bearer {token}"}


# The priced providers of the Spend view's test: micro-units per image delivered (USD), and per
# request (EUR), prices of the test's own so that the cost strings are unlike any other test's.
USD_PER_OUTPUT = 123457
EUR_PER_REQUEST = 2500000
# The model the priced USD jobs name: the overview's spend is by provider and model.
MODEL = "img-model-" + uuid.uuid4().hex[:6]


def money(micros):
    """Micro-units as the gateway writes them: 370371 → "0.370371"."""
    return f"{micros // 1000000}.{micros % 1000000:06d}"


class Console:
    """A gateway with the admin token and providers of names of their own (breakers are kept in
    the shared database by provider name): `rev`, whose hanging create ends in review, `unk`,
    whose hanging create stays unknown (reconciliation looks for 10 minutes), and `acct`, whose
    credential the mock refuses. Priced, more: `usd` and `eur`, with price tables in those
    currencies, and `img`, OpenAI's images profile whose outputs are archived."""

    def __init__(self, gateway_factory, mock, priced=False):
        tag = uuid.uuid4().hex[:8]
        self.tag = tag
        self.rev, self.acct, self.unk = f"rev-{tag}", f"acct-{tag}", f"unk-{tag}"
        self.usd, self.eur = f"spend-usd-{tag}", f"spend-eur-{tag}"
        self.cx = f"cx-{tag}"
        providers = [
            provider(self.rev, mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
                     reconcile={"strategy": "none", "window_seconds": 2}),
            provider(self.acct, mock.url, retry={"max_attempts": 5, "deadline_seconds": 60,
                                                 "base_ms": 100, "cap_ms": 500}),
            provider(self.unk, mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
                     reconcile={"strategy": "none", "window_seconds": 600})]
        if priced:
            providers += [
                provider(self.usd, mock.url,
                         pricing={"currency": "USD", "per_output": USD_PER_OUTPUT}),
                provider(self.eur, mock.url,
                         pricing={"currency": "EUR", "per_request": EUR_PER_REQUEST})]
            # Async, with a cancel endpoint and a price table (the shipped replicate profile).
            e, _ = entry("replicate", mock)
            e["name"] = self.cx
            self.cx_route = f"{self.cx}/{SHIPPED_ASYNC['replicate'][0]}"
            providers.append(e)
            img, self.img_route = images_entry(mock)
            self.img = img["name"]
            providers.append(img)
        self.gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers,
                                  env=SECRETS)

    def reset(self):
        r = self.gw.http.request("POST", f"/v1/admin/providers/{self.acct}/reset",
                                 headers=admin())
        assert r.status == 200, r


def review_job(c, token, mock):
    gw = c.gw
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, "console-" + uuid.uuid4().hex, {"prompt": "x"},
                  route=f"{c.rev}/images/generations")
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], {"review"}, timeout=30)
    assert job["state"] == "review", job
    return job["id"]


def trip(c, token, mock):
    gw = c.gw
    mock.script([{"status": 401}])
    r = gw.submit(token, "console-" + uuid.uuid4().hex, {"prompt": "x"},
                  route=f"{c.acct}/images/generations")
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], {"failed", "completed"})
    assert job["state"] == "failed", job
    # The dispatcher records the breaker just after it commits the failed job (attempt.c):
    # wait for it, a bounded while.
    deadline = time.monotonic() + 10
    while True:
        tripped = gw.http.request("GET", "/readyz").json()["tripped_providers"]
        if c.acct in [t["provider"] for t in tripped] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert c.acct in [t["provider"] for t in tripped], (tripped, job)


def test_console_files_are_served_with_a_strict_policy(gateway_factory, mock):
    gw = Console(gateway_factory, mock).gw
    page = gw.http.request("GET", "/console")
    assert page.status == 200, page
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    for r in [page] + [gw.http.request("GET", f"/console/{n}") for n in ("app.js", "app.css")]:
        assert r.status == 200, r
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    html = page.body.decode()
    # No inline script or style for the policy to refuse: every script and sheet is a file.
    assert "<script src=\"/console/app.js\"" in html and "<script>" not in html
    assert "style=" not in html and "<style" not in html
    # Byte for byte the files of the source tree.
    with open(os.path.join(ROOT, "console", "app.js"), "rb") as f:
        assert gw.http.request("GET", "/console/app.js").body == f.read()
    for missing in ("/console/nope.js", "/console/index.html", "/console/"):
        r = gw.http.request("GET", missing)
        assert r.status == 404 and r.json()["type"].endswith(":not-found"), (missing, r)


def test_console_admin_reads_need_the_admin_token(gateway_factory, mock, token):
    c = Console(gateway_factory, mock)
    gw = c.gw
    job_id = review_job(c, token, mock)
    trip(c, token, mock)
    try:
        check_admin_reads(c, job_id, token)
    finally:
        c.reset()


def check_admin_reads(c, job_id, token):
    gw = c.gw
    for path in ("/v1/admin/jobs", f"/v1/admin/jobs/{job_id}", "/v1/admin/providers"):
        assert gw.http.request("GET", path, headers=admin(token)).status == 401, path
        assert gw.http.request("GET", path).status == 401, path

    listed = gw.http.request("GET", f"/v1/admin/jobs?state=review&provider={c.rev}",
                             headers=admin()).json()["data"]
    assert [j["id"] for j in listed] == [job_id]
    assert gw.http.request("GET", f"/v1/admin/jobs?state=review&provider={c.acct}",
                           headers=admin()).json()["data"] == []
    everyone = gw.http.request("GET", "/v1/admin/jobs?limit=1000", headers=admin()).json()
    assert job_id in [j["id"] for j in everyone["data"]]
    for bad in ("state=bogus", "limit=0", "limit=1001", "limit=5x", "provider="):
        r = gw.http.request("GET", f"/v1/admin/jobs?{bad}", headers=admin())
        assert r.status == 400 and r.json()["type"].endswith(":invalid-query"), (bad, r)

    d = gw.http.request("GET", f"/v1/admin/jobs/{job_id}", headers=admin()).json()
    assert d["job"]["id"] == job_id and d["job"]["state"] == "review"
    creates = [a for a in d["attempts"] if a["kind"] == "create"]
    assert creates and creates[0]["outcome"] == "ambiguous" and creates[0]["decision"] == "unknown"
    assert creates[0]["http_status"] is None and creates[0]["started_at"] <= \
        creates[0]["finished_at"]
    assert [a["seq"] for a in d["attempts"]] == sorted(a["seq"] for a in d["attempts"])
    r = gw.http.request("GET", "/v1/admin/jobs/job_none", headers=admin())
    assert r.status == 404 and r.json()["type"].endswith(":job-not-found")

    providers = gw.http.request("GET", "/v1/admin/providers", headers=admin()).json()["data"]
    assert [p["name"] for p in providers] == [c.rev, c.acct, c.unk], "the configuration's order"
    acct = providers[1]
    assert acct["tripped"] is True and acct["http_status"] == 401 and acct["tripped_at"], acct
    assert "401" in acct["reason"]
    assert providers[0] == {"name": c.rev, "mode": "sync", "tripped": False,
                            "http_status": None, "reason": None, "tripped_at": None}


def spend(c, database_url):
    """A tenant with a USD budget (5 a day, no month limit, 3 in flight) completes two jobs on
    the USD provider (one image, then two) and one on the EUR provider; what the Spend view must
    show of it, as the browser test's SPEND, once the API says the same."""
    gw = c.gw
    name = "spend-" + uuid.uuid4().hex[:10]
    token = tenant_token(database_url, name)
    out = subprocess.run([GATEWAY_BIN, "tenant", "budget", name, "--currency", "USD", "--day",
                          "5", "--in-flight", "3"], capture_output=True, text=True,
                         env=dict(os.environ, DATABASE_URL=database_url))
    assert out.returncode == 0, out.stderr
    for route, body in ((f"{c.usd}/images/generations", {"prompt": "a", "n": 1,
                                                         "model": MODEL}),
                        (f"{c.usd}/images/generations", {"prompt": "b", "n": 2,
                                                         "model": MODEL}),
                        (f"{c.eur}/images/generations", {"prompt": "c", "n": 1})):
        r = gw.submit(token, "console-" + uuid.uuid4().hex, body, route=route,
                      headers={"Prefer": "wait=20"})
        assert r.status == 200, (r.status, r.body[:300])
    today = time.strftime("%Y-%m-%d", time.gmtime())
    cost = 3 * USD_PER_OUTPUT  # three images delivered
    doc = gw.http.request("GET", "/v1/usage?group_by=provider", headers=admin()).json()
    mine = [(r["provider"], r["currency"], r["jobs"], r["cost"]) for r in doc["data"]
            if r["tenant"] == name]
    assert mine == [(c.eur, "EUR", 1, money(EUR_PER_REQUEST)), (c.usd, "USD", 2, money(cost))], doc
    budget = [b for b in doc["budgets"] if b["tenant"] == name]
    # The EUR job does not count against the USD budget.
    assert budget == [{"tenant": name, "currency": "USD", "day_limit_micros": 5000000,
                       "day_limit": "5.000000", "day_used_micros": cost, "day_used": money(cost),
                       "month_limit_micros": None, "month_used_micros": cost,
                       "month_used": money(cost), "max_in_flight": 3, "in_flight": 0}], budget
    return {"tenant": name, "provider": c.usd, "route": f"{c.usd}/images/generations",
            "currency": "USD", "jobs": 2, "cost": money(cost), "day": today,
            "day_used": money(cost), "day_limit": "5.000000", "month_used": money(cost),
            "max_in_flight": 3, "currencies": ["EUR", "USD"], "model": MODEL}


def canceled_job(c, token, mock):
    """A running task cancelled through the API and ended by the provider: `canceled`, with its
    remote id and a settled cost. Returns what the Jobs view must show of it, as the API says."""
    gw = c.gw
    r = gw.submit(token, "console-" + uuid.uuid4().hex,
                  {"prompt": "stop me", "_mock": {"polls": 100000}}, route=c.cx_route)
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert gw.wait_state(token, job_id, {"accepted"}, timeout=15)["state"] == "accepted"
    cancel = gw.http.request("POST", f"/v1/jobs/{job_id}/cancel", "",
                             {"Authorization": f"Bearer {token}"})
    assert cancel.status == 202, cancel
    j = gw.wait_state(token, job_id, {"canceled", "failed", "completed"}, timeout=15)
    assert j["state"] == "canceled" and j["remote_id"], j
    cost = j["cost"]
    assert cost and cost["micros"] is not None and cost["micros"] > 0, j
    return {"id": job_id, "provider": j["provider"], "route": j["route"],
            "remote_id": j["remote_id"],
            "cost": f"{money(cost['micros'])} {cost['currency']} "
                    f"(estimate {money(cost['estimate_micros'])})"}


def unknown_job(c, token, mock):
    """A create that hangs on `unk`: sent without an answer, it stays unknown while
    reconciliation looks (10 minutes)."""
    gw = c.gw
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, "console-" + uuid.uuid4().hex, {"prompt": "x"},
                  route=f"{c.unk}/images/generations")
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], {"unknown"}, timeout=30)
    assert job["state"] == "unknown", job
    return job["id"]


PROMPT = "never-shown-" + uuid.uuid4().hex


def paged_tenant(c, database_url, n=12):
    """A tenant of its own with n completed jobs on `rev`: its ids and keys, newest first."""
    name = "pages-" + uuid.uuid4().hex[:10]
    token = tenant_token(database_url, name)
    jobs = []
    for i in range(n):
        key = f"page-{i:02d}-{uuid.uuid4().hex[:8]}"
        r = c.gw.submit(token, key, {"prompt": PROMPT}, route=f"{c.rev}/images/generations",
                        headers={"Prefer": "wait=20"})
        assert r.status == 200, (r.status, r.body[:300])
        jobs.append((r.headers["x-idemgate-job-id"], key))
    jobs.reverse()
    return {"tenant": name, "ids": [j for j, _ in jobs], "keys": [k for _, k in jobs],
            "route": f"{c.rev} / images/generations"}


def html_job(c, token, mock):
    """A job the provider refused with an HTML page (a proxy's, say): its stored answer is not
    JSON, so the admin view carries it as body_base64. Its id."""
    mock.script([{"fault": "html", "status": 400}])
    r = c.gw.submit(token, "console-" + uuid.uuid4().hex, {"prompt": "x"},
                    route=f"{c.rev}/images/generations")
    job = c.gw.wait_state(token, r.headers.get("x-idemgate-job-id") or r.json()["id"],
                          {"failed"}, timeout=30)
    assert job["state"] == "failed", job
    d = c.gw.http.request("GET", f"/v1/admin/jobs/{job['id']}", headers=admin()).json()
    assert "body_base64" in d["job"]["result"], d["job"]["result"]
    return job["id"]


def archived_job(c, token):
    """A job of OpenAI's images profile whose two outputs are archived: its id and their sizes."""
    r = c.gw.submit(token, "console-" + uuid.uuid4().hex,
                    {"prompt": PROMPT, "n": 2, "model": "gpt-image-1"}, route=c.img_route)
    # The profile waits for the image and answers as OpenAI would; the job is named in a header.
    assert r.status in (200, 202), (r.status, r.body[:300])
    j = archived(c.gw, token, r.headers["x-idemgate-job-id"])
    assert [o["state"] for o in j["archive"]] == ["archived", "archived"], j
    return {"id": j["id"], "bytes": [o["bytes"] for o in j["archive"]],
            "content_type": j["archive"][0]["content_type"]}


def admin_pages(gw, query):
    """Every page of GET /v1/admin/jobs?query, following next_cursor: the jobs, in order."""
    jobs, after = [], None
    for _ in range(1000):
        q = query + (f"&starting_after={after}" if after else "")
        page = gw.http.request("GET", f"/v1/admin/jobs?{q}", headers=admin())
        assert page.status == 200, page
        doc = page.json()
        jobs += doc["data"]
        if not doc["has_more"]:
            assert doc["next_cursor"] is None, doc
            return jobs
        after = doc["next_cursor"]
    raise AssertionError("no last page")


def test_overview_and_the_admin_job_pages(gateway_factory, mock, token, database_url):
    """GET /v1/admin/overview counts what the database holds: the jobs in doubt (unknown and
    review, with the oldest of each), the jobs of the last 24 h by state, the priced tenant's
    spend by provider and model with its budget, and the time to complete per provider; the
    admin job list pages every tenant's jobs newest first and finds one by key; the operator
    reads any tenant's archived output."""
    c = Console(gateway_factory, mock, priced=True)
    gw = c.gw
    spent = spend(c, database_url)
    pages = paged_tenant(c, database_url)
    arch = archived_job(c, token)
    unknown = unknown_job(c, token, mock)
    review = review_job(c, token, mock)

    r = gw.http.request("GET", "/v1/admin/overview", headers=admin())
    assert r.status == 200, r
    ov = r.json()
    assert PROMPT not in r.body.decode(), "a prompt in the overview"
    for state, job_id in (("unknown", unknown), ("review", review)):
        jobs = admin_pages(gw, f"state={state}&limit=50")
        listed = [j["id"] for j in jobs]
        d = ov["in_doubt"][state]
        assert job_id in listed and d["count"] == len(listed), (state, d, listed)
        # The oldest: the first sent (or created, when never sent), ties by id — the shared
        # database may hold other tests' jobs, sent in another order than they were created.
        first = min(jobs, key=lambda j: (j["first_sent_at"] or j["created_at"], j["id"]))
        assert d["oldest_job"] == first["id"] and d["oldest_age_seconds"] >= 0, (d, listed)
    by_state = ov["jobs_24h"]["by_state"]
    assert set(by_state) == {"prepared", "sending", "accepted", "unknown", "review",
                             "completed", "failed", "canceled"}
    assert by_state["unknown"] >= 1 and by_state["review"] >= 1
    assert by_state["completed"] >= 3 + len(pages["ids"]) + 1
    for st, n in by_state.items():
        assert sum(h["count"] for h in ov["jobs_24h"]["by_hour"] if h["state"] == st) == n, st

    today = time.strftime("%Y-%m-%d", time.gmtime())
    mine = sorted((r["provider"], r["model"] or "", r["currency"], r["jobs"], r["cost"], r["day"])
                  for r in ov["spend_30d"]["data"] if r["tenant"] == spent["tenant"])
    assert mine == sorted([(c.usd, MODEL, "USD", 2, spent["cost"], today),
                           (c.eur, "", "EUR", 1, money(EUR_PER_REQUEST), today)]), mine
    cost = 3 * USD_PER_OUTPUT
    budget = [b for b in ov["spend_30d"]["budgets"] if b["tenant"] == spent["tenant"]]
    assert budget == [{"tenant": spent["tenant"], "currency": "USD",
                       "day_limit_micros": 5000000, "day_limit": "5.000000",
                       "month_limit_micros": None, "day_used_micros": cost,
                       "day_used": money(cost), "month_used_micros": cost,
                       "month_used": money(cost)}], budget
    times = {t["provider"]: t for t in ov["time_to_complete_24h"]}
    for p, n in ((c.usd, 2), (c.eur, 1), (c.rev, len(pages["ids"])), (c.img, 1)):
        assert times[p]["jobs"] == n, (p, times.get(p))
        assert 0 <= times[p]["p50_seconds"] <= times[p]["p95_seconds"] < 60, times[p]
    assert c.unk not in times, "an unknown job is not completed"

    # Newest first, a page at a time, each job with its tenant.
    walked = admin_pages(gw, f"tenant={pages['tenant']}&limit=5")
    assert [j["id"] for j in walked] == pages["ids"]
    assert {j["tenant"] for j in walked} == {pages["tenant"]}
    assert [j["created_at"] for j in walked] == sorted((j["created_at"] for j in walked),
                                                       reverse=True)
    first = gw.http.request("GET", f"/v1/admin/jobs?tenant={pages['tenant']}&limit=5",
                            headers=admin()).json()
    assert first["has_more"] is True and first["next_cursor"]
    # Across tenants: the newest of all, whoever they belong to (other tests share this
    # database and may have made jobs since: this test's three appear in their order).
    everyone = gw.http.request("GET", "/v1/admin/jobs?limit=1000",
                               headers=admin()).json()["data"]
    ids = [j["id"] for j in everyone]
    assert [j["created_at"] for j in everyone] == sorted((j["created_at"] for j in everyone),
                                                         reverse=True)
    assert review in ids and unknown in ids and arch["id"] in ids, ids[:20]
    assert ids.index(review) < ids.index(unknown) < ids.index(arch["id"]), ids[:20]
    assert len({j["tenant"] for j in everyone}) >= 2
    # By key: the one job, found without naming its tenant; with another tenant, none.
    key = pages["keys"][4]
    found = gw.http.request("GET", f"/v1/admin/jobs?idempotency_key={key}",
                            headers=admin()).json()
    assert [(j["id"], j["tenant"], j["idempotency_key"]) for j in found["data"]] == \
        [(pages["ids"][4], pages["tenant"], key)] and found["has_more"] is False
    assert gw.http.request("GET", f"/v1/admin/jobs?idempotency_key={key}&tenant="
                           f"{spent['tenant']}", headers=admin()).json()["data"] == []
    for bad in ("bogus=1", "state=review&state=unknown", "starting_after=nope", "tenant=",
                "idempotency_key=", "limit=0"):
        r = gw.http.request("GET", f"/v1/admin/jobs?{bad}", headers=admin())
        assert r.status == 400 and r.json()["type"].endswith(":invalid-query"), (bad, r)
    assert gw.http.request("GET", "/v1/admin/overview?days=7", headers=admin()).status == 400
    for path in ("/v1/admin/overview", f"/v1/admin/jobs/{arch['id']}/outputs/0"):
        assert gw.http.request("GET", path, headers=admin(token)).status == 401, path
        assert gw.http.request("GET", path).status == 401, path

    # Any tenant's archived output, byte for byte what its tenant reads.
    d = gw.http.request("GET", f"/v1/admin/jobs/{arch['id']}", headers=admin()).json()
    assert [o["bytes"] for o in d["job"]["archive"]] == arch["bytes"], d["job"].get("archive")
    for n in (0, 1):
        mine_r = gw.http.request("GET", f"/v1/jobs/{arch['id']}/outputs/{n}",
                                 headers={"Authorization": f"Bearer {token}"})
        op = gw.http.request("GET", f"/v1/admin/jobs/{arch['id']}/outputs/{n}", headers=admin())
        assert op.status == 200 and op.body == mine_r.body and len(op.body) == arch["bytes"][n]
        assert op.headers["content-type"] == mine_r.headers["content-type"]
        assert op.headers["content-security-policy"] == "sandbox"
    r = gw.http.request("GET", f"/v1/admin/jobs/{arch['id']}/outputs/2", headers=admin())
    assert r.status == 404, r
    r = gw.http.request("GET", "/v1/admin/jobs/job_none/outputs/0", headers=admin())
    assert r.status == 404 and r.json()["type"].endswith(":job-not-found"), r


def test_console_in_a_headless_browser(gateway_factory, mock, token, database_url):
    chromium = subprocess.run([os.path.join(ROOT, "scripts", "browser-tools.sh")], check=True,
                              capture_output=True, text=True, timeout=1200).stdout.strip()
    c = Console(gateway_factory, mock, priced=True)
    gw = c.gw
    # Priced jobs first: the faults scripted below are for the next creates the mock receives.
    spent = spend(c, database_url)
    canceled = canceled_job(c, token, mock)
    pages = paged_tenant(c, database_url)
    arch = archived_job(c, token)
    unknown = unknown_job(c, token, mock)
    job_id = review_job(c, token, mock)
    html = html_job(c, token, mock)
    trip(c, token, mock)
    watch = {"unknown": unknown, "pages": pages, "archived": arch, "html": html}
    try:
        drive_browser(c, job_id, chromium, spent, canceled, watch)
    finally:
        c.reset()


def drive_browser(c, job_id, chromium, spent, canceled, watch):
    gw = c.gw
    shutil.rmtree(SHOTS, ignore_errors=True)
    print(f"\nconsole screenshots: {SHOTS}")
    run = subprocess.run(["node", os.path.join(CONSOLE_DIR, "console.mjs")], cwd=CONSOLE_DIR,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, GATEWAY=f"http://127.0.0.1:{gw.port}",
                                  ADMIN_TOKEN=ADMIN_TOKEN, JOB=job_id, TRIPPED=c.acct,
                                  PROVIDER=c.rev, SPEND=json.dumps(spent),
                                  CANCELED=json.dumps(canceled), WATCH=json.dumps(watch),
                                  SHOTS=SHOTS,
                                  CHROMIUM=chromium))
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "every step passed" in run.stdout

    # What the browser did, as the API sees it.
    j = gw.http.request("GET", f"/v1/admin/jobs/{job_id}", headers=admin()).json()["job"]
    assert j["state"] == "completed" and j["remote_id"] == "task_seen_in_console", j
    assert j["resolution"]["outcome"] == "found" and "console-test" in j["resolution"]["by"]
    tripped = gw.http.request("GET", "/readyz").json()["tripped_providers"]
    assert c.acct not in [t["provider"] for t in tripped], tripped
    assert len([n for n in os.listdir(SHOTS) if n.endswith(".png")]) >= 14
    # The token never reached the gateway's log (it is sent as a header, never in a URL).
    assert ADMIN_TOKEN not in gw.log()
