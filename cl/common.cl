/*
 * The prelude of every clattn program: src/opencl.c passes this text ahead
 * of each kernel source (and into the program cache's key), so that the
 * contract's mask, its empty-row value and the kernels' shape arguments are
 * written once.
 */

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
