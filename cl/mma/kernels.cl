/* ---- score modifiers ---------------------------------------------------- */


/* Scores to the units of exp. Unmodified, fp32's Q carries the scale
 * already and 16-bit scores take it with log2(e) in one product. Modified
 * ones (SHAPED) are held as y, the modified score z over MOD_UNIT: the cap
 * where there is one (y = tanh(s / cap) less ALiBi's slope / cap * dist),
 * else PRE, the scale the raw product still lacks (y = raw product less
 * slope / PRE * dist). The cap's and the scale's products then fold into
 * exp's, and each score pays only for its tanh and its bias. */
#define PRE(scale) (DTYPE != 0 ? (scale) : 1.0f)
#if MODS & MOD_SOFTCAP
#define MOD_UNIT(scale) softcap
#else
#define MOD_UNIT(scale) PRE(scale)
#endif
#if SHAPED
#define SCORE_UNIT(scale) (MOD_UNIT(scale) * EXP_UNIT)
#else
#define SCORE_UNIT(scale) (DTYPE != 0 ? (scale) * EXP_UNIT : 1.0f)
#endif

/* The ALiBi slope of a query head (0 without ALiBi). */
#if MODS & MOD_ALIBI
#define SLOPE(head) slopes[head]
#else
#define SLOPE(head) 0.0f
#endif

/* One score modified, in MOD_UNIT: x is the raw product; mul takes it to
 * tanh's argument, x * PRE / cap, where OpenCL's tanh is about 20
 * instructions a score. On the GPU, 16-bit kernels take one
 * tanh.approx.f32 (relative error below 2^-10.9, under half a bf16 ulp);
 * emulated, 1 - 2 / (1 + 2^(2 u log2(e))) by native_exp2 and native_recip;
 * float32 native's form, sign(x) (1 - e) / (1 + e) with e = 2^(-2 |u|
 * log2(e)), one ex2 and one division (an absolute error of a few float32
 * ulps of 1, as the scores' own rounding at the cap's size). In both,
 * mul carries 2 log2(e). Then ALiBi's bias, slope_u = slope / MOD_UNIT
 * times dist. *dz is the derivative of z in the scaled score. */
inline float modify_one(float x, float mul, float slope_u, float dist, float *dz)
{
    float g = 1.0f;
#if MODS & MOD_SOFTCAP
#if DTYPE != 0 && !defined(MMA_EMULATE)
    float th;
    __asm__("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(x * mul));
#elif DTYPE != 0
    const float y = x * mul * (1.0f / TWO_LOG2E);
    const float th = fabs(y) < TANH_SERIES_BELOW
                         ? tanh_series(y)
                         : 1.0f - 2.0f * native_recip(1.0f + native_exp2(x * mul));
#else /* as native: the series, else sign(x) (1 - e) / (1 + e), e = 2^(-|x| mul) */
    const float y = x * mul * (1.0f / TWO_LOG2E);
    const float th = fabs(y) < TANH_SERIES_BELOW ? tanh_series(y)
                                                  : tanh_of_e(x, exp2_ftz(-fabs(x) * mul));
#endif
    x = th;
    g = 1.0f - th * th;
#endif
#if MODS & MOD_ALIBI
    x -= slope_u * dist;
#endif
    *dz = g;
    return x;
}

/* The modified scores (in MOD_UNIT) of a lane's part of a 16 x TILE block,
 * and their derivatives into dz: element j's |P - T| is |base + side *
 * off(j)| with off(j) = (j & 2 ? 8 : 0) - j / 4 * 8 - (j & 1), side 1 for
 * the query side's blocks (rows queries, columns keys: base = row0 + delta
 * - t0 - 2t) and -1 for the key side's (base = p0 + 2t + delta - key0). In
 * float32 from base while that is exact, below 2^23. */
inline void modify_lane(float *s, float *dz, float pre, long base, float side, float softcap,
                        float slope)
{
#if (MODS & MOD_SOFTCAP) && DTYPE != 0 && !defined(MMA_EMULATE)
    const float mul = pre / softcap, slope_u = slope / softcap;
#elif MODS & MOD_SOFTCAP
    const float mul = TWO_LOG2E * pre / softcap, slope_u = slope / softcap;
#else
    const float mul = 1.0f, slope_u = slope / pre;
#endif
#define OFF(j) ((float)(((j) & 2 ? 8 : 0) - (int)((j) / 4 * 8) - (int)((j) & 1)))
    if (base > -(1L << 23) && base < (1L << 23)) {
        const float fb = (float)base;
        UNROLL
        for (uint j = 0; j < NT * 4; ++j)
            s[j] = modify_one(s[j], mul, slope_u, fabs(fb + side * OFF(j)), &dz[j]);
    } else {
        UNROLL
        for (uint j = 0; j < NT * 4; ++j) {
            const long d = base + (long)(side * OFF(j));
            s[j] = modify_one(s[j], mul, slope_u, (float)(d < 0 ? -d : d), &dz[j]);
        }
    }
#undef OFF
}

/* Dropout's keep bits of a lane's scores: bit j of kb[j / 32] for score
 * j of its fragment (n-tile j / 4, row half (j & 2) / 2, column j & 1).
 * Eight consecutive keys of one query share a Philox block, and the lanes
 * that hold them share its draw: each block is drawn by one of them, which
 * passes its eight keep bits (keep_byte) to the others by shuffles, a draw
 * per eight scores. `a`, where the warp's keys start within a block, is 0
 * unless kv_offset (or on the query side a window's first key) is off a
 * multiple of 8; the blocks then straddle the n-tiles (the rows on the key
 * side) and one more block a row (a column) is drawn. Blocks are numbered
 * so that those drawn at a = 0 come first. */
#define DROP_WORDS ((NT * 4 + 31) / 32)
#define QB ((2 * (NT + 1) + 3) / 4) /* blocks a lane draws at most, query side */
#define KB ((6 * NT + 7) / 8)       /* and key side */
#define BYTE_OF(w, i, lanes) (((w)[(i) % (lanes)][(i) / (lanes) / 4] >> ((i) / (lanes) % 4 * 8)) & 0xFFu)

/* Query side: rows row0 and row0 + 8 (queries), columns keys t0 + 8n + 2t
 * + c. Block i = 2m + r holds keys t0 + 8m - a .. of row half r; lane
 * i % 4 of the row's quad draws it. An n-tile's keep bits are a byte of
 * its block and the next one's, shifted by a. */
inline void keep_queries(uint *kb, uint t0, uint row0, uint head, uint b, long delta,
                         __local float *emu, MOD_ARGS)
{
    const uint lane = get_local_id(0) & 31u, t = lane & 3u;
    const uint first = t0 + kv_pos0, a = first & 7u, blocks = a ? 2 * (NT + 1) : 2 * NT;
    uint own[(QB + 3) / 4];
    UNROLL
    for (uint w = 0; w < (QB + 3) / 4; ++w)
        own[w] = 0u;
    UNROLL
    for (uint q = 0; q < QB; ++q) {
        const uint i = 4 * q + t;
        if (i < blocks) {
            const uint4 x = draws(((first >> 3) + i / 2) & 0x1FFFFFFFu, row0 + 8 * (i & 1u), head,
                                  b, delta, kv_pos0, seq0, drop_k0, drop_k1);
            own[q / 4] |= keep_byte(x, drop_thr) << (8 * (q % 4));
        }
    }
    uint got[4][(QB + 3) / 4];
    UNROLL
    for (uint w = 0; w < (QB + 3) / 4; ++w)
        UNROLL
        for (uint src = 0; src < 4; ++src)
            got[src][w] = shfl_idx(own[w], (lane & ~3u) | src, emu);
    UNROLL
    for (uint w = 0; w < DROP_WORDS; ++w)
        kb[w] = 0u;
    UNROLL
    for (uint n = 0; n < NT; ++n)
        UNROLL
        for (uint r = 0; r < 2; ++r) {
            const uint i = 2 * n + r, j = 4 * n + 2 * r; /* keys 2t and 2t + 1 */
            const uint two = BYTE_OF(got, i, 4) | BYTE_OF(got, i + 2, 4) << 8;
            kb[j / 32] |= ((two >> (a + 2 * t)) & 3u) << (j % 32);
        }
}

/* Key side: rows keys key0 and key0 + 8 (key0 = kbase + g), columns
 * queries p0 + 8n + 2t + c. Block i = 2NT k + (2n + c) holds keys kbase +
 * 8k - a .. of query p0 + 8n + 2t + c; lane g = i % 8 of the eight lanes of
 * the same t draws it. A column's keep bits are bits a .. a + 15 of its
 * blocks' three bytes. */
inline void keep_keys(uint *kb, uint p0, uint key0, uint head, uint b, long delta,
                      __local float *emu, MOD_ARGS)
{
    const uint lane = get_local_id(0) & 31u, t = lane & 3u, g = lane >> 2;
    const uint first = key0 - g + kv_pos0, a = first & 7u, blocks = a ? 6 * NT : 4 * NT;
    uint own[(KB + 3) / 4];
    UNROLL
    for (uint w = 0; w < (KB + 3) / 4; ++w)
        own[w] = 0u;
    UNROLL
    for (uint q = 0; q < KB; ++q) {
        const uint i = 8 * q + g, col = i % (2 * NT);
        if (i < blocks) {
            const uint4 x = draws(((first >> 3) + i / (2 * NT)) & 0x1FFFFFFFu,
                                  p0 + 8 * (col / 2) + 2 * t + (col & 1u), head, b, delta, kv_pos0,
                                  seq0, drop_k0, drop_k1);
            own[q / 4] |= keep_byte(x, drop_thr) << (8 * (q % 4));
        }
    }
    uint got[8][(KB + 3) / 4];
    UNROLL
    for (uint w = 0; w < (KB + 3) / 4; ++w)
        UNROLL
        for (uint src = 0; src < 8; ++src)
            got[src][w] = shfl_idx(own[w], (src << 2) | t, emu);
    UNROLL
    for (uint w = 0; w < DROP_WORDS; ++w)
        kb[w] = 0u;
    UNROLL
    for (uint col = 0; col < 2 * NT; ++col) {
        const uint three = BYTE_OF(got, col, 8) | BYTE_OF(got, 2 * NT + col, 8) << 8 |
                           BYTE_OF(got, 4 * NT + col, 8) << 16;
        UNROLL
        for (uint r = 0; r < 2; ++r) { /* key g of row half r */
            const uint j = col / 2 * 4 + 2 * r + (col & 1u);
            kb[j / 32] |= ((three >> (a + 8 * r + g)) & 1u) << (j % 32);
        }
    }
}

/* Dropout's factor of score j: drop_gain where kept, else 0. */
#define KEEP_GAIN(kb, j) (((kb)[(j) / 32] >> ((j) % 32)) & 1u ? drop_gain : 0.0f)

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
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
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
    stream_first(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, lo, hi, num_kv_heads,
                 kv_head, lo < hi);
    uint pa[PA_STEPS][4]; /* P's A fragments while its P V is in flight (wgmma) */
    UNROLL
    for (uint kk = 0; kk < PA_STEPS; ++kk)
        pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        stream_land(&st, false);
        times_wait(&acc[0][0], pa); /* the last tile's P V */
        stream_ready();
        if (t0 + TILE < hi)
            stream_next(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, t0 + TILE, hi,
                        num_kv_heads, kv_head);
        __local const float *kt = st.xt, *vt = st.yt;

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
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            const float l = (i & 2) ? l1 : l0;
            if (row < q_seq && d < D)
                STORE(o, at(b, q_seq, row, num_heads, head, d),
                      l != 0.0f ? acc[n][i] / l : ZERO_SUM(row, 0.0f));
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
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
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
    stream_first(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, lo, hi, num_kv_heads,
                 kv_head, lo < hi);
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        stream_land(&st, false);
        stream_ready();
        if (t0 + TILE < hi)
            stream_next(&st, tiles, k, 1.0f, v, 0, 0, false, false, b, kv_seq, t0 + TILE, hi,
                        num_kv_heads, kv_head);
        __local const float *kt = st.xt, *vt = st.yt;

        uint kb[DROP_WORDS]; /* dropout's keep bits, drawn before the scores are live */
#if MODS & MOD_DROPOUT
        keep_queries(kb, t0, row0, head, b, delta, emu, MOD_PASS);
#endif
        float s[NT][4], dp[NT][4], dz[NT * 4];
        scores(&s[0][0], &dp[0][0], &qf[0][0], &of[0][0], kt, vt, d0, xch, emu);
#if SHAPED
        modify_lane(&s[0][0], dz, PRE(scale), (long)row0 + delta - (long)t0 - 2 * (long)t, 1.0f,
                    softcap, slope);
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

/* ---- grad-K and grad-V ----------------------------------------------- */

/* P^T into s and (want_dk) dS^T = P^T * (dP^T - Dsum) into dp, from the
 * warp's 16 x TILE blocks S^T and dP^T of keys key0 (rows g) and key0 + 8
 * by queries p0.., whose m, l and Dsum are in mt, lt and dt; `masked`:
 * queries past hi or not seeing the key get 0. */
inline void p_of_keys(float *s, float *dp, __local const float *mt, __local const float *lt,
                      __local const float *dt, float unit, bool masked, bool want_dk, uint p0,
                      uint hi, uint key0, int causal, uint window, long delta, const uint *kb,
                      const float *dz, MOD_ARGS)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        const uint j = i / 4 * 8 + 2 * t + (i & 1), key = key0 + ((i & 2) ? 8u : 0u);
        const float x = s[i];
        float g = 1.0f;
#if MODS & MOD_DROPOUT
        g = KEEP_GAIN(kb, i);
#endif
#if DTYPE != 0 && FOLD_ML
        const float p = EXPU(min0(fma(x, unit, -(mt[j] + lt[j]) * EXP_UNIT)));
#else
        const float p = EXPU(min0(fma(x, unit, -mt[j] * EXP_UNIT)) - lt[j] * EXP_UNIT);
#endif
        const bool keep = !masked || (p0 + j < hi && visible(p0 + j, key, causal, window, delta));
#if MODS
        s[i] = keep ? p * g : 0.0f;
        dp[i] = keep && want_dk ? p * (g * dp[i] - dt[j]) * dz[i] : 0.0f;
#else
        s[i] = keep ? p : 0.0f;
        dp[i] = keep && want_dk ? p * (dp[i] - dt[j]) : 0.0f;
#endif
    }
}

/* The warp's 16 keys by the tile's queries of dS^T (p_of_keys's dp) into
 * a query head's dS scratch (cl/common.cl's ds_head: [key][query] floats
 * from dsh), queries past hi and keys past kv_seq left out. */
inline void scatter_ds(__global float *dsh, const float *dp, uint p0, uint hi, uint key0,
                       uint kv_seq, uint q_seq)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        const uint j = i / 4 * 8 + 2 * t + (i & 1), key = key0 + ((i & 2) ? 8u : 0u);
        if (p0 + j < hi && key < kv_seq)
            dsh[(ulong)key * q_seq + p0 + j] = dp[i];
    }
}

/* dK and/or dV of the work-group's WG_ROWS keys: every query row of every
 * head of the group that sees any of them streams through local memory
 * TILE rows at a time, with its LSE pair and Dsum; where dsw is not NULL
 * (float32), each pair's dS into the dS scratch too, for grad_qs__tiled.
 * Heads and batch elements come from the global ids, so that a launch may
 * cover a part of them (the scratch's chunks). */
inline void key_side(__global const elem *q, __global const elem *k, __global const elem *v,
                     __global const elem *d_out, __global const float *lse,
                     __global const float *dsum, __global elem *dk, __global elem *dv,
                     uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, int causal,
                     uint window, long delta, float scale, int accumulate,
                     __local float *tiles, bool want_dk, bool want_dv,
                     __global float *dq32, __global float *dsw, MOD_ARGS)
{
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    tiles = tile_base(tiles);
    const float unit = SCORE_UNIT(scale);
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    /* S^T = K Q^T, dP^T = V dO^T, dS^T Q and P^T dO */
    const uint kv_head = get_global_id(1), b = get_global_id(2);
    const uint group = num_heads / num_kv_heads;
    const uint r0 = get_group_id(0) * WG_ROWS; /* causal: the first blocks are the heaviest */
    const uint key0 = r0 + warp / WSPLIT * 16u + g, key1 = key0 + 8u;

    frag kf[KS][4], vf[KS][4];
    float dkf[KW][4], dvf[KW][4];
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        load_a(kf[ks], k, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * KSTEP, 1.0f);
        if (want_dk)
            load_a(vf[ks], v, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * KSTEP, 1.0f);
    }
    zero(&dkf[0][0], KW * 4);
    zero(&dvf[0][0], KW * 4);
    const uint last = min(r0 + WG_ROWS, kv_seq) - 1u;
    uint lo, hi;
    queries_of_keys(r0, last, q_seq, causal, window, delta, &lo, &hi);
#if DTYPE != 0 && WSPLIT == 1
    /* dS^T goes to ds; the last tile's is in the other buffer, for its dQ */
    __local float *kb = tiles + KB_AT, *ds = tiles + DS_AT;
    uint dq_p0 = 0, dq_head = 0; /* the last tile's queries */
    if (dq32)
        copy_block(kb, k, b, kv_seq, r0, num_kv_heads, kv_head); /* seen past the loop's barrier */
#endif

    /* One loop over (head of the group, tile of its queries), so that the
     * next tile is fetched while this one is computed. */
    const uint per_head = (hi - lo + TILE - 1u) / TILE, steps = lo < hi ? group * per_head : 0u;
    stream st;
    stream_init(&st, tiles);
    stream_first(&st, tiles, q, scale, d_out, lse, dsum, true, want_dk, b, q_seq, lo, hi,
                 num_heads, kv_head * group, steps > 0u);
    for (uint step = 0; step < steps; ++step) {
        const uint p0 = lo + step % per_head * TILE;
        stream_land(&st, true);
        stream_ready();
        if (step + 1u < steps) {
            const uint head = kv_head * group + (step + 1u) / per_head;
            const uint next_p = lo + (step + 1u) % per_head * TILE;
            stream_next(&st, tiles, q, scale, d_out, lse, dsum, true, want_dk, b, q_seq, next_p,
                        hi, num_heads, head);
        }
        __local const float *qt = st.xt, *ot = st.yt;
        __local const float *mt = st.rows, *lt = mt + TILE, *dt = lt + TILE;

        const uint head = kv_head * group + step / per_head;
        uint keep[DROP_WORDS]; /* dropout's keep bits, drawn before the scores are live */
#if MODS & MOD_DROPOUT
        keep_keys(keep, p0, key0, head, b, delta, emu, MOD_PASS);
#endif
        /* S^T and dP^T: 16 keys x TILE queries per warp. */
        float s[NT][4], dp[NT][4];
        scores(&s[0][0], want_dk ? &dp[0][0] : 0, &kf[0][0], &vf[0][0], qt, ot, d0, xch, emu);
#if DTYPE != 0 && WSPLIT == 1
        if (dq32 && step > 0) /* the last tile's dQ: its dS^T is past the barrier */
            add_dq(dq32, other_ds(tiles, ds), kb, b, q_seq, dq_p0, num_heads, dq_head, emu);
#endif
        const bool whole = p0 + TILE <= hi &&
                           all_visible(p0, (long)p0 + TILE - 1, r0, last, causal, window, delta);
        /* whole tiles skip the mask's tests */
        float dz[NT * 4];
#if SHAPED
        modify_lane(&s[0][0], dz, PRE(scale), (long)p0 + 2 * (long)t + delta - (long)key0, -1.0f,
                    softcap, SLOPE(head));
#else
        UNROLL
        for (uint j = 0; j < NT * 4; ++j)
            dz[j] = 1.0f;
#endif
        if (whole)
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, false, want_dk, p0, hi, key0, causal,
                      window, delta, keep, dz, MOD_PASS);
        else
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, true, want_dk, p0, hi, key0, causal,
                      window, delta, keep, dz, MOD_PASS);
#if DTYPE != 0 && WSPLIT == 1
        if (dq32)
            store_ds(ds, &dp[0][0]);
#endif
        if (dsw && warp % WSPLIT == 0) /* the WSPLIT warps of 16 keys hold the same dS^T */
            scatter_ds(dsw + ds_head(b, head, group, q_seq, kv_seq), &dp[0][0], p0, hi, key0,
                       kv_seq, q_seq);
        if (want_dv && want_dk)
            times(&dvf[0][0], &s[0][0], ot, &dkf[0][0], &dp[0][0], qt, d0, emu);
        else if (want_dv)
            times(&dvf[0][0], &s[0][0], ot, 0, 0, 0, d0, emu);
        else
            times(&dkf[0][0], &dp[0][0], qt, 0, 0, 0, d0, emu);
#if DTYPE != 0 && WSPLIT == 1
        dq_p0 = p0;
        dq_head = kv_head * group + step / per_head;
        ds = other_ds(tiles, ds);
#endif
        stream_advance(&st, tiles, true);
    }
#if DTYPE != 0 && WSPLIT == 1
    if (dq32 && steps) { /* the last tile's dQ */
        barrier(CLK_LOCAL_MEM_FENCE);
        add_dq(dq32, other_ds(tiles, ds), kb, b, q_seq, dq_p0, num_heads, dq_head, emu);
    }
#endif
#if DTYPE != 0
    scale_by(&dkf[0][0], KW * 4, scale); /* dS^T Q took Q unscaled */
#endif
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint key = (i & 2) ? key1 : key0, d = d0 + n * 8 + 2 * t + (i & 1);
            if (key < kv_seq && d < D) {
                const ulong x = at(b, kv_seq, key, num_kv_heads, kv_head, d);
                if (want_dk)
                    STORE_GRAD(dk, x, dkf[n][i], accumulate);
                if (want_dv)
                    STORE_GRAD(dv, x, dvf[n][i], accumulate);
            }
        }
    }
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_v__mma(__global const elem *d_out, ulong d_out_off, __global const elem *q, ulong q_off,
            __global const elem *k, ulong k_off, __global const float *lse, ulong lse_off,
            __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, k + k_off, d_out + d_out_off, lse + lse_off, lse + lse_off,
             dv + dv_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, false, true, 0, 0, MOD_PASS);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_k__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
            __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
            __global const float *lse, ulong lse_off, __global const float *dsum,
            ulong dsum_off, __global elem *dk, ulong dk_off, SHAPE_ARGS,
            __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dk + dk_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, false, 0, 0, MOD_PASS);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kv__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
             __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
             __global const float *lse, ulong lse_off, __global const float *dsum,
             ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
             SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, 0, 0, MOD_PASS);
}

#if DTYPE == 0
/* grad_kv__mma that also writes each pair's dS into the dS scratch ds,
 * from which grad_qs__tiled takes dQ (float32: a product on the FMA units
 * in place of grad-Q's three 3xTF32 ones); both may run on a part of the
 * heads and batch elements (a global offset in dimensions 1 and 2). */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kvs__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
              __global const float *lse, ulong lse_off, __global const float *dsum,
              ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
              __global float *ds, ulong ds_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, 0, ds + ds_off, MOD_PASS);
}
#endif

#if DTYPE != 0 && WSPLIT == 1
/* dK and dV, with dQ (unscaled) added into the float32 dq32, which starts
 * at zero; finish_dq__mma then writes dQ. */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kvq__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
              __global const float *lse, ulong lse_off, __global const float *dsum,
              ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
              __global float *dq32, ulong dq32_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, dq32 + dq32_off, 0, MOD_PASS);
}

/* dQ = scale * dq32, rounded once (or added to dQ under accumulate): a
 * work-group a block of WG_ROWS query rows of one head. */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
finish_dq__mma(__global const float *dq32, ulong dq32_off, __global elem *dq, ulong dq_off,
               SHAPE_ARGS, __local float *tiles)
{
    dq32 += dq32_off;
    dq += dq_off;
    const uint r0 = get_group_id(0) * WG_ROWS, head = get_group_id(1), b = get_group_id(2);
    for (uint j = get_local_id(0); j < WG_ROWS * D; j += LANES) {
        const uint row = r0 + j / D;
        if (row < q_seq) {
            const ulong x = at(b, q_seq, row, num_heads, head, j % D);
            STORE_GRAD(dq, x, scale * dq32[x], accumulate);
        }
    }
}
#endif

