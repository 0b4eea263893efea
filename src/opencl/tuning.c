/* The kernels' shapes per device class, as data: each entry says why it
 * is what it is, and results/ holds the measurements behind it. The
 * environment overrides (CLATTN_TILED, CLATTN_MMA, CLATTN_MMA_GRAD_Q,
 * CLATTN_MMA_SINGLE) replace them for tuning; docs/tuning.md says how. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl.h"
#include "program_cache.h"

/* cl/tiled, by how the device runs a work-group: its items side by side
 * (GPUs, and CPU drivers that map them to SIMD lanes, such as Mesa's
 * llvmpipe) or as a loop (PoCL's CPU device); by head_dim class, the
 * forward's shape and the backward's. */
static const tile_class tile_table[] = {
    {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, 64, {64, 32, 8, 64, 4, 0},
     {64, 16, 16, 64, 8, 0},
     "micro-tiles of 4 rows by 4 keys in the forward; on the key side 8 rows by one query, "
     "split 16 ways (dQ from its dS: the key side is most of the backward)"},
    {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, 96, {32, 16, 8, 128, 4, 0},
     {32, 8, 8, 128, 4, 0},
     "micro-tiles of 4 rows; the key side's two tiles of rows and keys leave room for 32 "
     "rows and tiles of 8 (beside rows split by columns: 0.88x the forward, 0.47x the "
     "backward)"},
    {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, 128, {64, 8, 4, 128, 4, 0},
     {32, 8, 8, 128, 4, 0},
     "the forward's 64 rows share each tile of 8 keys, split 4 ways, 4 rows by 2 keys a "
     "work-item; the backward's as d96's"},
    {CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR, CLATTN_MAX_HEAD_DIM, {16, 16, 8, 128, 2, 0},
     {32, 16, 1, 32, 0, 0},
     "the forward's micro-tiles of 2 rows by 2 keys, K and V taking turns in one tile (two "
     "do not fit 48 KB); the backward's rows split by columns, as its micro-tiles' two tiles "
     "and two sets of rows leave a few pairs a barrier"},
    {CL_DEVICE_TYPE_CPU, 64, {32, 32, 8, 64, 4, 0}, {32, 32, 8, 64, 4, 0}, "the GPUs' micro-tiles"},
    {CL_DEVICE_TYPE_CPU, CLATTN_MAX_HEAD_DIM, {64, 32, 1, CLATTN_MAX_HEAD_DIM, 0, 0},
     {64, 32, 1, CLATTN_MAX_HEAD_DIM, 0, 0},
     "whole rows, as PoCL runs a work-group's items as a loop"},
};
enum { TILE_CLASSES = sizeof tile_table / sizeof tile_table[0] };

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

unsigned clattn_ocl_tile_dsplit(const tile_config *c, uint32_t head_dim)
{
    return !c->per_item && head_dim > c->columns ? (head_dim + c->columns - 1) / c->columns : 1u;
}

size_t clattn_ocl_tile_items(const tile_config *c, uint32_t head_dim)
{
    return c->per_item ? (size_t)c->rows / c->per_item * c->split
                       : (size_t)c->rows * c->split * clattn_ocl_tile_dsplit(c, head_dim);
}

/* cl/tiled's local buffer for kernel k at a head_dim under c, in whole
 * float4s of floats: rows.cl's (the same for every kernel), or micro.cl's
 * LOCAL_FORWARD, LOCAL_GRAD_Q, LOCAL_GRAD_QS or LOCAL_KEY (K_COUNT: the
 * larger of LOCAL_GRAD_Q and LOCAL_KEY). */
size_t clattn_ocl_tiled_local_floats(const tile_config *c, uint32_t head_dim, int k)
{
    size_t floats;
    if (c->per_item) {
        const size_t rows = c->rows, tile = c->tile, split = c->split;
        const size_t ds = (head_dim + 3) / 4 * 4 + 4, ws = (rows + 3) / 4 * 4 + 4;
        /* the forward's weights take the key tile's place where they fit
         * it; K and V take turns in one buffer under one_kv */
        const size_t kv = c->one_kv ? tile * ds + tile * ws
                                    : 2 * tile * ds + (ws <= ds ? 0 : tile * ws);
        const size_t forward = rows * ds + kv + 2 * split * rows;
        const size_t grad_q = 2 * rows * ds + 2 * tile * ds + tile * ws;
        const size_t key = 2 * rows * ds + 2 * tile * ds + 2 * tile * ws + 3 * tile;
        const size_t grad_qs = tile * ds + tile * ws; /* below grad_q's */
        floats = k == K_FORWARD   ? forward
                 : k == K_GRAD_Q  ? grad_q
                 : k == K_GRAD_QS ? grad_qs
                 : k == K_COUNT   ? (key > grad_q ? key : grad_q)
                                  : key;
    } else {
        const size_t dsplit = clattn_ocl_tile_dsplit(c, head_dim);
        const size_t stride = (head_dim + dsplit - 1) / dsplit * dsplit;
        const size_t exchange = dsplit > 1 ? 2 * dsplit * c->tile * c->rows : 0;
        const size_t tiles = 2 * (size_t)c->tile * stride + 3 * (size_t)c->tile + exchange;
        const size_t combine = ((size_t)c->split - 1) * c->rows * (stride + 2);
        floats = tiles > combine ? tiles : combine;
    }
    return (floats + 3) / 4 * 4; /* the kernels take it as float4s */
}

/* The tuning file's entry for a kind, dtype, head_dim and (tiled) pass, or
 * NULL. */
static const tuned_entry *tuned(const struct clattn_cl_state *cl, int kind, clattn_dtype dtype,
                                uint32_t head_dim, int pass)
{
    for (size_t i = 0; i < cl->ntuned; ++i)
        if (cl->tuned[i].kind == kind && cl->tuned[i].dtype == dtype &&
            cl->tuned[i].head_dim == head_dim && cl->tuned[i].pass == pass)
            return &cl->tuned[i];
    return NULL;
}

/* Halves *x where what is left still divides by `by`; 0 where it cannot. */
static int halve(unsigned *x, unsigned by)
{
    if (*x < 2 || (*x / 2) % by)
        return 0;
    *x /= 2;
    return 1;
}

/* Fits a micro-tile shape: fewer work-items share a row, then a group holds
 * fewer rows, until the group fits `limit`; then the forward's K and V
 * tiles share one buffer, and the tile, the rows, the sharing and the rows
 * a work-item shrink, until the local buffer fits.
 * The smallest (a row, a tile of one, one work-item) needs about 4 *
 * head_dim floats: 4.2 KB at d256, within any device of OpenCL's full
 * profile (32 KB or more); a device with less is refused at the build. */
static void fit_micro(tile_config *c, uint32_t head_dim, size_t limit, size_t local_mem, int k)
{
    const size_t room = local_mem / sizeof(float);
    c->one_kv = 0;
    while (clattn_ocl_tile_items(c, head_dim) > limit) {
        if (c->split > 1 && c->tile % (c->split / 2) == 0)
            c->split /= 2;
        else if (!halve(&c->rows, c->per_item))
            c->rows = c->per_item = c->split = 1;
    }
    while (clattn_ocl_tiled_local_floats(c, head_dim, k) > room) {
        if (k == K_FORWARD && !c->one_kv) {
            c->one_kv = 1; /* before anything shrinks */
            continue;
        }
        if ((c->tile > c->split && halve(&c->tile, c->split)) || halve(&c->rows, c->per_item))
            continue;
        if (c->split > 1 && c->tile % (c->split / 2) == 0)
            c->split /= 2;
        else if (c->per_item > 1)
            c->per_item = c->rows = 1;
        else if (c->rows > 1 || c->tile > 1)
            c->rows = c->per_item = c->tile = c->split = 1;
        else
            break; /* too small for the smallest: refused at the build */
    }
}

static int parse_tiled(const char *text, tile_config *c);

/* The shape of tiled kernel k for a head_dim on a device that runs
 * work-groups of at most `limit` work-items: the variable's
 * (CLATTN_TILED_BACKWARD for the backward's kernels, else CLATTN_TILED),
 * else the tuning file's (the kernel's pass, else every kernel's), else the
 * table's, fitted. Micro-tiles fit as fit_micro says, to the local memory
 * of the forward or of the larger backward kernel (one program). Rows: fewer
 * work-items share a row by tiles (split), then a group holds fewer rows,
 * then a work-item holds more columns, until the group fits the limit;
 * then the tile halves until the local buffer fits the device. Every
 * device fits in the end: one work-item, one row, a tile of one. */
tile_config clattn_ocl_tile_config(const struct clattn_cl_state *cl, uint32_t head_dim,
                                   clattn_dtype dtype, size_t limit, int k)
{
    const int pass = k == K_GRAD_Q || k == K_GRAD_K || k == K_GRAD_V || k == K_GRAD_KV ||
                             k == K_GRAD_KVS || k == K_GRAD_QS
                         ? TILED_BACKWARD
                         : TILED_FORWARD;
    const tile_class *t = cl->tiles;
    while (t + 1 < tile_table + TILE_CLASSES && t->max_head_dim < head_dim && t[1].type == t->type)
        ++t;
    tile_config c = pass == TILED_BACKWARD ? t->backward : t->forward;
    const char *env = pass == TILED_BACKWARD && cl->tiled_env[1][0] ? cl->tiled_env[1]
                                                                    : cl->tiled_env[0];
    const tuned_entry *e;
    if (*env)
        parse_tiled(env, &c); /* checked when the context was made; fields left out: the table's */
    else if ((e = tuned(cl, KIND_TILED, dtype, head_dim, pass)) != NULL ||
             (e = tuned(cl, KIND_TILED, dtype, head_dim, TILED_EVERY)) != NULL)
        c = e->tile;
    if (c.per_item) {
        fit_micro(&c, head_dim, limit, cl->local_mem, pass == TILED_BACKWARD ? K_COUNT : K_FORWARD);
        return c;
    }
    while (clattn_ocl_tile_items(&c, head_dim) > limit) {
        if (c.split > 1)
            c.split /= 2;
        else if (c.rows > 1)
            c.rows = (c.rows + 1) / 2;
        else
            c.columns *= 2;
    }
    while (c.tile > c.split && (c.tile / 2) % c.split == 0 &&
           clattn_ocl_tiled_local_floats(&c, head_dim, K_FORWARD) * sizeof(float) > cl->local_mem)
        c.tile /= 2;
    return c;
}

size_t clattn_ocl_tree_work_group(uint32_t head_dim, size_t limit)
{
    size_t wg = 1;
    while (wg < head_dim && wg * 2 <= limit)
        wg <<= 1;
    return wg;
}

/* Whether kernel k runs on wgmma (cl/mma's WGMMA): asked for (by default
 * on compute capability 9, or by CLATTN_MMA_WGMMA=1), the forward, grad-Q
 * and the key side's kernels of 16-bit
 * tensors at head_dim 64 or 128
 * (the 128-byte swizzle's 64 columns), whole warpgroups (4 or 8 warps,
 * WSPLIT 1) and tiles of 32 to 128 keys in steps of 32, on a GPU of
 * compute capability 9 or emulated. */
int clattn_ocl_mma_wgmma(int asked, int nv_major, int emulate, const mma_config *c,
                     uint32_t head_dim, clattn_dtype dtype, int k)
{
    return asked && (nv_major >= 9 || emulate) &&
           (k == K_FORWARD || k == K_GRAD_Q || k == K_GRAD_KV || k == K_GRAD_K || k == K_GRAD_V) &&
           dtype != CLATTN_DTYPE_F32 &&
           (head_dim == 64 || head_dim == 128) && c->warps % 4 == 0 && c->wsplit == 1 &&
           c->tile % 32 == 0 && c->tile <= 128;
}

/* cl/mma's local buffer for a kernel at a head_dim under config c, in
 * floats: up to 3 to a 16-byte boundary, the tile rows' m, l and Dsum, the
 * warps' exchange, the emulation's scratch, then the kernel's two tiles
 * (fp32: [tile][padded + 4] floats a plane; 16-bit: [tile][padded / 2 + 4]
 * words of two elements). 16-bit kernels have two of each, rows and tiles:
 * one is filled while the other is read. */
size_t clattn_ocl_mma_local_floats(const mma_config *c, uint32_t head_dim, int emulate,
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

/* The shape of mma kernel k at a head_dim for a dtype. */
const mma_config *clattn_ocl_mma_config(const struct clattn_cl_state *cl, uint32_t head_dim,
                                        clattn_dtype dtype, int k)
{
    static const mma_config none = {0, 0, 0, 0};
    if (k == K_GRAD_KVQ || k == K_FINISH_DQ) /* the single pass: only where asked */
        return cl->single_tuned ? &cl->single_tune : &none;
    if (k == K_GRAD_Q && cl->grad_q_tuned)
        return &cl->grad_q_tune;
    if (cl->mma_tuned)
        return &cl->mma_tune;
    const tuned_entry *e = tuned(cl, KIND_MMA, dtype, head_dim, 0);
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

/* Parses "ROWS,TILE,SPLIT[,COLUMNS[,PER_ITEM]]" over *c (what is left out
 * kept); 0 where it is not a shape tiled takes: SPLIT dividing TILE, and
 * for micro-tiles (PER_ITEM 1 to 8) PER_ITEM dividing ROWS; at most 1024
 * work-items. */
static int parse_tiled(const char *text, tile_config *c)
{
    unsigned rows, tile, split, columns = 0, per_item = c->per_item;
    char end;
    const int n = sscanf(text, "%u,%u,%u,%u,%u%c", &rows, &tile, &split, &columns, &per_item, &end);
    if (n < 3 || n > 5 || !rows || !tile || !split || tile % split || rows > 1024 ||
        tile > 256 || (n >= 4 && (!columns || columns > 1024)) || per_item > 8 ||
        (per_item ? rows % per_item || rows / per_item * split > 1024 : rows * split > 1024))
        return 0;
    c->rows = rows;
    c->tile = tile;
    c->split = split;
    if (columns)
        c->columns = columns;
    c->per_item = per_item;
    return 1;
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

clattn_status clattn_ocl_tuning_init(struct clattn_cl_state *cl, cl_device_type type)
{
    cl->tiles = tile_table;
    for (size_t i = 0; i < TILE_CLASSES; ++i)
        if (type & tile_table[i].type) {
            cl->tiles = &tile_table[i];
            break;
        }
    /* Tuning overrides for a device the table does not know well: fields
     * left out keep each class's own, so each must take them. */
    static const char *const names[2] = {"CLATTN_TILED", "CLATTN_TILED_BACKWARD"};
    for (int v = 0; v < 2; ++v) {
        const char *tune = getenv(names[v]);
        cl->tiled_env[v][0] = '\0';
        if (!tune || !*tune)
            continue;
        for (const tile_class *t = cl->tiles;
             t < tile_table + TILE_CLASSES && t->type == cl->tiles->type; ++t) {
            tile_config both[2] = {t->forward, t->backward};
            for (int i = v; i < 2; ++i)
                if (strlen(tune) >= sizeof cl->tiled_env[v] || !parse_tiled(tune, &both[i]))
                    return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                                       "%s='%s': want ROWS,TILE,SPLIT[,COLUMNS[,PER_ITEM]] with "
                                       "SPLIT dividing TILE, PER_ITEM 0 to 8 dividing ROWS, and "
                                       "at most 1024 work-items",
                                       names[v], tune);
        }
        snprintf(cl->tiled_env[v], sizeof cl->tiled_env[v], "%s", tune);
    }
    uint64_t bound;
    if (!clattn_cache_bound(&bound))
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_CACHE_MAX_MB='%s': want the program cache's bound as a whole "
                           "number of MiB (0: no bound)",
                           getenv("CLATTN_CACHE_MAX_MB"));
    /* CLATTN_DS_MAX_MB: the dS scratch's bound (launch.c's ds_chunk) */
    const char *ds = getenv("CLATTN_DS_MAX_MB");
    cl->ds_max = DS_DEFAULT;
    if (ds) {
        char *end;
        errno = 0;
        const unsigned long long mb = strtoull(ds, &end, 10);
        if (!*ds || *end || errno || ds[0] == '-' || mb >= 1ull << 40)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_DS_MAX_MB='%s': want the backward's dS scratch bound as a "
                               "whole number of MiB (0: none)",
                               ds);
        cl->ds_max = (size_t)(mb << 20);
    }
    clattn_status st;
    const char *single = getenv("CLATTN_MMA_SINGLE"); /* "0", as unset: two passes */
    if ((!single || strcmp(single, "0")) &&
        (st = mma_override("CLATTN_MMA_SINGLE", &cl->single_tune, &cl->single_tuned)) !=
            CLATTN_OK)
        return st;
    if (cl->single_tuned && cl->single_tune.wsplit != 1)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_MMA_SINGLE='%s': the single pass wants WSPLIT 1 (or 0 for two "
                           "passes)",
                           single);
    if ((st = mma_override("CLATTN_MMA", &cl->mma_tune, &cl->mma_tuned)) != CLATTN_OK)
        return st;
    return mma_override("CLATTN_MMA_GRAD_Q", &cl->grad_q_tune, &cl->grad_q_tuned);
}

/* The tuning file's path: CLATTN_TUNING_FILE ("off": none), else
 * $XDG_CONFIG_HOME/clattn/tuning, else ~/.config/clattn/tuning; 0 where
 * there is none. */
static int tuning_path(char *path, size_t size)
{
    const char *set = getenv("CLATTN_TUNING_FILE"), *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int n;
    if (set && *set)
        n = strcmp(set, "off") ? snprintf(path, size, "%s", set) : -1;
    else if (xdg && *xdg)
        n = snprintf(path, size, "%s/clattn/tuning", xdg);
    else if (home && *home)
        n = snprintf(path, size, "%s/.config/clattn/tuning", home);
    else
        n = -1;
    return n > 0 && (size_t)n < size;
}

static int parse_dtype_name(const char *name, clattn_dtype *dtype)
{
    static const char *const names[3] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; ++i)
        if (!strcmp(name, names[i])) {
            *dtype = (clattn_dtype)i;
            return 1;
        }
    return 0;
}

/* One entry line, "VARIANT<TAB>DTYPE<TAB>HEAD_DIM<TAB>SHAPE<TAB>KEY", into
 * *e and *key (pointing into line, which it cuts); the reason where it is
 * malformed, else NULL. */
static const char *parse_entry(char *line, tuned_entry *e, const char **key)
{
    char *field[5];
    field[0] = line;
    for (int i = 1; i < 5; ++i) {
        char *tab = strchr(field[i - 1], '\t');
        if (!tab)
            return "want VARIANT, DTYPE, HEAD_DIM, SHAPE and the device, tab-separated";
        *tab = '\0';
        field[i] = tab + 1;
    }
    memset(e, 0, sizeof *e);
    char end;
    if (!strcmp(field[0], "tiled"))
        e->kind = KIND_TILED, e->pass = TILED_EVERY;
    else if (!strcmp(field[0], "tiled-forward"))
        e->kind = KIND_TILED, e->pass = TILED_FORWARD;
    else if (!strcmp(field[0], "tiled-backward"))
        e->kind = KIND_TILED, e->pass = TILED_BACKWARD;
    else if (!strcmp(field[0], "mma"))
        e->kind = KIND_MMA;
    else
        return "the variant is none of tiled, tiled-forward, tiled-backward and mma";
    if (!parse_dtype_name(field[1], &e->dtype))
        return "the dtype is none of f32, f16 and bf16";
    if (sscanf(field[2], "%u%c", &e->head_dim, &end) != 1 || !e->head_dim ||
        e->head_dim > CLATTN_MAX_HEAD_DIM)
        return "the head_dim is not 1 to 256";
    e->tile.columns = CLATTN_MAX_HEAD_DIM;
    e->tile.per_item = 0;
    if (e->kind == KIND_TILED ? !parse_tiled(field[3], &e->tile) : !parse_mma(field[3], &e->mma))
        return e->kind == KIND_TILED ? "not a tiled shape (ROWS,TILE,SPLIT,COLUMNS,PER_ITEM)"
                                     : "not an mma shape (WARPS,WSPLIT,TILE,PLANES)";
    if (e->kind == KIND_MMA && e->dtype != CLATTN_DTYPE_F32 && e->mma.tile % 16)
        return "mma's 16-bit kernels want tiles of 16 rows or more";
    *key = field[4];
    return NULL;
}

/* Whether an mma entry's kernels fit the device's local memory (wgmma's
 * alignment counted). */
static int mma_fits(const struct clattn_cl_state *cl, const tuned_entry *e)
{
    static const int kernels[3] = {K_FORWARD, K_GRAD_Q, K_GRAD_KV};
    for (int i = 0; i < 3; ++i)
        if ((clattn_ocl_mma_local_floats(&e->mma, e->head_dim, cl->mma_emulate, e->dtype,
                                         kernels[i]) +
             256) * sizeof(float) >
            cl->local_mem)
            return 0;
    return 1;
}

void clattn_ocl_tuning_file(struct clattn_cl_state *cl, clattn_context *ctx, const char *key)
{
    char path[1024];
    cl->ntuned = 0;
    if (!tuning_path(path, sizeof path))
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return; /* no file: the tables */
    char line[1024];
    const char *why = NULL;
    unsigned number = 1, skipped = 0, other_driver = 0;
    /* The device's key without its driver: entries from another driver are stale. */
    const char *driver = strrchr(key, '/');
    const size_t stem = driver ? (size_t)(driver - key) : strlen(key);
    if (!fgets(line, sizeof line, f)) {
        why = "it is empty";
    } else {
        char version[64];
        line[strcspn(line, "\r\n")] = '\0';
        if (sscanf(line, "clattn-tuning 1 %63s", version) != 1)
            why = "its first line is not 'clattn-tuning 1 VERSION'";
        else if (strcmp(version, clattn_version()))
            why = "it was written by another clattn version (stale)";
    }
    while (!why && fgets(line, sizeof line, f)) {
        ++number;
        const size_t n = strcspn(line, "\r\n");
        if (!line[n] && !feof(f)) {
            why = "a line is too long";
            break;
        }
        line[n] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        tuned_entry e;
        const char *entry_key = NULL;
        if ((why = parse_entry(line, &e, &entry_key)) != NULL)
            break;
        if (e.kind == KIND_MMA && !mma_fits(cl, &e)) {
            clattn_log_append(ctx, "tuning: %s, line %u: the mma shape needs more local memory "
                              "than the device has; the entry is ignored", path, number);
            continue;
        }
        if (strcmp(entry_key, key)) {
            other_driver += !strncmp(entry_key, key, stem) && entry_key[stem] == '/';
            continue; /* another device's */
        }
        tuned_entry *slot = (tuned_entry *)tuned(cl, e.kind, e.dtype, e.head_dim, e.pass);
        if (!slot && cl->ntuned == TUNED_MAX) {
            ++skipped;
            continue;
        }
        *(slot ? slot : &cl->tuned[cl->ntuned++]) = e; /* a later line replaces an earlier */
    }
    if (!why && ferror(f))
        why = "it could not be read";
    fclose(f);
    if (why) {
        cl->ntuned = 0;
        if (number > 1)
            clattn_log_append(ctx, "tuning: %s, line %u: %s; the file is ignored", path, number,
                              why);
        else
            clattn_log_append(ctx, "tuning: %s: %s; the file is ignored", path, why);
        return;
    }
    if (other_driver)
        clattn_log_append(ctx, "tuning: %s: %u entries for this device under another driver "
                          "(stale) are ignored", path, other_driver);
    if (skipped)
        clattn_log_append(ctx, "tuning: %s: %u entries past the first %d are ignored", path,
                          skipped, (int)TUNED_MAX);
    for (size_t i = 0; i < cl->ntuned; ++i) {
        const tuned_entry *e = &cl->tuned[i];
        static const char *const dtypes[3] = {"f32", "f16", "bf16"};
        static const char *const passes[3] = {"tiled-forward", "tiled-backward", "tiled"};
        if (e->kind == KIND_TILED)
            clattn_log_append(ctx, "tuning: %s %s head_dim %u: %u,%u,%u,%u,%u from %s",
                              passes[e->pass], dtypes[e->dtype], e->head_dim, e->tile.rows, e->tile.tile,
                              e->tile.split, e->tile.columns, e->tile.per_item, path);
        else
            clattn_log_append(ctx, "tuning: mma %s head_dim %u: %u,%u,%u,%u from %s",
                              dtypes[e->dtype], e->head_dim, e->mma.warps, e->mma.wsplit,
                              e->mma.tile, e->mma.planes, path);
    }
}

size_t clattn_ocl_local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                              uint32_t head_dim)
{
    if (set->kind[k] == KIND_BLOCKED)
        return sizeof(float); /* unused, but an argument wants a size */
    if (set->kind[k] == KIND_MMA && k == K_FINISH_DQ)
        return sizeof(float); /* unused */
    if (set->kind[k] == KIND_MMA) {
        const mma_config *c = clattn_ocl_mma_config(cl, head_dim, set->dtype, k);
        /* wgmma's tiles start at a 1024-byte boundary: up to 255 floats more */
        const int wgmma = clattn_ocl_mma_wgmma(cl->wgmma, cl->nv_major, cl->mma_emulate, c,
                                               head_dim, set->dtype, k);
        const size_t align = wgmma ? 256 : 0;
        return (clattn_ocl_mma_local_floats(c, head_dim, cl->mma_emulate, set->dtype, k) + align) *
               sizeof(float);
    }
    if (set->kind[k] == KIND_TILED) {
        const tile_config c = clattn_ocl_tile_config(cl, head_dim, set->dtype, set->limit, k);
        return clattn_ocl_tiled_local_floats(&c, head_dim, k) * sizeof(float);
    }
    return clattn_ocl_tree_work_group(head_dim, set->limit) * sizeof(float) *
           (size_t)clattn_ocl_kernel_descs[k].local_per_lane;
}

size_t clattn_ocl_work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                             uint32_t head_dim)
{
    const tile_config c = clattn_ocl_tile_config(cl, head_dim, set->dtype, set->limit, k);
    return set->kind[k] == KIND_TILED
               ? clattn_ocl_tile_items(&c, head_dim)
           : set->kind[k] == KIND_BLOCKED ? 1
           : set->kind[k] == KIND_MMA
               ? 32u * clattn_ocl_mma_config(cl, head_dim, set->dtype, k)->warps
               : clattn_ocl_tree_work_group(head_dim, set->limit);
}
