/* The native key-side jobs (grad-V, grad-K, the fused backward): part of
 * kernels.c's unit, compiled with it once per instruction-set level, so it
 * has no guard and includes nothing. */
/* Key-side jobs gather the query rows (every head of the group at each
 * position) that see any key of the block, CHUNK at a time. */
enum { CHUNK = 32 };

typedef struct key_chunk {
    const float *q[CHUNK], *d_out[CHUNK];
    float *dq[CHUNK]; /* the row of the float32 dQ the block adds into */
    float m[CHUNK], l[CHUNK], dsum[CHUNK];
    uint32_t lo[CHUNK], hi[CHUNK]; /* keys of the block the row sees */
    uint32_t pos[CHUNK], head[CHUNK]; /* the row's query position and head */
    uint8_t whole[CHUNK]; /* the caller's mask alone, showing every pair of the row */
    size_t b;                         /* the block's batch element */
    uint32_t t0;                      /* and first key */
    size_t n;
} key_chunk;

/* acc[i][d0 + v * HW + .] += sum_j w[i][j] * krows[j][same] for the
 * DQ_ROWS rows i and nv (up to DQ_VECS) hardware vectors v of columns from
 * d0: DQ_ROWS x nv accumulators, so that each key row's vectors serve
 * DQ_ROWS rows and each broadcast w element nv vectors. */
enum { DQ_ROWS = HW == 16 ? 4 : 2, DQ_VECS = 4 };
INLINE void add_dq_vecs(float *const *acc, const tile_row *w, const float *const *krows,
                        size_t d0, int nv)
{
    hvec a[DQ_ROWS][DQ_VECS];
    for (int i = 0; i < DQ_ROWS; ++i)
        for (int v = 0; v < nv; ++v)
            a[i][v] = hload(acc[i] + d0 + v * HW);
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        hvec x[DQ_VECS];
        for (int v = 0; v < nv; ++v) {
            x[v] = hload(krows[j] + d0 + v * HW);
            IN_REGISTER(x[v]);
        }
        for (int i = 0; i < DQ_ROWS; ++i) {
            const float b = w[i][j];
            for (int v = 0; v < nv; ++v)
                a[i][v] += b * x[v];
        }
    }
    for (int i = 0; i < DQ_ROWS; ++i)
        for (int v = 0; v < nv; ++v)
            hstore(acc[i] + d0 + v * HW, a[i][v]);
}

/* dq[r] += sum_j ds[r][j] * krows[j] for the chunk's n rows (ds zero past
 * them, up to a multiple of PAD_ROWS): DQ_ROWS rows at a time, DQ_VECS
 * vectors of columns at a time, then what is left of a row's vectors (two,
 * then one), then its columns past the last whole vector. Each element's
 * sum runs over j in order from dQ's value, as a vector at a time of 8 rows
 * had summed it: 8 accumulators of one vector each took a load of a key
 * row's vector and 8 broadcast loads for 8 FMAs (1.1 loads an FMA, 0.5
 * now at AVX-512's level). */
INLINE void add_dq(float *const *dq, const tile_row *ds, const float *const *krows, size_t D,
                   size_t n)
{
    _Static_assert(PAD_ROWS % DQ_ROWS == 0, "chunks padded to whole groups of rows");
    for (size_t r = 0; r < n; r += DQ_ROWS) {
        float *const *acc = dq + r;
        const tile_row *w = ds + r;
        size_t d = 0;
        for (; d + DQ_VECS * HW <= D; d += DQ_VECS * HW)
            add_dq_vecs(acc, w, krows, d, DQ_VECS);
        if (d + 2 * HW <= D) {
            add_dq_vecs(acc, w, krows, d, 2);
            d += 2 * HW;
        }
        if (d + HW <= D) {
            add_dq_vecs(acc, w, krows, d, 1);
            d += HW;
        }
        for (; d < D; ++d)
            for (int i = 0; i < DQ_ROWS; ++i) {
                float a = acc[i][d];
                for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                    a += w[i][j] * krows[j][d];
                acc[i][d] = a;
            }
    }
}

/* Adds one chunk of query rows to the block's transposed dK and dV (and,
 * with c->dq_fused, to the part's dQ, krows the block's key rows). */
INLINE void key_chunk_run(const native_call *c, key_chunk *ch, const tile_row *kt,
                          const tile_row *vt, tile_row *dkt, tile_row *dvt,
                          const float *const *krows)
{
    const size_t D = c->s->head_dim, n = ch->n;
    _Alignas(64) tile_row p[CHUNK], ds[CHUNK];
    for (size_t r = n; r % PAD_ROWS; ++r) {
        ch->q[r] = ch->d_out[r] = zero_row;
        ch->lo[r] = ch->hi[r] = 0;
    }
    const size_t padded = (n + PAD_ROWS - 1) / PAD_ROWS * PAD_ROWS; /* zero rows past n */
    const float scale = c->scale;
    const int shaped = (c->mods & NATIVE_SHAPED) != 0;
    for (size_t r = 0; r < padded; r += DOT_ROWS) {
        if (shaped) /* modified scores from scaled dots (a constant 1 folds away) */
            dots(ch->q + r, kt, D, p + r, scale);
        else
            dots(ch->q + r, kt, D, p + r, 1.0f);
        if (dkt)
            dots(ch->d_out + r, vt, D, ds + r, 1.0f);
    }
    /* modified scores come scaled; dS takes dropout's mask through dP */
    _Alignas(64) tile_row dz[CHUNK];
    uint32_t kept[CHUNK];
    if (c->mods & CLATTN_MOD_DROPOUT) {
        native_drop_rows rows;
        native_drop_rows_of(c, ch->b, ch->pos, ch->head, n, &rows);
        native_keep_bits(c, &rows, ch->t0, kept);
    }
    const int bias_alone = native_bias_alone(c->mods), span = native_span_alone(c);
    const uint32_t keys = c->s->kv_seq - ch->t0 < KEY_BLOCK ? c->s->kv_seq - ch->t0 : KEY_BLOCK;
    /* the span alone on a whole row writes its scores and dz itself */
    const int span_whole = span && !(c->mods & NATIVE_BUILT_IN) && keys == KEY_BLOCK;
    for (size_t r = 0; r < n && c->mods; ++r) {
        const int64_t base = (int64_t)ch->pos[r] + c->delta - (int64_t)ch->t0;
        const float slope = c->slopes ? c->slopes[ch->head[r]] : 0.0f;
        const int scalar = !small_distance(base) || ((c->mods & CLATTN_MOD_USER) && !bias_alone &&
                                                     !span && !ch->whole[r]);
        if (shaped && scalar)
            for (uint32_t j = 0; j < KEY_BLOCK; ++j)
                p[r][j] = native_modify(c, p[r][j], ch->b, ch->pos[r], ch->t0 + j,
                                        ch->head[r], dkt ? &dz[r][j] : NULL);
        EACH_PART(h) {
            if (shaped && !scalar && !span_whole) {
                const hvec d = (float)base - hload(lane_float + h);
                hvec g;
                hstore(p[r] + h,
                       modify_v(c, hload(p[r] + h), HSELECT(d < 0.0f, -d, d), slope, &g));
                hstore(dz[r] + h, g);
            }
            if (dkt && (c->mods & CLATTN_MOD_DROPOUT)) {
                const hivec keep = (hivec)(((huvec){0} + kept[r]) >> huload(lane_index + h) & 1u);
                hstore(ds[r] + h, HSELECT(keep != 0, hload(ds[r] + h) * c->drop.gain,
                                          HSPLAT(0.0f)));
            }
        }
        if (bias_alone && !scalar) { /* the bias's row, as modify_rows() adds it */
            _Alignas(64) float buf[KEY_BLOCK];
            const float *row = native_bias_row(c, ch->b, ch->head[r], ch->pos[r], ch->t0, keys, buf);
            for (uint32_t j = 0; j < keys; ++j)
                p[r][j] += row[j];
        }
        if (span && !scalar) { /* along the row's keys, as modify_rows() runs it */
            _Alignas(64) float g[KEY_BLOCK];
            native_span(c, p[r], dkt ? dz[r] : NULL, g, keys, 1, ch->b, ch->pos[r], ch->t0,
                        ch->head[r]);
        }
    }
    const float unit = shaped ? LOG2E : scale * LOG2E;
    for (size_t r = 0; r < n; ++r) {
        /* p = exp(min(s * scale - m, 0) - l) in base 2 */
        const float m2 = ch->m[r] * LOG2E, l2 = ch->l[r] * LOG2E;
        EACH_PART(h) {
            const hvec x = hload(p[r] + h) * unit - m2;
            const huvec j = huload(lane_index + h);
            const hivec live = (j >= ch->lo[r]) & (j < ch->hi[r]);
            const hvec pr = HSELECT(live, exp2v(HMIN0(x) - l2), HSPLAT(0.0f));
            hstore(p[r] + h, pr);
            /* masked pairs' dS exactly 0, whatever a NaN elsewhere in the row */
            if (dkt)
                hstore(ds[r] + h,
                       HSELECT(live, scale * pr * (hload(ds[r] + h) - ch->dsum[r]),
                               HSPLAT(0.0f)));
        }
    }
    const unsigned after = CLATTN_MOD_SOFTCAP | CLATTN_MOD_USER | CLATTN_MOD_DROPOUT;
    for (size_t r = 0; r < n && (c->mods & after); ++r)
        EACH_PART(h) {
            if (c->mods & CLATTN_MOD_DROPOUT) {
                const hivec keep = (hivec)(((huvec){0} + kept[r]) >> huload(lane_index + h) & 1u);
                hstore(p[r] + h, HSELECT(keep != 0, hload(p[r] + h) * c->drop.gain,
                                         HSPLAT(0.0f)));
            }
            if (dkt && (c->mods & (CLATTN_MOD_SOFTCAP | CLATTN_MOD_USER)))
                hstore(ds[r] + h, hload(ds[r] + h) * hload(dz[r] + h));
        }
    if (dvt)
        accumulate(dvt, D, ch->d_out, p, n);
    if (dkt)
        accumulate(dkt, D, ch->q, ds, n);
    if (dkt && c->dq_fused) {
        _Alignas(64) float spare[CLATTN_MAX_HEAD_DIM]; /* the padding rows' sums */
        for (size_t r = n; r < CHUNK; ++r)
            ch->dq[r] = spare;
        add_dq(ch->dq, ds, krows, D, n);
    }
    ch->n = 0;
}

/* dO . O of row `row`. float32 rows go to native_dot() directly, not through
 * in_row(): with the widening inlined beside it, GCC compiled native_dot()'s
 * vector part as products and sums apart rather than FMAs (dsum_job at the
 * AVX2 level), and float32 gradients moved by an ulp. */
INLINE float row_dsum(const native_call *c, size_t row)
{
    const size_t D = c->s->head_dim;
    if (c->s->dtype == CLATTN_DTYPE_F32)
        return native_dot((const float *)c->d_out + row * D, (const float *)c->o + row * D, D);
    _Alignas(64) float a[CLATTN_MAX_HEAD_DIM], b[CLATTN_MAX_HEAD_DIM];
    return native_dot(in_row(c, c->d_out, row * D, D, a), in_row(c, c->o, row * D, D, b), D);
}

/* The spin-wait of ready_tiles and ready_rows: until *state is 2 (a unit
 * another job claimed is ready). A unit takes microseconds; past a few
 * thousand spins its maker is likely off its core (more threads than
 * cores), so give way to it. */
INLINE void wait_ready(atomic_int *state)
{
    for (unsigned spins = 0; atomic_load_explicit(state, memory_order_acquire) != 2;)
        if (++spins % 4096 == 0)
            sched_yield();
#if defined(__SSE2__)
        else
            _mm_pause();
#endif
}

/* Claims a unit not yet made (0 -> 1): 1 where this job is to make it. */
INLINE int claim(atomic_int *state)
{
    int idle = 0;
    return atomic_load_explicit(state, memory_order_acquire) == 0 &&
           atomic_compare_exchange_strong_explicit(state, &idle, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

/* The key side's rows of query positions [start, end) of every head of
 * the group of (b, kv_head), ready (c->row_state): each unit of them not
 * yet made is claimed, made by this job (the head-major copies' rows, then
 * Dsum's) and marked ready; then the job waits for those other jobs
 * claimed. No job waits while it holds a claim, so none waits for ever. */
INLINE void ready_rows(const native_call *c, size_t b, size_t kv_head, uint32_t start,
                       uint32_t end)
{
    if (start >= end)
        return;
    const clattn_shape *s = c->s;
    const size_t units = (s->q_seq + (size_t)PACK_ROWS - 1) / PACK_ROWS;
    const size_t first = start / PACK_ROWS, last = (end + (size_t)PACK_ROWS - 1) / PACK_ROWS;
    const size_t h0 = kv_head * c->group;
    atomic_int *state = c->row_state + (b * s->num_heads + h0) * units;
    for (size_t h = 0; h < c->group; ++h)
        for (size_t u = first; u < last; ++u)
            if (claim(state + h * units + u)) {
                clattn_native_pack_rows(c, b, h0 + h, u);
                if (c->dsum) {
                    const size_t stop = (u + 1) * PACK_ROWS < s->q_seq ? (u + 1) * PACK_ROWS
                                                                       : s->q_seq;
                    for (size_t pos = u * PACK_ROWS; pos < stop; ++pos) {
                        const size_t row = row_index(s, b, pos, h0 + h);
                        ((float *)c->dsum)[row] = row_dsum(c, row);
                    }
                }
                atomic_store_explicit(state + h * units + u, 2, memory_order_release);
            }
    for (size_t h = 0; h < c->group; ++h)
        for (size_t u = first; u < last; ++u)
            wait_ready(state + h * units + u);
}

/* The head-major dQ copy that key-side part `part` adds into (native.h's
 * dq_part); NULL where it adds into dQ itself (part 0, dq_in_place). */
INLINE float *part_copy(const native_call *c, size_t part)
{
    if (c->dq_in_place && part == 0)
        return NULL;
    return c->dq_part + (part - (size_t)c->dq_in_place) * c->dq_part_floats;
}

/* Whether the mask map shows any pair of the row block of pos against the
 * keys [t0, t0 + nt) to a head of KV head kv_head's group. */
INLINE int group_shows(const native_call *c, size_t b, size_t kv_head, uint32_t pos, uint32_t t0,
                       uint32_t nt)
{
    const uint32_t first = pos / MAP_BLOCK * MAP_BLOCK;
    const uint32_t rows = c->s->q_seq - first < MAP_BLOCK ? c->s->q_seq - first : MAP_BLOCK;
    for (size_t head = kv_head * c->group; head < (kv_head + 1) * c->group; ++head)
        if (native_mask_shows(c, b, head, first, rows, t0, nt))
            return 1;
    return 0;
}

/* dV and/or dK of KEY_BLOCK keys of one (batch, KV head). */
static void key_block(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim, kv_row = (size_t)s->num_kv_heads * D;
    const size_t block = job % c->blocks_per_head;
    const size_t kv_head = job / c->blocks_per_head % s->num_kv_heads;
    const size_t b = job / c->blocks_per_head / s->num_kv_heads;
    const uint32_t t0 = (uint32_t)(block * KEY_BLOCK);
    const uint32_t nt = s->kv_seq - t0 < KEY_BLOCK ? s->kv_seq - t0 : KEY_BLOCK;
    const int want_dk = c->dk != NULL, want_dv = c->dv != NULL;

    _Alignas(64) tile_row kt[CLATTN_MAX_HEAD_DIM], vt[CLATTN_MAX_HEAD_DIM];
    _Alignas(64) tile_row dkt[CLATTN_MAX_HEAD_DIM], dvt[CLATTN_MAX_HEAD_DIM];
    const size_t first = ((size_t)b * s->kv_seq + t0) * kv_row + kv_head * D;
    const float *krows[KEY_BLOCK], *vrows[KEY_BLOCK];
    /* 16-bit rows widened; the fused backward's dS K reads the block's key
     * rows for every chunk of query rows: from a copy of their own, not
     * from K, where they lie heads * D floats apart (a power of two there
     * put all 32 in one or two of L1's sets: its product took twice the
     * time a flop of the others did; d64 on 8 KV heads, 2 KB apart). */
    _Alignas(64) float kcopy[KEY_BLOCK * CLATTN_MAX_HEAD_DIM];
    float *vwide = (float *)dkt; /* V's widened rows, until dK starts */
    for (uint32_t j = 0; j < KEY_BLOCK; ++j) {
        krows[j] = j < nt ? in_row(c, c->k, first + j * kv_row, D, kcopy + j * D) : zero_row;
        vrows[j] = j < nt && want_dk ? in_row(c, c->v, first + j * kv_row, D, vwide + j * D)
                                     : zero_row;
    }
    transpose_in(krows, D, kt);
    if (c->dq_fused && s->dtype == CLATTN_DTYPE_F32)
        for (uint32_t j = 0; j < nt; ++j) {
            memcpy(kcopy + j * D, krows[j], D * sizeof(float));
            krows[j] = kcopy + j * D;
        }
    if (want_dk)
        transpose_in(vrows, D, vt);
    memset(dkt, 0, D * sizeof dkt[0]);
    memset(dvt, 0, D * sizeof dvt[0]);

    /* The queries that see any key of the block. */
    uint32_t start, end, unused;
    clattn_query_range(s, t0, &start, &unused);
    clattn_query_range(s, t0 + nt - 1, &unused, &end);
    if (c->row_state)
        ready_rows(c, b, kv_head, start, end);
    key_chunk ch;
    ch.n = 0;
    ch.b = b;
    ch.t0 = t0;
    /* the part's dQ: a head-major copy (at), or dQ's own rows (row * D) */
    float *const dq_copy = c->dq_fused ? part_copy(c, part_of(block, c->key_parts)) : NULL;
    float *const dq_own = c->dq_fused && !dq_copy ? (float *)c->dq : NULL;
    for (uint32_t pos = start; pos < end; ++pos) {
        /* Row blocks the caller's mask hides for every head of the group
         * against the block's keys, skipped whole. */
        while (c->mask_map && (pos == start || pos % MAP_BLOCK == 0) && pos < end &&
               !group_shows(c, b, kv_head, pos, t0, nt))
            pos = (pos / MAP_BLOCK + 1) * MAP_BLOCK;
        if (pos >= end)
            break;
        /* Keys of the block that pos sees: [lo, hi). */
        uint32_t lo, hi;
        clattn_key_range(s, pos, &lo, &hi);
        lo = lo > t0 ? lo - t0 : 0;
        hi = hi > t0 + nt ? nt : hi > t0 ? hi - t0 : 0;
        if (lo >= hi)
            continue;
        for (size_t head = kv_head * c->group; head < (kv_head + 1) * c->group; ++head) {
            const int shown = native_mask_shows(c, b, head, pos, 1, t0 + lo, hi - lo);
            if (!shown)
                continue;
            ch.whole[ch.n] = shown == 2 && native_hide_alone(c->mods);
            const size_t row = row_index(s, b, pos, head);
            const size_t at = ((b * s->num_heads + head) * s->q_seq + pos) * D;
            ch.q[ch.n] = c->qh + at;
            ch.d_out[ch.n] = c->oh + at;
            ch.dq[ch.n] = dq_own ? dq_own + row * D : dq_copy ? dq_copy + at : NULL;
            ch.m[ch.n] = c->lse[2 * row];
            ch.l[ch.n] = c->lse[2 * row + 1];
            ch.dsum[ch.n] = want_dk ? c->dsum[row] : 0.0f;
            ch.lo[ch.n] = lo;
            ch.hi[ch.n] = hi;
            ch.pos[ch.n] = pos;
            ch.head[ch.n] = (uint32_t)head;
            if (++ch.n == CHUNK)
                key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL,
                              krows);
        }
    }
    if (ch.n)
        key_chunk_run(c, &ch, kt, vt, want_dk ? dkt : NULL, want_dv ? dvt : NULL, krows);
    /* s->accumulate: add into the outputs (beta = 1); kcopy is free */
    if (want_dv) {
        tile_to_rows(dvt, D, kcopy);
        for (uint32_t j = 0; j < nt; ++j)
            out_row(c, c->dv, first + j * kv_row, kcopy + j * D, D, s->accumulate);
    }
    if (want_dk) {
        tile_to_rows(dkt, D, kcopy);
        for (uint32_t j = 0; j < nt; ++j)
            out_row(c, c->dk, first + j * kv_row, kcopy + j * D, D, s->accumulate);
    }
}
