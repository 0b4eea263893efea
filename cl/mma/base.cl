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
 * defines, chosen per head_dim by src/opencl/variants/mma.c; with the defaults
 * the program compiles after cl/common.cl, the prelude every program starts
 * with.
 *
 * The program is these files of cl/mma/, in order (cmake/embed.cmake joins
 * them): base.cl (this: the shapes and what every path shares), tf32.cl
 * (fp32 operands: 3xTF32), f16.cl (16-bit operands: m16n8k16, cp.async,
 * ldmatrix), wgmma.cl (Hopper's warpgroup products), pipeline.cl (the
 * streamed tiles and the products, one interface over the paths),
 * single.cl (the single-pass backward's dQ), modifiers.cl (the score
 * modifiers on fragments), query.cl (the forward and grad-Q) and key.cl
 * (the key side), each kernel one loop over that interface; layout.h
 * before them all.
 * Columns are padded with zeros to a multiple of KSTEP * WSPLIT.
 * Launch: global (blocks * LANES, heads, batch), local (LANES, 1, 1),
 * blocks = ceil(rows / WG_ROWS); `tiles` is a __local buffer of
 * MMA_LOCAL_FLOATS (cl/mma/layout.h), which src/opencl/variants/mma.c
 * sizes it by too.
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
#define XCH_FLOATS MMA_XCH_FLOATS(WARPS, WSPLIT, TILE) /* 2 * XCH_MAT where WSPLIT > 1 */
#define EMU_FLOATS MMA_EMU_FLOATS(DTYPE != 0)
#define EMU_SHFL (EMU_FLOATS - 32)
#ifdef MMA_EMULATE
#define EMU_TOTAL (WARPS * EMU_FLOATS)
#else
#define EMU_TOTAL 0
#endif
/* The local buffer (cl/mma/layout.h): m, l and Dsum of a tile's rows, the
 * partial S and dP blocks of every warp, the emulation's scratch, then the
 * kernel's tiles. */
#define BUFFERS MMA_BUFFERS(DTYPE != 0)
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

/* The work-group's block (of rows on its side) and head, from its ids 0
 * and 1: a head's blocks are neighbouring work-groups in launch order, or
 * a block's heads (HEADS_SIDE). HEADS_FIRST (CLATTN_MMA_ORDER) 2, the
 * default, takes a block's heads side by side under a causal mask, whose
 * blocks differ in cost (every head's heaviest block then goes first), 1
 * always, 0 never; all three do under a bias or bool mask without a heads
 * dimension (bias_dims bit 1 clear), whose heads then read its tiles from
 * the cache after the first. */
#ifndef HEADS_FIRST
#define HEADS_FIRST 2
#endif
#if MODS & (MOD_BIAS | MOD_BOOL)
#define HEADLESS(bias_dims) (!((bias_dims) & 2u))
#else
#define HEADLESS(bias_dims) false
#endif
#if HEADS_FIRST == 1
#define HEADS_SIDE(bias_dims, causal) true
#elif HEADS_FIRST == 2
#define HEADS_SIDE(bias_dims, causal) ((causal) != 0 || HEADLESS(bias_dims))
#else
#define HEADS_SIDE(bias_dims, causal) HEADLESS(bias_dims)
#endif
inline uint group_block(uint bias_dims, int causal)
{
    if (HEADS_SIDE(bias_dims, causal))
        return (get_group_id(1) * get_num_groups(0) + get_group_id(0)) / get_num_groups(1);
    return get_group_id(0);
}
inline uint group_head(uint bias_dims, int causal)
{
    if (HEADS_SIDE(bias_dims, causal))
        return (get_group_id(1) * get_num_groups(0) + get_group_id(0)) % get_num_groups(1);
    return get_group_id(1);
}

/* The first query row of the work-group's block: under the causal mask the
 * last blocks have the most keys, so they go first. */
inline uint query_block(uint q_seq, int causal, uint bias_dims)
{
    const uint blocks = (q_seq + WG_ROWS - 1u) / WG_ROWS, block = group_block(bias_dims, causal);
    return (causal ? blocks - 1u - block : block) * WG_ROWS;
}

/* Whether every query of [q_first, q_last] sees every key of [k_first,
 * k_last] (queries at global position + delta in the keys' terms): such
 * tiles skip the mask. */
inline bool all_visible(long q_first, long q_last, long k_first, long k_last, int causal,
                        uint window, long delta)
{
    return (!causal || k_last < q_first + delta + causal) &&
           (window == 0u || q_last + delta < k_first + (long)window);
}

/* The local buffer as the kernels lay it out. 16-bit tiles are read by
 * ldmatrix and written 16 bytes at a time, which want them aligned, and a
 * __local argument is promised only its element's alignment: for them the
 * buffer starts at its first 16-byte boundary (the host gives MMA_ALIGN
 * floats more). fp32's kernels do without: computed from the pointer's bits, the
 * base cost them 64-bit address arithmetic and up to 80 registers (175 ->
 * 255 in the d64 forward, by ptxas). */
inline __local float *tile_base(__local float *p)
{
#if WGMMA /* swizzled tiles start at a 1024-byte boundary (the host gives MMA_ALIGN_WGMMA more) */
    return p + ((1024u - ((uint)(ulong)(p + TILES_AT) & 1023u)) & 1023u) / 4u;
#elif DTYPE != 0
    return local_align16(p);
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

/* x of lane src (0 .. 31) of the warp. */
inline uint shfl_idx(uint x, uint src, __local float *emu)
{
#ifdef MMA_EMULATE
    __local uint *ex = (__local uint *)(emu + EMU_SHFL);
    const uint lane = get_local_id(0) & 31u;
    ex[lane] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint y = ex[src];
    barrier(CLK_LOCAL_MEM_FENCE);
    return y;
#else
    uint y;
    __asm__ __volatile__("shfl.sync.idx.b32 %0, %1, %2, 31, -1;" : "=r"(y) : "r"(x), "r"(src));
    return y;
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
