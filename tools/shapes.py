#!/usr/bin/env python3
"""The benchmark's shapes, one list for every tool: tools/torch_bench.py
imports it, tools/device_run.sh reads it through this command line.

    python3 tools/shapes.py gpu|cpu [--tag TAG] [--dims 64,128]

prints one line per shape, `HEAD_DIM:clattn bench arguments`, e.g.
`64:--q-seq 4096 --heads 8 --causal`. Tags pick a subset: `ab` the GPU
shapes timed old against new (device_run.sh's gab), `class` one shape per
head_dim class (tune, tiled and mods stages), `small` the problems of S <= 1024."""
import argparse
import sys

# (batch, q_seq, heads, kv_heads, head_dim, causal, tags)
GPU = [
    (1, 4096, 8, 8, 64, True, "ab class"),
    (1, 4096, 32, 8, 64, False, "ab"),
    (1, 16384, 8, 8, 64, True, "ab"),
    (1, 2048, 16, 16, 80, True, ""),
    (1, 2048, 16, 16, 96, True, "ab class"),
    (1, 4096, 32, 8, 128, True, "ab class"),
    (1, 4096, 32, 8, 128, False, "ab"),
    (4, 2048, 16, 16, 128, True, ""),
    (1, 2048, 8, 8, 256, True, "ab class"),
    # the rest of the bench set: Llama, d80 GQA, d112, ViT, and small problems
    (1, 8192, 32, 8, 128, True, ""),
    (1, 2048, 16, 4, 80, False, ""),
    (1, 2048, 16, 16, 112, True, ""),
    (256, 197, 12, 12, 64, False, ""),
    (1, 1024, 8, 2, 64, True, "small"),
    (1, 1024, 16, 4, 128, True, "small"),
]
# d64 and d128 GQA, batched d64, then head_dims 32, 96 and 256
CPU = [
    (1, 1024, 8, 2, 64, True, "ab"),
    (1, 1024, 16, 4, 128, True, "ab"),
    (4, 512, 8, 8, 64, False, "ab"),
    (2, 1024, 8, 8, 32, True, "ab"),
    (2, 512, 12, 4, 96, False, "ab"),
    (1, 512, 8, 8, 256, True, "ab"),
]


def plain(shapes):
    """(batch, q_seq, heads, kv_heads, head_dim, causal) tuples, tags dropped."""
    return [s[:6] for s in shapes]


def bench_args(shape):
    """`clattn bench` arguments of a shape, its head_dim left out."""
    batch, q_seq, heads, kv_heads, _, causal = shape[:6]
    args = ([f"--batch {batch}"] if batch != 1 else []) + [f"--q-seq {q_seq}", f"--heads {heads}"]
    args += [f"--kv-heads {kv_heads}"] if kv_heads != heads else []
    return " ".join(args + (["--causal"] if causal else []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("set", choices=["gpu", "cpu"])
    ap.add_argument("--tag")
    ap.add_argument("--dims", help="only these head_dims, comma-separated")
    a = ap.parse_args()
    dims = {int(d) for d in a.dims.split(",")} if a.dims else None
    for s in GPU if a.set == "gpu" else CPU:
        if (a.tag and a.tag not in s[6].split()) or (dims and s[4] not in dims):
            continue
        print(f"{s[4]}:{bench_args(s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
