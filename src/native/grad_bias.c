/* The gradients that sum over the pairs, on the host, where the backend's
 * device does not take them (else on the device: src/opencl/pairs.c):
 * the bias's (clattn_grad_bias) and the score function's parameters'
 * (clattn_grad_score_params). Each takes a pair's dZ = p (dP - Dsum) from
 * its modified score (the bias and the masks included). A bias job is one
 * row of d_bias, walking for each batch element and head that row gathers,
 * in order, the row's pairs one by one (native_modify()). A parameter job
 * is a part of the blocks of query rows, fixed by the shape, that the
 * native kernels' tiled pass (kernels.c's params_block) sums into float64
 * sums of the part's own, then added in the parts' order. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "native.h"
#include "pool.h"

/* A call's tensors on the host: the first member, so that the pool hands
 * the jobs a native_call that is one. */
typedef struct host_pairs {
    native_call c;
    const float *q, *k, *v, *o, *d_out; /* float32: the caller's, or copies */
    const float *lse;
    float *copies[5];
} host_pairs;

/* One row's terms: its query and output gradient rows, Dsum, LSE pair,
 * key range and global position; row_of() gives them, or 0 where the row
 * is empty (no key, or every one hidden). */
typedef struct pair_row {
    const float *qr, *g, *pair;
    float dsum;
    size_t b, h, kv_head;
    uint32_t i, P, lo, hi;
} pair_row;

static int row_of(const host_pairs *j, size_t b, size_t h, uint32_t i, pair_row *r)
{
    const clattn_shape *s = j->c.s;
    const size_t D = s->head_dim, H = s->num_heads, row = (b * s->q_seq + i) * H + h;
    r->pair = j->lse + 2 * row;
    if (r->pair[0] == EMPTY_ROW && r->pair[1] == EMPTY_ROW)
        return 0;
    r->qr = j->q + row * D;
    r->g = j->d_out + row * D;
    r->dsum = native_dot(r->g, j->o + row * D, D);
    r->b = b;
    r->h = h;
    r->kv_head = h / (H / s->num_kv_heads);
    r->i = i;
    r->P = clattn_query_position(s, i, j->c.delta);
    clattn_key_range(s, i, &r->lo, &r->hi);
    return 1;
}

/* dZ of the row's pair with key t (0 where a mask hides it). */
static float pair_dz(const host_pairs *j, const pair_row *r, uint32_t t)
{
    const native_call *c = &j->c;
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim, key = (r->b * s->kv_seq + t) * s->num_kv_heads + r->kv_head;
    const float x = native_dot(r->qr, j->k + key * D, D) * c->scale;
    const float z = native_modify(c, x, r->b, r->i, t, r->h, NULL);
    if (z == -INFINITY)
        return 0.0f;
    float dp = native_dot(r->g, j->v + key * D, D);
    if (c->mods & CLATTN_MOD_DROPOUT)
        dp = clattn_dropout_keeps(&c->drop, (uint32_t)r->b, (uint32_t)r->h, r->P,
                                  t + s->kv_offset)
                 ? dp * c->drop.gain
                 : 0.0f;
    const float d = z - r->pair[0]; /* p as the backward takes it */
    return expf((d < 0.0f ? d : 0.0f) - r->pair[1]) * (dp - r->dsum);
}

typedef struct bias_job {
    host_pairs t; /* first */
    float *d_bias;
    size_t heads_out; /* the bias's heads: 1 or num_heads */
} bias_job;

/* Row i of d_bias's slice `job / q_seq`: the pairs of query row i of every
 * (batch element, head) the slice gathers, added in that order. */
static void bias_row(const native_call *call, size_t job)
{
    const bias_job *j = (const bias_job *)call;
    const clattn_shape *s = call->s;
    const size_t H = s->num_heads;
    const size_t i = job % s->q_seq, slice = job / s->q_seq;
    const size_t b_out = slice / j->heads_out, h_out = slice % j->heads_out;
    float *out = j->d_bias + job * s->kv_seq;
    if (!s->accumulate)
        memset(out, 0, s->kv_seq * sizeof *out);
    const size_t b0 = s->bias_batch > 1 ? b_out : 0, b1 = s->bias_batch > 1 ? b_out + 1 : s->batch;
    const size_t h0 = j->heads_out > 1 ? h_out : 0, h1 = j->heads_out > 1 ? h_out + 1 : H;
    for (size_t b = b0; b < b1; ++b)
        for (size_t h = h0; h < h1; ++h) {
            pair_row r;
            if (row_of(&j->t, b, h, (uint32_t)i, &r))
                for (uint32_t t = r.lo; t < r.hi; ++t)
                    out[t] += pair_dz(&j->t, &r, t);
        }
}

typedef struct params_job {
    host_pairs t; /* first */
    /* the tiled pass's calls (kernels.c's params_block: native_params) and
     * hot loops */
    native_call call, built_in, user;
    const native_kernels *hot;
    double *sums;  /* [parts][count] */
    uint32_t *bad; /* per part: an index past count, or a count past the most, seen */
    size_t parts, blocks;
} params_job;

/* Part `job` of the blocks of query rows (the forward's numbering): its
 * blocks in order, into its own sums. */
static void params_part(const native_call *call, size_t job)
{
    const params_job *j = (const params_job *)call;
    native_params p = {&j->built_in, &j->user, j->sums + job * call->s->score_params_count, 0};
    const size_t end = j->blocks * (job + 1) / j->parts;
    for (size_t i = j->blocks * job / j->parts; i < end && !p.bad; ++i)
        j->hot->params(&j->call, i, &p);
    j->bad[job] = p.bad;
}

/* x as float32: x itself, or a copy in *copy (NULL where memory is short). */
static const float *as_f32(clattn_dtype dtype, const void *x, size_t n, float **copy)
{
    *copy = NULL;
    if (dtype == CLATTN_DTYPE_F32)
        return x;
    if ((*copy = malloc(n * sizeof(float))))
        clattn_to_f32(dtype, x, *copy, n);
    return *copy;
}

/* Makes t's float32 tensors (copies of 16-bit ones) and its native_call
 * for shape; CLATTN_ERROR_OUT_OF_MEMORY (nothing kept) where memory is
 * short. */
static clattn_status host_begin(host_pairs *t, const clattn_shape *shape, const clattn_sizes *sz,
                                const void *const in[5], const float *lse)
{
    const size_t elems[5] = {sz->q, sz->kv, sz->kv, sz->q, sz->q};
    const float **dst[5] = {&t->q, &t->k, &t->v, &t->o, &t->d_out};
    int short_of_memory = 0;
    for (int i = 0; i < 5; ++i)
        short_of_memory |= !(*dst[i] = as_f32(shape->dtype, in[i], elems[i], &t->copies[i]));
    if (short_of_memory) {
        for (int i = 0; i < 5; ++i)
            free(t->copies[i]);
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                           "out of host memory for float32 copies of the %s tensors",
                           shape->dtype == CLATTN_DTYPE_F16 ? "float16" : "bfloat16");
    }
    native_call *c = &t->c;
    c->s = shape;
    c->mods = clattn_modifiers(shape);
    c->scale = clattn_effective_scale(shape);
    c->softcap = shape->softcap;
    c->slopes = shape->alibi_slopes;
    c->delta = clattn_mask_delta(shape);
    c->drop = clattn_dropout_of(shape->dropout_p, shape->dropout_seed, shape->dropout_offset);
    t->lse = lse;
    return CLATTN_OK;
}

/* Runs jobs 0 .. jobs - 1 of t on the native context's threads, or up to
 * 16 of another context's, then frees t's copies; the context's kernels
 * read `name`. */
static void host_run(clattn_context *ctx, host_pairs *t, native_job job, size_t jobs,
                     const char *name)
{
    pthread_mutex_lock(&ctx->lock);
    long cpus = ctx->backend == CLATTN_BACKEND_NATIVE ? ctx->num_threads
                                                      : sysconf(_SC_NPROCESSORS_ONLN);
    const int n = cpus < 1 ? 1 : cpus > 16 && ctx->backend != CLATTN_BACKEND_NATIVE ? 16
                                                                                  : (int)cpus;
    if (!ctx->pool && n > 1)
        ctx->pool = clattn_native_pool_create(n - 1);
    clattn_native_run_jobs(ctx->pool, &t->c, job, jobs, n);
    snprintf(ctx->kernels, sizeof ctx->kernels, "%s", name);
    ctx->build_options[0] = '\0';
    pthread_mutex_unlock(&ctx->lock);
    for (int i = 0; i < 5; ++i)
        free(t->copies[i]);
}

/* The checks both gradients make: the call's, the pointers, and out
 * (out_bytes) against the inputs. */
static clattn_status grad_begin(clattn_context *ctx, const clattn_shape *shape, clattn_sizes *sz,
                                const void *const in[6], const void *out, size_t out_bytes,
                                const char *out_name)
{
    clattn_status st = clattn_call_begin(ctx, shape, sz);
    if (st != CLATTN_OK)
        return st;
    static const char *const names[6] = {"q", "k", "v", "o", "lse", "d_out"};
    for (int i = 0; i < 6; ++i)
        if (!in[i])
            return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", names[i]);
    if (!out)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", out_name);
    const size_t elem = clattn_role_bytes(CLATTN_R_Q, shape->dtype);
    const size_t bytes[6] = {sz->q * elem, sz->kv * elem, sz->kv * elem, sz->q * elem,
                             sz->lse * sizeof(float), sz->q * elem};
    for (int i = 0; i < 6; ++i)
        if (clattn_overlaps(out, out_bytes, in[i], bytes[i]))
            return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                               "%s overlaps %s: an output may share no memory with another "
                               "tensor of the call",
                               out_name, names[i]);
    return CLATTN_OK;
}

/* j's calls for the tiled pass: Q, O and dO the caller's, K and V
 * float32 (t's), the modifiers' constants, and the hot loops (the native
 * context's, else this CPU's). */
static void params_calls(params_job *j, const clattn_context *ctx, const void *q, const void *o,
                         const void *d_out, const float *lse)
{
    const clattn_shape *s = j->t.c.s;
    native_call *c = &j->call;
    *c = j->t.c;
    c->q = q;
    c->o = o;
    c->d_out = d_out;
    c->k = j->t.k;
    c->v = j->t.v;
    c->lse = lse;
    c->kh = c->vh = NULL;
    c->group = s->num_heads / s->num_kv_heads;
    c->cap_k = s->softcap > 0.0f ? (2.0f * 1.44269504088896341f) / s->softcap : 0.0f;
    c->cap_inv = s->softcap > 0.0f ? 1.0f / s->softcap : 0.0f;
    j->built_in = *c;
    j->built_in.mods &= ~CLATTN_MOD_USER;
    j->user = *c;
    j->user.mods &= CLATTN_MOD_USER;
    j->user.scale = 1.0f;
    j->hot = ctx->native;
    if (!j->hot && clattn_native_pick_kernels(&j->hot) != CLATTN_OK)
        j->hot = &clattn_native_baseline;
}

clattn_status clattn_grad_bias(clattn_context *ctx, const clattn_shape *shape, const void *q,
                               const void *k, const void *v, const void *o, const float *lse,
                               const void *d_out, float *d_bias)
{
    clattn_sizes sz;
    const void *const in[6] = {q, k, v, o, lse, d_out};
    clattn_status st = grad_begin(ctx, shape, &sz, in, d_bias,
                                  shape ? clattn_bias_elems(shape) * sizeof(float) : 0, "d_bias");
    if (st != CLATTN_OK || (st = clattn_grad_bias_takes(shape)) != CLATTN_OK)
        return st;
    if (ctx->ops->grad_bias) { /* on the device, where it takes the call */
        pthread_mutex_lock(&ctx->lock);
        const int ran = ctx->ops->grad_bias(ctx, shape, &sz, in, d_bias, &st);
        pthread_mutex_unlock(&ctx->lock);
        if (ran)
            return st;
    }
    if ((st = clattn_native_host_forms(shape, "the bias's gradient, on the host,")) != CLATTN_OK)
        return st;
    bias_job j;
    memset(&j, 0, sizeof j);
    const void *const host_in[5] = {q, k, v, o, d_out};
    if ((st = host_begin(&j.t, shape, &sz, host_in, lse)) != CLATTN_OK)
        return st;
    j.d_bias = d_bias;
    j.heads_out = shape->bias_heads > 1 ? shape->bias_heads : 1u;
    const size_t slices = (shape->bias_batch > 1 ? shape->bias_batch : 1u) * j.heads_out;
    host_run(ctx, &j.t, bias_row, slices * shape->q_seq, "grad_bias__host");
    return CLATTN_OK;
}

/* The float64 sums a parameter job keeps: at most this many bytes in all. */
#define PARAMS_SUMS_BYTES (256u << 20)

clattn_status clattn_grad_params_takes(const clattn_shape *shape, const float *d_params)
{
    const size_t count = shape->score_params_count;
    if (!d_params)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "d_params is NULL");
    if (!shape->score_fn && !shape->score_native)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER,
                           "the shape has no score function: its parameters' gradient needs one");
    if (!shape->score_params || !count)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER,
                           "shape->score_params is NULL or score_params_count 0: no parameters");
    if (clattn_packed(shape))
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the score parameters' gradient with packed sequences");
    const size_t params_bytes = count * sizeof(float);
    if (clattn_overlaps(d_params, params_bytes, shape->score_params, params_bytes))
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "d_params overlaps score_params: an output may share no memory with "
                           "another tensor of the call");
    return CLATTN_OK;
}

clattn_status clattn_grad_score_params(clattn_context *ctx, const clattn_shape *shape,
                                       const void *q, const void *k, const void *v,
                                       const void *o, const float *lse, const void *d_out,
                                       float *d_params)
{
    clattn_sizes sz;
    const void *const in[6] = {q, k, v, o, lse, d_out};
    const size_t count = shape ? shape->score_params_count : 0;
    clattn_status st = grad_begin(ctx, shape, &sz, in, d_params, count * sizeof(float),
                                  "d_params");
    if (st != CLATTN_OK || (st = clattn_grad_params_takes(shape, d_params)) != CLATTN_OK)
        return st;
    if (ctx->ops->grad_score_params) { /* on the device, where it takes the call */
        pthread_mutex_lock(&ctx->lock);
        const int ran = ctx->ops->grad_score_params(ctx, shape, &sz, in, d_params, &st);
        pthread_mutex_unlock(&ctx->lock);
        if (ran)
            return st;
    }
    if (!shape->score_dp_native)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER,
                           "shape->score_dp_native is NULL: the parameters' gradient needs the "
                           "score function's derivative in them, on the host in C (%s; "
                           "docs/programmable.md)",
                           ctx->ops->grad_score_params
                               ? "the device takes clattn_score_dp from score_fn where the "
                                 "table fits its local memory"
                               : "the native backend");
    if ((st = clattn_native_host_forms(shape, "the score parameters' gradient")) != CLATTN_OK)
        return st;
    params_job j;
    memset(&j, 0, sizeof j);
    j.blocks = (size_t)shape->batch * shape->num_heads *
               ((shape->q_seq + QUERY_BLOCK - 1) / QUERY_BLOCK);
    j.parts = PARAMS_SUMS_BYTES / (count * sizeof(double));
    j.parts = j.parts < 1 ? 1 : j.parts > 64 ? 64 : j.parts;
    j.parts = j.parts > j.blocks ? j.blocks : j.parts;
    j.sums = calloc(j.parts * count, sizeof *j.sums);
    j.bad = calloc(j.parts, sizeof *j.bad);
    const void *const host_in[5] = {q, k, v, o, d_out};
    if (!j.sums || !j.bad)
        st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                         "out of host memory for %zu parts' sums of %zu parameters", j.parts,
                         count);
    else if ((st = host_begin(&j.t, shape, &sz, host_in, lse)) == CLATTN_OK) {
        params_calls(&j, ctx, q, o, d_out, lse);
        host_run(ctx, &j.t, params_part, j.parts, "grad_score_params__host");
        for (size_t p = 0; p < j.parts && st == CLATTN_OK; ++p)
            if (j.bad[p])
                st = clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                                 "score_dp_native gave more than %d indices or one past the %zu "
                                 "parameters; d_params is left as it was",
                                 CLATTN_SCORE_DP_MAX, count);
        for (size_t i = 0; i < count && st == CLATTN_OK; ++i) {
            double sum = 0.0;
            for (size_t p = 0; p < j.parts; ++p)
                sum += j.sums[p * count + i];
            d_params[i] = (shape->accumulate ? d_params[i] : 0.0f) + (float)sum;
        }
    }
    free(j.sums);
    free(j.bad);
    return st;
}
