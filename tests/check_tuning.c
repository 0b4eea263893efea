/* The tuning file `clattn tune` writes (shapes and `auto` entries) and the
 * default's choice of variant; the cache suite runs them. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CL_TARGET_OPENCL_VERSION 120
#include "clattn_cl.h"
#include "harness.h"
#include "kernel_tests.h"
#include "numerics.h"
#include "reference.h"

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

tuning_tests get_tuning_tests(void)
{
    tuning_tests t = {tuning_file, tuning_file_calls, default_choice};
    return t;
}
