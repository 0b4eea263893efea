/* libFuzzer target: shape validation, the seed block's conversion, the pair
 * count, and, for shapes small enough, every op on the native backend with
 * inputs of exactly the shape's size (so ASan sees any access past them). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static clattn_context *native;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t w[10] = {0};
    memcpy(w, data, size < sizeof w ? size : sizeof w);
    clattn_shape s;
    clattn_shape_from_seed(w, &s);
    s = clattn_shape_default();
    s.batch = w[0] % 4;
    s.q_seq = w[1];
    s.kv_seq = w[2];
    s.num_heads = w[3];
    s.num_kv_heads = w[4];
    s.head_dim = w[5];
    s.causal = (int)(w[6] & 1);
    s.window = w[7];
    memcpy(&s.scale, &w[8], sizeof s.scale);
    s.q_offset = w[9] & 0xffffu;
    s.kv_offset = w[9] >> 16;
    s.accumulate = (int)(w[6] >> 1 & 1); /* the outputs start zeroed */
    if (clattn_shape_validate(&s) != CLATTN_OK)
        return 0;
    /* Small shapes only: the fuzzer wants many runs, not big ones. */
    s.q_seq %= 40;
    s.kv_seq = s.causal && !s.q_offset && !s.kv_offset ? s.q_seq : s.kv_seq % 40;
    s.num_heads %= 9;
    s.head_dim %= 40;
    if (clattn_shape_validate(&s) != CLATTN_OK)
        return 0;
    clattn_shape_visible_pairs(&s);
    if (!native) {
        clattn_options o = clattn_options_default();
        o.backend = CLATTN_BACKEND_NATIVE;
        o.num_threads = 2;
        if (clattn_context_create(&o, &native) != CLATTN_OK)
            abort();
    }
    const size_t nq = (size_t)s.batch * s.q_seq * s.num_heads * s.head_dim;
    const size_t nkv = (size_t)s.batch * s.kv_seq * s.num_kv_heads * s.head_dim;
    const size_t nl = (size_t)s.batch * s.q_seq * s.num_heads * 2;
    float *q = calloc(nq, 4), *o = calloc(nq, 4), *d = calloc(nq, 4), *dq = calloc(nq, 4);
    float *k = calloc(nkv, 4), *v = calloc(nkv, 4), *dk = calloc(nkv, 4), *dv = calloc(nkv, 4);
    float *lse = calloc(nl, 4);
    for (size_t i = 0; i < nq; ++i)
        q[i] = d[i] = (float)((i * 7919u) % 13u) / 13.0f - 0.5f;
    for (size_t i = 0; i < nkv; ++i)
        k[i] = v[i] = (float)((i * 104729u) % 17u) / 17.0f - 0.5f;
    if (clattn_forward(native, &s, q, k, v, o, lse) != CLATTN_OK ||
        clattn_backward(native, &s, q, k, v, o, lse, d, dq, dk, dv) != CLATTN_OK ||
        clattn_grad_v(native, &s, d, q, k, lse, dv) != CLATTN_OK)
        abort(); /* a valid shape must run */
    free(q), free(o), free(d), free(dq), free(k), free(v), free(dk), free(dv), free(lse);
    return 0;
}
