/* Links clattn (statically or not), runs grad-V once and checks the answer: with
 * Q = K = 0 and dO = 1 every visible key has p = 1 / (pos + 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <clattn.h>

int main(void)
{
    if (strcmp(clattn_version(), CLATTN_VERSION) != 0) {
        fprintf(stderr, "header %s, library %s\n", CLATTN_VERSION, clattn_version());
        return 1;
    }
    clattn_context *ctx;
    clattn_status st = clattn_context_create(NULL, &ctx);
    if (st != CLATTN_OK) {
        fprintf(stderr, "%s: %s\n", clattn_status_string(st), clattn_last_error());
        return 1;
    }
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 16;
    s.num_heads = 2;
    s.num_kv_heads = 1;
    s.head_dim = 8;
    s.causal = 1;
    float q[16 * 2 * 8] = {0}, k[16 * 8] = {0}, d_out[16 * 2 * 8], lse[16 * 2 * 2], dv[16 * 8];
    for (int i = 0; i < 16 * 2 * 8; ++i)
        d_out[i] = 1.0f;
    for (int pos = 0; pos < 16; ++pos)
        for (int h = 0; h < 2; ++h) {
            lse[(pos * 2 + h) * 2] = 0.0f;
            lse[(pos * 2 + h) * 2 + 1] = logf((float)pos + 1.0f);
        }
    st = clattn_grad_v(ctx, &s, d_out, q, k, lse, dv);
    int bad = st != CLATTN_OK;
    for (int t = 0; t < 16 && !bad; ++t) {
        double want = 0.0;
        for (int pos = t; pos < 16; ++pos)
            want += 2.0 / (pos + 1);
        bad = fabs(dv[t * 8] - want) > 1e-5 * want;
    }
    printf("consumer on %s: %s\n", clattn_context_device(ctx), bad ? "WRONG" : "ok");
    clattn_context_destroy(ctx);
    return bad;
}
