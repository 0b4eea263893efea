/* clattn_merge_cl(): two partial results over disjoint key sets, (o1,
 * lse1) and (o2, lse2), into the (o, lse) of their union, a work-item per
 * row. A row's log-sum-exp is m + log l; the merged one is their log of
 * summed exponentials, each O weighted by exp(its LSE - the merged one).
 * Elementwise per row, so o may be o1 or o2 (in place). */
__kernel void merge__tree(__global const elem *o1, ulong o1_off, __global const float *lse1,
                          ulong lse1_off, __global const elem *o2, ulong o2_off,
                          __global const float *lse2, ulong lse2_off, __global elem *o,
                          ulong o_off, __global float *lse, ulong lse_off, ulong rows,
                          uint head_dim)
{
    const ulong row = get_global_id(0);
    if (row >= rows)
        return;
    const float m1 = lse1[lse1_off + 2 * row], l1 = lse1[lse1_off + 2 * row + 1];
    const float m2 = lse2[lse2_off + 2 * row], l2 = lse2[lse2_off + 2 * row + 1];
    /* Empty is the pair (EMPTY_ROW, EMPTY_ROW): a NaN beside it is not. */
    const bool e1 = m1 == EMPTY_ROW && l1 == EMPTY_ROW, e2 = m2 == EMPTY_ROW && l2 == EMPTY_ROW;
    const float m = e1 ? m2 : e2 ? m1 : fmax(m1, m2);
    const float s1 = e1 ? 0.0f : exp(m1 - m + l1), s2 = e2 ? 0.0f : exp(m2 - m + l2);
    const float sum = s1 + s2, w1 = sum != 0.0f ? s1 / sum : 0.0f, w2 = sum != 0.0f ? s2 / sum : 0.0f;
    for (uint d = 0; d < head_dim; ++d) {
        const ulong i = row * head_dim + d;
        STORE(o, o_off + i, w1 * LOAD(o1, o1_off + i) + w2 * LOAD(o2, o2_off + i));
    }
    lse[lse_off + 2 * row] = sum != 0.0f ? m : EMPTY_ROW;
    lse[lse_off + 2 * row + 1] = sum != 0.0f ? log(sum) : EMPTY_ROW;
}
