"""The numpy API against the float64 reference, on native and PoCL, and
its answers to bad input."""
import ctypes
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import clattn
from conftest import TOL, backend_context, in_threads, rel_err
from reference import batched, bf16_bits, bf16_value

rng = np.random.default_rng(1234)


def tensors(B, Sq, Sk, H, Hk, D, packed=None):
    if packed is not None:
        tq, tk = packed
        shapes = [(tq, H, D), (tk, Hk, D), (tk, Hk, D), (tq, H, D)]
    else:
        shapes = [(B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D), (B, Sq, H, D)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


# (name, B, Sq, Sk, H, Hk, D, options): each a case the C contract names.
CASES = [
    ("gqa-causal-top-left", 2, 37, 53, 4, 2, 32, dict(causal=True)),
    ("causal-bottom-right", 1, 29, 61, 4, 4, 16, dict(causal="bottom-right")),
    ("window-offsets", 2, 33, 40, 2, 1, 24, dict(causal=True, window=9, window_right=3,
                                                   q_offset=20, kv_offset=13)),
    ("softcap-scale", 1, 31, 31, 4, 2, 40, dict(softcap=2.5, scale=0.3)),
    ("alibi", 2, 24, 30, 4, 1, 16, dict(causal=True, alibi_slopes=[0.5, 0.25, 0.125, 0.0625])),
    ("dropout", 2, 26, 35, 2, 2, 32, dict(causal=True, dropout_p=0.3, seed=77, offset=5)),
]


def reference(q, k, v, d_out, opts, cu=None):
    o = dict(opts)
    scale = o.pop("scale", None) or 1.0 / np.sqrt(q.shape[-1])
    causal = o.pop("causal", False)
    kw = dict(scale=scale, causal=bool(causal), window=o.pop("window", 0),
              softcap=o.pop("softcap", 0.0))
    right = o.pop("window_right", 0)
    if right:  # causal's bound moved right
        kw["causal"], kw["right"] = False, right
    kw["shift"] = o.pop("q_offset", 0) - o.pop("kv_offset", 0)
    slopes = o.pop("alibi_slopes", None)
    p = o.pop("dropout_p", 0.0)
    seed, offset = o.pop("seed", 0), o.pop("offset", 0)
    assert not o, o
    B = len(cu[0]) - 1 if cu else q.shape[0]
    keeps = None
    if p > 0:
        kw["dropout_p"] = p
        args = dict(q_seq=q.shape[-3], kv_seq=k.shape[-3], num_heads=q.shape[-2], dropout_p=p,
                    seed=seed, offset=offset, causal=causal, q_offset=max(kw["shift"], 0),
                    kv_offset=max(-kw["shift"], 0))
        if cu:
            keeps = clattn.dropout_mask(cu_seqlens_q=cu[0], cu_seqlens_kv=cu[1], **args)
        else:
            keeps = list(clattn.dropout_mask(batch=B, **args))
    return batched(q, k, v, d_out, cu_q=cu[0] if cu else None, cu_k=cu[1] if cu else None,
                   keeps=keeps, alibi_rows=[np.asarray(slopes)] * B if slopes else None,
                   causal_bottom_right=causal == "bottom-right", **kw)


def check_all_ops(ctx, q, k, v, d_out, opts, tol, cu=None, dtype=None, convert=None):
    ref = reference(*(convert(x) if convert else x for x in (q, k, v, d_out)), opts, cu)
    extra = dict(opts)
    if cu:
        extra.update(cu_seqlens_q=cu[0], cu_seqlens_kv=cu[1])
    if dtype:
        extra["dtype"] = dtype
    val = convert or (lambda x: x)
    o, lse = ctx.forward(q, k, v, **extra)
    assert o.dtype == q.dtype and lse.dtype == np.float32
    assert rel_err(val(o), ref[0]) < tol
    seen = ref[1][..., 0] > -1e29
    assert np.all(lse[~seen] == -1e30)
    lse_ref = ref[1][..., 0] + ref[1][..., 1]
    assert np.max(np.abs((lse[..., 0] + lse[..., 1])[seen] - lse_ref[seen])) < 1e-4 * max(
        1.0, np.max(np.abs(lse_ref[seen])))
    # The gradients from the reference's own o and lse, so each op is
    # checked alone.
    o_in = q.dtype.type(0) + o
    dq, dk, dv = ctx.backward(q, k, v, o_in, lse, d_out, **extra)
    for got, want in zip((dq, dk, dv), ref[2:]):
        assert rel_err(val(got), want) < tol
    assert rel_err(val(ctx.grad_q(q, k, v, o_in, lse, d_out, **extra)), ref[2]) < tol
    assert rel_err(val(ctx.grad_k(q, k, v, o_in, lse, d_out, **extra)), ref[3]) < tol
    assert rel_err(val(ctx.grad_v(q, k, lse, d_out, **extra)), ref[4]) < tol


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ops_f32(ctx, case):
    _, B, Sq, Sk, H, Hk, D, opts = case
    q, k, v, d_out = tensors(B, Sq, Sk, H, Hk, D)
    check_all_ops(ctx, q, k, v, d_out, opts, TOL["f32"])


def test_packed_sequences(ctx):
    # Three sequences, one of them without keys: its rows come out empty.
    cu_q, cu_k = np.array([0, 17, 17, 40, 52], np.int32), np.array([0, 30, 41, 41, 75], np.int32)
    q, k, v, d_out = tensors(0, 0, 0, 4, 2, 16, packed=(52, 75))
    for opts in (dict(causal=True), dict(causal="bottom-right", window=7), dict()):
        check_all_ops(ctx, q, k, v, d_out, opts, TOL["f32"], cu=(cu_q, cu_k))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_ops_16bit(ctx, dtype):
    q, k, v, d_out = tensors(2, 21, 34, 4, 2, 24)
    if dtype == "f16":
        args = [x.astype(np.float16) for x in (q, k, v, d_out)]
        convert, name = (lambda x: x.astype(np.float32)), None
    else:
        args = [bf16_bits(x) for x in (q, k, v, d_out)]
        convert, name = bf16_value, "bf16"
    check_all_ops(ctx, *args, dict(causal=True, softcap=3.0), TOL[dtype], dtype=name,
                  convert=convert)


def test_ml_dtypes_bfloat16(ctx):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, _ = tensors(1, 9, 12, 2, 1, 8)
    as_bf = [x.astype(ml_dtypes.bfloat16) for x in (q, k, v)]
    o, _ = ctx.forward(*as_bf, causal=True)
    o_bits, _ = ctx.forward(*(x.view(np.uint16) for x in as_bf), causal=True, dtype="bf16")
    assert o.dtype == as_bf[0].dtype and np.array_equal(o.view(np.uint16), o_bits)


def test_merge_is_the_union_of_key_chunks(ctx):
    q, k, v, _ = tensors(2, 19, 40, 4, 2, 16)
    whole_o, whole_lse = ctx.forward(q, k, v, causal=True)
    o1, l1 = ctx.forward(q, k[:, :23], v[:, :23], causal=True)
    o2, l2 = ctx.forward(q, k[:, 23:], v[:, 23:], causal=True, kv_offset=23)
    o, lse = ctx.merge(o1, l1, o2, l2)
    assert rel_err(o, whole_o) < TOL["f32"]
    assert rel_err(lse[..., 0] + lse[..., 1], whole_lse[..., 0] + whole_lse[..., 1]) < 1e-6


def test_sinks_join_one_key_chunk_and_have_a_gradient(ctx):
    # A sink is one more key with no value: given to one key chunk, the
    # merge is the whole forward with it. Its gradient, -sum exp(sink - L)
    # (d_out . o) a head (0 for a sink at -inf), adds in under accumulate.
    q, k, v, d_out = tensors(2, 19, 40, 4, 2, 16)
    sinks = np.array([1.0, -2.0, 0.5, -np.inf], np.float32)
    whole_o, whole_lse = ctx.forward(q, k, v, causal=True, sinks=sinks)
    plain_o, _ = ctx.forward(q, k, v, causal=True)
    assert rel_err(whole_o, plain_o) > 1e-2
    o1, l1 = ctx.forward(q, k[:, :23], v[:, :23], causal=True, sinks=sinks)
    o2, l2 = ctx.forward(q, k[:, 23:], v[:, 23:], causal=True, kv_offset=23)
    o, lse = ctx.merge(o1, l1, o2, l2)
    assert rel_err(o, whole_o) < TOL["f32"]
    d = ctx.grad_sinks(q, k, v, whole_o, whole_lse, d_out, causal=True, sinks=sinks)
    L = (whole_lse[..., 0] + whole_lse[..., 1]).astype(np.float64)
    dots = np.sum(d_out.astype(np.float64) * whole_o, axis=-1)
    want = -np.sum(np.exp(sinks.astype(np.float64) - L) * dots, axis=(0, 1))
    assert d.shape == (4,) and d[3] == 0.0 and rel_err(d, want) < 1e-5
    more = np.full(4, 0.25, np.float32)
    got = ctx.grad_sinks(q, k, v, whole_o, whole_lse, d_out, causal=True, sinks=sinks,
                         d_sinks=more, accumulate=True)
    assert got is more and rel_err(got, d + 0.25) < 1e-6


def test_accumulate_adds_into_given_gradients(ctx):
    q, k, v, d_out = tensors(1, 15, 15, 2, 2, 8)
    o, lse = ctx.forward(q, k, v, causal=True)
    fresh = ctx.backward(q, k, v, o, lse, d_out, causal=True)
    start = [np.full_like(g, 0.5) for g in fresh]
    got = ctx.backward(q, k, v, o, lse, d_out, causal=True, dq=start[0], dk=start[1],
                       dv=start[2], accumulate=True)
    for g, f, s in zip(got, fresh, start):
        assert g is s
        assert rel_err(g, f + 0.5) < TOL["f32"]


def test_dropout_mask_is_the_forwards_draw():
    # With every probability 1 / Sk (Q = 0) and V = 1, a row's output is
    # (kept keys) / (Sk (1 - p)): the mask the forward drew, row by row.
    ctx = backend_context("native")
    B, S, H, D, p = 2, 20, 3, 4, 0.4
    q = np.zeros((B, S, H, D), np.float32)
    v = np.ones((B, S, H, D), np.float32)
    o, _ = ctx.forward(q, q, v, dropout_p=p, seed=9, offset=2)
    keep = clattn.dropout_mask(batch=B, q_seq=S, kv_seq=S, num_heads=H, dropout_p=p, seed=9,
                               offset=2)
    assert keep.shape == (B, H, S, S) and 0.3 < 1 - keep.mean() < 0.5
    want = keep.sum(axis=-1) / (S * (1 - p))
    assert np.allclose(o[..., 0], want.transpose(0, 2, 1), rtol=1e-5)
    one = clattn.dropout_mask(batch=B, q_seq=S, kv_seq=S, num_heads=H, dropout_p=p, seed=9,
                              offset=2, b=1, head=2)
    assert np.array_equal(one, keep[1, 2])


def test_non_contiguous_inputs_are_copied(ctx):
    q, k, v, _ = tensors(2, 12, 12, 2, 2, 8)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not qt.flags.c_contiguous
    a, _ = ctx.forward(qt, k, v, causal=True)
    b, _ = ctx.forward(q, k, v, causal=True)
    assert np.array_equal(a, b)


BAD = [
    ("mixed dtypes", TypeError, lambda q, k, v: (q, k.astype(np.float16), v), {}),
    ("float64", TypeError, lambda q, k, v: (q.astype(np.float64),) * 1 + (k.astype(np.float64),
                                                                          v.astype(np.float64)),
     {}),
    ("uint16 without dtype", TypeError, lambda q, k, v: (bf16_bits(q), bf16_bits(k),
                                                          bf16_bits(v)), {}),
    ("list", TypeError, lambda q, k, v: (q.tolist(), k, v), {}),
    ("rank", ValueError, lambda q, k, v: (q[0], k[0], v[0]), {}),
    ("batch", ValueError, lambda q, k, v: (q, k[:1], v[:1]), {}),
    ("head_dim", ValueError, lambda q, k, v: (q, k[..., :4], v[..., :4]), {}),
    ("v shape", ValueError, lambda q, k, v: (q, k, v[:, :3]), {}),
    ("heads", ValueError, lambda q, k, v: (q[:, :, :3], k, v), {}),
    ("head_dim 0", ValueError, lambda q, k, v: (q[..., :0], k[..., :0], v[..., :0]), {}),
    ("causal word", ValueError, lambda q, k, v: (q, k, v), dict(causal="sideways")),
    ("scale", ValueError, lambda q, k, v: (q, k, v), dict(scale=float("nan"))),
    ("negative window", ValueError, lambda q, k, v: (q, k, v), dict(window=-1)),
    ("right, no causal", ValueError, lambda q, k, v: (q, k, v), dict(window_right=2)),
    ("softcap", ValueError, lambda q, k, v: (q, k, v), dict(softcap=-1.0)),
    ("dropout", ValueError, lambda q, k, v: (q, k, v), dict(dropout_p=1.0)),
    ("slopes", ValueError, lambda q, k, v: (q, k, v), dict(alibi_slopes=[1.0])),
    ("sinks", ValueError, lambda q, k, v: (q, k, v), dict(sinks=[1.0])),
    ("NaN sink", ValueError, lambda q, k, v: (q, k, v), dict(sinks=[0.0, float("nan"), 0, 0])),
    ("+inf sink", ValueError, lambda q, k, v: (q, k, v), dict(sinks=[float("inf"), 0, 0, 0])),
    ("one cu_seqlens", ValueError, lambda q, k, v: (q[0], k[0], v[0]),
     dict(cu_seqlens_q=[0, 8])),
    ("decreasing cu_seqlens", ValueError, lambda q, k, v: (q[0], k[0], v[0]),
     dict(cu_seqlens_q=[0, 5, 3], cu_seqlens_kv=[0, 4, 8])),
    ("cu_seqlens past the rows", ValueError, lambda q, k, v: (q[0], k[0], v[0]),
     dict(cu_seqlens_q=[0, 5, 9], cu_seqlens_kv=[0, 4, 8])),
    ("negative cu_seqlens", ValueError, lambda q, k, v: (q[0], k[0], v[0]),
     dict(cu_seqlens_q=[0, -1, 8], cu_seqlens_kv=[0, 4, 8])),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises(case):
    ctx = backend_context("native")
    _, exc, make, opts = case
    q, k, v, _ = tensors(2, 8, 8, 4, 2, 8)
    with pytest.raises(exc) as e:
        ctx.forward(*make(q, k, v), **opts)
    assert str(e.value)


def test_bad_output_arrays_are_refused():
    ctx = backend_context("native")
    q, k, v, d_out = tensors(1, 8, 8, 2, 2, 8)
    o, lse = ctx.forward(q, k, v)
    with pytest.raises(ValueError, match="accumulate"):
        ctx.backward(q, k, v, o, lse, d_out, accumulate=True)
    with pytest.raises(ValueError, match="contiguous"):
        ctx.backward(q, k, v, o, lse, d_out, dq=np.zeros((1, 8, 2, 8, 2), np.float32)[..., 0])
    with pytest.raises(ValueError, match="shape"):
        ctx.grad_v(q, k, lse, d_out, dv=np.zeros((1, 8, 2, 9), np.float32))
    with pytest.raises(ValueError, match="lse"):
        ctx.backward(q, k, v, o, lse[..., :1], d_out)


def test_devices_and_contexts():
    devs = clattn.devices()
    assert devs[-1]["backend"] == "native" and devs[-1]["selector"] == "native"
    assert clattn.variants("native") == ["blocked"]
    with pytest.raises(ValueError):
        clattn.variants("auto")
    with pytest.raises(clattn.Error) as e:
        clattn.Context(device="no such device at all")
    assert e.value.status == "CLATTN_ERROR_DEVICE_NOT_FOUND"
    with pytest.raises(ValueError) as e:
        clattn.Context(device="native", variant="no-such-variant")
    assert e.value.status == "CLATTN_ERROR_UNKNOWN_VARIANT"
    with pytest.raises(TypeError):
        clattn.Context(device=3)
    with clattn.Context(device="native", threads=1) as c:
        assert c.backend == "native" and "1 thread" in c.device
    with pytest.raises(clattn.Error, match="closed"):
        c.forward(*tensors(1, 4, 4, 1, 1, 4)[:3])
    assert clattn.library_version() == clattn.__version__


def test_struct_layouts_match_the_header():
    # tests/python_layout.c prints sizeof and offsetof as the C compiler
    # lays the structs out; ctypes must agree.
    probe = os.environ.get("CLATTN_LAYOUT_PROBE")
    if not probe:
        pytest.fail("CLATTN_LAYOUT_PROBE (the built python_layout) is not set")
    out = subprocess.run([probe], check=True, capture_output=True, text=True).stdout.split()
    from clattn import _lib
    checked = 0
    for item in out:
        struct, field, value = item.split(":")
        cls = {"clattn_shape": _lib.Shape, "clattn_options": _lib.Options,
               "clattn_device_info": _lib.DeviceInfo}[struct]
        have = ctypes.sizeof(cls) if field == "sizeof" else getattr(cls, field).offset
        assert have == int(value), item
        checked += 1
    assert checked == 3 + 38 + 4 + 5


def test_threads_share_a_context_and_match_one_thread():
    ctx = backend_context("native")
    q, k, v, d_out = tensors(2, 64, 64, 4, 2, 32)
    want_o, want_lse = ctx.forward(q, k, v, causal=True)
    want_g = ctx.backward(q, k, v, want_o, want_lse, d_out, causal=True)
    def once():
        o, lse = ctx.forward(q, k, v, causal=True)
        return (o, lse) + tuple(ctx.backward(q, k, v, o, lse, d_out, causal=True))

    results = in_threads(once, threads=4, each=5)
    for r in results:
        for got, want in zip(r, (want_o, want_lse) + tuple(want_g)):
            assert np.array_equal(got, want)


def test_calls_release_the_gil():
    # While one thread is inside a long clattn call, another keeps running
    # Python at most of the rate it runs while the first sleeps. A held GIL
    # would let it run only in the switch intervals between calls: with
    # calls of a tenth of a second, a small share of that rate.
    ctx = clattn.Context(device="native", threads=1)
    q, k, v, _ = tensors(1, 2048, 2048, 4, 4, 64)  # about 0.1 s a call
    ctx.forward(q, k, v)
    done = threading.Event()
    count = [0]

    def spin():
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.1)
    c1, t1 = count[0], time.perf_counter()
    for _ in range(3):
        ctx.forward(q, k, v)
    c2, t2 = count[0], time.perf_counter()
    done.set()
    t.join()
    free, during = (c1 - c0) / (t1 - t0), (c2 - c1) / (t2 - t1)
    assert during > 0.4 * free, (free, during)
