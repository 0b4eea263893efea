/* Sliding-window attention with global tokens: each query sees the 256
 * keys up to itself, and the first 4 keys (attention sinks as tokens)
 * always. */
bool clattn_mask(uint b, uint h, uint q, uint k)
{
    return k <= q && (q - k < 256u || k < 4u);
}
