"""The seeded randomised fault campaign (issue 10, section E; TESTING.md "Beyond hand-picked
scenarios").

One run, from one seed:

- **Plan.** `make_plan(seed, sizes)` draws, with `random.Random(seed)`, everything the campaign
  decides: each intent's provider, tenant, body, start time, `Prefer: wait`, and the driver's
  actions on it (cancel, resubmit under the same key, the same key with another body,
  regenerate) with their delays; the moments of the faults (replica kill -9, replica SIGSTOP
  past its lease, PostgreSQL immediate stop, mock lookup/list outages and connection refusals,
  unrelated tasks); the operator's decisions on jobs in review (and its attempts to adopt
  another job's task); the mock's own PRNG seed and behaviour weights (random mode) or, without
  random mode, each intent's `_mock` controls.
- **Run.** `Campaign.run()` starts two gateway replicas (kill -9'd and restarted by the
  replicas.py supervisor), drives the intents from a thread pool with the client driver
  (client.py: same key on anything not definite), samples every job's state through
  `GET /v1/jobs/{id}`, resolves jobs found in `review` from the mock's ground truth, applies the
  faults at their moments, then drains (bounded) and collects the ledger, the mock's tasks, the
  database rows and every job as the API shows it.
- **Check.** `checker.check_campaign()` (see checker.py) turns that into one summary line and
  a list of violations, each with its evidence.

Only thread interleavings and process timings are not fixed by the seed: a replay
(`CAMPAIGN_SEED=N`) runs the same plan against the same faults at the same moments, not the
same nanoseconds.
"""

import collections
import http.client
import json
import os
import random
import threading
import time
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from . import checker, providers
from .client import Client, Intent, Outcome, RetryPolicy, definite_failure, post, sha256_hex

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROFILES = os.path.join(ROOT, "deploy", "providers")

WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECRETS = {"KEYED_API_KEY": "k-camp", "KEYED_WEBHOOK_SECRET": "mock-hmac-secret",
           "REPLICATE_API_TOKEN": "r8-camp", "REPLICATE_WEBHOOK_SECRET": WHSEC,
           "OPENAI_API_KEY": "sk-camp"}

# The personalities a campaign drives, and how often each is drawn.
#   plain     sync, no keys, reconcile none: ambiguity → review, never resent
#   lookup    sync, no keys, get_by_client_id; the reference goes in the body (metadata)
#   listed    sync, no keys, list_match over a paged list (cursor) among unrelated tasks
#   keyed     sync, native Idempotency-Key (/v2/generations), idempotent_resubmit
#   kasync    async keyed-async: native key, HMAC webhooks, polled
#   replicate async Replicate: no key, reconcile none, Standard Webhooks, provider cancel
#   chat      LLM text through the shipped openai-chat profile (no keys, reconcile none): streamed
#             (`stream: true`, server-sent events, several clients per key joining) or whole;
#             the mock's stream route draws nothing in random mode: each intent carries its
#             behaviour (`_mock`: tokens, slow tokens, cut_after, error_after, 429)
#   upload    a multipart/form-data image edit through the shipped openai-images profile
#             (`images/edits`, `"multipart": true`, reconcile none), the `_mock` controls a
#             text field of the form (429 / ok / slow), else random mode's draw
#   respond   a background Responses stream through the shipped openai-responses profile
#             (`"stream": true, "background": true`): a cut one is resumed by the reconciler
#             after its last whole event, so its record is the one event sequence its clients
#             were given the start of; several clients per key as for chat; behaviour in `_mock`
KINDS = ("plain", "lookup", "listed", "keyed", "kasync", "replicate", "chat", "upload", "respond")
KIND_WEIGHTS = (14, 20, 20, 18, 16, 12, 16, 10, 8)
ASYNC_KINDS = ("kasync", "replicate")
# LLM text: its clients capture every answer's bytes, join one key, and ask again on a cut.
STREAM_KINDS = ("chat", "respond")

# Streamed chats: what the mock does with one (every send of the intent alike), and how often.
# The gateway wants its lease 2 s above a provider's total timeout and does not renew it during a
# call, so at the campaign's 3 s lease a chat has the same 1 s as every create: "tokens" and
# "slow_tokens" end within it, "timeout" does not (the gateway cuts it: in doubt, like "cut").
CHAT_BEHAVIOURS = (("tokens", 42), ("slow_tokens", 20), ("cut", 14), ("error", 6),
                   ("timeout", 6), ("status_429", 12))
P_CHAT_STREAM = 0.7            # else the whole answer (no `stream`)
P_CHAT_JOIN = 0.4              # more clients on the same key, at once or a little later
P_CHAT_OTHER_REPLICA = 0.35    # a joining client on the other replica (waits for the record)
P_CHAT_LEAVE = 0.2             # a joining client that reads a little and goes away
# Background Responses streams: what the mock does with the create (and with the resume), and how
# often. Ten events for six deltas (created, in_progress, deltas, text done, completed): "cut"
# closes the create after 1..9 of them (at least the first, which names the response: the
# reconciler resumes it by that id); "resume_cut" also cuts the first resume again, after at least
# one more event (none: nothing resumed, the response is read back whole — not what is tested);
# "long" spaces them past the providers' total timeout (the gateway cuts the create, and a resume
# may be cut by its lease too: read over several); "status_429" is refused before any event.
RESPOND_BEHAVIOURS = (("tokens", 36), ("slow_tokens", 14), ("cut", 22), ("resume_cut", 14),
                      ("long", 6), ("status_429", 8))
# Uploads: the `_mock` form field; "random": none (random mode draws; controls mode: the
# intent's drawn controls).
UPLOAD_BEHAVIOURS = (("ok", 30), ("slow", 20), ("status_429", 15), ("random", 35))
# The replicas' upload_part_inline_bytes: an image is drawn 200..6000 bytes, so about two uploads
# in three have it kept in the archive store (one folder, shared by the replicas) and referred to
# from the row, and the others are stored whole; every send and resend of both must be the
# client's bytes (upload_bytes_mismatch), and the summary counts the first kind
# (uploads_in_store).
UPLOAD_PART_INLINE_BYTES = 2048

# Random mode: the behaviours every create draws from (contract item 9).
WEIGHTS = {"ok": 40, "hang": 5, "close": 4, "reset": 4, "task_made_5xx": 5, "status_5xx": 5,
           "reject_400": 2, "status_429": 4, "status_503": 4, "slow_ok": 8, "late_visible": 6,
           "truncate": 3, "task_fails": 4}
LOOKUP_DELAY_MS_MAX = 150


@dataclass
class Sizes:
    intents: int
    concurrency: int
    load_s: float          # intents start within this many seconds
    kills: int             # kill -9 of a replica
    pg_restarts: int       # pg_ctl stop -m immediate, then start
    outages: int           # a lookup / list outage and a refusal at the mock (seconds each)
    drain_s: float         # the bounded drain
    stalls: int = 1        # SIGSTOP of a replica past its lease, then SIGCONT
    window_s: int = 10     # every profile's reconcile window (review after it)
    grace_ms: int = 5000   # reconcile.absent_grace_ms (> late_visible's 3000 ms)
    page_max: int = 20     # the mock's list_page_max: lists page among unrelated tasks
    seeded: int = 120      # unrelated tasks made at the start (more come during the run)
    # A slow provider: every create the mock draws for also waits MIN..MAX ms (random mode), the
    # providers' total timeout and the lease grown to match. (0, 0): the usual fast mock.
    create_delay_ms: tuple = (0, 0)
    total_ms: int = 1000
    lease_s: int = 3


CI = Sizes(intents=240, concurrency=12, load_s=25, kills=2, pg_restarts=1, outages=3, drain_s=60)
FULL = Sizes(intents=3000, concurrency=24, load_s=300, kills=12, pg_restarts=4, outages=12,
             drain_s=120, page_max=50, stalls=4)
# Slow providers (issue 22): creates that take seconds, arriving fast, so that hundreds (CI size)
# or a thousand and more (FULL) calls are in flight on two replicas when one is killed, stopped or
# its database restarted.
SLOW_CI = Sizes(intents=300, concurrency=100, load_s=6, kills=1, pg_restarts=1, outages=1,
                drain_s=120, stalls=1, create_delay_ms=(1000, 4000), total_ms=8000, lease_s=12)
SLOW_FULL = Sizes(intents=2000, concurrency=300, load_s=12, kills=2, pg_restarts=1, outages=2,
                  drain_s=300, stalls=1, create_delay_ms=(2000, 10000), total_ms=15000,
                  lease_s=20)

P_CANCEL, P_RESUBMIT, P_REUSE, P_REGEN, P_WAIT = 0.2, 0.2, 0.03, 0.03, 0.2
P_PAD, PAD_BYTES = 0.004, 17 << 20
# Refusals of one tenant's request (issue 21 item 5): a 403 without a marker the profile declares
# fails that job only and trips nothing; a 401 trips the provider for every tenant until the
# campaign's operator resets it (the resetter, about every second).
P_FORBIDDEN, P_UNAUTHORIZED = 0.02, 0.006


# --- small HTTP helpers ----------------------------------------------------------------------------

def call(port, method, path, token=None, body=None, headers=None, timeout=10):
    """One request on a fresh connection; never raises for network trouble.
    Returns (status or None, headers, parsed body or raw bytes, t0, t1)."""
    h = {"Connection": "close"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    if body is not None:
        h["Content-Type"] = "application/json"
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
    h.update(headers or {})
    t0 = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = data
        return r.status, hdrs, doc, t0, time.time()
    except (OSError, http.client.HTTPException):
        return None, {}, None, t0, time.time()
    finally:
        conn.close()


def mock_json(url, path, body=None, method=None, timeout=30):
    """A mock route: (status, parsed body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, raw
    except (OSError, ValueError):
        return None, None


# --- provider entries --------------------------------------------------------------------------------

# A short budget: a back-off (429/503) or a refused resend ends within seconds, not minutes.
RETRY = {"max_attempts": 8, "deadline_seconds": 120, "base_ms": 50, "cap_ms": 500}


def _recon(sizes, **kw):
    r = {"window_seconds": sizes.window_s, "interval_ms": 250,
         "absent_grace_ms": sizes.grace_ms}
    r.update(kw)
    return r


# A found task (lookup, list item, task read) is the mock's task object, unlike the create's
# answer: the create's answer is its `result` member.
FOUND = "$.result"


def entries(mock_url, tag, sizes):
    """The gateway's provider entries, one per kind, named kind + tag."""
    task_v1 = {"path": "/v1/images/tasks/{id}", "client_ref": "$.client_ref"}
    task_v2 = {"path": "/v2/generations/tasks/{id}", "client_ref": "$.client_ref"}
    out = {
        "plain": providers.entry("plain" + tag, mock_url, retry=dict(RETRY),
                                 reconcile=_recon(sizes, strategy="none", task=task_v1, found_result=FOUND)),
        "lookup": providers.entry(
            "lookup" + tag, mock_url, client_ref={"body_field": "metadata.client_ref"},
            retry=dict(RETRY),
            reconcile=_recon(sizes, strategy="get_by_client_id", task=task_v1, found_result=FOUND,
                             lookup={"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                                     "client_ref": "$.client_ref",
                                     "absent": {"path": "$.error.code",
                                                "equals": "not_found"}})),
        "listed": providers.entry(
            "listed" + tag, mock_url, client_ref={"header": "X-Client-Ref"}, retry=dict(RETRY),
            reconcile=_recon(sizes, strategy="list_match", task=task_v1, found_result=FOUND, list={
                "path": "/v1/images/tasks?since={since}&until={until}&limit=1000",
                "items": "$.data[*]", "match": "$.client_ref", "id": "$.id",
                "next_cursor": "$.next_cursor", "cursor_param": "cursor", "max_pages": 50})),
        "keyed": providers.entry(
            "keyed" + tag, mock_url, path="/v2/generations", route="generations",
            idempotency={"header": "Idempotency-Key"}, retry=dict(RETRY),
            reconcile=_recon(sizes, strategy="idempotent_resubmit", task=task_v2, found_result=FOUND)),
    }
    for kind, name, route in (("kasync", "keyed-async", "generations"),
                              ("replicate", "replicate", "flux-schnell")):
        path = os.path.join(PROFILES, name + ".json")
        with open(path) as f:
            prof = json.load(f)
        poll = dict(prof["poll"], interval_ms=100, max_interval_ms=400, deadline_seconds=600)
        rec = dict(prof["reconcile"], window_seconds=sizes.window_s, interval_ms=250,
                   absent_grace_ms=sizes.grace_ms)
        e = {"name": kind + tag, "profile": path, "base_url": mock_url, "poll": poll,
             "timeouts": dict(providers.T1), "reconcile": rec,
             "retry": dict(RETRY)}
        if kind == "kasync":
            e["webhook"] = dict(prof["webhook"], client_ref="$.metadata.client_ref")
        out[kind] = e
        out[kind]["_route"] = route
    if sizes.total_ms != providers.T1["total_ms"]:
        for e in out.values():
            e["timeouts"] = dict(providers.T1, total_ms=sizes.total_ms)
    # Streamed LLM text and multipart uploads, through the shipped profiles.
    with open(os.path.join(PROFILES, "openai-chat.json")) as f:
        chat = json.load(f)
    out["chat"] = {"name": "chat" + tag, "profile": os.path.join(PROFILES, "openai-chat.json"),
                   "base_url": mock_url, "retry": dict(RETRY),
                   "timeouts": dict(providers.T1, total_ms=sizes.total_ms),
                   "reconcile": dict(chat["reconcile"], window_seconds=sizes.window_s,
                                     interval_ms=250, absent_grace_ms=sizes.grace_ms),
                   "_route": "chat/completions"}
    # Its reconcile as shipped (the task read by id, the resume after a sequence number), at the
    # campaign's window: a cut stream it cannot resume within it goes to review.
    with open(os.path.join(PROFILES, "openai-responses.json")) as f:
        responses = json.load(f)
    out["respond"] = {"name": "respond" + tag,
                      "profile": os.path.join(PROFILES, "openai-responses.json"),
                      "base_url": mock_url, "retry": dict(RETRY),
                      "timeouts": dict(providers.T1, total_ms=sizes.total_ms),
                      "reconcile": dict(responses["reconcile"], window_seconds=sizes.window_s,
                                        interval_ms=250, absent_grace_ms=sizes.grace_ms),
                      "_route": "responses"}
    out["upload"] = {"name": "upload" + tag,
                     "profile": os.path.join(PROFILES, "openai-images.json"),
                     "base_url": mock_url, "retry": dict(RETRY),
                     "timeouts": dict(providers.T1, total_ms=sizes.total_ms),
                     "reconcile": _recon(sizes, strategy="none", task=task_v1,
                                         found_result=FOUND),
                     "_route": "images/edits"}
    return out


def route_of(entry):
    r = entry.get("_route") or entry["routes"][0]["route"]
    return f"{entry['name']}/{r}"


def gateway_entries(ents):
    return [{k: v for k, v in e.items() if not k.startswith("_")} for e in ents.values()]


# --- the plan ----------------------------------------------------------------------------------------

# Mock controls drawn per intent when the mock has no random mode (body `_mock`): every send of
# that intent (the gateway's resends too) then behaves the same.
SYNC_CONTROLS = [
    (40, {}), (5, {"fault": "hang"}), (4, {"fault": "close"}), (4, {"fault": "reset"}),
    (5, {"status": 502}), (3, {"status": 500}), (2, {"status": 400}),
    (4, {"status": 502, "task_made": True}), (2, {"status": 524, "task_made": True}),
    (4, {"status": 429, "retry_after": "1"}), (4, {"status": 503, "retry_after": "1"}),
    (8, "slow"), (3, {"fault": "truncate"}),
]


def _draw_controls(rng, kind):
    total = sum(w for w, _ in SYNC_CONTROLS)
    x, acc = rng.uniform(0, total), 0
    pick = SYNC_CONTROLS[-1][1]
    for w, c in SYNC_CONTROLS:
        acc += w
        if x <= acc:
            pick = c
            break
    c = {"delay_ms": rng.randint(0, 1500)} if pick == "slow" else dict(pick)
    if not c and rng.random() < 0.12:
        c["visible_after_ms"] = rng.randint(500, 3000)   # created, listed only later
    if kind in ASYNC_KINDS:
        c["polls"] = rng.randint(0, 3)
        if rng.random() < 0.08:
            c["outcome"] = "failed"
        c["webhook"] = {"duplicates": rng.randint(0, 2), "delay_ms": rng.randint(0, 1000),
                        "reorder": rng.random() < 0.3}
    return c


@dataclass
class IntentPlan:
    ix: int
    kind: str
    tenant: int
    start: float
    body: dict
    controls: dict
    wait: int
    actions: list
    resolve_seed: int
    special: dict = None
    chat: dict = None      # chat: behaviour, stream, clients [(delay s, other replica, leave)]
    form: dict = None      # upload: behaviour, boundaries, fields, image seed and size


@dataclass
class Plan:
    seed: int
    sizes: Sizes
    intents: list
    faults: list          # (at seconds, kind, arg)
    mock_seed: int
    seeds: list           # (at seconds, personality, count): unrelated tasks
    weights: dict = None  # random mode's behaviour weights


def make_plan(seed, sizes, tenants=2):
    rng = random.Random(seed)
    out = []
    for ix in range(sizes.intents):
        kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
        tenant = rng.randrange(tenants)
        start = rng.uniform(0, sizes.load_s)
        if kind == "chat":
            out.append(_plan_chat(rng, seed, ix, tenant, start, sizes.total_ms))
            continue
        if kind == "upload":
            out.append(_plan_upload(rng, seed, ix, tenant, start))
            continue
        if kind == "respond":
            out.append(_plan_respond(rng, seed, ix, tenant, start, sizes.total_ms))
            continue
        body = {"prompt": f"campaign {seed}-{ix} {rng.getrandbits(32):08x}",
                "n": rng.randint(1, 3)}
        if kind == "lookup" and rng.random() < 0.05:
            # A reference the gateway cannot place (issue 10 A2): refused at intake after the
            # fix; before it, sent without our reference.
            body["metadata"] = rng.choice([{"client_ref": f"own-{seed}-{ix}"}, None])
        controls = _draw_controls(rng, kind)
        # Controls random mode does not draw; an intent carrying them gets no random draw.
        special = {}
        x = rng.random()
        if kind in ("plain", "lookup", "listed", "keyed") and x < P_PAD:
            special = {"pad_bytes": PAD_BYTES}             # a result over 16 MiB (issue 10 C10)
        elif kind == "kasync" and x < 0.06:
            special = rng.choice([{"id_numeric": True}, {"id_missing": True}])  # (C11)
        elif kind in ("plain", "lookup", "listed") and x < P_PAD + P_FORBIDDEN:
            special = {"status": 403}
        elif kind in ("plain", "lookup", "listed") and x < P_PAD + P_FORBIDDEN + P_UNAUTHORIZED:
            special = {"status": 401}
        wait = rng.randint(1, 4) if rng.random() < P_WAIT else 0
        actions = []
        if rng.random() < P_CANCEL:
            # At once (often still prepared or sending), or when a timed-out send has made the
            # job unknown (the 1 s provider timeout).
            at = rng.uniform(0, 0.3) if rng.random() < 0.4 else rng.uniform(0.8, 3.0)
            actions.append((at, "cancel"))
        if rng.random() < P_RESUBMIT:
            actions.append((rng.uniform(0, 4), "resubmit"))
        if rng.random() < P_REUSE:
            actions.append((rng.uniform(0, 2), "reuse"))
            if rng.random() < 0.5:
                # The other body differs only past 2^53 (issue 10 D13): still another request.
                body["seed"] = 9007199254740993 + 2 * rng.randrange(1000)
        if rng.random() < P_REGEN:
            actions.append((rng.uniform(1, 6), "regenerate"))
        actions.sort()
        out.append(IntentPlan(ix, kind, tenant, start, body, controls, wait, actions,
                              rng.getrandbits(32), special))
    out.sort(key=lambda p: p.start)
    faults = []
    span = (0.1 * sizes.load_s, 0.9 * sizes.load_s)
    for _ in range(sizes.kills):
        faults.append((rng.uniform(*span), "kill", rng.choice(("a", "b"))))
    # PostgreSQL restarts spread over the load, one per slice, down 0.5..3 s.
    for k in range(sizes.pg_restarts):
        lo = span[0] + (span[1] - span[0]) * k / sizes.pg_restarts
        hi = span[0] + (span[1] - span[0]) * (k + 1) / sizes.pg_restarts
        faults.append((rng.uniform(lo, hi), "pg_restart", round(rng.uniform(0.5, 3.0), 2)))
    for _ in range(sizes.outages):
        faults.append((rng.uniform(*span), rng.choice(("lookup_outage", "list_outage")),
                       round(rng.uniform(1.0, 4.0), 2)))
        faults.append((rng.uniform(*span), "refuse", round(rng.uniform(0.3, 1.5), 2)))
    for _ in range(sizes.stalls):
        # Past the lease: another replica takes the stalled one's work over.
        faults.append((rng.uniform(*span), "stall",
                       round(rng.uniform(sizes.lease_s + 0.5, sizes.lease_s + 2.5), 3)))
    faults.sort(key=lambda f: f[0])
    seeds = [(0.0, "openai-images", sizes.seeded), (0.0, "native-idempotent", sizes.seeded // 2)]
    t = 0.0
    while True:
        t += rng.uniform(2.0, 6.0)
        if t >= sizes.load_s:
            break
        seeds.append((t, rng.choice(("openai-images", "native-idempotent")), rng.randint(2, 12)))
    # Each seed leans its own way: every behaviour's weight scaled by 0.3..3.
    weights = {k: max(1, round(w * rng.uniform(0.3, 3.0))) for k, w in WEIGHTS.items()}
    return Plan(seed, sizes, out, faults, rng.getrandbits(31), seeds, weights)


def _pick(rng, table):
    return rng.choices([n for n, _ in table], weights=[w for _, w in table])[0]


def _plan_chat(rng, seed, ix, tenant, start, total_ms=1000):
    """A chat intent: its behaviour at the mock, whether it streams, its clients; actions:
    resubmit (the record again) and the key with another body (422). No cancel, regenerate or
    operator: a stream's generation leaves no task to find or cancel."""
    behaviour = _pick(rng, CHAT_BEHAVIOURS)
    ctl = {"events": rng.randint(3, 8), "event_delay_ms": rng.randint(0, 40)}
    if behaviour == "slow_tokens":
        ctl = {"events": rng.randint(3, 4), "event_delay_ms": rng.randint(50, 100)}
    elif behaviour == "timeout":
        # Six events spaced past the providers' total timeout (1.2–1.8× of it): the transfer is
        # cut by its timeout before the terminal event, whatever the sizes' timeout.
        ctl = {"events": 6, "event_delay_ms": rng.randint(200, 300) * total_ms // 1000}
    elif behaviour == "cut":
        ctl = {"events": 6, "event_delay_ms": rng.randint(20, 150), "cut_after": rng.randint(1, 6)}
    elif behaviour == "error":
        ctl = {"events": 6, "event_delay_ms": rng.randint(20, 150),
               "error_after": rng.randint(1, 5)}
    elif behaviour == "status_429":
        ctl = {"status": 429}
    stream = rng.random() < P_CHAT_STREAM
    body = {"model": "gpt-4o-mini",
            "messages": [{"role": "user",
                          "content": f"campaign {seed}-{ix} {rng.getrandbits(32):08x}"}],
            "_mock": ctl}
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    clients = _chat_clients(rng)
    actions = []
    if rng.random() < P_RESUBMIT:
        actions.append((rng.uniform(0, 4), "resubmit"))
    if rng.random() < P_REUSE * 2:
        actions.append((rng.uniform(0, 2), "reuse"))
    actions.sort()
    return IntentPlan(ix, "chat", tenant, start, body, {}, 0, actions, rng.getrandbits(32),
                      None, chat={"behaviour": behaviour, "stream": stream, "clients": clients})


def _chat_clients(rng):
    """The clients of one LLM text key: the first at once; 40 % of keys get one or two more
    0–0.8 s later, on the same replica (they join the live stream) or the other (they wait for
    the record), some of which read a little and leave."""
    clients = [(0.0, False, None)]
    if rng.random() < P_CHAT_JOIN:
        for _ in range(rng.randint(1, 2)):
            clients.append((round(rng.uniform(0, 0.8), 3), rng.random() < P_CHAT_OTHER_REPLICA,
                            rng.choice((40, 200, 400)) if rng.random() < P_CHAT_LEAVE else None))
    return clients


def _plan_respond(rng, seed, ix, tenant, start, total_ms=1000):
    """A background Responses stream: its behaviour at the mock (RESPOND_BEHAVIOURS), its
    clients as for chat; actions: resubmit (the record again) and the key with another input
    (422). No cancel (a cancelled response is read back, not resumed), regenerate or operator (a
    job in review is left there: the checker wants to see it)."""
    behaviour = _pick(rng, RESPOND_BEHAVIOURS)
    ctl = {"events": rng.randint(3, 8), "event_delay_ms": rng.randint(0, 40)}
    if behaviour == "slow_tokens":
        # Up to 8 events 90 ms apart: within the 1 s timeout, or just past it (then resumed).
        ctl = {"events": rng.randint(3, 4), "event_delay_ms": rng.randint(50, 90)}
    elif behaviour in ("cut", "resume_cut"):
        cut = rng.randint(1, 9 if behaviour == "cut" else 8)
        ctl = {"events": 6, "event_delay_ms": rng.randint(20, 80), "cut_after": cut}
        if behaviour == "resume_cut":
            ctl["resume_cut_after"] = rng.randint(cut + 1, 9)
    elif behaviour == "long":
        # Ten events 200–300 ms apart (scaled to the timeout): the create is cut by the
        # providers' total timeout after about four, the resume runs under the lease's time left.
        ctl = {"events": 6, "event_delay_ms": rng.randint(200, 300) * total_ms // 1000}
    elif behaviour == "status_429":
        ctl = {"status": 429}
    body = {"model": "gpt-4o-mini", "input": f"campaign {seed}-{ix} {rng.getrandbits(32):08x}",
            "stream": True, "background": True, "_mock": ctl}
    clients = _chat_clients(rng)
    actions = []
    if rng.random() < P_RESUBMIT:
        actions.append((rng.uniform(0, 4), "resubmit"))
    if rng.random() < P_REUSE * 2:
        actions.append((rng.uniform(0, 2), "reuse"))
    actions.sort()
    return IntentPlan(ix, "respond", tenant, start, body, {}, 0, actions, rng.getrandbits(32),
                      None, chat={"behaviour": behaviour, "stream": True, "clients": clients})


def _plan_upload(rng, seed, ix, tenant, start):
    """An upload intent: an image edit as multipart/form-data (the bytes, boundary and field
    order drawn), its behaviour at the mock, and the actions of the sync kinds."""
    behaviour = _pick(rng, UPLOAD_BEHAVIOURS)
    mock = {"ok": {"delay_ms": 0}, "slow": {"delay_ms": rng.randint(200, 1500)},
            "status_429": {"status": 429, "retry_after": "1"}}.get(behaviour)
    controls = _draw_controls(rng, "upload")
    fields = {"prompt": f"campaign edit {seed}-{ix} {rng.getrandbits(32):08x}",
              "model": "gpt-image-1", "n": rng.randint(1, 2)}
    order = ["prompt", "model", "n", "_mock", "image"]
    rng.shuffle(order)
    form = {"behaviour": behaviour, "mock": mock, "fields": fields, "order": order,
            "boundary": f"----campaign{seed}x{ix}x{rng.getrandbits(40):010x}",
            "alt_boundary": f"alt-{rng.getrandbits(48):012x}",
            "image_seed": rng.getrandbits(32), "image_bytes": rng.randint(200, 6000)}
    actions = []
    if rng.random() < P_CANCEL:
        at = rng.uniform(0, 0.3) if rng.random() < 0.4 else rng.uniform(0.8, 3.0)
        actions.append((at, "cancel"))
    if rng.random() < P_RESUBMIT:
        actions.append((rng.uniform(0, 4), "resubmit"))
    if rng.random() < P_REUSE * 2:
        actions.append((rng.uniform(0, 2), "reuse"))
    if rng.random() < P_REGEN:
        actions.append((rng.uniform(1, 6), "regenerate"))
    actions.sort()
    wait = rng.randint(1, 4) if rng.random() < P_WAIT else 0
    return IntentPlan(ix, "upload", tenant, start, dict(fields), controls, wait, actions,
                      rng.getrandbits(32), None, form=form)


def form_body(form, controls=None, boundary=None, order=None, prompt=None):
    """The multipart/form-data bytes of an upload plan and their Content-Type. `controls`: the
    `_mock` field (None: no such field); the other arguments make another encoding (the same
    meaning under another boundary and order) or another request (another prompt)."""
    b = (boundary or form["boundary"]).encode()
    img = random.Random(form["image_seed"]).randbytes(form["image_bytes"])
    out = b""
    for name in order or form["order"]:
        if name == "_mock":
            if controls is None:
                continue
            value = json.dumps(controls, sort_keys=True).encode()
        elif name == "image":
            out += (b"--" + b + b'\r\nContent-Disposition: form-data; name="image"; '
                    b'filename="edit.png"\r\nContent-Type: image/png\r\n\r\n'
                    b"\x89PNG\r\n\x1a\n" + img + b"\r\n")
            continue
        else:
            v = form["fields"][name] if not (name == "prompt" and prompt) else prompt
            value = str(v).encode()
        out += (b"--" + b + b'\r\nContent-Disposition: form-data; name="' + name.encode() +
                b'"\r\n\r\n' + value + b"\r\n")
    out += b"--" + b + b"--\r\n"
    return out, f"multipart/form-data; boundary={(boundary or form['boundary'])}"


# --- the run ------------------------------------------------------------------------------------------

@dataclass
class Sample:
    t0: float
    t1: float
    state: str
    src: str


@dataclass
class Job:
    id: str
    token: str
    key: str
    kind: str
    ix: int
    parent: str = None           # a regeneration's parent job
    samples: list = field(default_factory=list)
    cancel_ack: dict = None      # the first acknowledged cancel: t0, t1, status, state
    cancels: list = field(default_factory=list)
    resolutions: list = field(default_factory=list)
    resubmits: list = field(default_factory=list)   # (status, job id, replayed, state)
    final_seen: bool = False


class Campaign:
    """Runs one plan. `replicas` is a replicas.Replicas whose ports are fixed in advance,
    `cluster` the cluster.Cluster the gateways use (restarted by the campaign), `sqlf` a SQL
    function on its database."""

    def __init__(self, plan, mock_url, tokens, replicas, cluster, sqlf, admin_token, pfx, tag,
                 ports, log=print):
        self.plan = plan
        self.sizes = plan.sizes
        self.mock_url = mock_url
        self.tokens = tokens
        self.reps = replicas
        self.cluster = cluster
        self.sqlf = sqlf
        self.admin = admin_token
        self.pfx = pfx
        self.tag = tag
        self.ports = ports
        self.log = log
        self.ents = entries(mock_url, tag, self.sizes)
        self.lock = threading.RLock()
        self.jobs = {}                    # job id -> Job
        self.outcomes = [None] * len(plan.intents)
        self.intents = [None] * len(plan.intents)
        self.plan_of = [None] * len(plan.intents)
        self.reuses = []                  # dicts: ix, body_sha256, status, job_id
        self.job_by_hash = {}             # canonical body sha256 -> job id
        self.decoys = []                  # foreign adoption attempts and their answers
        self.last_truth = {}
        self.regen_requests = []
        self.events = []                  # (time, what, detail): faults as applied
        self.stop_load = threading.Event()
        self.stop_resolver = threading.Event()
        self.stop_sampler = threading.Event()
        self.abort = threading.Event()
        self.mock_mode = None
        self.caps = {}
        self.admin_resolve = None         # None: untried; True/False: the admin token works
        self.t0 = None
        self.counters = collections.Counter()
        self.trips = set()                # (provider, http_status) of every breaker seen tripped
        self.chat_clients = {}            # slot -> [Outcome] of every client of a chat intent
        self.drive_s = {}                 # slot -> seconds its driver took (actions included)
        self.received = collections.defaultdict(list)  # key -> every captured chat answer

    # -- mock setup

    def setup_mock(self, want_mode=None):
        st, _ = mock_json(self.mock_url, "/_reset", {})
        assert st == 200, "mock reset failed"
        st, doc = mock_json(self.mock_url, "/_chaos")
        self.caps["random"] = st == 200
        mode = want_mode or os.environ.get("CAMPAIGN_MOCK_MODE", "auto")
        if mode == "auto":
            mode = "random" if self.caps["random"] else "controls"
        if mode == "random":
            body = {"seed": self.plan.mock_seed, "weights": self.plan.weights or WEIGHTS,
                    "lookup_delay_ms_max": LOOKUP_DELAY_MS_MAX}
            if self.sizes.create_delay_ms[1]:
                body["create_delay_ms"] = list(self.sizes.create_delay_ms)
            st, doc = mock_json(self.mock_url, "/_chaos", body)
            assert st == 200, f"the mock refused random mode: {st} {doc}"
        self.mock_mode = mode
        st, cfg = mock_json(self.mock_url, "/_config")
        cfg = cfg if isinstance(cfg, dict) else {}
        self.caps["paging"] = "list_page_max" in cfg
        self.caps["list_page_status"] = "list_page_status" in cfg
        if self.caps["paging"]:
            st, _ = mock_json(self.mock_url, "/_config", {"list_page_max": self.sizes.page_max})
            assert st == 200
        st, _ = mock_json(self.mock_url, "/_tasks/seed", {"provider": "openai-images", "count": 1})
        self.caps["seed"] = st == 200

    def seed_tasks(self, personality, count):
        if self.caps.get("seed") and count > 0:
            mock_json(self.mock_url, "/_tasks/seed", {"provider": personality, "count": count})

    # -- helpers

    def live_ports(self):
        p = self.reps.ports(alive_only=True)
        return p or list(self.ports)

    def port(self, i=None):
        p = self.live_ports()
        return p[(i if i is not None else random.randrange(len(p))) % len(p)]

    def job(self, jid):
        with self.lock:
            return self.jobs.get(jid)

    def observe(self, jid, t0, t1, state, src):
        if not jid or not state:
            return
        with self.lock:
            j = self.jobs.get(jid)
            if j is not None:
                j.samples.append(Sample(t0, t1, state, src))
                if state in ("completed", "failed"):
                    j.final_seen = True

    def register(self, jid, token, key, kind, ix, parent=None):
        with self.lock:
            if jid not in self.jobs:
                self.jobs[jid] = Job(jid, token, key, kind, ix, parent)
            return self.jobs[jid]

    def request(self, method, path, token, body=None, headers=None, tries=40, seconds=40.0,
                timeout=10):
        """A request retried on anything not definite (no answer, 5xx, 408, 429), across the
        replicas; returns the last (status, headers, doc, t0, t1)."""
        start = time.monotonic()
        res = (None, {}, None, 0.0, 0.0)
        for i in range(tries):
            res = call(self.port(i), method, path, token, body, headers, timeout)
            st = res[0]
            if st is not None and st < 500 and st not in (408, 429):
                return res
            if time.monotonic() - start > seconds:
                break
            time.sleep(min(1.0, 0.05 * (2 ** min(i, 5))) * random.uniform(0.5, 1.0))
        return res

    # -- the driver

    def intent_of(self, p):
        ent = self.ents[p.kind]
        key = f"{self.pfx}-{p.ix}"
        if p.kind in STREAM_KINDS:
            # Prefer: wait on every client: a stream is followed live (a joiner on the same
            # replica gets it live too), a whole answer waited for; 202 when it takes longer.
            return Intent(self.tokens[p.tenant], key, dict(p.body), route_of(ent), kind=p.kind,
                          headers={"Prefer": "wait=8"}, capture=True)
        if p.kind == "upload":
            f = p.form
            ctl = f["mock"] if f["mock"] is not None else (
                dict(p.controls) if self.mock_mode == "controls" else None)
            raw, ctype = form_body(f, ctl)
            headers = {"Prefer": f"wait={p.wait}"} if p.wait else {}
            return Intent(self.tokens[p.tenant], key, dict(p.body, _mock=ctl), route_of(ent),
                          kind=p.kind, headers=headers, raw=raw, content_type=ctype)
        body = dict(p.body)
        ctl = dict(p.controls) if self.mock_mode == "controls" else {}
        ctl.update(p.special or {})
        if ctl:
            body["_mock"] = ctl
        key = f"{self.pfx}-{p.ix}"
        headers = {"Prefer": f"wait={p.wait}"} if p.wait else {}
        return Intent(self.tokens[p.tenant], key, body, route_of(ent), kind=p.kind,
                      headers=headers)

    def note_answer(self, intent, a):
        """Client.on_attempt for chat intents: every answer's bytes, kept by key."""
        with self.lock:
            self.received[intent.key].append(a)

    def chat_policy(self, seconds=45):
        return RetryPolicy(max_attempts=60, max_seconds=seconds, timeout=15,
                           job_failed_final=True)

    def drive_chat(self, slot, p, intent):
        """Every client of a chat intent at its moment (joiners on the same replica follow the
        live stream, on the other one wait for the record; some leave early); a client whose
        answer was cut asks once more with the same key (never a second generation)."""
        clients = p.chat["clients"]
        outs = [None] * len(clients)
        first = zlib.crc32(intent.key.encode())

        def one(i):
            at, other, leave = clients[i]
            if at and self.abort.wait(at):
                return
            it = replace(intent, leave_after=leave)
            c = Client(self.live_ports, self.chat_policy(), on_attempt=self.note_answer)
            out = c.perform(it, first=first + (1 if other else 0))
            if out.attempts and out.attempts[-1].error in ("cut", "left"):
                again = Client(self.live_ports, self.chat_policy(30),
                               on_attempt=self.note_answer).perform(intent, first=first + 1)
                out = Outcome(intent, out.attempts + again.attempts, again.result)
            outs[i] = out

        threads = [threading.Thread(target=one, args=(i,), daemon=True)
                   for i in range(1, len(clients))]
        for t in threads:
            t.start()
        one(0)
        for t in threads:
            t.join(timeout=120)
        with self.lock:
            self.chat_clients[slot] = [o for o in outs if o is not None]
        self.counters["chat_clients"] += len(clients)
        return outs[0]

    def drive(self, slot, p):
        delay = self.t0 + p.start - time.time()
        if delay > 0 and self.stop_load.wait(delay):
            return
        t = time.time()
        try:
            self._drive(slot, p)
        finally:
            with self.lock:
                self.drive_s[slot] = round(time.time() - t, 1)

    def _drive(self, slot, p):
        intent = self.intent_of(p)
        if p.kind in STREAM_KINDS:
            self.intents[slot] = intent
            self.plan_of[slot] = p
            out = self.drive_chat(slot, p, intent)
            self.outcomes[slot] = out
            # A job named by any client's answer (a failed job's replayed 429 names it too).
            jids = {a.job_id or a.doc_job_id for o in self.chat_clients.get(slot, [])
                    for a in o.attempts if a.job_id or a.doc_job_id}
            for jid in jids:
                self.register(jid, intent.token, intent.key, p.kind, slot)
                with self.lock:
                    self.job_by_hash[intent.body_sha256] = jid
            for o in self.chat_clients.get(slot, []):
                for a in o.attempts:
                    if a.job_id and a.state:
                        self.observe(a.job_id, a.t0, a.t1, a.state, "submit")
            if out is None or not jids:
                return
            jid = out.any_job_id or next(iter(jids))
            acked_at = out.attempts[-1].t1
            for at, action in p.actions:
                if self.abort.wait(max(0.0, acked_at + at - time.time())):
                    return
                getattr(self, "act_" + action)(slot, p, intent, jid)
            return
        self.intents[slot] = intent
        self.plan_of[slot] = p
        # Upload drivers spent their whole 60 s (+15) without a definite answer in the CI runs
        # (the slowest drivers of every run): 30 s of the same key is what the checker needs of
        # them, and the run is ~30 s shorter.
        client = Client(self.live_ports,
                        RetryPolicy(max_attempts=80, max_seconds=30 if p.kind == "upload" else 60,
                                    timeout=15, job_failed_final=p.kind == "upload"))
        out = client.perform(intent)
        self.outcomes[slot] = out
        if p.kind == "upload" and not out.acknowledged and out.any_job_id:
            # A job that failed (its 429s ran out) answered with its replayed refusal.
            self.register(out.any_job_id, intent.token, intent.key, p.kind, slot)
            with self.lock:
                self.job_by_hash[intent.body_sha256] = out.any_job_id
        if not out.acknowledged:
            return
        jid = out.job_id or next(iter(out.job_ids))
        self.register(jid, intent.token, intent.key, p.kind, slot)
        with self.lock:
            self.job_by_hash[intent.body_sha256] = jid
        for a in out.attempts:
            if a.status in (200, 202) and a.job_id:
                self.observe(a.job_id, a.t0, a.t1, a.state, "submit")
        acked_at = out.attempts[-1].t1
        for at, action in p.actions:
            if self.abort.wait(max(0.0, acked_at + at - time.time())):
                return
            getattr(self, "act_" + action)(slot, p, intent, jid)

    def act_cancel(self, slot, p, intent, jid):
        st, _, doc, t0, t1 = self.request("POST", f"/v1/jobs/{jid}/cancel", intent.token, "")
        j = self.job(jid)
        state = doc.get("state") if isinstance(doc, dict) else None
        rec = {"t0": t0, "t1": t1, "status": st, "state": state}
        with self.lock:
            j.cancels.append(rec)
            if st in (200, 202) and j.cancel_ack is None:
                j.cancel_ack = rec
        self.observe(jid, t0, t1, state, "cancel")
        self.counters["cancels"] += 1
        if st in (200, 202):
            self.counters["cancels_acked"] += 1

    def act_resubmit(self, slot, p, intent, jid):
        if p.kind in STREAM_KINDS:
            client = Client(self.live_ports, self.chat_policy(40), on_attempt=self.note_answer)
        else:
            client = Client(self.live_ports, RetryPolicy(max_attempts=60, max_seconds=40,
                                                         timeout=15,
                                                         job_failed_final=p.kind == "upload"))
        if p.kind == "upload" and p.resolve_seed % 2:
            # The same upload under another boundary and field order: the same request.
            order = list(reversed(p.form["order"]))
            raw, ctype = form_body(p.form, intent.body.get("_mock"),
                                   boundary=p.form["alt_boundary"], order=order)
            intent = replace(intent, raw=raw, content_type=ctype)
        out = client.perform(intent)
        j = self.job(jid)
        for a in out.attempts:
            if a.status in (200, 202) and a.job_id:
                with self.lock:
                    j.resubmits.append({"status": a.status, "job_id": a.job_id,
                                        "replayed": a.replayed, "state": a.state,
                                        "t0": a.t0, "t1": a.t1})
                self.observe(a.job_id, a.t0, a.t1, a.state, "resubmit")
            elif definite_failure(a.status):
                # The replay of a failed job carries its id (the provider's status, replayed);
                # a refusal of the gateway's own carries none.
                with self.lock:
                    j.resubmits.append({"status": a.status, "job_id": a.job_id,
                                        "replayed": a.replayed, "problem": a.problem_type})
        self.counters["resubmits"] += 1

    def act_reuse(self, slot, p, intent, jid):
        """The same key with another body: 422, and nothing sent."""
        if p.kind == "upload":
            prompt = intent.body["prompt"] + " (other)"
            raw, ctype = form_body(p.form, intent.body.get("_mock"), prompt=prompt)
            alt = replace(intent, body=dict(intent.body, prompt=prompt), raw=raw,
                          content_type=ctype, headers={})
        elif p.kind == "chat":
            msgs = [dict(intent.body["messages"][0],
                         content=intent.body["messages"][0]["content"] + " (other)")]
            alt = replace(intent, body=dict(intent.body, messages=msgs), capture=False,
                          headers={})
        elif p.kind == "respond":
            alt = replace(intent, body=dict(intent.body, input=intent.body["input"] + " (other)"),
                          capture=False, headers={})
        else:
            if "seed" in intent.body:
                body = dict(intent.body, seed=intent.body["seed"] - 1)
            else:
                body = dict(intent.body, prompt=intent.body["prompt"] + " (other)")
            alt = Intent(intent.token, intent.key, body, intent.route, kind=intent.kind)
        out = Client(self.live_ports, RetryPolicy(max_attempts=40, max_seconds=30)).perform(alt)
        last = out.attempts[-1] if out.attempts else None
        with self.lock:
            self.reuses.append({"ix": slot, "job_id": jid, "key": intent.key,
                                "body_sha256": alt.body_sha256,
                                "status": last.status if last else None,
                                "answer_job": last.job_id if last else None})
        self.counters["reuses"] += 1

    def act_regenerate(self, slot, p, intent, jid):
        """A deliberate second paid creation from a finished job, under its own key."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.job(jid).final_seen:
            st, _, doc, t0, t1 = call(self.port(), "GET", f"/v1/jobs/{jid}", intent.token)
            if st == 200 and isinstance(doc, dict):
                self.observe(jid, t0, t1, doc.get("state"), "regen-wait")
            time.sleep(0.3)
        if not self.job(jid).final_seen:
            self.counters["regenerate_skipped"] += 1
            return
        key = intent.key + "-r"
        st, _, doc, t0, t1 = self.request("POST", f"/v1/jobs/{jid}/regenerate", intent.token, "",
                                          headers={"Idempotency-Key": key})
        rec = {"parent": jid, "key": key, "status": st}
        if st == 202 and isinstance(doc, dict) and doc.get("id"):
            rec["job_id"] = doc["id"]
            self.register(doc["id"], intent.token, key, p.kind, slot, parent=jid)
            self.observe(doc["id"], t0, t1, doc.get("state"), "regenerate")
        with self.lock:
            self.regen_requests.append(rec)
        self.counters["regenerations"] += 1

    # -- the sampler: every job's state, often, through the API

    def sampler(self):
        rr = 0
        while not self.stop_sampler.is_set():
            with self.lock:
                active = [j for j in self.jobs.values() if not j.final_seen]
            if not active:
                self.stop_sampler.wait(0.1)
                continue
            batch = active[rr % len(active):][:40] or active[:40]
            rr += len(batch)
            for j in batch:
                if self.stop_sampler.is_set():
                    break
                st, _, doc, t0, t1 = call(self.port(), "GET", f"/v1/jobs/{j.id}", j.token,
                                          timeout=5)
                if st == 200 and isinstance(doc, dict):
                    self.observe(j.id, t0, t1, doc.get("state"), "sample")
                elif st == 404:
                    self.observe(j.id, t0, t1, "(missing)", "sample")
            self.stop_sampler.wait(0.1)

    # -- the operator: resolves jobs in review from the mock's ground truth

    def ground_truth(self):
        """{job id: [task ids the provider made for it]}, from the ledger."""
        st, doc = mock_json(self.mock_url, "/_ledger")
        if st != 200 or not isinstance(doc, dict):
            return None   # no truth, no decision (an unread ledger is not "no task")
        tasks = collections.defaultdict(list)
        with self.lock:
            by_hash = dict(self.job_by_hash)
        for e in doc["creates"]:
            if not e.get("task_id") or e.get("replay"):
                continue
            ref = e.get("client_ref")
            jid = ref if self.job(ref) is not None else by_hash.get(e.get("body_sha256"))
            if jid:   # a create sent without our reference is still this job's task
                tasks[jid].append(e["task_id"])
        return tasks

    def resolver(self):
        while not self.stop_resolver.wait(0.7):
            pending = []
            for tok in self.tokens:
                st, _, doc, _, _ = call(self.port(), "GET", "/v1/jobs?state=review&limit=1000",
                                        tok)
                if st == 200 and isinstance(doc, dict):
                    pending += [(tok, d["id"]) for d in doc.get("data", [])]
            todo = []
            for tok, jid in pending:
                j = self.job(jid)
                # A chat job in review is left there: its generation (if any) has no task to
                # find; the checker wants cut streams in doubt. A background response in review
                # was not resumed within the window: left there too, for the checker to see.
                if j is not None and len(j.resolutions) < 3 and j.kind not in STREAM_KINDS:
                    todo.append(j)
            if not todo:
                continue
            truth = self.ground_truth()
            if truth is None:
                continue
            with self.lock:
                self.last_truth = truth
            for j in todo:
                if self.stop_resolver.is_set():
                    break
                self.resolve(j, truth.get(j.id, []))

    def resolve(self, j, tasks):
        p = self.plan_of[j.ix]
        rng = random.Random(p.resolve_seed * 7 + len(j.resolutions) + (1 if j.parent else 0))
        if rng.random() < 0.15:
            body = {"outcome": "abandon", "operator": "campaign"}
        elif tasks:
            body = {"outcome": "found", "remote_id": tasks[0], "operator": "campaign"}
        else:
            body = {"outcome": "absent", "operator": "campaign"}
        use_admin = body["outcome"] == "found" and self.admin and self.admin_resolve is not False \
            and rng.random() < 0.5
        token = self.admin if use_admin else j.token
        if body["outcome"] == "found" and not use_admin and rng.random() < 0.3:
            self.decoy(j, rng)
        st, _, doc, t0, t1 = self.request("POST", f"/v1/jobs/{j.id}/resolve", token, body,
                                          tries=10, seconds=10)
        if use_admin and st in (401, 403, 404):
            # This gateway does not take the admin token here: the tenant's own decision.
            self.admin_resolve = False
            use_admin, token = False, j.token
            st, _, doc, t0, t1 = self.request("POST", f"/v1/jobs/{j.id}/resolve", token, body,
                                              tries=10, seconds=10)
        elif use_admin and st == 200:
            self.admin_resolve = True
        state = doc.get("state") if isinstance(doc, dict) else None
        rec = dict(body, status=st, state=state, by="admin" if use_admin else "tenant",
                   t0=t0, t1=t1, tasks=list(tasks),
                   problem=doc.get("type") if isinstance(doc, dict) and st >= 400 else None)
        with self.lock:
            j.resolutions.append(rec)
        self.observe(j.id, t0, t1, state, "resolve")
        self.counters["resolve_" + body["outcome"]] += 1

    def decoy(self, j, rng):
        """A tenant tries to adopt a task that is not its job's (another job's, or an unrelated
        task on the shared account): refused unless proven (issue 10 D14)."""
        with self.lock:
            others = [t for jid, ts in self.last_truth.items() if jid != j.id for t in ts]
        if not others:
            return
        remote = rng.choice(sorted(others))
        st, _, doc, t0, t1 = self.request("POST", f"/v1/jobs/{j.id}/resolve", j.token,
                                          {"outcome": "found", "remote_id": remote,
                                           "operator": "campaign-decoy"}, tries=10, seconds=10)
        rec = {"job": j.id, "remote_id": remote, "status": st,
               "problem": doc.get("type") if isinstance(doc, dict) else None, "t1": t1}
        with self.lock:
            self.decoys.append(rec)
        if st == 200 and isinstance(doc, dict):
            self.observe(j.id, t0, t1, doc.get("state"), "decoy")
        self.counters["decoys"] += 1

    # -- faults

    def faults(self):
        for at, kind, arg in self.plan.faults:
            if self.stop_load.wait(max(0.0, self.t0 + at - time.time())):
                return
            getattr(self, "fault_" + kind)(arg)

    def fault_kill(self, name):
        # Only while the other replica is up, so clients have somewhere to go.
        deadline = time.monotonic() + 10
        while not all(r.alive() for r in self.reps.replicas.values()):
            if time.monotonic() > deadline or self.stop_load.is_set():
                self.events.append((time.time(), "kill_skipped", name))
                return
            time.sleep(0.1)
        self.reps.kill(name)
        self.events.append((time.time(), "kill", name))
        self.counters["kills"] += 1

    def fault_stall(self, seconds):
        """SIGSTOP a replica past its lease, then SIGCONT: its leases are taken over while it
        sleeps; whatever it was doing must not write (fencing) nor send again."""
        live = [n for n, r in self.reps.replicas.items() if r.alive()]
        if len(live) < 2:
            self.events.append((time.time(), "stall_skipped", None))
            return
        name = live[int(seconds * 1000) % len(live)]
        self.reps.sigstop(name)
        try:
            self.events.append((time.time(), "stall", name))
            time.sleep(seconds)
        finally:
            self.reps.sigcont(name)
        self.counters["stalls"] += 1

    def fault_pg_restart(self, down_s):
        self.cluster.stop_immediate()
        self.events.append((time.time(), "pg_stop", down_s))
        time.sleep(down_s)
        self.cluster.start()
        self.events.append((time.time(), "pg_start", None))
        self.counters["pg_restarts"] += 1

    def _outage(self, key, seconds):
        st, _ = mock_json(self.mock_url, "/_config", {key: 503 if key == "lookup_status" else 500})
        if st != 200:
            return
        self.events.append((time.time(), key, seconds))
        self.stop_load.wait(seconds)
        for _ in range(50):  # a refusal window may be open: try again until it is over
            if mock_json(self.mock_url, "/_config", {key: 0})[0] == 200:
                break
            time.sleep(0.2)
        self.counters["outages"] += 1

    def fault_refuse(self, seconds):
        """The provider refuses connections for a while: creates are safely resent (nothing
        left), lookups and lists prove nothing."""
        st, _ = mock_json(self.mock_url, "/_refuse", {"ms": int(seconds * 1000)})
        if st == 200:
            self.events.append((time.time(), "refuse", seconds))
            self.counters["refusals"] += 1

    def fault_lookup_outage(self, seconds):
        self._outage("lookup_status", seconds)

    def fault_list_outage(self, seconds):
        self._outage("list_page_status" if self.caps.get("list_page_status") else "list_status",
                     seconds)

    def noise(self):
        for at, personality, count in self.plan.seeds:
            if self.stop_load.wait(max(0.0, self.t0 + at - time.time())):
                return
            self.seed_tasks(personality, count)

    # -- the whole run

    def resetter(self):
        """The operator of tripped credentials: every tripped provider of this run is noted
        (provider, status) and reset, until the run's end, so that work held behind a breaker
        goes on."""
        mine = tuple(e["name"] for e in self.ents.values())
        while not self.stop_sampler.wait(1.0):
            try:
                rows = self.sqlf("SELECT provider, http_status FROM provider_breakers")
            except Exception:  # noqa: BLE001 - PostgreSQL may be restarting
                continue
            for prov, status in rows:
                if prov not in mine:
                    continue
                with self.lock:
                    self.trips.add((prov, int(status or 0)))
                st = None
                if self.admin:
                    st, _, _, _, _ = call(self.port(), "POST",
                                          f"/v1/admin/providers/{prov}/reset", self.admin, "")
                if st != 200:
                    try:
                        self.sqlf(f"DELETE FROM provider_breakers WHERE provider = '{prov}'")
                    except Exception:  # noqa: BLE001
                        continue
                self.counters["breaker_resets"] += 1

    def run(self):
        self.t0 = time.time()
        threads = [threading.Thread(target=f, daemon=True, name=f.__name__)
                   for f in (self.sampler, self.resolver, self.faults, self.noise)]
        for t in threads:
            t.start()
        reset_thread = threading.Thread(target=self.resetter, daemon=True, name="resetter")
        reset_thread.start()
        ex = ThreadPoolExecutor(max_workers=self.sizes.concurrency)
        try:
            futs = [ex.submit(self.drive, slot, p) for slot, p in enumerate(self.plan.intents)]
            for f in futs:
                f.result()
        except BaseException:
            # Interrupted or broken: nothing new starts, the threads end within their bounds.
            self.abort.set()
            for ev in (self.stop_load, self.stop_resolver, self.stop_sampler):
                ev.set()
            ex.shutdown(wait=False, cancel_futures=True)
            raise
        ex.shutdown()
        load_s = time.time() - self.t0
        self.stop_load.set()
        for t in threads[2:]:
            t.join(timeout=60)
        # Whatever the faults left: PostgreSQL up, both replicas up, the mock's endpoints on.
        if not self.cluster.is_running():
            self.cluster.start()
        for r in self.reps.replicas.values():
            if not r.alive():
                deadline = time.monotonic() + 10
                while not r.alive() and time.monotonic() < deadline:
                    time.sleep(0.1)
        mock_json(self.mock_url, "/_config", {"lookup_status": 0, "list_status": 0})
        if self.caps.get("list_page_status"):
            mock_json(self.mock_url, "/_config", {"list_page_status": 0})
        # The operator keeps resolving for one more window, then the drain decides.
        self.stop_resolver.wait(min(self.sizes.window_s, 10))
        self.stop_resolver.set()
        threads[1].join(timeout=30)
        self.log(f"campaign: load {load_s:.1f} s, {dict(self.counters)}; draining", flush=True)
        start = time.monotonic()
        waited, counts = 0.0, {}
        while time.monotonic() - start < self.sizes.drain_s:
            step = min(5.0, self.sizes.drain_s - (time.monotonic() - start))
            _, counts = checker.drain(self.sqlf, self.pfx, step, interval=0.5)
            waited = time.monotonic() - start
            if all(s in checker.FINAL for s in counts):
                break
            self.log(f"campaign: drain {waited:.0f} s: {counts}", flush=True)
        time.sleep(1.0)  # a create sent late would be in the ledger now
        self.stop_sampler.set()
        threads[0].join(timeout=30)
        reset_thread.join(timeout=30)
        return {"load_s": round(load_s, 1), "drain_s": round(waited, 2)}

    # -- what the checker needs

    def chat_replays(self):
        """After the drain, before the ledger is read: every chat job (and background response)
        asked again with its key and body — a completed one twice (`Prefer: wait`: the record,
        byte for byte, twice), one in doubt or failed once (`respond-async`: its state, and
        nothing sent)."""
        slots = [ix for ix, p in enumerate(self.plan_of)
                 if p is not None and p.kind in STREAM_KINDS and self.intents[ix] is not None]
        if not slots:
            return {}
        keys = ",".join(f"'{self.intents[ix].key}'" for ix in slots)
        state = {k: (jid, st) for jid, k, st in self.sqlf(
            f"SELECT id, idempotency_key, state FROM operations WHERE idempotency_key IN ({keys})")}
        out = {}

        def ask(ix):
            it = self.intents[ix]
            if it.key not in state:
                return None
            jid, st = state[it.key]
            got = []
            for n in range(2 if st == "completed" else 1):
                h = {"Prefer": "wait=10"} if st == "completed" else {"Prefer": "respond-async"}
                a = None
                for i in range(10):   # a replica may be restarting: the same request again
                    a = post(self.port(n + i), replace(it, headers=h, leave_after=None), 20)
                    if a.status is not None and a.status < 500 and not a.error:
                        break
                    time.sleep(0.3)
                got.append({"status": a.status, "body": a.body, "error": a.error,
                            "replayed": a.replayed, "job_id": a.job_id,
                            "content_type": a.content_type})
            return jid, {"state": st, "key": it.key, "answers": got}

        with ThreadPoolExecutor(max_workers=4) as ex:
            for r in ex.map(ask, slots):
                if r:
                    out[r[0]] = r[1]
        return out

    def collect(self):
        replays = self.chat_replays()
        time.sleep(0.5)  # a create a replay caused would be in the ledger now
        st, doc = mock_json(self.mock_url, "/_ledger")
        ledger = doc["creates"]
        st, chaos = mock_json(self.mock_url, "/_chaos")
        async_ids = {e["task_id"] for e in ledger
                     if e.get("task_id") and e.get("provider") in ("keyed-async", "replicate")}
        tasks = {}
        for tid in sorted(async_ids):
            st, t = mock_json(self.mock_url, f"/_tasks/{tid}")
            if st == 200:
                tasks[tid] = t
        q = ("SELECT o.id, o.idempotency_key, o.state, coalesce(o.remote_id, ''), "
             "coalesce(o.last_error, ''), (o.cancel_requested_at IS NOT NULL), o.provider, "
             "t.token_sha256, coalesce(o.resolution, ''), coalesce(o.outputs_received, -1), "
             # a body stored with its upload's parts in the archive store (upload.h's magic)
             "substring(o.req_body FROM 1 FOR 18) = "
             "'\\x6964656d676174652d75706c6f61642f310a'::bytea "
             "FROM operations o "
             "JOIN tenants t ON t.id = o.tenant_id "
             f"WHERE o.idempotency_key LIKE '{self.pfx}-%'")
        rows = {}
        for r in self.sqlf(q):
            rows[r[0]] = {"id": r[0], "key": r[1], "state": r[2], "remote_id": r[3],
                          "last_error": r[4], "cancel_requested": r[5] == "t", "provider": r[6],
                          "token_sha256": r[7], "resolution": r[8],
                          "outputs_received": int(r[9]), "upload_in_store": r[10] == "t"}
        by_sha = {sha256_hex(t.encode()): t for t in self.tokens}
        views = {}

        def view(jid):
            tok = by_sha.get(rows[jid]["token_sha256"])
            st, _, doc, _, _ = self.request("GET", f"/v1/jobs/{jid}", tok, tries=10, seconds=20)
            # Not read: what the gateway answered instead, for the evidence.
            return jid, doc if st == 200 else {"unread": st, "answer": doc}

        with ThreadPoolExecutor(max_workers=6) as ex:
            for jid, v in ex.map(view, list(rows)):
                views[jid] = v
        # The gateway's own record of the creates it sent for the jobs a client cancelled.
        sends = collections.defaultdict(list)
        with self.lock:
            cancelled = [jid for jid, j in self.jobs.items() if j.cancel_ack and jid in rows]
        for i in range(0, len(cancelled), 200):
            ids = ",".join(f"'{jid}'" for jid in cancelled[i:i + 200])
            for jid, started, sent, outcome, finished in self.sqlf(
                    # A lease that expired while sending: the dead sender's bytes may have
                    # left at any time before the reaper's row (its finished_at).
                    "SELECT operation_id, coalesce(extract(epoch FROM started_at), "
                    "extract(epoch FROM finished_at), 0)::text, "
                    "coalesce(bytes_sent, 0)::text, outcome, "
                    "extract(epoch FROM finished_at)::text FROM attempts "
                    f"WHERE kind = 'create' AND operation_id IN ({ids})"):
                sends[jid].append({"started": float(started), "bytes_sent": int(sent),
                                   "outcome": outcome, "finished": float(finished)})
        outcomes = {f"{k}:{o}": int(n) for k, o, n in self.sqlf(
            "SELECT a.kind, a.outcome, count(*) FROM attempts a JOIN operations o "
            "ON o.tenant_id = a.tenant_id AND o.id = a.operation_id "
            f"WHERE o.idempotency_key LIKE '{self.pfx}-%' GROUP BY 1, 2 ORDER BY 1, 2")}
        records, steps = self.stream_records()
        return {"ledger": ledger, "tasks": tasks, "rows": rows, "views": views,
                "chaos": chaos if isinstance(chaos, dict) else None, "sends": dict(sends),
                "attempt_outcomes": outcomes, "trips": sorted(self.trips),
                "chat_replays": replays, "records": records, "resume_steps": steps}

    def stream_records(self):
        """The background responses' records as the database holds them (the bytes the
        checker compares every client's with: a replay could be synthesised), and each job's
        attempts in order (kind:outcome — `resumed_partial`, `resumed` are the resumes)."""
        name = self.ents["respond"]["name"]
        records, steps = {}, collections.defaultdict(list)
        for jid, hexed in self.sqlf(
                "SELECT id, coalesce(encode(resp_body, 'hex'), '-') FROM operations "
                f"WHERE provider = '{name}' AND idempotency_key LIKE '{self.pfx}-%'"):
            records[jid] = None if hexed == "-" else bytes.fromhex(hexed)
        for jid, kind, outcome in self.sqlf(
                "SELECT a.operation_id, a.kind, a.outcome FROM attempts a JOIN operations o "
                "ON o.tenant_id = a.tenant_id AND o.id = a.operation_id "
                f"WHERE o.provider = '{name}' AND o.idempotency_key LIKE '{self.pfx}-%' "
                "ORDER BY a.operation_id, a.seq"):
            steps[jid].append(f"{kind}:{outcome}")
        return records, dict(steps)

    def coverage(self):
        """What the run exercised, from the driver's side."""
        with self.lock:
            jobs = list(self.jobs.values())
        seen = collections.Counter()
        for j in jobs:
            for st in {s.state for s in j.samples}:
                seen[st] += 1
        acks = collections.Counter(j.cancel_ack.get("state") for j in jobs if j.cancel_ack)
        with self.lock:
            slow = sorted(self.drive_s.items(), key=lambda x: -x[1])[:5]
        return {"jobs_seen_in": dict(seen), "cancel_acked_in": dict(acks),
                "slowest_drivers": [(s, self.plan_of[s].kind if self.plan_of[s] else None, d,
                                     [a for _, a in self.plan_of[s].actions]
                                     if self.plan_of[s] else None,
                                     [[(a.status, a.error, round(a.t1 - a.t0, 1))
                                       for a in o.attempts][-4:]
                                      for o in self.chat_clients.get(s, [])])
                                    for s, d in slow]}

    def attempts_of(self, jid):
        """The gateway's own attempt log for one job (evidence)."""
        try:
            return self.sqlf(
                "SELECT a.seq, a.kind, a.outcome, coalesce(a.http_status::text, ''), "
                "coalesce(a.curl_code::text, ''), a.decision, coalesce(a.error, ''), "
                "extract(epoch FROM a.finished_at)::text FROM attempts a "
                f"WHERE a.operation_id = '{jid}' ORDER BY a.seq")
        except Exception as e:  # noqa: BLE001 - evidence is best effort
            return [[f"unavailable: {e}"]]


# --- evidence -----------------------------------------------------------------------------------------

def save_evidence(summary, evidence, plan):
    """Writes the run's summary, evidence and fault schedule next to the summary lines; returns
    the path."""
    from . import report
    d = os.path.dirname(report.SUMMARY_FILE)
    path = os.path.join(d, f"campaign-{plan.seed}-{int(time.time())}.json")
    try:
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"summary": summary, "faults": plan.faults, "evidence": evidence}, f,
                      indent=1, default=str)
    except OSError:
        return None
    return path


def append_findings(path, summary, evidence):
    """One Markdown section per violation kind of this run, with up to three jobs' evidence."""
    by = collections.defaultdict(list)
    for ev in evidence:
        by[ev["violation"]].append(ev)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "a") as f:
        for name, evs in by.items():
            f.write(f"\n## {name} — seed {summary['seed']} ({stamp}, mock {summary.get('mock_mode')})\n\n")
            f.write(f"Replay: `CAMPAIGN_SEED={summary['seed']}` (intents {summary['intents']}). "
                    f"Count in this run: {summary.get(name)}.\n\n")
            for ev in evs[:3]:
                f.write(f"- job `{ev.get('job')}` ({ev.get('kind')}, key `{ev.get('key')}`): "
                        f"{ev.get('why')}\n")
                f.write("```json\n" + json.dumps(ev, indent=1, default=str)[:6000] + "\n```\n")
