#!/usr/bin/env python3
"""Names the CUDA kernels PyTorch's scaled_dot_product_attention launches
for a shape, dtype and op, with each kernel's share of the GPU time
(torch.profiler): which of its backends a benchmark line compares against,
and on which units it runs. Needs torch and a CUDA device; skips (exit 77)
without them.

    python3 tools/torch_kernels.py [--dtype f32|f16|bf16] [--head-dims 64,128]
                                   [--torch-backend flash|cudnn|efficient|math]

The shapes are tools/torch_bench.py's GPU shapes."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench as tb  # noqa: E402


def kernels_of(shape, op, dtype, backend):
    """[(kernel name, microseconds)] of one call, longest first."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
    batch, s, h, kh, d, causal = shape
    mk = lambda heads: torch.randn(batch, heads, s, d, device="cuda",
                                   dtype=tb.TORCH_DTYPES[dtype])
    q, k, v = mk(h), mk(kh), mk(kh)
    for t in (q, k, v):
        t.requires_grad_(op == "backward")
    d_out = mk(h)
    kw = dict(is_causal=causal, enable_gqa=kh != h)

    def call():
        if op == "forward":
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            out = F.scaled_dot_product_attention(q, k, v, **kw)
            torch.autograd.grad(out, (q, k, v), d_out)

    with tb.sdpa_backend(backend):
        call()  # warm-up: the profile holds one steady call
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name] = times.get(e.name, 0.0) + e.device_time
    return sorted(times.items(), key=lambda kv: -kv[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--torch-backend", choices=["flash", "cudnn", "efficient", "math"])
    args = p.parse_args()
    if tb.torch is None or not tb.torch.cuda.is_available():
        print("torch_kernels: skipped: needs torch with a CUDA device")
        return 77
    dims = {int(x) for x in args.head_dims.split(",")}
    for shape in tb.GPU_SHAPES:
        if shape[4] not in dims:
            continue
        batch, s, h, kh, d, causal = shape
        for op in ("forward", "backward"):
            print(f"b{batch} s{s} h{h}/{kh} d{d}{' causal' if causal else ''} {op} {args.dtype}:")
            try:
                rows = kernels_of(shape, op, args.dtype, args.torch_backend)
            except RuntimeError as e:
                print(f"  cannot run: {str(e).splitlines()[0]}")
                continue
            total = sum(t for _, t in rows) or 1.0
            for name, t in rows:
                print(f"  {t:10.1f} us {100 * t / total:5.1f}%  {name[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
