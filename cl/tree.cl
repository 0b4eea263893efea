/*
 * The `tree` variants: meganeura's WGSL attention archetypes in OpenCL C 1.2,
 * generalised. grad_v__tree is mha_grad_v.wgsl; the others follow its shape.
 *
 * One work-group per row (a query for forward and grad-Q, a key for grad-K,
 * grad-V and grad-KV) of one head and batch element; lane d owns element d of
 * the row. Each dot product is reduced across the work-group in local memory
 * by a tree of barriers, as the seed does with its 64 lanes. The work-group
 * is the next power of two >= head_dim; lanes past head_dim add zeros, so any
 * head_dim from 1 to 256 works.
 *
 * Launch: global (rows * WG, heads, batch), local (WG, 1, 1); `red` is a
 * __local buffer of WG floats, or 2 * WG for kernels that reduce two dot
 * products at once. Tensor arguments are (buffer, offset in floats) pairs.
 */

/* Sums every lane's value; every lane of the work-group must call it. */
inline float tree_sum(__local float *red, float mine, uint tid, uint wg)
{
    red[tid] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = wg >> 1; s > 0u; s >>= 1) {
        if (tid < s)
            red[tid] += red[tid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float sum = red[0];
    /* red[0] is read by every lane before the next call overwrites it. */
    barrier(CLK_LOCAL_MEM_FENCE);
    return sum;
}

/* Two sums through one tree: red holds 2 * wg floats. */
inline float2 tree_sum2(__local float *red, float a, float b, uint tid, uint wg)
{
    red[tid] = a;
    red[wg + tid] = b;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = wg >> 1; s > 0u; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
            red[wg + tid] += red[wg + tid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float2 sum = (float2)(red[0], red[wg]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return sum;
}

/* Element offsets: [b][row][head][d] with `heads` heads. */
inline ulong at(uint b, uint rows, uint row, uint heads, uint head, uint head_dim, uint d)
{
    return (((ulong)b * rows + row) * heads + head) * head_dim + d;
}

__kernel void grad_v__tree(__global const elem *d_out, ulong d_out_off,
                           __global const elem *q, ulong q_off,
                           __global const elem *k, ulong k_off,
                           __global const float *lse, ulong lse_off,
                           __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint t = get_group_id(0), kv_head = get_group_id(1), b = get_group_id(2);
    const bool live = tid < head_dim;
    const uint group = num_heads / num_kv_heads;
    const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, tid);
    const float k_t = live ? LOAD(k, k_off + kv_at) : 0.0f;
    float my_dv = 0.0f;

    uint start, end;
    queries_of_keys(t, t, q_seq, causal, window, delta, &start, &end);
    for (uint pos = start; pos < end; ++pos) {
        for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
            const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, tid);
            const float score =
                tree_sum(red, live ? LOAD(q, q_off + q_at) * k_t : 0.0f, tid, wg) * scale;
            const ulong row = lse_off + 2 * at(b, q_seq, pos, num_heads, head, 1, 0);
            const float p = exp(min0(score - lse[row]) - lse[row + 1]);
            if (live)
                my_dv += p * LOAD(d_out, d_out_off + q_at);
        }
    }
    if (live)
        STORE_GRAD(dv, dv_off + kv_at, my_dv, accumulate);
}

/* O and the LSE pair of one query row, by online softmax over its keys. */
__kernel void forward__tree(__global const elem *q, ulong q_off,
                            __global const elem *k, ulong k_off,
                            __global const elem *v, ulong v_off,
                            __global elem *o, ulong o_off,
                            __global float *lse, ulong lse_off, SHAPE_ARGS, __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint pos = get_group_id(0), head = get_group_id(1), b = get_group_id(2);
    const bool live = tid < head_dim;
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, tid);
    const float q_d = live ? LOAD(q, q_off + q_at) : 0.0f;
    float m = EMPTY_ROW, l = 0.0f, acc = 0.0f;

    uint start, end;
    keys_of_queries(pos, pos, kv_seq, causal, window, delta, &start, &end);
    for (uint t = start; t < end; ++t) {
        const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, tid);
        const float s = tree_sum(red, live ? q_d * LOAD(k, k_off + kv_at) : 0.0f, tid, wg) * scale;
        const float m_new = fmax(m, s);
        const float rescale = exp(m - m_new), e = exp(s - m_new);
        l = l * rescale + e;
        acc = acc * rescale + (live ? e * LOAD(v, v_off + kv_at) : 0.0f);
        m = m_new;
    }
    if (live)
        STORE(o, o_off + q_at, l != 0.0f ? acc / l : 0.0f);
    if (tid == 0) {
        const ulong row = lse_off + 2 * at(b, q_seq, pos, num_heads, head, 1, 0);
        lse[row] = l != 0.0f ? m : EMPTY_ROW;
        lse[row + 1] = l != 0.0f ? log(l) : EMPTY_ROW;
    }
}

/* Dsum = dO . O for one query row: the pre-pass that grad-Q, grad-K and
 * grad-KV read instead of recomputing it per key. */
__kernel void dsum__tree(__global const elem *d_out, ulong d_out_off,
                         __global const elem *o, ulong o_off,
                         __global float *dsum, ulong dsum_off, SHAPE_ARGS, __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint pos = get_group_id(0), head = get_group_id(1), b = get_group_id(2);
    const bool live = tid < head_dim;
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, tid);
    const float sum =
        tree_sum(red, live ? LOAD(d_out, d_out_off + q_at) * LOAD(o, o_off + q_at) : 0.0f, tid, wg);
    if (tid == 0)
        dsum[dsum_off + at(b, q_seq, pos, num_heads, head, 1, 0)] = sum;
}

/* dQ of one query row: sum over its keys of scale * dS * K[t]. */
__kernel void grad_q__tree(__global const elem *q, ulong q_off,
                           __global const elem *k, ulong k_off,
                           __global const elem *v, ulong v_off,
                           __global const elem *d_out, ulong d_out_off,
                           __global const float *lse, ulong lse_off,
                           __global const float *dsum, ulong dsum_off,
                           __global elem *dq, ulong dq_off, SHAPE_ARGS, __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint pos = get_group_id(0), head = get_group_id(1), b = get_group_id(2);
    const bool live = tid < head_dim;
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, tid);
    const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
    const float q_d = live ? LOAD(q, q_off + q_at) : 0.0f;
    const float do_d = live ? LOAD(d_out, d_out_off + q_at) : 0.0f;
    const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
    const float ds_row = dsum[dsum_off + row];
    float acc = 0.0f;

    uint start, end;
    keys_of_queries(pos, pos, kv_seq, causal, window, delta, &start, &end);
    for (uint t = start; t < end; ++t) {
        const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, tid);
        const float k_d = live ? LOAD(k, k_off + kv_at) : 0.0f;
        const float v_d = live ? LOAD(v, v_off + kv_at) : 0.0f;
        const float2 sums = tree_sum2(red, q_d * k_d, do_d * v_d, tid, wg);
        const float p = exp(min0(sums.x * scale - m) - l);
        acc += scale * p * (sums.y - ds_row) * k_d;
    }
    if (live)
        STORE_GRAD(dq, dq_off + q_at, acc, accumulate);
}

/* dK (and dV when dv is not NULL) of one key row, over the queries of its
 * KV head's group that see it; each score is shared by both. */
inline void grad_kv_row(__global const elem *q, ulong q_off, __global const elem *k,
                        ulong k_off, __global const elem *v, ulong v_off,
                        __global const elem *d_out, ulong d_out_off,
                        __global const float *lse, ulong lse_off,
                        __global const float *dsum, ulong dsum_off, __global elem *dk,
                        ulong dk_off, __global elem *dv, ulong dv_off, SHAPE_ARGS,
                        __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint t = get_group_id(0), kv_head = get_group_id(1), b = get_group_id(2);
    const bool live = tid < head_dim;
    const uint group = num_heads / num_kv_heads;
    const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, tid);
    const float k_d = live ? LOAD(k, k_off + kv_at) : 0.0f;
    const float v_d = live ? LOAD(v, v_off + kv_at) : 0.0f;
    float dk_acc = 0.0f, dv_acc = 0.0f;

    uint start, end;
    queries_of_keys(t, t, q_seq, causal, window, delta, &start, &end);
    for (uint pos = start; pos < end; ++pos) {
        for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
            const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, tid);
            const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
            const float q_d = live ? LOAD(q, q_off + q_at) : 0.0f;
            const float do_d = live ? LOAD(d_out, d_out_off + q_at) : 0.0f;
            const float2 sums = tree_sum2(red, q_d * k_d, do_d * v_d, tid, wg);
            const float p =
                exp(min0(sums.x * scale - lse[lse_off + 2 * row]) - lse[lse_off + 2 * row + 1]);
            dk_acc += scale * p * (sums.y - dsum[dsum_off + row]) * q_d;
            dv_acc += p * do_d;
        }
    }
    if (live) {
        STORE_GRAD(dk, dk_off + kv_at, dk_acc, accumulate);
        if (dv)
            STORE_GRAD(dv, dv_off + kv_at, dv_acc, accumulate);
    }
}

__kernel void grad_k__tree(__global const elem *q, ulong q_off,
                           __global const elem *k, ulong k_off,
                           __global const elem *v, ulong v_off,
                           __global const elem *d_out, ulong d_out_off,
                           __global const float *lse, ulong lse_off,
                           __global const float *dsum, ulong dsum_off,
                           __global elem *dk, ulong dk_off, SHAPE_ARGS, __local float *red)
{
    grad_kv_row(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum, dsum_off,
                dk, dk_off, 0, 0, SHAPE_PASS, red);
}

__kernel void grad_kv__tree(__global const elem *q, ulong q_off,
                            __global const elem *k, ulong k_off,
                            __global const elem *v, ulong v_off,
                            __global const elem *d_out, ulong d_out_off,
                            __global const float *lse, ulong lse_off,
                            __global const float *dsum, ulong dsum_off,
                            __global elem *dk, ulong dk_off,
                            __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float *red)
{
    grad_kv_row(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum, dsum_off,
                dk, dk_off, dv, dv_off, SHAPE_PASS, red);
}

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
    const bool e1 = l1 == EMPTY_ROW, e2 = l2 == EMPTY_ROW;
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
