"""Multipart uploads (issue 25 §4): an image edit's multipart/form-data body is accepted on a
route whose profile says so, fingerprinted by what it means (names, filenames, content types, a
SHA-256 of each part: not the boundary, not the order of differently named fields), recorded as
the client sent it and forwarded byte for byte with its own boundary, on the first send and on a
resend. The mock's ledger keeps the SHA-256 and the Content-Type of every create it received."""

import hashlib
import json
import os
import time
import uuid

from conftest import ROOT

PROFILES = os.path.join(ROOT, "deploy", "providers")
ENV = {"OPENAI_API_KEY": "sk-test-edits"}
PNG = b"\x89PNG\r\n\x1a\n\x00\x01\x02 not a delimiter: \r\n--b0 --b1" + bytes(range(256)) * 4


def edits_entry(mock):
    """The shipped OpenAI images profile at the mock, under a name of this test's own."""
    name = "oaiedits" + uuid.uuid4().hex[:6]
    return {"name": name, "profile": os.path.join(PROFILES, "openai-images.json"),
            "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 5000},
            "retry": {"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50, "cap_ms": 200},
            "archive": {"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True}}, name


def form(boundary, order="pmi", prompt="a cat in a hat", image=PNG, closing=True):
    """A multipart/form-data body: p(rompt), m(odel), n, i(mage) in the order given."""
    out = b""
    for w in order:
        out += b"--" + boundary.encode() + b"\r\n"
        if w == "p":
            out += b'Content-Disposition: form-data; name="prompt"\r\n\r\n' + prompt.encode()
        elif w == "m":
            out += b'Content-Disposition: form-data; name="model"\r\n\r\ngpt-image-1'
        elif w == "n":
            out += b'Content-Disposition: form-data; name="n"\r\n\r\n2'
        else:
            out += (b'Content-Disposition: form-data; name="image"; filename="cat.png"\r\n'
                    b"Content-Type: image/png\r\n\r\n" + image)
        out += b"\r\n"
    if closing:
        out += b"--" + boundary.encode() + b"--\r\n"
    return out


def post(gw, token, route, key, body, ctype, wait=20):
    h = {"Authorization": f"Bearer {token}", "Content-Type": ctype, "Prefer": f"wait={wait}"}
    if key:
        h["Idempotency-Key"] = key
    return gw.http.request("POST", f"/v1/providers/{route}", body, h, timeout=wait + 10)


def edits_creates(mock):
    return [c for c in mock.ledger() if c["route"] == "/v1/images/edits"]


def test_an_upload_is_forwarded_as_sent_and_replayed_by_what_it_means(gateway_factory, mock,
                                                                      token):
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV)
    route = name + "/images/edits"
    first = form("b1", "pmi")
    r = post(gw, token, route, "edit-1", first, "multipart/form-data; boundary=b1")
    assert r.status == 200, r
    assert len(r.json()["data"]) == 1
    job_id = r.headers["x-idemgate-job-id"]
    creates = edits_creates(mock)
    assert len(creates) == 1, creates
    assert creates[0]["body_sha256"] == hashlib.sha256(first).hexdigest()
    assert creates[0]["content_type"] == "multipart/form-data; boundary=b1"

    # The same fields under another boundary, in another order, quoted: the same request.
    again = form("----Other Boundary:7MA4", "imp")
    r2 = post(gw, token, route, "edit-1", again,
              'multipart/form-data; boundary="----Other Boundary:7MA4"')
    assert r2.status == 200, r2
    assert r2.headers.get("idempotent-replayed") == "true"
    assert r2.body == r.body
    assert r2.headers["x-idemgate-job-id"] == job_id
    assert len(edits_creates(mock)) == 1

    # Another image under the key: a different request, refused, nothing sent.
    other = form("b1", "pmi", image=PNG + b"!")
    r3 = post(gw, token, route, "edit-1", other, "multipart/form-data; boundary=b1")
    assert r3.status == 422, r3
    assert "body" in r3.json()["detail"]
    # Another filename, same bytes: also different.
    renamed = first.replace(b'filename="cat.png"', b'filename="dog.png"')
    r4 = post(gw, token, route, "edit-1", renamed, "multipart/form-data; boundary=b1")
    assert r4.status == 422, r4
    assert len(edits_creates(mock)) == 1

    # A JSON body on the same route still goes as JSON.
    r5 = gw.submit(token, "edit-json", {"prompt": "x", "model": "gpt-image-1"}, route=route,
                   headers={"Prefer": "wait=20"})
    assert r5.status == 200, r5
    assert edits_creates(mock)[-1]["content_type"] == "application/json"


def test_a_resent_upload_is_the_same_bytes(gateway_factory, mock, token):
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV)
    mock.script([{"status": 429}])  # refused before any work: sent again, after a backoff
    body = form("resend-boundary", "nmpi")
    r = post(gw, token, name + "/images/edits", "edit-resend", body,
             "multipart/form-data; boundary=resend-boundary")
    assert r.status == 200, r
    assert len(r.json()["data"]) == 2  # n=2 read from the text field
    creates = edits_creates(mock)
    assert [c["status"] for c in creates] == [429, 200], creates
    digest = hashlib.sha256(body).hexdigest()
    assert {c["body_sha256"] for c in creates} == {digest}
    assert {c["content_type"] for c in creates} == {"multipart/form-data; boundary=resend-boundary"}


def test_uploads_refused_plainly(gateway_factory, mock, token):
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV, max_body_bytes=2048, max_upload_bytes=8192)
    edits, gens = name + "/images/edits", name + "/images/generations"
    ct = "multipart/form-data; boundary=b1"

    r = post(gw, token, gens, "u-1", form("b1"), ct, wait=0)
    assert r.status == 415, r
    assert "images/generations takes JSON bodies" in r.json()["detail"]

    r = post(gw, token, edits, "u-2", form("b1"), "multipart/mixed; boundary=b1", wait=0)
    assert r.status == 415, r

    for body, ctype, why in [
        (form("b1", closing=False), ct, "does not end with a delimiter"),
        (b"preamble\r\n" + form("b1"), ct, "does not begin with its boundary"),
        (form("b1"), "multipart/form-data", "no valid boundary"),
        (form("b1"), "multipart/form-data; boundary=b1; boundary=b2", "no valid boundary"),
        (form("b1").replace(b"Content-Type: image/png", b"Content-Transfer-Encoding: binary"),
         ct, "a header other than"),
        # The boundary inside a part, where a lenient reader sees a hidden part n=10.
        (form("b1", prompt="--b1\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n10"),
         ct, "holds its boundary"),
    ]:
        r = post(gw, token, edits, "u-" + uuid.uuid4().hex, body, ctype, wait=0)
        assert r.status == 400, (why, r)
        assert why in r.json()["detail"], (why, r)

    # The caps: an upload under max_upload_bytes but over max_body_bytes goes through; over
    # max_upload_bytes it is refused; a JSON body keeps max_body_bytes.
    big = form("b1", image=b"x" * 5000)
    r = post(gw, token, edits, "u-big", big, ct, wait=20)
    assert r.status == 200, r
    r = post(gw, token, edits, "u-huge", form("b1", image=b"x" * 9000), ct, wait=0)
    assert r.status == 413, r
    assert "8192" in r.json()["detail"]
    # Text fields are held to the body cap, the upload's being for files: they are read and
    # copied as a JSON body is.
    r = post(gw, token, edits, "u-text", form("b1", prompt="y" * 5000), ct, wait=0)
    assert r.status == 413, r
    assert "text fields" in r.json()["detail"] and "2048" in r.json()["detail"], r.json()
    r = gw.submit(token, "u-json", {"prompt": "y" * 3000}, route=edits)
    assert r.status == 413, r
    assert "2048" in r.json()["detail"]
    # The upload cap is the route's: an upload to a route that takes none keeps the body cap,
    # so nobody makes a connection hold max_upload_bytes by naming the type alone.
    r = post(gw, token, gens, "u-gens-big", big, ct, wait=0)
    assert r.status == 413, r
    assert "2048" in r.json()["detail"]
    assert len(edits_creates(mock)) == 1  # only the one upload that was accepted


def test_a_video_from_an_uploaded_reference(gateway_factory, mock, token):
    """OpenAI's videos take their input reference as an upload: the shipped profile's create
    route takes multipart, and the async job goes on as any (accepted, polled, completed)."""
    name = "oaivideos" + uuid.uuid4().hex[:6]
    profile = os.path.join(PROFILES, "openai-videos.json")
    with open(profile) as f:
        poll = dict(json.load(f)["poll"], interval_ms=100, max_interval_ms=200)
    gw = gateway_factory(providers=[{
        "name": name, "profile": profile, "base_url": mock.url,
        "timeouts": {"connect_ms": 1000, "total_ms": 5000}, "poll": poll}], env=ENV)
    b = b"----vid"
    body = (b"--" + b + b"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsora-2\r\n"
            b"--" + b + b"\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na wave\r\n"
            b"--" + b + b"\r\nContent-Disposition: form-data; name=\"input_reference\"; "
            b"filename=\"ref.png\"\r\nContent-Type: image/png\r\n\r\n" + PNG + b"\r\n"
            b"--" + b + b"--\r\n")
    r = post(gw, token, name + "/videos", "video-ref-1", body,
             "multipart/form-data; boundary=----vid", wait=0)
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = gw.wait_state(token, job_id, ("completed", "failed", "review"), timeout=30)
    assert j["state"] == "completed", j
    [create] = [c for c in mock.ledger() if c["route"] == "/v1/videos"]
    assert create["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert create["content_type"] == "multipart/form-data; boundary=----vid"


def test_a_field_a_provider_may_read_otherwise_is_refused(gateway_factory, mock, token):
    """`model=gpt-image-1` then `model=dall-e-2` in one body: the gateway priced (and
    fingerprinted) the first value, a provider whose parser keeps the last generates the other —
    a request paid at a fraction of its price, past any budget. Refused now (400), nothing
    recorded or sent; so is a name holding an escape. A list named name[] goes through."""
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV)
    route = name + "/images/edits"
    before = len(edits_creates(mock))
    b = "amb-" + uuid.uuid4().hex[:8]
    repeated = (form(b, "pmi", closing=False) + b"--" + b.encode() + b"\r\n"
                b'Content-Disposition: form-data; name="model"\r\n\r\ndall-e-2\r\n'
                + b"--" + b.encode() + b"--\r\n")
    r = post(gw, token, route, "amb-" + uuid.uuid4().hex, repeated,
             "multipart/form-data; boundary=" + b)
    assert r.status == 400 and "model" in r.json()["detail"], r
    escaped = (form(b, "pi", closing=False) + b"--" + b.encode() + b"\r\n"
               b'Content-Disposition: form-data; name="mo\\del"\r\n\r\ngpt-image-1\r\n'
               + b"--" + b.encode() + b"--\r\n")
    r = post(gw, token, route, "amb-" + uuid.uuid4().hex, escaped,
             "multipart/form-data; boundary=" + b)
    assert r.status == 400, r
    time.sleep(0.3)
    assert len(edits_creates(mock)) == before
    listed = (form(b, "pmi", closing=False) + b"--" + b.encode() + b"\r\n"
              b'Content-Disposition: form-data; name="tags[]"\r\n\r\na\r\n'
              + b"--" + b.encode() + b"\r\n"
              b'Content-Disposition: form-data; name="tags[]"\r\n\r\nb\r\n'
              + b"--" + b.encode() + b"--\r\n")
    r = post(gw, token, route, "amb-" + uuid.uuid4().hex, listed,
             "multipart/form-data; boundary=" + b)
    assert r.status == 200, r


def test_a_part_where_the_gateways_reference_lives_is_refused(gateway_factory, mock, token):
    """A provider entry that sends the job's id at `metadata.client_ref`, which webhooks and
    task reads echo back to find the job (across tenants: the id is the gateway's). The gateway
    cannot place it in a multipart body, and sent the client's own `metadata[client_ref]` part
    as it was: a tenant could name another tenant's job there, and a webhook echoing it would
    have adopted the tenant's task into that job. Such a part is refused now (422
    client-ref-unplaceable, as a JSON body holding the member is), nothing recorded or sent; a
    body without it goes through."""
    e, name = edits_entry(mock)
    e["client_ref"] = {"body_field": "metadata.client_ref"}
    gw = gateway_factory(providers=[e], env=ENV)
    route = name + "/images/edits"
    before = len(edits_creates(mock))
    b = "ref-" + uuid.uuid4().hex[:8]
    for part in (b"metadata[client_ref]", b"metadata"):
        body = (form(b, "pmi", closing=False) + b"--" + b.encode() + b"\r\n"
                b'Content-Disposition: form-data; name="' + part + b'"\r\n\r\n'
                b"job_someone_elses\r\n" + b"--" + b.encode() + b"--\r\n")
        r = post(gw, token, route, "ref-" + uuid.uuid4().hex, body,
                 "multipart/form-data; boundary=" + b)
        assert r.status == 422, r
        assert r.json()["type"] == "urn:idemgate:problem:client-ref-unplaceable", r.json()
    time.sleep(0.3)
    assert len(edits_creates(mock)) == before
    r = post(gw, token, route, "ref-" + uuid.uuid4().hex, form(b, "pmi"),
             "multipart/form-data; boundary=" + b)
    assert r.status == 200, r
    assert len(edits_creates(mock)) == before + 1
