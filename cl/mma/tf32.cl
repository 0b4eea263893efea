#if DTYPE == 0
/* ---- fp32 tensors: 3xTF32 on m16n8k8 ---------------------------------- */

/* x rounded to tf32 (10 mantissa bits), as mma reads it: Veltkamp's split
 * by 2^13 + 1, in float arithmetic so that every NaN stays a NaN (integer
 * rounding carries a NaN of all-ones mantissa, the GPU's, into the sign).
 * Unfused: a contracted fma would round only once. Past 4e34 in magnitude
 * x * 8193 overflows to a NaN. */
inline uint tf32(float x)
{
#pragma OPENCL FP_CONTRACT OFF
    const float t = x * 8193.0f;
    return as_uint(t - (t - x));
}

/* The big and small tf32 parts of 4 values. */
inline void split4(const float *x, uint *big, uint *small)
{
    UNROLL
    for (int i = 0; i < 4; ++i) {
        big[i] = tf32(x[i]);
        small[i] = tf32(x[i] - as_float(big[i]));
    }
}

/* c += a . b for one 16 x 8 x 8 product of the warp. */
inline void mma(float *c, const uint *a, const uint *b, __local float *emu)
{
#ifdef MMA_EMULATE
    const uint lane = get_local_id(0) & 31u, g = lane >> 2, t = lane & 3u;
    __local float *ea = emu, *eb = emu + 128;
    ea[g * 8 + t] = as_float(a[0] & 0xffffe000u);
    ea[(g + 8) * 8 + t] = as_float(a[1] & 0xffffe000u);
    ea[g * 8 + t + 4] = as_float(a[2] & 0xffffe000u);
    ea[(g + 8) * 8 + t + 4] = as_float(a[3] & 0xffffe000u);
    eb[t * 8 + g] = as_float(b[0] & 0xffffe000u);
    eb[(t + 4) * 8 + g] = as_float(b[1] & 0xffffe000u);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = 0; k < 8; ++k) {
        c[0] = fma(ea[g * 8 + k], eb[k * 8 + 2 * t], c[0]);
        c[1] = fma(ea[g * 8 + k], eb[k * 8 + 2 * t + 1], c[1]);
        c[2] = fma(ea[(g + 8) * 8 + k], eb[k * 8 + 2 * t], c[2]);
        c[3] = fma(ea[(g + 8) * 8 + k], eb[k * 8 + 2 * t + 1], c[3]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    __asm__ __volatile__("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* c += a . b in 3xTF32. The tensor cores add into their accumulator with
 * truncation, not rounding: summed straight into c, over thousands of
 * k-steps (dK and dV at q_seq 4096), that bias grew to ~1e-4 of the result.
 * So each k-step's three products go into a zeroed accumulator, and that
 * into c with an ordinary rounded add. */
inline void mma3(float *c, const uint *a_big, const uint *a_small, const uint *b_big,
                 const uint *b_small, __local float *emu)
{
    float step[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma(step, a_small, b_big, emu);
    mma(step, a_big, b_small, emu);
    mma(step, a_big, b_big, emu);
    c[0] += step[0];
    c[1] += step[1];
    c[2] += step[2];
    c[3] += step[3];
}

/* Fetches this lane's share of rows [r0, r0 + TILE) of a [batch][rows]
 * [heads][D] tensor, times factor, into registers x; zeros past `end` and
 * past D. Fetched a tile ahead, the loads are in flight while the current
 * tile is computed. */
inline void fetch_tile(float *x, __global const elem *src, uint b, uint rows, uint r0, uint end,
                       uint heads, uint head, float factor)
{
    UNROLL
    for (uint j = 0; j < PER_LANE; ++j) {
        const uint i = get_local_id(0) + j * LANES, r = i / DP, d = i % DP;
        x[j] = i < TILE * DP && r0 + r < end && d < D
                   ? src[at(b, rows, r0 + r, heads, head, d)] * factor
                   : 0.0f;
    }
}

/* Stores what fetch_tile fetched into tile[TILE][STRIDE] (both planes with
 * PLANES 2). */
inline void store_tile(__local float *tile, const float *x)
{
    UNROLL
    for (uint j = 0; j < PER_LANE; ++j) {
        const uint i = get_local_id(0) + j * LANES, r = i / DP, d = i % DP;
        if (i < TILE * DP) {
#if PLANES == 2
            const uint big = tf32(x[j]);
            tile[r * STRIDE + d] = as_float(big);
            tile[PLANE + r * STRIDE + d] = as_float(tf32(x[j] - as_float(big)));
#else
            tile[r * STRIDE + d] = x[j];
#endif
        }
    }
}

/* A B operand from a tile: the elements at i and i + step, both parts. */
inline void b_frag(__local const float *tile, uint i, uint step, uint *big, uint *small)
{
#if PLANES == 2
    big[0] = as_uint(tile[i]);
    big[1] = as_uint(tile[i + step]);
    small[0] = as_uint(tile[PLANE + i]);
    small[1] = as_uint(tile[PLANE + i + step]);
#else
    const float x0 = tile[i], x1 = tile[i + step];
    big[0] = tf32(x0);
    big[1] = tf32(x1);
    small[0] = tf32(x0 - as_float(big[0]));
    small[1] = tf32(x1 - as_float(big[1]));
#endif
}

/* An A fragment (16 rows from row0 and row1 = row0 + 8, the 8 columns from
 * col) of a [batch][rows][heads][D] tensor, times factor; zeros past `rows`
 * and D. */
inline void load_a(float *a, __global const elem *src, uint b, uint rows, uint row0, uint heads,
                   uint head, uint col, float factor)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (int i = 0; i < 4; ++i) {
        const uint row = row0 + ((i & 1) ? 8u : 0u), d = col + t + ((i & 2) ? 4u : 0u);
        a[i] = row < rows && d < D ? src[at(b, rows, row, heads, head, d)] * factor : 0.0f;
    }
}

/* The warp's 16 x TILE block of a . x^T over its columns into s, x a tile
 * of TILE rows, and of c . y^T into dp unless dp is NULL; each summed over
 * the warps of the group. a and c are the warp's KS A fragments. */
inline void tile_products(float *s, float *dp, const float *a, const float *c,
                          __local const float *x, __local const float *y, uint d0,
                          __local float *xch, __local float *emu)
{
    const uint lane = get_local_id(0) & 31u, warp = get_local_id(0) >> 5;
    const uint g = lane >> 2, t = lane & 3u;
    zero(s, NT * 4);
    if (dp)
        zero(dp, NT * 4);
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        uint ab[4], as[4], cb[4], cs[4];
        split4(a + ks * 4, ab, as);
        if (dp)
            split4(c + ks * 4, cb, cs);
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            const uint at_x = (n * 8 + g) * STRIDE + d0 + ks * 8 + t;
            uint bb[2], bs[2];
            b_frag(x, at_x, 4, bb, bs);
            mma3(s + n * 4, ab, as, bb, bs, emu);
            if (dp) {
                b_frag(y, at_x, 4, bb, bs);
                mma3(dp + n * 4, cb, cs, bb, bs, emu);
            }
        }
    }
    sum_over_split(s, dp, xch, warp, lane);
}

/* acc (the warp's KW 16 x 8 blocks of its columns) += p . x, p the warp's
 * 16 x TILE block and x a tile of TILE rows. The accumulator layout of
 * m16n8k8 is not its A layout, so the k index is permuted, as the header
 * says: A's column t is tile row 2t, column t + 4 tile row 2t + 1. */
inline void tile_times(float *acc, const float *p, __local const float *x, uint d0,
                       __local float *emu)
{
    const uint t = get_local_id(0) & 3u, g = (get_local_id(0) & 31u) >> 2;
    UNROLL
    for (uint j = 0; j < NT; ++j) {
        const float a[4] = {p[j * 4], p[j * 4 + 2], p[j * 4 + 1], p[j * 4 + 3]};
        uint ab[4], as[4];
        split4(a, ab, as);
        UNROLL
        for (uint n = 0; n < KW; ++n) {
            uint bb[2], bs[2];
            b_frag(x, (j * 8 + 2 * t) * STRIDE + d0 + n * 8 + g, STRIDE, bb, bs);
            mma3(acc + n * 4, ab, as, bb, bs, emu);
        }
    }
}

/* m, l and (want_dk) Dsum of query row p0 + lid of a tile, for the lanes
 * lid < TILE, into registers x; zeros past `end`. */
inline void fetch_rows(float *x, __global const float *lse, __global const float *dsum, uint b,
                       uint q_seq, uint p0, uint end, uint num_heads, uint head, bool want_dk)
{
    const uint lid = get_local_id(0);
    const bool in = lid < TILE && p0 + lid < end;
    const ulong row = ((ulong)b * q_seq + (in ? p0 + lid : 0u)) * num_heads + head;
    x[0] = in ? lse[2 * row] : 0.0f;
    x[1] = in ? lse[2 * row + 1] : 0.0f;
    x[2] = in && want_dk ? dsum[row] : 0.0f;
}
#endif
