/* The numeric suite (`kernels`): the same cases and every op on every
 * backend and variant, against float64. */
#define CL_TARGET_OPENCL_VERSION 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "harness.h"
#include "numerics.h"
#include "reference.h"

clattn_shape to_shape(const shape_case *c)
{
    clattn_shape s = clattn_shape_default();
    s.batch = c->batch;
    s.q_seq = c->q_seq;
    s.kv_seq = c->kv_seq;
    s.num_heads = c->heads;
    s.num_kv_heads = c->kv_heads;
    s.head_dim = c->head_dim;
    s.causal = c->causal;
    s.window = c->window;
    s.scale = c->scale;
    return s;
}

/* The variant under test, for messages. */
const char *current_variant = "default";

void expect_close(const char *what, const clattn_shape *s, float q_gain,
                  const float *got, const double *ref, const double *mag, size_t n)
{
    size_t at;
    double worst = worst_error(got, ref, mag, n, &at);
    if (getenv("CLATTN_TEST_VERBOSE"))
        printf("%s b%u q%u kv%u h%u/%u d%u causal %d window %u gain %g: worst %.3g of "
               "tolerance\n",
               what, s->batch, s->q_seq, s->kv_seq, s->num_heads, s->num_kv_heads, s->head_dim,
               s->causal, s->window, (double)q_gain, worst);
    ck_assert_msg(worst <= 1.0,
                  "%s on %s/%s: b%u q%u kv%u heads %u/%u d%u causal %d window %u gain %g: "
                  "element %zu is %.9g, reference %.9g (mag %.3g); %.3g times the tolerance",
                  what, test_backend, current_variant, s->batch, s->q_seq, s->kv_seq, s->num_heads,
                  s->num_kv_heads, s->head_dim, s->causal, s->window, (double)q_gain, at,
                  (double)got[at], ref[at], mag[at], worst);
}

static double *doubles(size_t n)
{
    double *a = malloc((n ? n : 1) * sizeof(double));
    ck_assert_ptr_nonnull(a);
    return a;
}

/* The LSE pairs: empty rows exactly as meganeura's forward, others close. */
static void expect_lse(const clattn_shape *s, const float *got, const double *ref, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        if (ref[i] == -1e30) {
            ck_assert_msg(got[i] == -1e30f, "LSE %zu of an empty row is %g", i, (double)got[i]);
            continue;
        }
        ck_assert_msg(fabs(got[i] - ref[i]) <= TOL_REL * (1.0 + fabs(ref[i])),
                      "LSE on %s: h%u/%u d%u causal %d window %u: element %zu is %.9g, "
                      "reference %.9g",
                      test_backend, s->num_heads, s->num_kv_heads, s->head_dim, s->causal,
                      s->window, i, (double)got[i], ref[i]);
    }
}

/* Runs every op on ctx for the shape and compares each with the float64
 * reference: forward, grad-V, backward, grad-Q and grad-K alone, and the
 * backward from this backend's own forward. */
void check_ops(clattn_context *ctx, const clattn_shape *s, float q_gain, uint64_t seed)
{
    problem p;
    problem_make(&p, s, seed, q_gain);
    double *o_ref = doubles(p.nq), *o_mag = doubles(p.nq), *lse_ref = doubles(p.nlse);
    double *dq = doubles(p.nq), *dq_mag = doubles(p.nq), *dk = doubles(p.nkv);
    double *dk_mag = doubles(p.nkv), *dv = doubles(p.nkv), *dv_mag = doubles(p.nkv);
    float *o = nan_array(p.nq), *lse = nan_array(p.nlse), *gq = nan_array(p.nq);
    float *gk = nan_array(p.nkv), *gv = nan_array(p.nkv);

    ck_assert_status(clattn_forward(ctx, s, p.q, p.k, p.v, o, lse), CLATTN_OK);
    ref_forward(&p, o_ref, o_mag, lse_ref);
    expect_close("forward O", s, q_gain, o, o_ref, o_mag, p.nq);
    expect_lse(s, lse, lse_ref, p.nlse);

    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    ck_assert_status(clattn_grad_v(ctx, s, p.d_out, p.q, p.k, p.lse, gv), CLATTN_OK);
    expect_close("grad-V", s, q_gain, gv, dv, dv_mag, p.nkv);

    float *fill[3] = {gq, gk, gv};
    size_t nfill[3] = {p.nq, p.nkv, p.nkv};
    for (int i = 0; i < 3; ++i)
        for (size_t j = 0; j < nfill[i]; ++j)
            fill[i][j] = NAN;
    ck_assert_status(clattn_backward(ctx, s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq, gk, gv),
                     CLATTN_OK);
    expect_close("backward dQ", s, q_gain, gq, dq, dq_mag, p.nq);
    expect_close("backward dK", s, q_gain, gk, dk, dk_mag, p.nkv);
    expect_close("backward dV", s, q_gain, gv, dv, dv_mag, p.nkv);

    for (size_t j = 0; j < p.nq; ++j)
        gq[j] = NAN;
    for (size_t j = 0; j < p.nkv; ++j)
        gk[j] = NAN;
    ck_assert_status(clattn_grad_q(ctx, s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq), CLATTN_OK);
    expect_close("grad-Q", s, q_gain, gq, dq, dq_mag, p.nq);
    ck_assert_status(clattn_grad_k(ctx, s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gk), CLATTN_OK);
    expect_close("grad-K", s, q_gain, gk, dk, dk_mag, p.nkv);

    /* The chain: this backend's forward feeds its backward. */
    memcpy(p.o, o, p.nq * sizeof(float));
    memcpy(p.lse, lse, p.nlse * sizeof(float));
    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    ck_assert_status(clattn_backward(ctx, s, p.q, p.k, p.v, o, lse, p.d_out, gq, gk, gv),
                     CLATTN_OK);
    expect_close("chain dQ", s, q_gain, gq, dq, dq_mag, p.nq);
    expect_close("chain dK", s, q_gain, gk, dk, dk_mag, p.nkv);
    expect_close("chain dV", s, q_gain, gv, dv, dv_mag, p.nkv);

    double *frees[] = {o_ref, o_mag, lse_ref, dq, dq_mag, dk, dk_mag, dv, dv_mag};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    float *ffrees[] = {o, lse, gq, gk, gv};
    for (size_t i = 0; i < sizeof ffrees / sizeof *ffrees; ++i)
        free(ffrees[i]);
    problem_free(&p);
}

static uint16_t *halves(size_t n)
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

static void expect_close_16(const char *what, const clattn_shape *s, const uint16_t *got,
                            const double *ref, const double *mag, size_t n)
{
    expect_sum_16(what, s, got, ref, mag, n, 1);
}

/* Every op with 16-bit tensors on ctx, against float64 from the rounded
 * inputs; the LSE pairs stay float32. */
static void check_ops_16(clattn_context *ctx, const clattn_shape *s, float q_gain, uint64_t seed)
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

/* Whether a comma-separated list names a variant. */
static int listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

/* A context for the next variant of the backend under test from *v on
 * (CLATTN_TEST_VARIANT keeps those it lists), with current_variant set;
 * NULL past the last. Variants this device does not run are passed over
 * (test_variant_context checked their refusal). */
static clattn_context *next_variant(size_t *v)
{
    const char *name, *only = getenv("CLATTN_TEST_VARIANT");
    for (; (name = clattn_variant_name(test_backend_kind(), *v)) != NULL; ++*v) {
        if (only && !listed(only, name))
            continue;
        clattn_context *ctx = test_variant_context(name);
        if (ctx) {
            ++*v;
            current_variant = name;
            return ctx;
        }
    }
    return NULL;
}

/* A shape on every variant of the backend, one context each. */
static void run_shape(const clattn_shape *s, float q_gain, uint64_t seed)
{
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, s, q_gain, seed);
        clattn_context_destroy(ctx);
    }
}

/* Case i on every variant of the backend. */
static void run_cases(const shape_case *cases, int i)
{
    clattn_shape s = to_shape(&cases[i]);
    run_shape(&s, cases[i].q_gain, 1000u + (uint64_t)i);
}

/* Packed variable-length sequences: lengths per sequence (query, key),
 * with GQA, both causal alignments, a window, offsets, empty and one-token
 * sequences, lengths off every tile size, and rows past the last prefix
 * sum on both sides. */
typedef struct packed_case {
    uint32_t heads, kv_heads, head_dim;
    int causal;
    uint32_t window, q_offset, kv_offset, count;
    uint32_t q[6], kv[6];
} packed_case;

static const packed_case packed[] = {
    {2, 1, 16, CLATTN_CAUSAL_TOP_LEFT, 0, 0, 0, 5, {5, 0, 1, 17, 33}, {5, 3, 1, 12, 33}},
    {2, 2, 32, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 4, {7, 20, 1, 3}, {12, 9, 0, 3}},
    {4, 2, 64, 0, 6, 3, 1, 2, {65, 31}, {40, 70}},
    {3, 3, 40, CLATTN_CAUSAL_BOTTOM_RIGHT, 9, 2, 0, 3, {1, 50, 0}, {66, 17, 0}},
};

static int dtype_runs(clattn_dtype dtype);

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
 * dropout, Q times q_gain. */
static void packed_ops_with(clattn_context *ctx, const packed_case *c, uint64_t seed,
                            float q_gain, const float *slopes, float dropout_p)
{
    uint32_t cu[14];
    clattn_shape s = packed_shape(c, cu);
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
        if (!one.q_seq || !one.kv_seq || (dropout_p > 0.0f && i > 0)) /* alone, b is 0 */
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
            if (!one.q_seq || !one.kv_seq || (dropout_p > 0.0f && i > 0))
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
    packed_ops_with(ctx, c, seed, 1.0f, NULL, 0.0f);
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
    {{1, 20, 50, 4, 2, 16, 1, 0, 0, 1}, 30, 0},  {{1, 33, 40, 4, 2, 64, 1, 9, 0, 1}, 70, 50},
    {{2, 17, 23, 3, 1, 7, 1, 0, 0, 1}, 5, 12},   {{1, 40, 30, 2, 2, 100, 0, 6, 0, 1}, 100, 90},
    {{1, 65, 37, 4, 1, 32, 1, 20, 0, 4}, 37, 0}, {{1, 9, 70, 2, 1, 24, 0, 5, 0, 1}, 0, 3},
};
START_TEST(offset_sweep)
{
    clattn_shape s = to_shape(&offsets[_i].c);
    s.q_offset = offsets[_i].q_offset;
    s.kv_offset = offsets[_i].kv_offset;
    run_shape(&s, offsets[_i].c.q_gain, 1500u + (uint64_t)_i);
}

/* A sequence split into chunks equals the whole: queries cut at one point
 * and keys at two, the causal and window masks crossing the cuts (the
 * chunk pair at the start has equal lengths, as causal with both offsets 0
 * needs). Each query chunk's forwards over the key chunks, with their
 * offsets, merge (clattn_merge, in place) into the whole's O and LSE; the
 * backward of every (query chunk, key chunk) pair, given the whole's O and
 * LSE, accumulates into dQ, dK and dV. On every variant, in float32. */
static const shape_case splits[] = {
    {1, 45, 45, 4, 2, 32, 1, 13, 0, 1}, {1, 45, 45, 3, 3, 20, 1, 0, 0, 1},
    {1, 45, 45, 2, 1, 64, 0, 9, 0, 1},  {1, 45, 45, 4, 2, 8, 0, 0, 0, 4},
};
static void split_check(const clattn_shape *shape, uint64_t seed, float q_gain);
START_TEST(split_sweep_offsets)
{
    const clattn_shape whole = to_shape(&splits[_i]);
    split_check(&whole, 4000u + (uint64_t)_i, splits[_i].q_gain);
}
END_TEST

/* The score modifiers (see modifier_sweep) over the same chunks: ALiBi's
 * |P - T| and dropout's draws take global positions, so the chunks' sum is
 * the whole. */
static const float slopes8[8] = {0.5f,     0.25f,     0.125f,     0.0625f,
                                 0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
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

/* The score modifiers against the float64 reference on every variant and
 * op, in float32 and bf16: softcap (scores pushed past the cap by large
 * logits), ALiBi, dropout, and all three at once, with GQA, both causal
 * alignments, a window, offsets and batch. */
typedef struct modifier_case {
    shape_case c;
    float softcap;
    int alibi;
    float dropout_p;
    uint32_t q_offset, kv_offset;
} modifier_case;
static const modifier_case modifiers[] = {
    {{1, 37, 37, 4, 2, 32, 1, 0, 0, 4}, 5.0f, 0, 0.0f, 0, 0},
    {{1, 33, 50, 8, 4, 64, 0, 9, 0, 1}, 0.0f, 1, 0.0f, 40, 31},
    {{2, 29, 29, 4, 1, 16, 1, 0, 0, 1}, 0.0f, 0, 0.3f, 0, 0},
    {{1, 20, 45, 8, 2, 32, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 3}, 4.0f, 1, 0.2f, 7, 5},
    /* a cap far above the scores: as no cap, where tanh's 1 - e form loses
     * all but a few ulps of 1 (an error in O of 1.35 at 1e8) */
    {{1, 33, 33, 4, 2, 32, 1, 0, 0, 1}, 1e8f, 0, 0.0f, 0, 0},
};
/* The case with all three, also in bf16; and dropout alone at kv_offset
 * 0, where mma's keys start on a Philox block (at ALL_MODIFIERS' 5 each
 * row draws one block more), in bf16 too on mma. */
enum { ALL_MODIFIERS = 3, DROPOUT_ALIGNED = 2 };

static clattn_shape modifier_shape(const modifier_case *m, uint64_t seed)
{
    clattn_shape s = to_shape(&m->c);
    s.softcap = m->softcap;
    s.alibi_slopes = m->alibi ? slopes8 : NULL;
    s.dropout_p = m->dropout_p;
    s.dropout_seed = seed * 0x9E3779B97F4A7C15ull;
    s.dropout_offset = seed;
    s.q_offset = m->q_offset;
    s.kv_offset = m->kv_offset;
    return s;
}

START_TEST(modifier_sweep)
{
    const clattn_shape s = modifier_shape(&modifiers[_i], 5000u + (uint64_t)_i);
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, &s, modifiers[_i].c.q_gain, 5000u + (uint64_t)_i);
        const int bf16 = _i == ALL_MODIFIERS ||
                         (_i == DROPOUT_ALIGNED && !strcmp(current_variant, "mma"));
        if (bf16 && dtype_runs(CLATTN_DTYPE_BF16)) {
            clattn_shape h = s;
            h.dtype = CLATTN_DTYPE_BF16;
            check_ops_16(ctx, &h, modifiers[_i].c.q_gain, 5000u + (uint64_t)_i);
        }
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* The case with all three modifiers on tiled alone, in float32. */
START_TEST(modifier_tiled)
{
    const clattn_shape s = modifier_shape(&modifiers[ALL_MODIFIERS], 5000u + ALL_MODIFIERS);
    clattn_context *ctx = test_variant_context("tiled");
    ck_assert_ptr_nonnull(ctx);
    current_variant = "tiled";
    check_ops(ctx, &s, modifiers[ALL_MODIFIERS].c.q_gain, 5000u + ALL_MODIFIERS);
    clattn_context_destroy(ctx);
}
END_TEST

/* Packed sequences with every modifier: dropout's b is the sequence. */
START_TEST(packed_modifiers)
{
    packed_case c = packed[1];
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        packed_ops_with(ctx, &c, 2100u, 3.0f, slopes8, 0.3f);
        clattn_context_destroy(ctx);
    }
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
        /* within 5 standard deviations of the binomial's mean */
        const double q = 1.0 - cases[c].p, sd = sqrt(q * (1.0 - q) / (double)all);
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
    const shape_case sc = {1, 30, 30, 2, 1, 16, 1, 0, 0, 1};
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

/* Every head_dim the issue names, alternating the masks. */
static const shape_case head_dims[] = {
    {1, 33, 33, 4, 2, 1, 1, 0, 0, 1},    {1, 33, 33, 4, 2, 7, 0, 0, 0, 1},
    {1, 33, 33, 4, 2, 16, 1, 5, 0, 1},   {1, 33, 40, 4, 2, 32, 0, 6, 0, 1},
    {1, 65, 65, 4, 2, 64, 1, 0, 0, 1},   {1, 33, 33, 4, 2, 80, 0, 0, 0, 1},
    {1, 33, 33, 4, 2, 96, 1, 0, 0, 1},   {1, 33, 20, 4, 2, 128, 0, 0, 0, 1},
    {1, 33, 33, 4, 2, 256, 1, 4, 0, 1},
};
START_TEST(head_dim_sweep) { run_cases(head_dims, _i); }
END_TEST

static const shape_case q_seqs[] = {
    {1, 1, 1, 4, 1, 32, 1, 0, 0, 1},     {1, 2, 2, 4, 1, 32, 0, 0, 0, 1},
    {1, 7, 7, 4, 1, 32, 1, 0, 0, 1},     {1, 64, 64, 4, 1, 32, 0, 0, 0, 1},
    {1, 65, 65, 4, 1, 32, 1, 0, 0, 1},   {1, 200, 200, 4, 1, 32, 0, 0, 0, 1},
    {1, 200, 200, 2, 1, 32, 1, 0, 0, 1},
};
START_TEST(q_seq_sweep) { run_cases(q_seqs, _i); }
END_TEST

/* kv_seq != q_seq, with and without a window (never causal). */
static const shape_case kv_seqs[] = {
    {1, 7, 65, 2, 1, 16, 0, 0, 0, 1},    {1, 65, 7, 2, 1, 16, 0, 0, 0, 1},
    {1, 200, 64, 2, 2, 16, 0, 5, 0, 1},  {1, 1, 200, 2, 1, 16, 0, 0, 0, 1},
    {1, 20, 50, 2, 1, 16, 0, 3, 0, 1},
};
START_TEST(kv_seq_sweep) { run_cases(kv_seqs, _i); }
END_TEST

/* Causal at offsets 0 with kv_seq != q_seq: top-left (1) and bottom-right
 * (2, CLATTN_CAUSAL_BOTTOM_RIGHT), longer keys and longer queries (rows that
 * see no key), GQA, a window. */
static const shape_case alignments[] = {
    {1, 37, 12, 4, 2, 16, 1, 0, 0, 1},  {1, 12, 37, 4, 2, 16, 1, 0, 0, 1},
    {1, 37, 12, 4, 2, 16, 2, 0, 0, 1},  {2, 12, 37, 4, 1, 16, 2, 0, 0, 1},
    {1, 40, 70, 2, 2, 16, 2, 9, 0, 1},
};
START_TEST(causal_alignment) { run_cases(alignments, _i); }
END_TEST

/* The same at head_dim 64, for the emulated mma suite (its programs). */
static const shape_case alignments_64[] = {
    {1, 70, 20, 4, 2, 64, 2, 0, 0, 1},
    {1, 20, 70, 2, 1, 64, 1, 9, 0, 1},
};
START_TEST(causal_alignment_64) { run_cases(alignments_64, _i); }
END_TEST

static const shape_case groups[] = {
    {1, 33, 33, 2, 2, 16, 1, 0, 0, 1},   {1, 33, 33, 4, 2, 16, 1, 0, 0, 1},
    {1, 33, 33, 8, 2, 16, 0, 0, 0, 1},   {1, 33, 33, 16, 2, 16, 1, 0, 0, 1},
    {1, 33, 33, 8, 1, 16, 1, 0, 0, 1}, /* multi-query */
};
START_TEST(group_sweep) { run_cases(groups, _i); }
END_TEST

static const shape_case windows[] = {
    {1, 40, 40, 2, 1, 16, 0, 0, 0, 1},   {1, 40, 40, 2, 1, 16, 1, 0, 0, 1},
    {1, 40, 40, 2, 1, 16, 0, 1, 0, 1},   {1, 40, 40, 2, 1, 16, 1, 1, 0, 1},
    {1, 40, 40, 2, 1, 16, 0, 3, 0, 1},   {1, 40, 40, 2, 1, 16, 1, 3, 0, 1},
    {1, 40, 40, 2, 1, 16, 0, 40, 0, 1},  {1, 40, 40, 2, 1, 16, 1, 1000, 0, 1},
    {1, 40, 40, 2, 1, 16, 1, 4294967295u, 0, 1},
};
START_TEST(window_sweep) { run_cases(windows, _i); }
END_TEST

static const shape_case batches[] = {
    {1, 37, 37, 4, 2, 24, 1, 9, 0, 1},
    {3, 37, 37, 4, 2, 24, 1, 9, 0, 1},
    {3, 20, 45, 6, 3, 40, 0, 0, 0, 1},
};
START_TEST(batch_sweep) { run_cases(batches, _i); }
END_TEST

/* Sizes on both sides of the tiled kernels' rows (64) and tiles (32). */
static const shape_case tiles[] = {
    {1, 31, 31, 2, 1, 32, 1, 0, 0, 1},   {1, 32, 32, 2, 1, 32, 0, 0, 0, 1},
    {1, 33, 33, 2, 1, 32, 1, 0, 0, 1},   {1, 63, 63, 2, 2, 16, 1, 0, 0, 1},
    {1, 64, 64, 2, 2, 16, 0, 0, 0, 1},   {1, 65, 65, 2, 2, 16, 1, 0, 0, 1},
    {1, 129, 129, 2, 1, 8, 1, 50, 0, 1}, {1, 70, 129, 2, 1, 8, 0, 33, 0, 1},
    {1, 129, 70, 2, 1, 128, 0, 0, 0, 1}, {1, 40, 40, 2, 1, 129, 1, 0, 0, 1},
};
START_TEST(tile_edges) { run_cases(tiles, _i); }
END_TEST

/* Scores far from zero: exp() must not overflow, and p must stay exact. */
static const shape_case large[] = {
    {1, 64, 64, 2, 1, 64, 1, 0, 0, 30},
    {1, 33, 33, 2, 2, 7, 0, 0, 0, 60},
    {2, 30, 30, 4, 1, 128, 1, 0, 0, 20},
};
START_TEST(large_logits) { run_cases(large, _i); }
END_TEST

static const shape_case scales[] = {
    {1, 30, 30, 2, 1, 16, 1, 0, 0.3f, 1},
    {1, 30, 30, 2, 1, 16, 0, 0, 2.0f, 1},
};
START_TEST(caller_scale) { run_cases(scales, _i); }
END_TEST

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
    const shape_case c = {1, 12, 12, 2, 1, 8, 1, 0, 0, 1};
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

/* One context, shapes growing and shrinking, and a rejected call between:
 * the scratch buffers and the context survive. */
START_TEST(one_context_many_calls)
{
    clattn_context *ctx = test_context(NULL);
    static const shape_case seq[] = {
        {1, 50, 50, 4, 2, 64, 1, 0, 0, 1},
        {1, 5, 9, 2, 1, 8, 0, 0, 0, 1},
        {2, 70, 70, 4, 4, 32, 1, 0, 0, 1},
        {1, 5, 9, 2, 1, 8, 0, 0, 0, 1},
    };
    for (int i = 0; i < 4; ++i) {
        clattn_shape s = to_shape(&seq[i]);
        check_ops(ctx, &s, 1.0f, 500u + (uint64_t)i);
        clattn_shape bad = s;
        bad.num_kv_heads = 3;
        float x = 0.0f;
        ck_assert_status(clattn_grad_v(ctx, &bad, &x, &x, &x, &x, &x),
                         CLATTN_ERROR_HEADS_NOT_DIVISIBLE);
    }
    clattn_context_destroy(ctx);
}
END_TEST

/* tiled's backward takes dQ from a dS scratch of at most CLATTN_DS_MAX_MB
 * MiB, by chunks of batch elements or KV heads where the whole is past it;
 * where one KV head's dS is past it, or the bound is 0, grad-Q computes the
 * scores again. Each way is exact against the reference, and the kernels
 * that ran say which way it took. A malformed bound is refused. One
 * head_dim, whose programs the other tests build too: under ASan a cold
 * PoCL build takes minutes. */
START_TEST(ds_scratch_parts)
{
    static const struct {
        const char *bound;
        shape_case c;
        const char *grad_q;
    } cases[] = {
        /* 2 * 160 * 160 floats a KV head: 5 in 1 MiB, batch elements by 2 */
        {"1", {3, 160, 160, 4, 2, 64, 1, 0, 0, 1}, "grad_qs__tiled"},
        /* 200 * 200 floats a head: 6 heads of 8 in 1 MiB, then 2; a window */
        {"1", {1, 200, 200, 8, 8, 64, 0, 50, 0, 1}, "grad_qs__tiled"},
        /* 2 * 520 * 520 floats: one KV head is past 1 MiB */
        {"1", {1, 520, 520, 2, 1, 64, 1, 0, 0, 1}, "grad_q__tiled"},
        {"0", {1, 70, 90, 2, 1, 64, 1, 0, 0, 1}, "grad_q__tiled"},
        {NULL, {2, 70, 90, 4, 2, 64, 1, 0, 0, 1}, "grad_qs__tiled"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        if (cases[i].bound)
            setenv("CLATTN_DS_MAX_MB", cases[i].bound, 1);
        else
            unsetenv("CLATTN_DS_MAX_MB");
        clattn_context *ctx = test_variant_context("tiled");
        const clattn_shape s = to_shape(&cases[i].c);
        check_ops(ctx, &s, 1.0f, 900u + (uint64_t)i);
        /* check_ops's last call is a backward */
        ck_assert_msg(strstr(clattn_context_kernels(ctx), cases[i].grad_q) != NULL,
                      "case %zu (bound %s) ran %s, want %s", i,
                      cases[i].bound ? cases[i].bound : "unset", clattn_context_kernels(ctx),
                      cases[i].grad_q);
        clattn_context_destroy(ctx);
    }
    static const char *const bad[] = {"", "-1", "1.5", "12x", "99999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        setenv("CLATTN_DS_MAX_MB", bad[i], 1);
        clattn_options o = clattn_options_default();
        o.device = test_selector();
        o.variant = "tiled";
        clattn_context *ctx = NULL;
        ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
        ck_assert_ptr_null(ctx);
        ck_assert_msg(strstr(clattn_last_error(), "CLATTN_DS_MAX_MB=") != NULL, "message: %s",
                      clattn_last_error());
    }
    unsetenv("CLATTN_DS_MAX_MB");
}
END_TEST

/* The default variant is the first listed that the device runs, and each
 * says its name. */
START_TEST(named_variant)
{
    const char *name, *first = NULL;
    for (size_t v = 0; (name = clattn_variant_name(test_backend_kind(), v)) != NULL; ++v) {
        clattn_context *ctx = test_variant_context(name);
        if (!ctx)
            continue;
        ck_assert_str_eq(clattn_context_variant(ctx), name);
        /* What ran is reported, and is the variant's own: its dQ kernel
         * bears the variant's name (native's, "native": grad_q, or
         * grad_kvq where the key-side pass sums dQ too), or, where dQ comes
         * from a dS scratch (tiled's product, for mma's float32 too), the
         * key side that writes dS does. */
        ck_assert_str_eq(clattn_context_kernels(ctx), "");
        const shape_case c = {1, 20, 20, 2, 1, 64, 0, 0, 0, 1};
        clattn_shape s = to_shape(&c);
        problem p;
        problem_make(&p, &s, 7, 1.0f);
        float *gq = nan_array(p.nq), *gk = nan_array(p.nkv), *gv = nan_array(p.nkv);
        ck_assert_status(
            clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, gq, gk, gv), CLATTN_OK);
        char want[64], from_ds[64];
        snprintf(want, sizeof want, "grad_q__%s",
                 test_backend_kind() == CLATTN_BACKEND_NATIVE ? "native" : name);
        snprintf(from_ds, sizeof from_ds, "grad_kvs__%s", name);
        const int fused = test_backend_kind() == CLATTN_BACKEND_NATIVE &&
                          strstr(clattn_context_kernels(ctx), "grad_kvq__native") != NULL;
        ck_assert_msg(fused || strstr(clattn_context_kernels(ctx), want) != NULL ||
                          strstr(clattn_context_kernels(ctx), from_ds) != NULL,
                      "variant %s ran %s, want %s among them", name,
                      clattn_context_kernels(ctx), want);
        free(gq);
        free(gk);
        free(gv);
        problem_free(&p);
        clattn_context_destroy(ctx);
        if (!first)
            first = name;
    }
    ck_assert_ptr_nonnull(first);
    clattn_context *ctx = test_context(NULL);
    ck_assert_str_eq(clattn_context_variant(ctx), first);
    clattn_context_destroy(ctx);
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A reduced set for Oclgrind, whose simulation is slow: still tails past
 * a work-group and a tile, GQA, causal, windows, kv_seq != q_seq, batch,
 * and every op of every variant. head_dims are powers of two: for others
 * LLVM divides by a constant with a `freeze` instruction, which Oclgrind
 * 21.10's uninitialised-value check cannot simulate (it aborts the kernel;
 * tests/oclgrind.sh fails on that). Odd head_dims run everywhere else. */
static const shape_case simulated[] = {
    {2, 70, 70, 4, 2, 8, 1, 20, 0, 1},
    {1, 9, 37, 2, 1, 4, 0, 5, 0, 1},
    {1, 33, 33, 3, 3, 16, 0, 0, 0.5f, 1},
    {1, 66, 100, 2, 1, 2, 0, 0, 0, 1},
};
START_TEST(simulated_sweep) { run_cases(simulated, _i); }
END_TEST

/* A reduced set for the mma kernels with their instructions emulated on
 * the OpenCL CPU device, where each head_dim is a slow build. Every head_dim
 * class of src/opencl/tuning.c's mma table: up to 64 (a warp per 16 rows,
 * 128-row work-groups, 32-row tiles), 65..128 (two warps per 16 rows, 64 rows,
 * 16-row tiles of fp32) and 129..256 (four warps per 16 rows, 32 rows, 8-row
 * tiles); each with tails past a work-group and a tile, a head_dim padded to
 * whole k-steps of every warp (7, 100, 200) and whole ones, GQA, MQA,
 * causal, windows, kv_seq != q_seq, batch, a custom scale and large logits.
 * The GPU runs mma through the full sweep. */
static const shape_case emulated[] = {
    {2, 70, 70, 4, 2, 64, 1, 20, 0, 1},   {1, 9, 37, 2, 1, 7, 0, 5, 0, 1},
    {1, 33, 33, 3, 3, 64, 0, 0, 0.5f, 1}, {1, 66, 100, 2, 1, 7, 0, 0, 0, 1},
    {1, 130, 130, 4, 1, 64, 1, 0, 0, 8},  {1, 70, 70, 4, 2, 100, 1, 0, 0, 1},
    {2, 20, 33, 2, 1, 128, 0, 9, 0, 1},   {1, 37, 37, 2, 2, 200, 1, 5, 0, 1},
    {1, 70, 20, 4, 1, 256, 0, 0, 0, 4},
};
/* 16-bit tensors, in both formats, on every variant of the backend and on
 * the GPU's default context. Shapes: tails
 * past a work-group and a tile, GQA, MQA, causal, windows, kv_seq != q_seq,
 * batch, large logits, an odd head_dim and padded ones (each head_dim is a
 * build per variant and dtype on the OpenCL CPU device). */
static const shape_case dtype_cases[] = {
    {2, 70, 70, 4, 2, 64, 1, 20, 0, 1},  {1, 9, 37, 2, 1, 7, 0, 5, 0, 1},
    {1, 70, 70, 4, 1, 100, 1, 0, 0, 8},  {1, 37, 37, 2, 2, 200, 1, 5, 0, 1},
};
/* The 16-bit dtypes the sweeps run, and whether dtype runs here: f16's
 * reference needs the compiler's _Float16 (a case left out says so). */
static const clattn_dtype dtypes_16[] = {CLATTN_DTYPE_BF16, CLATTN_DTYPE_F16};
static int dtype_runs(clattn_dtype dtype)
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
        const float gain = dtype_cases[_i].q_gain;
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
    shape_case c = {1, 37, 37, 2, 2, head_dim, 1, 1, 0, 1};
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
    shape_case c = {1, 33, 33, 4, 2, 24, 1, 0, 0, 1};
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
 * src/opencl/tuning.c's clattn_ocl_mma_wgmma names): both dtypes, GQA, the
 * causal mask with a window, key tiles cut short by kv_seq. On a GPU, the variant that
 * CLATTN_TEST_VARIANT keeps, or the default (on an NVIDIA GPU of compute
 * capability 9, mma on wgmma unless CLATTN_MMA_WGMMA=0);
 * in the emulated suite, where CLATTN_MMA_WGMMA=1 asks, mma.sync products
 * reading the same swizzled tiles. The other sweeps reach them only at
 * head_dim 64, in bfloat16. */
static const shape_case wgmma_cases[] = {
    {1, 150, 150, 4, 2, 128, 1, 48, 0, 1},
    {2, 70, 130, 2, 1, 64, 0, 0, 0, 1},
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
        check_ops_16(ctx, &s, wgmma_cases[_i].q_gain, 5000u + (uint64_t)_i);
        clattn_context_destroy(ctx);
    }
}
END_TEST

/* Every modifier in bf16 at head_dim 64, where mma's 16-bit kernels run on
 * wgmma on compute capability 9: dropout with the warps' keys starting on
 * a Philox block and off one (kv_offset 3), the two ways lanes share its
 * draws. On a GPU every variant; in the emulated suite mma. */
static const modifier_case modifiers_64[] = {
    {{1, 70, 90, 4, 2, 64, 1, 0, 0, 1}, 3.0f, 1, 0.2f, 0, 0},
    {{1, 70, 90, 4, 2, 64, CLATTN_CAUSAL_BOTTOM_RIGHT, 0, 0, 1}, 3.0f, 1, 0.2f, 9, 3},
};
START_TEST(modifiers_16)
{
    clattn_shape s = modifier_shape(&modifiers_64[_i], 7000u + (uint64_t)_i);
    s.dtype = CLATTN_DTYPE_BF16;
    const float q_gain = modifiers_64[_i].c.q_gain;
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
    check_ops_16(ctx, &s, dtype_cases[_i].q_gain, 3000u + (uint64_t)_i);
    /* head_dims off a multiple of 8 run tiled's kernels
     * (src/opencl/build.c's clattn_ocl_kernels_for) */
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

/* A suite of one reduced sweep, on a slow device: a generous timeout. */
static Suite *reduced_suite(const char *name, const char *tcase, const TTest *sweep, int cases)
{
    Suite *s = suite_create(name);
    TCase *tc = tcase_create(tcase);
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, sweep, 0, cases);
    suite_add_tcase(s, tc);
    return s;
}

Suite *emulated_suite(void)
{
    Suite *s = reduced_suite("emulated", "mma", emulated_sweep, N(emulated));
    TCase *tc = tcase_create("mma-16");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, emulated_16, 0, N(dtype_cases));
    tcase_add_test(tc, emulated_16_buffers);
    if (wgmma_asked())
        tcase_add_loop_test(tc, wgmma_sweep, 0, N(wgmma_cases));
    tcase_add_test(tc, emulated_16_exact);
    tcase_add_loop_test(tc, modifiers_16, 0, N(modifiers_64));
    suite_add_tcase(s, tc);
    /* Global positions and accumulated gradients, at head_dim 64: one
     * offsets case and one split sequence. */
    tc = tcase_create("mma-offsets");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, offset_sweep, 1, 2);
    tcase_add_loop_test(tc, split_sweep_offsets, 2, 3);
    tcase_add_test(tc, non_finite_inputs); /* float32 at head_dim 8 */
    tcase_add_loop_test(tc, causal_alignment_64, 0, N(alignments_64));
    /* the score modifiers, all three, float32 and bf16; dropout where
     * lanes share its blocks */
    tcase_add_loop_test(tc, modifier_sweep, ALL_MODIFIERS, ALL_MODIFIERS + 1);
    tcase_add_loop_test(tc, modifier_sweep, DROPOUT_ALIGNED, DROPOUT_ALIGNED + 1);
    suite_add_tcase(s, tc);
    return s;
}

Suite *split_suite(void)
{
    return reduced_suite("split", "tiled", split_sweep, N(emulated));
}

/* The reduced set up to head_dim 128 on every variant of the backend, for
 * a second OpenCL implementation (rusticl, whose llvmpipe takes minutes to
 * compile blocked.cl past 128): tiled's row in one work-item and split by
 * columns, tree's lanes of several elements, tails, GQA, MQA, masks, batch. */
static const shape_case portable[] = {
    {2, 70, 70, 4, 2, 64, 1, 20, 0, 1},   {1, 9, 37, 2, 1, 7, 0, 5, 0, 1},
    {1, 33, 33, 3, 3, 64, 0, 0, 0.5f, 1}, {1, 90, 90, 4, 2, 64, 1, 0, 0, 8},
    {1, 40, 70, 4, 2, 100, 1, 0, 0, 1},  {2, 20, 33, 2, 1, 128, 0, 9, 0, 1},
};
START_TEST(portable_sweep) { run_cases(portable, _i); }
END_TEST

/* On Mesa's llvmpipe, which ends a work-item after 65535 loop iterations
 * and keeps what it wrote, a call that could reach that count is refused
 * with outputs untouched (every variant, forward and backward); on other
 * devices the same call runs. */
START_TEST(loop_cap)
{
    const shape_case c = {1, 4, 600, 2, 1, 64, 0, 0, 0, 1};
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

Suite *portable_suite(void)
{
    Suite *s = reduced_suite("portable", "variants", portable_sweep, N(portable));
    TCase *tc = tcase_create("loop_cap");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, loop_cap);
    /* packed sequences on a second OpenCL implementation: the d64 case */
    tcase_add_loop_test(tc, packed_sweep, 2, 3);
    /* the score modifiers, all three, on tiled (llvmpipe compiles blocked's
     * and tree's modified programs for minutes): dropout's mask as on every
     * device */
    tcase_add_test(tc, modifier_tiled);
    suite_add_tcase(s, tc);
    return s;
}

Suite *oclgrind_suite(void)
{
    return reduced_suite("oclgrind", "simulated", simulated_sweep, N(simulated));
}

/* Registers runs [start, end) of a loop test one by one, or under
 * CLATTN_TEST_SHARD those of this shard's turns; a test of one run goes
 * into every shard. */
static void add_shard(TCase *tc, const TTest *t, int start, int end)
{
    static unsigned turn;
    for (int i = start; i < end; ++i)
        if (end - start == 1 || turn++ % test_shards == test_shard)
            _tcase_add_test(tc, t, 0, 0, i, i + 1);
}

Suite *kernels_suite(void)
{
    Suite *s = suite_create(test_backend);
    TCase *tc = tcase_create("grad_v");
    /* Generous: a cold PoCL compile alone can take seconds. */
    tcase_set_timeout(tc, 600);
    add_shard(tc, head_dim_sweep, 0, N(head_dims));
    add_shard(tc, q_seq_sweep, 0, N(q_seqs));
    add_shard(tc, kv_seq_sweep, 0, N(kv_seqs));
    add_shard(tc, causal_alignment, 0, N(alignments));
    add_shard(tc, group_sweep, 0, N(groups));
    add_shard(tc, window_sweep, 0, N(windows));
    add_shard(tc, batch_sweep, 0, N(batches));
    add_shard(tc, tile_edges, 0, N(tiles));
    add_shard(tc, large_logits, 0, N(large));
    add_shard(tc, caller_scale, 0, N(scales));
    add_shard(tc, non_finite_inputs, 0, 1);
    add_shard(tc, seed_uniform_block, 0, N(seed_blocks));
    add_shard(tc, offset_sweep, 0, N(offsets));
    add_shard(tc, split_sweep_offsets, 0, N(splits));
    add_shard(tc, packed_sweep, 0, N(packed));
    add_shard(tc, one_context_many_calls, 0, 1);
    add_shard(tc, named_variant, 0, 1);
    if (test_backend_kind() != CLATTN_BACKEND_NATIVE)
        add_shard(tc, ds_scratch_parts, 0, 1);
    if (test_shard == 0)
        add_training_tests(tc);
    suite_add_tcase(s, tc);
    /* The score modifiers apart (CK_RUN_CASE=modifiers). */
    tc = tcase_create("modifiers");
    tcase_set_tags(tc, "modifiers"); /* kernels.fit-16 leaves them out: they fit nothing new */
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, modifier_sweep, 0, N(modifiers));
    tcase_add_loop_test(tc, split_modifiers, 0, 1);
    tcase_add_test(tc, packed_modifiers);
    tcase_add_test(tc, dropout_mask);
    if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU)
        tcase_add_loop_test(tc, modifiers_16, 0, N(modifiers_64));
    suite_add_tcase(s, tc);
    /* The 16-bit tensors apart (CK_RUN_CASE=grad_v-16): what
     * CLATTN_MMA_WGMMA changes, to be run alone under it. */
    tc = tcase_create("grad_v-16");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, dtype_sweep, 0, N(dtype_cases));
    tcase_add_test(tc, dtype_exact);
    tcase_add_test(tc, dtype_buffers);
    if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU)
        tcase_add_loop_test(tc, wgmma_sweep, 0, N(wgmma_cases));
    suite_add_tcase(s, tc);
    return s;
}
