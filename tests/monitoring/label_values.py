"""The label values the monitoring selects on, checked against the gateway's C source.

Usage: python3 label_values.py ROOT

A selector such as idemgate_intake_batches_total{result="committed"} in an alert, a dashboard
panel or a promtool test's input series matches nothing at all when the gateway never prints
that value: the alert can then never fire, and its promtool test (fed the same wrong value)
still passes. This reads, as text, the values the source can print for each label of each
idemgate_* metric, and fails on any value (an `=` or `!=` matcher, each word of an `=~` or
`!~` alternation, or a regular expression that matches none) the source cannot print. It also
fails on an idemgate_* name the source never mentions, and on a label whose values it does not
know where to find, so that no matcher passes unchecked.

Where the values are:
- samples printed whole: a label="value" literal in a C string, e.g.
  idemgate_archive_outputs_total{outcome=\"expired\"} in src/metrics.c;
- labels printed with %s from a table of names: FROM_TABLES below, each naming the C array
  whose string initializers are the values (an array that disappears is an error, not an
  empty set).
"""
import json
import os
import re
import sys

import yaml

# Labels Prometheus attaches to every target (scrape job, address, the PodMonitor's pod), not
# printed by the gateway.
TARGET_LABELS = {"job", "instance", "pod", "namespace", "container", "endpoint", "service"}
# Labels whose values come from the configuration (provider names and their currencies) or the
# build (version, revision), and histogram bounds (printed with %g from the bucket arrays): not
# checked.
CONFIGURED_LABELS = {"provider", "currency", "version", "revision", "le"}

# (metric, label) -> the places its %s values come from: ("file", "array") for every string in
# that array's initializer, or ("file", '"literal"') for one string the file must hold.
FROM_TABLES = {
    ("idemgate_http_requests_total", "route"): [("src/metrics.c", "route_names")],
    ("idemgate_http_requests_total", "status"): [("src/metrics.c", "status_names")],
    ("idemgate_http_request_duration_seconds", "route"): [("src/metrics.c", "route_names")],
    # cls_name()'s names, then "other" for the attempts no class names (lease_expired …).
    ("idemgate_attempts_total", "outcome"): [("src/classify.c", "names"),
                                             ("src/metrics.c", '"other"')],
    ("idemgate_poll_reads_total", "outcome"): [("src/metrics.c", "poll_read_names")],
    ("idemgate_db_batch_rows_total", "statement"): [("src/metrics.c", "db_rows_stmts")],
    ("idemgate_db_batch_rows_total", "result"): [("src/metrics.c", "results")],
    ("idemgate_archive_reads_unserved_total", "reason"): [("src/metrics.c",
                                                           "archive_read_names")],
    # admin.c prints the states the database counts: an operation's states (st_name()).
    ("idemgate_operations", "state"): [("src/states.c", "names")],
}

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
C_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
# A sample in a C string: idemgate_x{a=\"v\",b=\"%s\"}.
C_SAMPLE = re.compile(r'(idemgate_[a-z0-9_]+)\{((?:[a-z_]+=\\"[^"\\]*\\",?)+)\}')
C_LABEL = re.compile(r'([a-z_]+)=\\"([^"\\]*)\\"')
SELECTOR = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^{}]*)\}')
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
PLAIN_WORDS = re.compile(r'^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$')


def base_name(metric):
    for suffix in HISTOGRAM_SUFFIXES:
        if metric.endswith(suffix):
            return metric[:-len(suffix)]
    return metric


def array_strings(root, path, name):
    """The string literals of the initializer of the one array `name` defined in `path`."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    if name.startswith('"'):
        if name not in text:
            raise SystemExit(f"label_values: {path} holds no {name}")
        return {name.strip('"')}
    found = re.findall(r'\b%s\s*(?:\[[^\]]*\]\s*)+=\s*\{(.*?)\};' % re.escape(name), text, re.S)
    if len(found) != 1:
        raise SystemExit(f"label_values: {path}: {len(found)} definitions of {name}[], not 1")
    strings = set(C_STRING.findall(re.sub(r"/\*.*?\*/", "", found[0], flags=re.S)))
    if not strings:
        raise SystemExit(f"label_values: {path}: {name}[] holds no string")
    return strings


def source_values(root):
    """({(metric, label): values}, the text of every src/*.c) from the source."""
    values, texts = {}, []
    src = os.path.join(root, "src")
    for fn in sorted(os.listdir(src)):
        if fn.endswith(".c"):
            with open(os.path.join(src, fn), encoding="utf-8") as f:
                texts.append(f.read())
    text = "\n".join(texts)
    for metric, labels in C_SAMPLE.findall(text):
        for label, value in C_LABEL.findall(labels):
            if "%" not in value:
                values.setdefault((metric, label), set()).add(value)
    for key, places in FROM_TABLES.items():
        for path, name in places:
            values.setdefault(key, set()).update(array_strings(root, path, name))
    return values, text


def selectors(where, promql):
    """(where, metric, [(label, op, value)]) for each selector of a PromQL expression."""
    out = []
    for m in SELECTOR.finditer(promql):
        metric, body, matchers, pos = m.group(1), m.group(2), [], 0
        while pos < len(body) and body[pos:].strip():
            mm = MATCHER.match(body, pos)
            if not mm:
                raise SystemExit(f"label_values: {where}: cannot read matchers {{{body}}}")
            matchers.append((mm.group(1), mm.group(2), mm.group(3).replace('\\\\', '\\')))
            pos = mm.end()
        out.append((where, metric, matchers))
    return out


def shipped(root):
    """Every selector of the PrometheusRule, the dashboard and the alert tests' series."""
    mon = os.path.join(root, "deploy", "kubernetes", "monitoring")
    out = []
    with open(os.path.join(mon, "prometheusrule.yaml"), encoding="utf-8") as f:
        rule = yaml.safe_load(f)
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            out += selectors(f"prometheusrule.yaml {r.get('alert') or r.get('record')}",
                             r["expr"])

    def walk(o, title):
        if isinstance(o, dict):
            title = o.get("title", title)
            for k, v in o.items():
                if k == "expr" and isinstance(v, str):
                    out.extend(selectors(f"idemgate-dashboard.json {title!r}", v))
                else:
                    walk(v, title)
        elif isinstance(o, list):
            for v in o:
                walk(v, title)

    with open(os.path.join(mon, "idemgate-dashboard.json"), encoding="utf-8") as f:
        walk(json.load(f), "")
    with open(os.path.join(root, "tests", "monitoring", "alerts_test.yaml"),
              encoding="utf-8") as f:
        tests = yaml.safe_load(f)
    for i, t in enumerate(tests["tests"]):
        for s in t.get("input_series", []):
            out += selectors(f"alerts_test.yaml test {i + 1} series", s["series"])
    return out


def main(root):
    values, text = source_values(root)
    bad, checked = [], 0
    for where, metric, matchers in shipped(root):
        if metric is None:
            bad.append(f"{where}: a selector without a metric name cannot be checked")
            continue
        if not metric.startswith("idemgate_"):
            continue  # up, process_*: Prometheus's own or the standard set
        base = base_name(metric)
        if not re.search(r"\b(%s|%s)\b" % (re.escape(metric), re.escape(base)), text):
            bad.append(f"{where}: {metric}: src/*.c never prints this name")
            continue
        for label, op, value in matchers:
            if label in TARGET_LABELS or label in CONFIGURED_LABELS or value == "":
                continue  # (label="" selects the series without the label)
            known = values.get((metric, label)) or values.get((base, label))
            if not known:
                bad.append(f"{where}: {metric}{{{label}}}: no value of this label is known in "
                           f"src/*.c (add where it comes from to FROM_TABLES)")
                continue
            checked += 1
            prints = f'(it prints {", ".join(sorted(known))})'
            what = f'{where}: {metric}{{{label}{op}"{value}"}}'
            if op in ("=", "!="):
                wrong = [] if value in known else [value]
            elif PLAIN_WORDS.match(value):  # a|b|c: each word is a value
                wrong = [v for v in value.split("|") if v not in known]
            else:  # anchored, as Prometheus anchors it
                if not any(re.fullmatch(value, v) for v in known):
                    bad.append(f"{what}: matches no value src/*.c prints {prints}")
                continue
            for v in wrong:
                bad.append(f'{what}: src/*.c never prints {label}="{v}" {prints}')
    if bad:
        print("label_values: FAILED", *bad, sep="\n  ", file=sys.stderr)
        return 1
    print(f"label_values: SUCCESS: {checked} label matchers checked against src/*.c")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
