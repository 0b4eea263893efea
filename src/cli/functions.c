/* The caller's functions on the command line (--score-fn, --mask-fn,
 * --score-params): their files read for the OpenCL backends, and for the
 * native backend the same files compiled as C99 with the system's C
 * compiler ($CC, else cc) into a shared object that is loaded
 * (docs/programmable.md says which functions are valid as both). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "npy.h"

#include "common.h"

extern char **environ;

/* A source file's text, at most 1 MiB, into *out (free() it); prints one
 * line and returns 0 where it cannot be read or is empty. */
static int read_text(const char *cmd, const char *flag, const char *path, char **out)
{
    enum { MAX_SOURCE = 1 << 20 };
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "clattn %s: %s %s: %s\n", cmd, flag, path, strerror(errno));
        return 0;
    }
    char *text = malloc(MAX_SOURCE + 1);
    size_t n = text ? fread(text, 1, MAX_SOURCE + 1, f) : 0;
    const int failed = !text || ferror(f);
    fclose(f);
    const char *why = failed ? "cannot be read"
                      : n > MAX_SOURCE ? "is larger than 1 MiB"
                      : n == 0 || memchr(text, '\0', n) ? "is empty or not text"
                                                        : NULL;
    if (why) {
        fprintf(stderr, "clattn %s: %s %s %s\n", cmd, flag, path, why);
        free(text);
        return 0;
    }
    text[n] = '\0';
    *out = text;
    return 1;
}

int mod_read_functions(const char *cmd, mod_opts *m, clattn_shape *s)
{
    if (m->params_file && !m->score_file) {
        fprintf(stderr, "clattn %s: --score-params wants --score-fn: they are its parameters\n",
                cmd);
        return 0;
    }
    if ((m->score_file && !read_text(cmd, "--score-fn", m->score_file, &m->score_src)) ||
        (m->mask_file && !read_text(cmd, "--mask-fn", m->mask_file, &m->mask_src)))
        return 0;
    if (m->params_file) {
        npy_array a;
        char err[512];
        if (npy_read(m->params_file, &a, err, sizeof err) != 0) {
            fprintf(stderr, "clattn %s: %s\n", cmd, err);
            return 0;
        }
        const int ok = a.data && a.ndim == 1 && a.count >= 1 && a.count <= UINT32_MAX;
        if (!ok)
            fprintf(stderr, "clattn %s: --score-params %s: want a 1-D float32 ('<f4') array of "
                            "at least one value\n",
                    cmd, m->params_file);
        else
            m->params = a.data, a.data = NULL, m->nparams = (uint32_t)a.count;
        npy_free(&a);
        if (!ok)
            return 0;
    }
    s->score_fn = m->score_src;
    s->mask_fn = m->mask_src;
    s->score_params = m->params;
    s->score_params_count = m->nparams;
    return 1;
}

/* The C file that wraps the caller's sources (clattn_native_wrapper's
 * text around them), each source from its own line 1. */
static int write_wrapper(FILE *f, const mod_opts *m)
{
    fputs(clattn_native_wrapper(0), f);
    if (m->score_src)
        fprintf(f, "#line 1 \"%s\"\n%s\n", m->score_file, m->score_src);
    if (m->mask_src)
        fprintf(f, "#line 1 \"%s\"\n%s\n", m->mask_file, m->mask_src);
    fputs("#line 1 \"clattn's wrapper\"\n", f);
    fputs(clattn_native_wrapper(1), f);
    return fflush(f) == 0 && !ferror(f);
}

/* Runs the C compiler once on the wrapper, with -march=native where
 * `native` (its messages then go nowhere) or without (to stderr): 1 where
 * it compiled, 0 where it did not, -1 where it could not be started. */
static int run_compiler(const char *cc, const mod_opts *m, const char *c_file,
                        const char *so_file, int native)
{
    char *argv[16] = {(char *)cc,        "-std=c99",         "-O3",    "-fno-trapping-math",
                      "-fno-math-errno", "-fvisibility=hidden", "-shared", "-fPIC"};
    int n = 8;
    if (native)
        argv[n++] = "-march=native";
    if (m->score_src)
        argv[n++] = "-DCLATTN_SCORE";
    if (m->score_src && strstr(m->score_src, "clattn_score_dp"))
        argv[n++] = "-DCLATTN_SCORE_DP";
    if (m->mask_src)
        argv[n++] = "-DCLATTN_MASK";
    argv[n++] = "-o";
    argv[n++] = (char *)so_file;
    argv[n++] = (char *)c_file;
    argv[n++] = "-lm";
    argv[n] = NULL;
    posix_spawn_file_actions_t quiet;
    if (native && (posix_spawn_file_actions_init(&quiet) ||
                   posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0)))
        return 0; /* the second try, with messages, follows */
    pid_t pid;
    const int err = posix_spawnp(&pid, cc, native ? &quiet : NULL, NULL, argv, environ);
    if (native)
        posix_spawn_file_actions_destroy(&quiet);
    if (err) {
        errno = err;
        return -1;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Compiles the wrapper for this machine's CPU (vector units the span's
 * loops use), else for the compiler's default target, whose messages go
 * to stderr. */
static int compile_wrapper(const char *cmd, const mod_opts *m, const char *c_file,
                           const char *so_file)
{
    const char *cc = getenv("CC");
    if (!cc || !cc[0])
        cc = "cc";
    int done = run_compiler(cc, m, c_file, so_file, 1);
    if (done == 0)
        done = run_compiler(cc, m, c_file, so_file, 0);
    if (done < 0) {
        fprintf(stderr, "clattn %s: the native backend compiles the functions with %s: %s\n",
                cmd, cc, strerror(errno));
        return 0;
    }
    if (!done) {
        fprintf(stderr, "clattn %s: %s did not compile the functions as C99 (its messages "
                        "above); the native backend needs them valid C as well as OpenCL C\n",
                cmd, cc);
        return 0;
    }
    return 1;
}

int mod_native(const char *cmd, int native, mod_opts *m, clattn_shape *s)
{
    if (!native || (!m->score_src && !m->mask_src) || m->lib)
        return 1;
    const char *tmp = getenv("TMPDIR");
    char dir[4096], c_file[4200], so_file[4200];
    snprintf(dir, sizeof dir, "%s/clattn-fn-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "clattn %s: a folder for the functions' build: %s\n", cmd,
                strerror(errno));
        return 0;
    }
    snprintf(c_file, sizeof c_file, "%s/functions.c", dir);
    snprintf(so_file, sizeof so_file, "%s/functions.so", dir);
    FILE *f = fopen(c_file, "w");
    int ok = f != NULL;
    if (f) {
        ok = write_wrapper(f, m);
        ok = fclose(f) == 0 && ok;
    }
    if (!ok)
        fprintf(stderr, "clattn %s: writing %s: %s\n", cmd, c_file, strerror(errno));
    ok = ok && compile_wrapper(cmd, m, c_file, so_file);
    if (ok && !(m->lib = dlopen(so_file, RTLD_NOW | RTLD_LOCAL))) {
        fprintf(stderr, "clattn %s: loading the functions: %s\n", cmd, dlerror());
        ok = 0;
    }
    /* the loaded object stays mapped once its files are gone */
    remove(so_file);
    remove(c_file);
    rmdir(dir);
    if (!ok)
        return 0;
    /* POSIX: a function's address through a data pointer, by memcpy */
    void *sym[5] = {NULL, NULL, NULL, NULL, NULL};
    static const char *const names[5] = {"clattn_native_score", "clattn_native_score_ds",
                                         "clattn_native_score_span", "clattn_native_mask",
                                         "clattn_native_score_dp"};
    for (int i = 0; i < 5; ++i)
        sym[i] = dlsym(m->lib, names[i]);
    if (m->score_src) {
        memcpy(&s->score_native, &sym[0], sizeof sym[0]);
        memcpy(&s->score_ds_native, &sym[1], sizeof sym[1]);
        memcpy(&s->score_span_native, &sym[2], sizeof sym[2]);
        memcpy(&s->score_dp_native, &sym[4], sizeof sym[4]); /* NULL without clattn_score_dp */
    }
    if (m->mask_src)
        memcpy(&s->mask_native, &sym[3], sizeof sym[3]);
    return (!m->score_src || (sym[0] && sym[1] && sym[2])) && (!m->mask_src || sym[3]);
}

void mod_free(mod_opts *m)
{
    free(m->slopes);
    free(m->sinks);
    free(m->score_src);
    free(m->mask_src);
    free(m->params);
    free(m->bias);
    free(m->bool_mask);
    m->bias = NULL;
    m->bool_mask = NULL;
    if (m->lib)
        dlclose(m->lib);
    m->slopes = m->sinks = m->params = NULL;
    m->score_src = m->mask_src = NULL;
    m->lib = NULL;
}
