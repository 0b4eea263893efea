#!/usr/bin/env python3
"""Runs two builds of the clattn CLI on the same inputs and compares their
outputs byte for byte: the check that a change meant to keep results (a
refactor, a move of code) keeps them. Each case is a forward (O, LSE), then
a backward from the old build's O and LSE (dQ, dK, dV), per device,
variant, native level and dtype asked for. Needs numpy.

    python3 tools/bitcmp.py OLD/clattn NEW/clattn [--devices native,cpu,gpu]
        [--variants default,blocked,...] [--levels v4,v3,baseline]
        [--dtypes f32,bf16,f16] [--shapes 0,1,2]

--levels applies to native (CLATTN_NATIVE_LEVEL), --variants to the OpenCL
devices. Prints one line per case that differs and a closing
'N passed, N failed' line; exits 1 when any differs or fails to run."""
import argparse
import itertools
import os
import subprocess
import sys
import tempfile

import numpy as np

# (batch, q_seq, kv_seq, heads, kv_heads, head_dim, mask flags)
SHAPES = [
    (1, 37, 37, 4, 2, 40, ["--causal"]),
    (2, 70, 90, 2, 2, 64, ["--window", "16"]),
    (1, 130, 130, 8, 1, 128, ["--causal"]),
    (1, 33, 21, 2, 2, 5, []),
    (1, 48, 48, 2, 1, 256, ["--causal", "--window", "20"]),
]


def save(path, a, dtype):
    if dtype == "f32":
        np.save(path, a.astype(np.float32))
    elif dtype == "f16":
        np.save(path, a.astype(np.float16))
    else:  # bfloat16 bit patterns, rounded to nearest even
        bits = a.astype(np.float32).view(np.uint32)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        np.save(path, (bits >> 16).astype(np.uint16))


def run(cli, args, env):
    p = subprocess.run([cli] + args, env=env, capture_output=True, text=True)
    return p.returncode, p.stderr.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--devices", default="native,cpu")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--levels", default="default")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--shapes", help="indices into SHAPES, comma-separated (default all)")
    a = ap.parse_args()
    shapes = [SHAPES[int(i)] for i in a.shapes.split(",")] if a.shapes else SHAPES
    passed = failed = 0
    tmp = tempfile.mkdtemp(prefix="bitcmp")
    rng = np.random.default_rng(7)
    runs = []
    for dev in a.devices.split(","):
        if dev == "native":
            runs += [(dev, None, lvl) for lvl in a.levels.split(",")]
        else:
            runs += [(dev, var, None) for var in a.variants.split(",")]
    for si, (b, q, kv, h, kvh, d, mask) in enumerate(shapes):
        for dtype in a.dtypes.split(","):
            base = os.path.join(tmp, f"s{si}{dtype}")
            gain = 2.0  # scores of a few units: softmax far from uniform
            for name, shape in (("q", (b, q, h, d)), ("k", (b, kv, kvh, d)),
                                ("v", (b, kv, kvh, d)), ("do", (b, q, h, d))):
                save(f"{base}_{name}.npy", rng.standard_normal(shape) * gain, dtype)
            for dev, var, lvl in runs:
                env = dict(os.environ)
                if lvl and lvl != "default":
                    env["CLATTN_NATIVE_LEVEL"] = lvl
                sel = ["--device", dev] + (["--variant", var] if var and var != "default" else [])
                tag = f"{dev}/{var or lvl} {dtype} shape {si}"
                common = ["--q", f"{base}_q.npy", "--k", f"{base}_k.npy", "--v", f"{base}_v.npy",
                          "--dtype", dtype] + mask + sel
                outs = {}
                ok = True
                for which, cli in (("old", a.old), ("new", a.new)):
                    o, l = f"{base}_{which}_o.npy", f"{base}_{which}_lse.npy"
                    rc, err = run(cli, ["forward"] + common + ["--out", o, "--lse-out", l], env)
                    if rc:
                        print(f"FAIL {tag}: {which} forward exit {rc}: {err}")
                        ok = False
                        break
                    outs[which] = [o, l]
                if ok:
                    o, l = outs["old"]
                    for which, cli in (("old", a.old), ("new", a.new)):
                        g = [f"{base}_{which}_{x}.npy" for x in ("dq", "dk", "dv")]
                        rc, err = run(cli, ["backward"] + common +
                                      ["--o", o, "--lse", l, "--d-out", f"{base}_do.npy",
                                       "--dq", g[0], "--dk", g[1], "--dv", g[2]], env)
                        if rc:
                            print(f"FAIL {tag}: {which} backward exit {rc}: {err}")
                            ok = False
                            break
                        outs[which] += g
                if ok:
                    names = ["O", "LSE", "dQ", "dK", "dV"]
                    differ = [n for n, x, y in zip(names, outs["old"], outs["new"])
                              if open(x, "rb").read() != open(y, "rb").read()]
                    if differ:
                        print(f"DIFFER {tag}: {', '.join(differ)}")
                        ok = False
                passed += ok
                failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
