/* The on-disk program cache: stored, loaded, damaged, unwritable, off. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
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
    const shape_case c = {1, 20, 20, 2, 1, 16, 1, 0, 0, 1};
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

Suite *cache_suite(void)
{
    const TTest *const tests[] = {program_cache};
    return case_suite("cache", "program_cache", 600, tests, 1);
}
