#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention with the score modifiers clattn
has, timed on the GPU beside `clattn bench`: plain causal attention, with
dropout_p, with ALiBi as an additive float attn_mask, and with a bias
tensor [1][1][S][S] (uniform in [-0.5, 0.5), clattn bench's --bias over the
heads) as one (causal folded into both: SDPA takes is_causal or a mask,
not both); --modifiers picks them. Softcap has no SDPA
argument (FlexAttention's score_mod has it; not timed here). One JSON line
per (modifier, op): the median time and GFLOP/s over the visible pairs, as
clattn bench counts them (4 FLOP a pair a head_dim element forward, 10
backward).

    tools/torch_mods.py --q-seq 4096 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16
    tools/torch_mods.py --q-seq 8192 --heads 8 --head-dim 64 --modifiers none,bias
"""
import argparse
import json

import torch

from torch_varlen import timed  # the same CUDA-event timing, median of reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--q-seq", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--modifiers", default="none,dropout,alibi",
                    help="comma-separated, of none, dropout, alibi and bias")
    a = ap.parse_args()
    kinds = a.modifiers.split(",")
    unknown = set(kinds) - {"none", "dropout", "alibi", "bias"}
    if unknown:
        ap.error(f"--modifiers: unknown {', '.join(sorted(unknown))}")
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    n, h, kvh, d, dev = a.q_seq, a.heads, a.kv_heads or a.heads, a.head_dim, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.rand(1, h, n, d, device=dev, dtype=dt, generator=g) * 2 - 1
    k = torch.rand(1, kvh, n, d, device=dev, dtype=dt, generator=g) * 2 - 1
    v = torch.rand(1, kvh, n, d, device=dev, dtype=dt, generator=g) * 2 - 1
    do = torch.rand(1, h, n, d, device=dev, dtype=dt, generator=g) * 2 - 1
    pairs = n * (n + 1) // 2 * h
    F = torch.nn.functional
    pos = torch.arange(n, device=dev)
    above = pos[None, :] > pos[:, None]

    def alibi():  # slope 2^(-8 (i + 1) / h) per head, bias -slope |P - T|
        dist = (pos[:, None] - pos[None, :]).abs().to(torch.float32)
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device=dev)
        return dict(attn_mask=(-slopes[:, None, None] * dist)
                    .masked_fill(above, float("-inf")).to(dt)[None])

    def bias():  # one [S][S] table over the heads
        table = torch.rand(n, n, device=dev, generator=g) - 0.5
        return dict(attn_mask=table.masked_fill(above, float("-inf")).to(dt)[None, None])
    cases = {
        "none": lambda: dict(is_causal=True),
        "dropout": lambda: dict(is_causal=True, dropout_p=a.dropout),
        "alibi": alibi,
        "bias": bias,
    }
    for name in kinds:
        kw = cases[name]()
        def fwd_only():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=kvh != h, **kw)

        def both():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            F.scaled_dot_product_attention(*leaves, enable_gqa=kvh != h, **kw).backward(do)
        try:
            with torch.no_grad():
                fwd = timed(fwd_only, a.reps)
            bwd = max(timed(both, a.reps) - fwd, 1e-9)
        except Exception as e:  # this torch refuses the shape or the argument
            print(json.dumps({"modifier": name, "error": str(e)[:200]}))
            continue
        for op, sec, flop in (("forward", fwd, 4), ("backward", bwd, 10)):
            print(json.dumps({"modifier": name, "op": op, "dtype": a.dtype, "q_seq": n,
                              "heads": h, "kv_heads": kvh, "head_dim": d, "seconds": sec,
                              "gflops": flop * pairs * d / sec * 1e-9}))


if __name__ == "__main__":
    main()
