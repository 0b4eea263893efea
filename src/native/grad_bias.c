/* The gradients that sum over the pairs, on the host, where the backend's
 * device does not take them (else on the device: src/opencl/pairs.c):
 * the bias's (clattn_grad_bias) and the score function's parameters'
 * (clattn_grad_score_params). Both run the native kernels' tiled passes
 * (kernels.c's bias_block and params_block), which take each pair's dZ =
 * p (dP - Dsum) from its modified score (the bias and the masks
 * included) a block of query rows against a tile of keys at a time. A
 * bias job is a block of rows of one slice of d_bias, summing the batch
 * elements and heads it gathers in order; a parameter job is a part of
 * the blocks of query rows, fixed by the shape, summing into float64 sums
 * of its own that are then added in the parts' order. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "native.h"
#include "pool.h"

/* A call for the tiled passes: the first member, so that the pool hands
 * the jobs a native_call that is one. Q, O and dO are the caller's; K and
 * V float32 (the caller's, or copies in `copies`). */
typedef struct host_pairs {
    native_call c;
    const native_kernels *hot; /* the native context's, else this CPU's */
    float *copies[2];
} host_pairs;

typedef struct bias_job {
    host_pairs t; /* first */
    float *d_bias;
} bias_job;

static void bias_part(const native_call *call, size_t job)
{
    const bias_job *j = (const bias_job *)call;
    j->t.hot->bias(call, job, j->d_bias);
}

typedef struct params_job {
    host_pairs t; /* first */
    /* t's call with its built-in modifiers alone, and with its functions alone */
    native_call built_in, user;
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
        j->t.hot->params(call, i, &p);
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

/* Makes t's call for shape from the caller's in[] (q, k, v, o, d_out) and
 * lse: K and V as float32 (copies of 16-bit ones), the modifiers'
 * constants, the hot loops; CLATTN_ERROR_OUT_OF_MEMORY (nothing kept)
 * where memory is short. */
static clattn_status host_begin(const clattn_context *ctx, host_pairs *t,
                                const clattn_shape *shape, const clattn_sizes *sz,
                                const void *const in[5], const float *lse)
{
    native_call *c = &t->c;
    c->k = as_f32(shape->dtype, in[1], sz->kv, &t->copies[0]);
    c->v = as_f32(shape->dtype, in[2], sz->kv, &t->copies[1]);
    if (!c->k || !c->v) {
        free(t->copies[0]);
        free(t->copies[1]);
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                           "out of host memory for float32 copies of K and V (%s)",
                           shape->dtype == CLATTN_DTYPE_F16 ? "float16" : "bfloat16");
    }
    c->s = shape;
    c->q = in[0];
    c->o = in[3];
    c->d_out = in[4];
    c->lse = lse;
    c->kh = c->vh = NULL; /* K and V read where they lie */
    native_call_modifiers(c, shape, clattn_modifiers(shape));
    t->hot = ctx->native;
    if (!t->hot && clattn_native_pick_kernels(&t->hot) != CLATTN_OK)
        t->hot = &clattn_native_baseline;
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
    for (int i = 0; i < 2; ++i)
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
    if ((st = host_begin(ctx, &j.t, shape, &sz, host_in, lse)) != CLATTN_OK)
        return st;
    j.d_bias = d_bias;
    const size_t slices = clattn_bias_elems(shape) / ((size_t)shape->q_seq * shape->kv_seq);
    host_run(ctx, &j.t, bias_part,
             slices * native_query_blocks(shape->q_seq), "grad_bias__host");
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
    j.blocks = (size_t)shape->batch * shape->num_heads * native_query_blocks(shape->q_seq);
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
    else if ((st = host_begin(ctx, &j.t, shape, &sz, host_in, lse)) == CLATTN_OK) {
        j.built_in = j.user = j.t.c;
        j.built_in.mods &= ~CLATTN_MOD_USER;
        j.user.mods &= CLATTN_MOD_USER;
        j.user.scale = 1.0f; /* over the scores the built-ins gave */
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
