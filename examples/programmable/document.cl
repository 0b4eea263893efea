/* A document mask: query q sees key k only inside its own document. The
 * documents here are 512 positions long; for documents of other lengths,
 * compare document ids from a table instead (a mask function has no
 * parameters: write the table into the source, or use a score function
 * that returns -INFINITY, whose parameters can hold one). */
bool clattn_mask(uint b, uint h, uint q, uint k)
{
    return q / 512u == k / 512u && k <= q;
}
