/* The dot products q . k and dO . v of work-item (i, j)'s pair, query row
 * i and key j of a BT x BT tile (BT = the work-group's side): Q and dO
 * (rows qa), K and V (rows ka) pass through local memory BIAS_CHUNK
 * columns at a time, work-item (i, j) loading columns j, j + BT, ... of
 * query row i and of key i. Each array holds BT rows of BIAS_ROW floats
 * (BIAS_CHUNK and 4 more: a row starts 16 bytes aligned and 4 banks past
 * the one before, so that eight neighbouring keys' 16-byte reads fall in
 * distinct banks); `tiles` holds four (the host's sizes,
 * src/opencl/opencl.h). Every work-item of the group calls it. */
#define BIAS_ROW (BIAS_CHUNK + 4u)

inline void tile_dots(__global const elem *q, __global const elem *k, __global const elem *v,
                      __global const elem *d_out, ulong qa, ulong ka, uint head_dim,
                      __local float *tiles, float *s_out, float *dp_out)
{
    const uint bt = get_local_size(0), j = get_local_id(0), i = get_local_id(1);
    const uint size = bt * BIAS_ROW;
    __local float *qs = tiles, *gs = qs + size, *ks = gs + size, *vs = ks + size;
    __local const float4 *q4 = (__local const float4 *)(qs + i * BIAS_ROW);
    __local const float4 *g4 = (__local const float4 *)(gs + i * BIAS_ROW);
    __local const float4 *k4 = (__local const float4 *)(ks + j * BIAS_ROW);
    __local const float4 *v4 = (__local const float4 *)(vs + j * BIAS_ROW);
    float4 s = (float4)(0.0f), dp = (float4)(0.0f);
    for (uint c0 = 0; c0 < head_dim; c0 += BIAS_CHUNK) {
        for (uint c = j; c < BIAS_CHUNK; c += bt) {
            const uint x = i * BIAS_ROW + c;
            const bool in = c0 + c < head_dim;
            qs[x] = in ? LOAD(q, qa + c0 + c) : 0.0f;
            gs[x] = in ? LOAD(d_out, qa + c0 + c) : 0.0f;
            ks[x] = in ? LOAD(k, ka + c0 + c) : 0.0f;
            vs[x] = in ? LOAD(v, ka + c0 + c) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (uint c = 0; c < BIAS_CHUNK / 4u; ++c) {
            s = fma(q4[c], k4[c], s);
            dp = fma(g4[c], v4[c], dp);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *s_out = (s.x + s.y) + (s.z + s.w);
    *dp_out = (dp.x + dp.y) + (dp.z + dp.w);
}

/* clattn_grad_bias(): dBias of a BT x BT tile of query rows and keys of
 * one slice of the bias (grid: keys, rows, slices; BT = the work-group's
 * side), summed over the batch elements and query heads the slice gathers
 * (bias_dims), in that order: each visible pair's p (dP - Dsum), dropout's
 * factor on dP, as the backward's dS before the score function's
 * derivative and the scale; the products through tile_dots. */
__kernel void grad_bias__tree(__global const elem *q, ulong q_off,
                              __global const elem *k, ulong k_off,
                              __global const elem *v, ulong v_off,
                              __global const elem *d_out, ulong d_out_off,
                              __global const float *lse, ulong lse_off,
                              __global const float *dsum, ulong dsum_off,
                              __global float *d_bias, ulong d_bias_off, SHAPE_ARGS, uint batch,
                              __local float *tiles)
{
    const uint bt = get_local_size(0), j = get_local_id(0), i = get_local_id(1);
    const uint t0 = get_group_id(0) * bt, p0 = get_group_id(1) * bt, slice = get_group_id(2);
    tiles = local_align16(tiles); /* tile_dots reads 16 bytes at a time */
    const uint t = t0 + j, pos = p0 + i;
    const uint heads_out = bias_dims & 2u ? num_heads : 1u;
    const uint b_out = slice / heads_out, h_out = slice % heads_out;
    const uint b_lo = bias_dims & 1u ? b_out : 0u, b_hi = bias_dims & 1u ? b_out + 1u : batch;
    const uint h_lo = bias_dims & 2u ? h_out : 0u, h_hi = bias_dims & 2u ? h_out + 1u : num_heads;
    const uint group = num_heads / num_kv_heads;
    const uint p1 = min(p0 + bt, q_seq) - 1u, t1 = min(t0 + bt, kv_seq) - 1u;
    /* the keys any row of the tile sees under the built-in masks: the same
     * for every work-item, as are the block map's tiles below */
    uint lo, hi;
    keys_of_queries(p0, p1, kv_seq, causal, window, delta, &lo, &hi);
    const bool any = t0 < hi && t1 >= lo;
    const bool mine = pos < q_seq && t < kv_seq;
    const ulong out = d_bias_off + ((ulong)slice * q_seq + pos) * kv_seq + t;
    float acc = mine && accumulate ? d_bias[out] : 0.0f;
    for (uint b = b_lo; any && b < b_hi; ++b)
        for (uint head = h_lo; head < h_hi; ++head) {
            if (!map_shows(mask_blocks, b, head, num_heads, q_seq, kv_seq, p0, p1, t0, t1))
                continue;
            /* this work-item's rows to load: query p0 + i, key t0 + i */
            const ulong qa = at(b, q_seq, min(pos, q_seq - 1u), num_heads, head, head_dim, 0);
            const ulong ka = at(b, kv_seq, min(t0 + i, kv_seq - 1u), num_kv_heads,
                                head / group, head_dim, 0);
            float s, dp;
            tile_dots(q + q_off, k + k_off, v + v_off, d_out + d_out_off, qa, ka, head_dim,
                      tiles, &s, &dp);
            if (!mine || !visible(pos, t, causal, window, delta))
                continue;
            const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
            const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
            if (m == EMPTY_ROW && l == EMPTY_ROW)
                continue; /* no key, or every one hidden */
            float z = s * scale, dz = 1.0f;
#if SHAPED
            z = MODIFY(z, pos, t, head, b, &dz);
#endif
#if MODS & MOD_DROPOUT
            dp *= DROP(pos, t, head, b);
#endif
            if (z != -INFINITY)
                acc += exp(min0(z - m) - l) * (dp - dsum[dsum_off + row]);
        }
    if (mine)
        d_bias[out] = acc;
}

#if MODS & MOD_SCORE_DP
/* Where `on` (the same in every work-item), the held sums of every
 * work-item into the table, then none held. Every work-item passes its
 * barriers either way: with them inside the condition, PoCL 3.1 summed
 * wrongly (tiles of 4) where Mesa's rusticl did not. */
inline void hold_flush(__local uint *entry, __local float *term, __local float *table,
                       uint *held, float *sums, uint *nheld, bool on)
{
    const uint n = get_local_size(0) * get_local_size(1);
    const uint w = get_local_id(1) * get_local_size(0) + get_local_id(0);
    if (on) {
#pragma unroll
        for (uint e = 0; e < SCORE_DP_MAX; ++e) {
            entry[e * n + w] = e < *nheld ? held[e] : 0xFFFFFFFFu;
            term[e * n + w] = e < *nheld ? sums[e] : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint x = 0; on && x < SCORE_DP_MAX * n; ++x) {
        const uint e = entry[x];
        if (e != 0xFFFFFFFFu && (e & (n - 1u)) == w)
            table[e] += term[x];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    *nheld = on ? 0u : *nheld;
}

/* Adds a pair's terms (index, d times dz; the first `terms`) to the held
 * sums if they all find room, true then; false leaves everything as it
 * was. The arrays are indexed by constants alone, so that they stay in
 * registers. */
inline bool hold_add(uint *held, float *sums, uint *nheld, uint terms, const uint *index,
                     const float *d, float dz)
{
    uint need = 0u;
#pragma unroll
    for (uint e = 0; e < SCORE_DP_MAX; ++e) {
        bool found = e >= terms;
#pragma unroll
        for (uint h = 0; h < SCORE_DP_MAX; ++h)
            found |= h < *nheld && held[h] == index[e];
#pragma unroll
        for (uint f = 0; f < e; ++f)
            found |= index[f] == index[e];
        need += found ? 0u : 1u;
    }
    if (*nheld + need > SCORE_DP_MAX)
        return false;
#pragma unroll
    for (uint e = 0; e < SCORE_DP_MAX; ++e) {
        if (e >= terms)
            break;
        bool found = false;
#pragma unroll
        for (uint h = 0; h < SCORE_DP_MAX; ++h) {
            const bool here = !found && h < *nheld && held[h] == index[e];
            sums[h] += here ? dz * d[e] : 0.0f;
            found |= here;
        }
#pragma unroll
        for (uint h = 0; h < SCORE_DP_MAX; ++h) {
            const bool here = !found && h == *nheld;
            held[h] = here ? index[e] : held[h];
            sums[h] = here ? dz * d[e] : sums[h];
        }
        *nheld += found ? 0u : 1u;
    }
    return true;
}

/* clattn_grad_score_params(): the caller's score function's parameters'
 * gradient, d_params[e] = the sum over visible pairs of dZ = p (dP - Dsum)
 * (dropout's factor on dP) times the derivative d that clattn_score_dp
 * gives for e, into one row of `parts` (count floats) a work-group, which
 * the host adds up in order (src/opencl/pairs.c).
 *
 * A work-group of BT x BT (grid: G groups of query blocks, slices) takes
 * query blocks g, g + G, ... of BT rows of its slice (batch element, query
 * head), their keys BT at a time, work-item (i, j) the pair of row i and
 * key j through tile_dots. Each work-item holds up to SCORE_DP_MAX entries
 * and their sums in registers, adding a pair's terms to the entries it
 * holds; where a pair names more entries than it has room for, the whole
 * work-group flushes (hold_flush): every held sum goes to a list in local
 * memory (held entry e of work-item w in slot e * BT^2 + w), and work-item
 * w adds into the table, after the tiles in local memory, the sums of the
 * entries with entry mod BT^2 = w, in slot order. Every sum is thus taken
 * in an order the data fix, whatever the device's scheduling; a function
 * whose entries repeat along a row (a bias clipped at a distance, one
 * parameter a head) flushes seldom. A count past SCORE_DP_MAX or an entry
 * past count sets *bad (the host then writes nothing). */
__kernel void grad_score_params__tree(__global const elem *q, ulong q_off,
                                      __global const elem *k, ulong k_off,
                                      __global const elem *v, ulong v_off,
                                      __global const elem *d_out, ulong d_out_off,
                                      __global const float *lse, ulong lse_off,
                                      __global const float *dsum, ulong dsum_off,
                                      __global float *parts, ulong parts_off, SHAPE_ARGS,
                                      uint count, __global uint *bad, __local float *tiles)
{
    const uint bt = get_local_size(0), j = get_local_id(0), i = get_local_id(1);
    const uint n = bt * bt, w = i * bt + j;
    const uint slice = get_group_id(1), b = slice / num_heads, head = slice % num_heads;
    const uint group = num_heads / num_kv_heads;
    tiles = local_align16(tiles); /* tile_dots reads 16 bytes at a time */
    __local uint *entry = (__local uint *)(tiles + 4u * bt * BIAS_ROW);
    __local float *term = (__local float *)(entry + SCORE_DP_MAX * n);
    __local float *table = term + SCORE_DP_MAX * n;
    /* the last tile whose pairs flush (by the count of tiles taken): set
     * after a tile's tile_dots, read before the next's */
    __local uint full;
    __global const float *p = slopes + 2u * num_heads;
    for (uint e = w; e < count; e += n)
        table[e] = 0.0f;
    if (w == 0u)
        full = 0xFFFFFFFFu;
    uint held[SCORE_DP_MAX] = {0u, 0u, 0u, 0u}, nheld = 0u, flaw = 0u, tiles_done = 0u;
    float sums[SCORE_DP_MAX] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint p0 = get_group_id(0) * bt; p0 < q_seq; p0 += get_num_groups(0) * bt) {
        const uint p1 = min(p0 + bt, q_seq) - 1u, pos = min(p0 + i, q_seq - 1u);
        const ulong row = at(b, q_seq, pos, num_heads, head, 1, 0);
        const ulong qa = at(b, q_seq, pos, num_heads, head, head_dim, 0);
        const float m = lse[lse_off + 2 * row], l = lse[lse_off + 2 * row + 1];
        /* a row past the block's end, or empty (no key, or every one hidden) */
        const bool live = p0 + i < q_seq && !(m == EMPTY_ROW && l == EMPTY_ROW);
        const float ds = dsum[dsum_off + row];
        uint lo, hi;
        keys_of_queries(p0, p1, kv_seq, causal, window, delta, &lo, &hi);
        for (uint t0 = lo; t0 < hi; t0 += bt) {
            const uint t1 = min(t0 + bt, kv_seq) - 1u, t = t0 + j;
            if (!map_shows(mask_blocks, b, head, num_heads, q_seq, kv_seq, p0, p1, t0, t1))
                continue;
            const uint stamp = tiles_done++;
            const ulong ka = at(b, kv_seq, min(t0 + i, kv_seq - 1u), num_kv_heads,
                                head / group, head_dim, 0);
            float s, dp;
            tile_dots(q + q_off, k + k_off, v + v_off, d_out + d_out_off, qa, ka, head_dim,
                      tiles, &s, &dp);
            uint terms = 0u, index[SCORE_DP_MAX] = {0u, 0u, 0u, 0u};
            float d[SCORE_DP_MAX] = {0.0f, 0.0f, 0.0f, 0.0f}, dz = 0.0f;
            if (live && t < kv_seq && visible(p0 + i, t, causal, window, delta)) {
                float g;
                const float pre = builtin_modify(s * scale, p0 + i, t, head, delta, softcap,
                                                 slopes, &g);
                const float z = user_modify(pre, p0 + i, t, head, b, delta, slopes, num_heads,
                                            q_seq, kv_seq, kv_pos0, seq0, bias, bool_mask,
                                            bias_dims, &g);
#if MODS & MOD_DROPOUT
                dp *= DROP(p0 + i, t, head, b);
#endif
                if (z != -INFINITY)
                    dz = exp(min0(z - m) - l) * (dp - ds);
                if (dz != 0.0f) { /* as the host's pass: a pair with no dZ names nothing */
                    const uint P = (uint)((long)(p0 + i) + delta + (long)kv_pos0);
                    terms = clattn_score_dp(pre, b + seq0, head, P, t + kv_pos0, p, index, d);
                    if (terms > SCORE_DP_MAX)
                        flaw = 1u;
                    terms = min(terms, SCORE_DP_MAX);
                    /* the entries inside the table, in order, first */
                    uint kept = 0u, in[SCORE_DP_MAX];
                    float din[SCORE_DP_MAX];
#pragma unroll
                    for (uint e = 0; e < SCORE_DP_MAX; ++e) {
                        const bool on = e < terms && index[e] < count;
                        flaw |= e < terms && index[e] >= count;
#pragma unroll
                        for (uint x = 0; x < SCORE_DP_MAX; ++x) {
                            in[x] = on && x == kept ? index[e] : in[x];
                            din[x] = on && x == kept ? d[e] : din[x];
                        }
                        kept += on ? 1u : 0u;
                    }
#pragma unroll
                    for (uint e = 0; e < SCORE_DP_MAX; ++e) {
                        index[e] = in[e];
                        d[e] = din[e];
                    }
                    terms = kept;
                }
            }
            const bool added = hold_add(held, sums, &nheld, terms, index, d, dz);
            if (!added)
                full = stamp; /* every writer writes the same */
            barrier(CLK_LOCAL_MEM_FENCE);
            hold_flush(entry, term, table, held, sums, &nheld, full == stamp);
            if (!added)
                hold_add(held, sums, &nheld, terms, index, d, dz);
        }
    }
    hold_flush(entry, term, table, held, sums, &nheld, true);
    if (flaw)
        bad[0] = 1u; /* every writer writes the same */
    const ulong part = (ulong)slice * get_num_groups(0) + get_group_id(0);
    for (uint e = w; e < count; e += n)
        parts[parts_off + part * count + e] = table[e];
}
#endif

