/* Internal interfaces of clattn: the backend table, the context, errors. */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "clattn.h"

#if defined(__GNUC__)
#define CLATTN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLATTN_PRINTF(f, a)
#endif

/* Records a message for clattn_last_error() and returns st, so that a
 * failure reads `return clattn_fail(CLATTN_ERROR_X, "...", ...);`. */
clattn_status clattn_fail(clattn_status st, const char *fmt, ...) CLATTN_PRINTF(2, 3);
/* Appends a line to a failure already recorded (a build log, say). */
void clattn_fail_append(const char *text);
void clattn_clear_error(void);

/* Whether [a, a + na) and [b, b + nb) share a byte: an output of the host's
 * gradients against the call's other tensors. */
static inline int clattn_overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

/* Sizes in elements of each tensor of a shape, checked for overflow of the
 * byte count. */
typedef struct clattn_sizes {
    size_t q;   /* Q, dO, O, dQ */
    size_t kv;  /* K, V, dK, dV */
    size_t lse; /* LSE */
} clattn_sizes;

/* Whether s packs variable-length sequences (cu_seqlens set). */
static inline int clattn_packed(const clattn_shape *s) { return s->cu_seqlens_q != NULL; }
/* Sequence i of a packed shape as a problem of its own: batch 1, its
 * lengths, no prefix sums. */
clattn_shape clattn_sequence_shape(const clattn_shape *s, uint32_t i);
/* Validates the shape and fills sizes (may be NULL). */
clattn_status clattn_check_shape(const clattn_shape *s, clattn_sizes *sizes);
float clattn_effective_scale(const clattn_shape *s);
/* The queries [*start, *end) that see key t, as the seed bounds them. */
void clattn_query_range(const clattn_shape *s, uint32_t t, uint32_t *start, uint32_t *end);
/* The keys [*lo, *hi) that query pos sees. */
void clattn_key_range(const clattn_shape *s, uint32_t pos, uint32_t *lo, uint32_t *hi);
/* q_offset - kv_offset (+ kv_seq - q_seq aligned bottom-right): key j is
 * visible to query i iff (not causal or j <= i + delta + window_right)
 * and (no window or i + delta < j + window). */
int64_t clattn_mask_delta(const clattn_shape *s);
/* The kernels' `causal` argument (cl/common.cl): 0 without causal, else
 * window_right + 1, which validation keeps within an int. */
int32_t clattn_mask_right(const clattn_shape *s);

/* The score modifiers a shape asks for, as bits; CLATTN_MOD_SINK (learnable
 * sinks) changes the forward alone (clattn_op_modifiers). CLATTN_MODS
 * counts the built-in ones' combinations; the caller's functions
 * (CLATTN_MOD_SCORE, CLATTN_MOD_MASK: docs/programmable.md) come above. */
enum {
    CLATTN_MOD_SOFTCAP = 1,
    CLATTN_MOD_ALIBI = 2,
    CLATTN_MOD_DROPOUT = 4,
    CLATTN_MOD_SINK = 8,
    CLATTN_MODS = 16,
    CLATTN_MOD_SCORE = 16,
    CLATTN_MOD_MASK = 32,
    CLATTN_MOD_BIAS = 64,  /* shape->bias */
    CLATTN_MOD_BOOL = 128, /* shape->bool_mask */
    /* the score function's clattn_score_dp: the programs of its
     * parameters' gradient alone (no shape asks for it) */
    CLATTN_MOD_SCORE_DP = 256,
    /* pairs hidden one by one: block maps, and rows that may be empty */
    CLATTN_MOD_HIDE = CLATTN_MOD_MASK | CLATTN_MOD_BOOL,
    /* the per-pair modifiers: the caller's functions and tensors */
    CLATTN_MOD_USER = CLATTN_MOD_SCORE | CLATTN_MOD_MASK | CLATTN_MOD_BIAS | CLATTN_MOD_BOOL
};
unsigned clattn_modifiers(const clattn_shape *s);
/* The elements of shape->bias and of bool_mask: [bias_batch][bias_heads]
 * [q_seq][kv_seq], each of the first two 1 where 0 or 1. */
static inline size_t clattn_bias_elems(const clattn_shape *s)
{
    return (size_t)(s->bias_batch > 1 ? s->bias_batch : 1u) *
           (s->bias_heads > 1 ? s->bias_heads : 1u) * s->q_seq * s->kv_seq;
}
/* Whether the host can run s: every function has its C form, and the bias
 * and bool mask their host arrays (clattn_native_host_forms says why not). */
static inline int clattn_host_forms(const clattn_shape *s)
{
    return (!s->score_fn || s->score_native) && (!s->mask_fn || s->mask_native) &&
           (!s->bias_cl || s->bias) && (!s->bool_mask_cl || s->bool_mask);
}
/* The checks of the score parameters' gradient (clattn_grad_score_params,
 * _cl) beyond the call's: a score function, its parameters, no packed
 * sequences, d_params apart from them; CLATTN_OK or the failure's status. */
clattn_status clattn_grad_params_takes(const clattn_shape *s, const float *d_params);
/* CLATTN_ERROR_UNSUPPORTED_SHAPE where s packs sequences, which the bias's
 * gradient does not take (clattn_grad_bias, _cl); else CLATTN_OK. */
static inline clattn_status clattn_grad_bias_takes(const clattn_shape *s)
{
    if (clattn_packed(s))
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the bias's gradient with packed sequences: a bias has no packed "
                           "layout");
    return CLATTN_OK;
}
/* The element of shape->bias and bool_mask for batch element b, query
 * head h, query row i and key row j (the broadcast applied). */
static inline size_t clattn_bias_index(const clattn_shape *s, size_t b, size_t h, size_t i,
                                       size_t j)
{
    const size_t heads = s->bias_heads > 1 ? s->bias_heads : 1u;
    return (((s->bias_batch > 1 ? b : 0u) * heads + (heads > 1 ? h : 0u)) * s->q_seq + i) *
               s->kv_seq + j;
}
/* Bytes of one element of shape->bias (bias_dtype). */
static inline size_t clattn_bias_bytes(const clattn_shape *s)
{
    return s->bias_dtype == CLATTN_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}
/* n elements of shape->bias from element i on, as float32, into out. */
void clattn_bias_values(const clattn_shape *s, size_t i, size_t n, float *out);
/* The global position P of query row pos that dropout's draw and ALiBi
 * take: pos + delta + kv_offset (delta from clattn_mask_delta), modulo
 * 2^32 (bottom-right alignment may make it negative). */
static inline uint32_t clattn_query_position(const clattn_shape *s, uint32_t pos, int64_t delta)
{
    return (uint32_t)((int64_t)pos + delta + (int64_t)s->kv_offset);
}

/* The tensors of the contract, by role. An op reads some and writes some. */
typedef enum clattn_role {
    CLATTN_R_Q,
    CLATTN_R_K,
    CLATTN_R_V,
    CLATTN_R_O,
    CLATTN_R_LSE,
    CLATTN_R_DO,
    CLATTN_R_DQ,
    CLATTN_R_DK,
    CLATTN_R_DV,
    CLATTN_R_COUNT
} clattn_role;

typedef enum clattn_op {
    CLATTN_OP_FORWARD,  /* Q K V -> O LSE */
    CLATTN_OP_GRAD_V,   /* dO Q K LSE -> dV */
    CLATTN_OP_GRAD_Q,   /* Q K V O LSE dO -> dQ */
    CLATTN_OP_GRAD_K,   /* Q K V O LSE dO -> dK */
    CLATTN_OP_BACKWARD, /* Q K V O LSE dO -> dQ dK dV */
    CLATTN_OP_COUNT
} clattn_op;

#define CLATTN_BIT(r) (1u << (r))
/* Bit masks of the roles each op reads and writes. */
extern const unsigned clattn_op_reads[CLATTN_OP_COUNT];
extern const unsigned clattn_op_writes[CLATTN_OP_COUNT];
/* The roles a call of op with shape s reads: clattn_op_reads[op], and the
 * gradients it writes when s->accumulate adds into them. */
unsigned clattn_call_reads(clattn_op op, const clattn_shape *s);
/* The checks every call starts with: ctx not NULL and a valid shape, whose
 * sizes go to *sz. Clears the thread's last error first. */
clattn_status clattn_call_begin(const clattn_context *ctx, const clattn_shape *s,
                                clattn_sizes *sz);
/* The modifier bits of op's kernels: clattn_modifiers(), with
 * CLATTN_MOD_SINK for the forward where the shape has sinks. */
unsigned clattn_op_modifiers(const clattn_shape *s, clattn_op op);
const char *clattn_role_name(clattn_role r);
/* Elements of the tensor of a role. */
size_t clattn_role_elems(const clattn_sizes *sz, clattn_role r);
/* Bytes of one element of role r: the LSE pairs are float, the rest dtype's. */
size_t clattn_role_bytes(int r, clattn_dtype dtype);

/* Elements of role r's tensor before sequence i's rows, for packed s. */
size_t clattn_sequence_offset(const clattn_shape *s, int r, uint32_t i);
/* For packed s, the rows of op's outputs that no sequence's problem writes
 * (those of a sequence whose other side is empty, and those past the last
 * prefix sum; not the gradients under accumulate): fill(arg, role, first
 * element, elements, value) for each run of them, value 0 or, for the LSE,
 * -1e30. Stops at, and returns, the first non-zero that fill returns. */
int clattn_fill_unseen(const clattn_shape *s, clattn_op op,
                       int (*fill)(void *arg, int role, size_t first, size_t count, float value),
                       void *arg);
/* The order packed sequences run in: the one with the most pairs first,
 * so that what fails for the longest (a size, a build) fails before any
 * output is written; then the others in order. clattn_longest_sequence()
 * finds that one; step n of the order is clattn_sequence_at(n, longest). */
uint32_t clattn_longest_sequence(const clattn_shape *s);
static inline uint32_t clattn_sequence_at(uint32_t n, uint32_t longest)
{
    return n == 0 ? longest : n - 1 < longest ? n - 1 : n;
}

/* One packed sequence's problem, as the core hands it to a backend's
 * run_many: its shape (batch 1), sizes and tensors (at its rows), and its
 * index in the batch (dropout's b). */
typedef struct clattn_seq_call {
    clattn_shape shape;
    clattn_sizes sizes;
    const void *t[CLATTN_R_COUNT];
    uint32_t index;
} clattn_seq_call;

/* One backend: a runner for every op, its teardown, and whether it runs
 * packed sequences itself. t holds a pointer
 * for each role the op reads or writes (outputs are cast back to float *);
 * shape and pointers are validated before run is called, under ctx's lock.
 * run_many, where a backend has it, runs the core's split of a packed
 * batch (the sequences with work, the longest first) as one call, so
 * that the sequences share its rounds of work; NULL: run for each.
 * grad_bias, where a backend has it, computes clattn_grad_bias() from the
 * host arrays in[] (q, k, v, o, lse, d_out) on its device, under ctx's
 * lock: 0 where it does not take the call (the host computes it), else 1
 * with the status in *st; NULL: always the host. */
typedef struct clattn_backend_ops {
    clattn_status (*run)(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                         const clattn_sizes *sz, const void *const t[CLATTN_R_COUNT]);
    void (*destroy)(clattn_context *ctx);
    int packed; /* run takes packed sequences (cu_seqlens) itself; else the core splits them */
    clattn_status (*run_many)(clattn_context *ctx, clattn_op op, const clattn_seq_call *calls,
                              size_t n);
    int (*grad_bias)(clattn_context *ctx, const clattn_shape *s, const clattn_sizes *sz,
                     const void *const in[6], float *d_bias, clattn_status *st);
    /* the same for clattn_grad_score_params(), into d_params */
    int (*grad_score_params)(clattn_context *ctx, const clattn_shape *s, const clattn_sizes *sz,
                             const void *const in[6], float *d_params, clattn_status *st);
} clattn_backend_ops;

struct clattn_cl_state;

struct clattn_context {
    clattn_backend backend;
    const clattn_backend_ops *ops;
    pthread_mutex_t lock;
    char device[320];
    char variant[32];
    char kernels[160]; /* what the last call ran, comma-separated */
    char build_options[2048]; /* their programs' options (OpenCL), "; "-separated */
    char *log;       /* what auto tried; never NULL after creation */
    int num_threads; /* native */
    unsigned native_parts[2]; /* native: CLATTN_NATIVE_PARTS, query and key side (0: planned) */
    const struct native_kernels *native; /* native: the hot loops it runs */
    struct native_pool *pool;            /* native: its threads, once started */
    float *scratch;                      /* native: head-major copies and Dsum */
    size_t scratch_floats;
    struct native_mask_map *mask_map;    /* native: the last mask function's block map */
    struct clattn_cl_state *cl; /* NULL on native */
    /* The batch index of element 0 of the call being run: dropout's b. The
     * index of the sequence while packed sequences run one by one through
     * run, else 0. */
    uint32_t seq_base;
};

/* Stops a context's host threads (src/native/pool.c); NULL is a no-op. */
void clattn_native_pool_destroy(struct native_pool *p);

/* Native backend: fills ctx->device, ctx->variant and num_threads. */
clattn_status clattn_native_init(clattn_context *ctx, const clattn_options *opts);

/* OpenCL device selection, as parsed from a selector. */
typedef enum clattn_cl_pick_kind {
    CLATTN_PICK_GPU,   /* every non-CPU device, in enumeration order */
    CLATTN_PICK_CPU,   /* every CPU device */
    CLATTN_PICK_INDEX, /* platform:device */
    CLATTN_PICK_NAME   /* first device whose name contains the text */
} clattn_cl_pick_kind;

typedef struct clattn_cl_pick {
    clattn_cl_pick_kind kind;
    unsigned platform, device;
    const char *name;
} clattn_cl_pick;

/* Tries the devices that pick names, in order, until one initialises;
 * each failure is appended to ctx->log. all_candidates: keep trying after
 * a failure (auto); otherwise the first matching device is final. */
clattn_status clattn_opencl_init(clattn_context *ctx, const clattn_options *opts,
                                 const clattn_cl_pick *pick, int all_candidates);

/* A zeroed context with its lock and an empty log, for a backend's init. */
clattn_status clattn_context_alloc(clattn_context **out);

void clattn_log_append(clattn_context *ctx, const char *fmt, ...) CLATTN_PRINTF(2, 3);
/* Whether some backend offers a variant of this name (variants.c). */
int clattn_known_variant(const char *name);

/* bfloat16 <-> float32 as the library converts them everywhere (host
 * conversions, the native backend's packing): widening is exact; narrowing
 * rounds to nearest even and keeps NaNs NaN (quiet). Branch-free, so that
 * loops of them vectorise. */
static inline float clattn_bf16_to_f32(uint16_t h)
{
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline uint16_t clattn_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t nan = (x >> 16) | 0x40u, rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Element i of shape->bias as float32 (bias_dtype), inline for the pair
 * by pair paths. */
static inline float clattn_bias_value(const clattn_shape *s, size_t i)
{
    if (s->bias_dtype == CLATTN_DTYPE_F32)
        return ((const float *)s->bias)[i];
    if (s->bias_dtype == CLATTN_DTYPE_BF16)
        return clattn_bf16_to_f32(((const uint16_t *)s->bias)[i]);
    float f;
    clattn_bias_values(s, i, 1, &f);
    return f;
}

#endif /* CLATTN_INTERNAL_H */
