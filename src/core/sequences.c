/* Packed sequences: each one's shape and rows, and what rows no sequence
 * covers get. */
#include "internal.h"

clattn_shape clattn_sequence_shape(const clattn_shape *s, uint32_t i)
{
    clattn_shape one = *s;
    one.batch = 1;
    one.q_seq = s->cu_seqlens_q[i + 1] - s->cu_seqlens_q[i];
    one.kv_seq = s->cu_seqlens_kv[i + 1] - s->cu_seqlens_kv[i];
    one.cu_seqlens_q = one.cu_seqlens_kv = NULL;
    return one;
}

/* Whether role r's rows are keys (K, V, dK, dV), and its elements per row. */
static int role_kv(int r)
{
    return r == CLATTN_R_K || r == CLATTN_R_V || r == CLATTN_R_DK || r == CLATTN_R_DV;
}

static size_t role_row(const clattn_shape *s, int r)
{
    return r == CLATTN_R_LSE ? 2u * s->num_heads
           : role_kv(r)      ? (size_t)s->num_kv_heads * s->head_dim
                             : (size_t)s->num_heads * s->head_dim;
}

size_t clattn_sequence_offset(const clattn_shape *s, int r, uint32_t i)
{
    return (size_t)(role_kv(r) ? s->cu_seqlens_kv[i] : s->cu_seqlens_q[i]) * role_row(s, r);
}

int clattn_fill_unseen(const clattn_shape *s, clattn_op op,
                       int (*fill)(void *arg, int role, size_t first, size_t count, float value),
                       void *arg)
{
    /* what the call overwrites: not the gradients it adds into */
    const unsigned writes = clattn_op_writes[op] & ~clattn_call_reads(op, s);
    for (int r = 0; r < CLATTN_R_COUNT; ++r) {
        if (!(writes & CLATTN_BIT(r)))
            continue;
        const int kv = role_kv(r);
        const uint32_t *mine = kv ? s->cu_seqlens_kv : s->cu_seqlens_q;
        const uint32_t *other = kv ? s->cu_seqlens_q : s->cu_seqlens_kv;
        const size_t per = role_row(s, r);
        /* piece i < batch: sequence i's rows where its other side is empty;
         * piece batch: the rows past the last prefix sum */
        for (uint32_t i = 0; i <= s->batch; ++i) {
            const uint32_t start = mine[i];
            const uint32_t end = i == s->batch           ? (kv ? s->kv_seq : s->q_seq)
                                 : other[i + 1] == other[i] ? mine[i + 1]
                                                            : start;
            const int rc = end > start ? fill(arg, r, start * per, (size_t)(end - start) * per,
                                              r == CLATTN_R_LSE ? -1e30f : 0.0f)
                                       : 0;
            if (rc)
                return rc;
        }
    }
    return 0;
}

uint32_t clattn_longest_sequence(const clattn_shape *s)
{
    uint32_t first = 0;
    uint64_t most = 0;
    for (uint32_t i = 0; i < s->batch; ++i) {
        const uint64_t w = (uint64_t)(s->cu_seqlens_q[i + 1] - s->cu_seqlens_q[i]) *
                           (s->cu_seqlens_kv[i + 1] - s->cu_seqlens_kv[i]);
        if (w > most) {
            most = w;
            first = i;
        }
    }
    return first;
}
