/* The native backend: the contract in plain C, threaded over blocks of keys.
 *
 * grad-V is split into jobs of KEY_BLOCK keys of one (batch, KV head); each
 * job keeps its keys transposed and its dV rows in registers' reach, so the
 * inner loops run along contiguous memory and vectorise without fast-math:
 * scores across the block's keys, then dV along head_dim. Threads take jobs
 * from a shared counter, so uneven causal work balances itself. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

enum { KEY_BLOCK = 16, MAX_THREADS = 256 };

static void native_destroy(clattn_context *ctx) { (void)ctx; }

const clattn_backend_ops clattn_native_ops = {clattn_native_grad_v, native_destroy};

static int default_threads(void)
{
    const char *env = getenv("CLATTN_NUM_THREADS");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n > 0)
            return n > MAX_THREADS ? MAX_THREADS : (int)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

clattn_status clattn_native_init(clattn_context *ctx, const clattn_options *opts)
{
    if (opts->variant && strcmp(opts->variant, "blocked") != 0)
        return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT,
                           "variant '%s' is not a native one; native runs 'blocked'",
                           opts->variant);
    ctx->num_threads = opts->num_threads > 0
                           ? (opts->num_threads > MAX_THREADS ? MAX_THREADS : opts->num_threads)
                           : default_threads();
    ctx->backend = CLATTN_BACKEND_NATIVE;
    ctx->ops = &clattn_native_ops;
    snprintf(ctx->device, sizeof ctx->device, "native: %d thread%s", ctx->num_threads,
             ctx->num_threads == 1 ? "" : "s");
    snprintf(ctx->variant, sizeof ctx->variant, "blocked");
    return CLATTN_OK;
}

typedef struct grad_v_job {
    const clattn_shape *s;
    const float *d_out, *q, *k, *lse;
    float *dv;
    float scale;
    size_t blocks_per_head; /* key blocks in one (batch, KV head) */
    size_t jobs;
    atomic_size_t next;
} grad_v_job;

static void grad_v_block(const grad_v_job *g, size_t job)
{
    const clattn_shape *s = g->s;
    const size_t D = s->head_dim;
    const size_t group = s->num_heads / s->num_kv_heads;
    const size_t q_row = (size_t)s->num_heads * D, kv_row = (size_t)s->num_kv_heads * D;
    const size_t block = job % g->blocks_per_head;
    const size_t kv_head = job / g->blocks_per_head % s->num_kv_heads;
    const size_t b = job / g->blocks_per_head / s->num_kv_heads;
    const uint32_t t0 = (uint32_t)(block * KEY_BLOCK);
    const uint32_t nt = s->kv_seq - t0 < KEY_BLOCK ? s->kv_seq - t0 : KEY_BLOCK;

    float kt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK]; /* K of the block, transposed */
    float acc[KEY_BLOCK][CLATTN_MAX_HEAD_DIM];
    const float *kb = g->k + ((size_t)b * s->kv_seq + t0) * kv_row + kv_head * D;
    for (size_t d = 0; d < D; ++d)
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            kt[d][j] = j < nt ? kb[j * kv_row + d] : 0.0f;
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        memset(acc[j], 0, D * sizeof(float));

    /* The queries that see any key of the block. */
    uint32_t start, end, unused;
    clattn_query_range(s, t0, &start, &unused);
    clattn_query_range(s, t0 + nt - 1, &unused, &end);

    const float *qb = g->q + (size_t)b * s->q_seq * q_row;
    const float *ob = g->d_out + (size_t)b * s->q_seq * q_row;
    const float *lb = g->lse + (size_t)b * s->q_seq * s->num_heads * 2;
    for (uint32_t pos = start; pos < end; ++pos) {
        /* Keys of the block that pos sees: [lo, hi). */
        uint32_t lo = 0, hi = nt;
        if (s->causal && pos < t0 + nt)
            hi = pos >= t0 ? pos - t0 + 1 : 0;
        if (s->window > 0 && pos >= s->window && pos - s->window + 1 > t0)
            lo = pos - s->window + 1 - t0;
        if (lo >= hi)
            continue;
        for (size_t hr = 0; hr < group; ++hr) {
            const size_t head = kv_head * group + hr;
            const float *qr = qb + pos * q_row + head * D;
            float sc[KEY_BLOCK] = {0};
            for (size_t d = 0; d < D; ++d)
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    sc[j] += qr[d] * kt[d][j];
            const float m = lb[(pos * s->num_heads + head) * 2];
            const float l = lb[(pos * s->num_heads + head) * 2 + 1];
            const float *orow = ob + pos * q_row + head * D;
            for (uint32_t j = lo; j < hi; ++j) {
                const float p = expf(fminf(sc[j] * g->scale - m, 0.0f) - l);
                for (size_t d = 0; d < D; ++d)
                    acc[j][d] += p * orow[d];
            }
        }
    }
    for (uint32_t j = 0; j < nt; ++j)
        memcpy(g->dv + ((size_t)b * s->kv_seq + t0 + j) * kv_row + kv_head * D, acc[j],
               D * sizeof(float));
}

static void *grad_v_worker(void *arg)
{
    grad_v_job *g = arg;
    for (;;) {
        size_t job = atomic_fetch_add(&g->next, 1);
        if (job >= g->jobs)
            return NULL;
        grad_v_block(g, job);
    }
}

/* Runs worker on n threads, the caller's among them. A thread that cannot
 * be started leaves its share to the others, so this cannot fail. */
static void run_threads(void *(*worker)(void *), void *arg, int n)
{
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < n; ++i)
        if (pthread_create(&tid[started], NULL, worker, arg) == 0)
            ++started;
    worker(arg);
    for (int i = 0; i < started; ++i)
        pthread_join(tid[i], NULL);
}

clattn_status clattn_native_grad_v(clattn_context *ctx, const clattn_shape *s,
                                   const clattn_sizes *sz, const float *d_out, const float *q,
                                   const float *k, const float *lse, float *dv)
{
    (void)sz;
    grad_v_job g = {s, d_out, q, k, lse, dv, clattn_effective_scale(s), 0, 0, 0};
    g.blocks_per_head = (s->kv_seq + (size_t)KEY_BLOCK - 1) / KEY_BLOCK;
    g.jobs = g.blocks_per_head * s->num_kv_heads * s->batch;
    atomic_init(&g.next, 0);
    int n = ctx->num_threads;
    if ((size_t)n > g.jobs)
        n = (int)g.jobs;
    run_threads(grad_v_worker, &g, n);
    return CLATTN_OK;
}
