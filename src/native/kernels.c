/* The native backend's hot loops (see native.c for the jobs' shapes).
 * This file is compiled once per instruction-set level, each with its own
 * -m flags and NATIVE_LEVEL (v4: AVX-512 F/BW/CD/DQ/VL; v3: AVX2 with FMA;
 * baseline: the build's target), rather than cloned by target_clones: GCC
 * lowers some generic vector operations (integer comparisons) for the
 * baseline before it clones, so a clone need not be vectorised for its own
 * level (results/tuning-notes.md). */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "native.h"

#ifndef NATIVE_LEVEL
#define NATIVE_LEVEL baseline
#define NATIVE_NAME "baseline"
#endif
#define NATIVE_TABLE_(level) clattn_native_##level
#define NATIVE_TABLE(level) NATIVE_TABLE_(level)

#include "simd.h"

/* The part (of `parts`) that block i of a head falls to: to and fro (see
 * native.h). */
INLINE size_t part_of(size_t i, size_t parts)
{
    const size_t m = i % (2 * parts);
    return m < parts ? m : 2 * parts - 1 - m;
}

/* out[i][.] = sum_d rows[i][d] * t[d][.] for DOT_ROWS rows. */
INLINE void dots(const float *const *rows, const tile_row *t, size_t D, tile_row *out)
{
    hvec a[DOT_ROWS][PARTS];
    for (int i = 0; i < DOT_ROWS; ++i)
        for (int p = 0; p < PARTS; ++p)
            a[i][p] = HSPLAT(0.0f);
    for (size_t d = 0; d < D; ++d) {
        hvec x[PARTS];
        for (int p = 0; p < PARTS; ++p) {
            x[p] = hload(t[d] + p * HW);
            IN_REGISTER(x[p]);
        }
        for (int i = 0; i < DOT_ROWS; ++i) {
            const float r = rows[i][d];
            for (int p = 0; p < PARTS; ++p)
                a[i][p] += r * x[p];
        }
    }
    for (int i = 0; i < DOT_ROWS; ++i)
        for (int p = 0; p < PARTS; ++p)
            hstore(out[i] + p * HW, a[i][p]);
}

/* acc[d][.] += sum_r rows[r][d] * w[r][.] for r < n: ACC_DIMS rows of the
 * transposed accumulator stay in registers while the n rows stream by. */
INLINE void accumulate(tile_row *acc, size_t D, const float *const *rows, const tile_row *w,
                       size_t n)
{
    size_t d = 0;
    for (; d + ACC_DIMS <= D; d += ACC_DIMS) {
        hvec c[ACC_DIMS][PARTS];
        for (int i = 0; i < ACC_DIMS; ++i)
            for (int p = 0; p < PARTS; ++p)
                c[i][p] = hload(acc[d + i] + p * HW);
        for (size_t r = 0; r < n; ++r) {
            hvec x[PARTS];
            for (int p = 0; p < PARTS; ++p) {
                x[p] = hload(w[r] + p * HW);
                IN_REGISTER(x[p]);
            }
            const float *row = rows[r] + d;
            for (int i = 0; i < ACC_DIMS; ++i)
                for (int p = 0; p < PARTS; ++p)
                    c[i][p] += row[i] * x[p];
        }
        for (int i = 0; i < ACC_DIMS; ++i)
            for (int p = 0; p < PARTS; ++p)
                hstore(acc[d + i] + p * HW, c[i][p]);
    }
    for (; d < D; ++d)
        EACH_PART(h) {
            hvec c = hload(acc[d] + h);
            for (size_t r = 0; r < n; ++r)
                c += rows[r][d] * hload(w[r] + h);
            hstore(acc[d] + h, c);
        }
}

/* The forward's: acc[d][.] = acc[d][.] * rescale[.] + sum_r xt[d][r] *
 * w[r][.], the accumulator scaled as it is loaded (the running rescale, at
 * no pass of its own), and xt a transposed tile of V (vt's layout), so
 * that each broadcast element of a column follows the last in memory:
 * from V's rows they were a row apart, and at d256 the 32 rows of a tile
 * (a KB apart) shared a few of L1's sets. */
INLINE void accumulate_t(tile_row *acc, size_t D, const tile_row *xt, const tile_row *w,
                         size_t n, const float *rescale)
{
    hvec rs[PARTS];
    for (int p = 0; p < PARTS; ++p)
        rs[p] = hload(rescale + p * HW);
    size_t d = 0;
    for (; d + ACC_DIMS <= D; d += ACC_DIMS) {
        hvec c[ACC_DIMS][PARTS];
        for (int i = 0; i < ACC_DIMS; ++i)
            for (int p = 0; p < PARTS; ++p)
                c[i][p] = (hvec)hload(acc[d + i] + p * HW) * rs[p];
        for (size_t r = 0; r < n; ++r) {
            hvec x[PARTS];
            for (int p = 0; p < PARTS; ++p) {
                x[p] = hload(w[r] + p * HW);
                IN_REGISTER(x[p]);
            }
            for (int i = 0; i < ACC_DIMS; ++i)
                for (int p = 0; p < PARTS; ++p)
                    c[i][p] += xt[d + i][r] * x[p];
        }
        for (int i = 0; i < ACC_DIMS; ++i)
            for (int p = 0; p < PARTS; ++p)
                hstore(acc[d + i] + p * HW, c[i][p]);
    }
    for (; d < D; ++d)
        EACH_PART(h) {
            hvec c = (hvec)hload(acc[d] + h) * rs[h / HW];
            for (size_t r = 0; r < n; ++r)
                c += xt[d][r] * hload(w[r] + h);
            hstore(acc[d] + h, c);
        }
}

/* ---- score modifiers ---------------------------------------------------- */

/* j as a float, lane by lane: |P - T| of a tile's rows or keys. */
static const float lane_float[KEY_BLOCK] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* tanh(x / cap), lane by lane, k = 2 log2(e) / cap, inv = 1 / cap, as
 * cl/common.cl's softcap_tanh(): where |x / cap| < 1/4 its odd series to
 * the ninth power, accurate relative to x / cap, so that a large cap tends
 * to no cap; else sign(x) (1 - e) / (1 + e) with e = exp(-2 |x| / cap)
 * from exp2v, one division. NaN stays NaN. */
INLINE hvec tanh_v(hvec x, float k, float inv)
{
    const hivec neg = x < 0.0f;
    const hvec e = exp2v(HSELECT(neg, x, -x) * k);
    const hvec t = (1.0f - e) / (1.0f + e);
    const hvec y = x * inv, y2 = y * y;
    const hvec series =
        y * (1.0f + y2 * (-1.0f / 3.0f +
                          y2 * (2.0f / 15.0f + y2 * (-17.0f / 315.0f + y2 * (62.0f / 2835.0f)))));
    const hivec small = HSELECT(neg, -y, y) < 0.25f;
    return HSELECT(small, series, HSELECT(neg, -t, t));
}

/* native_modify() of HW scaled scores x whose |P - T| are dist, of one
 * query head's slope; *dz their derivatives. */
INLINE hvec modify_v(const native_call *c, hvec x, hvec dist, float slope, hvec *dz)
{
    *dz = HSPLAT(1.0f);
    if (c->mods & CLATTN_MOD_SOFTCAP) {
        const hvec th = tanh_v(x, c->cap_k, c->cap_inv);
        x = c->softcap * th;
        *dz = 1.0f - th * th;
    }
    if (c->mods & CLATTN_MOD_ALIBI)
        x -= slope * dist;
    return x;
}

/* |P - T| = |base + r - j| in float32 lanes is exact while |base| stays
 * well below 2^24; past it the scalar native_modify() takes the tile. */
INLINE int small_distance(int64_t base) { return base > -(1 << 23) && base < (1 << 23); }

/* A query-side tile sc[j][r] (raw dots of key t0 + j and query row pos0 +
 * r of query head `head`) to modified scaled scores, their derivatives in
 * dz where not NULL. */
INLINE void modify_rows(const native_call *c, tile_row *sc, tile_row *dz, size_t pos0,
                        uint32_t t0, size_t head)
{
    const float slope = c->slopes ? c->slopes[head] : 0.0f;
    const int64_t base = (int64_t)pos0 + c->delta - (int64_t)t0;
    if (!small_distance(base)) {
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            for (size_t r = 0; r < QUERY_BLOCK; ++r) {
                float g;
                sc[j][r] = native_modify(c, sc[j][r] * c->scale, (uint32_t)(pos0 + r), t0 + j,
                                         head, &g);
                if (dz)
                    dz[j][r] = g;
            }
        return;
    }
    EACH_PART(h) {
        const hvec rows = hload(lane_float + h) + (float)base;
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            const hvec d = rows - (float)j;
            hvec g;
            hstore(sc[j] + h,
                   modify_v(c, hload(sc[j] + h) * c->scale, HSELECT(d < 0.0f, -d, d), slope, &g));
            if (dz)
                hstore(dz[j] + h, g);
        }
    }
}

/* Dropout's keep bits (native_keep_bits' layout: bit j of kept[r] for key
 * t0 + j and row r) applied to a query-side tile x[j][r]: x times gain
 * where kept, 0 where dropped. */
INLINE void drop_rows(tile_row *x, const uint32_t *kept, float gain)
{
    EACH_PART(h) {
        const huvec bits = huload(kept + h);
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            hstore(x[j] + h, HSELECT((hivec)((bits >> j) & 1u) != 0, hload(x[j] + h) * gain,
                                     HSPLAT(0.0f)));
    }
}

/* Key-side jobs gather the query rows (every head of the group at each
 * position) that see any key of the block, CHUNK at a time. */
enum { CHUNK = 32 };

typedef struct key_chunk {
    const float *q[CHUNK], *d_out[CHUNK];
    float *dq[CHUNK]; /* the row of the float32 dQ the block adds into */
    float m[CHUNK], l[CHUNK], dsum[CHUNK];
    uint32_t lo[CHUNK], hi[CHUNK]; /* keys of the block the row sees */
    uint32_t pos[CHUNK], head[CHUNK]; /* the row's query position and head */
    size_t b;                         /* the block's batch element */
    uint32_t t0;                      /* and first key */
    size_t n;
} key_chunk;

/* acc[i][d0 + v * HW + .] += sum_j w[i][j] * krows[j][same] for the
 * DQ_ROWS rows i and nv (up to DQ_VECS) hardware vectors v of columns from
 * d0: DQ_ROWS x nv accumulators, so that each key row's vectors serve
 * DQ_ROWS rows and each broadcast w element nv vectors. */
enum { DQ_ROWS = HW == 16 ? 4 : 2, DQ_VECS = 4 };
INLINE void add_dq_vecs(float *const *acc, const tile_row *w, const float *const *krows,
                        size_t d0, int nv)
{
    hvec a[DQ_ROWS][DQ_VECS];
    for (int i = 0; i < DQ_ROWS; ++i)
        for (int v = 0; v < nv; ++v)
            a[i][v] = hload(acc[i] + d0 + v * HW);
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        hvec x[DQ_VECS];
        for (int v = 0; v < nv; ++v) {
            x[v] = hload(krows[j] + d0 + v * HW);
            IN_REGISTER(x[v]);
        }
        for (int i = 0; i < DQ_ROWS; ++i) {
            const float b = w[i][j];
            for (int v = 0; v < nv; ++v)
                a[i][v] += b * x[v];
        }
    }
    for (int i = 0; i < DQ_ROWS; ++i)
        for (int v = 0; v < nv; ++v)
            hstore(acc[i] + d0 + v * HW, a[i][v]);
}

/* dq[r] += sum_j ds[r][j] * krows[j] for the chunk's n rows (ds zero past
 * them, up to a multiple of PAD_ROWS): DQ_ROWS rows at a time, DQ_VECS
 * vectors of columns at a time, then what is left of a row's vectors (two,
 * then one), then its columns past the last whole vector. Each element's
 * sum runs over j in order from dQ's value, as a vector at a time of 8 rows
 * had summed it: 8 accumulators of one vector each took a load of a key
 * row's vector and 8 broadcast loads for 8 FMAs (1.1 loads an FMA, 0.5
 * now at AVX-512's level). */
INLINE void add_dq(float *const *dq, const tile_row *ds, const float *const *krows, size_t D,
                   size_t n)
{
    _Static_assert(PAD_ROWS % DQ_ROWS == 0, "chunks padded to whole groups of rows");
    for (size_t r = 0; r < n; r += DQ_ROWS) {
        float *const *acc = dq + r;
        const tile_row *w = ds + r;
        size_t d = 0;
        for (; d + DQ_VECS * HW <= D; d += DQ_VECS * HW)
            add_dq_vecs(acc, w, krows, d, DQ_VECS);
        if (d + 2 * HW <= D) {
            add_dq_vecs(acc, w, krows, d, 2);
            d += 2 * HW;
        }
        if (d + HW <= D) {
            add_dq_vecs(acc, w, krows, d, 1);
            d += HW;
        }
        for (; d < D; ++d)
            for (int i = 0; i < DQ_ROWS; ++i) {
                float a = acc[i][d];
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    a += w[i][j] * krows[j][d];
                acc[i][d] = a;
            }
    }
}

/* Adds one chunk of query rows to the block's transposed dK and dV (and,
 * with c->dq_fused, to the part's dQ, krows the block's key rows). */
INLINE void key_chunk_run(const native_call *c, key_chunk *ch, const tile_row *kt,
                          const tile_row *vt, tile_row *dkt, tile_row *dvt,
                          const float *const *krows)
{
    const size_t D = c->s->head_dim, n = ch->n;
    _Alignas(64) tile_row p[CHUNK], ds[CHUNK];
    for (size_t r = n; r % PAD_ROWS; ++r) {
        ch->q[r] = ch->d_out[r] = zero_row;
        ch->lo[r] = ch->hi[r] = 0;
    }
    const size_t padded = (n + PAD_ROWS - 1) / PAD_ROWS * PAD_ROWS; /* zero rows past n */
    for (size_t r = 0; r < padded; r += DOT_ROWS) {
        dots(ch->q + r, kt, D, p + r);
        if (dkt)
            dots(ch->d_out + r, vt, D, ds + r);
    }
    const float scale = c->scale;
    /* modified scores come scaled; dS takes dropout's mask through dP */
    _Alignas(64) tile_row dz[CHUNK];
    uint32_t kept[CHUNK];
    const int shaped = (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_ALIBI)) != 0;
    if (c->mods & CLATTN_MOD_DROPOUT) {
        native_drop_rows rows;
        native_drop_rows_of(c, ch->b, ch->pos, ch->head, n, &rows);
        native_keep_bits(c, &rows, ch->t0, kept);
    }
    for (size_t r = 0; r < n && c->mods; ++r) {
        const int64_t base = (int64_t)ch->pos[r] + c->delta - (int64_t)ch->t0;
        const float slope = c->slopes ? c->slopes[ch->head[r]] : 0.0f;
        if (shaped && !small_distance(base))
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                p[r][j] = native_modify(c, p[r][j] * scale, ch->pos[r], ch->t0 + j,
                                        ch->head[r], &dz[r][j]);
        EACH_PART(h) {
            if (shaped && small_distance(base)) {
                const hvec d = (float)base - hload(lane_float + h);
                hvec g;
                hstore(p[r] + h, modify_v(c, hload(p[r] + h) * scale, HSELECT(d < 0.0f, -d, d),
                                          slope, &g));
                hstore(dz[r] + h, g);
            }
            if (dkt && (c->mods & CLATTN_MOD_DROPOUT)) {
                const hivec keep = (hivec)(((huvec){0} + kept[r]) >> huload(lane_index + h) & 1u);
                hstore(ds[r] + h, HSELECT(keep != 0, hload(ds[r] + h) * c->drop.gain,
                                          HSPLAT(0.0f)));
            }
        }
    }
    const float unit = shaped ? LOG2E : scale * LOG2E;
    for (size_t r = 0; r < n; ++r) {
        /* p = exp(min(s * scale - m, 0) - l) in base 2 */
        const float m2 = ch->m[r] * LOG2E, l2 = ch->l[r] * LOG2E;
        EACH_PART(h) {
            const hvec x = hload(p[r] + h) * unit - m2;
            const huvec j = huload(lane_index + h);
            const hivec live = (j >= ch->lo[r]) & (j < ch->hi[r]);
            const hvec pr = HSELECT(live, exp2v(HMIN0(x) - l2), HSPLAT(0.0f));
            hstore(p[r] + h, pr);
            /* masked pairs' dS exactly 0, whatever a NaN elsewhere in the row */
            if (dkt)
                hstore(ds[r] + h,
                       HSELECT(live, scale * pr * (hload(ds[r] + h) - ch->dsum[r]),
                               HSPLAT(0.0f)));
        }
    }
    for (size_t r = 0; r < n && (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_DROPOUT)); ++r)
        EACH_PART(h) {
            if (c->mods & CLATTN_MOD_DROPOUT) {
                const hivec keep = (hivec)(((huvec){0} + kept[r]) >> huload(lane_index + h) & 1u);
                hstore(p[r] + h, HSELECT(keep != 0, hload(p[r] + h) * c->drop.gain,
                                         HSPLAT(0.0f)));
            }
            if (dkt && (c->mods & CLATTN_MOD_SOFTCAP))
                hstore(ds[r] + h, hload(ds[r] + h) * hload(dz[r] + h));
        }
    if (dvt)
        accumulate(dvt, D, ch->d_out, p, n);
    if (dkt)
        accumulate(dkt, D, ch->q, ds, n);
    if (dkt && c->dq_fused) {
        _Alignas(64) float spare[CLATTN_MAX_HEAD_DIM]; /* the padding rows' sums */
        for (size_t r = n; r < CHUNK; ++r)
            ch->dq[r] = spare;
        add_dq(ch->dq, ds, krows, D, n);
    }
    ch->n = 0;
}

/* dO . O of row `row`. float32 rows go to dot() directly, not through
 * in_row(): with the widening inlined beside it, GCC compiled dot()'s
 * vector part as products and sums apart rather than FMAs (dsum_job at the
 * AVX2 level), and float32 gradients moved by an ulp. */
INLINE float row_dsum(const native_call *c, size_t row)
{
    const size_t D = c->s->head_dim;
    if (c->s->dtype == CLATTN_DTYPE_F32)
        return dot((const float *)c->d_out + row * D, (const float *)c->o + row * D, D);
    _Alignas(64) float a[CLATTN_MAX_HEAD_DIM], b[CLATTN_MAX_HEAD_DIM];
    return dot(in_row(c, c->d_out, row * D, D, a), in_row(c, c->o, row * D, D, b), D);
}

/* The spin-wait of ready_tiles and ready_rows: until *state is 2 (a unit
 * another job claimed is ready). A unit takes microseconds; past a few
 * thousand spins its maker is likely off its core (more threads than
 * cores), so give way to it. */
INLINE void wait_ready(atomic_int *state)
{
    for (unsigned spins = 0; atomic_load_explicit(state, memory_order_acquire) != 2;)
        if (++spins % 4096 == 0)
            sched_yield();
#if defined(__SSE2__)
        else
            _mm_pause();
#endif
}

/* Claims a unit not yet made (0 -> 1): 1 where this job is to make it. */
INLINE int claim(atomic_int *state)
{
    int idle = 0;
    return atomic_load_explicit(state, memory_order_acquire) == 0 &&
           atomic_compare_exchange_strong_explicit(state, &idle, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

/* The key side's rows of query positions [start, end) of every head of
 * the group of (b, kv_head), ready (c->row_state): each unit of them not
 * yet made is claimed, made by this job (the head-major copies' rows, then
 * Dsum's) and marked ready; then the job waits for those other jobs
 * claimed. No job waits while it holds a claim, so none waits for ever. */
INLINE void ready_rows(const native_call *c, size_t b, size_t kv_head, uint32_t start,
                       uint32_t end)
{
    if (start >= end)
        return;
    const clattn_shape *s = c->s;
    const size_t units = (s->q_seq + (size_t)PACK_ROWS - 1) / PACK_ROWS;
    const size_t first = start / PACK_ROWS, last = (end + (size_t)PACK_ROWS - 1) / PACK_ROWS;
    const size_t h0 = kv_head * c->group;
    atomic_int *state = c->row_state + (b * s->num_heads + h0) * units;
    for (size_t h = 0; h < c->group; ++h)
        for (size_t u = first; u < last; ++u)
            if (claim(state + h * units + u)) {
                clattn_native_pack_rows(c, b, h0 + h, u);
                if (c->dsum) {
                    const size_t stop = (u + 1) * PACK_ROWS < s->q_seq ? (u + 1) * PACK_ROWS
                                                                       : s->q_seq;
                    for (size_t pos = u * PACK_ROWS; pos < stop; ++pos) {
                        const size_t row = row_index(s, b, pos, h0 + h);
                        ((float *)c->dsum)[row] = row_dsum(c, row);
                    }
                }
                atomic_store_explicit(state + h * units + u, 2, memory_order_release);
            }
    for (size_t h = 0; h < c->group; ++h)
        for (size_t u = first; u < last; ++u)
            wait_ready(state + h * units + u);
}

/* The head-major dQ copy that key-side part `part` adds into (native.h's
 * dq_part); NULL where it adds into dQ itself (part 0, dq_in_place). */
INLINE float *part_copy(const native_call *c, size_t part)
{
    if (c->dq_in_place && part == 0)
        return NULL;
    return c->dq_part + (part - (size_t)c->dq_in_place) * c->dq_part_floats;
}

/* dV and/or dK of KEY_BLOCK keys of one (batch, KV head). */
static void key_block(const native_call *c, size_t job)
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
    /* 16-bit rows widened; the fused backward's dS K reads the block's key
     * rows for every chunk of query rows: from a copy of their own, not
     * from K, where they lie heads * D floats apart (a power of two there
     * put all 32 in one or two of L1's sets: its product took twice the
     * time a flop of the others did; d64 on 8 KV heads, 2 KB apart). */
    _Alignas(64) float kcopy[KEY_BLOCK * CLATTN_MAX_HEAD_DIM];
    float *vwide = (float *)dkt; /* V's widened rows, until dK starts */
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        krows[j] = j < nt ? in_row(c, c->k, first + j * kv_row, D, kcopy + j * D) : zero_row;
        vrows[j] = j < nt && want_dk ? in_row(c, c->v, first + j * kv_row, D, vwide + j * D)
                                     : zero_row;
    }
    transpose_in(krows, D, kt);
    if (c->dq_fused && s->dtype == CLATTN_DTYPE_F32)
        for (uint32_t j = 0; j < nt; ++j) {
            memcpy(kcopy + j * D, krows[j], D * sizeof(float));
            krows[j] = kcopy + j * D;
        }
    if (want_dk)
        transpose_in(vrows, D, vt);
    memset(dkt, 0, D * sizeof dkt[0]);
    memset(dvt, 0, D * sizeof dvt[0]);

    /* The queries that see any key of the block. */
    uint32_t start, end, unused;
    clattn_query_range(s, t0, &start, &unused);
    clattn_query_range(s, t0 + nt - 1, &unused, &end);
    if (c->row_state)
        ready_rows(c, b, kv_head, start, end);
    key_chunk ch;
    ch.n = 0;
    ch.b = b;
    ch.t0 = t0;
    /* the part's dQ: a head-major copy (at), or dQ's own rows (row * D) */
    float *const dq_copy = c->dq_fused ? part_copy(c, part_of(block, c->key_parts)) : NULL;
    float *const dq_own = c->dq_fused && !dq_copy ? (float *)c->dq : NULL;
    for (uint32_t pos = start; pos < end; ++pos) {
        /* Keys of the block that pos sees: [lo, hi). */
        uint32_t lo, hi;
        clattn_key_range(s, pos, &lo, &hi);
        lo = lo > t0 ? lo - t0 : 0;
        hi = hi > t0 + nt ? nt : hi > t0 ? hi - t0 : 0;
        if (lo >= hi)
            continue;
        for (size_t head = kv_head * c->group; head < (kv_head + 1) * c->group; ++head) {
            const size_t row = row_index(s, b, pos, head);
            const size_t at = ((b * s->num_heads + head) * s->q_seq + pos) * D;
            ch.q[ch.n] = c->qh + at;
            ch.d_out[ch.n] = c->oh + at;
            ch.dq[ch.n] = dq_own ? dq_own + row * D : dq_copy ? dq_copy + at : NULL;
            ch.m[ch.n] = c->lse[2 * row];
            ch.l[ch.n] = c->lse[2 * row + 1];
            ch.dsum[ch.n] = want_dk ? c->dsum[row] : 0.0f;
            ch.lo[ch.n] = lo;
            ch.hi[ch.n] = hi;
            ch.pos[ch.n] = pos;
            ch.head[ch.n] = (uint32_t)head;
            if (++ch.n == CHUNK)
                key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL,
                              krows);
        }
    }
    if (ch.n)
        key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL, krows);
    /* s->accumulate: add into the outputs (beta = 1); kcopy is free */
    if (want_dv) {
        tile_to_rows(dvt, D, kcopy);
        for (uint32_t j = 0; j < nt; ++j)
            out_row(c, c->dv, first + j * kv_row, kcopy + j * D, D, s->accumulate);
    }
    if (want_dk) {
        tile_to_rows(dkt, D, kcopy);
        for (uint32_t j = 0; j < nt; ++j)
            out_row(c, c->dk, first + j * kv_row, kcopy + j * D, D, s->accumulate);
    }
}

/* Query-side jobs take QUERY_BLOCK query rows of one (batch, head), kept
 * transposed so that the rows lie along a vector, and walk the keys
 * KEY_BLOCK at a time: a key's scores against every row of the block are
 * one vector, and per-row softmax state (max, sum, Dsum) is a vector too. */

typedef struct query_block {
    size_t b, head, pos0, rows;      /* rows of [pos0, pos0 + rows) */
    uint32_t lo, hi;                 /* keys any of them sees */
    uint32_t row_lo[QUERY_BLOCK];    /* keys [row_lo, row_hi) row r sees; */
    uint32_t row_hi[QUERY_BLOCK];    /* empty past the last row */
    const float *kb, *vb;            /* K and V of the KV head at key 0 */
    const tile_row *vt;              /* the forward's V of the KV head (vt's layout) */
    size_t kv_row;
    size_t row[QUERY_BLOCK];         /* row_index of each row */
    const float *ptrs[QUERY_BLOCK];  /* scratch: row pointers to transpose */
} query_block;

INLINE void query_block_of(const native_call *c, size_t job, query_block *qb)
{
    const clattn_shape *s = c->s;
    const size_t blocks = (s->q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK;
    const size_t D = s->head_dim;
    /* Blocks of one head are consecutive, as run_blocks groups them. */
    qb->pos0 = job % blocks * QUERY_BLOCK;
    qb->head = job / blocks % s->num_heads;
    qb->b = job / blocks / s->num_heads;
    qb->rows = s->q_seq - qb->pos0 < QUERY_BLOCK ? s->q_seq - qb->pos0 : QUERY_BLOCK;
    const size_t kv_head = qb->head / c->group;
    const size_t base = (qb->b * s->num_kv_heads + kv_head) * s->kv_seq * D;
    /* K's rows in the head-major copy, or (the float32 forward, no copy:
     * kh NULL) in K itself, num_kv_heads * D floats apart */
    qb->kv_row = c->kh ? D : s->num_kv_heads * D;
    qb->kb = c->kh ? c->kh + base
                   : (const float *)c->k + (qb->b * s->kv_seq * s->num_kv_heads + kv_head) * D;
    qb->vb = c->vh ? c->vh + base : NULL;
    /* [tile][D][KEY_BLOCK]: a KV head's tiles are whole tiles of keys */
    qb->vt = c->vt ? (const tile_row *)(c->vt + (qb->b * s->num_kv_heads + kv_head) *
                                                    native_tiled_rows(s->kv_seq) * D)
                   : NULL;
    qb->lo = UINT32_MAX;
    qb->hi = 0;
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        qb->row_lo[r] = qb->row_hi[r] = 0;
        qb->row[r] = 0;
        if (r >= qb->rows)
            continue;
        clattn_key_range(s, (uint32_t)(qb->pos0 + r), &qb->row_lo[r], &qb->row_hi[r]);
        qb->lo = qb->row_lo[r] < qb->lo ? qb->row_lo[r] : qb->lo;
        qb->hi = qb->row_hi[r] > qb->hi ? qb->row_hi[r] : qb->hi;
        qb->row[r] = row_index(s, qb->b, qb->pos0 + r, qb->head);
    }
    if (qb->lo > qb->hi)
        qb->lo = qb->hi;
}

/* The block's rows of dropout's counters (native_drop_rows_of). */
INLINE void query_block_drop_rows(const native_call *c, const query_block *qb,
                                  native_drop_rows *d)
{
    uint32_t pos[QUERY_BLOCK], heads[QUERY_BLOCK];
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        pos[r] = (uint32_t)(qb->pos0 + r);
        heads[r] = (uint32_t)qb->head;
    }
    native_drop_rows_of(c, qb->b, pos, heads, qb->rows, d);
}

/* t[d][r] = x[row r][d] for the block's rows (of tensor x, widened where
 * 16-bit), zeros past them. */
INLINE void query_block_transpose(const native_call *c, query_block *qb, const void *x,
                                  tile_row *t)
{
    const size_t D = c->s->head_dim;
    _Alignas(64) float wide[QUERY_BLOCK * CLATTN_MAX_HEAD_DIM];
    for (size_t r = 0; r < QUERY_BLOCK; ++r)
        qb->ptrs[r] = r < qb->rows ? in_row(c, x, qb->row[r] * D, D, wide + r * D) : zero_row;
    transpose_in(qb->ptrs, D, t);
}

/* The rows of keys [t0, t0 + n) of one KV head, zero rows past n. */
INLINE void key_rows(const float *base, size_t kv_row, uint32_t t0, uint32_t n,
                     const float *rows[KEY_BLOCK])
{
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        rows[j] = j < n ? base + (t0 + j) * kv_row : zero_row;
}

/* The forward's V tiles of the block's keys, ready: each not yet packed is
 * claimed (0 -> 1) and packed by this job, then marked ready (2); then the
 * job waits for those other jobs claimed. No job waits while it holds a
 * claim, so none waits for ever. */
INLINE void ready_tiles(const native_call *c, const query_block *qb)
{
    if (qb->lo >= qb->hi)
        return;
    const size_t tiles = native_tiled_rows(c->s->kv_seq) / KEY_BLOCK;
    const size_t kv_head = qb->head / c->group;
    atomic_int *state = c->vt_state + (qb->b * c->s->num_kv_heads + kv_head) * tiles;
    const size_t first = qb->lo / KEY_BLOCK, end = (qb->hi + KEY_BLOCK - 1) / KEY_BLOCK;
    for (size_t t = first; t < end; ++t)
        if (claim(state + t)) {
            clattn_native_pack_v_tile(c, qb->b, kv_head, t);
            atomic_store_explicit(state + t, 2, memory_order_release);
        }
    for (size_t t = first; t < end; ++t)
        wait_ready(state + t);
}

/* sc[j][r] for the keys t0 + j of a tile against the block's rows. */
INLINE void tile_scores(const float *const *krows, const tile_row *qt,
                        size_t D, tile_row *sc)
{
    for (uint32_t j = 0; j < KEY_BLOCK; j += DOT_ROWS)
        dots(krows + j, qt, D, sc + j);
}

/* O and the LSE pairs of a block of query rows, by online softmax. */
static void forward_block(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], ot[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row sc[KEY_BLOCK];
    float m[QUERY_BLOCK], l[QUERY_BLOCK], rescale[QUERY_BLOCK];
    if (c->vt_state)
        ready_tiles(c, &qb);
    query_block_transpose(c, &qb, c->q, qt);
    memset(ot, 0, D * sizeof ot[0]);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        m[r] = EMPTY_ROW;
        l[r] = 0.0f;
    }
    /* Modified scores come scaled: their scale is 1. */
    const int shaped = (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_ALIBI)) != 0;
    const float scale = shaped ? 1.0f : c->scale, unit = scale * LOG2E;
    native_drop_rows drop; /* the block's rows of dropout's counters */
    if (c->mods & CLATTN_MOD_DROPOUT)
        query_block_drop_rows(c, &qb, &drop);
    /* Keys that every row of the block sees: tiles of them skip the mask. */
    uint32_t all_lo = 0, all_hi = UINT32_MAX;
    for (size_t r = 0; r < qb.rows; ++r) {
        all_lo = qb.row_lo[r] > all_lo ? qb.row_lo[r] : all_lo;
        all_hi = qb.row_hi[r] < all_hi ? qb.row_hi[r] : all_hi;
    }
    /* Tiles are V's (vt): from the one that holds key lo, its keys below
     * lo masked. */
    for (uint32_t t0 = qb.lo / KEY_BLOCK * KEY_BLOCK; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const float *krows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        tile_scores(krows, qt, D, sc);
        if (shaped)
            modify_rows(c, sc, NULL, qb.pos0, t0, qb.head);
        const int whole = n == KEY_BLOCK && all_lo <= t0 && t0 + KEY_BLOCK <= all_hi;
        EACH_PART(h) {
            /* The tile's row maxima (scaled: the scale is positive) */
            hvec block_max = HSPLAT(EMPTY_ROW);
            if (whole) {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    block_max = HMAX(hload(sc[j] + h), block_max);
                block_max *= scale;
            } else {
                /* masked scores to EMPTY_ROW, the others scaled */
                const huvec row_lo = huload(qb.row_lo + h), row_hi = huload(qb.row_hi + h);
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    const uint32_t t = t0 + j;
                    const hvec x = HSELECT((t >= row_lo) & (t < row_hi),
                                           hload(sc[j] + h) * scale, HSPLAT(EMPTY_ROW));
                    hstore(sc[j] + h, x);
                    block_max = HMAX(x, block_max);
                }
            }
            const hvec m_old = hload(m + h), m_new = HMAX(block_max, m_old);
            const hvec rs = exp2v((m_old - m_new) * LOG2E);
            hstore(rescale + h, rs);
            hstore(m + h, m_new);
            /* weights exp(s * scale - m) in base 2: whole tiles' scores
             * are raw, the others' scaled already */
            const hvec m2 = m_new * LOG2E;
            hvec sum = HSPLAT(0.0f);
            if (whole) {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    const hvec w = exp2v(hload(sc[j] + h) * unit - m2);
                    hstore(sc[j] + h, w);
                    sum += w;
                }
            } else {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    /* Masked scores are exactly EMPTY_ROW; their weight is
                     * 0 even while the row's max is EMPTY_ROW too. */
                    const hvec x = hload(sc[j] + h);
                    const hvec w = HSELECT(x == EMPTY_ROW, HSPLAT(0.0f), exp2v(x * LOG2E - m2));
                    hstore(sc[j] + h, w);
                    sum += w;
                }
            }
            hstore(l + h, hload(l + h) * rs + sum);
        }
        if (c->mods & CLATTN_MOD_DROPOUT) { /* l is the undropped sum */
            uint32_t kept[QUERY_BLOCK] = {0};
            native_keep_bits(c, &drop, t0, kept);
            drop_rows(sc, kept, 1.0f);
        }
        accumulate_t(ot, D, qb.vt + (size_t)(t0 / KEY_BLOCK) * D, sc, n, rescale);
    }
    /* O = ot / l, a vector of rows at a time (0 where the weights sum to
     * 0; the rows below make that NaN where the row sees a key) */
    EACH_PART(h) {
        const hvec sum = hload(l + h);
        const hivec live = sum != 0.0f; /* NaN too: it must show */
        const hvec by = HSELECT(live, sum, HSPLAT(1.0f));
        const float gain = c->drop.gain; /* 1 without dropout */
        for (size_t d = 0; d < D; ++d)
            hstore(ot[d] + h, HSELECT(live, hload(ot[d] + h) / by * gain, HSPLAT(0.0f)));
    }
    float *rows = qt[0]; /* free */
    tile_to_rows(ot, D, rows);
    for (size_t r = 0; r < qb.rows; ++r) {
        /* A row whose weights sum to 0 is empty where it sees no key; where
         * it sees keys whose scores are all -inf (or below EMPTY_ROW, the
         * masks' own value) it has no softmax: NaN, as PyTorch's math gives. */
        const float zero = qb.row_lo[r] < qb.row_hi[r] ? NAN : EMPTY_ROW;
        if (l[r] == 0.0f && qb.row_lo[r] < qb.row_hi[r])
            for (size_t d = 0; d < D; ++d)
                rows[r * D + d] = NAN;
        out_row(c, c->o_out, qb.row[r] * D, rows + r * D, D, 0);
        float *pair = c->lse_out + 2 * qb.row[r];
        pair[0] = l[r] != 0.0f ? m[r] : zero;
        pair[1] = l[r] != 0.0f ? logf(l[r]) : zero;
    }
}

/* dQ of a block of query rows. */
static void grad_q_block(const native_call *c, size_t job)
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
        dsum[r] = live ? row_dsum(c, qb.row[r]) : 0.0f;
    }
    const float scale = c->scale;
    const int shaped = (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_ALIBI)) != 0;
    const float unit = shaped ? LOG2E : scale * LOG2E; /* modified scores come scaled */
    native_drop_rows drop; /* the block's rows of dropout's counters */
    if (c->mods & CLATTN_MOD_DROPOUT)
        query_block_drop_rows(c, &qb, &drop);
    _Alignas(64) tile_row dz[KEY_BLOCK];
    for (size_t r = 0; r < QUERY_BLOCK; ++r) { /* p = exp(min(s * scale - m, 0) - l) in base 2 */
        m[r] *= LOG2E;
        l[r] *= LOG2E;
    }
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        key_rows(qb.vb, qb.kv_row, t0, n, vrows);
        tile_scores(krows, qt, D, sc);
        tile_scores(vrows, dot_t, D, dp);
        if (shaped)
            modify_rows(c, sc, dz, qb.pos0, t0, qb.head);
        if (c->mods & CLATTN_MOD_DROPOUT) {
            uint32_t kept[QUERY_BLOCK] = {0}; /* rows past qb.rows: dropped */
            native_keep_bits(c, &drop, t0, kept);
            drop_rows(dp, kept, c->drop.gain);
        }
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            const uint32_t t = t0 + j;
            EACH_PART(h) {
                const hvec x = hload(sc[j] + h) * unit - hload(m + h);
                const huvec row_lo = huload(qb.row_lo + h), row_hi = huload(qb.row_hi + h);
                const hivec live = (t >= row_lo) & (t < row_hi);
                const hvec p = HSELECT(live, exp2v(HMIN0(x) - hload(l + h)), HSPLAT(0.0f));
                hstore(sc[j] + h, HSELECT(live, scale * p * (hload(dp[j] + h) - hload(dsum + h)),
                                          HSPLAT(0.0f)));
            }
        }
        if (c->mods & CLATTN_MOD_SOFTCAP)
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                EACH_PART(h) hstore(sc[j] + h, hload(sc[j] + h) * hload(dz[j] + h));
        accumulate(dqt, D, krows, sc, n);
    }
    float *rows = qt[0]; /* free */
    tile_to_rows(dqt, D, rows);
    for (size_t r = 0; r < qb.rows; ++r)
        out_row(c, c->dq, qb.row[r] * D, rows + r * D, D, c->s->accumulate);
}

static void dsum_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t rows = (size_t)s->batch * s->q_seq * s->num_heads;
    const size_t end = (job + 1) * DSUM_ROWS < rows ? (job + 1) * DSUM_ROWS : rows;
    for (size_t row = job * DSUM_ROWS; row < end; ++row)
        ((float *)c->dsum)[row] = row_dsum(c, row);
}

/* A job is the blocks of one head that fall to one part, in order.
 * block(c, i) takes block i of the per-block numbering, blocks per head
 * fastest. */
INLINE void run_part(const native_call *c, size_t job, size_t blocks, size_t parts,
                     void (*block)(const native_call *, size_t))
{
    const size_t head = job / parts, part = job % parts;
    for (size_t i = part; i < blocks; ++i)
        if (part_of(i, parts) == part)
            block(c, head * blocks + i);
}

static void forward_job(const native_call *c, size_t job)
{
    run_part(c, job, (c->s->q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK, c->query_parts,
             forward_block);
}

static void grad_q_job(const native_call *c, size_t job)
{
    run_part(c, job, (c->s->q_seq + (size_t)QUERY_BLOCK - 1) / QUERY_BLOCK, c->query_parts,
             grad_q_block);
}

/* With dQ summed in the key side, a key-side job is the only one to add
 * into its part's dQ rows of its KV head (every head of the group:
 * consecutive in a head-major copy, and in a row of dQ): it zeroes them
 * first, in its own cache. */
static void key_block_job(const native_call *c, size_t job)
{
    if (c->dq_fused) {
        const clattn_shape *s = c->s;
        const size_t D = s->head_dim, kvh = job / c->key_parts;
        const size_t rows = c->group * s->q_seq * D;
        float *copy = part_copy(c, job % c->key_parts);
        if (copy)
            memset(copy + kvh * rows, 0, rows * sizeof(float));
        else
            for (size_t pos = 0; pos < s->q_seq; ++pos)
                memset((float *)c->dq +
                           row_index(s, kvh / s->num_kv_heads, pos,
                                     kvh % s->num_kv_heads * c->group) * D,
                       0, c->group * D * sizeof(float));
    }
    run_part(c, job, c->blocks_per_head, c->key_parts, key_block);
}

static void widen(clattn_dtype dtype, const void *src, float *dst, size_t n)
{
    widen_n(dtype, src, dst, n);
}

static void narrow(clattn_dtype dtype, const float *src, void *dst, size_t n)
{
    narrow_n(dtype, src, dst, n);
}

static void transpose(const float *const *rows, size_t D, float *t)
{
    transpose_in(rows, D, (tile_row *)t);
}

const native_kernels NATIVE_TABLE(NATIVE_LEVEL) = {
    NATIVE_NAME, forward_job, grad_q_job, key_block_job, dsum_job, widen, narrow, transpose,
};
