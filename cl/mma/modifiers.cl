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
    const float th = clattn_tanh(x * mul); /* tanh.approx.f32 */
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

/* The caller's functions and tensors (user_modify) on a lane's part of a
 * 16 x TILE block of scores held in MOD_UNIT (mu): element j's row is row0
 * + (j & 2 ? 8 : 0), its column col0 + 8 (j / 4) + 2t + (j & 1); the rows
 * are query rows on the query side, keys on the key side (key_side), and
 * the columns the others. A hidden pair's score is -inf, whose weight is
 * 0 below any row's max (EMPTY_ROW at least); dz takes the score
 * function's derivative. bv: the bias's values of the elements, read by
 * bias_lane before the scores' products, so that the loads are in flight
 * beside them. */
#if USER_FNS
#define LANE_ROW(row0, j) ((row0) + (((j) & 2) ? 8u : 0u))
#define LANE_COL(col0, j, t) ((col0) + (j) / 4 * 8 + 2 * (t) + ((j) & 1))
inline void bias_lane(float *bv, uint row0, uint col0, bool key_side, uint head, uint b,
                      uint num_heads, uint q_seq, uint kv_seq, MOD_ARGS)
{
    const uint t = get_local_id(0) & 3u;
#if MODS & MOD_BIAS
    /* A block inside the bias: the lane's first element's index once, the
     * others a 32-bit offset from it, and the element type chosen once. */
    const uint rows = key_side ? kv_seq : q_seq, cols = key_side ? q_seq : kv_seq;
    if (row0 + 8u < rows && col0 + NT * 8u <= cols && kv_seq < (1u << 24)) {
        const uint c = col0 + 2u * t, down = key_side ? 1u : kv_seq, across = key_side ? kv_seq : 1u;
        const ulong at = bias_at(b, head, key_side ? c : row0, key_side ? row0 : c, num_heads,
                                 q_seq, kv_seq, bias_dims);
#define BIAS_OFF(j) ((((j) & 2) ? 8u * down : 0u) + ((j) / 4 * 8u + ((j) & 1)) * across)
        /* a float32 bias on the query side: elements j and j + 1 lie side
         * by side, one load of both where the first's index is even (the
         * buffer aligned) */
        if (!key_side && !(bias_dims & 12u) && !(at & 1u)) {
            __global const float2 *p = (__global const float2 *)(bias + at);
            UNROLL
            for (uint j = 0; j < NT * 4; j += 2) {
                const float2 v = p[BIAS_OFF(j) / 2u];
                bv[j] = v.x;
                bv[j + 1] = v.y;
            }
            return;
        }
        /* and a 16-bit one's pair in one 32-bit load */
        if (!key_side && (bias_dims & 4u) && !(at & 1u)) {
            __global const uint *p = (__global const uint *)((__global const ushort *)bias + at);
            UNROLL
            for (uint j = 0; j < NT * 4; j += 2) {
                const uint w = p[BIAS_OFF(j) / 2u];
                bv[j] = as_float(w << 16);
                bv[j + 1] = as_float(w & 0xFFFF0000u);
            }
            return;
        }
        if (!key_side && (bias_dims & 8u) && !(at & 1u)) {
            __global const uint *p = (__global const uint *)((__global const ushort *)bias + at);
            UNROLL
            for (uint j = 0; j < NT * 4; j += 2) {
                const uint w = p[BIAS_OFF(j) / 2u];
                const ushort two[2] = {(ushort)w, (ushort)(w >> 16)};
                bv[j] = vload_half(0, (const __private half *)two);
                bv[j + 1] = vload_half(1, (const __private half *)two);
            }
            return;
        }
        if (bias_dims & 4u) {
            __global const ushort *p = (__global const ushort *)bias + at;
            UNROLL
            for (uint j = 0; j < NT * 4; ++j)
                bv[j] = as_float((uint)p[BIAS_OFF(j)] << 16);
        } else if (bias_dims & 8u) {
            __global const half *p = (__global const half *)bias + at;
            UNROLL
            for (uint j = 0; j < NT * 4; ++j)
                bv[j] = vload_half(BIAS_OFF(j), p);
        } else {
            __global const float *p = bias + at;
            UNROLL
            for (uint j = 0; j < NT * 4; ++j)
                bv[j] = p[BIAS_OFF(j)];
        }
#undef BIAS_OFF
        return;
    }
#endif
    UNROLL
    for (uint j = 0; j < NT * 4; ++j) {
        const uint r = LANE_ROW(row0, j), c = LANE_COL(col0, j, t);
        bv[j] = user_bias(bias, b, head, key_side ? c : r, key_side ? r : c, num_heads, q_seq,
                          kv_seq, bias_dims);
    }
}

inline void user_lane(float *s, float *dz, const float *bv, float mu, uint row0, uint col0,
                      bool key_side, uint head, uint b, long delta, uint num_heads, uint q_seq,
                      uint kv_seq, MOD_ARGS)
{
    const float inv = 1.0f / mu;
#if (MODS & (MOD_SCORE | MOD_BIAS)) == MOD_BIAS && !HIDING
    /* a bias alone: (s mu + bias) / mu as one fma */
    UNROLL
    for (uint j = 0; j < NT * 4; ++j)
        s[j] = fma(bv[j], inv, s[j]);
#else
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint j = 0; j < NT * 4; ++j) {
        const uint r = LANE_ROW(row0, j), c = LANE_COL(col0, j, t);
        float g = 1.0f;
        s[j] = user_modify_with(s[j] * mu, key_side ? c : r, key_side ? r : c, head, b, delta,
                                slopes, num_heads, q_seq, kv_seq, kv_pos0, seq0, bv[j], bool_mask,
                                bias_dims, &g) *
               inv;
        dz[j] *= g;
    }
#endif
}
#define BIAS_LANE(bv, row0, col0, key_side, head) \
    bias_lane((bv), (row0), (col0), (key_side), (head), b, num_heads, q_seq, kv_seq, MOD_PASS)
#define USER_LANE(s, dz, bv, row0, col0, key_side, head)                                      \
    user_lane((s), (dz), (bv), MOD_UNIT(scale), (row0), (col0), (key_side), (head), b, delta, \
              num_heads, q_seq, kv_seq, MOD_PASS)
#else
#define BIAS_LANE(bv, row0, col0, key_side, head)
#define USER_LANE(s, dz, bv, row0, col0, key_side, head)
#endif

/* Dropout's keep bits of a lane's scores: bit j of kb[j / 32] for score
 * j of its fragment (n-tile j / 4, row half (j & 2) / 2, column j & 1).
 * Sixteen consecutive keys of one query share a Philox block, and the
 * lanes that hold them share its draw: each block is drawn by one of them,
 * which passes its sixteen keep bits (keep_bits_lanes) to the others by
 * shuffles, a draw per sixteen scores. `a`, where the warp's keys start
 * within a block, is 0 unless kv_offset (or on the query side a window's
 * first key) is off a multiple of 16; the blocks then straddle the n-tiles
 * (the rows on the key side) and one more block a row (a column) may be
 * drawn. Each lane keeps the sixteen bits of its blocks in halves of
 * words: HALF_OF(w, i, lanes) is block i's. */
#define DROP_WORDS ((NT * 4 + 31) / 32)
#define QBLOCKS (2 * ((NT + 1) / 2 + 2)) /* block indices the query side reads */
#define QB ((QBLOCKS + 3) / 4)             /* blocks a lane draws at most, query side */
#define KB ((4 * NT + 7) / 8)              /* and key side */
#define HALF_OF(w, i, lanes) \
    (((w)[(i) % (lanes)][(i) / (lanes) / 2] >> ((i) / (lanes) % 2 * 16)) & 0xFFFFu)

/* The keep bits of a block's sixteen keys, key i at bit i where draw8(w,
 * i) >= thr, by 16-bit lanes: for word k's bytes 0 and 2 (e)
 * and 1 and 3 (o), a lane's byte + 256 - thr has bit 8 set iff the byte is
 * at least thr (thr < 256: no lane borrows). Keys 4k .. 4k + 3 then sit
 * at bits 8, 9, 24 and 25 of m, taken to bits 4k, 4k + 1 and 16 + 4k,
 * 17 + 4k of x. A threshold of 256 (p above 255/256) keeps none. */
inline uint keep_bits_lanes(uint4 w, uint thr)
{
    const uint c = 0x01000100u - thr * 0x00010001u;
    const uint words[4] = {w.x, w.y, w.z, w.w};
    uint x = 0u;
    UNROLL
    for (uint k = 0; k < 4; ++k) {
        const uint e = (words[k] & 0x00FF00FFu) + c, o = ((words[k] >> 8) & 0x00FF00FFu) + c;
        const uint m = (e & 0x01000100u) | (o & 0x01000100u) << 1;
        x |= k < 2 ? m >> (8 - 4 * k) : m << (4 * k - 8);
    }
    return thr > 255u ? 0u : (x & 0x3333u) | (x >> 14 & 0xCCCCu);
}

/* Query side: rows row0 and row0 + 8 (queries), columns keys t0 + 8n + 2t
 * + c. Block i = 2m + r holds keys t0 + 16m - a .. of row half r; lane
 * i % 4 of the row's quad draws it. N-tile n's keys start at bit a + 8n
 * of its row half's blocks, in block (n + h) / 2 (h = a / 8) at bit
 * a % 8 + 8 ((n + h) mod 2): the two blocks from there, picked by h so
 * that every index is known when compiled. */
inline void keep_queries(uint *kb, uint t0, uint row0, uint head, uint b, long delta,
                         __local float *emu, MOD_ARGS)
{
    const uint lane = get_local_id(0) & 31u, t = lane & 3u;
    const uint first = t0 + kv_pos0, a = first & 15u, blocks = 2 * ((a + 8 * NT + 15) >> 4);
    uint own[(QB + 1) / 2];
    UNROLL
    for (uint w = 0; w < (QB + 1) / 2; ++w)
        own[w] = 0u;
    UNROLL
    for (uint q = 0; q < QB; ++q) {
        const uint i = 4 * q + t;
        if (i < blocks) {
            const uint4 x = draws(((first >> 4) + i / 2) & 0x0FFFFFFFu, row0 + 8 * (i & 1u), head,
                                  b, delta, kv_pos0, seq0, drop_k0, drop_k1);
            own[q / 2] |= keep_bits_lanes(x, drop_thr) << (16 * (q % 2));
        }
    }
    if (a == 0u) {
        /* Blocks from a multiple of 16: lane s's word w holds blocks 4q + s
         * (q = 2w, 2w + 1 in its halves), keys 16m .. 16m + 15 of row half r
         * for m = 2q + s / 2, r = s % 2; this lane's keys of n-tile 2m + n'
         * (n' = 0, 1) are bits 8n' + 2t and 8n' + 2t + 1 of it, and scores
         * 8m + 4n' + 2r + c of kb: 32w + 16 (q % 2) + 8 (s / 2) + 2 (s % 2) +
         * 4n' + c. */
        UNROLL
        for (uint w = 0; w < DROP_WORDS; ++w) {
            uint x = 0u;
            UNROLL
            for (uint src = 0; src < 4; ++src) {
                const uint z = shfl_idx(own[w], (lane & ~3u) | src, emu) >> (2u * t) & 0x03030303u;
                x |= ((z | z >> 4) & 0x00330033u) << (8u * (src >> 1) + 2u * (src & 1u));
            }
            kb[w] = x;
        }
        return;
    }
    uint got[4][(QB + 1) / 2];
    UNROLL
    for (uint w = 0; w < (QB + 1) / 2; ++w)
        UNROLL
        for (uint src = 0; src < 4; ++src)
            got[src][w] = shfl_idx(own[w], (lane & ~3u) | src, emu);
    UNROLL
    for (uint w = 0; w < DROP_WORDS; ++w)
        kb[w] = 0u;
    const uint h = a >> 3, low = a & 7u;
    UNROLL
    for (uint n = 0; n < NT; ++n)
        UNROLL
        for (uint r = 0; r < 2; ++r) {
            const uint j = 4 * n + 2 * r; /* keys 2t and 2t + 1 */
            const uint m0 = n / 2, m1 = (n + 1) / 2;
            const uint w0 = HALF_OF(got, 2 * m0 + r, 4) | HALF_OF(got, 2 * m0 + 2 + r, 4) << 16;
            const uint w1 = HALF_OF(got, 2 * m1 + r, 4) | HALF_OF(got, 2 * m1 + 2 + r, 4) << 16;
            const uint two = h ? w1 >> (low + 8 * ((n + 1) % 2)) : w0 >> (low + 8 * (n % 2));
            kb[j / 32] |= ((two >> (2 * t)) & 3u) << (j % 32);
        }
}

/* Key side: rows keys key0 and key0 + 8 (key0 = kbase + g), columns
 * queries p0 + 8n + 2t + c. Block i = 2NT k + (2n + c) holds keys kbase +
 * 16k - a .. of query p0 + 8n + 2t + c; lane g = i % 8 of the eight lanes
 * of the same t draws it (k = 1 only where a > 0). A column's keep bits
 * are bits a .. a + 15 of its two blocks. */
inline void keep_keys(uint *kb, uint p0, uint key0, uint head, uint b, long delta,
                      __local float *emu, MOD_ARGS)
{
    const uint lane = get_local_id(0) & 31u, t = lane & 3u, g = lane >> 2;
    const uint first = key0 - g + kv_pos0, a = first & 15u, blocks = a ? 4 * NT : 2 * NT;
    uint own[(KB + 1) / 2];
    UNROLL
    for (uint w = 0; w < (KB + 1) / 2; ++w)
        own[w] = 0u;
    UNROLL
    for (uint q = 0; q < KB; ++q) {
        const uint i = 8 * q + g, col = i % (2 * NT);
        if (i < blocks) {
            const uint4 x = draws(((first >> 4) + i / (2 * NT)) & 0x0FFFFFFFu,
                                  p0 + 8 * (col / 2) + 2 * t + (col & 1u), head, b, delta, kv_pos0,
                                  seq0, drop_k0, drop_k1);
            own[q / 2] |= keep_bits_lanes(x, drop_thr) << (16 * (q % 2));
        }
    }
    if (a == 0u) {
        /* Blocks from a multiple of 16: lane s's word w holds the columns
         * 8q + s (q = 2w, 2w + 1 in its halves), n = 4q + s / 2 and c = s %
         * 2, whose keys key0 and key0 + 8 are bits g and 8 + g; scores 4n +
         * 2r + c of kb: 32w + 16 (q % 2) + 4 (s / 2) + s % 2 + 2r. */
        UNROLL
        for (uint w = 0; w < DROP_WORDS; ++w) {
            uint x = 0u;
            UNROLL
            for (uint src = 0; src < 8; ++src) {
                const uint z = shfl_idx(own[w], (src << 2) | t, emu) >> g & 0x01010101u;
                x |= ((z | z >> 6) & 0x00050005u) << (4u * (src >> 1) + (src & 1u));
            }
            kb[w] = x;
        }
        return;
    }
    uint got[8][(KB + 1) / 2];
    UNROLL
    for (uint w = 0; w < (KB + 1) / 2; ++w)
        UNROLL
        for (uint src = 0; src < 8; ++src)
            got[src][w] = shfl_idx(own[w], (src << 2) | t, emu);
    UNROLL
    for (uint w = 0; w < DROP_WORDS; ++w)
        kb[w] = 0u;
    UNROLL
    for (uint col = 0; col < 2 * NT; ++col) {
        const uint two = HALF_OF(got, col, 8) | HALF_OF(got, 2 * NT + col, 8) << 16;
        UNROLL
        for (uint r = 0; r < 2; ++r) { /* key g of row half r */
            const uint j = col / 2 * 4 + 2 * r + (col & 1u);
            kb[j / 32] |= ((two >> (a + 8 * r + g)) & 1u) << (j % 32);
        }
    }
}

/* Dropout's factor of score j: drop_gain where kept, else 0. */
#define KEEP_GAIN(kb, j) (((kb)[(j) / 32] >> ((j) % 32)) & 1u ? drop_gain : 0.0f)

