#!/usr/bin/env python3
"""Gathers the results of bench/run.sh into one table (stdout) and one JSON file.

    report.py TMPDIR OUT.json SETTINGS_JSON

TMPDIR/results holds one JSON per run (wrk's done() line, pgbench's summary) and facts.tsv
(KEY<TAB>JSON lines: memory, callgrind totals, settings of the server).
"""
import datetime
import json
import os
import platform
import subprocess
import sys

ROWS = [  # key, label, what it is compared with
    ("mock", "mock provider, direct", "end-to-end baseline"),
    ("nginx", "nginx -> mock", "baseline"),
    ("e2e", "gateway end to end (Prefer: wait=30, new keys)", "nginx"),
    ("nginx_wide", "nginx -> mock, %(wide_connections)d conns", "baseline"),
    ("e2e_wide", "gateway end to end, %(wide_connections)d conns", "nginx_wide"),
    ("replay", "gateway replay (one completed key, Prefer: wait=30)", "nginx"),
    ("get", "gateway GET /v1/jobs/{id} (completed)", ""),
    ("slow_nginx", "nginx -> slow mock (%(slow_delay_ms)d ms), %(slow_connections)d conns", "baseline"),
    ("slow_e2e", "gateway -> slow mock, defaults, wait=60, %(slow_connections)d conns", "slow_nginx"),
    ("stream_nginx", "nginx -> mock, %(stream_events)d-event streams (streams/s)", "baseline"),
    ("stream_live", "gateway, %(stream_events)d-event streams live, new keys", "stream_nginx"),
    ("stream_replay", "gateway, one recorded stream replayed", "stream_nginx"),
    ("intake", "gateway intake 202 (new keys, no dispatcher)", "pgbench"),
    ("intake_disp", "gateway intake 202 (new keys, dispatchers on)", "pgbench"),
    ("intake_seq", "gateway intake 202, one sequential client", ""),
    ("intake_hist", "gateway intake 202, %(history_rows)d operations stored", "intake"),
    ("intake_tomb", "... and %(tombstone_rows)d key tombstones", "intake"),
    ("pgbench", "pgbench: intake statement, %(connections)d clients (ceiling)", "ceiling"),
    ("pgbench_gw", "pgbench: intake statement, %(http_threads)d clients (= gateway's)", ""),
    ("pgbench_batch", "pgbench: 32 intake rows per commit, 4 clients (rows/s)", ""),
]

TARGETS = {  # ratio key: (numerator, denominator, target, text)
    "intake_vs_pgbench": ("intake", "pgbench", 1.5, "intake / pgbench single-row ceiling"),
    "intake_vs_pgbench_batch": ("intake", "pgbench_batch", 0.0,
                                "intake / pgbench batched rows (how close to it)"),
    "e2e_vs_nginx": ("e2e", "nginx", 0.5, "end to end / nginx"),
    "e2e_wide_vs_nginx_wide": ("e2e_wide", "nginx_wide", 0.0,
                               "end to end / nginx, both with more clients at once"),
    "replay_vs_nginx": ("replay", "nginx", 1.0, "replay / nginx"),
    "slow_vs_nginx": ("slow_e2e", "slow_nginx", 0.9, "slow provider: end to end / nginx"),
    "stream_live_vs_nginx": ("stream_live", "stream_nginx", 0.5, "live streams / nginx (events/s)"),
    "stream_replay_vs_nginx": ("stream_replay", "stream_nginx", 1.0,
                               "replayed stream / nginx (events/s)"),
    "intake_hist_vs_intake": ("intake_hist", "intake", 0.0,
                              "intake with history / intake on an empty table"),
    "intake_tomb_vs_intake": ("intake_tomb", "intake", 0.0,
                              "intake with history and tombstones / intake on an empty table"),
}


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    osr = ""
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osr = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_mib": mem, "os": osr,
            "kernel": platform.release(), "loadavg_at_report": os.getloadavg()[0],
            "wrk": sh("wrk -v 2>&1 | head -1"), "nginx": sh("nginx -v 2>&1"),
            "valgrind": sh("valgrind --version")}


def ms(us):
    return "%.2f" % (us / 1000.0) if us is not None else "-"


def main():
    tmp, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    res_dir = os.path.join(tmp, "results")
    runs = {}
    for key, _, _ in ROWS:
        p = os.path.join(res_dir, key + ".json")
        if os.path.exists(p) and os.path.getsize(p) > 0:
            try:
                runs[key] = json.loads(open(p).read().strip().splitlines()[-1])
            except (ValueError, IndexError):
                pass
    facts = {}
    p = os.path.join(res_dir, "facts.tsv")
    batch_rows = 0
    if os.path.exists(p):
        for line in open(p):
            k, _, v = line.rstrip("\n").partition("\t")
            try:
                facts[k] = json.loads(v)
            except ValueError:
                facts[k] = v

    batch_rows = (facts.get("pgbench_batch") or {}).get("rows_per_transaction", 0)
    if batch_rows and "pgbench_batch" in runs:
        runs["pgbench_batch"]["transactions_per_sec"] = runs["pgbench_batch"]["rps"]
        runs["pgbench_batch"]["rps"] *= batch_rows  # rows/s: what it is compared as
    ratios = {}
    for k, (num, den, target, text) in TARGETS.items():
        if num in runs and den in runs and runs[den].get("rps"):
            r = runs[num]["rps"] / runs[den]["rps"]
            ratios[k] = {"value": round(r, 3), "target": target, "met": r >= target, "what": text}
            if not target:
                ratios[k]["target"] = None  # shown, not judged
    if "intake" in runs and "nginx" in runs:
        v = runs["intake"]["p99_us"] / max(1, runs["nginx"]["p99_us"])
        ratios["intake_p99_vs_nginx"] = {"value": round(v, 3), "target": 3.0, "met": v <= 3.0,
                                         "what": "intake p99 / nginx p99 (<= 3)", "le": True}
    if "intake_hist" in runs and "intake" in runs:
        v = runs["intake_hist"]["p99_us"] / max(1, runs["intake"]["p99_us"])
        ratios["intake_hist_p99_vs_intake"] = {
            "value": round(v, 3), "target": None, "what": "intake p99 with history / empty table"}
    fsync = facts.get("pg_test_fsync")
    if "intake_seq" in runs and fsync and fsync.get("fdatasync_ops_per_sec"):
        gap = runs["intake_seq"]["p50_us"] / 1000.0 - 1000.0 / fsync["fdatasync_ops_per_sec"]
        ratios["intake_seq_p50_minus_fsync_ms"] = {
            "value": round(gap, 3), "target": 1.0, "met": gap <= 1.0, "le": True,
            "what": "one client: intake p50 - one fdatasync, ms (<= 1)"}
    slow = facts.get("slow") if isinstance(facts.get("slow"), dict) else {}
    if "slow_e2e" in runs and slow.get("delay_ms"):
        over = runs["slow_e2e"]["p50_us"] / 1000.0 - slow["delay_ms"]
        ratios["slow_p50_over_delay_ms"] = {
            "value": round(over, 1), "target": 50.0, "met": over <= 50.0, "le": True,
            "what": "slow provider: p50 - the provider's delay, ms"}
    if "replay" in runs and "nginx" in runs:
        ok = runs["replay"]["p99_us"] <= runs["nginx"]["p99_us"]
        ratios["replay_p99_vs_nginx"] = {
            "value": round(runs["replay"]["p99_us"] / max(1, runs["nginx"]["p99_us"]), 3),
            "target": 1.0, "met": ok, "what": "replay p99 / nginx p99 (no worse: <= 1)"}

    mem = facts.get("gateway_main_memory", {})
    idle = facts.get("idle", {})
    memory = {}
    if idle:
        memory["rss_with_idle_kib"] = idle.get("rss_with_kib")
        memory["idle_connections"] = idle.get("connections")
        memory["idle_target_met"] = idle.get("rss_with_kib", 1 << 30) < 64 * 1024
    if facts.get("gateway_main_peak"):
        memory["peak_rss_kib"] = facts["gateway_main_peak"].get("peak_rss_kib")
    if mem:
        memory["peak_rss_under_load_kib"] = mem.get("peak_rss_kib")
        s = [x["rss_kib"] for x in mem.get("samples", []) if x.get("rss_kib")]
        loaded = [x["rss_kib"] for x in mem.get("samples", [])[1:] if x.get("rss_kib")]
        if loaded:
            memory["rss_loaded_min_kib"] = min(loaded)
            memory["rss_loaded_max_kib"] = max(loaded)
            memory["rss_drift"] = round(max(loaded) / min(loaded) - 1, 3)
            memory["requests"] = mem.get("requests")
        memory["samples"] = mem.get("samples")

    instr = {}
    for part in ("intake", "replay", "get"):
        c = facts.get("callgrind_" + part)
        if c and c.get("ir"):
            net = c["ir"] - c.get("idle_ir", 0)
            instr[part] = {"ir_per_request": round(net / c["requests"]),
                           "ir_total": c["ir"], "idle_ir": c.get("idle_ir", 0),
                           "requests": c["requests"], "client": c.get("client")}
            pp = os.path.join(res_dir, "profile-%s.json" % part)
            if os.path.exists(pp) and os.path.getsize(pp) > 0:
                instr[part]["profile"] = json.loads(open(pp).read())

    now = datetime.datetime.now(datetime.timezone.utc)
    commit = sh("git -C %s rev-parse --short HEAD 2>/dev/null" % json.dumps(os.getcwd()))
    dirty = sh("git -C %s status --porcelain -- src include migrations 2>/dev/null | head -1" % json.dumps(os.getcwd()))
    doc = {"date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit + ("+dirty" if dirty else ""),
           "binary": facts.get("binary"),
           "machine": dict(machine(), loadavg_at_start=facts.get("loadavg_start")),
           "settings": settings,
           "postgresql": facts.get("pg_settings"), "runs": runs, "ratios": ratios,
           "memory": memory, "instructions": instr,
           "notes": {k: v for k, v in facts.items() if k in ("replay_job", "pgbench_script",
                                                                "gateway_main", "gateway_intake_memory",
                                                                "pgbench_batch", "pg_test_fsync",
                                                                "slow", "inflight", "e2e_cost", "e2e_wide_cost",
                                                                "stream_live_cost", "intake_cost", "e2e_drain", "e2e_wide_drain",
                                                                "stream_live_drain",
                                                                "stream", "stream_many")}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    m = doc["machine"]
    print()
    b = doc.get("binary") or {}
    print("idemgate bench  %s  commit %s  (build/idemgate built %s, sha256 %s…)"
          % (doc["date"], doc["commit"], b.get("built", "?"), b.get("sha256", "?")))
    print("%s, %s cores, %s MiB, %s; %d connections, %d s per run" % (
        m["cpu"], m["cores"], m["memory_mib"], m["os"], settings["connections"], settings["seconds"]))
    print("gateway: %d http_threads, %d dispatch_workers; load average %s at start, %.2f at the end"
          % (settings["http_threads"], settings["dispatch_workers"], facts.get("loadavg_start", "?"),
             m["loadavg_at_report"]))
    print()
    w = 54
    print("%-*s %10s %9s %9s  %s" % (w, "run", "req/s", "p50 ms", "p99 ms", "answers"))
    print("-" * (w + 50))
    for key, label, _ in ROWS:
        r = runs.get(key)
        if not r:
            continue
        codes = r.get("codes")
        if codes is not None:
            ans = " ".join("%s:%d" % (k, v) for k, v in sorted(codes.items()))
            if r.get("replayed"):
                ans += " replayed:%d" % r["replayed"]
            errs = r.get("errors", {})
            bad = {k: v for k, v in errs.items() if v and k != "status"}
            if bad:
                ans += " errors:" + ",".join("%s=%d" % kv for kv in bad.items())
        else:
            ans = "failed:%s" % r.get("failed")
        print("%-*s %10.0f %9s %9s  %s" % (w, label % settings, r["rps"], ms(r["p50_us"]),
                                           ms(r["p99_us"]), ans))
    if fsync:
        print("%-*s %10.0f   (pg_test_fsync: one 8 kB write + fdatasync per op)"
              % (w, "disk: fdatasync ops/s", fsync["fdatasync_ops_per_sec"]))
    print()
    for k, r in ratios.items():
        if r["target"] is None:
            print("%-44s %6.2f   (no target)" % (r["what"], r["value"]))
            continue
        le = k == "replay_p99_vs_nginx" or r.get("le")
        print("%-44s %6.2f   target %s %-4s  %s" % (r["what"], r["value"], "<=" if le else ">=",
                                                     r["target"], "met" if r["met"] else "NOT met"))
    if memory:
        print()
        if memory.get("peak_rss_under_load_kib"):
            print("gateway peak RSS (VmHWM) under wrk load          %6.1f MiB"
                  % (memory["peak_rss_under_load_kib"] / 1024))
        if memory.get("peak_rss_kib"):
            print("gateway peak RSS (VmHWM), idle connections too   %6.1f MiB" % (memory["peak_rss_kib"] / 1024))
        if "rss_with_idle_kib" in memory:
            print("gateway RSS with %d idle connections           %6.1f MiB   target < 64 MiB  %s"
                  % (memory["idle_connections"], memory["rss_with_idle_kib"] / 1024,
                     "met" if memory["idle_target_met"] else "NOT met"))
        if "rss_drift" in memory:
            print("gateway RSS after each loaded run: %.1f .. %.1f MiB over %d requests (%+.0f%%; target flat, +-10%%)"
                  % (memory["rss_loaded_min_kib"] / 1024, memory["rss_loaded_max_kib"] / 1024,
                     memory["requests"], 100 * memory["rss_drift"]))
    if slow.get("gateway_mid_run"):
        g = slow["gateway_mid_run"]
        print()
        print("slow provider, mid-run: %s calls in flight, %s threads, %s PostgreSQL connections, "
              "RSS %.1f MiB" % (g.get("calls_in_flight"), g.get("threads"), g.get("pg_connections"),
                                (g.get("rss_kib") or 0) / 1024))
    stream = facts.get("stream") if isinstance(facts.get("stream"), dict) else {}
    if stream.get("first_byte_ms"):
        fb = stream["first_byte_ms"]
        print()
        print("streams: %s events each; first byte (median of %s sequential): nginx %s ms, "
              "gateway %s ms (a new job: recorded, sent, relayed)"
              % (stream.get("events_per_stream"), stream.get("first_byte_samples"),
                 fb.get("nginx"), fb.get("gateway")))
    many = facts.get("stream_many") if isinstance(facts.get("stream_many"), dict) else {}
    if many.get("rss_before_kib"):
        print("%s streams live at once (%s s each), gateway RSS: %.1f MiB before" % (
            many["connections"], many.get("seconds_per_stream"), many["rss_before_kib"] / 1024))
        for i, rd in enumerate(many.get("rounds") or []):
            mid = rd.get("mid_run") or {}
            print("  round %d: %.1f MiB with them live (%s threads), %.1f MiB after"
                  % (i + 1, (mid.get("rss_kib") or 0) / 1024, mid.get("threads"),
                     (rd.get("rss_after_kib") or 0) / 1024))
    for key, what in (("e2e_cost", "end-to-end job"),
                      ("e2e_wide_cost", "end-to-end job, %s conns" % settings.get("wide_connections")),
                      ("stream_live_cost", "live stream job"),
                      ("intake_cost", "intent (202, no dispatcher)")):
        cost = facts.get(key)
        if not (isinstance(cost, dict) and cost.get("jobs")):
            continue
        jobs = cost["jobs"]
        stmts = cost.get("statements") or []
        total = sum(float(s["ms"]) for s in stmts)
        print()
        drain = facts.get(key.replace("_cost", "_drain")) or {}
        print("per %s (%d jobs): PostgreSQL executor %.3f ms (wall), PostgreSQL CPU "
              "%.3f ms, gateway CPU %.3f ms%s"
              % (what, jobs, total / jobs,
                 1000.0 * cost.get("postgresql_cpu_ticks", 0) / cost["clk_tck"] / jobs,
                 1000.0 * cost["gateway_cpu_ticks"] / cost["clk_tck"] / jobs,
                 " (its work left after the run included: %s s%s)"
                 % (drain.get("seconds", "?"), ", %s not done" % drain["left"] if drain.get("left") else "")
                 if drain else ""))
        if cost.get("operations_updates"):
            print("    updates of operations: %d (%.2f a job), HOT %d (%.0f %%)"
                  % (cost["operations_updates"], cost["operations_updates"] / jobs,
                     cost.get("operations_hot_updates", 0),
                     100.0 * cost.get("operations_hot_updates", 0) / cost["operations_updates"]))
        for s in stmts[:10]:
            print("    %8.4f ms  %6.2f calls  %s" % (float(s["ms"]) / jobs, s["calls"] / jobs, s["query"]))
    infl = facts.get("inflight")
    if isinstance(infl, dict):
        print("calls in flight: %s submitted (%s), peak %s in flight (sampled %s); peak RSS %.1f MiB, "
              "%s threads, %s PostgreSQL connections; states %s; mock creates %s; all ended after %s s"
              % (infl.get("calls"), (infl.get("submitter") or {}).get("statuses"),
                 infl.get("peak_calls_in_flight"), infl.get("sampled_calls_in_flight"),
                 (infl.get("peak_rss_kib") or 0) / 1024, infl.get("peak_threads"),
                 infl.get("peak_pg_connections"), infl.get("states"), infl.get("mock_creates"),
                 infl.get("seconds_to_all_ended")))
    if instr:
        print()
        for part, c in instr.items():
            print("instructions per request, %-7s %9d   (callgrind: %d requests, idle cost subtracted)"
                  % (part, c["ir_per_request"], c["requests"]))
            prof = c.get("profile")
            if prof:
                print("    by object: " + ", ".join("%s %d" % (o.split(".so")[0], n)
                                                    for o, n in prof["by_object"][:6] if n))
                print("    top functions: " + ", ".join("%s %d" % (f, n) for f, n in prof["exclusive"][:4]))
    print()


if __name__ == "__main__":
    main()
