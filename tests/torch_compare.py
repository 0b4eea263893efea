#!/usr/bin/env python3
"""Compares `clattn forward` and `clattn backward` with PyTorch autograd in
float64 on random cases (GQA, causal, windows, odd head_dim, batch), on
every backend this machine has. Needs numpy and torch; skips (exit 77)
without them.

    python3 tests/torch_compare.py BUILD/clattn [--cases N] [--seed S] [--large]

--large adds the benchmark's shapes (q_seq 4096, head_dim 64: 8 heads causal,
and 32 heads on 8 KV heads; q_seq 2048 at head_dims 80, 96, 128 and 256),
where long sums show accumulation error.

Prints the worst error of each tensor per backend, as max |clattn - torch|
divided by max |torch|, and exits 1 if any exceeds the tolerance (1e-4,
or --tolerance)."""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

TOLERANCE = 1e-4


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k, v, d_out, causal, window, scale):
    """O, the log-sum-exp per row, and dQ dK dV by autograd, in float64."""
    q, k, v, d_out = (torch.tensor(a, dtype=torch.float64, device=DEVICE)
                      for a in (q, k, v, d_out))
    for t in (q, k, v):
        t.requires_grad_(True)
    batch, q_seq, heads, _ = q.shape
    kv_seq, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    s = qh @ kh.transpose(-1, -2) * scale
    pos = torch.arange(q_seq, device=DEVICE).view(-1, 1)
    t = torch.arange(kv_seq, device=DEVICE).view(1, -1)
    visible = torch.ones(q_seq, kv_seq, dtype=torch.bool, device=DEVICE)
    if causal:
        visible &= t <= pos
    if window:
        visible &= pos < t + window
    has_key = visible.any(dim=1).view(1, 1, -1, 1)
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~has_key, 0.0)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse) * has_key
    o = (p @ vh).permute(0, 2, 1, 3)
    o.backward(d_out)
    cpu = lambda x: x.detach().cpu().numpy()
    return (cpu(o), cpu(lse.squeeze(-1).permute(0, 2, 1)), cpu(has_key.view(-1)),
            cpu(q.grad), cpu(k.grad), cpu(v.grad))


def save(folder, name, array):
    path = os.path.join(folder, name)
    np.save(path, np.ascontiguousarray(array, dtype="<f4"))
    return path


def rel_error(got, want):
    scale = np.abs(want).max()
    return float(np.abs(got.astype(np.float64) - want).max() / (scale if scale > 0 else 1.0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--backends", help="comma-separated: native, cpu, gpu (default: all here)")
    args = ap.parse_args()
    large = [(1, 4096, 8, 8, 64, True), (1, 4096, 32, 8, 64, False),
             (1, 2048, 8, 8, 80, True), (1, 2048, 8, 8, 96, False),
             (1, 2048, 8, 2, 128, True), (1, 2048, 4, 4, 256, True)] if args.large else []
    rng = np.random.default_rng(args.seed)
    devices = subprocess.run([args.cli, "devices"], capture_output=True, text=True).stdout
    # Device lines read "[*] P:D KIND NAME"; auto's own lines mention kinds too.
    kinds = {line.lstrip("* ").split()[1] for line in devices.splitlines()
             if line.lstrip("* ")[:1].isdigit()}
    backends = ["native"] + [b for b, kind in (("cpu", "opencl-cpu"), ("gpu", "opencl-gpu"))
                             if kind in kinds]
    if args.backends:
        backends = [b for b in backends if b in args.backends.split(",")]
    worst = {b: {} for b in backends}
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for case in range(args.cases + len(large)):
            kv_heads = int(rng.choice([1, 2, 3]))
            heads = kv_heads * int(rng.choice([1, 2, 4]))
            head_dim = int(rng.choice([1, 5, 13, 32, 64, 80, 127]))
            causal = bool(rng.integers(2))
            q_seq = int(rng.integers(1, 90))
            kv_seq = q_seq if causal else int(rng.integers(1, 90))
            window = int(rng.choice([0, 0, 1, 4, 17]))
            batch = int(rng.integers(1, 3))
            scale = float(rng.choice([0.0, 0.37]))
            gain = float(rng.choice([1.0, 4.0]))
            if case >= args.cases:
                batch, q_seq, heads, kv_heads, head_dim, causal = large[case - args.cases]
                kv_seq, window, scale, gain = q_seq, 0, 0.0, 1.0
            q = rng.uniform(-gain, gain, (batch, q_seq, heads, head_dim))
            k = rng.uniform(-1, 1, (batch, kv_seq, kv_heads, head_dim))
            v = rng.uniform(-1, 1, (batch, kv_seq, kv_heads, head_dim))
            d_out = rng.uniform(-1, 1, (batch, q_seq, heads, head_dim))
            q, k, v, d_out = (a.astype(np.float32) for a in (q, k, v, d_out))
            eff_scale = scale if scale > 0 else 1.0 / np.sqrt(head_dim)
            o_ref, lse_ref, has_key, dq_ref, dk_ref, dv_ref = reference(
                q, k, v, d_out, causal, window, eff_scale)
            files = {n: save(folder, n + ".npy", a)
                     for n, a in (("q", q), ("k", k), ("v", v), ("do", d_out))}
            flags = (["--causal"] if causal else []) + (["--window", str(window)] if window else [])
            flags += ["--scale", repr(scale)] if scale > 0 else []
            desc = (f"case {case}: batch {batch} q {q_seq} kv {kv_seq} heads {heads}/{kv_heads} "
                    f"d {head_dim} causal {int(causal)} window {window} scale {scale} gain {gain}")
            for b in backends:
                out = {n: os.path.join(folder, f"{b}-{n}.npy")
                       for n in ("o", "lse", "dq", "dk", "dv")}
                run = subprocess.run(
                    [args.cli, "forward", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                     "--out", out["o"], "--lse-out", out["lse"], "--device", b] + flags,
                    capture_output=True, text=True)
                if run.returncode:
                    print(f"{desc}: {b} forward failed: {run.stderr}")
                    failed = True
                    continue
                run = subprocess.run(
                    [args.cli, "backward", "--q", files["q"], "--k", files["k"], "--v",
                     files["v"], "--o", out["o"], "--lse", out["lse"], "--d-out", files["do"],
                     "--dq", out["dq"], "--dk", out["dk"], "--dv", out["dv"], "--device", b]
                    + flags, capture_output=True, text=True)
                if run.returncode:
                    print(f"{desc}: {b} backward failed: {run.stderr}")
                    failed = True
                    continue
                lse = np.load(out["lse"]).astype(np.float64)
                rows = lse.reshape(-1, 2)
                has = np.tile(has_key, batch * heads).reshape(batch, heads, q_seq)
                has = has.transpose(0, 2, 1).reshape(-1)
                lse_sum = np.where(has, rows[:, 0] + rows[:, 1], 0.0)
                lse_want = np.where(has, lse_ref.reshape(-1), 0.0)
                errors = {
                    "O": rel_error(np.load(out["o"]), o_ref),
                    "LSE": rel_error(lse_sum, lse_want),
                    "dQ": rel_error(np.load(out["dq"]), dq_ref),
                    "dK": rel_error(np.load(out["dk"]), dk_ref),
                    "dV": rel_error(np.load(out["dv"]), dv_ref),
                }
                for name, err in errors.items():
                    if err > worst[b].get(name, (0.0, ""))[0]:
                        worst[b][name] = (err, desc)
                    if not err <= args.tolerance:
                        print(f"{desc}: {b} {name} error {err:.3g}")
                        failed = True
    print(f"clattn against torch {torch.__version__} float64 autograd, {args.cases} cases "
          f"{f'and {len(large)} large shapes ' if large else ''}"
          f"(max |err| / max |ref|, tolerance {args.tolerance:g}):")
    print("backend     " + "".join(f"{n:>11}" for n in ("O", "LSE", "dQ", "dK", "dV")))
    for b in backends:
        print(f"{b:<12}" + "".join(f"{worst[b].get(n, (float('nan'),))[0]:>11.2e}"
                                   for n in ("O", "LSE", "dQ", "dK", "dV")))
    print("FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
