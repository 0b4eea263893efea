"""Fixtures of the Python package's tests: the backends they run on, and
whether torch must be present.

A backend the machine lacks is skipped, unless CLATTN_REQUIRE_BACKENDS
names it ("opencl-cpu"); torch is skipped unless it names "python", as CI
does.
"""
import os

import numpy as np
import pytest

import clattn

REQUIRED = set(filter(None, os.environ.get("CLATTN_REQUIRE_BACKENDS", "").split(",")))
SELECTORS = {"native": "native", "opencl-cpu": "cpu"}
_contexts = {}


def backend_context(backend):
    """One context per backend for the whole session (PoCL builds its
    kernels once), or a skip (a failure where required)."""
    if backend not in _contexts:
        try:
            ctx = clattn.Context(device=SELECTORS[backend], threads=2)
            if ctx.backend != backend:
                raise clattn.Error(f"asked for {backend}, got {ctx.device}")
            _contexts[backend] = ctx
        except clattn.Error as e:
            _contexts[backend] = e
    got = _contexts[backend]
    if isinstance(got, Exception):
        if backend in REQUIRED:
            pytest.fail(f"{backend} is required (CLATTN_REQUIRE_BACKENDS) but absent: {got}")
        pytest.skip(f"{backend} is absent: {got}")
    return got


def backends():
    wanted = os.environ.get("CLATTN_PY_BACKENDS", "native,opencl-cpu")
    return [b for b in wanted.split(",") if b]


@pytest.fixture(params=backends())
def ctx(request):
    return backend_context(request.param)


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        if "python" in REQUIRED:
            pytest.fail(f"torch is required (CLATTN_REQUIRE_BACKENDS names python): {e}")
        pytest.skip(f"torch is absent: {e}")


def rel_err(got, ref):
    """max |got - ref| over max |ref|: the tests' error measure."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.all(np.isfinite(got)), "non-finite values"
    scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-6)
    return float(np.max(np.abs(got - ref), initial=0.0)) / scale


# Per dtype: float32's sums drift by sqrt(n) * 6e-8 of their magnitude; a
# 16-bit output is rounded once (u = 2^-11, 2^-8) from float32 sums of
# 16-bit inputs. Any indexing or masking error is off by a whole term.
TOL = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}


def in_threads(fn, threads=4, each=4):
    """fn() called `each` times on each of `threads` threads at once: the
    list of its results; an exception in any thread fails the test."""
    import threading
    results, errors = [], []

    def work():
        try:
            for _ in range(each):
                results.append(fn())
        except Exception as e:  # reported below
            errors.append(e)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    assert len(results) == threads * each
    return results
