/* What the OpenCL backend's files share: the kernels an op is made of, the
 * kernel shapes, a context's state, and the functions one file offers the
 * others.
 *   devices.c  enumerating and picking devices, making a context's state
 *   tuning.c   every variant's setup, the scratch bounds, the tuning file
 *   build.c    building a variant's programs (program cache, sm_90a route)
 *   launch.c   sizing and enqueueing kernels, an op's plan
 *   host.c     the host-pointer calls through per-role copy buffers
 *   pairs.c    dBias and the score parameters' gradient on the device
 *   cl_api.c   the public clattn_*_cl calls on the caller's cl_mem buffers
 *   variants/  one file per variant (variant.h): its kernels, shapes, sizing */
#ifndef CLATTN_OPENCL_H
#define CLATTN_OPENCL_H

#define CL_TARGET_OPENCL_VERSION 120
#include "clattn_cl.h"
#include "internal.h"

#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

/* The kernels an op is made of. */
enum {
    K_GRAD_V,
    K_FORWARD,
    K_DSUM,
    K_GRAD_Q,
    K_GRAD_K,
    K_GRAD_KV,
    K_GRAD_KVQ,  /* dK, dV and a float32 dQ in one pass (mma, 16-bit) */
    K_FINISH_DQ, /* dQ from that float32 dQ */
    K_GRAD_KVS,  /* GRAD_KV that also writes dS to a scratch (tiled) */
    K_GRAD_QS,   /* dQ from that dS: no scores recomputed */
    K_SUM_PARTS, /* dK and dV from the key side's parts (PARTS_K, PARTS_V) */
    K_GRAD_BIAS, /* dBias (clattn_grad_bias): the generic variant's */
    /* the score parameters' gradient (clattn_grad_score_params): the
     * generic variant's, in the sets built with CLATTN_MOD_SCORE_DP */
    K_GRAD_PARAMS,
    K_COUNT
};

/* What each kernel takes: its tensors in argument order, whether its rows
 * are queries or keys, and how many floats of local memory per lane
 * (kernel_desc.c). */
typedef struct kernel_desc {
    int roles[9];
    int nroles;
    int key_rows;
    int local_per_lane;
} kernel_desc;
extern const kernel_desc clattn_ocl_kernel_descs[K_COUNT];

/* Dsum, the pre-pass's output, is a tensor of one float per query row;
 * DQ32 the single-pass backward's float32 dQ, summed by atomic adds; DS the
 * dS scratch between GRAD_KVS and GRAD_QS; PARTS_K and PARTS_V the float32
 * dK and dV of a key side split into parts, each element's parts side by
 * side, which SUM_PARTS adds up; DBIAS the bias's float32 gradient;
 * DPARAMS the score parameters' gradient's parts, a table a work-group. */
enum { R_DSUM = CLATTN_R_COUNT, R_DQ32, R_DS, R_PARTS_K, R_PARTS_V, R_DBIAS, R_DPARAMS, R_ALL };

/* cl/tiled's shape: rows per work-group, keys (or queries) per local-memory
 * tile, work-items per row by the tile's rows, the most columns of head_dim
 * one work-item holds (the rows layout: more work-items share a row by
 * columns past it), and rows per work-item (1 to 8: the micro-tile layout,
 * whose work-items also split the columns by split; 0: the rows layout).
 * one_kv is set by fitting, never given: the micro-tile forward's K and V
 * tiles take turns in one buffer, as two do not fit the device. */
typedef struct tile_config {
    unsigned rows, tile, split, columns, per_item, one_kv;
} tile_config;
/* Which of tiled's kernels a shape is for: the forward, or the backward's
 * (grad-Q and the key side share one program); TILED_EVERY in the tuning
 * file: both. */
enum { TILED_FORWARD, TILED_BACKWARD, TILED_EVERY };
struct tile_class;

/* cl/mma's shape: warps per work-group, warps that share 16 rows (each
 * with a part of head_dim), rows per local tile, and whether float32 tiles
 * hold tf32 planes (2) or fp32 (1; unused by 16-bit tensors). */
typedef struct mma_config {
    unsigned warps, wsplit, tile, planes;
} mma_config;
/* A shape from the tuning file (`clattn tune`), for one variant, dtype and
 * head_dim on this device. */
typedef struct tuned_entry {
    const struct clattn_ocl_variant *variant;
    int pass; /* tiled: TILED_FORWARD, TILED_BACKWARD or TILED_EVERY */
    clattn_dtype dtype;
    uint32_t head_dim;
    tile_config tile;
    mma_config mma;
} tuned_entry;
enum { TUNED_MAX = 96, PACKED_QUEUES = 4, TUNING_KEY_MAX = 400 };
enum { GRAD_BIAS_AUTO, GRAD_BIAS_DEVICE, GRAD_BIAS_HOST };
/* The columns of Q, dO, K and V that grad_bias__tree (cl/tree/pairs.cl) holds in
 * local memory at a time: its -DBIAS_CHUNK; the floats of a row of them
 * there (its BIAS_ROW); the bytes its buffer gives up to start 16-byte
 * aligned (local_align16). */
enum { BIAS_CHUNK = 32, BIAS_ROW = BIAS_CHUNK + 4, BIAS_ALIGN = 12 };
/* The default's choice (choice.c): ops and size classes (the longest of
 * q_seq and kv_seq up to CHOICE_SHORT_TO, or past it; the built-in table's
 * CHOICE_FEW: short, with few blocks of keys). */
enum { CHOICE_FORWARD, CHOICE_BACKWARD, CHOICE_ANY = -1 };
enum { CHOICE_SHORT, CHOICE_LONG, CHOICE_FEW, CHOICE_SHORT_TO = 1024, CHOICES_MAX = 96 };
/* A tuning file's `auto` entry: the variant that runs an op of a dtype,
 * head_dim and size class on this device. */
typedef struct choice_entry {
    clattn_dtype dtype;
    uint32_t head_dim;
    int op, size;
    const struct clattn_ocl_variant *variant;
} choice_entry;
#define DS_DEFAULT ((size_t)-1)

/* The kernels of one variant, built for one head_dim (tiled, blocked) or
 * any (tree). */
typedef struct kernel_set {
    cl_program program[K_COUNT]; /* kernels of one source share a program */
    cl_kernel kernel[K_COUNT];
    const char *function[K_COUNT];
    char options[K_COUNT][384]; /* each kernel's program's build options */
    size_t max_wg[K_COUNT];
    cl_ulong local_mem[K_COUNT];
    const struct clattn_ocl_variant *family[K_COUNT]; /* whose source each kernel is */
    clattn_dtype dtype;
    unsigned mods; /* the score modifiers it was built with (MODS) */
    /* The most work-items a work-group of the set has: the device's limit,
     * lowered to what every built kernel of the set allows. Tree and tiled
     * fit their shapes to it. */
    size_t limit;
    /* The variant it was built for, and the next variant's set of the same
     * head_dim, dtype and modifiers (the default's choice runs several). */
    const struct clattn_ocl_variant *variant;
    struct kernel_set *next;
    /* The caller's functions (docs/programmable.md) its programs start
     * with, owned; NULL for the built-in modifiers alone. With them, the
     * set's head_dim (0: the generic variant's, for any). */
    char *user;
    uint32_t head_dim;
} kernel_set;

/* Kernel sets with the caller's functions that a context keeps, the most
 * recently used first; past this many the least recent is released. */
#define USER_SETS_MAX 16

struct clattn_cl_state {
    clattn_context *owner; /* for its log */
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    int own_context, own_queue;
    /* What the device allows, as read (and lowered by CLATTN_DEVICE_LIMITS). */
    struct {
        cl_ulong max_alloc, global_mem, local_mem;
        size_t max_wg; /* the work-group limit (in dimension 0 too) */
        /* Loop iterations a work-item may run in all, where the driver
         * ends work-items past a count (Mesa's llvmpipe: 65535); 0 where
         * none. */
        unsigned long loop_cap;
        cl_uint float_width;   /* the native vector width for float */
        cl_uint compute_units; /* CL_DEVICE_MAX_COMPUTE_UNITS */
    } limits;
    /* The variant built per head_dim, or NULL where the generic variant's
     * one set serves every call. */
    const struct clattn_ocl_variant *variant;
    /* 1: made without a variant, so that each call runs the default's
     * choice (choice.c) for it; the choices of the tuning file for it. */
    int choose;
    struct {
        choice_entry entries[CHOICES_MAX];
        size_t count;
    } choices;
    /* The built kernels, per score modifiers (clattn_modifiers bits) and
     * dtype: the generic variant's for any head_dim (with the context
     * where it is the context's variant, else on first use), the
     * variant's per head_dim (on first use; the generic set where auto
     * fell back on it), and merge__tree per dtype. */
    struct {
        kernel_set any_head_dim[CLATTN_MODS][3];
        int any_built[CLATTN_MODS][3];
        kernel_set *per_head_dim[CLATTN_MODS][3][CLATTN_MAX_HEAD_DIM + 1];
        kernel_set *user; /* with the caller's functions, chained by next */
        cl_kernel merge[3];
    } kernels;
    /* What variants/mma.c reads from the device and the environment. */
    struct {
        int emulate;  /* build cl/mma with -DMMA_EMULATE */
        int nv_major; /* compute capability (NVIDIA), else 0: 9 builds with -DSM90 */
        int wgmma;    /* the 16-bit kernels on wgmma where it applies */
        int tuned;    /* CLATTN_MMA set: tune for every kernel */
        mma_config tune;
        int grad_q_tuned; /* CLATTN_MMA_GRAD_Q set: grad_q_tune for grad-Q */
        mma_config grad_q_tune;
        int single_tuned; /* CLATTN_MMA_SINGLE set: the single pass, wherever it fits */
        mma_config single_tune;
        unsigned key_parts; /* CLATTN_MMA_KEY_PARTS: the key side's parts (0: 'auto') */
        int heads_first;    /* CLATTN_MMA_ORDER: an MMA_ORDER_ (cl/mma's HEADS_FIRST) */
    } mma;
    /* What variants/tiled.c reads from the device and the environment. */
    struct {
        const struct tile_class *classes; /* the device type's first class in the table */
        /* CLATTN_TILED (every kernel) and CLATTN_TILED_BACKWARD (the
         * backward's), checked, or ""; they beat the tuning file. */
        char env[2][64];
    } tiled;
    /* The device's key in the tuning file ("" where it has none), and the
     * file's entries for it. */
    char tuning_key[TUNING_KEY_MAX];
    /* Where clattn_grad_bias() runs (CLATTN_GRAD_BIAS): GRAD_BIAS_AUTO, the
     * device on a GPU and the host on a CPU device wherever the host can
     * (its own threads are faster there); GRAD_BIAS_DEVICE, GRAD_BIAS_HOST
     * wherever each can. */
    int grad_bias_on;
    /* CLATTN_LOCAL_PROBE=1 (tests): each laid-out local buffer checked at
     * its build (build.c's probe_local). */
    int local_probe;
    /* Whether built programs go to clattn's program cache: not on PoCL,
     * which keeps its own, unless CLATTN_CACHE_POCL=1 (build.c). */
    int program_cache;
    struct {
        tuned_entry entries[TUNED_MAX];
        size_t count;
    } tuned;
    /* Queues of the context's own that packed sequences spread over. */
    cl_command_queue packed_queues[PACKED_QUEUES];
    /* The buffers host-pointer calls copy through, per role, grown as
     * needed. */
    struct {
        cl_mem buffer[CLATTN_R_COUNT];
        size_t bytes[CLATTN_R_COUNT];
    } host_copy;
    /* The backward's dS scratch (GRAD_KVS to GRAD_QS): at most `max` bytes
     * (CLATTN_DS_MAX_MB; 0: none, grad-Q computes the scores again;
     * DS_DEFAULT: a 16th of the device's memory) and the device's largest
     * allocation; the buffer, grown as needed, and the event of its last
     * reader, which the next call's first writer waits for. */
    struct {
        size_t max;
        cl_mem buffer;
        size_t bytes;
        cl_event last_read;
    } ds;
    /* The key side's parts (R_PARTS_K, R_PARTS_V): the buffer, grown as
     * needed, and the event of its last reader (SUM_PARTS), which the next
     * writer waits for. */
    struct {
        cl_mem buffer;
        size_t bytes;
        cl_event last_read;
        int ran; /* the last op split its key side */
    } parts;
    /* The block map of the caller's mask function (cl/common.cl's
     * mask_map) of the last shape that had one, kept for the calls after
     * it while their mask's text and the shape's sizes and positions are
     * the same (a new one goes in a new buffer: kernels still queued keep
     * the old). */
    struct mask_map_state {
        cl_mem buffer;
        char *text;
        uint32_t batch, q_seq, kv_seq, num_heads, kv_offset, seq_base;
        int64_t delta;
    } mask_map;
};

/* The buffers of an op's score modifiers (cl/common.cl's MOD_ARGS): the
 * ALiBi slopes, sinks and score parameters; the block map of the caller's
 * mask function and bool mask; the caller's bias and bool mask, and which
 * dimensions they have. NULL where the op has none. */
typedef struct clattn_mod_buffers {
    cl_mem slopes, blocks, bias, bool_mask;
    cl_uint bias_dims;
    cl_mem own_blocks; /* a map made for this op alone (of a bool mask) */
} clattn_mod_buffers;
/* modifiers.c: *mb for an op of s with modifier bits mods (the host
 * arrays copied, the caller's cl_mem retained); _release_mods releases
 * them; _mask_map puts the block map in mb->blocks (made by the mask_map
 * kernel of set's forward program after the wait list, and waited for; a
 * mask function's kept on cl for the calls after it). */
clattn_status clattn_ocl_make_mods(struct clattn_cl_state *cl, const clattn_shape *s, unsigned mods,
                                  clattn_mod_buffers *mb);
void clattn_ocl_release_mods(clattn_mod_buffers *mb);
clattn_status clattn_ocl_mask_map(struct clattn_cl_state *cl, cl_command_queue queue,
                                  const kernel_set *set, const clattn_shape *s,
                                  clattn_mod_buffers *mb, cl_uint nwait, const cl_event *wait);

/* errors.c */
clattn_status clattn_ocl_fail(cl_int err, const char *what);
const char *clattn_ocl_error_name(cl_int err);

/* devices.c */
/* Makes ctx an OpenCL context on device; context and queue are created
 * when NULL, the caller's used (never released) otherwise. */
clattn_status clattn_ocl_init_on_device(clattn_context *ctx, const char *variant,
                                        cl_context context, cl_device_id device,
                                        cl_command_queue queue, int strict_limits);

/* tuning.c */
/* Every variant's setup (variant.h) with the device's facts, then the
 * program cache's bound and CLATTN_DS_MAX_MB (a bad one is
 * CLATTN_ERROR_INVALID_OPTION). */
clattn_status clattn_ocl_tuning_init(struct clattn_cl_state *cl, cl_device_id device,
                                     int items_loop);

/* tuning_file.c */
/* A device's key in the tuning file (docs/tuning.md), "PLATFORM / DEVICE /
 * DRIVER", into key; 0, and key "", where it does not fit size or holds a
 * tab or newline. */
int clattn_ocl_tuning_key(const char *platform, const char *device, const char *driver,
                          char *key, size_t size);
/* The tuning file's entries for the device whose key is `key`, into
 * cl->tuned, each line of what happened in ctx's log. A missing file is no
 * entry; a damaged or stale one is ignored with a log line, never a
 * failure. */
void clattn_ocl_tuning_file(struct clattn_cl_state *cl, clattn_context *ctx, const char *key);

/* build.c */
void clattn_ocl_release_set(kernel_set *set);
clattn_status clattn_ocl_build_set(struct clattn_cl_state *cl,
                                   const struct clattn_ocl_variant *variant, uint32_t head_dim,
                                   clattn_dtype dtype, unsigned mods, kernel_set *set,
                                   int strict_limits);
clattn_status clattn_ocl_generic_kernels(struct clattn_cl_state *cl, clattn_dtype dtype,
                                         unsigned mods, kernel_set **out);
/* The kernels of a variant (NULL: the generic one) for a head_dim, dtype
 * and set of score modifiers, built on first use; `reason`, where not
 * NULL, is logged with the build: why the variant runs. */
clattn_status clattn_ocl_kernels_for(struct clattn_cl_state *cl,
                                     const struct clattn_ocl_variant *variant, const char *reason,
                                     uint32_t head_dim, clattn_dtype dtype, unsigned mods,
                                     kernel_set **out);
/* The generic variant's kernels for s's head_dim and dtype with modifier
 * bits mods (the caller's functions too). */
clattn_status clattn_ocl_generic_kernels_of(struct clattn_cl_state *cl, const clattn_shape *s,
                                            unsigned mods, kernel_set **out);
/* The kernels op runs for shape s: the default's choice (choice.c) where
 * the context chooses, else its variant's. */
clattn_status clattn_ocl_kernels_of(struct clattn_cl_state *cl, clattn_op op,
                                    const clattn_shape *s, kernel_set **out);

/* choice.c */
/* The variant op runs for s (NULL: the generic one), and *reason why where
 * it was chosen (else NULL). */
const struct clattn_ocl_variant *clattn_ocl_variant_for(const struct clattn_cl_state *cl,
                                                        clattn_op op, const clattn_shape *s,
                                                        const char **reason);
/* CHOICE_SHORT or CHOICE_LONG, and CHOICE_FORWARD or CHOICE_BACKWARD. */
int clattn_ocl_size_class(const clattn_shape *s);
int clattn_ocl_choice_op(clattn_op op);
/* An `auto` entry's shape field, "OP,SIZE=VARIANT", into c's op, size and
 * variant: 1 where it is one. */
int clattn_ocl_parse_choice(const char *shape, choice_entry *c);
/* An entry as "auto DTYPE head_dim D: OP,SIZE=VARIANT" for the log. */
void clattn_ocl_format_choice(const choice_entry *c, char *buf, size_t size);

/* launch.c */
/* A launch over a part of the heads and batch elements (the dS scratch's
 * chunks): KV heads [kv_head0, + kv_heads) of batch elements [b0, + nb). */
typedef struct grid_part {
    size_t kv_head0, kv_heads, b0, nb;
} grid_part;
/* Kernel k's arguments up to its local buffer: its tensors (kernel_desc),
 * then cl/common.cl's SHAPE_ARGS; *next: the next argument's index. */
cl_int clattn_ocl_set_args(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                           const clattn_shape *s, const clattn_mod_buffers *mb,
                           const clattn_cl_tensor t[R_ALL], cl_uint *next);
/* Whether kernel k's work-group of wg with `local` bytes fits the device. */
clattn_status clattn_ocl_check_fits(const struct clattn_cl_state *cl, const kernel_set *set,
                                    int k, const clattn_shape *s, size_t wg, size_t local);
/* Kernel k with its arguments, its grid (parts times its row groups; over
 * `part` of the heads and batch elements where not NULL) after the wait
 * list; *done gets its event. */
clattn_status clattn_ocl_enqueue_kernel(struct clattn_cl_state *cl, cl_command_queue queue,
                                        const kernel_set *set, int k, const clattn_shape *s,
                                        const clattn_mod_buffers *mb,
                                        const clattn_cl_tensor t[R_ALL], const grid_part *part,
                                        size_t parts, cl_uint nwait, const cl_event *wait,
                                        cl_event *done);
/* CLATTN_ERROR_TOO_LARGE_FOR_DEVICE where the driver's loop cap could cut
 * the call's work-items short (cl->loop_cap). */
clattn_status clattn_ocl_check_loop_cap(const struct clattn_cl_state *cl, clattn_op op,
                                        const clattn_shape *s);
/* Bytes of one element of role r (R_DSUM and the LSE pairs are float). */
size_t clattn_ocl_role_bytes(int r, clattn_dtype dtype);
clattn_status clattn_ocl_check_alloc(const struct clattn_cl_state *cl, const clattn_sizes *sz,
                                     clattn_dtype dtype);
/* Enqueues the kernels of op after the wait list, each after the one
 * before, so that an out-of-order queue keeps their order. *done, when
 * not NULL, receives the last kernel's event. */
clattn_status clattn_ocl_enqueue_op(struct clattn_cl_state *cl, cl_command_queue queue,
                                    clattn_op op, const clattn_shape *s,
                                    const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                    cl_uint nwait, const cl_event *wait, cl_event *done);
/* Packed sequences (cu_seqlens) on device buffers, each sequence's problem
 * at its rows, spread over the context's lanes; a barrier on its queue
 * after them all (event, when not NULL). */
clattn_status clattn_ocl_enqueue_packed(struct clattn_cl_state *cl, clattn_op op,
                                        const clattn_shape *s, const clattn_cl_tensor t[R_ALL],
                                        cl_uint nwait, const cl_event *wait, cl_event *event);
/* pairs.c: the gradients summed over the pairs, dBias (clattn_grad_bias)
 * and the score parameters' (clattn_grad_score_params). */
typedef enum pair_grad { PAIR_BIAS, PAIR_PARAMS } pair_grad;
/* Gradient `which` on the device into the host array out, from the device
 * tensors t (Q, K, V, O, LSE and DO) after the wait list, on the context's
 * queue; back once out is written. 0 where the device does not take s
 * (dBias past one allocation or the driver's loop cap; a score function's
 * source without clattn_score_dp, packed sequences, a table past local
 * memory: the host computes it), else 1 with the call's status in *st. */
int clattn_ocl_pair_grad(struct clattn_cl_state *cl, pair_grad which, const clattn_shape *s,
                         const clattn_sizes *sz, clattn_cl_tensor t[R_ALL], float *out,
                         cl_uint nwait, const cl_event *wait, clattn_status *st);
/* The same from host arrays in[] (q, k, v, o, lse, d_out), copied through
 * the scratch buffers: the backend's grad_bias and grad_score_params. */
int clattn_ocl_grad_bias_host(clattn_context *ctx, const clattn_shape *s, const clattn_sizes *sz,
                              const void *const in[6], float *d_bias, clattn_status *st);
int clattn_ocl_grad_params_host(clattn_context *ctx, const clattn_shape *s,
                                const clattn_sizes *sz, const void *const in[6], float *d_params,
                                clattn_status *st);
/* host.c */
/* The context's copy buffers of the roles in `held` (CLATTN_BIT bits)
 * into t, grown to the call's sizes (contents lost), then the caller's
 * arrays of the roles in `reads` written into theirs, an event each in ev
 * (*nev of them, to release, whatever the status). */
clattn_status clattn_ocl_upload(struct clattn_cl_state *cl, clattn_dtype dtype,
                                const clattn_sizes *sz, unsigned held, unsigned reads,
                                const void *const host[CLATTN_R_COUNT], clattn_cl_tensor t[R_ALL],
                                cl_event ev[CLATTN_R_COUNT], cl_uint *nev);
/* The backend's run: a host-pointer call through the scratch buffers. */
clattn_status clattn_ocl_run(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                             const clattn_sizes *sz, const void *const host[CLATTN_R_COUNT]);

#endif
