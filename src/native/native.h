/* The native backend's parts: the call its jobs share and the hot loops,
 * which src/native/kernels.c compiles once per x86-64 level (see
 * CMakeLists.txt) and native.c picks from at context creation. */
#ifndef CLATTN_NATIVE_H
#define CLATTN_NATIVE_H

#include <stdatomic.h>
#include <stddef.h>

#include "internal.h"
#include "philox.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Keys of a key-side block, and query rows of a query-side one: a row of
 * 32 floats (two AVX-512 vectors: 16 had the products reload every
 * broadcast element per vector). A job takes the blocks of one head that
 * fall to its part (one of `parts`, see native.c's plan_call), to and
 * fro: block i is part's when i % (2 * parts) is part or 2 * parts - 1 -
 * part, so that under a causal mask every part of a head weighs about the
 * same, and the rows the blocks stream (all of the head's keys, or all of
 * its queries) come from the thread's own cache after the first. */
enum { KEY_BLOCK = 32, QUERY_BLOCK = KEY_BLOCK };

/* Query rows of a Dsum job: a job a row (a 64-float dot product) had 16
 * threads queue on the shared job counter and on each other's cache lines
 * of Dsum. */
enum { DSUM_ROWS = 256 };

/* Rows of a head-major copy made at a time (a job of the copies' round,
 * or a unit of row_state): a job a (batch, head) gave a forward on 2 KV
 * heads two jobs per tensor, in a round per tensor. */
enum { PACK_ROWS = 128 };

/* A dot product with eight partial sums, so that it vectorises without
 * reassociating float additions behind the compiler's back. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline float native_dot(const float *a, const float *b, size_t n)
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

/* Blocks of QUERY_BLOCK query rows a head: the query side's jobs. */
static inline size_t native_query_blocks(uint32_t q_seq)
{
    return (q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK;
}

/* Rows of a head in vt's layout (native_call): whole tiles. */
static inline size_t native_tiled_rows(size_t rows)
{
    return (rows + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
}

/* t[d * KEY_BLOCK + j] = rows[j][d] for the KEY_BLOCK rows of a tile, 16
 * columns (a cache line) of each row at a time: rows a power of two apart
 * share few of L1's sets, and column by column over all 32 rows each line
 * was read again for every column (d256 on 8 heads, 8 KB apart: a tenth of
 * the backward's time on the development machine). The hot loops' tiles
 * and the forward's packed V (vt) are transposed by it at the baseline
 * level, by 8 x 8 blocks of AVX's shuffles at the others
 * (kernels.c's transpose_in, the table's transpose). */
static inline void native_transpose(const float *const *rows, size_t D, float *t)
{
    for (size_t d0 = 0; d0 < D; d0 += 16) {
        const size_t end = d0 + 16 < D ? d0 + 16 : D;
        for (size_t j = 0; j < KEY_BLOCK; ++j)
            for (size_t d = d0; d < end; ++d)
                t[d * KEY_BLOCK + j] = rows[j][d];
    }
}

/* A call's rounds of jobs: copies and Dsum, the op's main side, then the
 * fused backward's dQ sum or the two-pass backward's query side. */
enum { NATIVE_ROUNDS = 3 };

/* meganeura's LSE pair for a row with no visible key. */
#define EMPTY_ROW (-1e30f)

/* The built-in modifiers of the scores, and all that change the scores
 * themselves. */
#define NATIVE_BUILT_IN (CLATTN_MOD_SOFTCAP | CLATTN_MOD_ALIBI)
#define NATIVE_SHAPED (NATIVE_BUILT_IN | CLATTN_MOD_USER)

typedef struct native_call {
    const clattn_shape *s;
    /* The caller's tensors, of s->dtype: float32, or 16-bit, widened row by
     * row where the jobs read them and rounded row by row where they write
     * them (kernels.c's in_row and out_row), never copied whole. */
    const void *q, *k, *v, *o, *d_out;
    void *dq, *dk, *dv, *o_out;
    const float *lse;
    float *lse_out;
    const float *dsum; /* dO . O per query row, for grad-K */
    /* K and V ([batch][kv head][key][D]) for the query side, Q and dO
     * ([batch][head][pos][D]) for the key side: copies, head-major, so that
     * the rows a job streams lie next to each other (the tensors' own rows
     * are heads * D floats apart). kh is NULL in the float32 forward, which
     * reads K's rows where they lie (query_block_of). */
    const float *kh, *vh, *qh, *oh;
    /* The forward's V instead of vh: by tiles of KEY_BLOCK keys, each
     * transposed ([batch][kv head][tile][D][KEY_BLOCK], zeros past the
     * last key: native_tiled_rows(kv_seq) rows a head), so that its
     * product reads V's elements of a column in a row of their own. */
    const float *vt;
    /* dq_fused: the backward's dQ is summed in the key-side jobs, where
     * that pays (see native.c), else it has a query-side pass of its
     * own. The key-side jobs of part i (of key_parts) add into a float32
     * dQ of their own: where dq_in_place (a float32 dQ the call
     * overwrites), part 0's is dQ itself and part i's (i > 0) head-major
     * copy i - 1 of dq_part (copy j at dq_part + j * dq_part_floats);
     * else part i's is copy i. The copies are summed into dQ after. */
    int dq_fused, dq_in_place;
    float *dq_part;
    size_t dq_part_floats;
    struct native_pool *pool; /* the threads that run its jobs */
    const struct native_kernels *hot;
    /* Head-major copies being made in one round (native.c's
     * head_major), with Dsum's jobs after theirs where dsum_jobs: src (of
     * dtype, widened on the way when 16-bit) to dst, `heads` heads of
     * `rows` rows, as jobs of up to PACK_ROWS rows of one (batch, head),
     * `jobs` of them. */
    struct native_pack {
        const void *src;
        clattn_dtype dtype;
        float *dst;
        size_t heads, rows, jobs;
    } pack[4];
    int packs;
    size_t pack_jobs; /* the copies' jobs, all told */
    /* The forward's V tiles (vt), packed by the jobs that first need them,
     * not in a round of copies before the jobs: vt_pack describes the
     * copy, and vt_state[(b * num_kv_heads + kv head) * tiles a head +
     * tile] is 0 (not packed), 1 (being packed) or 2 (ready);
     * clattn_native_pack_v_tile packs one tile. NULL where there is no vt. */
    struct native_pack vt_pack;
    atomic_int *vt_state;
    /* The key side's head-major rows (the copies queued in pack[], and
     * Dsum where dsum is set), made by the key-side jobs as they first need
     * them where that side runs first, not in a round before them:
     * row_state[(b * num_heads + head) * units + u] for PACK_ROWS rows u
     * of a head, 0, 1 or 2 as vt_state; clattn_native_pack_rows copies a
     * unit's rows. NULL: the copies were made in a round. */
    atomic_int *row_state;
    float scale;
    /* The score modifiers (clattn_modifiers bits) and what they take:
     * delta (clattn_mask_delta) for ALiBi's |P - T| and dropout's P,
     * seq_base for dropout's b (the packed sequence's index). */
    unsigned mods;
    /* The caller's mask function's block map (native.c's mask_map: a byte
     * per MAP_BLOCK x MAP_BLOCK block of rows and keys, [b][head][row
     * block][key block]), or NULL: the mask is asked tile by tile. */
    const uint8_t *mask_map;
    size_t map_rows, map_keys; /* its blocks a head */
    float softcap;
    float cap_k;   /* 2 log2(e) / softcap: tanh_v's exponent a score */
    float cap_inv; /* 1 / softcap: tanh_v's argument a score */
    const float *slopes;
    const float *sinks; /* the forward's, under CLATTN_MOD_SINK */
    clattn_dropout drop;
    int64_t delta;
    uint32_t seq_base;
    size_t group;           /* query heads per KV head */
    size_t blocks_per_head; /* key blocks of one (batch, KV head) */
    size_t key_parts, query_parts; /* jobs per head of each side (above) */
    /* The call's rounds of jobs, in order (native.c's setup_call); a
     * round of none is skipped. */
    void (*round_job[NATIVE_ROUNDS])(const struct native_call *c, size_t job);
    size_t round_jobs[NATIVE_ROUNDS];
    /* Where this call stands for several (packed sequences' rounds run
     * together): theirs and the round's (native.c's native_many). */
    const struct native_many *many;
    /* The round being run, for the pool: its job function, count and the
     * next job to take. */
    void (*job)(const struct native_call *c, size_t job);
    size_t jobs;
    atomic_size_t next;
} native_call;

/* c's score modifiers (mods: their bits for the op) and what they take,
 * from s, and its query heads a KV head. */
static inline void native_call_modifiers(native_call *c, const clattn_shape *s, unsigned mods)
{
    c->scale = clattn_effective_scale(s);
    c->mods = mods;
    c->softcap = s->softcap;
    c->cap_k = s->softcap > 0.0f ? (2.0f * 1.44269504088896341f) / s->softcap : 0.0f;
    c->cap_inv = s->softcap > 0.0f ? 1.0f / s->softcap : 0.0f;
    c->slopes = s->alibi_slopes;
    c->sinks = s->sinks;
    c->drop = clattn_dropout_of(s->dropout_p, s->dropout_seed, s->dropout_offset);
    c->delta = clattn_mask_delta(s);
    c->group = s->num_heads / s->num_kv_heads;
}

/* Whether the caller's mask function and bool mask show key t to query
 * row pos (rows of the call) of head `head` of element b. */
static inline int native_pair_shown(const native_call *c, size_t b, size_t head, uint32_t pos,
                                    uint32_t t)
{
    const clattn_shape *s = c->s;
    if ((c->mods & CLATTN_MOD_BOOL) && !s->bool_mask[clattn_bias_index(s, b, head, pos, t)])
        return 0;
    return !(c->mods & CLATTN_MOD_MASK) ||
           s->mask_native((uint32_t)(c->seq_base + b), (uint32_t)head,
                          clattn_query_position(s, pos, c->delta), t + s->kv_offset);
}

/* Whether a bias tensor is the only per-pair modifier: the hot loops add
 * its rows to vector-modified scores instead of modifying pair by pair. */
static inline int native_bias_alone(unsigned mods)
{
    return (mods & CLATTN_MOD_USER) == CLATTN_MOD_BIAS;
}

/* Whether the caller's score function, with its span form
 * (score_span_native), is the only per-pair modifier: the hot loops run it
 * over a tile's keys or rows after the built-ins' vector code. */
static inline int native_span_alone(const native_call *c)
{
    return (c->mods & CLATTN_MOD_USER) == CLATTN_MOD_SCORE && c->s->score_span_native;
}

/* The span form over n scores x in columns of `rows` (score_span_native)
 * from query row pos (below q_seq) of head `head` of element b and key t
 * (below kv_seq); where dz is not NULL, it is multiplied by the
 * function's derivatives (g, n floats of scratch). */
static inline void native_span(const native_call *c, float *x, float *dz, float *g, uint32_t n,
                               uint32_t rows, size_t b, uint32_t pos, uint32_t t, size_t head)
{
    const clattn_shape *s = c->s;
    const int chain = dz && (c->mods & CLATTN_MOD_SOFTCAP); /* else dz holds 1s */
    s->score_span_native(x, chain ? g : dz, n, rows, (uint32_t)(c->seq_base + b), (uint32_t)head,
                         clattn_query_position(s, pos, c->delta), t + s->kv_offset,
                         s->score_params);
    if (chain)
        for (uint32_t i = 0; i < n; ++i)
            dz[i] *= g[i];
}

/* Whether the pairs' only per-pair modifiers hide them (a mask function, a
 * bool mask): the tiles a block map shows whole need not ask them. */
static inline int native_hide_alone(unsigned mods)
{
    return (mods & NATIVE_SHAPED) && !(mods & NATIVE_SHAPED & ~(unsigned)CLATTN_MOD_HIDE);
}

/* The modified score of the scaled score x of query row pos and key t of
 * query head `head` of batch element b (softcap, then ALiBi, then the
 * caller's functions: cl/common.cl's modify()); *dz, where dz is not NULL,
 * gets dz/dx (softcap's 1 - tanh^2 times the score function's derivative;
 * 1 without them): without it the score function's derivative is not
 * asked for. */
static inline float native_modify(const native_call *c, float x, size_t b, uint32_t pos,
                                  uint32_t t, size_t head, float *dz)
{
    float g = 1.0f;
    if (c->mods & CLATTN_MOD_SOFTCAP) {
        const float th = tanhf(x / c->softcap);
        x = c->softcap * th;
        g = 1.0f - th * th;
    }
    if (c->mods & CLATTN_MOD_ALIBI) {
        const int64_t dist = (int64_t)pos + c->delta - (int64_t)t;
        x -= c->slopes[head] * (float)(dist < 0 ? -dist : dist);
    }
    if (c->mods & CLATTN_MOD_USER) {
        /* the global positions, of rows clamped to the call's (a tile's
         * tail past them is discarded) */
        const clattn_shape *s = c->s;
        const uint32_t P = clattn_query_position(s, pos < s->q_seq ? pos : s->q_seq - 1, c->delta);
        const uint32_t T = (t < s->kv_seq ? t : s->kv_seq - 1) + s->kv_offset;
        const uint32_t bb = (uint32_t)(c->seq_base + b), h = (uint32_t)head;
        if (c->mods & CLATTN_MOD_SCORE) {
            if (dz)
                g *= s->score_ds_native(x, bb, h, P, T, s->score_params);
            x = s->score_native(x, bb, h, P, T, s->score_params);
        }
        const uint32_t i = pos < s->q_seq ? pos : s->q_seq - 1, j = T - s->kv_offset;
        if (c->mods & CLATTN_MOD_BIAS)
            x += clattn_bias_value(s, clattn_bias_index(s, b, head, i, j));
        if ((c->mods & CLATTN_MOD_HIDE) && !native_pair_shown(c, b, head, i, j)) {
            x = -INFINITY;
            g = 0.0f;
        }
    }
    if (dz)
        *dz = g;
    return x;
}

/* CLATTN_ERROR_UNSUPPORTED_SHAPE, naming `who`, where s has a function
 * without its C form or a bias or bool mask only in cl_mem: what the host
 * cannot run. */
clattn_status clattn_native_host_forms(const clattn_shape *s, const char *who);

/* mask_map.c: c's block map (c->mask_map), the context's kept one where it
 * is the call's, else made on the pool's threads; left NULL (the tiles ask
 * the mask) where it would pass 64 MB or memory is short. _free drops the
 * kept one. */
void clattn_native_mask_map(clattn_context *ctx, native_call *c);
void clattn_native_mask_map_free(clattn_context *ctx);

/* Whether the caller's mask function shows a pair of the query rows
 * [pos0, pos0 + rows) of head `head` of element b and the keys [t0, t0 +
 * n): the tiles and rows it hides whole are skipped. Always without one. */
#define MAP_BLOCK 32u
enum { MAP_HIDDEN = 0, MAP_SOME = 1, MAP_ALL = 2 };
/* 0 where the mask hides them all; 1 where it shows some; 2 where the map
 * says it shows every pair the built-in masks do (a tile that need not
 * ask it). */
static inline int native_mask_shows(const native_call *c, size_t b, size_t head, size_t pos0,
                                    size_t rows, uint32_t t0, uint32_t n)
{
    if (!(c->mods & CLATTN_MOD_HIDE) || !rows || !n)
        return 1;
    const clattn_shape *s = c->s;
    if (c->mask_map) {
        const uint8_t *m = c->mask_map + (b * s->num_heads + head) * c->map_rows * c->map_keys;
        int all = 1, any = 0;
        for (size_t i = pos0 / MAP_BLOCK; i <= (pos0 + rows - 1) / MAP_BLOCK; ++i)
            for (size_t j = t0 / MAP_BLOCK; j <= (t0 + n - 1) / MAP_BLOCK; ++j) {
                const uint8_t v = m[i * c->map_keys + j];
                any |= v != MAP_HIDDEN;
                all &= v == MAP_ALL;
            }
        return any ? 1 + all : 0;
    }
    for (size_t r = 0; r < rows; ++r)
        for (uint32_t j = 0; j < n; ++j)
            if (native_pair_shown(c, b, head, (uint32_t)(pos0 + r), t0 + j))
                return 1;
    return 0;
}

typedef uint64_t native_u64x8 __attribute__((vector_size(64)));
/* *r = *a * m lane by lane, a's lanes below 2^32: one 32 x 32 -> 64-bit
 * product where the level has it (vpmuludq), not a 64-bit one. Through
 * pointers: a 64-byte vector is no argument below AVX-512. */
static inline void native_mul32(native_u64x8 *r, const native_u64x8 *a, uint32_t m)
{
#if defined(__AVX512F__)
    *r = (native_u64x8)_mm512_mul_epu32((__m512i)*a, _mm512_set1_epi64(m));
#elif defined(__AVX2__)
    __m256i half[2];
    memcpy(half, a, sizeof half);
    const __m256i k = _mm256_set1_epi64x(m);
    half[0] = _mm256_mul_epu32(half[0], k);
    half[1] = _mm256_mul_epu32(half[1], k);
    memcpy(r, half, sizeof *r);
#else
    *r = *a * (uint64_t)m;
#endif
}

/* Philox4x32-10 of n blocks of eight counters each (c[i][word]), rounds
 * outside, blocks inside: the blocks' chains of products overlap. Where
 * native_mul32 reads the low halves alone (vpmuludq), the lanes' high
 * halves carry what they will through the rounds, never into a low half,
 * and are cleared once at the end. */
#if defined(__AVX2__)
#define NATIVE_HIGH_JUNK 1
#else
#define NATIVE_HIGH_JUNK 0
#endif
static inline void native_philox8(native_u64x8 (*c)[4], int n, uint32_t k0, uint32_t k1)
{
    const native_u64x8 lo32 = (native_u64x8){0} + 0xFFFFFFFFu;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        for (int i = 0; i < n; ++i) {
            native_u64x8 a, b;
            native_mul32(&a, &c[i][0], 0xD2511F53u);
            native_mul32(&b, &c[i][2], 0xCD9E8D57u);
            c[i][0] = (b >> 32) ^ c[i][1] ^ k0;
            c[i][2] = (a >> 32) ^ c[i][3] ^ k1;
            c[i][1] = NATIVE_HIGH_JUNK ? b : b & lo32;
            c[i][3] = NATIVE_HIGH_JUNK ? a : a & lo32;
        }
    }
    for (int i = 0; i < n && NATIVE_HIGH_JUNK; ++i)
        for (int w = 0; w < 4; ++w)
            c[i][w] &= lo32;
}

/* The counters' row words (P, h, b) of n rows (at most 32) of element b
 * of the call, eight rows a vector: a query block's once, for all its
 * tiles. Rows past n repeat row 0 of their eight. */
typedef struct native_drop_rows {
    native_u64x8 word[4][3];
    size_t n;
} native_drop_rows;

static inline void native_drop_rows_of(const native_call *c, size_t b, const uint32_t *pos,
                                       const uint32_t *head, size_t n, native_drop_rows *d)
{
    d->n = n;
    for (size_t r0 = 0; r0 < n; r0 += 8) {
        uint64_t lanes[3][8]; /* P, head and b of the eight rows */
        for (int i = 0; i < 8; ++i) {
            const size_t r = r0 + i < n ? r0 + i : r0;
            lanes[0][i] = clattn_query_position(c->s, pos[r], c->delta);
            lanes[1][i] = head[r];
            lanes[2][i] = (uint32_t)(b + c->seq_base);
        }
        memcpy(d->word[r0 / 8], lanes, sizeof lanes);
    }
}

/* Dropout's keep bits of 32 keys t0 .. t0 + 31 for d's rows: bit j of
 * bits[r] is key t0 + j's. Eight rows' Philox blocks at a time, in 64-bit
 * lanes. */
static inline void native_keep_bits(const native_call *c, const native_drop_rows *d, uint32_t t0,
                                    uint32_t *bits)
{
    const uint32_t T0 = t0 + c->s->kv_offset, thr = c->drop.threshold;
    const uint64_t first = T0 >> 4, last = ((uint64_t)T0 + 31u) >> 4;
    const size_t n = d->n;
    for (size_t r0 = 0; r0 < n; r0 += 8) {
        const native_u64x8 *row = d->word[r0 / 8];
        native_u64x8 ctr[3][4]; /* 32 keys span at most 3 blocks of 16 */
        const int blocks = (int)(last - first + 1);
        for (int k = 0; k < blocks; ++k) {
            /* the keys' positions wrap at 2^32, their blocks at 2^28 */
            ctr[k][0] = (native_u64x8){0} + (uint32_t)((first + (uint64_t)k) & 0x0FFFFFFFu);
            ctr[k][1] = row[0];
            ctr[k][2] = row[1];
            ctr[k][3] = row[2];
        }
        native_philox8(ctr, blocks, c->drop.key[0], c->drop.key[1]);
        native_u64x8 keep = {0};
        for (int k = 0; k < blocks && thr <= 0xFFu; ++k) { /* past 8 bits: nothing kept */
            native_u64x8 block;
#if defined(__AVX512BW__)
            /* A block's sixteen 8-bit draws (key i: byte i % 4 of word i /
             * 4) as two lanes of eight bytes, compared at once; the mask's
             * eight bits of a lane are its keys' keep bits. */
            const __m512i bar = _mm512_set1_epi8((char)(uint8_t)thr);
            uint64_t m[2], lanes[8];
            for (int half = 0; half < 2; ++half) {
                const native_u64x8 v = ctr[k][2 * half] | (ctr[k][2 * half + 1] << 32);
                m[half] = _mm512_cmpge_epu8_mask((__m512i)v, bar);
            }
            for (int i = 0; i < 8; ++i)
                lanes[i] = (m[0] >> (8 * i) & 0xFFu) | (m[1] >> (8 * i) & 0xFFu) << 8;
            memcpy(&block, lanes, sizeof block);
#else
            block = (native_u64x8){0};
            for (uint32_t i = 0; i < 16; ++i) { /* key i's byte: i % 4 of word i / 4 */
                const native_u64x8 u = (ctr[k][i >> 2] >> (8u * (i & 3u))) & 0xFFu;
                block |= ((native_u64x8)(u >= thr) & 1u) << i;
            }
#endif
            /* the block's first key is t0 + at; keys past t0 + 31 fall off */
            const int64_t at = (int64_t)((first + (uint64_t)k) * 16u) - (int64_t)T0;
            keep |= at >= 0 ? block << at : block >> -at;
        }
        uint64_t out[8];
        memcpy(out, &keep, sizeof out);
        for (size_t i = 0; i < 8 && r0 + i < n; ++i)
            bits[r0 + i] = out[i];
    }
}

typedef void (*native_job)(const native_call *c, size_t job);

/* The score parameters' gradient over blocks of query rows (grad_bias.c):
 * the call with its built-in modifiers alone, and with the caller's
 * functions alone (applied to the scores the built-ins gave: scale 1),
 * the part's float64 sums (score_params_count), and `bad`, set where
 * score_dp_native gave more than CLATTN_SCORE_DP_MAX indices or one past
 * the parameters. */
typedef struct native_params {
    const native_call *built_in, *user;
    double *sums;
    uint32_t bad;
} native_params;

/* The hot loops of one compilation: forward and grad-Q jobs take a block of
 * query rows, key-block jobs a block of keys (dK and/or dV), dsum jobs
 * DSUM_ROWS rows. */
typedef struct native_kernels {
    const char *name; /* the instruction set it was compiled for */
    native_job forward, grad_q, key_block, dsum;
    /* clattn_to_f32 and clattn_from_f32, compiled for the level */
    void (*widen)(clattn_dtype dtype, const void *src, float *dst, size_t n);
    void (*narrow)(clattn_dtype dtype, const float *src, void *dst, size_t n);
    /* native_transpose, compiled for the level */
    void (*transpose)(const float *const *rows, size_t D, float *t);
    /* the score parameters' gradient of query block `block` (the forward's
     * numbering) into p (c: Q, O and dO the call's; K and V float32 in the
     * call's layout, kh and vh NULL) */
    void (*params)(const native_call *c, size_t block, native_params *p);
    /* dBias of block `job` of the bias's slices' query blocks (slice job /
     * blocks), the pairs of every batch element and head it gathers, in
     * order (c as for params) */
    void (*bias)(const native_call *c, size_t job, float *d_bias);
} native_kernels;

/* Tile `tile` of V's copy c->vt_pack for (b, kv_head) (native.c): the
 * forward's jobs pack V's tiles as they first need them (kernels.c's
 * ready_tiles). */
void clattn_native_pack_v_tile(const native_call *c, size_t b, size_t kv_head, size_t tile);

/* Rows of unit u (PACK_ROWS rows) of (b, head) into every copy queued in
 * c->pack (native.c); the key-side jobs make the copies this way where
 * c->row_state is set (kernels.c's ready_rows), Dsum beside them. */
void clattn_native_pack_rows(const native_call *c, size_t b, size_t head, size_t u);
/* A job of the copies' round: PACK_ROWS rows of one (batch, head) of one
 * copy; past the copies' jobs, Dsum's (pack.c). */
void clattn_native_pack_job(const native_call *c, size_t job);

/* The hot loops for this CPU: the highest level it has, at most
 * CLATTN_NATIVE_LEVEL (v4, v3 or baseline) where that is set (an invalid
 * value: CLATTN_ERROR_INVALID_OPTION, *out the baseline). */
clattn_status clattn_native_pick_kernels(const native_kernels **out);

extern const native_kernels clattn_native_baseline;
#if CLATTN_NATIVE_LEVELS
extern const native_kernels clattn_native_v3, clattn_native_v4;
#endif

#endif
