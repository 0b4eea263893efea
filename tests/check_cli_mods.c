/* The score modifiers, the caller's functions and bias tensors through
 * the file commands (check_cli.c's suite): what the library gives, and bad
 * input that leaves nothing. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_harness.h"
#include "harness.h"
#include "npy.h"
#include "reference.h"

/* The score modifiers through the file commands: --softcap, --alibi,
 * --dropout with --seed and --dropout-offset, and --sinks give what the
 * library gives, the backward and --d-sinks too; bad values are bad input
 * that leaves nothing; train --dropout's evaluation loss falls. */
START_TEST(modifier_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, bad_slopes[4] = {0.5f, 0, 0, NAN};
    const float sinks[4] = {1.5f, -INFINITY, 0.0f, -2.0f};
    const size_t four = 4, three = 3;
    save("slopes.npy", &four, 1, slopes);
    save("sinks.npy", &four, 1, sinks);
    save("nan.npy", &four, 1, bad_slopes);
    save("three.npy", &three, 1, slopes);
    char qp[512], kp[512], vp[512], sp[512], sk[512];
    snprintf(qp, sizeof qp, "%s", path("q.npy"));
    snprintf(kp, sizeof kp, "%s", path("k.npy"));
    snprintf(vp, sizeof vp, "%s", path("v.npy"));
    snprintf(sp, sizeof sp, "%s", path("slopes.npy"));
    snprintf(sk, sizeof sk, "%s", path("sinks.npy"));
    ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("o.npy"),
                         "--lse-out", path("l.npy"), "--causal", "--softcap", "2.5", "--alibi",
                         sp, "--dropout", "0.25", "--seed", "42", "--dropout-offset", "7",
                         "--sinks", sk, "--device", "native", NULL),
                     0);
    clattn_shape m = s;
    m.sinks = sinks;
    m.causal = 1;
    m.softcap = 2.5f;
    m.alibi_slopes = slopes;
    m.dropout_p = 0.25f;
    m.dropout_seed = 42;
    m.dropout_offset = 7;
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    float *want = nan_array(p.nq), *want_l = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, &m, p.q, p.k, p.v, want, want_l), CLATTN_OK);
    npy_array a, l;
    char err[256];
    ck_assert_msg(npy_read(path("o.npy"), &a, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(npy_read(path("l.npy"), &l, err, sizeof err) == 0, "%s", err);
    ck_assert(a.count == p.nq && !memcmp(a.data, want, p.nq * sizeof(float)));
    ck_assert(l.count == p.nlse && !memcmp(l.data, want_l, p.nlse * sizeof(float)));
    /* the backward from that forward, with the same seed and offset */
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("l.npy"), "--d-out", path("do.npy"), "--dq",
                         path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"),
                         "--causal", "--softcap", "2.5", "--alibi", sp, "--dropout", "0.25",
                         "--seed", "42", "--dropout-offset", "7", "--sinks", sk, "--d-sinks",
                         path("ds.npy"), "--device", "native", NULL),
                     0);
    float *dq = nan_array(p.nq), *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
    ck_assert_status(clattn_backward(ctx, &m, p.q, p.k, p.v, a.data, l.data, p.d_out, dq, dk,
                                     dv),
                     CLATTN_OK);
    npy_array g;
    ck_assert_msg(npy_read(path("dv.npy"), &g, err, sizeof err) == 0, "%s", err);
    ck_assert(g.count == p.nkv && !memcmp(g.data, dv, p.nkv * sizeof(float)));
    npy_free(&g);
    ck_assert_msg(npy_read(path("dq.npy"), &g, err, sizeof err) == 0, "%s", err);
    ck_assert(g.count == p.nq && !memcmp(g.data, dq, p.nq * sizeof(float)));
    npy_free(&g);
    float ds[4];
    ck_assert_status(clattn_grad_sinks(ctx, &m, a.data, l.data, p.d_out, ds), CLATTN_OK);
    ck_assert_msg(npy_read(path("ds.npy"), &g, err, sizeof err) == 0, "%s", err);
    ck_assert(g.count == 4 && g.ndim == 1 && !memcmp(g.data, ds, sizeof ds));
    ck_assert(ds[0] != 0.0f && ds[1] == 0.0f); /* a sink moves the loss; -inf is none */
    npy_free(&g);
    /* --d-sinks wants --sinks: exit 2, and no output is left */
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("l.npy"), "--d-out", path("do.npy"), "--dq",
                         path("bq.npy"), "--dk", path("bk.npy"), "--dv", path("bv.npy"),
                         "--d-sinks", path("bs.npy"), "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "wants --sinks"), "%s", err_text);
    ck_assert(access(path("bq.npy"), F_OK) != 0 && access(path("bs.npy"), F_OK) != 0);
    clattn_context_destroy(ctx);
    npy_free(&a);
    npy_free(&l);
    free(want), free(want_l), free(dq), free(dk), free(dv);

    /* bad values: exit 2, the reason, no file */
    const struct {
        const char *flag, *value, *flag2, *value2, *says;
    } bad[] = {
        {"--dropout", "1", NULL, NULL, "below 1"},
        {"--dropout", "-0.1", NULL, NULL, "below 1"},
        {"--dropout", "0.1", NULL, NULL, "wants --seed"},
        /* positive, but 0 in float32: not silently none */
        {"--dropout", "1e-50", "--seed", "3", "float32 holds above 0"},
        {"--causal", "--causal-bottom-right", NULL, NULL, "two alignments"},
        {"--softcap", "-2", NULL, NULL, "finite number above 0"},
        {"--softcap", "inf", NULL, NULL, "finite number above 0"},
        {"--alibi", "three.npy", NULL, NULL, "4 slopes"},
        {"--alibi", "nan.npy", NULL, NULL, "CLATTN_ERROR_INVALID_MODIFIER"},
        {"--alibi", "missing.npy", NULL, NULL, "missing.npy"},
        {"--sinks", "three.npy", NULL, NULL, "4 sinks"},
        {"--window", "3", "--window-left", "2", "not both"},
        {"--window-left", "4294967295", NULL, NULL, "does not fit"},
        {"--sinks", "nan.npy", NULL, NULL, "CLATTN_ERROR_INVALID_MODIFIER"},
        {"--dropout", "0.1", "--seed", "-1", "whole number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char value[512];
        snprintf(value, sizeof value, "%s",
                 !strcmp(bad[i].flag, "--alibi") || !strcmp(bad[i].flag, "--sinks")
                     ? path(bad[i].value)
                     : bad[i].value);
        ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out",
                             path("bad.npy"), "--lse-out", path("badl.npy"), bad[i].flag, value,
                             bad[i].flag2 ? bad[i].flag2 : "--device",
                             bad[i].flag2 ? bad[i].value2 : "native", NULL),
                         2);
        ck_assert_msg(strstr(err_text, bad[i].says), "%s %s: %s", bad[i].flag, value, err_text);
        ck_assert(access(path("bad.npy"), F_OK) != 0 && access(path("badl.npy"), F_OK) != 0);
    }
    /* --dropout 0 with a seed (or a seed alone) is no dropout, as in the API,
     * PyTorch and FlashAttention: the plain forward's bytes. */
    ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("p0.npy"),
                         "--lse-out", path("p0l.npy"), "--device", "native", NULL),
                     0);
    ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("s0.npy"),
                         "--lse-out", path("s0l.npy"), "--dropout", "0", "--seed", "3",
                         "--dropout-offset", "2", "--device", "native", NULL),
                     0);
    ck_assert(same_bytes(path("p0.npy"), path("s0.npy")));
    ck_assert_int_eq(run("train", "--device", "native", "--dropout", "0.1", NULL), 0);
    ck_assert_msg(strstr(out_text, "evaluation loss") && strstr(out_text, "ok"), "%s", out_text);
    ck_assert_int_eq(run("train", "--device", "native", "--seed", "3", NULL), 0);
    problem_free(&p);
    cleanup();
}
END_TEST


/* The caller's functions through the file commands: --score-fn with
 * --score-params and --mask-fn, compiled as C99 for native, give what the
 * library gives with the same functions in C, forward and backward, and
 * the same on PoCL where it runs; a file that is missing or does not
 * compile, and parameters without a function, are bad input that leaves
 * nothing. */
static float cap_score(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p)
{
    (void)b, (void)h, (void)q, (void)k;
    return p[0] * tanhf(s / p[0]) + (q % 2u ? 0.5f : 0.0f);
}
static float cap_ds(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p)
{
    (void)b, (void)h, (void)q, (void)k;
    const float t = tanhf(s / p[0]);
    return 1.0f - t * t;
}
static int doc_mask(uint32_t b, uint32_t h, uint32_t q, uint32_t k)
{
    (void)b, (void)h;
    return q / 5u == k / 5u;
}

/* Whether two float32 .npy files agree within tol of their largest magnitude. */
static int close_files(const char *a, const char *b, double tol)
{
    npy_array x, y;
    char err[256];
    ck_assert_msg(npy_read(a, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(npy_read(b, &y, err, sizeof err) == 0, "%s", err);
    int ok = x.count == y.count;
    double big = 0.0;
    for (size_t i = 0; ok && i < x.count; ++i)
        big = fmax(big, fabs((double)x.data[i]));
    for (size_t i = 0; ok && i < x.count; ++i)
        ok = fabs((double)x.data[i] - (double)y.data[i]) <= tol * big;
    npy_free(&x);
    npy_free(&y);
    return ok;
}

START_TEST(function_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    static const char score[] =
        "float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
        "{\n    return p[0] * tanh(s / p[0]) + (q % 2u ? 0.5f : 0.0f);\n}\n"
        "float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
        "{\n    const float t = tanh(s / p[0]);\n    return 1.0f - t * t;\n}\n";
    static const char mask[] =
        "bool clattn_mask(uint b, uint h, uint q, uint k) { return q / 5u == k / 5u; }\n";
    static const char broken[] =
        "float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
        "{ return s + ; }\n";
    save_bytes("score.cl", score, sizeof score - 1);
    save_bytes("mask.cl", mask, sizeof mask - 1);
    save_bytes("broken.cl", broken, sizeof broken - 1);
    const float cap[1] = {3.0f};
    const size_t one = 1;
    save("cap.npy", &one, 1, cap);
    char qp[512], kp[512], vp[512], sf[512], mf[512], cp[512];
    snprintf(qp, sizeof qp, "%s", path("q.npy"));
    snprintf(kp, sizeof kp, "%s", path("k.npy"));
    snprintf(vp, sizeof vp, "%s", path("v.npy"));
    snprintf(sf, sizeof sf, "%s", path("score.cl"));
    snprintf(mf, sizeof mf, "%s", path("mask.cl"));
    snprintf(cp, sizeof cp, "%s", path("cap.npy"));
    ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("o.npy"),
                         "--lse-out", path("l.npy"), "--score-fn", sf, "--score-params", cp,
                         "--mask-fn", mf, "--device", "native", NULL),
                     0);
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("l.npy"), "--d-out", path("do.npy"), "--dq",
                         path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"),
                         "--score-fn", sf, "--score-params", cp, "--mask-fn", mf, "--device",
                         "native", NULL),
                     0);
    /* the library with the same functions in C */
    clattn_shape m = s;
    m.score_native = cap_score;
    m.score_ds_native = cap_ds;
    m.mask_native = doc_mask;
    m.score_params = cap;
    m.score_params_count = 1;
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    float *want = nan_array(p.nq), *want_l = nan_array(p.nlse), *dq = nan_array(p.nq);
    float *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
    ck_assert_status(clattn_forward(ctx, &m, p.q, p.k, p.v, want, want_l), CLATTN_OK);
    const size_t q_shape[3] = {s.q_seq, s.num_heads, s.head_dim};
    const size_t k_shape[3] = {s.kv_seq, s.num_kv_heads, s.head_dim};
    save("want_o.npy", q_shape, 3, want);
    ck_assert(close_files(path("o.npy"), path("want_o.npy"), 1e-5));
    npy_array l;
    char err[256];
    ck_assert_msg(npy_read(path("l.npy"), &l, err, sizeof err) == 0, "%s", err);
    ck_assert_status(clattn_backward(ctx, &m, p.q, p.k, p.v, want, l.data, p.d_out, dq, dk, dv),
                     CLATTN_OK);
    npy_free(&l);
    save("want_dq.npy", q_shape, 3, dq);
    save("want_dk.npy", k_shape, 3, dk);
    ck_assert(close_files(path("dq.npy"), path("want_dq.npy"), 1e-4));
    ck_assert(close_files(path("dk.npy"), path("want_dk.npy"), 1e-4));
    clattn_context_destroy(ctx);
    /* the same files on PoCL, where it runs */
    o.backend = CLATTN_BACKEND_OPENCL_CPU;
    if (clattn_context_create(&o, &ctx) == CLATTN_OK) {
        clattn_context_destroy(ctx);
        ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out",
                             path("oc.npy"), "--lse-out", path("lc.npy"), "--score-fn", sf,
                             "--score-params", cp, "--mask-fn", mf, "--device", "cpu", NULL),
                         0);
        ck_assert(close_files(path("oc.npy"), path("want_o.npy"), 1e-5));
        ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out",
                             path("bad.npy"), "--lse-out", path("badl.npy"), "--score-fn",
                             path("broken.cl"), "--device", "cpu", NULL),
                         2);
        ck_assert_msg(strstr(err_text, "CLATTN_ERROR_BUILD_FAILED") && strstr(err_text, "error"),
                      "%s", err_text);
        ck_assert(access(path("bad.npy"), F_OK) != 0);
    }
    free(want), free(want_l), free(dq), free(dk), free(dv);
    /* bad input: exit 2, the reason, no file */
    const struct {
        const char *flag, *value, *flag2, *value2, *says;
    } bad[] = {
        {"--score-fn", "missing.cl", "--device", "native", "missing.cl"},
        {"--score-params", "cap.npy", "--device", "native", "wants --score-fn"},
        {"--score-fn", "broken.cl", "--device", "native", "did not compile"},
        {"--score-fn", "score.cl", "--score-params", "q.npy", "1-D float32"},
        {"--mask-fn", "cap.npy", "--device", "native", "not text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char value[512], value2[512];
        snprintf(value, sizeof value, "%s", path(bad[i].value));
        snprintf(value2, sizeof value2, "%s",
                 strcmp(bad[i].flag2, "--device") ? path(bad[i].value2) : bad[i].value2);
        ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out",
                             path("bad.npy"), "--lse-out", path("badl.npy"), bad[i].flag, value,
                             bad[i].flag2, value2, NULL),
                         2);
        ck_assert_msg(strstr(err_text, bad[i].says), "%s %s: %s", bad[i].flag, value, err_text);
        ck_assert(access(path("bad.npy"), F_OK) != 0 && access(path("badl.npy"), F_OK) != 0);
    }
    /* docs/programmable.md's examples: each compiles as C99 and runs on
     * native, forward and backward (the relative bias with its 65 floats a
     * head, the softcap with its cap) */
    static const char *const examples[] = {"document", "prefix_lm", "sliding_global",
                                           "relative_bias", "softcap"};
    float table[8 * 65];
    for (int i = 0; i < 8 * 65; ++i)
        table[i] = (float)sin(0.3 * i);
    const size_t table_n = 8 * 65;
    save("table.npy", &table_n, 1, table);
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; ++i) {
        char file[600], params[512];
        snprintf(file, sizeof file, "%s/%s.cl", CLATTN_EXAMPLES_DIR, examples[i]);
        const int score = i >= 3;
        snprintf(params, sizeof params, "%s", path(i == 3 ? "table.npy" : "cap.npy"));
        ck_assert_msg(run("bench", "--op", "backward", "--q-seq", "130", "--heads", "8",
                          "--head-dim", "16", "--reps", "1", "--device", "native",
                          score ? "--score-fn" : "--mask-fn", file,
                          score ? "--score-params" : "--reps", score ? params : "1", NULL) == 0,
                      "%s: %s", file, err_text);
    }
    problem_free(&p);
    cleanup();
}
END_TEST


/* A bool ('|b1') .npy of 4 dimensions in the test's folder. */
static void save_bools(const char *name, const size_t shape[4], const uint8_t *v)
{
    char head[128];
    const size_t n = shape[0] * shape[1] * shape[2] * shape[3];
    int len = snprintf(head + 10, sizeof head - 10,
                       "{'descr': '|b1', 'fortran_order': False, 'shape': (%zu, %zu, %zu, %zu), }",
                       shape[0], shape[1], shape[2], shape[3]);
    while ((10 + len + 1) % 64)
        head[10 + len++] = ' ';
    head[10 + len++] = '\n';
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (char)(len & 0xFF);
    head[9] = (char)(len >> 8);
    char *bytes = malloc(10 + (size_t)len + n);
    ck_assert_ptr_nonnull(bytes);
    memcpy(bytes, head, 10 + (size_t)len);
    memcpy(bytes + 10 + len, v, n);
    save_bytes(name, bytes, 10 + (size_t)len + n);
    free(bytes);
}

/* --bias through the file commands: a float32 bias broadcast over the
 * batch gives what the library gives, forward and backward, with
 * --d-bias in its shape; a bool mask likewise, on native and on PoCL where
 * it runs; a bias of the wrong shape or with packed sequences, --d-bias
 * without a float32 bias, are bad input that leaves nothing. */
START_TEST(bias_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.batch = 2;
    const size_t bshape[4] = {1, s.num_heads, s.q_seq, s.kv_seq}, mshape[4] = {2, 1, s.q_seq,
                                                                                 s.kv_seq};
    const size_t nb = s.num_heads * s.q_seq * s.kv_seq, nm = 2 * s.q_seq * s.kv_seq;
    float *bias = malloc(nb * sizeof(float));
    uint8_t *keep = malloc(nm);
    ck_assert(bias && keep);
    for (size_t i = 0; i < nb; ++i)
        bias[i] = (float)sin(0.37 * (double)i);
    for (size_t i = 0; i < nm; ++i)
        keep[i] = i % 7u != 3u;
    save("bias.npy", bshape, 4, bias);
    save_bools("keep.npy", mshape, keep);
    s.bias = bias;
    s.bias_heads = s.num_heads;
    problem p;
    write_problem(&p, &s, 1); /* O and LSE with the bias */
    char qp[512], kp[512], vp[512], bp[512], mp[512];
    snprintf(qp, sizeof qp, "%s", path("q.npy"));
    snprintf(kp, sizeof kp, "%s", path("k.npy"));
    snprintf(vp, sizeof vp, "%s", path("v.npy"));
    snprintf(bp, sizeof bp, "%s", path("bias.npy"));
    snprintf(mp, sizeof mp, "%s", path("keep.npy"));
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                         path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"),
                         "--bias", bp, "--d-bias", path("db.npy"), "--device", "native", NULL),
                     0);
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    float *dq = nan_array(p.nq), *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
    float *db = nan_array(nb), *want = nan_array(p.nq), *want_l = nan_array(p.nlse);
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, dq, dk, dv),
                     CLATTN_OK);
    ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, db),
                     CLATTN_OK);
    const size_t q_shape[4] = {2, s.q_seq, s.num_heads, s.head_dim};
    save("want_dq.npy", q_shape, 4, dq);
    save("want_db.npy", bshape, 4, db);
    ck_assert(close_files(path("dq.npy"), path("want_dq.npy"), 1e-5));
    ck_assert(close_files(path("db.npy"), path("want_db.npy"), 1e-5));
    /* the same bias in float16 ('<f2') and as bfloat16's bits ('<u2'), of
     * values exact in each: the same dBias */
    static const clattn_dtype kinds[2] = {CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16};
    static const char *const descrs[2] = {"<f2", "<u2"};
    for (int k = 0; k < 2; ++k) {
        uint16_t *half = malloc(nb * sizeof *half);
        ck_assert_ptr_nonnull(half);
        clattn_from_f32(kinds[k], bias, half, nb);
        clattn_to_f32(kinds[k], half, bias, nb);
        char tmp[600], why[256];
        ck_assert_msg(npy_write_temp(path("bias16.npy"), bshape, 4, descrs[k], half, tmp,
                                     sizeof tmp, why, sizeof why) == 0 &&
                          npy_commit(tmp, path("bias16.npy"), why, sizeof why) == 0,
                      "%s", why);
        free(half);
        ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, db),
                         CLATTN_OK);
        save("want_db16.npy", bshape, 4, db);
        ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                             "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                             path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"),
                             "--bias", path("bias16.npy"), "--d-bias", path("db16.npy"),
                             "--device", "native", NULL),
                         0);
        ck_assert_msg(close_files(path("db16.npy"), path("want_db16.npy"), 0.0), "%s bias",
                      descrs[k]);
    }
    /* the bool mask, on native and on PoCL where it runs */
    clattn_shape m = s;
    m.bias = NULL;
    m.bias_heads = 1;
    m.bias_batch = 2;
    m.bool_mask = keep;
    ck_assert_status(clattn_forward(ctx, &m, p.q, p.k, p.v, want, want_l), CLATTN_OK);
    save("want_o.npy", q_shape, 4, want);
    clattn_context_destroy(ctx);
    o.backend = CLATTN_BACKEND_OPENCL_CPU;
    const int pocl = clattn_context_create(&o, &ctx) == CLATTN_OK;
    clattn_context_destroy(ctx);
    for (int d = 0; d < 1 + pocl; ++d) {
        ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("om.npy"),
                             "--lse-out", path("lm.npy"), "--bias", mp, "--device",
                             d ? "cpu" : "native", NULL),
                         0);
        ck_assert(close_files(path("om.npy"), path("want_o.npy"), 1e-5));
    }
    /* bad input: exit 2, the reason, no file */
    const size_t wrong[4] = {3, 1, s.q_seq, s.kv_seq};
    save("wrong.npy", wrong, 4, bias);
    ck_assert_int_eq(run("forward", "--q", qp, "--k", kp, "--v", vp, "--out", path("bad.npy"),
                         "--lse-out", path("badl.npy"), "--bias", path("wrong.npy"), NULL),
                     2);
    ck_assert_msg(strstr(err_text, "4-d float32"), "%s", err_text);
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                         path("bad.npy"), "--dk", path("badk.npy"), "--dv", path("badv.npy"),
                         "--bias", mp, "--d-bias", path("badb.npy"), NULL),
                     2);
    ck_assert_msg(strstr(err_text, "no gradient"), "%s", err_text);
    ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                         "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                         path("bad.npy"), "--dk", path("badk.npy"), "--dv", path("badv.npy"),
                         "--d-bias", path("badb.npy"), NULL),
                     2);
    ck_assert_msg(strstr(err_text, "wants --bias"), "%s", err_text);
    static const char *const left[] = {"bad.npy", "badl.npy", "badk.npy", "badv.npy", "badb.npy"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; ++i)
        ck_assert_msg(access(path(left[i]), F_OK) != 0, "%s was left", left[i]);
    free(dq), free(dk), free(dv), free(db), free(want), free(want_l), free(bias), free(keep);
    problem_free(&p);
    cleanup();
}
END_TEST

/* --d-score-params with examples/programmable/relative_bias.cl, on native
 * and on PoCL where it runs (on the host's pass, then on the device's
 * kernel): the table's gradient is the bias's gradient (clattn_grad_bias
 * of the same table as a bias tensor) summed over each entry's pairs;
 * without clattn_score_dp in the file, or without --score-params, bad
 * input that leaves nothing; clattn bench times it. */
START_TEST(score_params_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    const size_t H = s.num_heads, n = H * 65, nb = H * s.q_seq * s.kv_seq;
    float table[8 * 65], *bias = malloc(nb * sizeof(float)), *db = nan_array(nb);
    double want[8 * 65] = {0};
    ck_assert(bias && db);
    for (size_t i = 0; i < n; ++i)
        table[i] = (float)sin(0.3 * (double)i);
    size_t at[4 * 12 * 12];
    for (size_t h = 0, e = 0; h < H; ++h)
        for (uint32_t i = 0; i < s.q_seq; ++i)
            for (uint32_t j = 0; j < s.kv_seq; ++j, ++e) {
                const int d = (int)j - (int)i;
                at[e] = h * 65 + (size_t)(d < -32 ? 0 : d > 32 ? 64 : d + 32);
                bias[e] = table[at[e]];
            }
    save("table.npy", &n, 1, table);
    s.bias = bias;
    s.bias_heads = (uint32_t)H;
    problem p;
    write_problem(&p, &s, 0); /* O and LSE with the table as a bias */
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    ck_assert_status(clattn_grad_bias(ctx, &s, p.q, p.k, p.v, p.o, p.lse, p.d_out, db),
                     CLATTN_OK);
    clattn_context_destroy(ctx);
    for (size_t e = 0; e < nb; ++e)
        want[at[e]] += db[e];
    float want_f[8 * 65];
    for (size_t i = 0; i < n; ++i)
        want_f[i] = (float)want[i];
    save("want_dt.npy", &n, 1, want_f);
    o.backend = CLATTN_BACKEND_OPENCL_CPU;
    const int pocl = clattn_context_create(&o, &ctx) == CLATTN_OK;
    clattn_context_destroy(ctx);
    char qp[512], kp[512], vp[512], file[600], tp[512];
    snprintf(qp, sizeof qp, "%s", path("q.npy"));
    snprintf(kp, sizeof kp, "%s", path("k.npy"));
    snprintf(vp, sizeof vp, "%s", path("v.npy"));
    snprintf(tp, sizeof tp, "%s", path("table.npy"));
    snprintf(file, sizeof file, "%s/relative_bias.cl", CLATTN_EXAMPLES_DIR);
    for (int d = 0; d < 1 + 2 * pocl; ++d) {
        setenv("CLATTN_GRAD_BIAS", d == 2 ? "device" : "host", 1);
        ck_assert_msg(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                          "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                          path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy"),
                          "--score-fn", file, "--score-params", tp, "--d-score-params",
                          path("dt.npy"), "--device", d ? "cpu" : "native", NULL) == 0,
                      "%s", err_text);
        ck_assert_msg(close_files(path("dt.npy"), path("want_dt.npy"), 1e-5), "on %s",
                      d == 2 ? "PoCL's device" : d ? "PoCL's host" : "native");
    }
    unsetenv("CLATTN_GRAD_BIAS");
    ck_assert_msg(run("bench", "--op", "grad-score-params", "--q-seq", "40", "--heads", "4",
                      "--head-dim", "16", "--reps", "1", "--device", "native", "--score-fn", file,
                      "--score-params", tp, NULL) == 0,
                  "%s", err_text);
    ck_assert_int_eq(run("bench", "--op", "grad-score-params", "--q-seq", "40", "--heads", "8",
                         "--head-dim", "16", "--reps", "1", "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "wants --score-fn"), "%s", err_text);
    /* bad input: exit 2, the reason, no file */
    FILE *f = fopen(path("no_dp.cl"), "w");
    ck_assert_ptr_nonnull(f);
    fputs("float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
          "{ return s + p[h]; }\n"
          "float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float "
          "*p)\n{ return 1.0f; }\n",
          f);
    ck_assert_int_eq(fclose(f), 0);
    char no_dp[600];
    snprintf(no_dp, sizeof no_dp, "%s", path("no_dp.cl"));
    for (int i = 0; i < 2; ++i) {
        ck_assert_int_eq(run("backward", "--q", qp, "--k", kp, "--v", vp, "--o", path("o.npy"),
                             "--lse", path("lse.npy"), "--d-out", path("do.npy"), "--dq",
                             path("bad.npy"), "--dk", path("badk.npy"), "--dv", path("badv.npy"),
                             "--score-fn", i ? file : no_dp, i ? "--device" : "--score-params",
                             i ? "native" : tp, "--d-score-params", path("badt.npy"), NULL),
                         2);
        ck_assert_msg(strstr(err_text, i ? "wants --score-params" : "wants clattn_score_dp"),
                      "%s", err_text);
        static const char *const left[] = {"bad.npy", "badk.npy", "badv.npy", "badt.npy"};
        for (size_t j = 0; j < sizeof left / sizeof left[0]; ++j)
            ck_assert_msg(access(path(left[j]), F_OK) != 0, "%s was left", left[j]);
    }
    free(bias);
    free(db);
    problem_free(&p);
    cleanup();
}
END_TEST

void add_cli_modifier_tests(TCase *tc)
{
    tcase_add_test(tc, modifier_files);
    tcase_add_test(tc, function_files);
    tcase_add_test(tc, bias_files);
    tcase_add_test(tc, score_params_files);
}
