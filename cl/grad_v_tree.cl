/*
 * grad_v__tree: meganeura's mha_grad_v.wgsl in OpenCL C 1.2, generalised.
 *
 * One work-group per (KV position t, KV head, batch); lane d owns dV[t][d].
 * Each score Q[pos].K[t] is reduced across the work-group in local memory by
 * a tree of barriers, as the seed does with its 64 lanes. The work-group is
 * the next power of two >= head_dim; lanes past head_dim add zeros, so any
 * head_dim from 1 to 256 works.
 *
 * Launch: global (kv_seq * WG, num_kv_heads, batch), local (WG, 1, 1), and
 * `red` a __local buffer of WG floats.
 */

__kernel void grad_v__tree(__global const float *d_out, ulong d_out_off,
                           __global const float *q, ulong q_off,
                           __global const float *k, ulong k_off,
                           __global const float *lse, ulong lse_off,
                           __global float *dv, ulong dv_off,
                           uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads,
                           uint head_dim, int causal, uint window, float scale,
                           __local float *red)
{
    const uint wg = get_local_size(0);
    const uint tid = get_local_id(0);
    const uint t = get_group_id(0);
    const uint kv_head = get_group_id(1);
    const uint b = get_group_id(2);
    const bool lane_live = tid < head_dim;

    const uint heads_per_kv = num_heads / num_kv_heads;
    const ulong q_row = (ulong)num_heads * head_dim;
    const ulong kv_row = (ulong)num_kv_heads * head_dim;

    /* Offsets of this batch's first row and of this lane's element. */
    const ulong q_batch = q_off + (ulong)b * q_seq * q_row;
    const ulong o_batch = d_out_off + (ulong)b * q_seq * q_row;
    const ulong lse_batch = lse_off + (ulong)b * q_seq * num_heads * 2;
    const ulong kv_at = ((ulong)b * kv_seq + t) * kv_row + (ulong)kv_head * head_dim + tid;

    const float k_t = lane_live ? k[k_off + kv_at] : 0.0f;
    float my_dv = 0.0f;

    /* The seed's loop bounds: the queries that see key t. */
    const uint start_pos = causal ? t : 0u;
    uint end_pos = q_seq;
    if (window > 0u && t < q_seq && window < q_seq - t)
        end_pos = t + window; /* written so that t + window cannot wrap */

    for (uint pos = start_pos; pos < end_pos; ++pos) {
        for (uint head_rel = 0; head_rel < heads_per_kv; ++head_rel) {
            const uint head = kv_head * heads_per_kv + head_rel;
            const ulong q_at = (ulong)pos * q_row + (ulong)head * head_dim + tid;

            red[tid] = lane_live ? q[q_batch + q_at] * k_t : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint s = wg >> 1; s > 0u; s >>= 1) {
                if (tid < s)
                    red[tid] += red[tid + s];
                barrier(CLK_LOCAL_MEM_FENCE);
            }
            const float score = red[0] * scale;
            /* red[0] is read by every lane before lane 0 may overwrite it. */
            barrier(CLK_LOCAL_MEM_FENCE);

            const ulong lse_at = lse_batch + ((ulong)pos * num_heads + head) * 2;
            const float p = exp(fmin(score - lse[lse_at], 0.0f) - lse[lse_at + 1]);
            if (lane_live)
                my_dv += p * d_out[o_batch + q_at];
        }
    }

    if (lane_live)
        dv[dv_off + kv_at] = my_dv;
}
