/*
 * The prelude of every clattn program: src/opencl.c passes this text ahead
 * of each kernel source (and into the program cache's key), so that the
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

/* Every kernel's shape arguments, after its tensors. */
#define SHAPE_ARGS                                                                       \
    uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, uint head_dim, int causal, \
        uint window, float scale

/* The LSE pair of a row with no visible key, as in meganeura's forward;
 * masked scores take it too, so that exp() of them is 0. */
#define EMPTY_ROW (-1e30f)

/* Whether query pos sees key t (t < kv_seq is the caller's to test). */
inline bool visible(uint pos, uint t, int causal, uint window)
{
    return (!causal || t <= pos) && (window == 0u || (ulong)pos < (ulong)t + window);
}

/* The keys [*lo, *hi) that any query of [first, last] sees. */
inline void keys_of_queries(uint first, uint last, uint kv_seq, int causal, uint window,
                            uint *lo, uint *hi)
{
    *lo = window > 0u && first >= window ? first - window + 1u : 0u;
    *hi = causal ? min(last + 1u, kv_seq) : kv_seq;
}

/* The queries [*lo, *hi) that see any key of [first, last]; written so that
 * last + window cannot wrap. */
inline void queries_of_keys(uint first, uint last, uint q_seq, int causal, uint window,
                            uint *lo, uint *hi)
{
    *lo = causal ? first : 0u;
    *hi = q_seq;
    if (window > 0u && last < q_seq && window < q_seq - last)
        *hi = last + window;
}
