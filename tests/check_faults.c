/* Faults a device meets: a tensor past its largest allocation, a kernel that
 * does not build; each a status, and the context (or a new one) works after. */
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
    float x = 0.0f;
    ck_assert_status(clattn_grad_v(ctx, &huge, &x, &x, &x, &x, &x),
                     CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
    ck_assert_status(clattn_backward(ctx, &huge, &x, &x, &x, &x, &x, &x, &x, &x, &x),
                     CLATTN_ERROR_TOO_LARGE_FOR_DEVICE);
    shape_case c = {1, 20, 20, 2, 1, 16, 1, 0, 0, 1};
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

Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("device_faults");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, device_faults);
    suite_add_tcase(s, tc);
    return s;
}
