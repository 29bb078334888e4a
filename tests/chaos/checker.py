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
import os
import re
import time
import urllib.request

FINAL = ("completed", "failed", "canceled", "review")
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


# --- the randomised campaign (campaign.py) -----------------------------------------------------------
#
# On top of check(): every job of the run (intents and regenerations) against the provider's ledger
# and tasks, the database and what the API answered over time.

STATES_C = os.path.join(os.path.dirname(__file__), "..", "..", "src", "states.c")
STATE_NAMES = ("prepared", "sending", "accepted", "unknown", "review", "completed", "failed",
               "canceled")
SYNC_EXACT_BODY = ("plain", "listed", "keyed")  # kinds whose creates carry the client's bytes
# LLM text (chat, background Responses): a record of events, no task; see check_streams().
STREAM_KINDS = ("chat", "respond")


def transitions(path=STATES_C):
    """{state: {next states}} as src/states.c allows them (the `allowed[]` table)."""
    src = open(path).read()
    table = src[src.index("allowed[ST__COUNT]"):]
    table = table[:table.index("};")]
    out = {s: set() for s in STATE_NAMES}
    for m in re.finditer(r"\[ST_([A-Z]+)\]\s*=\s*([^,]*)", table):
        frm = m.group(1).lower()
        out[frm] = {t.lower() for t in re.findall(r"B\(ST_([A-Z]+)\)", m.group(2))}
    return out


def reachable(allowed):
    """{state: every state reachable from it in one or more steps}."""
    out = {}
    for s in allowed:
        seen, todo = set(), list(allowed[s])
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                todo.extend(allowed.get(x, ()))
        out[s] = seen
    return out


def backwards(samples, final_state, closure):
    """The first pair of observations (a before b: a answered before b was asked) where b is
    not a's state nor reachable from it; None when the sequence is monotone. samples: objects
    with t0, t1, state, src. The database's state after the drain comes last."""
    obs = sorted(samples, key=lambda s: s.t0)
    if final_state:
        obs.append(type("Final", (), {"t0": float("inf"), "t1": float("inf"),
                                       "state": final_state, "src": "db-after-drain"})())
    for i, a in enumerate(obs):
        for b in obs[i + 1:]:
            if b.t0 <= a.t1:
                continue  # overlapping requests: no order between them
            if b.state == a.state:
                continue
            if a.state == "(missing)" or b.state == "(missing)" or \
                    b.state not in closure.get(a.state, ()):
                return a, b
    return None


def _data_len(body):
    """The outputs a stored sync result holds: its data, or (a task object) its result's."""
    if not isinstance(body, dict):
        return 0
    for doc in (body, body.get("result")):
        if isinstance(doc, dict) and isinstance(doc.get("data"), list):
            return len(doc["data"])
    return 0


def _has_data(body):
    if not isinstance(body, dict):
        return False
    for doc in (body, body.get("result")):
        if isinstance(doc, dict) and isinstance(doc.get("data"), list) and doc["data"]:
            return True
    return False


def check_campaign(scenario, camp, data, timing):
    """Returns (summary, evidence): the summary line (violation counts, unknown keys, the run's
    figures) and, per violation, the jobs with what the ledger, the tasks, the database and the
    API said about them."""
    closure = reachable(transitions())
    ledger_all = data["ledger"]
    rows, views, tasks = data["rows"], data["views"], data["tasks"]
    regen_ids = {r["job_id"] for r in camp.regen_requests if r.get("job_id")}
    regen_ids |= {jid for jid, r in rows.items() if r["key"].endswith("-r")}
    base_entries = [e for e in ledger_all if e.get("client_ref") not in regen_ids]
    ran = [ix for ix, o in enumerate(camp.outcomes) if o is not None and o.attempts]
    outcomes = [camp.outcomes[ix] for ix in ran]
    base = check(scenario, outcomes, camp.sqlf, base_entries, camp.pfx, timing["drain_s"])

    # Every ledger entry to its job: by reference, else by the canonical body of an intent.
    key_of = {r["key"]: jid for jid, r in rows.items()}
    by_hash = {}
    for ix in ran:
        it = camp.intents[ix]
        jid = key_of.get(it.key)
        if jid:
            by_hash[it.body_sha256] = jid
    entries_of = collections.defaultdict(list)
    for e in ledger_all:
        jid = e.get("client_ref") if e.get("client_ref") in rows else by_hash.get(
            e.get("body_sha256"))
        if jid:
            entries_of[jid].append(e)
    kind_of = {}
    for ix in ran:
        jid = key_of.get(camp.intents[ix].key)
        if jid:
            kind_of[jid] = camp.plan_of[ix].kind
    for jid, r in rows.items():
        if jid not in kind_of:
            j = camp.job(jid)
            kind_of[jid] = j.kind if j else r["provider"].split("-")[0]

    def paid(jid):
        return [e for e in entries_of[jid] if not e.get("replay") and e.get("task_id")]

    def task_ids(jid):
        return {e["task_id"] for e in entries_of[jid] if e.get("task_id")}

    v = collections.defaultdict(list)     # violation -> [job ids or keys]
    why = {}                              # (violation, job) -> a sentence
    exact_mismatch = 0
    for jid, r in rows.items():
        j = camp.job(jid)
        kind = kind_of[jid]
        state = r["state"]
        ack = j.cancel_ack if j else None
        abandoned = r["resolution"] == "abandon"
        ps = paid(jid)
        if len(ps) > 1 and jid in regen_ids:
            v["duplicates"].append(jid)
            why[("duplicates", jid)] = f"{len(ps)} paid creates for one regeneration"
        # A create after the cancel was acknowledged. When the cancel found the job `sending`,
        # the one create then in flight may reach the provider after the answer.
        if ack:
            after = sorted((e for e in entries_of[jid] if e["time"] > ack["t1"]),
                           key=lambda e: e["time"])
            sends = data.get("sends", {}).get(jid, [])
            # Creates whose bytes left before the acknowledgement may be read by the provider
            # after it (a busy provider reads a connection's body from the kernel's buffer after
            # the gateway timed out): as many as the gateway's sends started before the answer
            # outnumber the ledger's entries received before it. When the cancel found the job
            # `sending`, the one create then in flight is such a send.
            # A lease that expired while sending (its sender died or stalled) stands for a send
            # whose bytes may have left before the lease ran out.
            before = sum(1 for a in sends if a["started"] <= ack["t1"] and
                         (a["bytes_sent"] > 0 or a.get("outcome") == "lease_expired"))
            # Answered `sending` with no transfer running: the claim that committed `sending`
            # before the cancel hands its create to the call engine, which may start it after
            # the answer, or its sender died mid-send and the reaper's row (no start of its own)
            # comes after the answer. That one is the create in flight, besides the earlier
            # sends the provider had not read yet; any later one is a violation.
            running = any(a["started"] <= ack["t1"] < a.get("finished", a["started"])
                          for a in sends if a["bytes_sent"] > 0)
            pending = 1 if ack.get("state") == "sending" and not running else 0
            seen = sum(1 for e in entries_of[jid] if e["time"] <= ack["t1"])
            in_flight = max(before + pending - seen, 1 if ack.get("state") == "sending" else 0)
            after = after[in_flight:]
            # The gateway's own attempts: a create that started after the acknowledgement.
            late = sorted((a for a in sends if a["started"] > ack["t1"] and a["bytes_sent"] > 0),
                          key=lambda a: a["started"])
            late = late[pending:]
            if late and not after:
                v["create_after_cancel"].append(jid)
                why[("create_after_cancel", jid)] = (
                    f"cancel acknowledged at {ack['t1']:.3f} (state {ack.get('state')}); the "
                    f"gateway started sending the create again at "
                    f"{[round(a['started'], 3) for a in late]}")
            if after:
                v["create_after_cancel"].append(jid)
                why[("create_after_cancel", jid)] = (
                    f"cancel acknowledged at {ack['t1']:.3f} (state {ack.get('state')}); "
                    f"creates at {[round(e['time'], 3) for e in after]} "
                    f"(paid: {[bool(e.get('task_id')) and not e.get('replay') for e in after]})")
        view = views.get(jid)
        if state == "completed" and kind not in STREAM_KINDS:   # see check_streams()
            res = view.get("result") if isinstance(view, dict) else None
            if kind in ("kasync", "replicate"):
                t = tasks.get(r["remote_id"])
                outs = res.get("outputs") if isinstance(res, dict) else None
                if not r["remote_id"] or t is None:
                    v["completed_without_outputs"].append(jid)
                    why[("completed_without_outputs", jid)] = \
                        f"async job completed with remote id {r['remote_id']!r}, no such task"
                elif t.get("status") == "succeeded" and (t.get("outputs") or 0) > 0 and \
                        not (isinstance(outs, list) and outs):
                    v["completed_without_outputs"].append(jid)
                    why[("completed_without_outputs", jid)] = (
                        f"task {r['remote_id']} succeeded with {t.get('outputs')} outputs; "
                        f"the job's result.outputs is {outs!r}")
                elif t.get("status") == "succeeded" and isinstance(outs, list) and \
                        len(outs) < (t.get("outputs") or 0):
                    v["completed_with_fewer_outputs"].append(jid)
                    why[("completed_with_fewer_outputs", jid)] = (
                        f"task {r['remote_id']} delivered {t.get('outputs')} outputs; the job "
                        f"lists {len(outs)}")
            else:
                body = res.get("body") if isinstance(res, dict) else None
                if not (isinstance(res, dict) and 200 <= (res.get("status") or 0) < 300
                        and _has_data(body)):
                    v["completed_without_outputs"].append(jid)
                    why[("completed_without_outputs", jid)] = (
                        "sync job completed without a stored result holding data: "
                        + json.dumps(res if res is not None else view)[:300])
                held = _data_len(body)
                got = r.get("outputs_received", -1)
                if held and got < held:
                    v["completed_with_fewer_outputs"].append(jid)
                    why[("completed_with_fewer_outputs", jid)] = (
                        f"the stored result holds {held} outputs; outputs_received is "
                        f"{got if got >= 0 else 'not recorded'}")
        res = view.get("result") if isinstance(view, dict) else None
        body = res.get("body") if isinstance(res, dict) else None
        if state == "completed" and kind not in ("kasync", "replicate") + STREAM_KINDS and \
                isinstance(body, dict) and body.get("id") and body["id"] not in task_ids(jid):
            v["wrong_task"].append(jid)
            why[("wrong_task", jid)] = (f"the stored result is task {body['id']}'s, not a task "
                                        f"made for this job ({sorted(task_ids(jid))})")
        if r["remote_id"] and state in ("completed", "accepted") and kind not in STREAM_KINDS and \
                r["remote_id"] not in task_ids(jid):
            v["wrong_task"].append(jid)
            why[("wrong_task", jid)] = (f"remote id {r['remote_id']} is not a task made for this "
                                        f"job ({sorted(task_ids(jid))})")
        # Never failed while a task exists, cancelled or not (a found task is the truth): only
        # an operator's abandon, or the task's own failure, leaves one behind.
        if state == "canceled" and not (r["remote_id"] and r["remote_id"] in task_ids(jid)):
            v["canceled_without_task"].append(jid)
            why[("canceled_without_task", jid)] = (
                f"canceled with remote id {r['remote_id']!r}; the provider made "
                f"{sorted(task_ids(jid))}")
        if state == "failed" and ps and not abandoned:
            alive = []
            for e in ps:
                t = tasks.get(e["task_id"]) if kind in ("kasync", "replicate") else None
                st = t.get("status") if t else "succeeded"
                if st != "failed":
                    alive.append((e["task_id"], st))
            if alive:
                v["failed_with_task"].append(jid)
                why[("failed_with_task", jid)] = (f"failed ({r['last_error']!r}) while the "
                                                  f"provider holds {alive}")
        if j is not None:
            bad = backwards(j.samples, state, closure)
            if bad:
                a, b = bad
                v["state_backwards"].append(jid)
                why[("state_backwards", jid)] = (
                    f"{a.state} ({a.src}, answered {a.t1:.3f}) then {b.state} ({b.src}, asked "
                    f"{b.t0:.3f})")
            for rs in j.resubmits:
                if rs.get("job_id") not in (None, jid) or (rs["status"] == 202 and
                                                           not rs["replayed"]) or \
                        rs.get("job_id") is None or (rs["status"] >= 400 and
                                                     not rs.get("replayed")):
                    v["replay_mismatch"].append(jid)
                    why[("replay_mismatch", jid)] = f"a resubmit of the same key was answered {rs}"
                    break
        if kind in SYNC_EXACT_BODY and j is not None and j.parent is None:
            it = camp.intents[j.ix]
            exact_mismatch += sum(1 for e in entries_of[jid]
                                  if e.get("client_ref") == jid
                                  and e.get("body_sha256") != it.body_sha256)
    for ru in camp.reuses:
        if ru["status"] in (200, 202):
            v["key_reuse_accepted"].append(ru["job_id"])
            why[("key_reuse_accepted", ru["job_id"])] = \
                f"the same key with another body was answered {ru['status']}"
        if any(e.get("body_sha256") == ru["body_sha256"] for e in ledger_all):
            v["key_reuse_accepted"].append(ru["job_id"])
            why[("key_reuse_accepted", ru["job_id"])] = "the other body reached the provider"
    for d in getattr(camp, "decoys", []):
        if d["status"] is not None and 200 <= d["status"] < 300:
            v["foreign_adoption"].append(d["job"])
            why[("foreign_adoption", d["job"])] = (
                f"the tenant adopted {d['remote_id']}, a task made for another job, with "
                f"resolve found: answered {d['status']}")
    # A per-request refusal (402/403 without a marker the profile declares) is about that
    # request, not the credential: it never trips the provider for every tenant.
    for prov, status in data.get("trips", []):
        if status in (402, 403):
            v["tripped_by_request"].append(prov)
            why[("tripped_by_request", prov)] = f"{prov} was tripped by an HTTP {status}"
    for rg in camp.regen_requests:
        jid = rg.get("job_id")
        if jid and (jid not in rows or rows[jid]["state"] in NOT_FINAL):
            v["lost"].append(jid)
            why[("lost", jid)] = f"regeneration {jid} is {rows.get(jid, {}).get('state')}"

    stream_counts = check_streams(camp, data, rows, entries_of, kind_of, v, why)

    # The intents' own counts come from check(); the job ids of its lists are added here.
    key_to_job = {r["key"]: jid for jid, r in rows.items()}
    for name in ("lost", "duplicates", "id_mismatch", "stuck", "failed_but_created"):
        for key in base["_detail"].get(name, []):
            jid = key_to_job.get(key, key)
            v[name].append(jid)
            why.setdefault((name, jid), f"check(): {name} for key {key}")
    unknown = [jid for jid, r in rows.items() if r["state"] == "unknown"]
    for jid in unknown:
        why.setdefault(("unknown_after_drain", jid), "still unknown after the drain")
    v["unknown_after_drain"] = unknown

    counts = {k: len(set(v.get(k, []))) for k in CAMPAIGN_VIOLATIONS}
    counts["unexpected"] = base["unexpected"]
    states = collections.Counter(r["state"] for r in rows.values())
    summary = collections.OrderedDict(scenario=scenario)
    for k in ("intents", "acknowledged"):
        summary[k] = base[k]
    summary.update(counts)
    summary.update({
        "review": states.get("review", 0), "completed": states.get("completed", 0),
        "failed": states.get("failed", 0), "canceled": states.get("canceled", 0),
        "jobs": len(rows),
        "creates": sum(len(paid(j)) for j in rows), "replays": sum(
            1 for e in ledger_all if e.get("replay")),
        "client": base["client"], "hash_mismatch": exact_mismatch,
    })
    summary.update(stream_counts)
    summary.update(timing)
    if unknown:
        summary["unknown_keys"] = [rows[j]["key"] for j in unknown][:20]
    evidence = []
    for name in CAMPAIGN_VIOLATIONS:
        for jid in sorted(set(v.get(name, [])))[:10]:
            evidence.append(job_evidence(camp, data, name, jid, why.get((name, jid)),
                                         entries_of.get(jid, []), kind_of.get(jid)))
    if base["_detail"].get("unexpected_seqs"):
        seqs = set(base["_detail"]["unexpected_seqs"])
        evidence.append({"violation": "unexpected", "why": "ledger entries linked to no intent",
                         "ledger": [_entry(e) for e in ledger_all if e.get("seq") in seqs]})
    return summary, evidence


CAMPAIGN_VIOLATIONS = ("lost", "duplicates", "unexpected", "id_mismatch", "stuck",
                       "failed_but_created", "unknown_after_drain", "create_after_cancel",
                       "completed_without_outputs", "completed_with_fewer_outputs",
                       "canceled_without_task", "tripped_by_request", "wrong_task",
                       "failed_with_task",
                       "state_backwards", "replay_mismatch", "key_reuse_accepted",
                       "foreign_adoption",
                       # streamed LLM text and multipart uploads (check_streams)
                       "replay_not_identical", "whole_without_record", "stream_not_whole",
                       "cut_not_in_doubt", "upload_bytes_mismatch", "job_document_as_200",
                       # background Responses streams, resumed (check_streams)
                       "resumed_not_prefix", "record_not_whole")


# --- streamed LLM text and multipart uploads ---------------------------------------------------------

# The openai-chat stream's terminal event, and the Responses stream's (its last event's type): a
# stream that ends without it was cut.
CHAT_TERMINAL = b"data: [DONE]\n\n"
RESPONSES_TERMINAL = "response.completed"


def _is_stream(ctype):
    return bool(ctype) and ctype.startswith("text/event-stream")


def _whole(a):
    """An answer a client received whole: a 200 whose body ended normally."""
    return a.status == 200 and a.error is None and a.body is not None


def _complete(body, ctype, kind="chat"):
    """A whole answer's body is what it claims: a stream ending with its terminal event, or a
    chat.completion document (a Responses `response`, ended)."""
    if _is_stream(ctype):
        if kind == "respond":
            evs = sse_events(body)
            return body.endswith(b"\n\n") and bool(evs) and evs[-1][0] == RESPONSES_TERMINAL
        return body.endswith(CHAT_TERMINAL)
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return False
    if kind == "respond":
        return isinstance(doc, dict) and doc.get("object") == "response" and \
            doc.get("status") in ("completed", "incomplete")
    return isinstance(doc, dict) and isinstance(doc.get("choices"), list)


def check_streams(camp, data, rows, entries_of, kind_of, v, why):
    """The promise for chats (streamed or whole, clients joining one key) and uploads; adds
    violations to v (with a sentence in why) and returns the summary's counts.

    chat:
    - duplicates: more than one generation at the provider for one key (ledger entries that
      started one: `replay` false; a 429 refusal before the first event starts none);
    - id_mismatch: clients of one key answered with different jobs;
    - stream_not_whole: a 200 whose body ended normally but is not whole (a stream without its
      terminal event, a whole answer that is not a chat.completion): the gateway must cut a
      live client's body when the provider's stream was cut, so that the client knows;
    - replay_not_identical: a completed job whose record, asked twice with the same key and
      body, is not answered 200 twice byte for byte (ending with its terminal event), or a
      whole answer some client received differs from that record;
    - whole_without_record: a client received a whole answer of a job that did not complete
      (nothing can replay it);
    - cut_not_in_doubt: a job whose provider generated (a ledger entry with `replay` false)
      that ended `failed`, or whose stream was planned to be cut (`cut_after`, `error_after`,
      events past the provider timeout) and ended anything but `unknown` / `review`;
    - job_document_as_200: `Prefer: wait` answered 200 with the job's document for a job that is
      not `completed` (one that failed without a provider answer is a 502 `job-failed` with the
      job's headers: an SDK must never read it as the provider's success).
    respond (a background Responses stream: `"stream": true, "background": true`): as chat for
    duplicates, id_mismatch, stream_not_whole (whole: its last event `response.completed`),
    whole_without_record and job_document_as_200, and
    - record_not_whole: a completed job whose record (as the database holds it) is not one
      whole event sequence — `sequence_number` 0, 1, … n in order, one `response.completed`,
      last (a response read back whole, a JSON document, is not: the events its clients were
      given are lost from it);
    - replay_not_identical: as chat, and the replay is the record's bytes;
    - resumed_not_prefix: a stream a client was given (whole, cut, or left early) that is not
      the start of the completed job's record, byte for byte; while the job is in doubt, one
      of it and the record kept so far is not the start of the other;
    - cut_not_in_doubt: the provider generated (a ledger entry with `replay` false) and the
      job ended `failed`: a cut background response is resumed (completed) or, when the
      campaign ended first, still unknown / in review — never failed.
    upload:
    - upload_bytes_mismatch: a create whose SHA-256 or Content-Type is not the client's
      upload's (the first send and every resend, after a 429 too);
    - duplicates: more than one accepted create (2xx, `replay` false) for one key.
    """
    stats = collections.Counter()
    slot_of = {}
    for ix, it in enumerate(camp.intents):
        if it is not None:
            slot_of[it.key] = ix
    for jid, r in rows.items():
        kind = kind_of.get(jid)
        if kind not in ("chat", "upload", "respond"):
            continue
        ix = slot_of.get(r["key"])
        j = camp.job(jid)
        if ix is None and j is not None:
            ix = j.ix
        if ix is None:
            continue
        it = camp.intents[ix]
        ents = entries_of.get(jid, [])
        if kind == "upload":
            stats["uploads"] += 1
            stats["uploads_in_store"] += bool(r.get("upload_in_store"))
            bad = [e for e in ents if e.get("body_sha256") != it.body_sha256 or
                   e.get("content_type") != it.content_type]
            if bad:
                v["upload_bytes_mismatch"].append(jid)
                why[("upload_bytes_mismatch", jid)] = (
                    f"sent {len(bad)} of {len(ents)} times with other bytes or type: "
                    f"{[(e.get('seq'), e.get('body_sha256', '')[:12], e.get('content_type')) for e in bad[:4]]}"
                    f"; the upload is {it.body_sha256[:12]} {it.content_type!r}")
            accepted = [e for e in ents if not e.get("replay") and
                        200 <= (e.get("status") or 0) < 300]
            if len(accepted) > 1:
                v["duplicates"].append(jid)
                why[("duplicates", jid)] = f"{len(accepted)} accepted creates for one upload"
            stats["upload_resends"] += len(ents) > 1
            stats["upload_429s"] += sum(1 for e in ents if e.get("status") == 429)
            continue
        gens = [e for e in ents if not e.get("replay")]
        if kind == "respond":
            _check_respond(camp, data, jid, r, ix, gens, v, why, stats)
        else:
            _check_chat(camp, data, jid, r, ix, gens, v, why, stats)
    return {k: stats.get(k, 0) for k in (
        "chats", "streams", "joins", "whole_answers", "cut_answers", "failed_job_as_200",
        "replays_identical",
        "cut_in_doubt", "chat_refused", "uploads", "uploads_in_store", "upload_resends",
        "upload_429s", "responses", "respond_joins", "respond_whole_answers", "respond_cut_answers",
        "resumed", "resume_cuts", "resume_in_doubt", "respond_refused", "prefixes_checked",
        "read_back_whole", "respond_replays_identical")}


def _llm_answers(camp, jid, r, ix, gens, v, why, stream):
    """What every LLM text key promises, chat or background response: one generation at the
    provider, every client named the one job, a `Prefer: wait` answered with the job document
    only for a completed job, and a 200 that ended normally is whole. Returns (every answer
    the key's clients received, the whole ones, the joined-key flag, the job documents)."""
    kind = camp.plan_of[ix].kind
    if len(gens) > 1:
        v["duplicates"].append(jid)
        why[("duplicates", jid)] = (f"{len(gens)} generations at the provider for one "
                                    f"{'streamed ' if stream else ''}{kind} key")
    clients = camp.chat_clients.get(ix, [])
    named = {a.job_id or a.doc_job_id for o in clients for a in o.attempts
             if a.job_id or a.doc_job_id}
    if len(named) > 1 or (named and jid not in named):
        v["id_mismatch"].append(jid)
        why[("id_mismatch", jid)] = f"clients of one key were answered with jobs {named}"
    answers = list(camp.received.get(r["key"], []))
    whole = [a for a in answers if _whole(a)]
    # A job that never had a provider answer is answered with the job's headers (a 502
    # job-failed when it failed); a 200 job document is only for a completed one.
    doc200 = [a for a in answers if a.doc_job_id and a.state != "completed"]
    if doc200:
        v["job_document_as_200"].append(jid)
        why[("job_document_as_200", jid)] = (
            f"Prefer: wait answered 200 with the job document of a {doc200[0].state} job")
    for a in whole:
        if not _complete(a.body, a.content_type, kind):
            v["stream_not_whole"].append(jid)
            why[("stream_not_whole", jid)] = (
                f"a 200 ({a.content_type}) ended normally without being whole: "
                f"…{a.body[-80:]!r}")
            break
    return answers, whole, len(clients) > 1, len(doc200)


def _replays_verdict(rep, stream, whole, kind):
    """Whether a completed job's two replays after the drain are 200, byte-identical, whole and
    what every client received whole: (True, None) or (False, what is wrong)."""
    ok = len(rep) == 2 and all(x["status"] == 200 and not x["error"] and x["body"] for x in rep)
    if ok and rep[0]["body"] != rep[1]["body"]:
        return False, "the two replays differ"
    if not ok:
        return False, f"the replays were answered {[(x['status'], x['error']) for x in rep]}"
    if _is_stream(rep[0]["content_type"]) != stream or \
            not _complete(rep[0]["body"], rep[0]["content_type"], kind):
        return False, (f"the replay ({rep[0]['content_type']}) is not whole: "
                       f"…{rep[0]['body'][-80:]!r}")
    diff = [a for a in whole if a.body != rep[0]["body"]]
    if diff:
        return False, (f"{len(diff)} of {len(whole)} whole answers received differ from the "
                       f"record ({len(diff[0].body)} vs {len(rep[0]['body'])} bytes, replayed "
                       f"{diff[0].replayed})")
    return True, None


def _check_chat(camp, data, jid, r, ix, gens, v, why, stats):
    """A chat key (see check_streams): its record replayed identically, or it is in doubt."""
    it, p = camp.intents[ix], camp.plan_of[ix]
    state = r["state"]
    stream = bool(it.body.get("stream"))
    stats["chats"] += 1
    stats["streams"] += stream
    answers, whole, joined, doc200 = _llm_answers(camp, jid, r, ix, gens, v, why, stream)
    stats["joins"] += joined
    stats["whole_answers"] += len(whole)
    stats["cut_answers"] += sum(1 for a in answers if a.error == "cut")
    stats["failed_job_as_200"] += doc200
    planned_cut = stream and p.chat["behaviour"] in ("cut", "error", "timeout")
    if state == "completed":
        rep = (data.get("chat_replays") or {}).get(jid, {}).get("answers", [])
        ok, what = _replays_verdict(rep, stream, whole, "chat")
        if ok:
            stats["replays_identical"] += 1
        else:
            v["replay_not_identical"].append(jid)
            why[("replay_not_identical", jid)] = what
    elif whole:
        v["whole_without_record"].append(jid)
        why[("whole_without_record", jid)] = (
            f"{len(whole)} client(s) received a whole answer; the job is {state}")
    if gens and state == "failed":
        v["cut_not_in_doubt"].append(jid)
        why[("cut_not_in_doubt", jid)] = (f"the provider generated (ledger "
                                          f"{[e.get('seq') for e in gens]}); the job failed")
    elif planned_cut and gens and state not in ("unknown", "review"):
        v["cut_not_in_doubt"].append(jid)
        why[("cut_not_in_doubt", jid)] = (f"a stream cut before its terminal event "
                                          f"({p.body['_mock']}) ended {state}")
    if gens and state in ("unknown", "review"):
        stats["cut_in_doubt"] += 1
    if not gens and state == "failed":
        stats["chat_refused"] += 1


def _check_respond(camp, data, jid, r, ix, gens, v, why, stats):
    """A background Responses key (see check_streams): a cut stream is resumed after its last
    whole event, so the record is one event sequence and whatever any client was given — whole,
    cut, or left early — is its start."""
    p = camp.plan_of[ix]
    state = r["state"]
    rec = (data.get("records") or {}).get(jid)
    steps = (data.get("resume_steps") or {}).get(jid, [])
    stats["responses"] += 1
    answers, whole, joined, doc200 = _llm_answers(camp, jid, r, ix, gens, v, why, True)
    stats["respond_joins"] += joined
    stats["respond_whole_answers"] += len(whole)
    stats["respond_cut_answers"] += sum(1 for a in answers if a.error == "cut")
    stats["failed_job_as_200"] += doc200
    stats["resumed"] += any(x.endswith(":resumed") for x in steps)
    stats["resume_cuts"] += any(x.endswith(":resumed_partial") for x in steps)
    is_events = bool(rec) and not rec.lstrip().startswith(b"{")
    if state == "completed":
        fault = sequence_fault(rec)
        if fault:
            v["record_not_whole"].append(jid)
            why[("record_not_whole", jid)] = (f"completed ({p.chat['behaviour']}, "
                                              f"{p.body['_mock']}, attempts {steps}); its "
                                              f"record {fault}")
        stats["read_back_whole"] += bool(rec) and not is_events
        rep = (data.get("chat_replays") or {}).get(jid, {}).get("answers", [])
        ok, what = _replays_verdict(rep, True, whole, "respond")
        if ok and is_events and rep[0]["body"] != rec:
            # The replay of a stream recorded as such is the record's bytes, not a synthesis.
            ok, what = False, (f"the replay ({len(rep[0]['body'])} bytes) is not the record the "
                               f"database holds ({len(rec)} bytes)")
        if ok:
            stats["respond_replays_identical"] += 1
        else:
            v["replay_not_identical"].append(jid)
            why[("replay_not_identical", jid)] = what
    elif whole:
        v["whole_without_record"].append(jid)
        why[("whole_without_record", jid)] = (
            f"{len(whole)} client(s) received a whole answer; the job is {state}")
    # Every stream a client was given is the start of the record: of the final one when the
    # job completed; while it is in doubt, it and the record kept so far are both the start of
    # the one sequence (whichever is longer).
    given = [a for a in answers if a.status == 200 and _is_stream(a.content_type) and a.body]
    stats["prefixes_checked"] += len(given) if state == "completed" or is_events else 0
    if state == "completed":
        bad = [a for a in given if not (is_events and rec.startswith(a.body))]
    elif is_events:
        bad = [a for a in given if not (rec.startswith(a.body) or a.body.startswith(rec))]
    else:
        bad = []
    if bad:
        a = bad[0]
        at = _diverges_at(a.body, rec or b"")
        v["resumed_not_prefix"].append(jid)
        why[("resumed_not_prefix", jid)] = (
            f"{len(bad)} of {len(given)} streams given ({a.error or 'whole'}, {len(a.body)} "
            f"bytes, port {a.port}) are not the start of the {state} job's record "
            f"({len(rec or b'')} bytes{'' if is_events else ', not events'}); they differ at "
            f"byte {at}: given {a.body[at:at + 60]!r}, record {(rec or b'')[at:at + 60]!r}")
    # The provider generated: a background response goes on at the provider and is resumed or
    # read back, never failed (only its own failure fails it, and none is drawn).
    if gens and state == "failed":
        v["cut_not_in_doubt"].append(jid)
        why[("cut_not_in_doubt", jid)] = (f"the provider generated (ledger "
                                          f"{[e.get('seq') for e in gens]}); the background "
                                          f"response failed (attempts {steps})")
    if gens and state in ("unknown", "review"):
        stats["resume_in_doubt"] += 1
    if not gens and state == "failed":
        stats["respond_refused"] += 1


def _diverges_at(a, b):
    """The first byte where a and b differ (the shorter one's length when one starts the
    other)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def sse_events(body):
    """The whole events of a server-sent-events body, in order: [(event type or None, data
    bytes)]; a last event cut before its blank line is left out."""
    out = []
    for block in body.split(b"\n\n")[:-1]:
        ev, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                ev = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip())
        out.append((ev, b"\n".join(data)))
    return out


def sequence_fault(rec):
    """None when rec is one whole Responses event sequence — every event's data a JSON object
    whose `sequence_number` is its place (0, 1, … n: nothing repeated, nothing missing), one
    `response.completed`, last; else what is wrong with it (for the evidence)."""
    if not rec:
        return "is empty"
    if rec.lstrip().startswith(b"{"):
        return "is a JSON document (the response read back whole), not the events"
    if not rec.endswith(b"\n\n"):
        return f"ends inside an event: …{rec[-60:]!r}"
    evs = sse_events(rec)
    for i, (ev, raw) in enumerate(evs):
        try:
            doc = json.loads(raw)
        except ValueError:
            return f"has event {i} ({ev}) without JSON data: {raw[:80]!r}"
        n = doc.get("sequence_number") if isinstance(doc, dict) else None
        if not isinstance(n, int) or isinstance(n, bool) or n != i:
            return (f"has event {i} ({ev}) numbered {n!r}: the numbers are "
                    f"{[_seq_of(x) for _, x in evs][:40]}")
    types = [ev for ev, _ in evs]
    if types.count(RESPONSES_TERMINAL) != 1 or types[-1] != RESPONSES_TERMINAL:
        return f"does not end with its one {RESPONSES_TERMINAL} event: {types[-4:]}"
    return None


def _seq_of(raw):
    try:
        return json.loads(raw).get("sequence_number")
    except (ValueError, AttributeError):
        return None


def campaign_violations(summary):
    return {k: summary[k] for k in CAMPAIGN_VIOLATIONS if summary.get(k)}


def _entry(e):
    keep = ("seq", "time", "route", "provider", "status", "fault", "behavior", "replay", "task_id",
            "idempotency_key", "client_ref", "client_ref_source", "body_sha256", "content_type")
    return {k: e.get(k) for k in keep if k in e}


def job_evidence(camp, data, violation, jid, why, entries, kind):
    row = data["rows"].get(jid)
    j = camp.job(jid)
    t0 = camp.t0 or 0.0
    ev = {"violation": violation, "why": why, "job": jid, "kind": kind, "row": row,
          "ledger": [_entry(e) for e in sorted(entries, key=lambda e: e.get("seq", 0))],
          "tasks": {e["task_id"]: {k: data["tasks"][e["task_id"]].get(k)
                                   for k in ("status", "outputs", "cancels", "polls")}
                    for e in entries if e.get("task_id") in data["tasks"]}}
    if j is not None:
        seq = []
        for s in sorted(j.samples, key=lambda s: s.t0):
            if not seq or seq[-1][0] != s.state or seq[-1][1] != s.src:
                seq.append((s.state, s.src, round(s.t0 - t0, 3), round(s.t1 - t0, 3)))
        ev.update(key=j.key, parent=j.parent, cancel_ack=j.cancel_ack, cancels=j.cancels,
                  resolutions=j.resolutions, resubmits=j.resubmits, states=seq[:60])
    if row is not None:
        ev["attempts"] = camp.attempts_of(jid)
    if kind in STREAM_KINDS and row is not None:
        ev["answers"] = [{"status": a.status, "error": a.error, "port": a.port,
                          "t": round(a.t0 - t0, 3), "replayed": a.replayed,
                          "content_type": a.content_type,
                          "bytes": len(a.body) if a.body is not None else None,
                          "tail": a.body[-60:].decode("utf-8", "replace") if a.body else None}
                         for a in camp.received.get(row["key"], [])][:20]
        rep = (data.get("chat_replays") or {}).get(jid)
        if rep:
            ev["replays"] = [dict(x, body=(x["body"] or b"")[-60:].decode("utf-8", "replace"),
                                  bytes=len(x["body"] or b"")) for x in rep["answers"]]
    if kind == "respond" and row is not None:
        rec = (data.get("records") or {}).get(jid)
        p = camp.plan_of[j.ix] if j is not None else None
        ev["respond"] = {
            "behaviour": p.chat["behaviour"] if p else None,
            "mock": p.body.get("_mock") if p else None,
            "record_bytes": len(rec) if rec is not None else None,
            "record_head": rec[:120].decode("utf-8", "replace") if rec else None,
            "record_tail": rec[-120:].decode("utf-8", "replace") if rec else None,
            "record_events": [ev_type for ev_type, _ in sse_events(rec or b"")][:40],
            "steps": (data.get("resume_steps") or {}).get(jid)}
    view = data["views"].get(jid)
    if isinstance(view, dict):
        ev["view"] = {k: view.get(k) for k in ("state", "remote_id", "last_error", "attempts",
                                                "result", "outputs", "resolution",
                                                "cancel_requested_at", "unread", "answer")}
        if isinstance(ev["view"].get("result"), dict):
            ev["view"]["result"] = json.dumps(ev["view"]["result"])[:600]
    ev["t0"] = t0
    return ev
