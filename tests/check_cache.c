/* The on-disk program cache: stored, loaded, damaged, unwritable, off,
 * bounded; local buffers as the host sizes them. The cache suite, with
 * check_tuning.c's tests. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CL_TARGET_OPENCL_VERSION 120
#include "clattn_cl.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

/* The .bin files of a cache folder: how many, and each damaged in the
 * middle when damage is set. */
static int cache_files(const char *dir, int damage)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 4, ".bin"))
            continue;
        ++n;
        if (!damage)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r+b");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
        const long size = ftell(f);
        ck_assert_int_eq(fseek(f, size / 2, SEEK_SET), 0);
        ck_assert_int_eq(fputc(0x5a ^ (int)(size & 0xff), f) != EOF, 1);
        ck_assert_int_eq(fclose(f), 0);
    }
    closedir(d);
    return n;
}

/* Programs built once: a second context on the device loads them from the
 * on-disk cache; a damaged file, an unwritable folder or the cache turned
 * off fall back on the compiler, and every context computes the same. */
START_TEST(program_cache)
{
    if (!strcmp(test_backend, "native"))
        return; /* native builds nothing */
    char dir[] = "/tmp/clattn-cache-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("CLATTN_CACHE_DIR", dir, 1);
    const shape_case c = {.q_seq = 20, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);

    /* PoCL keeps its own cache: clattn stores nothing there unless asked. */
    clattn_context *ctx = test_context(NULL);
    const char *log = clattn_context_log(ctx);
    if (strstr(clattn_context_device(ctx), "Portable Computing Language")) {
        ck_assert_msg(strstr(log, "compiled") && !strstr(log, "program cache"), "%s", log);
        ck_assert_int_eq(cache_files(dir, 0), 0);
    }
    clattn_context_destroy(ctx);
    clattn_options o = clattn_options_default();
    o.device = test_selector();
    setenv("CLATTN_CACHE_POCL", "yes", 1); /* 0 or 1 */
    ctx = NULL;
    ck_assert_int_eq(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "CLATTN_CACHE_POCL='yes'"));
    setenv("CLATTN_CACHE_POCL", "1", 1);

    ctx = test_context(NULL);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "stored in the program cache") && !strstr(log, "loaded"), "%s",
                  log);
    check_ops(ctx, &s, 1.0f, 7);
    clattn_context_destroy(ctx);
    const int files = cache_files(dir, 0);
    ck_assert_int_ge(files, 1);

    ctx = test_context(NULL);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "loaded from the program cache") && !strstr(log, "compiled"),
                  "%s", log);
    check_ops(ctx, &s, 1.0f, 8);
    clattn_context_destroy(ctx);
    ck_assert_int_eq(cache_files(dir, 0), files);

    ck_assert_int_eq(cache_files(dir, 1), files);
    ctx = test_context(NULL);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "stored in the program cache") && !strstr(log, "loaded"), "%s",
                  log);
    check_ops(ctx, &s, 1.0f, 9);
    clattn_context_destroy(ctx);
    ctx = test_context(NULL); /* the rewritten files load again */
    ck_assert_msg(strstr(clattn_context_log(ctx), "loaded from the program cache"), "%s",
                  clattn_context_log(ctx));
    clattn_context_destroy(ctx);

    /* A folder that cannot be made: under a regular file. */
    char blocked[4096];
    snprintf(blocked, sizeof blocked, "%s/file", dir);
    FILE *f = fopen(blocked, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    strcat(blocked, "/sub");
    setenv("CLATTN_CACHE_DIR", blocked, 1);
    ctx = test_context(NULL);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "compiled") && !strstr(log, "program cache"), "%s", log);
    check_ops(ctx, &s, 1.0f, 10);
    clattn_context_destroy(ctx);

    setenv("CLATTN_CACHE_DIR", "off", 1);
    ctx = test_context(NULL);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "compiled") && !strstr(log, "program cache"), "%s", log);
    clattn_context_destroy(ctx);
    ck_assert_int_eq(cache_files(dir, 0), files);

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    unsetenv("CLATTN_CACHE_DIR");
    unsetenv("CLATTN_CACHE_POCL");
}
END_TEST

/* A file of `size` bytes at dir/name, last modified `age` seconds ago. */
static void make_file(const char *dir, const char *name, long size, long age)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (long i = 0; i < size; ++i)
        ck_assert_int_ne(fputc((int)(i & 0xff), f), EOF);
    ck_assert_int_eq(fclose(f), 0);
    const struct timespec when[2] = {{time(NULL) - age, 0}, {time(NULL) - age, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
}

/* Seconds since dir/name was last modified; -1 where it is gone. */
static long age_of(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) ? -1 : (long)(time(NULL) - st.st_mtime);
}

/* The cache's programs (16 hex digits and .bin): how many, their bytes,
 * the oldest one's age in seconds (before `age`), and each made `age`
 * seconds old where age >= 0. */
static int programs(const char *dir, long *bytes, long *oldest, long age)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    *bytes = *oldest = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t len = strlen(e->d_name);
        if (len != 20 || strcmp(e->d_name + 16, ".bin"))
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ck_assert_int_eq(stat(path, &st), 0);
        ++n;
        *bytes += (long)st.st_size;
        if (time(NULL) - st.st_mtime > *oldest)
            *oldest = (long)(time(NULL) - st.st_mtime);
        if (age >= 0) {
            const struct timespec when[2] = {{time(NULL) - age, 0}, {time(NULL) - age, 0}};
            ck_assert_int_eq(utimensat(AT_FDCWD, path, when, 0), 0);
        }
    }
    closedir(d);
    return n;
}

/* CLATTN_CACHE_MAX_MB: a store removes the least recently used programs
 * past the bound, never the one it stored nor a file not the cache's; a
 * load marks a program recently used; a bound that is not a whole number
 * of MiB is refused with its name. */
START_TEST(cache_bound)
{
    if (!strcmp(test_backend, "native"))
        return;
    char dir[] = "/tmp/clattn-bound-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("CLATTN_CACHE_DIR", dir, 1);
    setenv("CLATTN_CACHE_POCL", "1", 1);
    /* Programs of older sources (600 KiB each, oldest first) and a file of
     * someone else's, older than all of them. */
    make_file(dir, "00000000000000a1.bin", 600l << 10, 3000);
    make_file(dir, "00000000000000a2.bin", 600l << 10, 2000);
    make_file(dir, "00000000000000a3.bin", 600l << 10, 1000);
    make_file(dir, "notes.txt", 2l << 20, 4000);
    setenv("CLATTN_CACHE_MAX_MB", "1", 1);
    clattn_context *ctx = test_context(NULL);
    ck_assert_msg(strstr(clattn_context_log(ctx), "stored in the program cache"), "%s",
                  clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    /* 1.8 MiB of old programs and the new ones: a1 and a2 went first */
    ck_assert_int_eq(age_of(dir, "00000000000000a1.bin"), -1);
    ck_assert_int_eq(age_of(dir, "00000000000000a2.bin"), -1);
    ck_assert_int_ge(age_of(dir, "notes.txt"), 3990);
    long bytes, oldest;
    const int left = programs(dir, &bytes, &oldest, -1);
    ck_assert_msg(left >= 1 && (bytes <= 1l << 20 || left == 1), "%d programs, %ld bytes", left,
                  bytes);

    /* No bound (0): every program made old, then loaded, is recent again. */
    setenv("CLATTN_CACHE_MAX_MB", "0", 1);
    char fresh[] = "/tmp/clattn-bound-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(fresh));
    setenv("CLATTN_CACHE_DIR", fresh, 1);
    clattn_context_destroy(test_context(NULL));
    const int stored = programs(fresh, &bytes, &oldest, 5000);
    ck_assert_int_ge(stored, 1);
    ctx = test_context(NULL);
    ck_assert_msg(strstr(clattn_context_log(ctx), "loaded from the program cache") &&
                      !strstr(clattn_context_log(ctx), "compiled"),
                  "%s", clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    ck_assert_int_eq(programs(fresh, &bytes, &oldest, -1), stored);
    ck_assert_int_lt(oldest, 600);

    static const char *const bad[] = {"", "lots", "-1", "1.5", "99999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        setenv("CLATTN_CACHE_MAX_MB", bad[i], 1);
        clattn_options o = clattn_options_default();
        o.device = test_selector();
        ctx = NULL;
        ck_assert_int_eq(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
        ck_assert_ptr_null(ctx);
        ck_assert_ptr_nonnull(strstr(clattn_last_error(), "CLATTN_CACHE_MAX_MB="));
    }
    unsetenv("CLATTN_CACHE_MAX_MB");
    unsetenv("CLATTN_CACHE_DIR");
    unsetenv("CLATTN_CACHE_POCL");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, fresh);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Each laid-out local buffer (tiled's and mma's) as the host sizes it,
 * against the compiler's figure for the same layout (CLATTN_LOCAL_PROBE:
 * the build refuses a kernel given less than its layout): tiled in its
 * rows and micro-tile layouts at two head_dims, and mma (emulated on the
 * CPU device) on mma.sync in float32 and wgmma in bf16. */
START_TEST(local_buffers)
{
    if (!strcmp(test_backend, "native"))
        return; /* no local memory */
    setenv("CLATTN_LOCAL_PROBE", "1", 1);
    const struct {
        const char *variant, *tiled, *tiled_backward;
        uint32_t head_dim;
        clattn_dtype dtype;
        int wgmma;
    } runs[] = {
        {"tiled", "16,8,2,16,0", "12,8,4,64,3", 40, CLATTN_DTYPE_F32, 0},
        {"tiled", "12,8,4,64,3", "16,8,2,16,0", 128, CLATTN_DTYPE_BF16, 0},
        {"mma", NULL, NULL, 64, CLATTN_DTYPE_F32, 0},
        {"mma", NULL, NULL, 64, CLATTN_DTYPE_BF16, 1},
    };
    const int emulate = !strcmp(test_backend, "opencl-cpu");
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; ++i) {
        if (runs[i].tiled) {
            setenv("CLATTN_TILED", runs[i].tiled, 1);
            setenv("CLATTN_TILED_BACKWARD", runs[i].tiled_backward, 1);
        } else {
            unsetenv("CLATTN_TILED");
            unsetenv("CLATTN_TILED_BACKWARD");
        }
        setenv("CLATTN_MMA_EMULATE", emulate ? "1" : "0", 1);
        setenv("CLATTN_MMA_WGMMA", runs[i].wgmma ? "1" : "0", 1);
        clattn_options o = clattn_options_default();
        o.backend = test_backend_kind();
        o.variant = runs[i].variant;
        clattn_context *ctx = NULL;
        const clattn_status st = clattn_context_create(&o, &ctx);
        if (st == CLATTN_ERROR_UNKNOWN_VARIANT) /* mma on a GPU other than NVIDIA's */
            continue;
        ck_assert_status(st, CLATTN_OK);
        const shape_case c = {.q_seq = 33, .heads = 2, .kv_heads = 1,
                              .head_dim = runs[i].head_dim, .causal = 1};
        clattn_shape s = to_shape(&c);
        s.dtype = runs[i].dtype;
        if (s.dtype == CLATTN_DTYPE_F32)
            check_ops(ctx, &s, 1.0f, 41 + i);
        else
            check_ops_16(ctx, &s, 1.0f, 41 + i);
        /* the forward, and the backward's key side and grad-Q at least */
        ck_assert_msg(log_lines(ctx, "local buffer of") >= 3, "run %zu: %s", i,
                      clattn_context_log(ctx));
        clattn_context_destroy(ctx);
    }
    unsetenv("CLATTN_LOCAL_PROBE");
}
END_TEST

Suite *cache_suite(void)
{
    const tuning_tests t = get_tuning_tests();
    const TTest *const tests[] = {program_cache, cache_bound,   t.file,
                                  t.calls,       local_buffers, t.choice};
    return case_suite("cache", "program_cache", 600, tests, 6);
}
