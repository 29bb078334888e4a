"""The checker: compares what clients were told with what PostgreSQL holds and what the provider
(the counting mock) actually received.

After a bounded drain (every job of the run terminal or in review, or the time is up) it counts:

- lost        a 202 whose job has no durable row, or whose row is still prepared / sending /
              accepted after the drain (it never reached a terminal state, review or unknown);
- duplicates  intents with more than one real create at the provider: ledger entries with
              `replay` false that made a task, linked to the intent by `client_ref` (the job id)
              *or* by the SHA-256 of the body as sent (catches creates never linked to a job);
- unexpected  ledger entries no intent asked for (neither the reference nor the body matches),
              and creates for an intent that has no durable row at all;
- unknown_after_drain  jobs still `unknown` (their keys are listed);
- review      jobs in `review`;
and, beyond the brief: id_mismatch (answers for one key naming different jobs, or a job that is
not the row's), stuck (a durable row no client was acknowledged for that never progressed),
failed_but_created (a definite 4xx to the client, yet a create), hash_mismatch (the body the
provider got is not the canonical body of the intent its reference names).

A create is "real" when the mock made a task for it (`task_id` set): a create the provider
refused with a 4xx/5xx made nothing and is a legitimate back-off retry, not a duplicate.
"""

import collections
import json
import time
import urllib.request

FINAL = ("completed", "failed", "review")
NOT_FINAL = ("prepared", "sending", "accepted")


def ledger(mock_url):
    with urllib.request.urlopen(mock_url + "/_ledger", timeout=30) as r:
        return json.load(r)["creates"]


def _like(prefix):
    assert all(c.isalnum() or c == "-" for c in prefix), prefix
    return prefix + "%"


def rows(sqlf, prefix):
    """{(token_sha256, key): {id, state, remote_id, body_sha256}} for the run's keys."""
    q = ("SELECT t.token_sha256, o.idempotency_key, o.id, o.state, coalesce(o.remote_id, ''), "
         "encode(sha256(o.req_body), 'hex') FROM operations o "
         "JOIN tenants t ON t.id = o.tenant_id "
         f"WHERE o.idempotency_key LIKE '{_like(prefix)}'")
    out = {}
    for tok, key, jid, state, remote, bh in sqlf(q):
        out[(tok, key)] = {"id": jid, "state": state, "remote_id": remote, "body_sha256": bh}
    return out


def state_counts(sqlf, prefix):
    q = ("SELECT state, count(*) FROM operations "
         f"WHERE idempotency_key LIKE '{_like(prefix)}' GROUP BY state")
    return {s: int(n) for s, n in sqlf(q)}


def drain(sqlf, prefix, timeout=60.0, interval=0.2, final=FINAL):
    """Waits until every job of the run is terminal or in review, at most `timeout` seconds.
    Returns (seconds waited, state counts)."""
    start = time.monotonic()
    while True:
        counts = state_counts(sqlf, prefix)
        if all(s in final for s in counts) or time.monotonic() - start >= timeout:
            return time.monotonic() - start, counts
        time.sleep(interval)


def check(scenario, outcomes, sqlf, entries, prefix, drain_s=0.0, **extra):
    intents = [o.intent for o in outcomes]
    hashes = collections.Counter(i.body_sha256 for i in intents)
    assert max(hashes.values(), default=1) == 1, "every intent needs a body of its own"
    db = rows(sqlf, prefix)
    row_of = [db.get((i.token_sha256, i.key)) for i in intents]
    by_job = {r["id"]: ix for ix, r in enumerate(row_of) if r}
    by_hash = {i.body_sha256: ix for ix, i in enumerate(intents)}

    linked = collections.defaultdict(list)
    unexpected, hash_mismatch = [], 0
    for e in entries:
        ix = by_job.get(e.get("client_ref"))
        if ix is not None:
            if e.get("body_sha256") != intents[ix].body_sha256:
                hash_mismatch += 1
        else:
            ix = by_hash.get(e.get("body_sha256"))
            if ix is None or row_of[ix] is None:
                unexpected.append(e.get("seq"))
                continue
        linked[ix].append(e)

    def paid(ix):
        return [e for e in linked[ix] if not e.get("replay") and e.get("task_id")]

    lost, id_mismatch, stuck, failed_but_created, dups = [], [], [], [], []
    unknown_keys, review, states = [], 0, collections.Counter()
    client = collections.Counter(o.result for o in outcomes)
    for ix, o in enumerate(outcomes):
        r = row_of[ix]
        key = o.intent.key
        if r:
            states[r["state"]] += 1
            if r["state"] == "unknown":
                unknown_keys.append(key)
            if r["state"] == "review":
                review += 1
        if o.acknowledged:
            if r is None or r["state"] in NOT_FINAL:
                lost.append(key)
            if len(o.job_ids) != 1 or (r is not None and r["id"] not in o.job_ids):
                id_mismatch.append(key)
        elif r is not None and r["state"] in NOT_FINAL:
            stuck.append(key)
        if len(paid(ix)) > 1:
            dups.append(key)
        if o.result == "failed" and paid(ix):
            failed_but_created.append(key)

    summary = {
        "scenario": scenario,
        "intents": len(outcomes),
        "acknowledged": sum(1 for o in outcomes if o.acknowledged),
        "lost": len(lost),
        "duplicates": len(dups),
        "unexpected": len(unexpected),
        "unknown_after_drain": len(unknown_keys),
        "review": review,
        "completed": states.get("completed", 0),
        "failed": states.get("failed", 0),
        "creates": sum(len(paid(ix)) for ix in range(len(outcomes))),
        "replays": sum(1 for e in entries if e.get("replay")),
        "client": {"ok": client.get("ok", 0), "failed": client.get("failed", 0),
                   "unknown": client.get("unknown", 0)},
        "id_mismatch": len(id_mismatch),
        "stuck": len(stuck),
        "failed_but_created": len(failed_but_created),
        "hash_mismatch": hash_mismatch,
        "drain_s": round(drain_s, 2),
    }
    summary.update(extra)
    if unknown_keys:
        summary["unknown_keys"] = unknown_keys[:20]
    detail = {"lost": lost[:20], "duplicates": dups[:20], "unexpected_seqs": unexpected[:20],
              "id_mismatch": id_mismatch[:20], "stuck": stuck[:20],
              "failed_but_created": failed_but_created[:20]}
    summary["_detail"] = {k: v for k, v in detail.items() if v}
    return summary


def violations(summary):
    keys = ("lost", "duplicates", "unexpected", "id_mismatch", "stuck", "failed_but_created")
    return {k: summary[k] for k in keys if summary.get(k)}


def public(summary):
    """The summary without the detail lists (those go to the assertion message)."""
    return {k: v for k, v in summary.items() if not k.startswith("_")}
