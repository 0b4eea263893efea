/*
 * The `blocked` variants, for CPU devices (PoCL): one work-item per
 * work-group and no barriers, since PoCL turns every barrier into loops over
 * the work-group's items with their state saved between. Each work-item is
 * the native backend's job (src/native/native.c), with float16 vectors for
 * its tiles, 32 rows wide as two float16 halves:
 *  - key side (grad-V, grad-K, both): KK = 32 keys of one (batch, KV head),
 *    K and V transposed so that the keys lie along two vectors; the query
 *    rows that see any of them (every head of the group) stream by CHUNK at
 *    a time; dK and dV accumulate transposed and are written once.
 *  - query side (forward, grad-Q, Dsum): QB = 32 query rows of one (batch,
 *    head), transposed so that the rows lie along two vectors, so that a
 *    key's scores against all of them, and the per-row softmax state, are
 *    two vectors each; the keys stream by KB = 16 at a time.
 * Both products keep 16 vector accumulators in registers (eight rows of a
 * tile, both halves) and broadcast single elements of plain rows against
 * them, each broadcast serving two FMAs: with 16-row tiles, eight
 * accumulators took a broadcast load each besides the tile row's load,
 * more loads than two load ports serve a cycle. That is for vectors of 16
 * floats (AVX-512: 32 registers); where the device's are 8 floats (AVX2:
 * 16 registers), the host defines NARROW and the products take four rows
 * of one half at a time instead (4 accumulators, 8 registers).
 *
 * HEAD_DIM is a compile-time define (src/opencl/build.c builds one program
 * per head_dim); with the default the file compiles after cl/common.cl.
 * Launch: global (ceil(rows / 32), heads, batch), local (1, 1, 1), with rows
 * and heads of the side the kernel runs on; the __local argument is unused.
 */
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef NARROW
#define NARROW 0 /* the host sets 1 where the device's vectors are 8 floats */
#endif
#define D HEAD_DIM
#define KB 16 /* keys of a query-side tile */
#define KK 32 /* keys of a key-side work-item */
#define QB 32 /* query rows of a query-side work-item */
#define CHUNK 32

/* 16 elements of a 16-bit tensor from element i on, as float32, and 16
 * floats rounded to nearest even as the tensor's 16-bit bits: one vector
 * operation where PoCL's scalar vload_half and vstore_half_rte ran a
 * conversion (with branches, in software) per element. LOAD16 and bits16
 * give what LOAD and STORE do, element by element (NaNs stay NaNs, quiet). */
#if DTYPE == 1
#define LOAD16(p, i) vload_half16(0, (p) + (i))
inline ushort16 bits16(float16 x)
{
    const uint16 b = as_uint16(x), a = b & 0x7fffffffu, sign = (b >> 16) & 0x8000u;
    /* normal halves: the exponent rebiased (127 - 15), the mantissa's 13
     * dropped bits rounded to nearest even (a carry into the exponent is
     * right, up to infinity at 65520) */
    const uint16 normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* below 2^-14: subnormal halves, steps of 2^-24, which are the steps of
     * float32 at 0.5: the sum's rounding is the half's */
    const uint16 sub = as_uint16(as_float16(a) + 0.5f) - 0x3f000000u;
    const uint16 big = select((uint16)0x7c00u, 0x7e00u | ((a >> 13) & 0x3ffu), a > 0x7f800000u);
    uint16 h = select(normal, sub, a < 0x38800000u);
    h = select(h, big, a >= 0x477ff000u);
    return convert_ushort16(h | sign);
}
#elif DTYPE == 2
#define LOAD16(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
inline ushort16 bits16(float16 x)
{
    const uint16 b = as_uint16(x);
    return convert_ushort16(select((b + 0x7fffu + ((b >> 16) & 1u)) >> 16, (b >> 16) | 0x40u,
                                   (b & 0x7fffffffu) > 0x7f800000u));
}
#endif

/* x (lane i: element d of row at[i] / D) to p[at[i] + d] for the lanes
 * below n, added to what is there under accumulate; 16-bit tensors
 * converted as a vector, stored lane by lane. */
/* min0 of 16 lanes: min(x, 0) that keeps a NaN. */
inline float16 min0v(float16 x) { return select(x, (float16)0.0f, x > 0.0f); }

inline void store16(__global elem *p, const ulong *at, uint n, uint d, float16 x, int accumulate)
{
#if DTYPE == 0
    float v[16];
    vstore16(x, 0, v);
    for (uint i = 0; i < n; ++i)
        p[at[i] + d] = accumulate ? p[at[i] + d] + v[i] : v[i];
#else
    if (accumulate) {
        float old[16];
        for (uint i = 0; i < 16; ++i)
            old[i] = i < n ? LOAD(p, at[i] + d) : 0.0f;
        x = vload16(0, old) + x;
    }
    ushort bits[16];
    vstore16(bits16(x), 0, bits);
    __global ushort *u = (__global ushort *)p;
    for (uint i = 0; i < n; ++i)
        u[at[i] + d] = bits[i];
#endif
}

/* The rows the products below stream: fp32 rows straight from global
 * memory; 16-bit rows converted once into a private buffer (stage()), so
 * that the inner loops load floats rather than convert every element at
 * every use (PoCL's vload_half there ran the f16 backward at a fifth of
 * fp32's speed). */
#if DTYPE == 0
#define SRC __global const float
#define STAGED(rows) 1 /* no buffer */
#else
#define SRC const float
#define STAGED(rows) ((rows) * D)
#endif

/* Rows row[0..n) of x as the products read them: x itself with at = row
 * (fp32), or buf with at[i] = i * D, the rows converted (16-bit). */
inline SRC *stage(float *buf, __global const elem *x, const ulong *row, uint n, ulong *at)
{
#if DTYPE == 0
    for (uint i = 0; i < n; ++i)
        at[i] = row[i];
    return x;
#else
    for (uint i = 0; i < n; ++i) {
        __global const elem *r = x + row[i];
        uint d = 0;
        for (; d + 16 <= D; d += 16) /* 16 at a time: F16C where the CPU has it */
            vstore16(LOAD16(r, d), 0, buf + i * D + d);
        for (; d < D; ++d)
            buf[i * D + d] = LOAD(r, d);
        at[i] = i * D;
    }
    return buf;
#endif
}

#if NARROW
/* Devices whose vectors are 8 floats (AVX2: 16 registers) get the same
 * products four rows and one half at a time: eight rows of both halves
 * are 32 such registers of accumulators, which spilled on every step. */

/* out[i] = sum_d r_i[d] * (half h of t[d]) for four rows. */
inline void dots4(SRC *r0, SRC *r1, SRC *r2, SRC *r3, const float *t, uint h, float16 *out)
{
    float16 a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (uint d = 0; d < D; ++d) {
        const float16 y = vload16(2 * d + h, t);
        a0 += r0[d] * y;
        a1 += r1[d] * y;
        a2 += r2[d] * y;
        a3 += r3[d] * y;
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

inline void dots8(SRC *x, const ulong *row, const float *t, float16 *lo, float16 *hi)
{
    SRC *r0 = x + row[0], *r1 = x + row[1], *r2 = x + row[2], *r3 = x + row[3],
        *r4 = x + row[4], *r5 = x + row[5], *r6 = x + row[6], *r7 = x + row[7];
    dots4(r0, r1, r2, r3, t, 0, lo);
    dots4(r4, r5, r6, r7, t, 0, lo + 4);
    dots4(r0, r1, r2, r3, t, 1, hi);
    dots4(r4, r5, r6, r7, t, 1, hi + 4);
}
#else
/* lo[i], hi[i] = sum_d x[row[i] + d] * t[d] for 8 rows of x, t a transposed
 * tile of QB rows (halves 0..15 and 16..31). */
inline void dots8(SRC *x, const ulong *row, const float *t, float16 *lo, float16 *hi)
{
    SRC *r0 = x + row[0], *r1 = x + row[1], *r2 = x + row[2], *r3 = x + row[3],
        *r4 = x + row[4], *r5 = x + row[5], *r6 = x + row[6], *r7 = x + row[7];
    float16 a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f,
            a7 = 0.0f, b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, b3 = 0.0f, b4 = 0.0f, b5 = 0.0f,
            b6 = 0.0f, b7 = 0.0f;
    for (uint d = 0; d < D; ++d) {
        const float16 y = vload16(2 * d, t), z = vload16(2 * d + 1, t);
        const float x0 = r0[d], x1 = r1[d], x2 = r2[d], x3 = r3[d], x4 = r4[d], x5 = r5[d],
                    x6 = r6[d], x7 = r7[d];
        a0 += x0 * y;
        b0 += x0 * z;
        a1 += x1 * y;
        b1 += x1 * z;
        a2 += x2 * y;
        b2 += x2 * z;
        a3 += x3 * y;
        b3 += x3 * z;
        a4 += x4 * y;
        b4 += x4 * z;
        a5 += x5 * y;
        b5 += x5 * z;
        a6 += x6 * y;
        b6 += x6 * z;
        a7 += x7 * y;
        b7 += x7 * z;
    }
    lo[0] = a0, lo[1] = a1, lo[2] = a2, lo[3] = a3, lo[4] = a4, lo[5] = a5, lo[6] = a6;
    lo[7] = a7;
    hi[0] = b0, hi[1] = b1, hi[2] = b2, hi[3] = b3, hi[4] = b4, hi[5] = b5, hi[6] = b6;
    hi[7] = b7;
}
#endif

/* acc[d] = acc[d] * (f, g) + sum_r x[row[r] + d] * (w[r], v[r]) for r < n,
 * acc a transposed tile of QB rows (halves scaled by f and g as they are
 * loaded: the forward's running rescale; 1 elsewhere): eight of its rows,
 * both halves (NARROW: four, one half at a time), stay in registers while
 * the n rows stream by. */
inline void add_rows(float *acc, SRC *x, const ulong *row, const float16 *w, const float16 *v,
                     uint n, float16 f, float16 g)
{
    /* Named accumulators, not arrays: PoCL kept arrays of them in memory. */
    uint d = 0;
#if NARROW /* four rows of acc, one half at a time (see dots4) */
    for (; d + 4 <= D; d += 4)
        for (uint h = 0; h < 2; ++h) {
            float *a = acc + 32 * d;
            const float16 s = h ? g : f;
            const float16 *u = h ? v : w;
            float16 c0 = vload16(h, a) * s, c1 = vload16(2 + h, a) * s,
                    c2 = vload16(4 + h, a) * s, c3 = vload16(6 + h, a) * s;
            for (uint r = 0; r < n; ++r) {
                const float16 y = u[r];
                SRC *xr = x + row[r] + d;
                c0 += xr[0] * y;
                c1 += xr[1] * y;
                c2 += xr[2] * y;
                c3 += xr[3] * y;
            }
            vstore16(c0, h, a);
            vstore16(c1, 2 + h, a);
            vstore16(c2, 4 + h, a);
            vstore16(c3, 6 + h, a);
        }
#else
    for (; d + 8 <= D; d += 8) {
        float *a = acc + 32 * d;
        float16 c0 = vload16(0, a) * f, e0 = vload16(1, a) * g, c1 = vload16(2, a) * f,
                e1 = vload16(3, a) * g, c2 = vload16(4, a) * f, e2 = vload16(5, a) * g,
                c3 = vload16(6, a) * f, e3 = vload16(7, a) * g, c4 = vload16(8, a) * f,
                e4 = vload16(9, a) * g, c5 = vload16(10, a) * f, e5 = vload16(11, a) * g,
                c6 = vload16(12, a) * f, e6 = vload16(13, a) * g, c7 = vload16(14, a) * f,
                e7 = vload16(15, a) * g;
        for (uint r = 0; r < n; ++r) {
            const float16 y = w[r], z = v[r];
            SRC *xr = x + row[r] + d;
            const float x0 = xr[0], x1 = xr[1], x2 = xr[2], x3 = xr[3], x4 = xr[4], x5 = xr[5],
                        x6 = xr[6], x7 = xr[7];
            c0 += x0 * y;
            e0 += x0 * z;
            c1 += x1 * y;
            e1 += x1 * z;
            c2 += x2 * y;
            e2 += x2 * z;
            c3 += x3 * y;
            e3 += x3 * z;
            c4 += x4 * y;
            e4 += x4 * z;
            c5 += x5 * y;
            e5 += x5 * z;
            c6 += x6 * y;
            e6 += x6 * z;
            c7 += x7 * y;
            e7 += x7 * z;
        }
        vstore16(c0, 0, a);
        vstore16(e0, 1, a);
        vstore16(c1, 2, a);
        vstore16(e1, 3, a);
        vstore16(c2, 4, a);
        vstore16(e2, 5, a);
        vstore16(c3, 6, a);
        vstore16(e3, 7, a);
        vstore16(c4, 8, a);
        vstore16(e4, 9, a);
        vstore16(c5, 10, a);
        vstore16(e5, 11, a);
        vstore16(c6, 12, a);
        vstore16(e6, 13, a);
        vstore16(c7, 14, a);
        vstore16(e7, 15, a);
    }
#endif
    for (; d < D; ++d) {
        float16 c = vload16(2 * d, acc) * f, e = vload16(2 * d + 1, acc) * g;
        for (uint r = 0; r < n; ++r) {
            c += x[row[r] + d] * w[r];
            e += x[row[r] + d] * v[r];
        }
        vstore16(c, 2 * d, acc);
        vstore16(e, 2 * d + 1, acc);
    }
}

/* t[d][j] = x[row[j] + d], or 0 for j >= n, for the w rows of a tile of
 * width w (KB keys, QB query rows). */
inline void transpose_in(__global const elem *x, const ulong *row, uint n, float *t, uint w)
{
    for (uint j = 0; j < w; ++j) {
        uint d = 0;
#if DTYPE != 0
        for (; j < n && d + 16 <= D; d += 16) {
            float v[16];
            vstore16(LOAD16(x, row[j] + d), 0, v);
            for (uint i = 0; i < 16; ++i)
                t[(d + i) * w + j] = v[i];
        }
#endif
        for (; d < D; ++d)
            t[d * w + j] = j < n ? LOAD(x, row[j] + d) : 0.0f;
    }
}

/* Whether query pos sees key t, lane by lane, as float16 selects want it
 * (-1 where true): with at = pos + delta (global positions compared), under
 * the causal mask only keys t < at + causal, under a window only keys with at <
 * t + window. In 64 bits, so that nothing wraps, and without clamped
 * differences, which LLVM turns into saturating intrinsics that Oclgrind
 * cannot run. */
inline int16 visible16(uint16 pos, uint16 t, int causal, uint window, long delta)
{
    const long16 at = convert_long16(pos) + delta, key = convert_long16(t);
    const int16 past = convert_int16(key < at + (long)causal);
    const int16 near = window ? convert_int16(at - key < (long16)window) : (int16)(-1);
    return select((int16)(causal ? 0 : -1), near, past);
}


inline uint16 lane_ids(void)
{
    return (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* cl/common.cl's modify() of 16 pairs (query positions pos, keys t) of
 * query head `head`; *dz its derivatives. */
inline float16 modify16(float16 x, uint16 pos, uint16 t, uint head, uint b, long delta,
                        float softcap, __global const float *slopes, uint num_heads, uint q_seq,
                        uint kv_seq, uint kv_pos0, uint seq0, __global const float *bias,
                        __global const uchar *bool_mask, uint bias_dims, float16 *dz)
{
    *dz = (float16)1.0f;
#if MODS & MOD_SOFTCAP
    const float16 y = x * (1.0f / softcap), e = exp2(-fabs(y) * TWO_LOG2E);
    const float16 a = (1.0f - e) / (1.0f + e), y2 = y * y;
    const float16 series = y * (1.0f + y2 * (-1.0f / 3.0f + y2 * (2.0f / 15.0f + y2 *
                                              (-17.0f / 315.0f + y2 * (62.0f / 2835.0f)))));
    /* softcap_tanh(), 16 lanes */
    const float16 th = select(select(a, -a, x < 0.0f), series, fabs(y) < TANH_SERIES_BELOW);
    x = softcap * th;
    *dz = 1.0f - th * th;
#endif
#if MODS & MOD_ALIBI
    const long16 dist = convert_long16(pos) + delta - convert_long16(t);
    x -= slopes[head] * convert_float16(abs(dist));
#endif
#if USER_FNS
    /* the caller's functions, lane by lane */
    float xs[16], gs[16], ps[16], ts[16];
    vstore16(x, 0, xs);
    vstore16(*dz, 0, gs);
    vstore16(as_float16(pos), 0, ps);
    vstore16(as_float16(t), 0, ts);
    for (uint i = 0; i < 16u; ++i)
        xs[i] = user_modify(xs[i], as_uint(ps[i]), as_uint(ts[i]), head, b, delta, slopes,
                            num_heads, q_seq, kv_seq, kv_pos0, seq0, bias, bool_mask,
                            bias_dims, &gs[i]);
    x = vload16(0, xs);
    *dz = vload16(0, gs);
#endif
    return x;
}
#define MODIFY16(x, pos, t, head, dz)                                                          \
    modify16((x), (pos), (t), (head), b, delta, softcap, slopes, num_heads, q_seq, kv_seq,  \
             kv_pos0, seq0, bias, bool_mask, bias_dims, (dz))

/* cl/common.cl's DROP() of 16 pairs: drop_gain where kept, else 0, from
 * 16 Philox blocks side by side. */
inline float16 drop16(uint16 pos, uint16 t, uint head, uint b, long delta, uint kv_pos0,
                      uint seq0, uint k0, uint k1, uint thr, float gain)
{
    const uint16 T = t + kv_pos0;
    uint16 c0 = T >> 4u, c1 = convert_uint16(convert_long16(pos) + delta + (long)kv_pos0);
    uint16 c2 = (uint16)head, c3 = (uint16)(b + seq0);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint16 hi0 = mul_hi((uint16)0xD2511F53u, c0), lo0 = (uint16)0xD2511F53u * c0;
        const uint16 hi1 = mul_hi((uint16)0xCD9E8D57u, c2), lo1 = (uint16)0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    /* key T's 8 bits: byte T mod 4 of word (T mod 16) / 4 */
    const int16 odd = convert_int16((T & 4u) != 0u), high = convert_int16((T & 8u) != 0u);
    const uint16 w = select(select(c0, c1, odd), select(c2, c3, odd), high);
    const uint16 u = (w >> ((T & 3u) * 8u)) & 0xFFu;
    return select((float16)0.0f, (float16)gain, convert_int16(u >= thr));
}
#define DROP16(pos, t, head, b) \
    drop16((pos), (t), (head), (b), delta, kv_pos0, seq0, drop_k0, drop_k1, drop_thr, drop_gain)

