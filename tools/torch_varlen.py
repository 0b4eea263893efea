#!/usr/bin/env python3
"""PyTorch's attention over a packed batch of variable-length sequences,
timed on the GPU: its varlen path (torch.nn.attention.varlen.varlen_attn)
where this torch has it, else nested (jagged) tensors through
scaled_dot_product_attention, else one SDPA call per sequence. Prints one
JSON line per op with the path taken, the median time and GFLOP/s over the
visible pairs, for `clattn bench --random-seqlens` beside it.

    tools/torch_varlen.py --random-seqlens 128,4096,1 --batch 32 --heads 32 \\
        --kv-heads 8 --head-dim 128 --dtype bf16
"""
import argparse
import json
import statistics

import torch


def lengths(spec, count):
    """The same lengths as clattn bench --random-seqlens MIN,MAX[,SEED]."""
    parts = [int(x) for x in spec.split(",")]
    lo, hi, seed = parts[0], parts[1], parts[2] if len(parts) > 2 else 1
    state, out = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(lo + (state >> 33) % (hi - lo + 1))
    return out


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random-seqlens", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    lens = lengths(a.random_seqlens, a.batch)
    total, dev = sum(lens), "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.rand(total, a.heads, a.head_dim, device=dev, dtype=dt, generator=g) * 2 - 1
    k = torch.rand(total, a.kv_heads, a.head_dim, device=dev, dtype=dt, generator=g) * 2 - 1
    v = torch.rand(total, a.kv_heads, a.head_dim, device=dev, dtype=dt, generator=g) * 2 - 1
    do = torch.rand(total, a.heads, a.head_dim, device=dev, dtype=dt, generator=g) * 2 - 1
    pairs = sum(n * (n + 1) // 2 for n in lens) * a.heads
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
    rep = a.heads // a.kv_heads
    F = torch.nn.functional

    def varlen():
        from torch.nn.attention.varlen import varlen_attn
        m = max(lens)
        kr = k.repeat_interleave(rep, 1).contiguous()
        vr = v.repeat_interleave(rep, 1).contiguous()
        # causal: is_causal in some releases, window_size=(-1, 0) in others
        for causal in ({"window_size": (-1, 0)}, {"is_causal": True}):
            try:
                varlen_attn(q[:1], kr[:1], vr[:1], cu[:2].clamp(max=1), cu[:2].clamp(max=1), 1,
                            1, **causal)
                break
            except TypeError:
                continue
        return (lambda qq, kk, vv: varlen_attn(qq, kk, vv, cu, cu, m, m, **causal)), kr, vr

    def per_sequence():
        def run(qq, kk, vv):
            outs, at = [], 0
            for n in lens:
                s = slice(at, at + n)
                outs.append(F.scaled_dot_product_attention(
                    qq[s].transpose(0, 1), kk[s].transpose(0, 1), vv[s].transpose(0, 1),
                    is_causal=True, enable_gqa=True).transpose(0, 1))
                at += n
            return torch.cat(outs)
        return run, k, v

    for name, make in (("varlen_attn", varlen), ("per-sequence sdpa", per_sequence)):
        try:
            fn, kk, vv = make()
            leaves = [x.detach().requires_grad_(True) for x in (q, kk, vv)]
            fn(*leaves).backward(do)
            torch.cuda.synchronize()
        except Exception as e:  # this torch lacks the path, or it refuses the shape
            print(json.dumps({"path": name, "error": str(e)[:200]}))
            continue
        with torch.no_grad():
            fwd = timed(lambda: fn(q, kk, vv), a.reps)

        def both():
            leaves = [x.detach().requires_grad_(True) for x in (q, kk, vv)]
            fn(*leaves).backward(do)
        bwd = max(timed(both, a.reps) - fwd, 1e-9)
        for op, sec, flop in (("forward", fwd, 4), ("backward", bwd, 10)):
            print(json.dumps({"path": name, "op": op, "dtype": a.dtype, "sequences": a.batch,
                              "tokens": total, "seconds": sec,
                              "gflops": flop * pairs * a.head_dim / sec * 1e-9}))
        break


if __name__ == "__main__":
    main()
