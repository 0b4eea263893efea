/* The small helpers the variant files share with the rest of the
 * backend; they call nothing of it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "variant.h"

const tuned_entry *clattn_ocl_tuned(const struct clattn_cl_state *cl, const clattn_ocl_variant *v,
                                    clattn_dtype dtype, uint32_t head_dim, int pass)
{
    for (size_t i = 0; i < cl->tuned.count; ++i)
        if (cl->tuned.entries[i].variant == v && cl->tuned.entries[i].dtype == dtype &&
            cl->tuned.entries[i].head_dim == head_dim && cl->tuned.entries[i].pass == pass)
            return &cl->tuned.entries[i];
    return NULL;
}

const char *clattn_ocl_dtype_name(clattn_dtype dtype)
{
    static const char *const names[3] = {"f32", "f16", "bf16"};
    return (unsigned)dtype < 3 ? names[dtype] : "?";
}

void clattn_ocl_append(char *buf, size_t size, const char *format, ...)
{
    const size_t used = strlen(buf);
    if (used + 1 >= size)
        return;
    va_list ap;
    va_start(ap, format);
    vsnprintf(buf + used, size - used, format, ap);
    va_end(ap);
}
