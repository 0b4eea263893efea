/* Launching kernels: each kernel's arguments and grid, and an op's kernels
 * in order (host.c copies host pointers through to them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"
#include "variant.h"

/* The kernels of each op, in order; -1 ends a list. The backward runs
 * GRAD_KV where a variant has it, else GRAD_K and GRAD_V. */
static const int op_plans[CLATTN_OP_COUNT][5] = {
    [CLATTN_OP_FORWARD] = {K_FORWARD, -1},
    [CLATTN_OP_GRAD_V] = {K_GRAD_V, -1},
    [CLATTN_OP_GRAD_Q] = {K_DSUM, K_GRAD_Q, -1},
    [CLATTN_OP_GRAD_K] = {K_DSUM, K_GRAD_K, -1},
    [CLATTN_OP_BACKWARD] = {K_DSUM, K_GRAD_KV, K_GRAD_Q, -1},
};
static const int backward_unfused[5] = {K_DSUM, K_GRAD_K, K_GRAD_V, K_GRAD_Q, -1};
/* The single-pass backward, where a variant has it for the call (mma's
 * 16-bit kernels): DQ32 is zeroed before GRAD_KVQ. */
static const int backward_single[5] = {K_DSUM, K_GRAD_KVQ, K_FINISH_DQ, -1};
/* Where the dS scratch serves (ds_chunk: tiled's micro-tiles, mma's
 * float32): dQ from the key side's dS, GRAD_KVS and GRAD_QS by chunks. */
static const int backward_ds[5] = {K_DSUM, K_GRAD_KVS, K_GRAD_QS, -1};

size_t clattn_ocl_role_bytes(int r, clattn_dtype dtype)
{
    return r == R_DSUM ? sizeof(float) : clattn_role_bytes(r, dtype);
}

clattn_status clattn_ocl_check_alloc(const struct clattn_cl_state *cl, const clattn_sizes *sz,
                                     clattn_dtype dtype)
{
    const size_t largest = sz->q > sz->kv ? sz->q : sz->kv;
    const size_t bytes = largest * clattn_ocl_role_bytes(CLATTN_R_Q, dtype);
    if ((cl_ulong)bytes > cl->limits.max_alloc || sz->lse * sizeof(float) > cl->limits.max_alloc)
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
                           "a tensor of %zu bytes exceeds the device's largest allocation, "
                           "%llu bytes",
                           bytes, (unsigned long long)cl->limits.max_alloc);
    return CLATTN_OK;
}

cl_int clattn_ocl_set_args(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                           const clattn_shape *s, const clattn_mod_buffers *mb,
                           const clattn_cl_tensor t[R_ALL], cl_uint *next)
{
    const kernel_desc *kd = &clattn_ocl_kernel_descs[k];
    cl_kernel kn = set->kernel[k];
    cl_uint arg = 0;
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < kd->nroles; ++i) {
        const clattn_cl_tensor *x = &t[kd->roles[i]];
        cl_ulong off = x->offset;
        err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &x->buffer);
        err |= clSetKernelArg(kn, arg++, sizeof off, &off);
    }
    cl_int causal = clattn_mask_right(s);
    cl_float scale = clattn_effective_scale(s);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->q_seq);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->kv_seq);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->num_heads);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->num_kv_heads);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->head_dim);
    err |= clSetKernelArg(kn, arg++, sizeof causal, &causal);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->window);
    cl_long delta = clattn_mask_delta(s);
    cl_int accumulate = s->accumulate ? 1 : 0;
    err |= clSetKernelArg(kn, arg++, sizeof delta, &delta);
    err |= clSetKernelArg(kn, arg++, sizeof scale, &scale);
    err |= clSetKernelArg(kn, arg++, sizeof accumulate, &accumulate);
    /* the score modifiers' (cl/common.cl's MOD_ARGS) */
    const clattn_dropout drop = clattn_dropout_of(s->dropout_p, s->dropout_seed,
                                                  s->dropout_offset);
    const cl_float softcap = s->softcap;
    const cl_uint kv_pos0 = s->kv_offset, seq0 = cl->owner->seq_base;
    err |= clSetKernelArg(kn, arg++, sizeof softcap, &softcap);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &mb->slopes);
    err |= clSetKernelArg(kn, arg++, sizeof kv_pos0, &kv_pos0);
    err |= clSetKernelArg(kn, arg++, sizeof seq0, &seq0);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &drop.key[0]);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &drop.key[1]);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &drop.threshold);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_float), &drop.gain);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &mb->blocks);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &mb->bias);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &mb->bool_mask);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &mb->bias_dims);
    *next = arg;
    return err;
}

clattn_status clattn_ocl_check_fits(const struct clattn_cl_state *cl, const kernel_set *set,
                                    int k, const clattn_shape *s, size_t wg, size_t local)
{
    if (wg > set->max_wg[k] || set->local_mem[k] + local > cl->limits.local_mem)
        return clattn_fail(CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
                           "head_dim %u needs work-groups of %zu with %zu bytes of local "
                           "memory; the device runs at most %zu and has %llu bytes",
                           s->head_dim, wg, local, set->max_wg[k],
                           (unsigned long long)cl->limits.local_mem);
    return CLATTN_OK;
}

clattn_status clattn_ocl_enqueue_kernel(struct clattn_cl_state *cl, cl_command_queue queue,
                                        const kernel_set *set, int k, const clattn_shape *s,
                                        const clattn_mod_buffers *mb,
                                        const clattn_cl_tensor t[R_ALL], const grid_part *part,
                                        size_t parts, cl_uint nwait, const cl_event *wait,
                                        cl_event *done)
{
    const kernel_desc *kd = &clattn_ocl_kernel_descs[k];
    cl_kernel kn = set->kernel[k];
    const size_t wg = clattn_ocl_work_group(cl, set, k, s->head_dim);
    const size_t local = clattn_ocl_local_bytes(cl, set, k, s->head_dim);
    clattn_status st = clattn_ocl_check_fits(cl, set, k, s, wg, local);
    if (st != CLATTN_OK)
        return st;
    cl_uint arg = 0;
    cl_int err = clattn_ocl_set_args(cl, set, k, s, mb, t, &arg);
    err |= clSetKernelArg(kn, arg++, local, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail(CLATTN_ERROR_OPENCL, "clSetKernelArg failed for kernel %d", k);
    const size_t rows = kd->key_rows ? s->kv_seq : s->q_seq;
    const size_t heads = kd->key_rows ? s->num_kv_heads : s->num_heads;
    const size_t groups = set->family[k]->row_groups(cl, set, k, s, rows);
    size_t global[3] = {parts * groups * wg, heads, s->batch}, offset[3] = {0, 0, 0};
    size_t lsize[3] = {wg, 1, 1};
    if (part) {
        const size_t per = kd->key_rows ? 1 : s->num_heads / s->num_kv_heads;
        offset[1] = part->kv_head0 * per;
        global[1] = part->kv_heads * per;
        offset[2] = part->b0;
        global[2] = part->nb;
    }
    err = clEnqueueNDRangeKernel(queue, kn, 3, part ? offset : NULL, global, lsize, nwait,
                                 nwait ? wait : NULL, done);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clEnqueueNDRangeKernel");
    return CLATTN_OK;
}

/* Where the driver ends work-items after cl->limits.loop_cap loop iterations: a
 * bound on any kernel's, four passes over head_dim per row of the other
 * side that a work-item visits (keys for the query-side kernels, queries of
 * the whole head group for the key side), with 64 rows more for the second
 * block a causal work-group takes; a call past it is refused rather than
 * cut short. tiled's key side comes closest to it. */
clattn_status clattn_ocl_check_loop_cap(const struct clattn_cl_state *cl, clattn_op op,
                                        const clattn_shape *s)
{
    if (!cl->limits.loop_cap)
        return CLATTN_OK;
    const uint64_t keys = s->kv_seq;
    const uint64_t queries = (uint64_t)s->q_seq * (s->num_heads / s->num_kv_heads);
    const uint64_t rows = op == CLATTN_OP_FORWARD || op == CLATTN_OP_GRAD_Q ? keys
                          : op == CLATTN_OP_GRAD_V                         ? queries
                          : keys > queries                                 ? keys
                                                                           : queries;
    /* Each row costs a few loop steps whatever head_dim: counted as at
     * least 2 columns (at head_dim 1, llvmpipe cut calls from about 10,800
     * rows that 1 would let through). */
    const uint64_t loops = 4u * (rows + 64u) * (s->head_dim < 2 ? 2u : s->head_dim);
    if (loops <= cl->limits.loop_cap)
        return CLATTN_OK;
    return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
                       "this driver (Mesa's llvmpipe) ends a work-item after %lu loop "
                       "iterations and keeps what it wrote so far; this call's work-items may "
                       "run about %llu (%llu rows of head_dim %u): use a shorter sequence or "
                       "chunks merged by clattn_merge, or another device",
                       cl->limits.loop_cap, (unsigned long long)loops, (unsigned long long)rows,
                       s->head_dim);
}

/* The dS scratch's chunk for a backward: the most batch elements and KV
 * heads whose dS (group query heads a KV head, q_seq by kv_seq floats
 * each) fit cl->ds.max and the device's largest allocation; whole KV heads
 * of one batch element where not all of them fit. nb 0: no dS scratch, for
 * a variant without GRAD_KVS, a bound of 0, a KV head whose dS alone is
 * past it, or a queue other than the context's (packed sequences' queues
 * run at once and cannot share the scratch). */
static grid_part ds_chunk(const struct clattn_cl_state *cl, clattn_op op, const clattn_shape *s,
                          const kernel_set *set, cl_command_queue queue)
{
    grid_part c = {0, 0, 0, 0};
    if (op != CLATTN_OP_BACKWARD || !set->kernel[K_GRAD_KVS] || !set->kernel[K_GRAD_QS] ||
        queue != cl->queue)
        return c;
    const uint64_t asked = cl->ds.max == DS_DEFAULT ? cl->limits.global_mem / 16 : cl->ds.max;
    const uint64_t bound = asked < cl->limits.max_alloc ? asked : cl->limits.max_alloc;
    const uint64_t slab = (uint64_t)(s->num_heads / s->num_kv_heads) * s->q_seq * s->kv_seq *
                          sizeof(float);
    if (!slab || slab > bound)
        return c;
    const uint64_t slabs = bound / slab;
    c.kv_heads = slabs < s->num_kv_heads ? (size_t)slabs : s->num_kv_heads;
    const uint64_t whole = slabs / s->num_kv_heads;
    c.nb = whole > 1 ? (whole < s->batch ? (size_t)whole : s->batch) : 1;
    return c;
}

static size_t ds_bytes(const clattn_shape *s, const grid_part *c)
{
    return c->nb * c->kv_heads * (size_t)(s->num_heads / s->num_kv_heads) * s->q_seq * s->kv_seq *
           sizeof(float);
}

/* Makes sure a scratch buffer (the dS scratch, the key side's parts)
 * holds bytes, `what` naming it in a failure. A larger one replaces it:
 * OpenCL keeps the old until the kernels using it end. */
static clattn_status grow(struct clattn_cl_state *cl, cl_mem *buffer, size_t *have, size_t bytes,
                          const char *what)
{
    if (*have >= bytes)
        return CLATTN_OK;
    if (*buffer)
        clReleaseMemObject(*buffer);
    *have = 0;
    cl_int err;
    *buffer = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        *buffer = NULL;
        return clattn_ocl_fail(err, what);
    }
    *have = bytes;
    return CLATTN_OK;
}

/* The parts a key-side kernel k splits into for a call: the variant's
 * choice, where the set can add them up; 1 on a queue other than the
 * context's (packed sequences' queues run at once and cannot share the
 * scratch). */
static size_t key_parts(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                        const clattn_shape *s, cl_command_queue queue)
{
    const clattn_ocl_variant *f = set->family[k];
    if ((k != K_GRAD_KV && k != K_GRAD_KVS) || queue != cl->queue || !set->kernel[K_SUM_PARTS] ||
        !f->key_parts)
        return 1;
    const size_t parts = f->key_parts(cl, set, k, s);
    return parts ? parts : 1;
}

/* Key-side kernel k (any other kernel as clattn_ocl_enqueue_kernel runs it); split
 * into parts where key_parts says so: each part adds the steps (query
 * tiles of the group's heads) of its share into float32 dK and dV of its
 * own in the parts scratch, and SUM_PARTS adds the parts up in their order
 * into dK and dV, so that the result does not depend on which part runs
 * first. *done gets the last kernel's event. */
static clattn_status enqueue_key_side(struct clattn_cl_state *cl, cl_command_queue queue,
                                      const kernel_set *set, int k, const clattn_shape *s,
                                      const clattn_mod_buffers *mb,
                                      const clattn_cl_tensor t[R_ALL], const grid_part *part,
                                      cl_uint nwait, const cl_event *wait, cl_event *done)
{
    const size_t parts = key_parts(cl, set, k, s, queue);
    if (parts <= 1)
        return clattn_ocl_enqueue_kernel(cl, queue, set, k, s, mb, t, part, 1, nwait, wait, done);
    const size_t elems = (size_t)s->batch * s->kv_seq * s->num_kv_heads * s->head_dim;
    const size_t bytes = 2 * parts * elems * sizeof(float);
    if (bytes > cl->limits.max_alloc)
        return clattn_ocl_enqueue_kernel(cl, queue, set, k, s, mb, t, part, 1, nwait, wait, done);
    clattn_status st = grow(cl, &cl->parts.buffer, &cl->parts.bytes, bytes,
                            "clCreateBuffer(the key side's parts)");
    if (st != CLATTN_OK)
        return st;
    cl_event *waits = malloc((nwait + 1u) * sizeof *waits);
    if (!waits)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    cl_uint n = 0;
    for (cl_uint i = 0; i < nwait; ++i)
        waits[n++] = wait[i];
    if (cl->parts.last_read)
        waits[n++] = cl->parts.last_read;
    clattn_cl_tensor sub[R_ALL];
    memcpy(sub, t, sizeof sub);
    const size_t elem = clattn_ocl_role_bytes(CLATTN_R_DK, s->dtype);
    sub[R_PARTS_K].buffer = sub[R_PARTS_V].buffer = cl->parts.buffer;
    sub[R_PARTS_K].offset = 0;
    sub[R_PARTS_V].offset = parts * elems; /* floats */
    clattn_cl_tensor into[R_ALL];
    memcpy(into, sub, sizeof into);
    into[CLATTN_R_DK] = sub[R_PARTS_K]; /* the kernel's dK and dV, in its elements */
    into[CLATTN_R_DV].buffer = cl->parts.buffer;
    into[CLATTN_R_DV].offset = parts * elems * sizeof(float) / elem;
    cl_event first = NULL;
    st = clattn_ocl_enqueue_kernel(cl, queue, set, k, s, mb, into, part, parts, n,
                                   n ? waits : NULL, &first);
    free(waits);
    if (st != CLATTN_OK)
        return st;
    cl_event summed = NULL;
    st = clattn_ocl_enqueue_kernel(cl, queue, set, K_SUM_PARTS, s, mb, sub, part, parts, 1,
                                   &first, &summed);
    if (st != CLATTN_OK)
        clWaitForEvents(1, &first); /* no part may still write the scratch a later call takes */
    clReleaseEvent(first);
    if (st != CLATTN_OK)
        return st;
    if (cl->parts.last_read)
        clReleaseEvent(cl->parts.last_read);
    cl->parts.last_read = NULL;
    if (clRetainEvent(summed) == CL_SUCCESS)
        cl->parts.last_read = summed;
    else
        clWaitForEvents(1, &summed);
    cl->parts.ran = 1;
    *done = summed;
    return CLATTN_OK;
}

/* GRAD_KVS then GRAD_QS for each chunk of the batch elements and KV heads
 * (first), each after the one before, the first after prev and the last
 * reader of the scratch before this call; *done gets the last one's event,
 * which the scratch's next writer waits for. */
static clattn_status enqueue_ds_chunks(struct clattn_cl_state *cl, cl_command_queue queue,
                                       const kernel_set *set, const clattn_shape *s,
                                       const clattn_mod_buffers *mb, const clattn_cl_tensor t[R_ALL],
                                       const grid_part *first, cl_event prev, cl_event *done)
{
    clattn_status st = CLATTN_OK;
    cl_event last = NULL;
    for (size_t b0 = 0; b0 < s->batch && st == CLATTN_OK; b0 += first->nb)
        for (size_t h0 = 0; h0 < s->num_kv_heads && st == CLATTN_OK; h0 += first->kv_heads) {
            grid_part c = *first;
            c.b0 = b0;
            c.nb = b0 + c.nb > s->batch ? s->batch - b0 : c.nb;
            c.kv_head0 = h0;
            c.kv_heads = h0 + c.kv_heads > s->num_kv_heads ? s->num_kv_heads - h0 : c.kv_heads;
            for (int k = K_GRAD_KVS; k <= K_GRAD_QS && st == CLATTN_OK; ++k) {
                cl_event wait[2], ev = NULL;
                cl_uint n = 0;
                if (last)
                    wait[n++] = last;
                else {
                    if (prev)
                        wait[n++] = prev;
                    if (cl->ds.last_read)
                        wait[n++] = cl->ds.last_read;
                }
                st = enqueue_key_side(cl, queue, set, k, s, mb, t, &c, n, wait, &ev);
                if (last)
                    clReleaseEvent(last);
                last = st == CLATTN_OK ? ev : NULL;
            }
        }
    if (st != CLATTN_OK) {
        if (last)
            clReleaseEvent(last);
        return st;
    }
    if (cl->ds.last_read)
        clReleaseEvent(cl->ds.last_read);
    /* The next call's first writer of the scratch waits for its last reader;
     * where the event cannot be kept, the reader is waited for now. */
    if (clRetainEvent(last) == CL_SUCCESS) {
        cl->ds.last_read = last;
    } else {
        cl->ds.last_read = NULL;
        clWaitForEvents(1, &last);
    }
    *done = last;
    return CLATTN_OK;
}

clattn_status clattn_ocl_enqueue_op(struct clattn_cl_state *cl, cl_command_queue queue,
                                    clattn_op op, const clattn_shape *s,
                                    const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                    cl_uint nwait, const cl_event *wait, cl_event *done)
{
    kernel_set *set = NULL;
    clattn_status st = clattn_ocl_check_loop_cap(cl, op, s);
    if (st == CLATTN_OK)
        st = clattn_ocl_kernels_of(cl, op, s, &set);
    const unsigned mods = clattn_op_modifiers(s, op);
    clattn_mod_buffers mb;
    memset(&mb, 0, sizeof mb);
    if (st == CLATTN_OK)
        st = clattn_ocl_make_mods(cl, s, mods, &mb);
    if (st == CLATTN_OK && (mods & CLATTN_MOD_HIDE))
        st = clattn_ocl_mask_map(cl, queue, set, s, &mb, nwait, wait);
    if (st != CLATTN_OK) {
        clattn_ocl_release_mods(&mb);
        return st;
    }
    /* The single pass, built only where CLATTN_MMA_SINGLE asks for it. Its
     * float32 dQ is as large as dQ's elements in float32: where that exceeds
     * the device's largest allocation, two passes. */
    const int single = op == CLATTN_OP_BACKWARD && set->kernel[K_GRAD_KVQ] &&
                       (cl_ulong)sz->q * sizeof(float) <= cl->limits.max_alloc;
    const grid_part chunk = ds_chunk(cl, op, s, set, queue);
    const int *plan = single                                                ? backward_single
                      : chunk.nb                                            ? backward_ds
                      : op == CLATTN_OP_BACKWARD && !set->kernel[K_GRAD_KV] ? backward_unfused
                                                                            : op_plans[op];
    cl_mem dsum = NULL, dq32 = NULL;
    cl_event zeroed = NULL;
    /* A caller's Dsum (packed sequences share one) is used as given. */
    if (plan[0] == K_DSUM && !t[R_DSUM].buffer) {
        /* Released at once: OpenCL keeps it until the kernels using it end. */
        cl_int err;
        dsum =
            clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->lse / 2 * sizeof(float), NULL, &err);
        if (err != CL_SUCCESS) {
            clattn_ocl_release_mods(&mb);
            return clattn_ocl_fail(err, "clCreateBuffer(dsum)");
        }
        t[R_DSUM].buffer = dsum;
        t[R_DSUM].offset = 0;
    }
    if (single) { /* the float32 dQ, zeroed ahead of GRAD_KVQ; released as dsum is */
        cl_int err;
        const cl_float zero = 0.0f;
        dq32 = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->q * sizeof(float), NULL, &err);
        if (err == CL_SUCCESS) {
            err = clEnqueueFillBuffer(queue, dq32, &zero, sizeof zero, 0, sz->q * sizeof(float),
                                      0, NULL, &zeroed);
            if (err != CL_SUCCESS)
                clReleaseMemObject(dq32);
        }
        if (err != CL_SUCCESS) {
            if (dsum)
                clReleaseMemObject(dsum);
            clattn_ocl_release_mods(&mb);
            return clattn_ocl_fail(err,
                                   dq32 ? "clEnqueueFillBuffer(dq32)" : "clCreateBuffer(dq32)");
        }
        t[R_DQ32].buffer = dq32;
        t[R_DQ32].offset = 0;
    }
    if (chunk.nb && st == CLATTN_OK) {
        st = grow(cl, &cl->ds.buffer, &cl->ds.bytes, ds_bytes(s, &chunk),
                  "clCreateBuffer(dS scratch)");
        t[R_DS].buffer = cl->ds.buffer;
        t[R_DS].offset = 0;
    }
    cl_event prev = NULL;
    cl->parts.ran = 0;
    for (int i = 0; plan[i] >= 0 && st == CLATTN_OK; ++i) {
        cl_event ev = NULL;
        if (plan[i] == K_GRAD_KVQ) { /* after the zeroing too */
            const cl_event both[2] = {prev, zeroed};
            st = clattn_ocl_enqueue_kernel(cl, queue, set, plan[i], s, &mb, t, NULL, 1, 2, both,
                                           &ev);
        } else if (plan[i] == K_GRAD_KVS) { /* by chunks, each GRAD_KVS then GRAD_QS */
            st = enqueue_ds_chunks(cl, queue, set, s, &mb, t, &chunk, prev, &ev);
            ++i; /* GRAD_QS ran too */
        } else {
            st = prev ? enqueue_key_side(cl, queue, set, plan[i], s, &mb, t, NULL, 1, &prev, &ev)
                      : enqueue_key_side(cl, queue, set, plan[i], s, &mb, t, NULL, nwait, wait,
                                         &ev);
        }
        if (prev)
            clReleaseEvent(prev);
        prev = ev;
    }
    if (zeroed) {
        if (st != CLATTN_OK)
            clWaitForEvents(1, &zeroed); /* nothing else may still use dq32 */
        clReleaseEvent(zeroed);
    }
    if (dq32)
        clReleaseMemObject(dq32);
    if (dsum)
        clReleaseMemObject(dsum);
    clattn_ocl_release_mods(&mb);
    if (st == CLATTN_OK) {
        char *ran = cl->owner->kernels, *options = cl->owner->build_options;
        ran[0] = options[0] = '\0';
        for (int i = 0; plan[i] >= 0; ++i) {
            snprintf(ran + strlen(ran), sizeof cl->owner->kernels - strlen(ran), "%s%s",
                     i ? "," : "", set->function[plan[i]]);
            snprintf(options + strlen(options), sizeof cl->owner->build_options - strlen(options),
                     "%s%s", i ? "; " : "", set->options[plan[i]]);
        }
        if (cl->parts.ran)
            snprintf(ran + strlen(ran), sizeof cl->owner->kernels - strlen(ran), ",%s",
                     set->function[K_SUM_PARTS]);
    }
    if (st == CLATTN_OK && done)
        *done = prev;
    else if (prev)
        clReleaseEvent(prev);
    return st;
}

/* The queues packed sequences spread over, created on first use: NVIDIA's
 * OpenCL runs each in-order queue as a stream of its own, so kernels of
 * short sequences run beside each other rather than one after another.
 * None on CPU devices, whose kernels each take every core already (and
 * PoCL 3.1 was seen to fail an assertion, pocl_release_dlhandle_cache's,
 * with kernels in flight on several queues), or where the device refuses
 * more queues: then the context's. */
static cl_uint packed_queues(struct clattn_cl_state *cl)
{
    if (cl->owner->backend == CLATTN_BACKEND_OPENCL_CPU)
        return 0;
    for (cl_uint i = 0; i < PACKED_QUEUES; ++i) {
        if (cl->packed_queues[i])
            continue;
        cl_int err;
        cl->packed_queues[i] = clCreateCommandQueue(cl->context, cl->device, 0, &err);
        if (err != CL_SUCCESS) {
            cl->packed_queues[i] = NULL;
            return i;
        }
    }
    return PACKED_QUEUES;
}

/* clattn_fill_unseen()'s fill on device buffers: a fill command after the
 * call's start, its event appended to evs. */
typedef struct device_fill {
    struct clattn_cl_state *cl;
    clattn_dtype dtype;
    const clattn_cl_tensor *t;
    cl_event start, *evs;
    cl_uint *n;
    cl_int err;
} device_fill;

static int fill_device(void *arg, int role, size_t first, size_t count, float value)
{
    device_fill *f = arg;
    const size_t bytes = clattn_ocl_role_bytes(role, f->dtype);
    const cl_float wide = value;
    const cl_ushort zero16 = 0; /* value is 0 for 16-bit tensors */
    f->err = clEnqueueFillBuffer(f->cl->queue, f->t[role].buffer,
                                 bytes == 2 ? (const void *)&zero16 : (const void *)&wide, bytes,
                                 (f->t[role].offset + first) * bytes, count * bytes, 1, &f->start,
                                 &f->evs[*f->n]);
    if (f->err != CL_SUCCESS)
        return 1;
    ++*f->n;
    return 0;
}

/* Packed sequences on device buffers: each sequence's problem at its rows
 * (the longest first, so that what fails for it fails before anything is
 * enqueued), spread over the packed queues after a marker for what the caller's
 * queue and wait list hold; the rows no problem writes filled as a row that
 * sees nothing; then a barrier on the context's queue after them all, so
 * that the caller's later commands (and `event`) follow the whole call. */
clattn_status clattn_ocl_enqueue_packed(struct clattn_cl_state *cl, clattn_op op,
                                        const clattn_shape *s, const clattn_cl_tensor t[R_ALL],
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    const size_t most = (size_t)s->batch + 5u * ((size_t)s->batch + 1u);
    cl_event *evs = malloc(most * sizeof *evs), start = NULL;
    if (!evs)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    const cl_uint queues = packed_queues(cl);
    cl_uint n = 0, sequences = 0;
    cl_int err = clEnqueueMarkerWithWaitList(cl->queue, nwait, nwait ? wait : NULL, &start);
    clattn_status st = CLATTN_OK;
    /* One Dsum buffer for every sequence, at its rows: an allocation per
     * sequence can wait for the device (NVIDIA's does), which ran the
     * backward's sequences one after another. Released at once: OpenCL
     * keeps it until the kernels using it end. */
    cl_mem dsum = NULL;
    if (err == CL_SUCCESS && op != CLATTN_OP_FORWARD)
        dsum = clCreateBuffer(cl->context, CL_MEM_READ_WRITE,
                              (size_t)s->q_seq * s->num_heads * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS)
        err = clFlush(cl->queue);
    if (err != CL_SUCCESS)
        st = clattn_ocl_fail(err, "starting the packed sequences");
    const uint32_t longest = clattn_longest_sequence(s);
    for (uint32_t k = 0; k < s->batch && st == CLATTN_OK; ++k) {
        const uint32_t i = clattn_sequence_at(k, longest);
        const clattn_shape one = clattn_sequence_shape(s, i);
        if (!one.q_seq || !one.kv_seq)
            continue;
        clattn_cl_tensor sub[R_ALL];
        memcpy(sub, t, sizeof sub);
        for (int r = 0; r < CLATTN_R_COUNT; ++r)
            sub[r].offset += clattn_sequence_offset(s, r, i);
        sub[R_DSUM].buffer = dsum;
        sub[R_DSUM].offset = (size_t)s->cu_seqlens_q[i] * s->num_heads;
        clattn_sizes sz;
        cl_command_queue q = queues ? cl->packed_queues[sequences % queues] : cl->queue;
        cl->owner->seq_base = i; /* dropout's b */
        if ((st = clattn_check_shape(&one, &sz)) == CLATTN_OK &&
            (st = clattn_ocl_enqueue_op(cl, q, op, &one, &sz, sub, 1, &start, &evs[n])) ==
                CLATTN_OK) {
            ++n;
            ++sequences;
        }
        cl->owner->seq_base = 0;
    }
    device_fill f = {cl, s->dtype, t, start, evs, &n, CL_SUCCESS};
    if (st == CLATTN_OK && clattn_fill_unseen(s, op, fill_device, &f))
        st = clattn_ocl_fail(f.err, "clEnqueueFillBuffer");
    for (cl_uint i = 0; i < queues && i < sequences; ++i)
        clFlush(cl->packed_queues[i]);
    if (st == CLATTN_OK) {
        err = n ? clEnqueueBarrierWithWaitList(cl->queue, n, evs, event)
                : clEnqueueBarrierWithWaitList(cl->queue, 1, &start, event);
        if (err != CL_SUCCESS)
            st = clattn_ocl_fail(err, "clEnqueueBarrierWithWaitList");
    }
    if (st != CLATTN_OK && n)
        clWaitForEvents(n, evs); /* nothing of the call still runs once it returns */
    if (dsum)
        clReleaseMemObject(dsum);
    for (cl_uint j = 0; j < n; ++j)
        clReleaseEvent(evs[j]);
    if (start)
        clReleaseEvent(start);
    free(evs);
    return st;
}
