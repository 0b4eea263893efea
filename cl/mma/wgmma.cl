/* ---- the 16-bit kernels on wgmma (sm_90a) ---------------------------- */
#if WGMMA
/* NVIDIA's OpenCL compiles for sm_90, whose assembler refuses wgmma: each
 * sm_90a instruction is inline PTX inside a comment that starts with
 * SM90A, and the host (src/opencl/build.c) builds the program's PTX again
 * with the target sm_90a and the markers taken out (tests/sm90a_probe.c
 * checks the route).
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
 * and write one 128-byte row of banks, where tiles of core matrices (no
 * swizzle) would have a phase read 8 rows.
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
