/* Runs one suite: clattn_tests --suite NAME [--backend NAME].
 * The kernel and train suites on an OpenCL backend that this machine lacks exits 77,
 * which ctest reports as skipped, unless CLATTN_REQUIRE_BACKENDS names it:
 * then its absence is a failure. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

enum { EXIT_SKIP = 77 };

const char *test_backend = "native";
unsigned test_shard = 0, test_shards = 1;

/* "rusticl" is Mesa's OpenCL on llvmpipe (RUSTICL_ENABLE=llvmpipe), an
 * OpenCL CPU device picked by its name. */
const char *test_selector(void)
{
    return !strcmp(test_backend, "opencl-gpu")   ? "gpu"
           : !strcmp(test_backend, "opencl-cpu") ? "cpu"
           : !strcmp(test_backend, "rusticl")    ? "llvmpipe"
                                                 : "native";
}

clattn_backend test_backend_kind(void)
{
    return !strcmp(test_backend, "opencl-gpu") ? CLATTN_BACKEND_OPENCL_GPU
           : !strcmp(test_backend, "opencl-cpu") || !strcmp(test_backend, "rusticl")
               ? CLATTN_BACKEND_OPENCL_CPU
               : CLATTN_BACKEND_NATIVE;
}

clattn_context *test_context(const char *variant)
{
    clattn_options o = clattn_options_default();
    o.device = test_selector();
    o.variant = variant;
    clattn_context *ctx = NULL;
    clattn_status st = clattn_context_create(&o, &ctx);
    ck_assert_msg(st == CLATTN_OK, "context on %s: %s: %s", test_backend,
                  clattn_status_string(st), clattn_last_error());
    ck_assert_int_eq(clattn_context_backend(ctx), test_backend_kind());
    return ctx;
}

void assert_scaled(const float *got, const float *want, double times, size_t n, double tol,
                   const char *name, const char *what)
{
    for (size_t i = 0; i < n; ++i)
        ck_assert_msg(fabs((double)got[i] - times * want[i]) <= tol,
                      "on %s: %s[%zu] %s is %g, want %g", test_backend, name, i, what,
                      (double)got[i], times * want[i]);
}

clattn_context *test_limited_context(const char *limits)
{
    const char *was = getenv("CLATTN_DEVICE_LIMITS");
    char *saved = was ? strdup(was) : NULL;
    setenv("CLATTN_DEVICE_LIMITS", limits, 1);
    clattn_context *ctx = test_context(NULL);
    if (saved)
        setenv("CLATTN_DEVICE_LIMITS", saved, 1);
    else
        unsetenv("CLATTN_DEVICE_LIMITS");
    free(saved);
    return ctx;
}

clattn_context *test_variant_context(const char *variant)
{
    clattn_options o = clattn_options_default();
    o.device = test_selector();
    o.variant = variant;
    clattn_context *ctx = NULL;
    clattn_status st = clattn_context_create(&o, &ctx);
    if (st == CLATTN_ERROR_UNKNOWN_VARIANT && !strcmp(variant, "mma") &&
        strstr(clattn_last_error(), "needs an NVIDIA GPU")) {
        ck_assert_ptr_null(ctx);
        return NULL;
    }
    ck_assert_msg(st == CLATTN_OK, "context on %s, variant %s: %s: %s", test_backend, variant,
                  clattn_status_string(st), clattn_last_error());
    ck_assert_int_eq(clattn_context_backend(ctx), test_backend_kind());
    return ctx;
}

/* Whether a device of the backend exists and builds the kernels. Asked in a
 * child process, so that the parent, which forks every test, never starts
 * an OpenCL driver. Prints why not. */
static int backend_present(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        clattn_context *ctx = NULL;
        clattn_options o = clattn_options_default();
        o.device = test_selector();
        clattn_status st = clattn_context_create(&o, &ctx);
        if (st != CLATTN_OK)
            printf("no %s backend here: %s: %s\n", test_backend, clattn_status_string(st),
                   clattn_last_error());
        else
            printf("%s runs on %s\n", test_backend, clattn_context_device(ctx));
        clattn_context_destroy(ctx);
        fflush(stdout);
        _exit(st == CLATTN_OK ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int required(const char *backend)
{
    const char *req = getenv("CLATTN_REQUIRE_BACKENDS");
    if (!req)
        return 0;
    size_t n = strlen(backend);
    for (const char *p = req; (p = strstr(p, backend)) != NULL; p += n)
        if ((p == req || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

Suite *case_suite(const char *suite, const char *tcase, double timeout,
                  const TTest *const *tests, size_t n)
{
    Suite *s = suite_create(suite);
    TCase *tc = tcase_create(tcase);
    tcase_set_timeout(tc, timeout);
    for (size_t i = 0; i < n; ++i)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return s;
}

int log_lines(clattn_context *ctx, const char *what)
{
    int n = 0;
    for (const char *p = clattn_context_log(ctx); (p = strstr(p, what)) != NULL; p += strlen(what))
        ++n;
    return n;
}

int main(int argc, char **argv)
{
    const char *suite_name = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--suite"))
            suite_name = argv[i + 1];
        else if (!strcmp(argv[i], "--backend"))
            test_backend = argv[i + 1];
    }
    const char *shard = getenv("CLATTN_TEST_SHARD");
    if (shard && *shard) {
        char end;
        if (sscanf(shard, "%u/%u%c", &test_shard, &test_shards, &end) != 2 || !test_shards ||
            test_shard >= test_shards) {
            fprintf(stderr, "CLATTN_TEST_SHARD='%s': want K/N with 0 <= K < N\n", shard);
            return 2;
        }
    }
    Suite *suite = NULL;
    if (suite_name && !strcmp(suite_name, "kernels"))
        suite = kernels_suite();
    else if (suite_name && !strcmp(suite_name, "api"))
        suite = api_suite();
    else if (suite_name && !strcmp(suite_name, "cli"))
        suite = cli_suite();
    else if (suite_name && !strcmp(suite_name, "gradcheck"))
        suite = gradcheck_suite();
    else if (suite_name && !strcmp(suite_name, "train"))
        suite = train_suite();
    else if (suite_name && !strcmp(suite_name, "oclgrind"))
        suite = oclgrind_suite();
    else if (suite_name && !strcmp(suite_name, "emulated"))
        suite = emulated_suite();
    else if (suite_name && !strcmp(suite_name, "split"))
        suite = split_suite();
    else if (suite_name && !strcmp(suite_name, "portable"))
        suite = portable_suite();
    else if (suite_name && !strcmp(suite_name, "buffers"))
        suite = buffers_suite();
    else if (suite_name && !strcmp(suite_name, "cache"))
        suite = cache_suite();
    else if (suite_name && !strcmp(suite_name, "faults"))
        suite = faults_suite();
    else if (suite_name && !strcmp(suite_name, "inject"))
        suite = inject_suite();
    if (!suite || (strcmp(test_backend, "native") && strcmp(test_backend, "opencl-cpu") &&
                   strcmp(test_backend, "opencl-gpu") && strcmp(test_backend, "rusticl"))) {
        fprintf(stderr,
                "usage: %s --suite kernels|buffers|cache|faults|inject|train|oclgrind|emulated|split|"
                "portable|api|cli|gradcheck "
                "[--backend native|opencl-cpu|opencl-gpu|rusticl]\n",
                argv[0]);
        return 2;
    }
    const int per_backend = !strcmp(suite_name, "kernels") || !strcmp(suite_name, "train") ||
                            !strcmp(suite_name, "oclgrind") || !strcmp(suite_name, "emulated") ||
                            !strcmp(suite_name, "split") || !strcmp(suite_name, "portable") ||
                            !strcmp(suite_name, "buffers") ||
                            !strcmp(suite_name, "cache") || !strcmp(suite_name, "faults") ||
                            !strcmp(suite_name, "inject");
    if (per_backend && strcmp(test_backend, "native") &&
        !backend_present()) {
        if (required(test_backend)) {
            printf("FAIL: CLATTN_REQUIRE_BACKENDS names %s, which is absent\n", test_backend);
            return 1;
        }
        printf("SKIP: %s\n", test_backend);
        return EXIT_SKIP;
    }
    /* A run for one level of the native hot loops (ctest kernels.native-v3
     * and -baseline): that level must be the one that runs, or the run is
     * skipped where the CPU lacks it. */
    const char *level = getenv("CLATTN_NATIVE_LEVEL");
    if (per_backend && !strcmp(test_backend, "native") && level && *level) {
        clattn_context *ctx = NULL;
        clattn_options o = clattn_options_default();
        o.device = "native";
        if (clattn_context_create(&o, &ctx) != CLATTN_OK) {
            printf("FAIL: %s\n", clattn_last_error());
            return 1;
        }
        char want[64];
        snprintf(want, sizeof want, ", %s%s code", strcmp(level, "baseline") ? "x86-64-" : "",
                 level);
        const int runs = strstr(clattn_context_device(ctx), want) != NULL;
        printf("native runs on %s\n", clattn_context_device(ctx));
        clattn_context_destroy(ctx);
        if (!runs) {
            printf("SKIP: this CPU has no %s\n", level);
            return EXIT_SKIP;
        }
    }
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}
