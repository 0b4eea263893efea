/* The native query-side jobs (the forward, grad-Q): part of kernels.c's
 * unit, compiled with it once per instruction-set level, so it has no guard
 * and includes nothing. */
/* Query-side jobs take QUERY_BLOCK query rows of one (batch, head), kept
 * transposed so that the rows lie along a vector, and walk the keys
 * KEY_BLOCK at a time: a key's scores against every row of the block are
 * one vector, and per-row softmax state (max, sum, Dsum) is a vector too. */

typedef struct query_block {
    size_t b, head, pos0, rows;      /* rows of [pos0, pos0 + rows) */
    uint32_t lo, hi;                 /* keys any of them sees */
    uint32_t row_lo[QUERY_BLOCK];    /* keys [row_lo, row_hi) row r sees; */
    uint32_t row_hi[QUERY_BLOCK];    /* empty past the last row */
    const float *kb, *vb;            /* K and V of the KV head at key 0 */
    const tile_row *vt;              /* the forward's V of the KV head (vt's layout) */
    size_t kv_row;
    size_t row[QUERY_BLOCK];         /* row_index of each row */
    const float *ptrs[QUERY_BLOCK];  /* scratch: row pointers to transpose */
} query_block;

INLINE void query_block_of(const native_call *c, size_t job, query_block *qb)
{
    const clattn_shape *s = c->s;
    const size_t blocks = native_query_blocks(s->q_seq);
    const size_t D = s->head_dim;
    /* Blocks of one head are consecutive, as run_blocks groups them. */
    qb->pos0 = job % blocks * QUERY_BLOCK;
    qb->head = job / blocks % s->num_heads;
    qb->b = job / blocks / s->num_heads;
    qb->rows = s->q_seq - qb->pos0 < QUERY_BLOCK ? s->q_seq - qb->pos0 : QUERY_BLOCK;
    const size_t kv_head = qb->head / c->group;
    const size_t base = (qb->b * s->num_kv_heads + kv_head) * s->kv_seq * D;
    /* K's rows in the head-major copy, or (the float32 forward, no copy:
     * kh NULL) in K itself, num_kv_heads * D floats apart */
    qb->kv_row = c->kh ? D : s->num_kv_heads * D;
    qb->kb = c->kh ? c->kh + base
                   : (const float *)c->k + (qb->b * s->kv_seq * s->num_kv_heads + kv_head) * D;
    qb->vb = c->vh ? c->vh + base : NULL;
    /* [tile][D][KEY_BLOCK]: a KV head's tiles are whole tiles of keys */
    qb->vt = c->vt ? (const tile_row *)(c->vt + (qb->b * s->num_kv_heads + kv_head) *
                                                    native_tiled_rows(s->kv_seq) * D)
                   : NULL;
    qb->lo = UINT32_MAX;
    qb->hi = 0;
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        qb->row_lo[r] = qb->row_hi[r] = 0;
        qb->row[r] = 0;
        if (r >= qb->rows)
            continue;
        clattn_key_range(s, (uint32_t)(qb->pos0 + r), &qb->row_lo[r], &qb->row_hi[r]);
        qb->lo = qb->row_lo[r] < qb->lo ? qb->row_lo[r] : qb->lo;
        qb->hi = qb->row_hi[r] > qb->hi ? qb->row_hi[r] : qb->hi;
        qb->row[r] = row_index(s, qb->b, qb->pos0 + r, qb->head);
    }
    if (qb->lo > qb->hi)
        qb->lo = qb->hi;
}

/* The block's rows of dropout's counters (native_drop_rows_of). */
INLINE void query_block_drop_rows(const native_call *c, const query_block *qb,
                                  native_drop_rows *d)
{
    uint32_t pos[QUERY_BLOCK], heads[QUERY_BLOCK];
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        pos[r] = (uint32_t)(qb->pos0 + r);
        heads[r] = (uint32_t)qb->head;
    }
    native_drop_rows_of(c, qb->b, pos, heads, qb->rows, d);
}

/* t[d][r] = x[row r][d] for the block's rows (of tensor x, widened where
 * 16-bit), zeros past them. */
INLINE void query_block_transpose(const native_call *c, query_block *qb, const void *x,
                                  tile_row *t)
{
    const size_t D = c->s->head_dim;
    _Alignas(64) float wide[QUERY_BLOCK * CLATTN_MAX_HEAD_DIM];
    for (size_t r = 0; r < QUERY_BLOCK; ++r)
        qb->ptrs[r] = r < qb->rows ? in_row(c, x, qb->row[r] * D, D, wide + r * D) : zero_row;
    transpose_in(qb->ptrs, D, t);
}

/* The rows of keys [t0, t0 + n) of one KV head, zero rows past n. */
INLINE void key_rows(const float *base, size_t kv_row, uint32_t t0, uint32_t n,
                     const float *rows[KEY_BLOCK])
{
    for (uint32_t j = 0; j < KEY_BLOCK; ++j)
        rows[j] = j < n ? base + (t0 + j) * kv_row : zero_row;
}

/* The forward's V tiles of the block's keys, ready: each not yet packed is
 * claimed (0 -> 1) and packed by this job, then marked ready (2); then the
 * job waits for those other jobs claimed. No job waits while it holds a
 * claim, so none waits for ever. */
INLINE void ready_tiles(const native_call *c, const query_block *qb)
{
    if (qb->lo >= qb->hi)
        return;
    const size_t tiles = native_tiled_rows(c->s->kv_seq) / KEY_BLOCK;
    const size_t kv_head = qb->head / c->group;
    atomic_int *state = c->vt_state + (qb->b * c->s->num_kv_heads + kv_head) * tiles;
    const size_t first = qb->lo / KEY_BLOCK, end = (qb->hi + KEY_BLOCK - 1) / KEY_BLOCK;
    for (size_t t = first; t < end; ++t)
        if (claim(state + t)) {
            clattn_native_pack_v_tile(c, qb->b, kv_head, t);
            atomic_store_explicit(state + t, 2, memory_order_release);
        }
    for (size_t t = first; t < end; ++t)
        wait_ready(state + t);
}

/* sc[j][r] for the keys t0 + j of a tile against the block's rows, times
 * factor. */
INLINE void tile_scores(const float *const *krows, const tile_row *qt, size_t D, tile_row *sc,
                        float factor)
{
    for (uint32_t j = 0; j < KEY_BLOCK; j += DOT_ROWS)
        dots(krows + j, qt, D, sc + j, factor);
}

/* O and the LSE pairs of a block of query rows, by online softmax. */
static void forward_block(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], ot[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row sc[KEY_BLOCK];
    float m[QUERY_BLOCK], l[QUERY_BLOCK], rescale[QUERY_BLOCK];
    if (c->vt_state)
        ready_tiles(c, &qb);
    query_block_transpose(c, &qb, c->q, qt);
    memset(ot, 0, D * sizeof ot[0]);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        m[r] = EMPTY_ROW;
        l[r] = 0.0f;
    }
    /* Modified scores come scaled: their scale is 1. */
    const int shaped = (c->mods & NATIVE_SHAPED) != 0;
    /* the caller's mask the only modifier: tiles it shows whole skip it */
    const int mask_alone = native_hide_alone(c->mods);
    const float scale = shaped ? 1.0f : c->scale, unit = scale * LOG2E;
    native_drop_rows drop; /* the block's rows of dropout's counters */
    if (c->mods & CLATTN_MOD_DROPOUT)
        query_block_drop_rows(c, &qb, &drop);
    /* Keys that every row of the block sees: tiles of them skip the mask. */
    uint32_t all_lo = 0, all_hi = UINT32_MAX;
    for (size_t r = 0; r < qb.rows; ++r) {
        all_lo = qb.row_lo[r] > all_lo ? qb.row_lo[r] : all_lo;
        all_hi = qb.row_hi[r] < all_hi ? qb.row_hi[r] : all_hi;
    }
    /* Tiles are V's (vt): from the one that holds key lo, its keys below
     * lo masked. */
    for (uint32_t t0 = qb.lo / KEY_BLOCK * KEY_BLOCK; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const int shown = native_mask_shows(c, qb.b, qb.head, qb.pos0, qb.rows, t0, n);
        if (!shown)
            continue;
        const float *krows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        /* modified scores from scaled dots (scale 1 after them) */
        if (shaped) /* (a constant 1 folds away) */
            tile_scores(krows, qt, D, sc, c->scale);
        else
            tile_scores(krows, qt, D, sc, 1.0f);
        if (shaped && !(shown == 2 && mask_alone)) /* a tile the mask shows: scaled already */
            modify_rows(c, sc, NULL, qb.b, qb.pos0, t0, qb.head, 1.0f);
        const int whole = n == KEY_BLOCK && all_lo <= t0 && t0 + KEY_BLOCK <= all_hi;
        EACH_PART(h) {
            /* The tile's row maxima (scaled: the scale is positive) */
            hvec block_max = HSPLAT(EMPTY_ROW);
            if (whole) {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    block_max = HMAX(hload(sc[j] + h), block_max);
                block_max *= scale;
            } else {
                /* masked scores to EMPTY_ROW, the others scaled */
                const huvec row_lo = huload(qb.row_lo + h), row_hi = huload(qb.row_hi + h);
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    const uint32_t t = t0 + j;
                    const hvec x = HSELECT((t >= row_lo) & (t < row_hi),
                                           hload(sc[j] + h) * scale, HSPLAT(EMPTY_ROW));
                    hstore(sc[j] + h, x);
                    block_max = HMAX(x, block_max);
                }
            }
            const hvec m_old = hload(m + h), m_new = HMAX(block_max, m_old);
            const hvec rs = exp2v((m_old - m_new) * LOG2E);
            hstore(rescale + h, rs);
            hstore(m + h, m_new);
            /* weights exp(s * scale - m) in base 2: whole tiles' scores
             * are raw, the others' scaled already */
            const hvec m2 = m_new * LOG2E;
            hvec sum = HSPLAT(0.0f);
            if (whole) {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    const hvec w = exp2v(hload(sc[j] + h) * unit - m2);
                    hstore(sc[j] + h, w);
                    sum += w;
                }
            } else {
                for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
                    /* Masked scores are exactly EMPTY_ROW; their weight is
                     * 0 even while the row's max is EMPTY_ROW too. */
                    const hvec x = hload(sc[j] + h);
                    const hvec w = HSELECT(x == EMPTY_ROW, HSPLAT(0.0f), exp2v(x * LOG2E - m2));
                    hstore(sc[j] + h, w);
                    sum += w;
                }
            }
            hstore(l + h, hload(l + h) * rs + sum);
        }
        if (c->mods & CLATTN_MOD_DROPOUT) { /* l is the undropped sum */
            uint32_t kept[QUERY_BLOCK] = {0};
            native_keep_bits(c, &drop, t0, kept);
            drop_rows(sc, kept, 1.0f);
        }
        accumulate_t(ot, D, qb.vt + (size_t)(t0 / KEY_BLOCK) * D, sc, n, rescale);
    }
    /* The head's sink joins each row's sum as a key with no value: the
     * running max takes it, and O's sums are rescaled to that max. */
    if (c->mods & CLATTN_MOD_SINK) {
        const float sigma = c->sinks[qb.head];
        for (size_t r = 0; r < QUERY_BLOCK; ++r) {
            const float m_new = m[r] > sigma ? m[r] : sigma; /* a NaN m: NaN through l */
            const float rs = expf(m[r] - m_new);
            l[r] = l[r] * rs + expf(sigma - m_new);
            m[r] = m_new;
            for (size_t d = 0; d < D; ++d)
                ot[d][r] *= rs;
        }
    }
    /* O = ot / l, a vector of rows at a time (0 where the weights sum to
     * 0; the rows below make that NaN where the row sees a key) */
    EACH_PART(h) {
        const hvec sum = hload(l + h);
        const hivec live = sum != 0.0f; /* NaN too: it must show */
        const hvec by = HSELECT(live, sum, HSPLAT(1.0f));
        const float gain = c->drop.gain; /* 1 without dropout */
        for (size_t d = 0; d < D; ++d)
            hstore(ot[d] + h, HSELECT(live, hload(ot[d] + h) / by * gain, HSPLAT(0.0f)));
    }
    float *rows = qt[0]; /* free */
    tile_to_rows(ot, D, rows);
    for (size_t r = 0; r < qb.rows; ++r) {
        /* A row whose weights sum to 0 is empty where it sees no key; where
         * it sees keys whose scores are all -inf (or below EMPTY_ROW, the
         * masks' own value) it has no softmax: NaN, as PyTorch's math gives.
         * Under the caller's mask function, bool mask or bias it is empty. */
        const int sees = qb.row_lo[r] < qb.row_hi[r] &&
                         !(c->mods & (CLATTN_MOD_HIDE | CLATTN_MOD_BIAS));
        const float zero = sees ? NAN : EMPTY_ROW;
        if (l[r] == 0.0f && sees)
            for (size_t d = 0; d < D; ++d)
                rows[r * D + d] = NAN;
        out_row(c, c->o_out, qb.row[r] * D, rows + r * D, D, 0);
        float *pair = c->lse_out + 2 * qb.row[r];
        pair[0] = l[r] != 0.0f ? m[r] : zero;
        pair[1] = l[r] != 0.0f ? logf(l[r]) : zero;
    }
}

/* dQ of a block of query rows. */
static void grad_q_block(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block qb;
    query_block_of(c, job, &qb);
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], dot_t[CLATTN_MAX_HEAD_DIM],
        dqt[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row sc[KEY_BLOCK], dp[KEY_BLOCK];
    float m[QUERY_BLOCK], l[QUERY_BLOCK], dsum[QUERY_BLOCK];
    query_block_transpose(c, &qb, c->q, qt);
    query_block_transpose(c, &qb, c->d_out, dot_t);
    memset(dqt, 0, D * sizeof dqt[0]);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) {
        const int live = r < qb.rows;
        m[r] = live ? c->lse[2 * qb.row[r]] : 0.0f;
        l[r] = live ? c->lse[2 * qb.row[r] + 1] : 0.0f;
        dsum[r] = live ? row_dsum(c, qb.row[r]) : 0.0f;
    }
    const float scale = c->scale;
    const int shaped = (c->mods & NATIVE_SHAPED) != 0;
    /* the caller's mask the only modifier: tiles it shows whole skip it */
    const int mask_alone = native_hide_alone(c->mods);
    const float unit = shaped ? LOG2E : scale * LOG2E; /* modified scores come scaled */
    native_drop_rows drop; /* the block's rows of dropout's counters */
    if (c->mods & CLATTN_MOD_DROPOUT)
        query_block_drop_rows(c, &qb, &drop);
    _Alignas(64) tile_row dz[KEY_BLOCK];
    for (size_t r = 0; r < QUERY_BLOCK; ++r) { /* p = exp(min(s * scale - m, 0) - l) in base 2 */
        m[r] *= LOG2E;
        l[r] *= LOG2E;
    }
    for (uint32_t t0 = qb.lo; t0 < qb.hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb.hi - t0 < KEY_BLOCK ? qb.hi - t0 : KEY_BLOCK;
        const int shown = native_mask_shows(c, qb.b, qb.head, qb.pos0, qb.rows, t0, n);
        if (!shown)
            continue;
        const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
        key_rows(qb.kb, qb.kv_row, t0, n, krows);
        key_rows(qb.vb, qb.kv_row, t0, n, vrows);
        /* modified scores from scaled dots (scale 1 after them) */
        if (shaped)
            tile_scores(krows, qt, D, sc, scale);
        else
            tile_scores(krows, qt, D, sc, 1.0f);
        tile_scores(vrows, dot_t, D, dp, 1.0f);
        if (shaped && shown == 2 && mask_alone) /* the mask shows the tile: dz 1 */
            scale_rows(sc, dz, 1.0f);
        else if (shaped)
            modify_rows(c, sc, dz, qb.b, qb.pos0, t0, qb.head, 1.0f);
        if (c->mods & CLATTN_MOD_DROPOUT) {
            uint32_t kept[QUERY_BLOCK] = {0}; /* rows past qb.rows: dropped */
            native_keep_bits(c, &drop, t0, kept);
            drop_rows(dp, kept, c->drop.gain);
        }
        for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
            const uint32_t t = t0 + j;
            EACH_PART(h) {
                const hvec x = hload(sc[j] + h) * unit - hload(m + h);
                const huvec row_lo = huload(qb.row_lo + h), row_hi = huload(qb.row_hi + h);
                const hivec live = (t >= row_lo) & (t < row_hi);
                const hvec p = HSELECT(live, exp2v(HMIN0(x) - hload(l + h)), HSPLAT(0.0f));
                hstore(sc[j] + h, HSELECT(live, scale * p * (hload(dp[j] + h) - hload(dsum + h)),
                                          HSPLAT(0.0f)));
            }
        }
        if (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_USER))
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                EACH_PART(h) hstore(sc[j] + h, hload(sc[j] + h) * hload(dz[j] + h));
        accumulate(dqt, D, krows, sc, n);
    }
    float *rows = qt[0]; /* free */
    tile_to_rows(dqt, D, rows);
    for (size_t r = 0; r < qb.rows; ++r)
        out_row(c, c->dq, qb.row[r] * D, rows + r * D, D, c->s->accumulate);
}

/* A block of query rows' terms for dZ = p (dP - Dsum) tile by tile
 * (dz_block_of, dz_tile): Q and dO transposed, the LSE pairs in base 2,
 * Dsum, dropout's rows; V of the KV head (float32, in the call's layout). */
typedef struct dz_block {
    query_block qb;
    _Alignas(64) tile_row qt[CLATTN_MAX_HEAD_DIM], dot_t[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) float m[QUERY_BLOCK], l[QUERY_BLOCK], dsum[QUERY_BLOCK];
    native_drop_rows drop;
    const float *vb;
} dz_block;

/* Query block `job` (the forward's numbering) of c: Q, O and dO the
 * call's; K and V float32 in the call's layout (kh and vh NULL). 0 where
 * its rows see no key. */
INLINE int dz_block_of(const native_call *c, size_t job, dz_block *z)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim;
    query_block *qb = &z->qb;
    query_block_of(c, job, qb);
    if (qb->lo >= qb->hi)
        return 0;
    z->vb = (const float *)c->v + (qb->b * s->kv_seq * s->num_kv_heads + qb->head / c->group) * D;
    query_block_transpose(c, qb, c->q, z->qt);
    query_block_transpose(c, qb, c->d_out, z->dot_t);
    for (size_t r = 0; r < QUERY_BLOCK; ++r) { /* p = exp(min(z - m, 0) - l) in base 2 */
        const int live = r < qb->rows;
        z->m[r] = live ? c->lse[2 * qb->row[r]] * LOG2E : 0.0f;
        z->l[r] = live ? c->lse[2 * qb->row[r] + 1] * LOG2E : 0.0f;
        z->dsum[r] = live ? row_dsum(c, qb->row[r]) : 0.0f;
    }
    if (c->mods & CLATTN_MOD_DROPOUT)
        query_block_drop_rows(c, qb, &z->drop);
    return 1;
}

/* dz[j][r] = dZ of key t0 + j (n of them) and row r of the block, 0 where
 * no pair is shown; 0 where the caller's mask hides the tile. Where
 * split is not NULL, split->built_in gives the scores and pre gets them
 * (the score function's argument) before split->user's functions; else
 * c's modifiers all at once. */
INLINE int dz_tile(const native_call *c, const dz_block *z, const native_params *split,
                   uint32_t t0, uint32_t n, tile_row *pre, tile_row *dz)
{
    const query_block *qb = &z->qb;
    if (!native_mask_shows(c, qb->b, qb->head, qb->pos0, qb->rows, t0, n))
        return 0;
    const size_t D = c->s->head_dim;
    const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
    _Alignas(64) tile_row sc[KEY_BLOCK];
    key_rows(qb->kb, qb->kv_row, t0, n, krows);
    key_rows(z->vb, qb->kv_row, t0, n, vrows);
    tile_scores(krows, z->qt, D, sc, 1.0f);
    tile_scores(vrows, z->dot_t, D, dz, 1.0f);
    const native_call *first = split ? split->built_in : c;
    if (first->mods & NATIVE_SHAPED)
        modify_rows(first, sc, NULL, qb->b, qb->pos0, t0, qb->head, first->scale);
    else
        scale_rows(sc, NULL, c->scale);
    if (split) {
        memcpy(pre, sc, sizeof sc);
        modify_rows(split->user, sc, NULL, qb->b, qb->pos0, t0, qb->head, split->user->scale);
    }
    if (c->mods & CLATTN_MOD_DROPOUT) {
        uint32_t kept[QUERY_BLOCK] = {0}; /* rows past qb->rows: dropped */
        native_keep_bits(c, &z->drop, t0, kept);
        drop_rows(dz, kept, c->drop.gain);
    }
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        const uint32_t t = t0 + j;
        EACH_PART(h) {
            const hvec x = hload(sc[j] + h) * LOG2E - hload(z->m + h);
            const huvec row_lo = huload(qb->row_lo + h), row_hi = huload(qb->row_hi + h);
            const hivec live = (t >= row_lo) & (t < row_hi);
            const hvec p = HSELECT(live, exp2v(HMIN0(x) - hload(z->l + h)), HSPLAT(0.0f));
            hstore(dz[j] + h,
                   HSELECT(live, p * (hload(dz[j] + h) - hload(z->dsum + h)), HSPLAT(0.0f)));
        }
    }
    return 1;
}

/* The score parameters' gradient of a block of query rows (native_params):
 * for each pair with a dZ, keys then rows of each tile, the derivatives
 * score_dp_native gives at the score the built-ins gave, times dZ, into
 * the part's sums. */
static void params_block(const native_call *c, size_t job, native_params *pp)
{
    const clattn_shape *s = c->s;
    const size_t count = s->score_params_count;
    dz_block z;
    if (!dz_block_of(c, job, &z))
        return;
    const query_block *qb = &z.qb;
    const uint32_t b = (uint32_t)(c->seq_base + qb->b), head = (uint32_t)qb->head;
    _Alignas(64) tile_row pre[KEY_BLOCK], dz[KEY_BLOCK];
    for (uint32_t t0 = qb->lo; t0 < qb->hi; t0 += KEY_BLOCK) {
        const uint32_t n = qb->hi - t0 < KEY_BLOCK ? qb->hi - t0 : KEY_BLOCK;
        if (!dz_tile(c, &z, pp, t0, n, pre, dz))
            continue;
        for (uint32_t j = 0; j < n; ++j)
            for (size_t r = 0; r < qb->rows; ++r) {
                const float g = dz[j][r];
                if (g == 0.0f) /* hidden, dropped, or no gradient: nothing to add */
                    continue;
                uint32_t index[CLATTN_SCORE_DP_MAX];
                float d[CLATTN_SCORE_DP_MAX];
                const uint32_t got = s->score_dp_native(
                    pre[j][r], b, head,
                    clattn_query_position(s, (uint32_t)(qb->pos0 + r), c->delta),
                    t0 + j + s->kv_offset, s->score_params, index, d);
                if (got > CLATTN_SCORE_DP_MAX) {
                    pp->bad = 1;
                    return;
                }
                for (uint32_t e = 0; e < got; ++e) {
                    if (index[e] >= count) {
                        pp->bad = 1;
                        return;
                    }
                    pp->sums[index[e]] += (double)g * d[e];
                }
            }
    }
}

/* dBias of query block `job` of the bias's slices (slice job / blocks,
 * block job % blocks): the block's rows of d_bias zeroed (unless
 * accumulate), then for each batch element and head the slice gathers, in
 * order, each pair's dZ added in. */
static void bias_block(const native_call *c, size_t job, float *d_bias)
{
    const clattn_shape *s = c->s;
    const size_t blocks = native_query_blocks(s->q_seq), H = s->num_heads;
    const size_t heads_out = s->bias_heads > 1 ? H : 1;
    const size_t slice = job / blocks, pb = job % blocks;
    const size_t b_out = slice / heads_out, h_out = slice % heads_out;
    const size_t pos0 = pb * QUERY_BLOCK;
    const size_t rows = s->q_seq - pos0 < QUERY_BLOCK ? s->q_seq - pos0 : QUERY_BLOCK;
    float *out = d_bias + (slice * s->q_seq + pos0) * s->kv_seq;
    if (!s->accumulate)
        memset(out, 0, rows * s->kv_seq * sizeof *out);
    const size_t b0 = s->bias_batch > 1 ? b_out : 0, b1 = s->bias_batch > 1 ? b_out + 1 : s->batch;
    const size_t h0 = heads_out > 1 ? h_out : 0, h1 = heads_out > 1 ? h_out + 1 : H;
    _Alignas(64) tile_row dz[KEY_BLOCK];
    for (size_t b = b0; b < b1; ++b)
        for (size_t h = h0; h < h1; ++h) {
            dz_block z;
            if (!dz_block_of(c, (b * H + h) * blocks + pb, &z))
                continue;
            for (uint32_t t0 = z.qb.lo; t0 < z.qb.hi; t0 += KEY_BLOCK) {
                const uint32_t n = z.qb.hi - t0 < KEY_BLOCK ? z.qb.hi - t0 : KEY_BLOCK;
                if (dz_tile(c, &z, NULL, t0, n, NULL, dz))
                    for (size_t r = 0; r < rows; ++r)
                        for (uint32_t j = 0; j < n; ++j)
                            out[r * s->kv_seq + t0 + j] += dz[j][r];
            }
        }
}
