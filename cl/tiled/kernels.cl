/*
 * tiled's entry points: each runs its layout's block function on row block
 * g and, under a causal mask, on block blocks - 1 - g as well (PAIRED).
 * grad_kv__tiled takes dK and dV in one pass in both layouts;
 * grad_kvs__tiled and grad_qs__tiled (the same, writing dS, then dQ from
 * it) are the micro-tile layout's alone. grad_k__tiled and grad_v__tiled
 * serve the ops of one gradient.
 */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
forward__tiled(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
               __global const elem *v, ulong v_off, __global elem *o, ulong o_off,
               __global float *lse, ulong lse_off, SHAPE_ARGS, __local float4 *tiles4)
{
    PAIRED(q_seq, forward_block(q, q_off, k, k_off, v, v_off, o, o_off, lse, lse_off, SHAPE_PASS,
                                tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_q__tiled(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out,
              ulong d_out_off, __global const float *lse, ulong lse_off,
              __global const float *dsum, ulong dsum_off, __global elem *dq, ulong dq_off,
              SHAPE_ARGS, __local float4 *tiles4)
{
    PAIRED(q_seq, grad_q_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off,
                               dsum, dsum_off, dq, dq_off, SHAPE_PASS, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_v__tiled(__global const elem *d_out, ulong d_out_off, __global const elem *q,
              ulong q_off, __global const elem *k, ulong k_off, __global const float *lse,
              ulong lse_off, __global elem *dv, ulong dv_off, SHAPE_ARGS,
              __local float4 *tiles4)
{
    PAIRED(kv_seq, grad_v_block(d_out, d_out_off, q, q_off, k, k_off, lse, lse_off, dv, dv_off,
                                SHAPE_PASS, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_k__tiled(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out,
              ulong d_out_off, __global const float *lse, ulong lse_off,
              __global const float *dsum, ulong dsum_off, __global elem *dk, ulong dk_off,
              SHAPE_ARGS, __local float4 *tiles4)
{
    PAIRED(kv_seq, grad_k_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off,
                                dsum, dsum_off, dk, dk_off, SHAPE_PASS, tiles, r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kv__tiled(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
               __global const elem *v, ulong v_off, __global const elem *d_out,
               ulong d_out_off, __global const float *lse, ulong lse_off,
               __global const float *dsum, ulong dsum_off, __global elem *dk, ulong dk_off,
               __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float4 *tiles4)
{
#if PER_ITEM
    PAIRED(kv_seq, key_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum,
                             dsum_off, dk, dk_off, dv, dv_off, 0, SHAPE_PASS, tiles, r0))
#else
    PAIRED(kv_seq, key_rows_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off,
                                  dsum, dsum_off, dk, dk_off, dv, dv_off, SHAPE_PASS, tiles, r0))
#endif
}

#if PER_ITEM

/* grad_kv__tiled that also writes each pair's dS into the dS scratch ds
 * (cl/common.cl's ds_head), for grad_qs__tiled; both may run on a part of the
 * heads and batch elements (a global offset in dimensions 1 and 2). */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kvs__tiled(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
                __global const elem *v, ulong v_off, __global const elem *d_out,
                ulong d_out_off, __global const float *lse, ulong lse_off,
                __global const float *dsum, ulong dsum_off, __global elem *dk, ulong dk_off,
                __global elem *dv, ulong dv_off, __global float *ds, ulong ds_off, SHAPE_ARGS,
                __local float4 *tiles4)
{
    PAIRED(kv_seq, key_block(q, q_off, k, k_off, v, v_off, d_out, d_out_off, lse, lse_off, dsum,
                             dsum_off, dk, dk_off, dv, dv_off, ds + ds_off, SHAPE_PASS, tiles,
                             r0))
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_qs__tiled(__global const elem *k, ulong k_off, __global const float *ds, ulong ds_off,
               __global elem *dq, ulong dq_off, SHAPE_ARGS, __local float4 *tiles4)
{
    PAIRED(q_seq, grad_q_ds_block(k, k_off, ds, ds_off, dq, dq_off, SHAPE_PASS, tiles, r0))
}
#endif

#ifdef LOCAL_PROBE /* each kernel's buffer in whole float4s (cl/common.cl) */
#define WHOLE_FLOAT4S(x) (((x) + 3) / 4 * 4)
#if PER_ITEM
LOCAL_PROBE_KERNEL(forward__tiled, WHOLE_FLOAT4S(LOCAL_FORWARD))
LOCAL_PROBE_KERNEL(grad_q__tiled, WHOLE_FLOAT4S(LOCAL_GRAD_Q))
LOCAL_PROBE_KERNEL(grad_k__tiled, WHOLE_FLOAT4S(LOCAL_KEY))
LOCAL_PROBE_KERNEL(grad_v__tiled, WHOLE_FLOAT4S(LOCAL_KEY))
LOCAL_PROBE_KERNEL(grad_kv__tiled, WHOLE_FLOAT4S(LOCAL_KEY))
LOCAL_PROBE_KERNEL(grad_kvs__tiled, WHOLE_FLOAT4S(LOCAL_KEY))
LOCAL_PROBE_KERNEL(grad_qs__tiled, WHOLE_FLOAT4S(LOCAL_GRAD_QS))
#else
#define LOCAL_ROWS WHOLE_FLOAT4S(TILED_LOCAL_ROWS(ROWS, TILE, SPLIT, DSPLIT, DP))
LOCAL_PROBE_KERNEL(forward__tiled, LOCAL_ROWS)
LOCAL_PROBE_KERNEL(grad_q__tiled, LOCAL_ROWS)
LOCAL_PROBE_KERNEL(grad_k__tiled, LOCAL_ROWS)
LOCAL_PROBE_KERNEL(grad_v__tiled, LOCAL_ROWS)
LOCAL_PROBE_KERNEL(grad_kv__tiled, LOCAL_ROWS)
#endif
#endif
