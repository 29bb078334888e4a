#!/bin/sh
# Checks the monitoring shipped in deploy/kubernetes/monitoring with Prometheus's own tool:
# the PrometheusRule's spec.groups, extracted to a plain rules file, pass `promtool check rules`,
# and the alerts fire as tests/monitoring/alerts_test.yaml expects (`promtool test rules`); the
# Grafana dashboard is valid JSON. Then tests/monitoring/label_values.py reads the source: every
# idemgate_* name the rules, the dashboard and the alert tests' series use is one src/*.c
# prints, and every label value they select on (result="committed", state="unknown", …) is one
# it can print. The metric names are also checked against a running gateway's /metrics by
# tests/integration/test_metrics.py.
set -eu
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MON="$ROOT/deploy/kubernetes/monitoring"
PYTHON="${PYTHON:-/usr/bin/python3}"
command -v promtool >/dev/null 2>&1 || {
    echo "check-monitoring: promtool is missing (Debian package prometheus; make deps installs it)" >&2
    exit 1
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" - "$MON/prometheusrule.yaml" "$tmp/idemgate-rules.yaml" "$MON/idemgate-dashboard.json" <<'PY'
import json, sys, yaml
with open(sys.argv[1]) as f:
    rule = yaml.safe_load(f)
assert rule["kind"] == "PrometheusRule", rule.get("kind")
with open(sys.argv[2], "w") as f:
    yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, sort_keys=False)
with open(sys.argv[3]) as f:
    json.load(f)
PY
cp "$ROOT/tests/monitoring/alerts_test.yaml" "$tmp/"
promtool check rules "$tmp/idemgate-rules.yaml"
(cd "$tmp" && promtool test rules alerts_test.yaml)
"$PYTHON" "$ROOT/tests/monitoring/label_values.py" "$ROOT"
