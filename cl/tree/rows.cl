/*
 * The `tree` variants: meganeura's WGSL attention archetypes in OpenCL C 1.2,
 * generalised. grad_v__tree is mha_grad_v.wgsl; the others follow its shape.
 *
 * One work-group per row (a query for forward and grad-Q, a key for grad-K,
 * grad-V and grad-KV) of one head and batch element. Work-item `tid` of a
 * work-group of WG owns elements tid, tid + WG, ... of the row, at most
 * LANE_ELEMS of them, and sums its products over them first; each dot
 * product is then reduced across the work-group in local memory by a tree
 * of barriers, as the seed does with its 64 lanes. WG is the next power of
 * two >= head_dim where the device allows it, else the largest power of two
 * it allows (the host's clattn_ocl_tree_work_group), with LANE_ELEMS =
 * ceil(largest head_dim / WG); elements past head_dim add zeros, so any
 * head_dim from 1 to 256 runs on any device.
 *
 * Launch: global (rows * WG, heads, batch), local (WG, 1, 1); `red` is a
 * __local buffer of WG floats, or 2 * WG for kernels that reduce two dot
 * products at once. Tensor arguments are (buffer, offset in floats) pairs.
 */
#ifndef LANE_ELEMS
#define LANE_ELEMS 1
#endif

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

/* A work-item's elements of one row (element tid + i * wg in x[i]), zeros
 * past head_dim. `base` is the row's first element. */
inline void lane_load(float *x, __global const elem *src, ulong base, uint tid, uint wg,
                      uint head_dim)
{
    for (uint i = 0; i < LANE_ELEMS; ++i) {
        const uint d = tid + i * wg;
        x[i] = d < head_dim ? LOAD(src, base + d) : 0.0f;
    }
}

/* The work-item's part of a dot product of a row with its elements x. */
inline float lane_dot(const float *x, __global const elem *src, ulong base, uint tid, uint wg,
                      uint head_dim)
{
    float sum = 0.0f;
    for (uint i = 0; i < LANE_ELEMS; ++i) {
        const uint d = tid + i * wg;
        if (d < head_dim)
            sum = i ? fma(x[i], LOAD(src, base + d), sum) : x[i] * LOAD(src, base + d);
    }
    return sum;
}

/* The work-item's part of the dot product of two of its element sets. */
inline float lane_dot2(const float *x, const float *y)
{
    float sum = x[0] * y[0];
    for (uint i = 1; i < LANE_ELEMS; ++i)
        sum = fma(x[i], y[i], sum);
    return sum;
}

/* Under the caller's mask, a row's loop over keys steps over the blocks
 * of MAP_BLOCK keys its block map hides from the row (at the loop's first
 * key and at each block's first): key t, or the first shown past it (end
 * past the last), by SHOWN_KEYS from t's block, whose map byte a range of
 * it reads whole. The same for a key's loop over query rows, whose blocks
 * must be hidden from every query head of [head0, head0 + heads)
 * (SHOWN_ROWS). Without the mask, t and p themselves. */
#if HIDING
#define NEXT_SHOWN_KEY(t, start, end, pos, head)                                               \
    ((t) == (start) || (t) % MAP_BLOCK == 0u                                                   \
         ? max((t), SHOWN_KEYS((t) - (t) % MAP_BLOCK, MAP_BLOCK, (end), (pos), (pos), (head))) \
         : (t))
#define NEXT_SHOWN_ROW(p, start, end, t, head0, heads)                                         \
    ((p) == (start) || (p) % MAP_BLOCK == 0u                                                   \
         ? max((p), SHOWN_ROWS((p) - (p) % MAP_BLOCK, MAP_BLOCK, (end), (t), (t), (head0),     \
                               (heads)))                                                       \
         : (p))
#else
#define NEXT_SHOWN_KEY(t, start, end, pos, head) (t)
#define NEXT_SHOWN_ROW(p, start, end, t, head0, heads) (p)
#endif

/* Stores (or, for gradients under accumulate, adds) a work-item's elements. */
inline void lane_store_grad(__global elem *dst, ulong base, const float *x, uint tid, uint wg,
                            uint head_dim, int accumulate)
{
    for (uint i = 0; i < LANE_ELEMS; ++i) {
        const uint d = tid + i * wg;
        if (d < head_dim)
            STORE_GRAD(dst, base + d, x[i], accumulate);
    }
}

__kernel void grad_v__tree(__global const elem *d_out, ulong d_out_off,
                           __global const elem *q, ulong q_off,
                           __global const elem *k, ulong k_off,
                           __global const float *lse, ulong lse_off,
                           __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float *red)
{
    const uint wg = get_local_size(0), tid = get_local_id(0);
    const uint t = get_group_id(0), kv_head = get_group_id(1), b = get_group_id(2);
    const uint group = num_heads / num_kv_heads;
    const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, 0);
    float k_t[LANE_ELEMS], my_dv[LANE_ELEMS];
    lane_load(k_t, k, k_off + kv_at, tid, wg, head_dim);
    for (uint i = 0; i < LANE_ELEMS; ++i)
        my_dv[i] = 0.0f;

    uint start, end;
    queries_of_keys(t, t, q_seq, causal, window, delta, &start, &end);
    for (uint pos = start; pos < end; ++pos) {
        if ((pos = NEXT_SHOWN_ROW(pos, start, end, t, kv_head * group, group)) >= end)
            break;
        for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
            const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, 0);
            float score =
                tree_sum(red, lane_dot(k_t, q, q_off + q_at, tid, wg, head_dim), tid, wg) * scale;
#if SHAPED
            float dz;
            score = MODIFY(score, pos, t, head, b, &dz);
#endif
            const ulong row = lse_off + 2 * at(b, q_seq, pos, num_heads, head, 1, 0);
            float p = exp(min0(score - lse[row]) - lse[row + 1]);
#if MODS & MOD_DROPOUT
            p *= DROP(pos, t, head, b);
#endif
            for (uint i = 0; i < LANE_ELEMS; ++i) {
                const uint d = tid + i * wg;
                if (d < head_dim)
                    my_dv[i] += p * LOAD(d_out, d_out_off + q_at + d);
            }
        }
    }
    lane_store_grad(dv, dv_off + kv_at, my_dv, tid, wg, head_dim, accumulate);
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
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, 0);
    float q_d[LANE_ELEMS], acc[LANE_ELEMS];
    lane_load(q_d, q, q_off + q_at, tid, wg, head_dim);
    for (uint i = 0; i < LANE_ELEMS; ++i)
        acc[i] = 0.0f;
    float m = EMPTY_ROW, l = 0.0f;

    uint start, end;
    keys_of_queries(pos, pos, kv_seq, causal, window, delta, &start, &end);
    for (uint t = start; t < end; ++t) {
        if ((t = NEXT_SHOWN_KEY(t, start, end, pos, head)) >= end)
            break;
        const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, 0);
        float s =
            tree_sum(red, lane_dot(q_d, k, k_off + kv_at, tid, wg, head_dim), tid, wg) * scale;
#if SHAPED
        float dz;
        s = MODIFY(s, pos, t, head, b, &dz);
#endif
        const float m_new = fmax(m, s);
        float rescale = exp(m - m_new), e = exp(s - m_new);
        l = l * rescale + e;
#if MODS & MOD_DROPOUT
        e *= DROP(pos, t, head, b); /* l is the undropped sum */
#endif
        for (uint i = 0; i < LANE_ELEMS; ++i) {
            const uint d = tid + i * wg;
            acc[i] = acc[i] * rescale + (d < head_dim ? e * LOAD(v, v_off + kv_at + d) : 0.0f);
        }
        m = m_new;
    }
#if MODS & MOD_SINK
    const float r = sink_fold(&m, &l, SINK(head));
    for (uint i = 0; i < LANE_ELEMS; ++i)
        acc[i] *= r;
#endif
    for (uint i = 0; i < LANE_ELEMS; ++i)
        acc[i] = l != 0.0f ? acc[i] / l : ZERO_SUM(pos, 0.0f);
    for (uint i = 0; i < LANE_ELEMS; ++i) {
        const uint d = tid + i * wg;
        if (d < head_dim)
            STORE(o, o_off + q_at + d, acc[i]);
    }
    if (tid == 0) {
        const ulong row = lse_off + 2 * at(b, q_seq, pos, num_heads, head, 1, 0);
        lse[row] = l != 0.0f ? m : ZERO_SUM(pos, EMPTY_ROW);
        lse[row + 1] = l != 0.0f ? log(l) : ZERO_SUM(pos, EMPTY_ROW);
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
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, 0);
    float do_d[LANE_ELEMS];
    lane_load(do_d, d_out, d_out_off + q_at, tid, wg, head_dim);
    const float sum = tree_sum(red, lane_dot(do_d, o, o_off + q_at, tid, wg, head_dim), tid, wg);
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
    const uint kv_head = head / (num_heads / num_kv_heads);
    const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, 0);
    const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
    float q_d[LANE_ELEMS], do_d[LANE_ELEMS], k_d[LANE_ELEMS], v_d[LANE_ELEMS], acc[LANE_ELEMS];
    lane_load(q_d, q, q_off + q_at, tid, wg, head_dim);
    lane_load(do_d, d_out, d_out_off + q_at, tid, wg, head_dim);
    for (uint i = 0; i < LANE_ELEMS; ++i)
        acc[i] = 0.0f;
    const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
    const float ds_row = dsum[dsum_off + row];

    uint start, end;
    keys_of_queries(pos, pos, kv_seq, causal, window, delta, &start, &end);
    for (uint t = start; t < end; ++t) {
        if ((t = NEXT_SHOWN_KEY(t, start, end, pos, head)) >= end)
            break;
        const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, 0);
        lane_load(k_d, k, k_off + kv_at, tid, wg, head_dim);
        lane_load(v_d, v, v_off + kv_at, tid, wg, head_dim);
        const float2 sums = tree_sum2(red, lane_dot2(q_d, k_d), lane_dot2(do_d, v_d), tid, wg);
        float s = sums.x * scale, dz = 1.0f, dp = sums.y;
#if SHAPED
        s = MODIFY(s, pos, t, head, b, &dz);
#endif
#if MODS & MOD_DROPOUT
        dp *= DROP(pos, t, head, b);
#endif
        const float p = exp(min0(s - m) - l);
        for (uint i = 0; i < LANE_ELEMS; ++i)
            acc[i] += scale * p * (dp - ds_row) * dz * k_d[i];
    }
    lane_store_grad(dq, dq_off + q_at, acc, tid, wg, head_dim, accumulate);
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
    const uint group = num_heads / num_kv_heads;
    const ulong kv_at = at(b, kv_seq, t, num_kv_heads, kv_head, head_dim, 0);
    float k_d[LANE_ELEMS], v_d[LANE_ELEMS], q_d[LANE_ELEMS], do_d[LANE_ELEMS];
    float dk_acc[LANE_ELEMS], dv_acc[LANE_ELEMS];
    lane_load(k_d, k, k_off + kv_at, tid, wg, head_dim);
    lane_load(v_d, v, v_off + kv_at, tid, wg, head_dim);
    for (uint i = 0; i < LANE_ELEMS; ++i)
        dk_acc[i] = dv_acc[i] = 0.0f;

    uint start, end;
    queries_of_keys(t, t, q_seq, causal, window, delta, &start, &end);
    for (uint pos = start; pos < end; ++pos) {
        if ((pos = NEXT_SHOWN_ROW(pos, start, end, t, kv_head * group, group)) >= end)
            break;
        for (uint head = kv_head * group; head < (kv_head + 1u) * group; ++head) {
            const ulong q_at = at(b, q_seq, pos, num_heads, head, head_dim, 0);
            const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
            lane_load(q_d, q, q_off + q_at, tid, wg, head_dim);
            lane_load(do_d, d_out, d_out_off + q_at, tid, wg, head_dim);
            const float2 sums = tree_sum2(red, lane_dot2(q_d, k_d), lane_dot2(do_d, v_d), tid, wg);
            float s = sums.x * scale, dz = 1.0f, keep = 1.0f;
#if SHAPED
            s = MODIFY(s, pos, t, head, b, &dz);
#endif
#if MODS & MOD_DROPOUT
            keep = DROP(pos, t, head, b);
#endif
            float p = exp(min0(s - lse[lse_off + 2 * row]) - lse[lse_off + 2 * row + 1]);
            const float ds = scale * p * (keep * sums.y - dsum[dsum_off + row]) * dz;
            p *= keep;
            for (uint i = 0; i < LANE_ELEMS; ++i) {
                dk_acc[i] += ds * q_d[i];
                dv_acc[i] += p * do_d[i];
            }
        }
    }
    lane_store_grad(dk, dk_off + kv_at, dk_acc, tid, wg, head_dim, accumulate);
    if (dv)
        lane_store_grad(dv, dv_off + kv_at, dv_acc, tid, wg, head_dim, accumulate);
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

