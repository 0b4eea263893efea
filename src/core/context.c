/* Contexts and the dispatcher: which backend and device a context gets. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

clattn_status clattn_context_alloc(clattn_context **out)
{
    clattn_context *c = calloc(1, sizeof *c);
    if (!c || !(c->log = calloc(1, 1))) {
        free(c);
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    }
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c->log);
        free(c);
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "pthread_mutex_init failed");
    }
    *out = c;
    return CLATTN_OK;
}

void clattn_context_destroy(clattn_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->ops)
        ctx->ops->destroy(ctx);
    clattn_native_pool_destroy(ctx->pool); /* clattn_grad_bias()'s, on any backend */
    pthread_mutex_destroy(&ctx->lock);
    free(ctx->log);
    free(ctx);
}

clattn_backend clattn_context_backend(const clattn_context *ctx)
{
    return ctx ? ctx->backend : CLATTN_BACKEND_AUTO;
}

const char *clattn_context_device(const clattn_context *ctx) { return ctx ? ctx->device : ""; }

const char *clattn_context_variant(const clattn_context *ctx)
{
    return ctx ? ctx->variant : "";
}

const char *clattn_context_log(const clattn_context *ctx) { return ctx ? ctx->log : ""; }

const char *clattn_context_kernels(const clattn_context *ctx) { return ctx ? ctx->kernels : ""; }

const char *clattn_context_build_options(const clattn_context *ctx)
{
    return ctx ? ctx->build_options : "";
}

typedef enum plan { PLAN_AUTO, PLAN_NATIVE, PLAN_OPENCL } plan;

static int parse_index(const char *s, size_t len, unsigned *out)
{
    if (len == 0 || len > 6)
        return 0;
    unsigned v = 0;
    for (size_t i = 0; i < len; ++i) {
        if (!isdigit((unsigned char)s[i]))
            return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    *out = v;
    return 1;
}

/* Reads a selector: auto, gpu, cpu, native, P:D, or a device name's part. */
static clattn_status parse_selector(const char *sel, plan *p, clattn_cl_pick *pick)
{
    pick->name = sel;
    if (!strcmp(sel, "auto")) {
        *p = PLAN_AUTO;
    } else if (!strcmp(sel, "native")) {
        *p = PLAN_NATIVE;
    } else if (!strcmp(sel, "gpu") || !strcmp(sel, "opencl-gpu")) {
        *p = PLAN_OPENCL;
        pick->kind = CLATTN_PICK_GPU;
    } else if (!strcmp(sel, "cpu") || !strcmp(sel, "opencl-cpu")) {
        *p = PLAN_OPENCL;
        pick->kind = CLATTN_PICK_CPU;
    } else if (strchr(sel, ':') && strspn(sel, "0123456789:") == strlen(sel)) {
        const char *colon = strchr(sel, ':');
        *p = PLAN_OPENCL;
        pick->kind = CLATTN_PICK_INDEX;
        if (!parse_index(sel, (size_t)(colon - sel), &pick->platform) ||
            !parse_index(colon + 1, strlen(colon + 1), &pick->device))
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "device selector '%s': want PLATFORM:DEVICE, two indices", sel);
    } else if (sel[0] == '\0' || strspn(sel, " \t") == strlen(sel)) {
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "device selector is empty");
    } else {
        *p = PLAN_OPENCL;
        pick->kind = CLATTN_PICK_NAME;
    }
    return CLATTN_OK;
}

clattn_status clattn_context_create(const clattn_options *opts, clattn_context **ctx)
{
    clattn_clear_error();
    if (!ctx)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "ctx is NULL");
    *ctx = NULL;
    clattn_options o = opts ? *opts : clattn_options_default();
    if (o.variant && !strcmp(o.variant, "auto"))
        o.variant = NULL;
    if (o.num_threads < 0)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "num_threads %d is negative",
                           o.num_threads);
    if (o.variant && !clattn_known_variant(o.variant))
        return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT, "no kernel variant named '%s'",
                           o.variant);

    plan p = PLAN_AUTO;
    clattn_cl_pick pick = {CLATTN_PICK_GPU, 0, 0, NULL};
    const char *sel = o.device;
    if (!sel && o.backend == CLATTN_BACKEND_AUTO)
        sel = getenv("CLATTN_DEVICE");
    if (sel) {
        clattn_status st = parse_selector(sel, &p, &pick);
        if (st != CLATTN_OK)
            return st;
    } else {
        switch (o.backend) {
        case CLATTN_BACKEND_AUTO:
            p = PLAN_AUTO;
            break;
        case CLATTN_BACKEND_OPENCL_GPU:
        case CLATTN_BACKEND_OPENCL_CPU:
            p = PLAN_OPENCL;
            pick.kind = o.backend == CLATTN_BACKEND_OPENCL_GPU ? CLATTN_PICK_GPU
                                                               : CLATTN_PICK_CPU;
            break;
        case CLATTN_BACKEND_NATIVE:
            p = PLAN_NATIVE;
            break;
        default:
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "backend %d is not a clattn_backend",
                               (int)o.backend);
        }
    }

    clattn_context *c;
    clattn_status st = clattn_context_alloc(&c);
    if (st != CLATTN_OK)
        return st;
    if (p == PLAN_NATIVE) {
        st = clattn_native_init(c, &o);
    } else if (p == PLAN_OPENCL) {
        /* gpu and cpu try each device of the type; an index or name is final. */
        st = clattn_opencl_init(c, &o, &pick, pick.kind == CLATTN_PICK_GPU ||
                                                  pick.kind == CLATTN_PICK_CPU);
    } else {
        static const clattn_cl_pick order[2] = {{CLATTN_PICK_GPU, 0, 0, NULL},
                                                {CLATTN_PICK_CPU, 0, 0, NULL}};
        static const char *const what[2] = {"opencl-gpu", "opencl-cpu"};
        st = CLATTN_ERROR_DEVICE_NOT_FOUND;
        for (int i = 0; i < 2 && st != CLATTN_OK; ++i) {
            st = clattn_opencl_init(c, &o, &order[i], 1);
            if (st != CLATTN_OK)
                clattn_log_append(c, "auto: %s skipped: %s", what[i], clattn_last_error());
        }
        if (st != CLATTN_OK) {
            st = clattn_native_init(c, &o);
            if (st == CLATTN_OK)
                clattn_log_append(c, "auto: fell back to native");
        }
    }
    if (st != CLATTN_OK) {
        if (c->log[0])
            clattn_fail_append(c->log);
        clattn_context_destroy(c);
        return st;
    }
    clattn_clear_error();
    *ctx = c;
    return CLATTN_OK;
}

clattn_status clattn_call_begin(const clattn_context *ctx, const clattn_shape *s,
                                clattn_sizes *sz)
{
    clattn_clear_error();
    if (!ctx)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "ctx is NULL");
    return clattn_check_shape(s, sz);
}

/* clattn_merge() of one row of n elements, in float32. */
static void merge_row(const float *o1, const float *lse1, const float *o2, const float *lse2,
                      float *o, float *lse, size_t n)
{
    const float empty = -1e30f;
    /* Empty is the pair (-1e30, -1e30): a NaN with -1e30 is a NaN partial. */
    const int e1 = lse1[0] == empty && lse1[1] == empty;
    const int e2 = lse2[0] == empty && lse2[1] == empty;
    const float m = e1 ? lse2[0] : e2 ? lse1[0] : fmaxf(lse1[0], lse2[0]);
    const float s1 = e1 ? 0.0f : expf(lse1[0] - m + lse1[1]);
    const float s2 = e2 ? 0.0f : expf(lse2[0] - m + lse2[1]);
    const float sum = s1 + s2;
    /* sum is 0 only where both are empty; a NaN partial makes it NaN */
    const float w1 = sum != 0.0f ? s1 / sum : 0.0f, w2 = sum != 0.0f ? s2 / sum : 0.0f;
    for (size_t d = 0; d < n; ++d)
        o[d] = w1 * o1[d] + w2 * o2[d];
    lse[0] = sum != 0.0f ? m : empty;
    lse[1] = sum != 0.0f ? logf(sum) : empty;
}

clattn_status clattn_merge(clattn_context *ctx, const clattn_shape *shape, const void *o1,
                           const float *lse1, const void *o2, const float *lse2, void *o,
                           float *lse)
{
    clattn_sizes sz;
    clattn_status st = clattn_call_begin(ctx, shape, &sz);
    if (st != CLATTN_OK)
        return st;
    const void *const ptrs[6] = {o1, lse1, o2, lse2, o, lse};
    static const char *const names[6] = {"o1", "lse1", "o2", "lse2", "o", "lse"};
    for (int i = 0; i < 6; ++i)
        if (!ptrs[i])
            return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", names[i]);
    const size_t n = shape->head_dim, rows = sz.lse / 2;
    const size_t bytes = shape->dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2u;
    float a[CLATTN_MAX_HEAD_DIM], b[CLATTN_MAX_HEAD_DIM], out[CLATTN_MAX_HEAD_DIM], pair[2];
    for (size_t r = 0; r < rows; ++r) {
        const size_t at = r * n * bytes;
        clattn_to_f32(shape->dtype, (const char *)o1 + at, a, n);
        clattn_to_f32(shape->dtype, (const char *)o2 + at, b, n);
        merge_row(a, lse1 + 2 * r, b, lse2 + 2 * r, out, pair, n);
        clattn_from_f32(shape->dtype, out, (char *)o + at, n);
        lse[2 * r] = pair[0];
        lse[2 * r + 1] = pair[1];
    }
    return CLATTN_OK;
}

/* clattn_fill_unseen()'s fill on host tensors (arg: the tensors and the
 * bytes of a 16-bit or float32 element). */
typedef struct host_fill {
    const void *const *t;
    size_t elem;
} host_fill;

static int fill_host(void *arg, int role, size_t first, size_t count, float value)
{
    const host_fill *h = arg;
    if (role == CLATTN_R_LSE) {
        float *lse = (float *)h->t[role] + first;
        for (size_t j = 0; j < count; ++j)
            lse[j] = value;
    } else { /* value is 0: every dtype's zero is all zero bits */
        memset((char *)h->t[role] + first * h->elem, 0, count * h->elem);
    }
    return 0;
}

/* Packed sequences on host pointers: each sequence's problem on the
 * backend, at its rows of the tensors, the longest first (all in one call
 * where the backend has run_many); then the rows no problem wrote get what
 * a row that sees nothing gets. */
static clattn_status run_packed(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                                const void *const t[CLATTN_R_COUNT])
{
    const size_t elem = s->dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2u;
    const uint32_t longest = clattn_longest_sequence(s);
    clattn_seq_call *calls = ctx->ops->run_many ? malloc(s->batch * sizeof *calls) : NULL;
    if (ctx->ops->run_many && !calls)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory for %u sequences",
                           s->batch);
    size_t n_calls = 0;
    clattn_status st = CLATTN_OK;
    for (uint32_t n = 0; n < s->batch && st == CLATTN_OK; ++n) {
        const uint32_t i = clattn_sequence_at(n, longest);
        clattn_seq_call one = {.shape = clattn_sequence_shape(s, i), .index = i};
        if (!one.shape.q_seq || !one.shape.kv_seq)
            continue;
        for (int r = 0; r < CLATTN_R_COUNT; ++r) {
            const size_t bytes = r == CLATTN_R_LSE ? sizeof(float) : elem;
            one.t[r] = t[r] ? (const char *)t[r] + clattn_sequence_offset(s, r, i) * bytes : NULL;
        }
        st = clattn_check_shape(&one.shape, &one.sizes);
        if (st != CLATTN_OK)
            break;
        if (calls) {
            calls[n_calls++] = one;
            continue;
        }
        ctx->seq_base = i;
        st = ctx->ops->run(ctx, op, &one.shape, &one.sizes, one.t);
        ctx->seq_base = 0;
    }
    if (st == CLATTN_OK && n_calls)
        st = ctx->ops->run_many(ctx, op, calls, n_calls);
    free(calls);
    if (st != CLATTN_OK)
        return st;
    host_fill h = {t, elem};
    clattn_fill_unseen(s, op, fill_host, &h);
    return CLATTN_OK;
}

/* Validates and runs one op on ctx's backend under its lock. */
/* An output may share no byte with another tensor of the call: the
 * backends read their inputs while they write, in orders of their own, so
 * aliasing would give each its own wrong answer. */
static clattn_status check_aliasing(clattn_op op, const clattn_shape *s, const clattn_sizes *sz,
                                    const void *const t[CLATTN_R_COUNT])
{
    const unsigned used = clattn_op_reads[op] | clattn_op_writes[op];
    uintptr_t lo[CLATTN_R_COUNT], hi[CLATTN_R_COUNT];
    for (int r = 0; r < CLATTN_R_COUNT; ++r) {
        if (!(used & CLATTN_BIT(r)))
            continue;
        lo[r] = (uintptr_t)t[r];
        hi[r] = lo[r] + clattn_role_elems(sz, (clattn_role)r) * clattn_role_bytes(r, s->dtype);
    }
    for (int w = 0; w < CLATTN_R_COUNT; ++w) {
        if (!(clattn_op_writes[op] & CLATTN_BIT(w)))
            continue;
        for (int r = 0; r < CLATTN_R_COUNT; ++r)
            if (r != w && (used & CLATTN_BIT(r)) && lo[w] < hi[r] && lo[r] < hi[w])
                return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                                   "%s overlaps %s: an output may share no memory with "
                                   "another tensor of the call",
                                   clattn_role_name((clattn_role)w),
                                   clattn_role_name((clattn_role)r));
    }
    return CLATTN_OK;
}

static clattn_status run_op(clattn_context *ctx, clattn_op op, const clattn_shape *shape,
                            const void *const t[CLATTN_R_COUNT])
{
    clattn_sizes sz;
    clattn_status st = clattn_call_begin(ctx, shape, &sz);
    if (st != CLATTN_OK)
        return st;
    const unsigned used = clattn_op_reads[op] | clattn_op_writes[op];
    for (int r = 0; r < CLATTN_R_COUNT; ++r)
        if ((used & CLATTN_BIT(r)) && !t[r])
            return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL",
                               clattn_role_name((clattn_role)r));
    if ((st = check_aliasing(op, shape, &sz, t)) != CLATTN_OK)
        return st;
    pthread_mutex_lock(&ctx->lock);
    st = clattn_packed(shape) && !ctx->ops->packed ? run_packed(ctx, op, shape, t)
                                                   : ctx->ops->run(ctx, op, shape, &sz, t);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

clattn_status clattn_forward(clattn_context *ctx, const clattn_shape *shape, const void *q,
                             const void *k, const void *v, void *o, float *lse)
{
    const void *t[CLATTN_R_COUNT] = {0};
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_V] = v;
    t[CLATTN_R_O] = o;
    t[CLATTN_R_LSE] = lse;
    return run_op(ctx, CLATTN_OP_FORWARD, shape, t);
}

clattn_status clattn_grad_v(clattn_context *ctx, const clattn_shape *shape,
                            const void *d_out, const void *q, const void *k,
                            const float *lse, void *dv)
{
    const void *t[CLATTN_R_COUNT] = {0};
    t[CLATTN_R_DO] = d_out;
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_LSE] = lse;
    t[CLATTN_R_DV] = dv;
    return run_op(ctx, CLATTN_OP_GRAD_V, shape, t);
}

/* The ops that read everything the forward made: Q K V O LSE dO. */
static clattn_status run_backward_op(clattn_context *ctx, clattn_op op, const clattn_shape *shape,
                                     const void *q, const void *k, const void *v,
                                     const void *o, const float *lse, const void *d_out,
                                     void *dq, void *dk, void *dv)
{
    const void *t[CLATTN_R_COUNT] = {q, k, v, o, lse, d_out, dq, dk, dv};
    return run_op(ctx, op, shape, t);
}

clattn_status clattn_grad_q(clattn_context *ctx, const clattn_shape *shape, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            const void *d_out, void *dq)
{
    return run_backward_op(ctx, CLATTN_OP_GRAD_Q, shape, q, k, v, o, lse, d_out, dq, NULL, NULL);
}

clattn_status clattn_grad_k(clattn_context *ctx, const clattn_shape *shape, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            const void *d_out, void *dk)
{
    return run_backward_op(ctx, CLATTN_OP_GRAD_K, shape, q, k, v, o, lse, d_out, NULL, dk, NULL);
}

clattn_status clattn_backward(clattn_context *ctx, const clattn_shape *shape, const void *q,
                              const void *k, const void *v, const void *o, const float *lse,
                              const void *d_out, void *dq, void *dk, void *dv)
{
    return run_backward_op(ctx, CLATTN_OP_BACKWARD, shape, q, k, v, o, lse, d_out, dq, dk, dv);
}
