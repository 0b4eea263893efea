/* clattn bench: times an op on one device, each kernel variant side by side
 * in one run. OpenCL devices are timed on device-resident buffers through
 * the _cl calls (what a caller holding cl_mem sees); native on host memory.
 * Builds and a warm-up call are excluded; the figure is the median of the
 * timed calls. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const char *const bench_op_names[BENCH_OPS] = {"grad-v", "forward", "backward", "grad-bias",
                                               "grad-score-params"};

/* The ops whose output is a host array of float32 whatever the tensors:
 * the gradients summed over the pairs. */
static int pair_sum(const bench *b)
{
    return b->op == BENCH_GRAD_BIAS || b->op == BENCH_GRAD_PARAMS;
}

enum { MAX_SEQS = 4096 };

/* Bytes of one element of tensor i in the timed calls: the LSE pairs
 * (input, or the forward's second output), dBias and the score
 * parameters' gradient are float32. */
static size_t elem_bytes(const bench *b, int i)
{
    const int f32 = i == T_LSE || (b->op == BENCH_FORWARD && i == T_OUT1) ||
                    (pair_sum(b) && i == T_OUT0);
    return f32 || b->s.dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2;
}

/* Elements of the bias (and bool mask, and dBias) of s: its layout,
 * [bias_batch or 1][bias_heads or 1][q_seq][kv_seq]. */
static size_t bias_elems(const clattn_shape *s)
{
    return (size_t)(s->bias_batch > 1 ? s->bias_batch : 1) *
           (s->bias_heads > 1 ? s->bias_heads : 1) * s->q_seq * s->kv_seq;
}

/* Writes text as a JSON string's contents. */
static void json_text(const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; ++c) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs the op once on host pointers; out receives the outputs. */
static clattn_status run_host(clattn_context *ctx, const bench *b, void *const out[3])
{
    void *const *h = b->elems;
    switch (b->op) {
    case BENCH_GRAD_V:
        return clattn_grad_v(ctx, &b->s, h[T_DO], h[T_Q], h[T_K], h[T_LSE], out[0]);
    case BENCH_FORWARD:
        return clattn_forward(ctx, &b->s, h[T_Q], h[T_K], h[T_V], out[0], out[1]);
    case BENCH_BACKWARD:
        return clattn_backward(ctx, &b->s, h[T_Q], h[T_K], h[T_V], h[T_O], h[T_LSE], h[T_DO],
                               out[0], out[1], out[2]);
    case BENCH_GRAD_BIAS:
        return clattn_grad_bias(ctx, &b->s, h[T_Q], h[T_K], h[T_V], h[T_O], h[T_LSE], h[T_DO],
                                out[0]);
    case BENCH_GRAD_PARAMS:
        return clattn_grad_score_params(ctx, &b->s, h[T_Q], h[T_K], h[T_V], h[T_O], h[T_LSE],
                                        h[T_DO], out[0]);
    case BENCH_OPS:
        break;
    }
    return CLATTN_ERROR_INVALID_OPTION;
}

/* Enqueues the op once on device buffers (the pair sums: runs it, into
 * host out). */
static clattn_status run_cl(clattn_context *ctx, const bench *b, const clattn_cl_tensor *t,
                            void *out, cl_event *done)
{
    switch (b->op) {
    case BENCH_GRAD_V:
        return clattn_grad_v_cl(ctx, &b->s, t[T_DO], t[T_Q], t[T_K], t[T_LSE], t[T_OUT0], 0,
                                NULL, done);
    case BENCH_FORWARD:
        return clattn_forward_cl(ctx, &b->s, t[T_Q], t[T_K], t[T_V], t[T_OUT0], t[T_OUT1], 0,
                                 NULL, done);
    case BENCH_BACKWARD:
        return clattn_backward_cl(ctx, &b->s, t[T_Q], t[T_K], t[T_V], t[T_O], t[T_LSE],
                                  t[T_DO], t[T_OUT0], t[T_OUT1], t[T_OUT2], 0, NULL, done);
    case BENCH_GRAD_BIAS:
        return clattn_grad_bias_cl(ctx, &b->s, t[T_Q], t[T_K], t[T_V], t[T_O], t[T_LSE], t[T_DO],
                                   out, 0, NULL);
    case BENCH_GRAD_PARAMS:
        return clattn_grad_score_params_cl(ctx, &b->s, t[T_Q], t[T_K], t[T_V], t[T_O], t[T_LSE],
                                           t[T_DO], out, 0, NULL);
    case BENCH_OPS:
        break;
    }
    return CLATTN_ERROR_INVALID_OPTION;
}

/* Times reps calls of one variant; fills seconds (median) and max_error
 * (max |got - native| / max |native| over the outputs, NAN on native). */
clattn_status bench_time(clattn_context *ctx, const bench *b, int reps, double *seconds,
                         double *max_error)
{
    double *times = malloc((size_t)reps * sizeof(double));
    float *out[3] = {NULL, NULL, NULL};
    void *raw[3] = {NULL, NULL, NULL}; /* the outputs in the call's dtype */
    clattn_cl_tensor t[T_COUNT];
    memset(t, 0, sizeof t);
    clattn_status st = CLATTN_OK;
    for (int i = 0; i < b->nout; ++i)
        if (!(out[i] = alloc_floats(b->n[T_OUT0 + i])) ||
            !(raw[i] = malloc(b->n[T_OUT0 + i] * elem_bytes(b, T_OUT0 + i) + 1)))
            st = CLATTN_ERROR_OUT_OF_MEMORY;
    if (!times)
        st = CLATTN_ERROR_OUT_OF_MEMORY;
    const int on_cl = clattn_context_backend(ctx) != CLATTN_BACKEND_NATIVE;
    cl_context cctx = clattn_context_cl_context(ctx);
    cl_command_queue queue = clattn_context_cl_queue(ctx);
    for (int i = 0; i < T_OUT0 + b->nout && on_cl && st == CLATTN_OK; ++i) {
        cl_int err;
        const cl_mem_flags flags = CL_MEM_READ_WRITE | (i < T_OUT0 ? CL_MEM_COPY_HOST_PTR : 0);
        /* the tensor's bytes exactly: a copy reads that many from the host */
        const size_t bytes = b->n[i] * elem_bytes(b, i);
        t[i].buffer = clCreateBuffer(cctx, flags, bytes ? bytes : 1,
                                     i < T_OUT0 && bytes ? b->elems[i] : NULL, &err);
        if (err != CL_SUCCESS) {
            fprintf(stderr, "clattn bench: clCreateBuffer of %zu floats failed (%d)\n", b->n[i],
                    err);
            st = CLATTN_ERROR_OPENCL;
        }
    }
    /* The bias and bool mask on the device too, as the tensors are. */
    bench dev = *b;
    cl_mem held[2] = {NULL, NULL};
    const size_t bias_n = bias_elems(&b->s);
    const void *arrays[2] = {b->s.bias, b->s.bool_mask};
    const size_t sizes[2] = {bias_n * (b->s.bias_dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2),
                             bias_n};
    for (int i = 0; i < 2 && on_cl && st == CLATTN_OK; ++i) {
        cl_int err = CL_SUCCESS;
        if (arrays[i])
            held[i] = clCreateBuffer(cctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizes[i],
                                     (void *)arrays[i], &err);
        if (err != CL_SUCCESS) {
            fprintf(stderr, "clattn bench: clCreateBuffer of the bias (%zu bytes) failed (%d)\n",
                    sizes[i], err);
            st = CLATTN_ERROR_OPENCL;
        }
    }
    dev.s.bias_cl = held[0];
    dev.s.bool_mask_cl = held[1];
    /* A warm-up call first, then the timed ones. */
    for (int r = -1; r < reps && st == CLATTN_OK; ++r) {
        double t0 = now();
        if (on_cl) {
            cl_event done = NULL;
            st = run_cl(ctx, &dev, t, raw[0], &done);
            if (st == CLATTN_OK && done && clWaitForEvents(1, &done) != CL_SUCCESS)
                st = CLATTN_ERROR_OPENCL;
            if (done)
                clReleaseEvent(done);
        } else {
            st = run_host(ctx, b, raw);
        }
        if (r >= 0)
            times[r] = now() - t0;
    }
    for (int i = 0; i < b->nout && on_cl && !pair_sum(b) && st == CLATTN_OK; ++i)
        if (clEnqueueReadBuffer(queue, t[T_OUT0 + i].buffer, CL_TRUE, 0,
                                b->n[T_OUT0 + i] * elem_bytes(b, T_OUT0 + i), raw[i], 0, NULL,
                                NULL) != CL_SUCCESS)
            st = CLATTN_ERROR_OPENCL;
    for (int i = 0; i < b->nout && st == CLATTN_OK; ++i)
        clattn_to_f32(elem_bytes(b, T_OUT0 + i) == 2 ? b->s.dtype : CLATTN_DTYPE_F32, raw[i],
                      out[i], b->n[T_OUT0 + i]);
    if (st == CLATTN_OK) {
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        *seconds = times[reps / 2];
        *max_error = NAN;
        if (on_cl || b->s.dtype != CLATTN_DTYPE_F32) {
            double diff = 0.0, ref = 0.0;
            for (int i = 0; i < b->nout; ++i)
                for (size_t j = 0; j < b->n[T_OUT0 + i]; ++j) {
                    double d = fabs((double)out[i][j] - b->want[i][j]);
                    diff = d > diff || isnan(d) ? d : diff;
                    ref = fabs(b->want[i][j]) > ref ? fabs(b->want[i][j]) : ref;
                }
            *max_error = diff / (ref > 0.0 ? ref : 1.0);
        }
    }
    for (int i = 0; i < T_COUNT; ++i)
        if (t[i].buffer)
            clReleaseMemObject(t[i].buffer);
    for (int i = 0; i < 2; ++i)
        if (held[i])
            clReleaseMemObject(held[i]);
    for (int i = 0; i < 3; ++i) {
        free(out[i]);
        free(raw[i]);
    }
    free(times);
    return st;
}

int bench_prepare(const char *cmd, bench *b, int reference)
{
    const clattn_dtype dt = b->s.dtype;
    const clattn_shape *s = &b->s;
    const size_t nb = s->cu_seqlens_q ? 1u : s->batch; /* packed: no batch dimension */
    const size_t nq = nb * s->q_seq * s->num_heads * s->head_dim;
    const size_t nkv = nb * s->kv_seq * s->num_kv_heads * s->head_dim;
    const size_t nlse = nb * s->q_seq * s->num_heads * 2;
    const size_t sizes[T_COUNT] = {nq, nkv, nkv, nq, nlse, nq, 0, 0, 0};
    memcpy(b->n, sizes, sizeof sizes);
    switch (b->op) {
    case BENCH_GRAD_V:
        b->n[T_OUT0] = nkv;
        b->nout = 1;
        break;
    case BENCH_FORWARD:
        b->n[T_OUT0] = nq;
        b->n[T_OUT1] = nlse;
        b->nout = 2;
        break;
    case BENCH_BACKWARD:
        b->n[T_OUT0] = nq;
        b->n[T_OUT1] = b->n[T_OUT2] = nkv;
        b->nout = 3;
        break;
    case BENCH_GRAD_BIAS:
        b->n[T_OUT0] = bias_elems(s);
        b->nout = 1;
        break;
    case BENCH_GRAD_PARAMS:
        if (!s->score_params_count) {
            fprintf(stderr, "clattn %s: grad-score-params wants --score-fn (defining "
                            "clattn_score_dp) and --score-params\n", cmd);
            return EXIT_INPUT;
        }
        b->n[T_OUT0] = s->score_params_count;
        b->nout = 1;
        break;
    case BENCH_OPS:
        break;
    }
    int ok = 1;
    for (int i = 0; i < T_OUT0; ++i) {
        ok = ok && (b->host[i] = alloc_floats(b->n[i])) != NULL;
        b->elems[i] = b->host[i];
        if (ok && dt && i != T_LSE)
            ok = (b->elems[i] = malloc(b->n[i] * 2 + 1)) != NULL;
    }
    for (int i = 0; i < b->nout; ++i)
        ok = ok && (b->want[i] = alloc_floats(b->n[T_OUT0 + i])) != NULL;
    if (!ok) {
        fprintf(stderr, "clattn %s: out of memory\n", cmd);
        return EXIT_DEVICE;
    }
    uint64_t state = 0x853C49E6748FEA9Bull;
    fill_uniform(b->host[T_Q], nq, 1.0f, &state);
    fill_uniform(b->host[T_K], nkv, 1.0f, &state);
    fill_uniform(b->host[T_V], nkv, 1.0f, &state);
    fill_uniform(b->host[T_DO], nq, 1.0f, &state);
    /* 16-bit: every input a value of the dtype, so that the float32
     * reference sees what the timed calls see. */
    const int inputs16[4] = {T_Q, T_K, T_V, T_DO};
    for (int i = 0; i < 4 && dt; ++i) {
        clattn_from_f32(dt, b->host[inputs16[i]], b->elems[inputs16[i]], b->n[inputs16[i]]);
        clattn_to_f32(dt, b->elems[inputs16[i]], b->host[inputs16[i]], b->n[inputs16[i]]);
    }
    clattn_context *native = NULL;
    clattn_options no = clattn_options_default();
    no.backend = CLATTN_BACKEND_NATIVE;
    clattn_status st = clattn_context_create(&no, &native);
    /* O and LSE from the native forward; native's float32 outputs are the
     * reference. */
    bench f32 = *b;
    f32.s.dtype = CLATTN_DTYPE_F32;
    memcpy(f32.elems, b->host, sizeof f32.elems);
    if (st == CLATTN_OK)
        st = clattn_forward(native, &f32.s, b->host[T_Q], b->host[T_K], b->host[T_V],
                            b->host[T_O], b->host[T_LSE]);
    if (st == CLATTN_OK && dt) { /* O as a 16-bit forward gives it */
        clattn_from_f32(dt, b->host[T_O], b->elems[T_O], b->n[T_O]);
        clattn_to_f32(dt, b->elems[T_O], b->host[T_O], b->n[T_O]);
    }
    if (st == CLATTN_OK && reference)
        st = run_host(native, &f32, (void *const *)b->want);
    clattn_context_destroy(native);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn %s: %s: %s\n", cmd, clattn_status_string(st),
                clattn_last_error());
        return EXIT_DEVICE;
    }
    return 0;
}

void bench_free(bench *b)
{
    for (int i = 0; i < T_OUT0; ++i) {
        if (b->elems[i] != b->host[i])
            free(b->elems[i]);
        free(b->host[i]);
        b->elems[i] = b->host[i] = NULL;
    }
    for (int i = 0; i < 3; ++i) {
        free(b->want[i]);
        b->want[i] = NULL;
    }
}

int cmd_bench(int argc, char **argv)
{
    const char *cmd = "bench";
    if (wants_help(argc, argv)) {
        printf("usage: clattn bench --op grad-v|forward|backward|grad-bias|grad-score-params\n"
               "                    --q-seq N [--kv-seq N] --heads H\n"
               "                    [--kv-heads KH] --head-dim D [--batch B]\n"
               "                    [--causal | --causal-bottom-right]\n"
               "                    [--window W | --window-left L] [--window-right R]\n"
               "                    [--device SEL] [--variant NAME|auto|all] [--reps R] [--threads N]\n"
               "                    [--dtype f32|f16|bf16] [--json]\n"
               "                    [--seqlens L,L,... | --random-seqlens MIN,MAX[,SEED]]\n"
               "                    [--layout packed|padded|uniform]\n"
               MOD_USAGE_AT("                    ")
               "Times the op on random inputs: compile and a warm-up call excluded, the\n"
               "median of R timed calls (default 10). OpenCL devices run on buffers that\n"
               "stay on the device. --variant all measures every variant of the device side\n"
               "by side; auto (or no --variant) the device's default. --threads N runs\n"
               "the CPU backends on N threads (native's CLATTN_NUM_THREADS and PoCL's\n"
               "POCL_MAX_PTHREAD_COUNT; 0 or none: every core). --dtype times 16-bit\n"
               "tensors (default f32); the inputs are then values of that dtype and\n"
               "max_error is against native's float32 outputs on them (so it shows the\n"
               "outputs' rounding, on native too).\n"
               "grad-bias times clattn_grad_bias (the gradient of --bias, or of a bias of\n"
               "0 without one), its float32 output read back to the host as the call does;\n"
               "grad-score-params clattn_grad_score_params (--score-fn's clattn_score_dp,\n"
               "--score-params' gradient) likewise.\n"
               "GFLOP/s count 4 (grad-v, forward and the pair sums) or 10 (backward)\n"
               "FLOP per visible (query, key) pair per head_dim element; max_error is\n"
               "max |out - native| / max |native| over the outputs (null on native\n"
               "itself).\n"
               "--seqlens or --random-seqlens (--batch sequences) times a batch of\n"
               "sequences of those lengths (self-attention, --q-seq not needed): packed\n"
               "(cu_seqlens), padded to the longest (GFLOP/s over the packed batch's\n"
               "pairs: the useful work), or a uniform batch of as many pairs in all.\n"
               "--softcap, --alibi, --dropout, --sinks and the caller's functions\n"
               "(--score-fn, --mask-fn) time the score modifiers as the file commands take\n"
               "them (clattn forward --help).\n");
        return 0;
    }
    const char *op_name = NULL, *device = NULL, *variant = NULL, *dtype_name = "f32";
    const char *seqlens = NULL, *random_lens = NULL, *layout = "packed";
    uint32_t q_seq = 0, kv_seq = 0, heads = 0, kv_heads = 0, head_dim = 0, batch = 1;
    uint32_t window = 0, window_right = 0, window_left = 0, reps = 10, threads = 0;
    int causal = 0, bottom_right = 0, json = 0;
    mod_opts mods = {0};
    opt opts[21 + MOD_OPTS] = {
        {"--op", OPT_STRING, &op_name, 1, 0},       {"--q-seq", OPT_UINT, &q_seq, 0, 0},
        {"--kv-seq", OPT_UINT, &kv_seq, 0, 0},      {"--heads", OPT_UINT, &heads, 1, 0},
        {"--kv-heads", OPT_UINT, &kv_heads, 0, 0},  {"--head-dim", OPT_UINT, &head_dim, 1, 0},
        {"--batch", OPT_UINT, &batch, 0, 0},        {"--causal", OPT_FLAG, &causal, 0, 0},
        {"--window", OPT_UINT, &window, 0, 0},      {"--device", OPT_STRING, &device, 0, 0},
        {"--window-right", OPT_UINT, &window_right, 0, 0},
        {"--window-left", OPT_UINT, &window_left, 0, 0},
        {"--variant", OPT_STRING, &variant, 0, 0},  {"--reps", OPT_UINT, &reps, 0, 0},
        {"--threads", OPT_UINT, &threads, 0, 0},    {"--json", OPT_FLAG, &json, 0, 0},
        {"--dtype", OPT_STRING, &dtype_name, 0, 0},
        {"--causal-bottom-right", OPT_FLAG, &bottom_right, 0, 0},
        {"--seqlens", OPT_STRING, &seqlens, 0, 0},
        {"--random-seqlens", OPT_STRING, &random_lens, 0, 0},
        {"--layout", OPT_STRING, &layout, 0, 0},
    };
    size_t nopts = 20;
    mod_opts_add(opts, &nopts, &mods);
    if (!parse_opts(cmd, argc, argv, opts, nopts) ||
        !window_left_apply(cmd, opts, nopts, window_left, &window))
        return EXIT_INPUT;
    /* Packed sequences: their lengths, from a list or drawn at random. */
    static uint32_t cu[MAX_SEQS + 1];
    uint32_t count = 0, longest = 0;
    if (seqlens && random_lens) {
        fprintf(stderr, "clattn bench: --seqlens or --random-seqlens, not both\n");
        return EXIT_INPUT;
    }
    if (seqlens) {
        for (const char *p = seqlens; *p;) {
            char *end;
            const unsigned long len = strtoul(p, &end, 10);
            if (end == p || len > UINT32_MAX / 2 || count == MAX_SEQS ||
                (*end && *end != ',') || cu[count] + len > UINT32_MAX / 2) {
                fprintf(stderr, "clattn bench: --seqlens wants up to %d lengths, "
                                "comma-separated, not '%s'\n", MAX_SEQS, seqlens);
                return EXIT_INPUT;
            }
            cu[count + 1] = cu[count] + (uint32_t)len;
            longest = len > longest ? (uint32_t)len : longest;
            ++count;
            p = *end ? end + 1 : end;
        }
    } else if (random_lens) {
        unsigned lo, hi, seed = 1;
        char end;
        const int n = sscanf(random_lens, "%u,%u,%u%c", &lo, &hi, &seed, &end);
        if ((n != 2 && n != 3) || hi < lo || hi > 1u << 24 || batch > MAX_SEQS) {
            fprintf(stderr, "clattn bench: --random-seqlens wants MIN,MAX[,SEED] with MIN <= "
                            "MAX, for --batch sequences (at most %d)\n", MAX_SEQS);
            return EXIT_INPUT;
        }
        uint64_t state = seed;
        for (count = 0; count < batch; ++count) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t len = lo + (uint32_t)((state >> 33) % (hi - lo + 1u));
            cu[count + 1] = cu[count] + len;
            longest = len > longest ? len : longest;
        }
    }
    const int packed = count > 0;
    if (!packed && !q_seq) {
        fprintf(stderr, "clattn bench: --q-seq, --seqlens or --random-seqlens is required\n");
        return EXIT_INPUT;
    }
    if (strcmp(layout, "packed") && strcmp(layout, "padded") && strcmp(layout, "uniform")) {
        fprintf(stderr, "clattn bench: --layout wants packed, padded or uniform, not '%s'\n",
                layout);
        return EXIT_INPUT;
    }
    bench b;
    memset(&b, 0, sizeof b);
    int known = 0;
    for (int i = 0; i < BENCH_OPS; ++i)
        if (!strcmp(op_name, bench_op_names[i])) {
            b.op = (bench_op)i;
            known = 1;
        }
    if (!known) {
        fprintf(stderr, "clattn bench: --op wants grad-v, forward, backward, grad-bias or "
                        "grad-score-params, not '%s'\n",
                op_name);
        return EXIT_INPUT;
    }
    if (reps == 0 || reps > 100000) {
        fprintf(stderr, "clattn bench: --reps wants 1 to 100000\n");
        return EXIT_INPUT;
    }
    clattn_dtype dt;
    if (!parse_dtype(cmd, dtype_name, &dt))
        return EXIT_INPUT;
    if (threads > 256) {
        fprintf(stderr, "clattn bench: --threads wants 1 to 256\n");
        return EXIT_INPUT;
    }
    if (threads) {
        /* Before any context: PoCL reads its variable when it starts. */
        char text[16];
        snprintf(text, sizeof text, "%u", threads);
        if (setenv("CLATTN_NUM_THREADS", text, 1) || setenv("POCL_MAX_PTHREAD_COUNT", text, 1)) {
            fprintf(stderr, "clattn bench: cannot set the thread count\n");
            return EXIT_INPUT;
        }
    }
    b.s = clattn_shape_default();
    b.s.batch = batch;
    b.s.q_seq = q_seq;
    b.s.kv_seq = kv_seq ? kv_seq : q_seq;
    b.s.num_heads = heads;
    b.s.num_kv_heads = kv_heads ? kv_heads : heads;
    b.s.head_dim = head_dim;
    b.s.causal = bottom_right ? CLATTN_CAUSAL_BOTTOM_RIGHT : causal;
    b.s.window = window;
    b.s.window_right = window_right;
    double pairs = 0.0; /* the work counted: a packed batch's pairs, however laid out */
    if (packed) {
        b.s.batch = count;
        b.s.q_seq = b.s.kv_seq = cu[count] ? cu[count] : 1;
        b.s.cu_seqlens_q = b.s.cu_seqlens_kv = cu;
        pairs = (double)clattn_shape_visible_pairs(&b.s);
        if (!strcmp(layout, "padded")) { /* every sequence padded to the longest */
            b.s.cu_seqlens_q = b.s.cu_seqlens_kv = NULL;
            b.s.q_seq = b.s.kv_seq = longest ? longest : 1;
        } else if (!strcmp(layout, "uniform")) { /* equal sequences of as many pairs in all */
            b.s.cu_seqlens_q = b.s.cu_seqlens_kv = NULL;
            uint32_t lo = 1, hi = longest ? longest : 1;
            while (lo < hi) {
                b.s.q_seq = b.s.kv_seq = lo + (hi - lo) / 2;
                if ((double)clattn_shape_visible_pairs(&b.s) < pairs)
                    lo = b.s.q_seq + 1;
                else
                    hi = b.s.q_seq;
            }
            b.s.q_seq = b.s.kv_seq = lo;
            pairs = (double)clattn_shape_visible_pairs(&b.s);
        }
        batch = b.s.batch;
        q_seq = b.s.q_seq;
    }
    clattn_status st = clattn_shape_validate(&b.s);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn bench: %s: %s\n", clattn_status_string(st), clattn_last_error());
        return EXIT_INPUT;
    }
    if (!mod_apply(cmd, opts, nopts, &mods, &b.s)) {
        mod_free(&mods);
        return EXIT_INPUT;
    }
    if (!packed)
        pairs = (double)clattn_shape_visible_pairs(&b.s);
    clattn_context *base = NULL;
    int rc = open_context(cmd, device, NULL, &base);
    /* the C forms of the functions: native makes the inputs' O and LSE */
    if (!rc && !mod_native(cmd, 1, &mods, &b.s))
        rc = EXIT_INPUT;
    const int on_cl = !rc && clattn_context_backend(base) != CLATTN_BACKEND_NATIVE;
    b.s.dtype = dt;
    if (rc || (rc = bench_prepare(cmd, &b, on_cl || dt)) != 0)
        goto done;
    rc = EXIT_DEVICE;
    const double flop = (b.op == BENCH_BACKWARD ? 10.0 : 4.0) * pairs * head_dim;
    if (packed && !json)
        printf("%u sequences of %u tokens in all, the longest %u, %s: ", count, cu[count],
               longest, layout);
    const clattn_backend backend = clattn_context_backend(base);
    if (!json)
        printf("%s, batch %u, q_seq %u, kv_seq %u, %u heads, %u KV heads, head_dim %u%s, "
               "window %u%s%.0u%s%s%s%s%s, %s, on %s\n%-10s %12s %12s %12s  %s\n",
               bench_op_names[b.op], batch, q_seq, b.s.kv_seq, heads, b.s.num_kv_heads, head_dim,
               bottom_right ? ", causal bottom-right" : causal ? ", causal" : "", window,
               window_right ? ", right " : "", window_right,
               mods.softcap > 0.0f ? ", softcap" : "", mods.alibi ? ", ALiBi" : "",
               mods.dropout > 0.0f ? ", dropout" : "", mods.score_file ? ", score function" : "",
               mods.mask_file ? ", mask function" : "", dtype_name,
               clattn_context_device(base), "variant", "ms/call", "GFLOP/s", "max_error",
               "kernels");
    for (size_t vi = 0;; ++vi) {
        const char *name = variant && strcmp(variant, "all") ? (vi ? NULL : variant)
                           : variant ? clattn_variant_name(backend, vi)
                                     : (vi ? NULL : clattn_context_variant(base));
        if (!name)
            break;
        clattn_context *ctx = NULL;
        char selector[32];
        /* The same device as base, with this variant. */
        const char *dev = clattn_context_device(base);
        const char *idx = strrchr(dev, '(');
        if (on_cl && idx && sscanf(idx, "(%31[0-9:])", selector) == 1)
            dev = selector;
        else
            dev = on_cl ? device : "native";
        if (variant && !strcmp(variant, "all")) {
            /* A variant this device cannot run (mma off NVIDIA) is left out. */
            clattn_options o = clattn_options_default();
            o.device = dev;
            o.variant = name;
            st = clattn_context_create(&o, &ctx);
            if (st == CLATTN_ERROR_UNKNOWN_VARIANT) {
                fprintf(stderr, "clattn bench: variant %s left out: %s\n", name,
                        clattn_last_error());
                continue;
            }
            if (st != CLATTN_OK) {
                fprintf(stderr, "clattn bench: %s: %s\n", clattn_status_string(st),
                        clattn_last_error());
                rc = EXIT_DEVICE;
                goto done;
            }
        } else if ((rc = open_context(cmd, dev, variant ? name : NULL, &ctx)) != 0) {
            goto done;
        }
        double seconds = 0.0, err = NAN;
        st = bench_time(ctx, &b, (int)reps, &seconds, &err);
        char ran[160];
        snprintf(ran, sizeof ran, "%s", clattn_context_kernels(ctx));
        clattn_context_destroy(ctx);
        if (st == CLATTN_ERROR_UNSUPPORTED_SHAPE && variant && !strcmp(variant, "all")) {
            fprintf(stderr, "clattn bench: variant %s left out: %s\n", name, clattn_last_error());
            continue;
        }
        if (st != CLATTN_OK) {
            fprintf(stderr, "clattn bench: variant %s: %s: %s\n", name, clattn_status_string(st),
                    clattn_last_error());
            rc = EXIT_DEVICE;
            goto done;
        }
        char errtext[32];
        if (isnan(err))
            snprintf(errtext, sizeof errtext, "null");
        else
            snprintf(errtext, sizeof errtext, "%.3g", err);
        if (json) {
            printf("{\"op\": \"%s\", \"backend\": \"%s\", \"device\": \"", bench_op_names[b.op],
                   clattn_backend_name(backend));
            json_text(clattn_context_device(base));
            printf("\", \"variant\": \"%s\", \"batch\": %u, \"q_seq\": %u, \"kv_seq\": %u, \"heads\": %u, \"kv_heads\": %u, "
                   "\"head_dim\": %u, \"causal\": %s, \"window\": %u, \"window_right\": %u, "
                   "\"reps\": %u, "
                   "\"threads\": %u, \"dtype\": \"%s\", \"layout\": \"%s\", "
                   "\"softcap\": %g, \"alibi\": %s, \"dropout\": %g, "
                   "\"seconds\": %.6g, \"gflops\": %.6g, \"max_error\": %s, \"kernels\": \"%s\"}\n",
                   name, batch, q_seq, b.s.kv_seq, heads, b.s.num_kv_heads, head_dim,
                   b.s.causal == CLATTN_CAUSAL_BOTTOM_RIGHT ? "\"bottom-right\""
                   : b.s.causal                              ? "true"
                                                             : "false",
                   window, window_right, reps, threads, dtype_name, packed ? layout : "batch",
                   (double)mods.softcap, mods.alibi ? "true" : "false", (double)mods.dropout,
                   seconds,
                   flop / seconds * 1e-9,
                   errtext, ran);
        } else
            printf("%-10s %12.3f %12.2f %12s  %s\n", name, seconds * 1e3, flop / seconds * 1e-9,
                   errtext, ran);
        fflush(stdout);
    }
    rc = 0;
done:
    clattn_context_destroy(base);
    bench_free(&b);
    mod_free(&mods);
    return rc;
}
