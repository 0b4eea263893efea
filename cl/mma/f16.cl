#if DTYPE != 0
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
 * (COPY_WHOLE) goes with no test a unit: a pointer step and the copy, not
 * 64-bit address arithmetic redone every tile. */
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


/* m, l and (want_dk) Dsum of query rows [p0, p0 + TILE) into rows (TILE of
 * each), copied as the tiles are; zeros past `end`. */
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
