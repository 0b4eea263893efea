/* The score parameters' gradient beyond the float64 reference: on the
 * device's kernel (grad_score_params__tree) against the context's and
 * native's passes, in tiles of 16 and of 4, with the built-in modifiers,
 * accumulated, with a table past the device's local memory, with three
 * entries a pair, and from bfloat16 tensors. finite_differences
 * (check_programmable.c) calls it with its relative-bias table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "functions.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"
#include "twice.h"

/* Three entries a pair, which may repeat: the relative bucket, the far
 * right bucket at half weight (the same entry past distance 8) and bucket
 * q mod 5 at a quarter. */
#define clattn_score terms_score
#define clattn_score_ds terms_ds
#define clattn_score_dp terms_dp
static TWICE(terms_cl,
      float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          const int d = (int)k - (int)q;
          const uint at = 17u * h + (uint)(d < -8 ? 0 : d > 8 ? 16 : d + 8);
          return s + p[at] + 0.5f * p[17u * h + 16u] + 0.25f * p[17u * h + q % 5u];
      } float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p) {
          return 1.0f;
      } uint clattn_score_dp(float s, uint b, uint h, uint q, uint k, __global const float *p,
                             uint *index, float *d) {
          const int dist = (int)k - (int)q;
          index[0] = 17u * h + (uint)(dist < -8 ? 0 : dist > 8 ? 16 : dist + 8);
          index[1] = 17u * h + 16u;
          index[2] = 17u * h + q % 5u;
          d[0] = 1.0f;
          d[1] = 0.5f;
          d[2] = 0.25f;
          return 3u;
      })
#undef clattn_score
#undef clattn_score_ds
#undef clattn_score_dp

#undef __global

/* s with its functions' OpenCL C alone: no C forms for the host. */
static clattn_shape opencl_only(clattn_shape s)
{
    s.score_native = NULL;
    s.score_ds_native = NULL;
    s.mask_native = NULL;
    s.score_dp_native = NULL;
    return s;
}

/* The parameters' gradient of s on ctx's device (the functions in OpenCL C
 * alone) against want, within 1e-5 of want's largest entry, not zero. */
static void device_params_match(clattn_context *ctx, const clattn_shape *s, const problem *p,
                                const float *o, const float *lse, const float *want, size_t n,
                                const char *what)
{
    const clattn_shape dev = opencl_only(*s);
    float *got = nan_array(n);
    ck_assert_ptr_nonnull(got);
    ck_assert_status(clattn_grad_score_params(ctx, &dev, p->q, p->k, p->v, o, lse, p->d_out, got),
                     CLATTN_OK);
    ck_assert_ptr_nonnull(strstr(clattn_context_kernels(ctx), "grad_score_params__tree"));
    double largest = 0.0;
    for (size_t i = 0; i < n; ++i)
        largest = fmax(largest, fabs((double)want[i]));
    ck_assert(largest > 0.0);
    assert_scaled(got, want, 1.0, n, 1e-5 * largest, "d table", what);
    free(got);
}

/* The table's gradient on the device (score_dp from score_fn's source)
 * against the context's, dtable: the functions in OpenCL C alone, which
 * the host cannot run, so that the device takes it whatever
 * CLATTN_GRAD_BIAS says; added under accumulate; on a device of 16
 * work-items a work-group (tiles of 4 by 4) and 8 KB of local memory,
 * where a table past that memory goes to the host's pass. */
static void table_on_device(clattn_context *ctx, const clattn_shape *s, const problem *p,
                            const float *o, const float *lse, const float *dtable)
{
    enum { N = 8 * 17, BIG = 2000 };
    double largest = 0.0;
    for (size_t i = 0; i < N; ++i)
        largest = fmax(largest, fabs((double)dtable[i]));
    clattn_shape dev = opencl_only(*s);
    float got[N], twice[N];
    for (size_t i = 0; i < N; ++i)
        got[i] = NAN;
    ck_assert_status(clattn_grad_score_params(ctx, &dev, p->q, p->k, p->v, o, lse, p->d_out, got),
                     CLATTN_OK);
    ck_assert_ptr_nonnull(strstr(clattn_context_kernels(ctx), "grad_score_params__tree"));
    assert_scaled(got, dtable, 1.0, N, 1e-5 * largest, "d table",
                  "on the device (want the context's)");
    memcpy(twice, got, sizeof twice);
    dev.accumulate = 1;
    ck_assert_status(
        clattn_grad_score_params(ctx, &dev, p->q, p->k, p->v, o, lse, p->d_out, twice),
        CLATTN_OK);
    assert_scaled(twice, got, 2.0, N, 1e-6 * largest, "d table", "accumulated (want twice)");
    dev.accumulate = 0;
    /* the built-in modifiers before the function (its argument is theirs),
     * dropout and offsets: the context's against the device's */
    const float slopes[4] = {0.25f, 0.5f, 0.125f, 0.0625f};
    clattn_shape rich = *s;
    rich.softcap = 4.0f;
    rich.alibi_slopes = slopes;
    rich.dropout_p = 0.25f;
    rich.dropout_seed = 77;
    rich.q_offset = 5;
    rich.kv_offset = 3;
    float *o2 = nan_array(p->nq), *lse2 = nan_array(p->nlse), want[N];
    ck_assert(o2 && lse2);
    ck_assert_status(clattn_forward(ctx, &rich, p->q, p->k, p->v, o2, lse2), CLATTN_OK);
    ck_assert_status(
        clattn_grad_score_params(ctx, &rich, p->q, p->k, p->v, o2, lse2, p->d_out, want),
        CLATTN_OK);
    device_params_match(ctx, &rich, p, o2, lse2, want, N,
                        "with softcap, ALiBi, dropout and offsets (want the context's)");
    free(o2);
    free(lse2);
    clattn_context *small = test_limited_context("16,8192");
    ck_assert_ptr_nonnull(small);
    float four[N];
    ck_assert_status(
        clattn_grad_score_params(small, &dev, p->q, p->k, p->v, o, lse, p->d_out, four),
        CLATTN_OK);
    ck_assert_ptr_nonnull(strstr(clattn_context_kernels(small), "grad_score_params__tree"));
    assert_scaled(four, got, 1.0, N, 1e-5 * largest, "d table",
                  "in tiles of 4 (want tiles of 16's)");
    /* a table of BIG: past 8 KB beside the tiles, so on the host, where
     * its C forms let it; without them, a status and nothing written */
    float *big_params = calloc(BIG, sizeof(float)), *big = nan_array(BIG);
    ck_assert(big_params && big);
    memcpy(big_params, s->score_params, N * sizeof(float));
    clattn_shape wide = *s;
    wide.score_params = big_params;
    wide.score_params_count = BIG;
    ck_assert_status(
        clattn_grad_score_params(small, &wide, p->q, p->k, p->v, o, lse, p->d_out, big),
        CLATTN_OK);
    ck_assert_ptr_nonnull(strstr(clattn_context_kernels(small), "grad_score_params__host"));
    assert_scaled(big, dtable, 1.0, N, 1e-5 * largest, "d table",
                  "of a wide table on the host");
    for (size_t i = N; i < BIG; ++i)
        ck_assert(big[i] == 0.0f);
    wide = opencl_only(wide);
    big[0] = NAN;
    ck_assert_status(
        clattn_grad_score_params(small, &wide, p->q, p->k, p->v, o, lse, p->d_out, big),
        CLATTN_ERROR_NULL_POINTER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "local memory"));
    ck_assert(isnan(big[0]));
    free(big_params);
    free(big);
    clattn_context_destroy(small);
}

/* A function of three entries a pair, some the same, on the device (in
 * tiles of 16, then of 4) against native's pass through its C form: each
 * work-item's held sums fill and flush at different tiles. */
static void terms_on_device(clattn_context *ctx)
{
    enum { N = 2 * 17 };
    const shape_case c = {.q_seq = 70, .kv_seq = 75, .heads = 2, .kv_heads = 1, .head_dim = 16,
                          .q_gain = 2};
    clattn_shape s = with_score(to_shape(&c), terms_cl, terms_score, terms_ds, relbias_table, N);
    s.score_dp_native = terms_dp;
    problem p;
    problem_make(&p, &s, 6401, 2.0f);
    float *o = malloc(p.nq * sizeof(float)), *lse = malloc(p.nlse * sizeof(float));
    ck_assert(o && lse);
    float want[N];
    clattn_options native = clattn_options_default();
    native.device = "native";
    clattn_context *host = NULL;
    ck_assert_status(clattn_context_create(&native, &host), CLATTN_OK);
    ck_assert_status(clattn_forward(ctx, &s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    ck_assert_status(clattn_grad_score_params(host, &s, p.q, p.k, p.v, o, lse, p.d_out, want),
                     CLATTN_OK);
    clattn_context_destroy(host);
    device_params_match(ctx, &s, &p, o, lse, want, N,
                        "of three entries a pair on the device (want native's)");
    clattn_context *small = test_limited_context("16,8192");
    ck_assert_ptr_nonnull(small);
    device_params_match(small, &s, &p, o, lse, want, N,
                        "of three entries a pair in tiles of 4 (want native's)");
    clattn_context_destroy(small);
    free(o);
    free(lse);
    problem_free(&p);
}

/* The table's gradient from bfloat16 tensors against float32 ones of the
 * same values (Q, K, V, O and dO rounded to bfloat16): each op reads them
 * exactly, so the two agree to float32's rounding; on the context's pass,
 * then (an OpenCL context) on the device's kernel. */
static void table_from_bf16(clattn_context *ctx, const clattn_shape *s, const problem *p,
                            const float *o, const float *lse)
{
    enum { N = 8 * 17 };
    if (!dtype_runs(CLATTN_DTYPE_BF16))
        return;
    const float *in[5] = {p->q, p->k, p->v, o, p->d_out};
    const size_t count[5] = {p->nq, p->nkv, p->nkv, p->nq, p->nq};
    float *wide[5];
    uint16_t *half[5];
    for (int i = 0; i < 5; ++i) {
        wide[i] = malloc(count[i] * sizeof(float));
        half[i] = malloc(count[i] * sizeof(uint16_t));
        ck_assert(wide[i] && half[i]);
        clattn_from_f32(CLATTN_DTYPE_BF16, in[i], half[i], count[i]);
        clattn_to_f32(CLATTN_DTYPE_BF16, half[i], wide[i], count[i]);
    }
    for (int dev = 0; dev < 1 + (clattn_context_cl_context(ctx) != NULL); ++dev) {
        clattn_shape f = dev ? opencl_only(*s) : *s, h = f;
        h.dtype = CLATTN_DTYPE_BF16;
        float want[N], got[N];
        ck_assert_status(clattn_grad_score_params(ctx, &f, wide[0], wide[1], wide[2], wide[3],
                                                  lse, wide[4], want),
                         CLATTN_OK);
        ck_assert_status(clattn_grad_score_params(ctx, &h, half[0], half[1], half[2], half[3],
                                                  lse, half[4], got),
                         CLATTN_OK);
        double largest = 0.0;
        for (size_t i = 0; i < N; ++i)
            largest = fmax(largest, fabs((double)want[i]));
        assert_scaled(got, want, 1.0, N, 1e-5 * largest, "d table",
                      dev ? "from bfloat16 on the device" : "from bfloat16");
    }
    for (int i = 0; i < 5; ++i) {
        free(wide[i]);
        free(half[i]);
    }
}

void params_checks(clattn_context *ctx, const clattn_shape *s, const problem *p, const float *o,
                   const float *lse, const float *dtable)
{
    if (clattn_context_cl_context(ctx)) {
        table_on_device(ctx, s, p, o, lse, dtable);
        terms_on_device(ctx);
    }
    table_from_bf16(ctx, s, p, o, lse);
}
