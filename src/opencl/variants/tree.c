/* The tree variant: cl/tree's kernels, a work-group per row whose
 * work-items each hold LANE_ELEMS elements of it and sum by local-memory
 * tree reduction (the seed's grad-V, and every op after it). One set of
 * kernels serves every head_dim; the other variants take its Dsum
 * pre-pass, and merge runs on it. */
#include "clattn_kernels.h"
#include "variant.h"

/* A work-group for a head_dim: the next power of two, at most the largest
 * power of two within `limit`. */
static size_t tree_work_group(uint32_t head_dim, size_t limit)
{
    size_t wg = 1;
    while (wg < head_dim && wg * 2 <= limit)
        wg <<= 1;
    return wg;
}

/* The elements of a row each work-item holds, for the largest head_dim
 * the set serves; grad_bias__tree's columns a chunk. */
static void defines(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype, int k,
                    size_t limit, char *buf, size_t size)
{
    (void)cl, (void)dtype, (void)k;
    const uint32_t largest = head_dim ? head_dim : CLATTN_MAX_HEAD_DIM;
    const size_t wg = tree_work_group(largest, limit);
    clattn_ocl_append(buf, size, " -DLANE_ELEMS=%u -DBIAS_CHUNK=%uu",
                      (unsigned)((largest + wg - 1) / wg), (unsigned)BIAS_CHUNK);
}

/* grad_bias__tree's side: a square work-group of rows by keys, 16 by 16
 * where the limit allows. */
static size_t bias_side(size_t limit)
{
    size_t side = 16;
    while (side > 1 && side * side > limit)
        side >>= 1;
    return side;
}

static size_t work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim)
{
    (void)cl;
    if (k == K_GRAD_BIAS || k == K_GRAD_PARAMS)
        return bias_side(set->limit) * bias_side(set->limit);
    return tree_work_group(head_dim, set->limit);
}

/* local_per_lane floats a work-item (kernel_desc.c); grad_bias__tree's
 * four tiles of the side's rows of BIAS_ROW floats
 * (grad_score_params__tree's table and terms come on top: pairs.c). */
static size_t local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim)
{
    (void)cl;
    if (k == K_GRAD_BIAS || k == K_GRAD_PARAMS)
        return 4 * BIAS_ROW * bias_side(set->limit) * sizeof(float) + BIAS_ALIGN;
    return tree_work_group(head_dim, set->limit) * sizeof(float) *
           (size_t)clattn_ocl_kernel_descs[k].local_per_lane;
}

/* grad_score_params__tree is in the programs built with the caller's
 * clattn_score_dp alone. */
static int builds(const struct clattn_cl_state *cl, const kernel_set *set, uint32_t head_dim,
                  int k)
{
    (void)cl, (void)head_dim;
    return k != K_GRAD_PARAMS || (set->mods & CLATTN_MOD_SCORE_DP);
}

static size_t row_groups(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         const clattn_shape *s, size_t rows)
{
    (void)cl, (void)set, (void)k, (void)s;
    return rows;
}

const clattn_ocl_variant clattn_ocl_variant_tree = {
    .name = "tree",
    .programmable = 1,
    .source = clattn_cl_tree,
    .kernels =
        {
            [K_FORWARD] = {"forward__tree", &clattn_ocl_variant_tree},
            [K_DSUM] = {"dsum__tree", &clattn_ocl_variant_tree},
            [K_GRAD_Q] = {"grad_q__tree", &clattn_ocl_variant_tree},
            [K_GRAD_K] = {"grad_k__tree", &clattn_ocl_variant_tree},
            [K_GRAD_V] = {"grad_v__tree", &clattn_ocl_variant_tree},
            [K_GRAD_KV] = {"grad_kv__tree", &clattn_ocl_variant_tree},
            [K_GRAD_BIAS] = {"grad_bias__tree", &clattn_ocl_variant_tree},
            [K_GRAD_PARAMS] = {"grad_score_params__tree", &clattn_ocl_variant_tree},
        },
    .per_head_dim = 0,
    .fits_limit = 1,
    .lenient_limits = 1,
    .defines = defines,
    .work_group = work_group,
    .local_bytes = local_bytes,
    .row_groups = row_groups,
    .builds = builds,
};
