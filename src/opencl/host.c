/* The host-pointer calls: the caller's arrays copied through per-role
 * scratch buffers the context keeps, the op's kernels (launch.c), and the
 * outputs read back. */
#include <string.h>

#include "variant.h"

/* Makes sure the copy buffer of a role holds bytes (contents are lost). */
static clattn_status scratch(struct clattn_cl_state *cl, int role, size_t bytes)
{
    if (cl->host_copy.bytes[role] >= bytes)
        return CLATTN_OK;
    if (cl->host_copy.buffer[role])
        clReleaseMemObject(cl->host_copy.buffer[role]);
    cl->host_copy.buffer[role] = NULL;
    cl->host_copy.bytes[role] = 0;
    cl_int err;
    cl_mem m = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clCreateBuffer");
    cl->host_copy.buffer[role] = m;
    cl->host_copy.bytes[role] = bytes;
    return CLATTN_OK;
}

clattn_status clattn_ocl_upload(struct clattn_cl_state *cl, clattn_dtype dtype,
                                const clattn_sizes *sz, unsigned held, unsigned reads,
                                const void *const host[CLATTN_R_COUNT], clattn_cl_tensor t[R_ALL],
                                cl_event ev[CLATTN_R_COUNT], cl_uint *nev)
{
    *nev = 0;
    for (int r = 0; r < CLATTN_R_COUNT; ++r) {
        if (!(held & CLATTN_BIT(r)))
            continue;
        const size_t bytes = clattn_role_elems(sz, (clattn_role)r) * clattn_ocl_role_bytes(r, dtype);
        const clattn_status st = scratch(cl, r, bytes);
        if (st != CLATTN_OK)
            return st;
        t[r].buffer = cl->host_copy.buffer[r];
    }
    /* Events order the copies even on a caller's out-of-order queue. */
    for (int r = 0; r < CLATTN_R_COUNT; ++r) {
        if (!(reads & CLATTN_BIT(r)))
            continue;
        const size_t bytes = clattn_role_elems(sz, (clattn_role)r) * clattn_ocl_role_bytes(r, dtype);
        const cl_int err = clEnqueueWriteBuffer(cl->queue, t[r].buffer, CL_FALSE, 0, bytes,
                                                host[r], 0, NULL, &ev[*nev]);
        if (err != CL_SUCCESS)
            return clattn_ocl_fail(err, "clEnqueueWriteBuffer");
        ++*nev;
    }
    return CLATTN_OK;
}

clattn_status clattn_ocl_run(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                             const clattn_sizes *sz, const void *const host[CLATTN_R_COUNT])
{
    struct clattn_cl_state *cl = ctx->cl;
    kernel_set *set = NULL;
    /* A head_dim the variant refuses or cannot build fails before any copy. */
    clattn_status st = clattn_ocl_check_alloc(cl, sz, s->dtype);
    if (st == CLATTN_OK && !clattn_packed(s)) /* packed: each sequence's, longest first */
        st = clattn_ocl_check_loop_cap(cl, op, s);
    if (st == CLATTN_OK)
        st = clattn_ocl_kernels_of(cl, op, s, &set);
    if (st != CLATTN_OK)
        return st;
    /* Accumulating gradients are read (uploaded) first, then written. */
    const unsigned reads = clattn_call_reads(op, s), writes = clattn_op_writes[op];
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    cl_event ev[CLATTN_R_COUNT], kernels_done = NULL;
    cl_uint nev = 0;
    st = clattn_ocl_upload(cl, s->dtype, sz, reads | writes, reads, host, t, ev, &nev);
    if (st != CLATTN_OK && !nev)
        return st; /* nothing enqueued */
    cl_int err = CL_SUCCESS;
    if (st == CLATTN_OK)
        st = clattn_packed(s) ? clattn_ocl_enqueue_packed(cl, op, s, t, nev, ev, &kernels_done)
                              : clattn_ocl_enqueue_op(cl, cl->queue, op, s, sz, t, nev, ev,
                                                      &kernels_done);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    nev = 0;
    for (int r = 0; r < CLATTN_R_COUNT && st == CLATTN_OK; ++r)
        if (writes & CLATTN_BIT(r)) {
            const size_t bytes =
                clattn_role_elems(sz, (clattn_role)r) * clattn_ocl_role_bytes(r, s->dtype);
            err = clEnqueueReadBuffer(cl->queue, t[r].buffer, CL_FALSE, 0, bytes, (void *)host[r],
                                      1, &kernels_done, &ev[nev]);
            if (err == CL_SUCCESS)
                ++nev;
            else
                st = clattn_ocl_fail(err, "clEnqueueReadBuffer");
        }
    if (nev && (err = clWaitForEvents(nev, ev)) != CL_SUCCESS && st == CLATTN_OK)
        st = clattn_ocl_fail(err, "running the kernels");
    /* Nothing may still touch the caller's pointers once we return. */
    if (st != CLATTN_OK)
        clFinish(cl->queue);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    if (kernels_done)
        clReleaseEvent(kernels_done);
    return st;
}
