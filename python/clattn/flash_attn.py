"""FlashAttention-2's Python interface, computed by clattn.

`flash_attn_func`, `flash_attn_varlen_func`, `flash_attn_qkvpacked_func`
and `flash_attn_kvpacked_func` take FlashAttention-2's arguments, defaults,
layouts and semantics (docs/python.md lists them): causal aligned to the
bottom right; window_size=(left, right) keeps keys in
[i + sk - sq - left, i + sk - sq + right]; ALiBi adds
-slope * |i + sk - sq - j|; softmax_lse is float32 (batch, heads, sq), or
(heads, total_q) for varlen, +inf on rows that see no key.

What these signatures accept and clattn does not compute raises
NotImplementedError naming the argument: block_table, dropout together
with per-batch ALiBi slopes. Tensors must be on the CPU (see clattn.torch).
"""
import torch

from . import InvalidArgument, _call, _lib
from .torch import attention, check_dropout, check_scale, check_tensors, new_rng

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func"]


def _mask(where, causal, window_size, max_q, max_k):
    """FlashAttention-2's causal flag and window, normalised as its C++ entry
    points do, in clattn's terms: (causal, window, window_right)."""
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{where}: window_size must be a pair (left, right), not "
                              f"{window_size!r}") from None
    if left < -1 or right < -1:
        raise InvalidArgument(f"{where}: window_size sides are -1 (unbounded) or a count of "
                              f"keys, not {window_size!r}")
    if left >= max_k:
        left = -1
    if right >= max_k:
        right = -1
    if causal:
        right = 0
    if left < 0 and right >= 0:
        left = max_k
    if left >= 0 and right < 0:
        right = max_k
    window = left + 1 if left >= 0 else 0
    if window > 0xFFFFFFFF:
        window = 0
    if right == 0:
        return _lib.CAUSAL_BOTTOM_RIGHT, window, -1
    return 0, window, right


def _alibi(where, alibi_slopes, batch, heads):
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.device.type != "cpu":
        raise TypeError(f"{where}: alibi_slopes must be a CPU torch.Tensor")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"{where}: alibi_slopes must be float32, not {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise InvalidArgument(f"{where}: alibi_slopes must be ({heads},) or ({batch}, "
                              f"{heads}), not {tuple(alibi_slopes.shape)}")
    return alibi_slopes.detach()


def _options(where, dropout_p, softmax_scale, causal, window_size, max_q, max_k,
             alibi_slopes, batch, heads, head_dim):
    """The arguments both entry points share, checked and in clattn's terms:
    (dropout_p, scale, causal, window, window_right, slopes, rng)."""
    p = check_dropout(where, dropout_p)
    scale = check_scale(where, softmax_scale, head_dim, "softmax_scale")
    cmode, window, right = _mask(where, causal, window_size, max_q, max_k)
    slopes = _alibi(where, alibi_slopes, batch, heads)
    if slopes is not None and slopes.dim() == 2 and p > 0:
        raise NotImplementedError(f"{where}: dropout_p > 0 with alibi_slopes of shape "
                                  "(batch, heads): clattn's dropout mask needs the batch index")
    return p, scale, cmode, window, right, slopes, new_rng(p)


def _lse_out(lse):
    """clattn's (m, l) pairs as FlashAttention's softmax_lse, m + l: +inf on
    rows that see no key."""
    m, l = lse[..., 0], lse[..., 1]
    out = m + l
    return torch.where(m <= -1e30, torch.full_like(out, float("inf")), out)


def _round128(n):
    return (n + 127) // 128 * 128


def _probs(q, k, lse, keep, *, causal, window, window_right, scale, softcap, alibi,
           sq_pad, sk_pad):
    """FlashAttention's S_dmask for one batch element: (heads, sq_pad,
    sk_pad), the softmax probabilities where visible, negated where dropout
    drops them (keep, from the call's own draw), 0 elsewhere. For testing,
    as FlashAttention says."""
    with torch.no_grad():
        sq, H, D = q.shape
        sk, Hk, _ = k.shape
        out = torch.zeros(H, sq_pad, sk_pad, dtype=q.dtype)
        if sq == 0 or sk == 0:
            return out
        kk = k.float().repeat_interleave(H // Hk, dim=1)
        s = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sq).view(-1, 1) + (sk - sq)
        j = torch.arange(sk).view(1, -1)
        if alibi is not None:
            s = s - alibi.view(-1, 1, 1) * (i - j).abs()
        visible = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            visible &= j <= i
        if window:
            visible &= i < j + window
        if window_right >= 0:
            visible &= j <= i + window_right
        p = torch.exp(s - (lse[..., 0] + lse[..., 1]).t().unsqueeze(-1)) * visible
        p = torch.where(torch.from_numpy(keep).bool(), p, -p)
        out[:, :sq, :sk] = p.to(q.dtype)
        return out


def _dmask(q, k, lse, cu_q, cu_k, slopes, rng, cmode, window, right, scale, softcap, p,
           max_q, max_k):
    """S_dmask (batch, heads, round128(max_q), round128(max_k)) from the
    problem the op ran, its dropout masks drawn as the op drew them."""
    from .torch import _problem
    prob = _problem(q, k, cu_q, cu_k, slopes, rng, cmode, True, window, right, scale, softcap,
                    p)
    keeps = _call.dropout_keep(prob)
    H = q.shape[-2]
    rows = slopes.view(-1, H) if slopes is not None else None
    S = torch.zeros(len(keeps), H, _round128(max_q), _round128(max_k), dtype=q.dtype)
    for b, ((qs, ql, ks, kl), keep) in enumerate(zip(prob.elements(), keeps)):
        if cu_q is None:
            qb, kb, lb = q[b], k[b], lse[b]
        else:
            qb, kb, lb = q[qs:qs + ql], k[ks:ks + kl], lse[qs:qs + ql]
        S[b, :, :ql, :kl] = _probs(
            qb, kb, lb, keep, causal=cmode != 0, window=window, window_right=right,
            scale=scale, softcap=softcap,
            alibi=None if rows is None else rows[min(b, rows.shape[0] - 1)],
            sq_pad=ql, sk_pad=kl)
    return S


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, learnable_sink=None):
    """FlashAttention-2's flash_attn_func. q (batch, seqlen_q, heads,
    head_dim), k and v (batch, seqlen_k, heads_k, head_dim); returns out
    like q, or (out, softmax_lse, S_dmask) with return_attn_probs
    (S_dmask is None without dropout, as in FlashAttention). clattn's
    backward is always deterministic. learnable_sink (FlashAttention-4's):
    a float32 (heads,) logit per query head that joins each row's softmax
    with no value (gpt-oss's sinks), with a gradient."""
    where = "clattn.flash_attn_func"
    check_tensors(where, q=q, k=k, v=v)
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise InvalidArgument(f"{where}: q must be (batch, seqlen, heads, head_dim) and k, v "
                              f"(batch, seqlen_k, heads_k, head_dim) alike, not "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, sq, H, D = q.shape
    _, sk, Hk, _ = k.shape
    if k.shape[0] != B or k.shape[-1] != D:
        raise InvalidArgument(f"{where}: k must share q's batch and head_dim: "
                              f"{tuple(q.shape)}, {tuple(k.shape)}")
    if Hk == 0 or H % Hk:
        raise InvalidArgument(f"{where}: heads ({H}) must be a multiple of heads_k ({Hk})")
    p, scale, cmode, window, right, slopes, rng = _options(
        where, dropout_p, softmax_scale, causal, window_size, sq, sk, alibi_slopes, B, H, D)
    out, lse = attention(q, k, v, causal=cmode, align_bottom_right=True, window=window,
                         window_right=right, scale=scale, softcap=float(softcap),
                         alibi_slopes=slopes, dropout_p=p, rng=rng, sinks=learnable_sink)
    if not return_attn_probs:
        return out
    softmax_lse = _lse_out(lse).permute(0, 2, 1).contiguous()
    S = None
    if p > 0:
        S = _dmask(q, k, lse, None, None, slopes, rng, cmode, window, right, scale,
                   float(softcap), p, sq, sk)
    return out, softmax_lse, S


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           learnable_sink=None):
    """FlashAttention-2's flash_attn_varlen_func: q (total_q, heads,
    head_dim), k and v (total_k, heads_k, head_dim), cu_seqlens_q and
    cu_seqlens_k int32 (batch + 1) prefix sums. Returns out like q, or
    (out, softmax_lse (heads, total_q), S_dmask) with return_attn_probs.
    learnable_sink as flash_attn_func's."""
    where = "clattn.flash_attn_varlen_func"
    if block_table is not None:
        raise NotImplementedError(f"{where}: block_table (a paged KV cache) is not supported")
    check_tensors(where, q=q, k=k, v=v)
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise InvalidArgument(f"{where}: q must be (total_q, heads, head_dim) and k, v "
                              f"(total_k, heads_k, head_dim) alike, not {tuple(q.shape)}, "
                              f"{tuple(k.shape)}, {tuple(v.shape)}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (
                torch.int32, torch.int64) or cu.device.type != "cpu":
            raise InvalidArgument(f"{where}: {name} must be a 1-D int32 CPU tensor")
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.numel() < 2:
        raise InvalidArgument(f"{where}: cu_seqlens_q and cu_seqlens_k must both hold batch "
                              f"+ 1 >= 2 entries, not {cu_seqlens_q.numel()} and "
                              f"{cu_seqlens_k.numel()}")
    total_q, H, D = q.shape
    _, Hk, _ = k.shape
    if k.shape[-1] != D or Hk == 0 or H % Hk:
        raise InvalidArgument(f"{where}: k must share q's head_dim, and heads ({H}) must be "
                              f"a multiple of heads_k ({Hk})")
    B = cu_seqlens_q.numel() - 1
    p, scale, cmode, window, right, slopes, rng = _options(
        where, dropout_p, softmax_scale, causal, window_size, int(max_seqlen_q),
        int(max_seqlen_k), alibi_slopes, B, H, D)
    out, lse = attention(q, k, v, causal=cmode, align_bottom_right=True, window=window,
                         window_right=right, scale=scale, softcap=float(softcap),
                         alibi_slopes=slopes, dropout_p=p, rng=rng,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         sinks=learnable_sink)
    if not return_attn_probs:
        return out
    softmax_lse = _lse_out(lse).t().contiguous()
    S = None
    if p > 0:
        S = _dmask(q, k, lse, cu_seqlens_q, cu_seqlens_k, slopes, rng, cmode, window, right,
                   scale, float(softcap), p, int(max_seqlen_q), int(max_seqlen_k))
    return out, softmax_lse, S


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_qkvpacked_func: qkv (batch, seqlen, 3,
    heads, head_dim)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        raise InvalidArgument("clattn.flash_attn_qkvpacked_func: qkv must be (batch, seqlen, "
                              "3, heads, head_dim)")
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """FlashAttention-2's flash_attn_kvpacked_func: q (batch, seqlen_q,
    heads, head_dim), kv (batch, seqlen_k, 2, heads_k, head_dim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        raise InvalidArgument("clattn.flash_attn_kvpacked_func: kv must be (batch, seqlen_k, "
                              "2, heads_k, head_dim)")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)
