#!/usr/bin/env python3
"""Seconds each integration test file took, from a pytest JUnit report, as the JSON
tests/integration/durations.json holds (conftest.py hands the files to the workers longest
first). Refresh it after a file grew or shrank much:

    make integration PYTEST_ARGS=--junitxml=/tmp/junit.xml
    scripts/test-durations.py /tmp/junit.xml > tests/integration/durations.json
"""
import collections
import json
import sys
import xml.etree.ElementTree as ET


def main(path):
    took = collections.Counter()
    for case in ET.parse(path).iter("testcase"):
        # (classname: tests.integration.test_x, or …test_x.TestClass for a class's tests)
        module = next((p for p in case.get("classname", "").split(".")
                       if p.startswith("test_")), None)
        if module:
            took[module + ".py"] += float(case.get("time") or 0)
    json.dump({f: round(s) for f, s in sorted(took.items())}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: test-durations.py JUNIT.xml")
    main(sys.argv[1])
