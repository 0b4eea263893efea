/* Faults a device meets: a tensor past its largest allocation, a kernel that
 * does not build, and (suite inject, under tests/faultcl's LD_PRELOAD shim)
 * every OpenCL call of an op failing in turn; each a status, and the
 * context (or a new one) works after. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "numerics.h"
#include "reference.h"

/* Faults a device meets: a tensor past its largest allocation, and a
 * kernel that does not build. Each has its status, and the context (or a
 * new one) still works after. */
START_TEST(device_faults)
{
    if (!strcmp(test_backend, "native"))
        return; /* native has no device limits and builds nothing */
    clattn_context *ctx = test_context(NULL);
    clattn_shape huge = clattn_shape_default();
    huge.batch = 4096;
    huge.q_seq = huge.kv_seq = 65536;
    huge.num_heads = huge.num_kv_heads = 64;
    huge.head_dim = 64; /* 4 TiB a tensor: past any device's largest allocation */
    /* Tensors at addresses 16 TiB apart, never touched: outputs that alias
     * inputs are refused first (CLATTN_ERROR_INVALID_BUFFER), so these must
     * not overlap for the device's limit to be what answers. */
    float *x[9];
    for (int i = 0; i < 9; ++i)
        x[i] = (float *)(uintptr_t)(((uintptr_t)1 << 44) * (uintptr_t)(i + 1));
    ck_assert_status(clattn_grad_v(ctx, &huge, x[0], x[1], x[2], x[3], x[4]),
                     CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
    ck_assert_status(clattn_backward(ctx, &huge, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7],
                                     x[8]),
                     CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
    shape_case c = {.q_seq = 20, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    clattn_shape s = to_shape(&c);
    check_ops(ctx, &s, 1.0f, 5);
    clattn_context_destroy(ctx);

    /* Options that break the compile: the status, the log, no context. */
    setenv("CLATTN_CL_OPTIONS", "-DHEAD_DIM=not_a_number -Dfloat=syntax_error", 1);
    clattn_options o = clattn_options_default();
    o.device = test_selector();
    ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_BUILD_FAILED);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(clattn_last_error(), "build log") != NULL, "%s", clattn_last_error());
    /* auto notes the failed build and falls back to native. */
    o.device = "auto";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    ck_assert_int_eq(clattn_context_backend(ctx), CLATTN_BACKEND_NATIVE);
    ck_assert(strstr(clattn_context_log(ctx), "CLATTN_ERROR_BUILD_FAILED") != NULL);
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_CL_OPTIONS");
    ctx = test_context(NULL);
    check_ops(ctx, &s, 1.0f, 6);
    clattn_context_destroy(ctx);
}
END_TEST

/* The op of an injection run: one of the host-pointer calls on ctx. */
enum {
    OP_FORWARD,
    OP_GRAD_V,
    OP_BACKWARD,
    OP_GRAD_Q,
    OP_GRAD_K,
    OP_BACKWARD_TILED,
    OP_GRAD_PARAMS,
    OPS
};
static const char *const op_names[OPS] = {
    "forward", "grad_v", "backward", "grad_q", "grad_k", "backward on tiled",
    "the score parameters' gradient on the device"};
/* The variant an op runs on: the default, or tiled (its dS scratch). */
static const char *const op_variants[OPS] = {NULL, NULL, NULL, NULL, NULL, "tiled", NULL};

/* A relative bias of 9 buckets a head in OpenCL C alone, with its
 * parameters' derivative: its gradient runs on the device (pairs.c). */
#define PARAMS_COUNT 18
static const char relbias_cl[] =
    "float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
    "{ const int d = clamp((int)k - (int)q, -4, 4); return s + p[9u * h + (uint)(d + 4)]; }\n"
    "float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)\n"
    "{ return 1.0f; }\n"
    "uint clattn_score_dp(float s, uint b, uint h, uint q, uint k, __global const float *p,\n"
    "                     uint *index, float *d)\n"
    "{ const int t = clamp((int)k - (int)q, -4, 4); index[0] = 9u * h + (uint)(t + 4);\n"
    "  d[0] = 1.0f; return 1u; }\n";

static clattn_status run_op(clattn_context *ctx, int op, const clattn_shape *s, const problem *p,
                            float *out[3])
{
    switch (op) {
    case OP_FORWARD:
        return clattn_forward(ctx, s, p->q, p->k, p->v, out[0], out[1]);
    case OP_GRAD_V:
        return clattn_grad_v(ctx, s, p->d_out, p->q, p->k, p->lse, out[0]);
    case OP_BACKWARD:
    case OP_BACKWARD_TILED:
        return clattn_backward(ctx, s, p->q, p->k, p->v, p->o, p->lse, p->d_out, out[0], out[1],
                               out[2]);
    case OP_GRAD_Q:
        return clattn_grad_q(ctx, s, p->q, p->k, p->v, p->o, p->lse, p->d_out, out[0]);
    case OP_GRAD_PARAMS: { /* O and LSE the plain call's: any will do */
        static const float table[PARAMS_COUNT] = {0.5f, -0.25f, 0.125f, 1.0f, 0.0f,
                                                  -1.0f, 0.75f, 0.25f,  -0.5f};
        clattn_shape f = *s;
        f.score_fn = relbias_cl;
        f.score_params = table;
        f.score_params_count = PARAMS_COUNT;
        return clattn_grad_score_params(ctx, &f, p->q, p->k, p->v, p->o, p->lse, p->d_out,
                                        out[0]);
    }
    default:
        return clattn_grad_k(ctx, s, p->q, p->k, p->v, p->o, p->lse, p->d_out, out[0]);
    }
}

/* The outputs of an op (NULL past its last) are want's, bit for bit. */
static void expect_outputs(float *const out[3], float *const want[3], const size_t sizes[3])
{
    for (int i = 0; i < 3; ++i)
        if (out[i])
            ck_assert_mem_eq(out[i], want[i], sizes[i] * sizeof(float));
}

/* Every OpenCL call an op makes on a new context (its programs loaded from
 * the cache, or built), failed in turn by the shim: the op returns a
 * status with a message, or, where clattn absorbed the fault (a cached
 * program that fails to load is built again), the right outputs; the same
 * context then runs the op right. Leaks are the sanitizer checkers'. The
 * program cache is on, PoCL's included, so that its loads are failed too. */
START_TEST(injected_faults)
{
    setenv("CLATTN_CACHE_POCL", "1", 1);
    void (*arm)(long) = (void (*)(long))dlsym(RTLD_DEFAULT, "faultcl_arm");
    long (*counted)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "faultcl_calls");
    ck_assert_msg(arm && counted, "the suite wants tests/faultcl's shim in LD_PRELOAD");
    const shape_case c = {.q_seq = 20, .heads = 2, .kv_heads = 1, .head_dim = 16, .causal = 1};
    const clattn_shape s = to_shape(&c);
    problem p;
    problem_make(&p, &s, 41, 1.0f);
    const size_t sizes[OPS][3] = {{p.nq, p.nlse, 0}, {p.nkv, 0, 0},        {p.nq, p.nkv, p.nkv},
                                  {p.nq, 0, 0},      {p.nkv, 0, 0},        {p.nq, p.nkv, p.nkv},
                                  {PARAMS_COUNT, 0, 0}};
    for (int op = 0; op < OPS; ++op) {
        float *want[3] = {NULL, NULL, NULL}, *out[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; ++i)
            if (sizes[op][i]) {
                want[i] = nan_array(sizes[op][i]);
                out[i] = nan_array(sizes[op][i]);
            }
        clattn_context *ctx = test_context(op_variants[op]);
        ck_assert_status(run_op(ctx, op, &s, &p, want), CLATTN_OK); /* the cache warm */
        clattn_context_destroy(ctx);
        ctx = test_context(op_variants[op]);
        arm(0);
        ck_assert_status(run_op(ctx, op, &s, &p, out), CLATTN_OK);
        const long n = counted();
        clattn_context_destroy(ctx);
        ck_assert_int_gt(n, 0);
        int failed = 0, absorbed = 0, untouched = 0, statuses[32] = {0};
        for (long at = 1; at <= n; ++at) {
            ctx = test_context(op_variants[op]);
            for (int i = 0; i < 3; ++i)
                if (out[i])
                    memset(out[i], 0xA5, sizes[op][i] * sizeof(float));
            arm(at);
            const clattn_status st = run_op(ctx, op, &s, &p, out);
            arm(0);
            if (st == CLATTN_OK) {
                ++absorbed;
                expect_outputs(out, want, sizes[op]);
            } else {
                ++failed;
                ++statuses[(int)st & 31];
                ck_assert_msg(strlen(clattn_last_error()) > 0, "%s, call %ld: %s with no message",
                              op_names[op], at, clattn_status_string(st));
                /* A device fault is never blamed on the input: these tensors
                 * are far within every device's limits. */
                ck_assert_msg(st != CLATTN_ERROR_TOO_LARGE_FOR_DEVICE &&
                                  st != CLATTN_ERROR_DEVICE_NOT_FOUND,
                              "%s, call %ld: a device fault reported as %s: %s", op_names[op],
                              at, clattn_status_string(st), clattn_last_error());
                int clean = 1;
                for (int i = 0; i < 3; ++i)
                    for (size_t j = 0; out[i] && j < sizes[op][i]; ++j)
                        clean &= ((const unsigned char *)out[i])[4 * j] == 0xA5;
                untouched += clean;
            }
            /* The context still works. */
            ck_assert_status(run_op(ctx, op, &s, &p, out), CLATTN_OK);
            expect_outputs(out, want, sizes[op]);
            clattn_context_destroy(ctx);
        }
        printf("%s on %s: %ld calls faulted in turn: %d failed (outputs untouched in %d), "
               "%d absorbed; statuses:",
               op_names[op], test_backend, n, failed, untouched, absorbed);
        for (int st = 0; st < 32; ++st)
            if (statuses[st])
                printf(" %s x%d", clattn_status_string((clattn_status)st), statuses[st]);
        printf("\n");
        for (int i = 0; i < 3; ++i) {
            free(want[i]);
            free(out[i]);
        }
    }
    problem_free(&p);
    unsetenv("CLATTN_CACHE_POCL");
}
END_TEST

Suite *faults_suite(void)
{
    const TTest *const tests[] = {device_faults};
    return case_suite("faults", "device_faults", 600, tests, 1);
}

Suite *inject_suite(void)
{
    const TTest *const tests[] = {injected_faults};
    return case_suite("inject", "injected_faults", 900, tests, 1);
}
