/* The tiled variant: cl/tiled's portable kernels, a work-group per block
 * of rows (per pair of blocks under a causal mask), in one of two layouts:
 * rows, whose work-items share a row by tiles and columns, and micro-tiles,
 * whose work-items hold PER_ITEM rows each. Its shapes per device class are
 * data: each entry says why it is what it is, and results/ holds the
 * measurements behind it. CLATTN_TILED and CLATTN_TILED_BACKWARD replace
 * them for tuning; docs/tuning.md says how. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_kernels.h"
#include "tiled/layout.h"
#include "variant.h"

extern const clattn_ocl_variant clattn_ocl_variant_tiled;

/* A class of devices and head_dims: the forward's shape and the
 * backward's. */
typedef struct tile_class {
    cl_device_type type;
    uint32_t max_head_dim;
    tile_config forward, backward;
    const char *why;
} tile_class;

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

static unsigned tile_dsplit(const tile_config *c, uint32_t head_dim)
{
    return !c->per_item && head_dim > c->columns ? (head_dim + c->columns - 1) / c->columns : 1u;
}

static size_t tile_items(const tile_config *c, uint32_t head_dim)
{
    return c->per_item ? (size_t)c->rows / c->per_item * c->split
                       : (size_t)c->rows * c->split * tile_dsplit(c, head_dim);
}

/* cl/tiled's local buffer for kernel k at a head_dim under c, in whole
 * float4s of floats, as cl/tiled/layout.h lays it out: the rows layout's
 * (the same for every kernel), or the micro-tiles' of the kernel (K_COUNT:
 * the larger of grad-Q's and the key side's, which share a program). */
static size_t local_floats(const tile_config *c, uint32_t head_dim, int k)
{
    size_t floats;
    const size_t rows = c->rows, tile = c->tile, split = c->split;
    if (c->per_item) {
        const size_t ds = TILED_DS((size_t)head_dim), ws = TILED_WS(rows);
        const size_t grad_q = TILED_LOCAL_GRAD_Q(rows, tile, ds, ws);
        const size_t key = TILED_LOCAL_KEY(rows, tile, ds, ws);
        floats = k == K_FORWARD   ? TILED_LOCAL_FORWARD(rows, tile, split, ds, ws, c->one_kv)
                 : k == K_GRAD_Q  ? grad_q
                 : k == K_GRAD_QS ? TILED_LOCAL_GRAD_QS(tile, ds, ws)
                 : k == K_COUNT   ? (key > grad_q ? key : grad_q)
                                  : key;
    } else {
        const size_t dsplit = tile_dsplit(c, head_dim);
        floats = TILED_LOCAL_ROWS(rows, tile, split, dsplit, TILED_ROWS_DP((size_t)head_dim, dsplit));
    }
    return (floats + 3) / 4 * 4; /* the kernels take it as float4s */
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
    while (tile_items(c, head_dim) > limit) {
        if (c->split > 1 && c->tile % (c->split / 2) == 0)
            c->split /= 2;
        else if (!halve(&c->rows, c->per_item))
            c->rows = c->per_item = c->split = 1;
    }
    while (local_floats(c, head_dim, k) > room) {
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

/* Parses "ROWS,TILE,SPLIT[,COLUMNS[,PER_ITEM]]" over *c (what is left out
 * kept); 0 where it is not a shape tiled takes: SPLIT dividing TILE, and
 * for micro-tiles (PER_ITEM 1 to 8) PER_ITEM dividing ROWS; at most 1024
 * work-items. */
static int parse_tiled(const char *text, tile_config *c)
{
    unsigned rows, tile, split, columns = 0, per_item = c->per_item;
    char end;
    const int n = sscanf(text, "%u,%u,%u,%u,%u%c", &rows, &tile, &split, &columns, &per_item, &end);
    if (n < 3 || n > 5 || !rows || !tile || !split || tile % split || rows > 1024 || tile > 256 ||
        (n >= 4 && (!columns || columns > 1024)) || per_item > 8 ||
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
static tile_config tile_config_of(const struct clattn_cl_state *cl, uint32_t head_dim,
                                  clattn_dtype dtype, size_t limit, int k)
{
    const int pass = k == K_GRAD_Q || k == K_GRAD_K || k == K_GRAD_V || k == K_GRAD_KV ||
                             k == K_GRAD_KVS || k == K_GRAD_QS
                         ? TILED_BACKWARD
                         : TILED_FORWARD;
    const tile_class *t = cl->tiled.classes;
    while (t + 1 < tile_table + TILE_CLASSES && t->max_head_dim < head_dim && t[1].type == t->type)
        ++t;
    tile_config c = pass == TILED_BACKWARD ? t->backward : t->forward;
    const char *env =
        pass == TILED_BACKWARD && cl->tiled.env[1][0] ? cl->tiled.env[1] : cl->tiled.env[0];
    const tuned_entry *e;
    if (*env)
        parse_tiled(env, &c); /* checked when the context was made; fields left out:
                                 the table's */
    else if ((e = clattn_ocl_tuned(cl, &clattn_ocl_variant_tiled, dtype, head_dim, pass)) != NULL ||
             (e = clattn_ocl_tuned(cl, &clattn_ocl_variant_tiled, dtype, head_dim, TILED_EVERY)) !=
                 NULL)
        c = e->tile;
    if (c.per_item) {
        fit_micro(&c, head_dim, limit, cl->limits.local_mem, pass == TILED_BACKWARD ? K_COUNT : K_FORWARD);
        return c;
    }
    while (tile_items(&c, head_dim) > limit) {
        if (c.split > 1)
            c.split /= 2;
        else if (c.rows > 1)
            c.rows = (c.rows + 1) / 2;
        else
            c.columns *= 2;
    }
    while (c.tile > c.split && (c.tile / 2) % c.split == 0 &&
           local_floats(&c, head_dim, K_FORWARD) * sizeof(float) > cl->limits.local_mem)
        c.tile /= 2;
    return c;
}

static clattn_status setup(struct clattn_cl_state *cl, cl_device_id device, int items_loop)
{
    (void)device;
    /* The table's class follows how the device runs a work-group's items:
     * PoCL runs them as a loop (the CPU entries); GPUs, and CPU drivers that
     * map work-items to SIMD lanes (Mesa's llvmpipe), side by side with
     * registers of their own (the GPU entries). */
    const cl_device_type type = items_loop ? CL_DEVICE_TYPE_CPU : CL_DEVICE_TYPE_GPU;
    cl->tiled.classes = tile_table;
    for (size_t i = 0; i < TILE_CLASSES; ++i)
        if (type & tile_table[i].type) {
            cl->tiled.classes = &tile_table[i];
            break;
        }
    /* Tuning overrides for a device the table does not know well: fields
     * left out keep each class's own, so each must take them. */
    static const char *const names[2] = {"CLATTN_TILED", "CLATTN_TILED_BACKWARD"};
    for (int v = 0; v < 2; ++v) {
        const char *tune = getenv(names[v]);
        cl->tiled.env[v][0] = '\0';
        if (!tune || !*tune)
            continue;
        for (const tile_class *t = cl->tiled.classes;
             t < tile_table + TILE_CLASSES && t->type == cl->tiled.classes->type; ++t) {
            tile_config both[2] = {t->forward, t->backward};
            for (int i = v; i < 2; ++i)
                if (strlen(tune) >= sizeof cl->tiled.env[v] || !parse_tiled(tune, &both[i]))
                    return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                                       "%s='%s': want ROWS,TILE,SPLIT[,COLUMNS[,PER_ITEM]] with "
                                       "SPLIT dividing TILE, PER_ITEM 0 to 8 dividing ROWS, and "
                                       "at most 1024 work-items",
                                       names[v], tune);
        }
        snprintf(cl->tiled.env[v], sizeof cl->tiled.env[v], "%s", tune);
    }
    return CLATTN_OK;
}

/* GRAD_KVS and GRAD_QS only in the micro-tile layout: the rows layout
 * writes no dS. */
static int builds(const struct clattn_cl_state *cl, const kernel_set *set, uint32_t head_dim, int k)
{
    return (k != K_GRAD_KVS && k != K_GRAD_QS) ||
           tile_config_of(cl, head_dim, set->dtype, set->limit, k).per_item;
}

static void defines(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype, int k,
                    size_t limit, char *buf, size_t size)
{
    const tile_config t = tile_config_of(cl, head_dim, dtype, limit, k);
    clattn_ocl_append(buf, size, " -DROWS=%u -DTILE=%u -DSPLIT=%u -DDSPLIT=%u -DPER_ITEM=%u%s",
                      t.rows, t.tile, t.split, tile_dsplit(&t, head_dim), t.per_item,
                      t.one_kv ? " -DONE_KV=1" : "");
}

static size_t work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim)
{
    const tile_config c = tile_config_of(cl, head_dim, set->dtype, set->limit, k);
    return tile_items(&c, head_dim);
}

static size_t local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim)
{
    const tile_config c = tile_config_of(cl, head_dim, set->dtype, set->limit, k);
    return local_floats(&c, head_dim, k) * sizeof(float);
}

/* A block of ROWS rows a work-group; under a causal mask each work-group
 * takes a short and a long block, so that the work evens out. */
static size_t row_groups(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         const clattn_shape *s, size_t rows)
{
    const size_t per = tile_config_of(cl, s->head_dim, set->dtype, set->limit, k).rows;
    const size_t blocks = (rows + per - 1) / per;
    return s->causal ? (blocks + 1) / 2 : blocks;
}

static int parse_tuned(const char *name, const char *shape, tuned_entry *e, const char **why)
{
    if (!strcmp(name, "tiled"))
        e->pass = TILED_EVERY;
    else if (!strcmp(name, "tiled-forward"))
        e->pass = TILED_FORWARD;
    else if (!strcmp(name, "tiled-backward"))
        e->pass = TILED_BACKWARD;
    else
        return 0;
    e->tile.columns = CLATTN_MAX_HEAD_DIM;
    e->tile.per_item = 0;
    *why = parse_tiled(shape, &e->tile) ? NULL
                                        : "not a tiled shape (ROWS,TILE,SPLIT,COLUMNS,PER_ITEM)";
    return 1;
}

static void format_tuned(const tuned_entry *e, char *buf, size_t size)
{
    static const char *const passes[3] = {"tiled-forward", "tiled-backward", "tiled"};
    snprintf(buf, size, "%s %s head_dim %u: %u,%u,%u,%u,%u", passes[e->pass],
             clattn_ocl_dtype_name(e->dtype), e->head_dim, e->tile.rows, e->tile.tile, e->tile.split,
             e->tile.columns, e->tile.per_item);
}

/* clattn tune's search: "ROWS,TILE,SPLIT,COLUMNS,PER_ITEM". Stage 1 tries
 * rows and split at a middling tile (micro-tiles of 4 rows up to
 * micro_to, rows of 32 columns past it); stage 2 the tile and the rows a
 * work-item (micro-tiles) or columns (rows) around the winner. */
static void search_generate(int stage, const char *best, uint32_t head_dim, uint32_t micro_to,
                            clattn_dtype dtype, size_t max_wg, clattn_search_add add, void *sink)
{
    (void)dtype;
    unsigned b[5] = {0, 0, 0, 0, 0};
    if (stage == 2 && sscanf(best, "%u,%u,%u,%u,%u", &b[0], &b[1], &b[2], &b[3], &b[4]) != 5)
        return;
    static const unsigned rows[] = {16, 32, 64, 128}, splits[] = {1, 2, 4},
                          micro_splits[] = {4, 8, 16}, tiles[] = {16, 32, 64},
                          columns[] = {32, 64, 128, 256}, per_items[] = {1, 2, 4, 8};
    const int micro = stage == 1 ? head_dim <= micro_to : b[4] > 0;
    for (size_t i = 0; i < 12u; ++i) {
        unsigned v[5];
        if (stage == 1) {
            v[0] = rows[i / 3], v[1] = micro && head_dim > 64 ? 16 : 32;
            v[2] = micro ? micro_splits[i % 3] : splits[i % 3];
            v[3] = head_dim > 64 ? 32 : 64, v[4] = micro ? 4 : 0;
            if (micro && i >= 9u)
                break;
        } else {
            v[0] = b[0], v[1] = tiles[i / 4], v[2] = b[2];
            v[3] = micro ? b[3] : columns[i % 4], v[4] = micro ? per_items[i % 4] : 0;
            /* columns past head_dim are the same as head_dim's */
            if ((!micro && i % 4 && columns[i % 4 - 1] >= head_dim) || v[1] % v[2] ||
                (micro && v[0] % v[4]) || (v[1] == b[1] && v[3] == b[3] && v[4] == b[4]))
                continue;
        }
        const size_t items = micro ? (size_t)v[0] / v[4] * v[2]
                                   : (size_t)v[0] * v[2] * ((head_dim + v[3] - 1) / v[3]);
        char text[CLATTN_SEARCH_TEXT];
        snprintf(text, sizeof text, "%u,%u,%u,%u,%u", v[0], v[1], v[2], v[3], v[4]);
        if (items <= max_wg && !add(sink, text))
            return;
    }
}

/* A shape of four or five numbers; PER_ITEM left out is 0, the rows
 * layout, as in the tuning file. */
static int search_candidate(const char *text, char *out)
{
    unsigned v[5] = {0, 0, 0, 0, 0};
    char end;
    const int got = sscanf(text, "%u,%u,%u,%u,%u%c", &v[0], &v[1], &v[2], &v[3], &v[4], &end);
    if (got != 4 && got != 5)
        return 0;
    snprintf(out, CLATTN_SEARCH_TEXT, "%u,%u,%u,%u,%u", v[0], v[1], v[2], v[3], v[4]);
    return 1;
}

static const char *const search_clears[] = {"CLATTN_TILED", "CLATTN_TILED_BACKWARD", NULL};

/* Both ops' winner is the forward's and the backward's shape at once. */
static const clattn_ocl_search search = {
    .form = "ROWS,TILE,SPLIT,COLUMNS[,PER_ITEM]",
    .variable = {"CLATTN_TILED", "CLATTN_TILED", "CLATTN_TILED_BACKWARD"},
    .entry = {"tiled", "tiled-forward", "tiled-backward"},
    .clears = search_clears,
    .candidate = search_candidate,
    .generate = search_generate,
};

const clattn_ocl_variant clattn_ocl_variant_tiled = {
    .name = "tiled",
    .programmable = 1,
    .source = clattn_cl_tiled,
    .kernels =
        {
            [K_FORWARD] = {"forward__tiled", &clattn_ocl_variant_tiled},
            [K_DSUM] = {"dsum__tree", &clattn_ocl_variant_tree},
            [K_GRAD_Q] = {"grad_q__tiled", &clattn_ocl_variant_tiled},
            [K_GRAD_K] = {"grad_k__tiled", &clattn_ocl_variant_tiled},
            [K_GRAD_V] = {"grad_v__tiled", &clattn_ocl_variant_tiled},
            [K_GRAD_KV] = {"grad_kv__tiled", &clattn_ocl_variant_tiled},
            [K_GRAD_KVS] = {"grad_kvs__tiled", &clattn_ocl_variant_tiled},
            [K_GRAD_QS] = {"grad_qs__tiled", &clattn_ocl_variant_tiled},
        },
    .per_head_dim = 1,
    .fits_limit = 1,
    .setup = setup,
    .builds = builds,
    .defines = defines,
    .work_group = work_group,
    .local_bytes = local_bytes,
    .row_groups = row_groups,
    .tuned_names = "tiled, tiled-forward, tiled-backward",
    .parse_tuned = parse_tuned,
    .format_tuned = format_tuned,
    .search = &search,
};
