/*
 * The `tiled` variants: a whole dot product per work-item, no barrier per
 * product. A work-group holds ROWS rows of one head and batch element (query
 * rows for the forward and grad-Q, key rows for grad-V and grad-K), each
 * row's vectors in its work-items' registers; the other side streams through
 * local memory TILE rows at a time, loaded once for the whole work-group.
 * SPLIT work-items share a row, each taking every SPLIT-th row of each tile,
 * and combine their partial sums at the end: more work-items in flight when
 * rows are few. Lanes of one part are adjacent, so a warp reads one tile row
 * at a time (a broadcast). Tiles that no row of the group can see are
 * skipped through the loop bounds; only boundary tiles test the mask.
 *
 * HEAD_DIM, ROWS and TILE are compile-time defines, chosen per device by the
 * host (src/opencl.c); with the defaults the file compiles after
 * cl/common.cl.
 * Causal work is uneven (the last query sees every key, the first one key),
 * so there each work-group takes a pair of row blocks, g and blocks - 1 - g,
 * and every group has about the same work. A loop, not two inlined copies,
 * so that the pairing costs no registers.
 * Launch: global (B * LANES, heads, batch) with blocks = ceil(rows / ROWS)
 * and B = causal ? ceil(blocks / 2) : blocks; local (LANES, 1, 1); `tiles`
 * is a __local buffer of max(2 * TILE * D + 3 * TILE, (SPLIT - 1) * ROWS *
 * (D + 2)) floats.
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef ROWS
#define ROWS 64
#endif
#ifndef TILE
#define TILE 32
#endif
#ifndef SPLIT
#define SPLIT 1
#endif
#define D HEAD_DIM
#define LANES (ROWS * SPLIT)

inline ulong at(uint b, uint rows, uint row, uint heads, uint head, uint d)
{
    return (((ulong)b * rows + row) * heads + head) * D + d;
}

inline ulong row_of(uint b, uint q_seq, uint pos, uint num_heads, uint head)
{
    return ((ulong)b * q_seq + pos) * num_heads + head;
}

/* Loads rows [r0, r0 + TILE) of a [batch][rows][heads][D] tensor into
 * tile[TILE][D], zeros past `end`. Every work-item of the group calls it. */
inline void load_tile(__local float *tile, __global const float *src, ulong off, uint b,
                      uint rows, uint r0, uint end, uint heads, uint head)
{
    for (uint i = get_local_id(0); i < TILE * D; i += LANES) {
        const uint r = r0 + i / D;
        tile[i] = r < end ? src[off + at(b, rows, r, heads, head, i % D)] : 0.0f;
    }
}

/* The per-query values the key-side kernels read with each tile: m, l and
 * (for grad-K) Dsum of TILE query rows. */
inline void load_rows(__local float *mt, __local float *lt, __local float *dt,
                      __global const float *lse, ulong lse_off, __global const float *dsum,
                      ulong dsum_off, uint b, uint q_seq, uint p0, uint end, uint num_heads,
                      uint head)
{
    for (uint i = get_local_id(0); i < TILE; i += LANES) {
        const bool in = p0 + i < end;
        const ulong row = row_of(b, q_seq, in ? p0 + i : 0u, num_heads, head);
        mt[i] = in ? lse[lse_off + 2 * row] : 0.0f;
        lt[i] = in ? lse[lse_off + 2 * row + 1] : 0.0f;
        if (dsum)
            dt[i] = in ? dsum[dsum_off + row] : 0.0f;
    }
}

/* Adds the partial sums of a row's other parts into part 0's acc, through
 * local memory (the tiles' space). Every work-item of the group calls it. */
inline void sum_parts(__local float *comb, float *acc, uint part, uint r)
{
#if SPLIT > 1
    barrier(CLK_LOCAL_MEM_FENCE);
    if (part > 0)
        for (uint d = 0; d < D; ++d)
            comb[((part - 1u) * ROWS + r) * D + d] = acc[d];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (part == 0)
        for (uint p = 1; p < SPLIT; ++p)
            for (uint d = 0; d < D; ++d)
                acc[d] += comb[((p - 1u) * ROWS + r) * D + d];
#endif
}

inline void forward_block(__global const float *q, ulong q_off, __global const float *k,
                          ulong k_off, __global const float *v, ulong v_off, __global float *o,
                          ulong o_off, __global float *lse, ulong lse_off, SHAPE_ARGS,
                          __local float *tiles, uint r0)
{
    __local float *kt = tiles, *vt = tiles + TILE * D;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint r = get_local_id(0) % ROWS, part = get_local_id(0) / ROWS, pos = r0 + r;
    const bool live = pos < q_seq;
    const uint kv_head = head / (num_heads / num_kv_heads);
    float qr[D], acc[D];
    for (uint d = 0; d < D; ++d) {
        qr[d] = live ? q[q_off + at(b, q_seq, pos, num_heads, head, d)] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = EMPTY_ROW, l = 0.0f;
    uint lo, hi;
    keys_of_queries(r0, min(r0 + ROWS, q_seq) - 1u, kv_seq, causal, window, &lo, &hi);
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile(kt, k, k_off, b, kv_seq, t0, hi, num_kv_heads, kv_head);
        load_tile(vt, v, v_off, b, kv_seq, t0, hi, num_kv_heads, kv_head);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!live)
            continue;
        float s[TILE / SPLIT], tile_max = EMPTY_ROW;
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            const uint j = i * SPLIT + part;
            float dot = 0.0f;
            for (uint d = 0; d < D; ++d)
                dot = fma(qr[d], kt[j * D + d], dot);
            s[i] = t0 + j < hi && visible(pos, t0 + j, causal, window) ? dot : EMPTY_ROW;
            tile_max = fmax(tile_max, s[i]);
        }
        if (tile_max == EMPTY_ROW)
            continue;
        const float m_new = fmax(m, tile_max), rescale = exp(m - m_new);
        l *= rescale;
        for (uint d = 0; d < D; ++d)
            acc[d] *= rescale;
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            const uint j = i * SPLIT + part;
            const float e = exp(s[i] - m_new);
            l += e;
            for (uint d = 0; d < D; ++d)
                acc[d] = fma(e, vt[j * D + d], acc[d]);
        }
        m = m_new;
    }
#if SPLIT > 1
    /* Merge the parts' softmax states: rescale each to the largest m. */
    barrier(CLK_LOCAL_MEM_FENCE);
    __local float *comb = tiles;
    if (part > 0) {
        __local float *mine = comb + ((part - 1u) * ROWS + r) * (D + 2);
        for (uint d = 0; d < D; ++d)
            mine[d] = acc[d];
        mine[D] = m;
        mine[D + 1] = l;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (part > 0)
        return;
    float m_all = m;
    for (uint p = 1; p < SPLIT; ++p)
        m_all = fmax(m_all, comb[((p - 1u) * ROWS + r) * (D + 2) + D]);
    const float own = exp(m - m_all);
    l *= own;
    for (uint d = 0; d < D; ++d)
        acc[d] *= own;
    for (uint p = 1; p < SPLIT; ++p) {
        __local const float *other = comb + ((p - 1u) * ROWS + r) * (D + 2);
        const float f = exp(other[D] - m_all);
        l += other[D + 1] * f;
        for (uint d = 0; d < D; ++d)
            acc[d] = fma(other[d], f, acc[d]);
    }
    m = m_all;
#endif
    if (!live)
        return;
    for (uint d = 0; d < D; ++d)
        o[o_off + at(b, q_seq, pos, num_heads, head, d)] = l > 0.0f ? acc[d] / l : 0.0f;
    const ulong row = lse_off + 2 * row_of(b, q_seq, pos, num_heads, head);
    lse[row] = l > 0.0f ? m : EMPTY_ROW;
    lse[row + 1] = l > 0.0f ? log(l) : EMPTY_ROW;
}

/* dQ of a query row: sum over its keys of scale * dS * K[t]. */
inline void grad_q_block(__global const float *q, ulong q_off, __global const float *k,
                         ulong k_off, __global const float *v, ulong v_off,
                         __global const float *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global float *dq, ulong dq_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    __local float *kt = tiles, *vt = tiles + TILE * D;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint r = get_local_id(0) % ROWS, part = get_local_id(0) / ROWS, pos = r0 + r;
    const bool live = pos < q_seq;
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong row = row_of(b, q_seq, live ? pos : 0u, num_heads, head);
    float qr[D], dor[D], acc[D];
    for (uint d = 0; d < D; ++d) {
        qr[d] = live ? q[q_off + row * D + d] * scale : 0.0f;
        dor[d] = live ? d_out[d_out_off + row * D + d] : 0.0f;
        acc[d] = 0.0f;
    }
    const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
    const float ds_row = dsum[dsum_off + row];
    uint lo, hi;
    keys_of_queries(r0, min(r0 + ROWS, q_seq) - 1u, kv_seq, causal, window, &lo, &hi);
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);
        load_tile(kt, k, k_off, b, kv_seq, t0, hi, num_kv_heads, kv_head);
        load_tile(vt, v, v_off, b, kv_seq, t0, hi, num_kv_heads, kv_head);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!live)
            continue;
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            const uint j = i * SPLIT + part;
            if (t0 + j >= hi || !visible(pos, t0 + j, causal, window))
                continue;
            float s = 0.0f, dp = 0.0f;
            for (uint d = 0; d < D; ++d) {
                s = fma(qr[d], kt[j * D + d], s);
                dp = fma(dor[d], vt[j * D + d], dp);
            }
            const float ds = exp(fmin(s - m, 0.0f) - l) * (dp - ds_row);
            for (uint d = 0; d < D; ++d)
                acc[d] = fma(ds, kt[j * D + d], acc[d]);
        }
    }
    sum_parts(tiles, acc, part, r);
    if (live && part == 0)
        for (uint d = 0; d < D; ++d)
            dq[dq_off + row * D + d] = scale * acc[d];
}

/* dV of a key row, over the queries of its KV head's group that see it. */
inline void grad_v_block(__global const float *d_out, ulong d_out_off, __global const float *q,
                         ulong q_off, __global const float *k, ulong k_off,
                         __global const float *lse, ulong lse_off, __global float *dv,
                         ulong dv_off, SHAPE_ARGS, __local float *tiles, uint r0)
{
    __local float *qt = tiles, *ot = tiles + TILE * D, *mt = ot + TILE * D, *lt = mt + TILE;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
    const uint r = get_local_id(0) % ROWS, part = get_local_id(0) / ROWS, t = r0 + r;
    const bool live = t < kv_seq;
    const uint group = num_heads / num_kv_heads;
    float kr[D], acc[D];
    for (uint d = 0; d < D; ++d) {
        kr[d] = live ? k[k_off + at(b, kv_seq, t, num_kv_heads, kv_head, d)] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    uint lo, hi;
    queries_of_keys(r0, min(r0 + ROWS, kv_seq) - 1u, q_seq, causal, window, &lo, &hi);
    for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
        for (uint p0 = lo; p0 < hi; p0 += TILE) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(qt, q, q_off, b, q_seq, p0, hi, num_heads, head);
            load_tile(ot, d_out, d_out_off, b, q_seq, p0, hi, num_heads, head);
            load_rows(mt, lt, 0, lse, lse_off, 0, 0, b, q_seq, p0, hi, num_heads, head);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (!live)
                continue;
            for (uint i = 0; i < TILE / SPLIT; ++i) {
                const uint j = i * SPLIT + part;
                if (p0 + j >= hi || !visible(p0 + j, t, causal, window))
                    continue;
                float s = 0.0f;
                for (uint d = 0; d < D; ++d)
                    s = fma(kr[d], qt[j * D + d], s);
                const float p = exp(fmin(s - mt[j], 0.0f) - lt[j]);
                for (uint d = 0; d < D; ++d)
                    acc[d] = fma(p, ot[j * D + d], acc[d]);
            }
        }
    }
    sum_parts(tiles, acc, part, r);
    if (live && part == 0)
        for (uint d = 0; d < D; ++d)
            dv[dv_off + at(b, kv_seq, t, num_kv_heads, kv_head, d)] = acc[d];
}

/* dK of a key row: scale * sum of dS * Q over the queries that see it. */
inline void grad_k_block(__global const float *q, ulong q_off, __global const float *k,
                         ulong k_off, __global const float *v, ulong v_off,
                         __global const float *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global float *dk, ulong dk_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    __local float *qt = tiles, *ot = tiles + TILE * D, *mt = ot + TILE * D, *lt = mt + TILE;
    __local float *dt = lt + TILE;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
    const uint r = get_local_id(0) % ROWS, part = get_local_id(0) / ROWS, t = r0 + r;
    const bool live = t < kv_seq;
    const uint group = num_heads / num_kv_heads;
    float kr[D], vr[D], acc[D];
    for (uint d = 0; d < D; ++d) {
        const ulong kv = at(b, kv_seq, live ? t : 0u, num_kv_heads, kv_head, d);
        kr[d] = live ? k[k_off + kv] * scale : 0.0f;
        vr[d] = live ? v[v_off + kv] : 0.0f;
        acc[d] = 0.0f;
    }
    uint lo, hi;
    queries_of_keys(r0, min(r0 + ROWS, kv_seq) - 1u, q_seq, causal, window, &lo, &hi);
    for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
        for (uint p0 = lo; p0 < hi; p0 += TILE) {
            barrier(CLK_LOCAL_MEM_FENCE);
            load_tile(qt, q, q_off, b, q_seq, p0, hi, num_heads, head);
            load_tile(ot, d_out, d_out_off, b, q_seq, p0, hi, num_heads, head);
            load_rows(mt, lt, dt, lse, lse_off, dsum, dsum_off, b, q_seq, p0, hi, num_heads,
                      head);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (!live)
                continue;
            for (uint i = 0; i < TILE / SPLIT; ++i) {
                const uint j = i * SPLIT + part;
                if (p0 + j >= hi || !visible(p0 + j, t, causal, window))
                    continue;
                float s = 0.0f, dp = 0.0f;
                for (uint d = 0; d < D; ++d) {
                    s = fma(kr[d], qt[j * D + d], s);
                    dp = fma(vr[d], ot[j * D + d], dp);
                }
                const float ds = exp(fmin(s - mt[j], 0.0f) - lt[j]) * (dp - dt[j]);
                for (uint d = 0; d < D; ++d)
                    acc[d] = fma(ds, qt[j * D + d], acc[d]);
            }
        }
    }
    sum_parts(tiles, acc, part, r);
    if (live && part == 0)
        for (uint d = 0; d < D; ++d)
            dk[dk_off + at(b, kv_seq, t, num_kv_heads, kv_head, d)] = scale * acc[d];
}

/* Each kernel runs its block function on row block g and, under a causal
 * mask, on block blocks - 1 - g as well. A loop, not two inlined copies,
 * so that the pairing costs no registers. */
#define PAIRED(rows, call)                                                        \
    const uint blocks = (rows + ROWS - 1u) / ROWS, g = get_group_id(0);           \
    const uint passes = causal && blocks - 1u - g != g ? 2u : 1u;                 \
    for (uint pass = 0; pass < passes; ++pass) {                                  \
        const uint r0 = (pass ? blocks - 1u - g : g) * ROWS;                      \
        call;                                                                     \
    }

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
forward__tiled(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
               __global const float *v, ulong v_off, __global float *o, ulong o_off,
               __global float *lse, ulong lse_off, SHAPE_ARGS, __local float *tiles)
{
    PAIRED(q_seq, forward_block(q, q_off, k, k_off, v, v_off, o, o_off, lse, lse_off, q_seq,
                                kv_seq, num_heads, num_kv_heads, head_dim, causal, window,
                                scale, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_q__tiled(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
              __global const float *v, ulong v_off, __global const float *d_out,
              ulong d_out_off, __global const float *lse, ulong lse_off,
              __global const float *dsum, ulong dsum_off, __global float *dq, ulong dq_off,
              SHAPE_ARGS, __local float *tiles)
{
    PAIRED(q_seq, grad_q_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off,
                               dsum, dsum_off, dq, dq_off, q_seq, kv_seq, num_heads,
                               num_kv_heads, head_dim, causal, window, scale, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_v__tiled(__global const float *d_out, ulong d_out_off, __global const float *q,
              ulong q_off, __global const float *k, ulong k_off, __global const float *lse,
              ulong lse_off, __global float *dv, ulong dv_off, SHAPE_ARGS,
              __local float *tiles)
{
    PAIRED(kv_seq, grad_v_block(d_out, d_out_off, q, q_off, k, k_off, lse, lse_off, dv, dv_off,
                                q_seq, kv_seq, num_heads, num_kv_heads, head_dim, causal,
                                window, scale, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_k__tiled(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
              __global const float *v, ulong v_off, __global const float *d_out,
              ulong d_out_off, __global const float *lse, ulong lse_off,
              __global const float *dsum, ulong dsum_off, __global float *dk, ulong dk_off,
              SHAPE_ARGS, __local float *tiles)
{
    PAIRED(kv_seq, grad_k_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off,
                                dsum, dsum_off, dk, dk_off, q_seq, kv_seq, num_heads,
                                num_kv_heads, head_dim, causal, window, scale, tiles, r0))
}
