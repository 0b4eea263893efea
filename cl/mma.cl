/*
 * The `mma` variants: FlashAttention-2's loop structure on NVIDIA tensor
 * cores, reached from OpenCL C through inline PTX (mma.sync m16n8k8 on tf32
 * operands, sm_80 and later), with fp32 accuracy kept by 3xTF32: each fp32
 * operand x is split into big = x rounded to tf32 and small = (x - big)
 * rounded to tf32, and a.b is computed as small_a.big_b + big_a.small_b +
 * big_a.big_b (the small.small term is below fp32's rounding).
 *
 * A work-group is WARPS warps; each group of WSPLIT warps owns 16 rows of
 * the work-group's side (query rows for the forward and grad-Q, key rows for
 * grad-K/V), each warp of it DW columns of head_dim, held in registers as
 * mma fragments, and the other side streams through local memory TILE rows
 * at a time. Per tile a warp computes a 16 x TILE block of scores S (and
 * dP) with mma over its columns; with WSPLIT > 1 the warps of a group add
 * their partial blocks through local memory, in one order, so that each
 * holds the same sums. Each applies the mask and the softmax in registers,
 * and feeds the probabilities straight back into mma as the A operand of
 * the product that updates its columns of the output: the accumulator
 * layout of m16n8k8 (lane holds columns 2t and 2t + 1) is not its A layout
 * (columns t and t + 4), so the k index of that product is permuted - A's
 * column t is tile row 2t, column t + 4 is tile row 2t + 1 - and the B
 * operand is read from local memory in the same order. The sum over k does
 * not care about its order.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k8 with .tf32; g = lane / 4,
 * t = lane % 4): A (16 x 8, row-major) a0 (g, t), a1 (g + 8, t),
 * a2 (g, t + 4), a3 (g + 8, t + 4); B (8 x 8) b0 (t, g), b1 (t + 4, g);
 * C (16 x 8) c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
 *
 * With MMA_EMULATE defined, mma and the warp shuffles are emulated through
 * local memory with barriers, so that the same kernels run, slowly, on any
 * OpenCL device: the tests use it to check the indexing on PoCL.
 *
 * Splitting head_dim across warps keeps the registers of a lane near those
 * of head_dim 64 at any head_dim (the key side holds K, V, dK and dV
 * fragments: 16 * KW floats), at the price of one exchange per tile.
 * A tile in local memory is either two planes (PLANES 2: the values' big
 * tf32 parts, then their small ones, split once as the tile is loaded) or
 * the fp32 values (PLANES 1: half the memory, split by every read).
 *
 * HEAD_DIM, WARPS, WSPLIT, MMA_TILE and PLANES are compile-time defines,
 * chosen per head_dim by src/opencl.c; with the defaults the file compiles
 * after cl/common.cl, the prelude every program starts with. Columns are padded with zeros to a multiple of 8 * WSPLIT.
 * Launch: global (blocks * LANES, heads, batch), local (LANES, 1, 1),
 * blocks = ceil(rows / WG_ROWS); `tiles` is a __local buffer of
 * MMA_LOCAL_FLOATS floats.
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef WARPS
#define WARPS 4
#endif
#ifndef WSPLIT
#define WSPLIT 1
#endif
#ifndef MMA_TILE
#define MMA_TILE 32
#endif
#ifndef PLANES
#define PLANES 2
#endif
#define D HEAD_DIM
#define DP ((D + 8 * WSPLIT - 1) / (8 * WSPLIT) * (8 * WSPLIT)) /* padded columns */
#define DW (DP / WSPLIT)     /* a warp's columns */
#define KW (DW / 8)          /* its k-steps (and n-tiles) along head_dim */
#define STRIDE (DP + 4)      /* local rows padded: fragment reads hit 32 banks */
#define LANES (WARPS * 32)
#define WG_ROWS (WARPS / WSPLIT * 16)
#define TILE MMA_TILE        /* keys (query side) or queries (key side) per tile */
#define NT (TILE / 8)        /* n-tiles of a tile's rows */
#define PLANE (TILE * STRIDE)
#define TILE_FLOATS (PLANES * PLANE)
#define ROW_AT (2 * TILE_FLOATS)    /* m, l and Dsum of a tile's rows */
#define XCH_AT (ROW_AT + 3 * TILE)  /* partial S and dP blocks of every warp */
#define XCH_MAT (WARPS * NT * 4 * 32)
#if WSPLIT > 1
#define XCH_FLOATS (2 * XCH_MAT)
#else
#define XCH_FLOATS 0
#endif
#define EMU_AT (XCH_AT + XCH_FLOATS)
#define EMU_FLOATS 224
#ifdef MMA_EMULATE
#define MMA_LOCAL_FLOATS (EMU_AT + WARPS * EMU_FLOATS)
#else
#define MMA_LOCAL_FLOATS EMU_AT
#endif

#ifdef MMA_EMULATE
#define UNROLL
#else
#define UNROLL _Pragma("unroll")
#endif

inline ulong at(uint b, uint rows, uint row, uint heads, uint head, uint d)
{
    return (((ulong)b * rows + row) * heads + head) * D + d;
}

/* The first query row of the work-group's block: under the causal mask the
 * last blocks have the most keys, so they go first. */
inline uint query_block(uint q_seq, int causal)
{
    const uint blocks = (q_seq + WG_ROWS - 1u) / WG_ROWS;
    return (causal ? blocks - 1u - get_group_id(0) : get_group_id(0)) * WG_ROWS;
}

/* Whether every query of [q_first, q_last] sees every key of [k_first,
 * k_last]: such tiles skip the mask. */
inline bool all_visible(ulong q_first, ulong q_last, ulong k_first, ulong k_last, int causal,
                        uint window)
{
    return (!causal || k_last <= q_first) && (window == 0u || q_last < k_first + window);
}

/* x rounded to tf32 (10 mantissa bits), as mma reads it. */
inline uint tf32(float x) { return (as_uint(x) + 0x1000u) & 0xffffe000u; }

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

/* x of the lane whose id differs from this one's in the bits of mask. */
inline float shfl_xor(float x, uint mask, __local float *emu)
{
#ifdef MMA_EMULATE
    __local float *ex = emu + 192;
    const uint lane = get_local_id(0) & 31u;
    ex[lane] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float y = ex[lane ^ mask];
    barrier(CLK_LOCAL_MEM_FENCE);
    return y;
#else
    uint y;
    __asm__ __volatile__("shfl.sync.bfly.b32 %0, %1, %2, 31, -1;" : "=r"(y) : "r"(as_uint(x)), "r"(mask));
    return as_float(y);
#endif
}

/* Sum and max over the four lanes (t = 0..3) that hold one row. */
inline float row_sum(float x, __local float *emu)
{
    x += shfl_xor(x, 1u, emu);
    return x + shfl_xor(x, 2u, emu);
}

inline float row_max(float x, __local float *emu)
{
    x = fmax(x, shfl_xor(x, 1u, emu));
    return fmax(x, shfl_xor(x, 2u, emu));
}

/* A tile's elements that one lane loads. */
#define PER_LANE ((TILE * DP + LANES - 1) / LANES)

/* Fetches this lane's share of rows [r0, r0 + TILE) of a [batch][rows]
 * [heads][D] tensor, times factor, into registers x; zeros past `end` and
 * past D. Fetched a tile ahead, the loads are in flight while the current
 * tile is computed. */
inline void fetch_tile(float *x, __global const float *src, uint b, uint rows, uint r0, uint end,
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
inline void load_a(float *a, __global const float *src, uint b, uint rows, uint row0, uint heads,
                   uint head, uint col, float factor)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (int i = 0; i < 4; ++i) {
        const uint row = row0 + ((i & 1) ? 8u : 0u), d = col + t + ((i & 2) ? 4u : 0u);
        a[i] = row < rows && d < D ? src[at(b, rows, row, heads, head, d)] * factor : 0.0f;
    }
}

/* The A operand, big and small, of a product over a tile's rows from a
 * 16 x 8 accumulator block c (tile rows n * 8 ..): permuted as the header
 * says. */
inline void c_to_a(const float *c, uint *big, uint *small)
{
    const float a[4] = {c[0], c[2], c[1], c[3]};
    split4(a, big, small);
}

inline void zero(float *x, int n)
{
    UNROLL
    for (int i = 0; i < n; ++i)
        x[i] = 0.0f;
}

/* The warps of a group add their partial NT x 4 blocks x (over their own
 * columns): each stores its block in mat, and after the caller's barrier
 * xch_sum gives every one of them the sum, added in the same order. */
inline void xch_store(const float *x, __local float *mat, uint warp, uint lane)
{
    UNROLL
    for (uint i = 0; i < NT * 4; ++i)
        mat[(warp * NT * 4 + i) * 32 + lane] = x[i];
}

inline void xch_sum(float *x, __local const float *mat, uint warp, uint lane)
{
    const uint first = warp / WSPLIT * WSPLIT;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        float sum = 0.0f;
        UNROLL
        for (uint w = 0; w < WSPLIT; ++w)
            sum += mat[((first + w) * NT * 4 + i) * 32 + lane];
        x[i] = sum;
    }
}

/* s (and dp, when not NULL) summed over the warps of the group. */
inline void sum_over_split(float *s, float *dp, __local float *xch, uint warp, uint lane)
{
#if WSPLIT > 1
    xch_store(s, xch, warp, lane);
    if (dp)
        xch_store(dp, xch + XCH_MAT, warp, lane);
    barrier(CLK_LOCAL_MEM_FENCE);
    xch_sum(s, xch, warp, lane);
    if (dp)
        xch_sum(dp, xch + XCH_MAT, warp, lane);
#endif
}

/* The warp's 16 x TILE block of a . x^T over its columns into s, x a tile
 * of TILE rows, and of c . y^T into dp unless dp is NULL; each summed over
 * the warps of the group. a and c are the warp's KW A fragments. */
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
    for (uint ks = 0; ks < KW; ++ks) {
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

/* ---- forward --------------------------------------------------------- */

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
forward__mma(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
             __global const float *v, ulong v_off, __global float *o, ulong o_off,
             __global float *lse, ulong lse_off, SHAPE_ARGS, __local float *tiles)
{
    q += q_off;
    k += k_off;
    v += v_off;
    o += o_off;
    lse += lse_off;
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    __local float *kt = tiles, *vt = tiles + TILE_FLOATS, *xch = tiles + XCH_AT;
    __local float *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;

    float qf[KW][4]; /* Q * scale: this lane's part of its rows and columns */
    UNROLL
    for (uint ks = 0; ks < KW; ++ks)
        load_a(qf[ks], q, b, q_seq, row0, num_heads, head, d0 + ks * 8, scale);
    float acc[KW][4];
    zero(&acc[0][0], KW * 4);
    float m0 = EMPTY_ROW, m1 = EMPTY_ROW, l0 = 0.0f, l1 = 0.0f;

    const uint last = min(r0 + WG_ROWS, q_seq) - 1u;
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, &lo, &hi);
    float kx[PER_LANE], vx[PER_LANE];
    fetch_tile(kx, k, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    fetch_tile(vx, v, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);
        store_tile(kt, kx);
        store_tile(vt, vx);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            fetch_tile(kx, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
            fetch_tile(vx, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
        }

        float s[NT][4];
        tile_products(&s[0][0], 0, &qf[0][0], 0, kt, 0, d0, xch, emu);
        /* Only tiles that some row sees in part are masked. */
        const bool whole =
            t0 + TILE <= hi && all_visible(r0, last, t0, t0 + TILE - 1u, causal, window);
        float mx0 = EMPTY_ROW, mx1 = EMPTY_ROW;
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            UNROLL
            for (int i = 0; i < 4; ++i) {
                const uint key = t0 + n * 8 + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
                if (!whole && (key >= hi || !visible(row, key, causal, window)))
                    s[n][i] = EMPTY_ROW;
                if (i & 2)
                    mx1 = fmax(mx1, s[n][i]);
                else
                    mx0 = fmax(mx0, s[n][i]);
            }
        }
        const float n0 = fmax(m0, row_max(mx0, emu)), n1 = fmax(m1, row_max(mx1, emu));
        const float c0 = exp(m0 - n0), c1 = exp(m1 - n1);
        m0 = n0;
        m1 = n1;
        float sum0 = 0.0f, sum1 = 0.0f;
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            UNROLL
            for (int i = 0; i < 4; ++i) {
                /* Masked scores are exactly EMPTY_ROW; their weight is 0
                 * even while the row's max is EMPTY_ROW too. */
                const float e = s[n][i] == EMPTY_ROW ? 0.0f : exp(s[n][i] - ((i & 2) ? n1 : n0));
                s[n][i] = e;
                if (i & 2)
                    sum1 += e;
                else
                    sum0 += e;
            }
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
        UNROLL
        for (uint n = 0; n < KW; ++n) {
            acc[n][0] *= c0;
            acc[n][1] *= c0;
            acc[n][2] *= c1;
            acc[n][3] *= c1;
        }
        UNROLL
        for (uint j = 0; j < NT; ++j) {
            uint ab[4], as[4];
            c_to_a(s[j], ab, as);
            UNROLL
            for (uint n = 0; n < KW; ++n) {
                uint bb[2], bs[2];
                b_frag(vt, (j * 8 + 2 * t) * STRIDE + d0 + n * 8 + g, STRIDE, bb, bs);
                mma3(acc[n], ab, as, bb, bs, emu);
            }
        }
    }
    l0 = row_sum(l0, emu);
    l1 = row_sum(l1, emu);
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            const float l = (i & 2) ? l1 : l0;
            if (row < q_seq && d < D)
                o[at(b, q_seq, row, num_heads, head, d)] = l > 0.0f ? acc[n][i] / l : 0.0f;
        }
    }
    if (t == 0 && d0 == 0)
        for (int i = 0; i < 2; ++i) {
            const uint row = i ? row1 : row0;
            const float l = i ? l1 : l0, m = i ? m1 : m0;
            if (row < q_seq) {
                const ulong at_row = 2 * (((ulong)b * q_seq + row) * num_heads + head);
                lse[at_row] = l > 0.0f ? m : EMPTY_ROW;
                lse[at_row + 1] = l > 0.0f ? log(l) : EMPTY_ROW;
            }
        }
}

/* ---- grad-Q ---------------------------------------------------------- */

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_q__mma(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
            __global const float *v, ulong v_off, __global const float *d_out, ulong d_out_off,
            __global const float *lse, ulong lse_off, __global const float *dsum,
            ulong dsum_off, __global float *dq, ulong dq_off, SHAPE_ARGS,
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
    __local float *kt = tiles, *vt = tiles + TILE_FLOATS, *xch = tiles + XCH_AT;
    __local float *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;

    float qf[KW][4], of[KW][4], acc[KW][4];
    UNROLL
    for (uint ks = 0; ks < KW; ++ks) {
        load_a(qf[ks], q, b, q_seq, row0, num_heads, head, d0 + ks * 8, scale);
        load_a(of[ks], d_out, b, q_seq, row0, num_heads, head, d0 + ks * 8, 1.0f);
    }
    zero(&acc[0][0], KW * 4);
    float m[2], l[2], ds_row[2];
    for (int i = 0; i < 2; ++i) {
        const uint row = min(i ? row1 : row0, q_seq - 1u);
        const ulong at_row = ((ulong)b * q_seq + row) * num_heads + head;
        m[i] = lse[2 * at_row];
        l[i] = lse[2 * at_row + 1];
        ds_row[i] = dsum[at_row];
    }

    const uint last = min(r0 + WG_ROWS, q_seq) - 1u;
    uint lo, hi;
    keys_of_queries(r0, last, kv_seq, causal, window, &lo, &hi);
    float kx[PER_LANE], vx[PER_LANE];
    fetch_tile(kx, k, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    fetch_tile(vx, v, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
        barrier(CLK_LOCAL_MEM_FENCE);
        store_tile(kt, kx);
        store_tile(vt, vx);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            fetch_tile(kx, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
            fetch_tile(vx, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
        }

        float s[NT][4], dp[NT][4];
        tile_products(&s[0][0], &dp[0][0], &qf[0][0], &of[0][0], kt, vt, d0, xch, emu);
        const bool whole =
            t0 + TILE <= hi && all_visible(r0, last, t0, t0 + TILE - 1u, causal, window);
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            UNROLL
            for (int i = 0; i < 4; ++i) {
                const uint key = t0 + n * 8 + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
                const int r = (i & 2) ? 1 : 0;
                const float p = exp(fmin(s[n][i] - m[r], 0.0f) - l[r]);
                const bool keep = whole || (key < hi && visible(row, key, causal, window));
                s[n][i] = keep ? p * (dp[n][i] - ds_row[r]) : 0.0f;
            }
        }
        UNROLL
        for (uint j = 0; j < NT; ++j) {
            uint ab[4], as[4];
            c_to_a(s[j], ab, as);
            UNROLL
            for (uint n = 0; n < KW; ++n) {
                uint bb[2], bs[2];
                b_frag(kt, (j * 8 + 2 * t) * STRIDE + d0 + n * 8 + g, STRIDE, bb, bs);
                mma3(acc[n], ab, as, bb, bs, emu);
            }
        }
    }
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            if (row < q_seq && d < D)
                dq[at(b, q_seq, row, num_heads, head, d)] = scale * acc[n][i];
        }
    }
}

/* ---- grad-K and grad-V ----------------------------------------------- */

/* m, l and (want_dk) Dsum of query row p0 + lid of a tile, for the lanes
 * lid < TILE; zeros past `end`. */
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

/* dK and/or dV of the work-group's WG_ROWS keys: every query row of every
 * head of the group that sees any of them streams through local memory
 * TILE rows at a time, with its LSE pair and Dsum. */
inline void key_side(__global const float *q, __global const float *k, __global const float *v,
                     __global const float *d_out, __global const float *lse,
                     __global const float *dsum, __global float *dk, __global float *dv,
                     uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, int causal,
                     uint window, float scale, __local float *tiles, bool want_dk,
                     bool want_dv)
{
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    __local float *qt = tiles, *ot = tiles + TILE_FLOATS, *xch = tiles + XCH_AT;
    __local float *mt = tiles + ROW_AT, *lt = mt + TILE, *dt = lt + TILE;
    __local float *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
    const uint group = num_heads / num_kv_heads;
    const uint r0 = get_group_id(0) * WG_ROWS; /* causal: the first blocks are the heaviest */
    const uint key0 = r0 + warp / WSPLIT * 16u + g, key1 = key0 + 8u;

    float kf[KW][4], vf[KW][4], dkf[KW][4], dvf[KW][4];
    UNROLL
    for (uint ks = 0; ks < KW; ++ks) {
        load_a(kf[ks], k, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * 8, 1.0f);
        if (want_dk)
            load_a(vf[ks], v, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * 8, 1.0f);
    }
    zero(&dkf[0][0], KW * 4);
    zero(&dvf[0][0], KW * 4);
    const uint last = min(r0 + WG_ROWS, kv_seq) - 1u;
    uint lo, hi;
    queries_of_keys(r0, last, q_seq, causal, window, &lo, &hi);

    /* One loop over (head of the group, tile of its queries), so that the
     * next tile is fetched while this one is computed. */
    const uint per_head = (hi - lo + TILE - 1u) / TILE, steps = lo < hi ? group * per_head : 0u;
    float qx[PER_LANE], ox[PER_LANE], rx[3];
    fetch_tile(qx, q, b, q_seq, lo, hi, num_heads, kv_head * group, scale);
    fetch_tile(ox, d_out, b, q_seq, lo, hi, num_heads, kv_head * group, 1.0f);
    fetch_rows(rx, lse, dsum, b, q_seq, lo, hi, num_heads, kv_head * group, want_dk);
    for (uint step = 0; step < steps; ++step) {
        const uint p0 = lo + step % per_head * TILE;
        barrier(CLK_LOCAL_MEM_FENCE);
        store_tile(qt, qx);
        store_tile(ot, ox);
        if (lid < TILE) {
            mt[lid] = rx[0];
            lt[lid] = rx[1];
            dt[lid] = rx[2];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (step + 1u < steps) {
            const uint head = kv_head * group + (step + 1u) / per_head;
            const uint next = lo + (step + 1u) % per_head * TILE;
            fetch_tile(qx, q, b, q_seq, next, hi, num_heads, head, scale);
            fetch_tile(ox, d_out, b, q_seq, next, hi, num_heads, head, 1.0f);
            fetch_rows(rx, lse, dsum, b, q_seq, next, hi, num_heads, head, want_dk);
        }

        /* S^T and dP^T: 16 keys x TILE queries per warp. */
        float s[NT][4], dp[NT][4];
        tile_products(&s[0][0], want_dk ? &dp[0][0] : 0, &kf[0][0], &vf[0][0], qt, ot, d0, xch,
                      emu);
        const bool whole = p0 + TILE <= hi &&
                           all_visible(p0, (ulong)p0 + TILE - 1u, r0, last, causal, window);
        UNROLL
        for (uint n = 0; n < NT; ++n) {
            UNROLL
            for (int i = 0; i < 4; ++i) {
                const uint j = n * 8 + 2 * t + (i & 1), key = (i & 2) ? key1 : key0;
                const float p = exp(fmin(s[n][i] - mt[j], 0.0f) - lt[j]);
                const bool keep =
                    whole || (p0 + j < hi && visible(p0 + j, key, causal, window));
                s[n][i] = keep ? p : 0.0f;
                dp[n][i] = keep && want_dk ? p * (dp[n][i] - dt[j]) : 0.0f;
            }
        }
        UNROLL
        for (uint j = 0; j < NT; ++j) {
            uint pb[4], ps[4], db[4], dsm[4];
            if (want_dv)
                c_to_a(s[j], pb, ps);
            if (want_dk)
                c_to_a(dp[j], db, dsm);
            UNROLL
            for (uint n = 0; n < KW; ++n) {
                const uint at_q = (j * 8 + 2 * t) * STRIDE + d0 + n * 8 + g;
                uint bb[2], bs[2];
                if (want_dv) {
                    b_frag(ot, at_q, STRIDE, bb, bs);
                    mma3(dvf[n], pb, ps, bb, bs, emu);
                }
                if (want_dk) {
                    b_frag(qt, at_q, STRIDE, bb, bs);
                    mma3(dkf[n], db, dsm, bb, bs, emu);
                }
            }
        }
    }
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint key = (i & 2) ? key1 : key0, d = d0 + n * 8 + 2 * t + (i & 1);
            if (key < kv_seq && d < D) {
                const ulong x = at(b, kv_seq, key, num_kv_heads, kv_head, d);
                if (want_dk)
                    dk[x] = dkf[n][i];
                if (want_dv)
                    dv[x] = dvf[n][i];
            }
        }
    }
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_v__mma(__global const float *d_out, ulong d_out_off, __global const float *q, ulong q_off,
            __global const float *k, ulong k_off, __global const float *lse, ulong lse_off,
            __global float *dv, ulong dv_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, k + k_off, d_out + d_out_off, lse + lse_off, lse + lse_off,
             dv + dv_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window,
             scale, tiles, false, true);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_k__mma(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
            __global const float *v, ulong v_off, __global const float *d_out, ulong d_out_off,
            __global const float *lse, ulong lse_off, __global const float *dsum,
            ulong dsum_off, __global float *dk, ulong dk_off, SHAPE_ARGS,
            __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dk + dk_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window,
             scale, tiles, true, false);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kv__mma(__global const float *q, ulong q_off, __global const float *k, ulong k_off,
             __global const float *v, ulong v_off, __global const float *d_out, ulong d_out_off,
             __global const float *lse, ulong lse_off, __global const float *dsum,
             ulong dsum_off, __global float *dk, ulong dk_off, __global float *dv, ulong dv_off,
             SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window,
             scale, tiles, true, true);
}
