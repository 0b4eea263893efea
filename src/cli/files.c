/* The commands on .npy files: forward, backward, grad-v and merge. Their
 * outputs go through outputs.h: written under temporary names and renamed
 * only once all of them are written. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"
#include "npy.h"

#include "cli.h"
#include "outputs.h"


/* Reads a .npy tensor for a command; prints the reason on failure. */
static int load(const char *cmd, const char *path, npy_array *a)
{
    char err[512];
    if (npy_read(path, a, err, sizeof err) != 0) {
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return 0;
    }
    if (a->ints || a->bools) {
        fprintf(stderr, "clattn %s: %s holds %s; tensors are float32, float16 or "
                        "bfloat16 bits\n", cmd, path, a->ints ? "int32 ('<i4')" : "bools ('|b1')");
        npy_free(a);
        return 0;
    }
    return 1;
}

/* Reads packed sequences' prefix sums: a 1-D int32 ('<i4') array of at
 * least two entries, none negative, into a new uint32 array. */
static uint32_t *load_seqlens(const char *cmd, const char *flag, const char *path, size_t *n)
{
    npy_array a;
    char err[512];
    if (npy_read(path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return NULL;
    }
    uint32_t *cu = NULL;
    if (!a.ints || a.ndim != 1 || a.count < 2)
        fprintf(stderr, "clattn %s: %s %s: want a 1-D int32 ('<i4') array of batch + 1 prefix "
                        "sums\n", cmd, flag, path);
    else if (!(cu = malloc(a.count * sizeof *cu)))
        fprintf(stderr, "clattn %s: out of memory\n", cmd);
    for (size_t i = 0; cu && i < a.count; ++i) {
        if (a.ints[i] < 0) {
            fprintf(stderr, "clattn %s: %s %s: entry %zu is %d, negative\n", cmd, flag, path, i,
                    (int)a.ints[i]);
            free(cu);
            cu = NULL;
            break;
        }
        cu[i] = (uint32_t)a.ints[i];
    }
    *n = a.count;
    npy_free(&a);
    return cu;
}

/* Checks that a has ndim dims (3, or 4 with batch) and each of want, where
 * a want of 0 takes the array's size and stores it. */
static int check_dims(const char *cmd, const char *what, const npy_array *a, int batched,
                      size_t want[4])
{
    int ndim = batched ? 4 : 3;
    if (a->ndim != ndim) {
        const char *last = strncmp(what, "LSE", 3) ? "head_dim" : "2";
        fprintf(stderr, "clattn %s: %s has %d dimensions, want %d (%sseq, heads, %s)\n", cmd,
                what, a->ndim, ndim, batched ? "batch, " : "", last);
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
    uint32_t *cu_q, *cu_kv; /* packed sequences' prefix sums, or NULL */
} inputs;

static void inputs_free(inputs *in)
{
    npy_free(&in->q);
    npy_free(&in->k);
    npy_free(&in->v);
    npy_free(&in->o);
    npy_free(&in->lse);
    npy_free(&in->d_out);
    free(in->cu_q);
    free(in->cu_kv);
}

typedef struct input_paths {
    const char *q, *k, *v, *o, *lse, *d_out;
    const char *cu_q, *cu_kv; /* --cu-seqlens-q and --cu-seqlens-kv */
} input_paths;

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
    const int bits = descr_dtype(d) == CLATTN_DTYPE_BF16;
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
    *dtype = descr_dtype(d);
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
    int causal, bottom_right;
    uint32_t window, window_right, q_offset, kv_offset;
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
    if (!paths->cu_q != !paths->cu_kv) {
        fprintf(stderr, "clattn %s: packed sequences want both --cu-seqlens-q and "
                        "--cu-seqlens-kv\n", cmd);
        return 0;
    }
    size_t nq = 0, nkv = 0;
    if (paths->cu_q &&
        (!(in->cu_q = load_seqlens(cmd, "--cu-seqlens-q", paths->cu_q, &nq)) ||
         !(in->cu_kv = load_seqlens(cmd, "--cu-seqlens-kv", paths->cu_kv, &nkv))))
        return 0;
    if (paths->cu_q && (nq != nkv || nq - 1 > UINT32_MAX)) {
        fprintf(stderr, "clattn %s: --cu-seqlens-q has %zu entries and --cu-seqlens-kv %zu: "
                        "both want batch + 1\n", cmd, nq, nkv);
        return 0;
    }
    if (paths->cu_q && in->q.ndim != 3) {
        fprintf(stderr, "clattn %s: packed sequences want 3-D arrays (rows, heads, head_dim); "
                        "Q has %d dimensions\n", cmd, in->q.ndim);
        return 0;
    }
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
    s->causal = mask->bottom_right ? CLATTN_CAUSAL_BOTTOM_RIGHT : mask->causal;
    s->window = mask->window;
    s->window_right = mask->window_right;
    s->scale = mask->scale;
    s->q_offset = mask->q_offset;
    s->kv_offset = mask->kv_offset;
    if (in->cu_q) {
        s->batch = (uint32_t)(nq - 1);
        s->cu_seqlens_q = in->cu_q;
        s->cu_seqlens_kv = in->cu_kv;
    }
    clattn_status st = clattn_shape_validate(s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        return 0;
    }
    return 1;
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

/* The usage lines of the options every file command takes, each line
 * after `indent`. */
#define OPTIONS_USAGE_AT(indent)                                                            \
    indent "[--causal | --causal-bottom-right] [--window N | --window-left L]\n" indent     \
           "[--window-right N]\n" indent                                                   \
           "[--scale S] [--q-offset N] [--kv-offset N] [--device SEL]\n" indent            \
           "[--variant NAME] [--dtype T]\n" indent                                         \
           "[--cu-seqlens-q CQ.npy --cu-seqlens-kv CK.npy]\n" MOD_USAGE_AT(indent)

static const file_command file_commands[] = {
    {"forward",
     "usage: clattn forward --q Q.npy --k K.npy --v V.npy --out O.npy --lse-out LSE.npy\n"
     OPTIONS_USAGE_AT("                      ")
     "Attention's forward: O (q_seq, heads, head_dim) and the LSE pairs (q_seq,\n"
     "heads, 2) that the gradients read. Arrays as for grad-v; exit 0, 1 on a\n"
     "device failure, 2 on bad input (and then no output is left).\n",
     READS_V, 2, {"--out", "--lse-out"}, {LIKE_Q, LIKE_LSE}},
    {"backward",
     "usage: clattn backward --q Q.npy --k K.npy --v V.npy --o O.npy --lse LSE.npy\n"
     "                       --d-out DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy\n"
     "                       [--d-sinks DS.npy] [--d-bias DB.npy] [--d-score-params DP.npy]\n"
     OPTIONS_USAGE_AT("                       ")
     "Attention's backward from the forward's O and LSE and the output gradient\n"
     "dO: dQ like Q, dK and dV like K; with --sinks (the forward's), --d-sinks\n"
     "writes their gradient (float32, one per query head); with a float --bias,\n"
     "--d-bias writes its gradient in its shape (float32); with --score-params,\n"
     "--d-score-params writes theirs (float32, on the host: --score-fn's file\n"
     "defines clattn_score_dp). Exit 0, 1 on a device failure, 2\n"
     "on bad input (and then none of the outputs is left).\n",
     READS_V | READS_O | READS_LSE | READS_DO, 3, {"--dq", "--dk", "--dv"},
     {LIKE_Q, LIKE_K, LIKE_K}},
    {"grad-v",
     "usage: clattn grad-v --q Q.npy --k K.npy --d-out DO.npy --lse LSE.npy --out DV.npy\n"
     OPTIONS_USAGE_AT("                    ")
     "The gradient of attention with respect to V. Arrays are .npy, C order:\n"
     "Q and dO (q_seq, heads, head_dim), K (kv_seq, kv_heads, head_dim), LSE\n"
     "(q_seq, heads, 2), each with an optional leading batch dimension; DV is\n"
     "written as (kv_seq, kv_heads, head_dim). The tensors share one dtype:\n"
     "float32 '<f4', float16 '<f2', or with --dtype bf16 bfloat16 bit patterns in\n"
     "'<u2' or '<i2'; outputs are written in it, the LSE pairs always in '<f4'.\n"
     "Exit 0 on success, 1 on a device failure, 2 on bad input (and then no\n"
     "output file is left). --q-offset and --kv-offset are the global positions\n"
     "of the first query and key (default 0): the causal and window masks compare\n"
     "global positions. --causal aligns top-left (key t <= query t, as PyTorch's\n"
     "is_causal), --causal-bottom-right aligns the last query with the last key\n"
     "(as FlashAttention); they differ only where kv_seq != q_seq. --window N keeps\n"
     "keys less than N before the query; --window-right N (with a causal flag,\n"
     "which aligns it) keys up to N after it: FlashAttention's window_size\n"
     "(N - 1, N). --window-left L is --window L + 1: window_size (L, R) is\n"
     "--window-left L --window-right R.\n"
     "--cu-seqlens-q and --cu-seqlens-kv pack variable-length sequences: int32\n"
     "'<i4' arrays of batch + 1 prefix sums from 0, with the tensors as 3-D\n"
     "arrays of all the sequences' rows; each sequence is its own problem.\n"
     "Score modifiers, in this order: --softcap C caps scores at C * tanh(s / C);\n"
     "--alibi SLOPES.npy (float32, one slope per query head) subtracts\n"
     "slope * |P - T|; --dropout P drops attention probabilities with the mask\n"
     "drawn from --seed S at --dropout-offset N (default 0), the same on every\n"
     "device; the backward needs the forward's seed and offset. --sinks SINKS.npy\n"
     "(float32, one logit per query head) joins each row's softmax as a key with\n"
     "no value (gpt-oss's sinks); only the forward reads it.\n"
     "The caller's functions (docs/programmable.md), after those: --score-fn\n"
     "FILE.cl defines clattn_score and clattn_score_ds in OpenCL C, with the\n"
     "float32 parameters of --score-params P.npy; --mask-fn FILE.cl defines\n"
     "clattn_mask. The native backend compiles the same files as C99 with $CC\n"
     "(default cc) and loads them. --bias B.npy, 4-d (batch or 1, query heads or\n"
     "1, q_seq, kv_seq), is added to the scores after the score function where it\n"
     "is float32 ('<f4'), float16 ('<f2') or bfloat16 bits ('<u2', '<i2'), and\n"
     "hides the pairs where it is false where it is bool ('|b1'); not with\n"
     "--cu-seqlens.\n",
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
    const char *outp[MAX_OUTPUTS] = {NULL}, *device = NULL, *variant = NULL, *dtype = NULL;
    mask_opts mask = {0, 0, 0, 0, 0, 0, 0.0f};
    mod_opts mods = {0};
    const char *d_sinks = NULL, *d_bias = NULL, *d_params = NULL;
    uint32_t window_left = 0;
    opt opts[36] = {
        {"--q", OPT_STRING, &paths.q, 1, 0},
        {"--k", OPT_STRING, &paths.k, 1, 0},
        {"--causal", OPT_FLAG, &mask.causal, 0, 0},
        {"--causal-bottom-right", OPT_FLAG, &mask.bottom_right, 0, 0},
        {"--window", OPT_UINT, &mask.window, 0, 0},
        {"--window-right", OPT_UINT, &mask.window_right, 0, 0},
        {"--window-left", OPT_UINT, &window_left, 0, 0},
        {"--scale", OPT_POSITIVE, &mask.scale, 0, 0},
        {"--q-offset", OPT_UINT, &mask.q_offset, 0, 0},
        {"--kv-offset", OPT_UINT, &mask.kv_offset, 0, 0},
        {"--device", OPT_STRING, &device, 0, 0},
        {"--variant", OPT_STRING, &variant, 0, 0},
        {"--dtype", OPT_STRING, &dtype, 0, 0},
        {"--cu-seqlens-q", OPT_STRING, &paths.cu_q, 0, 0},
        {"--cu-seqlens-kv", OPT_STRING, &paths.cu_kv, 0, 0},
    };
    size_t n = 15;
    mod_opts_add(opts, &n, &mods);
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
    const int backward = fc->nout == 3;
    if (backward) {
        opts[n++] = (opt){"--d-sinks", OPT_STRING, &d_sinks, 0, 0};
        opts[n++] = (opt){"--d-bias", OPT_STRING, &d_bias, 0, 0};
        opts[n++] = (opt){"--d-score-params", OPT_STRING, &d_params, 0, 0};
    }
    /* The files written: the command's, then d sinks, d bias and d params
     * where asked. */
    const char *out_opt[MAX_OUTPUTS];
    for (int i = 0; i < fc->nout; ++i)
        out_opt[i] = fc->out_opt[i];
    if (!parse_opts(cmd, argc, argv, opts, n) ||
        !window_left_apply(cmd, opts, n, window_left, &mask.window))
        return EXIT_INPUT;
    int nout = fc->nout;
    const int sinks_at = d_sinks ? nout++ : -1, bias_at = d_bias ? nout++ : -1;
    const int params_at = d_params ? nout++ : -1;
    if (d_sinks)
        outp[sinks_at] = d_sinks, out_opt[sinks_at] = "--d-sinks";
    if (d_bias)
        outp[bias_at] = d_bias, out_opt[bias_at] = "--d-bias";
    if (d_params)
        outp[params_at] = d_params, out_opt[params_at] = "--d-score-params";
    if (d_params && !mods.params_file) {
        fprintf(stderr, "clattn %s: --d-score-params wants --score-params: the gradient is "
                        "theirs\n", cmd);
        return EXIT_INPUT;
    }
    if (d_sinks && !mods.sinks_file) {
        fprintf(stderr, "clattn %s: --d-sinks wants --sinks: the gradient is the sinks'\n", cmd);
        return EXIT_INPUT;
    }
    if (d_bias && !mods.bias_file) {
        fprintf(stderr, "clattn %s: --d-bias wants --bias: the gradient is the bias's\n", cmd);
        return EXIT_INPUT;
    }
    if (!check_outputs(cmd, out_opt, outp, nout))
        return EXIT_INPUT;

    inputs in = {0};
    clattn_shape s;
    clattn_context *ctx = NULL;
    void *out[MAX_OUTPUTS] = {NULL};
    output outs[MAX_OUTPUTS];
    size_t lse_shape[NPY_MAX_DIMS], heads_shape[1], params_shape[1];
    int rc = EXIT_INPUT;
    if (!load_inputs(cmd, &paths, &in, &mask, dtype, &s) || !mod_apply(cmd, opts, n, &mods, &s))
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
    if (d_bias && !mods.bias) {
        fprintf(stderr, "clattn %s: --d-bias wants a float --bias: a bool mask has no "
                        "gradient\n", cmd);
        goto done;
    }
    if (d_sinks) { /* one float32 a query head */
        heads_shape[0] = s.num_heads;
        out[sinks_at] = malloc(s.num_heads * sizeof(float));
        outs[sinks_at] = (output){d_sinks, heads_shape, 1, "<f4", out[sinks_at]};
    }
    if (d_bias) { /* the bias's shape */
        const size_t *b = mods.bias_shape;
        out[bias_at] = malloc(b[0] * b[1] * b[2] * b[3] * sizeof(float));
        outs[bias_at] = (output){d_bias, mods.bias_shape, 4, "<f4", out[bias_at]};
    }
    if (d_params) { /* one float32 a parameter */
        params_shape[0] = s.score_params_count;
        out[params_at] = malloc(s.score_params_count * sizeof(float));
        outs[params_at] = (output){d_params, params_shape, 1, "<f4", out[params_at]};
    }
    if ((d_sinks && !out[sinks_at]) || (d_bias && !out[bias_at]) ||
        (d_params && !out[params_at])) {
        fprintf(stderr, "clattn %s: out of memory\n", cmd);
        rc = EXIT_DEVICE;
        goto done;
    }
    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    /* the host sums the parameters' gradient, by the functions' C forms */
    if (!mod_native(cmd, clattn_context_backend(ctx) == CLATTN_BACKEND_NATIVE || d_params,
                    &mods, &s)) {
        rc = EXIT_INPUT;
        goto done;
    }
    if (d_params && !s.score_dp_native) {
        fprintf(stderr, "clattn %s: --d-score-params wants clattn_score_dp, the score "
                        "function's derivative in its parameters, in %s (docs/programmable.md)\n",
                cmd, mods.score_file);
        rc = EXIT_INPUT;
        goto done;
    }
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
    if (st == CLATTN_OK && d_sinks)
        st = clattn_grad_sinks(ctx, &s, elements(&in.o), in.lse.data, elements(&in.d_out),
                               out[sinks_at]);
    if (st == CLATTN_OK && d_bias)
        st = clattn_grad_bias(ctx, &s, elements(&in.q), elements(&in.k), elements(&in.v),
                              elements(&in.o), in.lse.data, elements(&in.d_out), out[bias_at]);
    if (st == CLATTN_OK && d_params)
        st = clattn_grad_score_params(ctx, &s, elements(&in.q), elements(&in.k),
                                      elements(&in.v), elements(&in.o), in.lse.data,
                                      elements(&in.d_out), out[params_at]);
    if (st != CLATTN_OK) {
        rc = op_failed(cmd, st);
        if (st == CLATTN_ERROR_BUILD_FAILED && (mods.score_src || mods.mask_src))
            rc = EXIT_INPUT; /* the caller's functions did not compile */
        goto done;
    }
    rc = write_outputs(cmd, out_opt, outs, nout) ? 0 : EXIT_INPUT;
done:
    clattn_context_destroy(ctx);
    for (int i = 0; i < MAX_OUTPUTS; ++i)
        free(out[i]);
    inputs_free(&in);
    mod_free(&mods);
    return rc;
}

int cmd_file_named(const char *name, int argc, char **argv, int *rc)
{
    for (size_t i = 0; i < sizeof file_commands / sizeof file_commands[0]; ++i)
        if (!strcmp(name, file_commands[i].name)) {
            *rc = cmd_file(&file_commands[i], argc, argv);
            return 1;
        }
    return 0;
}

/* clattn merge: two partial (O, LSE) results into that of their union. */
int cmd_merge(int argc, char **argv)
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
    static const char *const out_flags[2] = {"--out", "--lse-out"};
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0]))
        return EXIT_INPUT;
    const char *const out_paths[2] = {out_o, out_lse};
    if (!check_outputs(cmd, out_flags, out_paths, 2))
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
    rc = write_outputs(cmd, out_flags, outs, 2) ? 0 : EXIT_INPUT;
done:
    clattn_context_destroy(ctx);
    free(o);
    free(lse);
    npy_free(&l2);
    inputs_free(&in);
    return rc;
}
