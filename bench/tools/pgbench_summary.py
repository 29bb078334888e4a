#!/usr/bin/env python3
"""Summarises one pgbench run of bench/run.sh as one JSON line: tps and latency percentiles
from the per-transaction logs (-l).

    pgbench_summary.py PGBENCH_OUTPUT LOG_DIR CLIENTS
"""
import glob
import json
import re
import sys


def main():
    out = open(sys.argv[1]).read()
    lat = []
    for f in glob.glob(sys.argv[2] + "/pgbench_log.*"):
        for line in open(f):
            p = line.split()
            if len(p) >= 3 and p[2].isdigit():
                lat.append(int(p[2]))
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q / 100 * len(lat)))] if lat else 0

    tps = re.search(r"tps = ([0-9.]+) \(without", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    print(json.dumps({"requests": len(lat), "rps": float(tps.group(1)) if tps else 0.0,
                      "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
                      "p999_us": pct(99.9), "max_us": lat[-1] if lat else 0,
                      "clients": int(sys.argv[3]),
                      "failed": int(failed.group(1)) if failed else None}))


if __name__ == "__main__":
    main()
