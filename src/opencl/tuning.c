/* The tuning state every variant shares: each variant's setup when a
 * context is made, the program cache's and the dS scratch's bounds, and
 * where dBias runs.
 * The tuning file is tuning_file.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_cache.h"
#include "variant.h"

clattn_status clattn_ocl_tuning_init(struct clattn_cl_state *cl, cl_device_id device,
                                     int items_loop)
{
    for (size_t i = 0; clattn_ocl_variants[i]; ++i) {
        const clattn_ocl_variant *v = clattn_ocl_variants[i];
        const clattn_status st = v->setup ? v->setup(cl, device, items_loop) : CLATTN_OK;
        if (st != CLATTN_OK)
            return st;
    }
    uint64_t bound;
    if (!clattn_cache_bound(&bound))
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_CACHE_MAX_MB='%s': want the program cache's bound as a whole "
                           "number of MiB (0: no bound)",
                           getenv("CLATTN_CACHE_MAX_MB"));
    /* CLATTN_DS_MAX_MB: the dS scratch's bound (launch.c's ds_chunk) */
    const char *ds = getenv("CLATTN_DS_MAX_MB");
    cl->ds.max = DS_DEFAULT;
    if (ds) {
        char *end;
        errno = 0;
        const unsigned long long mb = strtoull(ds, &end, 10);
        if (!*ds || *end || errno || ds[0] == '-' || mb >= 1ull << 40)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_DS_MAX_MB='%s': want the backward's dS scratch bound as a "
                               "whole number of MiB (0: none)",
                               ds);
        cl->ds.max = (size_t)(mb << 20);
    }
    /* CLATTN_GRAD_BIAS: where dBias and the score parameters' gradient run
     * (pairs.c) */
    const char *on = getenv("CLATTN_GRAD_BIAS");
    static const char *const places[3] = {"auto", "device", "host"}; /* GRAD_BIAS_*'s order */
    cl->grad_bias_on = on ? -1 : GRAD_BIAS_AUTO;
    for (int i = 0; on && i < 3; ++i)
        if (!strcmp(on, places[i]))
            cl->grad_bias_on = i;
    if (cl->grad_bias_on < 0)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_GRAD_BIAS='%s': want auto, device or host (where the bias's "
                           "and the score parameters' gradients run)",
                           on);
    return CLATTN_OK;
}
