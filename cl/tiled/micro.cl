/*
 * tiled's micro-tile layout (PER_ITEM 1 to 8), in the manner of a blocked
 * matrix product (CLBlast's xgemm).
 *
 * A work-group holds ROWS rows of one head and batch element (query rows
 * for the forward and grad-Q, key rows for the key side) in local memory,
 * the rows' vectors of the inputs it scores them with; the other side
 * streams through local memory TILE rows at a time. Its work-items form a
 * grid of ROWS / PER_ITEM by SPLIT: work-item (ty, tx) holds rows ty +
 * ROWS / PER_ITEM * i (i < PER_ITEM, row_in) and
 *  - scores them against tile rows tx + SPLIT * j (j < CN = TILE / SPLIT),
 *    four columns a step: each local load of four floats feeds PER_ITEM or
 *    CN products of four, not one;
 *  - accumulates their outputs over the head_dim columns 4 (tx + SPLIT k)
 *    .. + 3 (k < NC4), from the tile's weights, which pass through local
 *    memory (WS), times the tile's rows.
 * Everything is float32 inside. A row's SPLIT work-items agree on the
 * row's softmax state bitwise: each takes the same values in the same
 * order (the tile's maximum through local memory, the sum from the
 * weights). Local rows are DS = DP + 4 floats apart (DP: head_dim rounded
 * up to four, zeros past it), so that the SPLIT rows a load step reads lie
 * in different banks. Tiles that no pair of the group masks skip the mask
 * test; tiles that no row of the group can see are skipped through the
 * loop bounds. dK and dV come from one kernel (grad_kv__tiled): one score
 * and dP a pair for both.
 *
 * The local buffer: each kernel's LOCAL_* below, in whole
 * float4s.
 */
#if PER_ITEM
#define WS TILED_WS(ROWS)                 /* a weight row's stride (one a tile row) */
#define CN (TILE / SPLIT)                 /* tile rows a work-item scores */
#define NC4 ((DP / 4 + SPLIT - 1) / SPLIT) /* float4 columns a work-item accumulates */
#define WHOLE_C4 (NC4 * SPLIT * 4 == DP)  /* every work-item's columns all lie inside DP */

/* Local floats of each kernel (cl/tiled/layout.h): the group's rows, the
 * tile's rows, the weights, and the forward's maxima and dropout sums
 * (RED) or the key side's per-query values. The forward's weights take the
 * key tile's place where they fit it (WS <= DS): the keys are read by
 * then. Where two tiles do not fit the device (ONE_KV, set by the host),
 * its K and V tiles take turns in one buffer: V goes in once the scores are
 * made (the barrier the maxima need lies between), at no extra barrier. */
#ifndef ONE_KV
#define ONE_KV 0
#endif
#define WS_IN_KS TILED_WS_IN_KS(DS, WS, ONE_KV)
#define LOCAL_FORWARD TILED_LOCAL_FORWARD(ROWS, TILE, SPLIT, DS, WS, ONE_KV)
#define LOCAL_GRAD_Q TILED_LOCAL_GRAD_Q(ROWS, TILE, DS, WS)
#define LOCAL_KEY TILED_LOCAL_KEY(ROWS, TILE, DS, WS)
#define LOCAL_GRAD_QS TILED_LOCAL_GRAD_QS(TILE, DS, WS)

/* A work-item's place in the group's grid. */
typedef struct lane {
    uint ty, tx;
} lane;

inline lane lane_of(void)
{
    const uint id = get_local_id(0);
    lane me = {id / SPLIT, id % SPLIT};
    return me;
}

/* The group row of the work-item's row i: its rows interleave with the
 * other work-items' (ty, ty + ROWS / RM, ...), so that the rows that the
 * neighbouring ty of one warp read at a step are neighbouring rows, DS
 * floats apart, in different banks (rows RM apart share banks from RM = 4
 * on). Its weights, maxima and sums keep the slot ty * RM + i. */
inline uint row_in(lane me, uint i)
{
    return i * (ROWS / RM) + me.ty;
}

/* Loads rows [r0, r0 + n) of a [batch][rows][heads][D] tensor, times gain,
 * into t[n][DS], zeros past `end` and past D. Every work-item of the group
 * calls it; neighbours read neighbouring columns. */
inline void load_block(__local float *t, uint n, __global const elem *src, ulong off, uint b,
                       uint rows, uint r0, uint end, uint heads, uint head, float gain)
{
    for (uint i = get_local_id(0); i < n * DP; i += LANES) {
        const uint r = i / DP, d = i % DP;
        t[r * DS + d] = r0 + r < end && d < D
                            ? LOAD(src, off + at(b, rows, r0 + r, heads, head, d)) * gain
                            : 0.0f;
    }
}

/* The products' inner loops are unrolled up to head_dim 64, where it ran
 * faster on a GPU; at head_dim 128 the unrolled backward ran slower. */
#if DP <= 64
#define MICRO_UNROLL _Pragma("unroll")
#else
#define MICRO_UNROLL
#endif

/* s[i * CN + j] = the dot product of the group's row ty * RM + i of `as`
 * with the tile's row tx + SPLIT * j of `bs`, four columns a step. */
inline void micro_dots(float *s, __local const float *as, __local const float *bs, lane me)
{
    for (uint e = 0; e < RM * CN; ++e)
        s[e] = 0.0f;
    MICRO_UNROLL
    for (uint d = 0; d < DP; d += 4) {
        float4 a[RM], x[CN];
        for (uint i = 0; i < RM; ++i)
            a[i] = *(__local const float4 *)(as + row_in(me, i) * DS + d);
        for (uint j = 0; j < CN; ++j)
            x[j] = *(__local const float4 *)(bs + (me.tx + SPLIT * j) * DS + d);
        for (uint i = 0; i < RM; ++i)
            for (uint j = 0; j < CN; ++j) {
                float t = s[i * CN + j];
                t = fma(a[i].x, x[j].x, t);
                t = fma(a[i].y, x[j].y, t);
                t = fma(a[i].z, x[j].z, t);
                t = fma(a[i].w, x[j].w, t);
                s[i * CN + j] = t;
            }
    }
}

/* Writes the work-item's weights w[i * CN + j] (row ty * RM + i, tile row
 * tx + SPLIT * j) into ws[tile row][WS]. */
inline void put_weights(__local float *ws, const float *w, lane me)
{
    for (uint j = 0; j < CN; ++j) {
        __local float *at = ws + (me.tx + SPLIT * j) * WS + me.ty * RM;
#if RM % 4 == 0 /* whole float4s: WS and the rows' offset are */
        for (uint i = 0; i < RM; i += 4)
            *(__local float4 *)(at + i) = (float4)(w[i * CN + j], w[(i + 1) * CN + j],
                                                   w[(i + 2) * CN + j], w[(i + 3) * CN + j]);
#else
        for (uint i = 0; i < RM; ++i)
            at[i] = w[i * CN + j];
#endif
    }
}

/* acc[(i * NC4 + k) * 4 + c] += sum over the tile's rows t of the weight of
 * (row ty * RM + i, t) times column 4 (tx + SPLIT k) + c of cs's row t; and,
 * where sum is not NULL, sum[i] += the weights of row i, in t's order. */
inline void micro_axpy(float *acc, float *sum, __local const float *ws, __local const float *cs,
                       lane me)
{
    MICRO_UNROLL
    for (uint t = 0; t < TILE; ++t) {
        float w[RM];
#if RM % 4 == 0 /* float4 loads: WS and the rows' offset are whole float4s */
        for (uint i = 0; i < RM; i += 4) {
            const float4 w4 = *(__local const float4 *)(ws + t * WS + me.ty * RM + i);
            w[i] = w4.x;
            w[i + 1] = w4.y;
            w[i + 2] = w4.z;
            w[i + 3] = w4.w;
        }
#else
        for (uint i = 0; i < RM; ++i)
            w[i] = ws[t * WS + me.ty * RM + i];
#endif
        if (sum)
            for (uint i = 0; i < RM; ++i)
                sum[i] += w[i];
        for (uint k = 0; k < NC4; ++k) {
            const uint c = 4 * (me.tx + SPLIT * k);
            if (!WHOLE_C4 && c >= DP)
                break;
            const float4 v = *(__local const float4 *)(cs + t * DS + c);
            for (uint i = 0; i < RM; ++i) {
                float *a = acc + (i * NC4 + k) * 4;
                a[0] = fma(w[i], v.x, a[0]);
                a[1] = fma(w[i], v.y, a[1]);
                a[2] = fma(w[i], v.z, a[2]);
                a[3] = fma(w[i], v.w, a[3]);
            }
        }
    }
}

/* Stores the work-item's columns of row i of acc, times gain, into a row
 * of a [batch][rows][heads][D] tensor (added to it under accumulate). */
inline void store_acc(__global elem *dst, ulong off, uint b, uint rows, uint row, uint heads,
                      uint head, const float *acc, uint i, float gain, int accumulate, lane me)
{
    for (uint k = 0; k < NC4; ++k)
        for (uint c = 0; c < 4; ++c) {
            const uint d = 4 * (me.tx + SPLIT * k) + c;
            if (d < D)
                STORE_GRAD(dst, off + at(b, rows, row, heads, head, d),
                           gain * acc[(i * NC4 + k) * 4 + c], accumulate);
        }
}

/* Whether query pos sees key t for every pos of [p_first, p_last] and t of
 * [t_first, t_last]: the tile needs no mask test. */
inline bool all_visible(uint p_first, uint p_last, uint t_first, uint t_last, int causal,
                        uint window, long delta)
{
    return visible(p_first, t_last, causal, window, delta) &&
           visible(p_last, t_first, causal, window, delta);
}

/* all_visible for the group's query rows r0 .. last and the key tile from
 * t0 (keys below hi). */
inline bool keys_whole(uint r0, uint last, uint t0, uint hi, int causal, uint window, long delta)
{
    return all_visible(r0, last, t0, min(t0 + TILE, hi) - 1u, causal, window, delta);
}

inline void forward_block(__global const elem *q, ulong q_off, __global const elem *k,
                          ulong k_off, __global const elem *v, ulong v_off, __global elem *o,
                          ulong o_off, __global float *lse, ulong lse_off, SHAPE_ARGS,
                          __local float *tiles, uint r0)
{
    __local float *qs = tiles, *ks = qs + ROWS * DS, *vs = ONE_KV ? ks : ks + TILE * DS;
    __local float *ws = WS_IN_KS ? ks : vs + TILE * DS;
    __local float *red = tiles + LOCAL_FORWARD - 2 * SPLIT * ROWS;
    const uint head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint last = min(r0 + ROWS, q_seq) - 1u;
    barrier(CLK_LOCAL_MEM_FENCE); /* the pair's first block is done with qs */
    load_block(qs, ROWS, q, q_off, b, q_seq, r0, q_seq, num_heads, head, scale);
    float acc[RM * NC4 * 4], m[RM], l[RM];
    for (uint e = 0; e < RM * NC4 * 4; ++e)
        acc[e] = 0.0f;
    for (uint i = 0; i < RM; ++i) {
        m[i] = EMPTY_ROW;
        l[i] = 0.0f;
    }
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    float nk[PF], nv[PF]; /* the next tile (ONE_KV: V of this one until it goes in) */
    /* tiles the caller's mask hides whole are skipped (SHOWN_KEYS) */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        const bool more = next < hi;
        barrier(CLK_LOCAL_MEM_FENCE);
        put_tile(ks, nk);
        if (!ONE_KV)
            put_tile(vs, nv);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!ONE_KV)
            fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        else if (more) /* V's comes once this tile's V is in */
            fetch_tile(nk, k, k_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        float s[RM * CN];
        micro_dots(s, qs, ks, me);
        const bool whole = keys_whole(r0, last, t0, hi, causal, window, delta);
        for (uint i = 0; i < RM; ++i) {
            const uint pos = r0 + row_in(me, i);
            float mx = EMPTY_ROW;
            for (uint j = 0; j < CN; ++j) {
                const uint t = t0 + me.tx + SPLIT * j;
                const bool seen = t < hi && (whole || visible(pos, t, causal, window, delta));
#if SHAPED
                float dz;
                s[i * CN + j] = MODIFY(s[i * CN + j], pos, t, head, b, &dz);
#endif
                s[i * CN + j] = seen ? s[i * CN + j] : EMPTY_ROW;
                mx = fmax(mx, s[i * CN + j]);
            }
            red[me.tx * ROWS + me.ty * RM + i] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the maxima are in, and K is read */
        float rescale[RM];
        for (uint i = 0; i < RM; ++i) {
            float tile_max = EMPTY_ROW;
            for (uint x = 0; x < SPLIT; ++x)
                tile_max = fmax(tile_max, red[x * ROWS + me.ty * RM + i]);
            const float m_new = fmax(m[i], tile_max);
            rescale[i] = exp(m[i] - m_new);
            m[i] = m_new;
#if MODS & MOD_DROPOUT
            float kept_sum = 0.0f; /* l is the undropped sum */
#endif
            for (uint j = 0; j < CN; ++j) {
                /* Masked scores are exactly EMPTY_ROW; their weight is 0
                 * even while the row's max is EMPTY_ROW too. */
                float p = s[i * CN + j] == EMPTY_ROW ? 0.0f : exp(s[i * CN + j] - m_new);
#if MODS & MOD_DROPOUT
                kept_sum += p;
                p *= DROP(r0 + row_in(me, i), t0 + me.tx + SPLIT * j, head, b);
#endif
                s[i * CN + j] = p;
            }
#if MODS & MOD_DROPOUT
            red[(SPLIT + me.tx) * ROWS + me.ty * RM + i] = kept_sum;
#endif
        }
        put_weights(ws, s, me);
        if (ONE_KV) {
            put_tile(vs, nv);
            if (more)
                fetch_tile(nv, v, v_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint i = 0; i < RM; ++i) {
            l[i] *= rescale[i];
            for (uint e = 0; e < NC4 * 4; ++e)
                acc[i * NC4 * 4 + e] *= rescale[i];
#if MODS & MOD_DROPOUT
            for (uint x = 0; x < SPLIT; ++x)
                l[i] += red[(SPLIT + x) * ROWS + me.ty * RM + i];
#endif
        }
#if MODS & MOD_DROPOUT
        micro_axpy(acc, 0, ws, vs, me);
#else
        micro_axpy(acc, l, ws, vs, me);
#endif
    }
    for (uint i = 0; i < RM; ++i) {
        const uint pos = r0 + row_in(me, i);
        if (pos >= q_seq)
            break;
#if MODS & MOD_SINK
        const float r = sink_fold(&m[i], &l[i], SINK(head));
#else
        const float r = 1.0f;
#endif
        store_acc(o, o_off, b, q_seq, pos, num_heads, head, acc, i,
                  l[i] != 0.0f ? r / l[i] : ZERO_SUM(pos, 0.0f), 0, me);
        if (me.tx == 0) {
            const ulong row = lse_off + 2 * row_of(b, q_seq, pos, num_heads, head);
            lse[row] = l[i] != 0.0f ? m[i] : ZERO_SUM(pos, EMPTY_ROW);
            lse[row + 1] = l[i] != 0.0f ? log(l[i]) : ZERO_SUM(pos, EMPTY_ROW);
        }
    }
}

/* dQ of the group's query rows: sum over their keys of scale * dS * K[t]. */
inline void grad_q_block(__global const elem *q, ulong q_off, __global const elem *k,
                         ulong k_off, __global const elem *v, ulong v_off,
                         __global const elem *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global elem *dq, ulong dq_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    __local float *qs = tiles, *os = qs + ROWS * DS, *ks = os + ROWS * DS, *vs = ks + TILE * DS;
    __local float *ws = vs + TILE * DS;
    const uint head = get_group_id(1), b = get_group_id(2);
    const lane me = lane_of();
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint last = min(r0 + ROWS, q_seq) - 1u;
    barrier(CLK_LOCAL_MEM_FENCE);
    load_block(qs, ROWS, q, q_off, b, q_seq, r0, q_seq, num_heads, head, scale);
    load_block(os, ROWS, d_out, d_out_off, b, q_seq, r0, q_seq, num_heads, head, 1.0f);
    float acc[RM * NC4 * 4], m[RM], l[RM], ds[RM];
    for (uint e = 0; e < RM * NC4 * 4; ++e)
        acc[e] = 0.0f;
    for (uint i = 0; i < RM; ++i) {
        const uint pos = r0 + row_in(me, i);
        const ulong row = row_of(b, q_seq, pos < q_seq ? pos : 0u, num_heads, head);
        m[i] = lse[lse_off + 2 * row];
        l[i] = lse[lse_off + 2 * row + 1];
        ds[i] = dsum[dsum_off + row];
    }
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    float nk[PF], nv[PF]; /* the next tile */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        barrier(CLK_LOCAL_MEM_FENCE);
        put_tile(ks, nk);
        put_tile(vs, nv);
        barrier(CLK_LOCAL_MEM_FENCE);
        fetch_pair(nk, nv, k, k_off, v, v_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
        float s[RM * CN], dp[RM * CN];
        micro_dots(s, qs, ks, me);
        micro_dots(dp, os, vs, me);
        const bool whole = keys_whole(r0, last, t0, hi, causal, window, delta);
        for (uint i = 0; i < RM; ++i) {
            const uint pos = r0 + row_in(me, i);
            for (uint j = 0; j < CN; ++j) {
                const uint t = t0 + me.tx + SPLIT * j;
                const uint e = i * CN + j;
                s[e] = grad_score(s[e], dp[e], m[i], l[i], ds[i],
                                  t < hi && (whole || visible(pos, t, causal, window, delta)),
                                  pos, t, head, b, SHAPE_PASS);
            }
        }
        put_weights(ws, s, me);
        barrier(CLK_LOCAL_MEM_FENCE);
        micro_axpy(acc, 0, ws, ks, me);
    }
    for (uint i = 0; i < RM; ++i) {
        const uint pos = r0 + row_in(me, i);
        if (pos >= q_seq)
            break;
        store_acc(dq, dq_off, b, q_seq, pos, num_heads, head, acc, i, scale, accumulate, me);
    }
}

/* The key side of the group's key rows, over the queries of its KV head's
 * group that see them: dV = sum of P * dO (where dv is not NULL) and dK =
 * scale * sum of dS * Q (where dk is not NULL), one score and dP a pair for
 * both; and where ds is not NULL, each pair's dS (0 where the masks hide
 * it) into the dS scratch, for grad-Q. Heads and batch elements come from
 * the global ids, so that a launch may cover a part of them. */
inline void key_block(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
                      __global const elem *v, ulong v_off, __global const elem *d_out,
                      ulong d_out_off, __global const float *lse, ulong lse_off,
                      __global const float *dsum, ulong dsum_off, __global elem *dk, ulong dk_off,
                      __global elem *dv, ulong dv_off, __global float *ds, SHAPE_ARGS,
                      __local float *tiles, uint r0)
{
    __local float *ks = tiles, *vs = ks + ROWS * DS, *qs = vs + ROWS * DS, *os = qs + TILE * DS;
    __local float *pw = os + TILE * DS, *dw = pw + TILE * WS, *mt = dw + TILE * WS;
    __local float *lt = mt + TILE, *dt = lt + TILE;
    const uint kv_head = get_global_id(1), b = get_global_id(2);
    const lane me = lane_of();
    const uint group = num_heads / num_kv_heads;
    const uint last = min(r0 + ROWS, kv_seq) - 1u;
    barrier(CLK_LOCAL_MEM_FENCE);
    load_block(ks, ROWS, k, k_off, b, kv_seq, r0, kv_seq, num_kv_heads, kv_head, scale);
    if (dk)
        load_block(vs, ROWS, v, v_off, b, kv_seq, r0, kv_seq, num_kv_heads, kv_head, 1.0f);
    float acc_k[RM * NC4 * 4], acc_v[RM * NC4 * 4];
    for (uint e = 0; e < RM * NC4 * 4; ++e)
        acc_k[e] = acc_v[e] = 0.0f;
    uint lo, hi;
    queries_of_keys(r0, last, q_seq, causal, window, delta, &lo, &hi);
    const uint heads_end = (kv_head + 1u) * group;
    float nq[PF], no[PF]; /* the next tile */
    /* Under the caller's mask, the (head, query tile) steps its block map
     * hides are skipped: the loops step over them (SHOWN_ROWS), and each
     * prefetch is of the next step shown. */
    FETCH_FIRST_QUERIES(nq, no, q, q_off, d_out, d_out_off, lo, hi, r0, last);
    for (uint head = kv_head * group; head < heads_end; ++head) {
        for (uint p0 = SHOWN_ROWS(lo, TILE, hi, r0, last, head, 1u); p0 < hi;
             p0 = SHOWN_ROWS(p0 + TILE, TILE, hi, r0, last, head, 1u)) {
            barrier(CLK_LOCAL_MEM_FENCE);
            put_tile(qs, nq);
            put_tile(os, no);
            load_stats(mt, lt, dt, lse, lse_off, dk ? dsum : 0, dsum_off, b, q_seq, p0, hi,
                       num_heads, head);
            barrier(CLK_LOCAL_MEM_FENCE);
            FETCH_NEXT_QUERIES(nq, no, q, q_off, d_out, d_out_off, head, p0, lo, hi, r0, last);
            float s[RM * CN], dp[RM * CN];
            micro_dots(s, ks, qs, me);
            if (dk)
                micro_dots(dp, vs, os, me);
            __global float *dsh =
                ds ? ds + ds_head(b, head, group, q_seq, kv_seq) : 0;
            const bool whole =
                all_visible(p0, min(p0 + TILE, hi) - 1u, r0, last, causal, window, delta);
            for (uint i = 0; i < RM; ++i) {
                const uint t = r0 + row_in(me, i);
                for (uint j = 0; j < CN; ++j) {
                    const uint jj = me.tx + SPLIT * j, pos = p0 + jj, e = i * CN + j;
                    float dz = 1.0f;
#if SHAPED
                    s[e] = MODIFY(s[e], pos, t, head, b, &dz);
#endif
                    /* unseen pairs weigh exactly 0: a NaN in a row they
                     * pair must not reach it */
                    const bool seen = pos < hi && (whole || visible(pos, t, causal, window, delta));
                    const float p = exp(min0(s[e] - mt[jj]) - lt[jj]);
#if MODS & MOD_DROPOUT
                    const float keep = DROP(pos, t, head, b);
#else
                    const float keep = 1.0f;
#endif
                    if (dk)
                        dp[e] = seen ? p * (dp[e] * keep - dt[jj]) * dz : 0.0f;
                    s[e] = seen ? p * keep : 0.0f;
                    if (dsh && pos < hi && t < kv_seq)
                        dsh[(ulong)t * q_seq + pos] = dp[e];
                }
            }
            if (dv)
                put_weights(pw, s, me);
            if (dk)
                put_weights(dw, dp, me);
            barrier(CLK_LOCAL_MEM_FENCE);
            if (dv)
                micro_axpy(acc_v, 0, pw, os, me);
            if (dk)
                micro_axpy(acc_k, 0, dw, qs, me);
        }
    }
    for (uint i = 0; i < RM; ++i) {
        const uint t = r0 + row_in(me, i);
        if (t >= kv_seq)
            break;
        if (dv)
            store_acc(dv, dv_off, b, kv_seq, t, num_kv_heads, kv_head, acc_v, i, 1.0f,
                      accumulate, me);
        if (dk)
            store_acc(dk, dk_off, b, kv_seq, t, num_kv_heads, kv_head, acc_k, i, scale,
                      accumulate, me);
    }
}

/* The dS scratch's weights of the key tile from t0 for the group's query
 * rows r0 .. last: PW floats a work-item, 0 where the masks hide the pair
 * (grad_kvs__tiled wrote no dS there; tiles they leave whole skip the
 * test), past `hi` and past q_seq. Where ROWS is a multiple of 4, chunk
 * i = id + u * LANES (u < PW4) is the four rows from 4 (i % (ROWS / 4))
 * against key t0 + i / (ROWS / 4), one vector load where `vec` (q_seq and
 * the scratch's offset multiples of 4); else float i is row i % ROWS
 * against key t0 + i / ROWS. */
#if ROWS % 4 == 0
#define PW4 ((TILE * ROWS / 4 + LANES - 1) / LANES)
#define PW (4 * PW4)
#else
#define PW ((TILE * ROWS + LANES - 1) / LANES)
#endif

inline void fetch_ds(float *r, __global const float *dsh, bool vec, uint q_seq, uint r0,
                     uint last, uint t0, uint hi, int causal, uint window, long delta,
                     __global const uchar *mask_blocks, uint b, uint head, uint num_heads,
                     uint kv_seq)
{
    /* Under the caller's mask, the key side skipped the tiles its block map
     * hides: their dS, never written, reads as 0 (a map block holds whole
     * float4s). */
#if HIDING
    const bool whole = false;
#define MAP_HIDES(pos, t) (!map_shows(mask_blocks, b, head, num_heads, q_seq, kv_seq, pos, pos, t, t))
#else
    const bool whole = keys_whole(r0, last, t0, hi, causal, window, delta);
#define MAP_HIDES(pos, t) false
#endif
#if ROWS % 4 == 0
    for (uint u = 0; u < PW4; ++u) {
        const uint i = get_local_id(0) + u * LANES, pos = r0 + 4 * (i % (ROWS / 4));
        const uint t = t0 + i / (ROWS / 4);
        __global const float *src = dsh + (ulong)t * q_seq + pos;
        float4 x = 0.0f;
        if (i < TILE * ROWS / 4 && t < hi && pos < q_seq) {
            if (vec)
                x = *(__global const float4 *)src;
            else
                x = (float4)(src[0], pos + 1 < q_seq ? src[1] : 0.0f,
                             pos + 2 < q_seq ? src[2] : 0.0f, pos + 3 < q_seq ? src[3] : 0.0f);
            if (MAP_HIDES(pos, t))
                x = 0.0f;
            if (!whole) {
                x.x = visible(pos, t, causal, window, delta) ? x.x : 0.0f;
                x.y = visible(pos + 1, t, causal, window, delta) ? x.y : 0.0f;
                x.z = visible(pos + 2, t, causal, window, delta) ? x.z : 0.0f;
                x.w = visible(pos + 3, t, causal, window, delta) ? x.w : 0.0f;
            }
        }
        r[4 * u] = x.x;
        r[4 * u + 1] = x.y;
        r[4 * u + 2] = x.z;
        r[4 * u + 3] = x.w;
    }
#else
    for (uint u = 0; u < PW; ++u) {
        const uint i = get_local_id(0) + u * LANES, pos = r0 + i % ROWS, t = t0 + i / ROWS;
        r[u] = i < TILE * ROWS && t < hi && pos < q_seq &&
                       (whole || visible(pos, t, causal, window, delta)) && !MAP_HIDES(pos, t)
                   ? dsh[(ulong)t * q_seq + pos]
                   : 0.0f;
    }
#endif
#undef MAP_HIDES
}
#define FETCH_DS(r, t0)                                                                      \
    fetch_ds((r), dsh, vec, q_seq, r0, last, (t0), hi, causal, window, delta, mask_blocks, b, head, \
             num_heads, kv_seq)

/* fetch_ds's floats into the weights' slots (put_weights's). */
inline void put_ds(__local float *ws, const float *r)
{
    for (uint u = 0; u < PW; ++u) {
#if ROWS % 4 == 0
        const uint i = get_local_id(0) + u / 4 * LANES;
        const uint t = i / (ROWS / 4), row = 4 * (i % (ROWS / 4)) + u % 4;
        if (i < TILE * ROWS / 4)
#else
        const uint i = get_local_id(0) + u * LANES, t = i / ROWS, row = i % ROWS;
        if (i < TILE * ROWS)
#endif
            ws[t * WS + row % (ROWS / RM) * RM + row / (ROWS / RM)] = r[u];
    }
}

/* dQ of the group's query rows from the dS scratch: sum over their keys of
 * scale * dS * K[t], a matrix product; the scores are not computed again.
 * Heads and batch elements come from the global ids (key_block's part). */
inline void grad_q_ds_block(__global const elem *k, ulong k_off, __global const float *ds,
                            ulong ds_off, __global elem *dq, ulong dq_off, SHAPE_ARGS,
                            __local float *tiles, uint r0)
{
    __local float *ks = tiles, *ws = ks + TILE * DS;
    const uint head = get_global_id(1), b = get_global_id(2);
    const lane me = lane_of();
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint last = min(r0 + ROWS, q_seq) - 1u;
    __global const float *dsh = ds + ds_off + ds_head(b, head, 1u, q_seq, kv_seq);
    const bool vec = ((ds_off | q_seq) & 3u) == 0;
    float acc[RM * NC4 * 4];
    for (uint e = 0; e < RM * NC4 * 4; ++e)
        acc[e] = 0.0f;
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    float nk[PF], nw[PW]; /* the next tile */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    if (lo < hi) {
        fetch_tile(nk, k, k_off, b, kv_seq, lo, hi, num_kv_heads, kv_head);
        FETCH_DS(nw, lo);
    }
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        barrier(CLK_LOCAL_MEM_FENCE);
        put_tile(ks, nk);
        put_ds(ws, nw);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (next < hi) {
            fetch_tile(nk, k, k_off, b, kv_seq, next, hi, num_kv_heads, kv_head);
            FETCH_DS(nw, next);
        }
        micro_axpy(acc, 0, ws, ks, me);
    }
    for (uint i = 0; i < RM; ++i) {
        const uint pos = r0 + row_in(me, i);
        if (pos >= q_seq)
            break;
        store_acc(dq, dq_off, b, q_seq, pos, num_heads, head, acc, i, scale, accumulate, me);
    }
}

inline void grad_v_block(__global const elem *d_out, ulong d_out_off, __global const elem *q,
                         ulong q_off, __global const elem *k, ulong k_off,
                         __global const float *lse, ulong lse_off, __global elem *dv,
                         ulong dv_off, SHAPE_ARGS, __local float *tiles, uint r0)
{
    key_block(q, q_off, k, k_off, 0, 0, d_out, d_out_off, lse, lse_off, 0, 0, 0, 0, dv, dv_off, 0,
              SHAPE_PASS, tiles, r0);
}

inline void grad_k_block(__global const elem *q, ulong q_off, __global const elem *k,
                         ulong k_off, __global const elem *v, ulong v_off,
                         __global const elem *d_out, ulong d_out_off,
                         __global const float *lse, ulong lse_off, __global const float *dsum,
                         ulong dsum_off, __global elem *dk, ulong dk_off, SHAPE_ARGS,
                         __local float *tiles, uint r0)
{
    key_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum, dsum_off, dk,
              dk_off, 0, 0, 0, SHAPE_PASS, tiles, r0);
}

#endif
