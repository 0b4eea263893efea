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
 * 16-bit tensors (DTYPE 1 float16, 2 bfloat16) use the 16-bit tensor-core
 * product instead, mma.sync m16n8k16 with float32 accumulation, on the
 * tensors' own bits: one product per k-step of 16, no splitting. Its
 * layouts (PTX ISA, .f16/.bf16; each register holds two elements, the
 * lower k in the lower half): A (16 x 16) a0 (g, 2t..2t+1), a1 (g + 8,
 * 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..); B (16 x 8) b0 (2t..2t+1,
 * g), b1 (2t + 8.., g); C as above. Two neighbouring 8-column C blocks are
 * then exactly one A fragment, so the probabilities (and dS) go back into
 * mma as 16-bit operands, rounded to nearest even, as FlashAttention does,
 * with no permutation. A B operand wants two consecutive k of one n: for
 * products over head_dim (S = Q K^T) those are a row's neighbouring
 * columns, for products over a tile's rows (P V) two rows' elements of one
 * column. A tile is kept by rows (words of two elements) and ldmatrix
 * reads both kinds of B operand from it, the second with .trans. Tiles
 * reach local memory through cp.async, 16 bytes a lane and no registers on
 * the way, into two buffers: the next tile is copied into one while the
 * work-group reads the other, one barrier a tile (fp32's tiles are fetched
 * into registers a tile ahead and stored, split, between two barriers).
 * Q's scale is applied to the scores in float32 (and to dK at the end),
 * not to the 16-bit operands, which would round again. Softmax, the LSE,
 * Dsum and every sum are float32, as for float32 tensors.
 *
 * HEAD_DIM, WARPS, WSPLIT, MMA_TILE, PLANES and DTYPE are compile-time
 * defines, chosen per head_dim by src/opencl.c; with the defaults the file
 * compiles after cl/common.cl, the prelude every program starts with.
 * Columns are padded with zeros to a multiple of KSTEP * WSPLIT.
 * Launch: global (blocks * LANES, heads, batch), local (LANES, 1, 1),
 * blocks = ceil(rows / WG_ROWS); `tiles` is a __local buffer of
 * TILES_AT floats plus the kernel's tiles (src/opencl.c's
 * mma_local_floats mirrors this).
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
#if DTYPE == 0
#define KSTEP 8  /* k of one product: tf32 */
#else
#define KSTEP 16 /* f16, bf16 */
#endif
/* 16-bit tensors take their exponentials in base 2, one ex2.approx a
 * score as FlashAttention does: their scores are scaled into units of
 * log2(e) (with Q's scale, in one product), the LSE pairs read and written
 * in natural units. float32's keep exp() (FAST_EXP=0 does for 16-bit). */
#ifndef FAST_EXP
#define FAST_EXP (DTYPE != 0)
#endif
/* native_exp2 compiles to ex2.approx.f32, which keeps subnormal inputs
 * and results: ptxas makes it five instructions where ex2.approx.ftz.f32
 * is one (a cubin of four of each, sm_90: 40 instructions against 24).
 * A weight below 2^-126 flushed to 0 changes no sum that matters (FTZ_EX2=0
 * keeps native_exp2). */
#ifndef FTZ_EX2
#define FTZ_EX2 1
#endif
inline float exp2_ftz(float x)
{
#if FTZ_EX2 && !defined(MMA_EMULATE)
    float y;
    __asm__("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return native_exp2(x);
#endif
}
/* The backward's P = exp(s - m - l) of a 16-bit kernel as one exponent,
 * s - (m + l), clamped at 0 (P <= 1 whatever the scores' rounding), where
 * float32's clamp s - m at 0 and subtract l after (FOLD_ML=0 does so for
 * 16-bit too). m + l rounds once: a relative error of P below 2^-24
 * |m + l|, far under the outputs' 16-bit rounding. */
#ifndef FOLD_ML
#define FOLD_ML 1
#endif
#if FAST_EXP && DTYPE != 0
#define EXP_UNIT 1.44269504088896341f /* log2(e) */
#define EXPU(x) exp2_ftz(x)
#else
#define EXP_UNIT 1.0f
#define EXPU(x) exp(x)
#endif
#define D HEAD_DIM
#define DP ((D + KSTEP * WSPLIT - 1) / (KSTEP * WSPLIT) * (KSTEP * WSPLIT)) /* padded */
/* WGMMA 1: the 16-bit forward's two products on Hopper's warpgroup
 * products (wgmma, sm_90a), its tiles laid out as their descriptors read
 * them; below, "the forward on wgmma". */
#ifndef WGMMA
#define WGMMA 0
#endif
#if WGMMA && (DTYPE == 0 || WARPS % 4 != 0 || WSPLIT != 1 || (D != 64 && D != 128) || \
              MMA_TILE % 32 != 0 || MMA_TILE > 128)
#error "WGMMA wants 16-bit tensors, warpgroups, WSPLIT 1, head_dim 64 or 128, tiles 32 to 128"
#endif
#define DW (DP / WSPLIT)     /* a warp's columns */
#define KW (DW / 8)          /* its n-tiles along head_dim */
#define KS (DW / KSTEP)      /* its k-steps along head_dim */
#define LANES (WARPS * 32)
#define WG_ROWS (WARPS / WSPLIT * 16)
#define TILE MMA_TILE        /* keys (query side) or queries (key side) per tile */
#define NT (TILE / 8)        /* n-tiles of a tile's rows */
#if DTYPE == 0
#define STRIDE (DP + 4)      /* local rows padded: fragment reads hit 32 banks */
#define PLANE (TILE * STRIDE)
#define ROW_TILE (PLANES * PLANE) /* floats of a tile (read by rows only) */
#define PER_LANE ((TILE * DP + LANES - 1) / LANES) /* a tile's elements per lane */
typedef float frag;          /* an A register: one fp32 element */
typedef float chunk;         /* what a lane fetches at once, a tile ahead */
#else
#if WGMMA
#define RW (DP / 2)          /* words per row of a tile (swizzled, not padded) */
#else
#define RW (DP / 2 + 4)      /* words per row of a tile (padded: 32 banks, 16-byte rows) */
#endif
#define ROW_TILE (TILE * RW)
#if HEAD_DIM % 8 == 0
#define UNIT 8               /* elements a lane copies at once: 16 bytes */
#else
#define UNIT 2
#endif
#define PER_LANE ((TILE * DP / UNIT + LANES - 1) / LANES) /* a tile's units per lane */
typedef uint frag;           /* an A register: two 16-bit elements */
#endif
#define XCH_MAT (WARPS * NT * 4 * 32)
#if WSPLIT > 1
#define XCH_FLOATS (2 * XCH_MAT)
#else
#define XCH_FLOATS 0
#endif
#if DTYPE == 0
#define EMU_FLOATS 224 /* A 16 x 8, B 8 x 8, a warp's shuffle */
#else
#define EMU_FLOATS 416 /* A 16 x 16, B 16 x 8, a warp's shuffle */
#endif
#define EMU_SHFL (EMU_FLOATS - 32)
#ifdef MMA_EMULATE
#define EMU_TOTAL (WARPS * EMU_FLOATS)
#else
#define EMU_TOTAL 0
#endif
/* The local buffer: m, l and Dsum of a tile's rows, the partial S and dP
 * blocks of every warp, the emulation's scratch, then the kernel's tiles.
 * fp32's tiles (and rows) are one of each, stored from registers fetched a
 * tile ahead; 16-bit ones two, copied into one while the other is read. */
#if DTYPE == 0
#define BUFFERS 1
#else
#define BUFFERS 2
#endif
#define ROW_AT 0
#define XCH_AT (3 * TILE * BUFFERS)
#define EMU_AT (XCH_AT + XCH_FLOATS)
#define TILES_AT (EMU_AT + EMU_TOTAL)

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
 * k_last] (queries at global position + delta in the keys' terms): such
 * tiles skip the mask. */
inline bool all_visible(long q_first, long q_last, long k_first, long k_last, int causal,
                        uint window, long delta)
{
    return (!causal || k_last <= q_first + delta) &&
           (window == 0u || q_last + delta < k_first + (long)window);
}

/* The local buffer as the kernels lay it out. 16-bit tiles are read by
 * ldmatrix and written 16 bytes at a time, which want them aligned, and a
 * __local argument is promised only its element's alignment: for them the
 * buffer starts at its first 16-byte boundary (src/opencl.c gives 3 floats
 * more). fp32's kernels do without: computed from the pointer's bits, the
 * base cost them 64-bit address arithmetic and up to 80 registers (175 ->
 * 255 in the d64 forward, by ptxas). */
inline __local float *tile_base(__local float *p)
{
#if WGMMA /* swizzled tiles start at a 1024-byte boundary (src/opencl.c gives 256 floats more) */
    return p + ((1024u - ((uint)(ulong)(p + TILES_AT) & 1023u)) & 1023u) / 4u;
#elif DTYPE != 0
    return p + ((16u - ((uint)(ulong)p & 15u)) & 15u) / 4u;
#else
    return p;
#endif
}

/* x of the lane whose id differs from this one's in the bits of mask. */
inline float shfl_xor(float x, uint mask, __local float *emu)
{
#ifdef MMA_EMULATE
    __local float *ex = emu + EMU_SHFL;
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

inline void zero(float *x, int n)
{
    UNROLL
    for (int i = 0; i < n; ++i)
        x[i] = 0.0f;
}

/* x *= f over n values: Q's scale on 16-bit scores and dK. */
inline void scale_by(float *x, int n, float f)
{
    UNROLL
    for (int i = 0; i < n; ++i)
        x[i] *= f;
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

#if DTYPE == 0
/* ---- fp32 tensors: 3xTF32 on m16n8k8 ---------------------------------- */

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

#else
/* ---- 16-bit tensors: m16n8k16 ----------------------------------------- */

/* A 16-bit element's value. */
inline float from16(uint h)
{
#if DTYPE == 2
    return as_float(h << 16);
#else
    const ushort u = (ushort)h;
    return vload_half(0, (const __private half *)&u);
#endif
}

/* Two floats as one operand register, each rounded to nearest even: lo in
 * the lower half. */
inline uint pack2(float lo, float hi)
{
#ifdef MMA_EMULATE
#if DTYPE == 2
    return (uint)bf16_rte(lo) | (uint)bf16_rte(hi) << 16;
#else
    ushort u[2];
    vstore_half_rte(lo, 0, (__private half *)u);
    vstore_half_rte(hi, 1, (__private half *)u);
    return (uint)u[0] | (uint)u[1] << 16;
#endif
#else
    uint r;
#if DTYPE == 2
    __asm__("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    __asm__("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
#endif
}

/* c += a . b for one 16 x 8 x 16 product of the warp. */
inline void mma16(float *c, const uint *a, const uint *b, __local float *emu)
{
#ifdef MMA_EMULATE
    const uint lane = get_local_id(0) & 31u, g = lane >> 2, t = lane & 3u;
    __local float *ea = emu, *eb = emu + 256;
    for (int i = 0; i < 4; ++i) {
        const uint row = g + ((i & 1) ? 8u : 0u), col = 2 * t + ((i & 2) ? 8u : 0u);
        ea[row * 16 + col] = from16(a[i] & 0xffffu);
        ea[row * 16 + col + 1] = from16(a[i] >> 16);
    }
    for (int i = 0; i < 2; ++i) {
        const uint k = 2 * t + (i ? 8u : 0u);
        eb[k * 8 + g] = from16(b[i] & 0xffffu);
        eb[(k + 1) * 8 + g] = from16(b[i] >> 16);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = 0; k < 16; ++k) {
        c[0] = fma(ea[g * 16 + k], eb[k * 8 + 2 * t], c[0]);
        c[1] = fma(ea[g * 16 + k], eb[k * 8 + 2 * t + 1], c[1]);
        c[2] = fma(ea[(g + 8) * 16 + k], eb[k * 8 + 2 * t], c[2]);
        c[3] = fma(ea[(g + 8) * 16 + k], eb[k * 8 + 2 * t + 1], c[3]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#else
#if DTYPE == 2
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* The bits of p[0] and p[1], elements d and d + 1 of a row, as one word;
 * zeros past D (p is read only below D). */
inline uint pair_at(__global const ushort *p, uint d)
{
    return (d < D ? (uint)p[0] : 0u) | (d + 1u < D ? (uint)p[1] << 16 : 0u);
}

/* Where unit j of a tile lies for this lane: row *r and column *d; false
 * past the tile's last unit. When LANES is a whole number of rows' units,
 * a lane keeps its column and steps by whole rows, so that its addresses
 * are one base and constant offsets. */
#define ROW_UNITS (DP / UNIT)
inline bool unit_at(uint j, uint *r, uint *d)
{
    const uint lid = get_local_id(0);
    if (LANES % ROW_UNITS == 0) {
        *r = lid / ROW_UNITS + j * (LANES / ROW_UNITS);
        *d = lid % ROW_UNITS * UNIT;
    } else {
        *r = (lid + j * LANES) / ROW_UNITS;
        *d = (lid + j * LANES) % ROW_UNITS * UNIT;
    }
    return TILE * DP / UNIT % LANES == 0 || lid + j * LANES < TILE * DP / UNIT;
}

/* 16-bit tiles go from global to local memory without registers: on the
 * GPU through cp.async, 16 or 4 bytes a lane, zero-filled where src_in is
 * false (src is then only a valid address), landing by the next
 * wait_copies(); emulated, by plain loads and stores at once. */
inline void copy16(__local uint *dst, __global const void *src, bool src_in)
{
#ifdef MMA_EMULATE
    *(__local uint4 *)dst = src_in ? *(__global const uint4 *)src : (uint4)(0u);
#else
    __asm__ __volatile__("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                         :
                         : "r"((uint)(ulong)dst), "l"(src), "r"(src_in ? 16u : 0u)
                         : "memory");
#endif
}

inline void copy4(__local float *dst, __global const float *src, bool src_in)
{
#ifdef MMA_EMULATE
    *dst = src_in ? *src : 0.0f;
#else
    __asm__ __volatile__("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                         :
                         : "r"((uint)(ulong)dst), "l"(src), "r"(src_in ? 4u : 0u)
                         : "memory");
#endif
}

/* Waits for this lane's copies; a barrier then shows everyone's. */
inline void wait_copies(void)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__("cp.async.wait_all;" ::: "memory");
#endif
}

/* The pair of tiles (two tensors') of the double buffer other than `pair`. */
inline __local float *other_pair(__local float *tiles, __local float *pair)
{
    return pair == tiles + TILES_AT ? pair + 2 * ROW_TILE : tiles + TILES_AT;
}

/* The same for the rows' m, l and Dsum (key side). */
inline __local float *other_rows(__local float *tiles, __local float *rows)
{
    return rows == tiles + ROW_AT ? rows + 3 * TILE : tiles + ROW_AT;
}

/* Copies rows [r0, r0 + TILE) of a [batch][rows][heads][D] tensor into a
 * tile ([TILE][RW] words), zeros past `end` and past D: 16 bytes a lane
 * where D is a multiple of 8 and the tensor starts 16-byte aligned, as
 * buffers and their usual offsets do, element-wise (and at once) where
 * not. The head's start and a lane's row offsets do not change from tile
 * to tile, and are computed apart from r0 so that the compiler keeps them
 * out of the loop; a tile wholly before `end` whose units fill the lanes
 * (COPY_WHOLE) goes with no test a unit: a pointer step and the copy (on
 * the H200 a 16-bit d128 tile's copies were 60 instructions a warp, 40 of
 * them 64-bit address arithmetic redone every tile). */
/* One unit of a row (elements d.. of it at p) to local words `to`; zeros
 * where `in` is false (p is then not read: bits, the tensor's start, is
 * the valid address cp.async is given instead). copy_tile's and
 * copy_tile_sw's. */
inline void copy_unit(__local uint *to, __global const ushort *p, __global const ushort *bits,
                      bool in, bool aligned, uint d)
{
#if UNIT == 8
    if (aligned) {
        copy16(to, in ? p : bits, in);
    } else {
        uint w[4];
        UNROLL
        for (int k = 0; k < 4; ++k)
            w[k] = in ? (uint)p[2 * k] | (uint)p[2 * k + 1] << 16 : 0u;
        *(__local uint4 *)to = (uint4)(w[0], w[1], w[2], w[3]);
    }
#else
    *to = in ? pair_at(p, d) : 0u;
#endif
}

#define COPY_WHOLE (UNIT == 8 && DP == D && LANES % ROW_UNITS == 0 && \
                    TILE * DP / UNIT % LANES == 0)
inline void copy_tile(__local float *tile, __global const elem *src, uint b, uint rows, uint r0,
                      uint end, uint heads, uint head)
{
    __global const ushort *bits = (__global const ushort *)src;
    const uint stride = heads * D; /* elements from one row to the next */
    __global const ushort *base = bits + at(b, rows, 0, heads, head, 0) + (ulong)r0 * stride;
    __local uint *words = (__local uint *)tile;
    const bool aligned = ((ulong)bits & 15u) == 0u;
#if UNIT == 8
#if COPY_WHOLE
    if (aligned && r0 + TILE <= end) {
        const uint lid = get_local_id(0);
        __global const ushort *p = base + (lid / ROW_UNITS) * stride + lid % ROW_UNITS * UNIT;
        __local uint *to = words + lid / ROW_UNITS * RW + lid % ROW_UNITS * (UNIT / 2);
        UNROLL
        for (uint j = 0; j < PER_LANE; ++j)
            copy16(to + j * (LANES / ROW_UNITS) * RW, p + j * (LANES / ROW_UNITS) * stride, true);
        return;
    }
#endif
#endif
    UNROLL
    for (uint j = 0; j < PER_LANE; ++j) {
        uint r, d;
        if (!unit_at(j, &r, &d))
            continue;
        copy_unit(words + r * RW + d / 2, base + r * stride + d, bits, r0 + r < end && d < D,
                  aligned, d);
    }
}

/* An A fragment (16 rows from row0 and row1 = row0 + 8, the 16 columns
 * from col) of a [batch][rows][heads][D] tensor; zeros past `rows` and D. */
inline void load_a(uint *a, __global const elem *src, uint b, uint rows, uint row0, uint heads,
                   uint head, uint col, float factor)
{
    __global const ushort *bits = (__global const ushort *)src;
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (int i = 0; i < 4; ++i) {
        const uint row = row0 + ((i & 1) ? 8u : 0u), d = col + 2 * t + ((i & 2) ? 8u : 0u);
        a[i] = row < rows ? pair_at(bits + at(b, rows, row, heads, head, d), d) : 0u;
    }
}

/* B fragments from a tile (words, RW a row). On the GPU ldmatrix reads four
 * 8 x 8 matrices of 16-bit elements, each lane naming one matrix row of 16
 * bytes (lane / 8 the matrix, lane % 8 the row) and receiving, per matrix,
 * the two elements its fragment wants, transposed on the way with .trans;
 * emulated, the same words are gathered element by element. Each lane's
 * address is one pointer per tile and constant offsets. */
#if !defined(MMA_EMULATE) && !defined(LDMATRIX)
#define LDMATRIX 1
#endif

/* For S = A . X^T (k along the tile's columns): the B fragments of n-tiles
 * n and n + 1 (tile rows 8n..8n + 15) at k-step columns [k0, k0 + 16), k0
 * past this warp's first column. x is the tile from rows_lane(). */
inline __local const uint *rows_lane(__local const float *tile, uint d0)
{
    const uint lane = get_local_id(0) & 31u;
    __local const uint *x = (__local const uint *)tile + d0 / 2;
#if LDMATRIX
    const uint m = lane >> 3;
    return x + ((m >> 1) * 8 + (lane & 7u)) * RW + (m & 1u) * 4;
#else
    return x + (lane >> 2) * RW + (lane & 3u);
#endif
}

inline void b_rows(uint *r, __local const uint *x, uint n, uint k0)
{
#if LDMATRIX
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"((uint)(ulong)(x + n * 8 * RW + k0 / 2)));
#else
    UNROLL
    for (uint i = 0; i < 4; ++i)
        r[i] = x[(n + (i >> 1)) * 8 * RW + k0 / 2 + (i & 1u) * 4];
#endif
}

/* For A . X (k along the tile's rows): the B fragments of the n-tiles at
 * columns c0 and c0 + 8 past this warp's first, k-step rows [k0, k0 + 16).
 * x is the tile from cols_lane(). */
inline __local const ushort *cols_lane(__local const float *tile, uint d0)
{
    const uint lane = get_local_id(0) & 31u;
    __local const ushort *x = (__local const ushort *)tile + d0;
#if LDMATRIX
    const uint m = lane >> 3;
    return x + ((m & 1u) * 8 + (lane & 7u)) * 2 * RW + (m >> 1) * 8;
#else
    return x + (lane & 3u) * 4 * RW + (lane >> 2); /* row 2t, column g */
#endif
}

inline void b_cols(uint *r, __local const ushort *x, uint c0, uint k0)
{
#if LDMATRIX
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"((uint)(ulong)(x + k0 * 2 * RW + c0)));
#else
    UNROLL
    for (uint i = 0; i < 4; ++i) {
        const uint at = (k0 + (i & 1u) * 8) * 2 * RW + c0 + (i >> 1) * 8;
        r[i] = (uint)x[at] | (uint)x[at + 2 * RW] << 16;
    }
#endif
}

/* The warp's 16 x TILE block of a . x^T over its columns into s, x a tile
 * of TILE rows, and of c . y^T into dp unless dp is NULL; each summed over
 * the warps of the group. a and c are the warp's KS A fragments. */
inline void tile_products(float *s, float *dp, const uint *a, const uint *c,
                          __local const float *x, __local const float *y, uint d0,
                          __local float *xch, __local float *emu)
{
    const uint lane = get_local_id(0) & 31u, warp = get_local_id(0) >> 5;
    __local const uint *xw = rows_lane(x, d0), *yw = y ? rows_lane(y, d0) : 0;
    zero(s, NT * 4);
    if (dp)
        zero(dp, NT * 4);
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        UNROLL
        for (uint n = 0; n < NT; n += 2) {
            uint bx[4];
            b_rows(bx, xw, n, ks * 16);
            mma16(s + n * 4, a + ks * 4, bx, emu);
            mma16(s + n * 4 + 4, a + ks * 4, bx + 2, emu);
            if (dp) {
                uint by[4];
                b_rows(by, yw, n, ks * 16);
                mma16(dp + n * 4, c + ks * 4, by, emu);
                mma16(dp + n * 4 + 4, c + ks * 4, by + 2, emu);
            }
        }
    }
    sum_over_split(s, dp, xch, warp, lane);
}

/* The A fragment of k-step kk of p, the warp's 16 x TILE block in float32
 * as accumulator blocks (a k-step's two 16 x 8 blocks, four floats each),
 * rounded to 16 bits and packed two to a word. */
inline void a_pack(uint a[4], const float *p, uint kk)
{
    const float *lo = p + 2 * kk * 4, *hi = lo + 4;
    a[0] = pack2(lo[0], lo[1]);
    a[1] = pack2(lo[2], lo[3]);
    a[2] = pack2(hi[0], hi[1]);
    a[3] = pack2(hi[2], hi[3]);
}

/* acc (the warp's KW 16 x 8 blocks of its columns) += p . x, p the warp's
 * 16 x TILE block in float32 (rounded here to 16 bits) and x a tile of
 * TILE rows. */
inline void tile_times(float *acc, const float *p, __local const float *x, uint d0,
                       __local float *emu)
{
    __local const ushort *xw = cols_lane(x, d0);
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk) {
        uint a[4];
        a_pack(a, p, kk);
        UNROLL
        for (uint n = 0; n < KW; n += 2) {
            uint bx[4];
            b_cols(bx, xw, n * 8, kk * 16);
            mma16(acc + n * 4, a, bx, emu);
            mma16(acc + n * 4 + 4, a, bx + 2, emu);
        }
    }
}

/* ---- the forward on wgmma (16-bit, sm_90a) ----------------------------- */

#if WGMMA
/* NVIDIA's OpenCL compiles for sm_90, whose assembler refuses wgmma: each
 * sm_90a instruction is inline PTX inside a comment that starts with
 * SM90A, and src/opencl.c builds the program's PTX again with the target
 * sm_90a and the markers taken out (tests/sm90a_probe.c checks the route).
 * The forward, grad-Q (dP = dO V^T beside S, dQ += dS K as O += P V) and
 * the key side (S^T = K Q^T and dP^T = V dO^T on the Q and dO tiles, dV
 * += P^T dO and dK += dS^T Q as O += P V).
 * A work-group is one or two warpgroups (64 query rows each); a product is
 * one wgmma m64nNk16 a k-step (N the tile's keys for S = Q K^T, head_dim
 * for O += P V) with A from registers (Q's fragments, P's packed, as
 * mma.sync takes them: warp w of a warpgroup holds its rows 16w..16w+15)
 * and B from a tile by a matrix descriptor. The accumulators come back in
 * mma.sync's C layout, so the softmax is the same code.
 *
 * Tiles are in the 128-byte swizzle: per 64 columns (an atom column, TILE
 * rows of 128 bytes), row j's 16-byte chunk c lands at chunk c ^ (j % 8).
 * A copy's 8 lanes of a phase then read one row's 128 contiguous bytes
 * and write one 128-byte row of banks; the tiles of core matrices (no
 * swizzle) this replaces had a phase read 8 rows and ran 0.6x as fast as
 * mma.sync's kernels, copies alone (without any product) as slow as the
 * whole.
 * S reads K's tile K-major (stride offset 1024: 8 rows; the leading offset
 * unused), P V reads V's MN-major (imm-trans-b 1; leading offset the step
 * between atom columns, stride offset 1024), both from one layout; atoms
 * start at 1024-byte boundaries. */
#define SM90A "// SM90A " /* src/sm90a.h's CLATTN_SM90A_MARK */
#define SW(j, d) ((d) / 64u * (TILE * 64u) + (j) * 64u + ((((d) % 64u) / 8u) ^ ((j) % 8u)) * 8u + (d) % 8u)

/* Rows [r0, r0 + TILE) of a [batch][rows][heads][D] tensor into a
 * swizzled tile, zeros past `end`: unit u (16 bytes, 8 columns of one row)
 * is row u / (DP / 8), columns (u % (DP / 8)) 8, as the tensor lies. */
inline void copy_tile_sw(__local float *tile, __global const elem *src, uint b, uint rows,
                         uint r0, uint end, uint heads, uint head)
{
    __global const ushort *bits = (__global const ushort *)src;
    const uint stride = heads * D;
    __global const ushort *base = bits + at(b, rows, 0, heads, head, 0) + (ulong)r0 * stride;
    __local ushort *halves = (__local ushort *)tile;
    const bool aligned = ((ulong)bits & 15u) == 0u;
    const uint lid = get_local_id(0), step = LANES / (DP / 8u); /* rows a pass */
    if (aligned && r0 + TILE <= end) {
        /* a whole tile: a lane's units are `step` rows apart (a multiple
         * of 8: the same swizzle), a pointer step each */
        const uint j = lid / (DP / 8u), d = lid % (DP / 8u) * 8u;
        __global const ushort *p = base + j * stride + d;
        __local ushort *to = halves + SW(j, d);
        UNROLL
        for (uint i = 0; i < TILE / step; ++i)
            copy16((__local uint *)(to + i * step * 64u), p + i * step * stride, true);
        return;
    }
    UNROLL
    for (uint i = 0; i < TILE / step; ++i) {
        const uint j = lid / (DP / 8u) + i * step, d = lid % (DP / 8u) * 8u;
        copy_unit((__local uint *)(halves + SW(j, d)), base + j * stride + d, bits, r0 + j < end,
                  aligned, d);
    }
}

/* Descriptor of a 128-byte-swizzled operand at `x`, offsets in bytes. */
inline ulong wg_desc(__local const ushort *x, uint lead, uint stride)
{
    return ((ulong)(((uint)(ulong)x & 0x3ffffu) >> 4)) | (ulong)(lead >> 4) << 16 |
           (ulong)(stride >> 4) << 32 | 1ul << 62;
}

inline void wg_fence(void)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__(SM90A "wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

/* Commits the products issued since the fence and waits for them; then
 * c's 16 values (each block passed to wg_hold) are read after it. */
inline void wg_commit_wait(void)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__(SM90A "wgmma.commit_group.sync.aligned;" ::: "memory");
    __asm__ __volatile__(SM90A "wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}

/* The empty asm statements below pin registers to their place in the
 * order: wgmma.fence orders only what is written before it, and a register
 * that a wgmma reads (its A operand) or adds into (its accumulators) must
 * not be written between that fence and the wgmma; the compiler would
 * otherwise be free to move such arithmetic past the fence, as CUTLASS's
 * fence_operand keeps it from doing. wg_hold: 16 accumulators. */
inline void wg_hold(float *c)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__(""
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]),
                           "+f"(c[5]), "+f"(c[6]), "+f"(c[7]), "+f"(c[8]), "+f"(c[9]),
                           "+f"(c[10]), "+f"(c[11]), "+f"(c[12]), "+f"(c[13]), "+f"(c[14]),
                           "+f"(c[15])::"memory");
#endif
}

/* The same for an A fragment. */
inline void wg_hold_a(uint *a)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])::"memory");
#endif
}

/* wg_hold on the accumulators of `cols` columns of c, and of c2 where
 * given (two products in one group), block by block. */
inline void wg_hold_cols(float *c, float *c2, uint cols)
{
    UNROLL
    for (uint n0 = 0; n0 < cols; n0 += 32) {
        wg_hold(c + n0 / 2);
        if (c2)
            wg_hold(c2 + n0 / 2);
    }
}

#if DTYPE == 2
#define WG_TYPES ".f32.bf16.bf16 "
#else
#define WG_TYPES ".f32.f16.f16 "
#endif
/* One wgmma.mma_async m64nNk16 a macro, N the tokens 32, 64, 96 or 128:
 * WG_LIST_N is its text up to imm-trans-b (c's N / 2 accumulators, then
 * the A fragment, scale-d and the descriptor), WG_C_N its accumulators as
 * operands. */
#define WG_LIST_32 "setp.ne.b32 p, %20, 0; wgmma.mma_async.sync.aligned.m64n32k16" WG_TYPES \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
    "{%16, %17, %18, %19}, %21, p, 1, 1, "
#define WG_LIST_64 "setp.ne.b32 p, %36, 0; wgmma.mma_async.sync.aligned.m64n64k16" WG_TYPES \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
    "{%32, %33, %34, %35}, %37, p, 1, 1, "
#define WG_LIST_96 "setp.ne.b32 p, %52, 0; wgmma.mma_async.sync.aligned.m64n96k16" WG_TYPES \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, " \
    "{%48, %49, %50, %51}, %53, p, 1, 1, "
#define WG_LIST_128 "setp.ne.b32 p, %68, 0; wgmma.mma_async.sync.aligned.m64n128k16" WG_TYPES \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
    "{%64, %65, %66, %67}, %69, p, 1, 1, "
#define WG_F4(c, i) "+f"((c)[i]), "+f"((c)[(i) + 1]), "+f"((c)[(i) + 2]), "+f"((c)[(i) + 3])
#define WG_F16(c, i) WG_F4(c, i), WG_F4(c, (i) + 4), WG_F4(c, (i) + 8), WG_F4(c, (i) + 12)
#define WG_C_32(c) WG_F16(c, 0)
#define WG_C_64(c) WG_F16(c, 0), WG_F16(c, 16)
#define WG_C_96(c) WG_F16(c, 0), WG_F16(c, 16), WG_F16(c, 32)
#define WG_C_128(c) WG_F16(c, 0), WG_F16(c, 16), WG_F16(c, 32), WG_F16(c, 48)
#define WG_CAT_(x, y) x##y
#define WG_CAT(x, y) WG_CAT_(x, y)
/* c += A . B, B n columns (a literal) by a descriptor, transposed if t
 * ("0" or "1"). */
#define WG_MMA(n, t, c, a, desc)                                                              \
    __asm__ __volatile__(SM90A "{ .reg .pred p; " WG_CAT(WG_LIST_, n) t "; }"                  \
                         : WG_CAT(WG_C_, n)(c)                                                 \
                         : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(1u),        \
                           "l"(desc))

#ifdef MMA_EMULATE
/* A wgmma emulated as mma.sync products: c += A . B over `blocks` blocks of
 * 8 columns, B's element (k, n) (k from k0) at a swizzled tile's row n,
 * column k, or with `trans` (imm-trans-b 1) at row k, column n. */
inline void wg_emulated(float *c, const uint *a, __local const ushort *x, uint blocks, uint k0,
                        bool trans, __local float *emu)
{
    const uint lane = get_local_id(0) & 31u, g = lane >> 2, t = lane & 3u;
    for (uint n = 0; n < blocks; ++n) {
        uint bx[2];
        for (uint i = 0; i < 2; ++i) {
            const uint k = k0 + 2u * t + 8u * i, col = 8u * n + g;
            const uint lo = trans ? SW(k, col) : SW(col, k);
            const uint hi = trans ? SW(k + 1u, col) : SW(col, k + 1u);
            bx[i] = (uint)x[lo] | (uint)x[hi] << 16;
        }
        mma16(c + 4 * n, a, bx, emu);
    }
}
#endif

/* c (this warp's 16 rows by the tile's MMA_TILE keys, mma.sync's C layout
 * a block of 8) += A . K[keys][columns k0..k0 + 15]^T, a the warp's A
 * fragment of 16 x 16 (Q's). */
inline void wg_keys(float *c, const uint *a, __local const float *tile, uint k0,
                    __local float *emu)
{
    __local const ushort *x = (__local const ushort *)tile;
#ifdef MMA_EMULATE
    wg_emulated(c, a, x, TILE / 8, k0, false, emu);
#else
    WG_MMA(MMA_TILE, "0", c, a, wg_desc(x + SW(0u, k0), 16u, 1024u));
#endif
}

/* acc (this warp's 16 rows by all DP columns) += P . V[keys k0..k0 + 15],
 * P the warp's A fragment of 16 x 16. */
inline void wg_columns(float *c, const uint *a, __local const float *tile, uint k0,
                       __local float *emu)
{
    __local const ushort *x = (__local const ushort *)tile;
#ifdef MMA_EMULATE
    wg_emulated(c, a, x, DP / 8, k0, true, emu);
#else
    WG_MMA(HEAD_DIM, "1", c, a, wg_desc(x + SW(k0, 0u), TILE * 128u, 1024u));
#endif
}

/* The warp's 16 x TILE block of Q K^T into s, Q the warp's KS A fragments
 * and K a swizzled tile; and where dp is given, dO V^T into it the same
 * way (grad-Q's two products, in one group). */
inline void wg_scores(float *s, const uint *q, __local const float *kt, float *dp,
                      const uint *o, __local const float *vt, __local float *emu)
{
    zero(s, NT * 4);
    if (dp)
        zero(dp, NT * 4);
    wg_hold_cols(s, dp, TILE);
    wg_fence();
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        wg_keys(s, q + ks * 4, kt, ks * 16, emu);
        if (dp)
            wg_keys(dp, o + ks * 4, vt, ks * 16, emu);
    }
    wg_commit_wait();
    wg_hold_cols(s, dp, TILE);
}

/* After wait_copies, before the barrier: the copies' writes (generic
 * proxy) ordered before the products' reads of them (async proxy). */
inline void wg_proxy_fence(void)
{
#ifndef MMA_EMULATE
    __asm__ __volatile__(SM90A "fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* p's A fragments (the warp's 16 x TILE block in float32, rounded here to
 * 16 bits), each packed and held before the fence. */
inline void wg_pack(uint a[TILE / 16][4], const float *p)
{
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk) {
        a_pack(a[kk], p, kk);
        wg_hold_a(a[kk]);
    }
}

/* acc (the warp's KW 16 x 8 blocks) += p . X, p the warp's 16 x TILE block
 * in float32 and X a swizzled tile; and where acc2 is given, acc2 += p2 .
 * X2 in the same group (the key side's dV and dK). The accumulators'
 * rescale is done before the fence. */
inline void wg_times(float *acc, const float *p, __local const float *x, float *acc2,
                     const float *p2, __local const float *x2, __local float *emu)
{
    uint a[TILE / 16][4], a2[TILE / 16][4];
    wg_pack(a, p);
    if (acc2)
        wg_pack(a2, p2);
    wg_hold_cols(acc, acc2, DP);
    wg_fence();
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk) {
        wg_columns(acc, a[kk], x, kk * 16, emu);
        if (acc2)
            wg_columns(acc2, a2[kk], x2, kk * 16, emu);
    }
    wg_commit_wait();
    wg_hold_cols(acc, acc2, DP);
}

/* The forward's P V left in flight: issued here (a, its A fragments, kept
 * by the caller), waited for by wg_wait before the barrier that lets the
 * next copies overwrite its V tile, so that it runs while the warps wait
 * for the next tile's copies. */
inline void wg_times_issue(float *acc, uint a[TILE / 16][4], const float *p,
                           __local const float *x, __local float *emu)
{
    wg_pack(a, p);
    wg_hold_cols(acc, 0, DP);
    wg_fence();
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk)
        wg_columns(acc, a[kk], x, kk * 16, emu);
#ifndef MMA_EMULATE
    __asm__ __volatile__(SM90A "wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

/* Waits for the products in flight; acc and a are read and free after it. */
inline void wg_wait(float *acc, uint a[TILE / 16][4])
{
#ifndef MMA_EMULATE
    __asm__ __volatile__(SM90A "wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
    wg_hold_cols(acc, 0, DP);
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk)
        wg_hold_a(a[kk]);
}
#endif

/* ---- the single-pass backward's dQ (16-bit, WSPLIT 1) ---------------- */

/* grad_kvq__mma computes dK, dV and dQ in one pass over the key side's
 * tiles, as FlashAttention-2 does: S and dP once per visible pair, five
 * products where grad-Q and grad-K/V take seven. Each tile's dS^T (this
 * work-group's keys by the tile's queries) goes to local memory in 16
 * bits, and dQ of the tile's queries += dS K over the work-group's keys,
 * with K's rows kept in local memory for the whole kernel; the 16 x 16
 * blocks of that product are dealt among the warps and added into a
 * float32 dQ by atomic adds (red.global.add), which finish_dq__mma then
 * scales and rounds into dQ once. That product runs a tile late, after the
 * next tile's S and dP, so that the loop keeps one barrier a tile: dS^T
 * has two buffers, written and read by turns. Local memory past the
 * tiles: */
#define KB_AT (TILES_AT + 4 * ROW_TILE) /* K's rows, [WG_ROWS][RW] words */
#define DSW (TILE / 2 + 4)              /* words a key row of dS^T (padded: 32 banks) */
#define DS_AT (KB_AT + WG_ROWS * RW)    /* dS^T, two of [WG_ROWS][DSW] words */
#define DQ_BLOCKS (TILE / 16 * (DP / 16))

/* The dS^T buffer other than ds. */
inline __local float *other_ds(__local float *tiles, __local float *ds)
{
    return ds == tiles + DS_AT ? ds + WG_ROWS * DSW : tiles + DS_AT;
}

/* K's rows [r0, r0 + WG_ROWS) into kb, zeros past kv_seq and D: plain
 * loads, once a work-group. */
inline void copy_block(__local float *kb, __global const elem *k, uint b, uint kv_seq, uint r0,
                       uint heads, uint head)
{
    __global const ushort *bits = (__global const ushort *)k;
    __local uint *words = (__local uint *)kb;
    for (uint j = get_local_id(0); j < WG_ROWS * (DP / 2); j += LANES) {
        const uint r = j / (DP / 2), d = j % (DP / 2) * 2;
        words[r * RW + d / 2] =
            r0 + r < kv_seq ? pair_at(bits + at(b, kv_seq, r0 + r, heads, head, d), d) : 0u;
    }
}

/* The warp's 16 x TILE block of dS^T (its keys by the tile's queries),
 * rounded to 16 bits as dK's product takes it, into its rows of ds. */
inline void store_ds(__local float *ds, const float *x)
{
    const uint lane = get_local_id(0) & 31u, warp = get_local_id(0) >> 5;
    __local uint *w = (__local uint *)ds + (warp * 16u + (lane >> 2)) * DSW + (lane & 3u);
    UNROLL
    for (uint n = 0; n < NT; ++n) {
        w[n * 4] = pack2(x[n * 4], x[n * 4 + 1]);
        w[8 * DSW + n * 4] = pack2(x[n * 4 + 2], x[n * 4 + 3]);
    }
}

/* The A fragment of dS (queries by keys) at query m0 and key k0, read from
 * dS^T by rows of keys: ldmatrix with .trans (matrices: queries m0 and
 * m0 + 8 of keys k0, then of keys k0 + 8). */
inline void a_from_ds(uint *a, __local const float *ds, uint m0, uint k0)
{
    const uint lane = get_local_id(0) & 31u;
    __local const ushort *x = (__local const ushort *)ds;
#if LDMATRIX
    const uint mat = lane >> 3;
    __local const ushort *p = x + (k0 + (mat >> 1) * 8 + (lane & 7u)) * 2 * DSW + m0 + (mat & 1u) * 8;
    __asm__ __volatile__("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                         : "r"((uint)(ulong)p));
#else
    const uint g = lane >> 2, t = lane & 3u;
    UNROLL
    for (uint i = 0; i < 4; ++i) {
        const uint m = m0 + g + (i & 1u) * 8, kk = k0 + 2 * t + (i >> 1) * 8;
        a[i] = (uint)x[kk * 2 * DSW + m] | (uint)x[(kk + 1) * 2 * DSW + m] << 16;
    }
#endif
}

/* *p += x in global memory, atomically. */
inline void add_to(__global float *p, float x)
{
#ifdef MMA_EMULATE
    volatile __global uint *u = (volatile __global uint *)p;
    uint old = *u, seen;
    while ((seen = atomic_cmpxchg(u, old, as_uint(as_float(old) + x))) != old)
        old = seen;
#else
    __asm__ __volatile__("red.global.add.f32 [%0], %1;" : : "l"(p), "f"(x) : "memory");
#endif
}

/* p[0] += x and, where both, p[1] += y: on sm_90 and later (SM90, from
 * the host) one vector red where the pair is 8-byte aligned (even D). */
inline void add_pair(__global float *p, float x, float y, bool both)
{
#if defined(SM90) && !defined(MMA_EMULATE) && D % 2 == 0
    __asm__ __volatile__("red.global.add.v2.f32 [%0], {%1, %2};" : : "l"(p), "f"(x), "f"(y)
                         : "memory");
#else
    add_to(p, x);
    if (both)
        add_to(p + 1, y);
#endif
}

/* dQ of a tile's queries p0.. (of head `head`) += dS K over the
 * work-group's keys, into dq32: its 16 x 16 blocks dealt among the warps,
 * each warp's blocks summed side by side (independent products), every
 * warp taking the same number (emulated mma has barriers). */
#define DQ_TURNS ((DQ_BLOCKS + WARPS - 1) / WARPS)
#define DQ_SAME_M (WARPS % (TILE / 16) == 0) /* a warp's blocks share their queries */
inline void add_dq(__global float *dq32, __local const float *ds, __local const float *kb,
                   uint b, uint q_seq, uint p0, uint num_heads, uint head, __local float *emu)
{
    const uint lane = get_local_id(0) & 31u, warp = get_local_id(0) >> 5;
    const uint g = lane >> 2, t = lane & 3u;
    __local const ushort *kw = cols_lane(kb, 0);
    float acc[DQ_TURNS][2][4];
    zero(&acc[0][0][0], DQ_TURNS * 8);
    UNROLL
    for (uint kk = 0; kk < WG_ROWS / 16; ++kk) {
        uint a[4];
        UNROLL
        for (uint turn = 0; turn < DQ_TURNS; ++turn) {
            const uint block = (turn * WARPS + warp) % DQ_BLOCKS;
            uint bx[4];
            if (turn == 0 || !DQ_SAME_M)
                a_from_ds(a, ds, block % (TILE / 16) * 16, kk * 16);
            b_cols(bx, kw, block / (TILE / 16) * 16, kk * 16);
            mma16(acc[turn][0], a, bx, emu);
            mma16(acc[turn][1], a, bx + 2, emu);
        }
    }
    UNROLL
    for (uint turn = 0; turn < DQ_TURNS; ++turn) {
        const uint block = turn * WARPS + warp;
        const uint m0 = block % (TILE / 16) * 16, c0 = block / (TILE / 16) * 16;
        UNROLL
        for (uint n = 0; n < 2; ++n) {
            UNROLL
            for (uint i = 0; i < 4; i += 2) {
                const uint row = p0 + m0 + g + (i ? 8u : 0u), d = c0 + n * 8 + 2 * t;
                if (block < DQ_BLOCKS && row < q_seq && d < D)
                    add_pair(dq32 + at(b, q_seq, row, num_heads, head, d), acc[turn][n][i],
                             acc[turn][n][i + 1], d + 1u < D);
            }
        }
    }
}
#endif

/* ---- forward --------------------------------------------------------- */

#if WGMMA
#define COPY_KV copy_tile_sw
#else
#define COPY_KV copy_tile
#endif

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
    /* scores to the units of exp: fp32's Q carries the scale already */
    const float unit = DTYPE != 0 ? scale * EXP_UNIT : 1.0f;
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    __local float *kt = tiles + TILES_AT, *vt = kt + ROW_TILE;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;

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
#if DTYPE == 0
    chunk kx[PER_LANE], vx[PER_LANE];
    fetch_tile(kx, k, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    fetch_tile(vx, v, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
#else
    if (lo < hi) { /* no copy is left in flight past the loop */
        COPY_KV(kt, k, b, kv_seq, lo, hi, num_kv_heads, kv_head);
        COPY_KV(vt, v, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    }
#endif
#if WGMMA
    uint pa[TILE / 16][4]; /* P's A fragments while its P V is in flight */
    UNROLL
    for (uint kk = 0; kk < TILE / 16; ++kk)
        pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
#endif
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
#if DTYPE == 0
        barrier(CLK_LOCAL_MEM_FENCE);
        store_tile(kt, kx);
        store_tile(vt, vx);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            fetch_tile(kx, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
            fetch_tile(vx, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
        }
#else
        /* one barrier a tile: past it, everyone's copies of this tile have
         * landed and the other pair, read for the last tile, is free */
        wait_copies();
#if WGMMA
        wg_wait(&acc[0][0], pa); /* the last tile's P V */
        wg_proxy_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            __local float *next = other_pair(tiles, kt);
            COPY_KV(next, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head);
            COPY_KV(next + ROW_TILE, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head);
        }
#endif

        float s[NT][4];
#if WGMMA
        wg_scores(&s[0][0], &qf[0][0], kt, 0, 0, 0, emu);
#else
        tile_products(&s[0][0], 0, &qf[0][0], 0, kt, 0, d0, xch, emu);
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
#if WGMMA
        wg_times_issue(&acc[0][0], pa, &s[0][0], vt, emu);
#else
        tile_times(&acc[0][0], &s[0][0], vt, d0, emu);
#endif
#if DTYPE != 0
        kt = other_pair(tiles, kt);
        vt = kt + ROW_TILE;
#endif
    }
#if WGMMA
    wg_wait(&acc[0][0], pa);
#endif
    l0 = row_sum(l0, emu);
    l1 = row_sum(l1, emu);
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint row = (i & 2) ? row1 : row0, d = d0 + n * 8 + 2 * t + (i & 1);
            const float l = (i & 2) ? l1 : l0;
            if (row < q_seq && d < D)
                STORE(o, at(b, q_seq, row, num_heads, head, d), l > 0.0f ? acc[n][i] / l : 0.0f);
        }
    }
    if (t == 0 && d0 == 0)
        for (int i = 0; i < 2; ++i) {
            const uint row = i ? row1 : row0;
            const float l = i ? l1 : l0, m = i ? m1 : m0;
            if (row < q_seq) {
                const ulong at_row = 2 * (((ulong)b * q_seq + row) * num_heads + head);
                lse[at_row] = l > 0.0f ? m / EXP_UNIT : EMPTY_ROW;
                lse[at_row + 1] = l > 0.0f ? log(l) : EMPTY_ROW;
            }
        }
}

/* ---- grad-Q ---------------------------------------------------------- */

/* dS = P * (dP - Dsum) into s, from the warp's 16 x TILE scores s and dP
 * of keys t0.., rows row0 (m[0], l[0], ds_row[0]) and row0 + 8 ([1]);
 * `masked`: keys past hi or not visible get 0. */
inline void ds_of_rows(float *s, const float *dp, const float *m, const float *l,
                       const float *ds_row, float unit, bool masked, uint t0, uint hi, uint row0,
                       int causal, uint window, long delta)
{
    const uint t = get_local_id(0) & 3u;
#if DTYPE != 0 && FOLD_ML
    const float ml[2] = {m[0] + l[0], m[1] + l[1]};
#endif
    UNROLL
    for (uint j = 0; j < NT * 4; ++j) {
        const uint key = t0 + j / 4 * 8 + 2 * t + (j & 1), row = row0 + ((j & 2) ? 8u : 0u);
        const int r = (j & 2) ? 1 : 0;
#if DTYPE != 0 && FOLD_ML
        const float p = EXPU(fmin(fma(s[j], unit, -ml[r]), 0.0f)); /* ml = m + l */
#else
        const float p = EXPU(fmin(fma(s[j], unit, -m[r]), 0.0f) - l[r]);
#endif
        const bool keep = !masked || (key < hi && visible(row, key, causal, window, delta));
        s[j] = keep ? p * (dp[j] - ds_row[r]) : 0.0f;
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
    /* scores to the units of exp: fp32's Q carries the scale already */
    const float unit = DTYPE != 0 ? scale * EXP_UNIT : 1.0f;
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    /* S = Q K^T, dP = dO V^T and dS K */
    __local float *kt = tiles + TILES_AT, *vt = kt + ROW_TILE;
    const uint head = get_group_id(1), b = get_group_id(2);
    const uint kv_head = head / (num_heads / num_kv_heads);
    const uint r0 = query_block(q_seq, causal);
    const uint row0 = r0 + warp / WSPLIT * 16u + g, row1 = row0 + 8u;

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
#if DTYPE == 0
    chunk kx[PER_LANE], vx[PER_LANE];
    fetch_tile(kx, k, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
    fetch_tile(vx, v, b, kv_seq, lo, hi, num_kv_heads, kv_head, 1.0f);
#else
    if (lo < hi) { /* no copy is left in flight past the loop */
        COPY_KV(kt, k, b, kv_seq, lo, hi, num_kv_heads, kv_head);
        COPY_KV(vt, v, b, kv_seq, lo, hi, num_kv_heads, kv_head);
    }
#endif
    for (uint t0 = lo; t0 < hi; t0 += TILE) {
#if DTYPE == 0
        barrier(CLK_LOCAL_MEM_FENCE);
        store_tile(kt, kx);
        store_tile(vt, vx);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            fetch_tile(kx, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
            fetch_tile(vx, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head, 1.0f);
        }
#else
        /* one barrier a tile: past it, everyone's copies of this tile have
         * landed and the other pair, read for the last tile, is free */
        wait_copies();
#if WGMMA
        wg_proxy_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t0 + TILE < hi) {
            __local float *next = other_pair(tiles, kt);
            COPY_KV(next, k, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head);
            COPY_KV(next + ROW_TILE, v, b, kv_seq, t0 + TILE, hi, num_kv_heads, kv_head);
        }
#endif

        float s[NT][4], dp[NT][4];
#if WGMMA
        wg_scores(&s[0][0], &qf[0][0], kt, &dp[0][0], &of[0][0], vt, emu);
#else
        tile_products(&s[0][0], &dp[0][0], &qf[0][0], &of[0][0], kt, vt, d0, xch, emu);
#endif
        const bool whole =
            t0 + TILE <= hi && all_visible(r0, last, t0, t0 + TILE - 1u, causal, window, delta);
        /* whole tiles skip the mask's tests */
        if (whole)
            ds_of_rows(&s[0][0], &dp[0][0], m, l, ds_row, unit, false, t0, hi, row0, causal,
                       window, delta);
        else
            ds_of_rows(&s[0][0], &dp[0][0], m, l, ds_row, unit, true, t0, hi, row0, causal,
                       window, delta);
#if WGMMA
        wg_times(&acc[0][0], &s[0][0], kt, 0, 0, 0, emu);
#else
        tile_times(&acc[0][0], &s[0][0], kt, d0, emu);
#endif
#if DTYPE != 0
        kt = other_pair(tiles, kt);
        vt = kt + ROW_TILE;
#endif
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

/* m, l and (want_dk) Dsum of query row p0 + lid of a tile, for the lanes
 * lid < TILE; zeros past `end`. fp32's go through registers x, 16-bit's
 * are copied into rows (TILE of each) as their tiles are. */
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

#if DTYPE != 0
inline void copy_rows(__local float *rows, __global const float *lse,
                      __global const float *dsum, uint b, uint q_seq, uint p0, uint end,
                      uint num_heads, uint head, bool want_dk)
{
    const uint lid = get_local_id(0);
    if (lid >= TILE)
        return;
    const bool in = p0 + lid < end;
    const ulong row = ((ulong)b * q_seq + (in ? p0 + lid : 0u)) * num_heads + head;
    copy4(rows + lid, lse + 2 * row, in);
    copy4(rows + TILE + lid, lse + 2 * row + 1, in);
    copy4(rows + 2 * TILE + lid, dsum + row, in && want_dk);
}
#endif

/* P^T into s and (want_dk) dS^T = P^T * (dP^T - Dsum) into dp, from the
 * warp's 16 x TILE blocks S^T and dP^T of keys key0 (rows g) and key0 + 8
 * by queries p0.., whose m, l and Dsum are in mt, lt and dt; `masked`:
 * queries past hi or not seeing the key get 0. */
inline void p_of_keys(float *s, float *dp, __local const float *mt, __local const float *lt,
                      __local const float *dt, float unit, bool masked, bool want_dk, uint p0,
                      uint hi, uint key0, int causal, uint window, long delta)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        const uint j = i / 4 * 8 + 2 * t + (i & 1), key = key0 + ((i & 2) ? 8u : 0u);
#if DTYPE != 0 && FOLD_ML
        const float p = EXPU(fmin(fma(s[i], unit, -(mt[j] + lt[j]) * EXP_UNIT), 0.0f));
#else
        const float p = EXPU(fmin(fma(s[i], unit, -mt[j] * EXP_UNIT), 0.0f) - lt[j] * EXP_UNIT);
#endif
        const bool keep = !masked || (p0 + j < hi && visible(p0 + j, key, causal, window, delta));
        s[i] = keep ? p : 0.0f;
        dp[i] = keep && want_dk ? p * (dp[i] - dt[j]) : 0.0f;
    }
}

/* dK and/or dV of the work-group's WG_ROWS keys: every query row of every
 * head of the group that sees any of them streams through local memory
 * TILE rows at a time, with its LSE pair and Dsum. */
inline void key_side(__global const elem *q, __global const elem *k, __global const elem *v,
                     __global const elem *d_out, __global const float *lse,
                     __global const float *dsum, __global elem *dk, __global elem *dv,
                     uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, int causal,
                     uint window, long delta, float scale, int accumulate,
                     __local float *tiles, bool want_dk, bool want_dv,
                     __global float *dq32)
{
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    tiles = tile_base(tiles);
    /* scores to the units of exp: fp32's Q carries the scale already */
    const float unit = DTYPE != 0 ? scale * EXP_UNIT : 1.0f;
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    __local float *mt = tiles + ROW_AT, *lt = mt + TILE, *dt = lt + TILE;
    /* S^T = K Q^T, dP^T = V dO^T, dS^T Q and P^T dO */
    __local float *qt = tiles + TILES_AT, *ot = qt + ROW_TILE;
    const uint kv_head = get_group_id(1), b = get_group_id(2);
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
#if DTYPE == 0
    chunk qx[PER_LANE], ox[PER_LANE];
    float rx[3];
    fetch_tile(qx, q, b, q_seq, lo, hi, num_heads, kv_head * group, scale);
    fetch_tile(ox, d_out, b, q_seq, lo, hi, num_heads, kv_head * group, 1.0f);
    fetch_rows(rx, lse, dsum, b, q_seq, lo, hi, num_heads, kv_head * group, want_dk);
#else
    if (steps) { /* no copy is left in flight past the loop */
        COPY_KV(qt, q, b, q_seq, lo, hi, num_heads, kv_head * group);
        COPY_KV(ot, d_out, b, q_seq, lo, hi, num_heads, kv_head * group);
        copy_rows(mt, lse, dsum, b, q_seq, lo, hi, num_heads, kv_head * group, want_dk);
    }
#endif
    for (uint step = 0; step < steps; ++step) {
        const uint p0 = lo + step % per_head * TILE;
#if DTYPE == 0
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
            const uint next_p = lo + (step + 1u) % per_head * TILE;
            fetch_tile(qx, q, b, q_seq, next_p, hi, num_heads, head, scale);
            fetch_tile(ox, d_out, b, q_seq, next_p, hi, num_heads, head, 1.0f);
            fetch_rows(rx, lse, dsum, b, q_seq, next_p, hi, num_heads, head, want_dk);
        }
#else
        wait_copies();
#if WGMMA
        wg_proxy_fence();
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (step + 1u < steps) {
            const uint head = kv_head * group + (step + 1u) / per_head;
            const uint next_p = lo + (step + 1u) % per_head * TILE;
            __local float *next = other_pair(tiles, qt);
            COPY_KV(next, q, b, q_seq, next_p, hi, num_heads, head);
            COPY_KV(next + ROW_TILE, d_out, b, q_seq, next_p, hi, num_heads, head);
            copy_rows(other_rows(tiles, mt), lse, dsum, b, q_seq, next_p, hi, num_heads, head,
                      want_dk);
        }
#endif

        /* S^T and dP^T: 16 keys x TILE queries per warp. */
        float s[NT][4], dp[NT][4];
#if WGMMA
        wg_scores(&s[0][0], &kf[0][0], qt, want_dk ? &dp[0][0] : 0, &vf[0][0], ot, emu);
#else
        tile_products(&s[0][0], want_dk ? &dp[0][0] : 0, &kf[0][0], &vf[0][0], qt, ot, d0, xch,
                      emu);
#endif
#if DTYPE != 0 && WSPLIT == 1
        if (dq32 && step > 0) /* the last tile's dQ: its dS^T is past the barrier */
            add_dq(dq32, other_ds(tiles, ds), kb, b, q_seq, dq_p0, num_heads, dq_head, emu);
#endif
        const bool whole = p0 + TILE <= hi &&
                           all_visible(p0, (long)p0 + TILE - 1, r0, last, causal, window, delta);
        /* whole tiles skip the mask's tests */
        if (whole)
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, false, want_dk, p0, hi, key0, causal,
                      window, delta);
        else
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, true, want_dk, p0, hi, key0, causal,
                      window, delta);
#if DTYPE != 0 && WSPLIT == 1
        if (dq32)
            store_ds(ds, &dp[0][0]);
#endif
#if WGMMA
        if (want_dv && want_dk)
            wg_times(&dvf[0][0], &s[0][0], ot, &dkf[0][0], &dp[0][0], qt, emu);
        else if (want_dv)
            wg_times(&dvf[0][0], &s[0][0], ot, 0, 0, 0, emu);
        else
            wg_times(&dkf[0][0], &dp[0][0], qt, 0, 0, 0, emu);
#else
        if (want_dv)
            tile_times(&dvf[0][0], &s[0][0], ot, d0, emu);
        if (want_dk)
            tile_times(&dkf[0][0], &dp[0][0], qt, d0, emu);
#endif
#if DTYPE != 0 && WSPLIT == 1
        dq_p0 = p0;
        dq_head = kv_head * group + step / per_head;
        ds = other_ds(tiles, ds);
#endif
#if DTYPE != 0
        qt = other_pair(tiles, qt);
        ot = qt + ROW_TILE;
        mt = other_rows(tiles, mt);
        lt = mt + TILE;
        dt = lt + TILE;
#endif
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
             scale, accumulate, tiles, false, true, 0);
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
             scale, accumulate, tiles, true, false, 0);
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
             scale, accumulate, tiles, true, true, 0);
}

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
             scale, accumulate, tiles, true, true, dq32 + dq32_off);
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
