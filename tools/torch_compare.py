#!/usr/bin/env python3
"""Compares `clattn forward` and `clattn backward` with PyTorch autograd in
float64 on random cases (GQA, causal, windows, odd head_dim, batch), on
every backend this machine has. Needs numpy and torch; skips (exit 77)
without them.

    python3 tools/torch_compare.py BUILD/clattn [--cases N] [--seed S] [--large]
                                   [--dtype f16|bf16]

--large adds the benchmark's shapes (q_seq 4096, head_dim 64: 8 heads causal,
and 32 heads on 8 KV heads; q_seq 2048 at head_dims 80, 96, 128 and 256),
where long sums show accumulation error.

Prints the worst error of each tensor per backend, as max |clattn - torch|
divided by max |torch|, and exits 1 if any exceeds the tolerance (1e-4,
or --tolerance).

--dtype f16|bf16 runs clattn on 16-bit tensors (float16 .npy files, or
bfloat16 bit patterns as int16 with `--dtype bf16`); the float64 reference
is computed from the rounded inputs, and each 16-bit output's error must be
at most twice that of PyTorch's own 16-bit scaled_dot_product_attention
(forward and autograd backward) on the same inputs and mask, or 1e-5
where PyTorch's is below that; the LSE pairs, float32, keep the
tolerance.

--modifiers N (default 6; float32 only) adds N cases with softcap, ALiBi and
dropout in random combinations: the cap by explicit float64 tanh, ALiBi as
an additive bias (checked against PyTorch's SDPA with it as attn_mask),
dropout's mask from a third Philox4x32-10 written here in numpy.

--packed N (default 4; float32 only) adds N batches of packed sequences
(--cu-seqlens-q and --cu-seqlens-kv, empty and one-token sequences among
them, two rows past the last prefix sum on each side), each sequence's
reference computed alone; rows no sequence writes must come out zero."""
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


def visibility(q_seq, kv_seq, causal, window):
    """The contract's mask: visible[pos, t]; causal 1 aligns top-left (PyTorch's
    is_causal), 2 bottom-right (FlashAttention's: positions move by kv - q)."""
    pos = torch.arange(q_seq, device=DEVICE).view(-1, 1) + (kv_seq - q_seq if causal == 2 else 0)
    t = torch.arange(kv_seq, device=DEVICE).view(1, -1)
    visible = torch.ones(q_seq, kv_seq, dtype=torch.bool, device=DEVICE)
    if causal:
        visible &= t <= pos
    if window:
        visible &= pos < t + window
    return visible


def reference(q, k, v, d_out, causal, window, scale, softcap=0.0, slopes=None, z=None):
    """O, the log-sum-exp per row, and dQ dK dV by autograd, in float64; with
    the score modifiers by explicit math: the cap by tanh, ALiBi as an
    additive bias (checked against PyTorch's SDPA with that bias as
    attn_mask where there is no cap), dropout's factors z on the
    probabilities."""
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
    visible = visibility(q_seq, kv_seq, causal, window)
    has_key = visible.any(dim=1).view(1, 1, -1, 1)
    plain = not softcap and slopes is None and z is None
    if plain and causal == 1 and not window:  # the mask is PyTorch's own is_causal one
        with torch.no_grad():
            mine = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=visible, scale=scale)
            theirs = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, is_causal=True, scale=scale)
        assert torch.allclose(mine, theirs, equal_nan=True), "is_causal aligns otherwise"
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        pos = torch.arange(q_seq, device=DEVICE).view(-1, 1) + (kv_seq - q_seq if causal == 2 else 0)
        t = torch.arange(kv_seq, device=DEVICE).view(1, -1)
        bias = -torch.tensor(slopes, dtype=torch.float64, device=DEVICE).view(-1, 1, 1) * \
            (pos - t).abs().to(torch.float64)
        s = s + bias
        if not softcap and z is None:  # the bias as PyTorch's own additive mask
            with torch.no_grad():
                theirs = torch.nn.functional.scaled_dot_product_attention(
                    qh, kh, vh, attn_mask=bias.masked_fill(~visible, float("-inf")), scale=scale)
                mine = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) @ vh
            rows = has_key.expand_as(mine)
            assert torch.allclose(mine[rows], theirs[rows]), "ALiBi differs from SDPA's attn_mask"
    s = s.masked_fill(~visible, float("-inf")).masked_fill(~has_key, 0.0)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse) * has_key
    if z is not None:
        p = p * torch.tensor(z, dtype=torch.float64, device=DEVICE)
    o = (p @ vh).permute(0, 2, 1, 3)
    o.backward(d_out)
    cpu = lambda x: x.detach().cpu().numpy()
    return (cpu(o), cpu(lse.squeeze(-1).permute(0, 2, 1)), cpu(has_key.view(-1)),
            cpu(q.grad), cpu(k.grad), cpu(v.grad))


TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
# The 16-bit bound where PyTorch's error is below float32's summation error,
# as when the reference is exactly 0 (one visible key: dQ = dK = 0).
FLOOR_16 = 1e-5


def save(folder, name, array, dtype="f32"):
    """array (float32 values, already representable in dtype) as clattn reads dtype."""
    path = os.path.join(folder, name)
    if dtype == "f16":
        array = np.ascontiguousarray(array, dtype="<f2")
    elif dtype == "bf16":
        array = (np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16).astype("<i2")
    else:
        array = np.ascontiguousarray(array, dtype="<f4")
    np.save(path, array)
    return path


def load(path, dtype="f32"):
    array = np.load(path)
    if dtype == "bf16":
        return (array.astype("<u2").astype("<u4") << 16).view("<f4").astype(np.float64)
    return array.astype(np.float64)


def round_to(array, dtype):
    """float32 values rounded to dtype (nearest even), back in float32."""
    if dtype == "f32":
        return array
    return torch.from_numpy(array).to(TORCH_DTYPES[dtype]).float().numpy()


def torch_16(q, k, v, d_out, causal, window, scale, dtype):
    """PyTorch's own SDPA on dtype tensors: O, dQ, dK, dV in float64 (NaN in
    rows that see no key)."""
    to = lambda a: torch.tensor(a, device=DEVICE).to(TORCH_DTYPES[dtype]).permute(0, 2, 1, 3)
    q, k, v, d_out = (to(a) for a in (q, k, v, d_out))
    for t in (q, k, v):
        t.requires_grad_(True)
    visible = visibility(q.shape[2], k.shape[2], causal, window)
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=visible, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    o.backward(d_out)
    back = lambda x: x.detach().permute(0, 2, 1, 3).double().cpu().numpy()
    return back(o), back(q.grad), back(k.grad), back(v.grad)


def rel_error(got, want):
    scale = np.abs(want).max()
    return float(np.abs(got.astype(np.float64) - want).max() / (scale if scale > 0 else 1.0))


def run_backends(cli, folder, tag, files, flags, backends, variant, has, refs, tolerance,
                 worst, desc):
    """clattn forward and backward of one case on every backend, each output
    against refs (O, LSE, dQ, dK, dV; the LSE pairs summed where has, the
    rows that see a key); True where one fails."""
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref = refs
    failed = False
    for b in backends:
        out = {n: os.path.join(folder, f"{tag}{b}-{n}.npy") for n in ("o", "lse", "dq", "dk", "dv")}
        run_flags = ["--device", b] + flags + (["--variant", variant] if variant and
                                               b != "native" else [])
        for cmd in (["forward", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                     "--out", out["o"], "--lse-out", out["lse"]],
                    ["backward", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                     "--o", out["o"], "--lse", out["lse"], "--d-out", files["do"],
                     "--dq", out["dq"], "--dk", out["dk"], "--dv", out["dv"]]):
            run = subprocess.run([cli] + cmd + run_flags, capture_output=True, text=True)
            if run.returncode:
                print(f"{desc}: {b} {cmd[0]} failed: {run.stderr}")
                failed = True
                break
        else:
            pairs = np.load(out["lse"]).astype(np.float64)
            lse_sum = np.where(has, pairs[..., 0] + pairs[..., 1], 0.0)
            errors = {"O": rel_error(load(out["o"]), o_ref),
                      "LSE": rel_error(lse_sum, np.where(has, lse_ref, 0.0)),
                      "dQ": rel_error(load(out["dq"]), dq_ref),
                      "dK": rel_error(load(out["dk"]), dk_ref),
                      "dV": rel_error(load(out["dv"]), dv_ref)}
            for name, err in errors.items():
                if err > worst[b].get(name, (0.0, ""))[0]:
                    worst[b][name] = (err, desc)
                if not err <= tolerance:
                    print(f"{desc}: {b} {name} error {err:.3g} (bound {tolerance:.3g})")
                    failed = True
    return failed


def packed_case(rng, folder, cli, backends, variant, tolerance, worst):
    """One batch of packed sequences through forward and backward on every
    backend, against each sequence's float64 reference; True where one fails."""
    kv_heads = int(rng.choice([1, 2]))
    heads = kv_heads * int(rng.choice([1, 2, 3]))
    head_dim = int(rng.choice([5, 16, 33, 64]))
    causal = int(rng.integers(3))
    window = int(rng.choice([0, 0, 3]))
    count = int(rng.integers(1, 6))
    lens = lambda: [int(rng.choice([0, 1, int(rng.integers(2, 70))])) for _ in range(count)]
    lq = lens()
    lk = lq if rng.integers(2) else lens()
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    nq, nk = int(cq[-1]) + 2, int(ck[-1]) + 2
    q = rng.uniform(-1, 1, (nq, heads, head_dim)).astype(np.float32)
    k = rng.uniform(-1, 1, (nk, kv_heads, head_dim)).astype(np.float32)
    v = rng.uniform(-1, 1, (nk, kv_heads, head_dim)).astype(np.float32)
    d_out = rng.uniform(-1, 1, (nq, heads, head_dim)).astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    o_ref, dq_ref = np.zeros(q.shape), np.zeros(q.shape)
    dk_ref, dv_ref = np.zeros(k.shape), np.zeros(k.shape)
    lse_ref, has = np.zeros((nq, heads)), np.zeros(nq, dtype=bool)
    for i in range(count):
        a, b, c, d = int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])
        if a == b or c == d:
            continue
        o, lse, has_key, dq, dk, dv = reference(q[None, a:b], k[None, c:d], v[None, c:d],
                                                d_out[None, a:b], causal, window, scale)
        o_ref[a:b], lse_ref[a:b], has[a:b] = o[0], lse[0], has_key
        dq_ref[a:b], dk_ref[c:d], dv_ref[c:d] = dq[0], dk[0], dv[0]
    o_ref[~has], dq_ref[~has] = 0.0, 0.0
    files = {n: save(folder, "p" + n + ".npy", x)
             for n, x in (("q", q), ("k", k), ("v", v), ("do", d_out))}
    for n, x in (("cq", cq), ("ck", ck)):
        files[n] = os.path.join(folder, n + ".npy")
        np.save(files[n], x.astype("<i4"))
    flags = ({1: ["--causal"], 2: ["--causal-bottom-right"]}.get(causal, []) +
             (["--window", str(window)] if window else []) +
             ["--cu-seqlens-q", files["cq"], "--cu-seqlens-kv", files["ck"]])
    desc = (f"packed {lq} / {lk}: heads {heads}/{kv_heads} d {head_dim} causal {causal} "
            f"window {window}")
    return run_backends(cli, folder, "p", files, flags, backends, variant, has[:, None],
                        (o_ref, lse_ref, dq_ref, dk_ref, dv_ref), tolerance, worst, desc)


MASK32 = np.uint64(0xFFFFFFFF)


def philox(c, key):
    """Philox4x32-10 of counters c (four uint64 arrays of 32-bit values) under
    key (two ints), as docs/numerics.md states it; a third implementation,
    beside the library's and the C tests'."""
    c0, c1, c2, c3 = (np.asarray(x, dtype=np.uint64) & MASK32 for x in c)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & MASK32, (k1 + np.uint64(0xBB67AE85)) & MASK32
        p0, p1 = c0 * np.uint64(0xD2511F53), c2 * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & MASK32, \
            (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & MASK32
    return c0, c1, c2, c3


def dropout_factor(batch, heads, q_seq, kv_seq, causal, p, seed, offset):
    """z[b, h, pos, t]: 1 / (1 - p) where the draw keeps the pair, else 0."""
    w = philox((offset & 0xFFFFFFFF, offset >> 32, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    key = (int(w[0]), int(w[1]))
    b, h, pos, t = np.meshgrid(np.arange(batch), np.arange(heads), np.arange(q_seq),
                               np.arange(kv_seq), indexing="ij")
    big_p = (pos + (kv_seq - q_seq if causal == 2 else 0)) % 2**32
    words = philox((t // 16, big_p, h, b), key)
    shift = (8 * (t % 4)).astype(np.uint64)  # key t's byte: low byte first
    draw = (np.choose(t % 16 // 4, words) >> shift) & np.uint64(0xFF)
    keep = draw.astype(np.float64) / 2.0**8 >= p
    return np.where(keep, 1.0 / (1.0 - np.float64(np.float32(p))), 0.0)


def modifier_case(rng, folder, cli, backends, variant, tolerance, worst):
    """One case with softcap, ALiBi and/or dropout through forward and
    backward on every backend, against reference(); True where one fails."""
    kv_heads = int(rng.choice([1, 2]))
    heads = kv_heads * int(rng.choice([1, 2, 3]))
    head_dim = int(rng.choice([8, 16, 40, 64]))
    causal = int(rng.integers(3))
    window = int(rng.choice([0, 0, 5]))
    batch = int(rng.integers(1, 3))
    q_seq = int(rng.integers(1, 70))
    kv_seq = q_seq if rng.integers(2) else int(rng.integers(1, 70))
    which = int(rng.integers(1, 8))  # bits: softcap, ALiBi, dropout
    softcap = float(rng.choice([2.0, 10.0])) if which & 1 else 0.0
    slopes = (2.0 ** -rng.uniform(1, 8, heads)).astype(np.float32) if which & 2 else None
    p = float(np.float32(rng.choice([0.1, 0.5]))) if which & 4 else 0.0
    seed, offset = int(rng.integers(2**63)), int(rng.integers(2**40))
    q = rng.uniform(-4, 4, (batch, q_seq, heads, head_dim)).astype(np.float32)
    k, v = (rng.uniform(-1, 1, (batch, kv_seq, kv_heads, head_dim)).astype(np.float32)
            for _ in range(2))
    d_out = rng.uniform(-1, 1, (batch, q_seq, heads, head_dim)).astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    z = dropout_factor(batch, heads, q_seq, kv_seq, causal, p, seed, offset) if p else None
    o_ref, lse_ref, has_key, dq_ref, dk_ref, dv_ref = reference(
        q, k, v, d_out, causal, window, scale, softcap, slopes, z)
    files = {n: save(folder, "m" + n + ".npy", x)
             for n, x in (("q", q), ("k", k), ("v", v), ("do", d_out))}
    flags = ({1: ["--causal"], 2: ["--causal-bottom-right"]}.get(causal, []) +
             (["--window", str(window)] if window else []))
    if softcap:
        flags += ["--softcap", repr(softcap)]
    if slopes is not None:
        files["slopes"] = os.path.join(folder, "slopes.npy")
        np.save(files["slopes"], slopes.astype("<f4"))
        flags += ["--alibi", files["slopes"]]
    if p:
        flags += ["--dropout", repr(p), "--seed", str(seed), "--dropout-offset", str(offset)]
    desc = (f"modifiers softcap {softcap} alibi {slopes is not None} dropout {p}: batch {batch} "
            f"q {q_seq} kv {kv_seq} heads {heads}/{kv_heads} d {head_dim} causal {causal} "
            f"window {window}")
    rows_with_key = np.tile(has_key.reshape(1, -1, 1), (batch, 1, heads))
    return run_backends(cli, folder, "m", files, flags, backends, variant, rows_with_key,
                        (o_ref, lse_ref, dq_ref, dk_ref, dv_ref), tolerance, worst, desc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--backends", help="comma-separated: native, cpu, gpu (default: all here)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--variant", help="the OpenCL backends' variant (default: each's own)")
    ap.add_argument("--packed", type=int, default=4)
    ap.add_argument("--modifiers", type=int, default=6)
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
    if args.dtype != "f32":
        backends.append("torch")  # PyTorch's own 16-bit errors, for the ratio
        worst["torch"] = {}
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for case in range(args.cases + len(large)):
            kv_heads = int(rng.choice([1, 2, 3]))
            heads = kv_heads * int(rng.choice([1, 2, 4]))
            head_dim = int(rng.choice([1, 5, 13, 32, 64, 80, 127]))
            causal = int(rng.integers(3))  # none, top-left, bottom-right
            q_seq = int(rng.integers(1, 90))
            kv_seq = q_seq if rng.integers(2) else int(rng.integers(1, 90))
            window = int(rng.choice([0, 0, 1, 4, 17]))
            batch = int(rng.integers(1, 3))
            scale = float(rng.choice([0.0, 0.37]))
            gain = float(rng.choice([1.0, 4.0]))
            if case >= args.cases:
                batch, q_seq, heads, kv_heads, head_dim, causal = large[case - args.cases]
                causal = int(causal)
                kv_seq, window, scale, gain = q_seq, 0, 0.0, 1.0
            q = rng.uniform(-gain, gain, (batch, q_seq, heads, head_dim))
            k = rng.uniform(-1, 1, (batch, kv_seq, kv_heads, head_dim))
            v = rng.uniform(-1, 1, (batch, kv_seq, kv_heads, head_dim))
            d_out = rng.uniform(-1, 1, (batch, q_seq, heads, head_dim))
            q, k, v, d_out = (round_to(a.astype(np.float32), args.dtype)
                              for a in (q, k, v, d_out))
            eff_scale = scale if scale > 0 else 1.0 / np.sqrt(head_dim)
            o_ref, lse_ref, has_key, dq_ref, dk_ref, dv_ref = reference(
                q, k, v, d_out, causal, window, eff_scale)
            files = {n: save(folder, n + ".npy", a, args.dtype)
                     for n, a in (("q", q), ("k", k), ("v", v), ("do", d_out))}
            flags = ({1: ["--causal"], 2: ["--causal-bottom-right"]}.get(causal, []) +
                     (["--window", str(window)] if window else []))
            flags += ["--scale", repr(scale)] if scale > 0 else []
            flags += ["--dtype", args.dtype] if args.dtype != "f32" else []
            # Rows that see no key: PyTorch gives NaN there, clattn zeros.
            rows_with_key = np.tile(has_key.reshape(1, -1, 1, 1), (batch, 1, heads, 1))
            pick = lambda a: np.where(rows_with_key, a, 0.0)
            if args.dtype != "f32":
                t_o, t_dq, t_dk, t_dv = torch_16(q, k, v, d_out, causal, window, eff_scale,
                                                 args.dtype)
                # dK, dV of keys that only empty rows see get NaN there too.
                t_errors = {"O": rel_error(pick(t_o), o_ref), "dQ": rel_error(pick(t_dq), dq_ref),
                            "dK": rel_error(np.nan_to_num(t_dk), dk_ref),
                            "dV": rel_error(np.nan_to_num(t_dv), dv_ref)}
            desc = (f"case {case}: batch {batch} q {q_seq} kv {kv_seq} heads {heads}/{kv_heads} "
                    f"d {head_dim} causal {int(causal)} window {window} scale {scale} gain {gain}")
            for b in backends:
                if b == "torch":
                    for name, err in t_errors.items():
                        if err > worst[b].get(name, (0.0, ""))[0]:
                            worst[b][name] = (err, desc)
                    continue
                out = {n: os.path.join(folder, f"{b}-{n}.npy")
                       for n in ("o", "lse", "dq", "dk", "dv")}
                run_flags = ["--device", b] + flags + (
                    ["--variant", args.variant] if args.variant and b != "native" else [])
                run = subprocess.run(
                    [args.cli, "forward", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                     "--out", out["o"], "--lse-out", out["lse"]] + run_flags,
                    capture_output=True, text=True)
                if run.returncode:
                    print(f"{desc}: {b} forward failed: {run.stderr}")
                    failed = True
                    continue
                run = subprocess.run(
                    [args.cli, "backward", "--q", files["q"], "--k", files["k"], "--v",
                     files["v"], "--o", out["o"], "--lse", out["lse"], "--d-out", files["do"],
                     "--dq", out["dq"], "--dk", out["dk"], "--dv", out["dv"]] + run_flags,
                    capture_output=True, text=True)
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
                    "O": rel_error(load(out["o"], args.dtype), o_ref),
                    "LSE": rel_error(lse_sum, lse_want),
                    "dQ": rel_error(load(out["dq"], args.dtype), dq_ref),
                    "dK": rel_error(load(out["dk"], args.dtype), dk_ref),
                    "dV": rel_error(load(out["dv"], args.dtype), dv_ref),
                }
                for name, err in errors.items():
                    if err > worst[b].get(name, (0.0, ""))[0]:
                        worst[b][name] = (err, desc)
                    bound = args.tolerance
                    if args.dtype != "f32" and name != "LSE":
                        bound = max(2 * t_errors[name], FLOOR_16)
                    if not err <= bound:
                        print(f"{desc}: {b} {name} error {err:.3g} (bound {bound:.3g})")
                        failed = True
        packed = args.packed if args.dtype == "f32" else 0
        for _ in range(packed):
            failed |= packed_case(rng, folder, args.cli, [b for b in backends if b != "torch"],
                                  args.variant, args.tolerance, worst)
        modified = args.modifiers if args.dtype == "f32" else 0
        for _ in range(modified):
            failed |= modifier_case(rng, folder, args.cli, [b for b in backends if b != "torch"],
                                    args.variant, args.tolerance, worst)
    bound = (f"tolerance {args.tolerance:g}" if args.dtype == "f32" else
             f"{args.dtype}: at most 2x torch's own {args.dtype} SDPA error, the LSE "
             f"{args.tolerance:g}")
    print(f"clattn against torch {torch.__version__} float64 autograd, {args.cases} cases "
          f"{f'and {len(large)} large shapes ' if large else ''}"
          f"{f'and {packed} packed batches ' if packed else ''}"
          f"{f'and {modified} cases with score modifiers ' if modified else ''}"
          f"(max |err| / max |ref|, {bound}):")
    print("backend     " + "".join(f"{n:>11}" for n in ("O", "LSE", "dQ", "dK", "dV")))
    for b in backends:
        print(f"{b:<12}" + "".join(f"{worst[b].get(n, (float('nan'),))[0]:>11.2e}"
                                   for n in ("O", "LSE", "dQ", "dK", "dV")))
    print("FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
