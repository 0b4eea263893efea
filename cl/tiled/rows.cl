/*
 * tiled's rows layout (PER_ITEM 0): a whole dot product per work-item, no
 * barrier per product. A work-group holds ROWS rows of one head and batch
 * element (query rows for the forward and grad-Q, key rows for grad-V and
 * grad-K), each row's vectors in its work-items' registers; the other side
 * streams through local memory TILE rows at a time, loaded once for the
 * whole work-group. SPLIT work-items share a row, each taking every
 * SPLIT-th row of each tile, and combine their partial sums at the end:
 * more work-items in flight when rows are few. Lanes of one part are
 * adjacent, so a warp reads one tile row at a time (a broadcast). Tiles
 * that no row of the group can see are skipped through the loop bounds,
 * and those the caller's mask hides whole through its block map
 * (SHOWN_KEYS, SHOWN_ROWS); only boundary tiles test the mask.
 *
 * Past what fits a work-item's registers, DSPLIT work-items share a row by
 * columns as well: each holds DC = ceil(D / DSPLIT) columns of its vectors
 * and of its accumulator, and computes partial dot products over them. The
 * work-items of a row add their partials through local memory once per
 * tile, each in the same order, so that all of them hold bitwise the same
 * scores and the same softmax. Local tiles are DP = DSPLIT * DC columns
 * wide, zero past D.
 *
 * The local buffer: TILED_LOCAL_ROWS (cl/tiled/layout.h), rounded up to
 * whole float4s.
 */
#if !PER_ITEM
#define XCH_AT TILED_ROWS_XCH_AT(TILE, DP) /* the partial dot products */

/* A work-item's place: its row of the group, its columns' part (DC columns
 * from c0) and its part of each tile's rows. */
typedef struct lane {
    uint r, c0, part;
} lane;

inline lane lane_of(void)
{
    const uint id = get_local_id(0);
    lane me = {id % ROWS, id / ROWS % DSPLIT * DC, id / (ROWS * DSPLIT)};
    return me;
}

/* Loads DC columns from c0 of a row of a [batch][rows][heads][D] tensor,
 * times gain, into x; zeros for a dead row or past D. */
inline void load_row(float *x, __global const elem *src, ulong off, uint b, uint rows,
                     uint row, bool live, uint heads, uint head, uint c0, float gain)
{
    for (uint d = 0; d < DC; ++d)
        x[d] = live && c0 + d < D ? LOAD(src, off + at(b, rows, row, heads, head, c0 + d)) * gain
                                  : 0.0f;
}

/* Stores DC columns from c0 of x, times gain, into a row (added to it
 * under accumulate). */
inline void store_row(__global elem *dst, ulong off, uint b, uint rows, uint row, uint heads,
                      uint head, uint c0, const float *x, float gain, int accumulate)
{
    for (uint d = 0; d < DC && c0 + d < D; ++d)
        STORE_GRAD(dst, off + at(b, rows, row, heads, head, c0 + d), gain * x[d], accumulate);
}

/* Partial dot products of x's columns with those of the work-item's tile
 * rows (every SPLIT-th from part). Where a work-item's columns come in
 * fours, the tile is read four floats a load (one local load feeds four
 * FMAs, not one); the sums are taken in the same order either way. */
inline void tile_dots(float *dots, const float *x, __local const float *tile, lane me)
{
    for (uint i = 0; i < TILE / SPLIT; ++i) {
        __local const float *row = tile + (i * SPLIT + me.part) * DP + me.c0;
        float dot = 0.0f;
#if DC % 4 == 0
        for (uint d = 0; d < DC; d += 4) {
            const float4 r = *(__local const float4 *)(row + d);
            dot = fma(x[d], r.x, dot);
            dot = fma(x[d + 1], r.y, dot);
            dot = fma(x[d + 2], r.z, dot);
            dot = fma(x[d + 3], r.w, dot);
        }
#else
        for (uint d = 0; d < DC; ++d)
            dot = fma(x[d], row[d], dot);
#endif
        dots[i] = dot;
    }
}

/* acc += w[i] * tile row i, over the work-item's tile rows and columns. */
inline void tile_axpy(float *acc, const float *w, __local const float *tile, lane me)
{
    for (uint i = 0; i < TILE / SPLIT; ++i) {
        __local const float *row = tile + (i * SPLIT + me.part) * DP + me.c0;
#if DC % 4 == 0
        for (uint d = 0; d < DC; d += 4) {
            const float4 r = *(__local const float4 *)(row + d);
            acc[d] = fma(w[i], r.x, acc[d]);
            acc[d + 1] = fma(w[i], r.y, acc[d + 1]);
            acc[d + 2] = fma(w[i], r.z, acc[d + 2]);
            acc[d + 3] = fma(w[i], r.w, acc[d + 3]);
        }
#else
        for (uint d = 0; d < DC; ++d)
            acc[d] = fma(w[i], row[d], acc[d]);
#endif
    }
}

/* Turns the partial dot products of a row's DSPLIT work-items into whole
 * ones (a and, when b is not NULL, b), added in the order of the columns
 * by every work-item of the row, so that all hold the same sums bitwise.
 * Every work-item of the group calls it, after the tile's barrier. */
inline void whole_dots(__local float *xch, float *a, float *b, lane me)
{
#if DSPLIT > 1
    const uint c = me.c0 / DC;
    for (uint i = 0; i < TILE / SPLIT; ++i) {
        const uint j = i * SPLIT + me.part;
        xch[(c * TILE + j) * ROWS + me.r] = a[i];
        if (b)
            xch[((DSPLIT + c) * TILE + j) * ROWS + me.r] = b[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint i = 0; i < TILE / SPLIT; ++i) {
        const uint j = i * SPLIT + me.part;
        float sa = 0.0f, sb = 0.0f;
        for (uint k = 0; k < DSPLIT; ++k) {
            sa += xch[(k * TILE + j) * ROWS + me.r];
            if (b)
                sb += xch[((DSPLIT + k) * TILE + j) * ROWS + me.r];
        }
        a[i] = sa;
        if (b)
            b[i] = sb;
    }
#endif
}

/* Adds the partial sums of a row's other parts into part 0's acc, through
 * local memory (the tiles' space). Every work-item of the group calls it. */
inline void sum_parts(__local float *comb, float *acc, lane me)
{
#if SPLIT > 1
    barrier(CLK_LOCAL_MEM_FENCE);
    if (me.part > 0)
        for (uint d = 0; d < DC; ++d)
            comb[((me.part - 1u) * ROWS + me.r) * DP + me.c0 + d] = acc[d];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (me.part == 0)
        for (uint p = 1; p < SPLIT; ++p)
            for (uint d = 0; d < DC; ++d)
                acc[d] += comb[((p - 1u) * ROWS + me.r) * DP + me.c0 + d];
#endif
}

inline void forward_block(__global const elem *q, ulong q_off, __global const elem *k,
                          ulong k_off, __global const elem *v, ulong v_off, __global elem *o,
                          ulong o_off, __global float *lse, ulong lse_off, SHAPE_ARGS,
                          __local float *tiles, uint r0)
{
    __local float *kt = tiles, *vt = tiles + TILE * DP;
    const uint head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint pos = r0 + me.r;
    const bool live = pos < q_seq;
    const uint kv_head = head / (num_heads / num_kv_heads);
    float qr[DC], acc[DC];
    load_row(qr, q, q_off, b, q_seq, pos, live, num_heads, head, me.c0, scale);
    for (uint d = 0; d < DC; ++d)
        acc[d] = 0.0f;
    float m = EMPTY_ROW, l = 0.0f;
    uint lo, hi;
    const uint last = min(r0 + ROWS, q_seq) - 1u;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    float nk[PF], nv[PF]; /* the next tile */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        barrier(CLK_LOCAL_MEM_FENCE);
        put_tile(kt, nk);
        put_tile(vt, nv);
        barrier(CLK_LOCAL_MEM_FENCE);
        fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        float s[TILE / SPLIT], tile_max = EMPTY_ROW;
        tile_dots(s, qr, kt, me);
        whole_dots(tiles + XCH_AT, s, 0, me);
        if (!live)
            continue;
        bool any = false; /* the row sees a key of the tile (its scores may be NaN) */
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            const uint t = t0 + i * SPLIT + me.part;
            const bool seen = t < hi && visible(pos, t, causal, window, delta);
#if SHAPED
            float dz;
            s[i] = MODIFY(s[i], pos, t, head, b, &dz);
#endif
            s[i] = seen ? s[i] : EMPTY_ROW;
            any = any || seen;
            tile_max = fmax(tile_max, s[i]);
        }
        if (!any)
            continue;
        const float m_new = fmax(m, tile_max), rescale = exp(m - m_new);
        l *= rescale;
        for (uint d = 0; d < DC; ++d)
            acc[d] *= rescale;
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            /* Masked scores are exactly EMPTY_ROW; their weight is 0 even
             * while the row's max is EMPTY_ROW too. */
            s[i] = s[i] == EMPTY_ROW ? 0.0f : exp(s[i] - m_new);
            l += s[i];
#if MODS & MOD_DROPOUT
            s[i] *= DROP(pos, t0 + i * SPLIT + me.part, head, b); /* l is the undropped sum */
#endif
        }
        tile_axpy(acc, s, vt, me);
        m = m_new;
    }
#if SPLIT > 1
    /* Merge the parts' softmax states: rescale each to the largest m. */
    barrier(CLK_LOCAL_MEM_FENCE);
    __local float *comb = tiles;
    if (me.part > 0) {
        __local float *mine = comb + ((me.part - 1u) * ROWS + me.r) * (DP + 2);
        for (uint d = 0; d < DC; ++d)
            mine[me.c0 + d] = acc[d];
        if (me.c0 == 0) {
            mine[DP] = m;
            mine[DP + 1] = l;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (me.part > 0)
        return;
    float m_all = m;
    for (uint p = 1; p < SPLIT; ++p)
        m_all = fmax(m_all, comb[((p - 1u) * ROWS + me.r) * (DP + 2) + DP]);
    const float own = exp(m - m_all);
    l *= own;
    for (uint d = 0; d < DC; ++d)
        acc[d] *= own;
    for (uint p = 1; p < SPLIT; ++p) {
        __local const float *other = comb + ((p - 1u) * ROWS + me.r) * (DP + 2);
        const float f = exp(other[DP] - m_all);
        l += other[DP + 1] * f;
        for (uint d = 0; d < DC; ++d)
            acc[d] = fma(other[me.c0 + d], f, acc[d]);
    }
    m = m_all;
#endif
    if (!live)
        return;
#if MODS & MOD_SINK
    const float r = sink_fold(&m, &l, SINK(head));
    for (uint d = 0; d < DC; ++d)
        acc[d] *= r;
#endif
    for (uint d = 0; d < DC; ++d)
        acc[d] = l != 0.0f ? acc[d] / l : ZERO_SUM(pos, 0.0f);
    store_row(o, o_off, b, q_seq, pos, num_heads, head, me.c0, acc, 1.0f, 0);
    if (me.c0 > 0)
        return;
    const ulong row = lse_off + 2 * row_of(b, q_seq, pos, num_heads, head);
    lse[row] = l != 0.0f ? m : ZERO_SUM(pos, EMPTY_ROW);
    lse[row + 1] = l != 0.0f ? log(l) : ZERO_SUM(pos, EMPTY_ROW);
}

/* dQ of a query row: sum over its keys of scale * dS * K[t]. */
inline void grad_q_block(__global const elem *q, ulong q_off, __global const elem *k,
                         ulong k_off, __global const elem *v, ulong v_off,
                         __global const elem *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global elem *dq, ulong dq_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    __local float *kt = tiles, *vt = tiles + TILE * DP;
    const uint head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint pos = r0 + me.r;
    const bool live = pos < q_seq;
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong row = row_of(b, q_seq, live ? pos : 0u, num_heads, head);
    float qr[DC], dor[DC], acc[DC];
    load_row(qr, q, q_off, b, q_seq, pos, live, num_heads, head, me.c0, scale);
    load_row(dor, d_out, d_out_off, b, q_seq, pos, live, num_heads, head, me.c0, 1.0f);
    for (uint d = 0; d < DC; ++d)
        acc[d] = 0.0f;
    const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
    const float ds_row = dsum[dsum_off + row];
    uint lo, hi;
    const uint last = min(r0 + ROWS, q_seq) - 1u;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    float nk[PF], nv[PF]; /* the next tile */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        barrier(CLK_LOCAL_MEM_FENCE);
        put_tile(kt, nk);
        put_tile(vt, nv);
        barrier(CLK_LOCAL_MEM_FENCE);
        fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        float s[TILE / SPLIT], dp[TILE / SPLIT];
        tile_dots(s, qr, kt, me);
        tile_dots(dp, dor, vt, me);
        whole_dots(tiles + XCH_AT, s, dp, me);
        if (!live)
            continue;
        for (uint i = 0; i < TILE / SPLIT; ++i) {
            const uint t = t0 + i * SPLIT + me.part;
            s[i] = grad_score(s[i], dp[i], m, l, ds_row,
                              t < hi && visible(pos, t, causal, window, delta), pos, t, head, b,
                              SHAPE_PASS);
        }
        tile_axpy(acc, s, kt, me);
    }
    sum_parts(tiles, acc, me);
    if (live && me.part == 0)
        store_row(dq, dq_off, b, q_seq, pos, num_heads, head, me.c0, acc, scale, accumulate);
}

/* dV of a key row, over the queries of its KV head's group that see it. */
inline void grad_v_block(__global const elem *d_out, ulong d_out_off, __global const elem *q,
                         ulong q_off, __global const elem *k, ulong k_off,
                         __global const float *lse, ulong lse_off, __global elem *dv,
                         ulong dv_off, SHAPE_ARGS, __local float *tiles, uint r0)
{
    __local float *qt = tiles, *ot = tiles + TILE * DP, *mt = ot + TILE * DP, *lt = mt + TILE;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint t = r0 + me.r;
    const bool live = t < kv_seq;
    const uint group = num_heads / num_kv_heads;
    float kr[DC], acc[DC];
    load_row(kr, k, k_off, b, kv_seq, t, live, num_kv_heads, kv_head, me.c0, scale);
    for (uint d = 0; d < DC; ++d)
        acc[d] = 0.0f;
    uint lo, hi;
    const uint last = min(r0 + ROWS, kv_seq) - 1u;
    queries_of_keys(r0, last, q_seq, causal, window, delta, &lo, &hi);
    const uint heads_end = (kv_head + 1u) * group;
    float nq[PF], no[PF]; /* the next tile */
    FETCH_FIRST_QUERIES(nq, no, q, q_off, d_out, d_out_off, lo, hi, r0, last);
    for (uint head = kv_head * group; head < heads_end; ++head) {
        for (uint p0 = SHOWN_ROWS(lo, TILE, hi, r0, last, head, 1u); p0 < hi;
             p0 = SHOWN_ROWS(p0 + TILE, TILE, hi, r0, last, head, 1u)) {
            barrier(CLK_LOCAL_MEM_FENCE);
            put_tile(qt, nq);
            put_tile(ot, no);
            load_stats(mt, lt, 0, lse, lse_off, 0, 0, b, q_seq, p0, hi, num_heads, head);
            barrier(CLK_LOCAL_MEM_FENCE);
            FETCH_NEXT_QUERIES(nq, no, q, q_off, d_out, d_out_off, head, p0, lo, hi, r0, last);
            float s[TILE / SPLIT];
            tile_dots(s, kr, qt, me);
            whole_dots(tiles + XCH_AT, s, 0, me);
            if (!live)
                continue;
            for (uint i = 0; i < TILE / SPLIT; ++i) {
                const uint j = i * SPLIT + me.part;
#if SHAPED
                float dz;
                s[i] = MODIFY(s[i], p0 + j, t, head, b, &dz);
#endif
                s[i] = p0 + j < hi && visible(p0 + j, t, causal, window, delta)
                           ? exp(min0(s[i] - mt[j]) - lt[j])
                           : 0.0f;
#if MODS & MOD_DROPOUT
                s[i] *= DROP(p0 + j, t, head, b);
#endif
            }
            tile_axpy(acc, s, ot, me);
        }
    }
    sum_parts(tiles, acc, me);
    if (live && me.part == 0)
        store_row(dv, dv_off, b, kv_seq, t, num_kv_heads, kv_head, me.c0, acc, 1.0f, accumulate);
}

/* dK of a key row (scale * sum of dS * Q over the queries that see it) and,
 * where dv is not NULL, its dV (sum of P * dO) from the same scores and dP:
 * grad_kv__tiled's one pass where grad_k__tiled and grad_v__tiled take
 * two. */
inline void key_rows_block(__global const elem *q, ulong q_off, __global const elem *k,
                           ulong k_off, __global const elem *v, ulong v_off,
                           __global const elem *d_out, ulong d_out_off,
                           __global const float *lse, ulong lse_off, __global const float *dsum,
                           ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv,
                           ulong dv_off, SHAPE_ARGS, __local float *tiles, uint r0)
{
    __local float *qt = tiles, *ot = tiles + TILE * DP, *mt = ot + TILE * DP, *lt = mt + TILE;
    __local float *dt = lt + TILE;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint t = r0 + me.r;
    const bool live = t < kv_seq;
    const uint group = num_heads / num_kv_heads;
    float kr[DC], vr[DC], acc_k[DC], acc_v[DC];
    load_row(kr, k, k_off, b, kv_seq, t, live, num_kv_heads, kv_head, me.c0, scale);
    load_row(vr, v, v_off, b, kv_seq, t, live, num_kv_heads, kv_head, me.c0, 1.0f);
    for (uint d = 0; d < DC; ++d)
        acc_k[d] = acc_v[d] = 0.0f;
    uint lo, hi;
    const uint last = min(r0 + ROWS, kv_seq) - 1u;
    queries_of_keys(r0, last, q_seq, causal, window, delta, &lo, &hi);
    const uint heads_end = (kv_head + 1u) * group;
    float nq[PF], no[PF]; /* the next tile */
    FETCH_FIRST_QUERIES(nq, no, q, q_off, d_out, d_out_off, lo, hi, r0, last);
    for (uint head = kv_head * group; head < heads_end; ++head) {
        for (uint p0 = SHOWN_ROWS(lo, TILE, hi, r0, last, head, 1u); p0 < hi;
             p0 = SHOWN_ROWS(p0 + TILE, TILE, hi, r0, last, head, 1u)) {
            barrier(CLK_LOCAL_MEM_FENCE);
            put_tile(qt, nq);
            put_tile(ot, no);
            load_stats(mt, lt, dt, lse, lse_off, dsum, dsum_off, b, q_seq, p0, hi, num_heads,
                      head);
            barrier(CLK_LOCAL_MEM_FENCE);
            FETCH_NEXT_QUERIES(nq, no, q, q_off, d_out, d_out_off, head, p0, lo, hi, r0, last);
            float s[TILE / SPLIT], dp[TILE / SPLIT];
            tile_dots(s, kr, qt, me);
            tile_dots(dp, vr, ot, me);
            whole_dots(tiles + XCH_AT, s, dp, me);
            if (!live)
                continue;
            for (uint i = 0; i < TILE / SPLIT; ++i) {
                const uint j = i * SPLIT + me.part, pos = p0 + j;
                float dz = 1.0f;
#if SHAPED
                s[i] = MODIFY(s[i], pos, t, head, b, &dz);
#endif
                /* unseen pairs weigh exactly 0: a NaN in a row they pair
                 * must not reach it */
                const bool seen = pos < hi && visible(pos, t, causal, window, delta);
                const float p = exp(min0(s[i] - mt[j]) - lt[j]);
#if MODS & MOD_DROPOUT
                const float keep = DROP(pos, t, head, b);
#else
                const float keep = 1.0f;
#endif
                dp[i] = seen ? p * (dp[i] * keep - dt[j]) * dz : 0.0f;
                s[i] = seen ? p * keep : 0.0f;
            }
            tile_axpy(acc_k, dp, qt, me);
            if (dv)
                tile_axpy(acc_v, s, ot, me);
        }
    }
    /* both, dv or not: PoCL 3.1 misbuilt a barrier under `if (dv)` */
    sum_parts(tiles, acc_k, me);
    sum_parts(tiles, acc_v, me);
    if (live && me.part == 0) {
        store_row(dk, dk_off, b, kv_seq, t, num_kv_heads, kv_head, me.c0, acc_k, scale,
                  accumulate);
        if (dv)
            store_row(dv, dv_off, b, kv_seq, t, num_kv_heads, kv_head, me.c0, acc_v, 1.0f,
                      accumulate);
    }
}

inline void grad_k_block(__global const elem *q, ulong q_off, __global const elem *k,
                         ulong k_off, __global const elem *v, ulong v_off,
                         __global const elem *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global elem *dk, ulong dk_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    key_rows_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum, dsum_off,
                   dk, dk_off, 0, 0, SHAPE_PASS, tiles, r0);
}

#endif
