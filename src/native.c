/* The native backend: the contract in plain C, threaded.
 *
 * Key-side ops (grad-V, grad-K and both at once) are split into jobs of
 * KEY_BLOCK keys of one (batch, KV head); a job keeps its K and V, and its
 * dK and dV, transposed, so that the block's keys lie along a vector, and
 * streams the query rows that see them (every head of the group) CHUNK at a
 * time. Query-side ops (forward, grad-Q) are split into jobs of QUERY_BLOCK
 * query rows of one (batch, head), kept transposed so that the rows lie
 * along a vector, and stream the keys KEY_BLOCK at a time (an online
 * softmax for the forward, whose per-row state is a vector too).
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

/* The two products everything below is made of. Both keep one side
 * transposed, so that a tile's KEY_BLOCK keys (or QUERY_BLOCK query rows)
 * lie along one vector, and broadcast single elements of plain rows against
 * it: no horizontal sums, and enough independent accumulators (eight) to
 * keep both FMA pipes busy. The vector type is 16 floats, one AVX-512
 * register; the AVX2 and baseline clones split it. */
typedef float vec __attribute__((vector_size(KEY_BLOCK * sizeof(float))));
typedef float tile_row[KEY_BLOCK];
enum { DOT_ROWS = 8, ACC_DIMS = 8 };

/* Unaligned, aliasing loads and stores of a vec: macros, as functions that
 * pass a vec by value would draw ABI warnings for the baseline clone. */
typedef float vec_u __attribute__((vector_size(KEY_BLOCK * sizeof(float)), aligned(4), may_alias));
#define vload(p) (*(const vec_u *)(p))
#define vstore(p, v) (*(vec_u *)(p) = (v))

static const float zero_row[CLATTN_MAX_HEAD_DIM];

/* out[i][.] = sum_d rows[i][d] * t[d][.] for DOT_ROWS rows. */
INLINE void dots(const float *const *rows, const tile_row *t, size_t D, tile_row *out)
{
    vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
    const float *r4 = rows[4], *r5 = rows[5], *r6 = rows[6], *r7 = rows[7];
    for (size_t d = 0; d < D; ++d) {
        const vec x = vload(t[d]);
        a0 += r0[d] * x;
        a1 += r1[d] * x;
        a2 += r2[d] * x;
        a3 += r3[d] * x;
        a4 += r4[d] * x;
        a5 += r5[d] * x;
        a6 += r6[d] * x;
        a7 += r7[d] * x;
    }
    vstore(out[0], a0);
    vstore(out[1], a1);
    vstore(out[2], a2);
    vstore(out[3], a3);
    vstore(out[4], a4);
    vstore(out[5], a5);
    vstore(out[6], a6);
    vstore(out[7], a7);
}

/* acc[d][.] += sum_r rows[r][d] * w[r][.] for r < n: ACC_DIMS rows of the
 * transposed accumulator stay in registers while the n rows stream by. */
INLINE void accumulate(tile_row *acc, size_t D, const float *const *rows, const tile_row *w,
                       size_t n)
{
    size_t d = 0;
    for (; d + ACC_DIMS <= D; d += ACC_DIMS) {
        vec c0 = vload(acc[d]), c1 = vload(acc[d + 1]), c2 = vload(acc[d + 2]),
            c3 = vload(acc[d + 3]), c4 = vload(acc[d + 4]), c5 = vload(acc[d + 5]),
            c6 = vload(acc[d + 6]), c7 = vload(acc[d + 7]);
        for (size_t r = 0; r < n; ++r) {
            const vec x = vload(w[r]);
            const float *row = rows[r] + d;
            c0 += row[0] * x;
            c1 += row[1] * x;
            c2 += row[2] * x;
            c3 += row[3] * x;
            c4 += row[4] * x;
            c5 += row[5] * x;
            c6 += row[6] * x;
            c7 += row[7] * x;
        }
        vstore(acc[d], c0);
        vstore(acc[d + 1], c1);
        vstore(acc[d + 2], c2);
        vstore(acc[d + 3], c3);
        vstore(acc[d + 4], c4);
        vstore(acc[d + 5], c5);
        vstore(acc[d + 6], c6);
        vstore(acc[d + 7], c7);
    }
    for (; d < D; ++d) {
        vec c = vload(acc[d]);
        for (size_t r = 0; r < n; ++r)
            c += rows[r][d] * vload(w[r]);
        vstore(acc[d], c);
    }
}

/* t[d][j] = rows[j][d] for the KEY_BLOCK rows of a tile. */
INLINE void transpose_in(const float *const *rows, size_t D, tile_row *t)
{
    for (size_t d = 0; d < D; ++d)
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            t[d][j] = rows[j][d];
}

/* Key-side jobs gather the query rows (every head of the group at each
 * position) that see any key of the block, CHUNK at a time. */
enum { CHUNK = 32 };

typedef struct key_chunk {
    const float *q[CHUNK], *d_out[CHUNK];
    float m[CHUNK], l[CHUNK], dsum[CHUNK];
    uint32_t lo[CHUNK], hi[CHUNK]; /* keys of the block the row sees */
    size_t n;
} key_chunk;

/* Adds one chunk of query rows to the block's transposed dK and dV. */
INLINE void key_chunk_run(const native_call *c, key_chunk *ch, const tile_row *kt,
                          const tile_row *vt, tile_row *dkt, tile_row *dvt)
{
    const size_t D = c->s->head_dim, n = ch->n;
    _Alignas(64) tile_row p[CHUNK], ds[CHUNK];
    for (size_t r = n; r % DOT_ROWS; ++r) {
        ch->q[r] = ch->d_out[r] = zero_row;
        ch->lo[r] = ch->hi[r] = 0;
    }
    for (size_t r = 0; r < n; r += DOT_ROWS) {
        dots(ch->q + r, kt, D, p + r);
        if (dkt)
            dots(ch->d_out + r, vt, D, ds + r);
    }
    for (size_t r = 0; r < n; ++r) {
        const float m = ch->m[r], l = ch->l[r], scale = c->scale;
        SIMD
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            p[r][j] = min0(p[r][j] * scale - m) - l;
        exp_block(p[r]);
        const uint32_t lo = ch->lo[r], hi = ch->hi[r];
        SIMD
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            p[r][j] = j >= lo && j < hi ? p[r][j] : 0.0f;
        if (dkt) {
            const float dsum = ch->dsum[r];
            SIMD
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                ds[r][j] = scale * p[r][j] * (ds[r][j] - dsum);
        }
    }
    if (dvt)
        accumulate(dvt, D, ch->d_out, p, n);
    if (dkt)
        accumulate(dkt, D, ch->q, ds, n);
    ch->n = 0;
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

    _Alignas(64) tile_row kt[CLATTN_MAX_HEAD_DIM], vt[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row dkt[CLATTN_MAX_HEAD_DIM], dvt[CLATTN_MAX_HEAD_DIM];
    const size_t first = ((size_t)b * s->kv_seq + t0) * kv_row + kv_head * D;
    const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        krows[j] = j < nt ? c->k + first + j * kv_row : zero_row;
        vrows[j] = j < nt && want_dk ? c->v + first + j * kv_row : zero_row;
    }
    transpose_in(krows, D, kt);
    if (want_dk)
        transpose_in(vrows, D, vt);
    memset(dkt, 0, D * sizeof dkt[0]);
    memset(dvt, 0, D * sizeof dvt[0]);

    /* The queries that see any key of the block. */
    uint32_t start, end, unused;
    clattn_query_range(s, t0, &start, &unused);
    clattn_query_range(s, t0 + nt - 1, &unused, &end);
    key_chunk ch;
    ch.n = 0;
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
            ch.q[ch.n] = c->q + row * D;
            ch.d_out[ch.n] = c->d_out + row * D;
            ch.m[ch.n] = c->lse[2 * row];
            ch.l[ch.n] = c->lse[2 * row + 1];
            ch.dsum[ch.n] = want_dk ? c->dsum[row] : 0.0f;
            ch.lo[ch.n] = lo;
            ch.hi[ch.n] = hi;
            if (++ch.n == CHUNK)
                key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL);
        }
    }
    if (ch.n)
        key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL);
    for (uint32_t j = 0; j < nt; ++j)
        for (size_t d = 0; d < D; ++d) {
            if (want_dv)
                c->dv[first + j * kv_row + d] = dvt[d][j];
            if (want_dk)
                c->dk[first + j * kv_row + d] = dkt[d][j];
        }
}

/* The keys [*lo, *hi) that query pos sees. */
INLINE void key_range(const clattn_shape *s, uint32_t pos, uint32_t *lo, uint32_t *hi)
{
    *lo = s->window > 0 && pos >= s->window ? pos - s->window + 1 : 0;
    *hi = s->causal ? (pos + 1 < s->kv_seq ? pos + 1 : s->kv_seq) : s->kv_seq;
}

/* Query-side jobs take QUERY_BLOCK query rows of one (batch, head), kept
 * transposed so that the rows lie along a vector, and walk the keys
 * KEY_BLOCK at a time: a key's scores against every row of the block are
 * one vector, and per-row softmax state (max, sum, Dsum) is a vector too. */
enum { QUERY_BLOCK = KEY_BLOCK };

typedef struct query_block {
    size_t b, head, pos0, rows;      /* rows of [pos0, pos0 + rows) */
    uint32_t lo, hi;                 /* keys any of them sees */
    uint32_t row_lo[QUERY_BLOCK];    /* keys [row_lo, row_hi) row r sees; */
    uint32_t row_hi[QUERY_BLOCK];    /* empty past the last row */
    const float *kb, *vb;            /* K and V of the KV head at key 0 */
    size_t kv_row;
    size_t row[QUERY_BLOCK];         /* row_index of each row */
    const float *ptrs[QUERY_BLOCK];  /* scratch: row pointers to transpose */
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
    qb->lo = UINT32_MAX;
    qb->hi = 0;
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        qb->row_lo[r] = qb->row_hi[r] = 0;
        qb->row[r] = 0;
        if (r >= qb->rows)
            continue;
        key_range(s, (uint32_t)(qb->pos0 + r), &qb->row_lo[r], &qb->row_hi[r]);
        qb->lo = qb->row_lo[r] < qb->lo ? qb->row_lo[r] : qb->lo;
        qb->hi = qb->row_hi[r] > qb->hi ? qb->row_hi[r] : qb->hi;
        qb->row[r] = row_index(s, qb->b, qb->pos0 + r, qb->head);
    }
    if (qb->lo > qb->hi)
        qb->lo = qb->hi;
}

/* t[d][r] = x[row r][d] for the block's rows, zeros past them. */
INLINE void query_block_transpose(const native_call *c, query_block *qb, const float *x,
                                  tile_row *t)
{
    const size_t D = c->s->head_dim;
    for (size_t r = 0; r < QUERY_BLOCK; ++r)
        qb->ptrs[r] = r < qb->rows ? x + qb->row[r] * D : zero_row;
    transpose_in(qb->ptrs, D, t);
}

/* The rows of keys [t0, t0 + n) of one KV head, zero rows past n. */
INLINE void key_rows(const float *base, size_t kv_row, uint32_t t0, uint32_t n,
                     const float *rows[KEY_BLOCK])
{
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        rows[j] = j < n ? base + (t0 + j) * kv_row : zero_row;
}

/* sc[j][r] for the keys t0 + j of a tile against the block's rows. */
INLINE void tile_scores(const float *const *krows, const tile_row *qt,
                        size_t D, tile_row *sc)
{
    for (uint32_t j = 0; j < KEY_BLOCK; j += DOT_ROWS)
        dots(krows + j, qt, D, sc + j);
}

/* O and the LSE pairs of a block of query rows, by online softmax. */
HOT static void forward_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], ot[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row sc[KEY_BLOCK];
    float m[QUERY_BLOCK], l[QUERY_BLOCK], rescale[QUERY_BLOCK];
    query_block_transpose(c, &qb, c->q, qt);
    memset(ot, 0, D * sizeof ot[0]);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        m[r] = EMPTY_ROW;
        l[r] = 0.0f;
    }
    const float scale = c->scale;
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        key_rows(qb.vb, qb.kv_row, t0, n, vrows);
        tile_scores(krows, qt, D, sc);
        float block_max[QUERY_BLOCK];
        for (size_t r = 0; r < QUERY_BLOCK; ++r)
            block_max[r] = EMPTY_ROW;
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            const uint32_t t = t0 + j;
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r) {
                const float x = t >= qb.row_lo[r] && t < qb.row_hi[r] ? sc[j][r] * scale
                                                                       : EMPTY_ROW;
                sc[j][r] = x;
                block_max[r] = x > block_max[r] ? x : block_max[r];
            }
        }
        SIMD
        for (size_t r = 0; r < QUERY_BLOCK; ++r) {
            const float m_new = block_max[r] > m[r] ? block_max[r] : m[r];
            rescale[r] = m[r] - m_new;
            m[r] = m_new;
        }
        exp_block(rescale);
        float sum[QUERY_BLOCK];
        SIMD
        for (size_t r = 0; r < QUERY_BLOCK; ++r)
            sum[r] = 0.0f;
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            float e[QUERY_BLOCK];
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r)
                e[r] = sc[j][r] - m[r];
            exp_block(e);
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r) {
                /* Masked scores are exactly EMPTY_ROW; their weight is 0 even
                 * while the row's max is EMPTY_ROW too. */
                sc[j][r] = sc[j][r] == EMPTY_ROW ? 0.0f : e[r];
                sum[r] += sc[j][r];
            }
        }
        SIMD
        for (size_t r = 0; r < QUERY_BLOCK; ++r)
            l[r] = l[r] * rescale[r] + sum[r];
        for (size_t d = 0; d < D; ++d) {
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r)
                ot[d][r] *= rescale[r];
        }
        accumulate(ot, D, vrows, sc, n);
    }
    for (size_t r = 0; r < qb.rows; ++r) {
        float *orow = c->o_out + qb.row[r] * D;
        for (size_t d = 0; d < D; ++d)
            orow[d] = l[r] > 0.0f ? ot[d][r] / l[r] : 0.0f;
        float *pair = c->lse_out + 2 * qb.row[r];
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
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], dot_t[CLATTN_MAX_HEAD_DIM],
        dqt[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row sc[KEY_BLOCK], dp[KEY_BLOCK];
    float m[QUERY_BLOCK], l[QUERY_BLOCK], dsum[QUERY_BLOCK];
    query_block_transpose(c, &qb, c->q, qt);
    query_block_transpose(c, &qb, c->d_out, dot_t);
    memset(dqt, 0, D * sizeof dqt[0]);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        const int live = r < qb.rows;
        m[r] = live ? c->lse[2 * qb.row[r]] : 0.0f;
        l[r] = live ? c->lse[2 * qb.row[r] + 1] : 0.0f;
        dsum[r] = live ? dot(c->d_out + qb.row[r] * D, c->o + qb.row[r] * D, D) : 0.0f;
    }
    const float scale = c->scale;
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        key_rows(qb.vb, qb.kv_row, t0, n, vrows);
        tile_scores(krows, qt, D, sc);
        tile_scores(vrows, dot_t, D, dp);
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            const uint32_t t = t0 + j;
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r)
                sc[j][r] = min0(sc[j][r] * scale - m[r]) - l[r];
            exp_block(sc[j]);
            SIMD
            for (size_t r = 0; r < QUERY_BLOCK; ++r) {
                const float p = t >= qb.row_lo[r] && t < qb.row_hi[r] ? sc[j][r] : 0.0f;
                sc[j][r] = scale * p * (dp[j][r] - dsum[r]);
            }
        }
        accumulate(dqt, D, krows, sc, n);
    }
    for (size_t r = 0; r < qb.rows; ++r) {
        float *dq = c->dq + qb.row[r] * D;
        for (size_t d = 0; d < D; ++d)
            dq[d] = dqt[d][r];
    }
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
    static const char *const ran[CLATTN_OP_COUNT] = {
        [CLATTN_OP_FORWARD] = "forward__native",
        [CLATTN_OP_GRAD_V] = "grad_v__native",
        [CLATTN_OP_GRAD_Q] = "grad_q__native",
        [CLATTN_OP_GRAD_K] = "dsum__native,grad_k__native",
        [CLATTN_OP_BACKWARD] = "dsum__native,grad_kv__native,grad_q__native",
    };
    if (op < CLATTN_OP_COUNT)
        snprintf(ctx->kernels, sizeof ctx->kernels, "%s", ran[op]);

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
