"""The torch API: PyTorch's SDPA and FlashAttention-2's functions against
float64 references, on native and PoCL; the custom ops under opcheck and
torch.compile; bad input."""
import math

import numpy as np
import pytest

from conftest import TOL, backend_context, backends, in_threads, rel_err, require_torch

require_torch()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import clattn  # noqa: E402
import clattn.torch as ct  # noqa: E402
from clattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from reference import batched  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(params=backends())
def backend(request):
    ct._context = backend_context(request.param)  # the torch API's context, for this test
    return request.param


def leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


def grads(out, inputs, d_out):
    return torch.autograd.grad(out, inputs, d_out)


def close(got, want, dtype):
    return rel_err(got.detach().double().numpy(), want.detach().double().numpy()) < TOL[dtype]


SDPA_CASES = [
    # (B, Hq, Hk, L, S, E, is_causal, enable_gqa)
    (2, 4, 4, 33, 33, 32, True, False),
    (1, 8, 2, 40, 57, 16, True, True),    # GQA, causal top-left with S > L
    (2, 4, 1, 45, 20, 24, True, True),    # MQA, L > S: rows past S see S keys
    (3, 2, 2, 17, 29, 64, False, False),
]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_sdpa_matches_pytorch_in_float64(backend, dtype, case):
    B, Hq, Hk, L, S, E, causal, gqa = case
    q, k, v = leaves((B, Hq, L, E), (B, Hk, S, E), (B, Hk, S, E), dtype=DTYPES[dtype])
    d_out = torch.randn(B, Hq, L, E).to(DTYPES[dtype])
    out = ct.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert out.shape == (B, Hq, L, E) and out.dtype == q.dtype
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal, enable_gqa=gqa)
    assert close(out, ref, dtype)
    for got, want in zip(grads(out, (q, k, v), d_out), grads(ref, ref_in, d_out.double())):
        assert close(got, want, dtype)


def test_sdpa_scale_and_extra_batch_dims(backend):
    q, k, v = leaves((2, 3, 4, 11, 16), (2, 3, 4, 13, 16), (2, 3, 4, 13, 16))
    out = ct.scaled_dot_product_attention(q, k, v, scale=0.2)
    ref = F.scaled_dot_product_attention(*(x.double() for x in (q, k, v)), scale=0.2)
    assert close(out, ref, "f32")


def test_sdpa_dropout_is_dropout_mask_in_float64(backend):
    B, H, L, S, E, p = 2, 3, 21, 26, 16, 0.25
    q, k, v = leaves((B, H, L, E), (B, H, S, E), (B, H, S, E))
    d_out = torch.randn(B, H, L, E)
    torch.manual_seed(5)
    out = ct.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    torch.manual_seed(5)
    seed, offset = torch.randint(0, 1 << 62, (2,)).tolist()
    keep = clattn.dropout_mask(batch=B, q_seq=L, kv_seq=S, num_heads=H, dropout_p=p,
                               seed=seed, offset=offset, causal=True)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    mask = torch.ones(L, S, dtype=torch.bool).tril()
    att = (ref_in[0] @ ref_in[1].transpose(-1, -2) / math.sqrt(E)).masked_fill(~mask,
                                                                               -math.inf)
    ref = (att.softmax(-1) * torch.from_numpy(keep).double() / (1 - p)) @ ref_in[2]
    assert close(out, ref, "f32")
    for got, want in zip(grads(out, (q, k, v), d_out), grads(ref, ref_in, d_out.double())):
        assert close(got, want, "f32")
    # The same seed draws the same mask; another, another.
    torch.manual_seed(5)
    again = ct.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    other = ct.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    assert torch.equal(out, again) and not torch.equal(out, other)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_attention_op_with_offsets_and_window(backend, dtype):
    # clattn's own op: a chunk of a longer sequence (offsets) under a causal
    # sliding window, GQA, against the float64 reference with the same
    # global positions.
    B, sq, sk, H, Hk, D = 2, 24, 40, 4, 2, 32
    q, k, v = leaves((B, sq, H, D), (B, sk, Hk, D), (B, sk, Hk, D), dtype=DTYPES[dtype])
    d_out = torch.randn(B, sq, H, D).to(DTYPES[dtype])
    out, lse = ct.attention(q, k, v, causal=1, window=11, q_offset=30, kv_offset=8)
    assert not lse.requires_grad
    n = [x.detach().double().numpy() for x in (q, k, v, d_out)]
    ref = batched(*n, scale=1 / math.sqrt(D), causal=True, window=11, shift=30 - 8)
    assert rel_err(out.detach().double().numpy(), ref[0]) < TOL[dtype]
    for got, want in zip(grads(out, (q, k, v), d_out), ref[2:]):
        assert rel_err(got.double().numpy(), want) < TOL[dtype]


def fa_reference(q, k, v, d_out, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                 scale=None, cu=None):
    """FlashAttention-2's semantics in float64 (reference.py): queries at
    i + sk - sq, keys in [i + sk - sq - left, i + sk - sq + right]."""
    left, right = window
    if causal:
        right = 0
    D = q.shape[-1]
    kw = dict(scale=scale or 1.0 / math.sqrt(D), causal=right == 0,
              window=left + 1 if left >= 0 else 0, right=right if right > 0 else None,
              softcap=softcap, align_bottom_right=True)
    B = len(cu[0]) - 1 if cu else q.shape[0]
    rows = None
    if alibi is not None:
        a = alibi.numpy().reshape(-1, q.shape[-2])
        rows = [a[min(b, len(a) - 1)] for b in range(B)]
    n = [x.detach().double().numpy() for x in (q, k, v, d_out)]
    return batched(*n, cu_q=cu[0] if cu else None, cu_k=cu[1] if cu else None,
                   alibi_rows=rows, **kw)


FA_CASES = [
    # (name, B, sq, sk, H, Hk, D, kwargs)
    ("causal-sq<sk", 2, 23, 41, 4, 2, 32, dict(causal=True)),
    ("causal-sq>sk", 1, 40, 18, 2, 2, 16, dict(causal=True)),  # 22 rows see nothing
    ("window-causal", 2, 37, 37, 4, 1, 24, dict(causal=True, window_size=(8, 0))),
    ("window-left-only", 1, 30, 45, 2, 2, 16, dict(window_size=(6, -1))),
    ("window-two-sided", 1, 20, 40, 2, 2, 16, dict(window_size=(5, 3))),
    ("softcap", 2, 19, 19, 4, 2, 40, dict(causal=True, softcap=1.5, softmax_scale=0.4)),
    ("alibi", 1, 25, 31, 4, 4, 16, dict(alibi_slopes=[0.3, 0.1, 0.05, 0.01])),
    ("alibi-causal-batch", 2, 22, 30, 2, 1, 16, dict(causal=True, alibi_per_batch=True)),
]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", FA_CASES, ids=[c[0] for c in FA_CASES])
def test_flash_attn_func_matches_float64(backend, dtype, case):
    _, B, sq, sk, H, Hk, D, kw = case
    kw = dict(kw)
    q, k, v = leaves((B, sq, H, D), (B, sk, Hk, D), (B, sk, Hk, D), dtype=DTYPES[dtype])
    d_out = torch.randn(B, sq, H, D).to(DTYPES[dtype])
    alibi = None
    if kw.pop("alibi_per_batch", False):
        alibi = torch.rand(B, H) * 0.5
    elif "alibi_slopes" in kw:
        alibi = torch.tensor(kw.pop("alibi_slopes"))
    out, lse, S = flash_attn_func(q, k, v, alibi_slopes=alibi, return_attn_probs=True, **kw)
    assert S is None and lse.shape == (B, H, sq) and lse.dtype == torch.float32
    ref = fa_reference(q, k, v, d_out, causal=kw.get("causal", False),
                       window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
                       alibi=alibi, scale=kw.get("softmax_scale"))
    assert rel_err(out.detach().double().numpy(), ref[0]) < TOL[dtype]
    seen = ref[1][..., 0] > -1e29
    want_lse = np.where(seen, ref[1][..., 0] + ref[1][..., 1], np.inf).transpose(0, 2, 1)
    got_lse = lse.numpy()
    assert np.array_equal(np.isinf(got_lse), np.isinf(want_lse))
    fin = np.isfinite(want_lse)
    assert np.max(np.abs(got_lse[fin] - want_lse[fin]), initial=0) < 1e-3
    for got, want in zip(grads(out, (q, k, v), d_out), ref[2:]):
        assert rel_err(got.double().numpy(), want) < TOL[dtype]


def test_flash_attn_dropout_mask_in_s_dmask(backend):
    B, sq, sk, H, D, p = 2, 19, 27, 2, 16, 0.3
    q, k, v = leaves((B, sq, H, D), (B, sk, H, D), (B, sk, H, D))
    d_out = torch.randn(B, sq, H, D)
    for causal in (True, False):
        torch.manual_seed(3)
        out, lse, S = flash_attn_func(q, k, v, dropout_p=p, causal=causal,
                                      window_size=(-1, -1) if causal else (9, -1),
                                      return_attn_probs=True)
        assert S.shape == (B, H, 128, 128)
        keep = (S[:, :, :sq, :sk] >= 0).numpy()
        # dropped over the visible pairs (masked ones are 0, kept positive)
        seen = (S[:, :, :sq, :sk] != 0).numpy()
        assert 0.2 < 1 - keep[seen].mean() < 0.4
        ref = fa_reference(q, k, v, d_out, causal=causal,
                           window=(-1, -1) if causal else (9, -1))
        kw = dict(scale=1 / math.sqrt(D), causal=causal, window=0 if causal else 10,
                  align_bottom_right=True, keeps=list(keep), dropout_p=p)
        ref = batched(*(x.detach().double().numpy() for x in (q, k, v, d_out)), **kw)
        assert rel_err(out.detach().numpy(), ref[0]) < TOL["f32"]
        for got, want in zip(grads(out, (q, k, v), d_out), ref[2:]):
            assert rel_err(got.numpy(), want) < TOL["f32"]
        # S's magnitudes are the undropped probabilities where visible.
        probs = np.abs(S[:, :, :sq, :sk].numpy())
        assert np.allclose(probs.sum(-1), 1.0, atol=1e-4)


VARLEN = [
    # (name, per-sequence (sq, sk), kwargs)
    ("causal", [(7, 11), (0, 5), (13, 13), (9, 4)], dict(causal=True)),
    ("window-two-sided", [(8, 12), (10, 14), (9, 5)], dict(window_size=(3, 2))),
    ("alibi-mixed", [(6, 9), (11, 5), (4, 4)], dict(alibi=True)),
    ("window-causal-gqa", [(15, 20), (3, 3), (12, 30)], dict(causal=True, window_size=(5, 0))),
    ("sinks-causal", [(9, 12), (0, 5), (13, 7)], dict(causal=True, sinks=True)),
]


@pytest.mark.parametrize("case", VARLEN, ids=[c[0] for c in VARLEN])
def test_varlen_matches_per_sequence_calls(backend, case):
    _, lens, kw = case
    kw = dict(kw)
    H, Hk, D = 4, 2, 16
    cq = torch.tensor([0] + list(np.cumsum([a for a, _ in lens])), dtype=torch.int32)
    ck = torch.tensor([0] + list(np.cumsum([b for _, b in lens])), dtype=torch.int32)
    q, k, v = leaves((int(cq[-1]), H, D), (int(ck[-1]), Hk, D), (int(ck[-1]), Hk, D))
    d_out = torch.randn(int(cq[-1]), H, D)
    alibi = torch.tensor([0.4, 0.2, 0.1, 0.05]) if kw.pop("alibi", False) else None
    if kw.pop("sinks", False):  # the sinks' gradient: the sequences' summed
        kw["learnable_sink"] = torch.tensor([1.0, -0.5, 2.0, -1.5]).requires_grad_()
    sink = kw.get("learnable_sink")
    out, lse, _ = flash_attn_varlen_func(q, k, v, cq, ck, max(a for a, _ in lens),
                                         max(b for _, b in lens), alibi_slopes=alibi,
                                         return_attn_probs=True, **kw)
    assert lse.shape == (H, int(cq[-1]))
    leaves_in = (q, k, v) if sink is None else (q, k, v, sink)
    dq, dk, dv, *d_sink = grads(out, leaves_in, d_out)
    sink_sum = torch.zeros(H)
    for i, (a, b) in enumerate(lens):
        if a == 0:
            continue
        qs, ks = int(cq[i]), int(ck[i])
        one = [x.detach()[s:s + n].unsqueeze(0).requires_grad_()
               for x, s, n in ((q, qs, a), (k, ks, b), (v, ks, b))]
        o1, l1, _ = flash_attn_func(*one, alibi_slopes=alibi, return_attn_probs=True, **kw)
        assert torch.allclose(out[qs:qs + a], o1[0], atol=1e-6)
        assert torch.allclose(lse[:, qs:qs + a], l1[0], atol=1e-5)
        g1 = grads(o1, one if sink is None else one + [sink], d_out[qs:qs + a].unsqueeze(0))
        assert torch.allclose(dq[qs:qs + a], g1[0][0], atol=1e-5)
        assert torch.allclose(dk[ks:ks + b], g1[1][0], atol=1e-5)
        assert torch.allclose(dv[ks:ks + b], g1[2][0], atol=1e-5)
        if sink is not None:
            sink_sum += g1[3]
    if sink is not None:
        assert torch.allclose(d_sink[0], sink_sum, atol=1e-5)
        assert sink_sum.abs().max() > 1e-3


def test_packed_entry_points(backend):
    qkv = leaves((2, 14, 3, 4, 16))[0]
    out = clattn.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = qkv.unbind(2)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))
    kv = qkv[:, :, 1:]
    assert torch.equal(clattn.flash_attn_kvpacked_func(q, kv), flash_attn_func(q, k, v))


# A score function (a cap in p[0] through clattn's tanh, plus 0.5 on odd
# queries) and a document mask (documents of 7 positions), as OpenCL C that
# is C99 too.
SOFTCAP_SCORE = """
float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return p[0] * clattn_tanh(s / p[0]) + (q % 2u == 1u ? 0.5f : 0.0f);
}
float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const float t = clattn_tanh(s / p[0]);
    return 1.0f - t * t;
}
"""
DOCUMENT_MASK = """
bool clattn_mask(uint b, uint h, uint q, uint k) { return q / 7u == k / 7u || h == 1u; }
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_flex_attention_matches_float64(backend, dtype):
    B, Hq, Hk, L, S, E = 2, 4, 2, 30, 26, 16
    q, k, v = leaves((B, Hq, L, E), (B, Hk, S, E), (B, Hk, S, E), dtype=DTYPES[dtype])
    d_out = torch.randn(B, Hq, L, E).to(DTYPES[dtype])
    cap = torch.tensor([3.0])
    out, lse = ct.flex_attention(q, k, v, score_mod=SOFTCAP_SCORE, enable_gqa=True,
                                 return_lse=True, mask_mod=DOCUMENT_MASK, score_params=cap)
    # the same in float64 by hand
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    rq, rk, rv = ref_in
    rk, rv = (x.repeat_interleave(Hq // Hk, dim=1) for x in (rk, rv))
    scores = rq @ rk.transpose(-1, -2) / math.sqrt(E)
    qi = torch.arange(L).view(L, 1)
    scores = 3.0 * torch.tanh(scores / 3.0) + (qi % 2 == 1) * 0.5
    shown = (qi // 7 == torch.arange(S).view(1, S) // 7) | (torch.arange(Hq) == 1).view(Hq, 1, 1)
    scores = scores.masked_fill(~shown, float("-inf"))
    ref_lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    ref = probs @ rv
    assert out.shape == (B, Hq, L, E) and close(out, ref, dtype)
    hidden = torch.isinf(ref_lse)
    assert hidden.any() and torch.equal(torch.isinf(lse), hidden)
    assert close(torch.where(hidden, 0.0, lse), torch.where(hidden, 0.0, ref_lse), "f32")
    for got, want in zip(grads(out, (q, k, v), d_out), grads(ref, ref_in, d_out.double())):
        assert close(got, want, dtype)


# A learned relative-position bias: 9 buckets of k - q (clamped to [-4, 4])
# per query head, in p[9 h + bucket], under a cap of 4, with its derivative
# in the one entry each pair reads.
RELBIAS_SCORE = """
uint relbias_bucket(uint h, uint q, uint k)
{
    const int d = (int)k - (int)q;
    return 9u * h + (uint)(d < -4 ? 0 : d > 4 ? 8 : d + 4);
}
float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return 4.0f * tanh((s + p[relbias_bucket(h, q, k)]) / 4.0f);
}
float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const float t = tanh((s + p[relbias_bucket(h, q, k)]) / 4.0f);
    return 1.0f - t * t;
}
uint clattn_score_dp(float s, uint b, uint h, uint q, uint k, __global const float *p,
                     uint *index, float *d)
{
    index[0] = relbias_bucket(h, q, k);
    d[0] = clattn_score_ds(s, b, h, q, k, p);
    return 1u;
}
"""


def test_learned_score_params_match_float64(backend):
    B, Hq, Hk, L, S, E = 2, 4, 2, 19, 23, 16
    q, k, v = leaves((B, Hq, L, E), (B, Hk, S, E), (B, Hk, S, E))
    d_out = torch.randn(B, Hq, L, E)
    table = (torch.randn(Hq * 9) * 0.5).requires_grad_()
    out = ct.flex_attention(q, k, v, score_mod=RELBIAS_SCORE, enable_gqa=True,
                            mask_mod=DOCUMENT_MASK, score_params=table)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v, table)]
    rq, rk, rv, rt = ref_in
    rk, rv = (x.repeat_interleave(Hq // Hk, dim=1) for x in (rk, rv))
    qi, ki = torch.arange(L).view(L, 1), torch.arange(S).view(1, S)
    at = (ki - qi).clamp(-4, 4) + 4 + 9 * torch.arange(Hq).view(Hq, 1, 1)
    scores = 4.0 * torch.tanh((rq @ rk.transpose(-1, -2) / math.sqrt(E) + rt[at]) / 4.0)
    shown = (qi // 7 == ki // 7) | (torch.arange(Hq) == 1).view(Hq, 1, 1)
    ref = torch.softmax(scores.masked_fill(~shown, float("-inf")), dim=-1).nan_to_num(0.0) @ rv
    assert close(out, ref, "f32")
    for got, want in zip(grads(out, (q, k, v, table), d_out),
                         grads(ref, ref_in, d_out.double())):
        assert close(got, want, "f32")
    # the op itself passes opcheck
    args = (d_out.transpose(1, 2).contiguous(), q.detach().transpose(1, 2).contiguous(),
            k.detach().transpose(1, 2).contiguous(), v.detach().transpose(1, 2).contiguous())
    o, lse = torch.ops.clattn.attention_forward(*args[1:], None, None, None, None, None,
                                                table.detach(), None, None, 0, False, 0, -1,
                                                1.0 / math.sqrt(E), 0.0, 0.0, 0, 0,
                                                RELBIAS_SCORE, DOCUMENT_MASK)
    torch.library.opcheck(torch.ops.clattn.attention_score_params_backward.default,
                          (args[0], *args[1:], o, lse, None, None, None, None, None,
                           table.detach(), None, None, 0, False, 0, -1, 1.0 / math.sqrt(E),
                           0.0, 0.0, 0, 0, RELBIAS_SCORE, DOCUMENT_MASK))
    # without clattn_score_dp, a table that requires grad is refused at once
    with pytest.raises(clattn.InvalidArgument, match="clattn_score_dp"):
        ct.flex_attention(q, k, v, score_mod=SOFTCAP_SCORE, enable_gqa=True,
                          score_params=table)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_attn_mask_matches_pytorch_in_float64(backend, kind):
    B, Hq, Hk, L, S, E = 2, 4, 2, 21, 27, 16
    q, k, v = leaves((B, Hq, L, E), (B, Hk, S, E), (B, Hk, S, E))
    d_out = torch.randn(B, Hq, L, E)
    g = torch.Generator().manual_seed(5)
    for shape in [(L, S), (B, 1, L, S), (1, Hq, L, S), (B, Hq, L, S), (B, 1, 1, S)]:
        if kind == "bool":
            mask = torch.rand(shape, generator=g) < 0.7
            mask[..., 0] = True  # no row hidden whole
        else:  # a learned bias: its gradient too, summed over what it broadcasts
            mask = torch.randn(shape, generator=g).requires_grad_()
        out = ct.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
        ref_mask = mask if kind == "bool" else mask.detach().double().requires_grad_()
        ref = F.scaled_dot_product_attention(*ref_in, attn_mask=ref_mask, enable_gqa=True)
        assert close(out, ref, "f32"), shape
        wrt, ref_wrt = (q, k, v), ref_in
        if kind == "float":
            wrt, ref_wrt = wrt + (mask,), ref_wrt + [ref_mask]
        for got, want in zip(grads(out, wrt, d_out), grads(ref, ref_wrt, d_out.double())):
            assert got.shape == want.shape and close(got, want, "f32"), shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_16_bit_attn_mask_is_its_float32_values(backend, dtype):
    # bf16 tensors with a bf16 float mask, as PyTorch wants them: the mask is
    # clattn's 16-bit bias, read as the float32 it equals; its gradient
    # comes back in its own dtype.
    B, H, L, S, E = 1, 2, 19, 23, 16
    q, k, v = leaves((B, H, L, E), (B, H, S, E), (B, H, S, E), dtype=torch.bfloat16)
    d_out = torch.randn(B, H, L, E).to(torch.bfloat16)
    mask = torch.randn(B, H, L, S, generator=torch.Generator().manual_seed(6)).to(dtype)
    mask[0, 0, 3, 5:9] = -math.inf
    runs = []
    for m in (mask.clone().requires_grad_(), mask.float().requires_grad_()):
        out = ct.scaled_dot_product_attention(q, k, v, attn_mask=m)
        runs.append((out,) + grads(out, (q, k, v, m), d_out))
    (o16, dq16, dk16, dv16, dm16), (o32, dq32, dk32, dv32, dm32) = runs
    for a, b in ((o16, o32), (dq16, dq32), (dk16, dk32), (dv16, dv32)):
        assert torch.equal(a, b)
    assert dm16.dtype == dtype and torch.equal(dm16, dm32.to(dtype))


def test_functions_refuse_what_they_cannot_take():
    q, k, v = leaves((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
    with pytest.raises(NotImplementedError, match="callable"):
        ct.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s)
    with pytest.raises(NotImplementedError, match="block_mask"):
        ct.flex_attention(q, k, v, block_mask=object())
    with pytest.raises(clattn.InvalidArgument, match="empty"):
        ct.flex_attention(q, k, v, mask_mod="  ")
    with pytest.raises(clattn.InvalidArgument, match="broadcast"):
        ct.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(3, 8, 8))
    with pytest.raises(clattn.InvalidArgument, match="not both"):
        ct.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool),
                                        is_causal=True)
    ct._context = backend_context("native")
    with pytest.raises(clattn.InvalidArgument, match="did not compile"):
        ct.flex_attention(q, k, v, score_mod="float clattn_score(float s) { return s +; }")


def test_unsupported_arguments_raise_not_implemented():
    q, k, v = leaves((1, 4, 8, 16), (1, 4, 8, 16), (1, 4, 8, 16))
    with pytest.raises(NotImplementedError, match="head_dim"):
        ct.scaled_dot_product_attention(q, k, v[..., :8])
    with pytest.raises(NotImplementedError, match="scale"):
        ct.scaled_dot_product_attention(q, k, v, scale=-1.0)
    fq, fk, fv = (x.transpose(1, 2) for x in (q, k, v))
    with pytest.raises(NotImplementedError, match="block_table"):
        flash_attn_varlen_func(fq[0], fk[0], fv[0], torch.tensor([0, 8], dtype=torch.int32),
                               torch.tensor([0, 8], dtype=torch.int32), 8, 8,
                               block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_func(fq, fk, fv, dropout_p=0.1, alibi_slopes=torch.rand(1, 4))


def test_bad_input_raises_clear_errors():
    q, k, v = leaves((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
    sdpa = ct.scaled_dot_product_attention
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)
    with pytest.raises(TypeError, match="dtype"):
        sdpa(q, k.half(), v, enable_gqa=True)
    with pytest.raises(TypeError, match="float64"):
        sdpa(q.double(), k.double(), v.double(), enable_gqa=True)
    with pytest.raises(ValueError):
        sdpa(q[0, 0, 0], k, v)
    with pytest.raises(ValueError, match="match"):
        sdpa(q, k[:, :, :5], v, enable_gqa=True)
    with pytest.raises(ValueError, match="CPU"):
        sdpa(q.to("meta"), k.to("meta"), v.to("meta"), enable_gqa=True)
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, k, v, dropout_p=1.5, enable_gqa=True)
    fq, fk, fv = (x.transpose(1, 2) for x in (q, k, v))
    with pytest.raises(ValueError):
        flash_attn_func(fq, fk[:, :, :, :4], fv[:, :, :, :4])
    with pytest.raises(ValueError, match="alibi"):
        flash_attn_func(fq, fk, fv, alibi_slopes=torch.rand(3))
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(fq, fk, fv, window_size=(-2, 0))
    cq = torch.tensor([0, 5, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(fq[0], fk[0], fv[0], cq, cq, 5, 5)
    with pytest.raises(ValueError, match="cu_seqlens"):
        flash_attn_varlen_func(fq[0], fk[0], fv[0], cq.float(), cq, 5, 5)
    # Non-contiguous tensors are copied: the same answer as contiguous ones.
    qt = fq.detach().transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    assert torch.equal(flash_attn_func(qt, fk, fv), flash_attn_func(fq.detach(), fk, fv))


def test_set_device_and_environment(monkeypatch):
    ctx = ct.set_device("native", threads=1)
    assert ct.context() is ctx and ctx.backend == "native"
    with pytest.raises(clattn.Error):
        ct.set_device("no such device at all")
    assert ct.context() is ctx  # a failed choice leaves the last one


def test_opcheck_on_every_custom_op():
    ct._context = backend_context("native")
    g = torch.Generator().manual_seed(1)

    def t(*s, grad=True):
        return torch.randn(*s, generator=g).requires_grad_(grad)

    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    rng = torch.tensor([11, 3], dtype=torch.int64)
    keep = (torch.arange(2 * 9 * 9).reshape(2, 1, 9, 9) % 5 != 1).to(torch.uint8)
    samples = [
        (t(2, 7, 4, 8), t(2, 9, 2, 8), t(2, 9, 2, 8), None, None, None, None, None, None, None,
         None, 1, False, 0, -1, 0.0, 0.0, 0.0, 0, 0, "", ""),
        (t(12, 2, 8), t(12, 2, 8), t(12, 2, 8), cu, cu, torch.tensor([0.5, 0.25]), None,
         t(2), None, None, None, 2, False, 4, -1, 0.3, 2.0, 0.0, 3, 1, "", ""),
        (t(1, 6, 2, 16), t(1, 10, 1, 16), t(1, 10, 1, 16), None, None, None, rng, None, None,
         None, None, 0, True, 3, 20, 0.25, 0.0, 0.2, 0, 0, "", ""),
        # a score function with its parameters, and a mask function
        (t(1, 9, 2, 8), t(1, 9, 2, 8), t(1, 9, 2, 8), None, None, None, None, None,
         torch.tensor([4.0]), None, None, 0, False, 0, -1, 0.0, 0.0, 0.0, 0, 0, SOFTCAP_SCORE,
         DOCUMENT_MASK),
        # a bias over the heads and a bool mask over the batch
        (t(2, 9, 2, 8), t(2, 9, 2, 8), t(2, 9, 2, 8), None, None, None, None, None, None,
         t(1, 2, 9, 9), keep, 1, False, 0, -1, 0.0, 0.0, 0.0, 0, 0, "", ""),
    ]
    for args in samples:
        torch.library.opcheck(torch.ops.clattn.attention_forward.default, args)
        q, k, v = args[:3]
        o, lse = torch.ops.clattn.attention_forward(*args)
        rest = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args[3:])
        want_d_bias = args[9] is not None
        bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse) + \
            rest[:8] + (want_d_bias,) + rest[8:]
        torch.library.opcheck(torch.ops.clattn.attention_backward.default, bargs)


class Block(torch.nn.Module):
    def __init__(self, width=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(width, width)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.kv_heads, self.d).unbind(2)
        a = ct.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                            is_causal=True, enable_gqa=True)
        b = flash_attn_func(q.transpose(1, 2), k, v, causal=True, window_size=(5, 0),
                            softcap=4.0)
        return self.o(a.transpose(1, 2).reshape(B, S, -1) + b.reshape(B, S, -1))


def test_torch_compile_fullgraph_matches_eager():
    ct._context = backend_context("native")
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(2, 24, 64)
    eager = m(x)
    g_eager = torch.autograd.grad(eager.square().sum(), list(m.parameters()))
    compiled = torch.compile(m, fullgraph=True)
    out = compiled(x)
    g = torch.autograd.grad(out.square().sum(), list(m.parameters()))
    assert torch.allclose(out, eager, atol=1e-5, rtol=1e-5)
    for a, b in zip(g, g_eager):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_threads_calling_one_context_match_one_thread():
    ct._context = backend_context("native")
    q, k, v = leaves((2, 4, 48, 32), (2, 2, 48, 32), (2, 2, 48, 32))
    d_out = torch.randn(2, 4, 48, 32)

    def once():
        out = ct.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return (out.detach(),) + grads(out, (q, k, v), d_out)

    want = once()
    results = in_threads(once, threads=4, each=4)
    for r in results:
        assert all(torch.equal(a, b) for a, b in zip(r, want))


def test_readme_example_runs():
    # The README's Python example, as a user would paste it.
    import os
    import re
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    blocks = re.findall(r"```python\n(.*?)```", open(readme).read(), re.S)
    assert blocks, "README.md has no ```python example"
    ct._context = backend_context("native")
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    q, out = scope["q"], scope["out"]
    ref_in = [scope[n].detach().double().requires_grad_() for n in ("q", "k", "v")]
    ref = F.scaled_dot_product_attention(*ref_in, is_causal=True, enable_gqa=True)
    ref.square().mean().backward()
    assert close(out, ref, "f32") and close(q.grad, ref_in[0].grad, "f32")


def test_inference_runs_the_kernel_directly_with_the_same_bytes():
    # Without autograd the wrappers call the op's kernel directly, skipping
    # the dispatcher; the bytes are the op's.
    ct._context = backend_context("native")
    q, k, v = leaves((2, 19, 4, 16), (2, 23, 2, 16), (2, 23, 2, 16))
    with torch.no_grad():
        fast = flash_attn_func(q, k, v, causal=True, window_size=(7, 0))
    via_op, _ = torch.ops.clattn.attention_forward(q.detach(), k.detach(), v.detach(), None,
                                                   None, None, None, None, None, None, None, 2,
                                                   True, 8, -1,
                                                   1 / math.sqrt(16), 0.0, 0.0, 0, 0, "", "")
    assert not fast.requires_grad and torch.equal(fast, via_op)


def sink_reference(q, k, v, sinks, d_out, *, causal, scale):
    """gpt-oss's sinks in float64 by autograd: a column of the head's logit
    joins the scores, and its weight is dropped before P V; the causal mask
    aligned bottom-right. Returns (o, lse, dq, dk, dv, d_sinks)."""
    x = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    qd, kd, vd, sd = x
    B, sq, H, D = qd.shape
    group = H // kd.shape[2]
    kx, vx = kd.repeat_interleave(group, 2), vd.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kx) * scale
    sk = kx.shape[1]
    if causal:
        i = torch.arange(sq).view(-1, 1) + (sk - sq)
        s = s.masked_fill(torch.arange(sk).view(1, -1) > i, float("-inf"))
    col = sd.view(1, H, 1, 1).expand(B, H, sq, 1)
    full = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    p = torch.softmax(full, dim=-1)[..., :-1]
    o = torch.einsum("bhqk,bkhd->bqhd", p, vx)
    g = torch.autograd.grad(o, x, d_out.double())
    return (o.detach(), lse.detach()) + tuple(t.detach() for t in g)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_learnable_sink_matches_float64(backend, dtype):
    # FlashAttention-4's learnable_sink through flash_attn_func: O, the LSE
    # (the sink in it), dq, dk, dv and the sinks' gradient, with GQA and a
    # bottom-right causal mask whose first rows see no key (O 0, L = sink).
    B, sq, sk, H, Hk, D = 2, 30, 21, 4, 2, 32
    q, k, v = leaves((B, sq, H, D), (B, sk, Hk, D), (B, sk, Hk, D), dtype=DTYPES[dtype])
    sinks = torch.tensor([1.5, -0.5, 0.0, 3.0]).requires_grad_()
    d_out = torch.randn(B, sq, H, D).to(DTYPES[dtype])
    out, lse, _ = flash_attn_func(q, k, v, causal=True, learnable_sink=sinks,
                                  return_attn_probs=True)
    ref = sink_reference(q, k, v, sinks, d_out, causal=True, scale=1 / math.sqrt(D))
    assert close(out, ref[0], dtype)
    assert torch.allclose(lse.double(), ref[1], atol=1e-3)
    got = torch.autograd.grad(out, (q, k, v, sinks), d_out)
    assert got[3].dtype == torch.float32 and got[3].shape == (H,)
    for g, want in zip(got, ref[2:]):
        assert close(g, want, dtype)
    # no sinks at -inf: the plain call's bytes
    plain = flash_attn_func(q, k, v, causal=True)
    none = flash_attn_func(q, k, v, causal=True, learnable_sink=torch.full((H,), -math.inf))
    assert torch.equal(plain, none)
    with pytest.raises(clattn.InvalidArgument):
        flash_attn_func(q, k, v, learnable_sink=torch.zeros(H + 1))
