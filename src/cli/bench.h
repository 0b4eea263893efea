/* clattn bench's timing, shared with clattn tune. */
#ifndef CLATTN_CLI_BENCH_H
#define CLATTN_CLI_BENCH_H

#define CL_TARGET_OPENCL_VERSION 120
#include "clattn_cl.h"
#include "cli.h"

typedef enum bench_op {
    BENCH_GRAD_V,
    BENCH_FORWARD,
    BENCH_BACKWARD,
    BENCH_GRAD_BIAS,
    BENCH_GRAD_PARAMS,
    BENCH_OPS
} bench_op;
/* "grad-v", "forward", "backward", "grad-bias", "grad-score-params" */
extern const char *const bench_op_names[BENCH_OPS];

/* Host tensors: inputs Q K V O LSE dO, outputs in out[0..nout). */
enum { T_Q, T_K, T_V, T_O, T_LSE, T_DO, T_OUT0, T_OUT1, T_OUT2, T_COUNT };

typedef struct bench {
    bench_op op;
    clattn_shape s; /* its dtype is the timed calls' */
    size_t n[T_COUNT];
    float *host[T_COUNT]; /* float32 values (rounded to the dtype when it is 16-bit) */
    void *elems[T_COUNT]; /* the inputs as the timed calls take them: host, or 16-bit */
    float *want[3]; /* native's float32 outputs on the same values: the reference */
    int nout;
} bench;

/* Allocates b's tensors for its op and shape (b->op and b->s set, b->s.dtype
 * the timed calls'), fills the inputs with random values of that dtype and
 * computes O and the LSE by native, and with `reference` native's float32
 * outputs of the op as the reference. 0, or the
 * exit status after printing the failure as `clattn CMD: ...`. */
int bench_prepare(const char *cmd, bench *b, int reference);
void bench_free(bench *b);
/* Times reps calls of the op on ctx after a warm-up call: seconds gets the
 * median, max_error max |got - native| / max |native| over the outputs
 * (NAN on native in float32). OpenCL contexts run on device buffers. */
clattn_status bench_time(clattn_context *ctx, const bench *b, int reps, double *seconds,
                         double *max_error);

#endif
