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
 * gradient kernels add into their outputs. */
#define SHAPE_ARGS                                                                       \
    uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, uint head_dim, int causal, \
        uint window, long delta, float scale, int accumulate

/* The shape arguments passed on, in SHAPE_ARGS's order. */
#define SHAPE_PASS \
    q_seq, kv_seq, num_heads, num_kv_heads, head_dim, causal, window, delta, scale, accumulate

/* A gradient's element i of p: x, or x added to it under accumulate. */
#define STORE_GRAD(p, i, x, accumulate) STORE(p, i, (accumulate) ? LOAD(p, i) + (x) : (x))

/* The LSE pair of a row with no visible key, as in meganeura's forward;
 * masked scores take it too, so that exp() of them is 0. */
#define EMPTY_ROW (-1e30f)

/* Whether query pos sees key t (t < kv_seq is the caller's to test): the
 * global positions are pos + q_offset and t + kv_offset, so the masks
 * compare pos + delta with t, in 64 bits. */
inline bool visible(uint pos, uint t, int causal, uint window, long delta)
{
    const long at = (long)pos + delta;
    return (!causal || (long)t <= at) && (window == 0u || at < (long)t + (long)window);
}

/* min(x, 0) that keeps a NaN (fmin drops it): a NaN score or LSE reaches
 * every gradient it touches, as in PyTorch. */
inline float min0(float x) { return x > 0.0f ? 0.0f : x; }

inline uint clamp_to(long x, uint n) { return x < 0 ? 0u : x > (long)n ? n : (uint)x; }

/* The keys [*lo, *hi) that any query of [first, last] sees. */
inline void keys_of_queries(uint first, uint last, uint kv_seq, int causal, uint window,
                            long delta, uint *lo, uint *hi)
{
    *hi = causal ? clamp_to((long)last + delta + 1, kv_seq) : kv_seq;
    *lo = window > 0u ? clamp_to((long)first + delta - (long)window + 1, *hi) : 0u;
}

/* The queries [*lo, *hi) that see any key of [first, last]. */
inline void queries_of_keys(uint first, uint last, uint q_seq, int causal, uint window,
                            long delta, uint *lo, uint *hi)
{
    *hi = window > 0u ? clamp_to((long)last - delta + (long)window, q_seq) : q_seq;
    *lo = causal ? clamp_to((long)first - delta, *hi) : 0u;
}
