/*
 * Ring attention (context parallelism) over MPI with clattn: each rank owns
 * a slice of the sequence's Q, K, V and dO, the K/V slices travel around a
 * ring of ranks, partial outputs merge through their log-sum-exp, and the
 * backward sends the dK/dV sums around with them, back to their owners.
 *
 *   mpirun -np N ring_attention --q-seq S --heads H --kv-heads KH --head-dim D
 *                               [--causal] [--window W] [--device SEL] [--reps R]
 *
 * The sequence is cut into 2N chunks of S / (2N) positions; rank r owns
 * chunks r and 2N - 1 - r (zigzag sharding), so that under a causal mask
 * every rank has the same work. Self-attention (kv_seq = q_seq), batch 1.
 * "{rank}" in SEL becomes the rank: --device 1:{rank} gives rank r device r
 * of OpenCL platform 1 (as `clattn devices` numbers them), a GPU per rank.
 *
 * Forward: at each of N steps a rank runs clattn_forward() for its two
 * query chunks against the two K/V chunks it holds (with their global
 * offsets; pairs that the mask hides whole are skipped) and merges each
 * result into its O and LSE (clattn_merge(), in place), while the next K/V
 * block is already on its way (MPI_Isend / MPI_Irecv). Backward: given the
 * whole O and LSE, each (query chunk, K/V chunk) pair's clattn_backward()
 * with shape.accumulate adds its share into the rank's dQ and into the dK
 * and dV sums that travel with the K/V block; after N steps one more hop
 * returns those sums to their owner.
 *
 * Exit status: 0 when the check passes, 1 when it fails or a call does, 2
 * on bad arguments, 77 when a rank cannot open its device.
 *
 * It checks itself: rank 0 gathers O, dQ, dK and dV, runs one single-device
 * forward and backward on the whole sequence, and exits 1 if any differs by
 * more than 1e-4 of that tensor's largest magnitude (the merges and the
 * split sums reorder float32 sums; nothing else differs). It prints the
 * ring's time and the single call's.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <clattn.h>

#define TOLERANCE 1e-4

typedef struct args {
    uint32_t q_seq, heads, kv_heads, head_dim, window, reps;
    int causal;
    const char *device;
} args;

static int parse_uint(const char *s, uint32_t *out)
{
    char *end;
    const unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > UINT32_MAX || s[0] == '-')
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* 0 on success; a message on stderr (rank 0) and 2 on bad arguments. */
static int parse_args(int argc, char **argv, args *a, int rank)
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
        } else if (!strcmp(o, "--device") && i + 1 < argc) {
            a->device = argv[++i];
        } else if (target && i + 1 < argc && parse_uint(argv[i + 1], target)) {
            ++i;
        } else {
            if (rank == 0)
                fprintf(stderr,
                        "ring_attention: bad argument '%s'\nusage: mpirun -np N ring_attention "
                        "--q-seq S --heads H --kv-heads KH --head-dim D [--causal] "
                        "[--window W] [--device SEL] [--reps R]\n",
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
static float input_at(int which, uint64_t i)
{
    uint64_t z = i * 4 + (uint64_t)which + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* Rows [pos0, pos0 + rows) of tensor `which`, each row_elems wide. */
static void make_rows(float *dst, int which, uint64_t pos0, size_t rows, size_t row_elems)
{
    for (size_t i = 0; i < rows * row_elems; ++i)
        dst[i] = input_at(which, pos0 * row_elems + i);
}

/* A failed call ends every rank (the others would wait on it forever). */
static void check(clattn_status st, const char *what, int rank)
{
    if (st == CLATTN_OK)
        return;
    fprintf(stderr, "ring_attention: rank %d: %s: %s: %s\n", rank, what,
            clattn_status_string(st), clattn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Whether any query of chunk qc sees any key of chunk kc (chunks of c). */
static int chunk_pair_visible(const args *a, uint32_t qc, uint32_t kc, uint32_t c)
{
    const uint64_t q0 = (uint64_t)qc * c, q1 = q0 + c - 1, k0 = (uint64_t)kc * c, k1 = k0 + c - 1;
    return (!a->causal || k0 <= q1) && (!a->window || q0 < k1 + a->window);
}

/* The shape of the pair (query chunk qc, key chunk kc), by its offsets, and
 * whether the masks leave any of it visible (pairs hidden whole are
 * skipped). */
static int chunk_pair(const args *a, clattn_shape *s, uint32_t qc, uint32_t kc, uint32_t c)
{
    s->q_offset = qc * c;
    s->kv_offset = kc * c;
    return chunk_pair_visible(a, qc, kc, c);
}

/* The two chunks of the block a rank holds at a ring step: those of the
 * rank `step` places before it. */
static void chunks_at(int rank, int ranks, uint32_t step, uint32_t out[2])
{
    const uint32_t owner = (uint32_t)((rank + ranks - (int)step) % ranks);
    out[0] = owner;
    out[1] = 2 * (uint32_t)ranks - 1 - owner;
}

/* K of chunks mine[0..1], then V of them, into a block (kvn elements a
 * chunk). */
static void own_block(float *block, const uint32_t mine[2], uint32_t c, size_t kvn, size_t kvrow)
{
    for (int i = 0; i < 2; ++i) {
        make_rows(block + i * kvn, 1, (uint64_t)mine[i] * c, c, kvrow);
        make_rows(block + (2 + i) * kvn, 2, (uint64_t)mine[i] * c, c, kvrow);
    }
}

static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        m = fmax(m, fabs((double)x[i]));
    return m;
}

/* max |got - want| / max |want|, and whether it is within TOLERANCE. */
static int compare(const char *what, const float *got, const float *want, size_t n)
{
    double worst = 0.0, scale = max_abs(want, n);
    for (size_t i = 0; i < n; ++i) {
        const double e = fabs((double)got[i] - want[i]);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    worst /= scale > 0.0 ? scale : 1.0;
    printf("  %-3s max |ring - single| / max |single| = %.3g%s\n", what, worst,
           worst <= TOLERANCE ? "" : "  (beyond the tolerance)");
    return worst <= TOLERANCE;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    args a;
    int rc = parse_args(argc, argv, &a, rank);
    const uint32_t n = (uint32_t)ranks, chunks = 2 * n;
    if (!rc && a.q_seq % chunks) {
        if (rank == 0)
            fprintf(stderr, "ring_attention: --q-seq %u is not a multiple of 2 x %u ranks\n",
                    a.q_seq, n);
        rc = 2;
    }
    if (rc) {
        MPI_Finalize();
        return rc;
    }
    const uint32_t c = a.q_seq / chunks;
    const size_t qrow = (size_t)a.heads * a.head_dim, kvrow = (size_t)a.kv_heads * a.head_dim;
    const size_t qn = (size_t)c * qrow, kvn = (size_t)c * kvrow, ln = (size_t)c * 2 * a.heads;

    /* The device: "{rank}" in the selector becomes the rank. */
    char device[256];
    const char *mark = strstr(a.device, "{rank}");
    if (mark)
        snprintf(device, sizeof device, "%.*s%d%s", (int)(mark - a.device), a.device, rank,
                 mark + 6);
    else
        snprintf(device, sizeof device, "%s", a.device);
    clattn_options opts = clattn_options_default();
    opts.device = device;
    clattn_context *ctx = NULL;
    clattn_status st = clattn_context_create(&opts, &ctx);
    /* A device this machine lacks: every rank exits 77 (what ctest counts
     * as skipped), after saying so. */
    int here = st == CLATTN_OK, all_here;
    MPI_Allreduce(&here, &all_here, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all_here) {
        if (!here)
            fprintf(stderr, "ring_attention: rank %d: no device '%s': %s: %s\n", rank, device,
                    clattn_status_string(st), clattn_last_error());
        clattn_context_destroy(ctx);
        MPI_Finalize();
        return 77;
    }

    /* This rank's two chunks of Q and dO, its outputs, and the K/V block
     * (its own two chunks, then each other rank's in turn) with dK and dV. */
    uint32_t mine[2];
    chunks_at(rank, ranks, 0, mine);
    float *q = malloc(2 * qn * sizeof(float)), *d_out = malloc(2 * qn * sizeof(float));
    float *o = malloc(2 * qn * sizeof(float)), *lse = malloc(2 * ln * sizeof(float));
    float *dq = malloc(2 * qn * sizeof(float)), *o_part = malloc(qn * sizeof(float));
    float *lse_part = malloc(ln * sizeof(float));
    /* A block: K of both chunks, V of both, then (backward) dK and dV. */
    const size_t block = 4 * kvn, grads = 4 * kvn;
    float *cur = malloc((block + grads) * sizeof(float));
    float *next = malloc((block + grads) * sizeof(float));
    if (!q || !d_out || !o || !lse || !dq || !o_part || !lse_part || !cur || !next) {
        fprintf(stderr, "ring_attention: out of memory on rank %d\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < 2; ++i) {
        make_rows(q + i * qn, 0, (uint64_t)mine[i] * c, c, qrow);
        make_rows(d_out + i * qn, 3, (uint64_t)mine[i] * c, c, qrow);
    }
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = c;
    s.num_heads = a.heads;
    s.num_kv_heads = a.kv_heads;
    s.head_dim = a.head_dim;
    s.causal = a.causal;
    s.window = a.window;
    if ((st = clattn_shape_validate(&s)) != CLATTN_OK) {
        if (rank == 0)
            fprintf(stderr, "ring_attention: %s: %s\n", clattn_status_string(st),
                    clattn_last_error());
        clattn_context_destroy(ctx);
        MPI_Finalize();
        return 2;
    }
    const int to = (rank + 1) % ranks, from = (rank + ranks - 1) % ranks;
    double ring_time = 0.0;
    for (uint32_t rep = 0; rep < a.reps; ++rep) {
        own_block(cur, mine, c, kvn, kvrow);
        for (size_t i = 0; i < 2 * qn; ++i)
            o[i] = 0.0f;
        for (size_t i = 0; i < 2 * ln; ++i)
            lse[i] = -1e30f; /* empty rows: merging into them copies */
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();

        /* ---- forward ---- */
        for (uint32_t step = 0; step < n; ++step) {
            MPI_Request req[2];
            const int more = step + 1 < n;
            if (more) {
                MPI_Irecv(next, (int)block, MPI_FLOAT, from, 0, MPI_COMM_WORLD, &req[0]);
                MPI_Isend(cur, (int)block, MPI_FLOAT, to, 0, MPI_COMM_WORLD, &req[1]);
            }
            uint32_t theirs[2];
            chunks_at(rank, ranks, step, theirs);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) {
                    if (!chunk_pair(&a, &s, mine[i], theirs[j], c))
                        continue;
                    check(clattn_forward(ctx, &s, q + i * qn, cur + j * kvn,
                                         cur + (2 + j) * kvn, o_part, lse_part),
                          "forward", rank);
                    check(clattn_merge(ctx, &s, o + i * qn, lse + i * ln, o_part, lse_part,
                                       o + i * qn, lse + i * ln),
                          "merge", rank);
                }
            if (more) {
                MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
                float *swap = cur;
                cur = next;
                next = swap;
            }
        }

        /* ---- backward: the block starts at home again, with zero sums ---- */
        own_block(cur, mine, c, kvn, kvrow);
        memset(cur + block, 0, grads * sizeof(float));
        memset(dq, 0, 2 * qn * sizeof(float));
        s.accumulate = 1;
        for (uint32_t step = 0; step < n; ++step) {
            MPI_Request req[2];
            const int more = step + 1 < n;
            if (more) { /* K and V of the next step, while this one computes */
                MPI_Irecv(next, (int)block, MPI_FLOAT, from, 0, MPI_COMM_WORLD, &req[0]);
                MPI_Isend(cur, (int)block, MPI_FLOAT, to, 0, MPI_COMM_WORLD, &req[1]);
            }
            uint32_t theirs[2];
            chunks_at(rank, ranks, step, theirs);
            float *dk = cur + block, *dv = cur + block + 2 * kvn;
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) {
                    if (!chunk_pair(&a, &s, mine[i], theirs[j], c))
                        continue;
                    check(clattn_backward(ctx, &s, q + i * qn, cur + j * kvn,
                                          cur + (2 + j) * kvn, o + i * qn, lse + i * ln,
                                          d_out + i * qn, dq + i * qn, dk + j * kvn,
                                          dv + j * kvn),
                          "backward", rank);
                }
            if (more)
                MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
            /* The sums go on with their block: to the next rank, and after
             * the last step home to the owner (which is the next rank). */
            MPI_Sendrecv(cur + block, (int)grads, MPI_FLOAT, to, 1, next + block, (int)grads,
                         MPI_FLOAT, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            float *swap = cur;
            cur = next;
            next = swap;
        }
        s.accumulate = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        ring_time = MPI_Wtime() - t0; /* the last rep's */
    }
    /* After the last hop cur + block holds this rank's own dK and dV (the
     * K/V part of cur is stale: the sums came back alone). */

    /* ---- rank 0 gathers and checks against one single-device call ---- */
    const size_t per_rank = 4 * qn + grads;
    float *mine_all = malloc(per_rank * sizeof(float));
    float *gathered = rank == 0 ? malloc(per_rank * (size_t)ranks * sizeof(float)) : NULL;
    if (!mine_all || (rank == 0 && !gathered))
        MPI_Abort(MPI_COMM_WORLD, 1);
    memcpy(mine_all, o, 2 * qn * sizeof(float));
    memcpy(mine_all + 2 * qn, dq, 2 * qn * sizeof(float));
    memcpy(mine_all + 4 * qn, cur + block, grads * sizeof(float));
    MPI_Gather(mine_all, (int)per_rank, MPI_FLOAT, gathered, (int)per_rank, MPI_FLOAT, 0,
               MPI_COMM_WORLD);
    int passed = 1;
    if (rank == 0) {
        const size_t full_q = (size_t)a.q_seq * qrow, full_kv = (size_t)a.q_seq * kvrow;
        const size_t full_l = (size_t)a.q_seq * 2 * a.heads;
        float *fq = malloc(full_q * 4), *fk = malloc(full_kv * 4), *fv = malloc(full_kv * 4);
        float *fdo = malloc(full_q * 4), *fo = malloc(full_q * 4), *fl = malloc(full_l * 4);
        float *gq = malloc(full_q * 4), *gk = malloc(full_kv * 4), *gv = malloc(full_kv * 4);
        float *ro = malloc(full_q * 4), *rq = malloc(full_q * 4), *rk = malloc(full_kv * 4);
        float *rv = malloc(full_kv * 4);
        if (!fq || !fk || !fv || !fdo || !fo || !fl || !gq || !gk || !gv || !ro || !rq || !rk ||
            !rv)
            MPI_Abort(MPI_COMM_WORLD, 1);
        make_rows(fq, 0, 0, a.q_seq, qrow);
        make_rows(fk, 1, 0, a.q_seq, kvrow);
        make_rows(fv, 2, 0, a.q_seq, kvrow);
        make_rows(fdo, 3, 0, a.q_seq, qrow);
        /* The ring's results in sequence order. */
        for (int r = 0; r < ranks; ++r) {
            const float *g = gathered + (size_t)r * per_rank;
            uint32_t own[2];
            chunks_at(r, ranks, 0, own);
            for (int i = 0; i < 2; ++i) {
                memcpy(ro + own[i] * qn, g + i * qn, qn * 4);
                memcpy(rq + own[i] * qn, g + 2 * qn + i * qn, qn * 4);
                memcpy(rk + own[i] * kvn, g + 4 * qn + i * kvn, kvn * 4);
                memcpy(rv + own[i] * kvn, g + 4 * qn + (2 + i) * kvn, kvn * 4);
            }
        }
        clattn_shape w = s;
        w.q_seq = w.kv_seq = a.q_seq;
        w.q_offset = w.kv_offset = 0;
        const double t0 = MPI_Wtime();
        check(clattn_forward(ctx, &w, fq, fk, fv, fo, fl), "single forward", rank);
        check(clattn_backward(ctx, &w, fq, fk, fv, fo, fl, fdo, gq, gk, gv), "single backward",
              rank);
        const double single_time = MPI_Wtime() - t0;
        {
            printf("ring_attention: %d ranks on '%s', q_seq %u (chunks of %u), heads %u/%u, "
                   "head_dim %u, causal %d, window %u\n",
                   ranks, a.device, a.q_seq, c, a.heads, a.kv_heads, a.head_dim, a.causal,
                   a.window);
            printf("  forward + backward: ring %.3f s, one call on rank 0's device %.3f s "
                   "(%.2fx)\n",
                   ring_time, single_time, single_time / ring_time);
            passed = compare("O", ro, fo, full_q) & compare("dQ", rq, gq, full_q) &
                     compare("dK", rk, gk, full_kv) & compare("dV", rv, gv, full_kv);
            printf("%s\n", passed ? "ok" : "FAILED");
        }
        float *frees[] = {fq, fk, fv, fdo, fo, fl, gq, gk, gv, ro, rq, rk, rv};
        for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
            free(frees[i]);
    }
    MPI_Bcast(&passed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(gathered);
    free(mine_all);
    float *frees[] = {q, d_out, o, lse, dq, o_part, lse_part, cur, next};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; ++i)
        free(frees[i]);
    clattn_context_destroy(ctx);
    MPI_Finalize();
    return passed ? 0 : 1;
}
