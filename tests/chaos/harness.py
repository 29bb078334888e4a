"""What every scenario shares: sizes (CI or CHAOS_FULL=1), intents, the drain-check-emit step,
merging the summaries of several runs into the scenario's one line, and the assertion."""

import collections
import os
import time
import uuid

from . import checker, providers, report
from .client import Intent

FULL = os.environ.get("CHAOS_FULL") == "1"


def size(ci, full):
    return full if FULL else ci


def wait_until(pred, timeout, interval=0.05):
    """Polls pred until it is true or timeout seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def prefix(tag):
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def intents(pfx, tokens, entries, n, mock=None, start=0):
    """n intents, round-robin over tenants and providers, each with a body of its own.
    mock: a dict of mock controls, or a function i -> dict (or None), put in `_mock`."""
    out = []
    for i in range(start, start + n):
        e = entries[i % len(entries)]
        key = f"{pfx}-{i}"
        body = {"prompt": f"chaos {key}", "n": 1}
        m = mock(i) if callable(mock) else mock
        if m:
            body["_mock"] = m
        out.append(Intent(tokens[i % len(tokens)], key, body, providers.route(e), kind=e["name"]))
    return out


def conclude(scenario, outcomes, sqlf, mock_url, pfx, drain_timeout=60.0, settle=0.3, emit=True,
             **extra):
    """Drains, reads the ledger, checks; emits the summary line unless emit is False."""
    waited, _ = checker.drain(sqlf, pfx, drain_timeout)
    time.sleep(settle)  # a create sent late would show in the ledger now
    s = checker.check(scenario, outcomes, sqlf, checker.ledger(mock_url), pfx, waited, **extra)
    if emit:
        report.emit(checker.public(s))
    return s


SUMMED = ("intents", "acknowledged", "lost", "duplicates", "unexpected", "unknown_after_drain",
          "review", "completed", "failed", "creates", "replays", "id_mismatch", "stuck",
          "failed_but_created", "hash_mismatch", "drain_s")


def merge(scenario, summaries, **extra):
    """One line for a scenario made of several runs: counts are summed."""
    m = collections.OrderedDict(scenario=scenario)
    for k in SUMMED:
        m[k] = sum(s.get(k, 0) for s in summaries)
    m["drain_s"] = round(m["drain_s"], 2)
    m["client"] = {k: sum(s["client"][k] for s in summaries) for k in ("ok", "failed", "unknown")}
    m["runs"] = len(summaries)
    keys = [k for s in summaries for k in s.get("unknown_keys", [])]
    if keys:
        m["unknown_keys"] = keys[:20]
    m.update(extra)
    m["_detail"] = {}
    for s in summaries:
        for k, v in s.get("_detail", {}).items():
            m["_detail"].setdefault(k, []).extend(v)
    return m


def emit(summary):
    return report.emit(checker.public(summary))


def assert_clean(summary):
    v = checker.violations(summary)
    assert not v, f"checker: {v}; detail {summary.get('_detail')}; {checker.public(summary)}"
