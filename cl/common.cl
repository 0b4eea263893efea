/*
 * The prelude of every clattn program: src/opencl/build.c passes this text
 * ahead of each kernel source (and into the program cache's key), so that the
 * contract's mask, its empty-row value and the kernels' shape arguments are
 * written once.
 */

/* The tensors' element type (DTYPE, a build option: 0 float32, 1 float16,
 * 2 bfloat16); LOAD and STORE convert to and from float32, stores rounding
 * to nearest even. Everything inside is float32; the LSE pairs and Dsum are
 * float32 in memory too. float16 goes through vload_half and
 * vstore_half_rte (core OpenCL 1.2: no cl_khr_fp16), bfloat16 through its
 * bits. */
#ifndef DTYPE
#define DTYPE 0
#endif
#if DTYPE == 0
#define elem float
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#elif DTYPE == 1
#define elem half
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
#else
#define elem ushort
#define LOAD(p, i) as_float((uint)(p)[i] << 16)
#define STORE(p, i, x) ((p)[i] = bf16_rte(x))
inline ushort bf16_rte(float x)
{
    const uint b = as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((b >> 16) | 0x40u); /* a quiet NaN */
    return (ushort)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
#endif

/* Every kernel's shape arguments, after its tensors: delta is q_offset -
 * kv_offset (the masks compare global positions), accumulate makes the
 * gradient kernels add into their outputs; then the score modifiers'
 * (MOD_ARGS). */
#define SHAPE_ARGS                                                                       \
    uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, uint head_dim, int causal, \
        uint window, long delta, float scale, int accumulate, MOD_ARGS

/* The shape arguments passed on, in SHAPE_ARGS's order. */
#define SHAPE_PASS                                                                         \
    q_seq, kv_seq, num_heads, num_kv_heads, head_dim, causal, window, delta, scale, accumulate, \
        MOD_PASS

/* The score modifiers a program is built with (MODS, a build option: the
 * bits of MOD_SOFTCAP, MOD_ALIBI, MOD_DROPOUT and MOD_SINK); without them their
 * arguments go unread and the kernels are those of plain attention.
 * Their arguments: the cap; the ALiBi slopes, one per query head; the
 * first key's global position kv_pos0 (kv_offset) and the first batch
 * element's index seq0 (a packed sequence's), which dropout's draw takes
 * (slopes holds the sinks too: SINK);
 * the call's Philox key (drop_k0, drop_k1), the threshold a draw is kept
 * from and the kept probabilities' gain 1 / (1 - p) (docs/numerics.md);
 * the block map of the caller's mask function and bool mask (HIDING:
 * mask_map below, or NULL); the caller's bias and bool mask (MOD_BIAS,
 * MOD_BOOL: [b][head][row][key], bias_dims' bit 0 set where they have a
 * batch dimension, bit 1 where they have a heads dimension). */
#ifndef MODS
#define MODS 0
#endif
#define MOD_SOFTCAP 1
#define MOD_ALIBI 2
#define MOD_DROPOUT 4
#define MOD_SINK 8 /* learnable sinks: the forward's alone */
/* The caller's functions, whose source goes ahead of this prelude
 * (docs/programmable.md): clattn_score and clattn_score_ds (MOD_SCORE),
 * clattn_mask (MOD_MASK). Their parameters follow the sinks in `slopes`. */
#define MOD_SCORE 16
#define MOD_MASK 32
#define MOD_BIAS 64  /* the caller's bias tensor */
#define MOD_BOOL 128 /* the caller's bool mask */
/* the caller's clattn_score_dp, the score function's derivative in its
 * parameters: grad_score_params__tree's programs alone */
#define MOD_SCORE_DP 256
/* the most parameters clattn_score_dp names a pair (clattn.h's
 * CLATTN_SCORE_DP_MAX) */
#define SCORE_DP_MAX 4u
#define USER_FNS (MODS & (MOD_SCORE | MOD_MASK | MOD_BIAS | MOD_BOOL))
/* pairs hidden one by one: a block map, and rows that may be empty */
#define HIDING (MODS & (MOD_MASK | MOD_BOOL))
/* the scores themselves change */
#define SHAPED (MODS & (MOD_SOFTCAP | MOD_ALIBI | MOD_SCORE | MOD_MASK | MOD_BIAS | MOD_BOOL))
#define MOD_ARGS                                                                             \
    float softcap, __global const float *slopes, uint kv_pos0, uint seq0, uint drop_k0,   \
        uint drop_k1, uint drop_thr, float drop_gain, __global const uchar *mask_blocks,  \
        __global const float *bias, __global const uchar *bool_mask, uint bias_dims
#define MOD_PASS                                                                          \
    softcap, slopes, kv_pos0, seq0, drop_k0, drop_k1, drop_thr, drop_gain, mask_blocks, bias, \
        bool_mask, bias_dims

/* Learnable sinks (MOD_SINK): query head h's logit, after the ALiBi
 * slopes in `slopes`; it joins a row's softmax as a key with no value.
 * sink_fold takes a row's running max *m and sum *l (of exp(z - *m)) to
 * the sink's and returns the factor that the row's sums of V take. A NaN
 * max (a NaN score) reaches *l. */
#define SINK(head) (slopes[num_heads + (head)])
inline float sink_fold(float *m, float *l, float sigma)
{
    const float m_new = *m > sigma ? *m : sigma;
    const float r = exp(*m - m_new);
    *l = *l * r + exp(sigma - m_new);
    *m = m_new;
    return r;
}

/* p from its first 16-byte boundary: a __local argument is promised only
 * its element's alignment, and kernels that read or write 16 bytes at a
 * time want more (their hosts give 12 bytes more). */
inline __local float *local_align16(__local float *p)
{
    return p + ((16u - ((uint)(ulong)p & 15u)) & 15u) / 4u;
}

/* The element of the caller's bias and bool mask of query row pos and key
 * t of query head `head` of element b (bias_dims: MOD_ARGS). */
inline ulong bias_at(uint b, uint head, uint pos, uint t, uint num_heads, uint q_seq,
                     uint kv_seq, uint bias_dims)
{
    const uint heads = bias_dims & 2u ? num_heads : 1u;
    return (((ulong)(bias_dims & 1u ? b : 0u) * heads + (bias_dims & 2u ? head : 0u)) * q_seq +
            pos) * kv_seq + t;
}

/* Element i of the caller's bias as float32: float32, or bfloat16 (bias_dims
 * bit 4) or float16 (bit 8), each exact in float32. */
inline float bias_value(__global const float *bias, ulong i, uint bias_dims)
{
    if (bias_dims & 4u)
        return as_float((uint)((__global const ushort *)bias)[i] << 16);
    if (bias_dims & 8u)
        return vload_half(i, (__global const half *)bias);
    return bias[i];
}

/* Whether the caller's mask function and bool mask show key t (global
 * position T) to query row pos (P) of query head `head` of element b. */
inline bool user_shows(uint b, uint head, uint pos, uint t, uint P, uint T, uint seq0,
                       __global const uchar *bool_mask, uint num_heads, uint q_seq, uint kv_seq,
                       uint bias_dims)
{
#if MODS & MOD_BOOL
    if (!bool_mask[bias_at(b, head, pos, t, num_heads, q_seq, kv_seq, bias_dims)])
        return false;
#endif
#if MODS & MOD_MASK
    return clattn_mask(b + seq0, head, P, T);
#else
    return true;
#endif
}

#if USER_FNS
/* The caller's functions and tensors of score x of query row pos and key t
 * of query head `head` of batch element b: the score function, the bias,
 * then the mask function and bool mask (a hidden pair's score -inf, its
 * derivative 0); the functions take the global positions P and T and
 * b + seq0, the tensors the rows, clamped to the call's (a tile's tail
 * past them is discarded). *g is multiplied by the score function's
 * derivative. user_modify_with takes the bias's value of the pair (0
 * without one), read by the caller (user_bias) where it can read it early;
 * user_modify reads it. */
inline float user_bias(__global const float *bias, uint b, uint head, uint pos, uint t,
                       uint num_heads, uint q_seq, uint kv_seq, uint bias_dims)
{
#if MODS & MOD_BIAS
    return bias_value(bias,
                      bias_at(b, head, min(pos, q_seq - 1u), min(t, kv_seq - 1u), num_heads,
                              q_seq, kv_seq, bias_dims),
                      bias_dims);
#else
    return 0.0f;
#endif
}

inline float user_modify_with(float x, uint pos, uint t, uint head, uint b, long delta,
                              __global const float *slopes, uint num_heads, uint q_seq,
                              uint kv_seq, uint kv_pos0, uint seq0, float bias_v,
                              __global const uchar *bool_mask, uint bias_dims, float *g)
{
    pos = min(pos, q_seq - 1u);
    t = min(t, kv_seq - 1u);
    const uint P = (uint)((long)pos + delta + (long)kv_pos0);
    const uint T = t + kv_pos0;
#if MODS & MOD_SCORE
    __global const float *p = slopes + 2u * num_heads;
    *g *= clattn_score_ds(x, b + seq0, head, P, T, p);
    x = clattn_score(x, b + seq0, head, P, T, p);
#endif
#if MODS & MOD_BIAS
    x += bias_v;
#endif
#if HIDING
    if (!user_shows(b, head, pos, t, P, T, seq0, bool_mask, num_heads, q_seq, kv_seq,
                    bias_dims)) {
        x = -INFINITY;
        *g = 0.0f;
    }
#endif
    return x;
}

inline float user_modify(float x, uint pos, uint t, uint head, uint b, long delta,
                         __global const float *slopes, uint num_heads, uint q_seq, uint kv_seq,
                         uint kv_pos0, uint seq0, __global const float *bias,
                         __global const uchar *bool_mask, uint bias_dims, float *g)
{
    return user_modify_with(x, pos, t, head, b, delta, slopes, num_heads, q_seq, kv_seq, kv_pos0,
                            seq0,
                            user_bias(bias, b, head, pos, t, num_heads, q_seq, kv_seq, bias_dims),
                            bool_mask, bias_dims, g);
}
#endif

/* The block map of the caller's mask function and bool mask: for each
 * batch element and query head, a byte per MAP_BLOCK x MAP_BLOCK block of
 * query rows and keys, non-zero where they show a pair of it; [b][head][row
 * block][key block], made by mask_map once for a call's shape (the host
 * keeps a function's for the calls after it). The kernels skip the tiles
 * of blocks it hides. */
#define MAP_BLOCK 64u
#if HIDING
__kernel void mask_map(__global uchar *map, uint q_seq, uint kv_seq, uint num_heads, long delta,
                       uint kv_pos0, uint seq0, __global const uchar *bool_mask, uint bias_dims)
{
    /* a work-group of MAP_BLOCK items a block, an item a key, down its rows
     * (the bool mask's neighbouring bytes side by side) 16 at a time, their
     * loads in flight together; a block's heads are neighbouring
     * work-groups, so that a mask without a heads dimension comes from the
     * cache after the first */
    const uint bh = get_group_id(0), kb = get_global_id(1), qb = get_global_id(2);
    const uint b = bh / num_heads, head = bh % num_heads, t = kb * MAP_BLOCK + get_local_id(0);
    const uint q_end = min(q_seq, (qb + 1u) * MAP_BLOCK);
    __local int any;
    if (get_local_id(0) == 0u)
        any = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    bool shown = false;
    for (uint row = qb * MAP_BLOCK; row < q_end && t < kv_seq && !shown; row += 16u) {
#pragma unroll
        for (uint i = 0; i < 16u; ++i) {
            const uint pos = min(row + i, q_end - 1u);
            const uint P = (uint)((long)pos + delta + (long)kv_pos0);
            shown = shown | user_shows(b, head, pos, t, P, t + kv_pos0, seq0, bool_mask,
                                       num_heads, q_seq, kv_seq, bias_dims);
        }
    }
    if (shown)
        atomic_or(&any, 1);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0u)
        map[((ulong)bh * get_global_size(2) + qb) * get_global_size(1) + kb] = any ? 1 : 0;
}
#endif

/* Whether the block map shows a pair of query rows [q0, q1] and keys [t0,
 * t1] of head `head` of element b (always without a map). */
inline bool map_shows(__global const uchar *mask_blocks, uint b, uint head, uint num_heads,
                      uint q_seq, uint kv_seq, uint q0, uint q1, uint t0, uint t1)
{
#if HIDING
    if (!mask_blocks)
        return true;
    const uint qbs = (q_seq + MAP_BLOCK - 1u) / MAP_BLOCK, kbs = (kv_seq + MAP_BLOCK - 1u) / MAP_BLOCK;
    __global const uchar *m = mask_blocks + ((ulong)b * num_heads + head) * qbs * kbs;
    for (uint i = q0 / MAP_BLOCK; i <= q1 / MAP_BLOCK; ++i)
        for (uint j = t0 / MAP_BLOCK; j <= t1 / MAP_BLOCK; ++j)
            if (m[i * kbs + j])
                return true;
    return false;
#else
    return true;
#endif
}
/* The first tile of `step` keys from t0 on (below hi) that the map shows
 * to query rows [q0, q1]: t0 itself without a map. The work-group's
 * tiles: the same for all its items. */
#define SHOWN_KEYS(t0, step, hi, q0, q1, head) \
    shown_keys((t0), (step), (hi), (q0), (q1), (head), b, num_heads, q_seq, kv_seq, mask_blocks)
inline uint shown_keys(uint t0, uint step, uint hi, uint q0, uint q1, uint head, uint b,
                       uint num_heads, uint q_seq, uint kv_seq, __global const uchar *mask_blocks)
{
#if HIDING
    while (t0 < hi &&
           !map_shows(mask_blocks, b, head, num_heads, q_seq, kv_seq, q0, q1, t0, min(t0 + step, hi) - 1u))
        t0 += step;
#endif
    return t0;
}
/* The same for tiles of query rows from p0 (below end) against keys
 * [t0, t1] of the heads [head0, head0 + heads). */
#define SHOWN_ROWS(p0, step, end, t0, t1, head0, heads) \
    shown_rows((p0), (step), (end), (t0), (t1), (head0), (heads), b, num_heads, q_seq, kv_seq, mask_blocks)
inline uint shown_rows(uint p0, uint step, uint end, uint t0, uint t1, uint head0, uint heads,
                       uint b, uint num_heads, uint q_seq, uint kv_seq,
                       __global const uchar *mask_blocks)
{
#if HIDING
    for (; p0 < end; p0 += step)
        for (uint h = head0; h < head0 + heads; ++h)
            if (map_shows(mask_blocks, b, h, num_heads, q_seq, kv_seq, p0, min(p0 + step, end) - 1u, t0, t1))
                return p0;
#endif
    return p0;
}

/* The key side's next (query head, tile of TILE query rows) step from
 * (*head, *p0) on, over the heads below heads_end and each one's rows
 * [lo, hi), that the map shows against keys [t0, t1]: *head is heads_end
 * past the last. TILE is the variant's. */
#define NEXT_SHOWN_QUERIES(head, p0, heads_end, lo, hi, t0, t1)                            \
    for (;;) {                                                                             \
        if (*(head) >= (heads_end))                                                        \
            break;                                                                         \
        *(p0) = SHOWN_ROWS(*(p0), TILE, (hi), (t0), (t1), *(head), 1u);                    \
        if (*(p0) < (hi))                                                                  \
            break;                                                                         \
        ++*(head);                                                                         \
        *(p0) = (lo);                                                                      \
    }

/* The built-in modifiers of the scaled score x of query row pos and key t
 * of query head `head`: softcap, then ALiBi over |P - T| = |pos + delta -
 * t|; *g gets softcap's derivative 1 - tanh^2 (1 without it). */
inline float builtin_modify(float x, uint pos, uint t, uint head, long delta, float softcap,
                            __global const float *slopes, float *g)
{
    *g = 1.0f;
#if MODS & MOD_SOFTCAP
    const float th = softcap_tanh(x * (1.0f / softcap));
    x = softcap * th;
    *g = 1.0f - th * th;
#endif
#if MODS & MOD_ALIBI
    const long dist = (long)pos + delta - (long)t;
    x -= slopes[head] * (float)(dist < 0 ? -dist : dist);
#endif
    return x;
}

/* The modified score of the scaled score x of query row pos and key t of
 * query head `head` of batch element b: the built-in modifiers, then the
 * caller's functions (user_modify); *dz gets dz/dx, the product of
 * softcap's 1 - tanh^2 and the score function's derivative (1 without
 * them). */
inline float modify(float x, uint pos, uint t, uint head, uint b, long delta, float softcap,
                    __global const float *slopes, uint num_heads, uint q_seq, uint kv_seq,
                    uint kv_pos0, uint seq0, __global const float *bias,
                    __global const uchar *bool_mask, uint bias_dims, float *dz)
{
    float g;
    x = builtin_modify(x, pos, t, head, delta, softcap, slopes, &g);
#if USER_FNS
    x = user_modify(x, pos, t, head, b, delta, slopes, num_heads, q_seq, kv_seq, kv_pos0, seq0,
                    bias, bool_mask, bias_dims, &g);
#endif
    *dz = g;
    return x;
}
#define MODIFY(x, pos, t, head, b, dz)                                                     \
    modify((x), (pos), (t), (head), (b), delta, softcap, slopes, num_heads, q_seq, kv_seq, \
           kv_pos0, seq0, bias, bool_mask, bias_dims, (dz))

/* Philox4x32-10 (Salmon et al., SC 2011) of counter c under key (k0, k1). */
inline uint4 philox(uint4 c, uint k0, uint k1)
{
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint hi0 = mul_hi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const uint hi1 = mul_hi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = (uint4)(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

/* The Philox block of dropout's draws of keys 16c .. 16c + 15 (global
 * positions) for query row pos of head `head` of batch element b: the
 * block at (c, P, head, b + seq0). */
inline uint4 draws(uint c, uint pos, uint head, uint b, long delta, uint kv_pos0, uint seq0,
                   uint k0, uint k1)
{
    const uint P = (uint)((long)pos + delta + (long)kv_pos0);
    return philox((uint4)(c, P, head, b + seq0), k0, k1);
}

/* Key i's (0 .. 15) 8-bit draw of a block: byte i mod 4 of word i / 4,
 * low byte first. */
inline uint draw8(uint4 w, uint i)
{
    const uint j = i >> 2, word = j == 0u ? w.x : j == 1u ? w.y : j == 2u ? w.z : w.w;
    return (word >> (8u * (i & 3u))) & 0xFFu;
}

/* Whether dropout keeps key t of query row pos (one draw of its block). */
inline bool kept(uint pos, uint t, uint head, uint b, long delta, uint kv_pos0, uint seq0,
                 uint k0, uint k1, uint thr)
{
    const uint T = t + kv_pos0;
    return draw8(draws(T >> 4, pos, head, b, delta, kv_pos0, seq0, k0, k1), T & 15u) >= thr;
}
#define KEPT(pos, t, head, b) \
    kept((pos), (t), (head), (b), delta, kv_pos0, seq0, drop_k0, drop_k1, drop_thr)
/* Dropout's factor of a probability: drop_gain where kept, else 0. */
#define DROP(pos, t, head, b) (KEPT(pos, t, head, b) ? drop_gain : 0.0f)

/* A gradient's element i of p: x, or x added to it under accumulate. */
#define STORE_GRAD(p, i, x, accumulate) STORE(p, i, (accumulate) ? LOAD(p, i) + (x) : (x))

/* The LSE pair of a row with no visible key, as in meganeura's forward;
 * masked scores take it too, so that exp() of them is 0. */
#define EMPTY_ROW (-1e30f)

/* The backward's dS scratch, between the key side (grad_kvs__tiled,
 * grad_kvs__mma) and grad_qs__tiled: the dS of the launch's part of the
 * batch elements and query heads (its global offset and size in dimensions
 * 1 and 2, which count KV heads of `group` query heads each on the key
 * side, query heads on the query side: group 1), as [batch element][query
 * head][key t][query pos] floats. The first float of query head `head` of
 * batch element b. */
inline ulong ds_head(uint b, uint head, uint group, uint q_seq, uint kv_seq)
{
    const ulong heads = get_global_size(1) * group, first = get_global_offset(1) * group;
    return (((ulong)b - get_global_offset(2)) * heads + head - first) * kv_seq * q_seq;
}

/* Whether query pos sees key t (t < kv_seq is the caller's to test): the
 * global positions are pos + q_offset and t + kv_offset, so the masks
 * compare pos + delta with t, in 64 bits. `causal` is 0 (no right side)
 * or 1 + the window's right side: keys up to causal - 1 past the query
 * are visible (1: the causal mask). */
inline bool visible(uint pos, uint t, int causal, uint window, long delta)
{
    const long at = (long)pos + delta;
    return (!causal || (long)t < at + causal) && (window == 0u || at < (long)t + (long)window);
}

/* min(x, 0) that keeps a NaN (fmin drops it): a NaN score or LSE reaches
 * every gradient it touches, as in PyTorch. */
inline float min0(float x) { return x > 0.0f ? 0.0f : x; }

inline uint clamp_to(long x, uint n) { return x < 0 ? 0u : x > (long)n ? n : (uint)x; }

/* The keys [*lo, *hi) that any query of [first, last] sees. */
inline void keys_of_queries(uint first, uint last, uint kv_seq, int causal, uint window,
                            long delta, uint *lo, uint *hi)
{
    *hi = causal ? clamp_to((long)last + delta + causal, kv_seq) : kv_seq;
    *lo = window > 0u ? clamp_to((long)first + delta - (long)window + 1, *hi) : 0u;
}

/* What a row whose weights sum to 0 writes in place of O's elements
 * (empty: 0) or of its LSE pair (empty: EMPTY_ROW). A row that sees no key
 * is empty; one that sees keys whose scores are all -inf (or below
 * EMPTY_ROW, the masks' own value) has no softmax: NaN, as PyTorch's math
 * gives. */
inline float zero_sum(uint pos, uint kv_seq, int causal, uint window, long delta, float empty)
{
#if MODS & (MOD_MASK | MOD_BOOL | MOD_BIAS)
    return empty; /* the caller's mask or bias may hide every key the masks show */
#endif
    uint lo, hi;
    keys_of_queries(pos, pos, kv_seq, causal, window, delta, &lo, &hi);
    return lo < hi ? NAN : empty;
}
#define ZERO_SUM(pos, empty) zero_sum((pos), kv_seq, causal, window, delta, (empty))

/* The queries [*lo, *hi) that see any key of [first, last]. */
inline void queries_of_keys(uint first, uint last, uint q_seq, int causal, uint window,
                            long delta, uint *lo, uint *hi)
{
    *hi = window > 0u ? clamp_to((long)last - delta + (long)window, q_seq) : q_seq;
    *lo = causal ? clamp_to((long)first - delta - causal + 1, *hi) : 0u;
}

/* Under LOCAL_PROBE (a build the host makes only where CLATTN_LOCAL_PROBE
 * asks, for tests), kernel NAME_local declares one static local array of
 * `floats` floats: kernel NAME's buffer as this program's defines lay it
 * out, sized by the compiler, whose CL_KERNEL_LOCAL_MEM_SIZE the host
 * checks against the buffer it gives NAME. Never run. */
#define LOCAL_PROBE_KERNEL(name, floats)                                                      \
    __kernel void name##_local(__global float *out)                                           \
    {                                                                                         \
        __local float probe[(floats)];                                                        \
        const uint i = get_local_id(0);                                                       \
        probe[i] = (float)i;                                                                  \
        barrier(CLK_LOCAL_MEM_FENCE);                                                         \
        out[i] = probe[(floats) - 1u - i];                                                    \
    }
#ifdef LOCAL_PROBE
/* One float: what the implementation adds to a probe's own array. */
LOCAL_PROBE_KERNEL(local_probe_base, 1)
#endif
