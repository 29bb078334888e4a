"""Output archival (issue 13 §1): every shipped profile's outputs (URL, base64, content
endpoint) are copied into the content-addressed archive and served by
GET /v1/jobs/{id}/outputs/{n}; a kill -9 mid-copy leaves no partial object and the copy
resumes; an expired URL, a wrong Content-Length, a redirect to another host and a private
address are each refused or counted, never silently dropped."""

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid

import pytest

from conftest import ROOT, pg_proxy, settle_tombstones
from test_async import SECRETS, SHIPPED_ASYNC, body, entry
from test_group_commit import execute, rows_args, statement_sql

sys.path.insert(0, os.path.join(ROOT, "tests"))
from chaos.client import fan_out  # noqa: E402

# A fetch's timeout under the tests' short leases (a claim's lease holds its longest fetch).
MOCK_ARCHIVE = {"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True,
                "timeout_ms": 3000}
PROFILES = os.path.join(ROOT, "deploy", "providers")


def arch_entry(name, mock, archive=None, **over):
    """A shipped profile pointed at the mock, under a provider name of its own: the gateways of
    other tests (one database) never plan or claim this test's outputs, nor this one theirs."""
    e, route = entry(name, mock, **over)
    unique = e["name"] + uuid.uuid4().hex[:6]
    route = unique + route[len(e["name"]):]
    e["name"] = unique
    a = dict(MOCK_ARCHIVE)
    # Keep the profile's own paths (Vertex's bytesBase64Encoded) under the mock's hosts.
    with open(os.path.join(PROFILES, name + ".json")) as f:
        a = dict(json.load(f).get("archive", {}), **a)
    a.update(archive or {})
    e["archive"] = a
    return e, route


def images_entry(mock, archive=None):
    a = dict(MOCK_ARCHIVE, **(archive or {}))
    name = "openaiimages" + uuid.uuid4().hex[:6]
    return {"name": name, "profile": os.path.join(PROFILES, "openai-images.json"),
            "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 5000},
            "archive": a}, name + "/images/generations"


def start(gateway_factory, tmp_path, entries, **settings):
    env = dict(SECRETS, **settings.pop("env", {}))
    settings.setdefault("archive_dir", str(tmp_path / "archive"))
    return gateway_factory(providers=entries, env=env, **settings)


def archived(gw, token, job_id, timeout=30, states=("archived",)):
    """The job once every output's archive state is in states (or the deadline passed)."""
    deadline = time.monotonic() + timeout
    while True:
        j = gw.job(token, job_id).json()
        arch = j.get("archive")
        if j["state"] in ("failed", "review") or time.monotonic() > deadline:
            return j
        if arch and all(o["state"] in states for o in arch):
            return j
        time.sleep(0.1)


def get_output(gw, token, job_id, n, headers=None):
    h = {"Authorization": f"Bearer {token}"}
    h.update(headers or {})
    return gw.http.request("GET", f"/v1/jobs/{job_id}/outputs/{n}", headers=h)


def objects(archive_dir):
    root = os.path.join(archive_dir, "objects")
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[f] = fh.read()
    return out


def check_archive(gw, token, job_id, archive_dir, n_outputs):
    j = archived(gw, token, job_id)
    assert j["state"] == "completed", j
    arch = j["archive"]
    assert len(arch) == n_outputs and all(o["state"] == "archived" for o in arch), arch
    stored = objects(archive_dir)
    for o in arch:
        r = get_output(gw, token, job_id, o["index"])
        assert r.status == 200, r
        assert hashlib.sha256(r.body).hexdigest() == o["sha256"] == r.headers["etag"].strip('"')
        assert len(r.body) == o["bytes"] and o["bytes"] > 0
        # Content-addressed: the object's name is the hash of its bytes.
        assert stored[o["sha256"]] == r.body
    return j


@pytest.mark.parametrize("name", sorted(SHIPPED_ASYNC))
def test_every_shipped_async_profile_archives(gateway_factory, token, mock, tmp_path, name):
    e, route = arch_entry(name, mock)
    gw = start(gateway_factory, tmp_path, [e])
    outs = 1 if name in ("openai-videos", "luma") else 2
    # respond-async: the shipped OpenAI profiles wait by default (for SDKs); this is the job.
    r = gw.submit(token, "arch-" + uuid.uuid4().hex, body(polls=1, outputs=outs), route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    j = check_archive(gw, token, r.json()["id"], str(tmp_path / "archive"), outs)
    kinds = {o["kind"] for o in j["archive"]}
    assert kinds == {"endpoint" if name == "openai-videos" else
                     "b64" if name == "vertex-veo" else "url"}, j["archive"]


def test_a_copy_may_run_its_whole_timeout_past_the_lease(gateway_factory, token, mock, tmp_path):
    """Each fetch was cut at what its claim's lease had left, and nothing renews an archive
    lease: with lease_seconds under archive.timeout_ms (the defaults: 180 s and 300 s) every copy
    longer than the lease failed "Timeout was reached" and was fetched again from its first byte
    until its URL expired. The archive's claims now hold the longest fetch and 5 s more: a 5 s
    fetch under a 4 s lease is copied at its first attempt."""
    e, route = arch_entry("replicate", mock, archive={"timeout_ms": 15000},
                          timeouts={"connect_ms": 1000, "total_ms": 1500})
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 5000}))
    gw = start(gateway_factory, tmp_path, [e], lease_seconds=4)
    r = gw.submit(token, "slow-cdn-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    j = archived(gw, token, job_id, timeout=40, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "archived" and o["attempts"] == 1, o
    assert get_output(gw, token, job_id, 0).status == 200


def test_a_stopping_replica_gives_its_copies_in_flight_back(gateway_factory, token, mock,
                                                             tmp_path, psql):
    """A replica told to stop (SIGTERM) held its shutdown until every archive copy in flight
    ended — up to archive.timeout_ms, 5 minutes by default, past the grace period of every
    shipped deployment (150 s, 120 s, 40 s): killed mid-copy, its claim's lease then ran out
    before another replica could start again. Its copies in flight are given back at once:
    pending, unowned, due now for another replica."""
    e, route = arch_entry("replicate", mock, archive={"timeout_ms": 60000})
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 30000}))  # a slow CDN
    gw = start(gateway_factory, tmp_path, [e], lease_seconds=90)
    r = gw.submit(token, "stop-copy-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    q = f"SELECT count(*) FROM archive_outputs WHERE op_id = '{job_id}' AND lease_owner IS NOT NULL"
    deadline = time.monotonic() + 15
    while psql(q) != [["1"]]:  # claimed (born with the result): its copy is on its way
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.05)
    time.sleep(1)  # the GET has left: the slow CDN holds it
    gw.proc.terminate()
    gw.proc.wait(timeout=90)
    row = psql("SELECT state, lease_owner IS NULL, last_error FROM archive_outputs "
               f"WHERE op_id = '{job_id}'")
    assert row == [["pending", "t", "this replica stopped during the copy: given back"]], row
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 0}))
    other = start(gateway_factory, tmp_path, [e])
    j = archived(other, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    assert j["archive"][0]["state"] == "archived", j["archive"]


def test_a_read_never_shows_a_stale_archive(gateway_factory, token, mock, tmp_path, psql):
    # Cached views live for an hour here: a completed job's view must not be cached by id while
    # its archive can still change, or a client watching the copy would read "[]" or "pending"
    # long after the bytes are stored.
    e, route = arch_entry("replicate", mock)
    # A slow CDN: the copies take a second, so that the job is read completed while its archive
    # is still unsettled (a fast copy can settle before the first read sees the job completed).
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 1000}))
    gw = start(gateway_factory, tmp_path, [e], job_cache_ttl_ms=3600000)
    r = gw.submit(token, "stale-" + uuid.uuid4().hex, body(polls=1, outputs=2), route=route)
    job_id = r.json()["id"]
    deadline = time.monotonic() + 30
    seen_unsettled = False
    while True:
        j = gw.job(token, job_id).json()
        if j["state"] == "completed":
            arch = j.get("archive") or []
            if arch and all(o["state"] == "archived" for o in arch):
                break
            seen_unsettled = True
        assert time.monotonic() < deadline, j
        time.sleep(0.05)
    assert seen_unsettled, "the job was read while its archive was still unsettled"
    rows = psql(f"SELECT state FROM archive_outputs WHERE op_id = '{job_id}'")
    assert [x[0] for x in rows] == ["archived", "archived"]
    # Settled: from now on the view is the database's and may be cached.
    again = gw.job(token, job_id).json()
    assert again["archive"] == j["archive"]


def test_a_replay_never_shows_an_archive_older_than_a_read(gateway_factory, token, mock,
                                                           tmp_path, psql):
    """A read by id while the copies run cached the job's view by key too, for the cache's whole
    life: a replay of the key then showed "pending" long after a read had shown "archived"."""
    e, route = arch_entry("replicate", mock)
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 1000}))
    gw = start(gateway_factory, tmp_path, [e], job_cache_ttl_ms=3600000)
    key = "replay-arch-" + uuid.uuid4().hex
    b = body(polls=1, outputs=2)
    job_id = gw.submit(token, key, b, route=route).json()["id"]
    deadline = time.monotonic() + 30
    while True:  # one read of the job completed, its copies still running
        j = gw.job(token, job_id).json()
        if j["state"] == "completed" and any(o["state"] != "archived" for o in j["archive"]):
            break
        assert j["state"] != "completed" and time.monotonic() < deadline, j
        time.sleep(0.05)
    while [x[0] for x in psql(f"SELECT state FROM archive_outputs WHERE op_id = '{job_id}'")] \
            != ["archived", "archived"]:
        assert time.monotonic() < deadline, "the copies never ended"
        time.sleep(0.1)
    time.sleep(0.3)  # past the view's short life
    r = gw.submit(token, key, b, route=route, headers={"Prefer": "respond-async"})
    assert r.json()["id"] == job_id and r.headers.get("idempotent-replayed") == "true", r
    # (A replay from memory shows the archive as the read that cached it saw it; one read from
    # the database reads it: test_a_replay_read_from_the_database_shows_the_archive.)
    shown = [o["state"] for o in r.json().get("archive") or []]
    assert all(s == "archived" for s in shown), r.json()


def test_a_replay_read_from_the_database_shows_the_archive(gateway_factory, token, mock,
                                                           tmp_path, psql):
    """A client that retries its POST to get its result (the documented pattern) was answered,
    once the job left the cache, with the job as the database holds it but without its archive:
    the provider's URLs only (Replicate's expire in an hour), none of the gateway's copies a
    read by id shows. The replay of a completed job now reads its archive as a read does."""
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], job_cache_entries=0)
    key = "replay-db-arch-" + uuid.uuid4().hex
    b = body(polls=1, outputs=2)
    job_id = gw.submit(token, key, b, route=route).json()["id"]
    deadline = time.monotonic() + 30
    while [x[0] for x in psql(f"SELECT state FROM archive_outputs WHERE op_id = '{job_id}'")] \
            != ["archived", "archived"]:
        assert time.monotonic() < deadline, "the copies never ended"
        time.sleep(0.1)
    read = gw.job(token, job_id).json()
    assert [o["state"] for o in read["archive"]] == ["archived", "archived"], read
    r = gw.submit(token, key, b, route=route, headers={"Prefer": "respond-async"})
    assert r.json()["id"] == job_id and r.headers.get("idempotent-replayed") == "true", r
    assert r.json().get("archive") == read["archive"], r.json()


@pytest.mark.parametrize("inflight,workers", [(3, 1), (16, 1), (3, 3)])
def test_a_claim_takes_a_batch_within_the_room(gateway_factory, token, mock, tmp_path, psql,
                                               inflight, workers):
    """One claim takes up to a batch of a tenant's outputs (8), never more than
    archive_max_inflight leaves room for, however many archive threads claim at once: ten slow
    outputs (the mock's most) are each copied once, and no more than `inflight` are ever fetched
    from the provider at the same time — counted where the copies are made, at the mock. (A
    copy's end is written with its thread's next batch, up to a second later: its row still shows
    its lease meanwhile, so the rows' leases may briefly count more than the copies at once.)"""
    e, route = arch_entry("replicate", mock)
    # Slow enough (1.5 s a copy) that every wave of copies overlaps.
    mock.http.request("POST", "/_files", json.dumps({"delay_ms": 1500}))
    archive_dir = str(tmp_path / "archive")
    gw = start(gateway_factory, tmp_path, [e], archive_max_inflight=inflight,
               archive_workers=workers)
    r = gw.submit(token, "batch-" + uuid.uuid4().hex, body(polls=0, outputs=10), route=route)
    job_id = r.json()["id"]
    deadline, seen, t0 = time.monotonic() + 60, [], time.monotonic()
    while time.monotonic() < deadline:
        left, rows = psql("SELECT count(*) FILTER (WHERE state = 'pending'), count(*) "
                          f"FROM archive_outputs WHERE op_id = '{job_id}'")[0]
        files = mock.http.request("GET", "/_files").json()
        seen.append((round(time.monotonic() - t0, 2), files["now"], left, rows))
        if int(left) == 0 and int(rows) == 10:
            break
        time.sleep(0.05)
    # The room is used, and never passed: copies at once = the room (or every output).
    files = mock.http.request("GET", "/_files").json()
    assert files["most"] == min(inflight, 10), (files, seen)
    j = check_archive(gw, token, job_id, archive_dir, 10)
    assert [o["attempts"] for o in j["archive"]] == [1] * 10, j["archive"]


def test_a_claim_takes_one_stored_result(token, psql):
    """A base64 output's claim carries its job's whole stored answer: one claim takes at most one
    of them (a job of eight large images would otherwise be read eight times into one result),
    and the URL outputs beside it as a batch. The rest wait, due and unleased, for the next."""
    tenant = psql("SELECT id FROM tenants ORDER BY id LIMIT 1")[0][0]
    prov = "b64claim" + uuid.uuid4().hex[:8]
    job = "job_" + prov
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         f"state, expires_at, resp_body) VALUES ({tenant}, '{job}', 'k{prov}', '\\x00', 1, "
         f"'{prov}', 'r', 'POST', 'http://x', '', '\\x00', 'completed', "
         "now() + interval '1 day', '\\x7b7d')")
    kinds = ["b64", "url", "b64", "url", "b64", "url"]
    psql("INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
         "next_attempt_at) VALUES " + ", ".join(
             f"({tenant}, '{job}', {n}, '{prov}', '{k}', "
             f"{'NULL' if k == 'b64' else repr('https://x/' + str(n))}, "
             f"now() - interval '{10 - n} seconds')" for n, k in enumerate(kinds)))

    def claim():
        rows = psql(f"SELECT n, kind, resp_body IS NOT NULL FROM idemgate_archive_claim("
                    f"{tenant}, 'me', 30, ARRAY['{prov}'], 8) ORDER BY n")
        return [(int(n), k, b) for n, k, b in rows]

    assert claim() == [(0, "b64", "t"), (1, "url", "f"), (3, "url", "f"), (5, "url", "f")]
    left = psql(f"SELECT n FROM archive_outputs WHERE op_id = '{job}' AND lease_owner IS NULL "
                "AND state = 'pending' ORDER BY n")
    assert [int(r[0]) for r in left] == [2, 4]
    assert claim() == [(2, "b64", "t")]
    assert claim() == [(4, "b64", "t")]
    assert claim() == []


def completed_job_row(psql, prefix):
    """A completed job's row written by hand, under a provider name of its own: (tenant, provider,
    job id)."""
    tenant = psql("SELECT id FROM tenants ORDER BY id LIMIT 1")[0][0]
    prov = prefix + uuid.uuid4().hex[:8]
    job = "job_" + prov
    psql("INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
         "fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
         f"state, expires_at) VALUES ({tenant}, '{job}', 'k{prov}', '\\x00', 1, '{prov}', 'r', "
         "'POST', 'http://x', '', '\\x00', 'completed', now() + interval '1 day')")
    return tenant, prov, job


def test_a_claim_takes_the_urls_that_expire_first(token, psql):
    """Under a backlog an archive claim takes a few of a tenant's due copies. It took them by
    when they became due: a URL good for ten more minutes waited behind outputs good for a day
    (and behind retried rows), and ended expired — a paid output lost while the ones that could
    wait were copied. Now the soonest expiry first (migration 0041), those without one last,
    the longest due first among equals. The claim is called as the archive workers call it."""
    tenant, prov, job = completed_job_row(psql, "soonest")
    rows = {  # n: (due since, expires in)
        0: ("10 minutes", "1 day"),
        1: ("1 minute", "10 minutes"),
        2: ("20 minutes", None),       # base64 in the stored result: no expiry
        3: ("5 minutes", "10 minutes"),
        4: ("30 minutes", "2 hours"),
    }
    psql("INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
         "next_attempt_at, expires_at) VALUES "
         + ", ".join(f"({tenant}, '{job}', {n}, '{prov}', "
                     f"'{'b64' if exp is None else 'url'}', 'https://x/{n}', "
                     f"now() - interval '{due}', "
                     f"{'NULL' if exp is None else f'now() + interval {chr(39)}{exp}{chr(39)}'})"
                     for n, (due, exp) in rows.items()))
    order = []
    for _ in rows:
        got = psql(f"SELECT n FROM idemgate_archive_claim({tenant}, 'me', 60, "
                   f"ARRAY['{prov}'], 1)")
        assert len(got) == 1, got
        order.append(int(got[0][0]))
    assert order == [3, 1, 4, 0, 2], order


def test_the_rows_archive_finish_writes_what_archive_finish_writes(token, psql):
    """A thread's batch of copy ends is one statement (archive_finish_rows): each row it writes
    is archive_finish's row, column for column — archived with its object, expired keeping the
    error before it, pending again for a retry, no size — and answers its place in the batch; a
    row held by another claim's version and one ended already answer nothing and stay as
    they are."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("on Citus a batch is archive_finish's rows, one by one")
    tenant, prov, job = completed_job_row(psql, "finrows")
    # Outputs 0-5 ended by the batch, 10-13 by archive_finish with the same values.
    psql("INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
         "lease_owner, lease_version, lease_expires_at, attempts, last_error, state) VALUES "
         + ", ".join(f"({tenant}, '{job}', {n}, '{prov}', 'url', 'https://x/{n}', 'me', 1, "
                     f"now() + interval '1 minute', 1, 'an earlier error', "
                     f"'{'archived' if n % 10 == 5 else 'pending'}')"
                     for n in (0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 16)))
    no = "'false'"
    ends = {0: ("1", "'archived'", "NULL", "0", "'ab" + "0" * 62 + "'", "'42'", "'image/png'",
                "'fs'", "'replica-a'", no),
            1: ("1", "'expired'", "'too old'", "0", "NULL", "NULL", "NULL", "NULL", "NULL", no),
            2: ("1", "'pending'", "'status 503'", "5000", "NULL", "NULL", "NULL", "NULL", "NULL",
                no),
            3: ("1", "'archived'", "NULL", "0", "'cd" + "0" * 62 + "'", "NULL", "'image/png'",
                "'fs'", "'replica-a'", no),
            4: ("2", "'archived'", "NULL", "0", "NULL", "NULL", "NULL", "NULL", "NULL", no),
            5: ("1", "'expired'", "'too old'", "0", "NULL", "NULL", "NULL", "NULL", "NULL", no),
            # given back before any GET: its claim's attempt not counted
            6: ("1", "'pending'", "'no temporary file'", "5000", "NULL", "NULL", "NULL", "NULL",
                "NULL", "'true'")}

    def args(n, v):
        lease, state, error, delay, sha, size, ct, backend, by, untried = v
        return (f"'{tenant}'", f"'{job}'", f"'{n}'", f"'{lease}'", state, error, f"'{delay}'",
                sha, size, ct, backend, by, untried)

    compared = ("state, last_error, sha256, bytes, content_type, backend, stored_by, "
                "archived_at IS NOT NULL, lease_owner, lease_expires_at, attempts, lease_version, "
                "next_attempt_at > now() + interval '2 seconds'")  # due again later: 5 s

    def row(n):
        return psql(f"SELECT {compared} FROM archive_outputs WHERE tenant_id = {tenant} "
                    f"AND op_id = '{job}' AND n = {n}")

    def raw(n):
        return psql(f"SELECT a::text FROM archive_outputs a WHERE tenant_id = {tenant} "
                    f"AND op_id = '{job}' AND n = {n}")

    before = {n: raw(n) for n in (4, 5)}
    psql(f"UPDATE archive_outputs SET attempts = 2 WHERE tenant_id = {tenant} "
         f"AND op_id = '{job}' AND n IN (6, 16)")
    answers = execute(psql, statement_sql("archive_finish_rows"),
                      rows_args([args(n, ends[n]) for n in sorted(ends)]))
    assert sorted(answers) == [["1", "archived"], ["2", "expired"], ["3", "pending"],
                               ["4", "archived"], ["7", "pending"]]
    answers.sort()
    answers[4:4] = [None, None]  # rows 4 and 5 answered nothing: the places line up with n
    one = statement_sql("archive_finish")
    for n in (0, 1, 2, 3, 6):
        assert execute(psql, one, "(" + ", ".join(args(n + 10, ends[n])) + ")") == \
            [[answers[n][1]]]
        assert row(n) == row(n + 10), n
    assert row(0)[0][:8] == ["archived", "an earlier error", "ab" + "0" * 62, "42", "image/png",
                             "fs", "replica-a", "t"]
    assert row(1)[0][1] == "too old; last error: an earlier error"
    assert row(2)[0][0] == "pending" and row(2)[0][-1] == "t" and row(0)[0][-1] == "f"
    assert row(3)[0][3] == ""  # no size: NULL
    assert raw(4) == before[4] and raw(5) == before[5]
    assert [row(n)[0][10] for n in (0, 1, 2, 6)] == ["1", "1", "1", "1"]
    # The same end sent again (its first write's fate lost with the connection): the attempt is
    # taken back once — the row is no longer owned.
    one_again = execute(psql, one, "(" + ", ".join(args(16, ends[6])) + ")")
    assert one_again == [["pending"]] and row(16)[0][10] == "1", (one_again, row(16))


def test_a_stored_copy_is_written_whatever_claim_holds_its_row(token, psql):
    """A copy stored (archived, with its object's hash) is final whatever became of the claim
    that made it: its publish (an fsync, an upload) can end after its lease, and another claim
    of the row — whose copy of the same URL fails once it has expired — ends it `expired` or
    `failed`. Before: the stored copy's write was fenced and dropped, the paid output lost with
    its bytes in the store. Anything else stays fenced: another end under a stale claim, and an
    output archived already. Both statements (one row, a batch of rows) alike."""
    if psql("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")[0][0] == "1":
        pytest.skip("on Citus a batch is archive_finish's rows, one by one")
    tenant, prov, job = completed_job_row(psql, "stored")
    old_sha = "ee" + "0" * 62
    # (state, lease_owner, sha256) of each row, all under claim 2; the ends come from claim 1.
    rows = {0: ("pending", "'other'", "NULL"), 1: ("expired", "NULL", "NULL"),
            2: ("failed", "NULL", "NULL"), 3: ("pending", "'other'", "NULL"),
            4: ("archived", "NULL", f"'{old_sha}'")}
    for base in (0, 10):
        psql("INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
             "lease_owner, lease_version, lease_expires_at, attempts, state, sha256) VALUES "
             + ", ".join(f"({tenant}, '{job}', {base + n}, '{prov}', 'url', 'https://x/{n}', "
                         f"{owner}, 2, now() + interval '1 minute', 2, '{st}', {sha})"
                         for n, (st, owner, sha) in rows.items()))
    sha = "'ab" + "0" * 62 + "'"
    archived_end = ("'archived'", "NULL", "0", sha, "'42'", "'image/png'", "'fs'", "'replica-a'",
                    "'false'")
    ends = {0: archived_end, 1: archived_end, 2: archived_end,
            3: ("'expired'", "'too old'", "0", "NULL", "NULL", "NULL", "NULL", "NULL", "'false'"),
            4: archived_end}

    def args(n, v):
        return (f"'{tenant}'", f"'{job}'", f"'{n}'", "'1'") + v

    def row(n):
        return psql(f"SELECT state, sha256, lease_owner FROM archive_outputs "
                    f"WHERE tenant_id = {tenant} AND op_id = '{job}' AND n = {n}")[0]

    answers = execute(psql, statement_sql("archive_finish_rows"),
                      rows_args([args(n, ends[n]) for n in sorted(ends)]))
    assert sorted(answers) == [["1", "archived"], ["2", "archived"], ["3", "archived"]], answers
    one = statement_sql("archive_finish")
    for n in sorted(ends):
        written = execute(psql, one, "(" + ", ".join(args(n + 10, ends[n])) + ")")
        assert written == ([["archived"]] if n < 3 else []), (n, written)
        assert row(n) == row(n + 10), n
    for n in (0, 1, 2):
        assert row(n) == ["archived", sha.strip("'"), ""], row(n)
    assert row(3) == ["pending", "", "other"] and row(4) == ["archived", old_sha, ""]


@pytest.mark.parametrize("fmt", ["url", "b64_json"])
def test_openai_images_archives_urls_and_base64(gateway_factory, token, mock, tmp_path, fmt):
    e, route = images_entry(mock)
    gw = start(gateway_factory, tmp_path, [e], env={"OPENAI_API_KEY": "sk-x"})
    r = gw.submit(token, "img-" + uuid.uuid4().hex,
                  {"prompt": "a cat", "n": 2, "response_format": fmt}, route=route,
                  headers={"Prefer": "respond-async"})
    j = check_archive(gw, token, r.json()["id"], str(tmp_path / "archive"), 2)
    assert {o["kind"] for o in j["archive"]} == {"url" if fmt == "url" else "b64"}
    assert all(o["content_type"] == "image/png" for o in j["archive"]) or fmt == "b64_json"
    if fmt == "b64_json":
        assert get_output(gw, token, j["id"], 0).body.startswith(b"PNG:")


@pytest.mark.parametrize("how", ["sync", "poll"])
def test_a_completed_result_is_written_with_its_plan(gateway_factory, token, mock, tmp_path,
                                                     psql, how):
    """The outputs' archive rows are inserted by the statement that writes the result (no
    archive worker runs here to plan it afterwards), in the same transaction: the operation is
    marked planned at the instant it finished, and every output has its row."""
    if how == "sync":
        e, route = images_entry(mock)
        payload = {"prompt": "a cat", "n": 2, "response_format": "url"}
    else:
        e, route = arch_entry("replicate", mock)
        payload = body(polls=1, outputs=2)
    gw = start(gateway_factory, tmp_path, [e], archive_workers=0,
               env={"OPENAI_API_KEY": "sk-x"})
    r = gw.submit(token, "plan-" + uuid.uuid4().hex, payload, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"completed"}, 30)
    [[same]] = psql("SELECT archive_planned_at IS NOT NULL AND archive_planned_at = finished_at "
                    f"FROM operations WHERE id = '{job_id}'")
    assert same == "t"
    rows = psql(f"SELECT n, kind, state, provider FROM archive_outputs WHERE op_id = '{job_id}' "
                "ORDER BY n")
    assert rows == [["0", "url", "pending", e["name"]], ["1", "url", "pending", e["name"]]], rows
    assert not any(a == "archive_planned" for a in
                   (json.loads(l).get("event") for l in gw.log().splitlines()
                    if l.startswith("{"))), "no planner ran"


def test_range_etag_tenancy_and_same_bytes_once(gateway_factory, token, mock, tmp_path,
                                                database_url):
    from conftest import tenant_token
    mock.http.request("POST", "/_files", json.dumps({"bytes": 100000}))
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "rng-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    j = check_archive(gw, token, job_id, str(tmp_path / "archive"), 1)
    whole = get_output(gw, token, job_id, 0).body
    assert len(whole) == 100000
    part = get_output(gw, token, job_id, 0, {"Range": "bytes=10-19"})
    assert part.status == 206 and part.body == whole[10:20], part
    assert part.headers["content-range"] == "bytes 10-19/100000"
    tail = get_output(gw, token, job_id, 0, {"Range": "bytes=-5"})
    assert tail.status == 206 and tail.body == whole[-5:]
    assert get_output(gw, token, job_id, 0, {"Range": "bytes=100000-"}).status == 416
    etag = j["archive"][0]["sha256"]
    assert get_output(gw, token, job_id, 0, {"If-None-Match": f'"{etag}"'}).status == 304
    # Another tenant's job is not found; an index the job does not have either.
    other = tenant_token(database_url)
    assert get_output(gw, other, job_id, 0).status == 404
    missing = get_output(gw, token, job_id, 5)
    assert missing.status == 404 and "output-not-found" in missing.json()["type"]
    # The same bytes again (a second output whose bytes are identical) add no object.
    before = objects(str(tmp_path / "archive"))
    e2 = gw.submit(token, "rng2-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    check_archive(gw, token, e2.json()["id"], str(tmp_path / "archive"), 1)
    assert len(objects(str(tmp_path / "archive"))) == len(before) + 1  # other name, other bytes


def test_archived_objects_are_referenced_until_their_job_is_removed(gateway_factory, token, mock,
                                                                   tmp_path, database_url, psql):
    """The retention hook the archive uses (`idemgate unreferenced`): of its objects, those no
    remaining job references. An output archived for real is referenced by its job; once the
    janitor removed the job it is not. Before, only `{"sha256": …}` inside a job's outputs
    counted, which no write ever puts there: every archived object was listed for deletion while
    its job lived, and a job whose provider URL had expired lost its paid result."""
    from test_cli import cli
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], janitor_interval_ms=100, job_cache_entries=0)
    r = gw.submit(token, "unref-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    kept = check_archive(gw, token, job_id, str(tmp_path / "archive"), 1)["archive"][0]["sha256"]
    other = hashlib.sha256(b"other").hexdigest()
    out = cli(database_url, "unreferenced", kept, other)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [other], "an archived output of a live job was listed"
    assert cli(database_url, "unreferenced", "not-a-digest").returncode == 1
    psql(f"UPDATE operations SET expires_at = now() - interval '1 hour' WHERE id = '{job_id}'")
    deadline = time.monotonic() + 30
    while psql(f"SELECT count(*) FROM operations WHERE id = '{job_id}'") != [["0"]]:
        assert time.monotonic() < deadline, "the janitor did not remove the job"
        settle_tombstones(psql)
        time.sleep(0.1)
    assert sorted(cli(database_url, "unreferenced", kept, other).stdout.split()) == \
        sorted([kept, other])


def test_an_archive_row_left_without_its_job_references_nothing(gateway_factory, token, mock,
                                                                 tmp_path, database_url, psql):
    """Since migration 0030 no foreign key deletes a job's archive rows with it: the janitor
    does. A replica older than 0030 deletes the job alone; the row it leaves must not keep the
    object referenced for ever (`idemgate unreferenced` counts a row only while its job
    exists)."""
    from test_cli import cli
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], job_cache_entries=0)
    r = gw.submit(token, "orphan-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    kept = check_archive(gw, token, job_id, str(tmp_path / "archive"), 1)["archive"][0]["sha256"]
    assert cli(database_url, "unreferenced", kept).stdout.split() == []
    psql(f"DELETE FROM operations WHERE id = '{job_id}'")  # an old replica's janitor
    assert psql(f"SELECT count(*) FROM archive_outputs WHERE op_id = '{job_id}'") == [["1"]]
    assert cli(database_url, "unreferenced", kept).stdout.split() == [kept]


def test_output_not_archived_is_a_problem(gateway_factory, token, mock, tmp_path):
    mock.http.request("POST", "/_files", json.dumps({"fault": "status_404"}))
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "na-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"completed"}, 20)
    deadline = time.monotonic() + 20
    while not (gw.job(token, job_id).json().get("archive") or time.monotonic() > deadline):
        time.sleep(0.1)
    p = get_output(gw, token, job_id, 0)
    assert p.status == 404 and p.headers["content-type"].startswith("application/problem+json")
    assert p.json()["type"] == "urn:idemgate:problem:output-not-archived", p.json()


def test_kill9_mid_copy_leaves_no_partial_object_and_resumes(gateway_factory, token, mock,
                                                              tmp_path):
    size = 2 * 1024 * 1024
    mock.http.request("POST", "/_files", json.dumps({"bytes": size}))
    archive_dir = str(tmp_path / "archive")
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], lease_seconds=8,
               env={"IDEMGATE_CRASH": "archive_mid_copy"})
    r = gw.submit(token, "kill-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    gw.proc.wait(timeout=30)
    assert gw.proc.returncode == -signal.SIGKILL, gw.log()[-2000:]
    # Killed with part of the bytes written: a temporary file, no object.
    tmp = os.listdir(os.path.join(archive_dir, "tmp"))
    assert tmp and 0 < os.path.getsize(os.path.join(archive_dir, "tmp", tmp[0])) < size
    assert objects(archive_dir) == {}
    gw2 = start(gateway_factory, tmp_path, [e], lease_seconds=8)
    j = check_archive(gw2, token, job_id, archive_dir, 1)
    assert j["archive"][0]["attempts"] >= 2 and j["archive"][0]["bytes"] == size
    # The dead process's temporary file was swept.
    assert tmp[0] not in os.listdir(os.path.join(archive_dir, "tmp"))


def metric(gw, name):
    text = gw.http.request("GET", "/metrics").body.decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


BY_WRITE = 'idemgate_archive_claims_total{source="write"}'
BY_CLAIM = 'idemgate_archive_claims_total{source="claim"}'


@pytest.mark.parametrize("room", [8, 1])
def test_the_write_of_a_result_claims_its_outputs_copies(gateway_factory, token, mock, tmp_path,
                                                         room):
    """Born claims (issue 23): a create's result written completed claims the copies of its
    fetched outputs in the same statement, as far as the archive has room (archive_max_inflight):
    those are copied at once with no claim statement, one attempt each; the rest are left to a
    claim. Three URL outputs: with room for 8, all three by the write; with room for 1, one by
    the write and two by claims."""
    e, route = images_entry(mock)
    archive_dir = str(tmp_path / "archive")
    gw = start(gateway_factory, tmp_path, [e], archive_max_inflight=room,
               env={"OPENAI_API_KEY": "sk-x"})
    r = gw.submit(token, "born-" + uuid.uuid4().hex,
                  {"prompt": "a cat", "n": 3, "response_format": "url"}, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = check_archive(gw, token, job_id, archive_dir, 3)
    assert [o["attempts"] for o in j["archive"]] == [1, 1, 1], j["archive"]
    by_write, by_claim = metric(gw, BY_WRITE), metric(gw, BY_CLAIM)
    assert (by_write, by_claim) == ((3.0, 0.0) if room == 8 else (1.0, 2.0)), (by_write, by_claim)


def db_rows(gw):
    """idemgate_db_batch_rows_total by (statement, result)."""
    text = gw.http.request("GET", "/metrics").body.decode()
    return {(m.group(1), m.group(2)): int(m.group(3)) for m in re.finditer(
        r'^idemgate_db_batch_rows_total\{statement="(\w+)",result="(\w+)"\} (\d+)$', text, re.M)}


def test_bursts_are_written_by_the_batch_statements(gateway_factory, mock, token, tmp_path,
                                                    psql):
    """The gateway's own batches (the rows' arrays built in C, the answers mapped back by
    ordinal) go through the one-statement texts: under bursts of new keys waited for, intakes,
    starts of sending and results are written by intake_rows, begin_send_rows and finish_rows —
    rows answered, none failed — and every job is completed by one create with one attempt row,
    its two outputs claimed by its own write (a batch's born claims named for the right job:
    copied at their first attempt, none left to a claim). At most three bursts of 32, until each
    statement has written a batch."""
    e, route = images_entry(mock)
    gw = start(gateway_factory, tmp_path, [e], archive_max_inflight=256, dispatch_workers=4,
               env={"OPENAI_API_KEY": "sk-x"})
    pfx = "rows-" + uuid.uuid4().hex[:8]
    stmts = ("intake_rows", "begin_send_rows", "finish_rows", "archive_finish_rows")
    keys = []
    for burst in range(3):
        def one(i, burst=burst):
            r = gw.submit(token, f"{pfx}-{burst}-{i}",
                          {"prompt": f"batch {burst} {i}", "n": 2, "response_format": "url"},
                          route=route, headers={"Prefer": "wait=30"})
            return r.status, r.headers.get("x-idemgate-job-id")
        answers = fan_out(32, one)
        assert all(a is not None and a[0] == 200 and a[1] for a in answers), answers
        keys += [a[1] for a in answers]
        if all(db_rows(gw).get((s, "answered"), 0) > 0 for s in stmts):
            break
    c = db_rows(gw)
    assert all(c.get((s, "answered"), 0) > 0 for s in stmts), c
    assert all(c.get((s, "failed"), -1) == 0 for s in stmts), c
    for job_id in keys:
        j = check_archive(gw, token, job_id, str(tmp_path / "archive"), 2)
        assert [o["attempts"] for o in j["archive"]] == [1, 1], (job_id, j["archive"])
        assert len(mock.creates_for(job_id)) == 1, job_id
    rows = psql("SELECT o.transport_attempts, count(a.*) FROM operations o JOIN attempts a "
                "ON a.tenant_id = o.tenant_id AND a.operation_id = o.id WHERE o.id IN ("
                + ", ".join(f"'{k}'" for k in keys) + ") GROUP BY o.tenant_id, o.id")
    assert rows == [["1", "1"]] * len(keys), rows
    assert (metric(gw, BY_WRITE), metric(gw, BY_CLAIM)) == (2.0 * len(keys), 0.0)


def test_outputs_claimed_by_a_write_whose_replica_died_are_copied_by_another(
        gateway_factory, token, mock, tmp_path, psql):
    """A replica killed right after its result's commit, before its archive threads got the
    outputs its write claimed: the rows stay leased to the dead replica until the lease runs
    out, then another replica's claim copies them (a second attempt each): late, never lost."""
    e, route = images_entry(mock)
    archive_dir = str(tmp_path / "archive")
    gw = start(gateway_factory, tmp_path, [e], lease_seconds=8,
               env={"OPENAI_API_KEY": "sk-x", "IDEMGATE_CRASH": "after_result_commit"})
    key = "born-dies-" + uuid.uuid4().hex
    r = gw.submit(token, key, {"prompt": "a cat", "n": 2, "response_format": "url"}, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    gw.proc.wait(timeout=30)
    assert gw.proc.returncode == -signal.SIGKILL, gw.log()[-2000:]
    # Written completed, its two outputs inserted under the dead replica's lease.
    rows = psql("SELECT n, state, lease_owner IS NOT NULL, lease_version, attempts FROM "
                f"archive_outputs WHERE op_id = '{job_id}' ORDER BY n")
    assert rows == [["0", "pending", "t", "1", "1"], ["1", "pending", "t", "1", "1"]], rows
    gw2 = start(gateway_factory, tmp_path, [e], lease_seconds=8,
                env={"OPENAI_API_KEY": "sk-x"})
    j = check_archive(gw2, token, job_id, archive_dir, 2)
    assert [o["attempts"] for o in j["archive"]] == [2, 2], j["archive"]
    assert metric(gw2, BY_CLAIM) == 2.0 and metric(gw2, BY_WRITE) == 0.0


def test_outputs_a_write_claimed_as_its_replica_stops_are_given_back_at_once(
        gateway_factory, token, mock, tmp_path, psql):
    """A result written (its two outputs inserted under this replica's lease) while the replica
    is being stopped: SIGTERM arrives while the dispatcher thread is held between the commit and
    the hand-over to the archive threads (pause point `after_result_commit`). The archive has
    stopped taking work by then: each output is given back pending, unowned and due at once —
    not left leased for the 60 s lease, its claim's attempt not counted (no GET was made) — and
    another replica copies both (their first attempt)."""
    e, route = images_entry(mock)
    archive_dir = str(tmp_path / "archive")
    gw = start(gateway_factory, tmp_path, [e], lease_seconds=60,
               env={"OPENAI_API_KEY": "sk-x", "IDEMGATE_PAUSE": "after_result_commit:10000"})
    r = gw.submit(token, "born-stop-" + uuid.uuid4().hex,
                  {"prompt": "a cat", "n": 2, "response_format": "url"}, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    leased = f"SELECT count(*) FROM archive_outputs WHERE op_id = '{job_id}' AND lease_owner " \
             "IS NOT NULL"
    deadline = time.monotonic() + 20
    while (psql(leased) != [["2"]] or '"event":"pause_point"' not in gw.log()) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert psql(leased) == [["2"]] and '"event":"pause_point"' in gw.log(), gw.log()[-2000:]
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=30) == 0, gw.log()[-2000:]
    rows = psql("SELECT n, state, lease_owner IS NULL, next_attempt_at <= now(), attempts, "
                f"last_error FROM archive_outputs WHERE op_id = '{job_id}' ORDER BY n")
    stopped = "the replica stopped before the copy began"
    # No GET was made: the claim's attempt is given back with the row.
    assert rows == [["0", "pending", "t", "t", "0", stopped],
                    ["1", "pending", "t", "t", "0", stopped]], rows
    gw2 = start(gateway_factory, tmp_path, [e], lease_seconds=60, env={"OPENAI_API_KEY": "sk-x"})
    j = check_archive(gw2, token, job_id, archive_dir, 2)  # within 30 s: long before the lease
    assert [o["attempts"] for o in j["archive"]] == [1, 1], j["archive"]


def test_a_write_that_claimed_outputs_and_lost_its_answer_keeps_no_room(
        gateway_factory, token, mock, tmp_path, database_url):
    """The result's write commits with its output claimed for this replica, but the connection
    is closed before its answer arrives (a protocol proxy holds the answer and closes both sides
    at ReadyForQuery). The gateway's re-read finds the result written, not which outputs the
    write claimed: it hands none to the archive threads and gives their room back. The output
    waits out its lease (8 s) and a claim copies it (a second attempt). With room for one copy
    only, a later job's output is still copied at its first attempt: the lost write kept no room
    (kept, nothing more is ever copied on this replica)."""
    with pg_proxy(database_url) as (px, url):
        e, route = images_entry(mock)
        archive_dir = str(tmp_path / "archive")
        gw = start(gateway_factory, tmp_path, [e], archive_max_inflight=1, lease_seconds=8,
                   env={"OPENAI_API_KEY": "sk-x", "DATABASE_URL": url})
        px.fail_next("finish", "after")
        r = gw.submit(token, "born-lost-" + uuid.uuid4().hex,
                      {"prompt": "a cat", "n": 1, "response_format": "url"}, route=route,
                      headers={"Prefer": "respond-async"})
        assert r.status == 202, r
        j = check_archive(gw, token, r.json()["id"], archive_dir, 1)
        assert px.count("finish", "after") == 1
        assert [o["attempts"] for o in j["archive"]] == [2], j["archive"]
        assert (metric(gw, BY_WRITE), metric(gw, BY_CLAIM)) == (0.0, 1.0)
        r = gw.submit(token, "born-after-" + uuid.uuid4().hex,
                      {"prompt": "a dog", "n": 1, "response_format": "url"}, route=route,
                      headers={"Prefer": "respond-async"})
        j = check_archive(gw, token, r.json()["id"], archive_dir, 1)
        assert [o["attempts"] for o in j["archive"]] == [1], j["archive"]
        # By its write, or by a claim when an archive thread's look found the one slot taken
        # by the first copy just before the write (born claims then wait for the claims).
        assert metric(gw, BY_WRITE) + metric(gw, BY_CLAIM) == 2.0


def test_expired_url_is_counted_and_logged(gateway_factory, token, mock, tmp_path):
    mock.http.request("POST", "/_files", json.dumps({"fault": "status_404"}))
    e, route = arch_entry("replicate", mock)
    e["result"] = dict(json.load(open(os.path.join(PROFILES, "replicate.json")))["result"],
                       url_ttl_seconds=3)
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "exp-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    j = archived(gw, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "expired" and o["attempts"] >= 2, o
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="expired"}') >= 1
    assert '"event":"archive_expired"' in gw.log() and job_id in gw.log()
    assert get_output(gw, token, job_id, 0).status == 404


def test_a_first_claim_past_an_estimated_expiry_still_tries(gateway_factory, token, mock,
                                                            tmp_path):
    """An output's expiry is most often the profile's estimate (result.url_ttl_seconds after the
    result). A claim that came after it — a backlog, an archive stopped for a while — wrote the
    output `expired` without a single request, though the provider's URL still served it. The
    first claim now tries once; only a failure then is `expired`."""
    e, route = arch_entry("replicate", mock)
    e["result"] = dict(json.load(open(os.path.join(PROFILES, "replicate.json")))["result"],
                       url_ttl_seconds=2)
    a = start(gateway_factory, tmp_path, [e], archive_workers=0)  # records, never copies
    r = a.submit(token, "late-claim-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    assert a.wait_state(token, job_id, {"completed"}, 15)["state"] == "completed"
    time.sleep(3)  # past the estimate, before any claim
    b = start(gateway_factory, tmp_path, [e])
    j = archived(b, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "archived" and o["attempts"] == 1, o
    assert get_output(b, token, job_id, 0).status == 200


def test_a_claim_the_archive_store_refuses_is_no_try_of_the_url(gateway_factory, token, mock,
                                                                 tmp_path, psql):
    """A claim whose copy could not even begin — the archive's own temporary file could not be
    opened (a full or read-only volume; here its folder is a file) — made no GET, yet counted as
    a try: past the URL's (estimated) expiry the output was written `expired` at once, a paid
    output dropped without one request. It is given back pending, its attempt not counted, and
    copied once the store takes files again."""
    e, route = arch_entry("replicate", mock)
    e["result"] = dict(json.load(open(os.path.join(PROFILES, "replicate.json")))["result"],
                       url_ttl_seconds=2)
    a = start(gateway_factory, tmp_path, [e], archive_workers=0)  # records, never copies
    r = a.submit(token, "store-refuses-" + uuid.uuid4().hex, body(polls=0, outputs=1),
                 route=route)
    job_id = r.json()["id"]
    assert a.wait_state(token, job_id, {"completed"}, 15)["state"] == "completed"
    tmp = tmp_path / "archive" / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text("not a folder")
    time.sleep(3)  # past the estimate, before any claim
    b = start(gateway_factory, tmp_path, [e])
    row = f"SELECT state, attempts, next_attempt_at > now() FROM archive_outputs " \
          f"WHERE op_id = '{job_id}' AND lease_owner IS NULL AND last_error IS NOT NULL"
    deadline = time.monotonic() + 20
    while not psql(row):  # the claim's end written (batched for up to 1 s)
        assert time.monotonic() < deadline, b.log()[-2000:]
        time.sleep(0.05)
    assert psql(row) == [["pending", "0", "t"]], psql(row)
    assert '"event":"archive_given_back_untried"' in b.log()
    tmp.unlink()
    psql(f"UPDATE archive_outputs SET next_attempt_at = now() WHERE op_id = '{job_id}'")
    j = archived(b, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "archived" and o["attempts"] == 1, o
    assert get_output(b, token, job_id, 0).status == 200


def test_wrong_content_length_is_never_stored(gateway_factory, token, mock, tmp_path):
    mock.http.request("POST", "/_files", json.dumps({"bytes": 50000, "fault": "truncate"}))
    e, route = arch_entry("replicate", mock)
    e["result"] = dict(json.load(open(os.path.join(PROFILES, "replicate.json")))["result"],
                       url_ttl_seconds=4)
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "len-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    j = archived(gw, token, r.json()["id"], timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "expired" and "Content-Length" in o["last_error"], o
    assert objects(str(tmp_path / "archive")) == {}


def test_redirect_to_another_host_is_refused(gateway_factory, token, mock, tmp_path):
    """A redirect to a host archive.hosts does not declare is never followed (the mock answers
    302 to "localhost", another name for itself): failed for good, at the first attempt."""
    mock.http.request("POST", "/_files", json.dumps({"fault": "redirect"}))
    e, route = arch_entry("replicate", mock, archive={"hosts": ["127.0.0.1"]})
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "redir-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    j = archived(gw, token, r.json()["id"], timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "failed" and "redirect to another host" in o["last_error"], o
    assert "localhost" in o["last_error"], o
    assert o["attempts"] == 1
    assert objects(str(tmp_path / "archive")) == {}


def test_redirect_to_a_declared_host_is_followed(gateway_factory, token, mock, tmp_path):
    """A URL that answers with a redirect to another host archive.hosts declares (a content
    endpoint handing out a signed storage URL) is followed and copied. Before, every redirect
    off the first origin failed the output for good: a paid output never copied."""
    mock.http.request("POST", "/_files", json.dumps({"fault": "redirect"}))
    e, route = arch_entry("replicate", mock, archive={"hosts": ["127.0.0.1", "localhost"]})
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "redir-ok-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    j = archived(gw, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "archived" and o["attempts"] == 1, o
    got = get_output(gw, token, job_id, 0)
    assert got.status == 200 and got.body.startswith(b"PNG:"), got
    assert len(objects(str(tmp_path / "archive"))) == 1


def test_private_address_is_refused_unless_allowed(gateway_factory, token, mock, tmp_path):
    e, route = arch_entry("replicate", mock, archive={"allow_private": False})
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "priv-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    j = archived(gw, token, r.json()["id"], timeout=30, states=("expired", "failed", "archived"))
    o = j["archive"][0]
    assert o["state"] == "failed" and "127.0.0.1 is loopback" in o["last_error"], o
    assert len(mock.http.request("GET", "/_ledger").json()["creates"]) == 1
    assert objects(str(tmp_path / "archive")) == {}


@pytest.mark.parametrize("source", ["create", "poll"])
def test_an_output_the_policy_refuses_is_planned_ended(gateway_factory, token, mock, tmp_path,
                                                      psql, source):
    """An output whose URL the profile's archive policy refuses (here its scheme: http, with
    allow_http off) is written failed, with the reason, by the write of its result — a
    synchronous create's (the dispatcher, which would otherwise claim it born) or a poll's: never
    claimed, never handed to an archive thread, said and counted once as a claim's refusal was.
    The job's archive is settled as soon as its result is."""
    if source == "create":
        e, route = images_entry(mock, archive={"allow_http": False})
        payload = {"prompt": "a cat", "n": 3, "response_format": "url"}
    else:
        e, route = arch_entry("replicate", mock, archive={"allow_http": False})
        payload = body(polls=1, outputs=3)
    gw = start(gateway_factory, tmp_path, [e], env={"OPENAI_API_KEY": "sk-x"})
    r = gw.submit(token, "plan-refused-" + uuid.uuid4().hex, payload, route=route,
                  headers={"Prefer": "wait=20"})
    assert r.status == 200, r  # the provider's answer, as a waited job's
    job_id = r.headers.get("x-idemgate-job-id")
    j = gw.job(token, job_id).json()
    assert [(o["state"], o["attempts"]) for o in j["archive"]] == [("failed", 0)] * 3, j
    assert all("scheme http is not allowed" in o["last_error"] for o in j["archive"]), j
    rows = psql("SELECT lease_version, lease_owner FROM archive_outputs "
                f"WHERE op_id = '{job_id}' ORDER BY n")
    assert rows == [["0", ""]] * 3, rows
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == 3
    assert metric(gw, 'idemgate_archive_claims_total{source="write"}') == 0
    assert metric(gw, 'idemgate_archive_claims_total{source="claim"}') == 0
    assert gw.log().count('"event":"archive_refused"') == 3
    assert objects(str(tmp_path / "archive")) == {}


def test_a_batch_of_ends_is_written_and_counted_row_by_row(gateway_factory, token, mock,
                                                            tmp_path):
    """The ends of one claim's outputs are written together (one transaction): each row under
    its own claim, each counted once. Ten URLs whose address is refused (loopback, with
    allow_private off: judged at the copy) end at their claim; ten more of another job, allowed,
    are copied."""
    refused, route = arch_entry("replicate", mock, archive={"allow_private": False})
    allowed, route2 = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [refused, allowed])
    r = gw.submit(token, "refused-" + uuid.uuid4().hex, body(polls=0, outputs=10), route=route)
    j = archived(gw, token, r.json()["id"], timeout=30, states=("expired", "failed", "archived"))
    assert [(o["state"], o["attempts"]) for o in j["archive"]] == [("failed", 1)] * 10, j
    assert all("is loopback" in o["last_error"] for o in j["archive"]), j["archive"]
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == 10
    r2 = gw.submit(token, "allowed-" + uuid.uuid4().hex, body(polls=0, outputs=10), route=route2)
    check_archive(gw, token, r2.json()["id"], str(tmp_path / "archive"), 10)
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="archived"}') == 10
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == 10
    assert '"event":"archive_write_dropped"' not in gw.log()


@pytest.mark.parametrize("outputs", [10, 1])
def test_ends_whose_commit_lost_its_answer_are_counted_once(
        gateway_factory, token, mock, tmp_path, database_url, outputs):
    """The statement writing the ends commits, but the connection is closed before its answer
    arrives (the protocol proxy): for ten outputs the first statement of their ends — the
    batch (archive_finish_rows) of those whose copies came back together, or one end alone
    (archive_finish) — for one output the single one. Each end is written again by the single
    fenced statement, which finds its row ended; the end is then found written as this claim
    wrote it: each output counted once, none reported dropped, none copied again."""
    with pg_proxy(database_url) as (px, url):
        e, route = arch_entry("replicate", mock, archive={"allow_private": False})
        gw = start(gateway_factory, tmp_path, [e], env={"DATABASE_URL": url})
        px.fail_next("archive_finish", "after")
        r = gw.submit(token, "ends-lost-" + uuid.uuid4().hex, body(polls=0, outputs=outputs),
                      route=route)
        j = archived(gw, token, r.json()["id"], timeout=30,
                     states=("expired", "failed", "archived"))
        assert [(o["state"], o["attempts"]) for o in j["archive"]] == \
            [("failed", 1)] * outputs, j
        assert px.count("archive_finish", "after") == 1
        deadline = time.monotonic() + 10
        while metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') < outputs and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == outputs
        log = gw.log()
        found = log.count('"event":"archive_end_found_written"')
        # The lost statement held the ends that came back in one turn of the archive thread
        # (each copy is refused at its connection, by the engine): 1 to 10.
        assert (found == 1) if outputs == 1 else (1 <= found <= 10), log[-3000:]
        assert '"event":"archive_write_dropped"' not in log, log[-3000:]


def test_an_archived_end_the_database_could_not_take_is_written_later(
        gateway_factory, token, mock, tmp_path, database_url, psql):
    """A copy stored, then its end's write cannot reach the database (twice: the write and its
    retry, the protocol proxy cutting the connection before each). The end was dropped: its
    lease ran out and another claim fetched the output again — from a provider URL that may
    have expired by then, the stored object named by no row. Now an archived end is kept and
    written with the thread's next ends: one fetch, one attempt, archived."""
    with pg_proxy(database_url) as (px, url):
        e, route = arch_entry("replicate", mock)
        gw = start(gateway_factory, tmp_path, [e], env={"DATABASE_URL": url}, lease_seconds=8)
        px.fail_next("archive_finish", "before", "before")
        r = gw.submit(token, "ends-kept-" + uuid.uuid4().hex, body(polls=0, outputs=1),
                      route=route)
        job_id = r.json()["id"]
        j = archived(gw, token, job_id, timeout=30, states=("expired", "failed", "archived"))
        assert [(o["state"], o["attempts"]) for o in j["archive"]] == [("archived", 1)], j
        assert px.count("archive_finish", "before") == 2
        assert '"event":"archive_ends_kept"' in gw.log()
        assert '"event":"archive_write_dropped"' not in gw.log()


def test_a_refused_end_never_fails_its_neighbours(gateway_factory, token, mock, tmp_path,
                                                  psql):
    """A batch of ends the database refuses (here: a trigger made to fail one row's end) is
    written again one row at a time: the nine others end and are counted once; the refused one
    stays under its claim, and once the database takes it, a later claim ends it."""
    e, route = arch_entry("replicate", mock, archive={"allow_private": False})
    fn = "arch_poison_" + uuid.uuid4().hex[:8]
    psql(f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         f"IF NEW.n = 3 AND NEW.state = 'failed' AND EXISTS (SELECT 1 FROM operations o "
         f"WHERE o.tenant_id = NEW.tenant_id AND o.id = NEW.op_id AND o.provider = '{e['name']}') "
         "THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$")
    psql(f"CREATE TRIGGER {fn} BEFORE UPDATE ON archive_outputs FOR EACH ROW "
         f"EXECUTE FUNCTION {fn}()")
    try:
        gw = start(gateway_factory, tmp_path, [e], lease_seconds=8)
        r = gw.submit(token, "poison-" + uuid.uuid4().hex, body(polls=0, outputs=10),
                      route=route)
        job_id = r.json()["id"]
        deadline = time.monotonic() + 30
        while metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') < 9:
            assert time.monotonic() < deadline, gw.job(token, job_id).json()
            time.sleep(0.1)
        j = gw.job(token, job_id).json()
        states = {o["index"]: (o["state"], o["attempts"]) for o in j["archive"]}
        assert all(states[n] == ("failed", 1) for n in range(10) if n != 3), states
        assert states[3][0] != "failed", states
        assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == 9
    finally:
        psql(f"DROP TRIGGER {fn} ON archive_outputs")
        psql(f"DROP FUNCTION {fn}()")
    j = archived(gw, token, job_id, timeout=30, states=("expired", "failed", "archived"))
    states = {o["index"]: (o["state"], o["attempts"]) for o in j["archive"]}
    assert states[3] == ("failed", 2), states  # claimed again once its lease ran out
    assert all(states[n] == ("failed", 1) for n in range(10) if n != 3), states
    assert metric(gw, 'idemgate_archive_outputs_total{outcome="failed"}') == 10


# ---- the S3-compatible backend ----------------------------------------------------------

S3RVER_SH = os.path.join(ROOT, "scripts", "s3rver.sh")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """s3rver (npm, installed by scripts/s3rver.sh) on 127.0.0.1 with a bucket "archive"."""
    import subprocess
    from conftest import free_port, wait_for_line
    bin_ = subprocess.check_output([S3RVER_SH], text=True).strip()
    d = tmp_path_factory.mktemp("s3rver")
    port = free_port()
    proc = subprocess.Popen(["node", bin_, "-d", str(d), "-a", "127.0.0.1", "-p", str(port),
                             "--configure-bucket", "archive"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    from conftest import Http
    http = Http(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 20
    while True:
        try:
            if http.request("GET", "/", timeout=2).status in (200, 403):
                break
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "s3rver did not start"
        time.sleep(0.2)
    yield {"url": f"http://127.0.0.1:{port}", "http": http, "dir": str(d)}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except Exception:
        proc.kill()
        proc.wait()


def s3_settings(s3, key="S3RVER"):
    return {"archive_backend": "s3", "archive_s3_endpoint": s3["url"],
            "archive_s3_bucket": "archive",
            "env": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": "S3RVER"}}


def check_s3(gw, token, job_id, s3, n_outputs, tmp_path):
    j = archived(gw, token, job_id)
    assert j["state"] == "completed", j
    arch = j["archive"]
    assert len(arch) == n_outputs and all(o["state"] == "archived" for o in arch), arch
    for o in arch:
        r = get_output(gw, token, job_id, o["index"])
        assert r.status == 200 and hashlib.sha256(r.body).hexdigest() == o["sha256"], r
        # The object is in the bucket under its hash, and nothing was published locally.
        obj = s3["http"].request("GET", f"/archive/{o['sha256']}")
        assert obj.status == 200 and obj.body == r.body
    assert objects(str(tmp_path / "archive")) == {}
    return j


@pytest.mark.parametrize("name", sorted(SHIPPED_ASYNC) + ["openai-images:url",
                                                          "openai-images:b64_json"])
def test_every_shipped_profile_archives_to_s3(gateway_factory, token, mock, tmp_path, s3, name):
    settings = s3_settings(s3)
    if name.startswith("openai-images"):
        e, route = images_entry(mock)
        settings["env"]["OPENAI_API_KEY"] = "sk-x"
        b = {"prompt": "a cat", "n": 2, "response_format": name.split(":")[1]}
        outs = 2
    else:
        e, route = arch_entry(name, mock)
        outs = 1 if name in ("openai-videos", "luma") else 2
        b = body(polls=1, outputs=outs)
    gw = start(gateway_factory, tmp_path, [e], **settings)
    r = gw.submit(token, "s3-" + uuid.uuid4().hex, b, route=route,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    j = check_s3(gw, token, r.json()["id"], s3, outs, tmp_path)
    part = get_output(gw, token, j["id"], 0, {"Range": "bytes=1-3"})
    assert part.status == 206 and len(part.body) == 3


def test_a_bucket_that_refuses_a_put_in_passing_gets_the_bytes_in_hand(gateway_factory, token,
                                                                        mock, tmp_path, s3,
                                                                        psql):
    """A copy fetched whole, then the bucket answers its PUT 503 (S3's "slow down", a blip).
    The bytes were dropped and the output left for a later claim to fetch again — from a
    provider URL that may have expired by then: a paid output lost to a passing refusal. The
    PUT is now tried again at once with the bytes in hand (a few times, while each answers
    quickly): one fetch, one claim, the object stored. A proxy in front of the bucket refuses
    its first PUT."""
    import http.client
    import http.server
    host, port = s3["url"].split("//")[1].split(":")
    puts = []

    class Refuse(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def relay(self):
            n = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(n) if n else b""
            if self.command == "PUT":
                puts.append(self.path)
                if len(puts) == 1:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            c = http.client.HTTPConnection(host, int(port), timeout=10)
            c.request(self.command, self.path, data, dict(self.headers))
            r = c.getresponse()
            out = r.read()
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            c.close()

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = relay

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        settings = s3_settings(dict(s3, url=f"http://127.0.0.1:{proxy.server_address[1]}"))
        settings["env"]["OPENAI_API_KEY"] = "sk-x"
        e, route = images_entry(mock)
        gw = start(gateway_factory, tmp_path, [e], **settings)
        r = gw.submit(token, "s3blip-" + uuid.uuid4().hex, {"prompt": "a cat", "n": 1},
                      route=route, headers={"Prefer": "respond-async"})
        assert r.status == 202, r
        job_id = r.json()["id"]
        j = archived(gw, token, job_id)
        assert [o["state"] for o in j["archive"]] == ["archived"], j["archive"]
        assert len(puts) == 2, puts
        assert psql(f"SELECT attempts FROM archive_outputs WHERE op_id = '{job_id}'") == [["1"]]
    finally:
        proxy.shutdown()


def test_an_s3_object_that_does_not_match_its_hash_is_never_served(gateway_factory, token,
                                                                     mock, tmp_path, s3):
    """An object changed in the bucket after it was archived (same length, other bytes) is read
    back hashed: it does not match its name, and the output is answered unavailable (503), never
    served as the archived one."""
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], **s3_settings(s3))
    r = gw.submit(token, "s3tamper-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route,
                  headers={"Prefer": "respond-async"})
    j = archived(gw, token, r.json()["id"])
    [o] = j["archive"]
    assert o["state"] == "archived", o
    path = os.path.join(s3["dir"], "archive", o["sha256"] + "._S3rver_object")
    with open(path, "rb") as f:
        original = f.read()
    try:
        with open(path, "wb") as f:
            f.write(bytes(b ^ 0x55 for b in original))
        served = get_output(gw, token, j["id"], 0)
        assert served.status == 503, (served.status, served.body[:200])
        assert "does not match its SHA-256" in gw.log()
    finally:
        with open(path, "wb") as f:
            f.write(original)
    assert get_output(gw, token, j["id"], 0).body == original


def test_bucket_reads_at_once_are_bounded(gateway_factory, token, mock, tmp_path, s3):
    """An output in the bucket comes whole to a database worker before it is served: a few large
    videos read at once held every worker, and every tenant's reads and cancels waited behind
    them. With archive_s3_reads_max 1, a second read while one is in progress (held 5 s by a
    pause point) is answered 503 archive-busy with Retry-After at once, counted; the first is
    served whole, and a read after it is served again."""
    e, route = arch_entry("replicate", mock)
    settings = s3_settings(s3)
    settings["env"]["IDEMGATE_PAUSE"] = "archive_s3_read:5000"
    gw = start(gateway_factory, tmp_path, [e], archive_s3_reads_max=1, **settings)
    r = gw.submit(token, "s3busy-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route,
                  headers={"Prefer": "respond-async"})
    j = archived(gw, token, r.json()["id"])
    [o] = j["archive"]
    assert o["state"] == "archived", o
    first = {}
    t = threading.Thread(target=lambda: first.update(r=get_output(gw, token, j["id"], 0)))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while '"archive_s3_read"' not in gw.log():
            assert time.monotonic() < deadline, gw.log()[-2000:]
            time.sleep(0.02)
        busy = get_output(gw, token, j["id"], 0)
        assert busy.status == 503, (busy.status, busy.body[:200])
        assert busy.json()["type"].endswith("archive-busy") and busy.headers.get("retry-after")
        assert t.is_alive(), "the first read ended before the second came: nothing was proved"
    finally:
        t.join(20)
    assert first["r"].status == 200 and hashlib.sha256(first["r"].body).hexdigest() == o["sha256"]
    again = get_output(gw, token, j["id"], 0)
    assert again.status == 200 and again.body == first["r"].body
    metrics = gw.http.request("GET", "/metrics").body.decode()
    assert 'idemgate_archive_reads_unserved_total{reason="busy"} 1' in metrics


def test_s3_credentials_are_sent(gateway_factory, token, mock, tmp_path, s3):
    """A key the bucket does not know is refused (s3rver checks the access key id of the SigV4
    Authorization header; it does not recompute the signature), the copy is retried, never
    published locally."""
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], **s3_settings(s3, key="NOT-A-KEY"))
    r = gw.submit(token, "s3key-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    deadline = time.monotonic() + 20
    while True:
        arch = gw.job(token, job_id).json().get("archive") or [{}]
        if arch[0].get("attempts", 0) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    o = arch[0]
    assert o["state"] == "pending" and "bucket PUT answered 403" in o["last_error"], o
    assert objects(str(tmp_path / "archive")) == {}


def test_a_lower_migration_merged_after_a_higher_one_is_applied(database_url, psql):
    """Branches take migration numbers side by side (this one 0007; others 0008, 0009, …): a
    database that already recorded a higher version must still get 0007 once it is merged."""
    import subprocess
    from conftest import GATEWAY_BIN
    name = "mig_" + uuid.uuid4().hex[:10]
    psql(f"CREATE DATABASE {name}")
    url = database_url.replace("///idemgate?", f"///{name}?")
    env = dict(os.environ, DATABASE_URL=url)

    def q(sql):
        return subprocess.check_output(["psql", url, "-qtAX", "-c", sql], text=True).strip()

    try:
        subprocess.check_call([GATEWAY_BIN, "migrate"], env=env, stdout=subprocess.DEVNULL)
        # As a binary of another branch left it: 0007 never ran, a higher version did.
        q("DROP TABLE archive_outputs; ALTER TABLE operations DROP COLUMN archive_planned_at; "
          "DELETE FROM schema_migrations WHERE version = 7; "
          "INSERT INTO schema_migrations (version, name) VALUES (99, 'another_branch')")
        subprocess.check_call([GATEWAY_BIN, "migrate"], env=env, stdout=subprocess.DEVNULL)
        assert q("SELECT count(*) FROM schema_migrations WHERE version = 7") == "1"
        assert q("SELECT to_regclass('archive_outputs') IS NOT NULL") == "t"
    finally:
        psql(f"DROP DATABASE IF EXISTS {name}")


def test_archived_output_headers(gateway_factory, token, mock, tmp_path, psql):
    """Issue 21 item 12: archived outputs were served with the provider's Content-Type on the
    console's origin (text/html, SVG with script) and no nosniff, sandbox or attachment, and a
    416 had no Content-Range. Every answer with the bytes now has nosniff and a sandbox CSP, a
    type outside the image/video/audio allow-list is a download, and a 416 says the size."""
    mock.http.request("POST", "/_files", json.dumps({"bytes": 1000}))
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e])
    r = gw.submit(token, "hdr-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
    job_id = r.json()["id"]
    check_archive(gw, token, job_id, str(tmp_path / "archive"), 1)
    # The stored type is the provider's; a hostile provider's is set here in the row itself.
    for ct, inline in (("text/html", False), ("image/svg+xml", False),
                       ("application/octet-stream", False), ("text/html; charset=utf-8", False),
                       ("image/png", True), ("video/mp4", True), ("audio/mpeg", True)):
        psql(f"UPDATE archive_outputs SET content_type = '{ct}' WHERE op_id = '{job_id}'")
        for extra in ({}, {"Range": "bytes=0-9"}):
            resp = get_output(gw, token, job_id, 0, extra)
            assert resp.status in (200, 206), (ct, resp)
            h = resp.headers
            assert h.get("x-content-type-options") == "nosniff", (ct, h)
            assert h.get("content-security-policy") == "sandbox", (ct, h)
            if inline:
                assert "content-disposition" not in h, (ct, h)
            else:
                assert h.get("content-disposition") == "attachment", (ct, h)
    etag = f'"{gw.job(token, job_id).json()["archive"][0]["sha256"]}"'
    not_modified = get_output(gw, token, job_id, 0, {"If-None-Match": etag})
    assert not_modified.status == 304
    assert not_modified.headers.get("x-content-type-options") == "nosniff"
    unsatisfiable = get_output(gw, token, job_id, 0, {"Range": "bytes=1000-"})
    assert unsatisfiable.status == 416
    assert unsatisfiable.headers.get("content-range") == "bytes */1000", unsatisfiable.headers


# ---- issue 21 item 13: archive across replicas, readiness of the archive ------------------

def stop(*gateways):
    """Stops gateways of an earlier step: one that lacks a later step's provider would still claim
    that provider's accepted jobs and put their polls off."""
    for gw in gateways:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=20) == 0, gw.log()[-2000:]


def readyz(gw):
    r = gw.http.request("GET", "/readyz")
    return r.status, r.json()


def test_archive_across_replicas(gateway_factory, token, mock, tmp_path, s3):
    """Two replicas on one database. Each with its own local archive folder: an output archived
    by one is a 503 output-in-other-replica from the other (naming the replica that holds it),
    logged and counted, never a 500. With a shared store — one folder mounted by both, or the
    S3-compatible bucket — either replica serves it."""
    e, route = arch_entry("replicate", mock)
    one = start(gateway_factory, tmp_path, [e], archive_dir=str(tmp_path / "a1"),
                instance_id="replica-one")
    two = start(gateway_factory, tmp_path, [e], archive_dir=str(tmp_path / "a2"),
                instance_id="replica-two", archive_workers=0)
    jobs = []
    for gw in (one, two, one, two):
        r = gw.submit(token, "xr-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route)
        assert r.status == 202, r
        jobs.append(r.json()["id"])
    for job_id in jobs:
        archived(one, token, job_id, timeout=120)  # a deadline for a loaded machine, not a bound
        check_archive(one, token, job_id, str(tmp_path / "a1"), 1)  # only one archives
        p = get_output(two, token, job_id, 0)
        assert p.status == 503, p
        assert p.headers["content-type"].startswith("application/problem+json")
        assert p.json()["type"] == "urn:idemgate:problem:output-in-other-replica", p.json()
        assert "replica-one" in p.json()["detail"] and "shared" in p.json()["detail"]
        assert int(p.headers["retry-after"]) > 0
    assert metric(two, 'idemgate_archive_reads_unserved_total{reason="other_replica"}') == 4
    unserved = [json.loads(l) for l in two.log().splitlines()
                if '"event":"archive_read_unserved"' in l]
    assert len(unserved) == 4 and all(u["stored_by"] == "replica-one" for u in unserved)
    assert '"status":500' not in two.log()

    # The shared volume alternative: both replicas on one folder.
    stop(one, two)
    shared = str(tmp_path / "shared")
    e2, route2 = arch_entry("replicate", mock)
    three = start(gateway_factory, tmp_path, [e2], archive_dir=shared, instance_id="replica-3")
    four = start(gateway_factory, tmp_path, [e2], archive_dir=shared, instance_id="replica-4",
                 archive_workers=0)
    r = four.submit(token, "xv-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route2)
    archived(three, token, r.json()["id"], timeout=120)
    j = check_archive(three, token, r.json()["id"], shared, 1)
    assert get_output(four, token, j["id"], 0).status == 200

    # The S3-compatible store (the default of the shipped multi-replica deployments).
    stop(three, four)
    e3, route3 = arch_entry("replicate", mock)
    s3a = start(gateway_factory, tmp_path, [e3], archive_dir=str(tmp_path / "s3a"),
                instance_id="replica-5", **s3_settings(s3))
    s3b = start(gateway_factory, tmp_path, [e3], archive_dir=str(tmp_path / "s3b"),
                instance_id="replica-6", archive_workers=0, **s3_settings(s3))
    # The archiving replica's readiness probes the bucket (a PUT and a DELETE), and passes.
    assert readyz(s3a)[0] == 200 and readyz(s3a)[1]["archive"] == "writable", readyz(s3a)
    assert readyz(s3b)[1]["archive"] == "not_used"
    r = s3b.submit(token, "xs-" + uuid.uuid4().hex, body(polls=0, outputs=1), route=route3)
    assert r.status == 202, r
    j = archived(s3a, token, r.json()["id"], timeout=120)
    assert j.get("archive") and j["archive"][0]["state"] == "archived", (j, s3a.log()[-3000:])
    for gw in (s3a, s3b):
        got = get_output(gw, token, j["id"], 0)
        assert got.status == 200 and hashlib.sha256(got.body).hexdigest() == \
            j["archive"][0]["sha256"], got
    probes = os.path.join(s3["dir"], "archive", "idemgate-probe")
    assert not os.path.exists(probes) or not [f for f in os.listdir(probes)
                                              if not f.startswith(".")], "probe objects removed"


def test_base64_outputs_outlive_a_store_outage(gateway_factory, token, mock, tmp_path, psql):
    """Bytes kept in the result (base64: no URL to expire) are copied however long the archive
    store fails — a folder that cannot be written here, a bucket's 5xx or a full disk alike.
    Before: after ten tries (two to four minutes of outage) the output was `failed` for good,
    its job then deleted by retention with the only copy of its bytes."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the archive's parent folder should be")
    bad_dir = str(blocker / "archive")
    e, route = images_entry(mock)
    gw = start(gateway_factory, tmp_path, [e], archive_dir=bad_dir,
               env={"OPENAI_API_KEY": "sk-x"})
    r = gw.submit(token, "b64-" + uuid.uuid4().hex,
                  {"prompt": "a cat", "n": 1, "response_format": "b64_json"}, route=route,
                  headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]

    def ended():  # a try's end is written: the row unclaimed, its error kept
        rows = psql(f"SELECT state, attempts, lease_owner IS NULL AND last_error IS NOT NULL, "
                    f"next_attempt_at > now() FROM archive_outputs WHERE op_id = '{job_id}'")
        return rows[0] if rows else [None, "0", "f", "f"]

    deadline = time.monotonic() + 30
    while ended()[2:] != ["t", "t"]:
        assert time.monotonic() < deadline, ended()
        time.sleep(0.1)
    # No temporary file, no try: the claim's attempt is given back with the row.
    assert ended()[:2] == ["pending", "0"], ended()
    # Now the bytes are read but the store refuses to keep them (no folder for its objects),
    # after ten tries and more already spent: a try, counted, and still nothing ended.
    blocker.unlink()
    os.makedirs(bad_dir)
    with open(os.path.join(bad_dir, "objects"), "w") as f:
        f.write("a file where the objects' folder should be")
    psql(f"UPDATE archive_outputs SET attempts = 12, next_attempt_at = now() "
         f"WHERE op_id = '{job_id}'")
    while ended()[3] != "t":
        assert time.monotonic() < deadline + 30, ended()
        time.sleep(0.1)
    while ended()[2] != "t":
        assert time.monotonic() < deadline + 30, ended()
        time.sleep(0.1)
    assert ended()[:2] == ["pending", "13"], ended()
    os.remove(os.path.join(bad_dir, "objects"))
    psql(f"UPDATE archive_outputs SET next_attempt_at = now() WHERE op_id = '{job_id}'")
    j = archived(gw, token, job_id, timeout=30, states=("archived", "failed", "expired"))
    assert [o["state"] for o in j["archive"]] == ["archived"], j["archive"]
    assert get_output(gw, token, job_id, 0).body.startswith(b"PNG:")


def test_readyz_fails_when_archive_not_writable(gateway_factory, token, mock, tmp_path):
    """A replica that archives but cannot write its archive (a folder that cannot be created, an
    unreachable bucket) is alive but not ready; once the folder can be written, a later probe
    (the verdict is cached a few seconds) makes it ready again. A replica that archives nothing
    does not depend on the archive."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the archive's parent folder should be")
    bad_dir = str(blocker / "archive")
    e, route = arch_entry("replicate", mock)
    gw = start(gateway_factory, tmp_path, [e], archive_dir=bad_dir)
    assert gw.http.request("GET", "/healthz").status == 200
    status, ready = readyz(gw)
    assert status == 503 and ready["ready"] is False and ready["database"] is True, ready
    assert ready["archive"] == "unwritable" and "archive folder" in ready["archive_error"], ready
    assert metric(gw, "idemgate_archive_writable") == 0
    assert '"event":"archive_unwritable"' in gw.log()

    # Repaired: ready again at a later probe.
    blocker.unlink()
    deadline = time.monotonic() + 30
    while readyz(gw)[0] != 200:
        assert time.monotonic() < deadline, readyz(gw)
        time.sleep(0.2)
    assert readyz(gw)[1]["archive"] == "writable"
    assert metric(gw, "idemgate_archive_writable") == 1
    assert '"event":"archive_writable"' in gw.log()
    # The probe leaves nothing behind.
    assert os.listdir(os.path.join(bad_dir, "tmp")) == []
    assert objects(bad_dir) == {}

    # An unreachable bucket: not ready either.
    from conftest import free_port
    dead = {"archive_backend": "s3", "archive_s3_endpoint": f"http://127.0.0.1:{free_port()}",
            "archive_s3_bucket": "archive",
            "env": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}}
    gw_s3 = start(gateway_factory, tmp_path, [e], archive_dir=str(tmp_path / "spool"), **dead)
    status, ready = readyz(gw_s3)
    assert status == 503 and ready["archive"] == "unwritable", ready
    assert "bucket" in ready["archive_error"], ready

    # No archive workers here: the archive is not this replica's concern, and it is ready.
    blocker2 = tmp_path / "not-a-folder-either"
    blocker2.write_text("again")
    other = start(gateway_factory, tmp_path, [e], archive_dir=str(blocker2 / "x"),
                  archive_workers=0)
    status, ready = readyz(other)
    assert status == 200 and ready["archive"] == "not_used", ready
