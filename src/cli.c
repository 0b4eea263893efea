/* The clattn command line: devices, grad-v, demo.
 * Exit status: 0 success, 1 a device or library failure, 2 bad input. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clattn.h"
#include "npy.h"

enum { EXIT_DEVICE = 1, EXIT_INPUT = 2 };

/* One command-line option: a flag, a path, a count or a positive number. */
typedef enum opt_kind { OPT_FLAG, OPT_STRING, OPT_UINT, OPT_POSITIVE } opt_kind;

typedef struct opt {
    const char *name;
    opt_kind kind;
    void *value; /* int*, const char**, uint32_t*, float* */
    int required;
    int seen;
} opt;

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
static int parse_opts(const char *cmd, int argc, char **argv, opt *opts, size_t n)
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

static int wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; ++i)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Creates a context for the CLI; a failure is a device failure (1) unless
 * the selector or variant itself was malformed (2). */
static int open_context(const char *cmd, const char *device, const char *variant,
                        clattn_context **ctx)
{
    clattn_options o = clattn_options_default();
    o.device = device;
    o.variant = variant;
    clattn_status st = clattn_context_create(&o, ctx);
    if (st == CLATTN_OK) {
        const char *log = clattn_context_log(*ctx);
        if (log[0])
            fprintf(stderr, "%s", log);
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
            fprintf(stderr, "clattn %s: %s dimension %d is %zu, want %zu to agree with Q\n",
                    cmd, what, i, a->shape[i], *w);
            return 0;
        }
    }
    return 1;
}

static int cmd_grad_v(int argc, char **argv)
{
    const char *cmd = "grad-v";
    if (wants_help(argc, argv)) {
        printf("usage: clattn grad-v --q Q.npy --k K.npy --d-out DO.npy --lse LSE.npy "
               "--out DV.npy\n"
               "                    [--causal] [--window N] [--scale S] [--device SEL] "
               "[--variant NAME]\n"
               "The gradient of attention with respect to V. Arrays are float32 .npy, C order:\n"
               "Q and dO (q_seq, heads, head_dim), K (kv_seq, kv_heads, head_dim), LSE\n"
               "(q_seq, heads, 2), each with an optional leading batch dimension; DV is\n"
               "written as (kv_seq, kv_heads, head_dim). Exit 0 on success, 1 on a device\n"
               "failure, 2 on bad input (and then no output file is left).\n");
        return 0;
    }
    const char *qp = NULL, *kp = NULL, *dop = NULL, *lsep = NULL, *outp = NULL;
    const char *device = NULL, *variant = NULL;
    int causal = 0;
    uint32_t window = 0;
    float scale = 0.0f;
    opt opts[] = {
        {"--q", OPT_STRING, &qp, 1, 0},         {"--k", OPT_STRING, &kp, 1, 0},
        {"--d-out", OPT_STRING, &dop, 1, 0},    {"--lse", OPT_STRING, &lsep, 1, 0},
        {"--out", OPT_STRING, &outp, 1, 0},     {"--causal", OPT_FLAG, &causal, 0, 0},
        {"--window", OPT_UINT, &window, 0, 0},  {"--scale", OPT_POSITIVE, &scale, 0, 0},
        {"--device", OPT_STRING, &device, 0, 0}, {"--variant", OPT_STRING, &variant, 0, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0]))
        return EXIT_INPUT;

    npy_array q = {0}, k = {0}, d_out = {0}, lse = {0};
    float *dv = NULL;
    clattn_context *ctx = NULL;
    int rc = EXIT_INPUT;
    if (!load(cmd, qp, &q) || !load(cmd, kp, &k) || !load(cmd, dop, &d_out) ||
        !load(cmd, lsep, &lse))
        goto done;
    int batched = q.ndim == 4;
    /* [batch, q_seq, heads, dim] and [batch, kv_seq, kv_heads, dim] */
    size_t qs[4] = {batched ? 0 : 1, 0, 0, 0}, ks[4] = {0}, ls[4] = {0};
    if (!check_dims(cmd, "Q", &q, batched, qs))
        goto done;
    ks[0] = qs[0];
    ks[3] = qs[3];
    ls[0] = qs[0];
    ls[1] = qs[1];
    ls[2] = qs[2];
    ls[3] = 2;
    if (!check_dims(cmd, "K", &k, batched, ks) || !check_dims(cmd, "dO", &d_out, batched, qs) ||
        !check_dims(cmd, "LSE", &lse, batched, ls))
        goto done;

    clattn_shape s = clattn_shape_default();
    s.batch = (uint32_t)qs[0];
    s.q_seq = (uint32_t)qs[1];
    s.num_heads = (uint32_t)qs[2];
    s.head_dim = (uint32_t)qs[3];
    s.kv_seq = (uint32_t)ks[1];
    s.num_kv_heads = (uint32_t)ks[2];
    s.causal = causal;
    s.window = window;
    s.scale = scale;
    clattn_status st = clattn_shape_validate(&s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        goto done;
    }
    dv = malloc(k.count * sizeof(float));
    if (!dv) {
        fprintf(stderr, "clattn %s: out of memory\n", cmd);
        rc = EXIT_DEVICE;
        goto done;
    }
    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    st = clattn_grad_v(ctx, &s, d_out.data, q.data, k.data, lse.data, dv);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        rc = st == CLATTN_ERROR_TOO_LARGE_FOR_DEVICE ? EXIT_INPUT : EXIT_DEVICE;
        goto done;
    }
    char tmp[4096], err[512];
    if (npy_write_temp(outp, k.shape, k.ndim, dv, tmp, sizeof tmp, err, sizeof err) != 0 ||
        npy_commit(tmp, outp, err, sizeof err) != 0) {
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        rc = EXIT_INPUT;
        goto done;
    }
    rc = 0;
done:
    clattn_context_destroy(ctx);
    free(dv);
    npy_free(&q);
    npy_free(&k);
    npy_free(&d_out);
    npy_free(&lse);
    return rc;
}

/* A small fixed generator, so that every run of the demo sees the same data. */
static float next_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* The forward's LSE pairs in double, for the demo's inputs. */
static void demo_lse(const clattn_shape *s, const float *q, const float *k, float *lse)
{
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const double scale = 1.0 / sqrt((double)D);
    for (size_t pos = 0; pos < s->q_seq; ++pos)
        for (size_t h = 0; h < s->num_heads; ++h) {
            const float *qr = q + (pos * s->num_heads + h) * D;
            double m = -1e300, sum = 0.0;
            for (int pass = 0; pass < 2; ++pass)
                for (size_t t = 0; t <= pos && t < s->kv_seq; ++t) {
                    const float *kr = k + (t * s->num_kv_heads + h / group) * D;
                    double dot = 0.0;
                    for (size_t d = 0; d < D; ++d)
                        dot += (double)qr[d] * kr[d];
                    if (pass == 0)
                        m = dot * scale > m ? dot * scale : m;
                    else
                        sum += exp(dot * scale - m);
                }
            lse[(pos * s->num_heads + h) * 2] = (float)m;
            lse[(pos * s->num_heads + h) * 2 + 1] = (float)log(sum);
        }
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
    float *dv = malloc(nkv * 4), *dv_native = malloc(nkv * 4);
    clattn_context *ctx = NULL, *native = NULL;
    int rc = EXIT_DEVICE;
    if (!q || !d_out || !k || !lse || !dv || !dv_native) {
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
    demo_lse(&s, q, k, lse);

    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    clattn_options no = clattn_options_default();
    no.backend = CLATTN_BACKEND_NATIVE;
    clattn_status st = clattn_context_create(&no, &native);
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
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn COMMAND [ARGS]   (clattn COMMAND --help for each)\n"
               "  devices   list OpenCL devices and the native backend; mark auto's pick\n"
               "  grad-v    the gradient of attention with respect to V, on .npy files\n"
               "  demo      grad-V on an embedded layer, checked against native\n"
               "  version   print the library version\n"
               "The device comes from --device, else CLATTN_DEVICE, else auto.\n");
}

int main(int argc, char **argv)
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
    if (!strcmp(c, "grad-v"))
        return cmd_grad_v(argc - 2, argv + 2);
    if (!strcmp(c, "demo"))
        return cmd_demo(argc - 2, argv + 2);
    fprintf(stderr, "clattn: unknown command '%s'\n", c);
    usage(stderr);
    return EXIT_INPUT;
}
