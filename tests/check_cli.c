/* The command line from outside: the clattn program (path in CLATTN_CLI)
 * run on .npy files in a fresh folder, exit statuses, and no file left
 * behind on failure. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_harness.h"
#include "harness.h"
#include "npy.h"
#include "reference.h"

START_TEST(help_and_usage)
{
    make_dir();
    const char *cmds[] = {"devices", "grad-v", "demo",  "forward",
                          "backward", "train", "bench", "merge"};
    ck_assert_int_eq(run("--help", NULL), 0);
    ck_assert(strstr(out_text, "grad-v") != NULL);
    for (int i = 0; i < 8; ++i) {
        ck_assert_int_eq(run(cmds[i], "--help", NULL), 0);
        ck_assert(strstr(out_text, "usage: clattn") != NULL);
    }
    ck_assert_int_eq(run(NULL), 2);
    ck_assert_int_eq(run("frobnicate", NULL), 2);
    ck_assert_int_eq(run("version", NULL), 0);
    ck_assert(strstr(out_text, CLATTN_VERSION) != NULL);
    cleanup();
}
END_TEST

START_TEST(grad_v_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                         "--device", "native", NULL),
                     0);
    size_t want[3] = {12, 2, 8};
    check_output(&p, "dv.npy", 3, want);
    struct stat st;
    ck_assert_int_eq(stat(path("dv.npy"), &st), 0);
    ck_assert_msg((st.st_mode & 0044) != 0, "dv.npy has mode %o", st.st_mode & 0777);
    ck_assert_int_eq(count_entries(), 7); /* six inputs and dv.npy */
    problem_free(&p);
    cleanup();
}
END_TEST

/* grad-v batched under a causal two-sided window given as FlashAttention's
 * sides (--window-left 2 is --window 3). */
START_TEST(grad_v_batched_masked)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.batch = 3;
    s.causal = 1;
    s.window = 3;
    s.window_right = 2;
    s.scale = 0.5f;
    problem p;
    write_problem(&p, &s, 1);
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                         "--causal", "--window-left", "2", "--window-right", "2", "--scale",
                         "0.5", "--device", "native", "--variant", "blocked", NULL),
                     0);
    size_t want[4] = {3, 12, 2, 8};
    check_output(&p, "dv.npy", 4, want);
    problem_free(&p);
    cleanup();
}
END_TEST

/* forward then backward through files, batched and masked, on the backend
 * auto picks: the backward reads the forward's own O and LSE. */
START_TEST(forward_backward_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.batch = 2;
    s.causal = 1;
    s.window = 5;
    problem p;
    write_problem(&p, &s, 1);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("o2.npy"), "--lse-out", path("lse2.npy"),
                         "--causal", "--window", "5", NULL),
                     0);
    double *o = malloc(p.nq * sizeof(double)), *o_mag = malloc(p.nq * sizeof(double));
    double *lse = malloc(p.nlse * sizeof(double)), *ones = malloc(p.nlse * sizeof(double));
    ref_forward(&p, o, o_mag, lse);
    size_t qshape[4] = {2, 12, 4, 8}, kshape[4] = {2, 12, 2, 8}, lshape[4] = {2, 12, 4, 2};
    expect_file("o2.npy", 4, qshape, o, o_mag, p.nq);
    for (size_t i = 0; i < p.nlse; ++i)
        ones[i] = 1.0 + fabs(lse[i]);
    expect_file("lse2.npy", 4, lshape, lse, ones, p.nlse);

    ck_assert_int_eq(run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--o", path("o.npy"), "--lse", path("lse.npy"),
                         "--d-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("dv.npy"), "--causal", "--window", "5",
                         NULL),
                     0);
    double *dq = malloc(p.nq * 8), *dq_mag = malloc(p.nq * 8), *dk = malloc(p.nkv * 8);
    double *dk_mag = malloc(p.nkv * 8), *dv = malloc(p.nkv * 8), *dv_mag = malloc(p.nkv * 8);
    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    expect_file("dq.npy", 4, qshape, dq, dq_mag, p.nq);
    expect_file("dk.npy", 4, kshape, dk, dk_mag, p.nkv);
    expect_file("dv.npy", 4, kshape, dv, dv_mag, p.nkv);
    double *all[] = {o, o_mag, lse, ones, dq, dq_mag, dk, dk_mag, dv, dv_mag};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        free(all[i]);
    problem_free(&p);
    cleanup();
}
END_TEST

/* Global positions and merging through files: a forward with --q-offset
 * and --kv-offset (causal and window masks crossing the key chunks) equals
 * the float64 reference on those positions, and so does the merge of the
 * forwards over the two halves of the keys; a merge whose inputs disagree
 * exits 2 and leaves no output. */
START_TEST(offsets_and_merge)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.causal = 1;
    s.window = 6;
    s.q_offset = 20;
    s.kv_offset = 15;
    problem p;
    write_problem(&p, &s, 0);
    const char *mask[] = {"--causal", "--window", "6", "--q-offset", "20", "--device", "native"};
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("o_all.npy"), "--lse-out",
                         path("l_all.npy"), mask[0], mask[1], mask[2], mask[3], mask[4],
                         "--kv-offset", "15", mask[5], mask[6], NULL),
                     0);
    double *o = malloc(p.nq * sizeof(double)), *o_mag = malloc(p.nq * sizeof(double));
    double *lse = malloc(p.nlse * sizeof(double)), *ones = malloc(p.nlse * sizeof(double));
    ref_forward(&p, o, o_mag, lse);
    const size_t qshape[3] = {s.q_seq, s.num_heads, s.head_dim};
    const size_t lshape[3] = {s.q_seq, s.num_heads, 2};
    expect_file("o_all.npy", 3, qshape, o, o_mag, p.nq);
    /* The keys in two halves of 6 rows, at positions 15 and 21. */
    const size_t half[3] = {s.kv_seq / 2, s.num_kv_heads, s.head_dim};
    const size_t half_elems = p.nkv / 2;
    save("k1.npy", half, 3, p.k);
    save("v1.npy", half, 3, p.v);
    save("k2.npy", half, 3, p.k + half_elems);
    save("v2.npy", half, 3, p.v + half_elems);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k1.npy"), "--v",
                         path("v1.npy"), "--out", path("o1.npy"), "--lse-out", path("l1.npy"),
                         mask[0], mask[1], mask[2], mask[3], mask[4], "--kv-offset", "15",
                         mask[5], mask[6], NULL),
                     0);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k2.npy"), "--v",
                         path("v2.npy"), "--out", path("o2.npy"), "--lse-out", path("l2.npy"),
                         mask[0], mask[1], mask[2], mask[3], mask[4], "--kv-offset", "21",
                         mask[5], mask[6], NULL),
                     0);
    ck_assert_int_eq(run("merge", "--o", path("o1.npy"), "--lse", path("l1.npy"), "--o2",
                         path("o2.npy"), "--lse2", path("l2.npy"), "--out", path("om.npy"),
                         "--lse-out", path("lm.npy"), "--device", "native", NULL),
                     0);
    expect_file("om.npy", 3, qshape, o, o_mag, p.nq);
    /* The LSE: the merged pair's sum is the whole's log-sum-exp (rows
     * that see no key keep the empty pair). */
    for (size_t i = 0; i < p.nlse; ++i)
        ones[i] = 1.0 + fabs(lse[i]);
    expect_file("lm.npy", 3, lshape, lse, ones, p.nlse);
    /* O2 with another head count: exit 2, nothing written. */
    ck_assert_int_eq(run("merge", "--o", path("o1.npy"), "--lse", path("l1.npy"), "--o2",
                         path("k1.npy"), "--lse2", path("l2.npy"), "--out", path("bad.npy"),
                         "--lse-out", path("badl.npy"), NULL),
                     2);
    ck_assert(strstr(err_text, "O2") != NULL);
    ck_assert(!exists("bad.npy") && !exists("badl.npy"));
    /* A causal chunk of unequal length at offsets 0 runs (top-left). */
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k1.npy"), "--v",
                         path("v1.npy"), "--out", path("tl.npy"), "--lse-out",
                         path("tll.npy"), "--causal", "--device", "native", NULL),
                     0);
    double *all[] = {o, o_mag, lse, ones};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        free(all[i]);
    problem_free(&p);
    cleanup();
}
END_TEST

/* 16-bit .npy files: float16 as '<f2'; bfloat16 bits as '<i2' (what
 * tensor.view(torch.int16) gives) with --dtype bf16. The outputs come back
 * in the inputs' descr (the LSE pairs in '<f4'), equal to the float32 run
 * on the same (rounded) values up to the outputs' one rounding; mixed or
 * unmarked inputs exit 2 naming the file, and leave no output. */
START_TEST(sixteen_bit_files)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.causal = 1;
    problem p;
    problem_make(&p, &s, 5, 1.0f);
    size_t qs[3] = {12, 4, 8}, ks[3] = {12, 2, 8};
    const char *descr[2] = {"<f2", "<i2"};
    for (int fmt = 0; fmt < 2; ++fmt) {
        if (fmt == 0 && !HAVE_F16)
            continue; /* no _Float16 here to write float16 with */
        const clattn_dtype dtype = fmt ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F16;
        float *src[3] = {p.q, p.k, p.v};
        const size_t n[3] = {p.nq, p.nkv, p.nkv};
        const char *name16[3] = {"q16.npy", "k16.npy", "v16.npy"};
        const char *name32[3] = {"q32.npy", "k32.npy", "v32.npy"};
        for (int t = 0; t < 3; ++t) {
            uint16_t *bits = malloc(n[t] * 2);
            float *round = malloc(n[t] * 4);
            memcpy(round, src[t], n[t] * 4);
            round_16(round, bits, n[t], dtype);
            char tmp[600], err[256];
            ck_assert_msg(npy_write_temp(path(name16[t]), t ? ks : qs, 3, descr[fmt], bits, tmp,
                                         sizeof tmp, err, sizeof err) == 0 &&
                              npy_commit(tmp, path(name16[t]), err, sizeof err) == 0,
                          "%s", err);
            save(name32[t], t ? ks : qs, 3, round);
            free(bits);
            free(round);
        }
        const char *dtype_opt = fmt ? "--dtype" : NULL;
        ck_assert_int_eq(run("forward", "--q", path("q16.npy"), "--k", path("k16.npy"), "--v",
                             path("v16.npy"), "--out", path("o16.npy"), "--lse-out",
                             path("l16.npy"), "--causal", "--device", "native", dtype_opt,
                             "bf16", NULL),
                         0);
        ck_assert_int_eq(run("forward", "--q", path("q32.npy"), "--k", path("k32.npy"), "--v",
                             path("v32.npy"), "--out", path("o32.npy"), "--lse-out",
                             path("l32.npy"), "--causal", "--device", "native", NULL),
                         0);
        npy_array o16, o32, l16, l32;
        char err[256];
        ck_assert(npy_read(path("o16.npy"), &o16, err, sizeof err) == 0);
        ck_assert(npy_read(path("o32.npy"), &o32, err, sizeof err) == 0);
        ck_assert(npy_read(path("l16.npy"), &l16, err, sizeof err) == 0);
        ck_assert(npy_read(path("l32.npy"), &l32, err, sizeof err) == 0);
        ck_assert_str_eq(o16.descr, descr[fmt]);
        ck_assert_str_eq(l16.descr, "<f4");
        ck_assert_int_eq(memcmp(l16.data, l32.data, p.nlse * 4), 0);
        const double u = fmt ? 0x1p-8 : 0x1p-11;
        for (size_t i = 0; i < p.nq; ++i) {
            const float got = from_16(o16.bits[i], dtype);
            ck_assert_msg(fabs((double)got - o32.data[i]) <= u * fabs(o32.data[i]),
                          "%s O[%zu] is %g, float32 gives %g", descr[fmt], i, (double)got,
                          (double)o32.data[i]);
        }
        npy_free(&o16);
        npy_free(&o32);
        npy_free(&l16);
        npy_free(&l32);
    }
    /* Bad combinations: exit 2, the file named, nothing written. */
    const int before = count_entries();
    struct {
        const char *q, *k, *dtype, *says;
    } bad[] = {
        {"q16.npy", "k32.npy", "bf16", "k32.npy is '<f4'"},
        {"q16.npy", "k16.npy", NULL, "--dtype bf16 reads them"},
        {"q32.npy", "k32.npy", "bf16", "bfloat16 wants '<u2' or '<i2'"},
        {"q32.npy", "k32.npy", "f8", "--dtype wants f32, f16 or bf16"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        const int rc = run("forward", "--q", path(bad[i].q), "--k", path(bad[i].k), "--v",
                           path(bad[i].k), "--out", path("bad.npy"), "--lse-out",
                           path("badl.npy"), "--device", "native",
                           bad[i].dtype ? "--dtype" : NULL, bad[i].dtype, NULL);
        ck_assert_msg(rc == 2 && strstr(err_text, bad[i].says), "case %zu: exit %d: %s", i, rc,
                      err_text);
        ck_assert_int_eq(count_entries(), before);
    }
    problem_free(&p);
    cleanup();
}
END_TEST

/* Causal at offsets 0 with kv_seq != q_seq runs (top-left, as PyTorch's
 * is_causal); --causal-bottom-right is --causal with q_offset = kv_seq -
 * q_seq, bit for bit. */
START_TEST(causal_alignments)
{
    make_dir();
    clattn_shape s = cli_shape();
    s.kv_seq = 17;
    problem p;
    write_problem(&p, &s, 0);
    const char *in[] = {"--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy")};
    ck_assert_int_eq(run("forward", in[0], in[1], in[2], in[3], in[4], in[5], "--out",
                         path("o_tl.npy"), "--lse-out", path("l_tl.npy"), "--causal", "--device",
                         "native", NULL),
                     0);
    ck_assert_int_eq(run("forward", in[0], in[1], in[2], in[3], in[4], in[5], "--out",
                         path("o_br.npy"), "--lse-out", path("l_br.npy"), "--causal-bottom-right",
                         "--device", "native", NULL),
                     0);
    ck_assert_int_eq(run("forward", in[0], in[1], in[2], in[3], in[4], in[5], "--out",
                         path("o_off.npy"), "--lse-out", path("l_off.npy"), "--causal",
                         "--q-offset", "5", "--device", "native", NULL),
                     0);
    ck_assert(same_bytes(path("o_br.npy"), path("o_off.npy")));
    ck_assert(same_bytes(path("l_br.npy"), path("l_off.npy")));
    ck_assert(!same_bytes(path("o_tl.npy"), path("o_br.npy")));
    problem_free(&p);
    cleanup();
}
END_TEST

/* An int32 ('<i4') .npy of n entries, written by hand. */
static void save_ints(const char *name, const int32_t *v, size_t n)
{
    char head[128];
    int len = snprintf(head + 10, sizeof head - 10,
                       "{'descr': '<i4', 'fortran_order': False, 'shape': (%zu,), }", n);
    while ((10 + len + 1) % 64)
        head[10 + len++] = ' ';
    head[10 + len++] = '\n';
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (char)(len & 0xff);
    head[9] = (char)(len >> 8);
    char buf[512];
    memcpy(buf, head, (size_t)(10 + len));
    memcpy(buf + 10 + len, v, n * sizeof *v);
    save_bytes(name, buf, (size_t)(10 + len) + n * sizeof *v);
}

/* Packed sequences through the file commands: --cu-seqlens-q and
 * --cu-seqlens-kv give what the library's packed call gives, and bad
 * prefix sums are bad input that leaves nothing. */
START_TEST(packed_files)
{
    make_dir();
    clattn_shape s = cli_shape(); /* 12 query rows, 12 key rows */
    problem p;
    write_problem(&p, &s, 0);
    const int32_t cq[4] = {0, 5, 5, 12}, ck[4] = {0, 4, 9, 11};
    save_ints("cq.npy", cq, 4);
    save_ints("ck.npy", ck, 4);
    char qp[512], kp[512], vp[512]; /* path()'s buffers are reused */
    snprintf(qp, sizeof qp, "%s", path("q.npy"));
    snprintf(kp, sizeof kp, "%s", path("k.npy"));
    snprintf(vp, sizeof vp, "%s", path("v.npy"));
    const char *in[] = {"--q", qp, "--k", kp, "--v", vp};
    ck_assert_int_eq(run("forward", in[0], in[1], in[2], in[3], in[4], in[5], "--out",
                         path("o.npy"), "--lse-out", path("l.npy"), "--causal-bottom-right",
                         "--cu-seqlens-q", path("cq.npy"), "--cu-seqlens-kv", path("ck.npy"),
                         "--device", "native", NULL),
                     0);
    const uint32_t uq[4] = {0, 5, 5, 12}, uk[4] = {0, 4, 9, 11};
    clattn_shape packed = s;
    packed.batch = 3;
    packed.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    packed.cu_seqlens_q = uq;
    packed.cu_seqlens_kv = uk;
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    float *want = nan_array(p.nq), *want_l = nan_array(p.nlse);
    ck_assert_status(clattn_forward(ctx, &packed, p.q, p.k, p.v, want, want_l), CLATTN_OK);
    clattn_context_destroy(ctx);
    npy_array a, l;
    char err[256];
    ck_assert_msg(npy_read(path("o.npy"), &a, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(npy_read(path("l.npy"), &l, err, sizeof err) == 0, "%s", err);
    ck_assert(a.count == p.nq && !memcmp(a.data, want, p.nq * sizeof(float)));
    ck_assert(l.count == p.nlse && !memcmp(l.data, want_l, p.nlse * sizeof(float)));
    npy_free(&a);
    npy_free(&l);
    free(want);
    free(want_l);

    /* bad prefix sums, a count that does not match, one flag alone, int32 tensors */
    const int32_t down[4] = {0, 6, 5, 12}, past[4] = {0, 5, 5, 13}, three[3] = {0, 5, 12};
    save_ints("down.npy", down, 4);
    save_ints("past.npy", past, 4);
    save_ints("three.npy", three, 3);
    const struct {
        const char *cq, *ck, *says;
    } bad[] = {
        {"down.npy", "ck.npy", "CLATTN_ERROR_INVALID_SEQLENS"},
        {"past.npy", "ck.npy", "past the 12 rows"},
        {"three.npy", "ck.npy", "both want batch + 1"},
        {"cq.npy", NULL, "want both"},
        {"q.npy", "ck.npy", "want a 1-D int32"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        ck_assert_int_eq(run("forward", in[0], in[1], in[2], in[3], in[4], in[5], "--out",
                             path("bad.npy"), "--lse-out", path("badl.npy"), "--cu-seqlens-q",
                             path(bad[i].cq), bad[i].ck ? "--cu-seqlens-kv" : "--device",
                             bad[i].ck ? path(bad[i].ck) : "native", NULL),
                         2);
        ck_assert_msg(strstr(err_text, bad[i].says), "%s", err_text);
        ck_assert(access(path("bad.npy"), F_OK) != 0 && access(path("badl.npy"), F_OK) != 0);
    }
    ck_assert_int_eq(run("forward", "--q", path("cq.npy"), in[2], in[3], in[4], in[5], "--out",
                         path("bad.npy"), "--lse-out", path("badl.npy"), NULL),
                     2);
    ck_assert_msg(strstr(err_text, "holds int32"), "%s", err_text);
    problem_free(&p);
    cleanup();
}
END_TEST

START_TEST(devices_and_demo)
{
    make_dir();
    ck_assert_int_eq(run("devices", NULL), 0);
    ck_assert(strstr(out_text, "native") != NULL);
    ck_assert_msg(strchr(out_text, '*') != NULL, "no device marked: %s", out_text);
    ck_assert(strstr(out_text, "auto picks") != NULL);
    ck_assert_int_eq(run("devices", "extra", NULL), 2);
    ck_assert_int_eq(run("demo", "--device", "native", NULL), 0);
    ck_assert_msg(strstr(out_text, "GFLOP/s") && strstr(out_text, ": ok"), "%s", out_text);
    ck_assert_int_eq(run("demo", "--device", "nope-nope", NULL), 2);
    cleanup();
}
END_TEST

/* clattn tune: bad input is refused before anything runs; on PoCL a
 * candidate is timed beside the table's shape, and the winner lands in
 * the tuning file (a fresh one, then replacing its own line), whole. */
START_TEST(tune_keeps_winner)
{
    make_dir();
    const char *file = path("cfg/tuning");
    ck_assert_int_eq(run("tune", "--variant", "blocked", "--head-dim", "16", NULL), 2);
    ck_assert_msg(strstr(err_text, "mma or tiled or auto"), "%s", err_text);
    ck_assert_int_eq(run("tune", "--variant", "auto", "--head-dim", "16", "--candidates",
                         "8,8,1,16", "--file", file, NULL),
                     2);
    ck_assert_msg(strstr(err_text, "not auto"), "%s", err_text);
    ck_assert_int_eq(run("tune", "--variant", "tiled", "--head-dim", "16", "--candidates",
                         "8,8,1", "--file", file, NULL),
                     2);
    ck_assert_msg(strstr(err_text, "ROWS,TILE,SPLIT,COLUMNS"), "%s", err_text);
    ck_assert_int_eq(run("tune", "--variant", "tiled", "--head-dim", "16", "--device", "native",
                         "--file", file, NULL),
                     2);
    ck_assert_msg(strstr(err_text, "native"), "%s", err_text);
    ck_assert_int_eq(run("devices", NULL), 0);
    if (!strstr(out_text, "opencl-cpu")) { /* no OpenCL CPU device here: nothing more to run */
        cleanup();
        return;
    }
    const char *shape[] = {"--device", "cpu", "--variant", "tiled", "--head-dim", "16",
                           "--q-seq", "40", "--heads", "2", "--reps", "1", "--rounds", "1"};
    ck_assert_msg(run("tune", shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                      shape[6], shape[7], shape[8], shape[9], shape[10], shape[11], shape[12],
                      shape[13], "--candidates", "8,8,1,16", "--write-best", "--file", file,
                      NULL) == 0,
                  "clattn tune failed: %s", err_text);
    ck_assert_msg(strstr(out_text, "(table)") && strstr(out_text, "8,8,1,16,0 ") &&
                      strstr(out_text, "max_error") && strstr(out_text, "kept in"),
                  "%s", out_text);
    char text[4096];
    slurp(file, text, sizeof text);
    ck_assert_msg(!strncmp(text, "clattn-tuning 1 ", 16) && strstr(text, "tiled\tf32\t16\t8,8,1,16,0\t"),
                  "%s", text);
    /* Again with another shape (micro-tiles of 4 rows): its line replaces
     * the first, once. */
    ck_assert_msg(run("tune", shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                      shape[6], shape[7], shape[8], shape[9], shape[10], shape[11], shape[12],
                      shape[13], "--candidates", "16,16,2,16,4", "--write-best", "--file", file,
                      NULL) == 0,
                  "clattn tune failed: %s", err_text);
    slurp(file, text, sizeof text);
    ck_assert_msg(strstr(text, "\t16,16,2,16,4\t") && !strstr(text, "8,8,1,16"), "%s", text);
    /* The backward alone: a tiled-backward line beside the tiled one. */
    ck_assert_msg(run("tune", shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                      shape[6], shape[7], shape[8], shape[9], shape[10], shape[11], shape[12],
                      shape[13], "--op", "backward", "--candidates", "8,8,1,16",
                      "--write-best", "--file", file, NULL) == 0,
                  "clattn tune failed: %s", err_text);
    slurp(file, text, sizeof text);
    ck_assert_msg(strstr(text, "\ntiled\tf32\t16\t16,16,2,16,4\t") &&
                      strstr(text, "\ntiled-backward\tf32\t16\t8,8,1,16,0\t"),
                  "%s", text);
    /* A dry run writes nothing. A shape that builds the kernels of one
     * timed before it (here: given twice; the table's own) is not timed as
     * a candidate of its own. */
    ck_assert_msg(run("tune", shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                      shape[6], shape[7], shape[8], shape[9], shape[10], shape[11], shape[12],
                      shape[13], "--candidates", "4,8,2,16 4,8,2,16 32,32,8,64,4",
                      "--write-best", "--dry-run", "--file", file, NULL) == 0,
                  "clattn tune failed: %s", err_text);
    ck_assert_msg(strstr(out_text, "4,8,2,16,0     builds the kernels of 4,8,2,16,0 here") &&
                      strstr(out_text, "32,32,8,64,4   builds the kernels of the table's shape"),
                  "%s", out_text);
    char after[4096];
    slurp(file, after, sizeof after);
    ck_assert_str_eq(after, text);
    /* auto: every variant the device runs timed per op (mma skipped here),
     * the fastest kept as the op's auto entry for the size class, beside
     * the shapes' lines. */
    ck_assert_int_eq(run("tune", shape[0], shape[1], "--variant", "auto", shape[4], shape[5],
                         shape[6], shape[7], shape[8], shape[9], shape[10], shape[11], shape[12],
                         shape[13], "--file", file, NULL),
                     0);
    ck_assert_msg(strstr(out_text, "forward (short):") && strstr(out_text, "backward (short):") &&
                      strstr(out_text, "  blocked ") && strstr(out_text, "  tiled ") &&
                      strstr(out_text, "best: forward,short="),
                  "%s", out_text);
    slurp(file, after, sizeof after);
    ck_assert_msg(strstr(after, "\nauto\tf32\t16\tforward,short=") &&
                      strstr(after, "\nauto\tf32\t16\tbackward,short=") &&
                      strstr(after, "\ntiled\tf32\t16\t16,16,2,16,4\t"),
                  "%s", after);
    ck_assert_int_eq(remove(file), 0);
    ck_assert_int_eq(rmdir(path("cfg")), 0);
    cleanup();
}
END_TEST

Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, help_and_usage);
    tcase_add_test(tc, grad_v_files);
    tcase_add_test(tc, grad_v_batched_masked);
    tcase_add_test(tc, offsets_and_merge);
    tcase_add_test(tc, forward_backward_files);
    tcase_add_test(tc, sixteen_bit_files);
    tcase_add_test(tc, causal_alignments);
    tcase_add_test(tc, packed_files);
    add_cli_modifier_tests(tc);
    tcase_add_test(tc, devices_and_demo);
    tcase_add_test(tc, tune_keeps_winner);
    add_cli_failure_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}

