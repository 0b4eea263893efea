#!/usr/bin/env python3
"""`pip install` of the Python package, as a user runs it, into a scratch
folder, then a fresh interpreter that imports it from there alone:

    python3 tests/python_install.py SOURCE_DIR WORK_DIR

The package folder is copied into WORK_DIR first, so the build writes
nothing into the checkout. The installed package must load the library it
bundles, match the float64 answer of a small causal forward, and with torch
present run flash_attn_func with autograd.

Exit 77 (skipped) without pip or numpy, unless CLATTN_REQUIRE_BACKENDS
names "python"."""
import importlib.util
import os
import shutil
import subprocess
import sys

src, work = sys.argv[1], sys.argv[2]
required = "python" in os.environ.get("CLATTN_REQUIRE_BACKENDS", "").split(",")
missing = [m for m in ("numpy", "pip", "setuptools") if importlib.util.find_spec(m) is None]
if missing:
    print(("FAIL (required): " if required else "SKIP: ") + "no " + ", ".join(missing))
    sys.exit(1 if required else 77)

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
package = os.path.join(work, "python")
shutil.copytree(os.path.join(src, "python"), package,
                ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests",
                                              "libclattn.so*"))
target = os.path.join(work, "site")
env = dict(os.environ, CLATTN_SOURCE_DIR=src)
env.pop("CLATTN_LIBRARY", None)
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                "--no-deps", "--no-cache-dir", "--target", target, package], check=True,
               env=env)

CHECK = r'''
import math, os, sys
import numpy as np
import clattn
assert os.path.dirname(clattn._lib.library_path) == os.path.join(sys.argv[1], "clattn"), \
    clattn._lib.library_path
assert clattn.library_version() == clattn.__version__
r = np.random.default_rng(0)
q, k, v = (r.standard_normal((1, 9, 2, 8)).astype(np.float32) for _ in range(3))
o, lse = clattn.Context(device="native").forward(q, k, v, causal=True)
s = np.einsum("bqhd,bkhd->bhqk", q, k).astype(np.float64) / math.sqrt(8)
s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
assert np.max(np.abs(o - ref)) < 1e-5, np.max(np.abs(o - ref))
try:
    import torch
except ImportError:
    print("installed package: numpy API ok; torch absent")
    sys.exit(0)
x = torch.randn(1, 9, 2, 8, requires_grad=True)
clattn.torch.set_device("native")
clattn.flash_attn_func(x, x, x, causal=True).sum().backward()
assert x.grad is not None and torch.isfinite(x.grad).all()
print("installed package: numpy and torch APIs ok")
'''
env = {k: v for k, v in os.environ.items() if k not in ("CLATTN_LIBRARY", "PYTHONPATH")}
env["PYTHONPATH"] = target
subprocess.run([sys.executable, "-c", CHECK, target], check=True, env=env, cwd=work)
shutil.rmtree(work, ignore_errors=True)
