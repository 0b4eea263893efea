"""Times clattn beside PyTorch on the CPU, in one run, alternating the two
so that both see the same machine:

    python -m clattn.bench [--threads N] [--seq 1024] [--reps 7] [--json FILE]

- the C call alone (ctypes, buffers made beforehand) against the same call
  through clattn.flash_attn_func and clattn.torch's SDPA, forward and
  backward: what the Python layer costs;
- attention forward and forward + backward against PyTorch's CPU SDPA;
- one training step of a small language model with either attention.

Each figure is the median of --reps timed runs after a warm-up.
"""
import argparse
import ctypes
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import clattn
import clattn.torch as ct
from clattn import _call, _lib


def median_ms(fns, reps):
    """Runs the callables in turn, reps rounds, and returns each one's median
    milliseconds."""
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(reps):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            f()
            times[i].append((time.perf_counter() - t) * 1e3)
    return [statistics.median(t) for t in times]


def attention_rows(args, ctx, B, S, H, Hk, D, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, H, D, generator=g)
    k, v = torch.randn(B, S, Hk, D, generator=g), torch.randn(B, S, Hk, D, generator=g)
    d_out = torch.randn(B, S, H, D, generator=g)
    pairs = B * H * (S * (S + 1) // 2 if causal else S * S)
    fwd_flop, bwd_flop = 4 * pairs * D, 10 * pairs * D

    # The C call with everything made beforehand: ctypes' own cost only.
    prob = _call.Problem(batch=B, q_seq=S, kv_seq=S, num_heads=H, num_kv_heads=Hk,
                         head_dim=D, dtype=_lib.DTYPE_F32, causal=1 if causal else 0)
    shape, _ = prob.shape()
    o, lse = torch.empty_like(q), torch.empty(B, S, H, 2)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ptr = [t.data_ptr() for t in (q, k, v, o, lse, d_out, dq, dk, dv)]
    handle, sp = ctx.handle, ctypes.byref(shape)

    def c_forward():
        _lib.check(_lib.lib.clattn_forward(handle, sp, *ptr[:5]), "forward")

    def c_backward():
        _lib.check(_lib.lib.clattn_backward(handle, sp, *ptr), "backward")

    c_forward()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    # PyTorch's layout for SDPA: (B, H, S, D); GQA as enable_gqa.
    tq, tk, tv = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    t_do = d_out.transpose(1, 2).contiguous()
    gqa = H != Hk

    def fa_forward():
        with torch.no_grad():
            clattn.flash_attn_func(q, k, v, causal=causal)

    def fa_train():
        out = clattn.flash_attn_func(qg, kg, vg, causal=causal)
        torch.autograd.grad(out, (qg, kg, vg), d_out)

    def fa_backward_op():  # the backward as autograd runs it, without the graph
        ct._backward_impl(d_out, q, k, v, o, lse, None, None, None, None, None, None, None,
                          None, False, 1 if causal else 0, True, 0, -1, 0.0, 0.0, 0.0, 0, 0, "", "")

    def ours_sdpa_train():
        out = ct.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)
        torch.autograd.grad(out, (tq, tk, tv), t_do)

    def torch_forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)

    def torch_train():
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)
        torch.autograd.grad(out, (tq, tk, tv), t_do)

    # The Python layer against the C call alone, in a loop of their own:
    # right after a PyTorch call its OpenMP threads still spin a while, which
    # would weigh on whichever call came next.
    cf, ff, cb, fb = median_ms([c_forward, fa_forward, c_backward, fa_backward_op],
                               3 * args.reps)
    tf, ft, st, tt = median_ms([torch_forward, fa_train, ours_sdpa_train, torch_train],
                               args.reps)
    name = f"d{D} b{B} S{S} {H}" + (f" on {Hk}" if gqa else "") + " heads" + \
        (" causal" if causal else "")
    return {
        "shape": name, "B": B, "S": S, "H": H, "Hk": Hk, "D": D, "causal": causal,
        "c_forward_ms": cf, "py_forward_ms": ff, "python_forward_overhead": ff / cf - 1,
        "c_backward_ms": cb, "py_backward_ms": fb, "python_backward_overhead": fb / cb - 1,
        "clattn_forward_gflops": fwd_flop / ff / 1e6, "torch_forward_gflops": fwd_flop / tf / 1e6,
        "clattn_train_ms": ft, "clattn_sdpa_train_ms": st, "torch_train_ms": tt,
        "forward_ratio": tf / ff, "train_ratio": tt / ft, "sdpa_train_ratio": tt / st,
        "train_gflops_clattn": (fwd_flop + bwd_flop) / ft / 1e6,
        "train_gflops_torch": (fwd_flop + bwd_flop) / tt / 1e6,
    }


def model_row(args):
    """One training step of a small causal language model (the tests' one,
    made wider and deeper: width 256, 4 layers) at sequence args.model_seq,
    batch 4."""
    from torch import nn

    width, heads, layers, seq, batch, vocab = 256, 4, 4, args.model_seq, 4, 96

    class Block(nn.Module):
        def __init__(self, sdpa):
            super().__init__()
            self.sdpa = sdpa
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, heads, -1).permute(2, 0, 3, 1, 4)
            a = self.sdpa(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(B, S, width))
            return x + self.mlp(self.ln2(x))

    def make(sdpa):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Embedding(vocab, width), *[Block(sdpa) for _ in range(layers)],
                          nn.LayerNorm(width), nn.Linear(width, vocab))
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    ours, theirs = make(ct.scaled_dot_product_attention), make(F.scaled_dot_product_attention)
    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))

    def step(pair):
        m, opt = pair
        loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    a, b = median_ms([lambda: step(ours), lambda: step(theirs)], args.reps)
    return {"model": f"LM width {width}, {layers} layers, {heads} heads, batch {batch}, "
                     f"seq {seq}", "clattn_step_ms": a, "torch_step_ms": b, "ratio": b / a}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m clattn.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0, help="threads (0: every CPU)")
    ap.add_argument("--device", default="native", help="clattn device selector")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--model-seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one small shape, for a smoke test")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import os
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    ctx = ct.set_device(args.device, threads=threads)
    S = 64 if args.quick else args.seq
    shapes = [(1, S, 8, 2, 64, True)] if args.quick else [
        (1, S, 8, 2, 64, True), (1, S, 16, 16, 64, True), (4, S, 8, 8, 128, True),
        (16, 128, 12, 12, 64, False)]
    if args.quick:
        args.model_seq, args.reps = 32, 2
    print(f"clattn {clattn.__version__} on {ctx.device}; torch {torch.__version__}, "
          f"{threads} threads; {platform.processor() or platform.machine()}")
    rows = []
    print(f"{'shape':34} {'py/C fwd':>8} {'py/C bwd':>8} {'fwd GF/s':>17} {'fwd+bwd ms':>19} "
          f"{'ratio':>5}")
    for B, S_, H, Hk, D, causal in shapes:
        r = attention_rows(args, ctx, B, S_, H, Hk, D, causal)
        rows.append(r)
        print(f"{r['shape']:34} {r['python_forward_overhead']:+8.1%} "
              f"{r['python_backward_overhead']:+8.1%} "
              f"{r['clattn_forward_gflops']:8.1f}/{r['torch_forward_gflops']:<8.1f} "
              f"{r['clattn_train_ms']:9.2f}/{r['torch_train_ms']:<9.2f} "
              f"{r['train_ratio']:5.2f}")
    m = model_row(args)
    print(f"training step, {m['model']}: clattn {m['clattn_step_ms']:.1f} ms, torch "
          f"{m['torch_step_ms']:.1f} ms ({m['ratio']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"clattn": clattn.__version__, "torch": torch.__version__,
                       "device": ctx.device, "threads": threads,
                       "cpu": platform.processor() or platform.machine(),
                       "attention": rows, "model": m}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
