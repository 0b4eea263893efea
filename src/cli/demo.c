/* clattn demo: grad-V of an embedded layer on the chosen device, checked
 * against native. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clattn.h"
#include "npy.h"

#include "cli.h"


int cmd_demo(int argc, char **argv)
{
    const char *cmd = "demo";
    if (wants_help(argc, argv)) {
        printf("usage: clattn demo [--device SEL] [--variant NAME]\n"
               "Runs grad-V on an embedded causal layer (q_seq 512, 9 heads, 3 KV heads,\n"
               "head_dim 64) on the device auto picks, checks it against the native\n"
               "backend and prints the device, the time, GFLOP/s and the error.\n");
        return 0;
    }
    const char *device = NULL, *variant = NULL;
    opt opts[] = {{"--device", OPT_STRING, &device, 0, 0},
                  {"--variant", OPT_STRING, &variant, 0, 0}};
    if (!parse_opts(cmd, argc, argv, opts, 2))
        return EXIT_INPUT;
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 512;
    s.num_heads = 9;
    s.num_kv_heads = 3;
    s.head_dim = 64;
    s.causal = 1;
    const size_t nq = (size_t)s.q_seq * s.num_heads * s.head_dim;
    const size_t nkv = (size_t)s.kv_seq * s.num_kv_heads * s.head_dim;
    float *q = malloc(nq * 4), *d_out = malloc(nq * 4), *k = malloc(nkv * 4);
    float *lse = malloc((size_t)s.q_seq * s.num_heads * 2 * 4);
    float *dv = malloc(nkv * 4), *dv_native = malloc(nkv * 4), *o = malloc(nq * 4);
    clattn_context *ctx = NULL, *native = NULL;
    int rc = EXIT_DEVICE;
    if (!q || !d_out || !k || !lse || !dv || !dv_native || !o) {
        fprintf(stderr, "clattn demo: out of memory\n");
        goto done;
    }
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < nq; ++i) {
        q[i] = next_uniform(&state);
        d_out[i] = next_uniform(&state);
    }
    for (size_t i = 0; i < nkv; ++i)
        k[i] = next_uniform(&state);

    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    clattn_options no = clattn_options_default();
    no.backend = CLATTN_BACKEND_NATIVE;
    clattn_status st = clattn_context_create(&no, &native);
    /* The LSE pairs grad-V reads come from the forward, with K as V too. */
    if (st == CLATTN_OK)
        st = clattn_forward(native, &s, q, k, k, o, lse);
    enum { REPS = 3 };
    double times[REPS], native_time = 0.0;
    /* The first call pays for one-time work; time the ones after it. */
    for (int r = -1; r < REPS && st == CLATTN_OK; ++r) {
        double t0 = now();
        st = clattn_grad_v(ctx, &s, d_out, q, k, lse, dv);
        if (r >= 0)
            times[r] = now() - t0;
    }
    if (st == CLATTN_OK) {
        double t0 = now();
        st = clattn_grad_v(native, &s, d_out, q, k, lse, dv_native);
        native_time = now() - t0;
    }
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn demo: %s: %s\n", clattn_status_string(st), clattn_last_error());
        rc = EXIT_DEVICE;
        goto done;
    }
    for (int i = 0; i < REPS; ++i) /* median of three by sorting */
        for (int j = i + 1; j < REPS; ++j)
            if (times[j] < times[i]) {
                double x = times[i];
                times[i] = times[j];
                times[j] = x;
            }
    double flop = 4.0 * (double)clattn_shape_visible_pairs(&s) * s.head_dim;
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < nkv; ++i) {
        double d = fabs((double)dv[i] - dv_native[i]);
        max_diff = d > max_diff || isnan(d) ? d : max_diff;
        max_ref = fabs(dv_native[i]) > max_ref ? fabs(dv_native[i]) : max_ref;
    }
    double err = max_diff / max_ref;
    const double tolerance = 1e-4;
    printf("clattn %s demo: grad-V of a causal layer, q_seq %u, %u heads, %u KV heads, "
           "head_dim %u\n",
           clattn_version(), s.q_seq, s.num_heads, s.num_kv_heads, s.head_dim);
    printf("device:   %s, variant %s\n", clattn_context_device(ctx), clattn_context_variant(ctx));
    printf("time:     %.3f ms per call (median of %d), %.2f GFLOP/s\n", times[REPS / 2] * 1e3,
           REPS, flop / times[REPS / 2] * 1e-9);
    printf("native:   %s, %.3f ms, %.2f GFLOP/s\n", clattn_context_device(native),
           native_time * 1e3, flop / native_time * 1e-9);
    printf("error:    max |dV - dV native| / max |dV native| = %.3g (tolerance %.0e): %s\n", err,
           tolerance, err <= tolerance ? "ok" : "FAILED");
    rc = err <= tolerance ? 0 : EXIT_DEVICE;
done:
    clattn_context_destroy(ctx);
    clattn_context_destroy(native);
    free(q);
    free(d_out);
    free(k);
    free(lse);
    free(dv);
    free(dv_native);
    free(o);
    return rc;
}
