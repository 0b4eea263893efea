/* The native backend: the contract in plain C, threaded.
 *
 * Key-side ops (grad-V, grad-K and both at once) are split into jobs of
 * KEY_BLOCK keys of one (batch, KV head); a job keeps its K and V, and its
 * dK and dV, transposed, so that the block's keys lie along a vector, and
 * streams the query rows that see them (every head of the group) CHUNK at a
 * time. Query-side ops (forward, grad-Q) are split into jobs of QUERY_BLOCK
 * query rows of one (batch, head), kept transposed so that the rows lie
 * along a vector, and stream the keys KEY_BLOCK at a time (an online
 * softmax for the forward, whose per-row state is a vector too). The
 * backward's dQ is summed in its key-side jobs where that pays (see
 * fuse_grad_q), else it has a query-side pass of its own, which computes
 * the scores and dP a second time.
 * The rows a side streams (K and V for the query side, Q and dO for the
 * key side) are copied head-major: the forward reads float32 K in place,
 * and packs V by transposed tiles (native.h's vt) in its jobs, as they
 * first need them; a key side that runs first (grad-V, grad-K, the fused
 * backward) copies Q's and dO's rows and makes Dsum in its jobs too
 * (kernels.c's ready_rows); the two-pass backward copies what both
 * its sides read, and makes Dsum, in a round of its own first.
 * A job is the blocks of one head that fall to one of its parts, taken to
 * and fro (native.h), so that the parts of a head weigh the same under a
 * causal mask; heads are cut into as many parts as give every thread eight
 * jobs or so (plan_call). Threads take jobs from a shared counter, so a
 * thread held up elsewhere holds up no other, and no job depends on
 * another's, so the result does not depend on which thread ran what; the
 * fused backward's dQ is summed in one copy per key-side part, in the
 * blocks' order, so it comes out the same on every run with as many
 * parts, rounded differently with another count. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "native.h"
#include "pool.h"

#if CLATTN_NATIVE_LEVELS
#include <cpuid.h>
#endif

/* CLATTN_NUM_THREADS when set (a whole number from 1, capped at
 * NATIVE_MAX_THREADS; anything else is refused), else every online CPU. */
static clattn_status default_threads(int *out)
{
    const char *env = getenv("CLATTN_NUM_THREADS");
    if (env && *env) {
        char *end;
        errno = 0;
        const long n = strtol(env, &end, 10);
        if (*end != '\0' || n < 1 || errno == ERANGE || *env == '+' || *env == ' ')
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_NUM_THREADS='%s': want a whole number of threads, 1 or "
                               "more", env);
        *out = n > NATIVE_MAX_THREADS ? NATIVE_MAX_THREADS : (int)n;
        return CLATTN_OK;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    *out = n < 1 ? 1 : n > NATIVE_MAX_THREADS ? NATIVE_MAX_THREADS : (int)n;
    return CLATTN_OK;
}

/* The hot loops for this CPU: the highest level it has, at most
 * CLATTN_NATIVE_LEVEL (v4, v3 or baseline) when that is set. */
clattn_status clattn_native_pick_kernels(const native_kernels **out)
{
    const char *cap = getenv("CLATTN_NATIVE_LEVEL");
    int level = 4;
    if (cap && *cap) {
        level = !strcmp(cap, "v4") ? 4 : !strcmp(cap, "v3") ? 3 : !strcmp(cap, "baseline") ? 0 : -1;
        if (level < 0)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_NATIVE_LEVEL='%s': want v4, v3 or baseline", cap);
    }
    *out = &clattn_native_baseline;
#if CLATTN_NATIVE_LEVELS
    __builtin_cpu_init();
    /* F16C from CPUID itself: Clang's __builtin_cpu_supports has no "f16c". */
    unsigned eax, ebx, ecx = 0, edx;
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    const int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && f16c;
    const int v4 = v3 && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (level >= 4 && v4)
        *out = &clattn_native_v4;
    else if (level >= 3 && v3)
        *out = &clattn_native_v3;
#else
    (void)level;
#endif
    return CLATTN_OK;
}

/* The next n floats of the scratch (NULL for none: no arithmetic on a
 * scratch that was never needed, and is NULL). */
static float *take(float **next, size_t n)
{
    if (!n)
        return NULL;
    float *p = *next;
    *next += n;
    return p;
}

/* The next n claim flags of the scratch (a float's room each), all 0
 * (not made): vt_state's and row_state's. */
static atomic_int *take_states(float **next, size_t n)
{
    _Static_assert(sizeof(atomic_int) <= sizeof(float), "a flag in a float's room");
    atomic_int *states = (atomic_int *)take(next, n);
    for (size_t i = 0; i < n; ++i)
        atomic_init(&states[i], 0);
    return states;
}

/* Tensor r head-major: t[r] itself where it is float32 with one head, else
 * a copy in dst (16-bit rows widened as they are packed). The copy is
 * queued (four at most), and made by the call's round of copies (setup_call). */
static const float *head_major(native_call *c, const void *const *t, clattn_role r, size_t heads,
                               size_t rows, float *dst)
{
    if (c->s->dtype == CLATTN_DTYPE_F32 && heads == 1)
        return t[r];
    struct native_pack *p = &c->pack[c->packs++];
    p->src = t[r];
    p->dtype = c->s->dtype;
    p->dst = dst;
    p->heads = heads;
    p->rows = rows;
    p->jobs = c->s->batch * heads * ((rows + PACK_ROWS - 1) / PACK_ROWS);
    return dst;
}

/* floats of the head-major copy of a tensor of n elements over `heads`
 * heads: none where the tensor serves as it is. */
static size_t head_major_floats(const clattn_shape *s, size_t heads, size_t n)
{
    return s->dtype == CLATTN_DTYPE_F32 && heads == 1 ? 0 : n;
}

/* The fused backward's dQ copies (zeroed by the key-side jobs) are summed
 * into dQ by (batch, head, SUM_ROWS rows). */
enum { SUM_ROWS = 64 };

static void sum_dq_job(const native_call *c, size_t job)
{
    const clattn_shape *s = c->s;
    const size_t D = s->head_dim, per_head = (s->q_seq + (size_t)SUM_ROWS - 1) / SUM_ROWS;
    const size_t bh = job / per_head, head = bh % s->num_heads, b = bh / s->num_heads;
    const size_t pos0 = job % per_head * SUM_ROWS;
    const size_t end = pos0 + SUM_ROWS < s->q_seq ? pos0 + SUM_ROWS : s->q_seq;
    const size_t copies = c->key_parts - (size_t)c->dq_in_place;
    const int f32 = s->dtype == CLATTN_DTYPE_F32;
    float row[CLATTN_MAX_HEAD_DIM]; /* a 16-bit dQ's row, summed in float32 */
    for (size_t pos = pos0; pos < end; ++pos) {
        const size_t at = ((b * s->q_seq + pos) * s->num_heads + head) * D;
        float *out = f32 ? (float *)c->dq + at : row;
        const float *part = c->dq_part + (bh * s->q_seq + pos) * D;
        if (c->dq_in_place)
            ; /* part 0's sums are there */
        else if (!s->accumulate)
            memset(out, 0, D * sizeof(float));
        else if (!f32)
            c->hot->widen(s->dtype, (const uint16_t *)c->dq + at, row, D);
        for (size_t t = 0; t < copies; ++t) /* copy by copy, along the row */
            for (size_t d = 0; d < D; ++d)
                out[d] += part[t * c->dq_part_floats + d];
        if (!f32)
            c->hot->narrow(s->dtype, row, (uint16_t *)c->dq + at, D);
    }
}

/* Whether the backward sums dQ in its key-side jobs, in `copies` parts:
 * that spares the query-side pass's second computation of the scores and
 * dP (4 * head_dim flops a visible pair), for zeroing and summing a dQ
 * copy per part (2 * copies * |dQ| floats of memory traffic). It pays
 * where a row sees enough keys: on average 12.5 per copy, taking 25 flops
 * to the cost of a float moved. CLATTN_NATIVE_FUSED_DQ=0 or 1 decides
 * instead (tests, measurements). */
static int fuse_grad_q(const clattn_shape *s, int copies)
{
    const char *env = getenv("CLATTN_NATIVE_FUSED_DQ");
    if (env && *env)
        return strcmp(env, "0") != 0;
    const double rows = (double)s->batch * s->num_heads * s->q_seq;
    return (double)clattn_shape_visible_pairs(s) >= 12.5 * copies * rows;
}

/* Parts to cut each of `heads` heads of `blocks` blocks into: enough for
 * eight jobs a thread, and at least two blocks a part where a head has
 * them (a pair taken to and fro weighs the same as any other under a
 * causal mask). Where the parts are dQ copies (memory traffic), no more of
 * them than threads; elsewhere no more than four blocks a part. */
static size_t parts_for(size_t heads, size_t blocks, int threads, int copies)
{
    size_t parts = (8 * (size_t)threads + heads - 1) / heads;
    if (copies && parts > (size_t)threads)
        parts = (size_t)threads;
    if (parts > blocks / 2)
        parts = blocks / 2;
    if (!copies && parts < (blocks + 3) / 4)
        parts = (blocks + 3) / 4;
    return parts ? parts : 1;
}

typedef struct native_plan {
    size_t blocks_per_head, key_parts, query_parts;
    int fused;
} native_plan;

/* How a call is cut: the key side's blocks and parts (dQ copies for the
 * fused backward), the query side's parts, and whether the backward sums
 * dQ in the key side (parts_for). The cut follows the call's work, not a
 * fixed block count: under a causal mask a key block's work falls with its
 * position, so fixed stripes of jobs per thread leave the slowest stripe
 * far behind the mean. */
static native_plan plan_call(const clattn_context *ctx, clattn_op op, const clattn_shape *s)
{
    const int n = ctx->num_threads;
    const size_t q_blocks = native_query_blocks(s->q_seq);
    const size_t kv_heads = (size_t)s->num_kv_heads * s->batch;
    native_plan p;
    p.blocks_per_head = (s->kv_seq + (size_t)KEY_BLOCK - 1) / KEY_BLOCK;
    p.query_parts = parts_for((size_t)s->num_heads * s->batch, q_blocks, n, 0);
    p.key_parts = parts_for(kv_heads, p.blocks_per_head, n, 1);
    p.fused = op == CLATTN_OP_BACKWARD && fuse_grad_q(s, (int)p.key_parts);
    if (!p.fused)
        p.key_parts = parts_for(kv_heads, p.blocks_per_head, n, 0);
    /* CLATTN_NATIVE_PARTS, up to a part a block */
    if (ctx->native_parts[0])
        p.query_parts = ctx->native_parts[0] < q_blocks ? ctx->native_parts[0] : q_blocks;
    if (ctx->native_parts[1])
        p.key_parts = ctx->native_parts[1] < p.blocks_per_head ? ctx->native_parts[1]
                                                               : p.blocks_per_head;
    return p;
}

/* CLATTN_NATIVE_PARTS=QUERY,KEY: the parts of a head on each side, for
 * measurements (0 for either: as planned). */
static clattn_status parts_override(unsigned parts[2])
{
    parts[0] = parts[1] = 0;
    const char *env = getenv("CLATTN_NATIVE_PARTS");
    if (!env || !*env)
        return CLATTN_OK;
    unsigned long v[2];
    char *end = NULL;
    const char *at = env;
    for (int i = 0; i < 2; ++i) {
        v[i] = (*at >= '0' && *at <= '9') ? strtoul(at, &end, 10) : 4096ul;
        if (v[i] >= 4096ul || *end != (i ? '\0' : ','))
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_NATIVE_PARTS='%s': want QUERY,KEY, each 0 (as planned) "
                               "to 4095",
                               env);
        at = end + 1;
    }
    parts[0] = (unsigned)v[0];
    parts[1] = (unsigned)v[1];
    return CLATTN_OK;
}

/* *buf, kept by the context, grown to at least n floats as needed rather
 * than allocated afresh (new pages to fault in) every call. 0 when it
 * cannot grow. */
static int grow(float **buf, size_t *have, size_t n)
{
    if (n <= *have)
        return 1;
    float *grown = malloc(n * sizeof(float));
    if (!grown)
        return 0;
    free(*buf);
    *buf = grown;
    *have = n;
    return 1;
}

/* What a call keeps in the scratch, in floats, and whether its dQ is
 * summed in the key side (the plan's choice, unless memory ran short). */
typedef struct native_layout {
    int query_side, key_side, want_dsum, fused, k_in_place, v_tiles, lazy_rows;
    size_t copies, in_place, k_floats, v_floats, v_states, qh_floats, oh_floats, row_states;
    size_t total;
} native_layout;

static native_layout layout_call(clattn_op op, const clattn_shape *s, const clattn_sizes *sz,
                                 const native_plan *plan, int fused)
{
    native_layout L;
    memset(&L, 0, sizeof L);
    L.query_side = op == CLATTN_OP_FORWARD || op == CLATTN_OP_GRAD_Q || op == CLATTN_OP_BACKWARD;
    L.key_side = op != CLATTN_OP_FORWARD && op != CLATTN_OP_GRAD_Q;
    L.want_dsum = op == CLATTN_OP_GRAD_K || op == CLATTN_OP_BACKWARD;
    L.copies = plan->key_parts;
    L.fused = fused;
    /* A float32 dQ that is overwritten is the first key-side part's own:
     * one copy fewer to zero and to sum, none where the key side has one
     * part. (One added into keeps its copies: dQ's values plus the sum of
     * the parts, as the two-pass backward adds.) */
    L.in_place = s->dtype == CLATTN_DTYPE_F32 && !s->accumulate;
    /* The forward reads float32 K where it lies (query_block_of), without
     * a head-major copy: its score product streams 8 key rows at a time,
     * not the 32 of a tile that the backward's dQ product holds, and the
     * copy's round cost more than the strided rows (results/history.md). */
    L.k_in_place = op == CLATTN_OP_FORWARD && s->dtype == CLATTN_DTYPE_F32;
    L.k_floats = L.k_in_place ? 0 : head_major_floats(s, s->num_kv_heads, sz->kv);
    /* the forward's V by transposed tiles (vt), always copied: by its
     * jobs, as they first need them (kernels.c's ready_tiles), not in a
     * round before them, so that a float32 forward has no round of
     * copies. */
    L.v_tiles = op == CLATTN_OP_FORWARD;
    L.v_floats = L.v_tiles ? (size_t)s->batch * s->num_kv_heads * native_tiled_rows(s->kv_seq) *
                                 s->head_dim
                           : head_major_floats(s, s->num_kv_heads, sz->kv);
    L.v_states = L.v_tiles ? (size_t)s->batch * s->num_kv_heads *
                                 (native_tiled_rows(s->kv_seq) / KEY_BLOCK)
                           : 0;
    L.qh_floats = head_major_floats(s, s->num_heads, sz->q);
    L.oh_floats = head_major_floats(s, s->num_heads, sz->q);
    /* Where the key side runs first (grad-V, grad-K, the fused backward),
     * its jobs make Q's and dO's head-major rows and Dsum as they first
     * need them (kernels.c's ready_rows), not in a round before them. */
    const size_t units = (s->q_seq + (size_t)PACK_ROWS - 1) / PACK_ROWS;
    L.row_states = (size_t)s->batch * s->num_heads * units;
    L.lazy_rows = L.key_side && (fused || !L.query_side);
    L.total = (L.query_side && !fused ? L.k_floats + L.v_floats + L.v_states : 0) +
              (L.key_side ? L.qh_floats + L.oh_floats : 0) + (L.want_dsum ? sz->lse / 2 : 0) +
              (fused ? (L.copies - L.in_place) * sz->q : 0) + (L.lazy_rows ? L.row_states : 0);
    return L;
}

/* Sets c up for op on s (sequence seq_base of a packed batch, else 0),
 * its copies, states and Dsum in `scratch` (L.total floats), and its
 * rounds of jobs in order: a round of copies and Dsum (or none), the
 * op's main side, then the fused backward's sum of dQ or the two-pass
 * backward's query side. */
static void setup_call(const clattn_context *ctx, clattn_op op, const clattn_shape *s,
                       const clattn_sizes *sz, const void *const t[CLATTN_R_COUNT],
                       uint32_t seq_base, const native_plan *plan, const native_layout *L,
                       float *scratch, native_call *c)
{
    const native_kernels *hot = ctx->native;
    memset(c, 0, sizeof *c);
    c->pool = ctx->pool;
    c->hot = hot;
    c->s = s;
    c->q = t[CLATTN_R_Q];
    c->k = t[CLATTN_R_K];
    c->v = t[CLATTN_R_V];
    c->o = t[CLATTN_R_O];
    c->lse = t[CLATTN_R_LSE];
    c->d_out = t[CLATTN_R_DO];
    native_call_modifiers(c, s, clattn_op_modifiers(s, op));
    c->seq_base = seq_base;
    c->blocks_per_head = plan->blocks_per_head;
    c->key_parts = plan->key_parts;
    c->query_parts = plan->query_parts;
    const size_t key_jobs = plan->key_parts * s->num_kv_heads * s->batch;
    const size_t query_jobs = plan->query_parts * s->num_heads * s->batch;
    const size_t rows = sz->lse / 2;
    float *next = scratch;
    if (L->query_side && !L->fused) {
        if (!L->k_in_place)
            c->kh = head_major(c, t, CLATTN_R_K, s->num_kv_heads, s->kv_seq,
                               take(&next, L->k_floats));
        if (L->v_tiles) {
            c->vt_pack = (struct native_pack){.src = t[CLATTN_R_V], .dtype = s->dtype,
                                              .dst = take(&next, L->v_floats),
                                              .heads = s->num_kv_heads, .rows = s->kv_seq};
            c->vt = c->vt_pack.dst;
            c->vt_state = take_states(&next, L->v_states);
        } else {
            c->vh = head_major(c, t, CLATTN_R_V, s->num_kv_heads, s->kv_seq,
                               take(&next, L->v_floats));
        }
    }
    if (L->key_side) {
        c->qh = head_major(c, t, CLATTN_R_Q, s->num_heads, s->q_seq, take(&next, L->qh_floats));
        c->oh = head_major(c, t, CLATTN_R_DO, s->num_heads, s->q_seq, take(&next, L->oh_floats));
    }
    if (L->want_dsum)
        c->dsum = take(&next, rows);
    if (L->lazy_rows) {
        c->row_state = take_states(&next, L->row_states);
    } else { /* the copies and Dsum: one round, none depending on another */
        for (int i = 0; i < c->packs; ++i)
            c->pack_jobs += c->pack[i].jobs;
        c->round_job[0] = clattn_native_pack_job;
        c->round_jobs[0] = c->pack_jobs + (L->want_dsum ? (rows + DSUM_ROWS - 1) / DSUM_ROWS : 0);
    }
    switch (op) {
    case CLATTN_OP_FORWARD:
        c->o_out = (void *)t[CLATTN_R_O];
        c->lse_out = (float *)t[CLATTN_R_LSE];
        c->round_job[1] = hot->forward;
        c->round_jobs[1] = query_jobs;
        break;
    case CLATTN_OP_GRAD_V:
        c->dv = (void *)t[CLATTN_R_DV];
        c->round_job[1] = hot->key_block;
        c->round_jobs[1] = key_jobs;
        break;
    case CLATTN_OP_GRAD_Q:
        c->dq = (void *)t[CLATTN_R_DQ];
        c->round_job[1] = hot->grad_q;
        c->round_jobs[1] = query_jobs;
        break;
    case CLATTN_OP_GRAD_K:
    case CLATTN_OP_BACKWARD:
        c->dk = (void *)t[CLATTN_R_DK];
        if (op == CLATTN_OP_BACKWARD) {
            c->dv = (void *)t[CLATTN_R_DV];
            c->dq = (void *)t[CLATTN_R_DQ];
        }
        c->round_job[1] = hot->key_block;
        c->round_jobs[1] = key_jobs;
        if (L->fused) { /* the key side into dQ (and copies), then their sum */
            c->dq_fused = 1;
            c->dq_in_place = (int)L->in_place;
            c->dq_part = take(&next, (L->copies - L->in_place) * sz->q);
            c->dq_part_floats = sz->q;
            c->round_job[2] = sum_dq_job;
            c->round_jobs[2] =
                L->copies > L->in_place
                    ? s->batch * s->num_heads * ((s->q_seq + (size_t)SUM_ROWS - 1) / SUM_ROWS)
                    : 0;
        } else if (op == CLATTN_OP_BACKWARD) {
            c->round_job[2] = hot->grad_q;
            c->round_jobs[2] = query_jobs;
        }
        break;
    case CLATTN_OP_COUNT:
        break;
    }
}

static const char *const ran[CLATTN_OP_COUNT] = {
    [CLATTN_OP_FORWARD] = "forward__native",
    [CLATTN_OP_GRAD_V] = "grad_v__native",
    [CLATTN_OP_GRAD_Q] = "grad_q__native",
    [CLATTN_OP_GRAD_K] = "dsum__native,grad_k__native",
    [CLATTN_OP_BACKWARD] = "dsum__native,grad_kv__native,grad_q__native",
};

/* The kernels a call ran, for clattn_context_kernels(). */
static void name_kernels(clattn_context *ctx, clattn_op op, int fused)
{
    snprintf(ctx->kernels, sizeof ctx->kernels, "%s",
             fused ? "dsum__native,grad_kvq__native" : ran[op]);
}

/* A round of several calls' jobs (run_calls'): job j of the round is job
 * j - start[i] of calls[i]'s round r, for the last i whose start is at
 * most j. */
typedef struct native_many {
    native_call *calls;
    size_t *start;
    size_t n;
    int r;
} native_many;

static void many_job(const native_call *group, size_t job)
{
    const native_many *m = group->many;
    size_t lo = 0, hi = m->n; /* start[lo] <= job < start[hi] */
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (m->start[mid] <= job)
            lo = mid;
        else
            hi = mid;
    }
    const native_call *c = &m->calls[lo];
    c->round_job[m->r](c, job - m->start[lo]);
}

clattn_status clattn_native_host_forms(const clattn_shape *s, const char *who)
{
    if (clattn_host_forms(s))
        return CLATTN_OK;
    if ((s->score_fn && !s->score_native) || (s->mask_fn && !s->mask_native))
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the %s function is OpenCL C source alone: %s calls C functions "
                           "(shape.%s_native; docs/programmable.md)",
                           s->score_fn && !s->score_native ? "score" : "mask", who,
                           s->score_fn && !s->score_native ? "score" : "mask");
    if ((s->bias_cl && !s->bias) || (s->bool_mask_cl && !s->bool_mask))
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the %s is a cl_mem alone: %s reads host memory (shape.%s)",
                           s->bias_cl && !s->bias ? "bias" : "bool mask", who,
                           s->bias_cl && !s->bias ? "bias" : "bool_mask");
    return CLATTN_OK;
}

/* Runs op on the n problems seqs (one call, or a packed batch's
 * sequences) as one: every problem's copies in one round, then every
 * problem's main side in one, then the sums or query sides in one, in
 * seqs' order (a packed batch's longest first, so that short sequences
 * fill the threads that long ones leave idle); one barrier a round, not
 * one a round a problem. calls, plans, lays: n each; start: n + 1.
 * A 16-bit op reads and writes the caller's tensors row by row, widened
 * and rounded in the jobs (native_call); only the head-major copies the
 * float32 op makes too are float32. Converting whole tensors in rounds of
 * their own would add a pass over memory and a barrier to every call. */
static clattn_status run_calls(clattn_context *ctx, clattn_op op, const clattn_seq_call *seqs,
                               size_t n, native_call *calls, native_plan *plans,
                               native_layout *lays, size_t *start)
{
    if (op >= CLATTN_OP_COUNT)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "unknown op %d", (int)op);
    const clattn_shape *s = &seqs[0].shape;
    clattn_status st = clattn_native_host_forms(s, "the native backend");
    if (st != CLATTN_OK)
        return st;
    /* The context's threads, once, for every round of jobs below. */
    if (!ctx->pool && ctx->num_threads > 1)
        ctx->pool = clattn_native_pool_create(ctx->num_threads - 1);
    /* The scratch of all: with dQ summed in the key sides as planned, else
     * (memory short) every dQ in a pass of its own. */
    size_t total = 0;
    for (int fused_ok = 1;; fused_ok = 0) {
        total = 0;
        for (size_t i = 0; i < n; ++i) {
            plans[i] = plan_call(ctx, op, &seqs[i].shape);
            lays[i] = layout_call(op, &seqs[i].shape, &seqs[i].sizes, &plans[i],
                                  fused_ok && plans[i].fused);
            total += lays[i].total;
        }
        if (grow(&ctx->scratch, &ctx->scratch_floats, total))
            break;
        if (!fused_ok)
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY,
                               "out of host memory for %zu floats of scratch", total);
    }
    float *next = ctx->scratch;
    int any_fused = 0;
    for (size_t i = 0; i < n; ++i) {
        setup_call(ctx, op, &seqs[i].shape, &seqs[i].sizes, seqs[i].t, seqs[i].index, &plans[i],
                   &lays[i], next, &calls[i]);
        next += lays[i].total;
        any_fused |= lays[i].fused;
    }
    if (n == 1 && (calls[0].mods & CLATTN_MOD_HIDE)) /* packed: the tiles ask */
        clattn_native_mask_map(ctx, &calls[0]);
    name_kernels(ctx, op, any_fused);
    native_many m = {calls, start, n, 0};
    native_call group;
    memset(&group, 0, sizeof group);
    group.many = &m;
    for (m.r = 0; m.r < NATIVE_ROUNDS; ++m.r) {
        start[0] = 0;
        for (size_t i = 0; i < n; ++i)
            start[i + 1] = start[i] + calls[i].round_jobs[m.r];
        if (start[n])
            clattn_native_run_jobs(ctx->pool, &group, many_job, start[n], ctx->num_threads);
    }
    return CLATTN_OK;
}

static clattn_status native_run(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                                const clattn_sizes *sz, const void *const t[CLATTN_R_COUNT])
{
    clattn_seq_call one = {.shape = *s, .sizes = *sz, .index = ctx->seq_base};
    memcpy(one.t, t, sizeof one.t);
    native_call call;
    native_plan plan;
    native_layout lay;
    size_t start[2];
    return run_calls(ctx, op, &one, 1, &call, &plan, &lay, start);
}

static clattn_status native_run_many(clattn_context *ctx, clattn_op op,
                                     const clattn_seq_call *seqs, size_t n)
{
    native_call *calls = calloc(n, sizeof *calls);
    native_plan *plans = malloc(n * sizeof *plans);
    native_layout *lays = malloc(n * sizeof *lays);
    size_t *start = malloc((n + 1) * sizeof *start);
    const clattn_status st =
        calls && plans && lays && start
            ? run_calls(ctx, op, seqs, n, calls, plans, lays, start)
            : clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory for %zu sequences", n);
    free(calls);
    free(plans);
    free(lays);
    free(start);
    return st;
}

static void native_destroy(clattn_context *ctx)
{
    clattn_native_mask_map_free(ctx);
    clattn_native_pool_destroy(ctx->pool);
    ctx->pool = NULL;
    free(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_floats = 0;
}

static const clattn_backend_ops native_ops = {native_run, native_destroy, 0, native_run_many,
                                              NULL, NULL};

clattn_status clattn_native_init(clattn_context *ctx, const clattn_options *opts)
{
    if (opts->variant && strcmp(opts->variant, "blocked") != 0)
        return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT,
                           "variant '%s' is not a native one; native runs 'blocked'",
                           opts->variant);
    clattn_status st = clattn_native_pick_kernels(&ctx->native);
    if (st == CLATTN_OK)
        st = parts_override(ctx->native_parts);
    if (st != CLATTN_OK)
        return st;
    const int asked = opts->num_threads;
    if (asked < 0)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "num_threads %d: want 0 (the default) or more", asked);
    if (asked > 0)
        ctx->num_threads = asked > NATIVE_MAX_THREADS ? NATIVE_MAX_THREADS : asked;
    else if ((st = default_threads(&ctx->num_threads)) != CLATTN_OK)
        return st;
    ctx->backend = CLATTN_BACKEND_NATIVE;
    ctx->ops = &native_ops;
    snprintf(ctx->device, sizeof ctx->device, "native: %d thread%s, %s code", ctx->num_threads,
             ctx->num_threads == 1 ? "" : "s", ctx->native->name);
    snprintf(ctx->variant, sizeof ctx->variant, "blocked");
    return CLATTN_OK;
}
