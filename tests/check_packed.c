/* The kernel tests of packed sequences, global positions and a sequence
 * split into chunks: each against the whole or the float64 reference. */
#define CL_TARGET_OPENCL_VERSION 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

/* Packed variable-length sequences: lengths per sequence (query, key),
 * with GQA, both causal alignments, a window, offsets, empty and one-token
 * sequences, lengths off every tile size, and rows past the last prefix
 * sum on both sides. */

static const packed_case packed[] = {
    {2, 1, 16, CLATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 5, {5, 0, 1, 17, 33}, {5, 3, 1, 12, 33}},
    {2, 2, 32, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 4, {7, 20, 1, 3}, {12, 9, 0, 3}},
    {4, 2, 64, 0, 6, 3, 1, 2, {65, 31}, {40, 70}},
    {3, 3, 40, CLATTN_CAUSAL_BOTTOM_RIGHT, 9, 2, 0, 3, {1, 50, 0}, {66, 17, 0}},
};

/* Sequence i of a packed shape alone: batch 1, its lengths. */
static clattn_shape sequence_alone(const clattn_shape *s, uint32_t i)
{
    clattn_shape one = *s;
    one.batch = 1;
    one.q_seq = s->cu_seqlens_q[i + 1] - s->cu_seqlens_q[i];
    one.kv_seq = s->cu_seqlens_kv[i + 1] - s->cu_seqlens_kv[i];
    one.cu_seqlens_q = one.cu_seqlens_kv = NULL;
    return one;
}

/* The case as a shape over cu (2 * (count + 1) entries), with two rows
 * past the last prefix sum on each side. */
static clattn_shape packed_shape(const packed_case *c, uint32_t *cu)
{
    clattn_shape s = clattn_shape_default();
    s.batch = c->count;
    s.num_heads = c->heads;
    s.num_kv_heads = c->kv_heads;
    s.head_dim = c->head_dim;
    s.causal = c->causal;
    s.window = c->window;
    s.q_offset = c->q_offset;
    s.kv_offset = c->kv_offset;
    uint32_t *cq = cu, *ck = cu + c->count + 1;
    cq[0] = ck[0] = 0;
    for (uint32_t i = 0; i < c->count; ++i) {
        cq[i + 1] = cq[i] + c->q[i];
        ck[i + 1] = ck[i] + c->kv[i];
    }
    s.q_seq = cq[c->count] + 2;
    s.kv_seq = ck[c->count] + 2;
    s.cu_seqlens_q = cq;
    s.cu_seqlens_kv = ck;
    return s;
}

/* The float64 reference of a packed problem, sequence by sequence: O, its
 * magnitudes and the LSE (float O and LSE into p->o and p->lse), then dQ,
 * dK and dV with theirs; rows no sequence writes are O 0, LSE empty, and
 * zero gradients. */
static void packed_reference(problem *p, double *o, double *o_mag, double *lse, double *g[6])
{
    const clattn_shape *s = &p->s;
    const size_t qrow = (size_t)s->num_heads * s->head_dim;
    const size_t kvrow = (size_t)s->num_kv_heads * s->head_dim, lrow = 2u * s->num_heads;
    memset(o, 0, p->nq * sizeof *o);
    memset(o_mag, 0, p->nq * sizeof *o_mag);
    for (size_t j = 0; j < p->nlse; ++j)
        lse[j] = -1e30;
    for (int i = 0; i < 6; ++i)
        memset(g[i], 0, (i < 2 ? p->nq : p->nkv) * sizeof(double));
    for (int pass = 0; pass < 2; ++pass)
        for (uint32_t i = 0; i < s->batch; ++i) {
            const clattn_shape one = sequence_alone(s, i);
            if (!one.q_seq || !one.kv_seq)
                continue;
            const size_t q0 = s->cu_seqlens_q[i], k0 = s->cu_seqlens_kv[i];
            problem sub = {one,
                           one.q_seq * qrow,
                           one.kv_seq * kvrow,
                           one.q_seq * lrow,
                           p->q + q0 * qrow,
                           p->k + k0 * kvrow,
                           p->v + k0 * kvrow,
                           p->d_out + q0 * qrow,
                           p->o + q0 * qrow,
                           p->lse + q0 * lrow,
                           i};
            if (pass == 0) {
                ref_forward(&sub, o + q0 * qrow, o_mag + q0 * qrow, lse + q0 * lrow);
                for (size_t j = 0; j < sub.nq; ++j)
                    sub.o[j] = (float)o[q0 * qrow + j];
                for (size_t j = 0; j < sub.nlse; ++j)
                    sub.lse[j] = (float)lse[q0 * lrow + j];
            } else {
                ref_backward(&sub, g[0] + q0 * qrow, g[1] + q0 * qrow, g[2] + k0 * kvrow,
                             g[3] + k0 * kvrow, g[4] + k0 * kvrow, g[5] + k0 * kvrow);
            }
        }
}

/* packed_ops with score modifiers: softcap, ALiBi slopes (or NULL) and
 * dropout, Q times q_gain, and the caller's functions of fns (or NULL). */
static void packed_ops_with(clattn_context *ctx, const packed_case *c, uint64_t seed,
                            float q_gain, const float *slopes, float dropout_p,
                            const clattn_shape *fns)
{
    uint32_t cu[14];
    clattn_shape s = packed_shape(c, cu);
    if (fns) {
        s.score_fn = fns->score_fn;
        s.mask_fn = fns->mask_fn;
        s.score_params = fns->score_params;
        s.score_params_count = fns->score_params_count;
        s.score_native = fns->score_native;
        s.score_ds_native = fns->score_ds_native;
        s.mask_native = fns->mask_native;
    }
    /* alone, a sequence's b is 0: where the draw or the functions take b,
     * only the first is compared with its packed rows */
    const int by_b = dropout_p > 0.0f || fns;
    s.softcap = q_gain > 1.0f ? 2.0f : 0.0f;
    s.alibi_slopes = slopes;
    s.dropout_p = dropout_p;
    s.dropout_seed = seed;
    s.dropout_offset = 11;
    problem p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.nq = (size_t)s.q_seq * s.num_heads * s.head_dim;
    p.nkv = (size_t)s.kv_seq * s.num_kv_heads * s.head_dim;
    p.nlse = (size_t)s.q_seq * s.num_heads * 2;
    float *in[6] = {NULL};
    const size_t n_in[6] = {p.nq, p.nkv, p.nkv, p.nq, p.nq, p.nlse};
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < 6; ++i) {
        in[i] = nan_array(n_in[i]);
        for (size_t j = 0; j < n_in[i] && i < 4; ++j) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            in[i][j] = (float)((state >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0) *
                       (i == 0 ? q_gain : 1.0f);
        }
    }
    p.q = in[0], p.k = in[1], p.v = in[2], p.d_out = in[3], p.o = in[4], p.lse = in[5];
    double *o_ref = doubles(p.nq), *o_mag = doubles(p.nq), *lse_ref = doubles(p.nlse);
    double *g[6] = {doubles(p.nq), doubles(p.nq), doubles(p.nkv),
                    doubles(p.nkv), doubles(p.nkv), doubles(p.nkv)};
    packed_reference(&p, o_ref, o_mag, lse_ref, g);

    float *o = nan_array(p.nq), *lse = nan_array(p.nlse), *gq = nan_array(p.nq);
    float *gk = nan_array(p.nkv), *gv = nan_array(p.nkv);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    expect_close("packed forward O", &s, 1.0f, o, o_ref, o_mag, p.nq);
    expect_lse(&s, lse, lse_ref, p.nlse);
    ck_assert_status(clattn_grad_v(ctx, &s, p.d_out, p.q, p.k, p.lse, gv), CLATTN_OK);
    expect_close("packed grad-V", &s, 1.0f, gv, g[4], g[5], p.nkv);
    ck_assert_status(clattn_grad_q(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq), CLATTN_OK);
    expect_close("packed grad-Q", &s, 1.0f, gq, g[0], g[1], p.nq);
    ck_assert_status(clattn_grad_k(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gk), CLATTN_OK);
    expect_close("packed grad-K", &s, 1.0f, gk, g[2], g[3], p.nkv);
    float *fill[3] = {gq, gk, gv};
    const size_t nfill[3] = {p.nq, p.nkv, p.nkv};
    for (int i = 0; i < 3; ++i)
        for (size_t j = 0; j < nfill[i]; ++j)
            fill[i][j] = NAN;
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq, gk, gv),
                     CLATTN_OK);
    expect_close("packed backward dQ", &s, 1.0f, gq, g[0], g[1], p.nq);
    expect_close("packed backward dK", &s, 1.0f, gk, g[2], g[3], p.nkv);
    expect_close("packed backward dV", &s, 1.0f, gv, g[4], g[5], p.nkv);

    /* accumulate adds the same gradients again; rows no sequence writes
     * keep what they held. */
    clattn_shape acc = s;
    acc.accumulate = 1;
    ck_assert_status(clattn_backward(ctx, &acc, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq, gk, gv),
                     CLATTN_OK);
    for (int i = 0; i < 6; ++i)
        for (size_t j = 0; j < (i < 2 ? p.nq : p.nkv); ++j)
            g[i][j] *= 2.0;
    expect_close("packed accumulated dQ", &s, 1.0f, gq, g[0], g[1], p.nq);
    expect_close("packed accumulated dK", &s, 1.0f, gk, g[2], g[3], p.nkv);
    expect_close("packed accumulated dV", &s, 1.0f, gv, g[4], g[5], p.nkv);

    /* Each sequence alone gives bitwise what the packed call gave it. */
    const size_t qrow = (size_t)s.num_heads * s.head_dim, lrow = 2u * s.num_heads;
    for (uint32_t i = 0; i < s.batch; ++i) {
        const clattn_shape one = sequence_alone(&s, i);
        if (!one.q_seq || !one.kv_seq || (by_b && i > 0))
            continue;
        const size_t q0 = cu[i], k0 = cu[s.batch + 1 + i];
        const size_t kvrow = (size_t)s.num_kv_heads * s.head_dim;
        float *o1 = nan_array(one.q_seq * qrow), *l1 = nan_array(one.q_seq * lrow);
        ck_assert_status(clattn_forward(ctx, &one, p.q + q0 * qrow, p.k + k0 * kvrow,
                                        p.v + k0 * kvrow, o1, l1),
                         CLATTN_OK);
        ck_assert_msg(!memcmp(o1, o + q0 * qrow, one.q_seq * qrow * sizeof(float)) &&
                          !memcmp(l1, lse + q0 * lrow, one.q_seq * lrow * sizeof(float)),
                      "sequence %u alone differs from the packed call on %s/%s", i,
                      test_backend, current_variant);
        free(o1);
        free(l1);
    }

    /* 16-bit: the packed call gives each sequence bitwise what it gets alone. */
    if (dtype_runs(CLATTN_DTYPE_BF16)) {
        clattn_shape h = s;
        h.dtype = CLATTN_DTYPE_BF16;
        uint16_t *hq = halves(p.nq), *hk = halves(p.nkv), *hv = halves(p.nkv);
        uint16_t *ho = halves(p.nq), *hpack = halves(p.nq), *hone = halves(p.nq);
        /* the inputs rounded in place, and the reference from them */
        round_16(p.q, hq, p.nq, CLATTN_DTYPE_BF16);
        round_16(p.k, hk, p.nkv, CLATTN_DTYPE_BF16);
        round_16(p.v, hv, p.nkv, CLATTN_DTYPE_BF16);
        packed_reference(&p, o_ref, o_mag, lse_ref, g);
        ck_assert_status(clattn_forward(ctx, &h, hq, hk, hv, hpack, lse), CLATTN_OK);
        for (uint32_t i = 0; i < s.batch; ++i) {
            clattn_shape one = sequence_alone(&h, i);
            if (!one.q_seq || !one.kv_seq || (by_b && i > 0))
                continue;
            const size_t q0 = cu[i], k0 = cu[s.batch + 1 + i];
            const size_t kvrow = (size_t)s.num_kv_heads * s.head_dim;
            ck_assert_status(clattn_forward(ctx, &one, hq + q0 * qrow, hk + k0 * kvrow,
                                            hv + k0 * kvrow, hone, o),
                             CLATTN_OK);
            ck_assert_msg(!memcmp(hone, hpack + q0 * qrow, one.q_seq * qrow * 2),
                          "bf16 sequence %u alone differs from the packed call", i);
        }
        /* ... and O stays within bf16's bound against the float64 reference. */
        expect_close_16("packed bf16 O", &h, hpack, o_ref, o_mag, p.nq);
        free(hq), free(hk), free(hv), free(ho), free(hpack), free(hone);
    }

    double *frees[] = {o_ref, o_mag, lse_ref, g[0], g[1], g[2], g[3], g[4], g[5]};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    float *ffrees[] = {o, lse, gq, gk, gv, in[0], in[1], in[2], in[3], in[4], in[5]};
    for (size_t i = 0; i < sizeof ffrees / sizeof *ffrees; ++i)
        free(ffrees[i]);
}

static void packed_ops(clattn_context *ctx, const packed_case *c, uint64_t seed)
{
    packed_ops_with(ctx, c, seed, 1.0f, NULL, 0.0f, NULL);
}

START_TEST(packed_sweep)
{
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        packed_ops(ctx, &packed[_i], 2000u + (uint64_t)_i);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* Global positions: a continuation (bottom-right causal, q_offset = kv_seq
 * - q_seq), chunks in the middle of a sequence with causal and window masks
 * crossing them, queries before every key (empty rows), keys past the
 * queries, GQA, MQA, batch and a padded head_dim. */
static const struct {
    shape_case c;
    uint32_t q_offset, kv_offset;
} offsets[] = {
    {{.q_seq = 20, .kv_seq = 50, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 1}, 30, 0},
    {{.q_seq = 33, .kv_seq = 40, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1,
         .window = 9}, 70, 50},
    {{.batch = 2, .q_seq = 17, .kv_seq = 23, .heads = 3, .kv_heads = 1, .head_dim = 7,
         .causal = 1}, 5, 12},
    {{.q_seq = 40, .kv_seq = 30, .heads = 2, .head_dim = 100, .window = 6}, 100, 90},
    {{.q_seq = 65, .kv_seq = 37, .heads = 4, .kv_heads = 1, .head_dim = 32, .causal = 1,
         .window = 20, .q_gain = 4}, 37, 0},
    {{.q_seq = 9, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 24, .window = 5}, 0, 3},
};
START_TEST(offset_sweep)
{
    clattn_shape s = to_shape(&offsets[_i].c);
    s.q_offset = offsets[_i].q_offset;
    s.kv_offset = offsets[_i].kv_offset;
    run_shape(&s, case_gain(&offsets[_i].c), 1500u + (uint64_t)_i);
}

/* A sequence split into chunks equals the whole: queries cut at one point
 * and keys at two, the causal and window masks crossing the cuts (the
 * chunk pair at the start has equal lengths, as causal with both offsets 0
 * needs). Each query chunk's forwards over the key chunks, with their
 * offsets, merge (clattn_merge, in place) into the whole's O and LSE; the
 * backward of every (query chunk, key chunk) pair, given the whole's O and
 * LSE, accumulates into dQ, dK and dV. On every variant, in float32. */
static const shape_case splits[] = {
    {.q_seq = 45, .heads = 4, .kv_heads = 2, .head_dim = 32, .causal = 1, .window = 13},
    {.q_seq = 45, .heads = 3, .head_dim = 20, .causal = 1},
    {.q_seq = 45, .heads = 2, .kv_heads = 1, .head_dim = 64, .window = 9},
    {.q_seq = 45, .heads = 4, .kv_heads = 2, .head_dim = 8, .q_gain = 4},
};
static void split_check(const clattn_shape *shape, uint64_t seed, float q_gain);
START_TEST(split_sweep_offsets)
{
    const clattn_shape whole = to_shape(&splits[_i]);
    split_check(&whole, 4000u + (uint64_t)_i, case_gain(&splits[_i]));
}
END_TEST

/* The score modifiers (see modifier_sweep) over the same chunks: ALiBi's
 * |P - T| and dropout's draws take global positions, so the chunks' sum is
 * the whole. */
START_TEST(split_modifiers)
{
    clattn_shape whole = to_shape(&splits[_i]);
    whole.softcap = 2.5f;
    whole.alibi_slopes = slopes8;
    whole.dropout_p = 0.25f;
    whole.dropout_seed = 0x0123456789abcdefull;
    whole.dropout_offset = 3;
    split_check(&whole, 4100u + (uint64_t)_i, 3.0f);
}
END_TEST

static void split_check(const clattn_shape *shape, uint64_t seed, float q_gain)
{
    const clattn_shape whole = *shape;
    const uint32_t q_cuts[] = {0, 15, 45}, kv_cuts[] = {0, 15, 32, 45};
    const size_t qrow = (size_t)whole.num_heads * whole.head_dim;
    const size_t kvrow = (size_t)whole.num_kv_heads * whole.head_dim;
    const size_t lrow = 2u * whole.num_heads;
    problem p;
    problem_make(&p, &whole, seed, q_gain);
    double *o_ref = doubles(p.nq), *o_mag = doubles(p.nq), *lse_ref = doubles(p.nlse);
    double *dq = doubles(p.nq), *dq_mag = doubles(p.nq), *dk = doubles(p.nkv);
    double *dk_mag = doubles(p.nkv), *dv = doubles(p.nkv), *dv_mag = doubles(p.nkv);
    ref_forward(&p, o_ref, o_mag, lse_ref);
    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    float *o = nan_array(p.nq), *lse = nan_array(p.nlse), *o_part = nan_array(p.nq);
    float *lse_part = nan_array(p.nlse), *gq = nan_array(p.nq), *gk = nan_array(p.nkv);
    float *gv = nan_array(p.nkv);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        for (int a = 0; a + 1 < 3; ++a) {
            const uint32_t q0 = q_cuts[a], nq = q_cuts[a + 1] - q0;
            for (int b = 0; b + 1 < 4; ++b) {
                clattn_shape c = whole;
                c.q_seq = nq;
                c.kv_seq = kv_cuts[b + 1] - kv_cuts[b];
                c.q_offset = q0;
                c.kv_offset = kv_cuts[b];
                float *ko = p.k + kv_cuts[b] * kvrow, *vo = p.v + kv_cuts[b] * kvrow;
                float *into = b ? o_part : o + q0 * qrow, *lse_into = b ? lse_part : lse + q0 * lrow;
                ck_assert_status(clattn_forward(ctx, &c, p.q + q0 * qrow, ko, vo, into, lse_into),
                                 CLATTN_OK);
                if (b)
                    ck_assert_status(clattn_merge(ctx, &c, o + q0 * qrow, lse + q0 * lrow,
                                                  o_part, lse_part, o + q0 * qrow,
                                                  lse + q0 * lrow),
                                     CLATTN_OK);
            }
        }
        expect_close("split forward O", &whole, 1.0f, o, o_ref, o_mag, p.nq);
        expect_lse(&whole, lse, lse_ref, p.nlse);

        memset(gq, 0, p.nq * sizeof(float));
        memset(gk, 0, p.nkv * sizeof(float));
        memset(gv, 0, p.nkv * sizeof(float));
        for (int a = 0; a + 1 < 3; ++a)
            for (int b = 0; b + 1 < 4; ++b) {
                clattn_shape c = whole;
                c.q_seq = q_cuts[a + 1] - q_cuts[a];
                c.kv_seq = kv_cuts[b + 1] - kv_cuts[b];
                c.q_offset = q_cuts[a];
                c.kv_offset = kv_cuts[b];
                c.accumulate = 1;
                const size_t qa = q_cuts[a] * qrow, ka = kv_cuts[b] * kvrow;
                ck_assert_status(clattn_backward(ctx, &c, p.q + qa, p.k + ka, p.v + ka, p.o + qa,
                                                 p.lse + q_cuts[a] * lrow, p.d_out + qa, gq + qa,
                                                 gk + ka, gv + ka),
                                 CLATTN_OK);
            }
        expect_close("split dQ", &whole, 1.0f, gq, dq, dq_mag, p.nq);
        expect_close("split dK", &whole, 1.0f, gk, dk, dk_mag, p.nkv);
        expect_close("split dV", &whole, 1.0f, gv, dv, dv_mag, p.nkv);

        /* The device's merge of the last two parts gives the host's. */
        if (strcmp(test_backend, "native")) {
            clattn_shape c = whole;
            cl_context cctx = clattn_context_cl_context(ctx);
            cl_int err;
            const size_t ob = p.nq * sizeof(float), lb = p.nlse * sizeof(float);
            cl_mem bo = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, ob, o, &err);
            ck_assert_int_eq(err, CL_SUCCESS);
            cl_mem bl = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, lb, lse, &err);
            ck_assert_int_eq(err, CL_SUCCESS);
            cl_mem bo2 = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, ob, p.o, &err);
            ck_assert_int_eq(err, CL_SUCCESS);
            cl_mem bl2 = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, lb, p.lse,
                                        &err);
            ck_assert_int_eq(err, CL_SUCCESS);
            clattn_cl_tensor t1 = {bo, 0}, l1 = {bl, 0}, t2 = {bo2, 0}, l2 = {bl2, 0};
            ck_assert_status(clattn_merge_cl(ctx, &c, t1, l1, t2, l2, t1, l1, 0, NULL, NULL),
                             CLATTN_OK);
            ck_assert_status(clattn_merge(ctx, &c, o, lse, p.o, p.lse, o_part, lse_part),
                             CLATTN_OK);
            float *dev_o = nan_array(p.nq), *dev_l = nan_array(p.nlse);
            cl_command_queue queue = clattn_context_cl_queue(ctx);
            ck_assert_int_eq(clEnqueueReadBuffer(queue, bo, CL_TRUE, 0, ob, dev_o, 0, NULL, NULL),
                             CL_SUCCESS);
            ck_assert_int_eq(clEnqueueReadBuffer(queue, bl, CL_TRUE, 0, lb, dev_l, 0, NULL, NULL),
                             CL_SUCCESS);
            for (size_t i = 0; i < p.nq; ++i)
                ck_assert_msg(fabsf(dev_o[i] - o_part[i]) <= 1e-6f * (1.0f + fabsf(o_part[i])),
                              "merge_cl O[%zu] %g, host %g", i, (double)dev_o[i], (double)o_part[i]);
            for (size_t i = 0; i < p.nlse; ++i)
                ck_assert_msg(fabsf(dev_l[i] - lse_part[i]) <= 1e-6f * (1.0f + fabsf(lse_part[i])),
                              "merge_cl LSE[%zu] %g, host %g", i, (double)dev_l[i],
                              (double)lse_part[i]);
            free(dev_o);
            free(dev_l);
            cl_mem bufs[4] = {bo, bl, bo2, bl2};
            for (int i = 0; i < 4; ++i)
                clReleaseMemObject(bufs[i]);
        }
        clattn_context_destroy(ctx);
    }
    void *frees[] = {o_ref, o_mag, lse_ref, dq, dq_mag, dk, dk_mag, dv, dv_mag, o, lse,
                     o_part, lse_part, gq, gk, gv};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    problem_free(&p);
}

/* Packed sequences with every modifier: dropout's b is the sequence. */
START_TEST(packed_modifiers)
{
    packed_case c = packed[1];
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        packed_ops_with(ctx, &c, 2100u, 3.0f, slopes8, 0.3f, NULL);
        clattn_context_destroy(ctx);
    }
}
END_TEST


void packed_functions(clattn_context *ctx, uint64_t seed, const clattn_shape *fns)
{
    packed_ops_with(ctx, &packed[1], seed, 2.0f, NULL, 0.2f, fns);
}

packed_tests get_packed_tests(void)
{
    packed_tests t = {{packed_sweep, N(packed)},
                      {offset_sweep, N(offsets)},
                      {split_sweep_offsets, N(splits)},
                      {split_modifiers, 1},
                      packed_modifiers};
    return t;
}
