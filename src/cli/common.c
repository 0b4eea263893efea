/* The helpers the command line's commands share: option parsing (the
 * score modifiers' options among them), contexts, timing, random inputs,
 * and how a failure becomes an exit status. They call no command. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clattn.h"
#include "npy.h"

#include "common.h"


static int parse_uint(const char *s, uint32_t *out)
{
    if (!s || !*s)
        return 0;
    uint64_t v = 0;
    for (const char *p = s; *p; ++p) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > UINT32_MAX)
            return 0;
    }
    *out = (uint32_t)v;
    return 1;
}

static int parse_positive(const char *s, float *out)
{
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* In float32, as the library takes it: a value that rounds to 0 would
     * mean the default scale, and a subnormal one loses its precision. */
    const float f = (float)v;
    if (*end != '\0' || errno == ERANGE || !(f >= FLT_MIN) || !isfinite(f))
        return 0;
    *out = f;
    return 1;
}

static int parse_fraction(const char *s, float *out)
{
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    const float f = (float)v;
    /* A positive value float32 rounds to 0 would silently mean none. */
    if (*end != '\0' || errno == ERANGE || !(f >= 0.0f && f < 1.0f) || (v > 0.0 && f == 0.0f))
        return 0;
    *out = f;
    return 1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return 0;
    uint64_t v = 0;
    for (const char *p = s; *p; ++p) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
            return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 1;
}

void mod_opts_add(opt *opts, size_t *n, mod_opts *m)
{
    opts[(*n)++] = (opt){"--softcap", OPT_POSITIVE, &m->softcap, 0, 0};
    opts[(*n)++] = (opt){"--alibi", OPT_STRING, &m->alibi, 0, 0};
    opts[(*n)++] = (opt){"--dropout", OPT_FRACTION, &m->dropout, 0, 0};
    opts[(*n)++] = (opt){"--seed", OPT_U64, &m->seed, 0, 0};
    opts[(*n)++] = (opt){"--dropout-offset", OPT_U64, &m->offset, 0, 0};
    opts[(*n)++] = (opt){"--sinks", OPT_STRING, &m->sinks_file, 0, 0};
    opts[(*n)++] = (opt){"--bias", OPT_STRING, &m->bias_file, 0, 0};
    opts[(*n)++] = (opt){"--score-fn", OPT_STRING, &m->score_file, 0, 0};
    opts[(*n)++] = (opt){"--mask-fn", OPT_STRING, &m->mask_file, 0, 0};
    opts[(*n)++] = (opt){"--score-params", OPT_STRING, &m->params_file, 0, 0};
}

static const opt *find_opt(const opt *opts, size_t n, const char *name)
{
    for (size_t i = 0; i < n; ++i)
        if (!strcmp(opts[i].name, name))
            return &opts[i];
    return NULL;
}

/* A 1-D float32 array of one value a query head from `path` into *out
 * (free() it); prints one line and returns 0 on bad input. */
static int read_heads(const char *cmd, const char *flag, const char *path, const char *what,
                      uint32_t heads, float **out)
{
    npy_array a;
    char err[512];
    if (npy_read(path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return 0;
    }
    const int ok = a.data && a.ndim == 1 && a.count == heads;
    if (!ok)
        fprintf(stderr, "clattn %s: %s %s: want a 1-D float32 ('<f4') array of %u %s, one per "
                        "query head\n", cmd, flag, path, heads, what);
    else
        *out = a.data, a.data = NULL;
    npy_free(&a);
    return ok;
}

/* --bias: a 4-d float32, float16, bfloat16 (bits, '<u2' or '<i2') or bool
 * array [B or 1][H or 1][q_seq][kv_seq] into m and s; prints one line and
 * returns 0 on bad input. */
static int read_bias(const char *cmd, mod_opts *m, clattn_shape *s)
{
    npy_array a;
    char err[512];
    if (npy_read(m->bias_file, &a, err, sizeof err) != 0) {
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return 0;
    }
    const int ok = (a.data || a.bools || a.bits) && a.ndim == 4 &&
                   (a.shape[0] == 1 || a.shape[0] == s->batch) &&
                   (a.shape[1] == 1 || a.shape[1] == s->num_heads) && a.shape[2] == s->q_seq &&
                   a.shape[3] == s->kv_seq;
    if (!ok)
        fprintf(stderr,
                "clattn %s: --bias %s: want a 4-d float32 ('<f4'), float16 ('<f2'), "
                "bfloat16 bits ('<u2', '<i2') or bool ('|b1') array of [%u or 1][%u or 1][%u][%u] "
                "(batch, query heads, queries, keys)\n",
                cmd, m->bias_file, s->batch, s->num_heads, s->q_seq, s->kv_seq);
    else {
        memcpy(m->bias_shape, a.shape, sizeof m->bias_shape);
        s->bias_dtype = descr_dtype(a.descr);
        m->bias = a.bits ? (void *)a.bits : (void *)a.data;
        m->bool_mask = a.bools;
        a.data = NULL;
        a.bools = NULL;
        a.bits = NULL;
        s->bias = m->bias;
        s->bool_mask = m->bool_mask;
        s->bias_batch = (uint32_t)a.shape[0];
        s->bias_heads = (uint32_t)a.shape[1];
    }
    npy_free(&a);
    return ok;
}

int window_left_apply(const char *cmd, const opt *opts, size_t n, uint32_t left,
                      uint32_t *window)
{
    const opt *given = find_opt(opts, n, "--window-left"), *plain = find_opt(opts, n, "--window");
    if (!given || !given->seen)
        return 1;
    if (plain && plain->seen) {
        fprintf(stderr, "clattn %s: give --window N or --window-left L (N = L + 1), not both\n",
                cmd);
        return 0;
    }
    if (left == UINT32_MAX) {
        fprintf(stderr, "clattn %s: --window-left %u: the window L + 1 does not fit 32 bits\n",
                cmd, left);
        return 0;
    }
    *window = left + 1u;
    return 1;
}

int mod_apply(const char *cmd, const opt *opts, size_t n, mod_opts *m, clattn_shape *s)
{
    /* --dropout 0 with a seed is no dropout, as in the API, PyTorch and
     * FlashAttention. */
    const opt *seed = find_opt(opts, n, "--seed");
    if (m->dropout > 0.0f && !(seed && seed->seen)) {
        fprintf(stderr, "clattn %s: --dropout wants --seed: the mask is drawn from it\n", cmd);
        return 0;
    }
    if ((m->alibi && !read_heads(cmd, "--alibi", m->alibi, "slopes", s->num_heads, &m->slopes)) ||
        (m->sinks_file &&
         !read_heads(cmd, "--sinks", m->sinks_file, "sinks", s->num_heads, &m->sinks)) ||
        (m->bias_file && !read_bias(cmd, m, s)) || !mod_read_functions(cmd, m, s))
        return 0;
    s->softcap = m->softcap;
    s->alibi_slopes = m->slopes;
    s->sinks = m->sinks;
    s->dropout_p = m->dropout;
    s->dropout_seed = m->seed;
    s->dropout_offset = m->offset;
    const clattn_status st = clattn_shape_validate(s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st), clattn_last_error());
        return 0;
    }
    return 1;
}

/* Parses argv against opts; prints one line and returns 0 on bad input. */
int parse_opts(const char *cmd, int argc, char **argv, opt *opts, size_t n)
{
    for (int i = 0; i < argc; ++i) {
        opt *o = NULL;
        for (size_t j = 0; j < n; ++j)
            if (!strcmp(argv[i], opts[j].name))
                o = &opts[j];
        if (!o) {
            fprintf(stderr, "clattn %s: unknown argument '%s' (see clattn %s --help)\n", cmd,
                    argv[i], cmd);
            return 0;
        }
        o->seen = 1;
        if (o->kind == OPT_FLAG) {
            *(int *)o->value = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "clattn %s: %s needs a value\n", cmd, o->name);
            return 0;
        }
        const char *v = argv[++i];
        if (o->kind == OPT_STRING) {
            *(const char **)o->value = v;
        } else if (o->kind == OPT_UINT && !parse_uint(v, o->value)) {
            fprintf(stderr, "clattn %s: %s wants a whole number from 0 to %u, not '%s'\n", cmd,
                    o->name, UINT32_MAX, v);
            return 0;
        } else if (o->kind == OPT_FRACTION && !parse_fraction(v, o->value)) {
            fprintf(stderr,
                    "clattn %s: %s wants 0, or a number below 1 that float32 holds above 0 "
                    "(%g or more), not '%s'\n",
                    cmd, o->name, (double)FLT_TRUE_MIN, v);
            return 0;
        } else if (o->kind == OPT_U64 && !parse_u64(v, o->value)) {
            fprintf(stderr, "clattn %s: %s wants a whole number from 0 to %llu, not '%s'\n",
                    cmd, o->name, (unsigned long long)UINT64_MAX, v);
            return 0;
        } else if (o->kind == OPT_POSITIVE && !parse_positive(v, o->value)) {
            fprintf(stderr,
                    "clattn %s: %s wants a finite number above 0 that float32 holds as a "
                    "normal number (%g or more), not '%s'\n",
                    cmd, o->name, (double)FLT_MIN, v);
            return 0;
        }
    }
    for (size_t j = 0; j < n; ++j)
        if (opts[j].required && !opts[j].seen) {
            fprintf(stderr, "clattn %s: %s is required (see clattn %s --help)\n", cmd,
                    opts[j].name, cmd);
            return 0;
        }
    const opt *top = find_opt(opts, n, "--causal");
    const opt *bottom = find_opt(opts, n, "--causal-bottom-right");
    if (top && top->seen && bottom && bottom->seen) {
        fprintf(stderr, "clattn %s: --causal (top-left) and --causal-bottom-right are two "
                        "alignments of the causal mask: give one\n", cmd);
        return 0;
    }
    return 1;
}

int wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; ++i)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Creates a context for the CLI; a failure is a device failure (1) unless
 * the selector or variant itself was malformed (2). */
int open_context(const char *cmd, const char *device, const char *variant,
                 clattn_context **ctx)
{
    clattn_options o = clattn_options_default();
    o.device = device;
    o.variant = variant;
    clattn_status st = clattn_context_create(&o, ctx);
    if (st == CLATTN_OK) {
        /* What auto skipped, and why; not the routine lines about builds. */
        for (const char *line = clattn_context_log(*ctx); *line;) {
            const size_t n = strcspn(line, "\n");
            if (!strncmp(line, "auto", 4))
                fprintf(stderr, "%.*s\n", (int)n, line);
            line += n + (line[n] == '\n');
        }
        return 0;
    }
    fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st), clattn_last_error());
    /* A selector or variant that names nothing here is the caller's to fix. */
    return st == CLATTN_ERROR_INVALID_OPTION || st == CLATTN_ERROR_UNKNOWN_VARIANT ||
                   st == CLATTN_ERROR_DEVICE_NOT_FOUND
               ? EXIT_INPUT
               : EXIT_DEVICE;
}

clattn_dtype descr_dtype(const char *descr)
{
    if (!strcmp(descr, "<f2"))
        return CLATTN_DTYPE_F16;
    return !strcmp(descr, "<u2") || !strcmp(descr, "<i2") ? CLATTN_DTYPE_BF16 : CLATTN_DTYPE_F32;
}

int parse_dtype(const char *cmd, const char *name, clattn_dtype *dtype)
{
    static const char *const names[3] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; ++i)
        if (!strcmp(name, names[i])) {
            *dtype = (clattn_dtype)i;
            return 1;
        }
    fprintf(stderr, "clattn %s: --dtype wants f32, f16 or bf16, not '%s'\n", cmd, name);
    return 0;
}


/* A small fixed generator, so that every run of the demo sees the same data. */
float next_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}


/* Fills n floats uniformly in [-gain, gain). */
void fill_uniform(float *a, size_t n, float gain, uint64_t *state)
{
    for (size_t i = 0; i < n; ++i)
        a[i] = next_uniform(state) * gain;
}


float *alloc_floats(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}


/* Reports a failed op: a device failure, or input the device cannot take. */
int op_failed(const char *cmd, clattn_status st)
{
    fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st), clattn_last_error());
    return st == CLATTN_ERROR_TOO_LARGE_FOR_DEVICE ? EXIT_INPUT : EXIT_DEVICE;
}
