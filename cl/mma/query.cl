/* ---- forward --------------------------------------------------------- */

/* The warp's 16 x TILE scores s to their weights exp(s * unit - n), n the
 * row's running max (n0 for rows g, n1 for g + 8), and the weights' sums
 * added to *l0, *l1; `masked`: scores equal to EMPTY_ROW weigh 0. */
inline void exp_rows(float *s, float n0, float n1, float unit, bool masked, float *l0,
                     float *l1)
{
    float sum0 = 0.0f, sum1 = 0.0f;
    UNROLL
    for (uint j = 0; j < NT * 4; ++j) {
        const float e = EXPU(fma(s[j], unit, -((j & 2) ? n1 : n0)));
        s[j] = masked && s[j] == EMPTY_ROW ? 0.0f : e;
        if (j & 2)
            sum1 += s[j];
        else
            sum0 += s[j];
    }
    *l0 += sum0;
    *l1 += sum1;
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
forward__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
             __global const elem *v, ulong v_off, __global elem *o, ulong o_off,
             __global float *lse, ulong lse_off, SHAPE_ARGS, __local float *tiles)
{
    q += q_off;
    k += k_off;
    v += v_off;
    o += o_off;
    lse += lse_off;
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    tiles = tile_base(tiles);
    const float unit = SCORE_UNIT(scale);
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    const uint head = group_head(bias_dims, causal), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal, bias_dims);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;
    const float slope = SLOPE(head);

    frag qf[KS][4]; /* Q (times scale for fp32): this lane's part of its rows and columns */
    UNROLL
    for (uint ks = 0; ks < KS; ++ks)
        load_a(qf[ks], q, b, q_seq, row0, num_heads, head, d0 + ks * KSTEP, scale);
    float acc[KW][4];
    zero(&acc[0][0], KW * 4);
    float m0 = EMPTY_ROW, m1 = EMPTY_ROW, l0 = 0.0f, l1 = 0.0f;

    const uint last = min(r0 + WG_ROWS, q_seq) - 1u;
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    stream st;
    stream_init(&st, tiles);
    /* tiles the caller's mask hides whole are skipped (SHOWN_KEYS) */
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    stream_first(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, lo, hi, num_kv_heads,
                 kv_head, lo < hi);
    uint pa[PA_STEPS][4]; /* P's A fragments while its P V is in flight (wgmma) */
    UNROLL
    for (uint kk = 0; kk < PA_STEPS; ++kk)
        pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        stream_land(&st, false);
        times_wait(&acc[0][0], pa); /* the last tile's P V */
        stream_ready();
        if (next < hi)
            stream_next(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, next, hi,
                        num_kv_heads, kv_head);
        __local const float *kt = st.xt, *vt = st.yt;

        float bv[NT * 4]; /* the bias's values: loads in flight beside the products */
        BIAS_LANE(bv, row0, t0, false, head);
        uint kb[DROP_WORDS]; /* dropout's keep bits, drawn before the scores are live */
#if MODS & MOD_DROPOUT
        keep_queries(kb, t0, row0, head, b, delta, emu, MOD_PASS);
#endif
        float s[NT][4];
        scores(&s[0][0], 0, &qf[0][0], 0, kt, 0, d0, xch, emu);
#if SHAPED
        float dz[NT * 4]; /* unused: the forward needs no derivative */
        modify_lane(&s[0][0], dz, PRE(scale), (long)row0 + delta - (long)t0 - 2 * (long)t, 1.0f,
                    softcap, slope);
        USER_LANE(&s[0][0], dz, bv, row0, t0, false, head);
#endif
        /* Only tiles that some row sees in part are masked. */
        const bool whole =
            t0 + TILE <= hi && all_visible(r0, last, t0, t0 + TILE - 1u, causal, window, delta);
        if (!whole) {
            UNROLL
            for (uint n = 0; n < NT; ++n) {
                UNROLL
                for (int i = 0; i < 4; ++i) {
                    const uint key = t0 + n * 8 + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
                    if (key >= hi || !visible(row, key, causal, window, delta))
                        s[n][i] = EMPTY_ROW;
                }
            }
        }
        float mx0 = EMPTY_ROW, mx1 = EMPTY_ROW;
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            mx0 = fmax(mx0, fmax(s[n][0], s[n][1]));
            mx1 = fmax(mx1, fmax(s[n][2], s[n][3]));
        }
        /* the tile's row maxima, in the units of exp: a positive scale
         * keeps the max */
        const float x0 = row_max(mx0, emu) * unit, x1 = row_max(mx1, emu) * unit;
        const float n0 = fmax(m0, x0), n1 = fmax(m1, x1);
        if (n0 != m0 || n1 != m1) { /* the lane's own registers: no warp-wide step */
            const float c0 = EXPU(m0 - n0), c1 = EXPU(m1 - n1);
            l0 *= c0;
            l1 *= c1;
            UNROLL
            for (uint n = 0; n < KW; ++n) {
                acc[n][0] *= c0;
                acc[n][1] *= c0;
                acc[n][2] *= c1;
                acc[n][3] *= c1;
            }
        }
        m0 = n0;
        m1 = n1;
        /* Masked scores are exactly EMPTY_ROW; their weight is 0 even
         * while the row's max is EMPTY_ROW too. Whole tiles have none. */
        if (whole)
            exp_rows(&s[0][0], n0, n1, unit, false, &l0, &l1);
        else
            exp_rows(&s[0][0], n0, n1, unit, true, &l0, &l1);
#if MODS & MOD_DROPOUT /* l0 and l1 are the undropped sums */
        UNROLL
        for (uint j = 0; j < NT * 4; ++j)
            (&s[0][0])[j] *= KEEP_GAIN(kb, j);
#endif
        times_issue(&acc[0][0], pa, &s[0][0], vt, d0, emu);
        stream_advance(&st, tiles, false);
    }
    times_wait(&acc[0][0], pa);
    l0 = row_sum(l0, emu);
    l1 = row_sum(l1, emu);
    /* The head's sink joins both rows' sums (in the units of exp); f0 and
     * f1: what their sums of V take. */
    float f0 = 1.0f, f1 = 1.0f;
#if MODS & MOD_SINK
    const float su = SINK(head) * EXP_UNIT;
    const float s0 = m0 > su ? m0 : su, s1 = m1 > su ? m1 : su;
    f0 = EXPU(m0 - s0);
    f1 = EXPU(m1 - s1);
    l0 = l0 * f0 + EXPU(su - s0);
    l1 = l1 * f1 + EXPU(su - s1);
    m0 = s0;
    m1 = s1;
#endif
    /* What each row writes where its weights sum to 0: once a row, outside
     * the unrolled stores. */
    const float z0 = ZERO_SUM(row0, 0.0f), z1 = ZERO_SUM(row1, 0.0f);
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            const float l = (i & 2) ? l1 : l0, f = (i & 2) ? f1 : f0;
            if (row < q_seq && d < D)
                STORE(o, at(b, q_seq, row, num_heads, head, d),
                      l != 0.0f ? acc[n][i] * f / l : (i & 2) ? z1 : z0);
        }
    }
    if (t == 0 && d0 == 0)
        for (int i = 0; i < 2; ++i) {
            const uint row = i ? row1 : row0;
            const float l = i ? l1 : l0, m = i ? m1 : m0;
            if (row < q_seq) {
                const ulong at_row = 2 * (((ulong)b * q_seq + row) * num_heads + head);
                lse[at_row] = l != 0.0f ? m / EXP_UNIT : ZERO_SUM(row, EMPTY_ROW);
                lse[at_row + 1] = l != 0.0f ? log(l) : ZERO_SUM(row, EMPTY_ROW);
            }
        }
}

/* ---- grad-Q ---------------------------------------------------------- */

/* dS = P * (dP - Dsum) into s, from the warp's 16 x TILE scores s and dP
 * of keys t0.., rows row0 (m[0], l[0], ds_row[0]) and row0 + 8 ([1]);
 * `masked`: keys past hi or not visible get 0. */
inline void ds_of_rows(float *s, const float *dp, const float *m, const float *l,
                       const float *ds_row, float unit, bool masked, uint t0, uint hi, uint row0,
                       int causal, uint window, long delta, const uint *kb,
                       const float *dz, MOD_ARGS)
{
    const uint t = get_local_id(0) & 3u;
#if DTYPE != 0 && FOLD_ML
    const float ml[2] = {m[0] + l[0], m[1] + l[1]};
#endif
    UNROLL
    for (uint j = 0; j < NT * 4; ++j) {
        const uint key = t0 + j / 4 * 8 + 2 * t + (j & 1), row = row0 + ((j & 2) ? 8u : 0u);
        const int r = (j & 2) ? 1 : 0;
        const float x = s[j];
        float g = 1.0f;
#if MODS & MOD_DROPOUT
        g = KEEP_GAIN(kb, j);
#endif
#if DTYPE != 0 && FOLD_ML
        const float p = EXPU(min0(fma(x, unit, -ml[r]))); /* ml = m + l */
#else
        const float p = EXPU(min0(fma(x, unit, -m[r])) - l[r]);
#endif
        const bool keep = !masked || (key < hi && visible(row, key, causal, window, delta));
#if MODS
        s[j] = keep ? p * (g * dp[j] - ds_row[r]) * dz[j] : 0.0f;
#else
        s[j] = keep ? p * (dp[j] - ds_row[r]) : 0.0f;
#endif
    }
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_q__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
            __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
            __global const float *lse, ulong lse_off, __global const float *dsum,
            ulong dsum_off, __global elem *dq, ulong dq_off, SHAPE_ARGS,
            __local float *tiles)
{
    q += q_off;
    k += k_off;
    v += v_off;
    d_out += d_out_off;
    lse += lse_off;
    dsum += dsum_off;
    dq += dq_off;
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    tiles = tile_base(tiles);
    const float unit = SCORE_UNIT(scale);
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    /* S = Q K^T, dP = dO V^T and dS K */
    const uint head = group_head(bias_dims, causal), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal, bias_dims);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;
    const float slope = SLOPE(head);

    frag qf[KS][4], of[KS][4];
    float acc[KW][4];
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        load_a(qf[ks], q, b, q_seq, row0, num_heads, head, d0 + ks * KSTEP, scale);
        load_a(of[ks], d_out, b, q_seq, row0, num_heads, head, d0 + ks * KSTEP, 1.0f);
    }
    zero(&acc[0][0], KW * 4);
    float m[2], l[2], ds_row[2];
    for (int i = 0; i < 2; ++i) {
        const uint row = min(i ? row1 : row0, q_seq - 1u);
        const ulong at_row = ((ulong)b * q_seq + row) * num_heads + head;
        m[i] = lse[2 * at_row] * EXP_UNIT;
        l[i] = lse[2 * at_row + 1] * EXP_UNIT;
        ds_row[i] = dsum[at_row];
    }

    const uint last = min(r0 + WG_ROWS, q_seq) - 1u;
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, delta, &lo, &hi);
    stream st;
    stream_init(&st, tiles);
    lo = SHOWN_KEYS(lo, TILE, hi, r0, last, head);
    stream_first(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, lo, hi, num_kv_heads,
                 kv_head, lo < hi);
    for (uint t0 = lo, next; t0 < hi; t0 = next) {
        next = SHOWN_KEYS(t0 + TILE, TILE, hi, r0, last, head);
        stream_land(&st, false);
        stream_ready();
        if (next < hi)
            stream_next(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, next, hi,
                        num_kv_heads, kv_head);
        __local const float *kt = st.xt, *vt = st.yt;

        float bv[NT * 4]; /* the bias's values: loads in flight beside the products */
        BIAS_LANE(bv, row0, t0, false, head);
        uint kb[DROP_WORDS]; /* dropout's keep bits, drawn before the scores are live */
#if MODS & MOD_DROPOUT
        keep_queries(kb, t0, row0, head, b, delta, emu, MOD_PASS);
#endif
        float s[NT][4], dp[NT][4], dz[NT * 4];
        scores(&s[0][0], &dp[0][0], &qf[0][0], &of[0][0], kt, vt, d0, xch, emu);
#if SHAPED
        modify_lane(&s[0][0], dz, PRE(scale), (long)row0 + delta - (long)t0 - 2 * (long)t, 1.0f,
                    softcap, slope);
        USER_LANE(&s[0][0], dz, bv, row0, t0, false, head);
#else
        UNROLL
        for (uint j = 0; j < NT * 4; ++j)
            dz[j] = 1.0f;
#endif
        const bool whole =
            t0 + TILE <= hi && all_visible(r0, last, t0, t0 + TILE - 1u, causal, window, delta);
        /* whole tiles skip the mask's tests */
        if (whole)
            ds_of_rows(&s[0][0], &dp[0][0], m, l, ds_row, unit, false, t0, hi, row0, causal,
                       window, delta, kb, dz, MOD_PASS);
        else
            ds_of_rows(&s[0][0], &dp[0][0], m, l, ds_row, unit, true, t0, hi, row0, causal,
                       window, delta, kb, dz, MOD_PASS);
        times(&acc[0][0], &s[0][0], kt, 0, 0, 0, d0, emu);
        stream_advance(&st, tiles, false);
    }
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            if (row < q_seq && d < D)
                STORE_GRAD(dq, at(b, q_seq, row, num_heads, head, d), scale * acc[n][i],
                           accumulate);
        }
    }
}

