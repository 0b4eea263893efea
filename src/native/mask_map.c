/* The native backend's block map of the caller's mask function and bool
 * mask (native.h's native_mask_shows reads it): 32 x 32 blocks of rows and
 * keys, each hidden, shown in part or shown whole. */
#include <stdlib.h>
#include <string.h>

#include "native.h"
#include "pool.h"

/* The block map of a mask function and a bool mask, made once for a
 * shape and kept for the calls after it while the function, sizes and
 * positions are the same (one with a bool mask, whose bytes may change
 * between calls, is made for every call); a map past MASK_MAP_MAX bytes is
 * not made (the tiles ask the function instead). */
struct native_mask_map {
    uint8_t *map;
    int (*fn)(uint32_t, uint32_t, uint32_t, uint32_t);
    int of_tensor; /* made with a bool mask */
    uint32_t batch, q_seq, kv_seq, num_heads, kv_offset, seq_base;
    int64_t delta;
    size_t rows, keys;
};
#define MASK_MAP_MAX ((size_t)64 << 20)

/* Job j of a map: row block j % rows of head j / rows. A block is
 * MAP_HIDDEN where the function hides every pair of it that the built-in
 * masks show, MAP_ALL where it shows them all (its tiles then need not
 * ask it), else MAP_SOME. */
static void mask_map_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t rows = c->map_rows, keys = c->map_keys, head = job / rows % s->num_heads;
    const size_t b = job / rows / s->num_heads, r0 = job % rows * MAP_BLOCK;
    uint8_t *out = (uint8_t *)c->mask_map + job * keys;
    const size_t r1 = r0 + MAP_BLOCK < s->q_seq ? r0 + MAP_BLOCK : s->q_seq;
    for (size_t kb = 0; kb < keys; ++kb) {
        const uint32_t t0 = (uint32_t)(kb * MAP_BLOCK);
        const uint32_t t1 = s->kv_seq - t0 < MAP_BLOCK ? s->kv_seq : t0 + MAP_BLOCK;
        int shown = 0, hidden = 0;
        for (size_t pos = r0; pos < r1; ++pos) {
            uint32_t lo, hi;
            clattn_key_range(s, (uint32_t)pos, &lo, &hi);
            for (uint32_t t = lo > t0 ? lo : t0; t < (hi < t1 ? hi : t1); ++t) {
                if (native_pair_shown(c, b, head, (uint32_t)pos, t))
                    shown = 1;
                else
                    hidden = 1;
            }
        }
        out[kb] = !shown ? MAP_HIDDEN : hidden ? MAP_SOME : MAP_ALL;
    }
}

void clattn_native_mask_map(clattn_context *ctx, native_call *c)
{
    const clattn_shape *s = c->s;
    struct native_mask_map *m = ctx->mask_map;
    if (m && !m->of_tensor && !(c->mods & CLATTN_MOD_BOOL) && m->fn == s->mask_native &&
        m->batch == s->batch && m->q_seq == s->q_seq && m->kv_seq == s->kv_seq &&
        m->num_heads == s->num_heads && m->kv_offset == s->kv_offset &&
        m->seq_base == c->seq_base && m->delta == c->delta) {
        c->mask_map = m->map;
        c->map_rows = m->rows;
        c->map_keys = m->keys;
        return;
    }
    const size_t rows = (s->q_seq + MAP_BLOCK - 1) / MAP_BLOCK;
    const size_t keys = (s->kv_seq + MAP_BLOCK - 1) / MAP_BLOCK;
    const size_t heads = (size_t)s->batch * s->num_heads;
    if (rows * keys > MASK_MAP_MAX / heads)
        return;
    if (!m && !(m = ctx->mask_map = calloc(1, sizeof *m)))
        return;
    uint8_t *map = malloc(rows * keys * heads);
    if (!map)
        return;
    free(m->map);
    *m = (struct native_mask_map){map,          s->mask_native, (c->mods & CLATTN_MOD_BOOL) != 0,
                                  s->batch,     s->q_seq,       s->kv_seq,
                                  s->num_heads, s->kv_offset,   c->seq_base,
                                  c->delta,     rows,           keys};
    native_call job;
    memset(&job, 0, sizeof job);
    job.s = s;
    job.mods = c->mods;
    job.seq_base = c->seq_base;
    job.delta = c->delta;
    job.mask_map = map;
    job.map_rows = rows;
    job.map_keys = keys;
    /* run_calls() has started the context's threads */
    clattn_native_run_jobs(ctx->pool, &job, mask_map_job, rows * heads, ctx->num_threads);
    c->mask_map = map;
    c->map_rows = rows;
    c->map_keys = keys;
}

void clattn_native_mask_map_free(clattn_context *ctx)
{
    if (ctx->mask_map)
        free(ctx->mask_map->map);
    free(ctx->mask_map);
    ctx->mask_map = NULL;
}
