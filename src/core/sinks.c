/* Learnable sinks' gradient: d sigma_h = -sum over the head's rows of
 * exp(sigma_h - L) (dO . O), on the host for every backend. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

clattn_status clattn_grad_sinks(clattn_context *ctx, const clattn_shape *shape, const void *o,
                                const float *lse, const void *d_out, float *d_sinks)
{
    clattn_sizes sz;
    clattn_status st = clattn_call_begin(ctx, shape, &sz);
    if (st != CLATTN_OK)
        return st;
    const void *const ptrs[4] = {o, lse, d_out, d_sinks};
    static const char *const names[4] = {"o", "lse", "d_out", "d_sinks"};
    for (int i = 0; i < 4; ++i)
        if (!ptrs[i])
            return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", names[i]);
    if (!shape->sinks)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER,
                           "shape->sinks is NULL: the sinks' gradient needs the sinks");
    const size_t heads = shape->num_heads, n = shape->head_dim, rows = sz.lse / 2;
    const size_t elem = shape->dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2u;
    const size_t out_bytes = heads * sizeof(float);
    if (clattn_overlaps(d_sinks, out_bytes, o, sz.q * elem) ||
        clattn_overlaps(d_sinks, out_bytes, lse, sz.lse * sizeof(float)) ||
        clattn_overlaps(d_sinks, out_bytes, d_out, sz.q * elem) ||
        clattn_overlaps(d_sinks, out_bytes, shape->sinks, out_bytes))
        return clattn_fail(CLATTN_ERROR_INVALID_BUFFER,
                           "d_sinks overlaps another tensor of the call: an output may share "
                           "no memory with another tensor of the call");
    double *sum = calloc(heads, sizeof *sum);
    if (!sum)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory for %zu heads", heads);
    float a[CLATTN_MAX_HEAD_DIM], g[CLATTN_MAX_HEAD_DIM];
    const float empty = -1e30f;
    for (size_t r = 0; r < rows; ++r) {
        const float *pair = lse + 2 * r;
        if (pair[0] == empty && pair[1] == empty) /* a row no problem wrote */
            continue;
        const size_t h = r % heads;
        clattn_to_f32(shape->dtype, (const char *)o + r * n * elem, a, n);
        clattn_to_f32(shape->dtype, (const char *)d_out + r * n * elem, g, n);
        double dot = 0.0;
        for (size_t d = 0; d < n; ++d)
            dot += (double)a[d] * g[d];
        sum[h] += exp((double)shape->sinks[h] - ((double)pair[0] + pair[1])) * dot;
    }
    for (size_t h = 0; h < heads; ++h)
        d_sinks[h] = (shape->accumulate ? d_sinks[h] : 0.0f) - (float)sum[h];
    free(sum);
    return CLATTN_OK;
}
