/* The native backend: the contract in plain C, threaded.
 *
 * Key-side ops (grad-V, grad-K and both at once) are split into jobs of
 * KEY_BLOCK keys of one (batch, KV head); a job keeps its K and V transposed
 * so that the scores of all its keys against one query vectorise along the
 * block, and its dK and dV rows so that updates vectorise along head_dim.
 * Query-side ops (forward, grad-Q) are split into jobs of QUERY_BLOCK query
 * rows, with keys taken KEY_BLOCK at a time (an online softmax for the
 * forward), each key block transposed once for all the rows.
 * Threads take jobs from a shared counter, so uneven causal work balances
 * itself, and no job depends on another's, so the result does not depend on
 * the thread count. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

enum { KEY_BLOCK = 16, MAX_THREADS = 256 };

/* meganeura's LSE pair for a row with no visible key. */
#define EMPTY_ROW (-1e30f)

/* The hot loops are compiled for AVX-512, AVX2 and the baseline, and the
 * loader picks the best the CPU has, so one build runs fast everywhere.
 * Not under ThreadSanitizer: its instrumented ifunc resolvers run before
 * its runtime starts, and crash. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define HOT __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#define INLINE static inline __attribute__((always_inline))
#define SIMD _Pragma("omp simd")
#else
#define HOT
#define INLINE static inline
#define SIMD
#endif

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

typedef struct native_call {
    const clattn_shape *s;
    const float *q, *k, *v, *o, *lse, *d_out;
    float *dq, *dk, *dv, *o_out, *lse_out;
    const float *dsum; /* dO . O per query row, for grad-K */
    float scale;
    size_t group;           /* query heads per KV head */
    size_t blocks_per_head; /* key blocks of one (batch, KV head) */
    void (*job)(const struct native_call *c, size_t job);
    size_t jobs;
    atomic_size_t next;
} native_call;

/* min(x, 0) without fminf's NaN rules, which keep it from vectorising. */
INLINE float min0(float x) { return x < 0.0f ? x : 0.0f; }

/* exp() of KEY_BLOCK values, branch-free so that it vectorises: Cody-Waite
 * range reduction by ln 2 and a degree-6 polynomial (the constants of
 * Cephes' expf), within 2 ulp of expf(). Inputs below -87.3 give about
 * 1e-38 rather than less, far below anything the sums can see. */
INLINE void exp_block(float *x)
{
    SIMD
    for (int j = 0; j < KEY_BLOCK; ++j) {
        float v = x[j] < -87.3f ? -87.3f : x[j] > 88.3f ? 88.3f : x[j];
        /* Round v / ln 2 to an integer with the 1.5 * 2^23 trick. */
        const float n = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
        float r = v - n * 0.693359375f;
        r = r - n * -2.12194440e-4f;
        float poly = 1.9875691500e-4f;
        poly = poly * r + 1.3981999507e-3f;
        poly = poly * r + 8.3334519073e-3f;
        poly = poly * r + 4.1665795894e-2f;
        poly = poly * r + 1.6666665459e-1f;
        poly = poly * r + 5.0000001201e-1f;
        const float y = poly * r * r + r + 1.0f;
        const int32_t bits = ((int32_t)n + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        x[j] = y * scale;
    }
}

/* A dot product with eight partial sums, so that it vectorises without
 * reassociating float additions behind the compiler's back. */
INLINE float dot(const float *a, const float *b, size_t n)
{
    float part[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j)
            part[j] += a[i + j] * b[i + j];
    for (; i < n; ++i)
        part[i & 7] += a[i] * b[i];
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

INLINE size_t row_index(const clattn_shape *s, size_t b, size_t pos, size_t head)
{
    return (b * s->q_seq + pos) * s->num_heads + head;
}

/* dV and/or dK of KEY_BLOCK keys of one (batch, KV head). */
HOT static void key_block_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim, kv_row = (size_t)s->num_kv_heads * D;
    const size_t block = job % c->blocks_per_head;
    const size_t kv_head = job / c->blocks_per_head % s->num_kv_heads;
    const size_t b = job / c->blocks_per_head / s->num_kv_heads;
    const uint32_t t0 = (uint32_t)(block * KEY_BLOCK);
    const uint32_t nt = s->kv_seq - t0 < KEY_BLOCK ? s->kv_seq - t0 : KEY_BLOCK;
    const int want_dk = c->dk != NULL, want_dv = c->dv != NULL;

    float kt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK], vt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK];
    float dk[KEY_BLOCK][CLATTN_MAX_HEAD_DIM], dv[KEY_BLOCK][CLATTN_MAX_HEAD_DIM];
    const size_t first = ((size_t)b * s->kv_seq + t0) * kv_row + kv_head * D;
    for (size_t d = 0; d < D; ++d)
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            kt[d][j] = j < nt ? c->k[first + j * kv_row + d] : 0.0f;
            vt[d][j] = j < nt && want_dk ? c->v[first + j * kv_row + d] : 0.0f;
        }
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        memset(dk[j], 0, D * sizeof(float));
        memset(dv[j], 0, D * sizeof(float));
    }

    /* The queries that see any key of the block. */
    uint32_t start, end, unused;
    clattn_query_range(s, t0, &start, &unused);
    clattn_query_range(s, t0 + nt - 1, &unused, &end);
    for (uint32_t pos = start; pos < end; ++pos) {
        /* Keys of the block that pos sees: [lo, hi). */
        uint32_t lo = 0, hi = nt;
        if (s->causal && pos < t0 + nt)
            hi = pos >= t0 ? pos - t0 + 1 : 0;
        if (s->window > 0 && pos >= s->window && pos - s->window + 1 > t0)
            lo = pos - s->window + 1 - t0;
        if (lo >= hi)
            continue;
        for (size_t head = kv_head * c->group; head < (kv_head + 1) * c->group; ++head) {
            const size_t row = row_index(s, b, pos, head);
            const float *qr = c->q + row * D, *dor = c->d_out + row * D;
            float sc[KEY_BLOCK] = {0}, dp[KEY_BLOCK] = {0};
            for (size_t d = 0; d < D; ++d) {
                const float qd = qr[d];
                SIMD
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    sc[j] += qd * kt[d][j];
            }
            if (want_dk)
                for (size_t d = 0; d < D; ++d) {
                    const float od = dor[d];
                    SIMD
                    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                        dp[j] += od * vt[d][j];
                }
            const float m = c->lse[2 * row], l = c->lse[2 * row + 1];
            float pr[KEY_BLOCK];
            SIMD
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                pr[j] = min0(sc[j] * c->scale - m) - l;
            exp_block(pr);
            for (uint32_t j = lo; j < hi; ++j) {
                const float p = pr[j];
                if (want_dv) {
                    SIMD
                    for (size_t d = 0; d < D; ++d)
                        dv[j][d] += p * dor[d];
                }
                if (want_dk) {
                    const float ds = c->scale * p * (dp[j] - c->dsum[row]);
                    SIMD
                    for (size_t d = 0; d < D; ++d)
                        dk[j][d] += ds * qr[d];
                }
            }
        }
    }
    for (uint32_t j = 0; j < nt; ++j) {
        if (want_dv)
            memcpy(c->dv + first + j * kv_row, dv[j], D * sizeof(float));
        if (want_dk)
            memcpy(c->dk + first + j * kv_row, dk[j], D * sizeof(float));
    }
}

/* The keys [*lo, *hi) that query pos sees. */
INLINE void key_range(const clattn_shape *s, uint32_t pos, uint32_t *lo, uint32_t *hi)
{
    *lo = s->window > 0 && pos >= s->window ? pos - s->window + 1 : 0;
    *hi = s->causal ? (pos + 1 < s->kv_seq ? pos + 1 : s->kv_seq) : s->kv_seq;
}

/* Query-side jobs take QUERY_BLOCK query rows of one (batch, head) and walk
 * the keys KEY_BLOCK at a time; each key block's K (and V, for grad-Q) is
 * transposed once and serves every row, so scores of a row against the
 * block vectorise along the keys with no horizontal sums. */
enum { QUERY_BLOCK = 16 };

typedef struct query_block {
    size_t b, head, pos0, rows; /* rows of [pos0, pos0 + rows) */
    uint32_t lo, hi;            /* keys any of them sees */
    const float *kb, *vb;       /* K and V of the KV head at key 0 */
    size_t kv_row;
} query_block;

INLINE void query_block_of(const native_call *c, size_t job, query_block *qb)
{
    const clattn_shape *s = c->s;
    const size_t blocks = (s->q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK;
    const size_t D = s->head_dim;
    qb->head = job % s->num_heads;
    qb->pos0 = job / s->num_heads % blocks * QUERY_BLOCK;
    qb->b = job / s->num_heads / blocks;
    qb->rows = s->q_seq - qb->pos0 < QUERY_BLOCK ? s->q_seq - qb->pos0 : QUERY_BLOCK;
    qb->kv_row = (size_t)s->num_kv_heads * D;
    const size_t base = (size_t)qb->b * s->kv_seq * qb->kv_row + qb->head / c->group * D;
    qb->kb = c->k + base;
    qb->vb = c->v ? c->v + base : NULL;
    uint32_t lo_last, hi_first;
    key_range(s, (uint32_t)qb->pos0, &qb->lo, &hi_first);
    key_range(s, (uint32_t)(qb->pos0 + qb->rows - 1), &lo_last, &qb->hi);
}

/* x[j] = keep ? x[j] : EMPTY_ROW for keys t0 + j that pos does not see. */
INLINE void mask_scores(const clattn_shape *s, uint32_t pos, uint32_t t0, uint32_t n, float *x)
{
    uint32_t lo, hi;
    key_range(s, pos, &lo, &hi);
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        if (j >= n || t0 + j < lo || t0 + j >= hi)
            x[j] = EMPTY_ROW;
}

/* Transposes n rows of a key block (stride kv_row) into t[d][j], zeros
 * past n. */
INLINE void transpose_block(const float *rows, size_t kv_row, size_t D, uint32_t n,
                            float t[CLATTN_MAX_HEAD_DIM][KEY_BLOCK])
{
    for (size_t d = 0; d < D; ++d)
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            t[d][j] = j < n ? rows[j * kv_row + d] : 0.0f;
}

/* sc[j] = row . t[.][j] for the KEY_BLOCK keys of a transposed block. */
INLINE void block_dots(const float *row, float t[CLATTN_MAX_HEAD_DIM][KEY_BLOCK], size_t D,
                       float *sc)
{
    SIMD
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        sc[j] = 0.0f;
    for (size_t d = 0; d < D; ++d) {
        const float x = row[d];
        SIMD
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            sc[j] += x * t[d][j];
    }
}

/* O and the LSE pairs of a block of query rows, by online softmax. */
HOT static void forward_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    float kt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK];
    float acc[QUERY_BLOCK][CLATTN_MAX_HEAD_DIM], m[QUERY_BLOCK], l[QUERY_BLOCK];
    for (size_t r = 0; r < qb.rows; ++r) {
        memset(acc[r], 0, D * sizeof(float));
        m[r] = EMPTY_ROW;
        l[r] = 0.0f;
    }
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        transpose_block(qb.kb + t0 * qb.kv_row, qb.kv_row, D, n, kt);
        for (size_t r = 0; r < qb.rows; ++r) {
            const uint32_t pos = (uint32_t)(qb.pos0 + r);
            const size_t row = row_index(s, qb.b, pos, qb.head);
            float sc[KEY_BLOCK];
            block_dots(c->q + row * D, kt, D, sc);
            float block_max = EMPTY_ROW;
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                sc[j] *= c->scale;
            mask_scores(s, pos, t0, n, sc);
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                block_max = sc[j] > block_max ? sc[j] : block_max;
            if (block_max == EMPTY_ROW)
                continue;
            const float m_new = block_max > m[r] ? block_max : m[r];
            const float rescale = expf(m[r] - m_new);
            l[r] *= rescale;
            SIMD
            for (size_t d = 0; d < D; ++d)
                acc[r][d] *= rescale;
            SIMD
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                sc[j] -= m_new;
            exp_block(sc);
            for (uint32_t j = 0; j < n; ++j) {
                const float *vr = qb.vb + (t0 + j) * qb.kv_row, e = sc[j];
                if (e == 0.0f)
                    continue;
                l[r] += e;
                SIMD
                for (size_t d = 0; d < D; ++d)
                    acc[r][d] += e * vr[d];
            }
            m[r] = m_new;
        }
    }
    for (size_t r = 0; r < qb.rows; ++r) {
        const size_t row = row_index(s, qb.b, qb.pos0 + r, qb.head);
        float *orow = c->o_out + row * D;
        for (size_t d = 0; d < D; ++d)
            orow[d] = l[r] > 0.0f ? acc[r][d] / l[r] : 0.0f;
        float *pair = c->lse_out + 2 * row;
        pair[0] = l[r] > 0.0f ? m[r] : EMPTY_ROW;
        pair[1] = l[r] > 0.0f ? logf(l[r]) : EMPTY_ROW;
    }
}

/* dQ of a block of query rows. */
HOT static void grad_q_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    float kt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK], vt[CLATTN_MAX_HEAD_DIM][KEY_BLOCK];
    float acc[QUERY_BLOCK][CLATTN_MAX_HEAD_DIM], dsum[QUERY_BLOCK];
    for (size_t r = 0; r < qb.rows; ++r) {
        const size_t row = row_index(s, qb.b, qb.pos0 + r, qb.head);
        memset(acc[r], 0, D * sizeof(float));
        dsum[r] = dot(c->d_out + row * D, c->o + row * D, D);
    }
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        transpose_block(qb.kb + t0 * qb.kv_row, qb.kv_row, D, n, kt);
        transpose_block(qb.vb + t0 * qb.kv_row, qb.kv_row, D, n, vt);
        for (size_t r = 0; r < qb.rows; ++r) {
            const uint32_t pos = (uint32_t)(qb.pos0 + r);
            const size_t row = row_index(s, qb.b, pos, qb.head);
            const float m = c->lse[2 * row], l = c->lse[2 * row + 1];
            float pr[KEY_BLOCK], dp[KEY_BLOCK];
            block_dots(c->q + row * D, kt, D, pr);
            block_dots(c->d_out + row * D, vt, D, dp);
            SIMD
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                pr[j] = min0(pr[j] * c->scale - m) - l;
            mask_scores(s, pos, t0, n, pr);
            exp_block(pr);
            for (uint32_t j = 0; j < n; ++j) {
                if (pr[j] == 0.0f)
                    continue;
                const float *kr = qb.kb + (t0 + j) * qb.kv_row;
                const float ds = c->scale * pr[j] * (dp[j] - dsum[r]);
                SIMD
                for (size_t d = 0; d < D; ++d)
                    acc[r][d] += ds * kr[d];
            }
        }
    }
    for (size_t r = 0; r < qb.rows; ++r)
        memcpy(c->dq + row_index(s, qb.b, qb.pos0 + r, qb.head) * D, acc[r], D * sizeof(float));
}

HOT static void dsum_job(const native_call *c, size_t row)
{
    const size_t D = c->s->head_dim;
    ((float *)c->dsum)[row] = dot(c->d_out + row * D, c->o + row * D, D);
}

static void *worker(void *arg)
{
    native_call *c = arg;
    for (;;) {
        size_t job = atomic_fetch_add(&c->next, 1);
        if (job >= c->jobs)
            return NULL;
        c->job(c, job);
    }
}

/* Runs every job of c on up to n threads, the caller's among them. A thread
 * that cannot be started leaves its share to the others, so this cannot
 * fail. */
static void run_jobs(native_call *c, void (*job)(const native_call *, size_t), size_t jobs,
                     int n)
{
    c->job = job;
    c->jobs = jobs;
    atomic_store(&c->next, 0);
    if ((size_t)n > jobs)
        n = (int)jobs;
    pthread_t tid[MAX_THREADS];
    int started = 0;
    for (int i = 1; i < n; ++i)
        if (pthread_create(&tid[started], NULL, worker, c) == 0)
            ++started;
    worker(c);
    for (int i = 0; i < started; ++i)
        pthread_join(tid[i], NULL);
}

static clattn_status native_run(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                                const clattn_sizes *sz, const float *const t[CLATTN_R_COUNT])
{
    native_call c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.q = t[CLATTN_R_Q];
    c.k = t[CLATTN_R_K];
    c.v = t[CLATTN_R_V];
    c.o = t[CLATTN_R_O];
    c.lse = t[CLATTN_R_LSE];
    c.d_out = t[CLATTN_R_DO];
    c.scale = clattn_effective_scale(s);
    c.group = s->num_heads / s->num_kv_heads;
    c.blocks_per_head = (s->kv_seq + (size_t)KEY_BLOCK - 1) / KEY_BLOCK;
    const size_t key_jobs = c.blocks_per_head * s->num_kv_heads * s->batch;
    const size_t rows = sz->lse / 2;
    const size_t query_jobs = (s->q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK * s->num_heads *
                              s->batch;
    const int n = ctx->num_threads;
    float *dsum = NULL;

    switch (op) {
    case CLATTN_OP_FORWARD:
        c.o_out = (float *)t[CLATTN_R_O];
        c.lse_out = (float *)t[CLATTN_R_LSE];
        run_jobs(&c, forward_job, query_jobs, n);
        return CLATTN_OK;
    case CLATTN_OP_GRAD_V:
        c.dv = (float *)t[CLATTN_R_DV];
        run_jobs(&c, key_block_job, key_jobs, n);
        return CLATTN_OK;
    case CLATTN_OP_GRAD_Q:
        c.dq = (float *)t[CLATTN_R_DQ];
        run_jobs(&c, grad_q_job, query_jobs, n);
        return CLATTN_OK;
    case CLATTN_OP_GRAD_K:
    case CLATTN_OP_BACKWARD:
        dsum = malloc(rows * sizeof(float));
        if (!dsum)
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory for %zu floats",
                               rows);
        c.dsum = dsum;
        run_jobs(&c, dsum_job, rows, n);
        c.dk = (float *)t[CLATTN_R_DK];
        if (op == CLATTN_OP_BACKWARD)
            c.dv = (float *)t[CLATTN_R_DV];
        run_jobs(&c, key_block_job, key_jobs, n);
        if (op == CLATTN_OP_BACKWARD) {
            c.dq = (float *)t[CLATTN_R_DQ];
            run_jobs(&c, grad_q_job, query_jobs, n);
        }
        free(dsum);
        return CLATTN_OK;
    case CLATTN_OP_COUNT:
        break;
    }
    return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "unknown op %d", (int)op);
}

static void native_destroy(clattn_context *ctx) { (void)ctx; }

static const clattn_backend_ops native_ops = {native_run, native_destroy};

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
    ctx->ops = &native_ops;
    snprintf(ctx->device, sizeof ctx->device, "native: %d thread%s", ctx->num_threads,
             ctx->num_threads == 1 ? "" : "s");
    snprintf(ctx->variant, sizeof ctx->variant, "blocked");
    return CLATTN_OK;
}
