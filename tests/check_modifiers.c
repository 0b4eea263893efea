/* The kernel tests of the score modifiers (softcap, ALiBi, dropout) and
 * of dropout's mask. */
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

/* The score modifiers against the float64 reference on every variant and
 * op, in float32 and bf16: softcap (scores pushed past the cap by large
 * logits), ALiBi, dropout, and all three at once, with GQA, both causal
 * alignments, a window, offsets and batch. */
static const modifier_case modifiers[] = {
    {{.q_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 32, .causal = 1, .q_gain = 4}, 5.0f, 0,
         0.0f, 0, 0, 0},
    {{.q_seq = 33, .kv_seq = 50, .heads = 8, .kv_heads = 4, .head_dim = 64, .window = 9}, 0.0f, 1,
         0.0f, 40, 31, 0},
    {{.batch = 2, .q_seq = 29, .heads = 4, .kv_heads = 1, .head_dim = 16, .causal = 1}, 0.0f, 0,
         0.3f, 0, 0, 0},
    {{.q_seq = 20, .kv_seq = 45, .heads = 8, .kv_heads = 2, .head_dim = 32,
         .causal = CLATTN_CAUSAL_BOTTOM_RIGHT, .q_gain = 3}, 4.0f, 1, 0.2f, 7, 5, 0},
    /* a cap far above the scores: as no cap, where tanh's 1 - e form loses
     * all but a few ulps of 1 (an error in O of 1.35 at 1e8) */
    {{.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 32, .causal = 1}, 1e8f, 0, 0.0f, 0, 0,
         0},
    /* sinks, where the first rows see no key (bottom-right, kv_seq <
     * q_seq) and GQA; then with softcap, ALiBi and dropout, and a window
     * with a right side (also in bf16) */
    {{.q_seq = 40, .kv_seq = 25, .heads = 8, .kv_heads = 2, .head_dim = 64,
         .causal = CLATTN_CAUSAL_BOTTOM_RIGHT, .q_gain = 3}, 0.0f, 0, 0.0f, 0, 0, 1},
    {{.batch = 2, .q_seq = 35, .kv_seq = 48, .heads = 4, .kv_heads = 4, .head_dim = 40,
         .causal = 1, .window = 20, .window_right = 6, .q_gain = 2}, 6.0f, 1, 0.25f, 3, 9, 1},
};
/* The case with all three, also in bf16; and dropout alone at kv_offset
 * 0, where mma's keys start on a Philox block (at ALL_MODIFIERS' 5 each
 * row draws one block more), in bf16 too on mma. */

clattn_shape modifier_shape(const modifier_case *m, uint64_t seed)
{
    clattn_shape s = to_shape(&m->c);
    s.softcap = m->softcap;
    s.alibi_slopes = m->alibi ? slopes8 : NULL;
    s.dropout_p = m->dropout_p;
    s.dropout_seed = seed * 0x9E3779B97F4A7C15ull;
    s.dropout_offset = seed;
    s.q_offset = m->q_offset;
    s.kv_offset = m->kv_offset;
    s.sinks = m->sinks ? sinks8 : NULL;
    return s;
}

START_TEST(modifier_sweep)
{
    const clattn_shape s = modifier_shape(&modifiers[_i], 5000u + (uint64_t)_i);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, &s, case_gain(&modifiers[_i].c), 5000u + (uint64_t)_i);
        const int bf16 = _i == ALL_MODIFIERS || _i == SINKS_ALL ||
                         (_i == DROPOUT_ALIGNED && !strcmp(current_variant, "mma"));
        if (bf16 && dtype_runs(CLATTN_DTYPE_BF16)) {
            clattn_shape h = s;
            h.dtype = CLATTN_DTYPE_BF16;
            check_ops_16(ctx, &h, case_gain(&modifiers[_i].c), 5000u + (uint64_t)_i);
        }
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* The case with all three modifiers, and the one with sinks too, on tiled
 * alone, in float32. */
START_TEST(modifier_tiled)
{
    clattn_context *ctx = test_variant_context("tiled");
    ck_assert_ptr_nonnull(ctx);
    current_variant = "tiled";
    const int cases[2] = {ALL_MODIFIERS, SINKS_ALL};
    for (int i = 0; i < 2; ++i) {
        const clattn_shape s = modifier_shape(&modifiers[cases[i]], 5000u + (uint64_t)cases[i]);
        check_ops(ctx, &s, case_gain(&modifiers[cases[i]].c), 5000u + (uint64_t)cases[i]);
    }
    clattn_context_destroy(ctx);
}
END_TEST

/* Dropout's mask: clattn_dropout_mask() against the tests' own Philox
 * (its known answers first), bit for bit, at odd and large offsets, both
 * alignments, packed; the kept fraction within binomial bounds; p = 0
 * keeps all and runs as no dropout, bit for bit. */
START_TEST(dropout_mask)
{
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
         0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int i = 0; i < 3; ++i) {
        uint32_t out[4];
        ref_philox(kat[i], kat[i] + 4, out);
        ck_assert_mem_eq(out, kat[i] + 6, sizeof out);
    }
    uint32_t cu_q[4] = {0, 30, 30, 77}, cu_kv[4] = {0, 41, 50, 64};
    const struct {
        uint32_t batch, q, kv, heads, q_offset, kv_offset;
        int causal, packed;
        float p;
    } cases[] = {
        {2, 64, 64, 4, 0, 0, 1, 0, 0.3f},
        {1, 33, 70, 3, 4000000000u, 4000000001u, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0.5f},
        {3, 80, 70, 2, 5, 3, 0, 1, 0.1f},
        {1, 10, 7, 1, 0, 0, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0.9f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; ++c) {
        clattn_shape s = clattn_shape_default();
        s.batch = cases[c].batch;
        s.q_seq = cases[c].q;
        s.kv_seq = cases[c].kv;
        s.num_heads = s.num_kv_heads = cases[c].heads;
        s.head_dim = 8;
        s.causal = cases[c].causal;
        s.q_offset = cases[c].q_offset;
        s.kv_offset = cases[c].kv_offset;
        s.dropout_p = cases[c].p;
        s.dropout_seed = 0xfeedfacecafebeefull + c;
        s.dropout_offset = 0x100000000ull * c + 7u;
        if (cases[c].packed) {
            s.cu_seqlens_q = cu_q;
            s.cu_seqlens_kv = cu_kv;
        }
        uint8_t *keep = malloc((size_t)s.q_seq * s.kv_seq);
        ck_assert_ptr_nonnull(keep);
        size_t kept = 0, all = 0;
        for (uint32_t b = 0; b < s.batch; ++b)
            for (uint32_t h = 0; h < s.num_heads; ++h) {
                ck_assert_status(clattn_dropout_mask(&s, b, h, keep), CLATTN_OK);
                clattn_shape one = s;
                if (cases[c].packed) {
                    one.q_seq = cu_q[b + 1] - cu_q[b];
                    one.kv_seq = cu_kv[b + 1] - cu_kv[b];
                }
                for (uint32_t pos = 0; pos < one.q_seq; ++pos)
                    for (uint32_t t = 0; t < one.kv_seq; ++t) {
                        const int want = ref_dropout(&one, b, h, pos, t) != 0.0;
                        ck_assert_msg(keep[(size_t)pos * one.kv_seq + t] == want,
                                      "case %zu b %u h %u (%u, %u): mask %d, reference %d", c, b,
                                      h, pos, t, keep[(size_t)pos * one.kv_seq + t], want);
                        kept += (size_t)want;
                        ++all;
                    }
            }
        /* within 5 standard deviations of the binomial's mean: p rounded
         * up to a multiple of 2^-8, the draws' resolution */
        const double q = 1.0 - ceil((double)cases[c].p * 256.0) / 256.0, sd = sqrt(q * (1.0 - q) / (double)all);
        ck_assert_msg(fabs((double)kept / (double)all - q) <= 5.0 * sd + 1e-12,
                      "case %zu keeps %zu of %zu, expected fraction %g", c, kept, all, q);
        /* p = 0 keeps every pair */
        s.dropout_p = 0.0f;
        ck_assert_status(clattn_dropout_mask(&s, 0, 0, keep), CLATTN_OK);
        for (size_t i = 0; i < (size_t)s.q_seq * s.kv_seq && !cases[c].packed; ++i)
            ck_assert_int_eq(keep[i], 1);
        free(keep);
    }
    /* p = 0 with a seed runs as no dropout at all */
    const shape_case sc = {.q_seq = 30, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape a = to_shape(&sc), b = a;
    b.dropout_seed = 99;
    b.dropout_offset = 5;
    problem pr;
    problem_make(&pr, &a, 77, 1.0f);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        float *o1 = nan_array(pr.nq), *o2 = nan_array(pr.nq), *l1 = nan_array(pr.nlse),
              *l2 = nan_array(pr.nlse);
        ck_assert_status(clattn_forward(ctx, &a, pr.q, pr.k, pr.v, o1, l1), CLATTN_OK);
        ck_assert_status(clattn_forward(ctx, &b, pr.q, pr.k, pr.v, o2, l2), CLATTN_OK);
        ck_assert_mem_eq(o1, o2, pr.nq * sizeof(float));
        ck_assert_mem_eq(l1, l2, pr.nlse * sizeof(float));
        free(o1);
        free(o2);
        free(l1);
        free(l2);
        clattn_context_destroy(ctx);
    }
    problem_free(&pr);
}
END_TEST

modifier_tests get_modifier_tests(void)
{
    modifier_tests t = {{modifier_sweep, N(modifiers)}, modifier_tiled, dropout_mask};
    return t;
}
