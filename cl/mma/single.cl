#if DTYPE != 0
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
            const bool same_m = DQ_SAME_M; /* a variable: no constant operand to || */
            if (turn == 0 || !same_m)
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
