/* ---- grad-K and grad-V ----------------------------------------------- */

/* P^T into s and (want_dk) dS^T = P^T * (dP^T - Dsum) into dp, from the
 * warp's 16 x TILE blocks S^T and dP^T of keys key0 (rows g) and key0 + 8
 * by queries p0.., whose m, l and Dsum are in mt, lt and dt; `masked`:
 * queries past hi or not seeing the key get 0. */
inline void p_of_keys(float *s, float *dp, __local const float *mt, __local const float *lt,
                      __local const float *dt, float unit, bool masked, bool want_dk, uint p0,
                      uint hi, uint key0, int causal, uint window, long delta, const uint *kb,
                      const float *dz, MOD_ARGS)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        const uint j = i / 4 * 8 + 2 * t + (i & 1), key = key0 + ((i & 2) ? 8u : 0u);
        const float x = s[i];
        float g = 1.0f;
#if MODS & MOD_DROPOUT
        g = KEEP_GAIN(kb, i);
#endif
#if DTYPE != 0 && FOLD_ML
        const float p = EXPU(min0(fma(x, unit, -(mt[j] + lt[j]) * EXP_UNIT)));
#else
        const float p = EXPU(min0(fma(x, unit, -mt[j] * EXP_UNIT)) - lt[j] * EXP_UNIT);
#endif
        const bool keep = !masked || (p0 + j < hi && visible(p0 + j, key, causal, window, delta));
#if MODS
        s[i] = keep ? p * g : 0.0f;
        dp[i] = keep && want_dk ? p * (g * dp[i] - dt[j]) * dz[i] : 0.0f;
#else
        s[i] = keep ? p : 0.0f;
        dp[i] = keep && want_dk ? p * (dp[i] - dt[j]) : 0.0f;
#endif
    }
}

/* The warp's 16 keys by the tile's queries of dS^T (p_of_keys's dp) into
 * a query head's dS scratch (cl/common.cl's ds_head: [key][query] floats
 * from dsh), queries past hi and keys past kv_seq left out. */
inline void scatter_ds(__global float *dsh, const float *dp, uint p0, uint hi, uint key0,
                       uint kv_seq, uint q_seq)
{
    const uint t = get_local_id(0) & 3u;
    UNROLL
    for (uint i = 0; i < NT * 4; ++i) {
        const uint j = i / 4 * 8 + 2 * t + (i & 1), key = key0 + ((i & 2) ? 8u : 0u);
        if (p0 + j < hi && key < kv_seq)
            dsh[(ulong)key * q_seq + p0 + j] = dp[i];
    }
}

/* The first of the key side's steps s.. (tile s % per_head of TILE query
 * rows from lo, below hi, of query head head0 + s / per_head) that the
 * block map shows against keys [t0, t1]: `steps` past the last, s itself
 * without a map. */
inline uint shown_step(uint s, uint steps, uint per_head, uint lo, uint hi, uint t0, uint t1,
                       uint head0, uint b, uint num_heads, uint q_seq, uint kv_seq,
                       __global const uchar *mask_blocks)
{
#if HIDING
    for (; s < steps; ++s) {
        const uint p0 = lo + s % per_head * TILE;
        if (map_shows(mask_blocks, b, head0 + s / per_head, num_heads, q_seq, kv_seq, p0,
                      min(p0 + TILE, hi) - 1u, t0, t1))
            break;
    }
#endif
    return s;
}

/* dK and/or dV of the work-group's WG_ROWS keys: every query row of every
 * head of the group that sees any of them streams through local memory
 * TILE rows at a time, with its LSE pair and Dsum; where dsw is not NULL
 * (float32), each pair's dS into the dS scratch too, for grad_qs__tiled.
 * Heads and batch elements come from the global ids, so that a launch may
 * cover a part of them (the scratch's chunks).
 * A launch of `parts` times the blocks of keys splits each block's steps
 * into that many parts (src/opencl/launch.c's enqueue_key_side): part p,
 * work-groups p * blocks.., takes its share of them and writes its float32
 * dK and dV at element x's p-th place (x * parts + p) of dk and dv, which
 * sum_parts__mma adds up. */
inline void key_side(__global const elem *q, __global const elem *k, __global const elem *v,
                     __global const elem *d_out, __global const float *lse,
                     __global const float *dsum, __global elem *dk, __global elem *dv,
                     uint q_seq, uint kv_seq, uint num_heads, uint num_kv_heads, int causal,
                     uint window, long delta, float scale, int accumulate,
                     __local float *tiles, bool want_dk, bool want_dv,
                     __global float *dq32, __global float *dsw, MOD_ARGS)
{
    const uint lid = get_local_id(0), lane = lid & 31u, warp = lid >> 5;
    const uint g = lane >> 2, t = lane & 3u, d0 = warp % WSPLIT * DW;
    tiles = tile_base(tiles);
    const float unit = SCORE_UNIT(scale);
    __local float *xch = tiles + XCH_AT, *emu = tiles + EMU_AT + warp * EMU_FLOATS;
    /* S^T = K Q^T, dP^T = V dO^T, dS^T Q and P^T dO */
    /* (group_block, group_head: a block's KV heads side by side, where
     * HEADS_SIDE) */
    const uint x = group_block(bias_dims, causal);
    const uint kv_head = group_head(bias_dims, causal) + get_global_offset(1), b = get_global_id(2);
    const uint group = num_heads / num_kv_heads;
    const uint blocks = (kv_seq + WG_ROWS - 1u) / WG_ROWS;
    const uint parts = get_num_groups(0) / blocks, part = x / blocks;
    /* causal: the first blocks are the heaviest */
    const uint r0 = x % blocks * WG_ROWS;
    const uint key0 = r0 + warp / WSPLIT * 16u + g, key1 = key0 + 8u;

    frag kf[KS][4], vf[KS][4];
    float dkf[KW][4], dvf[KW][4];
    UNROLL
    for (uint ks = 0; ks < KS; ++ks) {
        load_a(kf[ks], k, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * KSTEP, 1.0f);
        if (want_dk)
            load_a(vf[ks], v, b, kv_seq, key0, num_kv_heads, kv_head, d0 + ks * KSTEP, 1.0f);
    }
    zero(&dkf[0][0], KW * 4);
    zero(&dvf[0][0], KW * 4);
    const uint last = min(r0 + WG_ROWS, kv_seq) - 1u;
    uint lo, hi;
    queries_of_keys(r0, last, q_seq, causal, window, delta, &lo, &hi);
#if DTYPE != 0 && WSPLIT == 1
    /* dS^T goes to ds; the last tile's is in the other buffer, for its dQ */
    __local float *kb = tiles + KB_AT, *ds = tiles + DS_AT;
    uint dq_p0 = 0, dq_head = 0; /* the last tile's queries */
    if (dq32)
        copy_block(kb, k, b, kv_seq, r0, num_kv_heads, kv_head); /* seen past the loop's barrier */
#endif

    /* One loop over (head of the group, tile of its queries), so that the
     * next tile is fetched while this one is computed. */
    const uint per_head = (hi - lo + TILE - 1u) / TILE, all = lo < hi ? group * per_head : 0u;
    const uint steps = all * (part + 1u) / parts; /* this part's: from all * part / parts */
    /* steps whose tile the caller's mask hides whole are skipped */
#define SHOWN_STEP(s) shown_step((s), steps, per_head, lo, hi, r0, last, kv_head * group, b, \
                                 num_heads, q_seq, kv_seq, mask_blocks)
    const uint first = SHOWN_STEP(all * part / parts);
    stream st;
    stream_init(&st, tiles);
    stream_first(&st, tiles, q, scale, d_out, lse, dsum, true, want_dk, b, q_seq,
                 lo + first % per_head * TILE, hi, num_heads, kv_head * group + first / per_head,
                 first < steps);
    for (uint step = first, next; step < steps; step = next) {
        next = SHOWN_STEP(step + 1u);
        const uint p0 = lo + step % per_head * TILE;
        stream_land(&st, true);
        stream_ready();
        if (next < steps) {
            const uint head = kv_head * group + next / per_head;
            const uint next_p = lo + next % per_head * TILE;
            stream_next(&st, tiles, q, scale, d_out, lse, dsum, true, want_dk, b, q_seq, next_p,
                        hi, num_heads, head);
        }
        __local const float *qt = st.xt, *ot = st.yt;
        __local const float *mt = st.rows, *lt = mt + TILE, *dt = lt + TILE;

        const uint head = kv_head * group + step / per_head;
        float bv[NT * 4]; /* the bias's values: loads in flight beside the products */
        BIAS_LANE(bv, key0, p0, true, head);
        uint keep[DROP_WORDS]; /* dropout's keep bits, drawn before the scores are live */
#if MODS & MOD_DROPOUT
        keep_keys(keep, p0, key0, head, b, delta, emu, MOD_PASS);
#endif
        /* S^T and dP^T: 16 keys x TILE queries per warp. */
        float s[NT][4], dp[NT][4];
        scores(&s[0][0], want_dk ? &dp[0][0] : 0, &kf[0][0], &vf[0][0], qt, ot, d0, xch, emu);
#if DTYPE != 0 && WSPLIT == 1
        if (dq32 && step > first) /* the last tile's dQ: its dS^T is past the barrier */
            add_dq(dq32, other_ds(tiles, ds), kb, b, q_seq, dq_p0, num_heads, dq_head, emu);
#endif
        const bool whole = p0 + TILE <= hi &&
                           all_visible(p0, (long)p0 + TILE - 1, r0, last, causal, window, delta);
        /* whole tiles skip the mask's tests */
        float dz[NT * 4];
#if SHAPED
        modify_lane(&s[0][0], dz, PRE(scale), (long)p0 + 2 * (long)t + delta - (long)key0, -1.0f,
                    softcap, SLOPE(head));
        USER_LANE(&s[0][0], dz, bv, key0, p0, true, head);
#else
        UNROLL
        for (uint j = 0; j < NT * 4; ++j)
            dz[j] = 1.0f;
#endif
        if (whole)
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, false, want_dk, p0, hi, key0, causal,
                      window, delta, keep, dz, MOD_PASS);
        else
            p_of_keys(&s[0][0], &dp[0][0], mt, lt, dt, unit, true, want_dk, p0, hi, key0, causal,
                      window, delta, keep, dz, MOD_PASS);
#if DTYPE != 0 && WSPLIT == 1
        if (dq32)
            store_ds(ds, &dp[0][0]);
#endif
        if (dsw && warp % WSPLIT == 0) /* the WSPLIT warps of 16 keys hold the same dS^T */
            scatter_ds(dsw + ds_head(b, head, group, q_seq, kv_seq), &dp[0][0], p0, hi, key0,
                       kv_seq, q_seq);
        if (want_dv && want_dk)
            times(&dvf[0][0], &s[0][0], ot, &dkf[0][0], &dp[0][0], qt, d0, emu);
        else if (want_dv)
            times(&dvf[0][0], &s[0][0], ot, 0, 0, 0, d0, emu);
        else
            times(&dkf[0][0], &dp[0][0], qt, 0, 0, 0, d0, emu);
#if DTYPE != 0 && WSPLIT == 1
        dq_p0 = p0;
        dq_head = kv_head * group + step / per_head;
        ds = other_ds(tiles, ds);
#endif
        stream_advance(&st, tiles, true);
    }
#if DTYPE != 0 && WSPLIT == 1
    if (dq32 && first < steps) { /* the last tile's dQ */
        barrier(CLK_LOCAL_MEM_FENCE);
        add_dq(dq32, other_ds(tiles, ds), kb, b, q_seq, dq_p0, num_heads, dq_head, emu);
    }
#endif
#if DTYPE != 0
    scale_by(&dkf[0][0], KW * 4, scale); /* dS^T Q took Q unscaled */
#endif
#undef SHOWN_STEP
    UNROLL
    for (uint n = 0; n < KW; ++n) {
        UNROLL
        for (int i = 0; i < 4; ++i) {
            const uint key = (i & 2) ? key1 : key0, d = d0 + n * 8 + 2 * t + (i & 1);
            if (key < kv_seq && d < D) {
                const ulong x = at(b, kv_seq, key, num_kv_heads, kv_head, d);
                if (parts > 1u) {
                    if (want_dk)
                        ((__global float *)dk)[x * parts + part] = dkf[n][i];
                    if (want_dv)
                        ((__global float *)dv)[x * parts + part] = dvf[n][i];
                    continue;
                }
                if (want_dk)
                    STORE_GRAD(dk, x, dkf[n][i], accumulate);
                if (want_dv)
                    STORE_GRAD(dv, x, dvf[n][i], accumulate);
            }
        }
    }
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_v__mma(__global const elem *d_out, ulong d_out_off, __global const elem *q, ulong q_off,
            __global const elem *k, ulong k_off, __global const float *lse, ulong lse_off,
            __global elem *dv, ulong dv_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, k + k_off, d_out + d_out_off, lse + lse_off, lse + lse_off,
             dv + dv_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, false, true, 0, 0, MOD_PASS);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_k__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
            __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
            __global const float *lse, ulong lse_off, __global const float *dsum,
            ulong dsum_off, __global elem *dk, ulong dk_off, SHAPE_ARGS,
            __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dk + dk_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, false, 0, 0, MOD_PASS);
}

__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kv__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
             __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
             __global const float *lse, ulong lse_off, __global const float *dsum,
             ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
             SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, 0, 0, MOD_PASS);
}

/* dK and dV from the parts of a split key side (key_side): launched as it
 * was, part p's work-groups add up the p-th share of their block's
 * elements over every part, in the parts' order. */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
sum_parts__mma(__global const float *pk, ulong pk_off, __global const float *pv, ulong pv_off,
               __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off, SHAPE_ARGS,
               __local float *tiles)
{
    pk += pk_off;
    pv += pv_off;
    dk += dk_off;
    dv += dv_off;
    const uint blocks = (kv_seq + WG_ROWS - 1u) / WG_ROWS;
    const uint parts = get_num_groups(0) / blocks, part = get_group_id(0) / blocks;
    const uint r0 = get_group_id(0) % blocks * WG_ROWS;
    const uint kv_head = get_global_id(1), b = get_global_id(2);
    const uint n = WG_ROWS * D, j1 = n * (part + 1u) / parts;
    for (uint j = n * part / parts + get_local_id(0); j < j1; j += LANES) {
        const uint row = r0 + j / D;
        if (row < kv_seq) {
            const ulong x = at(b, kv_seq, row, num_kv_heads, kv_head, j % D);
            float sk = 0.0f, sv = 0.0f;
            for (uint p = 0; p < parts; ++p) {
                sk += pk[x * parts + p];
                sv += pv[x * parts + p];
            }
            STORE_GRAD(dk, x, sk, accumulate);
            STORE_GRAD(dv, x, sv, accumulate);
        }
    }
}

#if DTYPE == 0
/* grad_kv__mma that also writes each pair's dS into the dS scratch ds,
 * from which grad_qs__tiled takes dQ (float32: a product on the FMA units
 * in place of grad-Q's three 3xTF32 ones); both may run on a part of the
 * heads and batch elements (a global offset in dimensions 1 and 2). */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kvs__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
              __global const float *lse, ulong lse_off, __global const float *dsum,
              ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
              __global float *ds, ulong ds_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, 0, ds + ds_off, MOD_PASS);
}
#endif

#if DTYPE != 0 && WSPLIT == 1
/* dK and dV, with dQ (unscaled) added into the float32 dq32, which starts
 * at zero; finish_dq__mma then writes dQ. */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
grad_kvq__mma(__global const elem *q, ulong q_off, __global const elem *k, ulong k_off,
              __global const elem *v, ulong v_off, __global const elem *d_out, ulong d_out_off,
              __global const float *lse, ulong lse_off, __global const float *dsum,
              ulong dsum_off, __global elem *dk, ulong dk_off, __global elem *dv, ulong dv_off,
              __global float *dq32, ulong dq32_off, SHAPE_ARGS, __local float *tiles)
{
    key_side(q + q_off, k + k_off, v + v_off, d_out + d_out_off, lse + lse_off, dsum + dsum_off,
             dk + dk_off, dv + dv_off, q_seq, kv_seq, num_heads, num_kv_heads, causal, window, delta,
             scale, accumulate, tiles, true, true, dq32 + dq32_off, 0, MOD_PASS);
}

/* dQ = scale * dq32, rounded once (or added to dQ under accumulate): a
 * work-group a block of WG_ROWS query rows of one head. */
__kernel __attribute__((reqd_work_group_size(LANES, 1, 1))) void
finish_dq__mma(__global const float *dq32, ulong dq32_off, __global elem *dq, ulong dq_off,
               SHAPE_ARGS, __local float *tiles)
{
    dq32 += dq32_off;
    dq += dq_off;
    const uint r0 = get_group_id(0) * WG_ROWS, head = get_group_id(1), b = get_group_id(2);
    for (uint j = get_local_id(0); j < WG_ROWS * D; j += LANES) {
        const uint row = r0 + j / D;
        if (row < q_seq) {
            const ulong x = at(b, q_seq, row, num_heads, head, j % D);
            STORE_GRAD(dq, x, scale * dq32[x], accumulate);
        }
    }
}
#endif

