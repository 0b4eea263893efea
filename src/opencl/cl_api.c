/* The public calls on the caller's own OpenCL objects (clattn_cl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl.h"

/* Checks that a caller's tensor lies inside its buffer, of ctx's context. */
/* Where a tensor's bytes lie: its buffer's root (the parent of a
 * sub-buffer; OpenCL 1.2 nests them one deep) and the byte range in it. */
typedef struct byte_span {
    cl_mem root;
    size_t lo, hi;
} byte_span;

static int spans_overlap(const byte_span *a, const byte_span *b)
{
    return a->root == b->root && a->lo < b->hi && b->lo < a->hi;
}

/* Checks the caller's tensor t (elems elements of `bytes` each) against its
 * buffer and the context, and places it in *span. */
static clattn_status check_tensor(const struct clattn_cl_state *cl, clattn_cl_tensor t,
                                  size_t elems, size_t bytes, const char *name, byte_span *span)
{
    if (!t.buffer)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s buffer is NULL", name);
    size_t size = 0, origin = 0;
    cl_context owner = NULL;
    cl_mem parent = NULL;
    cl_int err = clGetMemObjectInfo(t.buffer, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(t.buffer, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(t.buffer, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent,
                                 NULL);
    if (err == CL_SUCCESS && parent)
        err = clGetMemObjectInfo(t.buffer, CL_MEM_OFFSET, sizeof origin, &origin, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER, "%s is not a valid cl_mem: %s (%d)", name,
                           clattn_ocl_error_name(err), err);
    if (owner != cl->context)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "%s belongs to another cl_context than the clattn context's", name);
    size_t cap = size / bytes;
    if (t.offset > cap || elems > cap - t.offset)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "%s needs %zu elements of %zu bytes from offset %zu, the buffer "
                           "holds %zu",
                           name, elems, bytes, t.offset, cap);
    span->root = parent ? parent : t.buffer;
    span->lo = origin + t.offset * bytes;
    span->hi = span->lo + elems * bytes;
    return CLATTN_OK;
}

cl_context clattn_context_cl_context(const clattn_context *ctx)
{
    return ctx && ctx->cl ? ctx->cl->context : NULL;
}

cl_command_queue clattn_context_cl_queue(const clattn_context *ctx)
{
    return ctx && ctx->cl ? ctx->cl->queue : NULL;
}

/* The checks every _cl call starts with: clattn_call_begin()'s, an OpenCL
 * context, and a wait list where events are counted. */
static clattn_status cl_call_begin(const clattn_context *ctx, const clattn_shape *shape,
                                   clattn_sizes *sz, cl_uint nwait, const cl_event *wait)
{
    clattn_status st = clattn_call_begin(ctx, shape, sz);
    if (st != CLATTN_OK)
        return st;
    if (!ctx->cl)
        return clattn_fail(CLATTN_ERROR_WRONG_BACKEND,
                           "the _cl calls need an OpenCL context; this one is %s", ctx->device);
    if (nwait && !wait)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "event_wait_list is NULL with %u events",
                           nwait);
    return CLATTN_OK;
}

clattn_status clattn_merge_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor o1,
                              clattn_cl_tensor lse1, clattn_cl_tensor o2, clattn_cl_tensor lse2,
                              clattn_cl_tensor o, clattn_cl_tensor lse,
                              cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                              cl_event *event)
{
    clattn_sizes sz;
    clattn_status st = cl_call_begin(ctx, shape, &sz, num_events_in_wait_list, event_wait_list);
    if (st != CLATTN_OK)
        return st;
    struct clattn_cl_state *cl = ctx->cl;
    const clattn_cl_tensor t[6] = {o1, lse1, o2, lse2, o, lse};
    static const char *const names[6] = {"o1", "lse1", "o2", "lse2", "o", "lse"};
    const size_t ob = clattn_ocl_role_bytes(CLATTN_R_O, shape->dtype);
    byte_span span[6];
    for (int i = 0; i < 6; ++i)
        if ((st = check_tensor(cl, t[i], i % 2 ? sz.lse : sz.q, i % 2 ? sizeof(float) : ob,
                               names[i], &span[i])) != CLATTN_OK)
            return st;
    /* o may be exactly o1 or o2, and lse exactly lse1 or lse2 (merge__tree
     * reads a row before it writes it); any other overlap is refused. */
    for (int w = 4; w < 6; ++w)
        for (int r = 0; r < 6; ++r) {
            const int in_place = r < 4 && r % 2 == w % 2 && span[w].root == span[r].root &&
                                 span[w].lo == span[r].lo && span[w].hi == span[r].hi;
            if (r != w && !in_place && spans_overlap(&span[w], &span[r]))
                return clattn_fail(CLATTN_ERROR_INVALID_BUFFER, "%s overlaps %s", names[w],
                                   names[r]);
        }
    pthread_mutex_lock(&ctx->lock);
    kernel_set *set = NULL;
    const clattn_dtype dtype = shape->dtype;
    cl_int err = CL_SUCCESS;
    if (!cl->kernels.merge[dtype] && (st = clattn_ocl_generic_kernels(cl, dtype, 0, &set)) == CLATTN_OK) {
        cl->kernels.merge[dtype] = clCreateKernel(set->program[K_FORWARD], "merge__tree", &err);
        if (err != CL_SUCCESS) {
            cl->kernels.merge[dtype] = NULL;
            st = clattn_ocl_fail(err, "clCreateKernel(merge__tree)");
        }
    }
    if (st == CLATTN_OK) {
        cl_kernel kn = cl->kernels.merge[dtype];
        cl_uint arg = 0;
        for (int i = 0; i < 6; ++i) {
            cl_ulong off = t[i].offset;
            err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &t[i].buffer);
            err |= clSetKernelArg(kn, arg++, sizeof off, &off);
        }
        cl_ulong rows = sz.lse / 2;
        cl_uint head_dim = shape->head_dim;
        err |= clSetKernelArg(kn, arg++, sizeof rows, &rows);
        err |= clSetKernelArg(kn, arg++, sizeof head_dim, &head_dim);
        const size_t local = 64, global = (sz.lse / 2 + local - 1) / local * local;
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(cl->queue, kn, 1, NULL, &global, &local,
                                         num_events_in_wait_list,
                                         num_events_in_wait_list ? event_wait_list : NULL, event);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "enqueueing merge__tree");
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

/* Validates the caller's buffers for op and enqueues it. */
static clattn_status run_cl(clattn_context *ctx, clattn_op op, const clattn_shape *shape,
                            clattn_cl_tensor t[R_ALL], cl_uint nwait, const cl_event *wait,
                            cl_event *event)
{
    clattn_sizes sz;
    clattn_status st = cl_call_begin(ctx, shape, &sz, nwait, wait);
    if (st != CLATTN_OK)
        return st;
    const unsigned reads = clattn_op_reads[op], writes = clattn_op_writes[op];
    byte_span span[CLATTN_R_COUNT];
    for (int r = 0; r < CLATTN_R_COUNT; ++r)
        if (((reads | writes) & CLATTN_BIT(r)) &&
            (st = check_tensor(ctx->cl, t[r], clattn_role_elems(&sz, (clattn_role)r),
                               clattn_ocl_role_bytes(r, shape->dtype),
                               clattn_role_name((clattn_role)r), &span[r])) != CLATTN_OK)
            return st;
    /* An output may overlap no other tensor of the call, in bytes (the LSE
     * pairs' elements are wider than 16-bit tensors') of the buffers'
     * roots, so that two sub-buffers of one parent are seen too. */
    for (int w = 0; w < CLATTN_R_COUNT; ++w) {
        if (!(writes & CLATTN_BIT(w)))
            continue;
        for (int r = 0; r < CLATTN_R_COUNT; ++r)
            if (r != w && ((reads | writes) & CLATTN_BIT(r)) && spans_overlap(&span[w], &span[r]))
                return clattn_fail(CLATTN_ERROR_INVALID_BUFFER, "%s overlaps %s",
                                   clattn_role_name((clattn_role)w),
                                   clattn_role_name((clattn_role)r));
    }
    if ((st = clattn_ocl_check_alloc(ctx->cl, &sz, shape->dtype)) != CLATTN_OK)
        return st;
    pthread_mutex_lock(&ctx->lock);
    st = clattn_packed(shape)
             ? clattn_ocl_enqueue_packed(ctx->cl, op, shape, t, nwait, wait, event)
             : clattn_ocl_enqueue_op(ctx->cl, ctx->cl->queue, op, shape, &sz, t, nwait, wait, event);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

clattn_status clattn_grad_v_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor d_out, clattn_cl_tensor q, clattn_cl_tensor k,
                               clattn_cl_tensor lse, clattn_cl_tensor dv,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                               cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    t[CLATTN_R_DO] = d_out;
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_LSE] = lse;
    t[CLATTN_R_DV] = dv;
    return run_cl(ctx, CLATTN_OP_GRAD_V, shape, t, num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_forward_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor q,
                                clattn_cl_tensor k, clattn_cl_tensor v, clattn_cl_tensor o,
                                clattn_cl_tensor lse, cl_uint num_events_in_wait_list,
                                const cl_event *event_wait_list, cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_V] = v;
    t[CLATTN_R_O] = o;
    t[CLATTN_R_LSE] = lse;
    return run_cl(ctx, CLATTN_OP_FORWARD, shape, t, num_events_in_wait_list, event_wait_list,
                  event);
}

/* The gradients that read Q K V O LSE dO. */
static clattn_status run_backward_cl(clattn_context *ctx, clattn_op op, const clattn_shape *shape,
                                     const clattn_cl_tensor in[6], clattn_cl_tensor dq,
                                     clattn_cl_tensor dk, clattn_cl_tensor dv, cl_uint nwait,
                                     const cl_event *wait, cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    for (int r = 0; r < 6; ++r)
        t[r] = in[r]; /* Q K V O LSE dO lead the role list */
    t[CLATTN_R_DQ] = dq;
    t[CLATTN_R_DK] = dk;
    t[CLATTN_R_DV] = dv;
    return run_cl(ctx, op, shape, t, nwait, wait, event);
}

clattn_status clattn_backward_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor q,
                                 clattn_cl_tensor k, clattn_cl_tensor v, clattn_cl_tensor o,
                                 clattn_cl_tensor lse, clattn_cl_tensor d_out, clattn_cl_tensor dq,
                                 clattn_cl_tensor dk, clattn_cl_tensor dv,
                                 cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                 cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out};
    return run_backward_cl(ctx, CLATTN_OP_BACKWARD, shape, in, dq, dk, dv, num_events_in_wait_list,
                           event_wait_list, event);
}

clattn_status clattn_grad_q_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor q,
                               clattn_cl_tensor k, clattn_cl_tensor v, clattn_cl_tensor o,
                               clattn_cl_tensor lse, clattn_cl_tensor d_out, clattn_cl_tensor dq,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                               cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out}, none = {NULL, 0};
    return run_backward_cl(ctx, CLATTN_OP_GRAD_Q, shape, in, dq, none, none,
                           num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_grad_k_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor q,
                               clattn_cl_tensor k, clattn_cl_tensor v, clattn_cl_tensor o,
                               clattn_cl_tensor lse, clattn_cl_tensor d_out, clattn_cl_tensor dk,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                               cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out}, none = {NULL, 0};
    return run_backward_cl(ctx, CLATTN_OP_GRAD_K, shape, in, none, dk, none,
                           num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_context_create_from_cl(const clattn_options *opts, cl_context context,
                                            cl_device_id device, cl_command_queue queue,
                                            clattn_context **ctx)
{
    clattn_clear_error();
    if (!ctx)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "ctx is NULL");
    *ctx = NULL;
    if (!context || !device)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", context ? "device" : "context");
    /* A queue of another context or device, or a device outside the
     * context, would fail every later call: refuse it now. */
    cl_uint ndev = 0;
    cl_device_id devs[64];
    cl_int err = clGetContextInfo(context, CL_CONTEXT_NUM_DEVICES, sizeof ndev, &ndev, NULL);
    if (err == CL_SUCCESS && ndev <= 64)
        err = clGetContextInfo(context, CL_CONTEXT_DEVICES, ndev * sizeof *devs, devs, NULL);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clGetContextInfo (the caller's context)");
    int in_context = ndev > 64; /* not listed here: left to the driver */
    for (cl_uint i = 0; i < ndev && i < 64; ++i)
        in_context |= devs[i] == device;
    if (!in_context)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "device is not one of context's");
    if (queue) {
        cl_context qctx = NULL;
        cl_device_id qdev = NULL;
        err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
        if (err == CL_SUCCESS)
            err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
        if (err != CL_SUCCESS)
            return clattn_ocl_fail(err, "clGetCommandQueueInfo (the caller's queue)");
        if (qctx != context || qdev != device)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "queue belongs to %s",
                               qctx != context ? "another cl_context than context"
                                               : "another device than device");
    }
    clattn_options o = opts ? *opts : clattn_options_default();
    clattn_context *c;
    clattn_status st = clattn_context_alloc(&c);
    if (st != CLATTN_OK)
        return st;
    st = clattn_ocl_init_on_device(c, o.variant, context, device, queue, 0);
    if (st != CLATTN_OK) {
        clattn_context_destroy(c);
        return st;
    }
    snprintf(c->device + strlen(c->device), sizeof c->device - strlen(c->device),
             " (caller's context)");
    *ctx = c;
    return CLATTN_OK;
}

/* The device tensors t (of roles role, n of them) read back to new host
 * copies in host[], which enters all NULL (free() each; all NULL again on
 * failure), in order on the context's queue after the caller's events;
 * the last read blocks. */
static clattn_status read_back(clattn_context *ctx, const clattn_shape *shape,
                               const clattn_sizes *sz, int n, const clattn_cl_tensor *t,
                               const clattn_role *role, void **host, cl_uint nwait,
                               const cl_event *wait)
{
    size_t bytes[CLATTN_R_COUNT];
    byte_span span;
    clattn_status st = CLATTN_OK;
    for (int i = 0; i < n; ++i) {
        const size_t elem = clattn_ocl_role_bytes(role[i], shape->dtype);
        bytes[i] = clattn_role_elems(sz, role[i]) * elem;
        if ((st = check_tensor(ctx->cl, t[i], clattn_role_elems(sz, role[i]), elem,
                               clattn_role_name(role[i]), &span)) != CLATTN_OK)
            return st;
    }
    for (int i = 0; i < n && st == CLATTN_OK; ++i)
        if (!(host[i] = malloc(bytes[i] ? bytes[i] : 1)))
            st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory for %s (%zu bytes)",
                             clattn_role_name(role[i]), bytes[i]);
    if (st == CLATTN_OK) {
        pthread_mutex_lock(&ctx->lock);
        cl_int err = CL_SUCCESS;
        for (int i = 0; i < n && err == CL_SUCCESS; ++i)
            err = clEnqueueReadBuffer(ctx->cl->queue, t[i].buffer, i == n - 1 ? CL_TRUE : CL_FALSE,
                                      t[i].offset * clattn_ocl_role_bytes(role[i], shape->dtype),
                                      bytes[i], host[i], i == 0 ? nwait : 0,
                                      i == 0 && nwait ? wait : NULL, NULL);
        if (err != CL_SUCCESS) {
            clFinish(ctx->cl->queue); /* no read may still write the host copies */
            st = clattn_ocl_fail(err, "clEnqueueReadBuffer (reading back for the host)");
        }
        pthread_mutex_unlock(&ctx->lock);
    }
    if (st != CLATTN_OK)
        for (int i = 0; i < n; ++i) {
            free(host[i]);
            host[i] = NULL;
        }
    return st;
}

/* The start of a host computation from device tensors: the call's checks,
 * `out` (named out_name) not NULL, then the n tensors read back (read_back). */
static clattn_status host_call_begin(clattn_context *ctx, const clattn_shape *shape,
                                     const void *out, const char *out_name, int n,
                                     const clattn_cl_tensor *t, const clattn_role *role,
                                     void **host, cl_uint nwait, const cl_event *wait)
{
    clattn_sizes sz;
    for (int i = 0; i < n; ++i)
        host[i] = NULL;
    clattn_status st = cl_call_begin(ctx, shape, &sz, nwait, wait);
    if (st != CLATTN_OK)
        return st;
    if (!out)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", out_name);
    return read_back(ctx, shape, &sz, n, t, role, host, nwait, wait);
}

clattn_status clattn_grad_sinks_cl(clattn_context *ctx, const clattn_shape *shape,
                                   clattn_cl_tensor o, clattn_cl_tensor lse,
                                   clattn_cl_tensor d_out, float *d_sinks,
                                   cl_uint num_events_in_wait_list,
                                   const cl_event *event_wait_list)
{
    const clattn_cl_tensor t[3] = {o, lse, d_out};
    const clattn_role role[3] = {CLATTN_R_O, CLATTN_R_LSE, CLATTN_R_DO};
    void *host[3];
    clattn_status st = host_call_begin(ctx, shape, d_sinks, "d_sinks", 3, t, role, host,
                                       num_events_in_wait_list, event_wait_list);
    if (st == CLATTN_OK)
        st = clattn_grad_sinks(ctx, shape, host[0], host[1], host[2], d_sinks);
    for (int i = 0; i < 3; ++i)
        free(host[i]);
    return st;
}

/* Gradient `which` summed over the pairs of device tensors t into the
 * host array out: on the device where it takes the call, else read back
 * for the host. */
static clattn_status pairs_cl(clattn_context *ctx, pair_grad which, const clattn_shape *shape,
                              const clattn_cl_tensor t[6], const clattn_role role[6], float *out,
                              cl_uint nwait, const cl_event *wait)
{
    clattn_sizes sz;
    clattn_status st = cl_call_begin(ctx, shape, &sz, nwait, wait);
    if (st != CLATTN_OK)
        return st;
    if (which == PAIR_PARAMS)
        st = clattn_grad_params_takes(shape, out);
    else if (!out)
        st = clattn_fail(CLATTN_ERROR_NULL_POINTER, "d_bias is NULL");
    else
        st = clattn_grad_bias_takes(shape);
    if (st != CLATTN_OK)
        return st;
    clattn_cl_tensor all[R_ALL];
    memset(all, 0, sizeof all);
    byte_span span;
    for (int i = 0; i < 6; ++i) {
        if ((st = check_tensor(ctx->cl, t[i], clattn_role_elems(&sz, role[i]),
                               clattn_ocl_role_bytes(role[i], shape->dtype),
                               clattn_role_name(role[i]), &span)) != CLATTN_OK)
            return st;
        all[role[i]] = t[i];
    }
    pthread_mutex_lock(&ctx->lock);
    const int ran = clattn_ocl_pair_grad(ctx->cl, which, shape, &sz, all, out, nwait, wait, &st);
    pthread_mutex_unlock(&ctx->lock);
    if (ran)
        return st;
    void *host[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    st = read_back(ctx, shape, &sz, 6, t, role, host, nwait, wait);
    if (st == CLATTN_OK)
        st = which == PAIR_PARAMS
                 ? clattn_grad_score_params(ctx, shape, host[0], host[1], host[2], host[3],
                                            host[4], host[5], out)
                 : clattn_grad_bias(ctx, shape, host[0], host[1], host[2], host[3], host[4],
                                    host[5], out);
    for (int i = 0; i < 6; ++i)
        free(host[i]);
    return st;
}

clattn_status clattn_grad_score_params_cl(clattn_context *ctx, const clattn_shape *shape,
                                          clattn_cl_tensor q, clattn_cl_tensor k,
                                          clattn_cl_tensor v, clattn_cl_tensor o,
                                          clattn_cl_tensor lse, clattn_cl_tensor d_out,
                                          float *d_params, cl_uint num_events_in_wait_list,
                                          const cl_event *event_wait_list)
{
    const clattn_cl_tensor t[6] = {q, k, v, o, lse, d_out};
    const clattn_role role[6] = {CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V,
                                 CLATTN_R_O, CLATTN_R_LSE, CLATTN_R_DO};
    return pairs_cl(ctx, PAIR_PARAMS, shape, t, role, d_params, num_events_in_wait_list,
                    event_wait_list);
}

clattn_status clattn_grad_bias_cl(clattn_context *ctx, const clattn_shape *shape,
                                  clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                  clattn_cl_tensor o, clattn_cl_tensor lse,
                                  clattn_cl_tensor d_out, float *d_bias,
                                  cl_uint num_events_in_wait_list,
                                  const cl_event *event_wait_list)
{
    const clattn_cl_tensor t[6] = {q, k, v, o, lse, d_out};
    const clattn_role role[6] = {CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V,
                                 CLATTN_R_O, CLATTN_R_LSE, CLATTN_R_DO};
    return pairs_cl(ctx, PAIR_BIAS, shape, t, role, d_bias, num_events_in_wait_list,
                    event_wait_list);
}
