#!/usr/bin/env python3
"""Reads one callgrind dump (made with --dump-instr=no) and prints where the instructions went:
per shared object, and per function, both exclusive and inclusive, divided by a request count.

    cg_top.py FILE REQUESTS [N]        text, the N (default 25) costliest functions
    cg_top.py --json FILE REQUESTS [N] the same as JSON

Written for the benchmark because callgrind_annotate 3.19 attributes the whole of a dump taken
with callgrind_control to the threads' entry point (clone) when counters were zeroed mid-run.
Inclusive costs are the function's own plus the calls it made (recursive calls are counted
once per level, which can overstate a recursive function; none of the hot path is).
"""
import collections
import json
import re
import sys

NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")


def parse(path):
    names = {"ob": {}, "fn": {}, "fl": {}}
    kinds = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl",
             "cfi": "fl", "cfl": "fl"}
    excl = collections.Counter()
    incl_calls = collections.Counter()
    obj_of = {}
    ob = fn = None
    pending_call = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line[0] == "#":
                continue
            key, sep, rest = line.partition("=")
            if sep and key in kinds:
                m = NAMED.match(rest)
                kind = kinds[key]
                if m:
                    ident, name = m.group(1), m.group(2)
                    if name is not None:
                        names[kind][ident] = name
                    value = names[kind].get(ident, "(" + ident + ")")
                else:
                    value = rest
                if key == "ob":
                    ob = value
                elif key == "fn":
                    fn = value
                    obj_of.setdefault(fn, ob)
                continue
            if sep and key == "calls":
                pending_call = True
                continue
            if sep:
                continue
            if line[0] in "0123456789+-*":
                parts = line.split()
                if len(parts) < 2 or fn is None:
                    pending_call = False
                    continue
                cost = int(parts[1])
                if pending_call:
                    incl_calls[fn] += cost
                    pending_call = False
                else:
                    excl[fn] += cost
    total = sum(excl.values())
    incl = {f: excl[f] + incl_calls[f] for f in set(excl) | set(incl_calls)}
    by_obj = collections.Counter()
    for f, c in excl.items():
        by_obj[(obj_of.get(f) or "?").rsplit("/", 1)[-1]] += c
    return total, excl, incl, by_obj, obj_of


def short(fn, obj):
    o = (obj or "?").rsplit("/", 1)[-1]
    return fn if not fn.startswith("0x") else f"{fn} [{o}]"


def main():
    args = sys.argv[1:]
    as_json = args and args[0] == "--json"
    if as_json:
        args = args[1:]
    path, n_req = args[0], max(1, int(args[1]))
    top = int(args[2]) if len(args) > 2 else 25
    total, excl, incl, by_obj, obj_of = parse(path)
    ex = [(short(f, obj_of.get(f)), c // n_req) for f, c in excl.most_common(top)]
    ob = [(o, c // n_req) for o, c in by_obj.most_common()]
    # Inclusive: the gateway's own functions only (the libraries' internals are in `exclusive`).
    own = sorted(((f, c) for f, c in incl.items()
                  if (obj_of.get(f) or "").endswith("/idemgate")), key=lambda x: -x[1])[:top]
    inc = [(f, c // n_req) for f, c in own]
    if as_json:
        print(json.dumps({"ir_per_request": total // n_req, "by_object": ob, "exclusive": ex,
                          "inclusive_gateway": inc}))
        return
    print(f"{total // n_req} instructions per request in this dump ({total} over {n_req}; idle cost included)\n")
    print("by shared object (exclusive, per request):")
    for o, c in ob:
        if c:
            print(f"  {c:>9}  {100.0 * c * n_req / total:5.1f}%  {o}")
    print("\nfunctions, exclusive, per request:")
    for f, c in ex:
        print(f"  {c:>9}  {100.0 * c * n_req / total:5.1f}%  {f}")
    print("\nthe gateway's functions, inclusive, per request:")
    for f, c in inc:
        print(f"  {c:>9}  {100.0 * c * n_req / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
