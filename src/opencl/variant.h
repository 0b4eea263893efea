/* One OpenCL variant: a family of kernels with its own source, shapes,
 * sizing and tuning. Each variant is one file of src/opencl/variants/ that
 * defines one `clattn_ocl_variant`, listed once in src/core/variants.inc;
 * the rest of the backend asks these operations and knows no variant by
 * name. docs/architecture.md ("Adding a variant") says how to write one.
 *
 * A variant's kernel may come from another variant's source (mma's Dsum
 * pre-pass is tree's): the kernel's `family` is the variant whose source,
 * defines, grid and footprint it takes. Operations marked (family) are
 * asked of a kernel's family; the others of the context's variant. NULL
 * operations take the default each one states. */
#ifndef CLATTN_OPENCL_VARIANT_H
#define CLATTN_OPENCL_VARIANT_H

#include "opencl.h"
#include "search.h"

typedef struct clattn_ocl_variant clattn_ocl_variant;

typedef struct clattn_ocl_kernel {
    const char *function;             /* NULL: the variant has no such kernel */
    const clattn_ocl_variant *family; /* whose source and shapes it takes */
} clattn_ocl_kernel;

struct clattn_ocl_variant {
    const char *name;
    const char *source; /* the embedded program (clattn_kernels.h) */
    /* Every kernel slot (opencl.h's K_*): FORWARD, DSUM, GRAD_Q, GRAD_K and
     * GRAD_V are required; the others are built where the variant has
     * them and `builds` agrees. Most stand in for some of the required
     * ones in the backward: GRAD_KV (dK and dV fused) for GRAD_K with
     * GRAD_V; GRAD_KVQ with FINISH_DQ (one pass) for GRAD_KV with GRAD_Q;
     * GRAD_KVS with GRAD_QS (dQ from a dS scratch) for GRAD_KV with
     * GRAD_Q. GRAD_BIAS, the generic variant's, gives clattn_grad_bias()
     * on the device. Names say what is computed, then how. */
    clattn_ocl_kernel kernels[K_COUNT];
    /* 1: built per head_dim, on first use; 0: one set of kernels serves
     * every head_dim, built with the context. */
    int per_head_dim;
    /* 1 (family): the shapes fit the work-group limit they are given, so
     * that a kernel allowing fewer work-items is built again under that;
     * 0: a kernel short of its work-group is refused. */
    int fits_limit;
    /* 1 (family): a kernel past the device's limits is refused only when
     * the caller asks for strict limits (launches check again). */
    int lenient_limits;
    /* 1: its kernels compile the caller's score and mask functions
     * (docs/programmable.md); a call with them that would run another
     * variant runs tiled (or the generic one where tiled does not run). */
    int programmable;

    /* Whether the device can run the variant (NULL: any). */
    int (*runs_on)(cl_device_id device);
    /* Why it cannot, for the error (with runs_on). */
    const char *why_not;
    /* Called for every registered variant when a context is made: reads
     * the device's facts and the variable overrides into cl. `items_loop`:
     * the device runs a work-group's items as a loop (PoCL's CPU device). */
    clattn_status (*setup)(struct clattn_cl_state *cl, cl_device_id device, int items_loop);
    /* The variant that serves a head_dim and dtype in this one's place
     * (NULL: this one always). */
    const clattn_ocl_variant *(*serving)(uint32_t head_dim, clattn_dtype dtype);
    /* Whether an optional kernel k (one of the stand-ins) is built into
     * set, whose kernels before k are known (NULL: every kernel listed).
     * Asked of the variant, then of the kernel's family. */
    int (*builds)(const struct clattn_cl_state *cl, const kernel_set *set, uint32_t head_dim,
                  int k);
    /* (family) A shape the kernel cannot be built with, refused (NULL: none). */
    clattn_status (*check)(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype,
                           int k);
    /* (family) Appends kernel k's defines for a head_dim (0: any) to buf,
     * for work-groups of at most `limit`. */
    void (*defines)(const struct clattn_cl_state *cl, uint32_t head_dim, clattn_dtype dtype, int k,
                    size_t limit, char *buf, size_t size);
    /* (family) Work-items of kernel k's work-group. */
    size_t (*work_group)(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         uint32_t head_dim);
    /* (family) Bytes of kernel k's local buffer argument. */
    size_t (*local_bytes)(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                          uint32_t head_dim);
    /* (family) Work-groups along the rows for `rows` rows of a call. */
    size_t (*row_groups)(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                         const clattn_shape *s, size_t rows);
    /* (family) The parts the key side's kernel k (GRAD_KV or GRAD_KVS)
     * splits its steps over for a call (NULL or 1: none), where the set
     * has SUM_PARTS to add them up. */
    size_t (*key_parts)(const struct clattn_cl_state *cl, const kernel_set *set, int k,
                        const clattn_shape *s);

    /* The tuning file (docs/tuning.md). The entry names this variant
     * takes, for messages ("tiled, tiled-forward"), or NULL: none. */
    const char *tuned_names;
    /* Parses an entry whose variant field is `name` and shape `shape` into
     * *e: 0 where the name is not this variant's, else 1 with *why NULL or
     * the reason the entry is malformed. */
    int (*parse_tuned)(const char *name, const char *shape, tuned_entry *e, const char **why);
    /* Whether an entry's kernels fit the device (NULL: they do). */
    int (*tuned_fits)(const struct clattn_cl_state *cl, const tuned_entry *e);
    /* An entry as "NAME DTYPE head_dim D: SHAPE" for the log. */
    void (*format_tuned)(const tuned_entry *e, char *buf, size_t size);
    /* What `clattn tune` searches (search.h), or NULL: not tuned. */
    const clattn_ocl_search *search;
};

/* Each variant's operations, defined in its file. */
#define CLATTN_CL_VARIANT(name) extern const clattn_ocl_variant clattn_ocl_variant_##name;
#include "variants.inc"
#undef CLATTN_CL_VARIANT

/* The registry (variants/registry.c): every variant of variants.inc, in
 * its order, then NULL. */
extern const clattn_ocl_variant *const clattn_ocl_variants[];
/* The variant named `name`, or NULL. */
const clattn_ocl_variant *clattn_ocl_find_variant(const char *name);
/* The variant whose kernels serve every head_dim, which the others fall
 * back on and merge runs on (tree). */
const clattn_ocl_variant *clattn_ocl_generic_variant(void);

/* variants/support.c: the tuning file's entry of a variant, dtype, head_dim and pass,
 * or NULL. */
const tuned_entry *clattn_ocl_tuned(const struct clattn_cl_state *cl, const clattn_ocl_variant *v,
                                    clattn_dtype dtype, uint32_t head_dim, int pass);
/* "f32", "f16" or "bf16", as the tuning file writes them. */
const char *clattn_ocl_dtype_name(clattn_dtype dtype);
/* Appends printf-formatted text to buf, holding `size` bytes. */
void clattn_ocl_append(char *buf, size_t size, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Kernel k's work-group and local buffer, as its family sizes them. */
static inline size_t clattn_ocl_work_group(const struct clattn_cl_state *cl, const kernel_set *set,
                                           int k, uint32_t head_dim)
{
    return set->family[k]->work_group(cl, set, k, head_dim);
}
static inline size_t clattn_ocl_local_bytes(const struct clattn_cl_state *cl, const kernel_set *set,
                                            int k, uint32_t head_dim)
{
    return set->family[k]->local_bytes(cl, set, k, head_dim);
}

#endif
