/* Where a ring rank computes: its tensors on the device or the host, the
 * pairs' calls, and the blocks and sums that travel over MPI. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"

/* ---- where a rank computes ----------------------------------------------
 * On an OpenCL context every tensor of a rank lives on its device: the ring
 * enqueues clattn's _cl calls and drives MPI while the device computes, and
 * only the K/V blocks and the dK/dV sums that travel cross to the host. On a
 * native context the host arrays are all there is. */

/* Element i of t on the host. */
void *host_at(tensor t, size_t i) { return t.host + i * t.es; }

/* Rows [pos0, pos0 + rows) of input `which`, each row_elems wide, into t
 * from element `at`, in t's dtype. */
void make_rows(tensor t, size_t at, int which, uint64_t pos0, size_t rows, size_t row_elems)
{
    float part[1024];
    const size_t n = rows * row_elems;
    for (size_t i = 0; i < n; i += 1024) {
        const size_t m = n - i < 1024 ? n - i : 1024;
        for (size_t e = 0; e < m; ++e)
            part[e] = input_at(which, pos0 * row_elems + i + e);
        clattn_from_f32(t.dtype, part, host_at(t, at + i), m);
    }
}

/* K of chunks mine[0..1], then V of them, into a block (kvn elements a
 * chunk). */
void own_block(tensor block, const uint32_t mine[2], uint32_t c, size_t kvn, size_t kvrow)
{
    for (int i = 0; i < 2; ++i) {
        make_rows(block, i * kvn, 1, (uint64_t)mine[i] * c, c, kvrow);
        make_rows(block, (2 + i) * kvn, 2, (uint64_t)mine[i] * c, c, kvrow);
    }
}

/* n elements of t from element `at` as float32, in memory of the caller's
 * to free. */
float *to_floats(tensor t, size_t at, size_t n)
{
    float *f = malloc(n * sizeof(float));
    if (!f)
        MPI_Abort(MPI_COMM_WORLD, 1);
    clattn_to_f32(t.dtype, host_at(t, at), f, n);
    return f;
}

/* Adds the time since *t0 to kind k of p's phase and restarts *t0. */
void spend(place *p, int k, double *t0)
{
    const double now = MPI_Wtime();
    if (p->spent)
        p->spent[k] += now - *t0;
    *t0 = now;
}

void cl_check(cl_int err, const char *what, int rank)
{
    if (err == CL_SUCCESS)
        return;
    fprintf(stderr, "ring_attention: rank %d: %s: OpenCL error %d\n", rank, what, (int)err);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* n floats; with `pinned` on an OpenCL context the host side is a mapped
 * buffer of the driver's (page-locked where it can), which the copies to and
 * from the device run faster from. */
tensor tensor_new(const place *p, size_t n, clattn_dtype dtype, int pinned)
{
    tensor t = {NULL, dtype, elem_size(dtype), NULL, NULL};
    const size_t bytes = n * t.es;
    cl_int err = CL_SUCCESS;
    if (p->cl && pinned) {
        t.pinned = clCreateBuffer(p->cl, CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
        if (err == CL_SUCCESS)
            t.host = clEnqueueMapBuffer(p->queue, t.pinned, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                        bytes, 0, NULL, NULL, &err);
    } else {
        t.host = malloc(bytes);
    }
    if (p->cl && t.host && err == CL_SUCCESS)
        t.dev = clCreateBuffer(p->cl, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!t.host || err != CL_SUCCESS) {
        fprintf(stderr, "ring_attention: out of memory on rank %d (%zu floats)\n", p->rank, n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return t;
}

void tensor_free(const place *p, tensor *t)
{
    if (t->pinned) {
        clEnqueueUnmapMemObject(p->queue, t->pinned, t->host, 0, NULL, NULL);
        clFinish(p->queue);
        clReleaseMemObject(t->pinned);
    } else {
        free(t->host);
    }
    if (t->dev)
        clReleaseMemObject(t->dev);
}

clattn_cl_tensor on_dev(tensor t, size_t at)
{
    clattn_cl_tensor x = {t.dev, at};
    return x;
}

/* Elements [at, at + n) of t from the host to the device, on the copies
 * queue: the calls enqueued next wait for it. */
void upload(place *p, tensor t, size_t at, size_t n)
{
    if (!p->cl)
        return;
    cl_event ev;
    cl_check(clEnqueueWriteBuffer(p->copies, t.dev, CL_FALSE, at * t.es, n * t.es, host_at(t, at),
                                  0, NULL, &ev),
             "upload", p->rank);
    if (p->uploaded)
        clReleaseEvent(p->uploaded); /* the queue is in order: ev comes after it */
    p->uploaded = ev;
}

/* Elements [at, at + n) of t from the device, after the calls so far. */
void download(place *p, tensor t, size_t at, size_t n)
{
    if (p->cl)
        cl_check(clEnqueueReadBuffer(p->queue, t.dev, CL_TRUE, at * t.es, n * t.es, host_at(t, at),
                                     0, NULL, NULL),
                 "download", p->rank);
}

/* Elements [at, at + n) of t set to x (where the calls read it). */
void fill(place *p, tensor t, size_t at, size_t n, float x)
{
    char pattern[4];
    clattn_from_f32(t.dtype, &x, pattern, 1);
    if (p->cl) {
        cl_check(
            clEnqueueFillBuffer(p->queue, t.dev, pattern, t.es, at * t.es, n * t.es, 0, NULL, NULL),
            "fill", p->rank);
        return;
    }
    for (size_t i = 0; i < n; ++i)
        memcpy(host_at(t, at + i), pattern, t.es);
}

/* Waits for the uploads and the calls enqueued so far. */
void finish(place *p)
{
    if (!p->cl)
        return;
    double t0 = MPI_Wtime();
    cl_check(clFinish(p->copies), "finish", p->rank);
    spend(p, T_COPIES, &t0);
    cl_check(clFinish(p->queue), "finish", p->rank);
    spend(p, T_CALLS, &t0);
    if (p->uploaded)
        clReleaseEvent(p->uploaded);
    p->uploaded = NULL;
}

/* Query chunk i against the K/V chunk j of block cur: the partial result,
 * merged into the rank's O and LSE. */
void forward_pair(place *p, slices *r, tensor cur, const clattn_shape *s, int i, int j)
{
    const size_t qa = i * r->qn, la = i * r->ln, ka = j * r->kvn, va = (2 + j) * r->kvn;
    double t0 = MPI_Wtime();
    if (!p->cl) {
        float *lse = host_at(r->lse, la), *lse_part = host_at(r->lse_part, 0);
        check(clattn_forward(p->ctx, s, host_at(r->q, qa), host_at(cur, ka), host_at(cur, va),
                             host_at(r->o_part, 0), lse_part),
              "forward", p->rank);
        check(clattn_merge(p->ctx, s, host_at(r->o, qa), lse, host_at(r->o_part, 0), lse_part,
                           host_at(r->o, qa), lse),
              "merge", p->rank);
        spend(p, T_CALLS, &t0);
        return;
    }
    const cl_uint waits = p->uploaded ? 1u : 0u;
    check(clattn_forward_cl(p->ctx, s, on_dev(r->q, qa), on_dev(cur, ka), on_dev(cur, va),
                            on_dev(r->o_part, 0), on_dev(r->lse_part, 0), waits,
                            waits ? &p->uploaded : NULL, NULL),
          "forward", p->rank);
    check(clattn_merge_cl(p->ctx, s, on_dev(r->o, qa), on_dev(r->lse, la), on_dev(r->o_part, 0),
                          on_dev(r->lse_part, 0), on_dev(r->o, qa), on_dev(r->lse, la), 0, NULL,
                          NULL),
          "merge", p->rank);
    spend(p, T_CALLS, &t0);
}

/* Where the dK sum of chunk j of a block starts (its dV sum follows). */
size_t sums_at(const slices *r, int j) { return (4 + 2 * (size_t)j) * r->kvn; }

/* Query chunk i against K/V chunk j of block cur, adding into the rank's dQ
 * and the block's dK and dV sums of chunk j (s->accumulate is set); *done
 * (OpenCL) becomes the call's event. */
void backward_pair(place *p, slices *r, tensor cur, const clattn_shape *s, int i, int j,
                   cl_event *done)
{
    const size_t qa = i * r->qn, la = i * r->ln, ka = j * r->kvn, va = (2 + j) * r->kvn;
    const size_t dk = sums_at(r, j), dv = dk + r->kvn;
    double t0 = MPI_Wtime();
    if (!p->cl) {
        check(clattn_backward(p->ctx, s, host_at(r->q, qa), host_at(cur, ka), host_at(cur, va),
                              host_at(r->o, qa), host_at(r->lse, la), host_at(r->d_out, qa),
                              host_at(r->dq, qa), host_at(cur, dk), host_at(cur, dv)),
              "backward", p->rank);
        spend(p, T_CALLS, &t0);
        return;
    }
    const cl_uint waits = p->uploaded ? 1u : 0u;
    if (*done)
        clReleaseEvent(*done);
    check(clattn_backward_cl(p->ctx, s, on_dev(r->q, qa), on_dev(cur, ka), on_dev(cur, va),
                             on_dev(r->o, qa), on_dev(r->lse, la), on_dev(r->d_out, qa),
                             on_dev(r->dq, qa), on_dev(cur, dk), on_dev(cur, dv), waits,
                             waits ? &p->uploaded : NULL, done),
          "backward", p->rank);
    spend(p, T_CALLS, &t0);
}

/* Waits for ev (none when NULL) while driving MPI's requests reqs[0..n),
 * which may or may not complete meanwhile. */
void wait_driving(place *p, cl_event ev, MPI_Request *reqs, int n)
{
    if (!ev)
        return;
    clFlush(p->queue);
    clFlush(p->copies);
    for (;;) {
        cl_int status = CL_COMPLETE;
        cl_check(
            clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
            "clGetEventInfo", p->rank);
        cl_check(status < 0 ? status : CL_SUCCESS, "a device command", p->rank);
        if (status == CL_COMPLETE)
            return;
        int flag;
        if (n)
            MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    }
}

/* The dK and dV sums of chunk j of block cur to the host, once `done` (the
 * last call that adds into them; NULL: none this step) has ended, while
 * MPI's requests reqs[0..n) are driven. */
void fetch_sums(place *p, slices *r, tensor cur, int j, cl_event done, MPI_Request *reqs, int n)
{
    if (!p->cl)
        return;
    double t0 = MPI_Wtime();
    wait_driving(p, done, reqs, n);
    spend(p, T_CALLS, &t0);
    cl_event read;
    cl_check(clEnqueueReadBuffer(p->copies, cur.dev, CL_FALSE, sums_at(r, j) * cur.es,
                                 2 * r->kvn * cur.es, host_at(cur, sums_at(r, j)), 0, NULL, &read),
             "download", p->rank);
    wait_driving(p, read, reqs, n);
    clReleaseEvent(read);
    spend(p, T_COPIES, &t0);
}

/* MPI's type for elements of es bytes. */
MPI_Datatype mpi_type(size_t es) { return es == 4 ? MPI_FLOAT : MPI_UINT16_T; }

/* Sends n elements of es bytes from `out` to rank dest and receives n into
 * `in` from rank source, without waiting: req[0] the receive, req[1] the
 * send. */
void pass_on(const void *out, void *in, size_t n, size_t es, int dest, int source, int tag,
             MPI_Request req[2])
{
    MPI_Irecv(in, (int)n, mpi_type(es), source, tag, MPI_COMM_WORLD, &req[0]);
    MPI_Isend(out, (int)n, mpi_type(es), dest, tag, MPI_COMM_WORLD, &req[1]);
}

/* Drives MPI until req[0..1] (if `more`) complete, while the device
 * computes; then the received part [0, n) of `next` goes up to the device. */
void receive_block(place *p, int more, MPI_Request *req, tensor next, size_t n)
{
    if (!more)
        return;
    double t0 = MPI_Wtime();
    int done = 0;
    while (!done)
        MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
    spend(p, T_MPI, &t0);
    upload(p, next, 0, n);
}
