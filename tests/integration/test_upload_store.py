"""Large upload parts in the archive store (issue 25 §4): a part longer than
upload_part_inline_bytes is published to the archive store under its SHA-256 before the intent is
committed, the row keeps the part's headers and a reference, and every send — the first, a resend
after a refusal, a send by another process after a kill -9, a reconciler's resend — rebuilds the
client's bytes exactly. A store that cannot be read sends nothing and fails nothing: the job waits
and goes out once the store is back; an object gone for good past the provider's retry deadline
fails a job that was never sent (no task exists). Retention never lists an object a remaining job
refers to."""

import hashlib
import os
import re
import shutil
import subprocess
import time
import uuid

from conftest import GATEWAY_BIN, settle_tombstones
from test_multipart import ENV, edits_creates, edits_entry, form, post

MIB = 1 << 20
MAGIC = b"idemgate-upload/1\n"


def big_image(n=MIB):
    return os.urandom(n)


def obj_path(archive, sha):
    return os.path.join(archive, "objects", sha[:2], sha)


def unreadable_shard(archive, sha):
    """Makes the store's folder of object sha unreadable — a loop (the gateway runs as root
    here, so a chmod would not stop it) — and returns (the folder, where it was put aside)."""
    shard = os.path.join(archive, "objects", sha[:2])
    aside = shard + ".aside"
    os.rename(shard, aside)
    os.symlink(sha[:2], shard)
    return shard, aside


def row(psql, job_id):
    [[n, head]] = psql("SELECT octet_length(req_body), encode(substring(req_body FROM 1 FOR 18), "
                       f"'hex') FROM operations WHERE id = '{job_id}'")
    return int(n), bytes.fromhex(head)


def unreferenced(database_url, *shas):
    out = subprocess.run([GATEWAY_BIN, "unreferenced", *shas], capture_output=True, text=True,
                         env=dict(os.environ, DATABASE_URL=database_url))
    assert out.returncode == 0, out.stderr
    return sorted(out.stdout.split())


def ctype(boundary):
    return "multipart/form-data; boundary=" + boundary


def crash_then_send(gateway_factory, mock, token, psql, e, point, key, boundary, **dying_settings):
    """An upload to a gateway that kills itself at crash point `point` (build-test has them),
    then another gateway that takes the job over; returns (the client's body, the job when it
    ended, the creates the mock received for it). The row must name the store's object."""
    route = e["name"] + "/images/edits"
    dying = gateway_factory(providers=[e], env=dict(ENV, IDEMGATE_CRASH=point), **dying_settings)
    body = form(boundary, "pmi", image=big_image())
    try:
        post(dying, token, route, key, body, ctype(boundary), wait=0)
    except OSError:
        pass
    assert dying.proc.wait(timeout=20) != 0
    [[job_id]] = psql(f"SELECT id FROM operations WHERE idempotency_key = '{key}'")
    assert row(psql, job_id)[1] == MAGIC
    gw = gateway_factory(providers=[e], env=ENV)
    j = gw.wait_state(token, job_id, ("completed", "failed", "review"), timeout=60)
    return body, j, [c for c in edits_creates(mock) if c["client_ref"] == job_id]


def test_a_long_text_field_stays_in_the_row(gateway_factory, mock, token, psql, tmp_path):
    """Only files go to the store: a prompt longer than upload_part_inline_bytes beside a small
    image stays in the job's row. Before, any part over the threshold was published to the
    archive store — shared by every tenant, outliving the job — a prompt among them."""
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV)
    prompt = "a long prompt, word after word " * 3000  # ~90 KB, over the 64 KiB default
    body = form("up-text", "pmi", prompt=prompt)
    r = post(gw, token, name + "/images/edits", "up-text-" + uuid.uuid4().hex, body,
             ctype("up-text"))
    assert r.status == 200, r
    n, head = row(psql, r.headers["x-idemgate-job-id"])
    assert head != MAGIC and n == len(body), (n, len(body), head)
    sha = hashlib.sha256(prompt.encode()).hexdigest()
    assert not os.path.exists(obj_path(str(tmp_path / "archive"), sha))


def test_a_large_part_is_kept_in_the_store_and_sent_byte_exact(gateway_factory, mock, token,
                                                                psql, tmp_path, database_url):
    e, name = edits_entry(mock)
    gw = gateway_factory(providers=[e], env=ENV, janitor_interval_ms=100, job_cache_entries=0)
    route = name + "/images/edits"
    image = big_image()
    sha = hashlib.sha256(image).hexdigest()
    body = form("up-1", "pmi", image=image)
    r = post(gw, token, route, "up-key-1", body, ctype("up-1"))
    assert r.status == 200, r
    job_id = r.headers["x-idemgate-job-id"]

    # The row: the table and the part's headers, not its megabyte; the object under its hash.
    n, head = row(psql, job_id)
    assert head == MAGIC
    assert n < 65536 + 2048, n
    archive = str(tmp_path / "archive")
    with open(obj_path(archive, sha), "rb") as f:
        assert f.read() == image
    # The provider got the client's bytes exactly, once.
    [c] = edits_creates(mock)
    assert c["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert c["content_type"] == ctype("up-1")

    # The same request again (another boundary: the same fingerprint): a replay, no create; the
    # same object, published again: its time made now (a store's cleaner deletes only objects
    # older than a few minutes that no job names; one named again now is not old — it kept the
    # time of its first write).
    day_ago = time.time() - 86400
    os.utime(obj_path(archive, sha), (day_ago, day_ago))
    again = form("up-2", "imp", image=image)
    r2 = post(gw, token, route, "up-key-1", again, ctype("up-2"))
    assert r2.status == 200, r2
    assert r2.headers.get("idempotent-replayed") == "true"
    assert r2.headers["x-idemgate-job-id"] == job_id
    assert len(edits_creates(mock)) == 1
    assert os.stat(obj_path(archive, sha)).st_mtime > day_ago + 3600, "published, left old"
    # Its directory holds it once, and nothing half-written (objects are named by their whole
    # hash; another object there — the job's output, archived — may share the first two digits).
    listing = os.listdir(os.path.join(archive, "objects", sha[:2]))
    assert listing.count(sha) == 1, listing
    assert all(re.fullmatch(r"[0-9a-f]{64}", f) for f in listing), listing

    # Retention: the referenced object is never listed for deletion; once the job is gone
    # (expired, deleted by the janitor) it is.
    other = hashlib.sha256(b"nobody's").hexdigest()
    assert unreferenced(database_url, sha, other) == [other]
    psql(f"UPDATE operations SET expires_at = now() - interval '1 hour' WHERE id = '{job_id}'")
    deadline = time.monotonic() + 30
    while psql(f"SELECT count(*) FROM operations WHERE id = '{job_id}'") != [["0"]]:
        assert time.monotonic() < deadline, "the janitor did not delete the expired job"
        settle_tombstones(psql)
        time.sleep(0.1)
    assert unreferenced(database_url, sha, other) == sorted([sha, other])

    # Small parts stay in the row: an upload with no part over the threshold is stored whole.
    small = form("up-3", "pmi", image=b"tiny" * 100)
    r3 = post(gw, token, route, "up-key-small", small, ctype("up-3"))
    assert r3.status == 200, r3
    n3, head3 = row(psql, r3.headers["x-idemgate-job-id"])
    assert n3 == len(small) and head3 == small[:18]


def test_without_the_store_an_upload_stays_whole_in_the_row(gateway_factory, mock, token, psql,
                                                             tmp_path):
    """upload_part_inline_bytes 0: every upload whole in the row, as before. And a store that
    cannot take the parts (its folder cannot be made) costs no request: the row keeps the whole
    upload, and the log says why."""
    e, name = edits_entry(mock)
    off = gateway_factory(providers=[e], env=ENV, upload_part_inline_bytes=0)
    (tmp_path / "not-a-folder").write_text("")
    broken = gateway_factory(providers=[e], env=ENV,
                             archive_dir=str(tmp_path / "not-a-folder" / "archive"))
    for gw, key in ((off, "whole-1"), (broken, "whole-2")):
        body = form(key, "pmi", image=big_image(200000))
        r = post(gw, token, name + "/images/edits", key, body, ctype(key))
        assert r.status == 200, r
        assert row(psql, r.headers["x-idemgate-job-id"]) == (len(body), body[:18])
        assert edits_creates(mock)[-1]["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert "upload_kept_in_row" in broken.log() and "upload_kept_in_row" not in off.log()


def test_resends_rebuild_the_same_bytes(gateway_factory, mock, token, psql):
    """A refusal then a resend, and a gateway killed (-9) after the intent's commit whose job
    another process sends: each create carries the client's bytes."""
    e, name = edits_entry(mock)
    route = name + "/images/edits"
    gw = gateway_factory(providers=[e], env=ENV)
    mock.script([{"status": 429}])
    body = form("rs-1", "nmpi", image=big_image())
    r = post(gw, token, route, "resend-1", body, ctype("rs-1"))
    assert r.status == 200, r
    creates = edits_creates(mock)
    assert [c["status"] for c in creates] == [429, 200], creates
    assert {c["body_sha256"] for c in creates} == {hashlib.sha256(body).hexdigest()}

    # Killed right after the commit: nothing sent yet; the next process sends it.
    # (No dispatcher in the dying one: its own would race the crash point and may send first.)
    body2, j, mine = crash_then_send(gateway_factory, mock, token, psql, e,
                                     "after_intent_commit:1", "resend-2", "rs-2",
                                     dispatch_workers=0)
    assert j["state"] == "completed", j
    assert [c["body_sha256"] for c in mine] == [hashlib.sha256(body2).hexdigest()]


def test_a_reconcilers_resend_after_a_kill_is_byte_exact(gateway_factory, mock, token, psql):
    """A provider with native keys: killed after the provider answered, before the result was
    committed; the reaper makes the job unknown and the reconciler resends it under the same key,
    rebuilt from the row and the store."""
    e, _ = edits_entry(mock)
    e["idempotency"] = {"header": "Idempotency-Key"}
    e["reconcile"] = {"strategy": "idempotent_resubmit", "window_seconds": 600,
                      "interval_ms": 200}
    body, j, mine = crash_then_send(gateway_factory, mock, token, psql, e, "after_response:1",
                                    "reconcile-1", "rk-1")
    assert j["state"] == "completed", j
    assert len(mine) == 2, mine
    assert {c["body_sha256"] for c in mine} == {hashlib.sha256(body).hexdigest()}
    assert {c["idempotency_key"] for c in mine} == {j["id"]}


def test_a_reconcilers_resend_waits_out_a_store_outage_without_spending_attempts(
        gateway_factory, mock, token, psql, tmp_path):
    """The reconciler's resend under the provider's key counted a transport attempt, then found
    the upload's object unreadable and sent nothing: each reconcile interval of a store's outage
    spent one, and once they were spent the job went to review with nothing resent. The upload
    is rebuilt before the attempt is counted: the job waits `unknown`, its attempts untouched,
    and is resent once the store is back."""
    e, _ = edits_entry(mock)
    e["idempotency"] = {"header": "Idempotency-Key"}
    e["reconcile"] = {"strategy": "idempotent_resubmit", "window_seconds": 600,
                      "interval_ms": 200}
    route = e["name"] + "/images/edits"
    key = "outage-" + uuid.uuid4().hex
    dying = gateway_factory(providers=[e], env=dict(ENV, IDEMGATE_CRASH="after_response:1"))
    image = big_image()
    sha = hashlib.sha256(image).hexdigest()
    body = form("ou-1", "pmi", image=image)
    try:
        post(dying, token, route, key, body, ctype("ou-1"), wait=0)
    except OSError:
        pass
    assert dying.proc.wait(timeout=20) != 0
    [[job_id]] = psql(f"SELECT id FROM operations WHERE idempotency_key = '{key}'")
    shard, aside = unreadable_shard(str(tmp_path / "archive"), sha)
    gw = gateway_factory(providers=[e], env=ENV)
    deadline = time.monotonic() + 60
    while gw.log().count('"event":"upload_unreadable"') < 3:  # three resends blocked
        assert time.monotonic() < deadline, gw.log()[-2000:]
        time.sleep(0.1)
    [[state, tries]] = psql(f"SELECT state, transport_attempts FROM operations "
                            f"WHERE id = '{job_id}'")
    assert (state, tries) == ("unknown", "1"), (state, tries)
    mine = [c for c in edits_creates(mock) if c["client_ref"] == job_id]
    assert len(mine) == 1, mine  # the dying gateway's create only
    os.remove(shard)
    os.rename(aside, shard)
    j = gw.wait_state(token, job_id, ("completed", "failed", "review"), timeout=60)
    assert j["state"] == "completed", j
    mine = [c for c in edits_creates(mock) if c["client_ref"] == job_id]
    assert len(mine) == 2, mine
    assert {c["body_sha256"] for c in mine} == {hashlib.sha256(body).hexdigest()}
    assert {c["idempotency_key"] for c in mine} == {job_id}


def prepared_between_tries(gw, token, job_id, timeout=20):
    """The job as it is between two tries to send it: `prepared` (a try holds it `sending`)."""
    deadline = time.monotonic() + timeout
    while True:
        j = gw.job(token, job_id).json()
        if j["state"] == "prepared" or time.monotonic() > deadline:
            assert j["state"] == "prepared", j
            return j
        assert j["state"] == "sending", j
        time.sleep(0.02)


def test_an_unreadable_store_sends_nothing_and_fails_nothing(gateway_factory, mock, token, psql,
                                                            tmp_path, database_url):
    e, name = edits_entry(mock)
    route = name + "/images/edits"
    archive = str(tmp_path / "archive")
    gw = gateway_factory(providers=[e], env=ENV, dispatch_workers=0)  # records, never sends
    image = big_image()
    sha = hashlib.sha256(image).hexdigest()
    body = form("un-1", "pmi", image=image)
    r = post(gw, token, route, "unreadable-1", body, ctype("un-1"), wait=0)
    assert r.status == 202, r
    job_id = r.json()["id"]
    assert os.path.exists(obj_path(archive, sha))

    # The store cannot be read: nothing is sent, the job waits `prepared` and says why.
    shard, aside = unreadable_shard(archive, sha)
    sender = gateway_factory(providers=[e], env=ENV)
    deadline = time.monotonic() + 20
    while "store_unavailable" not in sender.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "upload_unreadable" in sender.log()
    # Each try claims it (`sending`) and writes it back: read it between two tries.
    j = prepared_between_tries(gw, token, job_id)
    assert "store_unavailable" in j["last_error"], j
    assert edits_creates(mock) == []
    # A live job's object is never listed for deletion.
    assert unreferenced(database_url, sha) == []

    # The object missing (the folder back, without it): still nothing sent, still not failed.
    os.remove(shard)
    os.mkdir(shard)
    deadline = time.monotonic() + 20
    while "object_missing" not in sender.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    prepared_between_tries(gw, token, job_id)
    assert edits_creates(mock) == []

    # Back: sent, byte for byte, once.
    os.rmdir(shard)
    os.rename(aside, shard)
    j = sender.wait_state(token, job_id, ("completed", "failed", "review"), timeout=30)
    assert j["state"] == "completed", j
    [c] = edits_creates(mock)
    assert c["body_sha256"] == hashlib.sha256(body).hexdigest()
    # The log never holds the upload's bytes.
    assert image[:32].hex() not in sender.log()


def test_an_object_gone_for_good_fails_a_job_never_sent(gateway_factory, mock, token, tmp_path):
    """Past the provider's retry deadline with its object gone, a job that was never sent (no
    task can exist, nothing was paid) is failed, and says why."""
    e, name = edits_entry(mock)
    e["retry"] = dict(e["retry"], deadline_seconds=2)
    archive = str(tmp_path / "archive")
    gw = gateway_factory(providers=[e], env=ENV, dispatch_workers=0)
    image = big_image()
    sha = hashlib.sha256(image).hexdigest()
    r = post(gw, token, name + "/images/edits", "gone-1", form("g-1", "pmi", image=image),
             ctype("g-1"), wait=0)
    assert r.status == 202, r
    job_id = r.json()["id"]
    shutil.move(obj_path(archive, sha), str(tmp_path / "lost"))
    sender = gateway_factory(providers=[e], env=ENV)
    j = sender.wait_state(token, job_id, ("completed", "failed", "review"), timeout=30)
    assert j["state"] == "failed", j
    assert "object_missing" in j["last_error"] and "nothing was sent" in j["last_error"], j
    assert edits_creates(mock) == []
