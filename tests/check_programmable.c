/* The caller's score and mask functions (docs/programmable.md) against the
 * float64 reference on every variant and op: functions that reproduce
 * softcap and ALiBi against the built-ins, a relative-position bias table
 * through the parameters, document, prefix-LM and sliding-plus-global
 * masks and one that hides whole rows, all of them with GQA, offsets,
 * batch, dropout and sinks; finite differences of a score function and of
 * the sinks; what bad functions and shapes get. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "functions.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

#include "twice.h"

/* softcap as a function: the cap in p[0], through clattn's tanh */
#define clattn_score softcap_score
#define clattn_score_ds softcap_ds
TWICE(softcap_cl,
      float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          return p[0] * clattn_tanh(s / p[0]);
      } float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const float t = clattn_tanh(s / p[0]);
          return 1.0f - t * t;
      })
#undef clattn_score
#undef clattn_score_ds

/* ALiBi as a function: query head h's slope in p[h] */
#define clattn_score alibi_score
#define clattn_score_ds alibi_ds
TWICE(alibi_cl,
      float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const float d = q > k ? (float)(q - k) : (float)(k - q);
          return s - p[h] * d;
      } float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          return 1.0f;
      })
#undef clattn_score
#undef clattn_score_ds

/* A learned relative-position bias: 17 buckets of k - q (clamped to
 * [-8, 8]) per query head, in p[17 h + bucket], and a batch element's
 * offset; then a cap, so that the derivative is not 1. Its derivative in
 * the one parameter a pair reads: the same 1 - t^2. */
#define clattn_score relbias_score
#define clattn_score_ds relbias_ds
#define clattn_score_dp relbias_dp
TWICE(relbias_cl,
      float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const int d = (int)k - (int)q;
          const int at = d < -8 ? 0 : d > 8 ? 16 : d + 8;
          return 6.0f * tanh((s + p[17u * h + (uint)at] + 0.25f * (float)b) / 6.0f);
      } float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const int d = (int)k - (int)q;
          const int at = d < -8 ? 0 : d > 8 ? 16 : d + 8;
          const float t = tanh((s + p[17u * h + (uint)at] + 0.25f * (float)b) / 6.0f);
          return 1.0f - t * t;
      } uint clattn_score_dp(float s, uint b, uint h, uint q, uint k, __global const float *p,
                             uint *index, float *d) {
          const int dist = (int)k - (int)q;
          const int at = dist < -8 ? 0 : dist > 8 ? 16 : dist + 8;
          index[0] = 17u * h + (uint)at;
          const float t = tanh((s + p[index[0]] + 0.25f * (float)b) / 6.0f);
          d[0] = 1.0f - t * t;
          return 1u;
      })
#undef clattn_score
#undef clattn_score_ds
#undef clattn_score_dp

/* Documents of 13 positions: a query sees the keys of its own. */
#define clattn_mask document_mask
TWICE(document_cl, bool clattn_mask(uint b, uint h, uint q, uint k) { return q / 13u == k / 13u; })
#undef clattn_mask

/* Prefix-LM: the first 10 positions see each other; the rest are causal. */
#define clattn_mask prefix_mask
TWICE(prefix_cl, bool clattn_mask(uint b, uint h, uint q, uint k) { return k < 10u || k <= q; })
#undef clattn_mask

/* Sliding window of 8 plus 3 global keys on even heads; odd heads see
 * all, element 1 of a batch sees causally. */
#define clattn_mask sliding_mask
TWICE(sliding_cl, bool clattn_mask(uint b, uint h, uint q, uint k) {
    if ((h & 1u) == 1u)
        return b == 0u || k <= q;
    return (k <= q && q - k < 8u) || k < 3u;
})
#undef clattn_mask

/* Rows at positions 3 mod 7 see no key (empty); the others every key. */
#define clattn_mask holes_mask
TWICE(holes_cl, bool clattn_mask(uint b, uint h, uint q, uint k) { return q % 7u != 3u; })
#undef clattn_mask

#undef __global

static const float cap5[1] = {5.0f};

/* 17 buckets for each of up to 8 heads, between -1 and 1. */
float relbias_table[8 * 17];
void fill_relbias(void)
{
    for (int i = 0; i < 8 * 17; ++i)
        relbias_table[i] = (float)sin(0.7 * i + 0.3);
}

clattn_shape with_score(clattn_shape s, const char *source,
                               float (*fn)(float, uint32_t, uint32_t, uint32_t, uint32_t,
                                           const float *),
                               float (*ds)(float, uint32_t, uint32_t, uint32_t, uint32_t,
                                           const float *),
                               const float *params, uint32_t count)
{
    s.score_fn = source;
    s.score_native = fn;
    s.score_ds_native = ds;
    s.score_params = params;
    s.score_params_count = count;
    return s;
}

clattn_shape with_mask(clattn_shape s, const char *source,
                              int (*fn)(uint32_t, uint32_t, uint32_t, uint32_t))
{
    s.mask_fn = source;
    s.mask_native = fn;
    return s;
}

/* A score function's span form (score_span_native), as the C wrappers
 * make it: n pairs in columns of `rows`. */
#define SPAN(name, fn, dfn)                                                                   \
    static void name(float *s, float *ds, uint32_t n, uint32_t rows, uint32_t b, uint32_t h,  \
                     uint32_t q, uint32_t k, const float *p)                                  \
    {                                                                                         \
        for (uint32_t i = 0; i < n; ++i) {                                                    \
            const uint32_t at_q = q + i % rows, at_k = k + i / rows;                          \
            if (ds)                                                                           \
                ds[i] = dfn(s[i], b, h, at_q, at_k, p);                                       \
            s[i] = fn(s[i], b, h, at_q, at_k, p);                                             \
        }                                                                                     \
    }
SPAN(softcap_span, softcap_score, softcap_ds)
SPAN(alibi_span, alibi_score, alibi_ds)
SPAN(relbias_span, relbias_score, relbias_ds)

/* bool to int, for the shape's C form */
#define AS_INT(name)                                                \
    int name##_int(uint32_t b, uint32_t h, uint32_t q, uint32_t k) \
    {                                                               \
        return name(b, h, q, k) ? 1 : 0;                            \
    }
AS_INT(document_mask)
AS_INT(prefix_mask)
AS_INT(sliding_mask)
AS_INT(holes_mask)

/* The functions that reproduce softcap and ALiBi against the built-ins
 * themselves: softcap with large logits (case 0 of the modifiers), ALiBi
 * bottom-right at offsets with GQA; native runs them by spans (a whole
 * tile of query rows and its tail, one query's keys on the key side). */
START_TEST(builtins_as_functions)
{
    const shape_case c0 = {.q_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 32, .causal = 1,
                           .q_gain = 4};
    clattn_shape cap_ref = to_shape(&c0);
    cap_ref.softcap = 5.0f;
    clattn_shape cap_fn =
        with_score(to_shape(&c0), softcap_cl, softcap_score, softcap_ds, cap5, 1);
    const shape_case c1 = {.q_seq = 20, .kv_seq = 45, .heads = 8, .kv_heads = 2, .head_dim = 32,
                           .causal = CLATTN_CAUSAL_BOTTOM_RIGHT, .q_gain = 3};
    clattn_shape alibi_ref = to_shape(&c1);
    alibi_ref.q_offset = 7;
    alibi_ref.kv_offset = 5;
    clattn_shape alibi_fn =
        with_score(alibi_ref, alibi_cl, alibi_score, alibi_ds, slopes8, 8);
    alibi_fn.score_span_native = alibi_span;
    cap_fn.score_span_native = softcap_span;
    alibi_ref.alibi_slopes = slopes8;
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops_against(ctx, &cap_fn, &cap_ref, 4.0f, 6100);
        check_ops_against(ctx, &alibi_fn, &alibi_ref, 3.0f, 6101);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* A relative-position bias table with dropout, GQA and a batch of 2 (its
 * b in the function), native by spans; then with the document mask and
 * sinks (pair by pair), in float32 and bf16. */
START_TEST(bias_table_and_document)
{
    fill_relbias();
    const shape_case c = {.batch = 2, .q_seq = 33, .kv_seq = 40, .heads = 4, .kv_heads = 2,
                          .head_dim = 40, .q_gain = 2};
    clattn_shape s = with_score(to_shape(&c), relbias_cl, relbias_score, relbias_ds,
                                relbias_table, 8 * 17);
    s.dropout_p = 0.2f;
    s.dropout_seed = 0x1234567890abcdefull;
    s.dropout_offset = 3;
    clattn_shape d = with_mask(s, document_cl, document_mask_int);
    s.score_span_native = relbias_span;
    d.sinks = sinks8;
    d.kv_offset = 4; /* documents cut across the keys' own rows */
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, &s, 2.0f, 6200);
        check_ops(ctx, &d, 2.0f, 6201);
        if (dtype_runs(CLATTN_DTYPE_BF16)) {
            clattn_shape h = d;
            h.dtype = CLATTN_DTYPE_BF16;
            check_ops_16(ctx, &h, 2.0f, 6202);
        }
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* The bias table with a mask function, sinks and dropout, and a bias
 * tensor (with some -inf) and a bool mask (with rows hidden whole), in
 * float32 and, where 16-bit runs, bf16 with the bias as bfloat16, on one
 * variant. */
static void functions_on(const char *variant, const shape_case *c, const char *mask_src,
                         int (*mask)(uint32_t, uint32_t, uint32_t, uint32_t), int sixteen,
                         uint64_t seed)
{
    fill_relbias();
    clattn_shape s = with_mask(with_score(to_shape(c), relbias_cl, relbias_score, relbias_ds,
                                          relbias_table, 8 * 17),
                               mask_src, mask);
    s.dropout_p = 0.2f;
    s.dropout_seed = 77;
    s.sinks = sinks8;
    s.bias_heads = s.num_heads;
    s.bias_batch = s.batch;
    float *bias = make_bias(&s, seed + 1, sixteen);
    uint8_t *keep = make_bool(&s, seed + 2, 1);
    s.bias = bias;
    s.bool_mask = keep;
    clattn_context *ctx = test_variant_context(variant);
    ck_assert_ptr_nonnull(ctx);
    current_variant = variant;
    check_ops(ctx, &s, 2.0f, seed);
    uint16_t *bits = NULL;
    if (sixteen && dtype_runs(CLATTN_DTYPE_BF16)) {
        /* and the bias as bfloat16, as 16-bit calls take it */
        const size_t n = (size_t)s.bias_batch * s.bias_heads * s.q_seq * s.kv_seq;
        bits = malloc(n * sizeof *bits);
        ck_assert_ptr_nonnull(bits);
        round_16(bias, bits, n, CLATTN_DTYPE_BF16);
        s.bias = bits;
        s.bias_dtype = CLATTN_DTYPE_BF16;
        s.dtype = CLATTN_DTYPE_BF16;
        check_ops_16(ctx, &s, 2.0f, seed + 3);
    }
    clattn_context_destroy(ctx);
    free(bias);
    free(bits);
    free(keep);
}

/* tiled, float32, documents: the portable suite's (rusticl). */
START_TEST(functions_tiled)
{
    const shape_case c = {.batch = 2, .q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2,
                          .head_dim = 32, .causal = 1, .q_gain = 2};
    functions_on("tiled", &c, document_cl, document_mask_int, 0, 6700);
}
END_TEST

/* mma at head_dim 64 (the emulated suite's programs), past the block map's
 * 64 positions: sliding-plus-global, whose hidden blocks the forward,
 * grad-Q and the key side (per query head of a group) skip, in float32
 * and bf16. */
START_TEST(functions_mma)
{
    const shape_case c = {.batch = 2, .q_seq = 150, .kv_seq = 170, .heads = 4, .kv_heads = 2,
                          .head_dim = 64, .q_gain = 2};
    functions_on("mma", &c, sliding_cl, sliding_mask_int, 1, 6710);
}
END_TEST

/* Prefix-LM, sliding-plus-global (by head and batch element) with causal
 * and a window of the built-ins too, and rows hidden whole, which come out
 * empty; then past the block map's 64 positions, where the kernels skip
 * the blocks it hides: sliding-plus-global with GQA and a batch, and
 * documents of 50 positions with a key offset. */
static const char *const mask_sources[5] = {prefix_cl, sliding_cl, holes_cl, sliding_cl,
                                            document_cl};
static int (*const mask_fns[5])(uint32_t, uint32_t, uint32_t, uint32_t) = {
    prefix_mask_int, sliding_mask_int, holes_mask_int, sliding_mask_int, document_mask_int};
START_TEST(masks)
{
    const shape_case cases[5] = {
        {.q_seq = 45, .heads = 2, .head_dim = 24},
        {.batch = 2, .q_seq = 40, .heads = 4, .kv_heads = 1, .head_dim = 64, .causal = 1,
         .window = 30},
        {.q_seq = 30, .kv_seq = 21, .heads = 3, .head_dim = 16},
        {.batch = 2, .q_seq = 200, .kv_seq = 230, .heads = 4, .kv_heads = 2, .head_dim = 32},
        {.q_seq = 260, .kv_seq = 200, .heads = 2, .kv_heads = 1, .head_dim = 16},
    };
    clattn_shape s = with_mask(to_shape(&cases[_i]), mask_sources[_i], mask_fns[_i]);
    s.kv_offset = _i == 4 ? 30 : 0;
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, &s, 1.0f, 6300u + (uint64_t)_i);
        if (_i == 2) { /* the hidden rows are empty: O = 0, LSE (-1e30, -1e30) */
            problem p;
            problem_make(&p, &s, 6310, 1.0f);
            float *o = malloc(p.nq * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
            ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
            for (uint32_t pos = 3; pos < s.q_seq; pos += 7)
                for (uint32_t h = 0; h < s.num_heads; ++h) {
                    const size_t row = (size_t)pos * s.num_heads + h;
                    ck_assert_float_eq(lse[2 * row], -1e30f);
                    ck_assert_float_eq(lse[2 * row + 1], -1e30f);
                    for (uint32_t d = 0; d < s.head_dim; ++d)
                        ck_assert_float_eq(o[row * s.head_dim + d], 0.0f);
                }
            free(o);
            free(lse);
            problem_free(&p);
        }
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* Packed sequences, whose b is the sequence's index: the bias table and
 * the document mask with dropout. */
START_TEST(packed_functions_sweep)
{
    fill_relbias();
    const clattn_shape fns = with_mask(
        with_score(clattn_shape_default(), relbias_cl, relbias_score, relbias_ds, relbias_table,
                   8 * 17),
        document_cl, document_mask_int);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        packed_functions(ctx, 6600, &fns);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* L = sum of O . dO from the reference's forward of p. */
double loss(const problem *p)
{
    double *o = doubles(p->nq), *mag = doubles(p->nq), *lse = doubles(p->nlse), sum = 0.0;
    ref_forward(p, o, mag, lse);
    for (size_t i = 0; i < p->nq; ++i)
        sum += o[i] * (double)p->d_out[i];
    free(o);
    free(mag);
    free(lse);
    return sum;
}

/* Central differences of L against the backend's dQ and dK (a score
 * function whose derivative is not 1, with a mask), d sinks and the
 * score function's parameters' gradient (its relative-bias table). */
START_TEST(finite_differences)
{
    fill_relbias();
    float sinks[4] = {0.5f, -1.0f, 1.5f, -INFINITY};
    const shape_case c = {.q_seq = 19, .kv_seq = 23, .heads = 4, .kv_heads = 2, .head_dim = 16,
                          .q_gain = 3};
    clattn_shape s = with_score(to_shape(&c), relbias_cl, relbias_score, relbias_ds,
                                relbias_table, 8 * 17);
    s = with_mask(s, prefix_cl, prefix_mask_int);
    s.sinks = sinks;
    s.score_dp_native = relbias_dp;
    clattn_context *ctx = test_context(NULL);
    ck_assert_ptr_nonnull(ctx);
    problem p;
    problem_make(&p, &s, 6400, 3.0f);
    float *o = malloc(p.nq * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
    float *dq = malloc(p.nq * sizeof(float)), *dk = malloc(p.nkv * sizeof(float));
    float *dv = malloc(p.nkv * sizeof(float)), dsink[4], dtable[8 * 17];
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, dq, dk, dv),
                     CLATTN_OK);
    ck_assert_status(clattn_grad_sinks(ctx, &s, o, lse, p.d_out, dsink), CLATTN_OK);
    ck_assert_status(clattn_grad_score_params(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, dtable),
                     CLATTN_OK);
    double largest = 0.0;
    for (size_t i = 0; i < p.nq; ++i)
        largest = fmax(largest, fabs((double)dq[i]));
    struct {
        float *x, *grad;
        size_t n;
        const char *name;
    } wrt[4] = {{p.q, dq, p.nq, "dQ"},
                {p.k, dk, p.nkv, "dK"},
                {sinks, dsink, 3, "d sinks"},
                {relbias_table, dtable, 4 * 17, "d table"}};
    for (int w = 0; w < 4; ++w)
        for (size_t i = 0; i < wrt[w].n; i += (w == 2 ? 1 : w == 3 ? 5 : 37)) {
            const float x0 = wrt[w].x[i];
            wrt[w].x[i] = x0 + 1e-2f;
            const double up = loss(&p), hi = wrt[w].x[i];
            wrt[w].x[i] = x0 - 1e-2f;
            const double down = loss(&p), lo = wrt[w].x[i];
            wrt[w].x[i] = x0;
            const double fd = (up - down) / (hi - lo), got = wrt[w].grad[i];
            ck_assert_msg(fabs(fd - got) <= 2e-3 * (fabs(fd) + largest),
                          "%s on %s: %s[%zu] is %g, finite differences give %g", current_variant,
                          test_backend, wrt[w].name, i, got, fd);
        }
    params_checks(ctx, &s, &p, o, lse, dtable);
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

/* A parameter derivative that names a parameter past the array, and one
 * that names too many. */
static uint32_t past_dp(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p,
                        uint32_t *index, float *d)
{
    (void)s, (void)b, (void)h, (void)p;
    index[0] = q == k ? 1u : 0u;
    d[0] = 1.0f;
    return 1u;
}
static uint32_t many_dp(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p,
                        uint32_t *index, float *d)
{
    (void)s, (void)b, (void)h, (void)q, (void)k, (void)p, (void)index, (void)d;
    return CLATTN_SCORE_DP_MAX + 1u;
}

/* A function that does not compile gives the compiler's log; a backend
 * without its form of a function, half a score function, parameters
 * without their array, an empty source and bad parameter derivatives get
 * their statuses, nothing written. */
START_TEST(bad_functions)
{
    const shape_case c = {.q_seq = 8, .heads = 2, .head_dim = 8};
    problem p;
    clattn_shape plain = to_shape(&c);
    problem_make(&p, &plain, 6500, 1.0f);
    float *o = nan_array(p.nq), *lse = nan_array(p.nlse);
    clattn_context *ctx = test_context(NULL);
    ck_assert_ptr_nonnull(ctx);
    const int native = test_backend_kind() == CLATTN_BACKEND_NATIVE;
    clattn_shape s = plain;
    s.score_fn = "float clattn_score(float s, uint b, uint h, uint q, uint k,\n"
                 "                   __global const float *p) { return s + ; }\n";
    if (native) {
        ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse),
                         CLATTN_ERROR_UNSUPPORTED_SHAPE);
        ck_assert_ptr_nonnull(strstr(clattn_last_error(), "score_native"));
    } else {
        ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse),
                         CLATTN_ERROR_BUILD_FAILED);
        ck_assert_msg(strstr(clattn_last_error(), "build log") &&
                          strstr(clattn_last_error(), "score_fn"),
                      "no log naming score_fn: %s", clattn_last_error());
    }
    s = plain;
    s.score_native = softcap_score;
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse),
                     CLATTN_ERROR_INVALID_MODIFIER);
    s = with_score(plain, softcap_cl, softcap_score, softcap_ds, NULL, 1);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_ERROR_NULL_POINTER);
    s = with_mask(plain, "", holes_mask_int);
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_MODIFIER);
    for (size_t i = 0; i < p.nlse; ++i) /* the refused calls wrote nothing */
        ck_assert(isnan(lse[i]));
    s = with_mask(plain, NULL, holes_mask_int);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse),
                     native ? CLATTN_OK : CLATTN_ERROR_UNSUPPORTED_SHAPE);
    if (!native)
        ck_assert_ptr_nonnull(strstr(clattn_last_error(), "mask_fn"));
    /* the parameters' gradient: none without the derivative; refused, the
     * gradient as it was, where it names a parameter past the one there is
     * or more than CLATTN_SCORE_DP_MAX */
    const float cap[1] = {5.0f};
    s = with_score(plain, softcap_cl, softcap_score, softcap_ds, cap, 1);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    float d_cap = NAN;
    ck_assert_status(clattn_grad_score_params(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, &d_cap),
                     CLATTN_ERROR_NULL_POINTER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "score_dp_native"));
    uint32_t (*const bad[2])(float, uint32_t, uint32_t, uint32_t, uint32_t, const float *,
                             uint32_t *, float *) = {past_dp, many_dp};
    for (int i = 0; i < 2; ++i) {
        s.score_dp_native = bad[i];
        ck_assert_status(
            clattn_grad_score_params(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, &d_cap),
            CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert(isnan(d_cap));
    }
    if (!native) /* the same two in OpenCL C alone, on the device */
        for (int i = 0; i < 2; ++i) {
            static const char *const bad_cl[2] = {"0u] = q == k ? 1u : 0u; return 1u",
                                                  "0u] = 0u; return 5u"};
            char text[640];
            snprintf(text, sizeof text,
                     "float clattn_score(float s, uint b, uint h, uint q, uint k,\n"
                     "                   __global const float *p) { return s; }\n"
                     "float clattn_score_ds(float s, uint b, uint h, uint q, uint k,\n"
                     "                      __global const float *p) { return 1.0f; }\n"
                     "uint clattn_score_dp(float s, uint b, uint h, uint q, uint k,\n"
                     "                     __global const float *p, uint *index, float *d) {\n"
                     "    d[0] = 1.0f; index[%s; }\n",
                     bad_cl[i]);
            s = with_score(plain, text, NULL, NULL, cap, 1);
            ck_assert_status(
                clattn_grad_score_params(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, &d_cap),
                CLATTN_ERROR_INVALID_MODIFIER);
            ck_assert_ptr_nonnull(strstr(clattn_last_error(), "clattn_score_dp gave"));
            ck_assert(isnan(d_cap));
        }
    free(o);
    free(lse);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

programmable_tests get_programmable_tests(void)
{
    programmable_tests t = {builtins_as_functions, bias_table_and_document, {masks, 5},
                            finite_differences, bad_functions, packed_functions_sweep,
                            functions_tiled, functions_mma};
    return t;
}
