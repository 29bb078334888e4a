"""Provider entries for the chaos scenarios, all pointing at the counting mock.

- plain   no idempotency keys, no way to look a task up (reconcile `none`, a 1 s window):
          anything ambiguous must end in `review`, never in a second create;
- lookup  no keys, but the task can be found by our client reference (X-Client-Ref header,
          `get_by_client_id`): ambiguity is resolved to completed, or proven absent and resent;
- keyed   the provider dedupes on `Idempotency-Key` (/v2): a resend is a safe transport retry;
- listed  no keys, `list_match` on the provider's task list.

The client reference travels in a header, never in the body, so the body the provider receives
is exactly the intent's canonical body and the checker can link a create by its hash."""

FAST_RETRY = {"max_attempts": 50, "deadline_seconds": 600, "base_ms": 50, "cap_ms": 300}
T1 = {"connect_ms": 1000, "total_ms": 1000}
OUTPUTS = {"requested": "$.n", "received": "$.data[*]", "usage": "$.usage"}


def entry(name, base_url, path="/v1/images/generations", route="images/generations", **extra):
    e = {"name": name, "base_url": base_url, "mode": "sync", "timeouts": dict(T1),
         "routes": [{"route": route, "method": "POST", "path": path}],
         "outputs": dict(OUTPUTS), "retry": dict(FAST_RETRY)}
    e.update(extra)
    return e


def plain(base_url, name="plain", window_seconds=1, **extra):
    return entry(name, base_url, reconcile={"strategy": "none", "window_seconds": window_seconds},
                 **extra)


def lookup(base_url, name="lookup", **extra):
    return entry(name, base_url, client_ref={"header": "X-Client-Ref"},
                 reconcile={"strategy": "get_by_client_id", "window_seconds": 60,
                            "found_result": "$.result",
                            "interval_ms": 200, "absent_grace_ms": 1000,
                            "lookup": {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                                       "client_ref": "$.client_ref",
                                       "absent": {"path": "$.error.code", "equals": "not_found"}}},
                 **extra)


def keyed(base_url, name="keyed", **extra):
    return entry(name, base_url, path="/v2/generations", route="generations",
                 idempotency={"header": "Idempotency-Key"},
                 reconcile={"strategy": "idempotent_resubmit", "interval_ms": 200}, **extra)


def listed(base_url, name="listed", window_seconds=4, **extra):
    return entry(name, base_url, client_ref={"header": "X-Client-Ref"},
                 reconcile={"strategy": "list_match", "window_seconds": window_seconds,
                            "found_result": "$.result",
                            "interval_ms": 300, "absent_grace_ms": 2000,
                            "list": {"path": "/v1/images/tasks?since={since}&until={until}",
                                     "items": "$.data[*]", "match": "$.client_ref",
                                     "id": "$.id", "next_cursor": "$.next_cursor"}},
                 **extra)


def route(entry_):
    return f"{entry_['name']}/{entry_['routes'][0]['route']}"


def all_three(base_url, tag=""):
    """The three sync personalities: plain, lookup, keyed (names suffixed with tag)."""
    return [plain(base_url, "plain" + tag), lookup(base_url, "lookup" + tag),
            keyed(base_url, "keyed" + tag)]


def kind(provider_name):
    """plain / lookup / keyed / listed, whatever the tag."""
    return provider_name.split("-")[0]


def tag():
    """A suffix that makes a test's provider names its own: a job another test left behind is
    never sent by this test's replicas, so it never shows in this test's ledger."""
    import uuid
    return "-" + uuid.uuid4().hex[:6]
