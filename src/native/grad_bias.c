/* The bias's gradient (clattn_grad_bias): dS of every pair, summed over
 * the dimensions the bias broadcasts, on the backend's device where it
 * takes the call (cl/tree.cl's grad_bias__tree), else here on the host. A
 * job is one row of d_bias: for each batch element and head that row
 * gathers, in order, the pairs' p (dP - Dsum), from the modified scores
 * that native_modify() gives (the bias and the masks included). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "native.h"
#include "pool.h"

typedef struct bias_job {
    native_call c; /* first: the pool hands the jobs a native_call */
    const float *q, *k, *v, *o, *d_out; /* float32: the caller's, or copies */
    const float *lse;
    float *d_bias;
    size_t heads_out; /* the bias's heads: 1 or num_heads */
} bias_job;

/* Row i of d_bias's slice `job / q_seq`: the pairs of query row i of every
 * (batch element, head) the slice gathers, added in that order. */
static void bias_row(const native_call *call, size_t job)
{
    const bias_job *j = (const bias_job *)call;
    const native_call *c = &j->c;
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim, H = s->num_heads, group = H / s->num_kv_heads;
    const size_t i = job % s->q_seq, slice = job / s->q_seq;
    const size_t b_out = slice / j->heads_out, h_out = slice % j->heads_out;
    float *out = j->d_bias + job * s->kv_seq;
    if (!s->accumulate)
        memset(out, 0, s->kv_seq * sizeof *out);
    const size_t b0 = s->bias_batch > 1 ? b_out : 0, b1 = s->bias_batch > 1 ? b_out + 1 : s->batch;
    const size_t h0 = j->heads_out > 1 ? h_out : 0, h1 = j->heads_out > 1 ? h_out + 1 : H;
    uint32_t lo, hi;
    clattn_key_range(s, (uint32_t)i, &lo, &hi);
    const int64_t delta = c->delta;
    for (size_t b = b0; b < b1; ++b)
        for (size_t h = h0; h < h1; ++h) {
            const size_t row = (b * s->q_seq + i) * H + h;
            const float *pair = j->lse + 2 * row;
            if (pair[0] == EMPTY_ROW && pair[1] == EMPTY_ROW)
                continue; /* no key, or every one hidden */

            const float *qr = j->q + row * D, *g = j->d_out + row * D;
            const float dsum = native_dot(g, j->o + row * D, D);
            const size_t kv_head = h / group;
            const uint32_t P = clattn_query_position(s, (uint32_t)i, delta);
            for (uint32_t t = lo; t < hi; ++t) {
                const size_t key = (b * s->kv_seq + t) * s->num_kv_heads + kv_head;
                const float z =
                    native_modify(c, native_dot(qr, j->k + key * D, D) * c->scale, b, (uint32_t)i, t, h,
                                  NULL);
                if (z == -INFINITY)
                    continue;
                float dp = native_dot(g, j->v + key * D, D);
                if (c->mods & CLATTN_MOD_DROPOUT)
                    dp = clattn_dropout_keeps(&c->drop, (uint32_t)b, (uint32_t)h, P,
                                              t + s->kv_offset)
                             ? dp * c->drop.gain
                             : 0.0f;
                const float x = z - pair[0]; /* p as the backward takes it */
                out[t] += expf((x < 0.0f ? x : 0.0f) - pair[1]) * (dp - dsum);
            }
        }
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

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

clattn_status clattn_grad_bias(clattn_context *ctx, const clattn_shape *shape, const void *q,
                               const void *k, const void *v, const void *o, const float *lse,
                               const void *d_out, float *d_bias)
{
    clattn_sizes sz;
    clattn_status st = clattn_call_begin(ctx, shape, &sz);
    if (st != CLATTN_OK)
        return st;
    const void *const ptrs[7] = {q, k, v, o, lse, d_out, d_bias};
    static const char *const names[7] = {"q", "k", "v", "o", "lse", "d_out", "d_bias"};
    for (int i = 0; i < 7; ++i)
        if (!ptrs[i])
            return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", names[i]);
    if ((st = clattn_grad_bias_takes(shape)) != CLATTN_OK)
        return st;
    const size_t heads_out = shape->bias_heads > 1 ? shape->bias_heads : 1u;
    const size_t slices = (shape->bias_batch > 1 ? shape->bias_batch : 1u) * heads_out;
    const size_t out_bytes = clattn_bias_elems(shape) * sizeof(float);
    const size_t elem = clattn_role_bytes(CLATTN_R_Q, shape->dtype);
    const size_t bytes[6] = {sz.q * elem, sz.kv * elem, sz.kv * elem, sz.q * elem,
                             sz.lse * sizeof(float), sz.q * elem};
    for (int i = 0; i < 6; ++i)
        if (overlaps(d_bias, out_bytes, ptrs[i], bytes[i]))
            return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                               "d_bias overlaps %s: an output may share no memory with another "
                               "tensor of the call",
                               names[i]);
    if (ctx->ops->grad_bias) { /* on the device, where it takes the call */
        pthread_mutex_lock(&ctx->lock);
        const void *const in[6] = {q, k, v, o, lse, d_out};
        const int ran = ctx->ops->grad_bias(ctx, shape, &sz, in, d_bias, &st);
        pthread_mutex_unlock(&ctx->lock);
        if (ran)
            return st;
    }
    if ((st = clattn_native_host_forms(shape, "the bias's gradient, on the host,")) != CLATTN_OK)
        return st;
    bias_job j;
    memset(&j, 0, sizeof j);
    float *copies[5];
    const void *const in[5] = {q, k, v, o, d_out};
    const size_t elems[5] = {sz.q, sz.kv, sz.kv, sz.q, sz.q};
    const float **dst[5] = {&j.q, &j.k, &j.v, &j.o, &j.d_out};
    int short_of_memory = 0;
    for (int i = 0; i < 5; ++i)
        short_of_memory |= !(*dst[i] = as_f32(shape->dtype, in[i], elems[i], &copies[i]));
    if (!short_of_memory) {
        native_call *c = &j.c;
        c->s = shape;
        c->mods = clattn_modifiers(shape);
        c->scale = clattn_effective_scale(shape);
        c->softcap = shape->softcap;
        c->slopes = shape->alibi_slopes;
        c->delta = clattn_mask_delta(shape);
        c->drop = clattn_dropout_of(shape->dropout_p, shape->dropout_seed, shape->dropout_offset);
        j.lse = lse;
        j.d_bias = d_bias;
        j.heads_out = heads_out;
        pthread_mutex_lock(&ctx->lock);
        /* the native context's threads; any other context's, up to 16 */
        long cpus = ctx->backend == CLATTN_BACKEND_NATIVE ? ctx->num_threads
                                                          : sysconf(_SC_NPROCESSORS_ONLN);
        const int n = cpus < 1 ? 1 : cpus > 16 && ctx->backend != CLATTN_BACKEND_NATIVE ? 16
                                                                                      : (int)cpus;
        if (!ctx->pool && n > 1)
            ctx->pool = clattn_native_pool_create(n - 1);
        clattn_native_run_jobs(ctx->pool, c, bias_row, slices * shape->q_seq, n);
        snprintf(ctx->kernels, sizeof ctx->kernels, "grad_bias__host");
        ctx->build_options[0] = '\0';
        pthread_mutex_unlock(&ctx->lock);
    }
    for (int i = 0; i < 5; ++i)
        free(copies[i]);
    if (short_of_memory)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                           "out of host memory for float32 copies of the %s tensors",
                           shape->dtype == CLATTN_DTYPE_F16 ? "float16" : "bfloat16");
    return CLATTN_OK;
}
