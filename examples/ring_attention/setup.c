/* The ring example's arguments, inputs, chunks and comparisons. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"

/* The check's bound on max |ring - single| / max |single| per dtype: float32
 * sums in another order; 16-bit outputs also rounded at every merge and
 * every step's addition into the travelling dK/dV sums. */
double tolerance(clattn_dtype dtype)
{
    return dtype == CLATTN_DTYPE_F32 ? 1e-4 : dtype == CLATTN_DTYPE_F16 ? 4e-3 : 2e-2;
}

size_t elem_size(clattn_dtype dtype) { return dtype == CLATTN_DTYPE_F32 ? 4u : 2u; }

int parse_uint(const char *s, uint32_t *out)
{
    char *end;
    const unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > UINT32_MAX || s[0] == '-')
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* 0 on success; a message on stderr (rank 0) and 2 on bad arguments. */
int parse_args(int argc, char **argv, args *a, int rank)
{
    memset(a, 0, sizeof *a);
    a->device = "auto";
    a->reps = 1;
    for (int i = 1; i < argc; ++i) {
        const char *o = argv[i];
        uint32_t *target = !strcmp(o, "--q-seq")      ? &a->q_seq
                           : !strcmp(o, "--heads")    ? &a->heads
                           : !strcmp(o, "--kv-heads") ? &a->kv_heads
                           : !strcmp(o, "--head-dim") ? &a->head_dim
                           : !strcmp(o, "--window")   ? &a->window
                           : !strcmp(o, "--reps")     ? &a->reps
                                                      : NULL;
        if (!strcmp(o, "--causal")) {
            a->causal = 1;
        } else if (!strcmp(o, "--sinks")) {
            a->sinks = 1;
        } else if (!strcmp(o, "--dtype") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "f16") ||
                    !strcmp(argv[i + 1], "bf16"))) {
            ++i;
            a->dtype = !strcmp(argv[i], "f32")   ? CLATTN_DTYPE_F32
                       : !strcmp(argv[i], "f16") ? CLATTN_DTYPE_F16
                                                 : CLATTN_DTYPE_BF16;
        } else if (!strcmp(o, "--device") && i + 1 < argc) {
            a->device = argv[++i];
        } else if (target && i + 1 < argc && parse_uint(argv[i + 1], target)) {
            ++i;
        } else {
            if (rank == 0)
                fprintf(stderr,
                        "ring_attention: bad argument '%s'\nusage: mpirun -np N ring_attention "
                        "--q-seq S --heads H --kv-heads KH --head-dim D [--causal] "
                        "[--window W] [--sinks] [--dtype f32|f16|bf16] [--device SEL] "
                        "[--reps R]\n",
                        o);
            return 2;
        }
    }
    if (!a->kv_heads)
        a->kv_heads = a->heads;
    if (!a->q_seq || !a->heads || !a->head_dim || !a->reps) {
        if (rank == 0)
            fprintf(stderr, "ring_attention: --q-seq, --heads and --head-dim are required and "
                            "positive (and --reps)\n");
        return 2;
    }
    return 0;
}

/* Input element i of tensor `which` (0 Q, 1 K, 2 V, 3 dO) in [-1, 1): a
 * hash of its global index, so that every rank makes its own slice and
 * rank 0 the whole without sending inputs around. */
float input_at(int which, uint64_t i)
{
    uint64_t z = i * 4 + (uint64_t)which + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* A failed call ends every rank (the others would wait on it forever). */
void check(clattn_status st, const char *what, int rank)
{
    if (st == CLATTN_OK)
        return;
    fprintf(stderr, "ring_attention: rank %d: %s: %s: %s\n", rank, what, clattn_status_string(st),
            clattn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Whether any query of chunk qc sees any key of chunk kc (chunks of c). */
int chunk_pair_visible(const args *a, uint32_t qc, uint32_t kc, uint32_t c)
{
    const uint64_t q0 = (uint64_t)qc * c, q1 = q0 + c - 1, k0 = (uint64_t)kc * c, k1 = k0 + c - 1;
    return (!a->causal || k0 <= q1) && (!a->window || q0 < k1 + a->window);
}

/* The shape of the pair (query chunk qc, key chunk kc), by its offsets, and
 * whether the masks leave any of it visible (pairs hidden whole are
 * skipped). */
int chunk_pair(const args *a, clattn_shape *s, uint32_t qc, uint32_t kc, uint32_t c)
{
    s->q_offset = qc * c;
    s->kv_offset = kc * c;
    return chunk_pair_visible(a, qc, kc, c);
}

/* The two chunks of rank `owner` (taken modulo the ranks). */
void chunks_of(uint32_t owner, int ranks, uint32_t out[2])
{
    owner %= (uint32_t)ranks;
    out[0] = owner;
    out[1] = 2 * (uint32_t)ranks - 1 - owner;
}

/* Those of the block a rank holds at forward step `step`: the block of the
 * rank `step` places before it. */
void chunks_at(int rank, int ranks, uint32_t step, uint32_t out[2])
{
    chunks_of((uint32_t)(rank + ranks - (int)(step % (uint32_t)ranks)), ranks, out);
}

double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        m = fmax(m, fabs((double)x[i]));
    return m;
}

/* max |got - want| / max |want|, and whether it is within tol. */
int compare(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double worst = 0.0, scale = max_abs(want, n);
    for (size_t i = 0; i < n; ++i) {
        const double e = fabs((double)got[i] - want[i]);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    worst /= scale > 0.0 ? scale : 1.0;
    printf("  %-3s max |ring - single| / max |single| = %.3g%s\n", what, worst,
           worst <= tol ? "" : "  (beyond the tolerance)");
    return worst <= tol;
}
