/* The OpenCL backend: device enumeration and selection, program builds,
 * scratch buffers for the host-pointer API, and kernel launches. */
#define CL_TARGET_OPENCL_VERSION 120
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_cl.h"
#include "clattn_kernels.h"
#include "internal.h"
#include "program_cache.h"
#include "sm90a.h"

#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

/* Kernels need -cl-std=CL1.2: NVIDIA reports OpenCL 3.0 but compiles C 1.2
 * only. No fast-math: masks and empty rows rely on huge negatives. */
static const char build_options[] = "-cl-std=CL1.2";

/* The kernels an op is made of. */
enum {
    K_GRAD_V,
    K_FORWARD,
    K_DSUM,
    K_GRAD_Q,
    K_GRAD_K,
    K_GRAD_KV,
    K_GRAD_KVQ, /* dK, dV and a float32 dQ in one pass (mma, 16-bit) */
    K_FINISH_DQ, /* dQ from that float32 dQ */
    K_COUNT
};

typedef struct cl_variant {
    int kernel;
    const char *name;
    const char *function;
    const char *source;
} cl_variant;

static const cl_variant variants[] = {
#define CLATTN_CL_VARIANT(kernel, name, function, source) {K_##kernel, name, function, source},
#include "variants.inc"
#undef CLATTN_CL_VARIANT
};
enum { VARIANT_COUNT = sizeof variants / sizeof variants[0] };

/* Dsum, the pre-pass's output, is a tensor of one float per query row;
 * DQ32 the single-pass backward's float32 dQ, summed by atomic adds. */
enum { R_DSUM = CLATTN_R_COUNT, R_DQ32, R_ALL };

/* What each kernel takes: its tensors in argument order, whether its rows
 * are queries or keys, and how many floats of local memory per lane. */
typedef struct kernel_desc {
    int roles[9];
    int nroles;
    int key_rows;
    int local_per_lane;
} kernel_desc;

static const kernel_desc kernel_descs[K_COUNT] = {
    [K_GRAD_V] = {{CLATTN_R_DO, CLATTN_R_Q, CLATTN_R_K, CLATTN_R_LSE, CLATTN_R_DV}, 5, 1, 1},
    [K_FORWARD] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_O, CLATTN_R_LSE}, 5, 0, 1},
    [K_DSUM] = {{CLATTN_R_DO, CLATTN_R_O, R_DSUM}, 3, 0, 1},
    [K_GRAD_Q] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                   CLATTN_R_DQ}, 7, 0, 2},
    [K_GRAD_K] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                   CLATTN_R_DK}, 7, 1, 2},
    [K_GRAD_KV] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                    CLATTN_R_DK, CLATTN_R_DV}, 8, 1, 2},
    [K_GRAD_KVQ] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                     CLATTN_R_DK, CLATTN_R_DV, R_DQ32}, 9, 1, 2},
    [K_FINISH_DQ] = {{R_DQ32, CLATTN_R_DQ}, 2, 0, 1},
};

/* The kernels of each op, in order; -1 ends a list. The backward runs
 * GRAD_KV where a variant has it, else GRAD_K and GRAD_V. */
static const int op_plans[CLATTN_OP_COUNT][5] = {
    [CLATTN_OP_FORWARD] = {K_FORWARD, -1},
    [CLATTN_OP_GRAD_V] = {K_GRAD_V, -1},
    [CLATTN_OP_GRAD_Q] = {K_DSUM, K_GRAD_Q, -1},
    [CLATTN_OP_GRAD_K] = {K_DSUM, K_GRAD_K, -1},
    [CLATTN_OP_BACKWARD] = {K_DSUM, K_GRAD_KV, K_GRAD_Q, -1},
};
static const int backward_unfused[5] = {K_DSUM, K_GRAD_K, K_GRAD_V, K_GRAD_Q, -1};
/* The single-pass backward, where a variant has it for the call (mma's
 * 16-bit kernels): DQ32 is zeroed before GRAD_KVQ. */
static const int backward_single[5] = {K_DSUM, K_GRAD_KVQ, K_FINISH_DQ, -1};

/* The tiled kernels' shapes per device type: rows per work-group, keys (or
 * queries) per local-memory tile, work-items per row by the tile's rows,
 * and the most columns of head_dim one work-item holds (more work-items
 * share a row by columns past it). A GPU wants more work-items in flight
 * than rows (causal attention with 8 heads of 4096 rows has only 32K rows);
 * a CPU runs a work-group's items as a loop and wants no split. On the
 * H200, 2026-11-30, forward and backward at q_seq 4096 (8 heads causal; 32
 * heads on 8 KV heads): 64,32,2 gave 8.6/10.2 and 7.4/7.5 TFLOP/s, against
 * 5.9/10.8 and 4.3/7.3 for 64,32,1 and 9.7/11.7 and 5.6/5.8 for 32,16,4
 * (`CLATTN_TILED=R,T,S clattn bench`). Past head_dim 64 a work-item's two
 * or three whole vectors spill (the backward at head_dim 128 ran at 0.78
 * TFLOP/s, below tree's 0.93), hence `wide`: rows split by columns. */
typedef struct tile_config {
    unsigned rows, tile, split, columns;
} tile_config;
typedef struct tile_class {
    cl_device_type type;
    tile_config narrow, wide; /* wide past narrow.columns */
} tile_class;
static const tile_class tile_table[] = {
    {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, {64, 32, 2, 64}, {32, 16, 1, 32}},
    {CL_DEVICE_TYPE_CPU, {64, 32, 1, CLATTN_MAX_HEAD_DIM}, {64, 32, 1, CLATTN_MAX_HEAD_DIM}},
};

/* Work-items that share a row by columns under c. */
static unsigned tile_dsplit(const tile_config *c, uint32_t head_dim)
{
    return head_dim > c->columns ? (head_dim + c->columns - 1) / c->columns : 1u;
}

/* How a kernel is launched: tree.cl's a work-group per row; tiled.cl's a
 * work-group per block of rows (per pair of blocks under a causal mask);
 * blocked.cl's a single work-item per block of BLOCKED_ROWS rows. */
enum { KIND_TREE, KIND_TILED, KIND_BLOCKED, KIND_MMA };
enum { BLOCKED_ROWS = 32 }; /* blocked.cl's KK keys and QB query rows */
/* mma.cl's shapes per head_dim class, one for the forward and one for the
 * backward's kernels: warps per work-group, warps that share 16 rows (each
 * with a part of head_dim), rows per local tile, and whether tiles hold tf32
 * planes (2) or fp32 (1). A lane holds 16 * head_dim / (8 * wsplit) floats
 * of fragments on the key side, and a work-group gets 48 KB of local memory
 * on NVIDIA's OpenCL: past head_dim 64 the warps split head_dim. Measured
 * on the H200, 2026-11-30 (`CLATTN_MMA=W,S,T,P clattn bench`, which sets
 * every kernel's shape; TFLOP/s forward / backward): d64 q_seq 4096 8 heads
 * causal 4,1,32,2 18.6 / 11.1, 8,1,32,2 17.1 / 13.0; d96 q_seq 2048 16
 * heads causal 4,2,16,2 15.7 / 10.8, 8,2,16,2 15.9 / 13.8, 8,2,16,1 14.9 /
 * 12.7; d128 q_seq 4096 32 heads on 8 causal 4,2,16,2 23.3 / 13.1,
 * 8,2,16,1 18.7 / 15.7 (8,2,16,2 needs 50 KB); d256 q_seq 2048 8 heads
 * causal 8,4,8,2 14.0 / 12.4, 4,4,16,1 12.8 / 7.0, 4,4,8,2 12.4 / 8.9.
 * grad-Q's own shape (`CLATTN_MMA_GRAD_Q`, the backward's TFLOP/s with the
 * table's dK/dV shape, same day): d64 causal 8,1,32,2 13.9, 8,1,16,2 14.9,
 * 4,1,16,2 14.5, 4,1,32,2 11.9; d64 32/8 heads 21.9, 22.8, 21.8, 19.6;
 * d128 32/8 causal 8,2,16,1 16.5, 8,2,8,2 17.1, 4,2,16,2 15.2; d128 32/8
 * non-causal 17.8, 18.3, 16.3; d96 causal 8,2,16,2 13.6 stays the best. */
typedef struct mma_config {
    unsigned warps, wsplit, tile, planes;
} mma_config;
typedef struct mma_class {
    uint32_t max_head_dim;
    mma_config forward, backward, grad_q; /* backward: dK and dV */
} mma_class;
static const mma_class mma_table[] = {
    {64, {4, 1, 32, 2}, {8, 1, 32, 2}, {8, 1, 16, 2}},
    {96, {4, 2, 16, 2}, {8, 2, 16, 2}, {8, 2, 16, 2}},
    {128, {4, 2, 16, 2}, {8, 2, 16, 1}, {8, 2, 8, 2}},
    {CLATTN_MAX_HEAD_DIM, {8, 4, 8, 2}, {8, 4, 8, 2}, {8, 4, 8, 2}},
};
/* The same for 16-bit tensors (m16n8k16; `planes` unused): tiles of
 * 16-bit words by rows, read by rows and by columns through ldmatrix, so
 * that they are half fp32's and longer tiles fit; a tile is a whole number
 * of k-steps of 16. Measured on the H200, 2026-11-30, bfloat16, every
 * kernel in one shape (`CLATTN_MMA=W,S,T,P clattn bench --dtype bf16`;
 * TFLOP/s forward / backward): d64 q_seq 4096 8 heads causal 4,1,64 100.7
 * / 66.0, 4,1,32 94.1 / 65.3, 8,1,16 71.0 / 52.3, 2,1,64 73.4 / 62.1; d128
 * q_seq 4096 32 heads on 8 causal 4,1,64 169.5 / 68.7, 8,1,64 161.9 /
 * 83.8, 4,1,32 124.0 / 89.9, 4,1,16 154.8 / 93.7 (the backward's kernels
 * hold K, V, dK and dV fragments: past 16-row tiles they spill). Past 128
 * the rows split by columns, untuned. Since 2026-12-01 16-bit tiles are
 * copied by cp.async into two buffers of each (no registers on the way,
 * one barrier a tile), which does not fit 64-row tiles past head_dim 64;
 * that day: d64 4,1,64 103.3 / 73.7, 8,1,64 97.9 / -, 8,1,32 85.2 / 66.4,
 * 4,1,32 - / 75.3; d128 4,1,32 187.8 / 102.5, 8,1,32 140.4 / -, 4,1,16
 * - / 96.1, 8,1,16 - / 93.6. Again for d64's backward, 2026-12-01 (sixth
 * session; three rounds, bf16 TFLOP/s, d64 causal / 32 heads on 8 /
 * q_seq 16384 causal): both kernels at 4,1,64 106-110 / 173-176 /
 * 186-187, both at 4,1,32 99-101 / 162-165 / 168-170, grad-Q alone at 32
 * 104-107 / 172-175 / 182-185, grad-K/V alone at 32 100-102 / 163-165 /
 * 171-172. Two 16-row blocks a warp (each B fragment
 * read serving two products) were slower everywhere the day before (d64
 * 4,1,32 forward 71.4, d128 4,1,16 backward 8.1 with its spills).
 * The single-pass backward (K's rows and two dS^T buffers in local memory
 * besides the tiles) has no column: its shape is CLATTN_MMA_SINGLE's, the
 * only way it runs (below). Same day, backward TFLOP/s
 * (`CLATTN_MMA_SINGLE=W,S,T,P`, 0 for two passes): d64 causal two passes
 * 74.2 / 71.7, single 4,1,32 68.6 / 58.1, 4,1,16 75.7, 8,1,16 48.9,
 * 2,1,32 59.9; d64 32 heads on 8 unmasked 118.7 / 118.8 (4,1,32), q_seq
 * 16384 causal 124.1 / 128.0; d128 causal 103.3 / 102.3, single 4,1,16
 * 96.1 / 91.5, 2,1,16 70.7; d128 unmasked 139.0 / 143.5; d96 causal
 * 67.7 / 56.1. Without the atomic adds (a trial) the single pass ran as
 * fast as with them: what holds it back is not the adds. Once whole
 * tiles skipped the mask's tests (2026-12-01, later), two passes were as
 * fast or faster everywhere: d64 q_seq 16384 causal 161 / 161 / 161 against
 * the single pass's 152 / 147 / 152, q_seq 4096 causal 92 / 92, 32 heads on
 * 8 148 / 151; so it runs only where CLATTN_MMA_SINGLE asks (its dQ is not
 * repeatable to the bit; two passes' is). */
static const mma_class mma16_table[] = {
    {64, {4, 1, 64, 1}, {4, 1, 64, 1}, {4, 1, 64, 1}},
    {128, {4, 1, 32, 1}, {4, 1, 32, 1}, {4, 1, 32, 1}},
    {CLATTN_MAX_HEAD_DIM, {4, 2, 16, 1}, {2, 2, 16, 1}, {4, 2, 16, 1}},
};

/* Whether kernel k runs on wgmma (mma.cl's WGMMA): asked for (by default
 * on compute capability 9, or by CLATTN_MMA_WGMMA=1), the forward, grad-Q
 * and the key side's kernels of 16-bit
 * tensors at head_dim 64 or 128
 * (the 128-byte swizzle's 64 columns), whole warpgroups (4 or 8 warps,
 * WSPLIT 1) and tiles of 32 to 128 keys in steps of 32, on a GPU of
 * compute capability 9 or emulated. */
static int mma_wgmma(int asked, int nv_major, int emulate, const mma_config *c,
                     uint32_t head_dim, clattn_dtype dtype, int k)
{
    return asked && (nv_major >= 9 || emulate) &&
           (k == K_FORWARD || k == K_GRAD_Q || k == K_GRAD_KV || k == K_GRAD_K || k == K_GRAD_V) &&
           dtype != CLATTN_DTYPE_F32 &&
           (head_dim == 64 || head_dim == 128) && c->warps % 4 == 0 && c->wsplit == 1 &&
           c->tile % 32 == 0 && c->tile <= 128;
}

/* mma.cl's local buffer for a kernel at a head_dim under config c, in
 * floats: up to 3 to a 16-byte boundary, the tile rows' m, l and Dsum, the
 * warps' exchange, the emulation's scratch, then the kernel's two tiles
 * (fp32: [tile][padded + 4] floats a plane; 16-bit: [tile][padded / 2 + 4]
 * words of two elements). 16-bit kernels have two of each, rows and tiles:
 * one is filled while the other is read. */
static size_t mma_local_floats(const mma_config *c, uint32_t head_dim, int emulate,
                               clattn_dtype dtype, int k)
{
    const size_t kstep = dtype == CLATTN_DTYPE_F32 ? 8u : 16u;
    const size_t unit = kstep * c->wsplit, padded = (head_dim + unit - 1) / unit * unit;
    const size_t exchange = c->wsplit > 1 ? 2 * (size_t)c->warps * c->tile / 8 * 4 * 32 : 0;
    const size_t emu = emulate ? (size_t)c->warps * (dtype == CLATTN_DTYPE_F32 ? 224 : 416) : 0;
    const size_t tile = dtype == CLATTN_DTYPE_F32 ? (size_t)c->planes * c->tile * (padded + 4)
                                                  : (size_t)c->tile * (padded / 2 + 4);
    const size_t buffers = dtype == CLATTN_DTYPE_F32 ? 1u : 2u;
    /* the single pass: K's rows and two tiles' dS^T, by rows of keys */
    const size_t rows = 16u * c->warps / c->wsplit;
    const size_t single = k == K_GRAD_KVQ ? rows * (padded / 2 + 4 + 2 * (c->tile / 2 + 4)) : 0;
    return 3 + buffers * (3 * (size_t)c->tile + 2 * tile) + exchange + emu + single;
}

/* A tuning override of mma shapes from the variable `name`, if set. */
static clattn_status mma_override(const char *name, mma_config *c, int *set)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return CLATTN_OK;
    char end;
    if (sscanf(text, "%u,%u,%u,%u%c", &c->warps, &c->wsplit, &c->tile, &c->planes, &end) != 4 ||
        (c->warps != 1 && c->warps != 2 && c->warps != 4 && c->warps != 8) ||
        (c->wsplit != 1 && c->wsplit != 2 && c->wsplit != 4) || c->warps % c->wsplit ||
        (c->tile != 8 && c->tile != 16 && c->tile != 32 && c->tile != 64) ||
        (c->planes != 1 && c->planes != 2))
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "%s='%s': want WARPS,WSPLIT,TILE,PLANES with WARPS 1, 2, 4 or 8, "
                           "WSPLIT 1, 2 or 4 dividing WARPS, TILE 8, 16, 32 or 64 (16-bit "
                           "tensors: 16 or more) and PLANES 1 or 2",
                           name, text);
    *set = 1;
    return CLATTN_OK;
}

/* NVIDIA's cl_nv_device_attribute_query. */
#define CLATTN_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000

/* The compute capability's major number of an NVIDIA GPU, 0 for any other
 * device: mma.cl's tensor-core PTX wants 8 (Ampere) or later, its vector
 * atomic adds 9 (Hopper). */
static int nv_major(cl_device_id device)
{
    size_t len = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &len) != CL_SUCCESS || !len)
        return 0;
    char *ext = malloc(len + 1);
    cl_uint major = 0;
    if (ext && clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, len, ext, NULL) == CL_SUCCESS) {
        ext[len] = '\0';
        if (!strstr(ext, "cl_nv_device_attribute_query") ||
            clGetDeviceInfo(device, CLATTN_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major,
                            &major, NULL) != CL_SUCCESS || major > 1000)
            major = 0;
    }
    free(ext);
    return (int)major;
}

/* CLATTN_MMA_EMULATE=1: mma.cl's instructions emulated in local memory, so
 * that its kernels run (slowly) on any device; for tests. */
static int mma_emulated(void)
{
    const char *env = getenv("CLATTN_MMA_EMULATE");
    return env && !strcmp(env, "1");
}

/* The kernels of one variant, built for one head_dim (tiled, blocked) or
 * any (tree). */
typedef struct kernel_set {
    cl_program program[K_COUNT]; /* kernels of one source share a program */
    cl_kernel kernel[K_COUNT];
    const char *function[K_COUNT];
    size_t max_wg[K_COUNT];
    cl_ulong local_mem[K_COUNT];
    int kind[K_COUNT];
    clattn_dtype dtype;
} kernel_set;

struct clattn_cl_state {
    clattn_context *owner; /* for its log */
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    int own_context, own_queue;
    /* Per dtype: */
    kernel_set generic[3]; /* tree's, any head_dim: with the context for tree, else lazily */
    int generic_built[3];
    /* Per head_dim, on first use; &generic where auto fell back on it. */
    kernel_set *special[3][CLATTN_MAX_HEAD_DIM + 1];
    cl_kernel merge[3]; /* tree.cl's merge__tree, per dtype, on first use */
    const char *special_variant; /* the variant built per head_dim, or NULL */
    int mma_emulate;             /* build mma.cl with -DMMA_EMULATE */
    int nv_major;                /* compute capability (NVIDIA), else 0: 9 builds with -DSM90 */
    int wgmma; /* the 16-bit kernels on wgmma where it applies (mma_wgmma) */
    int mma_tuned;               /* CLATTN_MMA set: mma_tune for every kernel */
    mma_config mma_tune;
    int grad_q_tuned;            /* CLATTN_MMA_GRAD_Q set: grad_q_tune for grad-Q */
    mma_config grad_q_tune;
    int single_tuned; /* CLATTN_MMA_SINGLE set to a shape: the single pass, wherever it fits */
    mma_config single_tune;
    tile_class tiles;
    cl_ulong max_alloc;
    cl_ulong local_mem;
    cl_uint float_width; /* the device's native vector width for float */
    /* Host-pointer calls copy through these buffers, grown as needed. */
    cl_mem scratch[CLATTN_R_COUNT];
    size_t scratch_bytes[CLATTN_R_COUNT];
};

/* tiled.cl's local buffer for a head_dim under c, in floats. */
static size_t tiled_local_floats(const tile_config *c, uint32_t head_dim)
{
    const size_t dsplit = tile_dsplit(c, head_dim);
    const size_t stride = (head_dim + dsplit - 1) / dsplit * dsplit;
    const size_t exchange = dsplit > 1 ? 2 * dsplit * c->tile * c->rows : 0;
    const size_t tiles = 2 * (size_t)c->tile * stride + 3 * (size_t)c->tile + exchange;
    const size_t combine = ((size_t)c->split - 1) * c->rows * (stride + 2);
    return tiles > combine ? tiles : combine;
}

/* The tiled kernels' shape for a head_dim: the table's, with its tile
 * halved until the local buffer fits the device (head_dim 256 on a GPU). */
static tile_config tile_config_for(const struct clattn_cl_state *cl, uint32_t head_dim)
{
    tile_config c = head_dim > cl->tiles.narrow.columns ? cl->tiles.wide : cl->tiles.narrow;
    while (c.tile % 2 == 0 && (c.tile / 2) % c.split == 0 &&
           tiled_local_floats(&c, head_dim) * sizeof(float) > cl->local_mem)
        c.tile /= 2;
    return c;
}

/* The shape of mma kernel k at a head_dim for a dtype. */
static const mma_config *mma_config_for(const struct clattn_cl_state *cl, uint32_t head_dim,
                                        clattn_dtype dtype, int k)
{
    static const mma_config none = {0, 0, 0, 0};
    if (k == K_GRAD_KVQ || k == K_FINISH_DQ) /* the single pass: only where asked */
        return cl->single_tuned ? &cl->single_tune : &none;
    if (k == K_GRAD_Q && cl->grad_q_tuned)
        return &cl->grad_q_tune;
    if (cl->mma_tuned)
        return &cl->mma_tune;
    const mma_class *table = dtype == CLATTN_DTYPE_F32 ? mma_table : mma16_table;
    size_t i = 0;
    while (table[i].max_head_dim < head_dim)
        ++i;
    return k == K_FORWARD  ? &table[i].forward
           : k == K_GRAD_Q ? &table[i].grad_q
                           : &table[i].backward;
}

/* Rows of a work-group of mma.cl: 16 for each group of wsplit warps. */
static size_t mma_rows(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype,
                       int k)
{
    const mma_config *c = mma_config_for(cl, head_dim, dtype, k);
    return 16u * c->warps / c->wsplit;
}

static const char *cl_error_name(cl_int err)
{
    switch (err) {
#define E(x) \
    case x:  \
        return #x;
        E(CL_DEVICE_NOT_FOUND)
        E(CL_DEVICE_NOT_AVAILABLE)
        E(CL_COMPILER_NOT_AVAILABLE)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        E(CL_OUT_OF_RESOURCES)
        E(CL_OUT_OF_HOST_MEMORY)
        E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_INVALID_VALUE)
        E(CL_INVALID_DEVICE)
        E(CL_INVALID_CONTEXT)
        E(CL_INVALID_COMMAND_QUEUE)
        E(CL_INVALID_MEM_OBJECT)
        E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_PROGRAM_EXECUTABLE)
        E(CL_INVALID_KERNEL_ARGS)
        E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE)
        E(CL_INVALID_GLOBAL_WORK_SIZE)
        E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_EVENT)
        E(CL_INVALID_BUFFER_SIZE)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
#undef E
    case CL_PLATFORM_NOT_FOUND_KHR:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "an OpenCL error";
}

static clattn_status cl_fail(cl_int err, const char *what)
{
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_INVALID_BUFFER_SIZE)
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE, "%s: %s (%d)", what,
                           cl_error_name(err), err);
    return clattn_fail(CLATTN_ERROR_OPENCL, "%s: %s (%d)", what, cl_error_name(err), err);
}

/* One OpenCL device as enumerated: platforms in order, then their devices. */
typedef struct cl_entry {
    cl_platform_id platform;
    cl_device_id device;
    unsigned platform_index, device_index;
    int is_cpu;
    char platform_name[128];
    char name[128];
} cl_entry;

static void query_string(cl_int (*get)(void *, cl_uint, size_t, void *, size_t *), void *obj,
                         cl_uint what, char *out, size_t size)
{
    if (get(obj, what, size, out, NULL) != CL_SUCCESS)
        snprintf(out, size, "?");
    out[size - 1] = '\0';
}

static cl_int get_platform_info(void *p, cl_uint what, size_t n, void *out, size_t *ret)
{
    return clGetPlatformInfo((cl_platform_id)p, what, n, out, ret);
}

static cl_int get_device_info(void *d, cl_uint what, size_t n, void *out, size_t *ret)
{
    return clGetDeviceInfo((cl_device_id)d, what, n, out, ret);
}

/* Lists every device of every platform into a new array (free() it).
 * A runtime without platforms yields CLATTN_ERROR_NO_PLATFORM. */
static clattn_status enumerate(cl_entry **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && np == 0))
        return clattn_fail(CLATTN_ERROR_NO_PLATFORM,
                           "no OpenCL platform: the ICD loader found no driver (%d)", err);
    if (err != CL_SUCCESS)
        return cl_fail(err, "clGetPlatformIDs");
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    clattn_status st = CLATTN_OK;
    cl_entry *list = NULL;
    size_t n = 0;
    err = clGetPlatformIDs(np, plats, NULL);
    if (err != CL_SUCCESS) {
        st = cl_fail(err, "clGetPlatformIDs");
        goto done;
    }
    for (cl_uint p = 0; p < np; ++p) {
        cl_uint nd = 0;
        /* A platform with no devices answers CL_DEVICE_NOT_FOUND: skip it. */
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || !nd)
            continue;
        cl_device_id *devs = calloc(nd, sizeof *devs);
        cl_entry *grown = realloc(list, (n + nd) * sizeof *list);
        if (!devs || !grown) {
            free(devs);
            if (grown)
                list = grown;
            st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
            goto done;
        }
        list = grown;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL) != CL_SUCCESS)
            nd = 0;
        for (cl_uint d = 0; d < nd; ++d) {
            cl_entry *e = &list[n++];
            cl_device_type type = 0;
            e->platform = plats[p];
            e->device = devs[d];
            e->platform_index = p;
            e->device_index = d;
            clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            e->is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
            query_string(get_platform_info, plats[p], CL_PLATFORM_NAME, e->platform_name,
                         sizeof e->platform_name);
            query_string(get_device_info, devs[d], CL_DEVICE_NAME, e->name, sizeof e->name);
        }
        free(devs);
    }
done:
    free(plats);
    if (st != CLATTN_OK) {
        free(list);
        return st;
    }
    *out = list;
    *count = n;
    return CLATTN_OK;
}

clattn_status clattn_list_devices(clattn_device_info *devices, size_t capacity, size_t *count)
{
    if (!count || (!devices && capacity))
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", count ? "devices" : "count");
    cl_entry *list;
    size_t n;
    clattn_status st = enumerate(&list, &n);
    if (st == CLATTN_ERROR_NO_PLATFORM)
        n = 0;
    else if (st != CLATTN_OK)
        return st;
    for (size_t i = 0; i < n && i < capacity; ++i) {
        clattn_device_info *d = &devices[i];
        d->backend = list[i].is_cpu ? CLATTN_BACKEND_OPENCL_CPU : CLATTN_BACKEND_OPENCL_GPU;
        d->platform_index = (int)list[i].platform_index;
        d->device_index = (int)list[i].device_index;
        snprintf(d->platform, sizeof d->platform, "%s", list[i].platform_name);
        snprintf(d->name, sizeof d->name, "%s", list[i].name);
    }
    if (n < capacity) {
        clattn_device_info *d = &devices[n];
        d->backend = CLATTN_BACKEND_NATIVE;
        d->platform_index = d->device_index = -1;
        snprintf(d->platform, sizeof d->platform, "clattn");
        snprintf(d->name, sizeof d->name, "native C");
    }
    *count = n + 1;
    free(list);
    clattn_clear_error();
    return CLATTN_OK;
}

static void release_set(kernel_set *set)
{
    for (int k = 0; k < K_COUNT; ++k) {
        if (set->kernel[k])
            clReleaseKernel(set->kernel[k]);
        if (set->program[k])
            clReleaseProgram(set->program[k]);
    }
}

static void release_state(struct clattn_cl_state *cl)
{
    if (!cl)
        return;
    for (int i = 0; i < CLATTN_R_COUNT; ++i)
        if (cl->scratch[i])
            clReleaseMemObject(cl->scratch[i]);
    for (int t = 0; t < 3; ++t) {
        if (cl->merge[t])
            clReleaseKernel(cl->merge[t]);
        release_set(&cl->generic[t]);
        for (int d = 0; d <= CLATTN_MAX_HEAD_DIM; ++d)
            if (cl->special[t][d]) {
                release_set(cl->special[t][d]);
                free(cl->special[t][d]);
            }
    }
    if (cl->own_queue && cl->queue)
        clReleaseCommandQueue(cl->queue);
    if (cl->own_context && cl->context)
        clReleaseContext(cl->context);
    free(cl);
}

static void opencl_destroy(clattn_context *ctx)
{
    release_state(ctx->cl);
    ctx->cl = NULL;
}

static const cl_variant *find_variant(int kernel, const char *name)
{
    for (int i = 0; i < VARIANT_COUNT; ++i)
        if (variants[i].kernel == kernel && !strcmp(name, variants[i].name))
            return &variants[i];
    return NULL;
}

/* The work-group the tree kernels need for a head_dim: the next power of two. */
static size_t tree_work_group(uint32_t head_dim)
{
    size_t wg = 1;
    while (wg < head_dim)
        wg <<= 1;
    return wg;
}

/* Loads src from the program cache, or compiles and stores it. */
static clattn_status compile(struct clattn_cl_state *cl, const cl_variant *v, const char *src,
                             const char *options, cl_program *out)
{
    cl_int err;
    if ((*out = clattn_cache_load(cl->context, cl->device, src, options)) != NULL) {
        clattn_log_append(cl->owner, "%s kernels (%s): loaded from the program cache",
                          v->name, options);
        return CLATTN_OK;
    }
    *out = clCreateProgramWithSource(cl->context, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return cl_fail(err, "clCreateProgramWithSource");
    }
    err = clBuildProgram(*out, 1, &cl->device, options, NULL, NULL);
    if (err == CL_SUCCESS) {
        const int stored = clattn_cache_store(*out, cl->device, src, options);
        clattn_log_append(cl->owner, "%s kernels (%s): compiled%s", v->name, options,
                          stored ? ", stored in the program cache" : "");
        return CLATTN_OK;
    }
    clattn_status st = clattn_fail(CLATTN_ERROR_BUILD_FAILED,
                                   "building %s of variant '%s' (%s) failed: %s (%d); build log:",
                                   v->function, v->name, options, cl_error_name(err), err);
    size_t len = 0;
    clGetProgramBuildInfo(*out, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
    char *log = len ? malloc(len + 1) : NULL;
    if (log &&
        clGetProgramBuildInfo(*out, cl->device, CL_PROGRAM_BUILD_LOG, len, log, NULL) ==
            CL_SUCCESS) {
        log[len] = '\0';
        clattn_fail_append(log);
    }
    free(log);
    return st;
}

/* mma.cl's WGMMA programs: NVIDIA's OpenCL compiles them for sm_90 with
 * their sm_90a instructions in comments marked SM90A; *program is replaced
 * by the same PTX built for sm_90a with the markers taken out (src/sm90a.c;
 * tests/sm90a_probe.c tries the route). */
static clattn_status retarget_sm90a(struct clattn_cl_state *cl, cl_program *program)
{
    size_t size = 0;
    char *ptx = NULL, *opened = NULL;
    cl_int err = clGetProgramInfo(*program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
    if (err == CL_SUCCESS && (!size || !(ptx = calloc(size + 1, 1))))
        err = CL_OUT_OF_HOST_MEMORY;
    if (err == CL_SUCCESS)
        err = clGetProgramInfo(*program, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL);
    clattn_status st = err == CL_SUCCESS ? CLATTN_OK : cl_fail(err, "clGetProgramInfo(PTX)");
    const int made = st == CLATTN_OK ? clattn_sm90a_ptx(ptx, &opened) : CLATTN_SM90A_OK;
    if (made == CLATTN_SM90A_NOT_SM90)
        st = clattn_fail(CLATTN_ERROR_BUILD_FAILED, "wgmma: the program's PTX is not for sm_90");
    else if (made == CLATTN_SM90A_NO_MEMORY)
        st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    if (st == CLATTN_OK) {
        const size_t len = strlen(opened) + 1;
        const unsigned char *bin = (const unsigned char *)opened;
        cl_int status;
        cl_program p = clCreateProgramWithBinary(cl->context, 1, &cl->device, &len, &bin,
                                                 &status, &err);
        if (err == CL_SUCCESS && (err = clBuildProgram(p, 1, &cl->device, "", NULL, NULL)) !=
                                     CL_SUCCESS)
            clReleaseProgram(p);
        if (err == CL_SUCCESS) {
            clReleaseProgram(*program);
            *program = p;
        } else {
            st = clattn_fail(CLATTN_ERROR_BUILD_FAILED, "wgmma: building the sm_90a PTX: %s (%d)",
                             cl_error_name(err), err);
        }
    }
    free(ptx);
    free(opened);
    return st;
}

static clattn_status build_program(struct clattn_cl_state *cl, const cl_variant *v,
                                   const char *defines, cl_program *out)
{
    /* CLATTN_CL_OPTIONS adds the caller's own compiler options. */
    const char *extra = getenv("CLATTN_CL_OPTIONS");
    char options[512];
    snprintf(options, sizeof options, "%s %s", defines, extra ? extra : "");
    /* The prelude goes ahead of the source, as one text: the cache's key
     * covers both. */
    const size_t prelude = strlen(clattn_cl_common), body = strlen(v->source);
    char *src = malloc(prelude + body + 1);
    if (!src)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    memcpy(src, clattn_cl_common, prelude);
    memcpy(src + prelude, v->source, body + 1);
    clattn_status st = compile(cl, v, src, options, out);
    free(src);
    if (st == CLATTN_OK && strstr(options, "-DWGMMA=1") && !cl->mma_emulate &&
        (st = retarget_sm90a(cl, out)) != CLATTN_OK) {
        clReleaseProgram(*out);
        *out = NULL;
    }
    return st;
}

/* Local memory a kernel of the set needs for a head_dim, in bytes. */
static size_t local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim)
{
    if (set->kind[k] == KIND_BLOCKED)
        return sizeof(float); /* unused, but an argument wants a size */
    if (set->kind[k] == KIND_MMA && k == K_FINISH_DQ)
        return sizeof(float); /* unused */
    if (set->kind[k] == KIND_MMA) {
        const mma_config *c = mma_config_for(cl, head_dim, set->dtype, k);
        /* wgmma's tiles start at a 1024-byte boundary: up to 255 floats more */
        const size_t align =
            mma_wgmma(cl->wgmma, cl->nv_major, cl->mma_emulate, c, head_dim, set->dtype, k)
                ? 256
                : 0;
        return (mma_local_floats(c, head_dim, cl->mma_emulate, set->dtype, k) + align) *
               sizeof(float);
    }
    if (set->kind[k] == KIND_TILED) {
        const tile_config c = tile_config_for(cl, head_dim);
        return tiled_local_floats(&c, head_dim) * sizeof(float);
    }
    return tree_work_group(head_dim) * sizeof(float) * (size_t)kernel_descs[k].local_per_lane;
}

/* The work-group size a kernel of the set runs with for a head_dim. */
static size_t work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim)
{
    const tile_config c = tile_config_for(cl, head_dim);
    return set->kind[k] == KIND_TILED ? (size_t)c.rows * c.split * tile_dsplit(&c, head_dim)
           : set->kind[k] == KIND_BLOCKED ? 1
           : set->kind[k] == KIND_MMA     ? 32u * mma_config_for(cl, head_dim, set->dtype, k)->warps
                                          : tree_work_group(head_dim);
}

/* Whether blocked.cl's products may keep 16 vectors of 16 floats: the
 * device says its vectors are 16 floats, or (PoCL runs on this CPU) this
 * CPU has AVX-512, whatever width LLVM prefers to report for it. */
static int wide_vectors(const struct clattn_cl_state *cl)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f"))
        return 1;
#endif
    return cl->float_width >= 16;
}

/* The defines kernel k of a kind is built with for a head_dim (0: any). */
static const char *kernel_options(const struct clattn_cl_state *cl, int kind, uint32_t head_dim,
                                  clattn_dtype dtype, int k, char *buf, size_t size)
{
    const tile_config t = tile_config_for(cl, head_dim);
    const int len = snprintf(buf, size,
                             "%s -DHEAD_DIM=%u -DROWS=%u -DTILE=%u -DSPLIT=%u -DDSPLIT=%u "
                             "-DDTYPE=%d",
                             build_options, head_dim ? head_dim : 1u, t.rows, t.tile, t.split,
                             tile_dsplit(&t, head_dim), (int)dtype);
    /* blocked.cl's products hold 16 vectors of 16 floats: as 32 registers
     * of 8 floats they spill, so such devices (AVX2) get four of them
     * (NARROW). PoCL on 2 threads of an AVX2-only AMD EPYC, three rounds,
     * GFLOP/s without -> with: b4 s512 d64 forward 45.7-48.9 -> 55.3-67.4,
     * backward 35.5-39.3 -> 58.0-67.0; d128 16/4 causal forward 51.2-54.2
     * -> 76.6-94.9, backward 39.9-40.2 -> 56.4-59.0. */
    if (kind == KIND_BLOCKED && !wide_vectors(cl) && len > 0 && (size_t)len < size)
        snprintf(buf + len, size - (size_t)len, " -DNARROW=1");
    if (kind == KIND_MMA && len > 0 && (size_t)len < size) {
        const mma_config *c = mma_config_for(cl, head_dim, dtype, k);
        snprintf(buf + len, size - (size_t)len,
                 " -DWARPS=%u -DWSPLIT=%u -DMMA_TILE=%u -DPLANES=%u%s%s", c->warps, c->wsplit,
                 c->tile, c->planes,
                 cl->mma_emulate     ? " -DMMA_EMULATE"
                 : cl->nv_major >= 9 ? " -DSM90"
                                     : "",
                 mma_wgmma(cl->wgmma, cl->nv_major, cl->mma_emulate, c, head_dim, dtype, k)
                     ? " -DWGMMA=1"
                     : "");
    }
    return buf;
}

/* Whether mma's single-pass backward serves a head_dim (its kinds are
 * known up to K_GRAD_KV): 16-bit tensors, a shape whose warps do not split
 * head_dim, and local memory for it on the device. */
static int single_pass(const struct clattn_cl_state *cl, const kernel_set *set,
                       uint32_t head_dim)
{
    const mma_config *c = mma_config_for(cl, head_dim, set->dtype, K_GRAD_KVQ);
    const uint32_t largest = head_dim ? head_dim : CLATTN_MAX_HEAD_DIM;
    return set->kind[K_GRAD_KV] == KIND_MMA && set->dtype != CLATTN_DTYPE_F32 && c->warps &&
           c->wsplit == 1 &&
           mma_local_floats(c, largest, cl->mma_emulate, set->dtype, K_GRAD_KVQ) *
                   sizeof(float) <=
               cl->local_mem;
}

/* Builds the kernels of a variant into set: generic ones (head_dim 0) or
 * ones specialised for head_dim, with their programs shared per source.
 * Checks each against the device's limits for the largest head_dim it may
 * run; strict_limits makes falling short an error rather than a per-call
 * refusal. */
static clattn_status build_set(struct clattn_cl_state *cl, const char *variant,
                               uint32_t head_dim, clattn_dtype dtype, kernel_set *set,
                               int strict_limits)
{
    set->dtype = dtype;
    for (int k = 0; k < K_COUNT; ++k) {
        const cl_variant *v = find_variant(k, variant);
        if (!v) {
            if (k == K_GRAD_KV || k == K_GRAD_KVQ || k == K_FINISH_DQ)
                continue; /* the backward runs GRAD_K and GRAD_V, or two passes, instead */
            return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT, "no OpenCL variant '%s'", variant);
        }
        if ((k == K_GRAD_KVQ || k == K_FINISH_DQ) && !single_pass(cl, set, head_dim))
            continue;
        set->kind[k] = v->source == clattn_cl_tiled     ? KIND_TILED
                       : v->source == clattn_cl_blocked ? KIND_BLOCKED
                       : v->source == clattn_cl_mma     ? KIND_MMA
                                                        : KIND_TREE;
        if (set->kind[k] == KIND_MMA && dtype != CLATTN_DTYPE_F32 &&
            mma_config_for(cl, head_dim, dtype, k)->tile % 16)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "mma's 16-bit kernels want tiles of 16 rows or more (CLATTN_MMA, "
                               "CLATTN_MMA_GRAD_Q, CLATTN_MMA_SINGLE)");
        char options[256], other[256];
        kernel_options(cl, set->kind[k], head_dim, dtype, k, options, sizeof options);
        for (int j = 0; j < k && !set->program[k]; ++j) {
            const cl_variant *w = set->program[j] ? find_variant(j, variant) : NULL;
            if (w && w->source == v->source &&
                !strcmp(options, kernel_options(cl, set->kind[j], head_dim, dtype, j, other,
                                                sizeof other))) {
                set->program[k] = set->program[j];
                clRetainProgram(set->program[k]);
            }
        }
        clattn_status st = CLATTN_OK;
        if (!set->program[k] && (st = build_program(cl, v, options, &set->program[k])) != CLATTN_OK)
            return st;
        cl_int err;
        set->function[k] = v->function;
        set->kernel[k] = clCreateKernel(set->program[k], v->function, &err);
        if (err != CL_SUCCESS) {
            set->kernel[k] = NULL;
            return cl_fail(err, "clCreateKernel");
        }
        if ((err = clGetKernelWorkGroupInfo(set->kernel[k], cl->device, CL_KERNEL_WORK_GROUP_SIZE,
                                            sizeof(size_t), &set->max_wg[k], NULL)) ||
            (err = clGetKernelWorkGroupInfo(set->kernel[k], cl->device, CL_KERNEL_LOCAL_MEM_SIZE,
                                            sizeof(cl_ulong), &set->local_mem[k], NULL)))
            return cl_fail(err, "clGetKernelWorkGroupInfo");
        const uint32_t largest = head_dim ? head_dim : CLATTN_MAX_HEAD_DIM;
        const size_t wg = work_group(cl, set, k, largest);
        const size_t local = local_bytes(cl, set, k, largest);
        if ((strict_limits || set->kind[k] != KIND_TREE) &&
            (set->max_wg[k] < wg || cl->local_mem < set->local_mem[k] + local))
            return clattn_fail(CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
                               "%s needs work-groups of %zu and %zu bytes of local memory; "
                               "the device allows %zu and %llu",
                               v->function, wg, local, set->max_wg[k],
                               (unsigned long long)cl->local_mem);
    }
    return CLATTN_OK;
}

/* The generic kernels (tree's, any head_dim) for a dtype, built on first
 * use. */
static clattn_status generic_kernels(struct clattn_cl_state *cl, clattn_dtype dtype,
                                     kernel_set **out)
{
    if (!cl->generic_built[dtype]) {
        clattn_status st = build_set(cl, "tree", 0, dtype, &cl->generic[dtype], 0);
        if (st != CLATTN_OK) {
            release_set(&cl->generic[dtype]);
            memset(&cl->generic[dtype], 0, sizeof cl->generic[dtype]);
            return st;
        }
        cl->generic_built[dtype] = 1;
    }
    *out = &cl->generic[dtype];
    return CLATTN_OK;
}

/* The kernels a call with this head_dim and dtype runs: the variant's own,
 * specialised for them (built on first use), or the generic set. 16-bit
 * tensors at a head_dim that is not a multiple of 8 run tiled's kernels
 * (float32 inside) in place of mma's, which would round P and dS to 16 bits
 * for products padded to 16 columns anyway: PyTorch's CUDA attention does
 * the same (its 16-bit kernels want such head_dims; others run in float32),
 * and tests/torch_compare.py holds clattn to twice its error. */
static clattn_status kernels_for(struct clattn_cl_state *cl, uint32_t head_dim,
                                 clattn_dtype dtype, kernel_set **out)
{
    const char *variant = cl->special_variant;
    if (!variant)
        return generic_kernels(cl, dtype, out);
    if (!strcmp(variant, "mma") && dtype != CLATTN_DTYPE_F32 && head_dim % 8)
        variant = "tiled";
    if (!cl->special[dtype][head_dim]) {
        kernel_set *set = calloc(1, sizeof *set);
        if (!set)
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
        clattn_status st = build_set(cl, variant, head_dim, dtype, set, 0);
        if (st != CLATTN_OK) {
            release_set(set);
            free(set);
            return st;
        }
        cl->special[dtype][head_dim] = set;
    }
    *out = cl->special[dtype][head_dim];
    return CLATTN_OK;
}

/* Bytes of one element of role r (R_DSUM and the LSE pairs are float). */
static size_t role_bytes(int r, clattn_dtype dtype)
{
    return r == CLATTN_R_LSE || r == R_DSUM || dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2u;
}

static const clattn_backend_ops opencl_ops;

/* Makes ctx an OpenCL context on device; context and queue are created
 * when NULL, the caller's used (never released) otherwise. */
static clattn_status init_on_device(clattn_context *ctx, const char *variant,
                                    cl_context context, cl_device_id device,
                                    cl_command_queue queue, int strict_limits)
{
    struct clattn_cl_state *cl = calloc(1, sizeof *cl);
    if (!cl)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    cl->owner = ctx;
    cl->device = device;
    cl_int err = CL_SUCCESS;
    clattn_status st = CLATTN_OK;
    if (context) {
        cl->context = context;
    } else {
        cl->context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
        cl->own_context = 1;
        if (err != CL_SUCCESS) {
            cl->context = NULL;
            st = cl_fail(err, "clCreateContext");
            goto fail;
        }
    }
    if (queue) {
        cl->queue = queue;
    } else {
        cl->queue = clCreateCommandQueue(cl->context, device, 0, &err);
        cl->own_queue = 1;
        if (err != CL_SUCCESS) {
            cl->queue = NULL;
            st = cl_fail(err, "clCreateCommandQueue");
            goto fail;
        }
    }
    cl_device_type type = 0;
    if ((err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof cl->max_alloc,
                               &cl->max_alloc, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof cl->local_mem,
                               &cl->local_mem, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT,
                               sizeof cl->float_width, &cl->float_width, NULL))) {
        st = cl_fail(err, "clGetDeviceInfo");
        goto fail;
    }
    /* Each device type's default is the first variant listed for it that
     * the device can run. */
    cl->nv_major = nv_major(device);
    /* wgmma by default on compute capability 9; CLATTN_MMA_WGMMA=0 keeps
     * mma.sync there, =1 asks for it where mma runs emulated too. */
    const char *wgmma = getenv("CLATTN_MMA_WGMMA");
    cl->wgmma = wgmma ? !strcmp(wgmma, "1") : cl->nv_major >= 9;
    const int can_mma = cl->nv_major >= 8 || mma_emulated();
    cl->mma_emulate = mma_emulated();
    if (!variant) {
        const clattn_backend kind = (type & CL_DEVICE_TYPE_CPU) ? CLATTN_BACKEND_OPENCL_CPU
                                                                : CLATTN_BACKEND_OPENCL_GPU;
        for (size_t i = 0; (variant = clattn_variant_name(kind, i)) != NULL; ++i)
            if (can_mma || strcmp(variant, "mma") != 0)
                break;
    }
    if (!strcmp(variant, "mma") && !can_mma) {
        st = clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT,
                         "variant 'mma' needs an NVIDIA GPU of compute capability 8.0 or "
                         "later (tensor-core PTX); this device is not one");
        goto fail;
    }
    cl->tiles = tile_table[0];
    for (size_t i = 0; i < sizeof tile_table / sizeof tile_table[0]; ++i)
        if (type & tile_table[i].type) {
            cl->tiles = tile_table[i];
            break;
        }
    /* A tuning override for a device the table does not know well. */
    const char *tune = getenv("CLATTN_TILED");
    if (tune && *tune) {
        unsigned rows, tile, split, columns = 0;
        char end;
        const int n = sscanf(tune, "%u,%u,%u,%u%c", &rows, &tile, &split, &columns, &end);
        if ((n != 3 && n != 4) || !rows || !tile || !split || tile % split || rows > 1024 ||
            tile > 256 || rows * split > 1024 || (n == 4 && !columns)) {
            st = clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                             "CLATTN_TILED='%s': want ROWS,TILE,SPLIT[,COLUMNS] with SPLIT "
                             "dividing TILE and ROWS * SPLIT <= 1024",
                             tune);
            goto fail;
        }
        tile_config *both[2] = {&cl->tiles.narrow, &cl->tiles.wide};
        for (int i = 0; i < 2; ++i) {
            both[i]->rows = rows;
            both[i]->tile = tile;
            both[i]->split = split;
            if (columns)
                both[i]->columns = columns;
        }
    }
    const char *single = getenv("CLATTN_MMA_SINGLE"); /* "0", as unset: two passes */
    if ((!single || strcmp(single, "0")) &&
        (st = mma_override("CLATTN_MMA_SINGLE", &cl->single_tune, &cl->single_tuned)) !=
            CLATTN_OK)
        goto fail;
    if (cl->single_tuned && cl->single_tune.wsplit != 1) {
        st = clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                         "CLATTN_MMA_SINGLE='%s': the single pass wants WSPLIT 1 (or 0 for two "
                         "passes)",
                         single);
        goto fail;
    }
    if ((st = mma_override("CLATTN_MMA", &cl->mma_tune, &cl->mma_tuned)) != CLATTN_OK ||
        (st = mma_override("CLATTN_MMA_GRAD_Q", &cl->grad_q_tune, &cl->grad_q_tuned)) !=
            CLATTN_OK)
        goto fail;
    /* Each program is built once per context, when first needed, except
     * one now, so that a device that cannot compile the variant is never
     * chosen: tree's (any head_dim) for tree, or the tiled or blocked ones
     * for head_dim 64. */
    cl->special_variant = !strcmp(variant, "tiled")     ? "tiled"
                          : !strcmp(variant, "blocked") ? "blocked"
                          : !strcmp(variant, "mma")     ? "mma"
                                                        : NULL;
    if (!cl->special_variant) {
        if ((st = build_set(cl, variant, 0, CLATTN_DTYPE_F32, &cl->generic[0], strict_limits)) !=
            CLATTN_OK)
            goto fail;
        cl->generic_built[0] = 1;
    }
    kernel_set *probe = NULL;
    if (cl->special_variant && (st = kernels_for(cl, 64, CLATTN_DTYPE_F32, &probe)) != CLATTN_OK)
        goto fail;

    char name[128], platform_name[128];
    cl_platform_id platform = NULL;
    query_string(get_device_info, device, CL_DEVICE_NAME, name, sizeof name);
    clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    query_string(get_platform_info, platform, CL_PLATFORM_NAME, platform_name,
                 sizeof platform_name);
    ctx->backend = (type & CL_DEVICE_TYPE_CPU) ? CLATTN_BACKEND_OPENCL_CPU
                                               : CLATTN_BACKEND_OPENCL_GPU;
    snprintf(ctx->device, sizeof ctx->device, "%s: %s / %s", clattn_backend_name(ctx->backend),
             platform_name, name);
    snprintf(ctx->variant, sizeof ctx->variant, "%s", variant);
    ctx->ops = &opencl_ops;
    ctx->cl = cl;
    return CLATTN_OK;
fail:
    release_state(cl);
    return st;
}

static int matches(const clattn_cl_pick *pick, const cl_entry *e)
{
    switch (pick->kind) {
    case CLATTN_PICK_GPU:
        return !e->is_cpu;
    case CLATTN_PICK_CPU:
        return e->is_cpu;
    case CLATTN_PICK_INDEX:
        return e->platform_index == pick->platform && e->device_index == pick->device;
    case CLATTN_PICK_NAME: {
        size_t n = strlen(pick->name);
        for (const char *h = e->name; *h; ++h) {
            size_t i = 0;
            while (i < n && h[i] && tolower((unsigned char)h[i]) ==
                                        tolower((unsigned char)pick->name[i]))
                ++i;
            if (i == n)
                return 1;
        }
        return 0;
    }
    }
    return 0;
}

static const char *pick_text(const clattn_cl_pick *pick, char *buf, size_t size)
{
    switch (pick->kind) {
    case CLATTN_PICK_GPU:
        return "OpenCL GPU";
    case CLATTN_PICK_CPU:
        return "OpenCL CPU device";
    case CLATTN_PICK_INDEX:
        snprintf(buf, size, "OpenCL device %u:%u", pick->platform, pick->device);
        return buf;
    case CLATTN_PICK_NAME:
        snprintf(buf, size, "OpenCL device named like '%s'", pick->name);
        return buf;
    }
    return "?";
}

clattn_status clattn_opencl_init(clattn_context *ctx, const clattn_options *opts,
                                 const clattn_cl_pick *pick, int all_candidates)
{
    cl_entry *list;
    size_t n;
    char buf[192];
    clattn_status st = enumerate(&list, &n);
    if (st != CLATTN_OK)
        return st;
    st = CLATTN_ERROR_DEVICE_NOT_FOUND;
    size_t i;
    for (i = 0; i < n; ++i) {
        if (!matches(pick, &list[i]))
            continue;
        st = init_on_device(ctx, opts->variant, NULL, list[i].device, NULL, all_candidates);
        if (st == CLATTN_OK)
            break;
        clattn_log_append(ctx, "%u:%u %s / %s: %s: %s", list[i].platform_index,
                          list[i].device_index, list[i].platform_name, list[i].name,
                          clattn_status_string(st), clattn_last_error());
        if (!all_candidates)
            break;
    }
    if (st == CLATTN_OK)
        snprintf(ctx->device + strlen(ctx->device), sizeof ctx->device - strlen(ctx->device),
                 " (%u:%u)", list[i].platform_index, list[i].device_index);
    free(list);
    if (st == CLATTN_ERROR_DEVICE_NOT_FOUND)
        return clattn_fail(st, "no %s among the OpenCL devices (see `clattn devices`)",
                           pick_text(pick, buf, sizeof buf));
    return st;
}

/* Makes sure the scratch buffer of a role holds bytes (contents are lost). */
static clattn_status scratch(struct clattn_cl_state *cl, int role, size_t bytes)
{
    if (cl->scratch_bytes[role] >= bytes)
        return CLATTN_OK;
    if (cl->scratch[role])
        clReleaseMemObject(cl->scratch[role]);
    cl->scratch[role] = NULL;
    cl->scratch_bytes[role] = 0;
    cl_int err;
    cl_mem m = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        return cl_fail(err, "clCreateBuffer");
    cl->scratch[role] = m;
    cl->scratch_bytes[role] = bytes;
    return CLATTN_OK;
}

static clattn_status check_alloc(const struct clattn_cl_state *cl, const clattn_sizes *sz,
                                 clattn_dtype dtype)
{
    const size_t largest = sz->q > sz->kv ? sz->q : sz->kv;
    const size_t bytes = largest * role_bytes(CLATTN_R_Q, dtype);
    if ((cl_ulong)bytes > cl->max_alloc || sz->lse * sizeof(float) > cl->max_alloc)
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE,
                           "a tensor of %zu bytes exceeds the device's largest allocation, "
                           "%llu bytes",
                           bytes, (unsigned long long)cl->max_alloc);
    return CLATTN_OK;
}

static clattn_status enqueue_kernel(struct clattn_cl_state *cl, const kernel_set *set, int k,
                                    const clattn_shape *s, const clattn_cl_tensor t[R_ALL],
                                    cl_uint nwait, const cl_event *wait, cl_event *done)
{
    const kernel_desc *kd = &kernel_descs[k];
    cl_kernel kn = set->kernel[k];
    const size_t wg = work_group(cl, set, k, s->head_dim);
    const size_t local = local_bytes(cl, set, k, s->head_dim);
    if (wg > set->max_wg[k] || set->local_mem[k] + local > cl->local_mem)
        return clattn_fail(CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
                           "head_dim %u needs work-groups of %zu with %zu bytes of local "
                           "memory; the device runs at most %zu and has %llu bytes",
                           s->head_dim, wg, local, set->max_wg[k],
                           (unsigned long long)cl->local_mem);
    cl_uint arg = 0;
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < kd->nroles; ++i) {
        const clattn_cl_tensor *x = &t[kd->roles[i]];
        cl_ulong off = x->offset;
        err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &x->buffer);
        err |= clSetKernelArg(kn, arg++, sizeof off, &off);
    }
    cl_int causal = s->causal ? 1 : 0;
    cl_float scale = clattn_effective_scale(s);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->q_seq);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->kv_seq);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->num_heads);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->num_kv_heads);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->head_dim);
    err |= clSetKernelArg(kn, arg++, sizeof causal, &causal);
    err |= clSetKernelArg(kn, arg++, sizeof(cl_uint), &s->window);
    cl_long delta = clattn_mask_delta(s);
    cl_int accumulate = s->accumulate ? 1 : 0;
    err |= clSetKernelArg(kn, arg++, sizeof delta, &delta);
    err |= clSetKernelArg(kn, arg++, sizeof scale, &scale);
    err |= clSetKernelArg(kn, arg++, sizeof accumulate, &accumulate);
    err |= clSetKernelArg(kn, arg++, local, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail(CLATTN_ERROR_OPENCL, "clSetKernelArg failed for kernel %d", k);
    const size_t rows = kd->key_rows ? s->kv_seq : s->q_seq;
    const size_t heads = kd->key_rows ? s->num_kv_heads : s->num_heads;
    const size_t per_group = set->kind[k] == KIND_TILED     ? tile_config_for(cl, s->head_dim).rows
                             : set->kind[k] == KIND_BLOCKED ? BLOCKED_ROWS
                             : set->kind[k] == KIND_MMA ? mma_rows(cl, s->head_dim, s->dtype, k)
                                                            : 1;
    const size_t blocks = (rows + per_group - 1) / per_group;
    const size_t groups = set->kind[k] == KIND_TILED && s->causal ? (blocks + 1) / 2 : blocks;
    size_t global[3] = {groups * wg, heads, s->batch};
    size_t lsize[3] = {wg, 1, 1};
    err = clEnqueueNDRangeKernel(cl->queue, kn, 3, NULL, global, lsize, nwait,
                                 nwait ? wait : NULL, done);
    if (err != CL_SUCCESS)
        return cl_fail(err, "clEnqueueNDRangeKernel");
    return CLATTN_OK;
}

/* Enqueues the kernels of op after the wait list, each after the one
 * before, so that an out-of-order queue keeps their order. *done, when
 * not NULL, receives the last kernel's event. */
static clattn_status enqueue_op(struct clattn_cl_state *cl, clattn_op op, const clattn_shape *s,
                                const clattn_sizes *sz, clattn_cl_tensor t[R_ALL],
                                cl_uint nwait, const cl_event *wait, cl_event *done)
{
    kernel_set *set = NULL;
    clattn_status st = kernels_for(cl, s->head_dim, s->dtype, &set);
    if (st != CLATTN_OK)
        return st;
    /* The single pass, built only where CLATTN_MMA_SINGLE asks for it. Its
     * float32 dQ is as large as dQ's elements in float32: where that exceeds
     * the device's largest allocation, two passes. */
    const int single = op == CLATTN_OP_BACKWARD && set->kernel[K_GRAD_KVQ] &&
                       (cl_ulong)sz->q * sizeof(float) <= cl->max_alloc;
    const int *plan = single                                               ? backward_single
                      : op == CLATTN_OP_BACKWARD && !set->kernel[K_GRAD_KV] ? backward_unfused
                                                                            : op_plans[op];
    cl_mem dsum = NULL, dq32 = NULL;
    cl_event zeroed = NULL;
    if (plan[0] == K_DSUM) {
        /* Released at once: OpenCL keeps it until the kernels using it end. */
        cl_int err;
        dsum = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->lse / 2 * sizeof(float), NULL,
                              &err);
        if (err != CL_SUCCESS)
            return cl_fail(err, "clCreateBuffer(dsum)");
        t[R_DSUM].buffer = dsum;
        t[R_DSUM].offset = 0;
    }
    if (single) { /* the float32 dQ, zeroed ahead of GRAD_KVQ; released as dsum is */
        cl_int err;
        const cl_float zero = 0.0f;
        dq32 = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, sz->q * sizeof(float), NULL, &err);
        if (err == CL_SUCCESS) {
            err = clEnqueueFillBuffer(cl->queue, dq32, &zero, sizeof zero, 0,
                                      sz->q * sizeof(float), 0, NULL, &zeroed);
            if (err != CL_SUCCESS)
                clReleaseMemObject(dq32);
        }
        if (err != CL_SUCCESS) {
            clReleaseMemObject(dsum);
            return cl_fail(err, dq32 ? "clEnqueueFillBuffer(dq32)" : "clCreateBuffer(dq32)");
        }
        t[R_DQ32].buffer = dq32;
        t[R_DQ32].offset = 0;
    }
    cl_event prev = NULL;
    for (int i = 0; plan[i] >= 0 && st == CLATTN_OK; ++i) {
        cl_event ev = NULL;
        if (plan[i] == K_GRAD_KVQ) { /* after the zeroing too */
            const cl_event both[2] = {prev, zeroed};
            st = enqueue_kernel(cl, set, plan[i], s, t, 2, both, &ev);
        } else {
            st = prev ? enqueue_kernel(cl, set, plan[i], s, t, 1, &prev, &ev)
                      : enqueue_kernel(cl, set, plan[i], s, t, nwait, wait, &ev);
        }
        if (prev)
            clReleaseEvent(prev);
        prev = ev;
    }
    if (zeroed) {
        if (st != CLATTN_OK)
            clWaitForEvents(1, &zeroed); /* nothing else may still use dq32 */
        clReleaseEvent(zeroed);
    }
    if (dq32)
        clReleaseMemObject(dq32);
    if (dsum)
        clReleaseMemObject(dsum);
    if (st == CLATTN_OK) {
        char *ran = cl->owner->kernels;
        ran[0] = '\0';
        for (int i = 0; plan[i] >= 0; ++i)
            snprintf(ran + strlen(ran), sizeof cl->owner->kernels - strlen(ran), "%s%s",
                     i ? "," : "", set->function[plan[i]]);
    }
    if (st == CLATTN_OK && done)
        *done = prev;
    else if (prev)
        clReleaseEvent(prev);
    return st;
}

static clattn_status opencl_run(clattn_context *ctx, clattn_op op, const clattn_shape *s,
                                const clattn_sizes *sz, const void *const host[CLATTN_R_COUNT])
{
    struct clattn_cl_state *cl = ctx->cl;
    kernel_set *set = NULL;
    /* A head_dim the variant refuses or cannot build fails before any copy. */
    clattn_status st = check_alloc(cl, sz, s->dtype);
    if (st == CLATTN_OK)
        st = kernels_for(cl, s->head_dim, s->dtype, &set);
    if (st != CLATTN_OK)
        return st;
    /* Accumulating gradients are read (uploaded) first, then written. */
    const unsigned reads = clattn_call_reads(op, s), writes = clattn_op_writes[op];
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    for (int r = 0; r < CLATTN_R_COUNT; ++r) {
        if (!((reads | writes) & CLATTN_BIT(r)))
            continue;
        const size_t bytes = clattn_role_elems(sz, (clattn_role)r) * role_bytes(r, s->dtype);
        if ((st = scratch(cl, r, bytes)) != CLATTN_OK)
            return st;
        t[r].buffer = cl->scratch[r];
    }
    /* Events order the copies even on a caller's out-of-order queue. */
    cl_event ev[CLATTN_R_COUNT], kernels_done = NULL;
    cl_uint nev = 0;
    cl_int err = CL_SUCCESS;
    for (int r = 0; r < CLATTN_R_COUNT && err == CL_SUCCESS; ++r)
        if (reads & CLATTN_BIT(r)) {
            const size_t bytes = clattn_role_elems(sz, (clattn_role)r) * role_bytes(r, s->dtype);
            err = clEnqueueWriteBuffer(cl->queue, t[r].buffer, CL_FALSE, 0, bytes, host[r], 0,
                                       NULL, &ev[nev]);
            if (err == CL_SUCCESS)
                ++nev;
        }
    if (err != CL_SUCCESS)
        st = cl_fail(err, "clEnqueueWriteBuffer");
    if (st == CLATTN_OK)
        st = enqueue_op(cl, op, s, sz, t, nev, ev, &kernels_done);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    nev = 0;
    for (int r = 0; r < CLATTN_R_COUNT && st == CLATTN_OK; ++r)
        if (writes & CLATTN_BIT(r)) {
            const size_t bytes = clattn_role_elems(sz, (clattn_role)r) * role_bytes(r, s->dtype);
            err = clEnqueueReadBuffer(cl->queue, t[r].buffer, CL_FALSE, 0, bytes, (void *)host[r],
                                      1, &kernels_done, &ev[nev]);
            if (err == CL_SUCCESS)
                ++nev;
            else
                st = cl_fail(err, "clEnqueueReadBuffer");
        }
    if (nev && (err = clWaitForEvents(nev, ev)) != CL_SUCCESS && st == CLATTN_OK)
        st = cl_fail(err, "running the kernels");
    /* Nothing may still touch the caller's pointers once we return. */
    if (st != CLATTN_OK)
        clFinish(cl->queue);
    for (cl_uint i = 0; i < nev; ++i)
        clReleaseEvent(ev[i]);
    if (kernels_done)
        clReleaseEvent(kernels_done);
    return st;
}

static const clattn_backend_ops opencl_ops = {opencl_run, opencl_destroy};

/* Checks that a caller's tensor lies inside its buffer, of ctx's context. */
static clattn_status check_tensor(const struct clattn_cl_state *cl, clattn_cl_tensor t,
                                  size_t elems, size_t bytes, const char *name)
{
    if (!t.buffer)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s buffer is NULL", name);
    size_t size = 0;
    cl_context owner = NULL;
    cl_int err = clGetMemObjectInfo(t.buffer, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(t.buffer, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err != CL_SUCCESS)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER, "%s is not a valid cl_mem: %s (%d)",
                           name, cl_error_name(err), err);
    if (owner != cl->context)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "%s belongs to another cl_context than the clattn context's", name);
    size_t cap = size / bytes;
    if (t.offset > cap || elems > cap - t.offset)
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "%s needs %zu elements of %zu bytes from offset %zu, the buffer "
                           "holds %zu",
                           name, elems, bytes, t.offset, cap);
    return CLATTN_OK;
}

cl_context clattn_context_cl_context(const clattn_context *ctx)
{
    return ctx && ctx->cl ? ctx->cl->context : NULL;
}

cl_command_queue clattn_context_cl_queue(const clattn_context *ctx)
{
    return ctx && ctx->cl ? ctx->cl->queue : NULL;
}

/* The checks every _cl call starts with: clattn_call_begin()'s, an OpenCL
 * context, and a wait list where events are counted. */
static clattn_status cl_call_begin(const clattn_context *ctx, const clattn_shape *shape,
                                   clattn_sizes *sz, cl_uint nwait, const cl_event *wait)
{
    clattn_status st = clattn_call_begin(ctx, shape, sz);
    if (st != CLATTN_OK)
        return st;
    if (!ctx->cl)
        return clattn_fail(CLATTN_ERROR_WRONG_BACKEND,
                           "the _cl calls need an OpenCL context; this one is %s", ctx->device);
    if (nwait && !wait)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "event_wait_list is NULL with %u events",
                           nwait);
    return CLATTN_OK;
}

clattn_status clattn_merge_cl(clattn_context *ctx, const clattn_shape *shape, clattn_cl_tensor o1,
                              clattn_cl_tensor lse1, clattn_cl_tensor o2, clattn_cl_tensor lse2,
                              clattn_cl_tensor o, clattn_cl_tensor lse,
                              cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                              cl_event *event)
{
    clattn_sizes sz;
    clattn_status st = cl_call_begin(ctx, shape, &sz, num_events_in_wait_list, event_wait_list);
    if (st != CLATTN_OK)
        return st;
    struct clattn_cl_state *cl = ctx->cl;
    const clattn_cl_tensor t[6] = {o1, lse1, o2, lse2, o, lse};
    static const char *const names[6] = {"o1", "lse1", "o2", "lse2", "o", "lse"};
    const size_t ob = role_bytes(CLATTN_R_O, shape->dtype);
    for (int i = 0; i < 6; ++i)
        if ((st = check_tensor(cl, t[i], i % 2 ? sz.lse : sz.q, i % 2 ? sizeof(float) : ob,
                               names[i])) != CLATTN_OK)
            return st;
    pthread_mutex_lock(&ctx->lock);
    kernel_set *set = NULL;
    const clattn_dtype dtype = shape->dtype;
    cl_int err = CL_SUCCESS;
    if (!cl->merge[dtype] && (st = generic_kernels(cl, dtype, &set)) == CLATTN_OK) {
        cl->merge[dtype] = clCreateKernel(set->program[K_FORWARD], "merge__tree", &err);
        if (err != CL_SUCCESS) {
            cl->merge[dtype] = NULL;
            st = cl_fail(err, "clCreateKernel(merge__tree)");
        }
    }
    if (st == CLATTN_OK) {
        cl_kernel kn = cl->merge[dtype];
        cl_uint arg = 0;
        for (int i = 0; i < 6; ++i) {
            cl_ulong off = t[i].offset;
            err |= clSetKernelArg(kn, arg++, sizeof(cl_mem), &t[i].buffer);
            err |= clSetKernelArg(kn, arg++, sizeof off, &off);
        }
        cl_ulong rows = sz.lse / 2;
        cl_uint head_dim = shape->head_dim;
        err |= clSetKernelArg(kn, arg++, sizeof rows, &rows);
        err |= clSetKernelArg(kn, arg++, sizeof head_dim, &head_dim);
        const size_t local = 64, global = (sz.lse / 2 + local - 1) / local * local;
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(cl->queue, kn, 1, NULL, &global, &local,
                                         num_events_in_wait_list,
                                         num_events_in_wait_list ? event_wait_list : NULL,
                                         event);
        if (err != CL_SUCCESS)
            st = cl_fail(err, "enqueueing merge__tree");
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

/* Validates the caller's buffers for op and enqueues it. */
static clattn_status run_cl(clattn_context *ctx, clattn_op op, const clattn_shape *shape,
                            clattn_cl_tensor t[R_ALL], cl_uint nwait, const cl_event *wait,
                            cl_event *event)
{
    clattn_sizes sz;
    clattn_status st = cl_call_begin(ctx, shape, &sz, nwait, wait);
    if (st != CLATTN_OK)
        return st;
    const unsigned reads = clattn_op_reads[op], writes = clattn_op_writes[op];
    for (int r = 0; r < CLATTN_R_COUNT; ++r)
        if (((reads | writes) & CLATTN_BIT(r)) &&
            (st = check_tensor(ctx->cl, t[r], clattn_role_elems(&sz, (clattn_role)r),
                               role_bytes(r, shape->dtype), clattn_role_name((clattn_role)r))) !=
                CLATTN_OK)
            return st;
    /* An output may overlap no other tensor of the call. */
    for (int w = 0; w < CLATTN_R_COUNT; ++w) {
        if (!(writes & CLATTN_BIT(w)))
            continue;
        /* In bytes: the LSE pairs' elements are wider than 16-bit tensors'. */
        const size_t wb = role_bytes(w, shape->dtype), w0 = t[w].offset * wb;
        const size_t w1 = w0 + clattn_role_elems(&sz, (clattn_role)w) * wb;
        for (int r = 0; r < CLATTN_R_COUNT; ++r) {
            if (r == w || !((reads | writes) & CLATTN_BIT(r)) || t[r].buffer != t[w].buffer)
                continue;
            const size_t rb = role_bytes(r, shape->dtype), r0 = t[r].offset * rb;
            const size_t r1 = r0 + clattn_role_elems(&sz, (clattn_role)r) * rb;
            if (r0 < w1 && w0 < r1)
                return clattn_fail(CLATTN_ERROR_INVALID_BUFFER, "%s overlaps %s",
                                   clattn_role_name((clattn_role)w),
                                   clattn_role_name((clattn_role)r));
        }
    }
    if ((st = check_alloc(ctx->cl, &sz, shape->dtype)) != CLATTN_OK)
        return st;
    pthread_mutex_lock(&ctx->lock);
    st = enqueue_op(ctx->cl, op, shape, &sz, t, nwait, wait, event);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

clattn_status clattn_grad_v_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor d_out, clattn_cl_tensor q, clattn_cl_tensor k,
                               clattn_cl_tensor lse, clattn_cl_tensor dv,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                               cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    t[CLATTN_R_DO] = d_out;
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_LSE] = lse;
    t[CLATTN_R_DV] = dv;
    return run_cl(ctx, CLATTN_OP_GRAD_V, shape, t, num_events_in_wait_list, event_wait_list,
                  event);
}

clattn_status clattn_forward_cl(clattn_context *ctx, const clattn_shape *shape,
                                clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                clattn_cl_tensor o, clattn_cl_tensor lse,
                                cl_uint num_events_in_wait_list,
                                const cl_event *event_wait_list, cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    t[CLATTN_R_Q] = q;
    t[CLATTN_R_K] = k;
    t[CLATTN_R_V] = v;
    t[CLATTN_R_O] = o;
    t[CLATTN_R_LSE] = lse;
    return run_cl(ctx, CLATTN_OP_FORWARD, shape, t, num_events_in_wait_list, event_wait_list,
                  event);
}

/* The gradients that read Q K V O LSE dO. */
static clattn_status run_backward_cl(clattn_context *ctx, clattn_op op,
                                     const clattn_shape *shape, const clattn_cl_tensor in[6],
                                     clattn_cl_tensor dq, clattn_cl_tensor dk,
                                     clattn_cl_tensor dv, cl_uint nwait, const cl_event *wait,
                                     cl_event *event)
{
    clattn_cl_tensor t[R_ALL];
    memset(t, 0, sizeof t);
    for (int r = 0; r < 6; ++r)
        t[r] = in[r]; /* Q K V O LSE dO lead the role list */
    t[CLATTN_R_DQ] = dq;
    t[CLATTN_R_DK] = dk;
    t[CLATTN_R_DV] = dv;
    return run_cl(ctx, op, shape, t, nwait, wait, event);
}

clattn_status clattn_backward_cl(clattn_context *ctx, const clattn_shape *shape,
                                 clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                                 clattn_cl_tensor o, clattn_cl_tensor lse,
                                 clattn_cl_tensor d_out, clattn_cl_tensor dq,
                                 clattn_cl_tensor dk, clattn_cl_tensor dv,
                                 cl_uint num_events_in_wait_list,
                                 const cl_event *event_wait_list, cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out};
    return run_backward_cl(ctx, CLATTN_OP_BACKWARD, shape, in, dq, dk, dv,
                           num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_grad_q_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                               clattn_cl_tensor o, clattn_cl_tensor lse, clattn_cl_tensor d_out,
                               clattn_cl_tensor dq, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out}, none = {NULL, 0};
    return run_backward_cl(ctx, CLATTN_OP_GRAD_Q, shape, in, dq, none, none,
                           num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_grad_k_cl(clattn_context *ctx, const clattn_shape *shape,
                               clattn_cl_tensor q, clattn_cl_tensor k, clattn_cl_tensor v,
                               clattn_cl_tensor o, clattn_cl_tensor lse, clattn_cl_tensor d_out,
                               clattn_cl_tensor dk, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event)
{
    const clattn_cl_tensor in[6] = {q, k, v, o, lse, d_out}, none = {NULL, 0};
    return run_backward_cl(ctx, CLATTN_OP_GRAD_K, shape, in, none, dk, none,
                           num_events_in_wait_list, event_wait_list, event);
}

clattn_status clattn_context_create_from_cl(const clattn_options *opts, cl_context context,
                                            cl_device_id device, cl_command_queue queue,
                                            clattn_context **ctx)
{
    clattn_clear_error();
    if (!ctx)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "ctx is NULL");
    *ctx = NULL;
    if (!context || !device)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL",
                           context ? "device" : "context");
    clattn_options o = opts ? *opts : clattn_options_default();
    clattn_context *c;
    clattn_status st = clattn_context_alloc(&c);
    if (st != CLATTN_OK)
        return st;
    st = init_on_device(c, o.variant, context, device, queue, 0);
    if (st != CLATTN_OK) {
        clattn_context_destroy(c);
        return st;
    }
    snprintf(c->device + strlen(c->device), sizeof c->device - strlen(c->device),
             " (caller's context)");
    *ctx = c;
    return CLATTN_OK;
}
