/*
 * clattn: OpenCL kernels for training multi-head attention, with a plain-C
 * fallback that computes the same results.
 *
 * Tensors are dense and row-major, of shape.dtype's elements (float32 by
 * default; float16 or bfloat16 as uint16_t bit patterns); the LSE pairs are
 * always float32:
 *   Q, dO, O, dQ  [batch][q_seq][num_heads][head_dim]
 *   K, V, dK, dV  [batch][kv_seq][num_kv_heads][head_dim]
 *   LSE           [batch][q_seq][num_heads][2]   the pair (m, l) of a row
 * Query head h reads KV head h / (num_heads / num_kv_heads).
 * Key t is visible to query pos iff, over the global positions
 * P = q_offset + pos and T = kv_offset + t,
 *   t < kv_seq && (!causal || T <= P) && (window == 0 || P < T + window).
 * With both offsets 0 and kv_seq != q_seq, causal is aligned top-left, as
 * PyTorch's is_causal; CLATTN_CAUSAL_BOTTOM_RIGHT aligns the last query
 * with the last key, as FlashAttention-2 (>= 2.1) and cuDNN do.
 *
 * Non-finite inputs propagate: a NaN or infinity in Q, K, V or dO reaches
 * every output element it touches (the rows that see that query or key,
 * and their gradients), as in PyTorch; a row comes out empty (O = 0, LSE
 * (-1e30, -1e30)) only when it sees no key. A row whose visible scores are
 * all -inf (or below -1e30, the masks' own value) has no softmax and gets
 * NaN, as PyTorch's math does. Inside a tile's product a
 * masked pair's zero weight times a NaN may carry it further (0 x NaN), as
 * PyTorch's and FlashAttention's kernels do.
 *
 * This header is plain C99 and C++; it needs no OpenCL header. The OpenCL
 * interop (caller-owned contexts, queues and buffers) is in clattn_cl.h.
 *
 * Threads: every function may be called from any thread. Calls on one
 * context take turns on its lock; clattn_last_error() is per thread.
 * Ownership: what a clattn_*_create function returns is the caller's, to
 * release with the matching destroy; strings returned by the library are
 * owned by it (or by the context they came from). Nothing aborts or exits.
 */
#ifndef CLATTN_H
#define CLATTN_H

#include <stddef.h>
#include <stdint.h>

#include "clattn_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every call returns CLATTN_OK (0) or one of these; clattn_status_string()
 * names each and clattn_last_error() says what exactly went wrong. */
typedef enum clattn_status {
    CLATTN_OK = 0,
    CLATTN_ERROR_NULL_POINTER = 1,       /* a required pointer is NULL */
    CLATTN_ERROR_ZERO_SIZE = 2,          /* batch, a sequence, heads or head_dim is 0 */
    CLATTN_ERROR_HEADS_NOT_DIVISIBLE = 3, /* num_heads % num_kv_heads != 0 */
    CLATTN_ERROR_HEAD_DIM_TOO_LARGE = 4, /* head_dim > CLATTN_MAX_HEAD_DIM */
    CLATTN_ERROR_CAUSAL_SEQ_MISMATCH = 5, /* no longer returned: causal takes any kv_seq */
    CLATTN_ERROR_INVALID_SCALE = 6,      /* scale negative, NaN or infinite */
    CLATTN_ERROR_SIZE_OVERFLOW = 7,      /* a tensor's byte size overflows size_t */
    CLATTN_ERROR_TOO_LARGE_FOR_DEVICE = 8, /* a tensor exceeds the device's largest allocation,
                                            * or the call's loops a driver's cap (llvmpipe) */
    CLATTN_ERROR_INVALID_OPTION = 9,     /* a malformed option or device selector */
    CLATTN_ERROR_UNKNOWN_VARIANT = 10,   /* no kernel variant of that name for the backend */
    CLATTN_ERROR_DEVICE_NOT_FOUND = 11,  /* the selector matches no device */
    CLATTN_ERROR_NO_PLATFORM = 12,       /* no OpenCL platform (ICD error -1001) */
    CLATTN_ERROR_BUILD_FAILED = 13,      /* the kernel did not compile; the log is in clattn_last_error() */
    CLATTN_ERROR_WORK_GROUP_TOO_LARGE = 14, /* the device cannot run the work-group the kernel needs */
    CLATTN_ERROR_OPENCL = 15,            /* any other OpenCL failure; the code is in the message */
    CLATTN_ERROR_OUT_OF_MEMORY = 16,     /* a host allocation failed */
    CLATTN_ERROR_WRONG_BACKEND = 17,     /* an OpenCL-only call on a native context */
    CLATTN_ERROR_INVALID_BUFFER = 18,    /* a cl_mem too small for its tensor, of another context, or
                                          * overlapping; a host output overlapping another tensor */
    CLATTN_ERROR_UNSUPPORTED_SHAPE = 19, /* the backend or variant has no kernels for the shape or dtype */
    CLATTN_ERROR_INVALID_DTYPE = 20,     /* shape.dtype is not a clattn_dtype */
    CLATTN_ERROR_INVALID_SEQLENS = 21,   /* packed sequences' prefix sums not from 0, decreasing,
                                          * or past the rows given */
    CLATTN_ERROR_INVALID_MODIFIER = 22,  /* softcap negative or not finite, an ALiBi slope not
                                          * finite, a sink NaN or +inf, dropout_p outside [0, 1) */
    CLATTN_ERROR_IO = 23                 /* a file could not be created, written or renamed */
} clattn_status;

#define CLATTN_MAX_HEAD_DIM 256

/* A static string naming the status, e.g. "CLATTN_ERROR_ZERO_SIZE"; never NULL. */
const char *clattn_status_string(clattn_status status);

/* The message of the last failed clattn call on the calling thread ("" when
 * none failed yet), with the detail a status cannot carry: which argument,
 * the OpenCL error code, a compiler's build log. Valid until the next clattn
 * call on this thread. */
const char *clattn_last_error(void);

/* The library's version as "MAJOR.MINOR.PATCH"; compare with CLATTN_VERSION. */
const char *clattn_version(void);

typedef enum clattn_backend {
    CLATTN_BACKEND_AUTO = 0,       /* an OpenCL GPU, else an OpenCL CPU device, else native */
    CLATTN_BACKEND_OPENCL_GPU = 1, /* the first OpenCL device of type GPU */
    CLATTN_BACKEND_OPENCL_CPU = 2, /* the first OpenCL device of type CPU (PoCL) */
    CLATTN_BACKEND_NATIVE = 3      /* plain C, threaded; needs no OpenCL at all */
} clattn_backend;

/* "auto", "opencl-gpu", "opencl-cpu" or "native"; "unknown" for other values. */
const char *clattn_backend_name(clattn_backend backend);

typedef struct clattn_options {
    /* Which backend to use. With CLATTN_BACKEND_AUTO and device == NULL the
     * environment variable CLATTN_DEVICE, when set, chooses instead. */
    clattn_backend backend;
    /* A device selector, which overrides backend when not NULL: "auto",
     * "gpu", "cpu", "native", "P:D" (OpenCL platform and device index, as
     * `clattn devices` lists them) or a case-insensitive substring of an
     * OpenCL device name. The string is read during the call only. */
    const char *device;
    /* A kernel variant by name, or NULL (or "auto") for the device's
     * default: OpenCL "mma" (tensor cores; NVIDIA GPUs of compute
     * capability 8.0+ only, and their default), "tiled" (other GPUs'
     * default), "blocked" (CPU devices' default) or "tree"; native
     * "blocked". clattn_variant_name() lists them. Without a name, each
     * call runs the variant measured fastest for its device, dtype, op,
     * head_dim and size class where one is known (the tuning file's auto
     * entries, else a built-in table: docs/tuning.md), else the default.
     * The string is read during the call only. */
    const char *variant;
    /* Threads of the native backend; 0 means CLATTN_NUM_THREADS when set,
     * else every online CPU. A negative count, or a CLATTN_NUM_THREADS
     * that is not a whole number from 1, is CLATTN_ERROR_INVALID_OPTION
     * when native is created. */
    int num_threads;
} clattn_options;

/* Options that pick the backend automatically. */
clattn_options clattn_options_default(void);

/* A context: one chosen backend and device, its compiled kernels and its
 * scratch buffers. Opaque. Calls on one context are serialised by a lock,
 * so a context may be shared by threads; they then take turns. */
typedef struct clattn_context clattn_context;

/* Creates a context as opts says (NULL: clattn_options_default()). With
 * backend auto, a backend that fails (no platform, no device, a failed
 * build) is noted and the next is tried; clattn_context_log() says what
 * was tried. The variant's kernels are built here (mma, tiled and blocked
 * ones for head_dim 64; other head_dims on first use), so a device that
 * cannot compile them is never chosen. Built programs are kept in an
 * on-disk cache (CLATTN_CACHE_DIR, else $XDG_CACHE_HOME/clattn or
 * ~/.cache/clattn; "off" disables it), so another context on the device
 * loads them. CLATTN_ERROR_UNKNOWN_VARIANT also answers a variant the
 * device cannot run ("mma" off NVIDIA tensor-core GPUs).
 * On success *ctx owns everything it created; release it with
 * clattn_context_destroy(). On failure *ctx is NULL and nothing is leaked.
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_INVALID_OPTION,
 * CLATTN_ERROR_UNKNOWN_VARIANT, CLATTN_ERROR_DEVICE_NOT_FOUND,
 * CLATTN_ERROR_NO_PLATFORM, CLATTN_ERROR_BUILD_FAILED,
 * CLATTN_ERROR_WORK_GROUP_TOO_LARGE, CLATTN_ERROR_OPENCL,
 * CLATTN_ERROR_OUT_OF_MEMORY. */
clattn_status clattn_context_create(const clattn_options *opts, clattn_context **ctx);

/* Releases everything the context created, and nothing it did not. NULL is
 * a no-op. No call on ctx may be in flight, and none may follow: any use
 * of ctx after this call (a second destroy included) is undefined. */
void clattn_context_destroy(clattn_context *ctx);

/* The backend the context runs on (never CLATTN_BACKEND_AUTO). */
clattn_backend clattn_context_backend(const clattn_context *ctx);

/* A one-line description of the backend and device, e.g.
 * "opencl-gpu: NVIDIA CUDA / NVIDIA H200 (0:0)" or "native: 2 threads".
 * Owned by the context. */
const char *clattn_context_device(const clattn_context *ctx);

/* The kernel variant the context runs, e.g. "tree" (made without a name:
 * its default, which a call runs where no faster choice is known; see
 * clattn_context_kernels()). Owned by the context. */
const char *clattn_context_variant(const clattn_context *ctx);

/* The kernels the context's last successful op ran, in order and
 * comma-separated, e.g. "dsum__tree,grad_kv__mma,grad_q__mma" ("" before
 * the first): where auto fell back for a head_dim, the kernels that really
 * ran. Owned by the context; valid until its next call. */
const char *clattn_context_kernels(const clattn_context *ctx);
/* The build options of the OpenCL programs those kernels came from, one per
 * kernel in the same order, separated by "; ": the shapes they ran at once
 * fitted to the device. "" on native and before the first op. */
const char *clattn_context_build_options(const clattn_context *ctx);

/* What creation tried before settling, one line per attempt ("" when the
 * first choice worked), with lines on the programs it built or loaded and
 * on the tuning file (docs/tuning.md): which entries it applied, or why it
 * ignored the file. Owned by the context. */
const char *clattn_context_log(const clattn_context *ctx);

/* The element type of Q, K, V, O, dO, dQ, dK and dV; the LSE pairs are
 * float whatever it is. 16-bit elements are passed as their bit patterns
 * (uint16_t). Softmax, the LSE, Dsum and every sum are float32 inside;
 * 16-bit outputs are rounded to nearest even once, at the end. */
typedef enum clattn_dtype {
    CLATTN_DTYPE_F32 = 0, /* IEEE binary32: float */
    CLATTN_DTYPE_F16 = 1, /* IEEE binary16 */
    CLATTN_DTYPE_BF16 = 2 /* bfloat16: the top 16 bits of a binary32 */
} clattn_dtype;

/* shape.causal: any non-zero value but CLATTN_CAUSAL_BOTTOM_RIGHT is
 * top-left, PyTorch's is_causal; CLATTN_CAUSAL_BOTTOM_RIGHT is
 * FlashAttention's and cuDNN's alignment. They differ only where
 * kv_seq != q_seq. */
#define CLATTN_CAUSAL_TOP_LEFT 1
#define CLATTN_CAUSAL_BOTTOM_RIGHT 2

typedef struct clattn_shape {
    uint32_t batch;
    uint32_t q_seq;
    uint32_t kv_seq;
    uint32_t num_heads;
    uint32_t num_kv_heads; /* divides num_heads; 1 is multi-query attention */
    uint32_t head_dim;     /* 1 .. CLATTN_MAX_HEAD_DIM */
    int causal;            /* non-zero: key T is visible to query P only if T <= P + window_right */
    uint32_t window;       /* non-zero: key t is visible to query pos only if pos < t + window */
    /* The window's right side, with causal: keys up to window_right past
     * the query are visible too (0, the default: the causal mask itself).
     * FlashAttention's window_size = (left, right) is window = left + 1
     * (left -1: 0) and, for right >= 0, causal (either alignment) with
     * window_right = right; right -1 is causal 0. Non-zero without causal
     * is CLATTN_ERROR_INVALID_OPTION. */
    uint32_t window_right;
    float scale;           /* 0: 1 / sqrt(head_dim) */
    clattn_dtype dtype;    /* of the tensors; 0 (CLATTN_DTYPE_F32) by default */
    /* Global positions of the first query row and the first key (0, 0 by
     * default): the causal and window masks compare q_offset + i with
     * kv_offset + j, so that a chunk of a longer sequence is masked as in
     * the whole. causal = CLATTN_CAUSAL_BOTTOM_RIGHT adds kv_seq - q_seq to
     * the queries' positions (a continuation: the last query sees the last
     * key), the same as q_offset = kv_seq - q_seq. Rows that see no key get
     * O = 0 and the LSE pair (-1e30, -1e30). */
    uint32_t q_offset;
    uint32_t kv_offset;
    /* Non-zero: the backward ops add their dQ, dK and dV into the output
     * tensors instead of overwriting them (BLAS's beta = 1), so that a
     * caller sums the gradients of several key chunks in place. */
    int accumulate;
    /* Packed variable-length sequences (FlashAttention's cu_seqlens):
     * NULL and NULL (the default) for a uniform batch; else batch + 1
     * prefix sums each, from 0 and non-decreasing, read during the call
     * only. Sequence i has the query rows [cu_seqlens_q[i],
     * cu_seqlens_q[i + 1]) and the key rows [cu_seqlens_kv[i],
     * cu_seqlens_kv[i + 1]); the tensors drop their batch dimension:
     *   Q, dO, O, dQ  [q_seq][num_heads][head_dim]
     *   K, V, dK, dV  [kv_seq][num_kv_heads][head_dim]
     *   LSE           [q_seq][num_heads][2]
     * with q_seq and kv_seq the rows given (at least the last prefix sum).
     * Each sequence is its own problem: its positions start at q_offset
     * and kv_offset, and the causal (either alignment, per sequence),
     * window, GQA and scale rules apply inside it. Sequences may be empty.
     * Query rows that see no key (in an empty key sequence, or past the
     * last prefix sum) get O = 0, the LSE pair (-1e30, -1e30) and dQ = 0;
     * key rows no query sees get dK = dV = 0 (left as they are under
     * accumulate). */
    const uint32_t *cu_seqlens_q;
    const uint32_t *cu_seqlens_kv;
    /* Score modifiers, applied in FlashAttention-2's order to the score
     * s = scale * (q . k) of query position P and key position T (the
     * global positions the masks use), before the mask:
     *   softcap > 0:        s = softcap * tanh(s / softcap)    (Gemma 2)
     *   alibi_slopes set:   s = s - alibi_slopes[h] * |P - T|  (query head h)
     * The LSE pairs are over the modified s; the backward goes through
     * tanh's derivative. alibi_slopes holds num_heads finite float32
     * slopes, read during the call only (for the _cl calls too). */
    float softcap;
    const float *alibi_slopes;
    /* Dropout of the attention probabilities: 0 (the default) is none;
     * else each (batch element or packed sequence b, query head h, P, T)
     * is kept iff the 8-bit Philox4x32-10 draw that docs/numerics.md
     * defines, keyed by dropout_seed at dropout_offset, as a fraction of
     * 2^8 is at least dropout_p, and
     * kept probabilities are scaled by 1 / (1 - dropout_p). The draw
     * depends on nothing else, so the mask is the same on every backend,
     * variant and device and for any chunking; a new dropout_offset (one
     * a step) draws a new mask from the same seed. The LSE pairs are the
     * undropped softmax's; the backward, given the same seed and offset,
     * regenerates the mask. clattn_dropout_mask() writes it out. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    /* Learnable sinks (gpt-oss, FlashAttention-4): NULL (the default), or
     * num_heads float32 logits read during the call only. Query head h's
     * sigma_h joins each of its rows' softmax as a key with no value:
     *   O = sum of exp(z_t - L) V[t],  L = log(sum of exp(z_t) + exp(sigma_h))
     * over the row's visible modified scores z_t; the LSE pair is L's (a
     * row that sees no key gets O = 0 and the pair (sigma_h, 0)). Only the
     * forward reads it: given that forward's LSE, the backward is exact
     * with or without it, and clattn_grad_sinks() gives d sigma. For key
     * chunks merged with clattn_merge(), give it to one chunk only. -inf is
     * no sink; NaN or +inf is CLATTN_ERROR_INVALID_MODIFIER. */
    const float *sinks;
    /* Programmable attention (docs/programmable.md): the caller's score and
     * mask functions, applied to each pair after the modifiers above, the
     * score function first, then the mask function, then the masks. Their
     * arguments: the score s so far; b, the batch element (a packed
     * sequence's index); h, the query head; q and k, the global positions P
     * and T the masks compare (modulo 2^32); p, the parameters.
     *   score_fn  OpenCL C source defining
     *             float clattn_score(float s, uint b, uint h, uint q, uint k,
     *                                __global const float *p)
     *             and its derivative in s, clattn_score_ds(), of the same
     *             arguments; NULL (the default): none.
     *   mask_fn   OpenCL C source defining
     *             bool clattn_mask(uint b, uint h, uint q, uint k),
     *             false hiding key k from query q; NULL: none.
     * The OpenCL backends compile them into the kernels (a compile error is
     * CLATTN_ERROR_BUILD_FAILED with the compiler's log); the native backend
     * calls score_native, score_ds_native and mask_native instead, the same
     * functions in C (a shape may carry both forms; a backend whose form is
     * missing returns CLATTN_ERROR_UNSUPPORTED_SHAPE). Functions must be
     * pure: they are called from many threads, in any order, and for
     * pairs whose result the masks then discard. score_params holds
     * score_params_count floats, read during the call only. A row that the
     * mask function hides whole is empty (O = 0, LSE (-1e30, -1e30)). */
    const char *score_fn;
    const char *mask_fn;
    const float *score_params;
    uint32_t score_params_count;
    float (*score_native)(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k,
                          const float *p);
    float (*score_ds_native)(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k,
                             const float *p);
    int (*mask_native)(uint32_t b, uint32_t h, uint32_t q, uint32_t k);
    /* A bias over the pairs and a boolean mask (PyTorch's attn_mask, as a
     * float or a bool tensor; cuDNN's bias), of the layout
     *   [bias_batch][bias_heads][q_seq][kv_seq]
     * indexed by the call's query row i and key row j (not by positions):
     *   bias       NULL (the default) or elements of bias_dtype, added to
     *              the score after the score function, before the mask
     *              function; -inf hides the pair (a row it hides whole is
     *              empty);
     *   bool_mask  NULL or bytes, 0 hiding key j from query row i, as the
     *              mask function does (its tiles are skipped likewise).
     * bias_batch is 1 or batch, bias_heads 1 or num_heads (0 reads as 1): a
     * dimension of 1 is broadcast. Both are read during the call only (for
     * the _cl calls too, from host memory). Not with packed sequences
     * (CLATTN_ERROR_UNSUPPORTED_SHAPE); dimensions that do not broadcast are
     * CLATTN_ERROR_INVALID_MODIFIER. clattn_grad_bias() gives dBias. */
    const void *bias;
    const uint8_t *bool_mask;
    uint32_t bias_batch;
    uint32_t bias_heads;
    /* The same tensors on the device, for the OpenCL backends: cl_mem
     * objects (cast to void *) of the layout above, which every call on an
     * OpenCL context (host-pointer and _cl calls alike) reads in place of
     * bias and bool_mask, with nothing copied; NULL (the default): none.
     * Native and clattn_grad_bias() read the host arrays (a shape may carry
     * both forms; one whose host form is missing is
     * CLATTN_ERROR_UNSUPPORTED_SHAPE there). A buffer smaller than the
     * layout is CLATTN_ERROR_INVALID_BUFFER. */
    void *bias_cl;
    void *bool_mask_cl;
    /* The score function over n pairs at once, for native beside
     * score_native and score_ds_native (NULL, the default: native calls
     * those pair by pair). The pairs lie in columns of `rows` pairs (n a
     * multiple of rows): s[i] is the score of the pair of query position
     * q + i % rows and key position k + i / rows (rows 1: one query's keys
     * k, k + 1, ...), and becomes score_native's value at it; where ds is
     * not NULL, ds[i] gets score_ds_native's at the same s[i] first. It
     * must give what those two give pair by pair (native calls either);
     * loops the compiler can vectorize make the score function nearly as
     * cheap as the built-in modifiers. The CLI and the Python package make
     * it from score_fn's source (clattn_native_wrapper). */
    void (*score_span_native)(float *s, float *ds, uint32_t n, uint32_t rows, uint32_t b,
                              uint32_t h, uint32_t q, uint32_t k, const float *p);
    /* The element type of bias and bias_cl: CLATTN_DTYPE_F32 (the
     * default), CLATTN_DTYPE_BF16 or CLATTN_DTYPE_F16, whatever the
     * tensors' dtype; each element is read as float32, exactly. Another
     * value is CLATTN_ERROR_INVALID_MODIFIER where there is a bias. dBias
     * (clattn_grad_bias) is float32 whatever it is. */
    clattn_dtype bias_dtype;
    /* The score function's derivative in its parameters, for
     * clattn_grad_score_params() (NULL, the default: none): at the score s
     * of a pair, up to CLATTN_SCORE_DP_MAX indices into p, in index[], and
     * the score function's partial derivative in each, in d[]; returns how
     * many. Its OpenCL C form, in score_fn's source, is
     *   uint clattn_score_dp(float s, uint b, uint h, uint q, uint k,
     *                        __global const float *p, uint *index, float *d)
     * (docs/programmable.md), which clattn_native_wrapper makes this. */
    uint32_t (*score_dp_native)(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k,
                                const float *p, uint32_t *index, float *d);
} clattn_shape;

/* The most parameters one pair's score may depend on (score_dp_native). */
#define CLATTN_SCORE_DP_MAX 4

/* The C99 text that makes the OpenCL C of shape->score_fn and mask_fn the
 * native backend's C forms, as the CLI and the Python package build them:
 * part 0 goes ahead of the functions' sources (headers, OpenCL C's names
 * defined for C, clattn_tanh as cl/tanh.cl has it), part 1 after them. Part 1
 * defines clattn_native_score, clattn_native_score_ds and
 * clattn_native_score_span (score_native, score_ds_native and
 * score_span_native) where CLATTN_SCORE is defined, clattn_native_score_dp
 * (score_dp_native) where CLATTN_SCORE_DP is, and clattn_native_mask
 * (mask_native) where CLATTN_MASK is. Built as a shared object with
 * -fvisibility=hidden, only those are exported and the functions inline
 * into the span's loops; with -O3 -fno-trapping-math (no rounding changed),
 * a compiler vectorizes those loops. NULL for any other part. */
const char *clattn_native_wrapper(int part);

/* n elements of dtype to float32 and back, as clattn converts them:
 * 16-bit to float32 exactly, float32 to 16-bit rounded to nearest even
 * (NaN stays NaN, overflow becomes infinity); float32 is copied. An invalid
 * dtype converts nothing. */
void clattn_to_f32(clattn_dtype dtype, const void *src, float *dst, size_t n);
void clattn_from_f32(clattn_dtype dtype, const float *src, void *dst, size_t n);

/* batch 1, everything else 0, no mask, default scale, float32: set the
 * sizes. */
clattn_shape clattn_shape_default(void);

/* Checks a shape against the contract without a context: the status that a
 * call with this shape would return for its shape alone. */
clattn_status clattn_shape_validate(const clattn_shape *shape);

/* The number of visible (query, key) pairs summed over query heads and
 * batch; 0 for an invalid shape, UINT64_MAX where the count does not fit.
 * grad-V does 4 * pairs * head_dim FLOP. */
uint64_t clattn_shape_visible_pairs(const clattn_shape *shape);

/* Converts meganeura's uniform block {q_seq, kv_seq, packed_heads,
 * head_dim, window_size, pad, pad, pad} (kv_seq == 0: causal with
 * kv_seq = q_seq; packed_heads = num_heads << 16 | num_kv_heads) into a
 * shape with batch 1 and the default scale, then validates it.
 * Status: as clattn_shape_validate(), or CLATTN_ERROR_NULL_POINTER. */
clattn_status clattn_shape_from_seed(const uint32_t params[8], clattn_shape *shape);

/* dV = sum over visible (pos, head of the KV head's group) of p * dO[pos],
 * p = exp(min(scale * Q[pos].K[t] - m, 0) - l), with (m, l) the forward's
 * LSE pair of the row. Host pointers, laid out as at the top of this file;
 * dv is written whole, inputs are not modified. Blocks until done.
 * Outputs may not alias: an output that shares memory with another tensor
 * of the call (dq == q, dk == dv, ...) is CLATTN_ERROR_INVALID_BUFFER,
 * found before anything is written; only clattn_merge() works in place.
 * Status: the shape's, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_INVALID_BUFFER,
 * CLATTN_ERROR_TOO_LARGE_FOR_DEVICE, CLATTN_ERROR_OPENCL,
 * CLATTN_ERROR_OUT_OF_MEMORY, and on a first call with a new head_dim
 * CLATTN_ERROR_BUILD_FAILED or CLATTN_ERROR_WORK_GROUP_TOO_LARGE;
 * CLATTN_ERROR_UNSUPPORTED_SHAPE where the backend has no kernels for the
 * shape (every backend and variant runs every head_dim 1..256 in every
 * dtype). A failure found before the op starts (bad shape, NULL pointer,
 * a head_dim the device cannot build) leaves the outputs unwritten; one
 * during it (a device fault) may leave them partly written. */
clattn_status clattn_grad_v(clattn_context *ctx, const clattn_shape *shape,
                            const void *d_out, const void *q, const void *k,
                            const float *lse, void *dv);

/* The forward: for each query row, O = sum over visible keys of p * V[t]
 * and the LSE pair (m, l), m the largest visible score, l = log of the sum
 * of exp(score - m); p = exp(score - m - l). A row with no visible key gets
 * O = 0 and (m, l) = (-1e30, -1e30). o and lse are written whole.
 * Status: as clattn_grad_v(). */
clattn_status clattn_forward(clattn_context *ctx, const clattn_shape *shape, const void *q,
                             const void *k, const void *v, void *o, float *lse);

/* The backward from the forward's o and lse and the output gradient d_out:
 * dQ, dK and dV, with Dsum = dO . O per row, dS = p * (dO . V[t] - Dsum),
 * dV[t] += p * dO, dK[t] += scale * dS * Q, dQ += scale * dS * K[t]; dK and
 * dV sum over every query head of the KV head's group. Deterministic: no
 * atomics, no order that depends on threads. Outputs are written whole, or
 * added to with shape->accumulate. Given the O and LSE of the whole key
 * set (after clattn_merge()), the backward of one key chunk (with its
 * offsets) is that chunk's exact share of the gradients.
 * Status: as clattn_grad_v(). */
clattn_status clattn_backward(clattn_context *ctx, const clattn_shape *shape, const void *q,
                              const void *k, const void *v, const void *o, const float *lse,
                              const void *d_out, void *dq, void *dk, void *dv);

/* Merges two partial results of the same queries over disjoint key sets,
 * (o1, lse1) and (o2, lse2), as forwards over two key chunks give them,
 * into the (o, lse) of their union: each row's log-sum-exp is m + l of its
 * pair; the merged one is the log of their summed exponentials, and o the
 * sum of o1 and o2 weighted by exp(their LSE - the merged LSE). The pair
 * written is (the larger m, the log-sum-exp relative to it). Rows empty in
 * both stay O = 0, (-1e30, -1e30); a NaN in either partial makes its row
 * NaN. Uses the shape's batch, q_seq,
 * num_heads, head_dim and dtype (o1, o2, o of that dtype; the pairs float).
 * o and lse may be o1 and lse1, or o2 and lse2: merged in place. The
 * host-pointer form runs on the host for every backend; clattn_merge_cl()
 * runs on the device. Status: as clattn_forward(). */
clattn_status clattn_merge(clattn_context *ctx, const clattn_shape *shape, const void *o1,
                           const float *lse1, const void *o2, const float *lse2, void *o,
                           float *lse);

/* The sinks' gradient, from the forward's o and lse (with shape->sinks)
 * and the output gradient d_out: for each query head h,
 *   d_sinks[h] = -sum over its rows of exp(sigma_h - L) (dO . O)
 * with L = m + l of the row's LSE pair, over every batch element (or
 * packed sequence) and query row; rows whose pair is empty's (-1e30,
 * -1e30) add nothing. d_sinks holds num_heads floats, written whole, or
 * added to with shape->accumulate. Runs on the host for every backend, in
 * one fixed order (deterministic), reading the call's O and dO once.
 * Status: as clattn_forward(); CLATTN_ERROR_NULL_POINTER where
 * shape->sinks is NULL. */
clattn_status clattn_grad_sinks(clattn_context *ctx, const clattn_shape *shape, const void *o,
                                const float *lse, const void *d_out, float *d_sinks);

/* The bias's gradient, from the forward's o and lse and the output
 * gradient d_out: dBias = dS = p (dP - Dsum) of each pair, the gradient of
 * the modified score where the bias is added (dP = dO . V[t], through
 * dropout's mask and gain where the shape has dropout; 0 where a mask
 * hides the pair), summed over the batch elements and heads that
 * shape->bias_batch and bias_heads broadcast. d_bias holds
 * [bias_batch][bias_heads][q_seq][kv_seq] floats, written whole, or added
 * to with shape->accumulate; shape->bias may be NULL (the gradient at a
 * bias of 0). Deterministic: each element's pairs are added in one fixed
 * order. On an OpenCL GPU it runs on the device (the shape's OpenCL
 * forms), d_bias read back; on native, on a CPU device where the host can
 * run it, and where the device cannot take it (the gradient past its
 * largest allocation, or a driver's loop cap), on the host on up to 16
 * threads, where a score or mask function needs its C form (score_native,
 * mask_native) and the bias its host form (CLATTN_GRAD_BIAS moves it,
 * docs/tuning.md). Status:
 * as clattn_forward(); CLATTN_ERROR_UNSUPPORTED_SHAPE with packed
 * sequences or without a form the host needs. */
clattn_status clattn_grad_bias(clattn_context *ctx, const clattn_shape *shape, const void *q,
                               const void *k, const void *v, const void *o, const float *lse,
                               const void *d_out, float *d_bias);

/* The score function's parameter gradient, from the forward's o and lse
 * and the output gradient d_out: for each parameter i,
 *   d_params[i] = sum over the pairs of dZ * d clattn_score / d p[i]
 * with dZ = p (dP - Dsum) the gradient of the pair's modified score (as
 * clattn_grad_bias() gives it; 0 where a mask hides the pair) and the
 * partial derivatives the score function's clattn_score_dp gives at the
 * score the score function took. d_params holds score_params_count
 * floats, written whole, or added to with shape->accumulate; nothing is
 * written on an error. Runs where clattn_grad_bias() does: on an OpenCL
 * device where shape->score_fn defines clattn_score_dp and the table fits
 * the device's local memory; else on the host (the C forms score_native,
 * score_dp_native and mask_native; a bias or bool mask in its host form),
 * on the native context's threads or up to 16 of another's.
 * Deterministic: the pairs are cut into parts by the shape (and the
 * device's work-group side) alone, and the parts' sums are added in
 * order in float64. Status: as clattn_forward(); CLATTN_ERROR_NULL_POINTER
 * where the shape has no score function or parameters, or the host runs
 * it without score_dp_native; CLATTN_ERROR_INVALID_MODIFIER where
 * clattn_score_dp gives more than CLATTN_SCORE_DP_MAX indices or one past
 * score_params_count; CLATTN_ERROR_UNSUPPORTED_SHAPE with packed
 * sequences or without a form the host needs. */
clattn_status clattn_grad_score_params(clattn_context *ctx, const clattn_shape *shape,
                                       const void *q, const void *k, const void *v,
                                       const void *o, const float *lse, const void *d_out,
                                       float *d_params);

/* dQ alone, and dK alone, as clattn_backward() computes them. */
clattn_status clattn_grad_q(clattn_context *ctx, const clattn_shape *shape, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            const void *d_out, void *dq);
clattn_status clattn_grad_k(clattn_context *ctx, const clattn_shape *shape, const void *q,
                            const void *k, const void *v, const void *o, const float *lse,
                            const void *d_out, void *dk);

/* The dropout mask of shape (dropout_p, dropout_seed, dropout_offset,
 * the offsets and causal alignment) for batch element (or packed
 * sequence) b and query head `head`: keep[pos * kv_len + t] = 1 where the
 * draw keeps (query row pos, key t) and 0 where it drops it, for the
 * q_len x kv_len rows of that element (its sequence's lengths when
 * packed). Visibility is not applied: a masked pair's entry is its draw
 * all the same. With dropout_p 0 every entry is 1.
 * Status: the shape's, CLATTN_ERROR_NULL_POINTER, CLATTN_ERROR_INVALID_OPTION
 * (b or head out of range). */
clattn_status clattn_dropout_mask(const clattn_shape *shape, uint32_t b, uint32_t head,
                                  uint8_t *keep);

/* The kernel variants a backend offers, by index from 0 (the first is its
 * default where the device runs it: OpenCL GPUs list "mma" first, then
 * "tiled"; OpenCL CPU devices "blocked"); NULL past the last, and for
 * CLATTN_BACKEND_AUTO. Static strings. */
const char *clattn_variant_name(clattn_backend backend, size_t index);

typedef struct clattn_device_info {
    clattn_backend backend; /* OPENCL_GPU, OPENCL_CPU or NATIVE */
    int platform_index;     /* -1 for native */
    int device_index;       /* within the platform; -1 for native */
    char platform[128];
    char name[128];
} clattn_device_info;

/* Lists every OpenCL device, then the native backend, into devices (up to
 * capacity entries); *count receives how many exist. An OpenCL runtime
 * with no platform is not an error: the list then holds native alone.
 * Status: CLATTN_OK, CLATTN_ERROR_NULL_POINTER (count NULL, or devices
 * NULL with capacity > 0), CLATTN_ERROR_OPENCL. */
clattn_status clattn_list_devices(clattn_device_info *devices, size_t capacity,
                                  size_t *count);

#ifdef __cplusplus
}
#endif

#endif /* CLATTN_H */
