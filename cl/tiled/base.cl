/*
 * The `tiled` variant: local-memory tiles and registers only, on any
 * OpenCL device. Two layouts, chosen per head_dim by the host
 * (src/opencl/tuning.c) through PER_ITEM:
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
 * This file holds what both share: the shape's defaults, the tensors'
 * indexing, the per-query values the key side reads with each tile, the
 * pairing of row blocks under a causal mask. cl/tiled/kernels.cl holds the
 * entry points. ROWS, TILE, SPLIT, DSPLIT and PER_ITEM are compile-time
 * defines; with the defaults the files compile after cl/common.cl.
 *
 * Launch: global (B * LANES, heads, batch) with blocks = ceil(rows / ROWS)
 * and B = causal ? ceil(blocks / 2) : blocks; local (LANES, 1, 1); `tiles`
 * is a __local buffer of clattn_ocl_tiled_local_floats() floats, taken as
 * float4s so that it is 16-byte aligned for the vector loads.
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

inline ulong at(uint b, uint rows, uint row, uint heads, uint head, uint d)
{
    return (((ulong)b * rows + row) * heads + head) * D + d;
}

inline ulong row_of(uint b, uint q_seq, uint pos, uint num_heads, uint head)
{
    return ((ulong)b * q_seq + pos) * num_heads + head;
}

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
    s = MODIFY(s, pos, t, head, &dz);
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
