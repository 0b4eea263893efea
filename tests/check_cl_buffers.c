/* The cl_mem calls (clattn_cl.h) on the caller's own OpenCL objects:
 * offsets, wait lists, events, bounds and ownership; on native, their
 * refusal. */
#define CL_TARGET_OPENCL_VERSION 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "harness.h"
#include "numerics.h"
#include "reference.h"

/* Finds a device of the backend with the plain OpenCL API, as a caller would. */
static cl_device_id caller_device(void)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    ck_assert_int_eq(clGetPlatformIDs(16, plats, &np), CL_SUCCESS);
    cl_device_type want = !strcmp(test_backend, "opencl-cpu") ? CL_DEVICE_TYPE_CPU
                                                              : CL_DEVICE_TYPE_GPU;
    for (cl_uint i = 0; i < np && i < 16; ++i) {
        cl_device_id dev;
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[i], want, 1, &dev, &nd) == CL_SUCCESS && nd)
            return dev;
    }
    ck_abort_msg("no %s device through the OpenCL API", test_backend);
    return NULL;
}

/* The caller's own cl_context, queue and buffers, with offsets, a wait list
 * and an output event; clattn releases none of them. */
START_TEST(caller_buffers)
{
    if (!strcmp(test_backend, "native")) {
        clattn_context *ctx = test_context(NULL);
        clattn_shape s = clattn_shape_default();
        s.q_seq = s.kv_seq = s.num_heads = s.num_kv_heads = s.head_dim = 1;
        clattn_cl_tensor none = {NULL, 0};
        ck_assert_status(clattn_grad_v_cl(ctx, &s, none, none, none, none, none, 0, NULL, NULL),
                         CLATTN_ERROR_WRONG_BACKEND);
        ck_assert_ptr_null(clattn_context_cl_queue(ctx));
        clattn_context_destroy(ctx);
        return;
    }
    cl_device_id dev = caller_device();
    cl_int err;
    cl_context cctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_command_queue queue = clCreateCommandQueue(cctx, dev, 0, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    clattn_context *ctx = NULL;
    /* A queue of another cl_context is refused at creation, not at every
     * later call; nothing is made, and the caller's objects stay theirs. */
    cl_context elsewhere = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_command_queue its_queue = clCreateCommandQueue(elsewhere, dev, 0, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    ck_assert_status(clattn_context_create_from_cl(NULL, cctx, dev, its_queue, &ctx),
                     CLATTN_ERROR_INVALID_OPTION);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "another cl_context"));
    clReleaseCommandQueue(its_queue);
    clReleaseContext(elsewhere);
    ck_assert_status(clattn_context_create_from_cl(NULL, cctx, dev, queue, &ctx), CLATTN_OK);
    ck_assert_ptr_eq(clattn_context_cl_queue(ctx), queue);
    ck_assert_ptr_eq(clattn_context_cl_context(ctx), cctx);

    shape_case c = {.batch = 2, .q_seq = 21, .heads = 4, .kv_heads = 2, .head_dim = 24,
         .causal = 1, .window = 5};
    clattn_shape s = to_shape(&c);
    problem p;
    problem_make(&p, &s, 4242, 1.0f);
    /* All five tensors in one buffer, at odd float offsets. */
    const size_t off[5] = {3, 3 + p.nq + 1, 3 + 2 * p.nq + 2, 3 + 2 * p.nq + p.nkv + 5,
                           3 + 2 * p.nq + p.nkv + p.nlse + 7};
    const size_t total = off[4] + p.nkv + 2;
    float *host = nan_array(total);
    memcpy(host + off[0], p.d_out, p.nq * 4);
    memcpy(host + off[1], p.q, p.nq * 4);
    memcpy(host + off[2], p.k, p.nkv * 4);
    memcpy(host + off[3], p.lse, p.nlse * 4);
    cl_mem buf = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, total * 4, host,
                                &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    clattn_cl_tensor t[5];
    for (int i = 0; i < 5; ++i) {
        t[i].buffer = buf;
        t[i].offset = off[i];
    }
    /* The kernel must wait for the caller's event. */
    cl_event gate = clCreateUserEvent(cctx, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_event done = NULL;
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], t[1], t[2], t[3], t[4], 1, &gate, &done),
                     CLATTN_OK);
    ck_assert_ptr_nonnull(done);
    cl_int state = 0;
    ck_assert_int_eq(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state,
                                    &state, NULL),
                     CL_SUCCESS);
    ck_assert_int_ne(state, CL_COMPLETE);
    ck_assert_int_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    ck_assert_int_eq(clWaitForEvents(1, &done), CL_SUCCESS);
    float *back = malloc(total * 4);
    ck_assert_int_eq(clEnqueueReadBuffer(queue, buf, CL_TRUE, 0, total * 4, back, 0, NULL, NULL),
                     CL_SUCCESS);
    double *ref = malloc(p.nkv * sizeof(double)), *mag = malloc(p.nkv * sizeof(double));
    ref_grad_v(&p, ref, mag);
    size_t at;
    double worst = worst_error(back + off[4], ref, mag, p.nkv, &at);
    ck_assert_msg(worst <= 1.0, "caller buffers: element %zu is %g, want %g", at,
                  (double)back[off[4] + at], ref[at]);
    /* Floats around dV are untouched. */
    ck_assert(isnan(back[off[4] - 1]) && isnan(back[off[4] + p.nkv]));

    /* Wrong placements are refused before anything is enqueued. */
    clattn_cl_tensor past = {buf, total - 1};
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], t[1], t[2], t[3], past, 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    clattn_cl_tensor overlap = {buf, off[3]};
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], t[1], t[2], t[3], overlap, 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    /* Two sub-buffers of one parent that overlap: dV's over Q's bytes. */
    cl_uint align_bits = 0;
    ck_assert_int_eq(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits,
                                     &align_bits, NULL),
                     CL_SUCCESS);
    const size_t align = align_bits / 8 ? align_bits / 8 : 4;
    cl_mem parent = clCreateBuffer(cctx, CL_MEM_READ_WRITE, align + 2 * p.nq * 4, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    const cl_buffer_region first = {0, p.nq * 4}, second = {align, p.nkv * 4};
    cl_mem q_part = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &first, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_mem dv_part = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &second, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    const clattn_cl_tensor q_sub = {q_part, 0}, dv_sub = {dv_part, 0};
    ck_assert(align < p.nq * 4); /* so that they overlap */
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], q_sub, t[2], t[3], dv_sub, 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "dv overlaps q"));
    clReleaseMemObject(dv_part);
    clReleaseMemObject(q_part);
    clReleaseMemObject(parent);
    cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, total * 4, NULL, &err);
    clattn_cl_tensor far = {foreign, 0};
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], t[1], t[2], t[3], far, 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_status(clattn_grad_v_cl(ctx, &s, t[0], t[1], t[2], t[3], t[4], 2, NULL, NULL),
                     CLATTN_ERROR_NULL_POINTER);

    clattn_context_destroy(ctx);
    /* The caller's objects are still alive and usable. */
    float one = 0;
    ck_assert_int_eq(clEnqueueReadBuffer(queue, buf, CL_TRUE, off[1] * 4, 4, &one, 0, NULL, NULL),
                     CL_SUCCESS);
    ck_assert(one == p.q[0]);
    clReleaseMemObject(foreign);
    clReleaseContext(other);
    clReleaseEvent(done);
    clReleaseEvent(gate);
    clReleaseMemObject(buf);
    clReleaseCommandQueue(queue);
    clReleaseContext(cctx);
    free(host);
    free(back);
    free(ref);
    free(mag);
    problem_free(&p);
}
END_TEST

/* forward_cl feeding backward_cl (and grad_q_cl, grad_k_cl) through the
 * caller's buffers and events, on an out-of-order queue where the device
 * has one: only the events order the kernels. */
START_TEST(caller_buffers_training)
{
    if (!strcmp(test_backend, "native")) {
        clattn_context *ctx = test_context(NULL);
        clattn_shape s = clattn_shape_default();
        s.q_seq = s.kv_seq = s.num_heads = s.num_kv_heads = s.head_dim = 1;
        clattn_cl_tensor none = {NULL, 0};
        ck_assert_status(clattn_backward_cl(ctx, &s, none, none, none, none, none, none, none,
                                            none, none, 0, NULL, NULL),
                         CLATTN_ERROR_WRONG_BACKEND);
        clattn_context_destroy(ctx);
        return;
    }
    cl_device_id dev = caller_device();
    cl_int err;
    cl_context cctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_command_queue_properties props = 0;
    clGetDeviceInfo(dev, CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    cl_command_queue queue = clCreateCommandQueue(
        cctx, dev, props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create_from_cl(NULL, cctx, dev, queue, &ctx), CLATTN_OK);

    shape_case c = {.batch = 2, .q_seq = 23, .heads = 6, .kv_heads = 3, .head_dim = 20,
         .causal = 1, .window = 6};
    clattn_shape s = to_shape(&c);
    problem p;
    problem_make(&p, &s, 777, 1.0f);
    enum { Q, K, V, O, LSE, DO, DQ, DK, DV, DQ2, DK2, COUNT };
    const size_t n[COUNT] = {p.nq, p.nkv, p.nkv, p.nq, p.nlse, p.nq, p.nq, p.nkv, p.nkv, p.nq,
                             p.nkv};
    const float *init[COUNT] = {p.q, p.k, p.v, NULL, NULL, p.d_out};
    clattn_cl_tensor t[COUNT];
    for (int i = 0; i < COUNT; ++i) {
        float *host = nan_array(n[i] + 1);
        if (init[i])
            memcpy(host + 1, init[i], n[i] * sizeof(float));
        t[i].buffer = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                     (n[i] + 1) * sizeof(float), host, &err);
        ck_assert_int_eq(err, CL_SUCCESS);
        t[i].offset = 1;
        free(host);
    }
    cl_event fwd = NULL, bwd = NULL, gq = NULL, gk = NULL;
    ck_assert_status(clattn_forward_cl(ctx, &s, t[Q], t[K], t[V], t[O], t[LSE], 0, NULL, &fwd),
                     CLATTN_OK);
    ck_assert_status(clattn_backward_cl(ctx, &s, t[Q], t[K], t[V], t[O], t[LSE], t[DO], t[DQ],
                                        t[DK], t[DV], 1, &fwd, &bwd),
                     CLATTN_OK);
    ck_assert_status(clattn_grad_q_cl(ctx, &s, t[Q], t[K], t[V], t[O], t[LSE], t[DO], t[DQ2], 1,
                                      &fwd, &gq),
                     CLATTN_OK);
    ck_assert_status(clattn_grad_k_cl(ctx, &s, t[Q], t[K], t[V], t[O], t[LSE], t[DO], t[DK2], 1,
                                      &fwd, &gk),
                     CLATTN_OK);
    /* An output over an input is refused. */
    ck_assert_status(clattn_backward_cl(ctx, &s, t[Q], t[K], t[V], t[O], t[LSE], t[DO], t[DQ],
                                        t[K], t[DV], 0, NULL, NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    cl_event all[3] = {bwd, gq, gk};
    ck_assert_int_eq(clWaitForEvents(3, all), CL_SUCCESS);
    float *back[COUNT];
    for (int i = O; i < COUNT; ++i) {
        back[i] = malloc((n[i] + 1) * sizeof(float));
        ck_assert_int_eq(clEnqueueReadBuffer(queue, t[i].buffer, CL_TRUE, 0,
                                             (n[i] + 1) * sizeof(float), back[i], 0, NULL, NULL),
                         CL_SUCCESS);
        ck_assert(isnan(back[i][0])); /* the float before the offset is untouched */
    }
    /* The reference backward from this device's own forward. */
    memcpy(p.o, back[O] + 1, p.nq * sizeof(float));
    memcpy(p.lse, back[LSE] + 1, p.nlse * sizeof(float));
    double *dq = malloc(p.nq * 8), *dq_mag = malloc(p.nq * 8), *dk = malloc(p.nkv * 8);
    double *dk_mag = malloc(p.nkv * 8), *dv = malloc(p.nkv * 8), *dv_mag = malloc(p.nkv * 8);
    ref_backward(&p, dq, dq_mag, dk, dk_mag, dv, dv_mag);
    expect_close("cl backward dQ", &s, 1.0f, back[DQ] + 1, dq, dq_mag, p.nq);
    expect_close("cl backward dK", &s, 1.0f, back[DK] + 1, dk, dk_mag, p.nkv);
    expect_close("cl backward dV", &s, 1.0f, back[DV] + 1, dv, dv_mag, p.nkv);
    expect_close("cl grad-Q", &s, 1.0f, back[DQ2] + 1, dq, dq_mag, p.nq);
    expect_close("cl grad-K", &s, 1.0f, back[DK2] + 1, dk, dk_mag, p.nkv);

    clattn_context_destroy(ctx);
    cl_event evs[4] = {fwd, bwd, gq, gk};
    for (int i = 0; i < 4; ++i)
        clReleaseEvent(evs[i]);
    for (int i = 0; i < COUNT; ++i)
        clReleaseMemObject(t[i].buffer);
    for (int i = O; i < COUNT; ++i)
        free(back[i]);
    double *refs[] = {dq, dq_mag, dk, dk_mag, dv, dv_mag};
    for (int i = 0; i < 6; ++i)
        free(refs[i]);
    clReleaseCommandQueue(queue);
    clReleaseContext(cctx);
    problem_free(&p);
}
END_TEST

/* clattn_merge_cl() with a NaN partial: its row comes out NaN, as the
 * host's clattn_merge() gives it, never emptied. */
START_TEST(merge_non_finite)
{
    if (!strcmp(test_backend, "native"))
        return; /* no cl_mem there */
    clattn_context *ctx = test_context(NULL);
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 4;
    s.num_heads = s.num_kv_heads = 1;
    s.head_dim = 2;
    const float e = -1e30f;
    /* Row 3's first pair (NaN, -1e30) is a NaN partial, not an empty one. */
    float o1[8] = {1, 2, NAN, 4, 1, 2, 0, 0}, l1[8] = {NAN, NAN, 1.0f, 0.2f, NAN, 0.0f, NAN, e};
    float o2[8] = {5, 6, 7, 8, 0, 0, 0, 0}, l2[8] = {2.0f, 0.3f, 0.1f, 0.0f, e, e, e, e};
    float *host[4] = {o1, l1, o2, l2};
    cl_context cctx = clattn_context_cl_context(ctx);
    cl_mem buf[4];
    for (int i = 0; i < 4; ++i) {
        cl_int err;
        buf[i] = clCreateBuffer(cctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof o1,
                                host[i], &err);
        ck_assert_int_eq(err, CL_SUCCESS);
    }
    const clattn_cl_tensor t[4] = {{buf[0], 0}, {buf[1], 0}, {buf[2], 0}, {buf[3], 0}};
    ck_assert_status(clattn_merge_cl(ctx, &s, t[0], t[1], t[2], t[3], t[0], t[1], 0, NULL, NULL),
                     CLATTN_OK);
    float o[8], l[8], want_o[8], want_l[8];
    cl_command_queue queue = clattn_context_cl_queue(ctx);
    ck_assert_int_eq(clEnqueueReadBuffer(queue, buf[0], CL_TRUE, 0, sizeof o, o, 0, NULL, NULL),
                     CL_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(queue, buf[1], CL_TRUE, 0, sizeof l, l, 0, NULL, NULL),
                     CL_SUCCESS);
    ck_assert_status(clattn_merge(ctx, &s, o1, l1, o2, l2, want_o, want_l), CLATTN_OK);
    for (int i = 0; i < 8; ++i) {
        ck_assert_msg(isnan(o[i]) == isnan(want_o[i]), "O[%d]: device %g, host %g", i,
                      (double)o[i], (double)want_o[i]);
        ck_assert_msg(isnan(l[i]) == isnan(want_l[i]), "LSE[%d]: device %g, host %g", i,
                      (double)l[i], (double)want_l[i]);
    }
    ck_assert(isnan(o[0]) && isnan(o[1]) && isnan(o[2]) && isnan(o[4]) && isnan(l[1]));
    ck_assert(isnan(o[6]) && isnan(o[7]) && isnan(l[7]));
    /* Merged in place is fine; O over an input's LSE is refused (before,
     * clattn_merge_cl checked no overlap at all). */
    const clattn_cl_tensor o_on_lse = {buf[1], 0};
    ck_assert_status(clattn_merge_cl(ctx, &s, t[0], t[1], t[2], t[3], o_on_lse, t[3], 0, NULL,
                                     NULL),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "o overlaps lse1"));
    ck_assert_status(clattn_merge_cl(ctx, &s, t[0], t[1], t[2], t[3], t[2], t[3], 0, NULL, NULL),
                     CLATTN_OK);
    clFinish(queue);
    for (int i = 0; i < 4; ++i)
        clReleaseMemObject(buf[i]);
    clattn_context_destroy(ctx);
}
END_TEST

/* Packed sequences on cl_mem: tensors at odd offsets in buffers of their
 * own, outputs poisoned first; the _cl calls give bitwise what the
 * host-pointer calls give, rows no sequence writes included, and the event
 * completes after every sequence and fill. */
static void packed_buffers_run(int mods)
{
    if (!strcmp(test_backend, "native"))
        return; /* no cl_mem there */
    clattn_context *ctx = test_context(NULL);
    cl_context cctx = clattn_context_cl_context(ctx);
    cl_command_queue queue = clattn_context_cl_queue(ctx);
    /* sequences: (6, 6), (0, 4), (9, 0), (1, 1), (20, 13); two rows past each end */
    const uint32_t cq[6] = {0, 6, 6, 15, 16, 36}, ck[6] = {0, 6, 10, 10, 11, 24};
    clattn_shape s = clattn_shape_default();
    s.batch = 5;
    s.q_seq = 38;
    s.kv_seq = 26;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 24;
    s.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    s.cu_seqlens_q = cq;
    s.cu_seqlens_kv = ck;
    /* mods: every score modifier and sinks, the slopes and sinks read
     * during the call only */
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[4] = {1.0f, -0.5f, 0.25f, -INFINITY};
    if (mods) {
        s.softcap = 3.0f;
        s.alibi_slopes = slopes;
        s.sinks = sinks;
        s.dropout_p = 0.2f;
        s.dropout_seed = 5;
        s.dropout_offset = 9;
    }
    const size_t nq = 38 * 4 * 24, nkv = 26 * 2 * 24, nl = 38 * 4 * 2, off = 3;
    const size_t n[9] = {nq, nkv, nkv, nq, nl, nq, nq, nkv, nkv};
    float *host[9], *got[9];
    uint64_t state = 77;
    for (int i = 0; i < 9; ++i) {
        host[i] = nan_array(n[i]);
        got[i] = nan_array(n[i]);
        for (size_t j = 0; j < n[i] && (i < 3 || i == 5); ++j) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            host[i][j] = (float)((state >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
        }
    }
    /* the host-pointer calls: what the _cl calls must give */
    ck_assert_status(clattn_forward(ctx, &s, host[0], host[1], host[2], host[3], host[4]),
                     CLATTN_OK);
    ck_assert_status(clattn_backward(ctx, &s, host[0], host[1], host[2], host[3], host[4],
                                     host[5], host[6], host[7], host[8]),
                     CLATTN_OK);
    cl_mem buf[9];
    clattn_cl_tensor t[9];
    for (int i = 0; i < 9; ++i) {
        cl_int err;
        buf[i] = clCreateBuffer(cctx, CL_MEM_READ_WRITE, (n[i] + off) * sizeof(float), NULL, &err);
        ck_assert_int_eq(err, CL_SUCCESS);
        const float poison = NAN;
        ck_assert_int_eq(clEnqueueFillBuffer(queue, buf[i], &poison, sizeof poison, 0,
                                             (n[i] + off) * sizeof(float), 0, NULL, NULL),
                         CL_SUCCESS);
        if (i < 3 || i == 5)
            ck_assert_int_eq(clEnqueueWriteBuffer(queue, buf[i], CL_TRUE, off * sizeof(float),
                                                  n[i] * sizeof(float), host[i], 0, NULL, NULL),
                             CL_SUCCESS);
        t[i].buffer = buf[i];
        t[i].offset = off;
    }
    cl_event fwd = NULL, bwd = NULL;
    ck_assert_status(clattn_forward_cl(ctx, &s, t[0], t[1], t[2], t[3], t[4], 0, NULL, &fwd),
                     CLATTN_OK);
    ck_assert_status(clattn_backward_cl(ctx, &s, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                                        t[8], 1, &fwd, &bwd),
                     CLATTN_OK);
    slopes[0] = slopes[1] = slopes[2] = slopes[3] = NAN; /* the calls have returned */
    sinks[0] = sinks[1] = sinks[2] = sinks[3] = NAN;
    if (mods) { /* the sinks' gradient from the device tensors, after the backward's event */
        const float back[4] = {1.0f, -0.5f, 0.25f, -INFINITY}, slopes_back[4] = {0.5f, 0.25f,
                                                                                 0.125f, 0.0625f};
        memcpy(sinks, back, sizeof back);
        memcpy(slopes, slopes_back, sizeof slopes_back);
        float ds_host[4], ds_cl[4];
        ck_assert_status(clattn_grad_sinks(ctx, &s, host[3], host[4], host[5], ds_host),
                         CLATTN_OK);
        ck_assert_status(clattn_grad_sinks_cl(ctx, &s, t[3], t[4], t[5], ds_cl, 1, &bwd),
                         CLATTN_OK);
        ck_assert(!memcmp(ds_host, ds_cl, sizeof ds_cl) && ds_cl[0] != 0.0f && ds_cl[3] == 0.0f);
        ck_assert_status(clattn_grad_sinks_cl(ctx, &s, t[3], t[4], t[5], NULL, 0, NULL),
                         CLATTN_ERROR_NULL_POINTER);
        clattn_cl_tensor short_o = {buf[3], n[3]}; /* past the buffer's end */
        ck_assert_status(clattn_grad_sinks_cl(ctx, &s, short_o, t[4], t[5], ds_cl, 0, NULL),
                         CLATTN_ERROR_INVALID_BUFFER);
    }
    ck_assert_int_eq(clWaitForEvents(1, &bwd), CL_SUCCESS);
    clReleaseEvent(fwd);
    clReleaseEvent(bwd);
    const int outs[5] = {3, 4, 6, 7, 8};
    for (int j = 0; j < 5; ++j) {
        const int i = outs[j];
        ck_assert_int_eq(clEnqueueReadBuffer(queue, buf[i], CL_TRUE, off * sizeof(float),
                                             n[i] * sizeof(float), got[i], 0, NULL, NULL),
                         CL_SUCCESS);
        ck_assert_msg(!memcmp(got[i], host[i], n[i] * sizeof(float)),
                      "packed tensor %d on cl_mem differs from the host-pointer call", i);
    }
    /* the rows past the ends: empty O rows and LSE pairs, zero gradients */
    ck_assert(host[3][nq - 1] == 0.0f && host[4][nl - 1] == -1e30f && host[6][nq - 1] == 0.0f &&
              host[7][nkv - 1] == 0.0f && host[8][nkv - 1] == 0.0f);
    for (int i = 0; i < 9; ++i) {
        clReleaseMemObject(buf[i]);
        free(host[i]);
        free(got[i]);
    }
    clattn_context_destroy(ctx);
}

START_TEST(packed_buffers) { packed_buffers_run(0); }
END_TEST

/* The same with softcap, ALiBi, dropout and sinks, and the sinks'
 * gradient from the device tensors. */
START_TEST(modified_buffers) { packed_buffers_run(1); }
END_TEST

Suite *buffers_suite(void)
{
    const TTest *const tests[] = {caller_buffers, caller_buffers_training, merge_non_finite,
                                  packed_buffers, modified_buffers};
    return case_suite("buffers", "cl_mem", 600, tests, sizeof tests / sizeof *tests);
}
