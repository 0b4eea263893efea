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

/* out[i][.] = factor * sum_d rows[i][d] * t[d][.] for DOT_ROWS rows. */
INLINE void dots(const float *const *rows, const tile_row *t, size_t D, tile_row *out,
                 float factor)
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
            hstore(out[i] + p * HW, a[i][p] * factor);
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
 * cl/tanh.cl's softcap_tanh(): where |x / cap| < 1/4 its odd series to
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

/* A query-side tile sc[j][r] (dots of key t0 + j and query row pos0 + r
 * of query head `head` of batch element b, times scale to scale them) to
 * modified scaled scores, their derivatives in dz where not NULL. */
INLINE void modify_rows(const native_call *c, tile_row *sc, tile_row *dz, size_t b, size_t pos0,
                        uint32_t t0, size_t head, float scale)
{
    const float slope = c->slopes ? c->slopes[head] : 0.0f;
    const int64_t base = (int64_t)pos0 + c->delta - (int64_t)t0;
    const int bias_alone = native_bias_alone(c->mods), span = native_span_alone(c);
    if (!small_distance(base) || ((c->mods & CLATTN_MOD_USER) && !bias_alone && !span)) {
        for (uint32_t j = 0; j < KEY_BLOCK; ++j)
            for (size_t r = 0; r < QUERY_BLOCK; ++r) {
                sc[j][r] = native_modify(c, sc[j][r] * scale, b, (uint32_t)(pos0 + r), t0 + j,
                                         head, dz ? &dz[j][r] : NULL);
            }
        return;
    }
    /* the call's rows and keys (a tail past them is discarded) */
    const clattn_shape *s = c->s;
    const uint32_t keys = s->kv_seq - t0 < KEY_BLOCK ? s->kv_seq - t0 : KEY_BLOCK;
    const uint32_t rows = s->q_seq - pos0 < QUERY_BLOCK ? (uint32_t)(s->q_seq - pos0) : QUERY_BLOCK;
    /* scaled scores that the built-ins leave as they are: nothing to do but
     * dz's 1s, which the span over a whole tile writes itself */
    const int whole = rows == QUERY_BLOCK && keys == KEY_BLOCK;
    if ((c->mods & NATIVE_BUILT_IN) || scale != 1.0f || (dz && !(span && whole)))
        EACH_PART(h) {
            const hvec rows = hload(lane_float + h) + (float)base;
            for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                const hvec d = rows - (float)j;
                hvec g;
                hstore(sc[j] + h,
                       modify_v(c, hload(sc[j] + h) * scale, HSELECT(d < 0.0f, -d, d), slope, &g));
                if (dz)
                    hstore(dz[j] + h, g);
            }
        }
    if (!bias_alone && !span)
        return;
    if (bias_alone) { /* its rows, down sc's columns */
        _Alignas(64) float buf[KEY_BLOCK];
        if (whole) {
            /* a whole tile: the rows into bt's columns by the tiles'
             * transpose, then added as sc lies (added down sc's columns,
             * each element was gathered) */
            _Alignas(64) tile_row bt[KEY_BLOCK];
            _Alignas(64) float wide[QUERY_BLOCK][KEY_BLOCK]; /* a 16-bit bias's rows */
            const float *at[QUERY_BLOCK];
            for (uint32_t r = 0; r < QUERY_BLOCK; ++r)
                at[r] = native_bias_row(c, b, head, pos0 + r, t0, KEY_BLOCK, wide[r]);
            transpose_in(at, KEY_BLOCK, bt);
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                EACH_PART(h) { hstore(sc[j] + h, hload(sc[j] + h) + hload(bt[j] + h)); }
        } else {
            for (uint32_t r = 0; r < rows; ++r) {
                const float *at = native_bias_row(c, b, head, pos0 + r, t0, keys, buf);
                for (uint32_t j = 0; j < keys; ++j)
                    sc[j][r] += at[j];
            }
        }
    }
    if (span) {
        _Alignas(64) float g[KEY_BLOCK * QUERY_BLOCK];
        if (rows == QUERY_BLOCK) /* sc's columns one after another: one call */
            native_span(c, sc[0], dz ? dz[0] : NULL, g, keys * QUERY_BLOCK, QUERY_BLOCK, b,
                        (uint32_t)pos0, t0, head);
        else
            for (uint32_t j = 0; j < keys; ++j)
                native_span(c, sc[j], dz ? dz[j] : NULL, g, rows, rows, b, (uint32_t)pos0, t0 + j,
                            head);
    }
}

/* A query-side tile's raw dots to scaled scores, derivatives 1 in dz
 * where not NULL: modify_rows() where no modifier changes them. */
INLINE void scale_rows(tile_row *sc, tile_row *dz, float scale)
{
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        EACH_PART(h) {
            hstore(sc[j] + h, hload(sc[j] + h) * scale);
            if (dz)
                hstore(dz[j] + h, HSPLAT(1.0f));
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

/* The jobs of each side. */
#include "key_side.h"
#include "query_side.h"

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
    run_part(c, job, native_query_blocks(c->s->q_seq), c->query_parts, forward_block);
}

static void grad_q_job(const native_call *c, size_t job)
{
    run_part(c, job, native_query_blocks(c->s->q_seq), c->query_parts, grad_q_block);
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
    params_block, bias_block,
};
