/*
 * clattn's OpenCL interop: contexts over the caller's own OpenCL objects and
 * every op enqueued on the caller's buffers. Include after or instead of
 * clattn.h; needs the OpenCL headers.
 *
 * Ownership: clattn never releases an OpenCL object it did not create. The
 * caller keeps its cl_context, cl_device_id, cl_command_queue and cl_mem
 * objects alive while a clattn context or an enqueued call uses them.
 */
#ifndef CLATTN_CL_H
#define CLATTN_CL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/cl.h>
#else
#include <CL/cl.h>
#endif

#include "clattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a clattn context on the caller's device. queue may be NULL, in
 * which case clattn creates (and later releases) an in-order queue of its
 * own on context and device; a caller's queue may be out of order, since
 * clattn orders its own commands through events. Packed sequences
 * (shape.cu_seqlens_*) on a GPU also run on up to four in-order queues that
 * clattn creates on context and device when first needed and releases with
 * the clattn context; the call's commands still follow what the caller's
 * queue holds, and the caller's later commands follow them. opts may be
 * NULL; its backend and device fields are ignored here, its variant is
 * honoured.
 * The kernels are built here.
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER (ctx, context or device
 * NULL), CLATTN_ERROR_INVALID_OPTION (device not in context, or queue of
 * another context or device), CLATTN_ERROR_UNKNOWN_VARIANT,
 * CLATTN_ERROR_BUILD_FAILED, CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
 * CLATTN_ERROR_OPENCL, CLATTN_ERROR_OUT_OF_MEMORY. */
clattn_status clattn_context_create_from_cl(const clattn_options *opts, cl_context context,
                                            cl_device_id device, cl_command_queue queue,
                                            clattn_context **ctx);

/* A tensor inside a cl_mem: offset counts elements of the shape's dtype
 * (floats for the LSE pairs), not bytes, from the start of buffer, so it
 * needs no alignment beyond the element's. */
typedef struct clattn_cl_tensor {
    cl_mem buffer;
    size_t offset;
} clattn_cl_tensor;

/* The context's OpenCL objects (its own or the caller's), for enqueueing
 * around clattn's calls; NULL on a native context. Still owned by whoever
 * created them. */
cl_context clattn_context_cl_context(const clattn_context *ctx);
cl_command_queue clattn_context_cl_queue(const clattn_context *ctx);

/* The tuning file (docs/tuning.md): kernel shapes kept per OpenCL device,
 * one entry per variant ("tiled", "tiled-forward", "tiled-backward" or
 * "mma"), dtype and head_dim, which every later context on the device
 * reads; `clattn tune` writes it through these calls. */

/* The file's path: CLATTN_TUNING_FILE, else $XDG_CONFIG_HOME/clattn/tuning,
 * else $HOME/.config/clattn/tuning.
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_INVALID_OPTION
 * (CLATTN_TUNING_FILE=off, no home set, or a path of size bytes or more). */
clattn_status clattn_tuning_file_path(char *path, size_t size);

/* The key the context's device has in the file, "PLATFORM / DEVICE /
 * DRIVER".
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_WRONG_BACKEND
 * (a native context), CLATTN_ERROR_INVALID_OPTION (a key of size bytes or
 * more, or one holding a tab or newline). */
clattn_status clattn_context_tuning_key(const clattn_context *ctx, char *key, size_t size);

/* Keeps one entry in the file at path, in place of any entry of the same
 * variant, dtype, head_dim and key: the file is written whole to a
 * temporary file beside it and renamed over it, so that a failure leaves
 * the old one as it was; a file of another format or clattn version is
 * replaced. The file's folder is created where missing. shape is the
 * variant's ("ROWS,TILE,SPLIT,COLUMNS,PER_ITEM" for tiled,
 * "WARPS,WSPLIT,TILE,PLANES" for mma), checked as a context reads it.
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_INVALID_OPTION
 * (a malformed entry), CLATTN_ERROR_IO (the folder or file cannot be
 * created, written or renamed). */
clattn_status clattn_tuning_file_store(const char *path, const char *variant, clattn_dtype dtype,
                                       uint32_t head_dim, const char *shape, const char *key);

/* grad-V as clattn_grad_v(), enqueued on the context's queue after the
 * events of the wait list; returns without waiting. When event is not
 * NULL it receives a new event for the kernel, which the caller releases.
 * Each tensor must lie inside its buffer and belong to the context's
 * cl_context; an output may overlap no other tensor of the call.
 * Status: the shape's, CLATTN_ERROR_NULL_POINTER,
 * CLATTN_ERROR_WRONG_BACKEND (a native context),
 * CLATTN_ERROR_INVALID_BUFFER, CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
 * CLATTN_ERROR_OPENCL. */
clattn_status clattn_grad_v_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor d_out, clattn_cl_tensor q, clattn_cl_tensor k,
                               clattn_cl_tensor lse, clattn_cl_tensor dv,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                               cl_event *event);

/* The forward (see clattn_forward()), enqueued like clattn_grad_v_cl().
 * o and lse may overlap no input. Status: as clattn_grad_v_cl(). */
clattn_status clattn_forward_cl(clattn_context *ctx, const clattn_shape *shape,
                                clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                clattn_cl_tensor o, clattn_cl_tensor lse,
                                cl_uint num_events_in_wait_list,
                                const cl_event *event_wait_list, cl_event *event);

/* dQ, dK and dV (see clattn_backward()), enqueued like clattn_grad_v_cl();
 * event, when not NULL, completes when all three are written. clattn keeps
 * the Dsum pre-pass's buffer itself until the kernels end.
 * Status: as clattn_grad_v_cl(). */
clattn_status clattn_backward_cl(clattn_context *ctx, const clattn_shape *shape,
                                 clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                 clattn_cl_tensor o, clattn_cl_tensor lse,
                                 clattn_cl_tensor d_out, clattn_cl_tensor dq,
                                 clattn_cl_tensor dk, clattn_cl_tensor dv,
                                 cl_uint num_events_in_wait_list,
                                 const cl_event *event_wait_list, cl_event *event);

/* clattn_merge() on the device, enqueued like clattn_forward_cl(): o1, o2
 * and o of the shape's dtype and Q's size, the LSE pairs float; o may be o1
 * or o2 (in place). */
clattn_status clattn_merge_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor o1,
                              clattn_cl_tensor lse1, clattn_cl_tensor o2, clattn_cl_tensor lse2,
                              clattn_cl_tensor o, clattn_cl_tensor lse,
                              cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                              cl_event *event);

/* clattn_grad_sinks() from device tensors: waits for the events, reads o,
 * lse and d_out back to the host and sums there; d_sinks is host memory
 * (num_heads floats). Blocks until done. Status: as clattn_grad_v_cl(),
 * CLATTN_ERROR_OUT_OF_MEMORY, and CLATTN_ERROR_NULL_POINTER where
 * shape->sinks is NULL. */
clattn_status clattn_grad_sinks_cl(clattn_context *ctx, const clattn_shape *shape,
                                   clattn_cl_tensor o, clattn_cl_tensor lse,
                                   clattn_cl_tensor d_out, float *d_sinks,
                                   cl_uint num_events_in_wait_list,
                                   const cl_event *event_wait_list);

/* clattn_grad_bias() from device tensors, on the device after the events;
 * d_bias is host memory, the bias's layout, read back. Where
 * clattn_grad_bias() would run on the host, q, k, v, o, lse and d_out are
 * read back and the host computes it. Blocks until done.
 * Status: as clattn_grad_v_cl() and clattn_grad_bias(). */
clattn_status clattn_grad_bias_cl(clattn_context *ctx, const clattn_shape *shape,
                                  clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                  clattn_cl_tensor o, clattn_cl_tensor lse,
                                  clattn_cl_tensor d_out, float *d_bias,
                                  cl_uint num_events_in_wait_list,
                                  const cl_event *event_wait_list);

/* clattn_grad_score_params() from device tensors: waits for the events,
 * reads q, k, v, o, lse and d_out back to the host and sums there;
 * d_params is host memory (score_params_count floats). Blocks until done.
 * Status: as clattn_grad_v_cl(), CLATTN_ERROR_OUT_OF_MEMORY, and
 * clattn_grad_score_params()'s. */
clattn_status clattn_grad_score_params_cl(clattn_context *ctx, const clattn_shape *shape,
                                          clattn_cl_tensor q, clattn_cl_tensor k,
                                          clattn_cl_tensor v, clattn_cl_tensor o,
                                          clattn_cl_tensor lse, clattn_cl_tensor d_out,
                                          float *d_params, cl_uint num_events_in_wait_list,
                                          const cl_event *event_wait_list);

/* dQ alone, and dK alone, enqueued likewise. */
clattn_status clattn_grad_q_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                               clattn_cl_tensor o, clattn_cl_tensor lse, clattn_cl_tensor d_out,
                               clattn_cl_tensor dq, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event);
clattn_status clattn_grad_k_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                               clattn_cl_tensor o, clattn_cl_tensor lse, clattn_cl_tensor d_out,
                               clattn_cl_tensor dk, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_CL_H */
