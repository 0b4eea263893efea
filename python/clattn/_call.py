"""One attention problem and its calls into libclattn, on raw addresses.

Both front ends (the numpy API and the torch ops) describe a problem as a
Problem and hand it host addresses; this module builds the clattn_shape,
runs the C call, and maps the one alignment the C shape cannot spell: the
queries' positions moved to the bottom right (FlashAttention's) without a
causal mask, which window and ALiBi see. Where packed sequences differ in
kv_len - q_len, or ALiBi slopes differ per batch element, it runs one call
per element instead.
"""
import ctypes

import numpy as np

from . import _lib
from ._lib import InvalidArgument

ELEMENT_SIZE = {_lib.DTYPE_F32: 4, _lib.DTYPE_F16: 2, _lib.DTYPE_BF16: 2}
U32 = 0xFFFFFFFF


def _u32(name, value):
    if isinstance(value, bool) or int(value) != value or not 0 <= int(value) <= U32:
        raise InvalidArgument(f"{name} must be an integer in [0, 2^32), not {value!r}")
    return int(value)


def _u64(name, value):
    if isinstance(value, bool) or int(value) != value or not 0 <= int(value) < 1 << 64:
        raise InvalidArgument(f"{name} must be an integer in [0, 2^64), not {value!r}")
    return int(value)


def seqlens(name, cu, rows):
    """A cu_seqlens array as uint32 prefix sums, checked as the C library
    checks them, so that the message names the Python argument."""
    a = np.asarray(cu)
    if a.ndim != 1 or a.size < 2:
        raise InvalidArgument(f"{name} must be 1-D with batch + 1 >= 2 entries, not of "
                              f"shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise InvalidArgument(f"{name} must hold integers, not {a.dtype}")
    v = a.astype(np.int64)
    if v[0] != 0 or np.any(np.diff(v) < 0) or v[-1] > rows:
        raise InvalidArgument(f"{name} must rise from 0 without decreasing to at most {rows} "
                              f"rows: {v.tolist() if v.size <= 16 else v}")
    return np.ascontiguousarray(v, dtype=np.uint32)


class Problem:
    """What one attention call computes, in the C library's terms plus
    `align_bottom_right`, which moves the queries by kv_len - q_len (per
    sequence) for window and ALiBi without a causal mask."""

    def __init__(self, *, batch, q_seq, kv_seq, num_heads, num_kv_heads, head_dim, dtype,
                 causal=0, window=0, scale=None, q_offset=0, kv_offset=0, softcap=0.0,
                 alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, cu_seqlens_q=None,
                 cu_seqlens_kv=None, align_bottom_right=False, accumulate=False,
                 window_right=None, sinks=None, functions=None, score_params=None,
                 bias=None, bool_mask=None, bias_dtype=0):
        self.batch, self.q_seq, self.kv_seq = batch, q_seq, kv_seq
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype
        if causal not in (0, _lib.CAUSAL_TOP_LEFT, _lib.CAUSAL_BOTTOM_RIGHT):
            raise InvalidArgument(f"causal must be 0, 1 or 2, not {causal!r}")
        # A window's right side (FlashAttention's window_size[1] >= 0) is the
        # shape's window_right over a causal mask, aligned as the window is
        # where no causal mask is asked for.
        self.window_right = 0
        if window_right is not None and int(window_right) >= 0:
            if not causal:
                causal = _lib.CAUSAL_BOTTOM_RIGHT if align_bottom_right else _lib.CAUSAL_TOP_LEFT
            self.window_right = _u32("window_right", window_right)
        self.causal = causal
        self.window = _u32("window", window)
        if scale is None:
            scale = 0.0
        scale = float(scale)
        if not (scale >= 0.0) or scale == float("inf"):
            raise InvalidArgument(f"scale must be finite and positive, not {scale!r}")
        self.scale = scale
        self.q_offset = _u32("q_offset", q_offset)
        self.kv_offset = _u32("kv_offset", kv_offset)
        self.softcap = float(softcap)
        self.dropout_p = float(dropout_p)
        self.seed = _u64("seed", seed)
        self.offset = _u64("offset", offset)
        # alibi_slopes: float32 (num_heads,) or (batch, num_heads), C-contiguous.
        self.alibi = alibi_slopes
        # sinks: float32 (num_heads,), C-contiguous: the forward's logits.
        self.sinks = sinks
        # functions: a _functions.Functions, or None; score_params: float32
        # (n,), C-contiguous, or None.
        self.functions = functions if functions else None
        self.score_params = score_params
        # bias: float32, or 16-bit bits (uint16) of bias_dtype, (bias_batch,
        # bias_heads, q_seq, kv_seq), C-contiguous, each of the first two 1 or
        # the whole; bool_mask: uint8 alike.
        self.bias, self.bool_mask, self.bias_dtype = bias, bool_mask, bias_dtype
        self.cu_q, self.cu_kv = cu_seqlens_q, cu_seqlens_kv
        self.align_bottom_right = bool(align_bottom_right) and causal == 0
        self.accumulate = bool(accumulate)
        self.es = ELEMENT_SIZE[dtype]
        self.native = False

    @property
    def packed(self):
        return self.cu_q is not None

    def elements(self):
        """(q_start, q_len, kv_start, kv_len) of each batch element or sequence."""
        if self.packed:
            q, kv = self.cu_q.astype(np.int64), self.cu_kv.astype(np.int64)
            return [(int(q[i]), int(q[i + 1] - q[i]), int(kv[i]), int(kv[i + 1] - kv[i]))
                    for i in range(len(q) - 1)]
        return [(b * self.q_seq, self.q_seq, b * self.kv_seq, self.kv_seq)
                for b in range(self.batch)]

    def shape(self):
        s = _lib.lib.clattn_shape_default()
        s.batch, s.q_seq, s.kv_seq = self.batch, self.q_seq, self.kv_seq
        s.num_heads, s.num_kv_heads, s.head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        s.causal, s.window, s.scale, s.dtype = self.causal, self.window, self.scale, self.dtype
        s.window_right = self.window_right
        s.q_offset, s.kv_offset = self.q_offset, self.kv_offset
        s.softcap, s.dropout_p = self.softcap, self.dropout_p
        s.dropout_seed, s.dropout_offset = self.seed, self.offset
        keep = []
        if self.packed:
            s.cu_seqlens_q = self.cu_q.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
            s.cu_seqlens_kv = self.cu_kv.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
            keep += [self.cu_q, self.cu_kv]
        if self.alibi is not None:
            s.alibi_slopes = ctypes.cast(self.alibi_address(0), ctypes.POINTER(ctypes.c_float))
        if self.sinks is not None:
            s.sinks = self.sinks.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        f = self.functions
        if f is not None:
            s.score_fn, s.mask_fn = f.score_bytes, f.mask_bytes
            if self.native:
                (s.score_native, s.score_ds_native, s.score_span_native,
                 s.mask_native) = f.native()
                s.score_dp_native = f.dp_native()
        if self.score_params is not None and self.score_params.size:
            s.score_params = self.score_params.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            s.score_params_count = self.score_params.size
            keep.append(self.score_params)
        if self.bias is not None:
            s.bias, s.bias_dtype = self.bias.ctypes.data, self.bias_dtype
        if self.bool_mask is not None:
            s.bool_mask = self.bool_mask.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        for t in (self.bias, self.bool_mask):
            if t is not None:
                s.bias_batch, s.bias_heads = t.shape[0], t.shape[1]
                keep.append(t)
        return s, keep

    def bias_per_element(self):
        """Whether the bias or bool mask has a batch dimension."""
        t = self.bias if self.bias is not None else self.bool_mask
        return t is not None and t.shape[0] > 1

    def alibi_address(self, element):
        a = self.alibi
        if a.ndim == 2:
            return a.ctypes.data + element * a.shape[1] * 4
        return a.ctypes.data

    def _shift(self, q_len, kv_len):
        """The offsets that move the queries by kv_len - q_len."""
        d = kv_len - q_len
        return (self.q_offset + d, self.kv_offset) if d >= 0 else (self.q_offset,
                                                                   self.kv_offset - d)

    def plan(self):
        """("one", problem) for a single call, or ("each", elements) for one
        call per batch element or sequence, (q_start, q_len, kv_start,
        kv_len) each."""
        els = self.elements()
        per_batch_alibi = (self.alibi is not None and self.alibi.ndim == 2
                           and not np.all(self.alibi == self.alibi[:1]))
        if not self.align_bottom_right and not per_batch_alibi:
            return "one", self
        if not per_batch_alibi:
            diffs = {kl - ql for (_, ql, _, kl) in els}
            if len(diffs) <= 1:
                one = self._copy()
                if diffs:
                    one.q_offset, one.kv_offset = self._shift(els[0][1], els[0][3])
                one.align_bottom_right = False
                return "one", one
            if not (self.window or self.alibi is not None):
                # Alignment moves nothing but the dropout draw's positions.
                return "one", self
        if self.dropout_p > 0.0:
            raise NotImplementedError(
                "dropout_p with ALiBi slopes that differ per batch element, or with "
                "bottom-right aligned window or ALiBi over sequences whose kv_len - q_len "
                "differ: clattn would run them one by one, and its dropout mask depends on "
                "the batch index")
        return "each", els

    def _copy(self):
        p = Problem.__new__(Problem)
        p.__dict__.update(self.__dict__)
        return p

    def _element(self, i, q_len, kv_len):
        p = self._copy()
        p.batch, p.q_seq, p.kv_seq = 1, q_len, kv_len
        p.cu_q = p.cu_kv = None
        if self.alibi is not None and self.alibi.ndim == 2:
            p.alibi = self.alibi[i]
        if self.bias_per_element():
            p.bias = self.bias[i:i + 1] if self.bias is not None else None
            p.bool_mask = self.bool_mask[i:i + 1] if self.bool_mask is not None else None
        if self.align_bottom_right:
            p.q_offset, p.kv_offset = self._shift(q_len, kv_len)
        p.align_bottom_right = False
        return p

    # Row strides in bytes.
    def q_row(self):
        return self.num_heads * self.head_dim * self.es

    def kv_row(self):
        return self.num_kv_heads * self.head_dim * self.es

    def lse_row(self):
        return self.num_heads * 2 * 4


# Each op: which arguments are query-side rows (q, o, d_out, dq), key-side
# rows (k, v, dk, dv) and LSE rows, and which are outputs.
_OPS = {
    "forward": ("qkvOL", "clattn_forward"),
    "backward": ("qkvolgQKV", "clattn_backward"),
    "grad_q": ("qkvolgQ", "clattn_grad_q"),
    "grad_k": ("qkvolgK", "clattn_grad_k"),
    "grad_v": ("gqklV", "clattn_grad_v"),
}
_QUERY_SIDE, _KEY_SIDE, _LSE = set("qogOQ"), set("kvKV"), set("lL")


def run(ctx, op, problem, *addresses):
    """Runs op on ctx with the tensors at these host addresses, in the C
    call's argument order."""
    roles, cname = _OPS[op]
    how, plan = problem.plan()
    if how == "one":
        _one(ctx, cname, plan, addresses)
        return
    accumulate = problem.accumulate
    for i, (qs, ql, ks, kl) in enumerate(plan):
        e = problem._element(i, ql, kl)
        moved = []
        for role, a in zip(roles, addresses):
            if role in _QUERY_SIDE:
                moved.append(a + qs * problem.q_row())
            elif role in _KEY_SIDE:
                moved.append(a + ks * problem.kv_row())
            else:
                moved.append(a + qs * problem.lse_row())
        if ql == 0 or kl == 0:
            _empty_element(roles, moved, e, accumulate)
            continue
        _one(ctx, cname, e, moved)


def _empty_element(roles, moved, e, accumulate):
    """What an element with no queries or no keys gives: its query rows see
    no key (O = 0, LSE (-1e30, -1e30), dQ = 0), and its keys get no
    gradient."""
    for role, a in zip(roles, moved):
        if role == "O" or (role == "Q" and not accumulate):
            ctypes.memset(a, 0, e.q_seq * e.q_row())
        elif role == "L":
            pairs = np.full(e.q_seq * e.num_heads * 2, -1e30, dtype=np.float32)
            ctypes.memmove(a, pairs.ctypes.data, pairs.nbytes)
        elif role in "KV" and not accumulate:
            ctypes.memset(a, 0, e.kv_seq * e.kv_row())


def _native(ctx, problem):
    """Whether the problem's functions need their C forms: ctx is native."""
    problem.native = problem.functions is not None and \
        _lib.lib.clattn_context_backend(ctx) == _lib.BACKEND_NATIVE


def _one(ctx, cname, problem, addresses):
    _native(ctx, problem)
    shape, keep = problem.shape()
    shape.accumulate = 1 if problem.accumulate else 0
    fn = getattr(_lib.lib, cname)
    status = fn(ctx, ctypes.byref(shape), *addresses)
    del keep
    _lib.check(status, cname, problem.functions is not None)


def grad_sinks(ctx, problem, o, lse, d_out, out):
    """The sinks' gradient into the float32 array at address out
    (num_heads), from the forward's O and LSE and dO at these addresses:
    one host pass over every row, whatever the plan."""
    _native(ctx, problem)
    shape, keep = problem.shape()
    shape.accumulate = 1 if problem.accumulate else 0
    status = _lib.lib.clattn_grad_sinks(ctx, ctypes.byref(shape), o, lse, d_out, out)
    del keep
    _lib.check(status, "clattn_grad_sinks")


def _grad_calls(problem, q, k, v, o, lse, d_out):
    """The calls a gradient over the pairs makes for the problem's plan:
    (index, problem, the addresses of q, k, v, o, lse and d_out) for the one
    call, or for each element where the plan runs them apart."""
    how, plan = problem.plan()
    if how != "each":
        return [(0, plan, (q, k, v, o, lse, d_out))]
    return [(i, problem._element(i, ql, kl),
             (q + qs * problem.q_row(), k + ks * problem.kv_row(), v + ks * problem.kv_row(),
              o + qs * problem.q_row(), lse + qs * problem.lse_row(),
              d_out + qs * problem.q_row()))
            for i, (qs, ql, ks, kl) in enumerate(plan)]


def grad_bias(ctx, problem, q, k, v, o, lse, d_out, out):
    """The bias's gradient into the float32 array at address out (the
    bias's shape), from the call's tensors at these addresses; where the
    plan runs each element apart, each adds its share (or writes its
    slice, where the bias has a batch dimension)."""
    calls = _grad_calls(problem, q, k, v, o, lse, d_out)
    per = len(calls) > 1 and problem.bias_per_element()
    # the bytes of one element's slice, where each writes its own
    rows = problem.q_seq * problem.kv_seq * 4 * (
        problem.bias if problem.bias is not None else problem.bool_mask).shape[1] if per else 0
    for i, e, at in calls:
        dst = out + i * rows
        accumulate = problem.accumulate or (not per and i > 0)
        _native(ctx, e)
        shape, keep = e.shape()
        shape.accumulate = 1 if accumulate else 0
        status = _lib.lib.clattn_grad_bias(ctx, ctypes.byref(shape), *at, dst)
        del keep
        _lib.check(status, "clattn_grad_bias")


def grad_score_params(ctx, problem, q, k, v, o, lse, d_out, out):
    """The score function's parameters' gradient into the float32 array at
    address out (one a parameter), from the call's tensors at these
    addresses: on a GPU's device through score_mod's clattn_score_dp, else
    on the host through the functions' C forms (which the shape carries for
    any backend); where the plan runs each element apart, each adds its
    share."""
    for i, e, at in _grad_calls(problem, q, k, v, o, lse, d_out):
        e.native = e.functions is not None  # the C forms, for the host where it runs it
        shape, keep = e.shape()
        if e.native and not shape.score_dp_native:
            raise InvalidArgument("score_params' gradient needs clattn_score_dp, the score "
                                  "function's derivative in its parameters, in score_mod "
                                  "(docs/programmable.md)")
        shape.accumulate = 1 if problem.accumulate or i > 0 else 0
        status = _lib.lib.clattn_grad_score_params(ctx, ctypes.byref(shape), *at, out)
        del keep
        _lib.check(status, "clattn_grad_score_params")


def dropout_keep(problem):
    """The dropout masks a call with this problem draws: per batch element
    or sequence, uint8 (num_heads, q_len, kv_len), 1 where kept. Visibility
    is not applied."""
    _, one = problem.plan()
    shape, keep = one.shape()
    masks = []
    for b, (_, ql, _, kl) in enumerate(one.elements()):
        m = np.ones((problem.num_heads, ql, kl), np.uint8)
        if m.size and problem.dropout_p > 0.0:
            for h in range(problem.num_heads):
                _lib.check(_lib.lib.clattn_dropout_mask(ctypes.byref(shape), b, h,
                                                        m[h].ctypes.data),
                           "clattn_dropout_mask")
        masks.append(m)
    del keep
    return masks
