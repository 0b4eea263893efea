/* The caller's score and mask functions and bias tensors
 * (docs/programmable.md) against the float64 reference on every variant
 * and op: functions that reproduce
 * softcap and ALiBi against the built-ins, a relative-position bias table
 * through the parameters, document, prefix-LM and sliding-plus-global
 * masks and one that hides whole rows, all of them with GQA, offsets,
 * batch, dropout and sinks; finite differences of a score function and of
 * the sinks; bias tensors and bool masks, broadcast, with dBias and its
 * finite differences; what bad functions, biases and shapes get. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

/* Each function is written once, in the subset that OpenCL C and C share:
 * TWICE() keeps its text, unexpanded, for the OpenCL backends and compiles
 * it here as C, under the names the macros below give it, for native and
 * the reference. */
typedef unsigned int uint;
#define __global
#define TWICE(name, ...)                     \
    static const char name[] = #__VA_ARGS__; \
    __VA_ARGS__
#pragma GCC diagnostic ignored "-Wunused-parameter"

/* softcap as a function: the cap in p[0] */
#define clattn_score softcap_score
#define clattn_score_ds softcap_ds
TWICE(softcap_cl,
      float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          return p[0] * tanh(s / p[0]);
      } float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const float t = tanh(s / p[0]);
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
 * offset; then a cap, so that the derivative is not 1. */
#define clattn_score relbias_score
#define clattn_score_ds relbias_ds
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
      })
#undef clattn_score
#undef clattn_score_ds

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
static float relbias_table[8 * 17];
static void fill_relbias(void)
{
    for (int i = 0; i < 8 * 17; ++i)
        relbias_table[i] = (float)sin(0.7 * i + 0.3);
}

static clattn_shape with_score(clattn_shape s, const char *source,
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

static clattn_shape with_mask(clattn_shape s, const char *source,
                              int (*fn)(uint32_t, uint32_t, uint32_t, uint32_t))
{
    s.mask_fn = source;
    s.mask_native = fn;
    return s;
}

/* bool to int, for the shape's C form */
#define AS_INT(name)                                                       \
    static int name##_int(uint32_t b, uint32_t h, uint32_t q, uint32_t k) \
    {                                                                      \
        return name(b, h, q, k) ? 1 : 0;                                   \
    }
AS_INT(document_mask)
AS_INT(prefix_mask)
AS_INT(sliding_mask)
AS_INT(holes_mask)

/* The functions that reproduce softcap and ALiBi against the built-ins
 * themselves: softcap with large logits (case 0 of the modifiers), ALiBi
 * bottom-right at offsets with GQA. */
START_TEST(builtins_as_functions)
{
    const shape_case c0 = {.q_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 32, .causal = 1,
                           .q_gain = 4};
    clattn_shape cap_ref = to_shape(&c0);
    cap_ref.softcap = 5.0f;
    const clattn_shape cap_fn =
        with_score(to_shape(&c0), softcap_cl, softcap_score, softcap_ds, cap5, 1);
    const shape_case c1 = {.q_seq = 20, .kv_seq = 45, .heads = 8, .kv_heads = 2, .head_dim = 32,
                           .causal = CLATTN_CAUSAL_BOTTOM_RIGHT, .q_gain = 3};
    clattn_shape alibi_ref = to_shape(&c1);
    alibi_ref.q_offset = 7;
    alibi_ref.kv_offset = 5;
    clattn_shape alibi_fn =
        with_score(alibi_ref, alibi_cl, alibi_score, alibi_ds, slopes8, 8);
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
 * b in the function); then with the document mask and sinks, in float32
 * and bf16. */
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

/* The bias table with the document mask, sinks and dropout on tiled
 * alone, in float32: the portable suite's (rusticl). */
START_TEST(functions_tiled)
{
    fill_relbias();
    const shape_case c = {.batch = 2, .q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2,
                          .head_dim = 32, .causal = 1, .q_gain = 2};
    clattn_shape s = with_mask(with_score(to_shape(&c), relbias_cl, relbias_score, relbias_ds,
                                          relbias_table, 8 * 17),
                               document_cl, document_mask_int);
    s.dropout_p = 0.2f;
    s.dropout_seed = 77;
    s.sinks = sinks8;
    clattn_context *ctx = test_variant_context("tiled");
    ck_assert_ptr_nonnull(ctx);
    current_variant = "tiled";
    check_ops(ctx, &s, 2.0f, 6700);
    clattn_context_destroy(ctx);
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
static double loss(const problem *p)
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
 * function whose derivative is not 1, with a mask) and d sinks. */
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
    clattn_context *ctx = test_context(NULL);
    ck_assert_ptr_nonnull(ctx);
    problem p;
    problem_make(&p, &s, 6400, 3.0f);
    float *o = malloc(p.nq * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
    float *dq = malloc(p.nq * sizeof(float)), *dk = malloc(p.nkv * sizeof(float));
    float *dv = malloc(p.nkv * sizeof(float)), dsink[4];
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, dq, dk, dv),
                     CLATTN_OK);
    ck_assert_status(clattn_grad_sinks(ctx, &s, o, lse, p.d_out, dsink), CLATTN_OK);
    double largest = 0.0;
    for (size_t i = 0; i < p.nq; ++i)
        largest = fmax(largest, fabs((double)dq[i]));
    struct {
        float *x, *grad;
        size_t n;
        const char *name;
    } wrt[3] = {{p.q, dq, p.nq, "dQ"}, {p.k, dk, p.nkv, "dK"}, {sinks, dsink, 3, "d sinks"}};
    for (int w = 0; w < 3; ++w)
        for (size_t i = 0; i < wrt[w].n; i += (w == 2 ? 1 : 37)) {
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
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

/* A function that does not compile gives the compiler's log; a backend
 * without its form of a function, half a score function, parameters
 * without their array and an empty source get their statuses, nothing
 * written. */
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
    free(o);
    free(lse);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

/* The elements of a bias of s: [bias_batch][bias_heads][q_seq][kv_seq]. */
static size_t bias_elems(const clattn_shape *s)
{
    return (size_t)(s->bias_batch > 1 ? s->bias_batch : 1) *
           (s->bias_heads > 1 ? s->bias_heads : 1) * s->q_seq * s->kv_seq;
}

/* clattn_grad_bias() against the reference from the problem's O and LSE;
 * in 16-bit, from inputs rounded to the dtype (so both read the same). */
static void check_grad_bias(clattn_context *ctx, const clattn_shape *s, float q_gain,
                            uint64_t seed)
{
    problem p;
    problem_make(&p, s, seed, q_gain);
    const size_t n = bias_elems(s);
    float *got = nan_array(n);
    double *ref = doubles(n), *mag = doubles(n);
    float *in[5] = {p.q, p.k, p.v, p.o, p.d_out};
    const size_t count[5] = {p.nq, p.nkv, p.nkv, p.nq, p.nq};
    uint16_t *half[5] = {0};
    for (int i = 0; i < 5 && s->dtype != CLATTN_DTYPE_F32; ++i) {
        half[i] = malloc(count[i] * sizeof(uint16_t));
        ck_assert_ptr_nonnull(half[i]);
        clattn_from_f32(s->dtype, in[i], half[i], count[i]);
        clattn_to_f32(s->dtype, half[i], in[i], count[i]);
    }
    const void *t[5];
    for (int i = 0; i < 5; ++i)
        t[i] = half[i] ? (const void *)half[i] : (const void *)in[i];

    ck_assert_status(clattn_grad_bias(ctx, s, t[0], t[1], t[2], t[3], p.lse, t[4], got),
                     CLATTN_OK);
    ref_grad_bias(&p, ref, mag);
    clattn_shape f32 = *s;
    f32.dtype = CLATTN_DTYPE_F32; /* float32 results from the same values */
    expect_close(s->dtype == CLATTN_DTYPE_F32 ? "grad bias" : "grad bias (16-bit inputs)", &f32, q_gain, got, ref, mag, n);
    for (int i = 0; i < 5; ++i)
        free(half[i]);
    free(got);
    free(ref);
    free(mag);
    problem_free(&p);
}

/* The forward with s's bias and bool mask as cl_mem (bias_cl,
 * bool_mask_cl) gives the bytes it gives with them in host memory, on an
 * OpenCL context; a buffer too small is INVALID_BUFFER. On native, the
 * cl_mem forms alone are refused. */
static void check_device_bias(clattn_context *ctx, const clattn_shape *s, uint64_t seed)
{
    problem p;
    problem_make(&p, s, seed, 1.0f);
    float *o = nan_array(p.nq), *lse = nan_array(p.nlse);
    float *o2 = nan_array(p.nq), *lse2 = nan_array(p.nlse);
    clattn_shape d = *s;
    d.bias = NULL;
    d.bool_mask = NULL;
    cl_context cc = clattn_context_cl_context(ctx);
    if (!cc) {
        d.bias_cl = (void *)1; /* never read: refused first */
        ck_assert_status(clattn_forward(ctx, &d, p.q, p.k, p.v, o2, lse2),
                         CLATTN_ERROR_UNSUPPORTED_SHAPE);
    } else {
        const size_t n = bias_elems(s);
        cl_int err = CL_SUCCESS;
        cl_mem b = s->bias ? clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                            n * sizeof(float), (void *)s->bias, &err)
                           : NULL;
        ck_assert_int_eq(err, CL_SUCCESS);
        cl_mem m = s->bool_mask ? clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n,
                                                 (void *)s->bool_mask, &err)
                                : NULL;
        ck_assert_int_eq(err, CL_SUCCESS);
        d.bias_cl = b;
        d.bool_mask_cl = m;
        ck_assert_status(clattn_forward(ctx, s, p.q, p.k, p.v, o, lse), CLATTN_OK);
        ck_assert_status(clattn_forward(ctx, &d, p.q, p.k, p.v, o2, lse2), CLATTN_OK);
        ck_assert_msg(!memcmp(o, o2, p.nq * sizeof(float)) &&
                          !memcmp(lse, lse2, p.nlse * sizeof(float)),
                      "%s: the cl_mem bias gives other bytes than the host one", current_variant);
        cl_mem small = clCreateBuffer(cc, CL_MEM_READ_ONLY, 16, NULL, &err);
        ck_assert_int_eq(err, CL_SUCCESS);
        clattn_shape t = d;
        if (b)
            t.bias_cl = small;
        else
            t.bool_mask_cl = small;
        for (size_t i = 0; i < p.nlse; ++i)
            lse2[i] = NAN;
        ck_assert_status(clattn_forward(ctx, &t, p.q, p.k, p.v, o2, lse2),
                         CLATTN_ERROR_INVALID_BUFFER);
        ck_assert(isnan(lse2[0]));
        clReleaseMemObject(small);
        /* dBias from device tensors: the host call's bytes */
        const float *in[6] = {p.q, p.k, p.v, p.o, p.lse, p.d_out};
        const size_t count[6] = {p.nq, p.nkv, p.nkv, p.nq, p.nlse, p.nq};
        clattn_cl_tensor t6[6];
        for (int i = 0; i < 6; ++i) {
            t6[i].buffer = clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                          count[i] * sizeof(float), (void *)in[i], &err);
            t6[i].offset = 0;
            ck_assert_int_eq(err, CL_SUCCESS);
        }
        float *g1 = nan_array(n), *g2 = nan_array(n);
        ck_assert_status(clattn_grad_bias(ctx, s, p.q, p.k, p.v, p.o, p.lse, p.d_out, g1),
                         CLATTN_OK);
        ck_assert_status(clattn_grad_bias_cl(ctx, s, t6[0], t6[1], t6[2], t6[3], t6[4], t6[5], g2,
                                             0, NULL),
                         CLATTN_OK);
        ck_assert(!memcmp(g1, g2, n * sizeof(float)));
        t6[3].offset = 1; /* past the buffer's end */
        ck_assert_status(clattn_grad_bias_cl(ctx, s, t6[0], t6[1], t6[2], t6[3], t6[4], t6[5], g2,
                                             0, NULL),
                         CLATTN_ERROR_INVALID_BUFFER);
        for (int i = 0; i < 6; ++i)
            clReleaseMemObject(t6[i].buffer);
        free(g1), free(g2);
        if (b)
            clReleaseMemObject(b);
        if (m)
            clReleaseMemObject(m);
    }
    free(o), free(lse), free(o2), free(lse2);
    problem_free(&p);
}

/* A bias in [-2, 2) with a few -inf, and a bool mask with about one pair
 * in four hidden and, where rows_out, query rows 2 mod 9 hidden whole. */
static float *make_bias(const clattn_shape *s, uint64_t seed, int with_inf)
{
    const size_t n = bias_elems(s);
    float *b = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = with_inf && (seed >> 40) % 11u == 0u ? -INFINITY
                                                     : (float)((seed >> 33) % 4096u) / 1024.0f - 2.0f;
    }
    return b;
}
static uint8_t *make_bool(const clattn_shape *s, uint64_t seed, int rows_out)
{
    const size_t n = bias_elems(s);
    uint8_t *m = malloc(n);
    ck_assert_ptr_nonnull(m);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const size_t row = i / s->kv_seq % s->q_seq;
        m[i] = (seed >> 40) % 4u != 0u && !(rows_out && row % 9u == 2u);
    }
    return m;
}

/* Bias tensors and bool masks, every op and dBias against the reference:
 * a per-head bias over a batch with GQA, causal and dropout; a per-element
 * bias with a bool mask that hides some rows whole (checked empty),
 * bottom-right at offsets; past the block map's 64 positions, a bool mask
 * of blocks with a bias of some -inf (float32 and bf16); a bias with a
 * score function, a mask function and sinks (the order). */
START_TEST(bias_tensors)
{
    const shape_case cases[4] = {
        {.batch = 2, .q_seq = 33, .kv_seq = 41, .heads = 4, .kv_heads = 2, .head_dim = 32,
         .causal = 1, .q_gain = 2},
        {.batch = 2, .q_seq = 30, .kv_seq = 37, .heads = 2, .head_dim = 32,
         .causal = CLATTN_CAUSAL_BOTTOM_RIGHT},
        {.q_seq = 150, .kv_seq = 140, .heads = 2, .kv_heads = 1, .head_dim = 32},
        {.q_seq = 40, .heads = 4, .kv_heads = 2, .head_dim = 32, .q_gain = 2},
    };
    fill_relbias();
    clattn_shape s = to_shape(&cases[_i]);
    float *bias = NULL;
    uint8_t *keep = NULL;
    switch (_i) {
    case 0:
        s.bias_heads = s.num_heads;
        s.dropout_p = 0.25f;
        s.dropout_seed = 99;
        s.bias = bias = make_bias(&s, 7100, 0);
        break;
    case 1:
        s.bias_batch = s.batch;
        s.q_offset = 3;
        s.kv_offset = 5;
        s.bias = bias = make_bias(&s, 7101, 0);
        s.bool_mask = keep = make_bool(&s, 7102, 1);
        break;
    case 2:
        s.bias_heads = s.num_heads;
        s.bias = bias = make_bias(&s, 7103, 1);
        keep = make_bool(&s, 0, 0);
        for (size_t i = 0; i < bias_elems(&s); ++i) /* blocks of 70 x 50 on a diagonal */
            keep[i] = i / s.kv_seq % s.q_seq / 70u == i % s.kv_seq / 50u;
        s.bool_mask = keep;
        break;
    default:
        s = with_mask(with_score(s, relbias_cl, relbias_score, relbias_ds, relbias_table, 8 * 17),
                      prefix_cl, prefix_mask_int);
        s.sinks = sinks8;
        s.bias = bias = make_bias(&s, 7104, 0);
        break;
    }
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, &s, case_gain(&cases[_i]), 7110u + (uint64_t)_i);
        if (v == 1) { /* dBias runs on the host: once a backend */
            check_grad_bias(ctx, &s, case_gain(&cases[_i]), 7120u + (uint64_t)_i);
            check_device_bias(ctx, &s, 7150u + (uint64_t)_i);
        }
        if (_i == 1) { /* rows 2 mod 9 are hidden whole: empty */
            problem p;
            problem_make(&p, &s, 7130, 1.0f);
            float *o = nan_array(p.nq), *lse = nan_array(p.nlse);
            ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
            for (size_t r = 0; r < p.nlse / 2; ++r)
                if (r / s.num_heads % s.q_seq % 9u == 2u) {
                    ck_assert_float_eq(lse[2 * r], -1e30f);
                    ck_assert_float_eq(o[r * s.head_dim], 0.0f);
                }
            free(o);
            free(lse);
            problem_free(&p);
        }
        if (_i == 2 && dtype_runs(CLATTN_DTYPE_BF16)) {
            clattn_shape h = s;
            h.dtype = CLATTN_DTYPE_BF16;
            check_ops_16(ctx, &h, 1.0f, 7140);
            if (v == 1)
                check_grad_bias(ctx, &h, 1.0f, 7141);
        }
        clattn_context_destroy(ctx);
    }
    free(bias);
    free(keep);
}
END_TEST

/* Central differences of L against dBias (a broadcast bias, with softcap
 * and a mask function); then what bad biases and calls get, nothing
 * written. */
START_TEST(bias_gradient)
{
    const shape_case c = {.batch = 2, .q_seq = 11, .kv_seq = 13, .heads = 4, .kv_heads = 2,
                          .head_dim = 16, .q_gain = 3};
    clattn_shape s = with_mask(to_shape(&c), prefix_cl, prefix_mask_int);
    s.softcap = 4.0f;
    s.bias_heads = s.num_heads;
    float *bias = make_bias(&s, 7200, 0);
    s.bias = bias;
    clattn_context *ctx = test_context(NULL);
    ck_assert_ptr_nonnull(ctx);
    problem p;
    problem_make(&p, &s, 7201, 3.0f);
    const size_t n = bias_elems(&s);
    float *o = malloc(p.nq * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
    float *db = nan_array(n);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, db), CLATTN_OK);
    double largest = 0.0;
    for (size_t i = 0; i < n; ++i)
        largest = fmax(largest, fabs((double)db[i]));
    p.s.bias = bias;
    for (size_t i = 0; i < n; i += 5) {
        const float x0 = bias[i];
        bias[i] = x0 + 1e-2f;
        const double up = loss(&p), hi = bias[i];
        bias[i] = x0 - 1e-2f;
        const double down = loss(&p), lo = bias[i];
        bias[i] = x0;
        const double fd = (up - down) / (hi - lo);
        ck_assert_msg(fabs(fd - db[i]) <= 2e-3 * (fabs(fd) + largest),
                      "on %s: dBias[%zu] is %g, finite differences give %g", test_backend, i,
                      (double)db[i], fd);
    }
    /* bad input: a status, nothing written */
    float *untouched = nan_array(n);
    clattn_shape bad = s;
    bad.bias_batch = 3;
    ck_assert_status(clattn_forward(ctx, &bad, p.q, p.k, p.v, o, lse),
                     CLATTN_ERROR_INVALID_MODIFIER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "bias_batch"));
    bad = s;
    bad.bias_heads = 2;
    ck_assert_status(clattn_grad_bias(ctx, &bad, p.q, p.k, p.v, o, lse, p.d_out, untouched),
                     CLATTN_ERROR_INVALID_MODIFIER);
    ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, NULL),
                     CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, (float *)p.q),
                     CLATTN_ERROR_INVALID_BUFFER);
    const uint32_t cu[3] = {0, 5, 11}, cu_kv[3] = {0, 6, 13};
    bad = s;
    bad.cu_seqlens_q = cu;
    bad.cu_seqlens_kv = cu_kv;
    ck_assert_status(clattn_shape_validate(&bad), CLATTN_ERROR_UNSUPPORTED_SHAPE);
    bad.bias = NULL;
    ck_assert_status(clattn_grad_bias(ctx, &bad, p.q, p.k, p.v, o, lse, p.d_out, untouched),
                     CLATTN_ERROR_UNSUPPORTED_SHAPE);
    bad = s;
    bad.mask_native = NULL; /* OpenCL C alone: the host cannot run it */
    ck_assert_status(clattn_grad_bias(ctx, &bad, p.q, p.k, p.v, o, lse, p.d_out, untouched),
                     CLATTN_ERROR_UNSUPPORTED_SHAPE);
    for (size_t i = 0; i < n; ++i)
        ck_assert(isnan(untouched[i]));
    free(untouched);
    free(o);
    free(lse);
    free(db);
    free(bias);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

programmable_tests get_programmable_tests(void)
{
    programmable_tests t = {builtins_as_functions, bias_table_and_document, {masks, 5},
                            finite_differences, bad_functions, packed_functions_sweep,
                            functions_tiled, {bias_tensors, 4}, bias_gradient};
    return t;
}
