/* The numeric suite (`kernels`): the same cases and every op on every
 * backend and variant, against float64. This file holds the shared checks,
 * the shape sweeps, and builds every suite of kernel tests from its own and
 * from check_edges.c's, check_dtypes.c's, check_packed.c's and
 * check_modifiers.c's (kernel_tests.h). */
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

clattn_shape to_shape(const shape_case *c)
{
    clattn_shape s = clattn_shape_default();
    s.batch = c->batch ? c->batch : 1;
    s.q_seq = c->q_seq;
    s.kv_seq = c->kv_seq ? c->kv_seq : c->q_seq;
    s.num_heads = c->heads;
    s.num_kv_heads = c->kv_heads ? c->kv_heads : c->heads;
    s.head_dim = c->head_dim;
    s.causal = c->causal;
    s.window = c->window;
    s.window_right = c->window_right;
    s.scale = c->scale;
    return s;
}

float case_gain(const shape_case *c) { return c->q_gain != 0.0f ? c->q_gain : 1.0f; }

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

double *doubles(size_t n)
{
    double *a = malloc((n ? n : 1) * sizeof(double));
    ck_assert_ptr_nonnull(a);
    return a;
}

/* The LSE pairs: empty rows exactly as meganeura's forward, others close. */
void expect_lse(const clattn_shape *s, const float *got, const double *ref, size_t n)
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
    check_ops_against(ctx, s, s, q_gain, seed);
}

void check_ops_against(clattn_context *ctx, const clattn_shape *s, const clattn_shape *ref,
                       float q_gain, uint64_t seed)
{
    problem p;
    problem_make(&p, ref, seed, q_gain);
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

    if (s->sinks) { /* their gradient, from the reference's O and LSE */
        double *ds = doubles(s->num_heads), *ds_mag = doubles(s->num_heads);
        float *got = nan_array(s->num_heads);
        ref_grad_sinks(&p, ds, ds_mag);
        ck_assert_status(clattn_grad_sinks(ctx, s, p.o, p.lse, p.d_out, got), CLATTN_OK);
        expect_close("d sinks", s, q_gain, got, ds, ds_mag, s->num_heads);
        free(ds);
        free(ds_mag);
        free(got);
    }

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
clattn_context *next_variant(size_t *v)
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
void run_shape(const clattn_shape *s, float q_gain, uint64_t seed)
{
    clattn_context *ctx;
    for (size_t v = 0; (ctx = next_variant(&v)) != NULL;) {
        check_ops(ctx, s, q_gain, seed);
        clattn_context_destroy(ctx);
    }
}

/* Case i on every variant of the backend. */
void run_cases(const shape_case *cases, int i)
{
    clattn_shape s = to_shape(&cases[i]);
    run_shape(&s, case_gain(&cases[i]), 1000u + (uint64_t)i);
}

const float slopes8[8] = {0.5f,     0.25f,     0.125f,     0.0625f,
                          0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
const float sinks8[8] = {4.0f, -1.0f, 0.5f, -INFINITY, 0.0f, 2.5f, -3.0f, 1.0f};


/* Every head_dim the issue names, alternating the masks (two-sided windows
 * at d16 and d256). */
static const shape_case head_dims[] = {
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 1, .causal = 1},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 7},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 1, .window = 5,
     .window_right = 3},
    {.q_seq = 33, .kv_seq = 40, .heads = 4, .kv_heads = 2, .head_dim = 32, .window = 6},
    {.q_seq = 65, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 80},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 96, .causal = 1},
    {.q_seq = 33, .kv_seq = 20, .heads = 4, .kv_heads = 2, .head_dim = 128},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 256, .causal = 1, .window = 4,
     .window_right = 2},
};
START_TEST(head_dim_sweep) { run_cases(head_dims, _i); }
END_TEST

/* Right windows at 65 (7 keys past each query) and 200 (30, across
 * tiles). */
static const shape_case q_seqs[] = {
    {.q_seq = 1, .heads = 4, .kv_heads = 1, .head_dim = 32, .causal = 1},
    {.q_seq = 2, .heads = 4, .kv_heads = 1, .head_dim = 32},
    {.q_seq = 7, .heads = 4, .kv_heads = 1, .head_dim = 32, .causal = 1},
    {.q_seq = 64, .heads = 4, .kv_heads = 1, .head_dim = 32},
    {.q_seq = 65, .heads = 4, .kv_heads = 1, .head_dim = 32, .causal = 1, .window_right = 7},
    {.q_seq = 200, .heads = 4, .kv_heads = 1, .head_dim = 32},
    {.q_seq = 200, .heads = 2, .kv_heads = 1, .head_dim = 32, .causal = 1, .window_right = 30},
};
START_TEST(q_seq_sweep) { run_cases(q_seqs, _i); }
END_TEST

/* kv_seq != q_seq, with and without a window (never causal). */
static const shape_case kv_seqs[] = {
    {.q_seq = 7, .kv_seq = 65, .heads = 2, .kv_heads = 1, .head_dim = 16},
    {.q_seq = 65, .kv_seq = 7, .heads = 2, .kv_heads = 1, .head_dim = 16},
    {.q_seq = 200, .kv_seq = 64, .heads = 2, .head_dim = 16, .window = 5},
    {.q_seq = 1, .kv_seq = 200, .heads = 2, .kv_heads = 1, .head_dim = 16},
    {.q_seq = 20, .kv_seq = 50, .heads = 2, .kv_heads = 1, .head_dim = 16, .window = 3},
};
START_TEST(kv_seq_sweep) { run_cases(kv_seqs, _i); }
END_TEST

/* Causal at offsets 0 with kv_seq != q_seq: top-left (1) and bottom-right
 * (2, CLATTN_CAUSAL_BOTTOM_RIGHT), longer keys and longer queries (rows that
 * see no key), GQA, a two-sided window. */
static const shape_case alignments[] = {
    {.q_seq = 37, .kv_seq = 12, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 12, .kv_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 37, .kv_seq = 12, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 2},
    {.batch = 2, .q_seq = 12, .kv_seq = 37, .heads = 4, .kv_heads = 1, .head_dim = 16, .causal = 2},
    {.q_seq = 40, .kv_seq = 70, .heads = 2, .head_dim = 16, .causal = 2, .window = 9,
     .window_right = 4},
};
START_TEST(causal_alignment) { run_cases(alignments, _i); }
END_TEST

/* The same at head_dim 64, for the emulated mma suite (its programs). */
static const shape_case alignments_64[] = {
    {.q_seq = 70, .kv_seq = 20, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 2},
    {.q_seq = 20, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = 1,
         .window = 9, .window_right = 5},
};
START_TEST(causal_alignment_64) { run_cases(alignments_64, _i); }
END_TEST

static const shape_case groups[] = {
    {.q_seq = 33, .heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 33, .heads = 4, .kv_heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 33, .heads = 8, .kv_heads = 2, .head_dim = 16},
    {.q_seq = 33, .heads = 16, .kv_heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 33, .heads = 8, .kv_heads = 1, .head_dim = 16, .causal = 1}, /* multi-query */
};
START_TEST(group_sweep) { run_cases(groups, _i); }
END_TEST

static const shape_case windows[] = {
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .window = 1},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1, .window = 1},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .window = 3},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1, .window = 3},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .window = 40},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1, .window = 1000},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1,
     .window = 4294967295u},
};
START_TEST(window_sweep) { run_cases(windows, _i); }
END_TEST

static const shape_case batches[] = {
    {.q_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 24, .causal = 1, .window = 9},
    {.batch = 3, .q_seq = 37, .heads = 4, .kv_heads = 2, .head_dim = 24, .causal = 1, .window = 9},
    {.batch = 3, .q_seq = 20, .kv_seq = 45, .heads = 6, .kv_heads = 3, .head_dim = 40},
};
START_TEST(batch_sweep) { run_cases(batches, _i); }
END_TEST

/* Sizes on both sides of the tiled kernels' rows (64) and tiles (32). */
static const shape_case tiles[] = {
    {.q_seq = 31, .heads = 2, .kv_heads = 1, .head_dim = 32, .causal = 1},
    {.q_seq = 32, .heads = 2, .kv_heads = 1, .head_dim = 32},
    {.q_seq = 33, .heads = 2, .kv_heads = 1, .head_dim = 32, .causal = 1},
    {.q_seq = 63, .heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 64, .heads = 2, .head_dim = 16},
    {.q_seq = 65, .heads = 2, .head_dim = 16, .causal = 1},
    {.q_seq = 129, .heads = 2, .kv_heads = 1, .head_dim = 8, .causal = 1, .window = 50},
    {.q_seq = 70, .kv_seq = 129, .heads = 2, .kv_heads = 1, .head_dim = 8, .window = 33},
    {.q_seq = 129, .kv_seq = 70, .heads = 2, .kv_heads = 1, .head_dim = 128},
    {.q_seq = 40, .heads = 2, .kv_heads = 1, .head_dim = 129, .causal = 1},
};
START_TEST(tile_edges) { run_cases(tiles, _i); }
END_TEST

/* Scores far from zero: exp() must not overflow, and p must stay exact. */
static const shape_case large[] = {
    {.q_seq = 64, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = 1, .q_gain = 30},
    {.q_seq = 33, .heads = 2, .head_dim = 7, .q_gain = 60},
    {.batch = 2, .q_seq = 30, .heads = 4, .kv_heads = 1, .head_dim = 128, .causal = 1,
         .q_gain = 20},
};
START_TEST(large_logits) { run_cases(large, _i); }
END_TEST

static const shape_case scales[] = {
    {.q_seq = 30, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1, .scale = 0.3f},
    {.q_seq = 30, .heads = 2, .kv_heads = 1, .head_dim = 16, .scale = 2.0f},
};
START_TEST(caller_scale) { run_cases(scales, _i); }
END_TEST

/* One context, shapes growing and shrinking, and a rejected call between:
 * the scratch buffers and the context survive. */
START_TEST(one_context_many_calls)
{
    clattn_context *ctx = test_context(NULL);
    static const shape_case seq[] = {
        {.q_seq = 50, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1},
        {.q_seq = 5, .kv_seq = 9, .heads = 2, .kv_heads = 1, .head_dim = 8},
        {.batch = 2, .q_seq = 70, .heads = 4, .head_dim = 32, .causal = 1},
        {.q_seq = 5, .kv_seq = 9, .heads = 2, .kv_heads = 1, .head_dim = 8},
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
        {"1", {.batch = 3, .q_seq = 160, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1},
             "grad_qs__tiled"},
        /* 200 * 200 floats a head: 6 heads of 8 in 1 MiB, then 2; a window */
        {"1", {.q_seq = 200, .heads = 8, .head_dim = 64, .window = 50}, "grad_qs__tiled"},
        /* 2 * 520 * 520 floats: one KV head is past 1 MiB */
        {"1", {.q_seq = 520, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = 1},
             "grad_q__tiled"},
        {"0", {.q_seq = 70, .kv_seq = 90, .heads = 2, .kv_heads = 1, .head_dim = 64, .causal = 1},
             "grad_q__tiled"},
        {NULL, {.batch = 2, .q_seq = 70, .kv_seq = 90, .heads = 4, .kv_heads = 2, .head_dim = 64,
             .causal = 1}, "grad_qs__tiled"},
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
        const shape_case c = {.q_seq = 20, .heads = 2, .kv_heads = 1, .head_dim = 64};
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

/* Adds the runs of a loop test. */
static void add_loop(TCase *tc, loop_test t) { tcase_add_loop_test(tc, t.test, 0, t.count); }

Suite *emulated_suite(void)
{
    const edge_tests e = get_edge_tests();
    const dtype_tests d = get_dtype_tests();
    const packed_tests pk = get_packed_tests();
    const modifier_tests m = get_modifier_tests();
    Suite *s = reduced_suite("emulated", "mma", d.emulated.test, d.emulated.count);
    TCase *tc = tcase_create("mma-16");
    tcase_set_timeout(tc, 900);
    add_loop(tc, d.emulated_16);
    tcase_add_test(tc, d.emulated_16_buffers);
    if (d.wgmma_asked)
        add_loop(tc, d.wgmma);
    tcase_add_test(tc, d.emulated_16_exact);
    add_loop(tc, d.modifiers_16);
    suite_add_tcase(s, tc);
    /* Global positions and accumulated gradients, at head_dim 64: one
     * offsets case and one split sequence. */
    tc = tcase_create("mma-offsets");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, pk.offsets.test, 1, 2);
    tcase_add_loop_test(tc, pk.splits.test, 2, 3);
    tcase_add_test(tc, e.non_finite); /* float32 at head_dim 8 */
    tcase_add_loop_test(tc, causal_alignment_64, 0, N(alignments_64));
    /* the score modifiers, all three, float32 and bf16, and with sinks;
     * dropout where lanes share its blocks */
    tcase_add_loop_test(tc, m.sweep.test, ALL_MODIFIERS, ALL_MODIFIERS + 1);
    tcase_add_loop_test(tc, m.sweep.test, SINKS_ALL, SINKS_ALL + 1);
    tcase_add_loop_test(tc, m.sweep.test, DROPOUT_ALIGNED, DROPOUT_ALIGNED + 1);
    add_loop(tc, d.key_parts);
    add_loop(tc, d.launch_order);
    suite_add_tcase(s, tc);
    /* the caller's functions and tensors, float32 and bf16, blocks skipped */
    tc = tcase_create("mma-functions");
    tcase_set_tags(tc, "programmable");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, get_programmable_tests().mma);
    suite_add_tcase(s, tc);
    return s;
}

Suite *split_suite(void)
{
    const dtype_tests d = get_dtype_tests();
    return reduced_suite("split", "tiled", d.split.test, d.split.count);
}

/* The reduced set up to head_dim 128 on every variant of the backend, for
 * a second OpenCL implementation (rusticl, whose llvmpipe takes minutes to
 * compile cl/blocked/ past 128): tiled's row in one work-item and split by
 * columns, tree's lanes of several elements, tails, GQA, MQA, masks, batch. */
static const shape_case portable[] = {
    {.batch = 2, .q_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1, .window = 20},
    {.q_seq = 9, .kv_seq = 37, .heads = 2, .kv_heads = 1, .head_dim = 7, .window = 5},
    {.q_seq = 33, .heads = 3, .head_dim = 64, .scale = 0.5f},
    {.q_seq = 90, .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = 1, .q_gain = 8},
    {.q_seq = 40, .kv_seq = 70, .heads = 4, .kv_heads = 2, .head_dim = 100, .causal = 1},
    {.batch = 2, .q_seq = 20, .kv_seq = 33, .heads = 2, .kv_heads = 1, .head_dim = 128,
         .window = 9},
};
START_TEST(portable_sweep) { run_cases(portable, _i); }
END_TEST

Suite *portable_suite(void)
{
    const edge_tests e = get_edge_tests();
    const packed_tests pk = get_packed_tests();
    const modifier_tests m = get_modifier_tests();
    Suite *s = reduced_suite("portable", "variants", portable_sweep, N(portable));
    TCase *tc = tcase_create("loop_cap");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, e.loop_cap);
    /* packed sequences on a second OpenCL implementation: the d64 case */
    tcase_add_loop_test(tc, pk.packed.test, 2, 3);
    /* the score modifiers, all three and with sinks, on tiled (llvmpipe
     * compiles blocked's and tree's modified programs for minutes):
     * dropout's mask as on every device; the caller's functions too */
    tcase_add_test(tc, m.tiled);
    tcase_add_test(tc, get_programmable_tests().tiled);
    suite_add_tcase(s, tc);
    return s;
}

Suite *oclgrind_suite(void)
{
    const dtype_tests d = get_dtype_tests();
    return reduced_suite("oclgrind", "simulated", d.simulated.test, d.simulated.count);
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
    const edge_tests e = get_edge_tests();
    const dtype_tests d = get_dtype_tests();
    const packed_tests pk = get_packed_tests();
    const modifier_tests m = get_modifier_tests();
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
    add_shard(tc, e.non_finite, 0, 1);
    add_shard(tc, e.seed_blocks.test, 0, e.seed_blocks.count);
    add_shard(tc, pk.offsets.test, 0, pk.offsets.count);
    add_shard(tc, pk.splits.test, 0, pk.splits.count);
    add_shard(tc, pk.packed.test, 0, pk.packed.count);
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
    add_loop(tc, m.sweep);
    add_loop(tc, pk.split_modifiers);
    tcase_add_test(tc, pk.modifiers);
    tcase_add_test(tc, m.dropout_mask);
    if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU)
        add_loop(tc, d.modifiers_16);
    suite_add_tcase(s, tc);
    /* The caller's functions apart (CK_RUN_CASE=programmable). */
    const programmable_tests pg = get_programmable_tests();
    tc = tcase_create("programmable");
    tcase_set_tags(tc, "modifiers programmable");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, pg.builtins);
    tcase_add_test(tc, pg.bias_table);
    add_loop(tc, pg.masks);
    tcase_add_test(tc, pg.finite_differences);
    tcase_add_test(tc, pg.bad_functions);
    tcase_add_test(tc, pg.packed);
    const bias_tests bt = get_bias_tests();
    add_loop(tc, bt.tensors);
    tcase_add_test(tc, bt.gradient);
    tcase_add_test(tc, bt.sixteen);
    suite_add_tcase(s, tc);
    /* The 16-bit tensors apart (CK_RUN_CASE=grad_v-16): what
     * CLATTN_MMA_WGMMA changes, to be run alone under it. */
    tc = tcase_create("grad_v-16");
    tcase_set_timeout(tc, 600);
    add_loop(tc, d.sweep);
    tcase_add_test(tc, d.exact);
    tcase_add_test(tc, d.buffers);
    if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU)
        add_loop(tc, d.wgmma);
    suite_add_tcase(s, tc);
    /* mma's key side in parts, forced, and its launch order
     * (CK_RUN_CASE=key-parts) */
    if (test_backend_kind() == CLATTN_BACKEND_OPENCL_GPU) {
        tc = tcase_create("key-parts");
        tcase_set_timeout(tc, 600);
        add_loop(tc, d.key_parts);
        add_loop(tc, d.launch_order);
        suite_add_tcase(s, tc);
    }
    return s;
}

