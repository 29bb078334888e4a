"""Where the checker's summary lines go: stdout (the test's captured output and report), a JSON
Lines file in build-test/, and a `chaos checker` section of pytest's terminal summary, so that a
plain `make test` (pytest -q, output captured) shows every line."""

import json
import os
import threading

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SUMMARY_FILE = os.environ.get("CHAOS_SUMMARY_FILE",
                              os.path.join(ROOT, "build-test", "chaos-summary.jsonl"))

_lines = []
_lock = threading.Lock()


class _TerminalSummary:
    def pytest_terminal_summary(self, terminalreporter):
        if _lines:
            terminalreporter.section("chaos checker summaries")
            for line in _lines:
                terminalreporter.write_line(line)


def install(config):
    """Registers the terminal-summary section once per pytest session."""
    if not config.pluginmanager.has_plugin("idemgate-chaos-report"):
        config.pluginmanager.register(_TerminalSummary(), "idemgate-chaos-report")


def emit(summary):
    line = json.dumps(summary, separators=(",", ":"))
    print(line, flush=True)
    with _lock:
        _lines.append(line)
        try:
            os.makedirs(os.path.dirname(SUMMARY_FILE), exist_ok=True)
            with open(SUMMARY_FILE, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return line
