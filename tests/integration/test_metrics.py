"""GET /metrics: Prometheus text, bounded labels, and safety counters that move when their event
happens. Logs: one JSON object per line, never a prompt, token, key or provider secret."""

import hashlib
import json
import os
import re
import subprocess
import time
import uuid

from conftest import GATEWAY_BIN, Http, free_port, provider


def scrape(gw):
    r = gw.http.request("GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values, r.body.decode()


def test_a_scrape_counts_the_waiting_states_along_their_indexes(gateway, psql):
    """/metrics counts prepared, sending, accepted, unknown and review at every scrape: each
    count must be able to run along a partial index of its state (seq scans off, the planner
    still takes one where no index serves), never over the whole history. Review had none
    before migration 0022: a scrape at 1 M operations read them all (0.4-0.6 s)."""
    del gateway  # migrated
    out = subprocess.run([GATEWAY_BIN, "statements"], capture_output=True, text=True, check=True)
    sql = {s["name"]: s["sql"] for s in map(json.loads, out.stdout.splitlines())}["gauges"]
    text = "\n".join("\t".join(r) for r in psql("SET enable_seqscan = off; "
                                                   "EXPLAIN (FORMAT JSON) " + sql))
    plan = json.loads(text)[0]["Plan"]
    partial = {r[0]: r[1] for r in psql("SELECT indexname, indexdef FROM pg_indexes "
                                         "WHERE tablename = 'operations'")}

    def nodes(n):
        yield n
        for child in n.get("Plans", []):
            yield from nodes(child)

    def indexes_under(n):  # a bitmap heap scan reads along the bitmap index scans beneath it
        return [c["Index Name"] for c in nodes(n) if c["Node Type"] == "Bitmap Index Scan"]

    # Each count reads operations once: along an index, or a bitmap of indexes, that holds only
    # its state's rows (operations_by_state leads with the tenant: a count of one state along it
    # reads every entry). The planner picks plain or bitmap scans by the table's statistics.
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "operations"]
    assert len(scans) == 5, text
    for n in scans:
        used = ([n["Index Name"]] if "Index Name" in n
                else indexes_under(n) if n["Node Type"] == "Bitmap Heap Scan" else [])
        assert used, (n["Node Type"], text)
        for index in used:
            assert "WHERE (state = '" in partial.get(index, ""), (n["Node Type"], index, text)


def test_metrics_move_with_their_events(gateway_factory, token, mock):
    gw = gateway_factory(providers=[
        provider("m", mock.url, auth={"header": "Authorization", "prefix": "Bearer ",
                                      "secret_env": "MOCK_IMAGES_API_KEY"},
                 timeouts={"connect_ms": 1000, "total_ms": 1000},
                 reconcile={"strategy": "none", "window_seconds": 2})])
    before, _ = scrape(gw)
    secret_prompt = "canary-prompt-" + uuid.uuid4().hex
    k = "canary-key-" + uuid.uuid4().hex
    ok = gw.submit(token, k, {"prompt": secret_prompt}, route="m/images/generations")
    gw.wait_state(token, ok.json()["id"], {"completed"})
    mock.script([{"fault": "hang"}])
    hang = gw.submit(token, "hang-" + uuid.uuid4().hex, {"prompt": "x"},
                     route="m/images/generations")
    gw.wait_state(token, hang.json()["id"], {"review"}, timeout=20)
    mock.script([{"status": 401}])
    bad = gw.submit(token, "acct-" + uuid.uuid4().hex, {"prompt": "x"},
                    route="m/images/generations")
    gw.wait_state(token, bad.json()["id"], {"failed"})
    gw.submit(token, k, {"prompt": "different"}, route="m/images/generations")  # 422
    after, text = scrape(gw)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta('idemgate_http_requests_total{route="intake",status="2xx"}') >= 3
    assert delta('idemgate_http_requests_total{route="intake",status="4xx"}') == 1
    assert delta('idemgate_attempts_total{provider="m",outcome="success"}') == 1
    assert delta('idemgate_attempts_total{provider="m",outcome="ambiguous"}') == 1
    assert delta('idemgate_attempts_total{provider="m",outcome="rejected_account"}') == 1
    # Upstream latency: each create is one call; time to complete: the one completed job.
    creates = sum(delta(n) for n in after if n.startswith('idemgate_attempts_total{provider="m",'))
    assert creates == 3
    assert delta('idemgate_upstream_duration_seconds_count{provider="m"}') == creates
    assert delta('idemgate_job_duration_seconds_count{provider="m"}') == 1
    assert after['idemgate_job_duration_seconds_bucket{provider="m",le="+Inf"}'] == 1
    assert delta("idemgate_ambiguous_submissions_total") == 1
    assert delta("idemgate_review_entered_total") == 1
    assert after['idemgate_operations{state="review"}'] >= 1
    # A gauge for every state, 0 when none: the terminal canceled included (issue 21 item 1).
    states = ("prepared", "sending", "accepted", "unknown", "review", "completed", "failed",
              "canceled")
    assert [s for s in states if f'idemgate_operations{{state="{s}"}}' not in after] == []
    assert after["idemgate_review_backlog"] >= 1
    assert after['idemgate_provider_tripped{provider="m"}'] == 1
    check_exposition(text)  # the tripped provider's row sits in its own family
    assert after["idemgate_database_up"] == 1
    assert after['idemgate_http_request_duration_seconds_count{route="intake"}'] >= 4
    # Bounded labels: no key, token, job id or prompt ever appears in the metrics.
    for needle in (k, token, ok.json()["id"], secret_prompt, "sk-mock-secret"):
        assert needle not in text
    labels = set(re.findall(r'(\w+)="', text))
    assert labels <= {"route", "status", "le", "outcome", "state", "provider", "result",
                      "reason", "source", "period", "version", "revision", "statement"}, labels

    log = gw.log()
    lines = [l for l in log.splitlines() if l.strip()]
    events = [json.loads(l) for l in lines]  # every line is one JSON object
    assert all("ts" in e and "level" in e and "event" in e for e in events)
    assert any(e["event"] == "http" and e.get("request_id") for e in events)
    for needle in (secret_prompt, token, k, "sk-mock-secret"):
        assert needle not in log, needle


def test_webhook_refusals_are_counted(gateway_factory, mock):
    gw = gateway_factory(providers=[provider(
        "hooked", mock.url, webhook={"verify": "hmac_sha256_hex", "secret_env": "HOOK_SECRET",
                                     "signature_header": "X-Signature", "task_id": "$.id"})],
        env={"HOOK_SECRET": "s3cret"})
    before, _ = scrape(gw)
    r = gw.http.request("POST", "/v1/webhooks/hooked", '{"id":"t1"}', {"X-Signature": "00"})
    assert r.status == 401
    after, _ = scrape(gw)
    assert after["idemgate_webhook_refused_total"] - before["idemgate_webhook_refused_total"] == 1


# ---- issue 21 item 11: metrics on a listener of their own, optionally behind a token --------

def sha256_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


def test_metrics_on_own_listener(gateway_factory, token):
    """metrics_listen: /metrics, /healthz and /readyz on a second address, nothing of the API
    there; the API's listener answers /metrics 404 (like any path it does not serve) except to
    the admin token (the console's safety view), and still answers its probes."""
    admin = "adm-" + uuid.uuid4().hex
    mport = free_port()
    gw = gateway_factory(metrics_listen=f"127.0.0.1:{mport}",
                         admin_token_sha256=sha256_hex(admin))
    m = Http(f"http://127.0.0.1:{mport}")
    r = m.request("GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
    assert "idemgate_database_up 1" in r.body.decode()
    assert m.request("HEAD", "/metrics").status == 200
    assert m.request("GET", "/healthz").status == 200
    assert m.request("GET", "/readyz").json()["ready"] is True
    # Nothing of the API on the metrics listener, whatever the credentials.
    auth = {"Authorization": f"Bearer {token}"}
    assert m.request("GET", "/v1/jobs", headers=auth).status == 404
    assert m.request("POST", "/v1/providers/mock-images/images/generations", "{}",
                     dict(auth, **{"Idempotency-Key": "k"})).status == 404
    assert m.request("GET", "/console").status == 404
    assert m.request("POST", "/metrics", "").status == 405
    # The API's listener: /metrics is not there for tenants or anonymous callers...
    for headers in ({}, auth):
        r = gw.http.request("GET", "/metrics", headers=headers)
        assert r.status == 404, r
        assert r.json()["type"] == "urn:idemgate:problem:not-found"
        assert b"idemgate_" not in r.body
    # ...only for the operator's console, with the admin token; the probes stay.
    r = gw.http.request("GET", "/metrics", headers={"Authorization": f"Bearer {admin}"})
    assert r.status == 200 and "idemgate_database_up" in r.body.decode()
    assert gw.http.request("GET", "/healthz").status == 200
    assert gw.http.request("GET", "/readyz").status == 200
    # Nor does the API's /readyz tell which providers are tripped or which statements fail
    # (before, it listed them to anyone); the metrics listener's does, and the admin token.
    ready = {"": gw.http.request("GET", "/readyz").json(),
             "tenant": gw.http.request("GET", "/readyz", headers=auth).json(),
             "admin": gw.http.request("GET", "/readyz",
                                      headers={"Authorization": f"Bearer {admin}"}).json(),
             "metrics": m.request("GET", "/readyz").json()}
    for who, body in ready.items():
        assert body["ready"] is True, (who, body)
        shown = "tripped_providers" in body and "failing_statements" in body
        assert shown == (who in ("admin", "metrics")), (who, body)
    # The metrics listener's requests are counted and logged like the API's.
    values, _ = scrape_at(m)
    assert values['idemgate_http_requests_total{route="metrics",status="2xx"}'] >= 3
    events = [json.loads(line) for line in gw.log().splitlines() if line.strip()]
    assert any(e["event"] == "metrics_listening" and e["port"] == mport for e in events)
    assert any(e["event"] == "http" and e.get("listener") == "metrics" for e in events)


def test_metrics_token(gateway_factory, token):
    """metrics_token_sha256: /metrics answers only the metrics token (or the admin token), on
    the API's listener and on the metrics listener alike; the probes need none; the token is
    never logged."""
    secret = "mt-" + uuid.uuid4().hex
    admin = "adm-" + uuid.uuid4().hex
    mport = free_port()
    settings = {"metrics_token_sha256": sha256_hex(secret), "admin_token_sha256": sha256_hex(admin)}
    plain = gateway_factory(**settings)
    split = gateway_factory(metrics_listen=f"127.0.0.1:{mport}", **settings)
    for http in (plain.http, Http(f"http://127.0.0.1:{mport}")):
        for headers in ({}, {"Authorization": f"Bearer {token}"},
                        {"Authorization": "Bearer " + secret + "x"},
                        {"Authorization": secret}):
            r = http.request("GET", "/metrics", headers=headers)
            assert r.status == 401, (headers, r)
            assert r.json()["type"] == "urn:idemgate:problem:unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert b"idemgate_" not in r.body
        for t in (secret, admin):
            r = http.request("GET", "/metrics", headers={"Authorization": f"Bearer {t}"})
            assert r.status == 200 and "idemgate_database_up 1" in r.body.decode(), r
        assert http.request("GET", "/healthz").status == 200
        # The probe answers anyone; which providers are tripped and which statements fail only
        # whoever may read /metrics there (before, the metrics listener told them to anyone).
        for t, shown in ((None, False), (token, False), (secret, True), (admin, True)):
            h = {"Authorization": f"Bearer {t}"} if t else {}
            r = http.request("GET", "/readyz", headers=h)
            assert r.status == 200 and r.json()["ready"] is True, r
            assert ("tripped_providers" in r.json()) == shown, (t == secret, t == admin, r)
    for gw in (plain, split):
        assert secret not in gw.log() and admin not in gw.log()
    # A malformed hash is a configuration error, not a metrics endpoint open to anyone.
    bad = subprocess.run([GATEWAY_BIN, "check-config"], capture_output=True, text=True,
                         env=dict(os.environ, IDEMGATE_METRICS_TOKEN_SHA256=secret))
    assert bad.returncode == 1 and "metrics_token_sha256" in bad.stderr
    assert secret not in bad.stderr + bad.stdout
    # So is the admin's, written as `sha256sum` prints it (the digest, two spaces and "-"): it
    # was accepted and the admin API answered 401 to the right token ever after.
    bad = subprocess.run([GATEWAY_BIN, "check-config"], capture_output=True, text=True,
                         env=dict(os.environ,
                                  IDEMGATE_ADMIN_TOKEN_SHA256=sha256_hex(admin) + "  -"))
    assert bad.returncode == 1 and "admin_token_sha256" in bad.stderr


def scrape_at(http):
    r = http.request("GET", "/metrics")
    assert r.status == 200, r
    values = {}
    for line in r.body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values, r.body.decode()


# ---- issue 24 item 10: metrics a platform team can use ------------------------------------

from test_archive import images_entry  # noqa: E402  (a priced provider that archives)
from test_async import SECRETS  # noqa: E402

MONITORING = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "kubernetes",
                          "monitoring")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset", "inf", "nan"}


def check_exposition(text):
    """Every family once, whole: its # HELP, then its # TYPE, then all of its samples, none of
    them after another family began (a family split in two is read by a standard parser as a
    second, untyped family). Returns {family: type}."""
    types, current, helped = {}, None, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped = line.split(" ", 3)[2]
            assert helped not in types, f"second # HELP for {helped}"
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"second # TYPE for {name}"
            assert helped == name, f"# TYPE {name} without its # HELP just before"
            types[name], current = kind, name
        elif line.strip():
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            fam = name
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[:-len(suffix)]
                if name.endswith(suffix) and types.get(base) == "histogram":
                    fam = base
            assert fam == current, f"{line!r} outside the block of its family ({current})"
    return types


def metric_names(expr):
    """The metric names a PromQL expression reads: what is left once strings, label matchers,
    ranges, grouping clauses, numbers, function calls and keywords are taken out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\boffset\s+-?(\d+[smhdwy]+)+", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0).lower() in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def shipped_expressions():
    """{where: expr} for every alert of the PrometheusRule and every target of the dashboard."""
    import yaml
    out = {}
    with open(os.path.join(MONITORING, "prometheusrule.yaml")) as f:
        rule = yaml.safe_load(f)
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            out[f"rule {r.get('alert') or r.get('record')}"] = r["expr"]
            for text in r.get("annotations", {}).values():  # queries inside templates
                for q in re.findall(r'query "((?:[^"\\]|\\.)*)"', text):
                    out[f"rule {r['alert']} annotation"] = q
    with open(os.path.join(MONITORING, "idemgate-dashboard.json")) as f:
        dash = json.load(f)
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out[f"panel {p['title']} {t['refId']}"] = t["expr"]
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            out[f"variable {v['name']}"] = re.sub(r"label_values\((\w+),.*\)", r"\1", q["query"])
    return out


def test_metric_names_are_read_from_promql():
    """The extractor the names test relies on: names only, not functions, labels or keywords."""
    assert metric_names('sum by (le, provider) (rate(a_bucket{job=~"$job",x="y(z)"}'
                        '[$__rate_interval])) / 1e6 > 0.9 and on() b_total offset 5m') == \
        {"a_bucket", "b_total"}
    assert metric_names("time() - process_start_time_seconds") == {"process_start_time_seconds"}
    assert metric_names("max(idemgate_x) > 0 unless up == 0") == {"idemgate_x", "up"}


def priced_archiving_gateway(gateway_factory, mock, **settings):
    e, route = images_entry(mock)
    gw = gateway_factory(providers=[e], env=dict(SECRETS), **settings)
    return gw, e["name"], route


def test_promtool_checks_the_real_metrics(gateway_factory, token, mock):
    """`promtool check metrics` (Prometheus's own parser and linter) accepts what a running
    gateway serves, after real traffic: provider histograms, spend, the archive, the database
    gauges. Every family once and whole (idemgate_operations was split around
    idemgate_review_backlog; the spend families were interleaved)."""
    gw, name, route = priced_archiving_gateway(gateway_factory, mock)
    r = gw.submit(token, "pt-" + uuid.uuid4().hex, {"prompt": "x", "n": 1}, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    gw.wait_state(token, r.json()["id"], {"completed"})
    _, text = scrape(gw)
    types = check_exposition(text)
    for fam, kind in (("idemgate_operations", "gauge"), ("idemgate_attempts_total", "counter"),
                      ("idemgate_upstream_duration_seconds", "histogram"),
                      ("idemgate_job_duration_seconds", "histogram"),
                      ("idemgate_build_info", "gauge"), ("process_cpu_seconds_total", "counter"),
                      ("process_resident_memory_bytes", "gauge"), ("process_open_fds", "gauge"),
                      ("process_start_time_seconds", "gauge"), ("process_max_fds", "gauge"),
                      ("idemgate_budget_used_ratio", "gauge"),
                      ("idemgate_archive_pending_copies", "gauge"),
                      ("idemgate_archive_oldest_pending_seconds", "gauge")):
        assert types.get(fam) == kind, (fam, types.get(fam))
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                         text=True)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), \
        (out.stdout, out.stderr)
    # The build says what it is; the process figures are this process's.
    m = re.search(r'^idemgate_build_info\{version="([^"]+)",revision="([^"]+)"\} 1$', text, re.M)
    assert m, text[:2000]
    # Built from this checkout (the Makefile passes the commit): a commit of this repository.
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], capture_output=True,
                            text=True, cwd=os.path.dirname(__file__))
    if inside.returncode == 0:
        assert re.fullmatch(r"[0-9a-f]{12}", m.group(2)), m.group(2)
        assert subprocess.run(["git", "cat-file", "-e", m.group(2) + "^{commit}"],
                              cwd=os.path.dirname(__file__)).returncode == 0, m.group(2)
    values, _ = scrape(gw)
    with open(f"/proc/{gw.proc.pid}/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = int(next(l for l in f if l.startswith("btime ")).split()[1])
    start = btime + start_ticks / os.sysconf("SC_CLK_TCK")
    assert abs(values["process_start_time_seconds"] - start) < 0.02
    assert 3 <= values["process_open_fds"] <= values["process_max_fds"]
    assert values["process_resident_memory_bytes"] > 1 << 20


def test_provider_series_exist_before_any_job(gateway_factory, mock):
    """A priced provider's spend is a 0 from the start, not a missing series (increase() and
    the dashboard's spend panels need the 0); attempts and both histograms are there at 0 per
    configured provider, and its tripped gauge is 0."""
    gw, name, _ = priced_archiving_gateway(gateway_factory, mock)
    values, _ = scrape(gw)
    for series in (f'idemgate_spend_micros_total{{provider="{name}",currency="USD"}}',
                   f'idemgate_settled_operations_total{{provider="{name}",currency="USD"}}',
                   f'idemgate_unpriced_operations_total{{provider="{name}",currency="USD"}}',
                   f'idemgate_attempts_total{{provider="{name}",outcome="success"}}',
                   f'idemgate_upstream_duration_seconds_count{{provider="{name}"}}',
                   f'idemgate_job_duration_seconds_count{{provider="{name}"}}',
                   f'idemgate_provider_tripped{{provider="{name}"}}'):
        assert values.get(series) == 0, series


def test_budget_and_archive_backlog_gauges(gateway_factory, token, mock, psql):
    """idemgate_budget_used_ratio: the most used share of any tenant's amount limit today and
    this month; idemgate_archive_pending_copies and _oldest_pending_seconds: the copies still to
    be made (no archive worker runs here), read with the minute's terminal counts."""
    gw, name, route = priced_archiving_gateway(gateway_factory, mock, archive_workers=0)
    r = gw.submit(token, "bg-" + uuid.uuid4().hex, {"prompt": "x", "n": 1}, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job = gw.wait_state(token, r.json()["id"], {"completed"})
    assert job["state"] == "completed", job
    [[tenant]] = psql("SELECT tenant_id FROM operations WHERE id = '%s'" % job["id"])
    psql("INSERT INTO tenant_budgets (tenant_id, currency, day_limit_micros, month_limit_micros, "
         "day, day_micros, month, month_micros) VALUES (%s, 'USD', 1000000, 100000000000, "
         "(now() AT TIME ZONE 'UTC')::date, 999000, "
         "date_trunc('month', now() AT TIME ZONE 'UTC')::date, 999000)" % tenant)
    values, _ = scrape(gw)  # the gateway's first scrape: the minute's figures are read now
    assert values['idemgate_budget_used_ratio{period="day"}'] >= 0.999
    assert 0 <= values['idemgate_budget_used_ratio{period="month"}'] <= 1
    assert values["idemgate_archive_pending_copies"] >= 1
    # Milliseconds, not whole seconds: the copy was planned a moment before this scrape.
    assert values["idemgate_archive_oldest_pending_seconds"] > 0
    psql("DELETE FROM tenant_budgets WHERE tenant_id = %s" % tenant)


def test_rules_and_dashboard_use_only_exported_names(gateway_factory, mock, token):
    """Every metric name an alert or a dashboard panel reads is one the gateway exports (a
    renamed metric would silently blank a panel or mute an alert); the rules pass
    `promtool check rules` and their unit tests (scripts/check-monitoring.sh)."""
    gw, _, _ = priced_archiving_gateway(gateway_factory, mock)
    _, text = scrape(gw)
    exported = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", l).group(0)
                for l in text.splitlines() if l.strip() and not l.startswith("#")}
    used = {}
    for where, expr in shipped_expressions().items():
        for n in metric_names(expr):
            used.setdefault(n, []).append(where)
    assert len(used) >= 25, sorted(used)
    # (`up`: Prometheus's own series of each scrape, not the gateway's)
    missing = {n: w for n, w in used.items() if n not in exported and n != "up"}
    assert not missing, missing
    for name in ("idemgate_review_backlog", "idemgate_archive_oldest_pending_seconds",
                 "idemgate_provider_tripped", "idemgate_unpriced_operations_total",
                 "idemgate_budget_used_ratio"):
        assert any(w.startswith("rule ") for w in used.get(name, [])), name
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = subprocess.run([os.path.join(root, "scripts", "check-monitoring.sh")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
