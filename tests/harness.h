/* What the check suites share: the backend under test and its context. */
#ifndef CLATTN_TESTS_HARNESS_H
#define CLATTN_TESTS_HARNESS_H

#include <check.h>

#include "clattn.h"

/* The backend the kernel suite runs on: "native", "opencl-cpu" or
 * "opencl-gpu"; set by main before any test forks. */
extern const char *test_backend;

/* CLATTN_TEST_SHARD=K/N (0 <= K < N): the kernels suite's float32 case
 * registers only every N-th run of its loop tests, from the K-th, and its
 * tests of one run in every shard, so that N processes share it
 * (tools/device_run.sh on a GPU; the ASan run on PoCL takes one half).
 * Unset: N is 1. */
extern unsigned test_shard, test_shards;

/* test_backend as a device selector ("gpu", "cpu", "native") and as the
 * backend a context on it reports. */
const char *test_selector(void);
clattn_backend test_backend_kind(void);

/* A context on test_backend, created inside the (forked) test. */
clattn_context *test_context(const char *variant);

/* |got[i] - times * want[i]| <= tol for each of n floats of the output
 * `name`, `what` telling which result got is. */
void assert_scaled(const float *got, const float *want, double times, size_t n, double tol,
                   const char *name, const char *what);

/* The same with CLATTN_DEVICE_LIMITS set to limits while it is made
 * ("WG,LOCAL_BYTES": a smaller device). */
clattn_context *test_limited_context(const char *limits);

/* The same for a named variant, or NULL where the device cannot run it
 * (mma off NVIDIA tensor-core GPUs), after checking that the refusal says
 * so with CLATTN_ERROR_UNKNOWN_VARIANT. */
clattn_context *test_variant_context(const char *variant);

Suite *kernels_suite(void);
Suite *buffers_suite(void);
Suite *cache_suite(void);
Suite *faults_suite(void);
Suite *inject_suite(void);
Suite *api_suite(void);
Suite *cli_suite(void);
Suite *gradcheck_suite(void);
Suite *oclgrind_suite(void);
Suite *emulated_suite(void);
Suite *split_suite(void);
Suite *portable_suite(void);
Suite *train_suite(void);
/* A suite of one test case holding tests[0..n), with its timeout in
 * seconds (a cold PoCL compile alone can take seconds). */
Suite *case_suite(const char *suite, const char *tcase, double timeout,
                  const TTest *const *tests, size_t n);
/* Lines of the context's log that contain `what`. */
int log_lines(clattn_context *ctx, const char *what);
/* Adds the per-backend tests of check_training.c to the kernel suite. */
void add_training_tests(TCase *tc);

/* Asserts a status with its message on failure. */
#define ck_assert_status(expr, want)                                                    \
    do {                                                                                \
        clattn_status got_ = (expr);                                                    \
        ck_assert_msg(got_ == (want), "%s gave %s, want %s: %s", #expr,                 \
                      clattn_status_string(got_), clattn_status_string(want),           \
                      clattn_last_error());                                             \
    } while (0)

#endif
