#!/usr/bin/env python3
"""Checks that no source files call each other in a loop: reads the object
files of a build with nm, draws an edge from each object to every object
defining a symbol it uses, and prints each cycle of that graph (each
strongly connected set of more than one file) with the symbols that close
it. Exits 1 when there is one.

    python3 tools/callgraph.py [--nm nm] DIR_OR_OBJECT...

A directory is searched for *.o files (a target's CMakeFiles/NAME.dir).
Each group of arguments is one graph: separate groups with --, e.g. the
library's objects, then the command line's."""
import argparse
import os
import subprocess
import sys


def objects(paths):
    found = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                found += [os.path.join(root, f) for f in files if f.endswith(".o")]
        else:
            found.append(p)
    return sorted(found)


def symbols(nm, obj):
    out = subprocess.run([nm, obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCV" and parts[1].isupper():
            defined.add(parts[2])
    return defined, used


def name(obj):
    base = os.path.basename(obj)
    return base[:-2] if base.endswith(".o") else base


def cycles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check(nm, paths):
    objs = objects(paths)
    if not objs:
        print(f"no object files under {' '.join(paths)}")
        return 1
    table = {o: symbols(nm, o) for o in objs}
    owner = {}
    for o, (defined, _) in table.items():
        for s in defined:
            owner[s] = o
    graph = {name(o): set() for o in objs}
    why = {}
    for o, (_, used) in table.items():
        for s in used:
            d = owner.get(s)
            if d and d != o:
                graph[name(o)].add(name(d))
                why.setdefault((name(o), name(d)), []).append(s)
    found = cycles(graph)
    for comp in found:
        print("cycle: " + ", ".join(comp))
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    print(f"  {a} -> {b}: {', '.join(sorted(why[(a, b)])[:6])}")
    print(f"{len(objs)} objects, {sum(len(v) for v in graph.values())} edges, "
          f"{len(found)} cycles")
    return 1 if found else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nm", default="nm")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    groups, group = [], []
    for p in args.paths:
        if p == "--":
            groups.append(group)
            group = []
        else:
            group.append(p)
    groups.append(group)
    return max(check(args.nm, g) for g in groups if g)


if __name__ == "__main__":
    sys.exit(main())
