/* The clattn command line: devices, forward, backward, grad-v, demo, train.
 * Exit status: 0 success, 1 a device or library failure, 2 bad input. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clattn.h"
#include "npy.h"

#include "cli.h"

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
    if (*end != '\0' || errno == ERANGE || !(v > 0.0) || !isfinite((float)v))
        return 0;
    *out = (float)v;
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
        } else if (o->kind == OPT_POSITIVE && !parse_positive(v, o->value)) {
            fprintf(stderr, "clattn %s: %s wants a finite number above 0, not '%s'\n", cmd,
                    o->name, v);
            return 0;
        }
    }
    for (size_t j = 0; j < n; ++j)
        if (opts[j].required && !opts[j].seen) {
            fprintf(stderr, "clattn %s: %s is required (see clattn %s --help)\n", cmd,
                    opts[j].name, cmd);
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
    return st == CLATTN_ERROR_INVALID_OPTION || st == CLATTN_ERROR_UNKNOWN_VARIANT ? EXIT_INPUT
                                                                                  : EXIT_DEVICE;
}

static int cmd_devices(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: clattn devices\n"
               "Lists every OpenCL platform and device, then the native backend, and marks\n"
               "with '*' the one that auto (or CLATTN_DEVICE) picks. Select one with\n"
               "--device P:D, gpu, cpu, native or a part of its name.\n");
        return 0;
    }
    if (argc > 0) {
        fprintf(stderr, "clattn devices: unknown argument '%s'\n", argv[0]);
        return EXIT_INPUT;
    }
    size_t n = 0;
    clattn_status st = clattn_list_devices(NULL, 0, &n);
    clattn_device_info *list = st == CLATTN_OK ? calloc(n, sizeof *list) : NULL;
    if (st == CLATTN_OK && !list)
        st = CLATTN_ERROR_OUT_OF_MEMORY;
    if (st == CLATTN_OK)
        st = clattn_list_devices(list, n, &n);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn devices: %s: %s\n", clattn_status_string(st),
                clattn_last_error());
        free(list);
        return EXIT_DEVICE;
    }
    clattn_context *ctx = NULL;
    clattn_options o = clattn_options_default();
    st = clattn_context_create(&o, &ctx);
    const char *picked = st == CLATTN_OK ? clattn_context_device(ctx) : "";
    for (size_t i = 0; i < n; ++i) {
        char idx[32] = "-", tag[40] = "";
        int mark;
        if (list[i].backend == CLATTN_BACKEND_NATIVE) {
            mark = ctx && clattn_context_backend(ctx) == CLATTN_BACKEND_NATIVE;
        } else {
            snprintf(idx, sizeof idx, "%d:%d", list[i].platform_index, list[i].device_index);
            snprintf(tag, sizeof tag, "(%s)", idx);
            mark = ctx && strstr(picked, tag) != NULL;
        }
        printf("%c %-6s %-11s %s / %s\n", mark ? '*' : ' ', idx,
               clattn_backend_name(list[i].backend), list[i].platform, list[i].name);
    }
    if (ctx)
        printf("auto picks %s\n%s", picked, clattn_context_log(ctx));
    else
        printf("auto picks nothing: %s: %s\n", clattn_status_string(st), clattn_last_error());
    clattn_context_destroy(ctx);
    free(list);
    return 0;
}

/* Reads a .npy input for a command; prints the reason on failure. */
static int load(const char *cmd, const char *path, npy_array *a)
{
    char err[512];
    if (npy_read(path, a, err, sizeof err) == 0)
        return 1;
    fprintf(stderr, "clattn %s: %s\n", cmd, err);
    return 0;
}

/* Checks that a has ndim dims (3, or 4 with batch) and each of want, where
 * a want of 0 takes the array's size and stores it. */
static int check_dims(const char *cmd, const char *what, const npy_array *a, int batched,
                      size_t want[4])
{
    int ndim = batched ? 4 : 3;
    if (a->ndim != ndim) {
        fprintf(stderr, "clattn %s: %s has %d dimensions, want %d%s\n", cmd, what, a->ndim,
                ndim, batched ? " (batch, seq, heads, dim)" : " (seq, heads, dim)");
        return 0;
    }
    for (int i = 0; i < ndim; ++i) {
        size_t *w = &want[i + (batched ? 0 : 1)];
        if (a->shape[i] > UINT32_MAX || a->shape[i] == 0) {
            fprintf(stderr, "clattn %s: %s dimension %d is %zu\n", cmd, what, i, a->shape[i]);
            return 0;
        }
        if (*w == 0) {
            *w = a->shape[i];
        } else if (*w != a->shape[i]) {
            fprintf(stderr, "clattn %s: %s dimension %d is %zu, want %zu to agree with the first array\n",
                    cmd, what, i, a->shape[i], *w);
            return 0;
        }
    }
    return 1;
}

/* The inputs of a command: Q (q_seq, heads, dim) with optional batch; the
 * key-side arrays (kv_seq, kv_heads, dim); O and dO like Q; LSE (q_seq,
 * heads, 2). Reads each named file, checks the shapes agree, and fills the
 * shape from them. */
typedef struct inputs {
    npy_array q, k, v, o, lse, d_out;
} inputs;

static void inputs_free(inputs *in)
{
    npy_free(&in->q);
    npy_free(&in->k);
    npy_free(&in->v);
    npy_free(&in->o);
    npy_free(&in->lse);
    npy_free(&in->d_out);
}

typedef struct input_paths {
    const char *q, *k, *v, *o, *lse, *d_out;
} input_paths;

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

/* Whether LSE pairs read from path are float32, as they must be. */
static int lse_is_f32(const char *cmd, const char *path, const npy_array *a)
{
    if (!strcmp(a->descr, "<f4"))
        return 1;
    fprintf(stderr, "clattn %s: %s is '%s': the LSE pairs are float32 ('<f4')\n", cmd, path,
            a->descr);
    return 0;
}

/* The tensors' dtype, from their descrs and --dtype (NULL, "f32", "f16" or
 * "bf16"): Q, K, V, O and dO share one; '<u2' and '<i2' are bfloat16 bits
 * only when --dtype bf16 says so; the LSE pairs are '<f4'. */
static int inputs_dtype(const char *cmd, const input_paths *paths, const inputs *in,
                        const char *want, clattn_dtype *dtype)
{
    const npy_array *t[5] = {&in->q, &in->k, &in->v, &in->o, &in->d_out};
    const char *names[5] = {paths->q, paths->k, paths->v, paths->o, paths->d_out};
    for (int i = 1; i < 5; ++i)
        if (names[i] && strcmp(t[i]->descr, in->q.descr)) {
            fprintf(stderr, "clattn %s: %s is '%s' and %s '%s': the tensors share one dtype\n",
                    cmd, names[i], t[i]->descr, paths->q, in->q.descr);
            return 0;
        }
    if (paths->lse && !lse_is_f32(cmd, paths->lse, &in->lse))
        return 0;
    const char *d = in->q.descr;
    const int bits = !strcmp(d, "<u2") || !strcmp(d, "<i2");
    clattn_dtype asked = CLATTN_DTYPE_F32;
    if (want && !parse_dtype(cmd, want, &asked))
        return 0;
    if (bits && !(want && asked == CLATTN_DTYPE_BF16)) {
        fprintf(stderr,
                "clattn %s: %s holds 16-bit integers ('%s'); --dtype bf16 reads them as "
                "bfloat16 bit patterns\n",
                cmd, paths->q, d);
        return 0;
    }
    *dtype = bits ? CLATTN_DTYPE_BF16 : !strcmp(d, "<f2") ? CLATTN_DTYPE_F16 : CLATTN_DTYPE_F32;
    if (want && asked != *dtype) {
        fprintf(stderr, "clattn %s: --dtype %s, but %s is '%s'%s\n", cmd, want, paths->q, d,
                asked == CLATTN_DTYPE_BF16 ? " (bfloat16 wants '<u2' or '<i2' bit patterns)"
                                           : "");
        return 0;
    }
    return 1;
}

/* The elements of a tensor input, whichever its dtype. */
static const void *elements(const npy_array *a)
{
    return a->data ? (const void *)a->data : (const void *)a->bits;
}

/* The mask and scale options of the file commands. */
typedef struct mask_opts {
    int causal;
    uint32_t window, q_offset, kv_offset;
    float scale;
} mask_opts;

static int load_inputs(const char *cmd, const input_paths *paths, inputs *in,
                       const mask_opts *mask, const char *want, clattn_shape *s)
{
    if (!load(cmd, paths->q, &in->q) || !load(cmd, paths->k, &in->k) ||
        (paths->v && !load(cmd, paths->v, &in->v)) ||
        (paths->o && !load(cmd, paths->o, &in->o)) ||
        (paths->lse && !load(cmd, paths->lse, &in->lse)) ||
        (paths->d_out && !load(cmd, paths->d_out, &in->d_out)))
        return 0;
    int batched = in->q.ndim == 4;
    /* [batch, q_seq, heads, dim] and [batch, kv_seq, kv_heads, dim] */
    size_t qs[4] = {batched ? 0 : 1, 0, 0, 0}, ks[4] = {0}, ls[4] = {0};
    if (!check_dims(cmd, "Q", &in->q, batched, qs))
        return 0;
    ks[0] = qs[0];
    ks[3] = qs[3];
    memcpy(ls, qs, 3 * sizeof(size_t));
    ls[3] = 2;
    if (!check_dims(cmd, "K", &in->k, batched, ks) ||
        (paths->v && !check_dims(cmd, "V", &in->v, batched, ks)) ||
        (paths->o && !check_dims(cmd, "O", &in->o, batched, qs)) ||
        (paths->d_out && !check_dims(cmd, "dO", &in->d_out, batched, qs)) ||
        (paths->lse && !check_dims(cmd, "LSE", &in->lse, batched, ls)))
        return 0;
    *s = clattn_shape_default();
    if (!inputs_dtype(cmd, paths, in, want, &s->dtype))
        return 0;
    s->batch = (uint32_t)qs[0];
    s->q_seq = (uint32_t)qs[1];
    s->num_heads = (uint32_t)qs[2];
    s->head_dim = (uint32_t)qs[3];
    s->kv_seq = (uint32_t)ks[1];
    s->num_kv_heads = (uint32_t)ks[2];
    s->causal = mask->causal;
    s->window = mask->window;
    s->scale = mask->scale;
    s->q_offset = mask->q_offset;
    s->kv_offset = mask->kv_offset;
    clattn_status st = clattn_shape_validate(s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        return 0;
    }
    return 1;
}

/* An output array and where it goes. */
typedef struct output {
    const char *path;
    const size_t *shape;
    int ndim;
    const char *descr;
    void *data;
} output;

/* Writes every output to a temporary beside it, then renames them all;
 * on any failure removes every temporary, so no output is left half-made. */
static int write_outputs(const char *cmd, const output *outs, int n)
{
    char tmp[8][4096], err[512];
    int made = 0, ok = 1;
    for (; made < n && ok; ++made)
        ok = npy_write_temp(outs[made].path, outs[made].shape, outs[made].ndim, outs[made].descr,
                            outs[made].data, tmp[made], sizeof tmp[made], err, sizeof err) == 0;
    if (!ok) {
        --made; /* the failed one removed its own temporary */
        for (int i = 0; i < made; ++i)
            npy_discard(tmp[i]);
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return 0;
    }
    for (int i = 0; i < n; ++i)
        if (npy_commit(tmp[i], outs[i].path, err, sizeof err) != 0) {
            for (int j = i + 1; j < n; ++j)
                npy_discard(tmp[j]);
            fprintf(stderr, "clattn %s: %s\n", cmd, err);
            return 0;
        }
    return 1;
}

/* Reports a failed op: a device failure, or input the device cannot take. */
static int op_failed(const char *cmd, clattn_status st)
{
    fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st), clattn_last_error());
    return st == CLATTN_ERROR_TOO_LARGE_FOR_DEVICE ? EXIT_INPUT : EXIT_DEVICE;
}

float *alloc_floats(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}

/* The commands that run one op on .npy files: which inputs they read
 * (Q and K always), the options naming their outputs, and each output's
 * shape: like Q, like K, or the LSE pairs. */
enum { LIKE_Q, LIKE_K, LIKE_LSE };
enum { READS_V = 1, READS_O = 2, READS_LSE = 4, READS_DO = 8 };

typedef struct file_command {
    const char *name, *usage;
    unsigned reads;
    int nout;
    const char *out_opt[3];
    int out_like[3];
} file_command;

static const file_command file_commands[] = {
    {"forward",
     "usage: clattn forward --q Q.npy --k K.npy --v V.npy --out O.npy --lse-out LSE.npy\n"
     "                      [--causal] [--window N] [--scale S] [--q-offset N] [--kv-offset N]\n"
     "                      [--device SEL] [--variant NAME] [--dtype T]\n"
     "Attention's forward: O (q_seq, heads, head_dim) and the LSE pairs (q_seq,\n"
     "heads, 2) that the gradients read. Arrays as for grad-v; exit 0, 1 on a\n"
     "device failure, 2 on bad input (and then no output is left).\n",
     READS_V, 2, {"--out", "--lse-out"}, {LIKE_Q, LIKE_LSE}},
    {"backward",
     "usage: clattn backward --q Q.npy --k K.npy --v V.npy --o O.npy --lse LSE.npy\n"
     "                       --d-out DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy\n"
     "                       [--causal] [--window N] [--scale S] [--q-offset N]\n"
     "                       [--kv-offset N] [--device SEL] [--variant NAME] [--dtype T]\n"
     "Attention's backward from the forward's O and LSE and the output gradient\n"
     "dO: dQ like Q, dK and dV like K. Exit 0, 1 on a device failure, 2 on bad\n"
     "input (and then none of the outputs is left).\n",
     READS_V | READS_O | READS_LSE | READS_DO, 3, {"--dq", "--dk", "--dv"},
     {LIKE_Q, LIKE_K, LIKE_K}},
    {"grad-v",
     "usage: clattn grad-v --q Q.npy --k K.npy --d-out DO.npy --lse LSE.npy --out DV.npy\n"
     "                    [--causal] [--window N] [--scale S] [--q-offset N] [--kv-offset N]\n"
     "                    [--device SEL] [--variant NAME] [--dtype T]\n"
     "The gradient of attention with respect to V. Arrays are .npy, C order:\n"
     "Q and dO (q_seq, heads, head_dim), K (kv_seq, kv_heads, head_dim), LSE\n"
     "(q_seq, heads, 2), each with an optional leading batch dimension; DV is\n"
     "written as (kv_seq, kv_heads, head_dim). The tensors share one dtype:\n"
     "float32 '<f4', float16 '<f2', or with --dtype bf16 bfloat16 bit patterns in\n"
     "'<u2' or '<i2'; outputs are written in it, the LSE pairs always in '<f4'.\n"
     "Exit 0 on success, 1 on a device failure, 2 on bad input (and then no\n"
     "output file is left). --q-offset and --kv-offset are the global positions\n"
     "of the first query and key (default 0): the causal and window masks compare\n"
     "global positions, so causal needs kv_seq == q_seq only when both are 0.\n",
     READS_LSE | READS_DO, 1, {"--out"}, {LIKE_K}},
};

static int cmd_file(const file_command *fc, int argc, char **argv)
{
    const char *cmd = fc->name;
    if (wants_help(argc, argv)) {
        printf("%s", fc->usage);
        return 0;
    }
    input_paths paths = {0};
    const char *outp[3] = {NULL, NULL, NULL}, *device = NULL, *variant = NULL, *dtype = NULL;
    mask_opts mask = {0, 0, 0, 0, 0.0f};
    opt opts[18] = {
        {"--q", OPT_STRING, &paths.q, 1, 0},
        {"--k", OPT_STRING, &paths.k, 1, 0},
        {"--causal", OPT_FLAG, &mask.causal, 0, 0},
        {"--window", OPT_UINT, &mask.window, 0, 0},
        {"--scale", OPT_POSITIVE, &mask.scale, 0, 0},
        {"--q-offset", OPT_UINT, &mask.q_offset, 0, 0},
        {"--kv-offset", OPT_UINT, &mask.kv_offset, 0, 0},
        {"--device", OPT_STRING, &device, 0, 0},
        {"--variant", OPT_STRING, &variant, 0, 0},
        {"--dtype", OPT_STRING, &dtype, 0, 0},
    };
    size_t n = 10;
    const struct {
        unsigned bit;
        const char *name;
        const char **path;
    } inputs_read[4] = {{READS_V, "--v", &paths.v},
                        {READS_O, "--o", &paths.o},
                        {READS_LSE, "--lse", &paths.lse},
                        {READS_DO, "--d-out", &paths.d_out}};
    for (int i = 0; i < 4; ++i)
        if (fc->reads & inputs_read[i].bit)
            opts[n++] = (opt){inputs_read[i].name, OPT_STRING, inputs_read[i].path, 1, 0};
    for (int i = 0; i < fc->nout; ++i)
        opts[n++] = (opt){fc->out_opt[i], OPT_STRING, &outp[i], 1, 0};
    if (!parse_opts(cmd, argc, argv, opts, n))
        return EXIT_INPUT;

    inputs in = {0};
    clattn_shape s;
    clattn_context *ctx = NULL;
    void *out[3] = {NULL, NULL, NULL};
    output outs[3];
    size_t lse_shape[NPY_MAX_DIMS];
    int rc = EXIT_INPUT;
    if (!load_inputs(cmd, &paths, &in, &mask, dtype, &s))
        goto done;
    memcpy(lse_shape, in.q.shape, sizeof lse_shape);
    lse_shape[in.q.ndim - 1] = 2;
    for (int i = 0; i < fc->nout; ++i) {
        const npy_array *like = fc->out_like[i] == LIKE_K ? &in.k : &in.q;
        const int lse = fc->out_like[i] == LIKE_LSE;
        const size_t count = lse ? in.q.count / s.head_dim * 2 : like->count;
        /* Written in the inputs' dtype (as their descr), the LSE pairs in float32. */
        const size_t elem = lse || s.dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2;
        out[i] = malloc(count ? count * elem : 1);
        outs[i] = (output){outp[i], lse ? lse_shape : like->shape, like->ndim,
                           lse ? "<f4" : in.q.descr, out[i]};
        if (!out[i]) {
            fprintf(stderr, "clattn %s: out of memory\n", cmd);
            rc = EXIT_DEVICE;
            goto done;
        }
    }
    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    clattn_status st;
    if (fc->nout == 2)
        st = clattn_forward(ctx, &s, elements(&in.q), elements(&in.k), elements(&in.v), out[0],
                            out[1]);
    else if (fc->nout == 3)
        st = clattn_backward(ctx, &s, elements(&in.q), elements(&in.k), elements(&in.v),
                             elements(&in.o), in.lse.data, elements(&in.d_out), out[0], out[1],
                             out[2]);
    else
        st = clattn_grad_v(ctx, &s, elements(&in.d_out), elements(&in.q), elements(&in.k),
                           in.lse.data, out[0]);
    if (st != CLATTN_OK) {
        rc = op_failed(cmd, st);
        goto done;
    }
    rc = write_outputs(cmd, outs, fc->nout) ? 0 : EXIT_INPUT;
done:
    clattn_context_destroy(ctx);
    for (int i = 0; i < 3; ++i)
        free(out[i]);
    inputs_free(&in);
    return rc;
}

/* clattn merge: two partial (O, LSE) results into that of their union. */
static int cmd_merge(int argc, char **argv)
{
    const char *cmd = "merge";
    if (wants_help(argc, argv)) {
        printf("usage: clattn merge --o O1.npy --lse L1.npy --o2 O2.npy --lse2 L2.npy\n"
               "                    --out O.npy --lse-out L.npy [--device SEL] [--dtype T]\n"
               "Merges two forwards' results over disjoint key sets of the same queries\n"
               "(O (q_seq, heads, head_dim) with an optional leading batch, LSE (q_seq,\n"
               "heads, 2) in '<f4') into those of all the keys, as clattn_merge(). O1 and\n"
               "O2 share a dtype, as for forward; outputs are written in it. Exit 0, 1 on a\n"
               "device failure, 2 on bad input (and then no output is left).\n");
        return 0;
    }
    input_paths paths = {0};
    const char *out_o = NULL, *out_lse = NULL, *lse2 = NULL, *device = NULL, *dtype = NULL;
    opt opts[] = {
        {"--o", OPT_STRING, &paths.q, 1, 0},       {"--lse", OPT_STRING, &paths.lse, 1, 0},
        {"--o2", OPT_STRING, &paths.o, 1, 0},      {"--lse2", OPT_STRING, &lse2, 1, 0},
        {"--out", OPT_STRING, &out_o, 1, 0},       {"--lse-out", OPT_STRING, &out_lse, 1, 0},
        {"--device", OPT_STRING, &device, 0, 0},   {"--dtype", OPT_STRING, &dtype, 0, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0]))
        return EXIT_INPUT;
    /* O1 sits where a command's Q does, O2 where its O does. */
    inputs in = {0};
    npy_array l2 = {0};
    clattn_context *ctx = NULL;
    void *o = NULL;
    float *lse = NULL;
    int rc = EXIT_INPUT;
    if (!load(cmd, paths.q, &in.q) || !load(cmd, paths.o, &in.o) ||
        !load(cmd, paths.lse, &in.lse) || !load(cmd, lse2, &l2))
        goto done;
    const int batched = in.q.ndim == 4;
    size_t qs[4] = {batched ? 0 : 1, 0, 0, 0}, ls[4];
    if (!check_dims(cmd, "O", &in.q, batched, qs))
        goto done;
    memcpy(ls, qs, 3 * sizeof(size_t));
    ls[3] = 2;
    if (!check_dims(cmd, "O2", &in.o, batched, qs) ||
        !check_dims(cmd, "LSE", &in.lse, batched, ls) ||
        !check_dims(cmd, "LSE2", &l2, batched, ls) || !lse_is_f32(cmd, lse2, &l2))
        goto done;
    clattn_shape s = clattn_shape_default();
    if (!inputs_dtype(cmd, &paths, &in, dtype, &s.dtype))
        goto done;
    s.batch = (uint32_t)qs[0];
    s.q_seq = s.kv_seq = (uint32_t)qs[1];
    s.num_heads = s.num_kv_heads = (uint32_t)qs[2];
    s.head_dim = (uint32_t)qs[3];
    clattn_status st = clattn_shape_validate(&s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        goto done;
    }
    const size_t elem = s.dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2;
    o = malloc(in.q.count * elem);
    lse = alloc_floats(in.lse.count);
    if (!o || !lse) {
        fprintf(stderr, "clattn %s: out of memory\n", cmd);
        rc = EXIT_DEVICE;
        goto done;
    }
    if ((rc = open_context(cmd, device, NULL, &ctx)) != 0)
        goto done;
    st = clattn_merge(ctx, &s, elements(&in.q), in.lse.data, elements(&in.o), l2.data, o, lse);
    if (st != CLATTN_OK) {
        rc = op_failed(cmd, st);
        goto done;
    }
    const output outs[2] = {{out_o, in.q.shape, in.q.ndim, in.q.descr, o},
                            {out_lse, in.lse.shape, in.lse.ndim, "<f4", lse}};
    rc = write_outputs(cmd, outs, 2) ? 0 : EXIT_INPUT;
done:
    clattn_context_destroy(ctx);
    free(o);
    free(lse);
    npy_free(&l2);
    inputs_free(&in);
    return rc;
}

/* A small fixed generator, so that every run of the demo sees the same data. */
float next_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static int cmd_demo(int argc, char **argv)
{
    const char *cmd = "demo";
    if (wants_help(argc, argv)) {
        printf("usage: clattn demo [--device SEL] [--variant NAME]\n"
               "Runs grad-V on an embedded causal layer (q_seq 512, 9 heads, 3 KV heads,\n"
               "head_dim 64) on the device auto picks, checks it against the native\n"
               "backend and prints the device, the time, GFLOP/s and the error.\n");
        return 0;
    }
    const char *device = NULL, *variant = NULL;
    opt opts[] = {{"--device", OPT_STRING, &device, 0, 0},
                  {"--variant", OPT_STRING, &variant, 0, 0}};
    if (!parse_opts(cmd, argc, argv, opts, 2))
        return EXIT_INPUT;
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 512;
    s.num_heads = 9;
    s.num_kv_heads = 3;
    s.head_dim = 64;
    s.causal = 1;
    const size_t nq = (size_t)s.q_seq * s.num_heads * s.head_dim;
    const size_t nkv = (size_t)s.kv_seq * s.num_kv_heads * s.head_dim;
    float *q = malloc(nq * 4), *d_out = malloc(nq * 4), *k = malloc(nkv * 4);
    float *lse = malloc((size_t)s.q_seq * s.num_heads * 2 * 4);
    float *dv = malloc(nkv * 4), *dv_native = malloc(nkv * 4), *o = malloc(nq * 4);
    clattn_context *ctx = NULL, *native = NULL;
    int rc = EXIT_DEVICE;
    if (!q || !d_out || !k || !lse || !dv || !dv_native || !o) {
        fprintf(stderr, "clattn demo: out of memory\n");
        goto done;
    }
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < nq; ++i) {
        q[i] = next_uniform(&state);
        d_out[i] = next_uniform(&state);
    }
    for (size_t i = 0; i < nkv; ++i)
        k[i] = next_uniform(&state);

    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    clattn_options no = clattn_options_default();
    no.backend = CLATTN_BACKEND_NATIVE;
    clattn_status st = clattn_context_create(&no, &native);
    /* The LSE pairs grad-V reads come from the forward, with K as V too. */
    if (st == CLATTN_OK)
        st = clattn_forward(native, &s, q, k, k, o, lse);
    enum { REPS = 3 };
    double times[REPS], native_time = 0.0;
    /* The first call pays for one-time work; time the ones after it. */
    for (int r = -1; r < REPS && st == CLATTN_OK; ++r) {
        double t0 = now();
        st = clattn_grad_v(ctx, &s, d_out, q, k, lse, dv);
        if (r >= 0)
            times[r] = now() - t0;
    }
    if (st == CLATTN_OK) {
        double t0 = now();
        st = clattn_grad_v(native, &s, d_out, q, k, lse, dv_native);
        native_time = now() - t0;
    }
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn demo: %s: %s\n", clattn_status_string(st), clattn_last_error());
        rc = EXIT_DEVICE;
        goto done;
    }
    for (int i = 0; i < REPS; ++i) /* median of three by sorting */
        for (int j = i + 1; j < REPS; ++j)
            if (times[j] < times[i]) {
                double x = times[i];
                times[i] = times[j];
                times[j] = x;
            }
    double flop = 4.0 * (double)clattn_shape_visible_pairs(&s) * s.head_dim;
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < nkv; ++i) {
        double d = fabs((double)dv[i] - dv_native[i]);
        max_diff = d > max_diff || isnan(d) ? d : max_diff;
        max_ref = fabs(dv_native[i]) > max_ref ? fabs(dv_native[i]) : max_ref;
    }
    double err = max_diff / max_ref;
    const double tolerance = 1e-4;
    printf("clattn %s demo: grad-V of a causal layer, q_seq %u, %u heads, %u KV heads, "
           "head_dim %u\n",
           clattn_version(), s.q_seq, s.num_heads, s.num_kv_heads, s.head_dim);
    printf("device:   %s, variant %s\n", clattn_context_device(ctx), clattn_context_variant(ctx));
    printf("time:     %.3f ms per call (median of %d), %.2f GFLOP/s\n", times[REPS / 2] * 1e3,
           REPS, flop / times[REPS / 2] * 1e-9);
    printf("native:   %s, %.3f ms, %.2f GFLOP/s\n", clattn_context_device(native),
           native_time * 1e3, flop / native_time * 1e-9);
    printf("error:    max |dV - dV native| / max |dV native| = %.3g (tolerance %.0e): %s\n", err,
           tolerance, err <= tolerance ? "ok" : "FAILED");
    rc = err <= tolerance ? 0 : EXIT_DEVICE;
done:
    clattn_context_destroy(ctx);
    clattn_context_destroy(native);
    free(q);
    free(d_out);
    free(k);
    free(lse);
    free(dv);
    free(dv_native);
    free(o);
    return rc;
}

/* Fills n floats uniformly in [-gain, gain). */
void fill_uniform(float *a, size_t n, float gain, uint64_t *state)
{
    for (size_t i = 0; i < n; ++i)
        a[i] = next_uniform(state) * gain;
}

/* One Adam step on n parameters with their moments m and v. */
static void adam_step(float *x, const float *g, float *m, float *v, size_t n, int step, float lr)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        x[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
    }
}

static void progress(int tty, int step, int steps, double loss)
{
    if (tty) {
        enum { WIDTH = 30 };
        int filled = (int)((long)WIDTH * step / steps);
        fprintf(stderr, "\r[%.*s%*s] step %d/%d loss %.3e", filled,
                "##############################", WIDTH - filled, "", step, steps, loss);
        if (step == steps)
            fputc('\n', stderr);
        fflush(stderr);
    } else if (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0 || step == steps) {
        printf("step %d/%d loss %.6e\n", step, steps, loss);
        fflush(stdout);
    }
}

static int cmd_train(int argc, char **argv)
{
    const char *cmd = "train";
    if (wants_help(argc, argv)) {
        printf("usage: clattn train [--steps N] [--device SEL] [--variant NAME] [--dtype T]\n"
               "Trains one causal attention layer (q_seq 64, 4 heads, 2 KV heads, head_dim\n"
               "16) whose Q, K and V are parameters, with Adam on forward + backward, to\n"
               "reproduce the output of a fixed random target layer. Prints the first and\n"
               "last loss; exits 1 unless the loss fell at least 100-fold. Default 300 steps.\n"
               "--dtype f16 or bf16 keeps float32 master weights and runs the op on 16-bit\n"
               "tensors, as mixed-precision training does (default f32).\n");
        return 0;
    }
    const char *device = NULL, *variant = NULL, *dtype_name = "f32";
    uint32_t steps = 300;
    opt opts[] = {{"--device", OPT_STRING, &device, 0, 0},
                  {"--variant", OPT_STRING, &variant, 0, 0},
                  {"--steps", OPT_UINT, &steps, 0, 0},
                  {"--dtype", OPT_STRING, &dtype_name, 0, 0}};
    if (!parse_opts(cmd, argc, argv, opts, 4))
        return EXIT_INPUT;
    static const char *const dtype_words[3] = {"float32", "float16", "bfloat16"};
    clattn_dtype dt;
    if (!parse_dtype(cmd, dtype_name, &dt))
        return EXIT_INPUT;
    if (steps == 0) {
        fprintf(stderr, "clattn train: --steps must be at least 1\n");
        return EXIT_INPUT;
    }
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 64;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 16;
    s.causal = 1;
    const size_t nq = (size_t)s.q_seq * s.num_heads * s.head_dim;
    const size_t nkv = (size_t)s.kv_seq * s.num_kv_heads * s.head_dim;
    const size_t nlse = (size_t)s.q_seq * s.num_heads * 2;
    /* Parameters, gradients and Adam moments of Q, K, V; then the rest. */
    const size_t sizes[3] = {nq, nkv, nkv};
    float *param[3], *grad[3], *mom1[3], *mom2[3];
    float *target = alloc_floats(nq), *o = alloc_floats(nq), *d_out = alloc_floats(nq);
    float *lse = alloc_floats(nlse);
    /* The op's tensors in the dtype: parameters, gradients, O and dO (the
     * float32 run passes the float arrays themselves). */
    const size_t elem = dt ? 2 : sizeof(float);
    void *t16[8] = {NULL};
    const size_t t16_n[8] = {nq, nkv, nkv, nq, nkv, nkv, nq, nq};
    int ok = target && o && d_out && lse;
    for (int i = 0; i < 8 && dt; ++i)
        ok = ok && (t16[i] = malloc(t16_n[i] * elem)) != NULL;
    for (int i = 0; i < 3; ++i) {
        param[i] = alloc_floats(sizes[i]);
        grad[i] = alloc_floats(sizes[i]);
        mom1[i] = calloc(sizes[i], sizeof(float));
        mom2[i] = calloc(sizes[i], sizeof(float));
        ok = ok && param[i] && grad[i] && mom1[i] && mom2[i];
    }
    clattn_context *ctx = NULL;
    int rc = EXIT_DEVICE;
    if (!ok) {
        fprintf(stderr, "clattn train: out of memory\n");
        goto done;
    }
    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    rc = EXIT_DEVICE;
    uint64_t state = 0x2545F4914F6CDD1Dull;
    /* The target layer: its output is what training must reproduce. */
    for (int i = 0; i < 3; ++i)
        fill_uniform(param[i], sizes[i], 1.0f, &state);
    clattn_status st = clattn_forward(ctx, &s, param[0], param[1], param[2], target, lse);
    s.dtype = (clattn_dtype)dt;
    void *p_op[3], *g_op[3], *o_op = dt ? t16[6] : (void *)o, *do_op = dt ? t16[7] : (void *)d_out;
    for (int i = 0; i < 3; ++i) {
        p_op[i] = dt ? t16[i] : (void *)param[i];
        g_op[i] = dt ? t16[3 + i] : (void *)grad[i];
    }
    for (int i = 0; i < 3; ++i)
        fill_uniform(param[i], sizes[i], 1.0f, &state);
    printf("clattn train on %s, variant %s: causal, q_seq %u, %u heads, %u KV heads, "
           "head_dim %u, %s tensors, Adam, %u steps\n",
           clattn_context_device(ctx), clattn_context_variant(ctx), s.q_seq, s.num_heads,
           s.num_kv_heads, s.head_dim, dtype_words[dt], steps);
    fflush(stdout);
    const int tty = isatty(fileno(stderr));
    double first = 0.0, loss = 0.0;
    for (uint32_t step = 1; step <= steps && st == CLATTN_OK; ++step) {
        for (int i = 0; i < 3 && dt; ++i)
            clattn_from_f32(s.dtype, param[i], p_op[i], sizes[i]);
        st = clattn_forward(ctx, &s, p_op[0], p_op[1], p_op[2], o_op, lse);
        if (st != CLATTN_OK)
            break;
        if (dt)
            clattn_to_f32(s.dtype, o_op, o, nq);
        loss = 0.0;
        for (size_t i = 0; i < nq; ++i) {
            const double diff = (double)o[i] - target[i];
            loss += diff * diff / (double)nq;
            d_out[i] = (float)(2.0 * diff / (double)nq);
        }
        if (step == 1)
            first = loss;
        if (dt)
            clattn_from_f32(s.dtype, d_out, do_op, nq);
        st = clattn_backward(ctx, &s, p_op[0], p_op[1], p_op[2], o_op, lse, do_op, g_op[0],
                             g_op[1], g_op[2]);
        for (int i = 0; i < 3 && dt && st == CLATTN_OK; ++i)
            clattn_to_f32(s.dtype, g_op[i], grad[i], sizes[i]);
        for (int i = 0; i < 3 && st == CLATTN_OK; ++i)
            adam_step(param[i], grad[i], mom1[i], mom2[i], sizes[i], (int)step, 0.05f);
        progress(tty, (int)step, (int)steps, loss);
    }
    if (st != CLATTN_OK) {
        rc = op_failed(cmd, st);
        goto done;
    }
    const double fell = loss > 0.0 ? first / loss : INFINITY;
    printf("loss: first %.6e, last %.6e, fell %.1f-fold (target 100): %s\n", first, loss, fell,
           fell >= 100.0 ? "ok" : "FAILED");
    rc = fell >= 100.0 ? 0 : EXIT_DEVICE;
done:
    clattn_context_destroy(ctx);
    for (int i = 0; i < 3; ++i) {
        free(param[i]);
        free(grad[i]);
        free(mom1[i]);
        free(mom2[i]);
    }
    for (int i = 0; i < 8; ++i)
        free(t16[i]);
    free(target);
    free(o);
    free(d_out);
    free(lse);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn COMMAND [ARGS]   (clattn COMMAND --help for each)\n"
               "  devices   list OpenCL devices and the native backend; mark auto's pick\n"
               "  forward   attention's forward, O and the LSE pairs, on .npy files\n"
               "  backward  dQ, dK and dV from the forward's O and LSE, on .npy files\n"
               "  grad-v    the gradient of attention with respect to V, on .npy files\n"
               "  merge     two partial forwards' (O, LSE) over disjoint keys into one\n"
               "  demo      grad-V on an embedded layer, checked against native\n"
               "  train     train an embedded attention layer with Adam; the loss must fall\n"
               "            100-fold\n"
               "  bench     time ops and kernel variants side by side\n"
               "  version   print the library version\n"
               "The device comes from --device, else CLATTN_DEVICE, else auto.\n");
}

int clattn_cli_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_INPUT;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "version") || !strcmp(c, "--version")) {
        printf("clattn %s\n", clattn_version());
        return 0;
    }
    if (!strcmp(c, "devices"))
        return cmd_devices(argc - 2, argv + 2);
    for (size_t i = 0; i < sizeof file_commands / sizeof file_commands[0]; ++i)
        if (!strcmp(c, file_commands[i].name))
            return cmd_file(&file_commands[i], argc - 2, argv + 2);
    if (!strcmp(c, "merge"))
        return cmd_merge(argc - 2, argv + 2);
    if (!strcmp(c, "demo"))
        return cmd_demo(argc - 2, argv + 2);
    if (!strcmp(c, "train"))
        return cmd_train(argc - 2, argv + 2);
    if (!strcmp(c, "bench"))
        return cmd_bench(argc - 2, argv + 2);
    fprintf(stderr, "clattn: unknown command '%s'\n", c);
    usage(stderr);
    return EXIT_INPUT;
}
