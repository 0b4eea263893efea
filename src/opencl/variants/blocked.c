/* The blocked variant: cl/blocked/'s kernels, a single work-item per block
 * of BLOCKED_ROWS rows with no barriers: what PoCL runs fastest on a CPU,
 * where it is the default. */
#include "clattn_kernels.h"
#include "variant.h"

enum { BLOCKED_ROWS = 32 }; /* cl/blocked/'s KK keys and QB query rows */

/* Whether cl/blocked/'s products may keep 16 vectors of 16 floats: the
 * device says its vectors are 16 floats, or (PoCL runs on this CPU) this
 * CPU has AVX-512, whatever width LLVM prefers to report for it. */
static int wide_vectors(const struct clattn_cl_state *cl)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f"))
        return 1;
#endif
    return cl->limits.float_width >= 16;
}

/* Its products hold 16 vectors of 16 floats: as 32 registers of 8 floats
 * they spill, so such devices (AVX2) get four of them (NARROW). */
static void defines(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype, int k,
                    size_t limit, char *buf, size_t size)
{
    (void)head_dim, (void)dtype, (void)k, (void)limit;
    if (!wide_vectors(cl))
        clattn_ocl_append(buf, size, " -DNARROW=1");
}

static size_t work_group(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim)
{
    (void)cl, (void)set, (void)k, (void)head_dim;
    return 1;
}

static size_t local_bytes(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim)
{
    (void)cl, (void)set, (void)k, (void)head_dim;
    return sizeof(float); /* unused, but an argument wants a size */
}

static size_t row_groups(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         const clattn_shape *s, size_t rows)
{
    (void)cl, (void)set, (void)k, (void)s;
    return (rows + BLOCKED_ROWS - 1) / BLOCKED_ROWS;
}

const clattn_ocl_variant clattn_ocl_variant_blocked = {
    .name = "blocked",
    .programmable = 1,
    .source = clattn_cl_blocked,
    .kernels =
        {
            [K_FORWARD] = {"forward__blocked", &clattn_ocl_variant_blocked},
            [K_DSUM] = {"dsum__blocked", &clattn_ocl_variant_blocked},
            [K_GRAD_Q] = {"grad_q__blocked", &clattn_ocl_variant_blocked},
            [K_GRAD_K] = {"grad_k__blocked", &clattn_ocl_variant_blocked},
            [K_GRAD_V] = {"grad_v__blocked", &clattn_ocl_variant_blocked},
            [K_GRAD_KV] = {"grad_kv__blocked", &clattn_ocl_variant_blocked},
        },
    .per_head_dim = 1,
    .defines = defines,
    .work_group = work_group,
    .local_bytes = local_bytes,
    .row_groups = row_groups,
};
