"""House rules checked on the source tree (no processes)."""

import os
import re

from conftest import ROOT

INCLUDE = os.path.join(ROOT, "include", "idemgate")
SRC = os.path.join(ROOT, "src")


def header_graph(folder=INCLUDE):
    """{header: {headers it includes}} among the project's own headers."""
    graph = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".h"):
            with open(os.path.join(folder, name)) as f:
                graph[name] = set(re.findall(r'^\s*#\s*include\s+"idemgate/([^"]+)"', f.read(),
                                             re.M))
    return graph


def module_graph(include=INCLUDE, src=SRC):
    """{module: {modules whose header it includes}}: a module is src/X.c with
    include/idemgate/X.h."""
    graph = {}
    for folder, ext in ((include, ".h"), (src, ".c")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(ext):
                with open(os.path.join(folder, name)) as f:
                    deps = re.findall(r'^\s*#\s*include\s+"idemgate/([^"]+)\.h"', f.read(), re.M)
                mod = name[:-len(ext)]
                graph.setdefault(mod, set()).update(d for d in deps if d != mod)
    return graph


def find_cycle(graph):
    """One include cycle as a list of headers, or None."""
    state, stack = {}, []

    def visit(h):
        state[h] = "open"
        stack.append(h)
        for d in sorted(graph.get(h, ())):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[h] = "done"
        return None

    for h in sorted(graph):
        if h not in state:
            found = visit(h)
            if found:
                return found
    return None


def test_no_include_cycle():
    """Issue 21 item 14: the archive planner and the profile loader included each other
    (archplan.c read profile.h, profile.c archplan.h). No header may reach itself through
    includes, and no two modules may include each other."""
    assert find_cycle({"a.h": {"b.h"}, "b.h": {"a.h"}}) == ["a.h", "b.h", "a.h"]
    assert find_cycle({"a.h": {"b.h"}, "b.h": set()}) is None
    cycle = find_cycle(header_graph())
    assert cycle is None, " -> ".join(cycle)
    mods = module_graph()
    assert "archplan" in mods and "profile" in mods, sorted(mods)
    mutual = sorted({tuple(sorted((a, b))) for a, deps in mods.items() for b in deps
                     if a in mods.get(b, ())})
    assert mutual == [], f"modules that include each other: {mutual}"
