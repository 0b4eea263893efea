/* The kernel tests of 16-bit tensors (bfloat16 and float16) on every
 * variant, and of mma's kernels emulated on the OpenCL CPU device; the
 * reduced sweeps for Oclgrind and tiled's forced shapes. */
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

uint16_t *halves(size_t n)
{
    uint16_t *a = malloc((n ? n : 1) * sizeof(uint16_t));
    ck_assert_ptr_nonnull(a);
    for (size_t i = 0; i < n; ++i)
        a[i] = 0x7e00u; /* a NaN in both formats: unwritten outputs fail */
    return a;
}

/* 16-bit outputs against the float64 reference of the rounded inputs: the
 * float32 tolerance, plus the one rounding of the output to dtype (unit
 * roundoff u = 2^-8 for bf16, 2^-11 for f16, of |ref|), plus the rounding
 * of the second product's operands where a kernel feeds P or dS back to
 * 16-bit tensor-core products (mma, as FlashAttention): each term p_j x_j
 * of a sum is off by at most u |p_j x_j|, so the sum by u times the sum of
 * the terms' magnitudes, which is mag. After `calls` calls that each add
 * the same gradient into a 16-bit output (accumulate), the output is calls
 * times ref, off by each call's error and each rounding of a partial sum
 * (u |j ref| for the j-th): calls times the float32 and operand terms, and
 * u (calls^2 + calls) / 2 |ref| for the roundings. */
static void expect_sum_16(const char *what, const clattn_shape *s, const uint16_t *got,
                          const double *ref, const double *mag, size_t n, int calls)
{
    const double u = s->dtype == CLATTN_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    const double roundings = (calls * calls + calls) / 2.0;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        const double g = from_16(got[i], s->dtype);
        double e = fabs(g - calls * ref[i]) /
                   (calls * (TOL_REL * mag[i] + TOL_ABS + u * mag[i]) +
                    u * roundings * fabs(ref[i]));
        if (isnan(e))
            e = INFINITY;
        if (e > worst) {
            worst = e;
            at = i;
        }
    }
    ck_assert_msg(worst <= 1.0,
                  "%s (dtype %d) on %s/%s: b%u q%u kv%u heads %u/%u d%u causal %d window %u: "
                  "element %zu is %.9g, reference %.9g; %.3g times the tolerance",
                  what, (int)s->dtype, test_backend, current_variant, s->batch, s->q_seq, s->kv_seq,
                  s->num_heads, s->num_kv_heads, s->head_dim, s->causal, s->window, at,
                  (double)from_16(got[at], s->dtype), calls * ref[at], worst);
}

void expect_close_16(const char *what, const clattn_shape *s, const uint16_t *got,
                     const double *ref, const double *mag, size_t n)
{
    expect_sum_16(what, s, got, ref, mag, n, 1);
}

/* Every op with 16-bit tensors on ctx, against float64 from the rounded
 * inputs; the LSE pairs stay float32. */
void check_ops_16(clattn_context *ctx, const clattn_shape *s, float q_gain, uint64_t seed)
{
    problem p;
    problem_make(&p, s, seed, q_gain);
    uint16_t *q = halves(p.nq), *k = halves(p.nkv), *v = halves(p.nkv), *d_out = halves(p.nq);
    uint16_t *o_in = halves(p.nq);
    round_16(p.q, q, p.nq, s->dtype);
    round_16(p.k, k, p.nkv, s->dtype);
    round_16(p.v, v, p.nkv, s->dtype);
    round_16(p.d_out, d_out, p.nq, s->dtype);
    double *o_ref = doubles(p.nq), *o_mag = doubles(p.nq), *lse_ref = doubles(p.nlse);
    ref_forward(&p, o_ref, o_mag, lse_ref);
    for (size_t i = 0; i < p.nq; ++i)
        p.o[i] = (float)o_ref[i];
    for (size_t i = 0; i < p.nlse; ++i)
        p.lse[i] = (float)lse_ref[i];
    round_16(p.o, o_in, p.nq, s->dtype); /* the backward's O, as a 16-bit forward gives it */

    uint16_t *o = halves(p.nq), *gq = halves(p.nq), *gk = halves(p.nkv), *gv = halves(p.nkv);
    float *lse = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, s, q, k, v, o, lse), CLATTN_OK);
    expect_close_16("forward O", s, o, o_ref, o_mag, p.nq);
    expect_lse(s, lse, lse_ref, p.nlse);

    double *dq = doubles(p.nq), *dq_mag = doubles(p.nq), *dk = doubles(p.nkv);
    double *dk_mag = doubles(p.nkv), *dv = doubles(p.nkv), *dv_mag = doubles(p.nkv);
    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    ck_assert_status(clattn_backward(ctx, s, q, k, v, o_in, p.lse, d_out, gq, gk, gv),
                     CLATTN_OK);
    /* CLATTN_MMA_SINGLE=W,1,T,P forces mma's single-pass backward wherever
     * its local memory fits, up to head_dim 128 on every device the tests
     * run: not two passes in silence (at head_dims off a multiple of 8,
     * 16-bit tensors run tiled's kernels instead). */
    const char *single = getenv("CLATTN_MMA_SINGLE");
    if (single && strchr(single, ',') && !strcmp(current_variant, "mma") && s->head_dim <= 128 &&
        s->head_dim % 8 == 0)
        ck_assert_msg(strstr(clattn_context_kernels(ctx), "grad_kvq__mma") != NULL,
                      "CLATTN_MMA_SINGLE=%s, but the backward ran %s", single,
                      clattn_context_kernels(ctx));
    expect_close_16("backward dQ", s, gq, dq, dq_mag, p.nq);
    expect_close_16("backward dK", s, gk, dk, dk_mag, p.nkv);
    expect_close_16("backward dV", s, gv, dv, dv_mag, p.nkv);
    /* Accumulated: a second backward adds the same gradients into the
     * first's (rounded) outputs. */
    clattn_shape twice = *s;
    twice.accumulate = 1;
    ck_assert_status(clattn_backward(ctx, &twice, q, k, v, o_in, p.lse, d_out, gq, gk, gv),
                     CLATTN_OK);
    expect_sum_16("accumulated dQ", s, gq, dq, dq_mag, p.nq, 2);
    expect_sum_16("accumulated dK", s, gk, dk, dk_mag, p.nkv, 2);
    expect_sum_16("accumulated dV", s, gv, dv, dv_mag, p.nkv, 2);
    if (s->sinks) { /* from 16-bit O and dO: within their rounding of the magnitude */
        double *ds = doubles(s->num_heads), *ds_mag = doubles(s->num_heads);
        float *got = nan_array(s->num_heads);
        ref_grad_sinks(&p, ds, ds_mag);
        ck_assert_status(clattn_grad_sinks(ctx, s, o_in, p.lse, d_out, got), CLATTN_OK);
        for (uint32_t h = 0; h < s->num_heads; ++h)
            ck_assert_msg(fabs(got[h] - ds[h]) <= ds_mag[h] / 128.0 + TOL_ABS,
                          "d sinks[%u] on %s/%s: %.9g, reference %.9g (mag %.3g)", h,
                          test_backend, current_variant, (double)got[h], ds[h], ds_mag[h]);
        free(ds);
        free(ds_mag);
        free(got);
    }
    uint16_t *one = halves(p.nkv);
    ck_assert_status(clattn_grad_v(ctx, s, d_out, q, k, p.lse, one), CLATTN_OK);
    expect_close_16("grad-V", s, one, dv, dv_mag, p.nkv);
    ck_assert_status(clattn_grad_k(ctx, s, q, k, v, o_in, p.lse, d_out, one), CLATTN_OK);
    expect_close_16("grad-K", s, one, dk, dk_mag, p.nkv);
    free(one);
    one = halves(p.nq);
    ck_assert_status(clattn_grad_q(ctx, s, q, k, v, o_in, p.lse, d_out, one), CLATTN_OK);
    expect_close_16("grad-Q", s, one, dq, dq_mag, p.nq);
    free(one);

    void *frees[] = {q, k, v, d_out, o_in, o, gq, gk, gv, lse, o_ref, o_mag, lse_ref,
                     dq, dq_mag, dk, dk_mag, dv, dv_mag};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    problem_free(&p);
}


/* A reduced set for Oclgrind, whose simulation is slow: still tails past
 * a work-group and a tile, GQA, causal, windows, kv_seq != q_seq, batch,
 * and every op of every variant. head_dims are powers of two: for others
 * LLVM divides by a constant with a `freeze` instruction, which Oclgrind
 * 21.10's uninitialised-value check cannot simulate (it aborts the kernel;
 * tests/oclgrind.sh fails on that). Odd head_dims run everywhere else. */
static const shape_case simulated[] = {
    {.batch = 2, .q_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 8, .causal = 1, .window = 20},
    {.q_seq = 9, .kv_seq = 37, .heads = 2, .kv_heads = 1, .head_dim = 4, .window = 5},
    {.q_seq = 33, .heads = 3, .head_dim = 16, .scale = 0.5f},
    {.q_seq = 66, .kv_seq = 100, .heads = 2, .kv_heads = 1, .head_dim = 2},
};
START_TEST(simulated_sweep) { run_cases(simulated, _i); }
END_TEST

/* A reduced set for the mma kernels with their instructions emulated on
 * the OpenCL CPU device, where each head_dim is a slow build. Every head_dim
 * class of src/opencl/variants/mma.c's table: up to 64 (a warp per 16 rows,
 * 128-row work-groups, 32-row tiles), 65..128 (two warps per 16 rows, 64 rows,
 * 16-row tiles of fp32) and 129..256 (four warps per 16 rows, 32 rows, 8-row
 * tiles); each with tails past a work-group and a tile, a head_dim padded to
 * whole k-steps of every warp (7, 100, 200) and whole ones, GQA, MQA,
 * causal, windows, kv_seq != q_seq, batch, a custom scale and large logits.
 * The GPU runs mma through the full sweep. */
static const shape_case emulated[] = {
    {.batch = 2, .q_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1, .window = 20},
    {.q_seq = 9, .kv_seq = 37, .heads = 2, .kv_heads = 1, .head_dim = 7, .window = 5},
    {.q_seq = 33, .heads = 3, .head_dim = 64, .scale = 0.5f},
    {.q_seq = 66, .kv_seq = 100, .heads = 2, .kv_heads = 1, .head_dim = 7},
    {.q_seq = 130, .heads = 4, .kv_heads = 1, .head_dim = 64, .causal = 1, .q_gain = 8},
    {.q_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 100, .causal = 1},
    {.batch = 2, .q_seq = 20, .kv_seq = 33, .heads = 2, .kv_heads = 1, .head_dim = 128,
         .window = 9},
    {.q_seq = 37, .heads = 2, .head_dim = 200, .causal = 1, .window = 5},
    {.q_seq = 70, .kv_seq = 20, .heads = 4, .kv_heads = 1, .head_dim = 256, .q_gain = 4},
};
/* 16-bit tensors, in both formats, on every variant of the backend and on
 * the GPU's default context. Shapes: tails
 * past a work-group and a tile, GQA, MQA, causal, windows, kv_seq != q_seq,
 * batch, large logits, an odd head_dim and padded ones (each head_dim is a
 * build per variant and dtype on the OpenCL CPU device). */
static const shape_case dtype_cases[] = {
    {.batch = 2, .q_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1, .window = 20},
    {.q_seq = 9, .kv_seq = 37, .heads = 2, .kv_heads = 1, .head_dim = 7, .window = 5},
    {.q_seq = 70, .heads = 4, .kv_heads = 1, .head_dim = 100, .causal = 1, .q_gain = 8},
    {.q_seq = 37, .heads = 2, .head_dim = 200, .causal = 1, .window = 5},
};
/* The 16-bit dtypes the sweeps run, and whether dtype runs here: f16's
 * reference needs the compiler's _Float16 (a case left out says so). */
static const clattn_dtype dtypes_16[] = {CLATTN_DTYPE_BF16, CLATTN_DTYPE_F16};
int dtype_runs(clattn_dtype dtype)
{
    if (dtype == CLATTN_DTYPE_F16 && !HAVE_F16) {
        printf("f16 cases not run: this compiler has no _Float16\n");
        return 0;
    }
    return 1;
}

START_TEST(dtype_sweep)
{
    for (int d = 0; d < 2; ++d) {
        if (!dtype_runs(dtypes_16[d]))
            continue;
        clattn_shape s = to_shape(&dtype_cases[_i]);
        s.dtype = dtypes_16[d];
        const float gain = case_gain(&dtype_cases[_i]);
        const uint64_t seed = 3000u + (uint64_t)_i;
        clattn_context *ctx = NULL;
        if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU) {
            current_variant = "default";
            ctx = test_context(NULL);
            check_ops_16(ctx, &s, gain, seed);
            clattn_context_destroy(ctx);
        }
        for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
            check_ops_16(ctx, &s, gain, seed);
            clattn_context_destroy(ctx);
        }
    }
}
END_TEST

/* got[i] == want[i] bit for bit, for i < n (the 16-bit outputs what, of
 * inputs of). */
static void expect_bits(const char *what, const char *of, const clattn_shape *s,
                        const uint16_t *got, const uint16_t *want, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        ck_assert_msg(got[i] == want[i], "%s %s d%u: %s[%zu] = 0x%04x, %s's 0x%04x",
                      current_variant, s->dtype == CLATTN_DTYPE_F16 ? "f16" : "bf16",
                      (unsigned)s->head_dim, what, i, got[i], of, want[i]);
}

/* One visible key a row (causal, window 1): every weight is 1 (to within
 * float32's rounding), so a 16-bit forward's O is V and the backward's dV
 * is dO, bit for bit, on every path that widens and rounds 16-bit
 * elements, with subnormal halves, the smallest normal and the largest
 * among the values (bfloat16: magnitudes from 2^-125 to 2^61, so that no
 * float32 under- or overflows). ctx is the caller's. */
static void check_exact_16(clattn_context *ctx, clattn_dtype dtype, uint32_t head_dim)
{
    static const uint16_t f16[] = {0x0001, 0x0002, 0x03ff, 0x0400, 0x7bff,
                                   0xfbff, 0x8001, 0x3c00, 0x3555, 0xc0a0};
    static const uint16_t bf16[] = {0x0100, 0x0101, 0x5e00, 0xde00, 0x3f80,
                                    0x3eab, 0xc0a0, 0x4b7f, 0x8101, 0x3c23};
    const uint16_t *special = dtype == CLATTN_DTYPE_F16 ? f16 : bf16;
    shape_case c = {.q_seq = 37, .heads = 2, .head_dim = head_dim, .causal = 1, .window = 1};
    clattn_shape s = to_shape(&c);
    s.dtype = dtype;
    problem p;
    problem_make(&p, &s, 4000u + head_dim, 1.0f);
    uint16_t *q = halves(p.nq), *k = halves(p.nkv), *v = halves(p.nkv), *d_out = halves(p.nq);
    round_16(p.q, q, p.nq, dtype);
    round_16(p.k, k, p.nkv, dtype);
    round_16(p.v, v, p.nkv, dtype);
    round_16(p.d_out, d_out, p.nq, dtype);
    for (size_t i = 0; i < p.nkv; i += 3) { /* V and dO alike: same shape here */
        v[i] = special[i / 3 % 10];
        d_out[i] = special[(i / 3 + 5) % 10];
    }
    uint16_t *o = halves(p.nq), *gq = halves(p.nq), *gk = halves(p.nkv), *gv = halves(p.nkv);
    float *lse = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, o, lse), CLATTN_OK);
    expect_bits("O", "V", &s, o, v, p.nq);
    ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, lse, d_out, gq, gk, gv), CLATTN_OK);
    expect_bits("dV", "dO", &s, gv, d_out, p.nkv);
    uint16_t *frees[] = {q, k, v, d_out, o, gq, gk, gv};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    free(lse);
    problem_free(&p);
}

/* check_exact_16 at a head_dim of the mma kernels and one of tiled's, on
 * every variant. */
START_TEST(dtype_exact)
{
    for (int d = 0; d < 2; ++d) {
        if (!dtype_runs(dtypes_16[d]))
            continue;
        for (uint32_t head_dim = 64; head_dim; head_dim = head_dim == 64 ? 100 : 0) {
            clattn_context *ctx = NULL;
            if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU) {
                current_variant = "default";
                ctx = test_context(NULL);
                check_exact_16(ctx, dtypes_16[d], head_dim);
                clattn_context_destroy(ctx);
            }
            for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
                check_exact_16(ctx, dtypes_16[d], head_dim);
                clattn_context_destroy(ctx);
            }
        }
    }
}
END_TEST

/* 16-bit tensors in a caller's cl_mem, at odd element offsets: the forward
 * gives the host-pointer call's bits, and a buffer one bfloat16 short is
 * refused (sizes count 2-byte elements, the LSE pairs 4-byte ones). ctx is
 * the test's to destroy. */
static void check_dtype_buffers(clattn_context *ctx)
{
    shape_case c = {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 24, .causal = 1};
    clattn_shape s = to_shape(&c);
    s.dtype = CLATTN_DTYPE_BF16;
    problem p;
    problem_make(&p, &s, 77, 1.0f);
    uint16_t *q = halves(p.nq), *k = halves(p.nkv), *v = halves(p.nkv), *o = halves(p.nq);
    round_16(p.q, q, p.nq, s.dtype);
    round_16(p.k, k, p.nkv, s.dtype);
    round_16(p.v, v, p.nkv, s.dtype);
    float *lse = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, o, lse), CLATTN_OK);

    cl_context cctx = clattn_context_cl_context(ctx);
    cl_command_queue queue = clattn_context_cl_queue(ctx);
    const size_t off[4] = {1, 1 + p.nq + 3, 1 + p.nq + p.nkv + 5, 1 + p.nq + 2 * p.nkv + 7};
    const size_t halves_total = off[3] + p.nq;
    uint16_t *host = halves(halves_total);
    memcpy(host + off[0], q, p.nq * 2);
    memcpy(host + off[1], k, p.nkv * 2);
    memcpy(host + off[2], v, p.nkv * 2);
    cl_int err;
    cl_mem buf = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                halves_total * 2, host, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_mem lse_buf = clCreateBuffer(cctx, CL_MEM_READ_WRITE, (p.nlse + 1) * 4, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    clattn_cl_tensor tq = {buf, off[0]}, tk = {buf, off[1]}, tv = {buf, off[2]};
    clattn_cl_tensor to = {buf, off[3]}, tl = {lse_buf, 1};
    cl_event done = NULL;
    ck_assert_status(clattn_forward_cl(ctx, &s, tq, tk, tv, to, tl, 0, NULL, &done), CLATTN_OK);
    ck_assert_int_eq(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    uint16_t *back = halves(p.nq);
    ck_assert_int_eq(clEnqueueReadBuffer(queue, buf, CL_TRUE, off[3] * 2, p.nq * 2, back, 0,
                                         NULL, NULL),
                     CL_SUCCESS);
    ck_assert_int_eq(memcmp(back, o, p.nq * 2), 0);
    /* O one element past the buffer's end. */
    clattn_cl_tensor late = {buf, off[3] + 1};
    ck_assert_status(clattn_forward_cl(ctx, &s, tq, tk, tv, late, tl, 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "of 2 bytes"));
    clReleaseMemObject(buf);
    clReleaseMemObject(lse_buf);
    void *frees[] = {q, k, v, o, lse, host, back};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    problem_free(&p);
}

START_TEST(dtype_buffers)
{
    if (!strcmp(test_backend, "native"))
        return; /* no cl_mem there; the refusal is caller_buffers' */
    clattn_context *ctx = test_context(NULL);
    check_dtype_buffers(ctx);
    clattn_context_destroy(ctx);
}
END_TEST

/* A context on the mma variant, which the emulated suite is for: not a
 * silent pass where mma is refused. */
static clattn_context *emulated_mma_context(void)
{
    clattn_context *ctx = test_variant_context("mma");
    ck_assert_msg(ctx != NULL, "the mma variant is refused here; set CLATTN_MMA_EMULATE=1");
    return ctx;
}

/* mma's wgmma kernels (the 16-bit kernels at head_dim 64 and 128 that
 * src/opencl/variants/mma.c's uses_wgmma names): both dtypes, GQA, the
 * causal mask with a window, key tiles cut short by kv_seq. On a GPU, the variant that
 * CLATTN_TEST_VARIANT keeps, or the default (on an NVIDIA GPU of compute
 * capability 9, mma on wgmma unless CLATTN_MMA_WGMMA=0);
 * in the emulated suite, where CLATTN_MMA_WGMMA=1 asks, mma.sync products
 * reading the same swizzled tiles. The other sweeps reach them only at
 * head_dim 64, in bfloat16. */
static const shape_case wgmma_cases[] = {
    {.q_seq = 150, .heads = 4, .kv_heads = 2, .head_dim = 128, .causal = 1, .window = 48},
    {.batch = 2, .q_seq = 70, .kv_seq = 130, .heads = 2, .kv_heads = 1, .head_dim = 64},
};
START_TEST(wgmma_sweep)
{
    for (int d = 0; d < 2; ++d) {
        if (!dtype_runs(dtypes_16[d]))
            continue;
        clattn_shape s = to_shape(&wgmma_cases[_i]);
        s.dtype = dtypes_16[d];
        const int gpu = test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU;
        const char *kept = getenv("CLATTN_TEST_VARIANT");
        clattn_context *ctx = gpu ? test_context(kept) : emulated_mma_context();
        current_variant = gpu ? (kept ? kept : "default") : "mma";
        check_ops_16(ctx, &s, case_gain(&wgmma_cases[_i]), 5000u + (uint64_t)_i);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* Every modifier in bf16 at head_dim 64, where mma's 16-bit kernels run on
 * wgmma on compute capability 9: dropout with the warps' keys starting on
 * a Philox block and off one (kv_offset 3), the two ways lanes share its
 * draws (the second with sinks). On a GPU every variant; in the emulated
 * suite mma. */
static const modifier_case modifiers_64[] = {
    {{.q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1}, 3.0f, 1,
         0.2f, 0, 0, 0},
    {{.q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2, .head_dim = 64,
         .causal = CLATTN_CAUSAL_BOTTOM_RIGHT}, 3.0f, 1, 0.2f, 9, 3, 1},
};
START_TEST(modifiers_16)
{
    clattn_shape s = modifier_shape(&modifiers_64[_i], 7000u + (uint64_t)_i);
    s.dtype = CLATTN_DTYPE_BF16;
    const float q_gain = case_gain(&modifiers_64[_i].c);
    if (test_backend_kind() != CLATTN_BACKEND_OPENCL_GPU) {
        clattn_context *ctx = emulated_mma_context();
        current_variant = "mma";
        check_ops_16(ctx, &s, q_gain, 7000u + (uint64_t)_i);
        clattn_context_destroy(ctx);
        return;
    }
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops_16(ctx, &s, q_gain, 7000u + (uint64_t)_i);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* n floats of x as a tensor of dtype in out: copied (float32), else
 * rounded to 16 bits (x then holds the rounded values). */
static void to_dtype(float *x, void *out, size_t n, clattn_dtype dtype)
{
    if (dtype == CLATTN_DTYPE_F32)
        memcpy(out, x, n * sizeof(float));
    else
        round_16(x, (uint16_t *)out, n, dtype);
}

/* mma's key side split into parts (CLATTN_MMA_KEY_PARTS): float32 (dS scratch) and
 * bf16 (wgmma on compute capability 9), GQA, causal, keys off a block's
 * end; 3 parts of two steps each and 16, most of them empty. The backward
 * names sum_parts__mma among its kernels, and gives the same dK and dV
 * again, and twice them under accumulate, bit for bit. */
START_TEST(key_parts)
{
    static const char *const counts[2] = {"3", "16"};
    const int gpu = test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU;
    const shape_case c = {.q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2, .head_dim = 64,
                          .causal = 1};
    setenv("CLATTN_MMA_KEY_PARTS", counts[_i], 1);
    clattn_context *ctx = gpu ? test_variant_context("mma") : emulated_mma_context();
    unsetenv("CLATTN_MMA_KEY_PARTS");
    if (!ctx)
        return; /* a GPU without mma: test_variant_context checked the refusal */
    current_variant = "mma";
    clattn_shape s = to_shape(&c);
    s.dtype = _i ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
    if (s.dtype == CLATTN_DTYPE_F32)
        check_ops(ctx, &s, 1.0f, 9100u);
    else
        check_ops_16(ctx, &s, 1.0f, 9101u);
    problem p;
    problem_make(&p, &s, 9102u, 1.0f);
    const size_t elem = s.dtype == CLATTN_DTYPE_F32 ? 4 : 2, nkv = p.nkv * elem;
    unsigned char *q = malloc(p.nq * elem), *k = malloc(nkv), *v = malloc(nkv);
    unsigned char *o = malloc(p.nq * elem), *d_out = malloc(p.nq * elem), *gq = malloc(p.nq * elem);
    unsigned char *gk[2] = {malloc(nkv), malloc(nkv)}, *gv[2] = {malloc(nkv), malloc(nkv)};
    float *from[5] = {p.q, p.k, p.v, p.o, p.d_out};
    unsigned char *to[5] = {q, k, v, o, d_out};
    const size_t count[5] = {p.nq, p.nkv, p.nkv, p.nq, p.nq};
    for (int i = 0; i < 5; ++i)
        to_dtype(from[i], to[i], count[i], s.dtype);
    for (int r = 0; r < 2; ++r) {
        ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, p.lse, d_out, gq, gk[r], gv[r]),
                         CLATTN_OK);
        ck_assert_msg(strstr(clattn_context_kernels(ctx), "sum_parts__mma") != NULL,
                      "CLATTN_MMA_KEY_PARTS=%s, but the backward ran %s", counts[_i],
                      clattn_context_kernels(ctx));
    }
    ck_assert_msg(!memcmp(gk[0], gk[1], nkv) && !memcmp(gv[0], gv[1], nkv),
                  "dK or dV moved between two runs of the same backward");
    if (elem == 4) { /* x + x is exact: twice the sum of the parts */
        s.accumulate = 1;
        ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, p.lse, d_out, gq, gk[1], gv[1]),
                         CLATTN_OK);
        const float *k0 = (const float *)gk[0], *k1 = (const float *)gk[1];
        const float *v0 = (const float *)gv[0], *v1 = (const float *)gv[1];
        for (size_t i = 0; i < p.nkv; ++i)
            ck_assert_msg(k1[i] == 2.0f * k0[i] && v1[i] == 2.0f * v0[i],
                          "accumulated dK or dV at %zu: %g, %g against twice %g, %g", i,
                          (double)k1[i], (double)v1[i], (double)k0[i], (double)v0[i]);
    }
    unsigned char *frees[] = {q, k, v, o, d_out, gq, gk[0], gk[1], gv[0], gv[1]};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    problem_free(&p);
    clattn_context_destroy(ctx);
}
END_TEST

/* mma's launch order moves no result: the forward's O and LSE and the
 * backward's dQ, dK and dV (from each order's own forward) under
 * CLATTN_MMA_ORDER=heads (a block's heads side by side, as the default
 * order under a causal mask) are those under blocks (a head's blocks side
 * by side) bit for bit, float32 and bf16, GQA, causal, a batch of two,
 * blocks off the sequences' ends. */
START_TEST(launch_order)
{
    const int gpu = test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU;
    const shape_case c = {.batch = 2, .q_seq = 150, .kv_seq = 170, .heads = 4, .kv_heads = 2,
                          .head_dim = 64, .causal = 1};
    clattn_shape s = to_shape(&c);
    s.dtype = _i ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
    problem p;
    problem_make(&p, &s, 9200u + (uint64_t)_i, 1.0f);
    const size_t elem = s.dtype == CLATTN_DTYPE_F32 ? 4 : 2, nq = p.nq * elem, nkv = p.nkv * elem;
    const size_t nlse = p.nlse * sizeof(float);
    unsigned char *in[4] = {malloc(nq), malloc(nkv), malloc(nkv), malloc(nq)};
    float *from[4] = {p.q, p.k, p.v, p.d_out};
    const size_t count[4] = {p.nq, p.nkv, p.nkv, p.nq};
    for (int i = 0; i < 4; ++i)
        to_dtype(from[i], in[i], count[i], s.dtype);
    /* per order: O, LSE, dQ, dK, dV */
    const size_t bytes[5] = {nq, nlse, nq, nkv, nkv};
    unsigned char *out[2][5];
    for (int order = 0; order < 2; ++order) {
        for (int i = 0; i < 5; ++i)
            out[order][i] = malloc(bytes[i]);
        setenv("CLATTN_MMA_ORDER", order ? "heads" : "blocks", 1);
        clattn_context *ctx = gpu ? test_variant_context("mma") : emulated_mma_context();
        unsetenv("CLATTN_MMA_ORDER");
        if (!ctx) { /* a GPU without mma: test_variant_context checked the refusal */
            for (int o = 0; o <= order; ++o)
                for (int i = 0; i < 5; ++i)
                    free(out[o][i]);
            goto done;
        }
        ck_assert_status(clattn_forward(ctx, &s, in[0], in[1], in[2], out[order][0],
                                        (float *)out[order][1]),
                         CLATTN_OK);
        ck_assert_status(clattn_backward(ctx, &s, in[0], in[1], in[2], out[order][0],
                                         (const float *)out[order][1], in[3], out[order][2],
                                         out[order][3], out[order][4]),
                         CLATTN_OK);
        clattn_context_destroy(ctx);
    }
    static const char *const names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    for (int i = 0; i < 5; ++i) {
        ck_assert_msg(!memcmp(out[0][i], out[1][i], bytes[i]),
                      "%s differs between CLATTN_MMA_ORDER=blocks and heads (%s)", names[i],
                      _i ? "bf16" : "float32");
        free(out[0][i]);
        free(out[1][i]);
    }
done:
    for (int i = 0; i < 4; ++i)
        free(in[i]);
    problem_free(&p);
}
END_TEST

static int wgmma_asked(void)
{
    const char *w = getenv("CLATTN_MMA_WGMMA");
    return w && !strcmp(w, "1");
}

/* The same on mma's 16-bit kernels, emulated: tensors that start off a
 * 16-byte boundary take their element-wise loads, not the 16-byte ones. */
START_TEST(emulated_16_buffers)
{
    clattn_context *ctx = emulated_mma_context();
    check_dtype_buffers(ctx);
    clattn_context_destroy(ctx);
}
END_TEST

/* check_exact_16 on mma's 16-bit kernels, emulated, at head_dim 64: bfloat16
 * (the programs emulated_16 builds), and float16 where CLATTN_MMA_WGMMA=1
 * (those wgmma_sweep builds). */
START_TEST(emulated_16_exact)
{
    clattn_context *ctx = emulated_mma_context();
    current_variant = "mma";
    check_exact_16(ctx, CLATTN_DTYPE_BF16, 64);
    if (wgmma_asked() && HAVE_F16)
        check_exact_16(ctx, CLATTN_DTYPE_F16, 64);
    clattn_context_destroy(ctx);
}
END_TEST

START_TEST(emulated_sweep)
{
    clattn_context *ctx = emulated_mma_context();
    clattn_context_destroy(ctx);
    run_cases(emulated, _i);
}
END_TEST

/* mma's 16-bit kernels (m16n8k16, P and dS fed back as 16-bit operands),
 * emulated, on the 16-bit sweep's shapes: bfloat16 and float16 by turns
 * (each head_dim and dtype is a slow build), so that both formats and
 * every head_dim class run. */
START_TEST(emulated_16)
{
    clattn_shape s = to_shape(&dtype_cases[_i]);
    s.dtype = _i % 2 && HAVE_F16 ? CLATTN_DTYPE_F16 : CLATTN_DTYPE_BF16;
    clattn_context *ctx = emulated_mma_context();
    current_variant = "mma";
    check_ops_16(ctx, &s, case_gain(&dtype_cases[_i]), 3000u + (uint64_t)_i);
    /* head_dims off a multiple of 8 run tiled's kernels
     * (src/opencl/variants/mma.c's serving) */
    const char *ran = clattn_context_kernels(ctx);
    const int on_mma = strstr(ran, "__mma") != NULL, on_tiled = strstr(ran, "__tiled") != NULL;
    ck_assert_msg(s.head_dim % 8 ? on_tiled && !on_mma : on_mma && !on_tiled,
                  "16-bit head_dim %u under mma ran %s", (unsigned)s.head_dim, ran);
    clattn_context_destroy(ctx);
}
END_TEST

/* The tiled kernels in shapes CLATTN_TILED and CLATTN_TILED_BACKWARD give
 * them (from ctest), at
 * every head_dim of the reduced set, on the OpenCL CPU device: the rows
 * layout as a GPU runs it past head_dim 64, with work-items that share a
 * row by columns (whose partial scores meet in local memory) and by tile
 * rows, 16 columns each, so every head_dim above 16 splits, padded ones
 * (100, 200) included; or micro-tiles of an odd height. */
START_TEST(split_sweep)
{
    const char *tiles = getenv("CLATTN_TILED"), *only = getenv("CLATTN_TEST_VARIANT");
    ck_assert_msg(tiles && strchr(tiles, ',') && only && !strcmp(only, "tiled"),
                  "set CLATTN_TILED=R,T,S,COLUMNS,PER_ITEM and CLATTN_TEST_VARIANT=tiled");
    run_cases(emulated, _i);
}
END_TEST

dtype_tests get_dtype_tests(void)
{
    dtype_tests t = {{dtype_sweep, N(dtype_cases)},
                     {wgmma_sweep, N(wgmma_cases)},
                     {modifiers_16, N(modifiers_64)},
                     {emulated_16, N(dtype_cases)},
                     {emulated_sweep, N(emulated)},
                     {split_sweep, N(emulated)},
                     {key_parts, 2},
                     {launch_order, 2},
                     {simulated_sweep, N(simulated)},
                     dtype_exact,
                     dtype_buffers,
                     emulated_16_buffers,
                     emulated_16_exact,
                     wgmma_asked()};
    return t;
}
