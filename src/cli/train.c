/* clattn train: one attention layer trained with Adam through forward and
 * backward; the loss must fall 100-fold. */
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


/* One Adam step on n parameters with their moments m and v. */
static void adam_step(float *x, const float *g, float *m, float *v, size_t n, int step, float lr)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        x[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
    }
}

static void progress(int tty, int step, int steps, double loss)
{
    if (tty) {
        enum { WIDTH = 30 };
        int filled = (int)((long)WIDTH * step / steps);
        fprintf(stderr, "\r[%.*s%*s] step %d/%d loss %.3e", filled,
                "##############################", WIDTH - filled, "", step, steps, loss);
        if (step == steps)
            fputc('\n', stderr);
        fflush(stderr);
    } else if (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0 || step == steps) {
        printf("step %d/%d loss %.6e\n", step, steps, loss);
        fflush(stdout);
    }
}

/* The loss of the layer's output against the target with s as given
 * (the evaluation loss: without dropout). */
static clattn_status eval_loss(clattn_context *ctx, const clattn_shape *s, float *const param[3],
                               void *const p_op[3], const size_t sizes[3], void *o_op, float *o,
                               const float *target, float *lse, size_t nq, double *loss)
{
    for (int i = 0; i < 3 && s->dtype; ++i)
        clattn_from_f32(s->dtype, param[i], p_op[i], sizes[i]);
    const clattn_status st = clattn_forward(ctx, s, p_op[0], p_op[1], p_op[2], o_op, lse);
    if (st != CLATTN_OK)
        return st;
    if (s->dtype)
        clattn_to_f32(s->dtype, o_op, o, nq);
    *loss = 0.0;
    for (size_t i = 0; i < nq; ++i) {
        const double diff = (double)o[i] - target[i];
        *loss += diff * diff / (double)nq;
    }
    return CLATTN_OK;
}

int cmd_train(int argc, char **argv)
{
    const char *cmd = "train";
    if (wants_help(argc, argv)) {
        printf("usage: clattn train [--steps N] [--device SEL] [--variant NAME] [--dtype T]\n"
               "                    [--dropout P [--seed S]]\n"
               "Trains one causal attention layer (q_seq 64, 4 heads, 2 KV heads, head_dim\n"
               "16) whose Q, K and V are parameters, with Adam on forward + backward, to\n"
               "reproduce the output of a fixed random target layer. Prints the first and\n"
               "last loss; exits 1 unless the loss fell at least 100-fold. Default 300 steps.\n"
               "--dtype f16 or bf16 keeps float32 master weights and runs the op on 16-bit\n"
               "tensors, as mixed-precision training does (default f32).\n"
               "--dropout P trains with dropout on the attention probabilities, a fresh\n"
               "mask each step (seed S, default 1, at offset = the step), the backward\n"
               "regenerating it; the loss that must fall is then the evaluation loss,\n"
               "the forward without dropout, measured before the first and after the\n"
               "last step.\n");
        return 0;
    }
    const char *device = NULL, *variant = NULL, *dtype_name = "f32";
    uint32_t steps = 300;
    float dropout = 0.0f;
    uint64_t seed = 1;
    opt opts[] = {{"--device", OPT_STRING, &device, 0, 0},
                  {"--variant", OPT_STRING, &variant, 0, 0},
                  {"--steps", OPT_UINT, &steps, 0, 0},
                  {"--dtype", OPT_STRING, &dtype_name, 0, 0},
                  {"--dropout", OPT_FRACTION, &dropout, 0, 0},
                  {"--seed", OPT_U64, &seed, 0, 0}};
    if (!parse_opts(cmd, argc, argv, opts, 6))
        return EXIT_INPUT;
    static const char *const dtype_words[3] = {"float32", "float16", "bfloat16"};
    clattn_dtype dt;
    if (!parse_dtype(cmd, dtype_name, &dt))
        return EXIT_INPUT;
    if (steps == 0) {
        fprintf(stderr, "clattn train: --steps must be at least 1\n");
        return EXIT_INPUT;
    }
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 64;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 16;
    s.causal = 1;
    const size_t nq = (size_t)s.q_seq * s.num_heads * s.head_dim;
    const size_t nkv = (size_t)s.kv_seq * s.num_kv_heads * s.head_dim;
    const size_t nlse = (size_t)s.q_seq * s.num_heads * 2;
    /* Parameters, gradients and Adam moments of Q, K, V; then the rest. */
    const size_t sizes[3] = {nq, nkv, nkv};
    float *param[3], *grad[3], *mom1[3], *mom2[3];
    float *target = alloc_floats(nq), *o = alloc_floats(nq), *d_out = alloc_floats(nq);
    float *lse = alloc_floats(nlse);
    /* The op's tensors in the dtype: parameters, gradients, O and dO (the
     * float32 run passes the float arrays themselves). */
    const size_t elem = dt ? 2 : sizeof(float);
    void *t16[8] = {NULL};
    const size_t t16_n[8] = {nq, nkv, nkv, nq, nkv, nkv, nq, nq};
    int ok = target && o && d_out && lse;
    for (int i = 0; i < 8 && dt; ++i)
        ok = ok && (t16[i] = malloc(t16_n[i] * elem)) != NULL;
    for (int i = 0; i < 3; ++i) {
        param[i] = alloc_floats(sizes[i]);
        grad[i] = alloc_floats(sizes[i]);
        mom1[i] = calloc(sizes[i], sizeof(float));
        mom2[i] = calloc(sizes[i], sizeof(float));
        ok = ok && param[i] && grad[i] && mom1[i] && mom2[i];
    }
    clattn_context *ctx = NULL;
    int rc = EXIT_DEVICE;
    if (!ok) {
        fprintf(stderr, "clattn train: out of memory\n");
        goto done;
    }
    if ((rc = open_context(cmd, device, variant, &ctx)) != 0)
        goto done;
    rc = EXIT_DEVICE;
    uint64_t state = 0x2545F4914F6CDD1Dull;
    /* The target layer: its output is what training must reproduce. */
    for (int i = 0; i < 3; ++i)
        fill_uniform(param[i], sizes[i], 1.0f, &state);
    clattn_status st = clattn_forward(ctx, &s, param[0], param[1], param[2], target, lse);
    s.dtype = (clattn_dtype)dt;
    void *p_op[3], *g_op[3], *o_op = dt ? t16[6] : (void *)o, *do_op = dt ? t16[7] : (void *)d_out;
    for (int i = 0; i < 3; ++i) {
        p_op[i] = dt ? t16[i] : (void *)param[i];
        g_op[i] = dt ? t16[3 + i] : (void *)grad[i];
    }
    for (int i = 0; i < 3; ++i)
        fill_uniform(param[i], sizes[i], 1.0f, &state);
    printf("clattn train on %s, variant %s: causal, q_seq %u, %u heads, %u KV heads, "
           "head_dim %u, %s tensors, Adam, %u steps",
           clattn_context_device(ctx), clattn_context_variant(ctx), s.q_seq, s.num_heads,
           s.num_kv_heads, s.head_dim, dtype_words[dt], steps);
    if (dropout > 0.0f)
        printf(", dropout %g (seed %llu)", (double)dropout, (unsigned long long)seed);
    printf("\n");
    double eval_first = 0.0;
    if (dropout > 0.0f && st == CLATTN_OK)
        st = eval_loss(ctx, &s, param, p_op, sizes, o_op, o, target, lse, nq, &eval_first);
    s.dropout_p = dropout;
    s.dropout_seed = seed;
    fflush(stdout);
    const int tty = isatty(fileno(stderr));
    double first = 0.0, loss = 0.0;
    for (uint32_t step = 1; step <= steps && st == CLATTN_OK; ++step) {
        s.dropout_offset = step; /* a fresh mask each step, the backward's the same */
        for (int i = 0; i < 3 && dt; ++i)
            clattn_from_f32(s.dtype, param[i], p_op[i], sizes[i]);
        st = clattn_forward(ctx, &s, p_op[0], p_op[1], p_op[2], o_op, lse);
        if (st != CLATTN_OK)
            break;
        if (dt)
            clattn_to_f32(s.dtype, o_op, o, nq);
        loss = 0.0;
        for (size_t i = 0; i < nq; ++i) {
            const double diff = (double)o[i] - target[i];
            loss += diff * diff / (double)nq;
            d_out[i] = (float)(2.0 * diff / (double)nq);
        }
        if (step == 1)
            first = loss;
        if (dt)
            clattn_from_f32(s.dtype, d_out, do_op, nq);
        st = clattn_backward(ctx, &s, p_op[0], p_op[1], p_op[2], o_op, lse, do_op, g_op[0],
                             g_op[1], g_op[2]);
        for (int i = 0; i < 3 && dt && st == CLATTN_OK; ++i)
            clattn_to_f32(s.dtype, g_op[i], grad[i], sizes[i]);
        for (int i = 0; i < 3 && st == CLATTN_OK; ++i)
            adam_step(param[i], grad[i], mom1[i], mom2[i], sizes[i], (int)step, 0.05f);
        progress(tty, (int)step, (int)steps, loss);
    }
    if (st != CLATTN_OK) {
        rc = op_failed(cmd, st);
        goto done;
    }
    if (dropout > 0.0f) {
        printf("training loss (dropout): first %.6e, last %.6e\n", first, loss);
        s.dropout_p = 0.0f;
        st = eval_loss(ctx, &s, param, p_op, sizes, o_op, o, target, lse, nq, &loss);
        if (st != CLATTN_OK) {
            rc = op_failed(cmd, st);
            goto done;
        }
        first = eval_first;
    }
    const double fell = loss > 0.0 ? first / loss : INFINITY;
    printf("%s: first %.6e, last %.6e, fell %.1f-fold (target 100): %s\n",
           dropout > 0.0f ? "evaluation loss" : "loss", first, loss, fell,
           fell >= 100.0 ? "ok" : "FAILED");
    rc = fell >= 100.0 ? 0 : EXIT_DEVICE;
done:
    clattn_context_destroy(ctx);
    for (int i = 0; i < 3; ++i) {
        free(param[i]);
        free(grad[i]);
        free(mom1[i]);
        free(mom2[i]);
    }
    for (int i = 0; i < 8; ++i)
        free(t16[i]);
    free(target);
    free(o);
    free(d_out);
    free(lse);
    return rc;
}
