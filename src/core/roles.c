/* What each op reads and writes, and the tensors' roles. */
#include "internal.h"

#define B CLATTN_BIT
#define FORWARD_STATE (B(CLATTN_R_Q) | B(CLATTN_R_K) | B(CLATTN_R_V) | B(CLATTN_R_O) | \
                       B(CLATTN_R_LSE) | B(CLATTN_R_DO))
const unsigned clattn_op_reads[CLATTN_OP_COUNT] = {
    [CLATTN_OP_FORWARD] = B(CLATTN_R_Q) | B(CLATTN_R_K) | B(CLATTN_R_V),
    [CLATTN_OP_GRAD_V] = B(CLATTN_R_DO) | B(CLATTN_R_Q) | B(CLATTN_R_K) | B(CLATTN_R_LSE),
    [CLATTN_OP_GRAD_Q] = FORWARD_STATE,
    [CLATTN_OP_GRAD_K] = FORWARD_STATE,
    [CLATTN_OP_BACKWARD] = FORWARD_STATE,
};
const unsigned clattn_op_writes[CLATTN_OP_COUNT] = {
    [CLATTN_OP_FORWARD] = B(CLATTN_R_O) | B(CLATTN_R_LSE),
    [CLATTN_OP_GRAD_V] = B(CLATTN_R_DV),
    [CLATTN_OP_GRAD_Q] = B(CLATTN_R_DQ),
    [CLATTN_OP_GRAD_K] = B(CLATTN_R_DK),
    [CLATTN_OP_BACKWARD] = B(CLATTN_R_DQ) | B(CLATTN_R_DK) | B(CLATTN_R_DV),
};
#undef FORWARD_STATE

unsigned clattn_call_reads(clattn_op op, const clattn_shape *s)
{
    const unsigned grads = B(CLATTN_R_DQ) | B(CLATTN_R_DK) | B(CLATTN_R_DV);
    return clattn_op_reads[op] | (s->accumulate ? clattn_op_writes[op] & grads : 0u);
}
#undef B

const char *clattn_role_name(clattn_role r)
{
    static const char *const names[CLATTN_R_COUNT] = {"q", "k", "v", "o", "lse",
                                                      "d_out", "dq", "dk", "dv"};
    return (unsigned)r < CLATTN_R_COUNT ? names[r] : "?";
}

size_t clattn_role_bytes(int r, clattn_dtype dtype)
{
    return r == CLATTN_R_LSE || dtype == CLATTN_DTYPE_F32 ? sizeof(float) : 2u;
}

size_t clattn_role_elems(const clattn_sizes *sz, clattn_role r)
{
    switch (r) {
    case CLATTN_R_K:
    case CLATTN_R_V:
    case CLATTN_R_DK:
    case CLATTN_R_DV:
        return sz->kv;
    case CLATTN_R_LSE:
        return sz->lse;
    default:
        return sz->q;
    }
}
