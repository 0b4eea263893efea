/* The head-major copies the native backend's jobs stream: rows packed
 * (16-bit ones widened) by the copies' round or by the jobs that first need
 * them, and V's transposed tiles. Compiled once, at the baseline; the
 * per-level files call it. */
#include <string.h>

#include "native.h"

/* Rows [r0, end) of one (batch, head) into their tiles of p->dst
 * (transposed, vt's layout), the last tile's rows past p->rows zero;
 * r0 a whole tile's. */
static void pack_tiles(const native_call *c, const struct native_pack *p, size_t b, size_t head,
                       size_t r0, size_t end)
{
    static const float zeros[CLATTN_MAX_HEAD_DIM];
    const size_t D = c->s->head_dim;
    float *dst = p->dst + (b * p->heads + head) * native_tiled_rows(p->rows) * D;
    float wide[KEY_BLOCK][CLATTN_MAX_HEAD_DIM]; /* 16-bit rows, widened */
    for (size_t t0 = r0; t0 < end; t0 += KEY_BLOCK) {
        const float *row[KEY_BLOCK];
        for (size_t j = 0; j < KEY_BLOCK; ++j) {
            const size_t r = t0 + j, at = ((b * p->rows + r) * p->heads + head) * D;
            if (r >= p->rows)
                row[j] = zeros;
            else if (p->dtype == CLATTN_DTYPE_F32)
                row[j] = (const float *)p->src + at;
            else {
                c->hot->widen(p->dtype, (const uint16_t *)p->src + at, wide[j], D);
                row[j] = wide[j];
            }
        }
        c->hot->transpose(row, D, dst + t0 * D); /* tile [D][KEY_BLOCK] */
    }
}

/* Rows [u * PACK_ROWS, + PACK_ROWS) of one (batch, head) of a [batch]
 * [rows][heads][D] tensor to their place in its [batch][heads][rows][D]
 * copy. */
static void pack_rows(const native_call *c, const struct native_pack *p, size_t b, size_t head,
                      size_t u)
{
    const size_t D = c->s->head_dim, r0 = u * PACK_ROWS;
    const size_t end = r0 + PACK_ROWS < p->rows ? r0 + PACK_ROWS : p->rows;
    float *dst = p->dst + (b * p->heads + head) * p->rows * D;
    for (size_t r = r0; r < end; ++r) {
        const size_t at = ((b * p->rows + r) * p->heads + head) * D;
        if (p->dtype == CLATTN_DTYPE_F32)
            memcpy(dst + r * D, (const float *)p->src + at, D * sizeof(float));
        else
            c->hot->widen(p->dtype, (const uint16_t *)p->src + at, dst + r * D, D);
    }
}

/* A job of the copies' round: PACK_ROWS rows of one (batch, head) of one
 * copy; past the copies' jobs, Dsum's. */
void clattn_native_pack_job(const native_call *c, size_t job)
{
    if (job >= c->pack_jobs) {
        c->hot->dsum(c, job - c->pack_jobs);
        return;
    }
    const struct native_pack *p = c->pack;
    for (; job >= p->jobs; ++p)
        job -= p->jobs;
    const size_t units = (p->rows + PACK_ROWS - 1) / PACK_ROWS, bh = job / units;
    pack_rows(c, p, bh / p->heads, bh % p->heads, job % units);
}

void clattn_native_pack_rows(const native_call *c, size_t b, size_t head, size_t u)
{
    for (int i = 0; i < c->packs; ++i)
        pack_rows(c, &c->pack[i], b, head, u);
}

void clattn_native_pack_v_tile(const native_call *c, size_t b, size_t kv_head, size_t tile)
{
    const struct native_pack *p = &c->vt_pack;
    const size_t r0 = tile * KEY_BLOCK;
    pack_tiles(c, p, b, kv_head, r0, r0 + KEY_BLOCK < p->rows ? r0 + KEY_BLOCK : p->rows);
}
