/* The command line on failure: bad input of every kind, a device that
 * fails, a file size limit, renames that fail; exit statuses, messages,
 * and outputs all written or none, nothing left behind. */
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

/* With several outputs, a failure at the last leaves none of them. */
START_TEST(multiple_outputs_all_or_nothing)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    const int before = count_entries();
    ck_assert_int_eq(run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--o", path("o.npy"), "--lse", path("lse.npy"),
                         "--d-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("nowhere/dv.npy"), "--device", "native",
                         NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("o2.npy"), "--lse-out",
                         path("nowhere/lse.npy"), "--device", "native", NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    /* V whose shape disagrees with K, and an O that is missing. */
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("q.npy"), "--out", path("o2.npy"), "--lse-out", path("l2.npy"),
                         NULL),
                     2);
    ck_assert_int_eq(run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--o", path("missing.npy"), "--lse", path("lse.npy"),
                         "--d-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("dv.npy"), NULL),
                     2);
    ck_assert_int_eq(run("backward", "--q", path("q.npy"), NULL), 2);
    ck_assert_int_eq(run("train", "--steps", "0", NULL), 2);
    ck_assert_int_eq(run("bench", "--op", "sideways", "--q-seq", "8", "--heads", "1",
                         "--head-dim", "4", NULL),
                     2);
    ck_assert_int_eq(run("bench", "--op", "forward", "--q-seq", "8", "--heads", "3",
                         "--kv-heads", "2", "--head-dim", "4", NULL),
                     2);
    ck_assert_int_eq(run("bench", "--op", "forward", "--q-seq", "8", "--heads", "1", NULL), 2);
    ck_assert_int_eq(run("bench", "--op", "forward", "--q-seq", "8", "--heads", "1",
                         "--head-dim", "4", "--reps", "0", NULL),
                     2);
    ck_assert_int_eq(run("train", "--steps", "x", NULL), 2);
    ck_assert_int_eq(count_entries(), before);
    problem_free(&p);
    cleanup();
}
END_TEST

/* Under a file size limit (ulimit -f) smaller than an output, the write
 * fails: the command reports it and exits 2, leaving nothing behind, rather
 * than dying by SIGXFSZ with a temporary file. */
START_TEST(file_size_limit_fails_cleanly)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    const int before = count_entries();
    run_file_limit = 256;
    const int rc = run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                       path("v.npy"), "--out", path("o2.npy"), "--lse-out", path("l2.npy"),
                       "--device", "native", NULL);
    run_file_limit = 0;
    ck_assert_msg(rc == 2, "exit %d; stderr: %s", rc, err_text);
    ck_assert_msg(strstr(err_text, "o2.npy") || strstr(err_text, "l2.npy"), "%s", err_text);
    ck_assert_int_eq(count_entries(), before);
    problem_free(&p);
    cleanup();
}
END_TEST


/* Whether two files hold the same bytes. */
/* A rename that fails after others succeeded (an immutable file, another
 * user's in a sticky folder; here tests/failrename fails dv.npy's): every
 * output is put back as it was, an input named as an output too, nothing
 * is left behind, and the message says what became of each. */
START_TEST(failed_rename_puts_everything_back)
{
    ck_assert_msg(getenv("CLATTN_FAILRENAME") != NULL, "CLATTN_FAILRENAME is not set");
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("o.npy"), "--lse-out", path("lse.npy"),
                         "--device", "native", NULL),
                     0);
    save_bytes("dk.npy", "not an array", 12);
    static char q_before[1 << 16], q_after[1 << 16];
    size_t nq, nq2;
    read_all(path("q.npy"), q_before, sizeof q_before, &nq);
    const int before = count_entries();
    run_fail_rename = "dv.npy";
    const int rc = run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                       path("v.npy"), "--o", path("o.npy"), "--lse", path("lse.npy"), "--d-out",
                       path("do.npy"), "--dq", path("q.npy"), "--dk", path("dk.npy"), "--dv",
                       path("dv.npy"), "--device", "native", NULL);
    run_fail_rename = NULL;
    ck_assert_msg(rc == 2, "exit %d; stderr: %s", rc, err_text);
    ck_assert_msg(strstr(err_text, "--dv") && strstr(err_text, "no output was written") &&
                      strstr(err_text, "--dq") && strstr(err_text, "restored as it was"),
                  "%s", err_text);
    read_all(path("q.npy"), q_after, sizeof q_after, &nq2);
    ck_assert(nq == nq2 && !memcmp(q_before, q_after, nq));
    char dk[64];
    size_t ndk;
    read_all(path("dk.npy"), dk, sizeof dk, &ndk);
    ck_assert(ndk == 12 && !memcmp(dk, "not an array", 12));
    ck_assert(!exists("dv.npy"));
    ck_assert_int_eq(count_entries(), before);
    problem_free(&p);
    cleanup();
}
END_TEST

/* Outputs take their places together or not at all: one that cannot (a
 * folder in its place) fails the call before any is written, so none is
 * left and an input named as an output is untouched; two outputs naming one
 * file are bad input; an output naming an input replaces it once the op is
 * done, from the input as it was. */
START_TEST(outputs_renamed_together)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    ck_assert_int_eq(mkdir(path("folder"), 0755), 0);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("o.npy"), "--lse-out", path("lse.npy"),
                         "--device", "native", NULL),
                     0);
    const int before = count_entries();
    ck_assert_int_eq(run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--o", path("o.npy"), "--lse", path("lse.npy"),
                         "--d-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("folder"), "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "--dv") && strstr(err_text, "folder"), "%s", err_text);
    ck_assert_int_eq(count_entries(), before);
    ck_assert_int_eq(run("merge", "--o", path("o.npy"), "--lse", path("lse.npy"), "--o2",
                         path("o.npy"), "--lse2", path("lse.npy"), "--out", path("m.npy"),
                         "--lse-out", path("folder"), NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    /* The input named as an output stays as it was. */
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("v.npy"), "--lse-out", path("folder"),
                         "--device", "native", NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    ck_assert(!exists("v.npy") || !same_bytes(path("v.npy"), path("o.npy")));
    /* Two outputs, one file: however it is spelled. */
    char dotted[600];
    snprintf(dotted, sizeof dotted, "%s/./x.npy", dir);
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("x.npy"), "--lse-out", dotted, "--device",
                         "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "same file"), "%s", err_text);
    ck_assert_int_eq(run("backward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--o", path("o.npy"), "--lse", path("lse.npy"),
                         "--d-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("x.npy"), "--dv", path("x.npy"), "--device", "native", NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    /* An output over its own input: O from Q as it was, as a run elsewhere
     * writes it. */
    ck_assert_int_eq(run("forward", "--q", path("q.npy"), "--k", path("k.npy"), "--v",
                         path("v.npy"), "--out", path("q.npy"), "--lse-out", path("l2.npy"),
                         "--device", "native", NULL),
                     0);
    ck_assert(same_bytes(path("q.npy"), path("o.npy")));
    ck_assert(same_bytes(path("l2.npy"), path("lse.npy")));
    ck_assert_int_eq(rmdir(path("folder")), 0);
    problem_free(&p);
    cleanup();
}
END_TEST

/* Every kind of bad input: exit 2, one line on stderr, and no output file,
 * not even a temporary; an existing output is left as it was. */
START_TEST(bad_input_leaves_nothing)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    /* Broken inputs beside the good ones. */
    save_bytes("text.npy", "this is not numpy\n", 18);
    FILE *f = fopen(path("q.npy"), "rb");
    unsigned char head[200];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    save_bytes("short.npy", head, n);
    unsigned char f8[128];
    memcpy(f8, head, 128);
    memcpy(strstr((char *)f8 + 10, "<f4"), "<f8", 3);
    save_bytes("f8.npy", f8, 128);
    unsigned char fortran[128];
    memcpy(fortran, head, 128);
    memcpy(strstr((char *)fortran + 10, "False"), "True ", 5);
    save_bytes("fortran.npy", fortran, 128);
    size_t odd[3] = {12, 2, 9};
    float zeros[12 * 2 * 9] = {0};
    save("k9.npy", odd, 3, zeros);
    size_t three[3] = {12, 3, 8};
    float more[12 * 3 * 8] = {0};
    save("k3.npy", three, 3, more);
    size_t seven[3] = {7, 2, 8};
    save("k7.npy", seven, 3, zeros);
    size_t batched[4] = {1, 12, 2, 8};
    save("k4.npy", batched, 4, zeros);
    save_bytes("keep.npy", "keep", 4);
    /* Headers that a search for substrings took (NumPy refuses each). */
    save_header("falsey.npy",
                "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (12, 2, 8), }", 192);
    save_header("elsewhere.npy",
                "{'x': \"'descr': '<f4'\", 'descr': '<f8', 'fortran_order': False, "
                "'shape': (12, 2, 8), }", 192);
    save_header("nodict.npy", "'descr': '<f4', 'fortran_order': False, 'shape': (12, 2, 8)",
                192);
    save_header("after.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (12, 2, 8)} x",
                192);
    ck_assert_int_eq(mkdir(path("folder.npy"), 0755), 0);
    const int before = count_entries();

    struct {
        const char *k, *extra[4];
    } cases[] = {
        {"missing.npy", {NULL}},    {"text.npy", {NULL}},       {"short.npy", {NULL}},
        {"f8.npy", {NULL}},         {"fortran.npy", {NULL}},    {"k9.npy", {NULL}},
        {"k3.npy", {NULL}},         {"k4.npy", {NULL}},         {"falsey.npy", {NULL}},
        {"elsewhere.npy", {NULL}},  {"nodict.npy", {NULL}},     {"after.npy", {NULL}},
        {"folder.npy", {NULL}},
        {"k.npy", {"--out", "", NULL}},
        {"k.npy", {"--window", "-1", NULL}},
        {"k.npy", {"--window", "3x", NULL}},
        {"k.npy", {"--window", "99999999999", NULL}},
        {"k.npy", {"--window-right", "4", NULL}}, /* without causal */
        {"k.npy", {"--scale", "0", NULL}},
        {"k.npy", {"--scale", "nan", NULL}},
        {"k.npy", {"--scale", "1e99", NULL}},
        {"k.npy", {"--scale", "1e-50", NULL}}, /* 0 in float32: not the default */
        {"k.npy", {"--scale", "1e-40", NULL}}, /* subnormal in float32 */
        {"k.npy", {"--scale", "", NULL}},
        {"k.npy", {"--window", NULL}},
        {"k.npy", {"--bogus", NULL}},
        {"k.npy", {"--variant", "no-such", NULL}},
        {"k.npy", {"--device", "1:", NULL}},
        {"k.npy", {"--device", "bogus", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const char *argv[24] = {"grad-v", "--q", path("q.npy"), "--k", path(cases[i].k),
                                "--d-out", path("do.npy"), "--lse", path("lse.npy"),
                                "--out", path("keep.npy"), "--device", "native"};
        int argc = 13;
        for (int j = 0; cases[i].extra[j]; ++j)
            argv[argc++] = cases[i].extra[j];
        int rc = run(argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[7],
                     argv[8], argv[9], argv[10], argv[11], argv[12], argv[13], argv[14],
                     argv[15], NULL);
        ck_assert_msg(rc == 2, "case %zu (%s %s) exit %d, stderr: %s", i, cases[i].k,
                      cases[i].extra[0] ? cases[i].extra[0] : "", rc, err_text);
        ck_assert_msg(lines(err_text) == 1, "case %zu: stderr is not one line: %s", i,
                      err_text);
        if (!strcmp(cases[i].k, "f8.npy") || !strcmp(cases[i].k, "elsewhere.npy"))
            /* the descr alone, not the header after it or another key's value */
            ck_assert_msg(strstr(err_text, "dtype is '<f8', want") != NULL ||
                              strstr(err_text, "key other than") != NULL,
                          "%s", err_text);
        if (!strcmp(cases[i].k, "folder.npy"))
            ck_assert_msg(strstr(err_text, "is a folder") != NULL, "%s", err_text);
        ck_assert_int_eq(count_entries(), before);
        char kept[8];
        slurp(path("keep.npy"), kept, sizeof kept);
        ck_assert_str_eq(kept, "keep");
    }
    /* A key given twice takes its last value, as in Python (and NumPy);
     * either quote is a string. */
    save_header("dup.npy",
                "{\"descr\": \"<f4\", 'fortran_order': False, 'shape': (1, 2, 3), "
                "'shape': (12, 2, 8)}",
                192);
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("dup.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                         "--device", "native", NULL),
                     0);
    unlink(path("dup.npy"));
    unlink(path("dv.npy"));
    /* A stream that is no .npy is refused from its first bytes, not read
     * until memory runs out. */
    ck_assert_int_eq(run("grad-v", "--q", "/dev/zero", "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                         "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "/dev/zero: not a .npy file"), "%s", err_text);
    /* A structured dtype is named whole; an LSE of the wrong rank says what
     * an LSE is. */
    static const char dict[] = "{'descr': [('a', '<f4')], 'fortran_order': False, "
                               "'shape': (12, 2, 8), }";
    unsigned char structured[128] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
    memset(structured + 10, ' ', 117);
    memcpy(structured + 10, dict, sizeof dict - 1);
    structured[127] = '\n';
    save_bytes("structured.npy", structured, 128);
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("structured.npy"),
                         "--d-out", path("do.npy"), "--lse", path("lse.npy"), "--out",
                         path("dv.npy"), "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "dtype is [('a', '<f4')], want"), "%s", err_text);
    unlink(path("structured.npy"));
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("k4.npy"), "--out", path("dv.npy"),
                         "--device", "native", NULL),
                     2);
    ck_assert_msg(strstr(err_text, "(seq, heads, 2)"), "%s", err_text);
    /* A required argument left out. */
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--lse",
                         path("lse.npy"), "--out", path("dv.npy"), NULL),
                     2);
    ck_assert(!exists("dv.npy"));
    /* An output folder that does not exist. */
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out",
                         path("nowhere/dv.npy"), "--device", "native", NULL),
                     2);
    ck_assert_int_eq(count_entries(), before);
    problem_free(&p);
    ck_assert_int_eq(rmdir(path("folder.npy")), 0);
    cleanup();
}
END_TEST

START_TEST(device_failure_exit_one)
{
    make_dir();
    clattn_shape s = cli_shape();
    problem p;
    write_problem(&p, &s, 0);
    /* A selector that matches no device is bad input. */
    ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                         path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                         "--device", "no-such-device-anywhere", NULL),
                     2);
    ck_assert(!exists("dv.npy"));
    ck_assert(strstr(err_text, "CLATTN_ERROR_DEVICE_NOT_FOUND") != NULL);
    /* A device that fails (its compiler refuses every variant's kernels,
     * so that auto has none to move on to) is exit 1. */
    clattn_device_info devs[16];
    size_t n = 0;
    int cpu = 0;
    ck_assert_int_eq(clattn_list_devices(devs, 16, &n), CLATTN_OK);
    for (size_t i = 0; i < n && i < 16; ++i)
        cpu |= devs[i].backend == CLATTN_BACKEND_OPENCL_CPU;
    if (cpu) {
        setenv("CLATTN_CL_OPTIONS", "-Dfloat=no_such_type", 1);
        ck_assert_int_eq(run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                             path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                             "--device", "cpu", NULL),
                         1);
        unsetenv("CLATTN_CL_OPTIONS");
        ck_assert(!exists("dv.npy"));
        ck_assert(strstr(err_text, "CLATTN_ERROR_BUILD_FAILED") != NULL);
        /* A device allocation that fails (a small one: the device is out of
         * memory, not the input too large) is exit 1 too. */
        ck_assert_msg(getenv("CLATTN_FAULTCL") != NULL, "CLATTN_FAULTCL is not set");
        run_fault = "clCreateBuffer";
        const int rc = run("grad-v", "--q", path("q.npy"), "--k", path("k.npy"), "--d-out",
                           path("do.npy"), "--lse", path("lse.npy"), "--out", path("dv.npy"),
                           "--device", "cpu", NULL);
        run_fault = NULL;
        ck_assert_msg(rc == 1 && strstr(err_text, "CLATTN_ERROR_OPENCL") &&
                          strstr(err_text, "clCreateBuffer"),
                      "exit %d: %s", rc, err_text);
        ck_assert(!exists("dv.npy"));
    }
    problem_free(&p);
    cleanup();
}

/* The failure tests, for cli_suite(). */
void add_cli_failure_tests(TCase *tc)
{
    tcase_add_test(tc, multiple_outputs_all_or_nothing);
    tcase_add_test(tc, file_size_limit_fails_cleanly);
    tcase_add_test(tc, failed_rename_puts_everything_back);
    tcase_add_test(tc, outputs_renamed_together);
    tcase_add_test(tc, bad_input_leaves_nothing);
    tcase_add_test(tc, device_failure_exit_one);
}
