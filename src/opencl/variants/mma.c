/* The mma variant: cl/mma's tensor-core kernels (mma.sync PTX, wgmma on
 * compute capability 9, or emulated in local memory for tests), a
 * work-group per 16 rows of each group of wsplit warps. float32 runs as
 * 3xTF32 (or fp32 planes); 16-bit tensors as m16n8k16 with cp.async
 * tiles. Its grad-Q from dS is tiled's and its Dsum tree's. The shapes per
 * head_dim class are data; CLATTN_MMA, CLATTN_MMA_GRAD_Q and
 * CLATTN_MMA_SINGLE replace them for tuning (docs/tuning.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_kernels.h"
#include "mma/layout.h"
#include "variant.h"

/* The most parts the key side splits into; CLATTN_MMA_KEY_PARTS=auto, the
 * default; the parts of 16-bit tensors under auto. */
#define MMA_KEY_PARTS_MAX 16u
#define MMA_KEY_PARTS_AUTO 0u
#define MMA_KEY_PARTS_16 4u
/* CLATTN_MMA_ORDER: cl/mma's HEADS_FIRST (blocks 0, heads 1, auto 2, the
 * default: heads under a causal mask). */
enum { MMA_ORDER_BLOCKS, MMA_ORDER_HEADS, MMA_ORDER_AUTO };

/* A head_dim class's shapes: forward, dK/dV and grad-Q. */
typedef struct mma_class {
    uint32_t max_head_dim;
    mma_config forward, backward, grad_q; /* backward: dK and dV */
    const char *why;
} mma_class;

/* cl/mma's float32 kernels (3xTF32) by head_dim class: forward, dK/dV,
 * grad-Q. A lane holds 16 * head_dim / (8 * wsplit) floats of fragments on
 * the key side and a work-group gets 48 KB of local memory on NVIDIA's
 * OpenCL, hence warps that split head_dim past 64. */
static const mma_class mma_table[] = {
    {64, {4, 1, 32, 2}, {8, 1, 32, 2}, {8, 1, 16, 2},
     "fastest on the H200 at d64 causal and GQA; grad-Q gains from a shorter tile"},
    {96, {4, 2, 16, 2}, {8, 2, 16, 2}, {8, 2, 16, 2},
     "two warps share a row group: a whole d96 row of fragments spills"},
    {128, {4, 2, 16, 2}, {8, 2, 16, 1}, {8, 2, 8, 2},
     "the key side keeps fp32 tiles (tf32 planes need 50 KB); grad-Q a tile of 8"},
    {CLATTN_MAX_HEAD_DIM, {8, 4, 8, 2}, {8, 4, 8, 2}, {8, 4, 8, 2},
     "four warps a row group and 8-row tiles: what fits 48 KB at d256"},
};

/* cl/mma's 16-bit kernels (m16n8k16, wgmma on compute capability 9):
 * tiles of 16-bit words copied by cp.async into two buffers, a whole
 * number of k-steps of 16 rows. */
static const mma_class mma16_table[] = {
    {64, {4, 1, 64, 1}, {4, 1, 64, 1}, {4, 1, 64, 1},
     "64-row tiles: fastest for every kernel at d64 on the H200"},
    {128, {4, 1, 32, 1}, {4, 1, 32, 1}, {4, 1, 32, 1},
     "two 64-row tiles do not fit 48 KB past d64; 32 rows beat 16"},
    {CLATTN_MAX_HEAD_DIM, {4, 2, 16, 1}, {2, 2, 16, 1}, {4, 2, 16, 1},
     "rows split by columns past d128 (untuned: what fits)"},
};

/* Whether kernel k runs on wgmma (cl/mma's WGMMA): asked for (by default
 * on compute capability 9, or by CLATTN_MMA_WGMMA=1), the forward, grad-Q
 * and the key side's kernels of 16-bit
 * tensors at head_dim 64 or 128
 * (the 128-byte swizzle's 64 columns), whole warpgroups (4 or 8 warps,
 * WSPLIT 1) and tiles of 32 to 128 keys in steps of 32, on a GPU of
 * compute capability 9 or emulated. */
static int uses_wgmma(const struct clattn_cl_state *cl, const mma_config *c, uint32_t head_dim,
                      clattn_dtype dtype, int k)
{
    return cl->mma.wgmma && (cl->mma.nv_major >= 9 || cl->mma.emulate) &&
           (k == K_FORWARD || k == K_GRAD_Q || k == K_GRAD_KV || k == K_GRAD_K || k == K_GRAD_V ||
            k == K_SUM_PARTS) &&
           dtype != CLATTN_DTYPE_F32 && (head_dim == 64 || head_dim == 128) && c->warps % 4 == 0 &&
           c->wsplit == 1 && c->tile % 32 == 0 && c->tile <= 128;
}

/* cl/mma's local buffer for a kernel at a head_dim under config c, in
 * floats, as cl/mma/layout.h lays it out (wgmma's alignment apart). */
static size_t local_floats(const mma_config *c, uint32_t head_dim, int emulate, clattn_dtype dtype,
                           int k)
{
    const size_t sixteen = dtype != CLATTN_DTYPE_F32, warps = c->warps, wsplit = c->wsplit;
    const size_t tile = c->tile, planes = c->planes;
    const size_t dp = MMA_DP((size_t)head_dim, sixteen, wsplit);
    return MMA_LOCAL_FLOATS(sixteen, warps, wsplit, tile, planes, dp, (size_t)(emulate != 0),
                            k == K_GRAD_KVQ);
}

/* The shape of mma kernel k at a head_dim for a dtype. */
static const mma_config *config(const struct clattn_cl_state *cl, uint32_t head_dim,
                                clattn_dtype dtype, int k)
{
    static const mma_config none = {0, 0, 0, 0};
    if (k == K_GRAD_KVQ || k == K_FINISH_DQ) /* the single pass: only where asked */
        return cl->mma.single_tuned ? &cl->mma.single_tune : &none;
    if (k == K_GRAD_Q && cl->mma.grad_q_tuned)
        return &cl->mma.grad_q_tune;
    if (cl->mma.tuned)
        return &cl->mma.tune;
    const tuned_entry *e = clattn_ocl_tuned(cl, &clattn_ocl_variant_mma, dtype, head_dim, 0);
    if (e)
        return &e->mma;
    const mma_class *table = dtype == CLATTN_DTYPE_F32 ? mma_table : mma16_table;
    size_t i = 0;
    while (table[i].max_head_dim < head_dim)
        ++i;
    return k == K_FORWARD  ? &table[i].forward
           : k == K_GRAD_Q ? &table[i].grad_q
                           : &table[i].backward;
}

/* Parses "WARPS,WSPLIT,TILE,PLANES"; 0 where it is not a shape mma takes. */
static int parse_mma(const char *text, mma_config *c)
{
    char end;
    return sscanf(text, "%u,%u,%u,%u%c", &c->warps, &c->wsplit, &c->tile, &c->planes, &end) == 4 &&
           (c->warps == 1 || c->warps == 2 || c->warps == 4 || c->warps == 8) &&
           (c->wsplit == 1 || c->wsplit == 2 || c->wsplit == 4) && c->warps % c->wsplit == 0 &&
           (c->tile == 8 || c->tile == 16 || c->tile == 32 || c->tile == 64) &&
           (c->planes == 1 || c->planes == 2);
}

/* A tuning override of mma shapes from the variable `name`, if set. */
static clattn_status mma_override(const char *name, mma_config *c, int *set)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return CLATTN_OK;
    if (!parse_mma(text, c))
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
 * device: cl/mma's tensor-core PTX wants 8 (Ampere) or later, its vector
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
            clGetDeviceInfo(device, CLATTN_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major,
                            NULL) != CL_SUCCESS ||
            major > 1000)
            major = 0;
    }
    free(ext);
    return (int)major;
}

/* CLATTN_MMA_EMULATE=1: cl/mma's instructions emulated in local memory, so
 * that its kernels run (slowly) on any device; for tests. */
static int mma_emulated(void)
{
    const char *env = getenv("CLATTN_MMA_EMULATE");
    return env && !strcmp(env, "1");
}

static int runs_on(cl_device_id device) { return nv_major(device) >= 8 || mma_emulated(); }

static clattn_status setup(struct clattn_cl_state *cl, cl_device_id device, int items_loop)
{
    (void)items_loop;
    cl->mma.nv_major = nv_major(device);
    cl->mma.emulate = mma_emulated();
    /* wgmma by default on compute capability 9; CLATTN_MMA_WGMMA=0 keeps
     * mma.sync there, =1 asks for it where mma runs emulated too. */
    const char *wgmma = getenv("CLATTN_MMA_WGMMA");
    cl->mma.wgmma = wgmma ? !strcmp(wgmma, "1") : cl->mma.nv_major >= 9;
    clattn_status st;
    const char *single = getenv("CLATTN_MMA_SINGLE"); /* "0", as unset: two passes */
    if ((!single || strcmp(single, "0")) &&
        (st = mma_override("CLATTN_MMA_SINGLE", &cl->mma.single_tune, &cl->mma.single_tuned)) !=
            CLATTN_OK)
        return st;
    if (cl->mma.single_tuned && cl->mma.single_tune.wsplit != 1)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_MMA_SINGLE='%s': the single pass wants WSPLIT 1 (or 0 for two "
                           "passes)",
                           single);
    if ((st = mma_override("CLATTN_MMA", &cl->mma.tune, &cl->mma.tuned)) != CLATTN_OK)
        return st;
    const char *parts = getenv("CLATTN_MMA_KEY_PARTS");
    cl->mma.key_parts = MMA_KEY_PARTS_AUTO;
    if (parts && *parts) {
        char end;
        if (!strcmp(parts, "auto"))
            cl->mma.key_parts = MMA_KEY_PARTS_AUTO;
        else if (sscanf(parts, "%u%c", &cl->mma.key_parts, &end) != 1 || !cl->mma.key_parts ||
                 cl->mma.key_parts > MMA_KEY_PARTS_MAX)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_MMA_KEY_PARTS='%s': want 'auto' or a count of parts "
                               "from 1 to %u",
                               parts, MMA_KEY_PARTS_MAX);
    }
    const char *order = getenv("CLATTN_MMA_ORDER");
    cl->mma.heads_first = MMA_ORDER_AUTO;
    if (order && *order) {
        if (!strcmp(order, "heads"))
            cl->mma.heads_first = MMA_ORDER_HEADS;
        else if (!strcmp(order, "blocks"))
            cl->mma.heads_first = MMA_ORDER_BLOCKS;
        else if (strcmp(order, "auto"))
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_MMA_ORDER='%s': want 'auto', 'blocks' or 'heads'", order);
    }
    return mma_override("CLATTN_MMA_GRAD_Q", &cl->mma.grad_q_tune, &cl->mma.grad_q_tuned);
}

/* The 16-bit kernels load rows 16 bytes at a time: a head_dim that is not
 * a multiple of 8 runs on tiled. */
static const clattn_ocl_variant *serving(uint32_t head_dim, clattn_dtype dtype)
{
    return dtype != CLATTN_DTYPE_F32 && head_dim % 8 ? &clattn_ocl_variant_tiled
                                                     : &clattn_ocl_variant_mma;
}

/* Whether the single-pass backward serves a head_dim (the set's kernels
 * are known up to K_GRAD_KV): 16-bit tensors, a shape whose warps do not
 * split head_dim, and local memory for it on the device. */
static int single_pass(const struct clattn_cl_state *cl, const kernel_set *set, uint32_t head_dim)
{
    const mma_config *c = config(cl, head_dim, set->dtype, K_GRAD_KVQ);
    const uint32_t largest = head_dim ? head_dim : CLATTN_MAX_HEAD_DIM;
    return set->family[K_GRAD_KV] == &clattn_ocl_variant_mma && set->dtype != CLATTN_DTYPE_F32 &&
           c->warps && c->wsplit == 1 &&
           local_floats(c, largest, cl->mma.emulate, set->dtype, K_GRAD_KVQ) * sizeof(float) <=
               cl->limits.local_mem;
}

/* The single pass only where asked for and it fits; dQ from dS (GRAD_KVS,
 * GRAD_QS) for float32 only: the 16-bit backward keeps its own grad-Q. */
static int builds(const struct clattn_cl_state *cl, const kernel_set *set, uint32_t head_dim, int k)
{
    if (k == K_GRAD_KVQ || k == K_FINISH_DQ)
        return single_pass(cl, set, head_dim);
    if (k == K_GRAD_KVS || k == K_GRAD_QS)
        return set->dtype == CLATTN_DTYPE_F32;
    return 1;
}

static clattn_status check(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype,
                           int k)
{
    if (dtype != CLATTN_DTYPE_F32 && config(cl, head_dim, dtype, k)->tile % 16)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "mma's 16-bit kernels want tiles of 16 rows or more (CLATTN_MMA, "
                           "CLATTN_MMA_GRAD_Q, CLATTN_MMA_SINGLE)");
    return CLATTN_OK;
}

static void defines(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype, int k,
                    size_t limit, char *buf, size_t size)
{
    (void)limit;
    const mma_config *c = config(cl, head_dim, dtype, k);
    clattn_ocl_append(buf, size, " -DWARPS=%u -DWSPLIT=%u -DMMA_TILE=%u -DPLANES=%u%s%s",
                      c->warps, c->wsplit, c->tile, c->planes,
                      cl->mma.emulate         ? " -DMMA_EMULATE"
                      : cl->mma.nv_major >= 9 ? " -DSM90"
                                              : "",
                      uses_wgmma(cl, c, head_dim, dtype, k) ? " -DWGMMA=1" : "");
    if (cl->mma.heads_first != MMA_ORDER_AUTO)
        clattn_ocl_append(buf, size, " -DHEADS_FIRST=%d", cl->mma.heads_first);
}

static size_t work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim)
{
    return 32u * config(cl, head_dim, set->dtype, k)->warps;
}

static size_t local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim)
{
    if (k == K_FINISH_DQ || k == K_SUM_PARTS)
        return sizeof(float); /* unused, but an argument wants a size */
    const mma_config *c = config(cl, head_dim, set->dtype, k);
    const size_t align = uses_wgmma(cl, c, head_dim, set->dtype, k) ? MMA_ALIGN_WGMMA : 0;
    return (local_floats(c, head_dim, cl->mma.emulate, set->dtype, k) + align) * sizeof(float);
}

/* 16 rows a group of wsplit warps. */
static size_t row_groups(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         const clattn_shape *s, size_t rows)
{
    const mma_config *c = config(cl, s->head_dim, set->dtype, k);
    const size_t per = 16u * c->warps / c->wsplit;
    return (rows + per - 1) / per;
}

/* The parts the key side splits its steps into (launch.c's
 * enqueue_key_side): CLATTN_MMA_KEY_PARTS's count, or by default ('auto'),
 * where the key side's work-groups, a block of keys of a KV head each, are
 * fewer than the device's compute units (short sequences, few KV heads):
 * for float32, enough parts for two work-groups a unit; for 16-bit tensors,
 * whose steps are shorter, MMA_KEY_PARTS_16 (on the H100, 4 parts beat one,
 * the float32 rule's 3 to 9, and 16 at d64, d80 and d128: results/parts-h100.log);
 * each part at least two steps. */
static size_t key_parts(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                        const clattn_shape *s)
{
    if (cl->mma.key_parts != MMA_KEY_PARTS_AUTO)
        return cl->mma.key_parts;
    const mma_config *c = config(cl, s->head_dim, set->dtype, k);
    const size_t rows = 16u * c->warps / c->wsplit;
    const size_t groups = (s->kv_seq + rows - 1) / rows * s->num_kv_heads * s->batch;
    const size_t units = cl->limits.compute_units;
    if (!groups || groups >= units)
        return 1;
    const size_t steps = (size_t)(s->num_heads / s->num_kv_heads) *
                         ((s->q_seq + c->tile - 1) / c->tile);
    size_t parts = set->dtype == CLATTN_DTYPE_F32 ? (2 * units + groups - 1) / groups
                                                  : MMA_KEY_PARTS_16;
    if (parts > steps / 2)
        parts = steps / 2;
    return parts > MMA_KEY_PARTS_MAX ? MMA_KEY_PARTS_MAX : parts ? parts : 1;
}

static int parse_tuned(const char *name, const char *shape, tuned_entry *e, const char **why)
{
    if (strcmp(name, "mma"))
        return 0;
    *why = !parse_mma(shape, &e->mma) ? "not an mma shape (WARPS,WSPLIT,TILE,PLANES)"
           : e->dtype != CLATTN_DTYPE_F32 && e->mma.tile % 16
               ? "mma's 16-bit kernels want tiles of 16 rows or more"
               : NULL;
    return 1;
}

/* Whether an mma entry's kernels fit the device's local memory (wgmma's
 * alignment counted). */
static int tuned_fits(const struct clattn_cl_state *cl, const tuned_entry *e)
{
    static const int kernels[3] = {K_FORWARD, K_GRAD_Q, K_GRAD_KV};
    for (int i = 0; i < 3; ++i)
        if ((local_floats(&e->mma, e->head_dim, cl->mma.emulate, e->dtype, kernels[i]) + MMA_ALIGN_WGMMA) *
                sizeof(float) >
            cl->limits.local_mem)
            return 0;
    return 1;
}

static void format_tuned(const tuned_entry *e, char *buf, size_t size)
{
    snprintf(buf, size, "mma %s head_dim %u: %u,%u,%u,%u", clattn_ocl_dtype_name(e->dtype),
             e->head_dim, e->mma.warps, e->mma.wsplit, e->mma.tile, e->mma.planes);
}

/* clattn tune's search: "WARPS,WSPLIT,TILE,PLANES". Stage 1 tries warps
 * and wsplit at a middling tile; stage 2 the tile and the planes around
 * the winner (16-bit tensors: one plane, tiles of 16 rows or more). */
static void search_generate(int stage, const char *best, uint32_t head_dim, uint32_t micro_to,
                            clattn_dtype dtype, size_t max_wg, clattn_search_add add, void *sink)
{
    (void)micro_to;
    unsigned b[4] = {0, 0, 0, 0};
    if (stage == 2 && sscanf(best, "%u,%u,%u,%u", &b[0], &b[1], &b[2], &b[3]) != 4)
        return;
    static const unsigned warps[] = {2, 4, 8}, wsplits[] = {1, 2, 4}, tiles[] = {8, 16, 32, 64};
    for (size_t i = 0; i < (stage == 1 ? 9u : 8u); ++i) {
        unsigned v[4];
        if (stage == 1) {
            v[0] = warps[i / 3], v[1] = wsplits[i % 3], v[2] = head_dim > 64 ? 16 : 32;
            v[3] = dtype ? 1 : 2;
        } else {
            v[0] = b[0], v[1] = b[1], v[2] = tiles[i / 2], v[3] = 1 + i % 2;
            if ((dtype && v[3] == 2) || (v[2] == b[2] && v[3] == b[3]))
                continue;
        }
        char text[CLATTN_SEARCH_TEXT];
        snprintf(text, sizeof text, "%u,%u,%u,%u", v[0], v[1], v[2], v[3]);
        if (v[0] % v[1] == 0 && 16u * v[1] <= head_dim + 15 && (!dtype || v[2] >= 16) &&
            32u * v[0] <= max_wg && !add(sink, text))
            return;
    }
}

static int search_candidate(const char *text, char *out)
{
    unsigned v[4];
    char end;
    if (sscanf(text, "%u,%u,%u,%u%c", &v[0], &v[1], &v[2], &v[3], &end) != 4)
        return 0;
    snprintf(out, CLATTN_SEARCH_TEXT, "%u,%u,%u,%u", v[0], v[1], v[2], v[3]);
    return 1;
}

static const char *const search_clears[] = {"CLATTN_MMA", "CLATTN_MMA_GRAD_Q",
                                            "CLATTN_MMA_SINGLE", NULL};

/* One shape serves both ops; each is tuned with the same variable. */
static const clattn_ocl_search search = {
    .form = "WARPS,WSPLIT,TILE,PLANES",
    .variable = {"CLATTN_MMA", "CLATTN_MMA", "CLATTN_MMA"},
    .entry = {"mma", "mma", "mma"},
    .clears = search_clears,
    .candidate = search_candidate,
    .generate = search_generate,
};

const clattn_ocl_variant clattn_ocl_variant_mma = {
    .name = "mma",
    .source = clattn_cl_mma,
    .kernels =
        {
            [K_FORWARD] = {"forward__mma", &clattn_ocl_variant_mma},
            [K_DSUM] = {"dsum__tree", &clattn_ocl_variant_tree},
            [K_GRAD_Q] = {"grad_q__mma", &clattn_ocl_variant_mma},
            [K_GRAD_K] = {"grad_k__mma", &clattn_ocl_variant_mma},
            [K_GRAD_V] = {"grad_v__mma", &clattn_ocl_variant_mma},
            [K_GRAD_KV] = {"grad_kv__mma", &clattn_ocl_variant_mma},
            [K_GRAD_KVQ] = {"grad_kvq__mma", &clattn_ocl_variant_mma},
            [K_FINISH_DQ] = {"finish_dq__mma", &clattn_ocl_variant_mma},
            [K_GRAD_KVS] = {"grad_kvs__mma", &clattn_ocl_variant_mma},
            [K_GRAD_QS] = {"grad_qs__tiled", &clattn_ocl_variant_tiled},
            [K_SUM_PARTS] = {"sum_parts__mma", &clattn_ocl_variant_mma},
        },
    .per_head_dim = 1,
    .programmable = 1,
    .runs_on = runs_on,
    .why_not = "variant 'mma' needs an NVIDIA GPU of compute capability 8.0 or later "
               "(tensor-core PTX); this device is not one",
    .setup = setup,
    .serving = serving,
    .builds = builds,
    .check = check,
    .defines = defines,
    .work_group = work_group,
    .local_bytes = local_bytes,
    .row_groups = row_groups,
    .key_parts = key_parts,
    .tuned_names = "mma",
    .parse_tuned = parse_tuned,
    .tuned_fits = tuned_fits,
    .format_tuned = format_tuned,
    .search = &search,
};
