"""clattn for PyTorch: autograd-enabled custom ops and PyTorch's
scaled_dot_product_attention on top of them.

The ops, `torch.ops.clattn.attention_forward`,
`torch.ops.clattn.attention_backward` and (for a score function's learned
parameters) `torch.ops.clattn.attention_score_params_backward`, are
torch.library custom ops with
fake (meta) kernels and an autograd formula, so they run under autograd,
torch.compile(fullgraph=True) and torch.library.opcheck. They take clattn's
layout, (batch, seq, heads, head_dim) or packed (total, heads, head_dim),
and CPU tensors: clattn computes on the device the context runs on (an
OpenCL GPU, PoCL, or native C) through its host-pointer API.

The device: set_device(...), else CLATTN_DEVICE, else auto.
"""
import math
import threading
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import Context, InvalidArgument, _call, _lib
from ._functions import Functions

__all__ = ["scaled_dot_product_attention", "flex_attention", "set_device", "context",
           "attention"]

_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16,
           torch.bfloat16: _lib.DTYPE_BF16}

_lock = threading.Lock()
_settings = {"device": None, "variant": None, "threads": None}
_context = None


def set_device(device=None, variant=None, threads=None):
    """Chooses the context the torch functions run on: a device selector
    ("auto", "gpu", "cpu", "native", "P:D", or part of a device name; None:
    CLATTN_DEVICE, else auto), a kernel variant, and the native backend's
    threads. The context is made here, so a bad choice raises now."""
    global _context
    ctx = Context(device=device, variant=variant, threads=threads)
    with _lock:
        _settings.update(device=device, variant=variant, threads=threads)
        _context = ctx
    return ctx


def context():
    """The context the torch functions run on, made on first use."""
    global _context
    with _lock:
        if _context is None:
            _context = Context(**_settings)
        return _context


def check_tensors(where, **tensors):
    """Refuses what clattn cannot take: tensors off the CPU, dtypes other
    than float32, float16 and bfloat16, or several dtypes in one call."""
    dtype = None
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(
                f"{where}: {name} is on {t.device}; clattn takes CPU tensors (it runs on "
                "an OpenCL device or the CPU through host memory). Move it with .cpu(), "
                "or use PyTorch's own attention for CUDA tensors")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{where}: {name} is {t.dtype}; clattn takes float32, float16 "
                            "and bfloat16")
        if dtype is not None and t.dtype != dtype:
            listed = ", ".join(f"{n} {x.dtype}" for n, x in tensors.items())
            raise TypeError(f"{where}: the tensors must share one dtype, not {listed}")
        dtype = t.dtype


def _problem(q, k, cu_q, cu_k, alibi, rng, causal, align, window, window_right, scale,
             softcap, dropout_p, q_offset=0, kv_offset=0, sinks=None, score_params=None,
             score_mod="", mask_mod="", bias=None, bool_mask=None):
    packed = cu_q is not None
    if packed:
        (Sq, H, D), (Sk, Hk, _) = q.shape, k.shape
        cq = _call.seqlens("cu_seqlens_q", cu_q.cpu().numpy(), Sq)
        ck = _call.seqlens("cu_seqlens_k", cu_k.cpu().numpy(), Sk)
        if cq.size != ck.size:
            raise InvalidArgument("cu_seqlens_q and cu_seqlens_k must have one length")
        batch = cq.size - 1
    else:
        (batch, Sq, H, D), (_, Sk, Hk, _) = q.shape, k.shape
        cq = ck = None
    seed, offset = (int(x) for x in rng.tolist()) if rng is not None else (0, 0)
    slopes = alibi.detach().to(torch.float32).contiguous().numpy() \
        if alibi is not None else None
    logits = sinks.detach().to(torch.float32).contiguous().numpy() \
        if sinks is not None else None
    params = score_params.detach().to(torch.float32).contiguous().reshape(-1).numpy() \
        if score_params is not None else None
    for name, t in (("bias", bias), ("bool_mask", bool_mask)):
        if t is not None and (t.dim() != 4 or t.shape[0] not in (1, batch) or
                              t.shape[1] not in (1, H) or tuple(t.shape[2:]) != (Sq, Sk)):
            raise InvalidArgument(f"{name} {tuple(t.shape)} is not (batch {batch} or 1, heads "
                                  f"{H} or 1, q_seq {Sq}, kv_seq {Sk})")
    return _call.Problem(
        batch=batch, q_seq=Sq, kv_seq=Sk, num_heads=H, num_kv_heads=Hk, head_dim=D,
        dtype=_DTYPES[q.dtype], causal=causal, window=window, scale=scale,
        softcap=softcap, alibi_slopes=slopes, dropout_p=dropout_p, seed=seed,
        offset=offset, cu_seqlens_q=cq, cu_seqlens_kv=ck, align_bottom_right=align,
        window_right=window_right if window_right >= 0 else None, q_offset=q_offset,
        kv_offset=kv_offset, sinks=logits, score_params=params,
        functions=_functions(score_mod, mask_mod),
        bias=_bias_array(bias), bias_dtype=_DTYPES[bias.dtype] if bias is not None else 0,
        bool_mask=bool_mask.contiguous().numpy() if bool_mask is not None else None)


_function_cache = {}


def _bias_array(bias):
    """The bias's elements as a NumPy array: float32, or a 16-bit float's
    bits (uint16)."""
    if bias is None:
        return None
    b = bias.detach().contiguous()
    return b.numpy() if b.dtype == torch.float32 else b.view(torch.int16).numpy().view("<u2")


def _functions(score_mod, mask_mod):
    """The Functions of these sources ("" for none), one per pair."""
    if not score_mod and not mask_mod:
        return None
    key = (score_mod, mask_mod)
    if key not in _function_cache:
        _function_cache[key] = Functions(score_mod or None, mask_mod or None)
    return _function_cache[key]


def _empty_rows(q):
    """Whether the call has nothing for clattn to compute."""
    return q.numel() == 0


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
             cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
             rng: Optional[Tensor], sinks: Optional[Tensor], score_params: Optional[Tensor],
             bias: Optional[Tensor], bool_mask: Optional[Tensor],
             causal: int, align_bottom_right: bool, window: int, window_right: int,
             scale: float, softcap: float, dropout_p: float, q_offset: int, kv_offset: int,
             score_mod: str, mask_mod: str) -> Tuple[Tensor, Tensor]:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1] + (2,), dtype=torch.float32)
    if _empty_rows(q):
        return o, lse
    if k.shape[-3] == 0 and cu_seqlens_q is None:  # no keys: every row is empty
        return o.zero_(), lse.fill_(-1e30)
    p = _problem(q, k, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, causal,
                 align_bottom_right, window, window_right, scale, softcap, dropout_p, q_offset,
                 kv_offset, sinks, score_params, score_mod, mask_mod, bias, bool_mask)
    _call.run(context().handle, "forward", p, q.data_ptr(), k.data_ptr(), v.data_ptr(),
              o.data_ptr(), lse.data_ptr())
    return o, lse


_forward = torch.library.custom_op("clattn::attention_forward", _forward_impl, mutates_args=(),
                                  device_types="cpu")


@_forward.register_fake
def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, sinks, score_params,
                  bias, bool_mask, causal, align_bottom_right, window, window_right, scale, softcap, dropout_p,
                  q_offset, kv_offset, score_mod, mask_mod):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            q.new_empty(q.shape[:-1] + (2,), dtype=torch.float32))


def _backward_impl(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              alibi_slopes: Optional[Tensor], rng: Optional[Tensor], sinks: Optional[Tensor],
              score_params: Optional[Tensor], bias: Optional[Tensor],
              bool_mask: Optional[Tensor], want_d_bias: bool, causal: int,
              align_bottom_right: bool, window: int, window_right: int, scale: float,
              softcap: float, dropout_p: float, q_offset: int, kv_offset: int, score_mod: str,
              mask_mod: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, the sinks' gradient (float32 (heads,); empty without
    sinks) and the bias's (float32 in its shape where want_d_bias, else
    empty)."""
    d_out, q, k, v, o = (t.contiguous() for t in (d_out, q, k, v, o))
    lse = lse.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    d_sinks = torch.zeros(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
    d_bias = torch.zeros(bias.shape if want_d_bias else (0,), dtype=torch.float32)
    if _empty_rows(q) or (k.shape[-3] == 0 and cu_seqlens_q is None):
        return dq.zero_(), dk.zero_(), dv.zero_(), d_sinks, d_bias
    p = _problem(q, k, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, causal,
                 align_bottom_right, window, window_right, scale, softcap, dropout_p, q_offset,
                 kv_offset, sinks, score_params, score_mod, mask_mod, bias, bool_mask)
    handle = context().handle
    _call.run(handle, "backward", p, q.data_ptr(), k.data_ptr(), v.data_ptr(),
              o.data_ptr(), lse.data_ptr(), d_out.data_ptr(), dq.data_ptr(), dk.data_ptr(),
              dv.data_ptr())
    if sinks is not None:
        _call.grad_sinks(handle, p, o.data_ptr(), lse.data_ptr(), d_out.data_ptr(),
                         d_sinks.data_ptr())
    if want_d_bias:
        _call.grad_bias(handle, p, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                        lse.data_ptr(), d_out.data_ptr(), d_bias.data_ptr())
    return dq, dk, dv, d_sinks, d_bias


_backward = torch.library.custom_op("clattn::attention_backward", _backward_impl, mutates_args=(),
                                   device_types="cpu")


@_backward.register_fake
def _backward_fake(d_out, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
                   sinks, score_params, bias, bool_mask, want_d_bias, causal,
                   align_bottom_right, window, window_right, scale, softcap, dropout_p, q_offset,
                   kv_offset, score_mod, mask_mod):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device),
            q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32),
            q.new_empty(bias.shape if want_d_bias else (0,), dtype=torch.float32))


def _params_backward_impl(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
                          lse: Tensor, cu_seqlens_q: Optional[Tensor],
                          cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
                          rng: Optional[Tensor], sinks: Optional[Tensor], score_params: Tensor,
                          bias: Optional[Tensor], bool_mask: Optional[Tensor], causal: int,
                          align_bottom_right: bool, window: int, window_right: int,
                          scale: float, softcap: float, dropout_p: float, q_offset: int,
                          kv_offset: int, score_mod: str, mask_mod: str) -> Tensor:
    """The score function's parameters' gradient (float32, their shape),
    through score_mod's clattn_score_dp (on a GPU's device, else on the
    host: docs/programmable.md). An op of its own, so
    that the backward's schema, which torch.compile's cached graphs name,
    stays as it was."""
    d_out, q, k, v, o = (t.contiguous() for t in (d_out, q, k, v, o))
    lse = lse.contiguous()
    d_params = torch.zeros(score_params.shape, dtype=torch.float32)
    if _empty_rows(q) or (k.shape[-3] == 0 and cu_seqlens_q is None):
        return d_params
    p = _problem(q, k, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, causal,
                 align_bottom_right, window, window_right, scale, softcap, dropout_p, q_offset,
                 kv_offset, sinks, score_params, score_mod, mask_mod, bias, bool_mask)
    _call.grad_score_params(context().handle, p, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                            o.data_ptr(), lse.data_ptr(), d_out.data_ptr(), d_params.data_ptr())
    return d_params


_params_backward = torch.library.custom_op("clattn::attention_score_params_backward",
                                           _params_backward_impl, mutates_args=(),
                                           device_types="cpu")


@_params_backward.register_fake
def _params_backward_fake(d_out, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                          rng, sinks, score_params, bias, bool_mask, causal,
                          align_bottom_right, window, window_right, scale, softcap, dropout_p,
                          q_offset, kv_offset, score_mod, mask_mod):
    return q.new_empty(score_params.shape, dtype=torch.float32)


_PARAMS = ("causal", "align_bottom_right", "window", "window_right", "scale", "softcap",
           "dropout_p", "q_offset", "kv_offset", "score_mod", "mask_mod")


_TENSORS = 11  # the ops' tensor arguments, before _PARAMS


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, alibi, rng, sinks, score_params, bias, bool_mask = inputs[:_TENSORS]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, alibi, rng, sinks, score_params, bias,
                          bool_mask)
    ctx.params = inputs[_TENSORS:]
    # The LSE pairs are an auxiliary output, as FlashAttention's softmax_lse:
    # no gradient flows through them.
    ctx.mark_non_differentiable(lse)


def _eager(*tensors):
    """Whether these are plain tensors outside any tracing, so that the
    ops' kernels may run directly, without the dispatcher's cost (about
    35 us a call); under torch.compile or with tensor subclasses (fake,
    functional) the ops go through the dispatcher."""
    return not torch.compiler.is_compiling() and all(
        t is None or type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors)


def _autograd_backward(ctx, d_out, d_lse):
    q, k, v, o, lse, cu_q, cu_k, alibi, rng, sinks, score_params, bias, bool_mask = \
        ctx.saved_tensors
    args = (d_out, q, k, v, o, lse, cu_q, cu_k, alibi, rng, sinks, score_params, bias, bool_mask)
    want_d_bias = bias is not None and ctx.needs_input_grad[9]
    want_d_params = score_params is not None and ctx.needs_input_grad[8]
    eager = _eager(*args)
    run = _backward_impl if eager else _backward
    dq, dk, dv, d_sinks, d_bias = run(*args, want_d_bias, *ctx.params)
    d_sinks = d_sinks.to(sinks.dtype) if sinks is not None else None
    d_bias = d_bias.to(bias.dtype) if want_d_bias else None
    d_params = None
    if want_d_params:
        run = _params_backward_impl if eager else _params_backward
        d_params = run(*args, *ctx.params).to(score_params.dtype)
    return (dq, dk, dv, None, None, None, None, d_sinks, d_params, d_bias, None) + \
        (None,) * len(_PARAMS)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def new_rng(dropout_p):
    """The (seed, offset) of one dropout draw, from torch's default CPU
    generator (so torch.manual_seed repeats it), or None without dropout."""
    if dropout_p == 0.0:
        return None
    return torch.randint(0, 1 << 62, (2,), dtype=torch.int64)


def check_dropout(where, dropout_p):
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise InvalidArgument(f"{where}: dropout_p must be in [0, 1), not {dropout_p!r}")
    return p


def check_heads(where, Hq, Hk, enable_gqa):
    """Query heads Hq over key heads Hk as PyTorch's enable_gqa takes them."""
    if Hq != Hk and not enable_gqa:
        raise InvalidArgument(f"{where}: query has {Hq} heads and key {Hk}: pass "
                              "enable_gqa=True for grouped-query attention")
    if Hk == 0 or Hq % Hk:
        raise InvalidArgument(f"{where}: query heads ({Hq}) must be a multiple of key "
                              f"heads ({Hk})")


def check_scale(where, scale, head_dim, name="scale"):
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 0.0
    s = float(scale)
    if not (s > 0.0) or math.isinf(s):
        raise NotImplementedError(f"{where}: {name}={scale!r}: clattn takes a finite, positive "
                                  "scale")
    return s


def attention(q, k, v, *, causal=0, align_bottom_right=False, window=0, window_right=-1,
              scale=None, softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng=None,
              cu_seqlens_q=None, cu_seqlens_k=None, q_offset=0, kv_offset=0, sinks=None,
              score_mod=None, mask_mod=None, score_params=None, bias=None, bool_mask=None):
    """The op in clattn's own terms and layout, with autograd: q (batch,
    q_seq, heads, head_dim), k and v (batch, kv_seq, kv_heads, head_dim),
    or packed (total, heads, head_dim) with cu_seqlens. causal: 0, 1
    (top-left) or 2 (bottom-right); window, q_offset and kv_offset as in
    clattn_shape. rng: None, or an int64 tensor (seed, offset) for
    dropout (new_rng draws one). sinks: None, or a learnable logit per query
    head (float32, (heads,)) that joins each row's softmax with no value,
    with a gradient. score_mod and mask_mod: OpenCL C source of the
    caller's functions (docs/programmable.md), score_params their float32
    parameters, with a gradient where score_mod defines clattn_score_dp. bias: None, or a float32, bfloat16 or float16
    CPU tensor (B or 1, heads or 1, q_seq, kv_seq) added to the scores after
    the score function, with a gradient (of its dtype); bool_mask: None, or a bool or uint8 tensor of that
    layout, False (0) hiding the pair; not with cu_seqlens. Returns (o, lse)
    with lse the float32 (m, l) pairs (..., heads, 2), which carry no
    gradient."""
    if scale is None:
        scale = 0.0
    if dropout_p and rng is None:
        rng = new_rng(dropout_p)
    if sinks is not None:
        heads = q.shape[-2]
        if not isinstance(sinks, Tensor) or sinks.device.type != "cpu" or \
                sinks.dtype != torch.float32 or tuple(sinks.shape) != (heads,):
            raise InvalidArgument(f"sinks must be a float32 CPU tensor of shape ({heads},)")
    if score_params is not None:
        if not isinstance(score_params, Tensor) or score_params.device.type != "cpu":
            raise InvalidArgument("score_params must be a CPU tensor")
    if mask_mod is not None and not isinstance(mask_mod, str):
        raise NotImplementedError("mask_mod must be OpenCL C source (a str); clattn does not "
                                  "take a BlockMask or a Python callable")
    fns = Functions(score_mod, mask_mod)  # checks the sources
    if score_params is not None and score_params.requires_grad and not fns.score_dp:
        raise InvalidArgument("score_params requires grad: score_mod must define "
                              "clattn_score_dp, the score function's derivative in its "
                              "parameters (docs/programmable.md), or pass a tensor that does "
                              "not require grad")
    if bias is not None and (not isinstance(bias, Tensor) or bias.dtype not in _DTYPES):
        raise InvalidArgument("bias must be a float32, bfloat16 or float16 tensor")
    if bool_mask is not None:
        if not isinstance(bool_mask, Tensor) or bool_mask.dtype not in (torch.bool, torch.uint8):
            raise InvalidArgument("bool_mask must be a bool or uint8 tensor")
        bool_mask = bool_mask.to(torch.uint8)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, sinks, score_params, bias,
            bool_mask)
    grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks, score_params, bias))
    run = _forward_impl if not grads and _eager(*args) else _forward
    return run(*args, int(causal), bool(align_bottom_right), int(window), int(window_right),
               float(scale), float(softcap), float(dropout_p), int(q_offset), int(kv_offset),
               score_mod or "", mask_mod or "")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by clattn:
    query (N, ..., Hq, L, E), key and value (N, ..., H, S, E); causal
    aligned top-left; dropout drawn from torch's default generator.
    attn_mask: a boolean mask (True takes part) or a float mask added to
    the scores, broadcastable to (N, ..., Hq, L, S), with a gradient where
    it requires one. Raises NotImplementedError for what clattn does not
    compute (a value head_dim other than the query's, a scale that is not
    positive)."""
    where = "clattn.torch.scaled_dot_product_attention"
    if attn_mask is not None and is_causal:
        raise InvalidArgument(f"{where}: pass attn_mask or is_causal, not both (as PyTorch)")
    check_tensors(where, query=query, key=key, value=value)
    if query.dim() < 3 or key.dim() != query.dim() or value.dim() != query.dim():
        raise InvalidArgument(f"{where}: query, key and value must be (N, ..., heads, seq, "
                              f"head_dim) alike, not {tuple(query.shape)}, "
                              f"{tuple(key.shape)}, {tuple(value.shape)}")
    E = query.shape[-1]
    if value.shape[-1] != E or key.shape[-1] != E:
        raise NotImplementedError(f"{where}: key and value must have the query's head_dim "
                                  f"{E}, not {key.shape[-1]} and {value.shape[-1]}")
    lead = query.shape[:-3]
    if key.shape[:-3] != lead or value.shape[:-3] != lead or key.shape != value.shape:
        raise InvalidArgument(f"{where}: batch dimensions and key/value shapes must match: "
                              f"{tuple(query.shape)}, {tuple(key.shape)}, "
                              f"{tuple(value.shape)}")
    Hq, L = query.shape[-3], query.shape[-2]
    Hk, S = key.shape[-3], key.shape[-2]
    check_heads(where, Hq, Hk, enable_gqa)
    p = check_dropout(where, dropout_p)
    s = check_scale(where, scale, E)
    B = math.prod(lead)
    q = query.reshape(B, Hq, L, E).transpose(1, 2)
    k = key.reshape(B, Hk, S, E).transpose(1, 2)
    v = value.reshape(B, Hk, S, E).transpose(1, 2)
    bias, keep = (None, None) if attn_mask is None else \
        _sdpa_mask(where, attn_mask, lead, Hq, L, S)
    o, _ = attention(q, k, v, causal=_lib.CAUSAL_TOP_LEFT if is_causal else 0, scale=s,
                     dropout_p=p, rng=new_rng(p), bias=bias, bool_mask=keep)
    return o.transpose(1, 2).reshape(query.shape)


def _sdpa_mask(where, attn_mask, lead, heads, L, S):
    """attn_mask, broadcastable to (*lead, heads, L, S), as clattn's bias
    (float32, or bfloat16 and float16 as they are, with autograd through
    the broadcast) or bool mask (uint8): (bias, bool_mask), each (B or 1,
    heads or 1, L, S) or None."""
    m = attn_mask
    if not isinstance(m, Tensor) or m.device.type != "cpu":
        raise InvalidArgument(f"{where}: attn_mask must be a CPU tensor")
    if m.dtype != torch.bool and not m.dtype.is_floating_point:
        raise InvalidArgument(f"{where}: attn_mask must be bool or floating point, not {m.dtype}")
    full = tuple(lead) + (heads, L, S)
    if m.dim() > len(full):
        raise InvalidArgument(f"{where}: attn_mask {tuple(m.shape)} has more dimensions than "
                              f"the scores {full}")
    m = m.reshape((1,) * (len(full) - m.dim()) + tuple(m.shape))
    try:
        torch.broadcast_shapes(tuple(m.shape), full)
    except RuntimeError:
        raise InvalidArgument(f"{where}: attn_mask {tuple(attn_mask.shape)} does not broadcast "
                              f"to the scores {full}") from None
    nb = 1 if all(d == 1 for d in m.shape[:-3]) else math.prod(lead)
    nh = 1 if m.shape[-3] == 1 else heads
    m = m.expand((tuple(lead) if nb > 1 else (1,) * len(lead)) + (nh, L, S)).reshape(nb, nh, L, S)
    if m.dtype == torch.bool:
        return None, m.to(torch.uint8)
    return (m if m.dtype in _DTYPES else m.to(torch.float32)), None


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, *, mask_mod=None, score_params=None):
    """PyTorch's FlexAttention (torch.nn.attention.flex_attention) with the
    functions as OpenCL C source (docs/programmable.md), computed by clattn
    on any OpenCL device or natively: query (B, Hq, L, E), key and value
    (B, H, S, E). score_mod defines clattn_score and clattn_score_ds, with
    score_params (float32) as their p, which has a gradient where score_mod
    defines clattn_score_dp too; mask_mod defines
    clattn_mask, whose hidden blocks are skipped. q and k are the query's
    and key's indices. A row that the mask hides whole gives 0, its LSE
    -inf. return_lse: also the log-sum-exp (B, Hq, L), float32."""
    where = "clattn.torch.flex_attention"
    if block_mask is not None:
        raise NotImplementedError(f"{where}: block_mask: pass the mask function itself as "
                                  "mask_mod (OpenCL C source); clattn finds the blocks it hides")
    if score_mod is not None and not isinstance(score_mod, str):
        raise NotImplementedError(f"{where}: score_mod must be OpenCL C source (a str); clattn "
                                  "compiles it, it does not trace a Python callable")
    check_tensors(where, query=query, key=key, value=value)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or key.shape != value.shape:
        raise InvalidArgument(f"{where}: query (B, Hq, L, E), key and value (B, H, S, E), not "
                              f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    B, Hq, L, E = query.shape
    Hk, S = key.shape[1], key.shape[2]
    if key.shape[0] != B or key.shape[3] != E:
        raise InvalidArgument(f"{where}: key and value must share query's batch and head_dim")
    check_heads(where, Hq, Hk, enable_gqa)
    s = check_scale(where, scale, E)
    o, lse = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                       scale=s, score_mod=score_mod, mask_mod=mask_mod,
                       score_params=score_params)
    o = o.transpose(1, 2)
    if not return_lse:
        return o
    m, l = lse[..., 0], lse[..., 1]
    total = torch.where(m <= -1e30, torch.full_like(m, float("-inf")), m + l)
    return o, total.transpose(1, 2)
