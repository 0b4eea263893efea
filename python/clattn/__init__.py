"""clattn: attention training kernels (OpenCL, or plain C) for numpy and
PyTorch.

The numpy API mirrors the C library: tensors in clattn's layout (batch,
seq, heads, head_dim), or (total, heads, head_dim) with cu_seqlens; the
LSE as float32 (m, l) pairs of shape (..., heads, 2).

    import numpy as np, clattn
    q = np.random.randn(2, 128, 8, 64).astype(np.float32)
    k = v = np.random.randn(2, 128, 2, 64).astype(np.float32)
    o, lse = clattn.forward(q, k, v, causal=True)

PyTorch users want `clattn.torch.scaled_dot_product_attention` and
`clattn.flash_attn_func` / `clattn.flash_attn_varlen_func`, imported on
first use so that importing clattn needs numpy alone.
"""
import os
import threading

import numpy as np

__version__ = "0.1.0"

from . import _call, _lib  # noqa: E402
from ._lib import Error, InvalidArgument  # noqa: E402

__all__ = ["Context", "Error", "InvalidArgument", "devices", "default_context", "forward",
           "backward", "grad_q", "grad_k", "grad_v", "grad_sinks", "merge", "dropout_mask",
           "variants", "library_version", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]

_lib._version_matches()


def library_version():
    """The loaded libclattn's version, "MAJOR.MINOR.PATCH"."""
    return _lib.lib.clattn_version().decode()


def devices():
    """Every device clattn can run on: each OpenCL device, then native. Each
    is a dict with backend, platform, name, and the selector that picks it
    (for Context(device=...) and CLATTN_DEVICE)."""
    count = _lib.ctypes.c_size_t(0)
    _lib.check(_lib.lib.clattn_list_devices(None, 0, _lib.ctypes.byref(count)),
               "clattn_list_devices")
    infos = (_lib.DeviceInfo * max(count.value, 1))()
    capacity = count.value
    _lib.check(_lib.lib.clattn_list_devices(infos, capacity, _lib.ctypes.byref(count)),
               "clattn_list_devices")
    out = []
    for d in infos[:min(capacity, count.value)]:
        native = d.platform_index < 0
        out.append({
            "backend": _lib.BACKENDS.get(d.backend, "unknown"),
            "platform": d.platform.decode(errors="replace"),
            "name": d.name.decode(errors="replace"),
            "platform_index": d.platform_index,
            "device_index": d.device_index,
            "selector": "native" if native else f"{d.platform_index}:{d.device_index}",
        })
    return out


def variants(backend):
    """The kernel variants a backend ("opencl-gpu", "opencl-cpu", "native")
    offers, its default first."""
    codes = {v: k for k, v in _lib.BACKENDS.items()}
    if backend not in codes or backend == "auto":
        raise InvalidArgument(f"backend must be one of opencl-gpu, opencl-cpu, native, "
                              f"not {backend!r}")
    names, i = [], 0
    while True:
        n = _lib.lib.clattn_variant_name(codes[backend], i)
        if not n:
            return names
        names.append(n.decode())
        i += 1


# False and True are also the keys 0 and 1 (the C values), as Python hashes them.
_CAUSAL = {False: 0, None: 0, True: _lib.CAUSAL_TOP_LEFT, "top-left": _lib.CAUSAL_TOP_LEFT,
           "top_left": _lib.CAUSAL_TOP_LEFT, 2: _lib.CAUSAL_BOTTOM_RIGHT,
           "bottom-right": _lib.CAUSAL_BOTTOM_RIGHT, "bottom_right": _lib.CAUSAL_BOTTOM_RIGHT}


def _causal(value):
    try:
        return _CAUSAL[value]
    except (KeyError, TypeError):
        raise InvalidArgument(f"causal must be False, True (top-left), 'top-left' or "
                              f"'bottom-right', not {value!r}") from None


_DTYPE_NAMES = {"f32": _lib.DTYPE_F32, "float32": _lib.DTYPE_F32, "f16": _lib.DTYPE_F16,
                "float16": _lib.DTYPE_F16, "bf16": _lib.DTYPE_BF16,
                "bfloat16": _lib.DTYPE_BF16}


def _dtype_of(named, dtype):
    """The clattn dtype of these arrays, which must all have one numpy dtype:
    float32, float16, ml_dtypes' bfloat16, or uint16 bit patterns with
    dtype="bf16" (or "f16")."""
    kinds = {a.dtype for a in named.values()}
    if len(kinds) != 1:
        listed = ", ".join(f"{n} {a.dtype}" for n, a in named.items())
        raise TypeError(f"clattn: the tensors must share one dtype, not {listed}")
    np_dtype = kinds.pop()
    want = None
    if dtype is not None:
        if str(dtype) not in _DTYPE_NAMES:
            raise InvalidArgument(f"dtype must be one of f32, f16, bf16, not {dtype!r}")
        want = _DTYPE_NAMES[str(dtype)]
    if np_dtype == np.float32:
        have = _lib.DTYPE_F32
    elif np_dtype == np.float16:
        have = _lib.DTYPE_F16
    elif np_dtype.name == "bfloat16":
        have = _lib.DTYPE_BF16
    elif np_dtype == np.uint16:
        if want not in (_lib.DTYPE_F16, _lib.DTYPE_BF16):
            raise TypeError("clattn: uint16 arrays are 16-bit bit patterns: say which with "
                            "dtype='bf16' or dtype='f16'")
        return want
    else:
        raise TypeError(f"clattn: tensors must be float32, float16, bfloat16 or uint16 bit "
                        f"patterns, not {np_dtype}")
    if want is not None and want != have:
        raise TypeError(f"clattn: dtype={dtype!r} but the arrays are {np_dtype}")
    return have


def _input(name, a):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"clattn: {name} must be a numpy array, not {type(a).__name__}")
    return np.ascontiguousarray(a)


def _output(name, a, shape, np_dtype):
    """A caller's output array: written in place, so it must already be
    right; nothing is copied."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"clattn: {name} must be a numpy array, not {type(a).__name__}")
    if a.shape != tuple(shape) or a.dtype != np_dtype:
        raise InvalidArgument(f"{name} must be {np_dtype} of shape {tuple(shape)}, not "
                              f"{a.dtype} of shape {a.shape}")
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise InvalidArgument(f"{name} must be C-contiguous and writeable: it is written in "
                              "place")
    return a


def _per_head(name, values, heads):
    """One float32 value a query head, C-contiguous, or None for None."""
    if values is None:
        return None
    a = np.ascontiguousarray(values, dtype=np.float32)
    if a.shape != (heads,):
        raise InvalidArgument(f"{name} must be float32 of shape ({heads},), not {a.shape}")
    return a


class _Tensors:
    """The arrays of one call, checked against each other, and the Problem
    they describe."""

    def __init__(self, q, k, lse=None, v=None, extra=(), *, dtype=None, causal=False,
                 window=0, window_right=0, scale=None, q_offset=0, kv_offset=0, softcap=0.0,
                 alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, cu_seqlens_q=None,
                 cu_seqlens_kv=None, accumulate=False, sinks=None):
        named = {"q": _input("q", q), "k": _input("k", k)}
        if v is not None:
            named["v"] = _input("v", v)
        for n, a in extra:
            named[n] = _input(n, a)
        self.dtype = _dtype_of(named, dtype)
        self.np_dtype = named["q"].dtype
        self.a = named
        q, k = named["q"], named["k"]
        packed = cu_seqlens_q is not None or cu_seqlens_kv is not None
        if packed and (cu_seqlens_q is None or cu_seqlens_kv is None):
            raise InvalidArgument("cu_seqlens_q and cu_seqlens_kv go together")
        rank = 3 if packed else 4
        layout = "(total, heads, head_dim)" if packed else "(batch, seq, heads, head_dim)"
        for n, a in named.items():
            if a.ndim != rank:
                raise InvalidArgument(f"{n} must be {layout}, not of shape {a.shape}")
        if packed:
            B = None
            Sq, H, D = q.shape
            Sk, Hk, Dk = k.shape
        else:
            B, Sq, H, D = q.shape
            Bk, Sk, Hk, Dk = k.shape
            if Bk != B:
                raise InvalidArgument(f"q and k must have one batch: {q.shape}, {k.shape}")
        if Dk != D:
            raise InvalidArgument(f"q and k must have one head_dim: {q.shape}, {k.shape}")
        if v is not None and named["v"].shape != k.shape:
            raise InvalidArgument(f"v must have k's shape {k.shape}, not {named['v'].shape}")
        for n, a in extra:
            want = k.shape if n in ("dk", "dv") else q.shape
            if named[n].shape != want:
                raise InvalidArgument(f"{n} must have shape {want}, not {named[n].shape}")
        if Hk == 0 or H % Hk:
            raise InvalidArgument(f"num_heads {H} must be a multiple of num_kv_heads {Hk}")
        self.q_shape, self.kv_shape = q.shape, k.shape
        self.lse_shape = q.shape[:-1] + (2,)
        if lse is not None:
            if not isinstance(lse, np.ndarray):
                raise TypeError(f"clattn: lse must be a numpy array, not {type(lse).__name__}")
            if lse.dtype != np.float32 or lse.shape != self.lse_shape:
                raise InvalidArgument(f"lse must be float32 of shape {self.lse_shape}, not "
                                      f"{lse.dtype} of shape {lse.shape}")
            self.lse = np.ascontiguousarray(lse)
        cu_q = cu_kv = None
        batch = B
        if packed:
            cu_q = _call.seqlens("cu_seqlens_q", cu_seqlens_q, Sq)
            cu_kv = _call.seqlens("cu_seqlens_kv", cu_seqlens_kv, Sk)
            if cu_q.size != cu_kv.size:
                raise InvalidArgument(f"cu_seqlens_q has {cu_q.size} entries and "
                                      f"cu_seqlens_kv {cu_kv.size}: one batch")
            batch = cu_q.size - 1
        slopes = _per_head("alibi_slopes", alibi_slopes, H)
        sink_logits = _per_head("sinks", sinks, H)
        if window_right and not causal:
            raise InvalidArgument(f"window_right {window_right!r} needs causal, which aligns it")
        self.problem = _call.Problem(
            batch=batch, q_seq=Sq, kv_seq=Sk, num_heads=H, num_kv_heads=Hk, head_dim=D,
            dtype=self.dtype, causal=_causal(causal), window=window,
            window_right=window_right if causal else None, scale=scale,
            q_offset=q_offset, kv_offset=kv_offset, softcap=softcap, alibi_slopes=slopes,
            dropout_p=dropout_p, seed=seed, offset=offset, cu_seqlens_q=cu_q,
            cu_seqlens_kv=cu_kv, accumulate=accumulate, sinks=sink_logits)

    def addr(self, name):
        return self.a[name].ctypes.data

    def new(self, shape):
        return np.empty(shape, dtype=self.np_dtype)


class Context:
    """A device and its built kernels: clattn_context_create.

    device: a selector ("auto", "gpu", "cpu", "native", "P:D" or part of a
    device's name; None: CLATTN_DEVICE, else auto). variant: a kernel
    variant by name (None: the device's default). threads: the native
    backend's threads (None: CLATTN_NUM_THREADS, else every CPU).

    A context may be shared by threads; their calls take turns, with the GIL
    released. close() (or leaving a `with` block) releases it; no call may
    then be in flight."""

    def __init__(self, device=None, variant=None, threads=None):
        o = _lib.lib.clattn_options_default()
        if device is not None:
            if not isinstance(device, str):
                raise TypeError(f"clattn: device must be a str selector, not "
                                f"{type(device).__name__}")
            o.device = device.encode()
        if variant is not None:
            if not isinstance(variant, str):
                raise TypeError(f"clattn: variant must be a str, not {type(variant).__name__}")
            o.variant = variant.encode()
        if threads is not None:
            if isinstance(threads, bool) or int(threads) != threads or not 0 <= threads < 1 << 31:
                raise InvalidArgument(f"threads must be a non-negative int, not {threads!r}")
            o.num_threads = int(threads)
        handle = _lib.ctypes.c_void_p()
        _lib.check(_lib.lib.clattn_context_create(_lib.ctypes.byref(o),
                                                  _lib.ctypes.byref(handle)),
                   "clattn_context_create")
        self._handle = handle

    @property
    def handle(self):
        if self._handle is None:
            raise Error("clattn: this context is closed")
        return self._handle

    def close(self):
        h, self._handle = getattr(self, "_handle", None), None
        if h is not None:
            _lib.lib.clattn_context_destroy(h)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _text(self, fn):
        return fn(self.handle).decode(errors="replace")

    @property
    def device(self):
        """A one-line description of the backend and device."""
        return self._text(_lib.lib.clattn_context_device)

    @property
    def backend(self):
        """"opencl-gpu", "opencl-cpu" or "native"."""
        return _lib.BACKENDS[_lib.lib.clattn_context_backend(self.handle)]

    @property
    def variant(self):
        return self._text(_lib.lib.clattn_context_variant)

    @property
    def kernels(self):
        """The kernels the last successful op ran, comma-separated."""
        return self._text(_lib.lib.clattn_context_kernels)

    @property
    def log(self):
        """What creation tried before settling, and the tuning file's use."""
        return self._text(_lib.lib.clattn_context_log)

    def __repr__(self):
        return f"clattn.Context({self.device!r}, variant={self.variant!r})" \
            if self._handle is not None else "clattn.Context(closed)"

    # The ops. Keywords, as clattn_shape has them: causal (False, True or
    # "top-left", "bottom-right"), window, window_right, scale, q_offset, kv_offset,
    # softcap, alibi_slopes, dropout_p, seed, offset, cu_seqlens_q,
    # cu_seqlens_kv, sinks (float32, one logit a query head: the forward's),
    # and dtype for uint16 arrays.

    def forward(self, q, k, v, **opts):
        """O and the LSE pairs: returns (o, lse), o like q, lse float32 of
        shape q.shape[:-1] + (2,)."""
        t = _Tensors(q, k, v=v, **opts)
        o, lse = t.new(t.q_shape), np.empty(t.lse_shape, np.float32)
        _call.run(self.handle, "forward", t.problem, t.addr("q"), t.addr("k"), t.addr("v"),
                  o.ctypes.data, lse.ctypes.data)
        return o, lse

    def _grads(self, op, names, q, k, v, o, lse, d_out, outs, accumulate, opts):
        t = _Tensors(q, k, lse=lse, v=v, extra=(("o", o), ("d_out", d_out)),
                     accumulate=accumulate, **opts)
        arrays = []
        for n in names:
            shape = t.kv_shape if n in ("dk", "dv") else t.q_shape
            given = outs.get(n)
            if given is None:
                if accumulate:
                    raise InvalidArgument(f"accumulate=True adds into {n}: pass it")
                given = t.new(shape)
            arrays.append(_output(n, given, shape, t.np_dtype))
        _call.run(self.handle, op, t.problem, t.addr("q"), t.addr("k"), t.addr("v"),
                  t.addr("o"), t.lse.ctypes.data, t.addr("d_out"),
                  *(a.ctypes.data for a in arrays))
        return arrays

    def backward(self, q, k, v, o, lse, d_out, *, dq=None, dk=None, dv=None,
                 accumulate=False, **opts):
        """(dq, dk, dv) from the forward's o and lse and the output gradient.
        Given dq, dk and dv are written in place (added to with
        accumulate=True) and returned."""
        return tuple(self._grads("backward", ("dq", "dk", "dv"), q, k, v, o, lse, d_out,
                                 {"dq": dq, "dk": dk, "dv": dv}, accumulate, opts))

    def grad_sinks(self, q, k, v, o, lse, d_out, *, sinks, d_sinks=None, accumulate=False,
                   **opts):
        """The sinks' gradient, float32 (heads,): -sum over each head's
        rows of exp(sink - L) (d_out . o), from the forward (with these
        sinks) and its output gradient. A given d_sinks is written in place
        (added to with accumulate=True) and returned."""
        t = _Tensors(q, k, lse=lse, v=v, extra=(("o", o), ("d_out", d_out)),
                     accumulate=accumulate, sinks=sinks, **opts)
        H = t.q_shape[-2]
        if d_sinks is None:
            if accumulate:
                raise InvalidArgument("accumulate=True adds into d_sinks: pass it")
            d_sinks = np.empty(H, np.float32)
        d_sinks = _output("d_sinks", d_sinks, (H,), np.dtype(np.float32))
        _call.grad_sinks(self.handle, t.problem, t.addr("o"), t.lse.ctypes.data,
                         t.addr("d_out"), d_sinks.ctypes.data)
        return d_sinks

    def grad_q(self, q, k, v, o, lse, d_out, *, dq=None, accumulate=False, **opts):
        """dq alone, as backward computes it."""
        return self._grads("grad_q", ("dq",), q, k, v, o, lse, d_out, {"dq": dq},
                           accumulate, opts)[0]

    def grad_k(self, q, k, v, o, lse, d_out, *, dk=None, accumulate=False, **opts):
        """dk alone, as backward computes it."""
        return self._grads("grad_k", ("dk",), q, k, v, o, lse, d_out, {"dk": dk},
                           accumulate, opts)[0]

    def grad_v(self, q, k, lse, d_out, *, dv=None, accumulate=False, **opts):
        """dv alone, from Q, K, the LSE and dO (the seed's kernel)."""
        t = _Tensors(q, k, lse=lse, extra=(("d_out", d_out),), accumulate=accumulate, **opts)
        if dv is None:
            if accumulate:
                raise InvalidArgument("accumulate=True adds into dv: pass it")
            dv = t.new(t.kv_shape)
        dv = _output("dv", dv, t.kv_shape, t.np_dtype)
        _call.run(self.handle, "grad_v", t.problem, t.addr("d_out"), t.addr("q"), t.addr("k"),
                  t.lse.ctypes.data, dv.ctypes.data)
        return dv

    def merge(self, o1, lse1, o2, lse2, *, dtype=None):
        """Merges two forwards of the same queries over disjoint keys into
        the forward over their union: returns (o, lse)."""
        named = {"o1": _input("o1", o1), "o2": _input("o2", o2)}
        dt = _dtype_of(named, dtype)
        a1, a2 = named["o1"], named["o2"]
        if a1.shape != a2.shape or a1.ndim not in (3, 4):
            raise InvalidArgument(f"o1 and o2 must share a shape (batch, seq, heads, head_dim) "
                                  f"or (total, heads, head_dim): {a1.shape}, {a2.shape}")
        want = a1.shape[:-1] + (2,)
        pairs = []
        for n, lse in (("lse1", lse1), ("lse2", lse2)):
            if not isinstance(lse, np.ndarray) or lse.dtype != np.float32 or lse.shape != want:
                raise InvalidArgument(f"{n} must be a float32 array of shape {want}")
            pairs.append(np.ascontiguousarray(lse))
        shape4 = a1.shape if a1.ndim == 4 else (1,) + a1.shape
        p = _call.Problem(batch=shape4[0], q_seq=shape4[1], kv_seq=shape4[1],
                          num_heads=shape4[2], num_kv_heads=shape4[2], head_dim=shape4[3],
                          dtype=dt)
        s, keep = p.shape()
        o, lse = np.empty_like(a1), np.empty(want, np.float32)
        st = _lib.lib.clattn_merge(self.handle, _lib.ctypes.byref(s), a1.ctypes.data,
                                   pairs[0].ctypes.data, a2.ctypes.data, pairs[1].ctypes.data,
                                   o.ctypes.data, lse.ctypes.data)
        _lib.check(st, "clattn_merge")
        return o, lse


_default = None
_default_lock = threading.Lock()


def default_context():
    """The context the module-level functions use, made on first use from
    CLATTN_DEVICE (else auto), CLATTN_VARIANT and CLATTN_NUM_THREADS."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Context(variant=os.environ.get("CLATTN_VARIANT") or None)
        return _default


def _module_op(name):
    def op(*args, context=None, **kwargs):
        return getattr(context or default_context(), name)(*args, **kwargs)
    op.__name__ = name
    op.__doc__ = getattr(Context, name).__doc__ + \
        "\n\nRuns on `context`, or on default_context()."
    return op


forward = _module_op("forward")
backward = _module_op("backward")
grad_q = _module_op("grad_q")
grad_k = _module_op("grad_k")
grad_v = _module_op("grad_v")
grad_sinks = _module_op("grad_sinks")
merge = _module_op("merge")


def dropout_mask(*, q_seq, kv_seq, num_heads, dropout_p, seed, offset=0, batch=1,
                 causal=False, q_offset=0, kv_offset=0, cu_seqlens_q=None,
                 cu_seqlens_kv=None, b=None, head=None):
    """The dropout mask clattn draws for these arguments: 1 where (query
    row, key) is kept, 0 where dropped; visibility is not applied.

    With b and head: uint8 (q_len, kv_len) of that batch element (or packed
    sequence) and query head. Without: uint8 (batch, num_heads, q_seq,
    kv_seq), or for packed sequences a list of (num_heads, q_len, kv_len)."""
    cu_q = cu_kv = None
    if cu_seqlens_q is not None or cu_seqlens_kv is not None:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise InvalidArgument("cu_seqlens_q and cu_seqlens_kv go together")
        cu_q = _call.seqlens("cu_seqlens_q", cu_seqlens_q, q_seq)
        cu_kv = _call.seqlens("cu_seqlens_kv", cu_seqlens_kv, kv_seq)
        batch = cu_q.size - 1
    p = _call.Problem(batch=batch, q_seq=q_seq, kv_seq=kv_seq, num_heads=num_heads,
                      num_kv_heads=1, head_dim=1, dtype=_lib.DTYPE_F32,
                      causal=_causal(causal), q_offset=q_offset, kv_offset=kv_offset,
                      dropout_p=dropout_p, seed=seed, offset=offset, cu_seqlens_q=cu_q,
                      cu_seqlens_kv=cu_kv)
    if (b is None) != (head is None):
        raise InvalidArgument("b and head go together")
    if b is not None:
        b, head = _call._u32("b", b), _call._u32("head", head)
        if b >= p.batch or head >= num_heads:
            raise InvalidArgument(f"b {b} and head {head} must be below batch {p.batch} and "
                                  f"num_heads {num_heads}")
    masks = _call.dropout_keep(p)
    if b is not None:
        return masks[b][head]
    return masks if cu_q is not None else np.stack(masks)


_LAZY = {"flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
         "flash_attn_kvpacked_func"}


def __getattr__(name):
    # torch is optional: clattn.torch and the FlashAttention functions load
    # it on first use.
    import importlib
    if name == "torch":
        return importlib.import_module(".torch", __name__)
    if name == "flash_attn" or name in _LAZY:
        fa = importlib.import_module(".flash_attn", __name__)
        return fa if name == "flash_attn" else getattr(fa, name)
    raise AttributeError(f"module 'clattn' has no attribute {name!r}")
