/* What the ring attention example's files share (main.c, setup.c,
 * place.c): its arguments, a rank's tensors and where they live, and the
 * functions each file offers; each is described where it is defined. */
#ifndef CLATTN_EXAMPLE_RING_H
#define CLATTN_EXAMPLE_RING_H

#include <mpi.h>
#include <stdint.h>

#include <clattn_cl.h>

typedef struct args {
    uint32_t q_seq, heads, kv_heads, head_dim, window, reps;
    int causal;
    int sinks; /* --sinks: learnable sinks (fixed logits here) in the forward */
    clattn_dtype dtype;
    const char *device;
} args;

/* Host memory, and on an OpenCL context a device buffer of the same size,
 * of elements of a dtype (es bytes). */
typedef struct tensor {
    char *host;
    clattn_dtype dtype;
    size_t es;
    cl_mem dev;    /* NULL on a native context */
    cl_mem pinned; /* the buffer that host maps, for the blocks that travel */
} tensor;

/* Where a rank's time goes in a phase, in seconds of waiting: on clattn's
 * calls (native: computing them; OpenCL: enqueueing them and waiting for
 * the device), on copies between device and host that the calls did not
 * hide, and on MPI transfers that the calls did not hide. */
enum { T_CALLS, T_COPIES, T_MPI, T_KINDS };

typedef struct place {
    clattn_context *ctx;
    cl_context cl;           /* NULL on a native context */
    cl_command_queue queue;  /* clattn's (in order): the calls */
    cl_command_queue copies; /* ours: uploads beside the calls */
    cl_event uploaded;       /* the last upload, which the next calls wait for */
    int rank;
    double *spent; /* the phase's T_KINDS sums, or NULL */
} place;

/* A rank's tensors: its two chunks of Q, dO, O, the LSE pairs and dQ; the
 * K/V blocks (K of two chunks, V of them, then dK and dV of the first chunk,
 * then of the second): its own (home) and two that the others' pass
 * through. */
typedef struct slices {
    tensor q, d_out, o, lse, dq, o_part, lse_part, home, buf[2];
    size_t qn, kvn, ln; /* elements of a chunk of Q (dO, O, dQ), of K (V), of the LSE */
} slices;

double tolerance(clattn_dtype dtype);
size_t elem_size(clattn_dtype dtype);
int parse_uint(const char *s, uint32_t *out);
int parse_args(int argc, char **argv, args *a, int rank);
float input_at(int which, uint64_t i);
void check(clattn_status st, const char *what, int rank);
int chunk_pair_visible(const args *a, uint32_t qc, uint32_t kc, uint32_t c);
int chunk_pair(const args *a, clattn_shape *s, uint32_t qc, uint32_t kc, uint32_t c);
void chunks_of(uint32_t owner, int ranks, uint32_t out[2]);
void chunks_at(int rank, int ranks, uint32_t step, uint32_t out[2]);
double max_abs(const float *x, size_t n);
int compare(const char *what, const float *got, const float *want, size_t n, double tol);
void *host_at(tensor t, size_t i);
void make_rows(tensor t, size_t at, int which, uint64_t pos0, size_t rows, size_t row_elems);
void own_block(tensor block, const uint32_t mine[2], uint32_t c, size_t kvn, size_t kvrow);
float *to_floats(tensor t, size_t at, size_t n);
void spend(place *p, int k, double *t0);
void cl_check(cl_int err, const char *what, int rank);
tensor tensor_new(const place *p, size_t n, clattn_dtype dtype, int pinned);
void tensor_free(const place *p, tensor *t);
clattn_cl_tensor on_dev(tensor t, size_t at);
void upload(place *p, tensor t, size_t at, size_t n);
void download(place *p, tensor t, size_t at, size_t n);
void fill(place *p, tensor t, size_t at, size_t n, float x);
void finish(place *p);
void forward_pair(place *p, slices *r, tensor cur, const clattn_shape *s, int i, int j);
size_t sums_at(const slices *r, int j);
void backward_pair(place *p, slices *r, tensor cur, const clattn_shape *s, int i, int j,
                   cl_event *done);
void wait_driving(place *p, cl_event ev, MPI_Request *reqs, int n);
void fetch_sums(place *p, slices *r, tensor cur, int j, cl_event done, MPI_Request *reqs, int n);
MPI_Datatype mpi_type(size_t es);
void pass_on(const void *out, void *in, size_t n, size_t es, int dest, int source, int tag,
             MPI_Request req[2]);
void receive_block(place *p, int more, MPI_Request *req, tensor next, size_t n);

#endif
