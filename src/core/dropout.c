/* The dropout mask as clattn_dropout_mask() writes it out. */
#include "internal.h"
#include "philox.h"

clattn_status clattn_dropout_mask(const clattn_shape *shape, uint32_t b, uint32_t head,
                                  uint8_t *keep)
{
    clattn_clear_error();
    clattn_status st = clattn_check_shape(shape, NULL);
    if (st != CLATTN_OK)
        return st;
    if (!keep)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "keep is NULL");
    if (b >= shape->batch || head >= shape->num_heads)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "element %u, head %u: the shape has %u and %u", b, head,
                           shape->batch, shape->num_heads);
    const clattn_shape one = clattn_packed(shape) ? clattn_sequence_shape(shape, b) : *shape;
    const clattn_dropout d =
        clattn_dropout_of(one.dropout_p, one.dropout_seed, one.dropout_offset);
    const int64_t delta = clattn_mask_delta(&one);
    for (uint32_t pos = 0; pos < one.q_seq; ++pos)
        for (uint32_t t = 0; t < one.kv_seq; ++t)
            keep[(size_t)pos * one.kv_seq + t] =
                one.dropout_p > 0.0f
                    ? (uint8_t)clattn_dropout_keeps(&d, b, head,
                                                    clattn_query_position(&one, pos, delta),
                                                    one.kv_offset + t)
                    : 1u;
    return CLATTN_OK;
}
