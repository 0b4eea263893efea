/* The registry of OpenCL variants: one line each in src/core/variants.inc. */
#include <string.h>

#include "variant.h"

const clattn_ocl_variant *const clattn_ocl_variants[] = {
#define CLATTN_CL_VARIANT(name) &clattn_ocl_variant_##name,
#include "variants.inc"
#undef CLATTN_CL_VARIANT
    NULL,
};

const clattn_ocl_variant *clattn_ocl_find_variant(const char *name)
{
    for (size_t i = 0; clattn_ocl_variants[i]; ++i)
        if (!strcmp(name, clattn_ocl_variants[i]->name))
            return clattn_ocl_variants[i];
    return NULL;
}

const clattn_ocl_variant *clattn_ocl_generic_variant(void)
{
    for (size_t i = 0; clattn_ocl_variants[i]; ++i)
        if (!clattn_ocl_variants[i]->per_head_dim)
            return clattn_ocl_variants[i];
    return NULL;
}
