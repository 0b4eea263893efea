/*
 * The `tiled` variant: local-memory tiles and registers only, on any
 * OpenCL device. Two layouts, chosen per head_dim by the host
 * (src/opencl/variants/tiled.c) through PER_ITEM:
 *
 *  - rows.cl (PER_ITEM 0): a row per work-item. A row's vectors sit in its
 *    work-items' registers (split by columns past what fits); the other
 *    side streams through local memory. No barrier per product; the
 *    layout for large head_dims.
 *  - micro.cl (PER_ITEM 1 to 8): register micro-tiles, as a blocked matrix
 *    product (CLBlast's xgemm) does. The group's rows sit in local memory
 *    beside the streamed tile; each work-item scores PER_ITEM rows against
 *    a part of the tile and accumulates a part of the columns. More
 *    products per local load; the group's rows and the tile share local
 *    memory, so it serves small head_dims.
 *
 * This file holds what both share: the shape's defaults and sizes, the
 * tensors' indexing, the streamed tiles' way through registers, the
 * per-query values the key side reads with each tile, the pairing of row
 * blocks under a causal mask. cl/tiled/kernels.cl holds the
 * entry points. ROWS, TILE, SPLIT, DSPLIT and PER_ITEM are compile-time
 * defines; with the defaults the files compile after cl/common.cl.
 *
 * Launch: global (B * LANES, heads, batch) with blocks = ceil(rows / ROWS)
 * and B = causal ? ceil(blocks / 2) : blocks; local (LANES, 1, 1); `tiles`
 * is a __local buffer of cl/tiled/layout.h's floats for the kernel, taken
 * as float4s so that it is 16-byte aligned for the vector loads.
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef ROWS
#define ROWS 32
#endif
#ifndef TILE
#define TILE 32
#endif
#ifndef SPLIT
#define SPLIT 8
#endif
#ifndef DSPLIT
#define DSPLIT 1
#endif
#ifndef PER_ITEM
#define PER_ITEM 4
#endif
#define D HEAD_DIM

/* What both layouts size by: LANES work-items a group, local tile rows of
 * DP columns (zeros past D) DS floats apart. rows.cl's work-items hold DC
 * columns of a row each; micro.cl's PER_ITEM (RM) rows each, and its rows
 * are padded so that a load step's rows lie in different banks. */
#if PER_ITEM
#define RM PER_ITEM
#define DP ((D + 3) / 4 * 4)
#define DS TILED_DS(D)
#define LANES (ROWS / RM * SPLIT)
#else
#define DC ((D + DSPLIT - 1) / DSPLIT)
#define DP TILED_ROWS_DP(D, DSPLIT)
#define DS DP
#define LANES (ROWS * DSPLIT * SPLIT)
#endif

inline ulong at(uint b, uint rows, uint row, uint heads, uint head, uint d)
{
    return (((ulong)b * rows + row) * heads + head) * D + d;
}

inline ulong row_of(uint b, uint q_seq, uint pos, uint num_heads, uint head)
{
    return ((ulong)b * q_seq + pos) * num_heads + head;
}

/* A streamed tile (TILE rows of the other side) passes through
 * registers: each work-item fetches its share of the next tile (PF
 * floats) before the current tile's products, so that the global loads'
 * latency hides behind them, and puts it in local memory after the next
 * barrier. Rows from r0 of a [batch][rows][heads][D] tensor, zeros past
 * `end` and past D.
 *
 * Where the tile's rows are whole float4s (DP a multiple of 4), a
 * work-item's share is float4s: chunk i = id + u * LANES (u < PF4) holds
 * columns 4 (i % (DP / 4)) .. + 3 of row i / (DP / 4), read as one vector
 * load where D is a multiple of 4 and the tensor's offset too (buffers are
 * aligned to far more than 16 bytes), as four loads otherwise, and stored
 * into local memory as one float4. */
#define VEC_TILES (DP % 4 == 0)
#define PF4 ((TILE * DP / 4 + LANES - 1) / LANES)
#if VEC_TILES
#define PF (4 * PF4)
#else
#define PF ((TILE * DP + LANES - 1) / LANES)
#endif

/* LOAD of elements i .. i + 3 at once, i a multiple of 4 (16-bit: 8 bytes) */
#if DTYPE == 0
#define LOAD4(p, i) (*(__global const float4 *)((p) + (i)))
#elif DTYPE == 1
#define LOAD4(p, i) vload_half4(0, (p) + (i))
#else
#define LOAD4(p, i) as_float4(convert_uint4(*(__global const ushort4 *)((p) + (i))) << 16)
#endif

inline void fetch_tile(float *r, __global const elem *src, ulong off, uint b, uint rows, uint r0,
                       uint end, uint heads, uint head)
{
#if VEC_TILES
    const ulong first = off + at(b, rows, r0, heads, head, 0), stride = (ulong)heads * D;
    const bool vec = D % 4 == 0 && (off & 3u) == 0;
    for (uint u = 0; u < PF4; ++u) {
        const uint i = get_local_id(0) + u * LANES, row = i / (DP / 4), d = 4 * (i % (DP / 4));
        const ulong at_d = first + row * stride + d;
        float4 x = 0.0f;
        if (i < TILE * DP / 4 && r0 + row < end && d < D) {
            if (vec) /* d + 3 < D too */
                x = LOAD4(src, at_d);
            else
                x = (float4)(LOAD(src, at_d), d + 1 < D ? LOAD(src, at_d + 1) : 0.0f,
                             d + 2 < D ? LOAD(src, at_d + 2) : 0.0f,
                             d + 3 < D ? LOAD(src, at_d + 3) : 0.0f);
        }
        r[4 * u] = x.x;
        r[4 * u + 1] = x.y;
        r[4 * u + 2] = x.z;
        r[4 * u + 3] = x.w;
    }
#else
    for (uint u = 0; u < PF; ++u) {
        const uint i = get_local_id(0) + u * LANES, row = i / DP, d = i % DP;
        r[u] = i < TILE * DP && r0 + row < end && d < D
                   ? LOAD(src, off + at(b, rows, r0 + row, heads, head, d))
                   : 0.0f;
    }
#endif
}

inline void put_tile(__local float *t, const float *r)
{
#if VEC_TILES
    for (uint u = 0; u < PF4; ++u) {
        const uint i = get_local_id(0) + u * LANES;
        if (i < TILE * DP / 4)
            *(__local float4 *)(t + i / (DP / 4) * DS + 4 * (i % (DP / 4))) =
                (float4)(r[4 * u], r[4 * u + 1], r[4 * u + 2], r[4 * u + 3]);
    }
#else
    for (uint u = 0; u < PF; ++u) {
        const uint i = get_local_id(0) + u * LANES;
        if (i < TILE * DP)
            t[i / DP * DS + i % DP] = r[u];
    }
#endif
}

/* fetch_tile of two tensors of one shape (K and V, or Q and dO) into a
 * and c, where r0 < end (a next tile exists). */
inline void fetch_pair(float *a, float *c, __global const elem *x, ulong x_off,
                       __global const elem *y, ulong y_off, uint b, uint rows, uint r0, uint end,
                       uint heads, uint head)
{
    if (r0 < end) {
        fetch_tile(a, x, x_off, b, rows, r0, end, heads, head);
        fetch_tile(c, y, y_off, b, rows, r0, end, heads, head);
    }
}

/* The key side's next tile of Q and dO after the one at (head, p0): the
 * next TILE queries of [lo, hi), or the first of the next head of the
 * group (heads below heads_end). */
inline void fetch_next_queries(float *nq, float *no, __global const elem *q, ulong q_off,
                               __global const elem *d_out, ulong d_out_off, uint b, uint q_seq,
                               uint num_heads, uint head, uint heads_end, uint p0, uint lo,
                               uint hi)
{
    const bool same = p0 + TILE < hi;
    fetch_pair(nq, no, q, q_off, d_out, d_out_off, b, q_seq, same ? p0 + TILE : lo,
               same || head + 1u < heads_end ? hi : 0u, num_heads, same ? head : head + 1u);
}

/* The key side's prefetches of query tiles (Q and dO) into nq and no, for
 * keys [r0, last] of KV head kv_head, whose query heads end at heads_end:
 * the first step, then the one after (head, p0). Under the caller's mask
 * they are of the (head, query tile) steps its block map shows
 * (NEXT_SHOWN_QUERIES), in this head or a later one, as the loops that
 * step with SHOWN_ROWS take them. */
#if HIDING
#define FETCH_FIRST_QUERIES(nq, no, q, q_off, d_out, d_out_off, lo, hi, r0, last)             \
    do {                                                                                     \
        uint first_head = kv_head * group, first = (lo);                                     \
        NEXT_SHOWN_QUERIES(&first_head, &first, heads_end, (lo), (hi), (r0), (last));        \
        fetch_pair((nq), (no), (q), (q_off), (d_out), (d_out_off), b, q_seq, first,          \
                   first_head < heads_end ? (hi) : 0u, num_heads, first_head);               \
    } while (0)
#define FETCH_NEXT_QUERIES(nq, no, q, q_off, d_out, d_out_off, head, p0, lo, hi, r0, last)   \
    do {                                                                                     \
        uint next_head = (head), next = (p0) + TILE;                                         \
        NEXT_SHOWN_QUERIES(&next_head, &next, heads_end, (lo), (hi), (r0), (last));          \
        fetch_pair((nq), (no), (q), (q_off), (d_out), (d_out_off), b, q_seq, next,           \
                   next_head < heads_end ? (hi) : 0u, num_heads, next_head);                 \
    } while (0)
#else
#define FETCH_FIRST_QUERIES(nq, no, q, q_off, d_out, d_out_off, lo, hi, r0, last)             \
    fetch_pair((nq), (no), (q), (q_off), (d_out), (d_out_off), b, q_seq, (lo), (hi), num_heads, \
               kv_head * group)
#define FETCH_NEXT_QUERIES(nq, no, q, q_off, d_out, d_out_off, head, p0, lo, hi, r0, last)   \
    fetch_next_queries((nq), (no), (q), (q_off), (d_out), (d_out_off), b, q_seq, num_heads,  \
                       (head), heads_end, (p0), (lo), (hi))
#endif

/* The per-query values the key side reads with each tile: m, l and (for
 * grad-K, dsum not NULL) Dsum of TILE query rows from p0, zeros past `end`.
 * Every work-item of the group calls it. */
inline void load_stats(__local float *mt, __local float *lt, __local float *dt,
                       __global const float *lse, ulong lse_off, __global const float *dsum,
                       ulong dsum_off, uint b, uint q_seq, uint p0, uint end, uint num_heads,
                       uint head)
{
    for (uint i = get_local_id(0); i < TILE; i += get_local_size(0)) {
        const bool in = p0 + i < end;
        const ulong row = row_of(b, q_seq, in ? p0 + i : 0u, num_heads, head);
        mt[i] = in ? lse[lse_off + 2 * row] : 0.0f;
        lt[i] = in ? lse[lse_off + 2 * row + 1] : 0.0f;
        if (dsum)
            dt[i] = in ? dsum[dsum_off + row] : 0.0f;
    }
}

/* dS of the pair (pos, t) from its raw score s and dP: P (from the query's
 * m and l) times the dropped dP less the query's Dsum, through the
 * modifiers' derivative; exactly 0 for a pair the masks hide, so that a NaN
 * in a row it pairs cannot reach it. */
inline float grad_score(float s, float dp, float m, float l, float dsum, bool seen, uint pos,
                        uint t, uint head, uint b, SHAPE_ARGS)
{
    float dz = 1.0f;
#if SHAPED
    s = MODIFY(s, pos, t, head, b, &dz);
#endif
#if MODS & MOD_DROPOUT
    dp *= DROP(pos, t, head, b);
#endif
    return seen ? exp(min0(s - m) - l) * (dp - dsum) * dz : 0.0f;
}

/* Causal work is uneven (the last query sees every key, the first one key),
 * so there each work-group takes a pair of row blocks, g and blocks - 1 - g,
 * and every group has about the same work. A loop, not two inlined copies,
 * so that the pairing costs no registers. */
#define PAIRED(rows, call)                                                        \
    __local float *tiles = (__local float *)tiles4;                               \
    const uint blocks = (rows + ROWS - 1u) / ROWS, g = get_group_id(0);           \
    const uint passes = causal && blocks - 1u - g != g ? 2u : 1u;                 \
    for (uint pass = 0; pass < passes; ++pass) {                                  \
        const uint r0 = (pass ? blocks - 1u - g : g) * ROWS;                      \
        call;                                                                     \
    }
