"""Attention in float64 with numpy: the reference the tests compare with.

Per batch element: q (Sq, H, D), k and v (Sk, Hk, D). Query row i sits at
position P = i + shift, key j at T = j; key j is visible iff (not causal or
T <= P) and (window == 0 or P < T + window) and (right is None or
T <= P + right). The score is scale * q.k, then softcap, then ALiBi
(-slope * |P - T|); keep (H, Sq, Sk) is the dropout mask.
"""
import numpy as np


def attention(q, k, v, d_out=None, *, scale, causal=False, shift=0, window=0, right=None,
              softcap=0.0, alibi=None, keep=None, dropout_p=0.0):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    Sq, H, D = q.shape
    Sk, Hk, _ = k.shape
    g = H // Hk
    o = np.zeros((Sq, H, D))
    lse = np.full((Sq, H, 2), -1e30)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    P = np.arange(Sq)[:, None] + shift
    T = np.arange(Sk)[None, :]
    vis = np.ones((Sq, Sk), dtype=bool)
    if causal:
        vis &= T <= P
    if window:
        vis &= P < T + window
    if right is not None:
        vis &= T <= P + right
    seen = vis.any(axis=1)
    for h in range(H):
        kh = h // g
        x = scale * (q[:, h] @ k[:, kh].T)
        dz = np.ones_like(x)
        if softcap > 0:
            th = np.tanh(x / softcap)
            x, dz = softcap * th, 1.0 - th * th
        s = x - (alibi[h] * np.abs(P - T) if alibi is not None else 0.0)
        m = np.where(seen, np.max(np.where(vis, s, -np.inf), axis=1, initial=-np.inf), 0.0)
        e = np.where(vis, np.exp(s - m[:, None]), 0.0)
        l_sum = e.sum(axis=1)
        p = np.where(seen[:, None], e / np.where(seen, l_sum, 1.0)[:, None], 0.0)
        lse[seen, h, 0] = m[seen]
        lse[seen, h, 1] = np.log(l_sum[seen])
        drop = keep[h] / (1.0 - dropout_p) if keep is not None and dropout_p > 0 else 1.0
        pd = p * drop
        o[:, h] = pd @ v[:, kh]
        if d_out is not None:
            do = np.asarray(d_out, dtype=np.float64)[:, h]
            dv[:, kh] += pd.T @ do
            dp = (do @ v[:, kh].T) * drop
            dsum = np.sum(do * o[:, h], axis=1)
            ds = p * (dp - dsum[:, None]) * dz
            dq[:, h] = scale * ds @ k[:, kh]
            dk[:, kh] += scale * ds.T @ q[:, h]
    return o, lse, dq, dk, dv


def batched(q, k, v, d_out=None, *, cu_q=None, cu_k=None, keeps=None, alibi_rows=None,
            align_bottom_right=False, causal_bottom_right=False, **kw):
    """attention() over a batch (B, S, H, D) or packed sequences
    (cu_seqlens): returns (o, lse, dq, dk, dv) in the same layout. keeps:
    per element (H, Sq, Sk); alibi_rows: per element slopes. With
    align_bottom_right (or causal_bottom_right) each element's queries move
    by kv_len - q_len."""
    packed = cu_q is not None
    if packed:
        bounds = [(cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]) for i in range(len(cu_q) - 1)]
    else:
        B = q.shape[0]
        bounds = [(b, b + 1, b, b + 1) for b in range(B)]
    outs = [np.zeros(np.shape(q)), np.full(np.shape(q)[:-1] + (2,), -1e30),
            np.zeros(np.shape(q)), np.zeros(np.shape(k)), np.zeros(np.shape(k))]
    for b, (qs, qe, ks, ke) in enumerate(bounds):
        if packed:
            qb, kb, vb = q[qs:qe], k[ks:ke], v[ks:ke]
            dob = d_out[qs:qe] if d_out is not None else None
        else:
            qb, kb, vb = q[b], k[b], v[b]
            dob = d_out[b] if d_out is not None else None
        if len(qb) == 0 or len(kb) == 0:
            continue
        extra = dict(kw)
        if align_bottom_right or causal_bottom_right:
            extra["shift"] = extra.get("shift", 0) + len(kb) - len(qb)
        if keeps is not None:
            extra["keep"] = keeps[b]
        if alibi_rows is not None:
            extra["alibi"] = alibi_rows[b]
        res = attention(qb, kb, vb, dob, **extra)
        sl_q = slice(qs, qe) if packed else b
        sl_k = slice(ks, ke) if packed else b
        for i, r in enumerate(res):
            outs[i][sl_k if i >= 3 else sl_q] = r
    return tuple(outs)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)
