/* The gradients that sum over the pairs, on the device: the bias's
 * (clattn_grad_bias, _cl: grad_bias__tree) and the score function's
 * parameters' (clattn_grad_score_params, _cl: grad_score_params__tree),
 * where each runs, their shared Dsum pre-pass and block map, and their
 * results read back to the host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "variant.h"

_Static_assert(CLATTN_SCORE_DP_MAX == 4, "cl/common.cl's SCORE_DP_MAX");

/* Whether the context puts a pair gradient of s on the device, leaving
 * aside whether the kernel fits: where the host cannot (no C forms of the
 * caller's functions), or the context says so (cl->grad_bias_on). */
static int device_wanted(const struct clattn_cl_state *cl, const clattn_shape *s)
{
    const int cpu = cl->owner->backend == CLATTN_BACKEND_OPENCL_CPU;
    return !(clattn_host_forms(s) && (cl->grad_bias_on == GRAD_BIAS_HOST ||
                                      (cl->grad_bias_on == GRAD_BIAS_AUTO && cpu)));
}

/* Whether the device computes dBias for s: where it is wanted, and it
 * can: its work-items loop over the batch elements and heads a slice
 * gathers, BIAS_CHUNK columns at a time (cl/tree/pairs.cl's grad_bias__tree),
 * within the driver's loop cap, and the gradient fits one allocation. */
static int grad_bias_fits(const struct clattn_cl_state *cl, const clattn_shape *s)
{
    if (!device_wanted(cl, s))
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

/* What both gradients' kernels start from: the generic variant's kernels
 * of s with the modifiers `mods`, their buffers and block map, and Dsum
 * (t[R_DSUM], made here) computed after the wait list; *summed gets that
 * pre-pass's event. pairs_end() releases what this made, whatever it
 * returned. */
typedef struct pairs_call {
    kernel_set *set;
    clattn_mod_buffers mb;
    cl_mem dsum;
    cl_event summed;
} pairs_call;

static clattn_status pairs_begin(struct clattn_cl_state *cl, const clattn_shape *s,
                                 const clattn_sizes *sz, unsigned mods, clattn_cl_tensor t[R_ALL],
                                 cl_uint nwait, const cl_event *wait, pairs_call *pc)
{
    memset(pc, 0, sizeof *pc);
    clattn_status st = clattn_ocl_generic_kernels_of(cl, s, mods, &pc->set);
    if (st == CLATTN_OK)
        st = clattn_ocl_make_mods(cl, s, mods, &pc->mb);
    if (st == CLATTN_OK && (mods & CLATTN_MOD_HIDE))
        st = clattn_ocl_mask_map(cl, cl->queue, pc->set, s, &pc->mb, nwait, wait);
    cl_int err = CL_SUCCESS;
    if (st == CLATTN_OK) {
        pc->dsum = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->lse / 2 * sizeof(float),
                                  NULL, &err);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "clCreateBuffer(dsum)");
    }
    if (st == CLATTN_OK) {
        t[R_DSUM].buffer = pc->dsum;
        t[R_DSUM].offset = 0;
        st = clattn_ocl_enqueue_kernel(cl, cl->queue, pc->set, K_DSUM, s, &pc->mb, t, NULL, 1,
                                       nwait, wait, &pc->summed);
    }
    return st;
}

/* Records the kernels that ran (kernel k after the pre-pass), and
 * releases what pairs_begin() made; on failure, after the pre-pass ends. */
static void pairs_end(struct clattn_cl_state *cl, pairs_call *pc, int k, clattn_status st)
{
    if (st == CLATTN_OK) {
        snprintf(cl->owner->kernels, sizeof cl->owner->kernels, "%s,%s",
                 pc->set->function[K_DSUM], pc->set->function[k]);
        snprintf(cl->owner->build_options, sizeof cl->owner->build_options, "%s",
                 pc->set->options[k]);
    }
    if (pc->summed) {
        if (st != CLATTN_OK)
            clWaitForEvents(1, &pc->summed);
        clReleaseEvent(pc->summed);
    }
    if (pc->dsum)
        clReleaseMemObject(pc->dsum);
    clattn_ocl_release_mods(&pc->mb);
}

/* The side of a square work-group of wg work-items (tree.c gives the
 * pair gradients' kernels bias_side() squared). */
static size_t side_of(size_t wg)
{
    size_t side = 1;
    while (side * side < wg)
        ++side;
    return side;
}

/* The Dsum pre-pass, then grad_bias__tree over every BT x BT tile of
 * every slice of the bias, after the wait list; t holds Q, K, V, O, LSE, DO
 * and DBIAS; *done gets the last kernel's event. */
static clattn_status enqueue_grad_bias(struct clattn_cl_state *cl, const clattn_shape *s,
                                       const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                       cl_uint nwait, const cl_event *wait, cl_event *done)
{
    pairs_call pc;
    clattn_status st = pairs_begin(cl, s, sz, clattn_op_modifiers(s, CLATTN_OP_BACKWARD), t,
                                   nwait, wait, &pc);
    kernel_set *set = pc.set;
    const size_t wg = st == CLATTN_OK ? clattn_ocl_work_group(cl, set, K_GRAD_BIAS, s->head_dim)
                                      : 0;
    const size_t local = st == CLATTN_OK ? clattn_ocl_local_bytes(cl, set, K_GRAD_BIAS,
                                                                  s->head_dim)
                                         : 0;
    if (st == CLATTN_OK)
        st = clattn_ocl_check_fits(cl, set, K_GRAD_BIAS, s, wg, local);
    if (st == CLATTN_OK) {
        const size_t side = side_of(wg);
        cl_kernel kn = set->kernel[K_GRAD_BIAS];
        cl_uint arg = 0;
        cl_int err = clattn_ocl_set_args(cl, set, K_GRAD_BIAS, s, &pc.mb, t, &arg);
        err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->batch);
        err |= clSetKernelArg(kn, arg++, local, NULL);
        const size_t slices = clattn_bias_elems(s) / ((size_t)s->q_seq * s->kv_seq);
        const size_t global[3] = {(s->kv_seq + side - 1) / side * side,
                                  (s->q_seq + side - 1) / side * side, slices};
        const size_t lsize[3] = {side, side, 1};
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(cl->queue, kn, 3, NULL, global, lsize, 1, &pc.summed,
                                         done);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "enqueueing grad_bias__tree");
    }
    pairs_end(cl, &pc, K_GRAD_BIAS, st);
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

/* The score parameters' gradient's launch (grad_score_params__tree): a
 * square work-group of `side` rows by keys, `groups` work-groups a slice
 * (batch element, query head) along its query blocks, and its local
 * memory: grad_bias__tree's tiles, each pair's terms, and the table. */
typedef struct params_launch {
    size_t side, groups, local;
} params_launch;

/* The work-groups a call's parameters' gradient spreads over: about
 * PARAMS_GROUPS, the query blocks of a slice allowing (the parts, and the
 * order of their sums, are the shape's and the work-group's side's). */
#define PARAMS_GROUPS 1024u

/* The local memory of a side's work-group with a table of count. */
static size_t params_local(size_t side, size_t count)
{
    return 4 * BIAS_ROW * side * sizeof(float) + BIAS_ALIGN +
           CLATTN_SCORE_DP_MAX * side * side * (sizeof(cl_uint) + sizeof(float)) +
           count * sizeof(float);
}

static params_launch params_launch_of(const clattn_shape *s, size_t side)
{
    params_launch pl;
    pl.side = side;
    const size_t slices = (size_t)s->batch * s->num_heads;
    const size_t blocks = (s->q_seq + side - 1) / side;
    pl.groups = (PARAMS_GROUPS + slices - 1) / slices;
    pl.groups = pl.groups > blocks ? blocks : pl.groups;
    pl.local = params_local(side, s->score_params_count);
    return pl;
}

/* Whether the device computes the score parameters' gradient of s: where
 * it is wanted, the score function's source defines clattn_score_dp, and
 * the kernel can: the table fits the device's local memory beside the
 * tiles (at the side its work-group limit allows, at most 16), the parts
 * one allocation, and its loops the driver's cap. */
static int grad_params_fits(const struct clattn_cl_state *cl, const clattn_shape *s)
{
    if (!device_wanted(cl, s) || !s->score_fn || !strstr(s->score_fn, "clattn_score_dp") ||
        clattn_packed(s))
        return 0;
    size_t side = 16;
    while (side > 1 && side * side > cl->limits.max_wg)
        side >>= 1;
    const params_launch pl = params_launch_of(s, 1);
    const size_t slices = (size_t)s->batch * s->num_heads;
    if (params_local(side, s->score_params_count) + 1024 > cl->limits.local_mem ||
        (cl_ulong)slices * pl.groups * s->score_params_count * sizeof(float) >
            cl->limits.max_alloc)
        return 0;
    if (!cl->limits.loop_cap)
        return 1;
    const uint64_t chunks = (s->head_dim + BIAS_CHUNK - 1u) / BIAS_CHUNK;
    const uint64_t tiles = ((uint64_t)s->kv_seq + 15) / 16;
    const uint64_t blocks = ((uint64_t)s->q_seq + 15) / 16;
    return blocks * tiles * (chunks * (2u * BIAS_CHUNK + 8u) + CLATTN_SCORE_DP_MAX * 256u) <=
           cl->limits.loop_cap;
}

/* The parameters' gradient into host d_params from the device tensors t:
 * the pre-pass and grad_score_params__tree's parts, read back and added
 * in order in float64; d_params untouched where the caller's derivative
 * named too many parameters or one past the table. */
static clattn_status run_grad_params(struct clattn_cl_state *cl, const clattn_shape *s,
                                     const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                     float *d_params, cl_uint nwait, const cl_event *wait)
{
    const size_t count = s->score_params_count;
    pairs_call pc;
    clattn_status st = pairs_begin(cl, s, sz,
                                   clattn_op_modifiers(s, CLATTN_OP_BACKWARD) |
                                       CLATTN_MOD_SCORE_DP,
                                   t, nwait, wait, &pc);
    const size_t wg = st == CLATTN_OK ? clattn_ocl_work_group(cl, pc.set, K_GRAD_PARAMS,
                                                              s->head_dim)
                                      : 1;
    const params_launch pl = params_launch_of(s, side_of(wg));
    const size_t slices = (size_t)s->batch * s->num_heads, nparts = slices * pl.groups;
    if (st == CLATTN_OK)
        st = clattn_ocl_check_fits(cl, pc.set, K_GRAD_PARAMS, s, wg, pl.local);
    float *parts = NULL;
    if (st == CLATTN_OK && !(parts = malloc(nparts * count * sizeof *parts)))
        st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                         "out of host memory for %zu parts of %zu parameters' gradient", nparts,
                         count);
    cl_int err = CL_SUCCESS;
    cl_mem out = NULL, bad = NULL;
    const cl_uint none = 0;
    cl_uint flaw = 0;
    if (st == CLATTN_OK) {
        out = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, nparts * count * sizeof(float),
                             NULL, &err);
        if (err == CL_SUCCESS)
            bad = clCreateBuffer(cl->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                 sizeof none, (void *)&none, &err);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "clCreateBuffer(score parameters' parts)");
    }
    if (st == CLATTN_OK) {
        t[R_DPARAMS].buffer = out;
        t[R_DPARAMS].offset = 0;
        cl_kernel kn = pc.set->kernel[K_GRAD_PARAMS];
        cl_uint arg = 0;
        const cl_uint n = (cl_uint)count;
        err = clattn_ocl_set_args(cl, pc.set, K_GRAD_PARAMS, s, &pc.mb, t, &arg);
        err |= clSetKernelArg(kn, arg++, sizeof n, &n);
        err |= clSetKernelArg(kn, arg++, sizeof bad, &bad);
        err |= clSetKernelArg(kn, arg++, pl.local, NULL);
        const size_t global[2] = {pl.groups * pl.side, slices * pl.side};
        const size_t lsize[2] = {pl.side, pl.side};
        cl_event done = NULL;
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(cl->queue, kn, 2, NULL, global, lsize, 1, &pc.summed,
                                         &done);
        /* both reads blocking: a caller's queue may be out of order */
        if (err == CL_SUCCESS)
            err = clEnqueueReadBuffer(cl->queue, bad, CL_TRUE, 0, sizeof flaw, &flaw, 1, &done,
                                      NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueReadBuffer(cl->queue, out, CL_TRUE, 0, nparts * count * sizeof(float),
                                      parts, 1, &done, NULL);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "enqueueing grad_score_params__tree or reading its parts");
        if (done)
            clReleaseEvent(done);
    }
    if (st == CLATTN_OK && flaw)
        st = clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                         "clattn_score_dp gave more than %d indices or one past the %zu "
                         "parameters; d_params is left as it was",
                         CLATTN_SCORE_DP_MAX, count);
    for (size_t i = 0; i < count && st == CLATTN_OK; ++i) {
        double sum = 0.0;
        for (size_t p = 0; p < nparts; ++p)
            sum += parts[p * count + i];
        d_params[i] = (s->accumulate ? d_params[i] : 0.0f) + (float)sum;
    }
    if (st != CLATTN_OK)
        clFinish(cl->queue); /* nothing of the call still runs once it returns */
    pairs_end(cl, &pc, K_GRAD_PARAMS, st);
    if (out)
        clReleaseMemObject(out);
    if (bad)
        clReleaseMemObject(bad);
    free(parts);
    return st;
}

/* The device tensors of host arrays in[] (q, k, v, o, lse, d_out) in t,
 * copied through the context's scratch buffers; their events in ev. */
static clattn_status upload_pairs(struct clattn_cl_state *cl, const clattn_shape *s,
                                  const clattn_sizes *sz, const void *const in[6],
                                  clattn_cl_tensor t[R_ALL], cl_event ev[CLATTN_R_COUNT],
                                  cl_uint *nev)
{
    static const int roles[6] = {CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V,
                                 CLATTN_R_O, CLATTN_R_LSE, CLATTN_R_DO};
    const void *host[CLATTN_R_COUNT] = {NULL};
    unsigned held = 0;
    for (int i = 0; i < 6; ++i) {
        host[roles[i]] = in[i];
        held |= CLATTN_BIT(roles[i]);
    }
    memset(t, 0, R_ALL * sizeof *t);
    clattn_status st = clattn_ocl_upload(cl, s->dtype, sz, held, held, host, t, ev, nev);
    if (st != CLATTN_OK)
        clFinish(cl->queue);
    return st;
}

/* Whether the device takes gradient `which` of s, and running it there. */
static int pair_fits(const struct clattn_cl_state *cl, pair_grad which, const clattn_shape *s)
{
    return which == PAIR_PARAMS ? grad_params_fits(cl, s) : grad_bias_fits(cl, s);
}

static clattn_status run_pair(struct clattn_cl_state *cl, pair_grad which, const clattn_shape *s,
                              const clattn_sizes *sz, clattn_cl_tensor t[R_ALL], float *out,
                              cl_uint nwait, const cl_event *wait)
{
    return which == PAIR_PARAMS ? run_grad_params(cl, s, sz, t, out, nwait, wait)
                                : run_grad_bias(cl, s, sz, t, out, nwait, wait);
}

int clattn_ocl_pair_grad(struct clattn_cl_state *cl, pair_grad which, const clattn_shape *s,
                         const clattn_sizes *sz, clattn_cl_tensor t[R_ALL], float *out,
                         cl_uint nwait, const cl_event *wait, clattn_status *st)
{
    if (!pair_fits(cl, which, s))
        return 0;
    *st = run_pair(cl, which, s, sz, t, out, nwait, wait);
    return 1;
}

/* The backend's grad_bias and grad_score_params: from host arrays,
 * through the scratch buffers. */
static int pairs_host(clattn_context *ctx, pair_grad which, const clattn_shape *s,
                      const clattn_sizes *sz, const void *const in[6], float *out,
                      clattn_status *st)
{
    struct clattn_cl_state *cl = ctx->cl;
    if (!pair_fits(cl, which, s) || clattn_ocl_check_alloc(cl, sz, s->dtype) != CLATTN_OK)
        return 0;
    clattn_cl_tensor t[R_ALL];
    cl_event ev[CLATTN_R_COUNT];
    cl_uint nev = 0;
    *st = upload_pairs(cl, s, sz, in, t, ev, &nev);
    if (*st == CLATTN_OK)
        *st = run_pair(cl, which, s, sz, t, out, nev, ev);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    return 1;
}

int clattn_ocl_grad_bias_host(clattn_context *ctx, const clattn_shape *s, const clattn_sizes *sz,
                              const void *const in[6], float *d_bias, clattn_status *st)
{
    return pairs_host(ctx, PAIR_BIAS, s, sz, in, d_bias, st);
}

int clattn_ocl_grad_params_host(clattn_context *ctx, const clattn_shape *s,
                                const clattn_sizes *sz, const void *const in[6], float *d_params,
                                clattn_status *st)
{
    return pairs_host(ctx, PAIR_PARAMS, s, sz, in, d_params, st);
}
