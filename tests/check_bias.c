/* Bias tensors and bool masks (shape.bias, bool_mask and their cl_mem
 * forms; docs/programmable.md) against the float64 reference on every
 * variant and op, broadcast over heads or batch, with dropout, offsets,
 * rows hidden whole, past the block map's 64 positions and beside the
 * caller's functions and sinks; dBias against the reference and central
 * differences; what bad biases get. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "functions.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

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
        const size_t bias_bytes = s->bias_dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2;
        cl_mem b = s->bias ? clCreateBuffer(cc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                            n * bias_bytes, (void *)s->bias, &err)
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
float *make_bias(const clattn_shape *s, uint64_t seed, int with_inf)
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
uint8_t *make_bool(const clattn_shape *s, uint64_t seed, int rows_out)
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
    int first = 1;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL; first = 0) {
        check_ops(ctx, &s, case_gain(&cases[_i]), 7110u + (uint64_t)_i);
        if (first) { /* dBias runs the same kernels whatever the variant: once a backend */
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
            if (first)
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
    /* accumulate adds to what d_bias holds */
    float *twice = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(twice);
    memcpy(twice, db, n * sizeof(float));
    clattn_shape acc = s;
    acc.accumulate = 1;
    ck_assert_status(clattn_grad_bias(ctx, &acc, p.q, p.k, p.v, o, lse, p.d_out, twice),
                     CLATTN_OK);
    assert_scaled(twice, db, 2.0, n, 1e-6 * largest, "dBias", "accumulated (want twice)");
    free(twice);
    if (clattn_context_cl_context(ctx)) {
        /* The mask function in OpenCL C alone: the host cannot run it, so
         * dBias runs on the device whatever CLATTN_GRAD_BIAS says; then on
         * a device of 16 work-items a work-group, its tiles 4 by 4. */
        clattn_shape dev = s;
        dev.mask_native = NULL;
        float *dbd = nan_array(n);
        ck_assert_status(clattn_grad_bias(ctx, &dev, p.q, p.k, p.v, o, lse, p.d_out, dbd),
                         CLATTN_OK);
        ck_assert_ptr_nonnull(strstr(clattn_context_kernels(ctx), "grad_bias__tree"));
        assert_scaled(dbd, db, 1.0, n, 1e-5 * largest, "dBias",
                      "on the device (want the context's)");
        clattn_context *small = test_limited_context("16,8192");
        ck_assert_ptr_nonnull(small);
        float *db4 = nan_array(n);
        ck_assert_status(clattn_grad_bias(small, &dev, p.q, p.k, p.v, o, lse, p.d_out, db4),
                         CLATTN_OK);
        ck_assert_ptr_nonnull(strstr(clattn_context_kernels(small), "grad_bias__tree"));
        assert_scaled(db4, dbd, 1.0, n, 1e-5 * largest, "dBias",
                      "in tiles of 4 (want tiles of 16's)");
        free(db4);
        free(dbd);
        clattn_context_destroy(small);
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
    bad.mask_native = NULL; /* OpenCL C alone: native cannot run it (a device can, above) */
    if (!clattn_context_cl_context(ctx))
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

/* Every op of s, and dBias on the host, into one buffer per output. */
typedef struct bias_outputs {
    float *o, *lse, *dq, *dk, *dv, *db;
} bias_outputs;

static bias_outputs bias_run(clattn_context *ctx, const clattn_shape *s, const problem *p)
{
    const size_t n = bias_elems(s);
    bias_outputs r = {nan_array(p->nq), nan_array(p->nlse), nan_array(p->nq),
                      nan_array(p->nkv), nan_array(p->nkv), nan_array(n)};
    ck_assert_status(clattn_forward(ctx, s, p->q, p->k, p->v, r.o, r.lse), CLATTN_OK);
    ck_assert_status(
        clattn_backward(ctx, s, p->q, p->k, p->v, p->o, p->lse, p->d_out, r.dq, r.dk, r.dv),
        CLATTN_OK);
    ck_assert_status(clattn_grad_bias(ctx, s, p->q, p->k, p->v, p->o, p->lse, p->d_out, r.db),
                     CLATTN_OK);
    return r;
}

static void bias_outputs_free(bias_outputs *r)
{
    float *all[6] = {r->o, r->lse, r->dq, r->dk, r->dv, r->db};
    for (int i = 0; i < 6; ++i)
        free(all[i]);
}

/* A bfloat16 and a float16 bias (with -inf) give, on every variant, the
 * bytes that a float32 bias of the same values gives: each op, dBias, and
 * (OpenCL) the bias as a 16-bit cl_mem; a bias_dtype that is not one is
 * refused. */
START_TEST(bias_16)
{
    const shape_case c = {.q_seq = 40, .kv_seq = 45, .heads = 4, .kv_heads = 2, .head_dim = 32,
                          .causal = 1, .q_gain = 2};
    clattn_shape s = to_shape(&c);
    s.bias_heads = s.num_heads;
    float *bias = make_bias(&s, 7300, 1);
    const size_t n = bias_elems(&s);
    uint16_t *bits = malloc(n * sizeof *bits);
    const clattn_dtype kinds[2] = {CLATTN_DTYPE_BF16, CLATTN_DTYPE_F16};
    for (int k = 0; k < (HAVE_F16 ? 2 : 1); ++k) {
        round_16(bias, bits, n, kinds[k]); /* bias now holds the 16-bit values */
        clattn_shape wide = s, narrow = s;
        wide.bias = bias;
        narrow.bias = bits;
        narrow.bias_dtype = kinds[k];
        problem p;
        problem_make(&p, &wide, 7301, 2.0f);
        clattn_context *ctx;
        for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
            bias_outputs a = bias_run(ctx, &wide, &p), b = bias_run(ctx, &narrow, &p);
            const size_t sizes[6] = {p.nq, p.nlse, p.nq, p.nkv, p.nkv, n};
            const float *x[6] = {a.o, a.lse, a.dq, a.dk, a.dv, a.db};
            const float *y[6] = {b.o, b.lse, b.dq, b.dk, b.dv, b.db};
            static const char *const names[6] = {"O", "LSE", "dQ", "dK", "dV", "dBias"};
            for (int i = 0; i < 6; ++i)
                ck_assert_msg(!memcmp(x[i], y[i], sizes[i] * sizeof(float)),
                              "%s: %s with a %s bias differs from the float32 bias's",
                              current_variant, names[i], kinds[k] == CLATTN_DTYPE_BF16 ? "bf16" : "f16");
            bias_outputs_free(&a);
            bias_outputs_free(&b);
            check_device_bias(ctx, &narrow, 7302);
            clattn_context_destroy(ctx);
        }
        problem_free(&p);
    }
    clattn_shape bad = s;
    bad.bias = bits;
    bad.bias_dtype = (clattn_dtype)7;
    ck_assert_status(clattn_shape_validate(&bad), CLATTN_ERROR_INVALID_MODIFIER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "bias_dtype"));
    free(bias);
    free(bits);
}
END_TEST

bias_tests get_bias_tests(void)
{
    bias_tests t = {{bias_tensors, 4}, bias_gradient, bias_16};
    return t;
}
