/* The CLI tests' harness: a fresh folder, running the clattn program
 * (CLATTN_CLI) with its output kept, and .npy files in and out. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_harness.h"
#include "harness.h"
#include "npy.h"
#include "reference.h"

char dir[256];
char out_text[65536], err_text[65536];

void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/clattn-cli-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

const char *path(const char *name)
{
    static char buf[16][512]; /* one call may hold several */
    static int i;
    i = (i + 1) % 16;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

void slurp(const char *file, char *text, size_t size)
{
    FILE *f = fopen(file, "rb");
    size_t n = f ? fread(text, 1, size - 1, f) : 0;
    text[n] = '\0';
    if (f)
        fclose(f);
}

rlim_t run_file_limit;
const char *run_fail_rename;
const char *run_fault;

int run(const char *arg0, ...)
{
    const char *cli = getenv("CLATTN_CLI");
    ck_assert_msg(cli != NULL, "CLATTN_CLI is not set");
    const char *argv[64];
    int argc = 0;
    argv[argc++] = cli;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char out_file[512], err_file[512];
    snprintf(out_file, sizeof out_file, "%s/.stdout", dir);
    snprintf(err_file, sizeof err_file, "%s/.stderr", dir);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(out_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        if (run_file_limit) {
            const struct rlimit r = {run_file_limit, run_file_limit};
            setrlimit(RLIMIT_FSIZE, &r);
        }
        if (run_fail_rename) {
            setenv("LD_PRELOAD", getenv("CLATTN_FAILRENAME"), 1);
            setenv("FAILRENAME_TO", run_fail_rename, 1);
        }
        if (run_fault) {
            setenv("LD_PRELOAD", getenv("CLATTN_FAULTCL"), 1);
            setenv("FAULTCL_FAIL", run_fault, 1);
        }
        execv(cli, (char *const *)argv);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    slurp(out_file, out_text, sizeof out_text);
    slurp(err_file, err_text, sizeof err_text);
    unlink(out_file);
    unlink(err_file);
    ck_assert_msg(WIFEXITED(status), "clattn died by a signal; stderr: %s", err_text);
    return WEXITSTATUS(status);
}

void save(const char *name, const size_t *shape, int ndim, const float *data)
{
    char tmp[600], err[256];
    ck_assert_msg(npy_write_temp(path(name), shape, ndim, "<f4", data, tmp, sizeof tmp, err,
                                 sizeof err) == 0 &&
                      npy_commit(tmp, path(name), err, sizeof err) == 0,
                  "%s", err);
}

void save_bytes(const char *name, const void *bytes, size_t n)
{
    FILE *f = fopen(path(name), "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* A .npy file with this header dict (padded as NumPy pads it) and n zero
 * floats of data. */
void save_header(const char *name, const char *dict, size_t n)
{
    unsigned char buf[512 + 12 * 2 * 8 * sizeof(float)] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    size_t len = strlen(dict), total = (10 + len + 1 + 63) / 64 * 64;
    ck_assert(total <= 512 && n <= 12 * 2 * 8);
    buf[8] = (unsigned char)((total - 10) & 0xFF);
    buf[9] = (unsigned char)((total - 10) >> 8);
    memset(buf + 10, ' ', total - 10);
    memcpy(buf + 10, dict, len);
    buf[total - 1] = '\n';
    memset(buf + total, 0, n * sizeof(float));
    save_bytes(name, buf, total + n * sizeof(float));
}

int exists(const char *name)
{
    struct stat st;
    return stat(path(name), &st) == 0;
}

/* Only the files a test wrote itself: no temporaries, no outputs. */
int count_entries(void)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            ++n;
    closedir(d);
    return n;
}

/* Removes the test's folder and everything in it. */
void cleanup(void)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(path(e->d_name));
    closedir(d);
    rmdir(dir);
}

int lines(const char *text)
{
    int n = 0;
    for (; *text; ++text)
        n += *text == '\n';
    return n;
}

/* Writes q.npy, k.npy, v.npy, o.npy, do.npy and lse.npy for the shape
 * (batched: 4-D). */
void write_problem(problem *p, const clattn_shape *s, int batched)
{
    problem_make(p, s, 21, 1.0f);
    size_t qs[4] = {s->batch, s->q_seq, s->num_heads, s->head_dim};
    size_t ks[4] = {s->batch, s->kv_seq, s->num_kv_heads, s->head_dim};
    size_t ls[4] = {s->batch, s->q_seq, s->num_heads, 2};
    int off = batched ? 0 : 1, nd = batched ? 4 : 3;
    save("q.npy", qs + off, nd, p->q);
    save("do.npy", qs + off, nd, p->d_out);
    save("k.npy", ks + off, nd, p->k);
    save("v.npy", ks + off, nd, p->v);
    save("o.npy", qs + off, nd, p->o);
    save("lse.npy", ls + off, nd, p->lse);
}

clattn_shape cli_shape(void)
{
    clattn_shape s = clattn_shape_default();
    s.q_seq = 12;
    s.kv_seq = 12;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 8;
    return s;
}

/* Reads an output, checks its shape and compares it with ref. */
void expect_file(const char *name, int ndim, const size_t *shape, const double *ref,
                 const double *mag, size_t n)
{
    npy_array a;
    char err[256];
    ck_assert_msg(npy_read(path(name), &a, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(a.ndim, ndim);
    for (int i = 0; i < ndim; ++i)
        ck_assert_uint_eq(a.shape[i], shape[i]);
    size_t at;
    ck_assert_uint_eq(a.count, n);
    ck_assert_str_eq(a.descr, "<f4");
    ck_assert_msg(worst_error(a.data, ref, mag, n, &at) <= 1.0, "%s[%zu] is %g, want %g", name,
                  at, (double)a.data[at], ref[at]);
    npy_free(&a);
}

void check_output(const problem *p, const char *name, int ndim, const size_t *shape)
{
    double *ref = malloc(p->nkv * sizeof(double)), *mag = malloc(p->nkv * sizeof(double));
    ref_grad_v(p, ref, mag);
    expect_file(name, ndim, shape, ref, mag, p->nkv);
    free(ref);
    free(mag);
}

int same_bytes(const char *a, const char *b)
{
    static char x[1 << 16], y[1 << 16];
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(g);
    const size_t n = fread(x, 1, sizeof x, f), m = fread(y, 1, sizeof y, g);
    fclose(f);
    fclose(g);
    return n == m && !memcmp(x, y, n);
}

/* Reads a whole small file; its length in *n. */
void read_all(const char *file, char *buf, size_t size, size_t *n)
{
    FILE *f = fopen(file, "rb");
    ck_assert_ptr_nonnull(f);
    *n = fread(buf, 1, size, f);
    fclose(f);
}
