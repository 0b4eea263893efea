/* The API's calls and their results: the seed's conversion, visible
 * pairs, merge, positions near 2^32, accumulated gradients, the native
 * backend's threads, and one context shared by threads or one per thread. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_tests.h"
#include "harness.h"
#include "reference.h"

START_TEST(seed_block_conversion)
{
    const uint32_t causal[8] = {128, 0, 9u << 16 | 3, 64, 0, 0, 0, 0};
    clattn_shape s;
    ck_assert_status(clattn_shape_from_seed(causal, &s), CLATTN_OK);
    ck_assert(s.causal && s.q_seq == 128 && s.kv_seq == 128 && s.num_heads == 9 &&
              s.num_kv_heads == 3 && s.head_dim == 64 && s.window == 0 && s.batch == 1 &&
              s.scale == 0.0f);
    const uint32_t cross[8] = {10, 30, 4u << 16 | 4, 32, 7, 0, 0, 0};
    ck_assert_status(clattn_shape_from_seed(cross, &s), CLATTN_OK);
    ck_assert(!s.causal && s.kv_seq == 30 && s.window == 7);
    const uint32_t uneven[8] = {10, 10, 3u << 16 | 2, 32, 0, 0, 0, 0};
    ck_assert_status(clattn_shape_from_seed(uneven, &s), CLATTN_ERROR_HEADS_NOT_DIVISIBLE);
    const uint32_t no_heads[8] = {10, 10, 0, 32, 0, 0, 0, 0};
    ck_assert_status(clattn_shape_from_seed(no_heads, &s), CLATTN_ERROR_ZERO_SIZE);
    ck_assert_status(clattn_shape_from_seed(NULL, &s), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_shape_from_seed(cross, NULL), CLATTN_ERROR_NULL_POINTER);
}
END_TEST

START_TEST(visible_pairs)
{
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 4;
    s.num_heads = s.num_kv_heads = s.head_dim = 1;
    s.causal = 1;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 10);
    s.window = 2;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 7);
    /* Causal alignments where kv_seq != q_seq: top-left, query i sees keys
     * 0..i; bottom-right, the last query sees the last key. 4 queries on 6
     * keys: 1+2+3+4 and 3+4+5+6; 6 queries on 4 keys: 1+2+3+4+4+4 and
     * 0+0+1+2+3+4 (the first two rows see nothing). */
    s.window = 0;
    s.q_seq = 4;
    s.kv_seq = 6;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 10);
    s.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 18);
    s.q_seq = 6;
    s.kv_seq = 4;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 10);
    s.causal = CLATTN_CAUSAL_TOP_LEFT;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 18);
    /* Against counting the rule pair by pair, over many shapes, offsets and
     * right sides (with causal). */
    for (uint32_t q = 1; q < 12; ++q)
        for (uint32_t kv = 1; kv < 12; ++kv)
            for (uint32_t w = 0; w < 14; w += 3)
                for (int at = 0; at < 18; ++at) { /* none, top-left, bottom-right; offsets */
                    const int causal = at % 3;
                    s = clattn_shape_default();
                    s.q_offset = at / 3 % 3 == 1 ? 5 : 0;
                    s.kv_offset = at / 3 % 3 == 2 ? 7 : 0;
                    s.window_right = causal && at >= 9 ? w / 2 + 1 : 0;
                    s.batch = 2;
                    s.q_seq = q;
                    s.kv_seq = kv;
                    s.num_heads = 3;
                    s.num_kv_heads = 1;
                    s.head_dim = 4;
                    s.causal = causal;
                    s.window = w;
                    uint64_t count = 0;
                    for (uint32_t pos = 0; pos < q; ++pos)
                        for (uint32_t t = 0; t < kv; ++t)
                            count += (uint64_t)ref_visible(&s, pos, t);
                    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), count * 3 * 2);
                }
    s.num_kv_heads = 2;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 0);
    /* A right side needs causal, and fits an int. */
    s = clattn_shape_default();
    s.q_seq = s.kv_seq = 4;
    s.num_heads = s.num_kv_heads = s.head_dim = 1;
    s.window_right = 1;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_msg(strstr(clattn_last_error(), "window_right"), "%s", clattn_last_error());
    s.causal = 1;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 10 + 3);
    s.window_right = INT32_MAX - 1;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 16);
    s.window_right = INT32_MAX;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_OPTION);
    /* Sequences of 2^32 - 1 and positions near 2^32 count at once, in closed
     * form: causal, n (n + 1) / 2; with a window W at equal offsets (the last
     * position 2^32 - 1), W (W + 1) / 2 + (m - W) W. */
    s = clattn_shape_default();
    s.q_seq = s.kv_seq = UINT32_MAX;
    s.num_heads = s.num_kv_heads = s.head_dim = 1;
    s.causal = 1;
    const uint64_t n = UINT32_MAX;
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), n * (n + 1) / 2);
    s.q_seq = s.kv_seq = 1u << 31;
    s.q_offset = s.kv_offset = UINT32_MAX - (1u << 31);
    s.window = 1000;
    const uint64_t m = 1u << 31;
    ck_assert_uint_eq(clattn_shape_validate(&s), CLATTN_OK);
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 1000u * 1001u / 2 + (m - 1000) * 1000);
    /* A count past 2^64 saturates rather than wrapping: 2^40 pairs a head
     * by 2^24 heads, against 2^63 by 2^23. */
    s = clattn_shape_default();
    s.q_seq = s.kv_seq = 1u << 20;
    s.num_heads = s.num_kv_heads = 1u << 10;
    s.head_dim = 1;
    s.batch = 1u << 13;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), UINT64_C(1) << 63);
    s.batch = 1u << 14;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), UINT64_MAX);
    /* With offsets: causal and windows over global positions. */
    for (uint32_t qo = 0; qo < 20; qo += 7)
        for (uint32_t ko = 0; ko < 20; ko += 6)
            for (uint32_t w = 0; w < 14; w += 5)
                for (int causal = 0; causal < 2; ++causal) {
                    s = clattn_shape_default();
                    s.q_seq = 9;
                    s.kv_seq = 13;
                    s.num_heads = s.num_kv_heads = s.head_dim = 1;
                    s.causal = causal;
                    s.window = w;
                    s.q_offset = qo;
                    s.kv_offset = ko;
                    if (clattn_shape_validate(&s) != CLATTN_OK)
                        continue; /* causal at offsets 0 with unequal lengths */
                    uint64_t count = 0;
                    for (uint32_t pos = 0; pos < s.q_seq; ++pos)
                        for (uint32_t t = 0; t < s.kv_seq; ++t)
                            count += (uint64_t)ref_visible(&s, pos, t);
                    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), count);
                }
}
END_TEST

/* clattn_merge(): statuses, the union of two key sets, empty rows on either
 * side and both, in place. */
START_TEST(merge_rows)
{
    clattn_context *ctx = native_context(1);
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 4;
    s.num_heads = s.num_kv_heads = 1;
    s.head_dim = 2;
    const float e = -1e30f;
    /* Rows: both sides; left only; right only; neither. */
    float o1[8] = {1, 2, 3, 4, 0, 0, 0, 0}, l1[8] = {0.5f, 0.0f, 1.0f, 0.2f, e, e, e, e};
    float o2[8] = {5, 6, 0, 0, 7, 8, 0, 0}, l2[8] = {2.0f, 0.3f, e, e, -1.0f, 0.0f, e, e};
    float o[8], l[8];
    ck_assert_status(clattn_merge(NULL, &s, o1, l1, o2, l2, o, l), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_merge(ctx, NULL, o1, l1, o2, l2, o, l), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_merge(ctx, &s, o1, l1, NULL, l2, o, l), CLATTN_ERROR_NULL_POINTER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "o2 is NULL"));
    s.head_dim = 0;
    ck_assert_status(clattn_merge(ctx, &s, o1, l1, o2, l2, o, l), CLATTN_ERROR_ZERO_SIZE);
    s.head_dim = 2;
    ck_assert_status(clattn_merge(ctx, &s, o1, l1, o2, l2, o, l), CLATTN_OK);
    /* Row 0: weights exp(LSE_i) / (exp(LSE_1) + exp(LSE_2)), LSE = m + l. */
    const double a = exp(0.5 + 0.0), b = exp(2.0 + 0.3);
    ck_assert_double_eq_tol(o[0], (a * 1 + b * 5) / (a + b), 1e-6);
    ck_assert_double_eq_tol(o[1], (a * 2 + b * 6) / (a + b), 1e-6);
    ck_assert_double_eq_tol((double)l[0] + l[1], log(a + b), 1e-6);
    ck_assert_float_eq(l[0], 2.0f); /* the larger max */
    ck_assert_float_eq(o[2], 3.0f);
    ck_assert_float_eq(o[3], 4.0f);
    ck_assert_double_eq_tol((double)l[2] + l[3], 1.2, 1e-6);
    ck_assert_float_eq(o[4], 7.0f);
    ck_assert_float_eq(o[5], 8.0f);
    ck_assert_double_eq_tol((double)l[4] + l[5], -1.0, 1e-6);
    ck_assert_float_eq(o[6], 0.0f);
    ck_assert_float_eq(o[7], 0.0f);
    ck_assert_float_eq(l[6], e);
    ck_assert_float_eq(l[7], e);
    /* In place, into the first pair: the same result. */
    ck_assert_status(clattn_merge(ctx, &s, o1, l1, o2, l2, o1, l1), CLATTN_OK);
    ck_assert_mem_eq(o1, o, sizeof o);
    ck_assert_mem_eq(l1, l, sizeof l);
    /* A NaN partial (its LSE, or its O) makes its row NaN, beside a valid
     * or an empty other side; it never empties the row. */
    float n1[8] = {1, 2, NAN, 4, 1, 2, 0, 0}, m1[8] = {NAN, NAN, 1.0f, 0.2f, NAN, 0.0f, e, e};
    float n2[8] = {5, 6, 7, 8, 0, 0, 0, 0}, m2[8] = {2.0f, 0.3f, 0.1f, 0.0f, e, e, e, e};
    ck_assert_status(clattn_merge(ctx, &s, n1, m1, n2, m2, o, l), CLATTN_OK);
    for (int row = 0; row < 3; ++row) {
        ck_assert_msg(isnan(o[2 * row]) || row == 1, "row %d: O %g", row, (double)o[2 * row]);
        ck_assert_msg(isnan(o[2 * row + 1]) || row == 1, "row %d", row);
        ck_assert_msg(l[2 * row] > -1e29f || isnan(l[2 * row]), "row %d emptied", row);
    }
    ck_assert(isnan(o[2])); /* O1's NaN element reaches only its own element */
    ck_assert(isfinite(o[3]));
    ck_assert(isnan(l[1]) && isnan(l[5]));
    ck_assert(isfinite(l[2]) && isfinite(l[3]));
    ck_assert_float_eq(l[6], e);
    /* The pair (NaN, -1e30) is a NaN partial, not an empty side: its row is
     * NaN beside a valid or an empty other side. */
    float p1[4] = {NAN, e, NAN, e}, p2[4] = {2.0f, 0.3f, e, e};
    float q1[4] = {1, 2, 3, 4}, q2[4] = {5, 6, 7, 8};
    s.q_seq = s.kv_seq = 2;
    ck_assert_status(clattn_merge(ctx, &s, q1, p1, q2, p2, o, l), CLATTN_OK);
    for (int i = 0; i < 4; ++i)
        ck_assert_msg(isnan(o[i]), "O[%d] %g", i, (double)o[i]);
    ck_assert(isnan(l[1]) && isnan(l[3]));
    clattn_context_destroy(ctx);
}
END_TEST

/* With shape.accumulate the backward adds into dQ, dK and dV: twice from
 * zero is twice once; other ops ignore it. */
/* Positions up to 2^32 - 1: a chunk at the top of the range is masked as
 * the same chunk at 0 (the masks see only P - T), bit for bit. */
START_TEST(top_positions)
{
    clattn_context *ctx = native_context(2);
    clattn_shape s = small_shape();
    s.causal = 1;
    s.window = 5;
    problem p;
    problem_make(&p, &s, 21, 1.0f);
    float *o0 = nan_array(p.nq), *l0 = nan_array(p.nlse);
    float *o1 = nan_array(p.nq), *l1 = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o0, l0), CLATTN_OK);
    s.q_offset = s.kv_offset = 0xFFFFFFFFu - s.q_seq + 1u;
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o1, l1), CLATTN_OK);
    ck_assert_mem_eq(o0, o1, p.nq * sizeof(float));
    ck_assert_mem_eq(l0, l1, p.nlse * sizeof(float));
    free(o0);
    free(l0);
    free(o1);
    free(l1);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

START_TEST(accumulate_gradients)
{
    clattn_context *ctx = native_context(2);
    clattn_shape s = small_shape();
    s.causal = 1;
    s.kv_seq = s.q_seq;
    problem p;
    problem_make(&p, &s, 9, 1.0f);
    float *once[3] = {nan_array(p.nq), nan_array(p.nkv), nan_array(p.nkv)};
    float *twice[3] = {nan_array(p.nq), nan_array(p.nkv), nan_array(p.nkv)};
    const size_t n[3] = {p.nq, p.nkv, p.nkv};
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, once[0],
                                     once[1], once[2]),
                     CLATTN_OK);
    for (int i = 0; i < 3; ++i)
        memset(twice[i], 0, n[i] * sizeof(float));
    s.accumulate = 1;
    for (int rep = 0; rep < 2; ++rep)
        ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, twice[0],
                                         twice[1], twice[2]),
                         CLATTN_OK);
    for (int i = 0; i < 3; ++i)
        for (size_t j = 0; j < n[i]; ++j)
            ck_assert_float_eq(twice[i][j], 2.0f * once[i][j]);
    float *o = nan_array(p.nq);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, p.lse), CLATTN_OK);
    for (size_t j = 0; j < p.nq; ++j)
        ck_assert(!isnan(o[j]));
    free(o);
    for (int i = 0; i < 3; ++i) {
        free(once[i]);
        free(twice[i]);
    }
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

/* Jobs split by key block are independent: thread counts cannot change a bit. */
START_TEST(native_threads_agree)
{
    clattn_shape s = small_shape();
    s.q_seq = s.kv_seq = 77;
    s.causal = 1;
    problem p;
    problem_make(&p, &s, 3, 1.0f);
    float *one = nan_array(p.nkv), *many = nan_array(p.nkv);
    clattn_context *a = native_context(1), *b = native_context(5);
    ck_assert_status(clattn_grad_v(a, &s, p.d_out, p.q, p.k, p.lse, one), CLATTN_OK);
    ck_assert_status(clattn_grad_v(b, &s, p.d_out, p.q, p.k, p.lse, many), CLATTN_OK);
    ck_assert(memcmp(one, many, p.nkv * sizeof(float)) == 0);
    clattn_context_destroy(a);
    clattn_context_destroy(b);
    free(one);
    free(many);
    problem_free(&p);
}
END_TEST

/* The backward that sums dQ in its key-side pass (a dQ copy per part of
 * the key side) gives the same bits on every run with one thread count,
 * whichever threads take the parts; and agrees with the two-pass
 * backward to rounding. */
START_TEST(native_fused_backward_repeats)
{
    clattn_shape s = small_shape();
    s.q_seq = s.kv_seq = 160; /* 160 keys a row: the fused path pays at 3 threads */
    unsetenv("CLATTN_NATIVE_FUSED_DQ");
    problem p;
    problem_make(&p, &s, 11, 1.0f);
    float *dq[4], *dk[4], *dv[4];
    clattn_context *ctx = native_context(3);
    for (int run = 0; run < 4; ++run) {
        dq[run] = nan_array(p.nq);
        dk[run] = nan_array(p.nkv);
        dv[run] = nan_array(p.nkv);
        if (run == 2)
            setenv("CLATTN_NATIVE_FUSED_DQ", "0", 1);
        if (run == 3) { /* five dQ copies: a context made under CLATTN_NATIVE_PARTS */
            clattn_context_destroy(ctx);
            setenv("CLATTN_NATIVE_PARTS", "0,5", 1);
            ctx = native_context(3);
            unsetenv("CLATTN_NATIVE_PARTS");
        }
        ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, dq[run],
                                         dk[run], dv[run]),
                         CLATTN_OK);
        unsetenv("CLATTN_NATIVE_FUSED_DQ");
        ck_assert_msg(strstr(clattn_context_kernels(ctx), run == 2 ? "grad_q__" : "grad_kvq__"),
                      "run %d ran %s", run, clattn_context_kernels(ctx));
    }
    ck_assert(memcmp(dq[0], dq[1], p.nq * sizeof(float)) == 0);
    ck_assert(memcmp(dk[0], dk[1], p.nkv * sizeof(float)) == 0);
    ck_assert(memcmp(dv[0], dv[1], p.nkv * sizeof(float)) == 0);
    /* dK and dV are the same jobs either way; dQ's sums are grouped
     * differently. */
    ck_assert(memcmp(dk[0], dk[2], p.nkv * sizeof(float)) == 0);
    ck_assert(memcmp(dv[0], dv[2], p.nkv * sizeof(float)) == 0);
    float worst = 0.0f, mag = 0.0f;
    for (size_t i = 0; i < p.nq; ++i) {
        worst = fmaxf(worst, fabsf(dq[0][i] - dq[2][i]));
        mag = fmaxf(mag, fabsf(dq[2][i]));
    }
    ck_assert_msg(mag > 0.0f && worst <= 1e-5f * mag, "dQ fused vs two-pass: %g of %g", worst,
                  mag);
    /* Other parts: dK and dV the same jobs' bits, dQ summed in 5 copies */
    ck_assert(memcmp(dk[0], dk[3], p.nkv * sizeof(float)) == 0);
    ck_assert(memcmp(dv[0], dv[3], p.nkv * sizeof(float)) == 0);
    worst = 0.0f;
    for (size_t i = 0; i < p.nq; ++i)
        worst = fmaxf(worst, fabsf(dq[3][i] - dq[2][i]));
    ck_assert_msg(worst <= 1e-5f * mag, "dQ in 5 copies vs two-pass: %g of %g", worst, mag);
    for (int run = 0; run < 4; ++run) {
        free(dq[run]);
        free(dk[run]);
        free(dv[run]);
    }
    clattn_context_destroy(ctx);
    problem_free(&p);
}
END_TEST

/* The fused backward's float32 dQ that a call overwrites is its first
 * key-side part's own (summed where it lies), and one added into is summed
 * from copies: from a zeroed dQ the two give the same bits (both start the
 * first part's sums from zero and add the other parts' copies in order),
 * with one part (1 thread), three (3 threads) and five. */
START_TEST(native_fused_dq_in_place)
{
    clattn_shape s = small_shape();
    s.q_seq = s.kv_seq = 160;
    unsetenv("CLATTN_NATIVE_FUSED_DQ");
    problem p;
    problem_make(&p, &s, 12, 1.0f);
    float *own = nan_array(p.nq), *added = nan_array(p.nq);
    float *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
    static const struct {
        int threads;
        const char *parts; /* CLATTN_NATIVE_PARTS, or NULL */
    } runs[] = {{1, NULL}, {3, NULL}, {3, "0,5"}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; ++i) {
        if (runs[i].parts)
            setenv("CLATTN_NATIVE_PARTS", runs[i].parts, 1);
        clattn_context *ctx = native_context(runs[i].threads);
        unsetenv("CLATTN_NATIVE_PARTS");
        clattn_shape c = s;
        ck_assert_status(clattn_backward(ctx, &c, p.q, p.k, p.v, p.o, p.lse, p.d_out, own, dk, dv),
                         CLATTN_OK);
        ck_assert_msg(strstr(clattn_context_kernels(ctx), "grad_kvq__"), "run %zu ran %s", i,
                      clattn_context_kernels(ctx));
        memset(added, 0, p.nq * sizeof(float));
        c.accumulate = 1;
        ck_assert_status(clattn_backward(ctx, &c, p.q, p.k, p.v, p.o, p.lse, p.d_out, added, dk,
                                         dv),
                         CLATTN_OK);
        ck_assert_msg(memcmp(own, added, p.nq * sizeof(float)) == 0, "run %zu: dQ differs", i);
        clattn_context_destroy(ctx);
    }
    free(own);
    free(added);
    free(dk);
    free(dv);
    problem_free(&p);
}
END_TEST

typedef struct thread_run {
    clattn_context *shared; /* NULL: the thread makes a context of its own */
    const problem *p;
    float *dv;
    clattn_status st;
} thread_run;

static void *run_thread(void *arg)
{
    thread_run *r = arg;
    clattn_context *ctx = r->shared;
    if (!ctx) {
        clattn_options o = clattn_options_default();
        o.backend = CLATTN_BACKEND_NATIVE;
        o.num_threads = 2;
        r->st = clattn_context_create(&o, &ctx);
    }
    for (int i = 0; i < 5 && r->st == CLATTN_OK; ++i)
        r->st = clattn_grad_v(ctx, &r->p->s, r->p->d_out, r->p->q, r->p->k, r->p->lse, r->dv);
    if (!r->shared)
        clattn_context_destroy(ctx);
    return NULL;
}

/* Four threads run grad-V at once, on one shared context or on a context
 * each; every one gets the right answer. */
static void check_threads(clattn_context *shared, int causal, uint64_t seed)
{
    clattn_shape s = small_shape();
    s.q_seq = s.kv_seq = 40;
    s.causal = causal;
    problem p;
    problem_make(&p, &s, seed, 1.0f);
    double *ref = malloc(p.nkv * sizeof(double)), *mag = malloc(p.nkv * sizeof(double));
    ref_grad_v(&p, ref, mag);
    enum { T = 4 };
    pthread_t tid[T];
    thread_run runs[T];
    for (int i = 0; i < T; ++i) {
        runs[i] = (thread_run){shared, &p, nan_array(p.nkv), CLATTN_OK};
        ck_assert_int_eq(pthread_create(&tid[i], NULL, run_thread, &runs[i]), 0);
    }
    for (int i = 0; i < T; ++i) {
        pthread_join(tid[i], NULL);
        ck_assert_status(runs[i].st, CLATTN_OK);
        size_t at;
        ck_assert(worst_error(runs[i].dv, ref, mag, p.nkv, &at) <= 1.0);
        free(runs[i].dv);
    }
    free(ref);
    free(mag);
    problem_free(&p);
}

/* Threads sharing one context take turns. */
START_TEST(shared_context_threads)
{
    clattn_context *ctx = native_context(2);
    check_threads(ctx, 0, 11);
    clattn_context_destroy(ctx);
}
END_TEST

START_TEST(context_per_thread) { check_threads(NULL, 1, 12); }
END_TEST

void add_api_call_tests(TCase *tc)
{
    tcase_add_test(tc, seed_block_conversion);
    tcase_add_test(tc, visible_pairs);
    tcase_add_test(tc, merge_rows);
    tcase_add_test(tc, top_positions);
    tcase_add_test(tc, accumulate_gradients);
    tcase_add_test(tc, native_threads_agree);
    tcase_add_test(tc, native_fused_backward_repeats);
    tcase_add_test(tc, native_fused_dq_in_place);
    tcase_add_test(tc, shared_context_threads);
    tcase_add_test(tc, context_per_thread);
}
