"""The intake contract: every status and problem type of POST /v1/providers/{p}/{route}."""

import json
import time
import uuid

import pytest

from conftest import tenant_token


def key():
    return "k-" + uuid.uuid4().hex


def problem_type(resp):
    assert resp.headers["content-type"] == "application/problem+json", resp
    body = resp.json()
    assert body["status"] == resp.status
    return body["type"].rsplit(":", 1)[1]


def test_new_then_replay(gateway, token, mock):
    k = key()
    r1 = gateway.submit(token, k, {"prompt": "a red fox", "n": 1})
    assert r1.status == 202, r1
    job = r1.json()
    assert job["id"].startswith("job_")
    assert r1.headers["location"] == f"/v1/jobs/{job['id']}"
    assert "idempotent-replayed" not in r1.headers
    assert job["idempotency_key"] == k
    assert r1.headers["x-request-id"]

    # Key order and whitespace do not change the fingerprint: this is the same operation.
    r2 = gateway.submit(token, k, '{ "n" : 1,\n  "prompt":"a red fox" }')
    assert r2.status == 202, r2
    assert r2.headers["idempotent-replayed"] == "true"
    assert r2.json()["id"] == job["id"]

    done = gateway.wait_state(token, job["id"], {"completed"})
    assert done["state"] == "completed"
    assert done["result"]["status"] == 200
    assert len(done["result"]["body"]["data"]) == 1
    assert done["attempts"] == {"transport": 1, "generation": 1}
    assert len(mock.creates_for(job["id"])) == 1


def test_quoted_and_bare_key_are_the_same_key(gateway, token):
    k = key()
    r1 = gateway.submit(token, k, {"prompt": "x"})
    r2 = gateway.submit(token, f'"{k}"', {"prompt": "x"})
    assert r1.status == 202 and r2.status == 202
    assert r2.json()["id"] == r1.json()["id"]
    assert r2.headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize("changed", [
    {"prompt": "a red fox", "n": 2},          # a value changes
    {"prompt": "a red fox ", "n": 1},         # one space inside a string
    {"prompt": "a red fox", "n": 1.5},        # a number
    {"prompt": "a red fox", "n": 1, "x": None},  # a member more
])
def test_key_reused_with_other_parameters_is_422_and_never_sent(gateway, token, mock, changed):
    k = key()
    r1 = gateway.submit(token, k, {"prompt": "a red fox", "n": 1})
    assert r1.status == 202
    gateway.wait_state(token, r1.json()["id"], {"completed"})
    r2 = gateway.submit(token, k, changed)
    assert r2.status == 422, r2
    assert problem_type(r2) == "idempotency-key-reused"
    # It names the job that holds the key and what differed (issue 24 §12).
    detail = r2.json()["detail"]
    assert r1.json()["id"] in detail and "another body" in detail, detail
    assert len(mock.ledger()) == 1


def test_same_key_other_route_is_422(gateway, token, mock):
    k = key()
    first = gateway.submit(token, k, {"prompt": "x"})
    assert first.status == 202
    r = gateway.submit(token, k, {"prompt": "x"}, route="mock-keyed/generations")
    assert r.status == 422 and problem_type(r) == "idempotency-key-reused"
    assert first.json()["id"] in r.json()["detail"], r.json()
    assert "another provider" in r.json()["detail"], r.json()


def test_an_unknown_target_lists_what_exists_and_multipart_is_415(gateway, token, mock):
    """A 404 names the configured providers (or the provider's routes); a multipart upload is a
    plain 415, not a JSON parse error at its first byte. Nothing is recorded or sent."""
    before = len(mock.ledger())
    r = gateway.submit(token, key(), {"prompt": "x"}, route="mock-imagez/images/generations")
    assert r.status == 404 and problem_type(r) == "unknown-route", r
    assert 'no provider "mock-imagez"' in r.json()["detail"], r.json()
    assert "mock-images" in r.json()["detail"] and "mock-keyed" in r.json()["detail"], r.json()
    r = gateway.submit(token, key(), {"prompt": "x"}, route="mock-images/images/generation")
    assert r.status == 404, r
    assert 'has no route "images/generation"' in r.json()["detail"], r.json()
    assert "images/generations" in r.json()["detail"], r.json()
    form = (b"--b0\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx\r\n"
            b"--b0\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
            b"Content-Type: image/png\r\n\r\n\x89PNG\r\n--b0--\r\n")
    r = gateway.submit(token, key(), form,
                       headers={"Content-Type": "multipart/form-data; boundary=b0"})
    assert r.status == 415 and problem_type(r) == "unsupported-media-type", r
    assert "multipart" in r.json()["detail"], r.json()
    assert len(mock.ledger()) == before


def test_missing_key(gateway, token):
    r = gateway.submit(token, None, {"prompt": "x"})
    assert r.status == 400 and problem_type(r) == "missing-idempotency-key"


@pytest.mark.parametrize("bad", [
    "",                     # empty
    "x" * 256,              # too long
    '"unterminated',        # broken sf-string
    '"a"b',                 # trailing bytes after the sf-string
    '"bad\\escape"',        # only \" and \\ are escapes
    "caf\u00e9",            # not ASCII
    "tab\there",            # control character
])
def test_malformed_key(gateway, token, bad):
    r = gateway.submit(token, bad, {"prompt": "x"})
    assert r.status == 400, (bad, r)
    assert problem_type(r) in ("invalid-idempotency-key", "missing-idempotency-key")


def test_longest_key_is_accepted(gateway, token):
    r = gateway.submit(token, "k" * 255, {"prompt": "x"})
    assert r.status == 202, r


def test_two_keys_is_400(gateway, token):
    # urllib cannot repeat a header; send raw bytes.
    import socket
    body = b'{"prompt":"x"}'
    req = (b"POST /v1/providers/mock-images/images/generations HTTP/1.1\r\nHost: x\r\n"
           b"Authorization: Bearer " + token.encode() + b"\r\n"
           b"Idempotency-Key: a\r\nIdempotency-Key: b\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(req)
        resp = s.recv(65536)
    assert resp.startswith(b"HTTP/1.1 400"), resp[:200]
    assert b"invalid-idempotency-key" in resp


def raw_status(port, req):
    """Sends raw bytes on a new connection; returns the whole answer (the gateway closes it)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_key_with_nul_refused(gateway, token, mock, psql):
    """Issue 21 item 10: a NUL inside Idempotency-Key was not refused. libmicrohttpd cut the value
    at the NUL, so "<k>\\0one" and "<k>\\0two" were both the key "<k>": one job for two
    intents (the second answered as a replay of the first). Every such request is now a 400 and
    nothing is recorded or sent, wherever the header stands and whatever follows the NUL."""
    k = key()
    body = b'{"prompt":"x"}'

    def req(key_line, last):
        head = (b"POST /v1/providers/mock-images/images/generations HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + token.encode() + b"\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n")
        if last:
            return head + key_line + b"\r\n\r\n" + body
        return head.replace(b"Host: x\r\n", b"Host: x\r\n" + key_line + b"\r\n") + b"\r\n" + body

    for tail in (b"one", b"two", b"\x01", b" x"):
        for last in (False, True):
            resp = raw_status(gateway.port, req(b"Idempotency-Key: " + k.encode() + b"\0" + tail,
                                                last))
            assert resp.startswith(b"HTTP/1.1 400"), (tail, last, resp[:300])
            assert b"application/problem+json" in resp
    # A NUL in any other header line is refused the same way (its value would be cut too).
    resp = raw_status(gateway.port, req(b"Idempotency-Key: " + k.encode() +
                                        b"\r\nX-Trace: a\0b", False))
    assert resp.startswith(b"HTTP/1.1 400"), resp[:300]
    assert psql(f"SELECT count(*) FROM operations WHERE idempotency_key LIKE '{k}%'") == [["0"]]
    assert mock.ledger() == []
    # The key without the NUL is still a key like any other.
    resp = raw_status(gateway.port, req(b"Idempotency-Key: " + k.encode(), True))
    assert resp.startswith(b"HTTP/1.1 202"), resp[:300]


def test_oversize_body_is_413(gateway_factory, token):
    gw = gateway_factory(max_body_bytes=1024)
    r = gw.submit(token, key(), json.dumps({"prompt": "x" * 2000}))
    assert r.status == 413 and problem_type(r) == "payload-too-large"
    assert gw.submit(token, key(), json.dumps({"prompt": "x" * 900})).status == 202


def test_default_body_cap_is_one_mebibyte(gateway, token):
    big = json.dumps({"prompt": "x" * (1024 * 1024)})
    r = gateway.submit(token, key(), big)
    assert r.status == 413 and problem_type(r) == "payload-too-large"


@pytest.mark.parametrize("body", [
    '{"prompt": "x"} trailing',
    '{"prompt": "x", "prompt": "y"}',
    '{"prompt": "x", "n": 1e999}',
    '[' * 65 + ']' * 65,
    '{"prompt": "x",}',
    '',
    'not json',
    '{"prompt": "\\ud800"}',
])
def test_bad_json_is_400(gateway, token, mock, body):
    r = gateway.submit(token, key(), body)
    assert r.status == 400, (body, r)
    assert problem_type(r) == "invalid-json"
    assert mock.ledger() == []


def test_unknown_route_is_404_never_forwarded(gateway, token, mock):
    for route in ("mock-images/v1/files", "nope/images/generations", "mock-images"):
        r = gateway.submit(token, key(), {"prompt": "x"}, route=route)
        assert r.status == 404, (route, r)
        assert problem_type(r) == "unknown-route"
    # A dot segment is refused before routing (issue 21 item 9): 400 bad-path.
    r = gateway.submit(token, key(), {"prompt": "x"},
                       route="mock-images/images/generations/../edits")
    assert r.status == 400 and problem_type(r) == "bad-path", r
    assert mock.ledger() == []


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer "])
def test_wrong_token_is_401(gateway, mock, auth):
    h = {"Idempotency-Key": key()}
    if auth is not None:
        h["Authorization"] = auth
    r = gateway.http.request("POST", "/v1/providers/mock-images/images/generations",
                             '{"prompt":"x"}', h)
    assert r.status == 401 and problem_type(r) == "unauthorized"
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert mock.ledger() == []


def test_401_comes_before_other_errors(gateway):
    h = {"Authorization": "Bearer not-a-tenant"}
    r = gateway.http.request("POST", "/v1/providers/nope/x", "garbage", h)
    assert r.status == 401
    r = gateway.http.request("POST", "/v1/providers/mock-images/images/generations", "garbage", h)
    assert r.status == 401


def until_status(call, status, bound_s=10.0):
    """Calls until the answer has `status`, for at most bound_s (five times the documented
    TENANTS_MAX_AGE_S, for a loaded machine): whether it ever does is the assertion."""
    deadline = time.monotonic() + bound_s
    while True:
        if call().status == status:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_revoked_token_is_401(gateway, database_url):
    import subprocess, os
    from conftest import GATEWAY_BIN
    name = "rev-" + uuid.uuid4().hex[:8]
    tok = tenant_token(database_url, name)
    assert gateway.submit(tok, key(), {"prompt": "x"}).status == 202
    subprocess.check_call([GATEWAY_BIN, "tenant", "revoke", name],
                          env=dict(os.environ, DATABASE_URL=database_url))
    # The tenant directory answers a token from memory only while the database confirmed it
    # within TENANTS_MAX_AGE_S (2 s): a revoked token is refused from then on, and for good.
    assert until_status(lambda: gateway.submit(tok, key(), {"prompt": "x"}), 401)
    for _ in range(3):
        assert gateway.submit(tok, key(), {"prompt": "x"}).status == 401


def test_a_token_revoked_while_its_request_waits_gets_no_answer(gateway, database_url, mock):
    """A request held by `Prefer: wait` was answered its job's result when the job ended, however
    long after its token was revoked (up to max_wait_seconds): the held answer read the job by
    tenant, never the token again. A revoked token stops working within the tenants' bound (2 s),
    held requests included: the answer is 401, and the job itself goes on."""
    import subprocess, os, threading
    from conftest import GATEWAY_BIN
    name = "rev-wait-" + uuid.uuid4().hex[:8]
    tok = tenant_token(database_url, name)
    got = {}
    before = len(mock.ledger())

    def held():
        got["r"] = gateway.submit(tok, key(), {"prompt": "x", "_mock": {"delay_ms": 4000}},
                                  headers={"Prefer": "wait=30"}, timeout=40)

    t = threading.Thread(target=held)
    t.start()
    deadline = time.monotonic() + 10
    while len(mock.ledger()) == before:  # held: its create is at the provider
        assert time.monotonic() < deadline
        time.sleep(0.02)
    subprocess.check_call([GATEWAY_BIN, "tenant", "revoke", name],
                          env=dict(os.environ, DATABASE_URL=database_url))
    t.join(45)
    assert got["r"].status == 401, (got["r"].status, got["r"].body[:300])
    assert b"data" not in got["r"].body


def test_job_list_tells_no_tenant_from_no_jobs(gateway, database_url):
    """One round trip proves the tenant: a stranger and a revoked tenant get 401 whether or not
    they would have jobs; a tenant without jobs gets an empty list."""
    import subprocess, os
    from conftest import GATEWAY_BIN
    name = "list-" + uuid.uuid4().hex[:8]
    tok = tenant_token(database_url, name)
    listing = lambda t, q="": gateway.http.request("GET", "/v1/jobs" + q,
                                                 headers={"Authorization": f"Bearer {t}"})
    r = listing(tok)
    assert r.status == 200 and r.json() == {"object": "list", "data": [], "has_more": False,
                                            "next_cursor": None}
    assert listing(tok, "?state=review").json()["data"] == []
    assert listing("not-a-tenant").status == 401
    job = gateway.submit(tok, key(), {"prompt": "x"}).json()["id"]
    assert [j["id"] for j in listing(tok).json()["data"]] == [job]
    assert listing(tok, "?state=failed").json()["data"] == []
    subprocess.check_call([GATEWAY_BIN, "tenant", "revoke", name],
                          env=dict(os.environ, DATABASE_URL=database_url))
    assert until_status(lambda: listing(tok), 401)
    assert listing(tok, "?state=failed").status == 401
    assert gateway.http.request("GET", f"/v1/jobs/{job}",
                                headers={"Authorization": f"Bearer {tok}"}).status == 401


def test_job_list_pages_newest_first_with_filters_and_refuses_unknown_parameters(
        gateway, database_url):
    """GET /v1/jobs (issue 24 §12): newest first, a page at a time through next_cursor until
    has_more is false; filters by state, provider and idempotency key; a parameter it does not
    take — a misspelt filter — or one given twice is a 400 naming it, never ignored."""
    tok = tenant_token(database_url, "pages-" + uuid.uuid4().hex[:8])
    auth = {"Authorization": f"Bearer {tok}"}
    listing = lambda q="": gateway.http.request("GET", "/v1/jobs" + q, headers=auth)
    keys = [key() for _ in range(7)]
    made = [gateway.submit(tok, k, {"prompt": "p%d" % i}).json()["id"] for i, k in enumerate(keys)]
    for j in made:
        gateway.wait_state(tok, j, {"completed"}, timeout=30)

    def pages(q):
        seen, cursor = [], None
        for _ in range(10):
            r = listing(q + (f"&starting_after={cursor}" if cursor else ""))
            assert r.status == 200, r.data
            body = r.json()
            assert len(body["data"]) <= 3
            seen += [j["id"] for j in body["data"]]
            if not body["has_more"]:
                assert body["next_cursor"] is None
                return seen
            cursor = body["next_cursor"]
        raise AssertionError("paging did not end")

    newest_first = list(reversed(made))
    assert pages("?limit=3") == newest_first
    assert pages("?limit=3&state=completed") == newest_first
    assert pages("?limit=3&provider=mock-images") == newest_first
    assert pages("?limit=3&provider=no-such-provider") == []
    assert pages("?limit=3&state=failed") == []
    assert [j["id"] for j in listing(f"?idempotency_key={keys[2]}").json()["data"]] == [made[2]]
    assert listing(f"?idempotency_key={keys[2]}&state=failed").json()["data"] == []
    assert [j["id"] for j in listing("?limit=2").json()["data"]] == newest_first[:2]

    for q, names in (("?stat=completed", "stat"), ("?limit=3&cursor=x", "cursor"),
                     ("?state=completed&state=failed", "state"), ("?limit=0", "limit"),
                     ("?limit=1001", "limit"), ("?limit=5x", "limit"),
                     ("?starting_after=job_x", "starting_after"), ("?state=done", "state")):
        r = listing(q)
        assert r.status == 400, (q, r.status)
        assert r.json()["type"] == "urn:idemgate:problem:invalid-query", r.json()
        assert names in r.json()["detail"], (q, r.json())


def test_a_list_page_is_cut_by_its_result_bodies(gateway_factory, database_url, psql):
    """A page holds at most 8 MiB of result bodies after its first job (jobpage.h): a page of
    1 000 jobs whose bodies are megabytes of base64 was held whole in one request's memory,
    several times over. Five jobs of 5 MB bodies come two to a page at limit 10, has_more set,
    in order; the operator's list pages the same way."""
    import hashlib
    admin = "admin-" + uuid.uuid4().hex
    gw = gateway_factory(admin_token_sha256=hashlib.sha256(admin.encode()).hexdigest())
    name = "bodies-" + uuid.uuid4().hex[:8]
    tok = tenant_token(database_url, name)
    made = [gw.submit(tok, key(), {"prompt": "p%d" % i}).json()["id"] for i in range(5)]
    for j in made:
        gw.wait_state(tok, j, {"completed"}, timeout=30)
    ids = ",".join(f"'{j}'" for j in made)
    psql("UPDATE operations SET resp_body = convert_to('\"' || repeat('x', 5000000) || '\"', "
         f"'UTF8') WHERE id IN ({ids})")

    def pages(path, token):
        got, cursor = [], None
        for _ in range(10):
            r = gw.http.request("GET", path + (f"&starting_after={cursor}" if cursor else ""),
                                headers={"Authorization": f"Bearer {token}"})
            assert r.status == 200, r.data[:300]
            body = r.json()
            assert all(len(j["result"]["body"]) == 5000000 for j in body["data"])
            # A tenant's list names no tenant; the operator's names the job's.
            assert all(j.get("tenant") == (name if token == admin else None)
                       for j in body["data"]), [j.get("tenant") for j in body["data"]]
            got.append([j["id"] for j in body["data"]])
            if not body["has_more"]:
                return got
            cursor = body["next_cursor"]
        raise AssertionError("paging did not end")

    newest_first = list(reversed(made))
    want = [newest_first[:2], newest_first[2:4], newest_first[4:]]
    assert pages("/v1/jobs?limit=10", tok) == want
    assert pages("/v1/jobs?limit=10&state=completed", tok) == want
    assert pages(f"/v1/admin/jobs?limit=10&tenant={name}", admin) == want
    assert pages(f"/v1/admin/jobs?limit=10&tenant={name}&state=completed", admin) == want


def test_tokens_are_stored_hashed(token, psql):
    rows = psql("SELECT token_sha256 FROM tenants")
    assert all(token not in r[0] for r in rows)
    import hashlib
    assert [hashlib.sha256(token.encode()).hexdigest()] in rows


def test_request_framing_is_checked(gateway, token):
    import socket
    body = b'{"prompt":"x"}'
    for extra in (b"Content-Length: 14\r\nContent-Length: 15\r\n",
                  b"Content-Length: 14\r\nTransfer-Encoding: chunked\r\n"):
        req = (b"POST /v1/providers/mock-images/images/generations HTTP/1.1\r\nHost: x\r\n"
               b"Authorization: Bearer " + token.encode() + b"\r\nIdempotency-Key: f\r\n"
               + extra + b"\r\n" + body)
        with socket.create_connection(("127.0.0.1", gateway.port)) as s:
            s.settimeout(5)
            s.sendall(req)
            resp = s.recv(65536)
        assert resp.startswith(b"HTTP/1.1 400"), (extra, resp[:200])


def raw_exchange(port, req, whole=False):
    """Sends req's bytes as they are on a new connection; answers its first read, or (whole)
    everything until the server closes or 5 s pass."""
    import socket
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(5)
        s.sendall(req)
        if not whole:
            return s.recv(65536)
        resp = b""
        try:
            while True:
                piece = s.recv(65536)
                if not piece:
                    return resp
                resp += piece
        except socket.timeout:
            return resp


def test_folded_and_unknown_transfer_codings_are_refused(gateway, token):
    """A folded header line (obs-fold) reached libmicrohttpd's parser as a renamed header
    ("Transfer-Encodingchunked"), out of the framing checks: the request was read without a
    body and the rest as the next request — a proxy that unfolds the line frames it otherwise.
    A Transfer-Encoding other than one `chunked` was read to the connection's end, a request
    pipelined behind it swallowed. Each is 400 bad-request-framing now, the connection closed."""
    nxt = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    cases = [
        b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + nxt,
        b"Content-Length: 37\r\n z\r\n\r\n" + nxt,
        b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + nxt,
        b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\n" + nxt,
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + nxt,
    ]
    for extra in cases:
        req = (b"POST /v1/jobs/job_x/cancel HTTP/1.1\r\nHost: x\r\n"
               b"Authorization: Bearer " + token.encode() + b"\r\n" + extra)
        resp = raw_exchange(gateway.port, req, whole=True)
        assert resp.startswith(b"HTTP/1.1 400"), (extra, resp[:300])
        assert resp.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in resp, (extra, resp)
    # HTTP/1.0 has no chunked coding: a Transfer-Encoding there is faulty framing too.
    req = (b"POST /v1/jobs/job_x/cancel HTTP/1.0\r\nHost: x\r\n"
           b"Authorization: Bearer " + token.encode() + b"\r\nTransfer-Encoding: chunked\r\n"
           b"\r\n0\r\n\r\n")
    resp = raw_exchange(gateway.port, req)
    assert resp.startswith(b"HTTP/1.") and b" 400 " in resp[:16], resp[:300]
    # One `chunked` (any case) is read as ever.
    req = (b"POST /v1/jobs/job_x/cancel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
           b"Authorization: Bearer " + token.encode() + b"\r\nTransfer-Encoding: Chunked\r\n"
           b"\r\n0\r\n\r\n")
    resp = raw_exchange(gateway.port, req)
    assert resp.startswith(b"HTTP/1.1 404"), resp[:300]


def test_health_and_readiness(gateway):
    assert gateway.http.request("GET", "/healthz").status == 200
    r = gateway.http.request("GET", "/readyz")
    assert r.status == 200, r
    assert r.json()["ready"] is True


def test_secret_is_sent_but_never_stored_or_logged(gateway, token, mock, psql):
    r = gateway.submit(token, key(), {"prompt": "a prompt that must not be logged"})
    job = gateway.wait_state(token, r.json()["id"], {"completed"})
    assert job["state"] == "completed"
    dump = "\n".join("\t".join(row) for row in psql(
        "SELECT o::text FROM operations o UNION ALL SELECT a::text FROM attempts a"))
    assert "sk-mock-secret" not in dump
    log = gateway.log()
    assert "sk-mock-secret" not in log
    assert "a prompt that must not be logged" not in log
    assert token not in log
