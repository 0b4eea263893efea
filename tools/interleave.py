#!/usr/bin/env python3
"""Times `clattn bench` under several arms, interleaved: the one runner
for every old-against-new and this-against-that comparison
(tools/device_run.sh's ab, gab, dtypes, wgmma and mods stages). Each
round runs every arm once, in order, so that a shared machine's drift
falls on all of them alike.

    python3 tools/interleave.py --label TEXT --arm NAME=CLI[@VAR=VALUE...][+ARGS]
                                [--arm ...] [--rounds N] [--json FILE] -- BENCH ARGS...

An arm is a name, the clattn program, variables set for it (`@` before
each) and bench arguments of its own (after `+`, space-separated), e.g.
`--arm old=build-old/clattn`, `--arm w1=build-dev/clattn@CLATTN_MMA_WGMMA=1`,
`--arm softcap=build-dev/clattn+--softcap 30`. Prints `LABEL: NAME=GFLOPS
...` round after round (`-` where the arm failed); --json appends one JSON
line per run (label, arm, round, and bench's --json fields) to FILE."""
import argparse
import json
import os
import subprocess
import sys


def parse_arm(text):
    name, _, rest = text.partition("=")
    rest, _, extra = rest.partition("+")
    cli, *env = rest.split("@")
    if not name or not cli or any("=" not in e for e in env):
        raise argparse.ArgumentTypeError(f"not NAME=CLI[@VAR=VALUE...][+ARGS]: {text}")
    return name, cli, dict(e.split("=", 1) for e in env), extra.split()


def run(arm, bench, timeout):
    name, cli, env, extra = arm
    try:
        p = subprocess.run([cli, "bench", *bench, *extra, "--json"], env={**os.environ, **env},
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    if p.returncode:
        return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return (rows[-1], None) if rows else (None, "no --json line")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--arm", action="append", type=parse_arm, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run (default 300)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("bench", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    line, failed = f"{a.label}:", 0
    for r in range(1, a.rounds + 1):
        for arm in a.arm:
            row, why = run(arm, bench, a.timeout)
            line += f" {arm[0]}={row['gflops'] if row else '-'}"
            if why:
                failed = 1
                print(f"{a.label}: {arm[0]}: {why}", file=sys.stderr)
            if a.json and row:
                with open(a.json, "a") as f:
                    f.write(json.dumps({"label": a.label, "arm": arm[0], "round": r, **row}) + "\n")
    print(line, flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
