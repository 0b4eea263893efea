#!/usr/bin/env python3
"""Times PyTorch's scaled_dot_product_attention (forward and backward)
beside `clattn bench` on the same shapes, in one run, and prints
clattn/PyTorch ratios. GPU: clattn on the OpenCL GPU against torch on CUDA;
CPU: clattn's native backend and PoCL against torch on the CPU, all at the
same thread count. Needs torch; skips (exit 77) without it.

    python3 tools/torch_bench.py BUILD/clattn [--threads N[,N...]] [--reps R] [--rounds N]
                                 [--no-cpu]
                                 [--no-gpu] [--variant NAME|all] [--head-dims 64,128]
                                 [--plot FILE.svg] [--dtype f32|f16|bf16]
                                 [--torch-backend flash|cudnn|efficient|math]
                                 [--json FILE.json]
    python3 tools/torch_bench.py --plot-from FILE.json [FILE.json ...] --plot FILE.svg

--threads 1,2,4,8,16 runs the CPU shapes at each thread count (torch, native
and PoCL alike): a scaling table.

--rounds N runs the whole plan N times over, each round timing every side
of every line again, and prints the medians over the rounds: GFLOP/s of
each side, and the median of each round's ratio. A shared machine's speed
drifts over minutes; rounds spread each side over the same minutes.

--dtype runs both sides on 16-bit tensors (torch's float16/bfloat16 SDPA,
`clattn bench --dtype`); the default is float32.

--torch-backend pins PyTorch's SDPA to one of its backends (torch.nn.attention.
sdpa_kernel); by default PyTorch picks one per call, as its users get.

--plot draws clattn's and PyTorch's figures per shape and op as bars
(needs matplotlib; without it the table is still printed).

--json FILE writes the run as a results file: the command, the date, the
machine, the versions and every line's figures. --plot-from FILE.json
[FILE.json ...] --plot FILE.svg draws a plot from results files alone
(no torch needed).

For GQA shapes PyTorch is timed both ways, with enable_gqa=True and with K
and V expanded to every head, and its faster time counts: its GQA path is
much slower than its MHA path in fp32.

FLOP are counted as clattn does (DESIGN.md): forward 4, backward 10 per
visible (query, key) pair per head_dim element, so a ratio is a speed ratio."""
import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from statistics import median

import shapes

try:
    import torch
    import torch.nn.functional as F
    TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
except ImportError as e:
    torch = None
    TORCH_MISSING = str(e)
    TORCH_DTYPES = {"f32": None, "f16": None, "bf16": None}

# (batch, q_seq, heads, kv_heads, head_dim, causal): tools/shapes.py's lists
GPU_SHAPES = shapes.plain(shapes.GPU)
CPU_SHAPES = shapes.plain(shapes.CPU)


def pairs(q_seq, heads, batch, causal):
    return (q_seq * (q_seq + 1) // 2 if causal else q_seq * q_seq) * heads * batch


def sdpa_backend(name):
    """A context that pins SDPA to backend `name` (None: PyTorch picks)."""
    if not name:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "math": SDPBackend.MATH}[name])


def torch_time(shape, op, device, reps, dtype, backend=None):
    """Median seconds a call, or None where the pinned backend cannot run it;
    for GQA the faster of enable_gqa and K/V expanded to every head."""
    try:
        with sdpa_backend(backend):
            t = torch_time_in(shape, op, device, reps, dtype, expand=False)
            if shape[2] != shape[3]:
                t = min(t, torch_time_in(shape, op, device, reps, dtype, expand=True))
            return t
    except RuntimeError as e:
        if not backend:
            raise
        print(f"torch's {backend} backend cannot run {shape} {op}: {str(e).splitlines()[0]}")
        return None


def torch_time_in(shape, op, device, reps, dtype, expand):
    batch, s, h, kh, d, causal = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda heads: (torch.rand(batch, heads, s, d, generator=g) * 2 - 1).to(
        device, TORCH_DTYPES[dtype])
    q, k, v = mk(h), mk(kh), mk(kh)
    for t in (q, k, v):
        t.requires_grad_(op == "backward")
    d_out = mk(h)
    kw = dict(is_causal=causal, enable_gqa=kh != h and not expand)
    if expand and kh != h:  # the expansion is part of what is timed, as in a model
        grow = lambda x: x.repeat_interleave(h // kh, dim=1)
    else:
        grow = lambda x: x

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times = []
    for r in range(reps + 1):
        if op == "forward":
            sync()
            t0 = time.perf_counter()
            with torch.no_grad():
                F.scaled_dot_product_attention(q, grow(k), grow(v), **kw)
            sync()
        else:
            out = F.scaled_dot_product_attention(q, grow(k), grow(v), **kw)
            sync()
            t0 = time.perf_counter()
            torch.autograd.grad(out, (q, k, v), d_out)
            sync()
        if r:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def clattn_runs(cli, shape, op, device, variant, reps, env, dtype):
    batch, s, h, kh, d, causal = shape
    cmd = [cli, "bench", "--op", op, "--q-seq", str(s), "--heads", str(h), "--kv-heads", str(kh),
           "--head-dim", str(d), "--batch", str(batch), "--device", device, "--variant", variant,
           "--reps", str(reps), "--dtype", dtype, "--json"] + (["--causal"] if causal else [])
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode:
        print(f"clattn bench failed: {' '.join(cmd)}\n{run.stderr}")
        return []
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def run_round(args, plans, say):
    """One timing of every line of the plan: rows of (desc, op, where,
    clattn GFLOP/s, torch GFLOP/s, torch device, kernels); say(row) prints
    a row as it comes, where the caller wants that."""
    rows, torch_times = [], {}
    for shape, dev, tdev, threads in plans:
        batch, s, h, kh, d, causal = shape
        desc = f"b{batch} s{s} h{h}/{kh} d{d}{' causal' if causal else ''}"
        if tdev == "cpu":
            desc += f" t{threads}"
        torch.set_num_threads(threads)
        # PoCL takes its thread count from its own variable.
        env = dict(os.environ, CLATTN_NUM_THREADS=str(threads),
                   POCL_MAX_PTHREAD_COUNT=str(threads))
        for op in ("forward", "backward"):
            flop = (4 if op == "forward" else 10) * pairs(s, h, batch, causal) * d
            key = (shape, op, tdev, threads)  # once per shape, not per clattn device
            if key not in torch_times:
                torch_times[key] = torch_time(shape, op, tdev, args.reps, args.dtype,
                                               args.torch_backend)
            if torch_times[key] is None:
                continue
            g_torch = flop / torch_times[key] * 1e-9
            for r in clattn_runs(args.cli, shape, op, dev, args.variant, args.reps, env,
                                 args.dtype):
                row = (desc, op, f"{r['backend']} / {r['variant']}", r["gflops"], g_torch, tdev,
                       r.get("kernels", ""))
                say(row)
                rows.append(row)
    return rows


def print_row(desc, op, where, g_clattn, g_torch, ratio, kernels):
    print(f"{desc:<34}{op:<10}{where:<34}{g_clattn:>10.1f}{g_torch:>10.1f}{ratio:>8.3f}  {kernels}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli", nargs="?", help="the clattn program (not with --plot-from)")
    ap.add_argument("--threads", default=str(os.cpu_count()),
                    help="CPU thread counts, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--variant", default="all")
    ap.add_argument("--head-dims", help="only shapes of these head_dims, comma-separated")
    ap.add_argument("--plot", metavar="FILE.svg")
    ap.add_argument("--dtype", default="f32", choices=sorted(TORCH_DTYPES))
    ap.add_argument("--torch-backend", choices=["flash", "cudnn", "efficient", "math"])
    ap.add_argument("--json", metavar="FILE.json", help="write the run as a results file")
    ap.add_argument("--plot-from", nargs="+", metavar="FILE.json",
                    help="draw --plot from results files and exit")
    args = ap.parse_args()
    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot")
        for path in args.plot_from:
            with open(path) as f:
                res = json.load(f)
            out = args.plot if len(args.plot_from) == 1 else f"{os.path.splitext(path)[0]}.svg"
            plot([tuple(r[k] for k in ROW_KEYS) for r in res["rows"]], out, res["torch"],
                 res["dtype"])
        return 0
    if not args.cli:
        ap.error("the clattn program is needed")
    if torch is None:
        print(f"SKIP: {TORCH_MISSING}")
        return 77
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps take a count of 1 or more")
    counts = [int(n) for n in args.threads.split(",")]
    plans = []
    if torch.cuda.is_available() and not args.no_gpu:
        plans += [(shape, "gpu", "cuda", counts[0]) for shape in GPU_SHAPES]
    if not args.no_cpu:
        plans += [(shape, dev, "cpu", n) for n in counts for shape in CPU_SHAPES
                  for dev in ("native", "cpu")]
    if args.head_dims:
        keep = {int(d) for d in args.head_dims.split(",")}
        plans = [p for p in plans if p[0][4] in keep]
    rounds = f", {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"torch {torch.__version__}, {args.dtype}, {args.threads} CPU threads, "
          f"median of {args.reps}{rounds}")
    head = (f"{'shape':<34}{'op':<10}{'clattn device / variant':<34}{'clattn':>10}{'torch':>10}"
            f"{'ratio':>8}")
    print(head)
    every = []
    for n in range(args.rounds):
        if args.rounds > 1:
            print(f"round {n + 1}")
        every += run_round(args, plans, lambda row: print_row(*row[:5], row[3] / row[4], row[6]))
    rows = []
    if args.rounds > 1:  # the medians, line by line
        print(f"median of the {args.rounds} rounds (ratio: the median of the rounds' ratios)")
        print(head)
        for line in dict.fromkeys(row[:3] for row in every):
            mine = [row for row in every if row[:3] == line]
            g_clattn, g_torch = median([r[3] for r in mine]), median([r[4] for r in mine])
            print_row(*line, g_clattn, g_torch, median([r[3] / r[4] for r in mine]), mine[0][6])
            rows.append((*line, g_clattn, g_torch, mine[0][5]))
    else:
        rows = [row[:6] for row in every]
    print("(GFLOP/s; ratio = clattn / torch)")
    if args.json:
        write_results(args, rows)
    if args.plot:
        plot(rows, args.plot, torch.__version__, args.dtype)
    return 0


ROW_KEYS = ("shape", "op", "clattn", "clattn_gflops", "torch_gflops", "torch_device")


def machine():
    """What the run ran on: the CPU model, and the GPU where torch sees one."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "gpu": gpu}


def write_results(args, rows):
    """The run as a results file (results/README.md says what it holds)."""
    version = subprocess.run([args.cli, "version"], capture_output=True, text=True).stdout
    res = {"command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
           "clattn": version.strip(), "torch": torch.__version__, "dtype": args.dtype,
           "threads": args.threads, "reps": args.reps, "rounds": args.rounds,
           "machine": machine(),
           "rows": [dict(zip(ROW_KEYS, r)) for r in rows]}
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(f"results: {args.json}")


def plot(rows, path, version, dtype):
    """Bars per (shape, op): each clattn device / variant and PyTorch's SDPA."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"no plot: {e}")
        return
    groups = list(dict.fromkeys((desc, op) for desc, op, *_ in rows))
    series = list(dict.fromkeys(where for _, _, where, *_ in rows))
    names = series + [f"PyTorch {dtype} SDPA"]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(groups)), 4.8))
    for i, name in enumerate(names):
        xs, ys = [], []
        for x, (desc, op) in enumerate(groups):
            for d, o, where, g_clattn, g_torch, _ in rows:
                if (d, o) == (desc, op) and (where == name or name == names[-1]):
                    xs.append(x + (i - (len(names) - 1) / 2) * width)
                    ys.append((g_torch if name == names[-1] else g_clattn) * 1e-3)
                    break
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{d}\n{o}" for d, o in groups], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"clattn beside PyTorch {version} scaled_dot_product_attention ({dtype})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
