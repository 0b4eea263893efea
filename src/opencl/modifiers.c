/* The buffers an op's score modifiers take (cl/common.cl's MOD_ARGS): the
 * ALiBi slopes, sinks and score parameters, the caller's bias and bool
 * mask, and the block map of the mask function and bool mask. */
#include <stdlib.h>
#include <string.h>

#include "opencl.h"

void clattn_ocl_release_mods(clattn_mod_buffers *mb)
{
    cl_mem *all[4] = {&mb->slopes, &mb->bias, &mb->bool_mask, &mb->own_blocks};
    for (int i = 0; i < 4; ++i) {
        if (*all[i])
            clReleaseMemObject(*all[i]);
        *all[i] = NULL;
    }
    mb->blocks = NULL;
}

/* The modifiers' buffers of an op of s (mods: its modifier bits) in *mb:
 * the slopes (num_heads ALiBi slopes, then num_heads sinks (cl/common.cl's
 * SINK), then the score function's parameters), the bias and the bool
 * mask, copied now: the caller's arrays are read during the call only. */
clattn_status clattn_ocl_make_mods(struct clattn_cl_state *cl, const clattn_shape *s, unsigned mods,
                                  clattn_mod_buffers *mb)
{
    memset(mb, 0, sizeof *mb);
    mb->bias_dims = (s->bias_batch > 1 ? 1u : 0u) | (s->bias_heads > 1 ? 2u : 0u) |
                    (s->bias_dtype == CLATTN_DTYPE_BF16   ? 4u
                     : s->bias_dtype == CLATTN_DTYPE_F16 ? 8u
                                                         : 0u);
    cl_int err = CL_SUCCESS;
    if (mods & (CLATTN_MOD_ALIBI | CLATTN_MOD_SINK | CLATTN_MOD_SCORE)) {
        const size_t params = mods & CLATTN_MOD_SCORE ? s->score_params_count : 0;
        const size_t floats = 2 * (size_t)s->num_heads + params;
        float *all = calloc(floats, sizeof(float));
        if (!all)
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                               "out of host memory for %u heads and %zu parameters",
                               s->num_heads, params);
        if (mods & CLATTN_MOD_ALIBI)
            memcpy(all, s->alibi_slopes, s->num_heads * sizeof(float));
        if (mods & CLATTN_MOD_SINK)
            memcpy(all + s->num_heads, s->sinks, s->num_heads * sizeof(float));
        if (params)
            memcpy(all + 2 * (size_t)s->num_heads, s->score_params, params * sizeof(float));
        mb->slopes = clCreateBuffer(cl->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                    floats * sizeof(float), all, &err);
        free(all);
        if (err != CL_SUCCESS)
            return clattn_ocl_fail(err, "clCreateBuffer(alibi_slopes, sinks, score_params)");
    }
    const size_t elems = clattn_bias_elems(s);
    const size_t bias_bytes = elems * clattn_bias_bytes(s);
    if ((mods & CLATTN_MOD_BIAS) && !s->bias_cl && bias_bytes > cl->limits.max_alloc) {
        clattn_ocl_release_mods(mb);
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
                           "the bias of %zu bytes exceeds the device's largest allocation",
                           bias_bytes);
    }
    /* The caller's cl_mem where the shape has one (retained, as the host
     * arrays' copies are made), else a copy of the host array. */
    const struct {
        unsigned bit;
        void *device;
        const void *host;
        size_t bytes;
        cl_mem *into;
        const char *name;
    } tensors[2] = {{CLATTN_MOD_BIAS, s->bias_cl, s->bias, bias_bytes, &mb->bias,
                     "bias_cl"},
                    {CLATTN_MOD_BOOL, s->bool_mask_cl, s->bool_mask, elems, &mb->bool_mask,
                     "bool_mask_cl"}};
    for (int i = 0; i < 2 && err == CL_SUCCESS; ++i) {
        if (!(mods & tensors[i].bit))
            continue;
        if (tensors[i].device) {
            size_t size = 0;
            cl_mem m = (cl_mem)tensors[i].device;
            if ((err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL)) !=
                CL_SUCCESS)
                break;
            if (size < tensors[i].bytes) {
                clattn_ocl_release_mods(mb);
                return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                                   "%s holds %zu bytes; its layout needs %zu", tensors[i].name,
                                   size, tensors[i].bytes);
            }
            if ((err = clRetainMemObject(m)) == CL_SUCCESS)
                *tensors[i].into = m;
        } else {
            *tensors[i].into =
                clCreateBuffer(cl->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                               tensors[i].bytes, (void *)tensors[i].host, &err);
        }
    }
    if (err != CL_SUCCESS) {
        clattn_ocl_release_mods(mb);
        return clattn_ocl_fail(err, "the bias and bool mask's buffers");
    }
    return CLATTN_OK;
}

/* The block map of s's mask function and bool mask into mb->blocks: the
 * kept one where it is s's, else made by mask_map from set's forward
 * program (after the call's wait list; waited for). A function's map is
 * kept for the calls after it; a bool mask's, whose bytes may change
 * between calls, is the op's own (mb->own_blocks). */
clattn_status clattn_ocl_mask_map(struct clattn_cl_state *cl, cl_command_queue queue,
                                  const kernel_set *set, const clattn_shape *s,
                                  clattn_mod_buffers *mb, cl_uint nwait, const cl_event *wait)
{
    struct mask_map_state *m = &cl->mask_map;
    const int64_t delta = clattn_mask_delta(s);
    const uint32_t seq_base = cl->owner->seq_base;
    const int keep = !(clattn_modifiers(s) & CLATTN_MOD_BOOL);
    if (keep && m->buffer && !strcmp(m->text, s->mask_fn) && m->batch == s->batch &&
        m->q_seq == s->q_seq && m->kv_seq == s->kv_seq && m->num_heads == s->num_heads &&
        m->kv_offset == s->kv_offset && m->seq_base == seq_base && m->delta == delta) {
        mb->blocks = m->buffer;
        return CLATTN_OK;
    }
    const size_t qb = (s->q_seq + 63u) / 64u, kb = (s->kv_seq + 63u) / 64u;
    const size_t heads = (size_t)s->batch * s->num_heads;
    if (qb * kb > cl->limits.max_alloc / heads)
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
                           "the mask's block map of %zu x %zu blocks for %zu heads exceeds the "
                           "device's largest allocation",
                           qb, kb, heads);
    char *text = NULL;
    if (keep) {
        if (!(text = malloc(strlen(s->mask_fn) + 1)))
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
        strcpy(text, s->mask_fn);
    }
    cl_int err;
    cl_mem buffer = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, qb * kb * heads, NULL, &err);
    cl_kernel k = err == CL_SUCCESS ? clCreateKernel(set->program[K_FORWARD], "mask_map", &err)
                                    : NULL;
    if (err == CL_SUCCESS) {
        const cl_uint q_seq = s->q_seq, kv_seq = s->kv_seq, num_heads = s->num_heads;
        const cl_uint kv_pos0 = s->kv_offset, seq0 = seq_base;
        const cl_long d = delta;
        cl_uint arg = 0;
        err |= clSetKernelArg(k, arg++, sizeof buffer, &buffer);
        err |= clSetKernelArg(k, arg++, sizeof q_seq, &q_seq);
        err |= clSetKernelArg(k, arg++, sizeof kv_seq, &kv_seq);
        err |= clSetKernelArg(k, arg++, sizeof num_heads, &num_heads);
        err |= clSetKernelArg(k, arg++, sizeof d, &d);
        err |= clSetKernelArg(k, arg++, sizeof kv_pos0, &kv_pos0);
        err |= clSetKernelArg(k, arg++, sizeof seq0, &seq0);
        err |= clSetKernelArg(k, arg++, sizeof(cl_mem), &mb->bool_mask);
        err |= clSetKernelArg(k, arg++, sizeof(cl_uint), &mb->bias_dims);
    }
    cl_event ev = NULL;
    if (err == CL_SUCCESS) {
        const size_t global[3] = {64u * heads, kb, qb}, local[3] = {64u, 1, 1};
        err = clEnqueueNDRangeKernel(queue, k, 3, NULL, global, local, nwait,
                                     nwait ? wait : NULL, &ev);
    }
    if (err == CL_SUCCESS)
        err = clWaitForEvents(1, &ev);
    if (ev)
        clReleaseEvent(ev);
    if (k)
        clReleaseKernel(k);
    if (err != CL_SUCCESS) {
        if (buffer)
            clReleaseMemObject(buffer);
        free(text);
        return clattn_ocl_fail(err, "making the mask's block map");
    }
    mb->blocks = buffer;
    if (!keep) {
        mb->own_blocks = buffer;
        return CLATTN_OK;
    }
    if (m->buffer)
        clReleaseMemObject(m->buffer);
    free(m->text);
    *m = (struct mask_map_state){buffer,       text,         s->batch,    s->q_seq, s->kv_seq,
                                 s->num_heads, s->kv_offset, seq_base, delta};
    return CLATTN_OK;
}
