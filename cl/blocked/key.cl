/* ---- key side ---------------------------------------------------------- */

/* The query rows of a chunk: offsets of their Q and dO rows, positions,
 * LSE and Dsum. */
typedef struct chunk {
    ulong row[CHUNK];
    uint pos[CHUNK], head[CHUNK];
    float m[CHUNK], l[CHUNK], dsum[CHUNK];
    uint n;
} chunk;

inline void chunk_run(chunk *ch, __global const elem *q, __global const elem *d_out,
                      const float *kt, const float *vt, float *dkt, float *dvt, uint t0,
                      uint nt, uint q_seq, uint kv_seq, uint num_heads, int causal, uint window,
                      long delta, float scale, bool want_dk, bool want_dv, uint b, MOD_ARGS)
{
    float16 p[2][CHUNK], ds[2][CHUNK]; /* the block's two halves of keys */
    const uint n = ch->n, n8 = (n + 7u) / 8u * 8u;
    for (uint r = n; r < n8; ++r)
        ch->row[r] = ch->row[0]; /* a valid row; only the first n are used */
    float qs[STAGED(CHUNK)], os[STAGED(CHUNK)];
    ulong at[CHUNK];
    SRC *qx = stage(qs, q, ch->row, n8, at);
    SRC *ox = stage(os, d_out, ch->row, n8, at);
    for (uint r = 0; r < n; r += 8) {
        dots8(qx, at + r, kt, p[0] + r, p[1] + r);
        if (want_dk)
            dots8(ox, at + r, vt, ds[0] + r, ds[1] + r);
    }
    for (uint h = 0; h < 2; ++h) {
        const uint16 t = t0 + 16 * h + lane_ids();
        const int16 live = 16 * h + lane_ids() < nt;
        for (uint r = 0; r < n; ++r) {
            const int16 keep = live & visible16((uint16)ch->pos[r], t, causal, window, delta);
#if MODS
            float16 dz = 1.0f, x = p[h][r] * scale, g = 1.0f;
#if SHAPED
            x = MODIFY16(x, (uint16)ch->pos[r], t, ch->head[r], &dz);
#endif
#if MODS & MOD_DROPOUT
            g = DROP16((uint16)ch->pos[r], t, ch->head[r], b);
#endif
            const float16 e = exp(min0v(x - ch->m[r]) - ch->l[r]);
            p[h][r] = select((float16)0.0f, e * g, keep);
            if (want_dk)
                ds[h][r] =
                    select((float16)0.0f, scale * e * (g * ds[h][r] - ch->dsum[r]) * dz, keep);
#else
            const float16 e = exp(min0v(p[h][r] * scale - ch->m[r]) - ch->l[r]);
            p[h][r] = select((float16)0.0f, e, keep);
            /* masked pairs' dS exactly 0, whatever a NaN elsewhere in the row */
            if (want_dk)
                ds[h][r] = select((float16)0.0f, scale * e * (ds[h][r] - ch->dsum[r]), keep);
#endif
        }
    }
    if (want_dv)
        add_rows(dvt, ox, at, p[0], p[1], n, 1.0f, 1.0f);
    if (want_dk)
        add_rows(dkt, qx, at, ds[0], ds[1], n, 1.0f, 1.0f);
    ch->n = 0;
}

inline void key_job(__global const elem *q, __global const elem *k, __global const elem *v,
                    __global const elem *d_out, __global const float *lse,
                    __global const float *dsum, __global elem *dk, __global elem *dv,
                    uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, int causal,
                    uint window, long delta, float scale, int accumulate, bool want_dk,
                    bool want_dv, MOD_ARGS)
{
    const uint t0 = get_global_id(0) * KK, kv_head = get_global_id(1), b = get_global_id(2);
    if (t0 >= kv_seq)
        return;
    const uint nt = min((uint)KK, kv_seq - t0), group = num_heads / num_kv_heads;
    const ulong kv_row = (ulong)num_kv_heads * D;
    const ulong first = ((ulong)b * kv_seq + t0) * kv_row + (ulong)kv_head * D;
    float kt[D * KK], vt[D * KK], dkt[D * KK], dvt[D * KK];
    ulong keys[KK];
    for (uint j = 0; j < KK; ++j)
        keys[j] = first + min(j, nt - 1) * kv_row;
    transpose_in(k, keys, nt, kt, KK);
    if (want_dk)
        transpose_in(v, keys, nt, vt, KK);
    for (uint i = 0; i < D * KK; ++i)
        dkt[i] = dvt[i] = 0.0f;

    /* The queries that see any key of the block, past the rows the mask's
     * block map hides from it for every head of the group. */
    uint start, end;
    queries_of_keys(t0, t0 + nt - 1, q_seq, causal, window, delta, &start, &end);
    chunk ch;
    ch.n = 0;
    const uint t1 = t0 + nt - 1;
    for (uint pos = SHOWN_ROWS(start, 1u, end, t0, t1, kv_head * group, group); pos < end;
         pos = SHOWN_ROWS(pos + 1u, 1u, end, t0, t1, kv_head * group, group)) {
        for (uint head = kv_head * group; head < (kv_head + 1) * group; ++head) {
            const ulong row = ((ulong)b * q_seq + pos) * num_heads + head;
            ch.row[ch.n] = row * D;
            ch.m[ch.n] = lse[2 * row];
            ch.l[ch.n] = lse[2 * row + 1];
            ch.dsum[ch.n] = want_dk ? dsum[row] : 0.0f;
            ch.pos[ch.n] = pos;
            ch.head[ch.n] = head;
            if (++ch.n == CHUNK)
                chunk_run(&ch, q, d_out, kt, vt, dkt, dvt, t0, nt, q_seq, kv_seq, num_heads,
                          causal, window, delta, scale, want_dk, want_dv, b, MOD_PASS);
        }
    }
    if (ch.n)
        chunk_run(&ch, q, d_out, kt, vt, dkt, dvt, t0, nt, q_seq, kv_seq, num_heads, causal,
                  window, delta, scale, want_dk, want_dv, b, MOD_PASS);
    for (uint h = 0; 16 * h < nt; ++h)
        for (uint d = 0; d < D; ++d) {
            if (want_dv)
                store16(dv, keys + 16 * h, min(nt - 16 * h, 16u), d, vload16(h, dvt + d * KK),
                        accumulate);
            if (want_dk)
                store16(dk, keys + 16 * h, min(nt - 16 * h, 16u), d, vload16(h, dkt + d * KK),
                        accumulate);
        }
}

__kernel void grad_v__blocked(__global const elem *d_out, ulong d_out_off,
                              __global const elem *q, ulong q_off, __global const elem *k,
                              ulong k_off, __global const float *lse, ulong lse_off,
                              __global elem *dv, ulong dv_off, SHAPE_ARGS,
                              __local float *unused)
{
    key_job(q + q_off, k + k_off, k + k_off, d_out + d_out_off, lse + lse_off, lse + lse_off,
            dv + dv_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
            scale, accumulate, false, true, MOD_PASS);
}

__kernel void grad_k__blocked(__global const elem *q, ulong q_off, __global const elem *k,
                              ulong k_off, __global const elem *v, ulong v_off,
                              __global const elem *d_out, ulong d_out_off,
                              __global const float *lse, ulong lse_off,
                              __global const float *dsum, ulong dsum_off, __global elem *dk,
                              ulong dk_off, SHAPE_ARGS, __local float *unused)
{
    key_job(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
            dk + dk_off, dk + dk_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
            scale, accumulate, true, false, MOD_PASS);
}

__kernel void grad_kv__blocked(__global const elem *q, ulong q_off, __global const elem *k,
                               ulong k_off, __global const elem *v, ulong v_off,
                               __global const elem *d_out, ulong d_out_off,
                               __global const float *lse, ulong lse_off,
                               __global const float *dsum, ulong dsum_off, __global elem *dk,
                               ulong dk_off, __global elem *dv, ulong dv_off, SHAPE_ARGS,
                               __local float *unused)
{
    key_job(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
            dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
            scale, accumulate, true, true, MOD_PASS);
}

