/* The bias's gradient on the device (clattn_grad_bias, _cl): where it
 * runs, the generic variant's Dsum pre-pass and grad_bias__tree, and the
 * gradient read back to the host. */
#include <stdio.h>
#include <string.h>

#include "variant.h"

/* Whether the device computes dBias for s: where the host cannot, or the
 * context says so (cl->grad_bias_on), and it can: its work-items loop over
 * the batch elements and heads a slice gathers, BIAS_CHUNK columns at a
 * time (cl/tree.cl's grad_bias__tree), within the driver's loop cap, and
 * the gradient fits one allocation. */
static int grad_bias_fits(const struct clattn_cl_state *cl, const clattn_shape *s)
{
    const int cpu = cl->owner->backend == CLATTN_BACKEND_OPENCL_CPU;
    if (clattn_host_forms(s) &&
        (cl->grad_bias_on == GRAD_BIAS_HOST || (cl->grad_bias_on == GRAD_BIAS_AUTO && cpu)))
        return 0;
    if ((cl_ulong)clattn_bias_elems(s) * sizeof(float) > cl->limits.max_alloc)
        return 0;
    if (!cl->limits.loop_cap)
        return 1;
    const uint64_t gathered = (uint64_t)(s->bias_batch > 1 ? 1u : s->batch) *
                              (s->bias_heads > 1 ? 1u : s->num_heads);
    const uint64_t chunks = (s->head_dim + BIAS_CHUNK - 1u) / BIAS_CHUNK;
    return gathered * chunks * (2u * BIAS_CHUNK + 8u) <= cl->limits.loop_cap;
}

/* The Dsum pre-pass, then grad_bias__tree over every BT x BT tile of
 * every slice of the bias, after the wait list; t holds Q, K, V, O, LSE, DO
 * and DBIAS; *done gets the last kernel's event. */
static clattn_status enqueue_grad_bias(struct clattn_cl_state *cl, const clattn_shape *s,
                                       const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                       cl_uint nwait, const cl_event *wait, cl_event *done)
{
    const unsigned mods = clattn_op_modifiers(s, CLATTN_OP_BACKWARD);
    kernel_set *set = NULL;
    clattn_mod_buffers mb;
    memset(&mb, 0, sizeof mb);
    clattn_status st = clattn_ocl_generic_kernels_of(cl, s, mods, &set);
    if (st == CLATTN_OK)
        st = clattn_ocl_make_mods(cl, s, mods, &mb);
    if (st == CLATTN_OK && (mods & CLATTN_MOD_HIDE))
        st = clattn_ocl_mask_map(cl, cl->queue, set, s, &mb, nwait, wait);
    cl_int err = CL_SUCCESS;
    cl_mem dsum = NULL;
    if (st == CLATTN_OK) {
        dsum = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->lse / 2 * sizeof(float), NULL,
                              &err);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "clCreateBuffer(dsum)");
    }
    cl_event summed = NULL;
    if (st == CLATTN_OK) {
        t[R_DSUM].buffer = dsum;
        t[R_DSUM].offset = 0;
        st = clattn_ocl_enqueue_kernel(cl, cl->queue, set, K_DSUM, s, &mb, t, NULL, 1, nwait,
                                       wait, &summed);
    }
    const size_t wg = st == CLATTN_OK ? clattn_ocl_work_group(cl, set, K_GRAD_BIAS, s->head_dim)
                                      : 0;
    const size_t local = st == CLATTN_OK ? clattn_ocl_local_bytes(cl, set, K_GRAD_BIAS,
                                                                  s->head_dim)
                                         : 0;
    if (st == CLATTN_OK)
        st = clattn_ocl_check_fits(cl, set, K_GRAD_BIAS, s, wg, local);
    if (st == CLATTN_OK) {
        size_t side = 1;
        while (side * side < wg)
            ++side;
        cl_kernel kn = set->kernel[K_GRAD_BIAS];
        cl_uint arg = 0;
        err = clattn_ocl_set_args(cl, set, K_GRAD_BIAS, s, &mb, t, &arg);
        err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->batch);
        err |= clSetKernelArg(kn, arg++, local, NULL);
        const size_t slices = clattn_bias_elems(s) / ((size_t)s->q_seq * s->kv_seq);
        const size_t global[3] = {(s->kv_seq + side - 1) / side * side,
                                  (s->q_seq + side - 1) / side * side, slices};
        const size_t lsize[3] = {side, side, 1};
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(cl->queue, kn, 3, NULL, global, lsize, 1, &summed, done);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "enqueueing grad_bias__tree");
    }
    if (st == CLATTN_OK) {
        snprintf(cl->owner->kernels, sizeof cl->owner->kernels, "%s,%s", set->function[K_DSUM],
                 set->function[K_GRAD_BIAS]);
        snprintf(cl->owner->build_options, sizeof cl->owner->build_options, "%s",
                 set->options[K_GRAD_BIAS]);
    }
    if (summed) {
        if (st != CLATTN_OK)
            clWaitForEvents(1, &summed);
        clReleaseEvent(summed);
    }
    if (dsum)
        clReleaseMemObject(dsum);
    clattn_ocl_release_mods(&mb);
    return st;
}

/* dBias into host d_bias from the device tensors t, read back once
 * written (uploaded first under accumulate). */
static clattn_status run_grad_bias(struct clattn_cl_state *cl, const clattn_shape *s,
                                   const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                   float *d_bias, cl_uint nwait, const cl_event *wait)
{
    const size_t bytes = clattn_bias_elems(s) * sizeof(float);
    cl_int err;
    cl_mem out = clCreateBuffer(cl->context,
                                CL_MEM_READ_WRITE | (s->accumulate ? CL_MEM_COPY_HOST_PTR : 0),
                                bytes, s->accumulate ? d_bias : NULL, &err);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clCreateBuffer(d_bias)");
    t[R_DBIAS].buffer = out;
    t[R_DBIAS].offset = 0;
    cl_event done = NULL;
    clattn_status st = enqueue_grad_bias(cl, s, sz, t, nwait, wait, &done);
    if (st == CLATTN_OK &&
        (err = clEnqueueReadBuffer(cl->queue, out, CL_TRUE, 0, bytes, d_bias, 1, &done, NULL)) !=
            CL_SUCCESS)
        st = clattn_ocl_fail(err, "clEnqueueReadBuffer(d_bias)");
    if (st != CLATTN_OK)
        clFinish(cl->queue); /* nothing of the call still runs once it returns */
    if (done)
        clReleaseEvent(done);
    clReleaseMemObject(out);
    return st;
}

int clattn_ocl_grad_bias(struct clattn_cl_state *cl, const clattn_shape *s,
                         const clattn_sizes *sz, clattn_cl_tensor t[R_ALL], float *d_bias,
                         cl_uint nwait, const cl_event *wait, clattn_status *st)
{
    if (!grad_bias_fits(cl, s))
        return 0;
    *st = run_grad_bias(cl, s, sz, t, d_bias, nwait, wait);
    return 1;
}

int clattn_ocl_grad_bias_host(clattn_context *ctx, const clattn_shape *s, const clattn_sizes *sz,
                              const void *const in[6], float *d_bias, clattn_status *st)
{
    struct clattn_cl_state *cl = ctx->cl;
    if (!grad_bias_fits(cl, s) || clattn_ocl_check_alloc(cl, sz, s->dtype) != CLATTN_OK)
        return 0;
    static const int roles[6] = {CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V,
                                 CLATTN_R_O, CLATTN_R_LSE, CLATTN_R_DO};
    const void *host[CLATTN_R_COUNT] = {NULL};
    unsigned held = 0;
    for (int i = 0; i < 6; ++i) {
        host[roles[i]] = in[i];
        held |= CLATTN_BIT(roles[i]);
    }
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    cl_event ev[CLATTN_R_COUNT];
    cl_uint nev = 0;
    *st = clattn_ocl_upload(cl, s->dtype, sz, held, held, host, t, ev, &nev);
    if (*st == CLATTN_OK)
        *st = run_grad_bias(cl, s, sz, t, d_bias, nev, ev);
    else
        clFinish(cl->queue);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    return 1;
}
