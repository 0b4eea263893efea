#!/usr/bin/env python3
"""Runs the seed, meganeura's mha_grad_v.wgsl, as it is on a real WebGPU
runtime (wgpu on whatever adapter it finds: Mesa's lavapipe on a CPU-only
machine) and compares its dV with `clattn grad-v` on every backend present.

    python3 tests/seed_oracle.py BUILD/clattn SEED_DIR

SEED_DIR holds the seed's text (the shared/ folder beside the checkout); it
is read at run time, never copied into the project. The shader is used as
written, given only `@group(0) @binding(i)` attributes in the order its
variables are declared, and dispatched [kv_seq, num_kv_heads, 1] with the
LSE from clattn's native forward, at head_dim 64 (its work-group size).

Twice:
- as the seed is: after tree_reduce's last barrier every lane reads
  wg_dot[0], and lane 0's next write of wg_dot[0] (the next head of the group
  or the next position) is not fenced from those reads. The script asserts
  that this race shows where a KV head serves several query heads (an error
  above 1e-2 of the largest element), so that the comparison can fail;
- with one workgroupBarrier() after that read: dV must agree with every
  backend's within 1e-5 of the largest element.

Exit 0 when both hold, 1 when not, 77 (skipped) when wgpu, an adapter, numpy
or the seed is missing, unless CLATTN_REQUIRE_BACKENDS names "seed"."""
import os
import subprocess
import sys
import tempfile

AGREE = 1e-5  # fenced seed against clattn, relative to max |dV|
RACE = 1e-2   # the unfenced seed must be at least this far off on GQA shapes


def skip(why):
    required = "seed" in os.environ.get("CLATTN_REQUIRE_BACKENDS", "").split(",")
    print(("FAIL (required): " if required else "SKIP: ") + why)
    sys.exit(1 if required else 77)


# Mesa's loader complains without a runtime folder; give it a private one.
if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="clattn-xdg-")

try:
    import numpy as np
    import wgpu
except ImportError as e:
    skip(str(e))

HEAD_DIM = 64
FENCE_AFTER = "let score = wg_dot[0] * scale;"
# (q_seq, kv_seq, heads, kv_heads, causal, window): the seed's causal rule
# needs kv_seq == q_seq (its kv_seq 0).
SHAPES = [
    (40, 40, 4, 4, True, 0),     # MHA: no later write to race with
    (40, 40, 8, 2, True, 0),     # GQA, causal
    (50, 80, 6, 3, False, 0),    # GQA, cross (kv_seq != q_seq)
    (45, 45, 4, 1, False, 9),    # MQA, window
    (33, 33, 8, 4, True, 5),     # GQA, causal and window
]


def seed_text(folder):
    """The WGSL of the seed's page: from its first comment to the end."""
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            text = f.read()
        if "MHA gradient wrt V" in text and "fn tree_reduce" in text:
            return text[text.index("// MHA gradient wrt V"):]
    return None


def with_bindings(wgsl):
    """`@group(0) @binding(i)` before each storage and uniform variable."""
    out, i = [], 0
    for line in wgsl.splitlines():
        if line.startswith("var<storage") or line.startswith("var<uniform"):
            line = f"@group(0) @binding({i}) {line}"
            i += 1
        out.append(line)
    return "\n".join(out) + "\n"


def run_seed(device, wgsl, q, k, v, d_out, lse, o, causal, window):
    """dV from the shader, with the seed's uniform block for the shape."""
    q_seq, heads, _ = q.shape
    kv_seq, kv_heads, _ = k.shape
    params = np.array([q_seq, 0 if causal else kv_seq, heads << 16 | kv_heads, HEAD_DIM,
                       window, 0, 0, 0], dtype=np.uint32)
    usage = wgpu.BufferUsage
    inputs = [d_out, q, k, v, lse, o]
    buffers = [device.create_buffer_with_data(data=np.ascontiguousarray(a, np.float32),
                                              usage=usage.STORAGE) for a in inputs]
    dv_bytes = k.size * 4
    dst = device.create_buffer(size=dv_bytes, usage=usage.STORAGE | usage.COPY_SRC)
    uniform = device.create_buffer_with_data(data=params, usage=usage.UNIFORM)
    readback = device.create_buffer(size=dv_bytes, usage=usage.COPY_DST | usage.MAP_READ)
    module = device.create_shader_module(code=wgsl)
    # The shader leaves V and O unused, and an "auto" layout would drop
    # them: every declared variable gets its binding, as meganeura binds.
    kinds = [wgpu.BufferBindingType.read_only_storage] * len(inputs)
    kinds += [wgpu.BufferBindingType.storage, wgpu.BufferBindingType.uniform]
    layout = device.create_bind_group_layout(entries=[
        {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
        for i, kind in enumerate(kinds)])
    pipeline = device.create_compute_pipeline(
        layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
        compute={"module": module, "entry_point": "main"})
    entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
               for i, b in enumerate(buffers + [dst, uniform])]
    bind = device.create_bind_group(layout=layout, entries=entries)
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipeline)
    cp.set_bind_group(0, bind)
    cp.dispatch_workgroups(kv_seq, kv_heads, 1)
    cp.end()
    enc.copy_buffer_to_buffer(dst, 0, readback, 0, dv_bytes)
    device.queue.submit([enc.finish()])
    readback.map_sync(wgpu.MapMode.READ)
    dv = np.frombuffer(readback.read_mapped(), dtype=np.float32).copy()
    readback.unmap()
    return dv.reshape(k.shape)


def clattn(cli, *args):
    run = subprocess.run([cli, *args], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"clattn {' '.join(args)}: {run.stderr.strip()}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    cli, folder = sys.argv[1], sys.argv[2]
    if not os.path.isdir(folder):
        skip(f"no seed folder {folder}")
    wgsl = seed_text(folder)
    if wgsl is None:
        skip(f"no mha_grad_v seed in {folder}")
    if FENCE_AFTER not in wgsl:
        print(f"FAIL: the seed has no line '{FENCE_AFTER}' to fence")
        return 1
    as_is = with_bindings(wgsl)
    fenced = with_bindings(wgsl.replace(FENCE_AFTER, FENCE_AFTER + " workgroupBarrier();"))
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="low-power")
        device = adapter.request_device_sync()
    except Exception as e:  # no Vulkan driver, no adapter
        skip(f"no WebGPU adapter: {e}")
    print(f"seed on {adapter.info['device']} ({adapter.info['backend_type']})")
    devices = subprocess.run([cli, "devices"], capture_output=True, text=True).stdout
    # Device lines read "[*] P:D KIND NAME"; auto's own lines mention kinds too.
    kinds = {line.lstrip("* ").split()[1] for line in devices.splitlines()
             if line.lstrip("* ")[:1].isdigit()}
    backends = ["native"] + [b for b, kind in (("cpu", "opencl-cpu"), ("gpu", "opencl-gpu"))
                             if kind in kinds]
    rng = np.random.default_rng(14)
    failed = False
    print(f"{'shape':<34}{'backend':<8}{'seed as is':>12}{'fenced':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name + ".npy")
        for q_seq, kv_seq, heads, kv_heads, causal, window in SHAPES:
            q = rng.uniform(-1, 1, (q_seq, heads, HEAD_DIM)).astype(np.float32)
            k = rng.uniform(-1, 1, (kv_seq, kv_heads, HEAD_DIM)).astype(np.float32)
            v = rng.uniform(-1, 1, (kv_seq, kv_heads, HEAD_DIM)).astype(np.float32)
            d_out = rng.uniform(-1, 1, (q_seq, heads, HEAD_DIM)).astype(np.float32)
            for name, a in (("q", q), ("k", k), ("v", v), ("do", d_out)):
                np.save(path(name), a)
            mask = (["--causal"] if causal else []) + (["--window", str(window)] if window else [])
            clattn(cli, "forward", "--q", path("q"), "--k", path("k"), "--v", path("v"), "--out",
                   path("o"), "--lse-out", path("lse"), "--device", "native", *mask)
            o, lse = np.load(path("o")), np.load(path("lse"))
            seed = run_seed(device, as_is, q, k, v, d_out, lse, o, causal, window)
            seed_fenced = run_seed(device, fenced, q, k, v, d_out, lse, o, causal, window)
            desc = (f"q{q_seq} kv{kv_seq} h{heads}/{kv_heads}{' causal' if causal else ''}"
                    f"{f' window {window}' if window else ''}")
            for b in backends:
                clattn(cli, "grad-v", "--q", path("q"), "--k", path("k"), "--d-out", path("do"),
                       "--lse", path("lse"), "--out", path("dv-" + b), "--device", b, *mask)
                want = np.load(path("dv-" + b)).astype(np.float64)
                big = np.abs(want).max()
                err = np.abs(seed - want).max() / big
                err_fenced = np.abs(seed_fenced - want).max() / big
                print(f"{desc:<34}{b:<8}{err:>12.3g}{err_fenced:>12.3g}")
                if not err_fenced <= AGREE:
                    print(f"FAIL: the fenced seed and clattn {b} differ by {err_fenced:.3g}")
                    failed = True
                if heads > kv_heads and not err > RACE:
                    print(f"FAIL: the seed's race did not show ({err:.3g} <= {RACE:g}): "
                          "this comparison could not catch a wrong dV")
                    failed = True
    print("FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
