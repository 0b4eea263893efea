/* ---- query side -------------------------------------------------------- */

/* The block's rows: Q (or dO) row offsets, clamped to a valid row past the
 * last, their positions and which rows are real (per half), and the keys
 * [t_lo, t_hi) that any of them may see. */
typedef struct rows {
    ulong row[QB];
    uint16 pos[2];
    int16 live[2];
    uint n, t_lo, t_hi;
} rows;

inline void rows_of(rows *r, uint q_seq, uint kv_seq, uint num_heads, int causal, uint window,
                    long delta)
{
    const uint pos0 = get_global_id(0) * QB, head = get_global_id(1), b = get_global_id(2);
    r->n = min((uint)QB, q_seq - pos0);
    const uint last = pos0 + r->n - 1;
    for (uint i = 0; i < QB; ++i)
        r->row[i] = ((ulong)b * q_seq + min(pos0 + i, last)) * num_heads + head;
    for (uint h = 0; h < 2; ++h) {
        r->pos[h] = pos0 + 16 * h + lane_ids();
        r->live[h] = 16 * h + lane_ids() < r->n;
    }
    keys_of_queries(pos0, last, kv_seq, causal, window, delta, &r->t_lo, &r->t_hi);
}

/* The rows of keys [t0, t0 + KB) of one KV head, clamped below t_hi. */
inline void key_rows(ulong *keys, uint b, uint kv_seq, uint num_kv_heads, uint kv_head, uint t0,
                     uint t_hi)
{
    for (uint j = 0; j < KB; ++j)
        keys[j] = (((ulong)b * kv_seq + min(t0 + j, t_hi - 1)) * num_kv_heads + kv_head) * D;
}

/* The scores of a tile's KB keys against the block's QB rows, both halves. */
inline void tile_scores(SRC *kx, const ulong *at, const float *qt, float16 *lo, float16 *hi)
{
    dots8(kx, at, qt, lo, hi);
    dots8(kx, at + 8, qt, lo + 8, hi + 8);
}

__kernel void forward__blocked(__global const elem *q, ulong q_off, __global const elem *k,
                               ulong k_off, __global const elem *v, ulong v_off,
                               __global elem *o, ulong o_off, __global float *lse,
                               ulong lse_off, SHAPE_ARGS, __local float *unused)
{
    if (get_global_id(0) * QB >= q_seq)
        return;
    q += q_off;
    k += k_off;
    v += v_off;
    o += o_off;
    lse += lse_off;
    rows r;
    rows_of(&r, q_seq, kv_seq, num_heads, causal, window, delta);
    const uint b = get_global_id(2), kv_head = get_global_id(1) / (num_heads / num_kv_heads);
    const uint head = get_global_id(1);
    ulong qrow[QB];
    for (uint i = 0; i < QB; ++i)
        qrow[i] = r.row[i] * D;
    float qt[D * QB], ot[D * QB];
    transpose_in(q, qrow, QB, qt, QB);
    for (uint i = 0; i < D * QB; ++i)
        ot[i] = 0.0f;
    float16 m[2] = {EMPTY_ROW, EMPTY_ROW}, l[2] = {0.0f, 0.0f};
    const uint pos0 = get_global_id(0) * QB, last = pos0 + r.n - 1u;
    /* the tiles of keys the mask's block map shows (all without one) */
    for (uint t0 = SHOWN_KEYS(r.t_lo, KB, r.t_hi, pos0, last, head); t0 < r.t_hi;
         t0 = SHOWN_KEYS(t0 + KB, KB, r.t_hi, pos0, last, head)) {
        const uint n = min((uint)KB, r.t_hi - t0);
        ulong keys[KB];
        float16 sc[2][KB], rescale[2];
        key_rows(keys, b, kv_seq, num_kv_heads, kv_head, t0, r.t_hi);
        float ks[STAGED(KB)], vs[STAGED(KB)];
        ulong at[KB];
        SRC *kx = stage(ks, k, keys, KB, at);
        SRC *vx = stage(vs, v, keys, KB, at);
        tile_scores(kx, at, qt, sc[0], sc[1]);
        for (uint h = 0; h < 2; ++h) {
            float16 block_max = EMPTY_ROW;
            for (uint j = 0; j < KB; ++j) {
                const int16 keep =
                    r.live[h] & visible16(r.pos[h], (uint16)(t0 + j), causal, window, delta);
                float16 x = sc[h][j] * scale;
#if SHAPED
                float16 dz;
                x = MODIFY16(x, r.pos[h], (uint16)(t0 + j), head, &dz);
#endif
                sc[h][j] = select((float16)EMPTY_ROW, x, j < n ? keep : (int16)0);
                block_max = fmax(block_max, sc[h][j]);
            }
            const float16 m_new = fmax(m[h], block_max);
            rescale[h] = exp(m[h] - m_new);
            float16 sum = 0.0f;
            for (uint j = 0; j < KB; ++j) {
                /* Masked scores are exactly EMPTY_ROW; their weight is 0
                 * even while the row's max is EMPTY_ROW too. */
                sc[h][j] = select(exp(sc[h][j] - m_new), (float16)0.0f, sc[h][j] == EMPTY_ROW);
                sum += sc[h][j];
#if MODS & MOD_DROPOUT
                sc[h][j] *= DROP16(r.pos[h], (uint16)(t0 + j), head, b); /* l: undropped */
#endif
            }
            l[h] = l[h] * rescale[h] + sum;
            m[h] = m_new;
        }
        add_rows(ot, vx, at, sc[0], sc[1], n, rescale[0], rescale[1]);
    }
    float16 fold[2] = {1.0f, 1.0f}; /* what O's sums take: 1 without a sink */
#if MODS & MOD_SINK
    for (uint h = 0; h < 2; ++h) {
        const float sigma = SINK(head);
        const float16 m_new = select((float16)sigma, m[h], m[h] > sigma);
        fold[h] = exp(m[h] - m_new);
        l[h] = l[h] * fold[h] + exp(sigma - m_new);
        m[h] = m_new;
    }
#endif
    float lv[QB], mv[QB];
    for (uint h = 0; h < 2; ++h) {
        vstore16(l[h], h, lv);
        vstore16(m[h], h, mv);
    }
    float zero[QB]; /* what a row whose weights sum to 0 writes to O */
    for (uint i = 0; i < QB; ++i)
        zero[i] = ZERO_SUM(get_global_id(0) * QB + i, 0.0f);
    for (uint h = 0; 16 * h < r.n; ++h)
        for (uint d = 0; d < D; ++d)
            store16(o, qrow + 16 * h, min(r.n - 16 * h, 16u), d,
                    select(vload16(h, zero), vload16(h, ot + d * QB) * fold[h] / l[h],
                           l[h] != 0.0f),
                    0);
    for (uint i = 0; i < r.n; ++i) {
        const float empty = zero[i] == 0.0f ? EMPTY_ROW : zero[i];
        lse[2 * r.row[i]] = lv[i] != 0.0f ? mv[i] : empty;
        lse[2 * r.row[i] + 1] = lv[i] != 0.0f ? log(lv[i]) : empty;
    }
}

__kernel void grad_q__blocked(__global const elem *q, ulong q_off, __global const elem *k,
                              ulong k_off, __global const elem *v, ulong v_off,
                              __global const elem *d_out, ulong d_out_off,
                              __global const float *lse, ulong lse_off,
                              __global const float *dsum, ulong dsum_off, __global elem *dq,
                              ulong dq_off, SHAPE_ARGS, __local float *unused)
{
    if (get_global_id(0) * QB >= q_seq)
        return;
    q += q_off;
    k += k_off;
    v += v_off;
    d_out += d_out_off;
    lse += lse_off;
    dsum += dsum_off;
    dq += dq_off;
    rows r;
    rows_of(&r, q_seq, kv_seq, num_heads, causal, window, delta);
    const uint b = get_global_id(2), kv_head = get_global_id(1) / (num_heads / num_kv_heads);
    const uint head = get_global_id(1);
    ulong qrow[QB];
    float mv[QB], lv[QB], sv[QB];
    for (uint i = 0; i < QB; ++i) {
        qrow[i] = r.row[i] * D;
        mv[i] = lse[2 * r.row[i]];
        lv[i] = lse[2 * r.row[i] + 1];
        sv[i] = dsum[r.row[i]];
    }
    float16 m[2], l[2], ds_row[2];
    for (uint h = 0; h < 2; ++h) {
        m[h] = vload16(h, mv);
        l[h] = vload16(h, lv);
        ds_row[h] = vload16(h, sv);
    }
    float qt[D * QB], dot[D * QB], dqt[D * QB];
    transpose_in(q, qrow, QB, qt, QB);
    transpose_in(d_out, qrow, QB, dot, QB);
    for (uint i = 0; i < D * QB; ++i)
        dqt[i] = 0.0f;
    const uint pos0 = get_global_id(0) * QB, last = pos0 + r.n - 1u;
    for (uint t0 = SHOWN_KEYS(r.t_lo, KB, r.t_hi, pos0, last, head); t0 < r.t_hi;
         t0 = SHOWN_KEYS(t0 + KB, KB, r.t_hi, pos0, last, head)) {
        const uint n = min((uint)KB, r.t_hi - t0);
        ulong keys[KB];
        float16 sc[2][KB], dp[2][KB];
        key_rows(keys, b, kv_seq, num_kv_heads, kv_head, t0, r.t_hi);
        float ks[STAGED(KB)], vs[STAGED(KB)];
        ulong at[KB];
        SRC *kx = stage(ks, k, keys, KB, at);
        SRC *vx = stage(vs, v, keys, KB, at);
        tile_scores(kx, at, qt, sc[0], sc[1]);
        tile_scores(vx, at, dot, dp[0], dp[1]);
        for (uint h = 0; h < 2; ++h)
            for (uint j = 0; j < KB; ++j) {
                const int16 keep =
                    r.live[h] & visible16(r.pos[h], (uint16)(t0 + j), causal, window, delta);
#if MODS
                float16 x = sc[h][j] * scale, dz = 1.0f, g = 1.0f;
#if SHAPED
                x = MODIFY16(x, r.pos[h], (uint16)(t0 + j), head, &dz);
#endif
#if MODS & MOD_DROPOUT
                g = DROP16(r.pos[h], (uint16)(t0 + j), head, b);
#endif
                const float16 p = exp(min0v(x - m[h]) - l[h]);
                sc[h][j] = select((float16)0.0f, scale * p * (g * dp[h][j] - ds_row[h]) * dz,
                                  j < n ? keep : (int16)0);
#else
                const float16 p = exp(min0v(sc[h][j] * scale - m[h]) - l[h]);
                sc[h][j] = select((float16)0.0f, scale * p * (dp[h][j] - ds_row[h]),
                                  j < n ? keep : (int16)0);
#endif
            }
        add_rows(dqt, kx, at, sc[0], sc[1], n, 1.0f, 1.0f);
    }
    for (uint h = 0; 16 * h < r.n; ++h)
        for (uint d = 0; d < D; ++d)
            store16(dq, qrow + 16 * h, min(r.n - 16 * h, 16u), d, vload16(h, dqt + d * QB),
                    accumulate);
}

/* Dsum = dO . O, QB rows per work-item, as the query side takes them. */
__kernel void dsum__blocked(__global const elem *d_out, ulong d_out_off, __global const elem *o,
                            ulong o_off, __global float *dsum, ulong dsum_off, SHAPE_ARGS,
                            __local float *unused)
{
    const uint pos0 = get_global_id(0) * QB, head = get_global_id(1), b = get_global_id(2);
    for (uint pos = pos0; pos < min(pos0 + QB, q_seq); ++pos) {
        const ulong row = ((ulong)b * q_seq + pos) * num_heads + head;
        float sum = 0.0f;
        uint d = 0;
#if DTYPE != 0
        float16 part = 0.0f;
        for (; d + 16 <= D; d += 16)
            part += LOAD16(d_out, d_out_off + row * D + d) * LOAD16(o, o_off + row * D + d);
        float v[16];
        vstore16(part, 0, v);
        for (uint i = 0; i < 16; ++i)
            sum += v[i];
#endif
        for (; d < D; ++d)
            sum += LOAD(d_out, d_out_off + row * D + d) * LOAD(o, o_off + row * D + d);
        dsum[dsum_off + row] = sum;
    }
}
