/* What training relies on: gradients that are the forward's derivatives
 * (central differences), dK and dV summed over each GQA group, and
 * `clattn train` reaching its loss target on a backend. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "reference.h"

static float *floats(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(a);
    return a;
}

/* L = sum of W * O, accumulated in float64 from the native forward. */
static double loss(clattn_context *ctx, const problem *p, const float *w, float *o, float *lse)
{
    ck_assert_status(clattn_forward(ctx, &p->s, p->q, p->k, p->v, o, lse), CLATTN_OK);
    double l = 0.0;
    for (size_t i = 0; i < p->nq; ++i)
        l += (double)w[i] * o[i];
    return l;
}

typedef struct grad_case {
    int causal;
    uint32_t window;
} grad_case;
static const grad_case grad_cases[] = {{0, 0}, {1, 0}, {0, 2}, {1, 3}};

/* The native backward against central differences of the native forward,
 * for every element of Q, K and V: batch 2, seq 5, 4 heads on 2 KV heads,
 * head_dim 8. float32 forwards limit the agreement to about 1e-5; a wrong
 * term is off by the size of the gradient itself. */
START_TEST(central_differences)
{
    clattn_shape s = clattn_shape_default();
    s.batch = 2;
    s.q_seq = s.kv_seq = 5;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 8;
    s.causal = grad_cases[_i].causal;
    s.window = grad_cases[_i].window;
    problem p;
    problem_make(&p, &s, 90 + (uint64_t)_i, 1.0f);
    clattn_options opts = clattn_options_default();
    opts.backend = CLATTN_BACKEND_NATIVE;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&opts, &ctx), CLATTN_OK);
    float *o = floats(p.nq), *lse = floats(p.nlse);
    float *grad[3] = {floats(p.nq), floats(p.nkv), floats(p.nkv)};
    /* dO = W, so the backward gives dL/dQ, dL/dK, dL/dV. */
    loss(ctx, &p, p.d_out, o, lse);
    ck_assert_status(clattn_backward(ctx, &s, p.q, p.k, p.v, o, lse, p.d_out, grad[0], grad[1],
                                     grad[2]),
                     CLATTN_OK);
    float *x[3] = {p.q, p.k, p.v};
    const size_t n[3] = {p.nq, p.nkv, p.nkv};
    const char *name[3] = {"Q", "K", "V"};
    const float h = 1e-2f;
    double worst = 0.0;
    for (int which = 0; which < 3; ++which)
        for (size_t i = 0; i < n[which]; ++i) {
            const float keep = x[which][i];
            x[which][i] = keep + h;
            const double up = loss(ctx, &p, p.d_out, o, lse);
            x[which][i] = keep - h;
            const double down = loss(ctx, &p, p.d_out, o, lse);
            x[which][i] = keep;
            const double fd = (up - down) / ((double)(keep + h) - (double)(keep - h));
            const double err = fabs(fd - grad[which][i]) / (2e-4 + 1e-3 * fabs(fd));
            worst = err > worst ? err : worst;
            ck_assert_msg(err <= 1.0,
                          "causal %d window %u: d%s[%zu] is %.6g, central difference %.6g",
                          s.causal, s.window, name[which], i, (double)grad[which][i], fd);
        }
    if (getenv("CLATTN_TEST_VERBOSE"))
        printf("gradcheck causal %d window %u: worst %.3g of tolerance\n", s.causal, s.window,
               worst);
    clattn_context_destroy(ctx);
    free(o);
    free(lse);
    for (int i = 0; i < 3; ++i)
        free(grad[i]);
    problem_free(&p);
}
END_TEST

/* GQA's dK and dV equal multi-head attention's with K and V repeated per
 * query head, summed over each group. */
START_TEST(group_sums)
{
    clattn_shape gqa = clattn_shape_default();
    gqa.q_seq = gqa.kv_seq = 19;
    gqa.num_heads = 6;
    gqa.num_kv_heads = 2;
    gqa.head_dim = 12;
    gqa.causal = 1;
    problem p;
    problem_make(&p, &gqa, 314, 1.0f);
    clattn_shape mha = gqa;
    mha.num_kv_heads = mha.num_heads;
    const size_t group = gqa.num_heads / gqa.num_kv_heads, D = gqa.head_dim;
    const size_t nkv_mha = (size_t)gqa.kv_seq * gqa.num_heads * D;
    float *k_rep = floats(nkv_mha), *v_rep = floats(nkv_mha);
    for (size_t t = 0; t < gqa.kv_seq; ++t)
        for (size_t h = 0; h < gqa.num_heads; ++h)
            for (size_t d = 0; d < D; ++d) {
                const size_t from = (t * gqa.num_kv_heads + h / group) * D + d;
                k_rep[(t * gqa.num_heads + h) * D + d] = p.k[from];
                v_rep[(t * gqa.num_heads + h) * D + d] = p.v[from];
            }
    clattn_context *ctx = test_context(NULL);
    float *dq = nan_array(p.nq), *dk = nan_array(p.nkv), *dv = nan_array(p.nkv);
    float *dq_m = nan_array(p.nq), *dk_m = nan_array(nkv_mha), *dv_m = nan_array(nkv_mha);
    ck_assert_status(clattn_backward(ctx, &gqa, p.q, p.k, p.v, p.o, p.lse, p.d_out, dq, dk, dv),
                     CLATTN_OK);
    ck_assert_status(clattn_backward(ctx, &mha, p.q, k_rep, v_rep, p.o, p.lse, p.d_out, dq_m,
                                     dk_m, dv_m),
                     CLATTN_OK);
    for (size_t i = 0; i < p.nq; ++i)
        ck_assert_msg(fabsf(dq[i] - dq_m[i]) <= 1e-5f * (1.0f + fabsf(dq_m[i])),
                      "dQ[%zu]: GQA %g, repeated %g", i, (double)dq[i], (double)dq_m[i]);
    for (size_t t = 0; t < gqa.kv_seq; ++t)
        for (size_t kvh = 0; kvh < gqa.num_kv_heads; ++kvh)
            for (size_t d = 0; d < D; ++d) {
                double sk = 0.0, sv = 0.0;
                for (size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                    sk += dk_m[(t * gqa.num_heads + h) * D + d];
                    sv += dv_m[(t * gqa.num_heads + h) * D + d];
                }
                const size_t at = (t * gqa.num_kv_heads + kvh) * D + d;
                ck_assert_msg(fabs(dk[at] - sk) <= 1e-5 * (1.0 + fabs(sk)) &&
                                  fabs(dv[at] - sv) <= 1e-5 * (1.0 + fabs(sv)),
                              "key %zu head %zu: dK %g vs %g, dV %g vs %g", t, kvh,
                              (double)dk[at], sk, (double)dv[at], sv);
            }
    clattn_context_destroy(ctx);
    float *all[] = {k_rep, v_rep, dq, dk, dv, dq_m, dk_m, dv_m};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        free(all[i]);
    problem_free(&p);
}
END_TEST

void add_training_tests(TCase *tc) { tcase_add_test(tc, group_sums); }

Suite *gradcheck_suite(void)
{
    Suite *s = suite_create("gradcheck");
    TCase *tc = tcase_create("native");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, central_differences, 0,
                        (int)(sizeof grad_cases / sizeof grad_cases[0]));
    suite_add_tcase(s, tc);
    return s;
}

/* `clattn train --device <backend>` from outside, in float32 and in
 * bfloat16 (float32 master weights, 16-bit tensors through the op): it
 * must reach its target. */
START_TEST(train_reaches_target)
{
    const char *dtype = _i ? "bf16" : "f32";
    const char *cli = getenv("CLATTN_CLI");
    ck_assert_msg(cli != NULL, "CLATTN_CLI is not set");
    const char *sel = test_selector();
    char out[] = "/tmp/clattn-train-XXXXXX";
    int fd = mkstemp(out);
    ck_assert_int_ge(fd, 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        execl(cli, cli, "train", "--device", sel, "--dtype", dtype, (char *)NULL);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    char text[8192] = "";
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(out);
    printf("%s", text);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "train (%s) failed: %s",
                  dtype, text);
    ck_assert(strstr(text, "(target 100): ok") != NULL);
    ck_assert_ptr_nonnull(strstr(text, _i ? "bfloat16 tensors" : "float32 tensors"));
}
END_TEST

Suite *train_suite(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create(test_backend);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, train_reaches_target, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
