/* The on-disk program cache: stored, loaded, damaged, unwritable, off,
 * bounded. */
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

    clattn_context *ctx = test_context(NULL);
    const char *log = clattn_context_log(ctx);
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
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, fresh);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The context's device as the tuning file keys it: "PLATFORM / DEVICE / DRIVER". */
static void device_key(clattn_context *ctx, char *key, size_t size)
{
    cl_device_id dev = NULL;
    cl_platform_id plat = NULL;
    char platform[128], name[128], driver[128];
    ck_assert_int_eq(clGetContextInfo(clattn_context_cl_context(ctx), CL_CONTEXT_DEVICES,
                                      sizeof dev, &dev, NULL),
                     CL_SUCCESS);
    ck_assert_int_eq(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL),
                     CL_SUCCESS);
    ck_assert_int_eq(clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof platform, platform, NULL),
                     CL_SUCCESS);
    ck_assert_int_eq(clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL), CL_SUCCESS);
    ck_assert_int_eq(clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof driver, driver, NULL),
                     CL_SUCCESS);
    snprintf(key, size, "%s / %s / %s", platform, name, driver);
}

static void write_text(const char *file, const char *text)
{
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

/* A tiled context on the test's device, with the log checked for `want`
 * (and not `unwanted`) and the ops at head_dim 16 against the reference. */
static void tiled_with_file(const char *want, const char *unwanted, uint64_t seed)
{
    clattn_context *ctx = test_context("tiled");
    const char *log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, want) && (!unwanted || !strstr(log, unwanted)), "%s", log);
    const shape_case c = {.q_seq = 21, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);
    check_ops(ctx, &s, 1.0f, seed);
    clattn_context_destroy(ctx);
}

/* The tuning file `clattn tune` writes: the device's entries replace the
 * table's shape in the kernels built; other devices' entries are left
 * alone; a stale or damaged file is ignored with a log line and never
 * fails a context. */
START_TEST(tuning_file)
{
    if (!strcmp(test_backend, "native"))
        return; /* native has no shapes to tune */
    char dir[] = "/tmp/clattn-tuning-XXXXXX", file[4096], text[4096], key[400];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/tuning", dir);
    setenv("CLATTN_CACHE_DIR", "off", 1); /* the build lines name the shapes */
    setenv("CLATTN_TUNING_FILE", "off", 1);
    unsetenv("CLATTN_TILED");
    unsetenv("CLATTN_TILED_BACKWARD");
    clattn_context *ctx = test_context("tiled");
    device_key(ctx, key, sizeof key);
    char api_key[400];
    ck_assert_status(clattn_context_tuning_key(ctx, api_key, sizeof api_key), CLATTN_OK);
    ck_assert_str_eq(api_key, key);
    clattn_context_destroy(ctx);
    setenv("CLATTN_TUNING_FILE", file, 1);

    /* This device's entry at head_dim 16, another device's, and this
     * device's under another driver. */
    char stem[400];
    snprintf(stem, sizeof stem, "%s", key);
    *strrchr(stem, '/') = '\0';
    snprintf(text, sizeof text,
             "clattn-tuning 1 %s\n# a comment\n\ntiled\tf32\t16\t8,8,1,16,2\t%s\n"
             "tiled\tf32\t16\t4,4,1,16\tOther / Device / 1.0\n"
             "tiled\tf32\t21\t4,4,1,32\t%s/ 0.0-other\n",
             clattn_version(), key, stem);
    write_text(file, text);
    tiled_with_file("tuning: tiled f32 head_dim 16: 8,8,1,16,2 from", "4,4,1", 11);
    ctx = test_context("tiled");
    ck_assert_msg(strstr(clattn_context_log(ctx), "under another driver (stale)"), "%s",
                  clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    /* The kernels at head_dim 16 are built with the file's shape (as far as
     * the device's limits let them be): micro-tiles of 2 rows. */
    ctx = test_context("tiled");
    const shape_case c = {.q_seq = 21, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);
    check_ops(ctx, &s, 1.0f, 12);
    ck_assert_msg(strstr(clattn_context_log(ctx), "-DHEAD_DIM=16 -DROWS=8 -DTILE=8 -DSPLIT=1 "
                                                  "-DDSPLIT=1 -DPER_ITEM=2"),
                  "%s", clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    /* CLATTN_TILED beats the file. */
    setenv("CLATTN_TILED", "4,4,2,16,0", 1);
    ctx = test_context("tiled");
    check_ops(ctx, &s, 1.0f, 13);
    ck_assert_msg(strstr(clattn_context_log(ctx), "-DHEAD_DIM=16 -DROWS=4 -DTILE=4 -DSPLIT=2"),
                  "%s", clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_TILED");
    /* A tiled-backward entry shapes the backward's kernels alone (the rows
     * layout here), the tiled entry the forward; CLATTN_TILED_BACKWARD
     * beats the first and leaves the second. */
    snprintf(text, sizeof text,
             "clattn-tuning 1 %s\ntiled\tf32\t16\t8,8,1,16,2\t%s\n"
             "tiled-backward\tf32\t16\t4,4,2,16,0\t%s\n",
             clattn_version(), key, key);
    write_text(file, text);
    ctx = test_context("tiled");
    check_ops(ctx, &s, 1.0f, 21);
    const char *log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "tuning: tiled-backward f32 head_dim 16: 4,4,2,16,0 from") &&
                      strstr(log, "-DROWS=8 -DTILE=8 -DSPLIT=1 -DDSPLIT=1 -DPER_ITEM=2") &&
                      strstr(log, "-DROWS=4 -DTILE=4 -DSPLIT=2 -DDSPLIT=1 -DPER_ITEM=0"),
                  "%s", log);
    clattn_context_destroy(ctx);
    setenv("CLATTN_TILED_BACKWARD", "8,8,2,16,4", 1);
    ctx = test_context("tiled");
    check_ops(ctx, &s, 1.0f, 22);
    log = clattn_context_log(ctx);
    ck_assert_msg(strstr(log, "-DROWS=8 -DTILE=8 -DSPLIT=1 -DDSPLIT=1 -DPER_ITEM=2") &&
                      strstr(log, "-DROWS=8 -DTILE=8 -DSPLIT=2 -DDSPLIT=1 -DPER_ITEM=4") &&
                      !strstr(log, "-DPER_ITEM=0"),
                  "%s", log);
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_TILED_BACKWARD");

    /* Stale: another clattn version's file. */
    snprintf(text, sizeof text, "clattn-tuning 1 0.0.0-other\ntiled\tf32\t16\t8,8,1,16\t%s\n",
             key);
    write_text(file, text);
    tiled_with_file("another clattn version (stale); the file is ignored", "8,8,1,16", 14);
    /* Damaged: not a tuning file, a bad shape, a missing field, a line too long. */
    write_text(file, "\x7f""ELF\x01\x02garbage\n");
    tiled_with_file("is not 'clattn-tuning 1 VERSION'; the file is ignored", "8,8,1,16", 15);
    snprintf(text, sizeof text,
             "clattn-tuning 1 %s\ntiled\tf32\t16\t8,8,1,16\t%s\ntiled\tf32\t16\t8,7,2,16\t%s\n",
             clattn_version(), key, key);
    write_text(file, text);
    tiled_with_file("line 3: not a tiled shape", "8,8,1,16,0 from", 16);
    snprintf(text, sizeof text, "clattn-tuning 1 %s\ntiled\tf32\t16\n", clattn_version());
    write_text(file, text);
    tiled_with_file("line 2: want VARIANT", "from", 17);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "clattn-tuning 1 %s\n", clattn_version());
    for (int i = 0; i < 3000; ++i)
        fputc('x', f);
    ck_assert_int_eq(fclose(f), 0);
    tiled_with_file("a line is too long", "from", 18);
    write_text(file, "");
    tiled_with_file("it is empty", "from", 19);
    /* No file at all: nothing to say. */
    remove(file);
    tiled_with_file("", "tuning:", 20);

    ck_assert_int_eq(rmdir(dir), 0);
    unsetenv("CLATTN_TUNING_FILE");
    unsetenv("CLATTN_CACHE_DIR");
}
END_TEST

/* The number of lines of file that start with `start`. */
static int lines_starting(const char *file, const char *start)
{
    char text[4096];
    int n = 0;
    FILE *f = fopen(file, "r");
    while (f && fgets(text, sizeof text, f))
        n += !strncmp(text, start, strlen(start));
    if (f)
        fclose(f);
    return n;
}

/* The tuning file's calls, which `clattn tune` makes: the path from the
 * environment, the device's key, and keeping an entry (checked as contexts
 * read it, replacing its own line, the file whole on failure), which a
 * context then reads; and the build options an op ran with. */
START_TEST(tuning_file_calls)
{
    if (!strcmp(test_backend, "native"))
        return;
    char dir[] = "/tmp/clattn-tuning-XXXXXX", file[4096], path[4096], want[4096], key[400];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("CLATTN_CACHE_DIR", "off", 1);
    unsetenv("CLATTN_TILED");
    unsetenv("CLATTN_TILED_BACKWARD");
    /* The path. */
    snprintf(file, sizeof file, "%s/sub/tuning", dir);
    setenv("CLATTN_TUNING_FILE", file, 1);
    ck_assert_status(clattn_tuning_file_path(path, sizeof path), CLATTN_OK);
    ck_assert_str_eq(path, file);
    ck_assert_status(clattn_tuning_file_path(path, 8), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_status(clattn_tuning_file_path(NULL, 8), CLATTN_ERROR_NULL_POINTER);
    setenv("CLATTN_TUNING_FILE", "off", 1);
    ck_assert_status(clattn_tuning_file_path(path, sizeof path), CLATTN_ERROR_INVALID_OPTION);
    unsetenv("CLATTN_TUNING_FILE");
    const char *xdg = getenv("XDG_CONFIG_HOME");
    char saved_xdg[4096] = "";
    if (xdg)
        snprintf(saved_xdg, sizeof saved_xdg, "%s", xdg);
    setenv("XDG_CONFIG_HOME", dir, 1);
    snprintf(want, sizeof want, "%s/clattn/tuning", dir);
    ck_assert_status(clattn_tuning_file_path(path, sizeof path), CLATTN_OK);
    ck_assert_str_eq(path, want);
    if (xdg)
        setenv("XDG_CONFIG_HOME", saved_xdg, 1);
    else
        unsetenv("XDG_CONFIG_HOME");
    setenv("CLATTN_TUNING_FILE", "off", 1);
    /* The key: an OpenCL device's, none on native. */
    clattn_context *ctx = test_context("tiled");
    ck_assert_status(clattn_context_tuning_key(ctx, key, sizeof key), CLATTN_OK);
    ck_assert_status(clattn_context_tuning_key(ctx, want, 4), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_status(clattn_context_tuning_key(NULL, want, 4), CLATTN_ERROR_NULL_POINTER);
    clattn_context_destroy(ctx);
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    ck_assert_status(clattn_context_tuning_key(ctx, want, sizeof want), CLATTN_ERROR_WRONG_BACKEND);
    ck_assert_str_eq(clattn_context_build_options(ctx), "");
    clattn_context_destroy(ctx);
    /* Entries a context would not take are refused, and nothing is written. */
    const struct {
        const char *variant, *shape, *key;
    } bad[] = {{"blocked", "8,8,1,16", key}, {"tiled", "8,7,2,16", key},
               {"mma", "4,1,64", key},       {"tiled", "8,8,1\t16", key},
               {"tiled", "8,8,1,16", ""},    {"tiled", "8,8,1,16", "a\nb"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        ck_assert_status(clattn_tuning_file_store(file, bad[i].variant, CLATTN_DTYPE_F32, 16,
                                                  bad[i].shape, bad[i].key),
                         CLATTN_ERROR_INVALID_OPTION);
        ck_assert_msg(strlen(clattn_last_error()) > 0, "entry %zu: no message", i);
    }
    ck_assert_int_ne(access(file, F_OK), 0);
    ck_assert_status(clattn_tuning_file_store(file, NULL, CLATTN_DTYPE_F32, 16, "8,8,1", key),
                     CLATTN_ERROR_NULL_POINTER);
    /* Kept: the folder made, another device's line and another head_dim's
     * kept beside it, its own line replaced. */
    ck_assert_status(clattn_tuning_file_store(file, "tiled", CLATTN_DTYPE_F32, 16, "4,4,1,16,0",
                                              "Other / Device / 1.0"),
                     CLATTN_OK);
    ck_assert_status(clattn_tuning_file_store(file, "tiled", CLATTN_DTYPE_F32, 16, "4,4,1,16,0",
                                              key),
                     CLATTN_OK);
    ck_assert_status(clattn_tuning_file_store(file, "tiled", CLATTN_DTYPE_F32, 32, "4,4,1,32,0",
                                              key),
                     CLATTN_OK);
    ck_assert_status(clattn_tuning_file_store(file, "tiled", CLATTN_DTYPE_F32, 16, "8,8,1,16,2",
                                              key),
                     CLATTN_OK);
    snprintf(want, sizeof want, "clattn-tuning 1 %s\n", clattn_version());
    ck_assert_int_eq(lines_starting(file, want), 1);
    ck_assert_int_eq(lines_starting(file, "tiled\tf32\t16\t"), 2);
    snprintf(want, sizeof want, "tiled\tf32\t16\t8,8,1,16,2\t%s\n", key);
    ck_assert_int_eq(lines_starting(file, want), 1);
    ck_assert_int_eq(lines_starting(file, "tiled\tf32\t32\t4,4,1,32,0\t"), 1);
    /* A file that cannot be written leaves the old one whole: its folder
     * is a file here. */
    snprintf(path, sizeof path, "%s/sub/tuning/inner", dir);
    ck_assert_status(clattn_tuning_file_store(path, "tiled", CLATTN_DTYPE_F32, 16, "8,8,1,16,2",
                                              key),
                     CLATTN_ERROR_IO);
    ck_assert_int_eq(lines_starting(file, "tiled\t"), 3);
    /* A context reads the entry, and its build options show the shape. */
    setenv("CLATTN_TUNING_FILE", file, 1);
    ctx = test_context("tiled");
    ck_assert_msg(strstr(clattn_context_log(ctx), "tuning: tiled f32 head_dim 16: 8,8,1,16,2"),
                  "%s", clattn_context_log(ctx));
    const shape_case c = {.q_seq = 21, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);
    check_ops(ctx, &s, 1.0f, 23);
    const char *options = clattn_context_build_options(ctx);
    size_t kernels = 1, seps = 0;
    for (const char *k = clattn_context_kernels(ctx); *k; ++k)
        kernels += *k == ',';
    for (const char *p = strstr(options, "; "); p; p = strstr(p + 2, "; "))
        ++seps;
    ck_assert_msg(strstr(options, "-DHEAD_DIM=16") && seps + 1 == kernels, "%s for %s", options,
                  clattn_context_kernels(ctx));
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_TUNING_FILE");
    unsetenv("CLATTN_CACHE_DIR");
    ck_assert_int_eq(remove(file), 0);
    snprintf(path, sizeof path, "%s/sub", dir);
    ck_assert_int_eq(rmdir(path), 0);
    snprintf(path, sizeof path, "%s/clattn", dir);
    rmdir(path); /* never made: the path is only computed */
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* Lines of the context's log that contain `what`. */
static int log_lines(clattn_context *ctx, const char *what)
{
    int n = 0;
    for (const char *p = clattn_context_log(ctx); (p = strstr(p, what)) != NULL; p += strlen(what))
        ++n;
    return n;
}

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

/* The default's choice (docs/tuning.md): a context made without a
 * variant runs each call on the variant a tuning file's `auto` entry names
 * for its dtype, head_dim, op and size class, and on its own otherwise; a
 * context given a variant runs that one. Entries are kept and refused as
 * the shapes' are. */
START_TEST(default_choice)
{
    if (!strcmp(test_backend, "native"))
        return;
    char dir[] = "/tmp/clattn-choice-XXXXXX", file[4096], text[4096], key[400];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/tuning", dir);
    setenv("CLATTN_TUNING_FILE", "off", 1);
    clattn_context *ctx = test_context(NULL);
    device_key(ctx, key, sizeof key);
    char own[32];
    snprintf(own, sizeof own, "%s", clattn_context_variant(ctx));
    clattn_context_destroy(ctx);
    /* Its own variant's name would choose nothing new: the other one. */
    const char *other = strcmp(own, "tiled") ? "tiled" : "blocked";
    snprintf(text, sizeof text,
             "clattn-tuning 1 %s\nauto\tf32\t16\tforward,short=%s\t%s\n"
             "auto\tf32\t16\tbackward,long=%s\t%s\n",
             clattn_version(), other, key, other, key);
    write_text(file, text);
    setenv("CLATTN_TUNING_FILE", file, 1);
    const shape_case c = {.q_seq = 21, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);
    char line[200];
    snprintf(line, sizeof line, "auto: %s at head_dim 16 (f32): the tuning file's auto entry",
             other);
    for (int named = 0; named < 2; ++named) {
        ctx = test_context(named ? own : NULL);
        snprintf(text, sizeof text, "tuning: auto f32 head_dim 16: forward,short=%s", other);
        ck_assert_msg(strstr(clattn_context_log(ctx), text), "%s", clattn_context_log(ctx));
        check_ops(ctx, &s, 1.0f, 31);
        /* The short forward on the other variant (a named one runs its
         * own), the backward (short) on its own. */
        ck_assert_msg(log_lines(ctx, line) == !named, "%s", clattn_context_log(ctx));
        ck_assert_str_eq(clattn_context_variant(ctx), own);
        clattn_context_destroy(ctx);
    }
    /* Kept: an auto entry replaces its own op and size class alone. */
    ck_assert_status(clattn_tuning_file_store(file, "auto", CLATTN_DTYPE_F32, 16,
                                              "forward,short=tiled", key),
                     CLATTN_OK);
    ck_assert_int_eq(lines_starting(file, "auto\tf32\t16\tforward,short=tiled\t"), 1);
    ck_assert_int_eq(lines_starting(file, "auto\tf32\t16\t"), 2);
    const char *bad[] = {"sideways,short=tiled", "forward,medium=tiled", "forward,short=tree",
                         "forward,short=nosuch", "forward,short", "forward,short=tiled,x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        ck_assert_status(clattn_tuning_file_store(file, "auto", CLATTN_DTYPE_F32, 16, bad[i], key),
                         CLATTN_ERROR_INVALID_OPTION);
        ck_assert_msg(strstr(clattn_last_error(), "OP,SIZE=VARIANT"), "%s: %s", bad[i],
                      clattn_last_error());
    }
    ck_assert_int_eq(lines_starting(file, "auto\t"), 2);
    /* A damaged auto entry: the whole file is ignored, as any damaged one. */
    snprintf(text, sizeof text, "clattn-tuning 1 %s\nauto\tf32\t16\tforward,short=tree\t%s\n",
             clattn_version(), key);
    write_text(file, text);
    ctx = test_context(NULL);
    ck_assert_msg(strstr(clattn_context_log(ctx), "line 2: an auto entry's shape is OP,SIZE"),
                  "%s", clattn_context_log(ctx));
    check_ops(ctx, &s, 1.0f, 32);
    ck_assert_int_eq(log_lines(ctx, "auto: "), 0);
    clattn_context_destroy(ctx);
    /* The built-in table, on an NVIDIA GPU of compute capability 9: a
     * float32 call at d128 past S 1024 runs tiled's kernels, a d64 backward
     * with few blocks of keys mma's. */
    setenv("CLATTN_TUNING_FILE", "off", 1);
    ctx = test_context(NULL);
    cl_device_id dev = NULL;
    cl_uint major = 0;
    ck_assert_int_eq(clGetContextInfo(clattn_context_cl_context(ctx), CL_CONTEXT_DEVICES,
                                      sizeof dev, &dev, NULL),
                     CL_SUCCESS);
    if (!strcmp(own, "mma") &&
        clGetDeviceInfo(dev, 0x4000 /* CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV */, sizeof major,
                        &major, NULL) == CL_SUCCESS &&
        major == 9) {
        const shape_case l = {.q_seq = 1100, .heads = 2, .kv_heads = 1, .head_dim = 128,
                              .causal = 1};
        clattn_shape ls = to_shape(&l);
        check_ops(ctx, &ls, 1.0f, 33);
        ck_assert_msg(strstr(clattn_context_kernels(ctx), "__tiled") &&
                          strstr(clattn_context_log(ctx), "auto: tiled at head_dim 128 (f32)"),
                      "%s: %s", clattn_context_kernels(ctx), clattn_context_log(ctx));
        /* A float32 d64 backward with few blocks of keys: mma's, its key
         * side in parts (the last call check_ops makes is a backward). */
        const shape_case f = {.q_seq = 256, .heads = 2, .kv_heads = 1, .head_dim = 64,
                              .causal = 1};
        clattn_shape fs = to_shape(&f);
        check_ops(ctx, &fs, 1.0f, 34);
        ck_assert_msg(strstr(clattn_context_kernels(ctx), "sum_parts__mma"), "%s",
                      clattn_context_kernels(ctx));
    }
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_TUNING_FILE");
    ck_assert_int_eq(remove(file), 0);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

Suite *cache_suite(void)
{
    const TTest *const tests[] = {program_cache, cache_bound, tuning_file, tuning_file_calls,
                                  local_buffers, default_choice};
    return case_suite("cache", "program_cache", 600, tests, 6);
}
