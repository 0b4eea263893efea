/*
 * Ring attention (context parallelism) over MPI with clattn: each rank owns
 * a slice of the sequence's Q, K, V and dO, the K/V slices travel around a
 * ring of ranks, partial outputs merge through their log-sum-exp, and the
 * backward sends the dK/dV sums around with them, back to their owners.
 *
 *   mpirun -np N ring_attention --q-seq S --heads H --kv-heads KH --head-dim D
 *                               [--causal] [--window W] [--sinks]
 *                               [--dtype f32|f16|bf16] [--device SEL] [--reps R]
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
 * block is already on its way (MPI_Isend / MPI_Irecv). With --sinks (a
 * logit per query head that joins every row's softmax as a key with no
 * value), each query chunk's forward against itself, at step 0, carries
 * them: a sink is one more key, so exactly one of a row's partials holds
 * it, and the merges count it once; the sinks' gradient is each rank's
 * rows' share (clattn_grad_sinks) summed. Backward: given the
 * whole O and LSE, each (query chunk, K/V chunk) pair's clattn_backward()
 * with shape.accumulate adds its share into the rank's dQ and into the dK
 * and dV sums that travel with the K/V block (each chunk's as soon as its
 * pairs are done). The backward goes around the ring the other way,
 * starting from the block the forward ended with (rank + 1's), so that a
 * block's last pairs are its owner's and its sums end there: N - 1 hops of
 * the sums, none back home.
 *
 * On an OpenCL device a rank's tensors stay on the device: the _cl calls
 * and merges are enqueued, MPI is driven while they run, and only the K/V
 * blocks and the sums cross to the host (through mapped, pinned buffers),
 * with the uploads on a queue of their own beside the calls. On the native
 * backend the same loop runs on host memory.
 *
 * After the check, rank 0 prints where the last rep's time went: for the
 * forward and the backward, the most any rank waited on clattn's calls
 * (native: computed them), on copies between device and host and on MPI
 * that the calls did not hide; then a hop's bytes and what MPI and a
 * device-to-host copy of them take alone.
 *
 * Exit status: 0 when the check passes, 1 when it fails or a call does, 2
 * on bad arguments, 77 when a rank cannot open its device.
 *
 * It checks itself: rank 0 gathers O, dQ, dK and dV, runs one single-device
 * forward and backward on the whole sequence, and exits 1 if any differs by
 * more than 1e-4 of that tensor's largest magnitude (the merges and the
 * split sums reorder float32 sums; nothing else differs), or in 16-bit
 * tensors (--dtype) more than 2e-2 (bf16) or 4e-3 (f16): O's merges and the
 * dK/dV sums round at every step. The LSE pairs are float32 always. It
 * prints the ring's time (the last of --reps) and the single call's (its
 * tensors on the device too), whose ratio is the ring's speed-up.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"

/* Rank 0: the ring's results (gathered, per_rank floats a rank: O, dQ, dK,
 * dV of its chunks) against one forward and backward of the whole sequence
 * on this rank's device (kept there, as the ring keeps its tensors, when it
 * is an OpenCL device); prints both times and the differences, and returns
 * whether every difference is within the dtype's tolerance; with
 * ring_sinks_grad (the ranks' sinks gradient summed), that too. */
static int check_single(place *p, const args *a, const clattn_shape *s, tensor gathered,
                        size_t per_rank, double ring_time, double forward_time,
                        const float *ring_sinks_grad)
{
    const int ranks = (int)(a->q_seq / (2 * s->q_seq));
    const size_t qrow = (size_t)a->heads * a->head_dim, kvrow = (size_t)a->kv_heads * a->head_dim;
    const size_t qn = (size_t)s->q_seq * qrow, kvn = (size_t)s->q_seq * kvrow;
    const size_t full_q = (size_t)a->q_seq * qrow, full_kv = (size_t)a->q_seq * kvrow;
    const size_t full_l = (size_t)a->q_seq * 2 * a->heads;
    enum { Q, K, V, DO, O, L, DQ, DK, DV, COUNT };
    const size_t sizes[COUNT] = {full_q, full_kv, full_kv, full_q, full_q,
                                 full_l, full_q,  full_kv, full_kv};
    tensor t[COUNT];
    for (int i = 0; i < COUNT; ++i)
        t[i] = tensor_new(p, sizes[i], i == L ? CLATTN_DTYPE_F32 : a->dtype, 0);
    float *ro = malloc(full_q * 4), *rq = malloc(full_q * 4), *rk = malloc(full_kv * 4);
    float *rv = malloc(full_kv * 4);
    if (!ro || !rq || !rk || !rv)
        MPI_Abort(MPI_COMM_WORLD, 1);
    make_rows(t[Q], 0, 0, 0, a->q_seq, qrow);
    make_rows(t[K], 0, 1, 0, a->q_seq, kvrow);
    make_rows(t[V], 0, 2, 0, a->q_seq, kvrow);
    make_rows(t[DO], 0, 3, 0, a->q_seq, qrow);
    /* The ring's results in sequence order, as float32. */
    for (int r = 0; r < ranks; ++r) {
        const size_t g = (size_t)r * per_rank;
        uint32_t own[2];
        chunks_at(r, ranks, 0, own);
        for (int i = 0; i < 2; ++i) {
            clattn_to_f32(a->dtype, host_at(gathered, g + i * qn), ro + own[i] * qn, qn);
            clattn_to_f32(a->dtype, host_at(gathered, g + 2 * qn + i * qn), rq + own[i] * qn, qn);
            clattn_to_f32(a->dtype, host_at(gathered, g + 4 * qn + 2 * i * kvn),
                          rk + own[i] * kvn, kvn);
            clattn_to_f32(a->dtype, host_at(gathered, g + 4 * qn + (2 * i + 1) * kvn),
                          rv + own[i] * kvn, kvn);
        }
    }
    clattn_shape w = *s;
    w.q_seq = w.kv_seq = a->q_seq;
    w.q_offset = w.kv_offset = 0;
    w.accumulate = 0;
    for (int i = Q; i <= DO; ++i)
        upload(p, t[i], 0, sizes[i]);
    finish(p);
    const double t0 = MPI_Wtime();
    if (p->cl) {
        check(clattn_forward_cl(p->ctx, &w, on_dev(t[Q], 0), on_dev(t[K], 0), on_dev(t[V], 0),
                                on_dev(t[O], 0), on_dev(t[L], 0), 0, NULL, NULL),
              "single forward", 0);
        check(clattn_backward_cl(p->ctx, &w, on_dev(t[Q], 0), on_dev(t[K], 0), on_dev(t[V], 0),
                                 on_dev(t[O], 0), on_dev(t[L], 0), on_dev(t[DO], 0),
                                 on_dev(t[DQ], 0), on_dev(t[DK], 0), on_dev(t[DV], 0), 0, NULL,
                                 NULL),
              "single backward", 0);
        finish(p);
    } else {
        float *lse = host_at(t[L], 0);
        check(clattn_forward(p->ctx, &w, t[Q].host, t[K].host, t[V].host, t[O].host, lse),
              "single forward", 0);
        check(clattn_backward(p->ctx, &w, t[Q].host, t[K].host, t[V].host, t[O].host, lse,
                              t[DO].host, t[DQ].host, t[DK].host, t[DV].host),
              "single backward", 0);
    }
    const double single_time = MPI_Wtime() - t0;
    for (int i = O; i < COUNT; ++i)
        download(p, t[i], 0, sizes[i]);
    static const char *const dtypes[3] = {"f32", "f16", "bf16"};
    printf("ring_attention: %d ranks on '%s', q_seq %u (chunks of %u), heads %u/%u, "
           "head_dim %u, causal %d, window %u%s, %s\n",
           ranks, a->device, a->q_seq, s->q_seq, a->heads, a->kv_heads, a->head_dim, a->causal,
           a->window, a->sinks ? ", sinks" : "", dtypes[a->dtype]);
    printf("  forward + backward: ring %.3f s (forward %.3f s), one call on rank 0's device "
           "%.3f s: %.2fx\n",
           ring_time, forward_time, single_time, single_time / ring_time);
    const double tol = tolerance(a->dtype);
    float *want[4];
    static const int outs[4] = {O, DQ, DK, DV};
    for (int i = 0; i < 4; ++i)
        want[i] = to_floats(t[outs[i]], 0, sizes[outs[i]]);
    int passed = compare("O", ro, want[0], full_q, tol) &
                 compare("dQ", rq, want[1], full_q, tol) &
                 compare("dK", rk, want[2], full_kv, tol) &
                 compare("dV", rv, want[3], full_kv, tol);
    if (ring_sinks_grad) { /* the sinks' gradient: the ranks' shares summed */
        float *ds = malloc(a->heads * sizeof(float));
        if (!ds)
            MPI_Abort(MPI_COMM_WORLD, 1);
        check(clattn_grad_sinks(p->ctx, &w, t[O].host, host_at(t[L], 0), t[DO].host, ds),
              "single grad_sinks", 0);
        passed &= compare("d sinks", ring_sinks_grad, ds, a->heads, tol);
        free(ds);
    }
    for (int i = 0; i < 4; ++i)
        free(want[i]);
    printf("%s\n", passed ? "ok" : "FAILED");
    for (int i = 0; i < COUNT; ++i)
        tensor_free(p, &t[i]);
    free(ro);
    free(rq);
    free(rk);
    free(rv);
    return passed;
}

/* Times one hop of `bytes` alone, the best of three: an MPI exchange with
 * the ring's neighbours (from a's host side into b's), and on an OpenCL
 * context a copy of a's device side to its host side. link[0] the MPI
 * seconds, link[1] the copy's (0 on native). */
static void measure_links(place *p, tensor a, tensor b, size_t bytes, int to, int from,
                          double link[2])
{
    link[0] = link[1] = INFINITY;
    for (int i = 0; i < 3; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Sendrecv(a.host, (int)(bytes / a.es), mpi_type(a.es), to, 9, b.host,
                     (int)(bytes / a.es), mpi_type(a.es), from, 9, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        link[0] = fmin(link[0], MPI_Wtime() - t0);
        if (p->cl) {
            t0 = MPI_Wtime();
            download(p, a, 0, bytes / a.es);
            link[1] = fmin(link[1], MPI_Wtime() - t0);
        }
    }
    if (!p->cl)
        link[1] = 0.0;
}

/* Rank 0: where the last rep's time went, the slowest rank's each kind,
 * and the cost of a hop alone. */
static void report_time(const place *p, double spent[2][T_KINDS], double ring_time,
                        double forward_time, size_t block_bytes, const double link[2])
{
    static const char *const phases[2] = {"forward", "backward"};
    const double phase[2] = {forward_time, ring_time - forward_time};
    for (int i = 0; i < 2; ++i)
        printf("  %-8s %.3f s, waits (each kind's most on any rank): calls %.3f s, copies "
               "%.3f s, MPI %.3f s\n",
               phases[i], phase[i], spent[i][T_CALLS], spent[i][T_COPIES], spent[i][T_MPI]);
    printf("  a hop: %.1f MB of K/V (and as much of dK/dV sums in the backward); alone, MPI "
           "%.2f GB/s",
           block_bytes / 1e6, block_bytes / link[0] / 1e9);
    if (p->cl)
        printf(", device to host %.2f GB/s", block_bytes / link[1] / 1e9);
    printf("\n");
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
    place p = {NULL, NULL, NULL, NULL, NULL, rank, NULL};
    clattn_status st = clattn_context_create(&opts, &p.ctx);
    /* A device this machine lacks: every rank exits 77 (what ctest counts
     * as skipped), after saying so. */
    int here = st == CLATTN_OK, all_here;
    MPI_Allreduce(&here, &all_here, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all_here) {
        if (!here)
            fprintf(stderr, "ring_attention: rank %d: no device '%s': %s: %s\n", rank, device,
                    clattn_status_string(st), clattn_last_error());
        clattn_context_destroy(p.ctx);
        MPI_Finalize();
        return 77;
    }
    p.cl = clattn_context_cl_context(p.ctx);
    p.queue = clattn_context_cl_queue(p.ctx);
    if (p.cl) {
        cl_device_id dev;
        cl_int err = clGetCommandQueueInfo(p.queue, CL_QUEUE_DEVICE, sizeof dev, &dev, NULL);
        if (err == CL_SUCCESS)
            p.copies = clCreateCommandQueue(p.cl, dev, 0, &err);
        cl_check(err, "clCreateCommandQueue", rank);
    }

    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = c;
    s.num_heads = a.heads;
    s.num_kv_heads = a.kv_heads;
    s.head_dim = a.head_dim;
    s.causal = a.causal;
    s.window = a.window;
    s.dtype = a.dtype;
    /* --sinks: fixed logits, from dominant to none (the last head's); the
     * forward of each query chunk against itself carries them */
    float *logits = a.sinks ? malloc(a.heads * sizeof(float)) : NULL;
    for (uint32_t h = 0; logits && h < a.heads; ++h)
        logits[h] = h + 1 == a.heads && h ? -INFINITY : 1.5f - 0.75f * (float)h;
    clattn_shape with_sinks = s;
    with_sinks.sinks = logits;
    if (a.sinks && !logits) {
        st = CLATTN_ERROR_OUT_OF_MEMORY;
        fprintf(stderr, "ring_attention: rank %d: out of memory for the sinks\n", rank);
    } else {
        st = clattn_shape_validate(&with_sinks);
    }
    if (st != CLATTN_OK) {
        if (rank == 0)
            fprintf(stderr, "ring_attention: %s: %s\n", clattn_status_string(st),
                    clattn_last_error());
        free(logits);
        if (p.copies)
            clReleaseCommandQueue(p.copies);
        clattn_context_destroy(p.ctx);
        MPI_Finalize();
        return 2;
    }

    slices r;
    r.qn = (size_t)c * qrow;
    r.kvn = (size_t)c * kvrow;
    r.ln = (size_t)c * 2 * a.heads;
    const size_t qn = r.qn, kvn = r.kvn, ln = r.ln, block = 4 * kvn, sums = 4 * kvn;
    tensor *all[] = {&r.q, &r.d_out, &r.o, &r.lse, &r.dq, &r.o_part, &r.lse_part,
                     &r.home, &r.buf[0], &r.buf[1]};
    const size_t sizes[] = {2 * qn, 2 * qn, 2 * qn, 2 * ln, 2 * qn, qn, ln, block + sums,
                            block + sums, block + sums};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) /* the LSE pairs are float32 */
        *all[i] = tensor_new(&p, sizes[i], i == 3 || i == 6 ? CLATTN_DTYPE_F32 : a.dtype,
                             i >= 7); /* the blocks travel */
    uint32_t mine[2];
    chunks_at(rank, ranks, 0, mine);
    for (int i = 0; i < 2; ++i) {
        make_rows(r.q, i * qn, 0, (uint64_t)mine[i] * c, c, qrow);
        make_rows(r.d_out, i * qn, 3, (uint64_t)mine[i] * c, c, qrow);
    }
    own_block(r.home, mine, c, kvn, kvrow);
    upload(&p, r.q, 0, 2 * qn);
    upload(&p, r.d_out, 0, 2 * qn);
    upload(&p, r.home, 0, block);
    finish(&p);

    const int to = (rank + 1) % ranks, from = (rank + ranks - 1) % ranks;
    double forward_time = 0.0, ring_time = 0.0;
    double spent[2][T_KINDS]; /* forward, backward: the last rep's */
    tensor cur = r.home;
    for (uint32_t rep = 0; rep < a.reps; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        memset(spent, 0, sizeof spent);
        p.spent = spent[0];

        /* ---- forward: O and LSE start empty (merging into them copies) ---- */
        fill(&p, r.o, 0, 2 * qn, 0.0f);
        fill(&p, r.lse, 0, 2 * ln, -1e30f);
        cur = r.home;
        for (uint32_t step = 0; step < n; ++step) {
            MPI_Request req[2];
            const int more = step + 1 < n;
            tensor next = r.buf[step & 1u];
            if (more) /* the next block travels while this one computes */
                pass_on(cur.host, next.host, block, cur.es, to, from, 0, req);
            uint32_t theirs[2];
            chunks_at(rank, ranks, step, theirs);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j)
                    if (chunk_pair(&a, &s, mine[i], theirs[j], c))
                        forward_pair(&p, &r, cur, step == 0 && i == j ? &with_sinks : &s, i,
                                     j);
            receive_block(&p, more, req, next, block);
            finish(&p);
            if (more)
                cur = next;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const double t1 = MPI_Wtime();
        p.spent = spent[1];

        /* ---- backward: around the ring the other way, from the block at
         * hand (that of rank + 1), so that every block's dK/dV sums, which
         * travel with it, end at its owner with its last pairs: n - 1 hops
         * of the sums, none of them home. ---- */
        fill(&p, cur, block, sums, 0.0f);
        fill(&p, r.dq, 0, 2 * qn, 0.0f);
        s.accumulate = 1;
        for (uint32_t step = 0; step < n; ++step) {
            MPI_Request req[6]; /* K/V, then chunk 0's sums, then chunk 1's */
            for (int i = 0; i < 6; ++i)
                req[i] = MPI_REQUEST_NULL;
            const int more = step + 1 < n;
            tensor next = r.buf[(n - 1u + step) & 1u]; /* not the forward's last */
            if (more) /* K and V of the next step, while this one computes */
                pass_on(cur.host, next.host, block, cur.es, from, to, 0, req);
            uint32_t theirs[2];
            chunks_of((uint32_t)rank + 1u + step, ranks, theirs);
            cl_event done[2] = {NULL, NULL};
            for (int j = 0; j < 2; ++j)
                for (int i = 0; i < 2; ++i)
                    if (chunk_pair(&a, &s, mine[i], theirs[j], c))
                        backward_pair(&p, &r, cur, &s, i, j, &done[j]);
            /* The sums go on with their block, chunk 0's while chunk 1's
             * are computed; after the last step they are home. */
            for (int j = 0; j < 2 && more; ++j) {
                const size_t at = sums_at(&r, j);
                fetch_sums(&p, &r, cur, j, done[j], req, 2 + 2 * j);
                pass_on(host_at(cur, at), host_at(next, at), 2 * kvn, cur.es, from, to, 1 + j,
                        req + 2 + 2 * j);
            }
            for (int j = 0; j < 2; ++j)
                if (done[j])
                    clReleaseEvent(done[j]);
            double tw = MPI_Wtime();
            MPI_Waitall(6, req, MPI_STATUSES_IGNORE);
            spend(&p, T_MPI, &tw);
            if (more)
                upload(&p, next, 0, block + sums);
            finish(&p);
            if (more)
                cur = next;
        }
        download(&p, cur, block, sums); /* this rank's own dK and dV */
        s.accumulate = 0;
        p.spent = NULL;
        MPI_Barrier(MPI_COMM_WORLD);
        forward_time = t1 - t0; /* the last rep's */
        ring_time = MPI_Wtime() - t0;
    }
    /* cur, the rank's own block again, holds its dK and dV sums. */
    download(&p, r.o, 0, 2 * qn);
    download(&p, r.dq, 0, 2 * qn);
    /* With sinks, their gradient: each rank's rows' share (its two query
     * chunks as one shape of 2c rows), summed over the ranks. */
    float *sinks_grad = NULL;
    if (logits) {
        download(&p, r.lse, 0, 2 * ln);
        finish(&p);
        clattn_shape g = with_sinks;
        g.q_seq = g.kv_seq = 2 * c;
        g.window = 0;
        float *share = malloc(a.heads * sizeof(float));
        sinks_grad = malloc(a.heads * sizeof(float));
        if (!share || !sinks_grad)
            MPI_Abort(MPI_COMM_WORLD, 1);
        check(clattn_grad_sinks(p.ctx, &g, r.o.host, host_at(r.lse, 0), r.d_out.host, share),
              "grad_sinks", rank);
        MPI_Reduce(share, sinks_grad, (int)a.heads, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        free(share);
    }

    /* ---- rank 0 gathers and checks against one single-device call ---- */
    const size_t per_rank = 4 * qn + sums;
    const size_t es = elem_size(a.dtype);
    tensor gathered = {NULL, a.dtype, es, NULL, NULL};
    char *mine_all = malloc(per_rank * es);
    gathered.host = rank == 0 ? malloc(per_rank * (size_t)ranks * es) : NULL;
    if (!mine_all || (rank == 0 && !gathered.host))
        MPI_Abort(MPI_COMM_WORLD, 1);
    memcpy(mine_all, r.o.host, 2 * qn * es);
    memcpy(mine_all + 2 * qn * es, r.dq.host, 2 * qn * es);
    memcpy(mine_all + 4 * qn * es, host_at(cur, block), sums * es);
    MPI_Gather(mine_all, (int)per_rank, mpi_type(es), gathered.host, (int)per_rank, mpi_type(es),
               0, MPI_COMM_WORLD);
    /* Where the time went (the slowest rank's, each kind), and what a hop
     * costs alone. */
    double slowest[2][T_KINDS], link[2], slowest_link[2];
    MPI_Reduce(spent, slowest, 2 * T_KINDS, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    measure_links(&p, r.buf[0], r.buf[1], block * es, to, from, link);
    MPI_Reduce(link, slowest_link, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    int passed = 1;
    if (rank == 0) {
        passed = check_single(&p, &a, &with_sinks, gathered, per_rank, ring_time, forward_time,
                              sinks_grad);
        report_time(&p, slowest, ring_time, forward_time, block * es, slowest_link);
    }
    MPI_Bcast(&passed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(gathered.host);
    free(mine_all);
    free(logits);
    free(sinks_grad);
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        tensor_free(&p, all[i]);
    if (p.copies)
        clReleaseCommandQueue(p.copies);
    clattn_context_destroy(p.ctx);
    MPI_Finalize();
    return passed ? 0 : 1;
}
