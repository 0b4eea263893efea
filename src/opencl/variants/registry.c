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

const clattn_ocl_search *clattn_ocl_search_of(const char *name)
{
    const clattn_ocl_variant *v = name ? clattn_ocl_find_variant(name) : NULL;
    return v ? v->search : NULL;
}

void clattn_ocl_searchable(char *names, size_t size)
{
    const char *sep = "";
    names[0] = '\0';
    for (size_t i = 0; clattn_ocl_variants[i]; ++i)
        if (clattn_ocl_variants[i]->search) {
            clattn_ocl_append(names, size, "%s%s", sep, clattn_ocl_variants[i]->name);
            sep = " or ";
        }
}

const char *clattn_ocl_search_variable(size_t i)
{
    for (size_t v = 0; clattn_ocl_variants[v]; ++v) {
        const clattn_ocl_search *s = clattn_ocl_variants[v]->search;
        for (size_t j = 0; s && s->clears[j]; ++j)
            if (i-- == 0)
                return s->clears[j];
    }
    return NULL;
}
