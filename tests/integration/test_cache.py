"""The terminal-job cache answers exactly what the database would."""

import uuid

from conftest import tenant_token


def test_cached_replays_and_reads_match_the_database(gateway_factory, token, mock, database_url):
    gw = gateway_factory()
    k = "cache-" + uuid.uuid4().hex
    first = gw.submit(token, k, {"prompt": "x"})
    job_id = first.json()["id"]
    done = gw.wait_state(token, job_id, {"completed"})
    uncached = gw.submit(token, k, {"prompt": "x"})  # read from the database, then remembered
    cached = gw.submit(token, k, {"prompt": "x"})
    assert uncached.status == cached.status == 202
    assert uncached.body == cached.body and cached.json()["id"] == job_id
    assert cached.headers["idempotent-replayed"] == "true"
    assert cached.headers["location"] == f"/v1/jobs/{job_id}"
    assert gw.submit(token, k, {"prompt": "y"}).status == 422, "a cached key still refuses reuse"
    waited = gw.submit(token, k, {"prompt": "x"}, headers={"Prefer": "wait=5"})
    assert waited.status == 200 and waited.json()["data"] and \
        waited.headers["x-idemgate-state"] == "completed"
    assert gw.job(token, job_id).json() == gw.job(token, job_id).json() == \
        gw.wait_state(token, job_id, {"completed"})
    assert gw.job(token, job_id).json()["updated_at"] == done["updated_at"]
    # Another tenant: neither the key nor the job id answers from this tenant's entries.
    other = tenant_token(database_url)
    assert gw.job(other, job_id).status == 404
    theirs = gw.submit(other, k, {"prompt": "y"})
    assert theirs.status == 202 and theirs.json()["id"] != job_id
    assert len(mock.creates_for(job_id)) == 1


def test_without_cache(gateway_factory, token, mock):
    gw = gateway_factory(job_cache_entries=0)
    k = "nocache-" + uuid.uuid4().hex
    j = gw.submit(token, k, {"prompt": "x"}).json()
    gw.wait_state(token, j["id"], {"completed"})
    assert gw.submit(token, k, {"prompt": "x"}).json()["id"] == j["id"]
    assert gw.submit(token, k, {"prompt": "z"}).status == 422
