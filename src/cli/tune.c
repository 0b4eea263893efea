/* clattn tune: searches a variant's kernel shapes on one OpenCL device for
 * one problem shape and dtype, printing each candidate's time and max error
 * as it goes, and keeps the winner in the per-device tuning file that later
 * contexts read (docs/tuning.md). Candidates are applied through the same
 * variables a user would set by hand (CLATTN_TILED, CLATTN_MMA); the tuner's
 * own contexts read no tuning file, so that the table's shape is the one to
 * beat. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "search.h"

enum { MAX_CANDIDATES = 160, FINALISTS = 3 };

typedef struct candidate {
    char text[32]; /* the shape as its variable takes it; "" for the table's */
    double seconds[2]; /* forward, backward: the latest timing */
    double total;      /* the sum over the ops of the latest timing */
    double sum;        /* totals summed over the confirming rounds */
    double error;
    int ok;
    char ran[2048]; /* the build options of the programs that ran, op after op */
} candidate;

/* Takes a candidate of the search into the list (sink: a candidate_list). */
typedef struct candidate_list {
    candidate *c;
    size_t *n;
} candidate_list;

static int add_candidate(void *sink, const char *text)
{
    candidate_list *l = sink;
    if (*l->n >= MAX_CANDIDATES)
        return 0;
    snprintf(l->c[(*l->n)++].text, sizeof l->c->text, "%s", text);
    return 1;
}

/* The shapes to try, in two stages, as far as the device's work-groups hold
 * them (search.h): how work is split, then the tile and the rest around the
 * first stage's winner `best`. Appends to c[*n]. */
static void generate(const clattn_ocl_search *search, int stage, const char *best,
                     uint32_t head_dim, uint32_t micro_to, clattn_dtype dtype, size_t max_wg,
                     candidate *c, size_t *n)
{
    candidate_list l = {c, n};
    search->generate(stage, best, head_dim, micro_to, dtype, max_wg, add_candidate, &l);
}

/* The device's work-group limit. */
static int device_max_wg(clattn_context *ctx, size_t *max_wg)
{
    cl_device_id dev = NULL;
    return clGetContextInfo(clattn_context_cl_context(ctx), CL_CONTEXT_DEVICES, sizeof dev, &dev,
                            NULL) == CL_SUCCESS &&
           clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof *max_wg, max_wg, NULL) ==
               CL_SUCCESS;
}

/* Times candidate c: a context on the device with c's shape, each op. A
 * shape the device cannot take (a failed build, too little local memory) is
 * not ok, with the reason printed; a failure of the device is the run's. */
static int time_candidate(const char *selector, const char *variant, const char *var,
                          const bench *b, int nops, int reps, candidate *c)
{
    if (var && (c->text[0] ? setenv(var, c->text, 1) : unsetenv(var))) {
        fprintf(stderr, "clattn tune: cannot set %s\n", var);
        return EXIT_INPUT;
    }
    clattn_options o = clattn_options_default();
    o.device = selector;
    o.variant = variant;
    clattn_context *ctx = NULL;
    clattn_status st = clattn_context_create(&o, &ctx);
    c->ok = 0;
    c->total = 0.0;
    c->error = 0.0;
    c->ran[0] = '\0';
    for (int i = 0; i < nops && st == CLATTN_OK; ++i) {
        double err = NAN;
        st = bench_time(ctx, &b[i], reps, &c->seconds[i], &err);
        c->total += c->seconds[i];
        c->error = err > c->error || isnan(err) ? err : c->error;
        /* what the shape ran as, once the library fitted it to the device */
        const size_t used = strlen(c->ran);
        if (st == CLATTN_OK)
            snprintf(c->ran + used, sizeof c->ran - used, "%s%s", i ? "; " : "",
                     clattn_context_build_options(ctx));
    }
    clattn_context_destroy(ctx);
    if (st == CLATTN_ERROR_BUILD_FAILED || st == CLATTN_ERROR_WORK_GROUP_TOO_LARGE ||
        st == CLATTN_ERROR_INVALID_OPTION || st == CLATTN_ERROR_UNSUPPORTED_SHAPE ||
        st == CLATTN_ERROR_UNKNOWN_VARIANT) { /* auto's variants the device lacks */
        const char *why = clattn_last_error();
        printf("  %-14s skipped: %s: %.*s\n", c->text[0] ? c->text : "(table)",
               clattn_status_string(st), (int)strcspn(why, "\n"), why);
        return 0;
    }
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn tune: %s: %s: %s\n", c->text[0] ? c->text : "the table's shape",
                clattn_status_string(st), clattn_last_error());
        return EXIT_DEVICE;
    }
    c->ok = 1;
    return 0;
}

static void print_candidate(const candidate *c, const bench *b, int nops)
{
    printf("  %-14s", c->text[0] ? c->text : "(table)");
    for (int i = 0; i < nops; ++i)
        printf(" %s %9.3f ms", bench_op_names[b[i].op], c->seconds[i] * 1e3);
    printf("  max_error %.3g\n", c->error);
    fflush(stdout);
}

static int by_total(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->ok != y->ok)
        return y->ok - x->ok;
    return (x->total > y->total) - (x->total < y->total);
}

/* The config folder above clattn's in the default path, which may not
 * exist yet. */
static void make_config_folder(const char *path)
{
    char config[1024];
    snprintf(config, sizeof config, "%s", path);
    for (int up = 0; up < 2; ++up) {
        char *slash = strrchr(config, '/');
        if (slash)
            *slash = '\0';
    }
    if (config[0])
        mkdir(config, 0755);
}

/* --variant auto: each variant the device runs per head_dim (not the
 * generic one) timed on each op, interleaved over the rounds after a first
 * sweep; the fastest within the error gate is kept as the op's `auto`
 * entry for the problem's size class, which contexts made without a
 * variant then run (docs/tuning.md, "The default's choice"). */
static int tune_auto(const char *selector, clattn_backend backend, const bench *b, int nops,
                     int reps, uint32_t rounds, int dry_run, const char *path, const char *key)
{
    enum { MAX_VARIANTS = 8 };
    const char *names[MAX_VARIANTS];
    size_t nv = 0;
    for (size_t i = 0; nv < MAX_VARIANTS && clattn_variant_name(backend, i); ++i)
        if (clattn_ocl_choosable(clattn_variant_name(backend, i)))
            names[nv++] = clattn_variant_name(backend, i);
    const char *size = clattn_ocl_size_class_name(&b[0].s);
    const double floor = b[0].s.dtype == CLATTN_DTYPE_F32   ? 1e-5
                         : b[0].s.dtype == CLATTN_DTYPE_F16 ? 2e-3
                                                            : 1.6e-2;
    int rc = 0;
    for (int op = 0; op < nops && !rc; ++op) {
        candidate c[MAX_VARIANTS];
        memset(c, 0, sizeof c);
        for (size_t v = 0; v < nv; ++v)
            snprintf(c[v].text, sizeof c[v].text, "%s", names[v]);
        printf("%s (%s):\n", bench_op_names[b[op].op], size);
        for (uint32_t r = 0; r <= rounds && !rc; ++r) {
            if (r)
                printf("round %u:\n", r);
            for (size_t v = 0; v < nv && !rc; ++v) {
                if (r && !c[v].ok)
                    continue;
                if (!(rc = time_candidate(selector, names[v], NULL, &b[op], 1, reps, &c[v])) &&
                    c[v].ok) {
                    c[v].sum = r || !rounds ? c[v].sum + c[v].total : 0.0;
                    printf("  %-14s %9.3f ms  max_error %.3g\n", names[v], c[v].total * 1e3,
                           c[v].error);
                    fflush(stdout);
                }
            }
        }
        if (rc)
            break;
        double least = INFINITY;
        for (size_t v = 0; v < nv; ++v)
            if (c[v].ok && c[v].error < least)
                least = c[v].error;
        size_t best = nv;
        for (size_t v = 0; v < nv; ++v) {
            if (c[v].ok && !(c[v].error <= 2.0 * least + floor)) {
                printf("  %-14s left out: max_error %.3g beyond %.3g\n", names[v], c[v].error,
                       2.0 * least + floor);
                c[v].ok = 0;
            }
            if (c[v].ok && (best == nv || c[v].sum < c[best].sum))
                best = v;
        }
        if (best == nv) {
            fprintf(stderr, "clattn tune: no variant runs the %s here\n",
                    bench_op_names[b[op].op]);
            rc = EXIT_DEVICE;
            break;
        }
        char shape[64];
        snprintf(shape, sizeof shape, "%s,%s=%s", bench_op_names[b[op].op], size, names[best]);
        printf("best: %s\n", shape);
        if (dry_run)
            continue;
        if (clattn_tuning_file_store(path, "auto", b[op].s.dtype, b[op].s.head_dim, shape, key) !=
            CLATTN_OK) {
            fprintf(stderr, "clattn tune: %s\n", clattn_last_error());
            rc = EXIT_INPUT;
        } else {
            printf("kept in %s\n", path);
        }
    }
    return rc;
}

int cmd_tune(int argc, char **argv)
{
    const char *cmd = "tune";
    if (wants_help(argc, argv)) {
        printf("usage: clattn tune --variant tiled|mma|auto --head-dim D [--dtype f32|f16|bf16]\n"
               "                   [--q-seq N] [--kv-seq N] [--heads H] [--kv-heads KH]\n"
               "                   [--batch B] [--causal] [--op forward|backward|both]\n"
               "                   [--device SEL] [--reps R] [--rounds N]\n"
               "                   [--candidates 'S S ...'] [--file PATH] [--dry-run]\n"
               "                   [--write-best]\n"
               "Searches the variant's kernel shapes (tiled:\n"
               "ROWS,TILE,SPLIT,COLUMNS,PER_ITEM; mma: WARPS,WSPLIT,TILE,PLANES) on an\n"
               "OpenCL device for one problem (default: q_seq 2048, 16 heads, both ops):\n"
               "first how the work is split, then the tile and rows a work-item or\n"
               "columns (mma: planes) around the best split, or the shapes given,\n"
               "printing each candidate's median time over R calls (default 5) and max\n"
               "error against native as it goes. The three\n"
               "fastest within the error of the table's shape are timed again with it,\n"
               "interleaved, over N rounds (default 2); a winner at least 3%% faster than\n"
               "the table's shape (any winner with --write-best) is kept in the tuning\n"
               "file (--file, else CLATTN_TUNING_FILE, else\n"
               "$XDG_CONFIG_HOME/clattn/tuning or ~/.config/clattn/tuning), which later\n"
               "contexts on the device read. --dry-run writes nothing.\n"
               "--variant auto times every variant the device runs instead, each op\n"
               "apart, over the rounds, and keeps the fastest as the op's auto entry for\n"
               "the problem's size class (short: q_seq and kv_seq up to 1024; else long),\n"
               "which contexts made without a variant then run.\n");
        return 0;
    }
    const char *variant = NULL, *device = NULL, *dtype_name = "f32", *op_name = "both";
    const char *list = NULL, *file = NULL;
    uint32_t q_seq = 2048, kv_seq = 0, heads = 16, kv_heads = 0, head_dim = 0, batch = 1;
    uint32_t reps = 5, rounds = 2;
    int causal = 0, dry_run = 0, write_best = 0;
    opt opts[] = {
        {"--variant", OPT_STRING, &variant, 1, 0},   {"--head-dim", OPT_UINT, &head_dim, 1, 0},
        {"--dtype", OPT_STRING, &dtype_name, 0, 0},  {"--q-seq", OPT_UINT, &q_seq, 0, 0},
        {"--kv-seq", OPT_UINT, &kv_seq, 0, 0},       {"--heads", OPT_UINT, &heads, 0, 0},
        {"--kv-heads", OPT_UINT, &kv_heads, 0, 0},   {"--batch", OPT_UINT, &batch, 0, 0},
        {"--causal", OPT_FLAG, &causal, 0, 0},       {"--op", OPT_STRING, &op_name, 0, 0},
        {"--device", OPT_STRING, &device, 0, 0},     {"--reps", OPT_UINT, &reps, 0, 0},
        {"--rounds", OPT_UINT, &rounds, 0, 0},       {"--candidates", OPT_STRING, &list, 0, 0},
        {"--file", OPT_STRING, &file, 0, 0},         {"--dry-run", OPT_FLAG, &dry_run, 0, 0},
        {"--write-best", OPT_FLAG, &write_best, 0, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0]))
        return EXIT_INPUT;
    const int choose = !strcmp(variant, "auto");
    const clattn_ocl_search *search = clattn_ocl_search_of(variant);
    if (!search && !choose) {
        char names[128];
        clattn_ocl_searchable(names, sizeof names);
        fprintf(stderr, "clattn tune: --variant wants %s or auto, not '%s'\n", names, variant);
        return EXIT_INPUT;
    }
    const int both = !strcmp(op_name, "both"), fwd = both || !strcmp(op_name, "forward");
    if (!fwd && strcmp(op_name, "backward")) {
        fprintf(stderr, "clattn tune: --op wants forward, backward or both, not '%s'\n", op_name);
        return EXIT_INPUT;
    }
    if (reps == 0 || reps > 1000 || rounds > 20) {
        fprintf(stderr, "clattn tune: --reps wants 1 to 1000 and --rounds 0 to 20\n");
        return EXIT_INPUT;
    }
    clattn_dtype dt;
    if (!parse_dtype(cmd, dtype_name, &dt))
        return EXIT_INPUT;
    bench b[2];
    memset(b, 0, sizeof b);
    b[0].s = clattn_shape_default();
    b[0].s.batch = batch;
    b[0].s.q_seq = q_seq;
    b[0].s.kv_seq = kv_seq ? kv_seq : q_seq;
    b[0].s.num_heads = heads;
    b[0].s.num_kv_heads = kv_heads ? kv_heads : heads;
    b[0].s.head_dim = head_dim;
    b[0].s.causal = causal;
    b[0].s.dtype = dt;
    clattn_status st = clattn_shape_validate(&b[0].s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn tune: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return EXIT_INPUT;
    }
    const int nops = both ? 2 : 1;
    b[0].op = fwd ? BENCH_FORWARD : BENCH_BACKWARD;
    b[1] = b[0];
    b[1].op = BENCH_BACKWARD;

    static candidate c[MAX_CANDIDATES + 1]; /* c[0]: the table's */
    memset(c, 0, sizeof c);
    size_t n = 1;
    if (choose && list) {
        fprintf(stderr, "clattn tune: --candidates is for a variant's shapes, not auto\n");
        return EXIT_INPUT;
    }
    for (const char *p = list; p && *(p += strspn(p, " ;\t"));) {
        const size_t len = strcspn(p, " ;\t");
        char text[26];
        snprintf(text, sizeof text, "%.*s", (int)(len < 24 ? len : 24), p);
        if (len > 24 || n > MAX_CANDIDATES || !search->candidate(text, c[n].text)) {
            fprintf(stderr, "clattn tune: --candidates wants up to %d shapes %s, not '%s'\n",
                    MAX_CANDIDATES, search->form, text);
            return EXIT_INPUT;
        }
        ++n;
        p += len;
    }
    char path[1024];
    const char *set_path = getenv("CLATTN_TUNING_FILE");
    const int default_path = !file && !(set_path && *set_path); /* under a config folder */
    const int have_path = file ? snprintf(path, sizeof path, "%s", file) < (int)sizeof path
                               : clattn_tuning_file_path(path, sizeof path) == CLATTN_OK;
    if (!have_path && !dry_run) {
        fprintf(stderr, "clattn tune: no tuning file: give --file, or set HOME or "
                        "XDG_CONFIG_HOME, or --dry-run\n");
        return EXIT_INPUT;
    }
    /* The tuner's contexts: the table's shape or a candidate's, never a
     * file's. One op tuned alone is set, and kept, as the search says
     * (tiled's backward apart from its forward). */
    const int ops = both ? SEARCH_BOTH : fwd ? SEARCH_FORWARD : SEARCH_BACKWARD;
    const char *var = choose ? NULL : search->variable[ops];
    const char *entry = choose ? NULL : search->entry[ops];
    int env_failed = setenv("CLATTN_TUNING_FILE", "off", 1);
    const char *shaping;
    for (size_t i = 0; (shaping = clattn_ocl_search_variable(i)) != NULL; ++i)
        env_failed |= unsetenv(shaping);
    if (env_failed) {
        fprintf(stderr, "clattn tune: cannot set the environment\n");
        return EXIT_INPUT;
    }

    clattn_context *base = NULL;
    int rc = open_context(cmd, device, choose ? NULL : variant, &base);
    if (rc)
        return rc;
    char key[400], selector[32];
    size_t max_wg = 0;
    const char *dev = clattn_context_device(base), *idx = strrchr(dev, '(');
    if (clattn_context_backend(base) == CLATTN_BACKEND_NATIVE || !idx ||
        sscanf(idx, "(%31[0-9:])", selector) != 1 ||
        clattn_context_tuning_key(base, key, sizeof key) != CLATTN_OK ||
        !device_max_wg(base, &max_wg)) {
        fprintf(stderr, "clattn tune: tunes an OpenCL device's kernels; %s is not one\n", dev);
        clattn_context_destroy(base);
        return EXIT_INPUT;
    }
    printf("tuning %s, %s, head_dim %u, batch %u, q_seq %u, kv_seq %u, %u heads, %u KV heads%s "
           "on %s\n",
           variant, dtype_name, head_dim, batch, q_seq, b[0].s.kv_seq, heads,
           b[0].s.num_kv_heads, causal ? ", causal" : "", dev);
    const clattn_backend backend = clattn_context_backend(base);
    clattn_context_destroy(base);
    if (choose) {
        for (int i = 0; i < nops && !rc; ++i)
            rc = bench_prepare(cmd, &b[i], 1);
        if (!rc && default_path && !dry_run)
            make_config_folder(path);
        if (!rc)
            rc = tune_auto(selector, backend, b, nops, (int)reps, rounds, dry_run, path, key);
        goto done;
    }
    int stage = n == 1; /* no --candidates: the two stages */
    if (stage)
        /* micro-tiles where the GPU table has them: the forward's at every
         * head_dim, the backward's up to 128 */
        generate(search, 1, NULL, head_dim, both || !fwd ? 128 : CLATTN_MAX_HEAD_DIM, dt,
                 max_wg, c, &n);

    rc = 0;
    for (int i = 0; i < nops && !rc; ++i)
        rc = bench_prepare(cmd, &b[i], 1);
    /* The sweep: the table's shape first, then every candidate once; the
     * second stage's candidates once the first stage's winner is known. */
    for (size_t i = 0; i < n && !rc; ++i) {
        if (!(rc = time_candidate(selector, variant, var, b, nops, (int)reps, &c[i])) &&
            c[i].ok) {
            size_t same = 0;
            while (same < i && !(c[same].ok && c[i].ran[0] && !strcmp(c[same].ran, c[i].ran)))
                ++same;
            if (same < i) { /* fitted to an earlier shape, or one twice: timed once */
                printf("  %-14s builds the kernels of %s here\n", c[i].text,
                       c[same].text[0] ? c[same].text : "the table's shape");
                c[i].ok = 0;
            } else {
                print_candidate(&c[i], b, nops);
            }
        }
        if (stage == 1 && i + 1 == n && !rc) {
            size_t best = 0;
            for (size_t j = 1; j < n; ++j)
                if (c[j].ok && (!best || c[j].total < c[best].total))
                    best = j;
            if (best)
                generate(search, 2, c[best].text, head_dim, 0, dt, max_wg, c, &n);
            stage = 2;
        }
    }
    if (!rc && !c[0].ok) {
        fprintf(stderr, "clattn tune: the table's shape does not run here\n");
        rc = EXIT_DEVICE;
    }
    if (rc)
        goto done;
    /* Candidates whose error is well beyond the table's are out. */
    const double floor = dt == CLATTN_DTYPE_F32 ? 1e-5 : dt == CLATTN_DTYPE_F16 ? 2e-3 : 1.6e-2;
    const double gate = 2.0 * c[0].error + floor;
    for (size_t i = 1; i < n; ++i)
        if (c[i].ok && !(c[i].error <= gate)) {
            printf("  %-14s left out: max_error %.3g beyond %.3g\n", c[i].text, c[i].error, gate);
            c[i].ok = 0;
        }
    qsort(c + 1, n - 1, sizeof *c, by_total);
    size_t finalists = 1;
    while (finalists <= FINALISTS && finalists < n && c[finalists].ok)
        ++finalists;
    /* The finalists again with the table's, interleaved: a shared machine
     * drifts over minutes. */
    for (size_t i = 0; i < finalists; ++i)
        c[i].sum = rounds ? 0.0 : c[i].total;
    for (uint32_t r = 0; r < rounds && !rc; ++r) {
        printf("round %u:\n", r + 1);
        for (size_t i = 0; i < finalists && !rc; ++i)
            if (!(rc = time_candidate(selector, variant, var, b, nops, (int)reps, &c[i])) &&
                c[i].ok) {
                c[i].sum += c[i].total;
                print_candidate(&c[i], b, nops);
            } else if (!rc) {
                c[i].sum = INFINITY;
            }
    }
    if (rc)
        goto done;
    size_t best = write_best && finalists > 1 ? 1 : 0;
    for (size_t i = 1; i < finalists; ++i)
        if (c[i].sum < c[best].sum)
            best = i;
    if (!best || (!write_best && c[best].sum > 0.97 * c[0].sum)) {
        printf("the table's shape stays: no candidate is 3%% faster\n");
        goto done;
    }
    printf("best: %s, %.1f%% of the table's time\n", c[best].text,
           100.0 * c[best].sum / c[0].sum);
    if (dry_run)
        goto done;
    if (default_path)
        make_config_folder(path);
    if (clattn_tuning_file_store(path, entry, dt, head_dim, c[best].text, key) != CLATTN_OK) {
        fprintf(stderr, "clattn tune: %s\n", clattn_last_error());
        rc = EXIT_INPUT;
    } else {
        printf("kept in %s\n", path);
    }
done:
    for (int i = 0; i < 2; ++i)
        bench_free(&b[i]);
    return rc;
}
