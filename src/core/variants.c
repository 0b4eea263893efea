/* The variants each backend offers, from the registry (variants.inc), in
 * the order clattn_variant_name() lists them. */
#include <string.h>

#include "internal.h"

static const char *const cl_variant_lines[] = {
#define CLATTN_CL_VARIANT(name) #name,
#include "variants.inc"
#undef CLATTN_CL_VARIANT
};
enum { CL_VARIANT_LINES = sizeof cl_variant_lines / sizeof cl_variant_lines[0] };

const char *clattn_variant_name(clattn_backend backend, size_t index)
{
    if (backend == CLATTN_BACKEND_NATIVE)
        return index == 0 ? "blocked" : NULL;
    if (backend != CLATTN_BACKEND_OPENCL_GPU && backend != CLATTN_BACKEND_OPENCL_CPU)
        return NULL;
    /* A CPU device's default is blocked (one work-item per block, no
     * barriers: what PoCL runs fastest); a GPU's the first listed. */
    const char *first = backend == CLATTN_BACKEND_OPENCL_CPU ? "blocked" : cl_variant_lines[0];
    if (index == 0)
        return first;
    for (size_t i = 0; i < CL_VARIANT_LINES; ++i)
        if (strcmp(cl_variant_lines[i], first) && --index == 0)
            return cl_variant_lines[i];
    return NULL;
}

int clattn_known_variant(const char *name)
{
    const clattn_backend kinds[2] = {CLATTN_BACKEND_NATIVE, CLATTN_BACKEND_OPENCL_GPU};
    for (int k = 0; k < 2; ++k)
        for (size_t i = 0; clattn_variant_name(kinds[k], i); ++i)
            if (!strcmp(name, clattn_variant_name(kinds[k], i)))
                return 1;
    return 0;
}
