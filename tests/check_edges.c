/* The kernel tests at the edges of the input: non-finite values, the
 * seed's uniform blocks against the seed itself, and the loop cap of Mesa's
 * llvmpipe. */
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

/* Each element of x (rows of `width`) against want: 1 must be NaN (2: NaN
 * or infinite), 0 must be finite, 3 either: a product over a tile may
 * carry a NaN through a masked pair's zero weight (0 x NaN), as PyTorch's
 * and FlashAttention's kernels do. */
static void expect_non_finite(const char *what, const float *x, const char *want, size_t rows,
                              size_t width)
{
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < width; ++c) {
            const float v = x[r * width + c];
            const char w = want[r * width + c];
            if (w == 3)
                continue;
            ck_assert_msg(w ? (w == 1 ? isnan(v) : !isfinite(v)) : isfinite(v),
                          "%s on %s/%s: row %zu element %zu is %g, want %s", what, test_backend,
                          current_variant, r, c, (double)v,
                          w ? "NaN (a non-finite input reaches it)" : "finite");
        }
}

/* A NaN or infinity in Q, K, V or dO reaches every output it touches and
 * no other, and never turns a row into an empty one (O = 0, LSE -1e30),
 * nor does a row whose visible scores are all -inf: 12 positions, 2 query
 * heads on 1 KV head, head_dim 8, causal. */
START_TEST(non_finite_inputs)
{
    const shape_case c = {.q_seq = 12, .heads = 2, .kv_heads = 1, .head_dim = 8, .causal = 1};
    const clattn_shape s = to_shape(&c);
    const size_t H = 2, D = 8, T = 12;
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        problem p;
        problem_make(&p, &s, 31, 1.0f);
        float *o = nan_array(p.nq), *lse = nan_array(p.nlse);
        float *dq = nan_array(p.nq), *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
        char want_q[12 * 2 * 8], want_kv[12 * 8], want_l[12 * 2 * 2];
        /* the forward: NaN in Q, NaN in K, inf in Q, scores all -inf */
        for (int which = 0; which < 4; ++which) {
            problem_free(&p);
            problem_make(&p, &s, 31, 1.0f);
            memset(want_q, 0, sizeof want_q);
            if (which == 0) {
                p.q[(2 * H + 1) * D] = NAN; /* row 2, head 1 */
                memset(want_q + (2 * H + 1) * D, 1, D);
            } else if (which == 1) {
                p.k[5 * D + 3] = NAN; /* key 5: rows 5.. of both heads */
                memset(want_q + 5 * H * D, 1, (T - 5) * H * D);
            } else if (which == 2) {
                p.k[0] = 1.0f; /* a +inf score, so the row's max is infinite */
                p.q[3 * H * D] = INFINITY; /* row 3, head 0 */
                memset(want_q + 3 * H * D, 1, D);
            } else {
                for (size_t t = 0; t < T; ++t) /* every score of row 3, head 1 is -inf */
                    p.k[t * D] = 1.0f;
                p.q[(3 * H + 1) * D] = -INFINITY;
                memset(want_q + (3 * H + 1) * D, 1, D);
            }
            for (size_t r = 0; r < T * H; ++r)
                want_l[2 * r] = want_l[2 * r + 1] = want_q[r * D] ? 2 : 0;
            ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
            expect_non_finite(which == 2   ? "forward O (inf in Q)"
                              : which == 3 ? "forward O (scores all -inf)"
                                           : "forward O",
                              o, want_q, T * H, D);
            for (size_t r = 0; r < T * H; ++r) /* NaN in m or l, never (-1e30, -1e30) */
                if (want_l[2 * r])
                    ck_assert_msg(isnan(lse[2 * r]) || isnan(lse[2 * r + 1]),
                                  "forward LSE on %s/%s: row %zu is (%g, %g), want a NaN",
                                  test_backend, current_variant, r, (double)lse[2 * r],
                                  (double)lse[2 * r + 1]);
                else
                    ck_assert(isfinite(lse[2 * r]) && isfinite(lse[2 * r + 1]) &&
                              lse[2 * r] > -1e29f);
        }
        /* The backward from the clean forward: NaN in K at key 5 reaches
         * dK and dV of key 5 and dQ of the rows that see it. */
        problem_free(&p);
        problem_make(&p, &s, 32, 1.0f);
        p.k[5 * D + 3] = NAN;
        ck_assert_status(
            clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, dq, dk, dv), CLATTN_OK);
        memset(want_q, 3, sizeof want_q); /* rows 0..4 may meet it through 0 x NaN */
        memset(want_q + 5 * H * D, 1, (T - 5) * H * D);
        memset(want_kv, 0, sizeof want_kv);
        memset(want_kv + 5 * D, 1, D);
        expect_non_finite("backward dQ (NaN in K)", dq, want_q, T * H, D);
        expect_non_finite("backward dK (NaN in K)", dk, want_kv, T, D);
        expect_non_finite("backward dV (NaN in K)", dv, want_kv, T, D);
        /* NaN in dO at row 7, head 0, column 3: Dsum of that row, so dS of
         * every key it sees (dK of keys 0..7, its dQ), and dV's column 3 of
         * those keys. */
        problem_free(&p);
        problem_make(&p, &s, 33, 1.0f);
        p.d_out[(7 * H + 0) * D + 3] = NAN;
        ck_assert_status(
            clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, dq, dk, dv), CLATTN_OK);
        memset(want_q, 0, sizeof want_q);
        memset(want_q + 7 * H * D, 1, D);
        memset(want_kv, 0, sizeof want_kv);
        memset(want_kv, 1, 8 * D);
        expect_non_finite("backward dQ (NaN in dO)", dq, want_q, T * H, D);
        expect_non_finite("backward dK (NaN in dO)", dk, want_kv, T, D);
        memset(want_kv, 0, sizeof want_kv);
        for (size_t t = 0; t < T; ++t) /* keys past 7 may meet it through 0 x NaN */
            want_kv[t * D + 3] = t <= 7 ? 1 : 3;
        expect_non_finite("backward dV (NaN in dO)", dv, want_kv, T, D);
        void *frees[] = {o, lse, dq, dk, dv};
        for (size_t i = 0; i < 5; ++i)
            free(frees[i]);
        problem_free(&p);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* meganeura's uniform blocks, run through the conversion and compared with
 * a transliteration of the seed itself. */
static const uint32_t seed_blocks[][8] = {
    {16, 0, 4u << 16 | 2, 64, 0, 0, 0, 0},
    {16, 16, 2u << 16 | 2, 64, 0, 0, 0, 0},
    {12, 20, 8u << 16 | 1, 64, 5, 0, 0, 0},
    {20, 0, 3u << 16 | 3, 64, 4, 0, 0, 0},
    {9, 9, 1u << 16 | 1, 64, 2, 0, 0, 0},
};
START_TEST(seed_uniform_block)
{
    clattn_shape s;
    ck_assert_status(clattn_shape_from_seed(seed_blocks[_i], &s), CLATTN_OK);
    problem p;
    problem_make(&p, &s, 77u + (uint64_t)_i, 1.0f);
    double *want = malloc(p.nkv * sizeof(double)), *ref = malloc(p.nkv * sizeof(double));
    double *mag = malloc(p.nkv * sizeof(double));
    float *dv = nan_array(p.nkv);
    ck_assert(want && ref && mag);
    seed_grad_v(seed_blocks[_i], p.d_out, p.q, p.k, p.lse, want);
    ref_grad_v(&p, ref, mag);
    /* The contract's reference is the seed, to float64 rounding. */
    for (size_t i = 0; i < p.nkv; ++i)
        ck_assert_msg(fabs(want[i] - ref[i]) <= 1e-12 * (mag[i] + 1e-30),
                      "seed and contract disagree at %zu: %.17g vs %.17g", i, want[i], ref[i]);
    clattn_context *ctx = test_context(NULL);
    ck_assert_status(clattn_grad_v(ctx, &s, p.d_out, p.q, p.k, p.lse, dv), CLATTN_OK);
    size_t at;
    double worst = worst_error(dv, want, mag, p.nkv, &at);
    ck_assert_msg(worst <= 1.0, "seed block %d: element %zu is %.9g, the seed gives %.9g", _i,
                  at, (double)dv[at], want[at]);
    clattn_context_destroy(ctx);
    free(want);
    free(ref);
    free(mag);
    free(dv);
    problem_free(&p);
}
END_TEST

/* On Mesa's llvmpipe, which ends a work-item after 65535 loop iterations
 * and keeps what it wrote, a call that could reach that count is refused
 * with outputs untouched (every variant, forward and backward); on other
 * devices the same call runs. */
START_TEST(loop_cap)
{
    const shape_case c = {.q_seq = 4, .kv_seq = 600, .heads = 2, .kv_heads = 1, .head_dim = 64};
    const clattn_shape s = to_shape(&c);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        const int capped = strstr(clattn_context_device(ctx), "llvmpipe") != NULL;
        problem p;
        problem_make(&p, &s, 41, 1.0f);
        float *o = nan_array(p.nq), *lse = nan_array(p.nlse);
        const clattn_status st = clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse);
        if (capped) {
            ck_assert_status(st, CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
            ck_assert_msg(strstr(clattn_last_error(), "llvmpipe") != NULL, "message: %s",
                          clattn_last_error());
            for (size_t i = 0; i < p.nq; ++i)
                ck_assert_msg(isnan(o[i]), "%s wrote O[%zu] on a refused call", current_variant,
                              i);
        } else {
            ck_assert_status(st, CLATTN_OK);
            ck_assert_msg(!isnan(o[0]), "%s left O unwritten", current_variant);
        }
        free(o);
        free(lse);
        problem_free(&p);
        /* head_dim 1, whose rows cost more loop steps than their columns
         * say: 12,000 keys were let through and came back wrong. */
        clattn_shape one = clattn_shape_default();
        one.q_seq = 40;
        one.kv_seq = 12000;
        one.num_heads = 2;
        one.num_kv_heads = one.head_dim = 1;
        if (capped) {
            static float in[12000], out[80], lsep[160];
            ck_assert_status(clattn_forward(ctx, &one, in, in, in, out, lsep),
                             CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
        }
        clattn_context_destroy(ctx);
    }
}
END_TEST

edge_tests get_edge_tests(void)
{
    edge_tests t = {non_finite_inputs, {seed_uniform_block, N(seed_blocks)}, loop_cap};
    return t;
}
