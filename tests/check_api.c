/* The API's contract: statuses for every bad input, options, selection
 * and queries; check_api_calls.c holds the calls' own results. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_tests.h"
#include "harness.h"
#include "reference.h"

clattn_shape small_shape(void)
{
    clattn_shape s = clattn_shape_default();
    s.q_seq = s.kv_seq = 8;
    s.num_heads = 4;
    s.num_kv_heads = 2;
    s.head_dim = 16;
    return s;
}

clattn_context *native_context(int threads)
{
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    o.num_threads = threads;
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    return ctx;
}

START_TEST(status_strings)
{
    for (int st = CLATTN_OK; st <= CLATTN_ERROR_IO; ++st) {
        const char *name = clattn_status_string((clattn_status)st);
        ck_assert_msg(strncmp(name, "CLATTN_", 7) == 0 &&
                          strcmp(name, "CLATTN_ERROR_UNKNOWN_STATUS") != 0,
                      "status %d is named %s", st, name);
        for (int other = CLATTN_OK; other < st; ++other)
            ck_assert_str_ne(name, clattn_status_string((clattn_status)other));
    }
    ck_assert_str_eq(clattn_status_string((clattn_status)999), "CLATTN_ERROR_UNKNOWN_STATUS");
    ck_assert_str_eq(clattn_backend_name(CLATTN_BACKEND_OPENCL_CPU), "opencl-cpu");
    ck_assert_str_eq(clattn_backend_name((clattn_backend)99), "unknown");
}
END_TEST

/* The public conversions: exact widening, nearest-even narrowing, the
 * special values, and nothing done for an invalid dtype. */
START_TEST(dtype_conversions)
{
    const float in[8] = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 0x1p-9f, 65520.0f, 0x1p-25f,
                         INFINITY, NAN};
    uint16_t bf[8], h[8];
    float back[8];
    clattn_from_f32(CLATTN_DTYPE_BF16, in, bf, 8);
    clattn_from_f32(CLATTN_DTYPE_F16, in, h, 8);
    const uint16_t want_bf[7] = {0x3f80, 0xc020, 0x3f80 /* tie to even */, 0x3f80, 0x4780,
                                 0x3300, 0x7f80};
    const uint16_t want_h[7] = {0x3c00, 0xc100, 0x3c04, 0x3c02, 0x7c00 /* overflow */,
                                0x0000 /* 2^-25 ties to even zero */, 0x7c00};
    for (int i = 0; i < 7; ++i) {
        ck_assert_msg(bf[i] == want_bf[i], "bf16 of %g is %04x", (double)in[i], bf[i]);
        ck_assert_msg(h[i] == want_h[i], "f16 of %g is %04x", (double)in[i], h[i]);
    }
    const float ties[2] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f};
    uint16_t th[2];
    clattn_from_f32(CLATTN_DTYPE_F16, ties, th, 2);
    ck_assert(th[0] == 0x3c00 && th[1] == 0x3c02); /* halfway: to the even one */
    clattn_to_f32(CLATTN_DTYPE_BF16, bf, back, 8);
    ck_assert(back[1] == -2.5f && isinf(back[6]) && isnan(back[7]));
    clattn_to_f32(CLATTN_DTYPE_F16, h, back, 8);
    ck_assert(back[0] == 1.0f && back[1] == -2.5f && isnan(back[7]));
    const uint16_t sub = 0x0001; /* float16's smallest subnormal, 2^-24 */
    clattn_to_f32(CLATTN_DTYPE_F16, &sub, back, 1);
    ck_assert(back[0] == 0x1p-24f);
    float copy[8] = {0};
    clattn_to_f32(CLATTN_DTYPE_F32, in, copy, 6);
    ck_assert_int_eq(memcmp(copy, in, 6 * sizeof(float)), 0);
    uint16_t keep = 0x1234;
    clattn_from_f32((clattn_dtype)7, in, &keep, 1);
    ck_assert_uint_eq(keep, 0x1234);
}
END_TEST

START_TEST(version)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CLATTN_VERSION_MAJOR, CLATTN_VERSION_MINOR,
             CLATTN_VERSION_PATCH);
    ck_assert_str_eq(clattn_version(), want);
    ck_assert_str_eq(CLATTN_VERSION, want);
}
END_TEST

/* Each invalid shape has its own status, and the message names the cause. */
START_TEST(shape_statuses)
{
    clattn_shape s = small_shape();
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    ck_assert_status(clattn_shape_validate(NULL), CLATTN_ERROR_NULL_POINTER);
    uint32_t *fields[] = {&s.batch, &s.q_seq, &s.kv_seq, &s.num_heads, &s.num_kv_heads,
                          &s.head_dim};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
        s = small_shape();
        *fields[i] = 0;
        ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_ZERO_SIZE);
    }
    s = small_shape();
    s.num_kv_heads = 3;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_HEADS_NOT_DIVISIBLE);
    ck_assert(strstr(clattn_last_error(), "num_heads 4") != NULL);
    s = small_shape();
    s.head_dim = CLATTN_MAX_HEAD_DIM + 1;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_HEAD_DIM_TOO_LARGE);
    s.head_dim = CLATTN_MAX_HEAD_DIM;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    s = small_shape();
    /* Causal with kv_seq != q_seq at offsets 0: top-left, or bottom-right. */
    s.causal = 1;
    s.kv_seq = 9;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    s.causal = CLATTN_CAUSAL_BOTTOM_RIGHT;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    s.causal = 0;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    /* Causal with kv_seq != q_seq once an offset places the chunks. */
    s.causal = 1;
    s.q_offset = 1;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    s.q_offset = 0;
    s.kv_offset = 5;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    /* Positions past 2^32 - 1 are refused, not wrapped: kv_seq 9 from
     * 2^32 - 8 ends at 2^32. */
    s.kv_offset = 0xFFFFFFFFu - 7;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_SIZE_OVERFLOW);
    s.kv_offset = 0;
    s.q_offset = 0xFFFFFFFFu;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_SIZE_OVERFLOW);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "q_offset"));
    /* The last position may be 2^32 - 1 itself. */
    s.q_offset = 0xFFFFFFFFu - s.q_seq + 1u;
    s.kv_offset = 0xFFFFFFFFu - s.kv_seq + 1u;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    s.q_offset = s.kv_offset = 0;
    const float bad_scales[] = {-1.0f, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 4; ++i) {
        s = small_shape();
        s.scale = bad_scales[i];
        ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_SCALE);
    }
    /* The dtype: float32 by default, the three formats, nothing else. */
    s = small_shape();
    ck_assert_int_eq(s.dtype, CLATTN_DTYPE_F32);
    const int dtypes[] = {CLATTN_DTYPE_F16, CLATTN_DTYPE_BF16, 3, -1, 1000};
    for (int i = 0; i < 5; ++i) {
        s.dtype = (clattn_dtype)dtypes[i];
        ck_assert_status(clattn_shape_validate(&s),
                         i < 2 ? CLATTN_OK : CLATTN_ERROR_INVALID_DTYPE);
    }
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "dtype 1000"));
    s = small_shape();
    s.batch = s.q_seq = s.kv_seq = s.num_heads = 0xFFFFFFFFu;
    s.num_kv_heads = 1;
    s.head_dim = 256;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_SIZE_OVERFLOW);
}
END_TEST

/* grad-V refuses before doing any work: pointers are never touched. */
START_TEST(grad_v_statuses)
{
    clattn_context *ctx = native_context(0);
    clattn_shape s = small_shape();
    float buf[8 * 4 * 16];
    float *p[5] = {buf, buf, buf, buf, buf};
    ck_assert_status(clattn_grad_v(NULL, &s, buf, buf, buf, buf, buf), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_grad_v(ctx, NULL, buf, buf, buf, buf, buf), CLATTN_ERROR_NULL_POINTER);
    for (int i = 0; i < 5; ++i) {
        float *a[5] = {p[0], p[1], p[2], p[3], p[4]};
        a[i] = NULL;
        ck_assert_status(clattn_grad_v(ctx, &s, a[0], a[1], a[2], a[3], a[4]),
                         CLATTN_ERROR_NULL_POINTER);
    }
    s.num_kv_heads = 3;
    ck_assert_status(clattn_grad_v(ctx, &s, NULL, NULL, NULL, NULL, NULL),
                     CLATTN_ERROR_HEADS_NOT_DIVISIBLE);
    s = small_shape();
    s.head_dim = 300;
    ck_assert_status(clattn_grad_v(ctx, &s, buf, buf, buf, buf, buf),
                     CLATTN_ERROR_HEAD_DIM_TOO_LARGE);
    clattn_context_destroy(ctx);
}
END_TEST

/* Bad prefix sums of packed sequences: a clear status, before anything is
 * written; the visible pairs of a packed shape sum its sequences'. */
START_TEST(packed_statuses)
{
    clattn_context *ctx = native_context(0);
    uint32_t cq[4] = {0, 3, 3, 7}, ck[4] = {0, 2, 5, 7};
    clattn_shape s = clattn_shape_default();
    s.batch = 3;
    s.q_seq = 8;
    s.kv_seq = 7;
    s.num_heads = s.num_kv_heads = 1;
    s.head_dim = 4;
    s.causal = 1;
    s.cu_seqlens_q = cq;
    s.cu_seqlens_kv = ck;
    ck_assert_status(clattn_shape_validate(&s), CLATTN_OK);
    /* (3 queries, 2 keys) top-left: 1 + 2 + 2; (0, 3): none; (4, 2): 1 + 2 + 2 + 2 */
    ck_assert_uint_eq(clattn_shape_visible_pairs(&s), 12u);
    float q[8 * 4], k[7 * 4], v[7 * 4], o[8 * 4], lse[8 * 2];
    for (int i = 0; i < 32; ++i)
        q[i] = (float)(i % 5) * 0.25f, o[i] = 42.0f;
    for (int i = 0; i < 28; ++i)
        k[i] = v[i] = (float)(i % 3) * 0.5f;
    struct {
        uint32_t *at, value;
        clattn_status want;
        const char *says;
    } bad[] = {
        {&cq[0], 1, CLATTN_ERROR_INVALID_SEQLENS, "start from 0"},
        {&ck[2], 1, CLATTN_ERROR_INVALID_SEQLENS, "decreases"},
        {&cq[3], 9, CLATTN_ERROR_INVALID_SEQLENS, "past the 8 rows"},
        {&ck[3], 8, CLATTN_ERROR_INVALID_SEQLENS, "past the 7 rows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        const uint32_t keep = *bad[i].at;
        *bad[i].at = bad[i].value;
        ck_assert_status(clattn_forward(ctx, &s, q, k, v, o, lse), bad[i].want);
        ck_assert_msg(strstr(clattn_last_error(), bad[i].says), "%s", clattn_last_error());
        ck_assert_status(clattn_shape_validate(&s), bad[i].want);
        *bad[i].at = keep;
    }
    for (int i = 0; i < 32; ++i)
        ck_assert(o[i] == 42.0f); /* nothing written */
    s.cu_seqlens_kv = NULL;
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, o, lse), CLATTN_ERROR_NULL_POINTER);
    ck_assert(strstr(clattn_last_error(), "cu_seqlens_kv is NULL"));
    s.cu_seqlens_kv = ck;
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, o, lse), CLATTN_OK);
    /* the row past the last prefix sum, and the empty sequence's none */
    ck_assert(o[7 * 4] == 0.0f && lse[7 * 2] == -1e30f && lse[7 * 2 + 1] == -1e30f);
    clattn_context_destroy(ctx);
}
END_TEST

/* Bad score modifiers: a negative, NaN or infinite cap, a slope not
 * finite, dropout_p outside [0, 1): CLATTN_ERROR_INVALID_MODIFIER with the
 * value named, from every op and from validation, nothing written; the
 * dropout mask's bad arguments. */
START_TEST(modifier_statuses)
{
    clattn_context *ctx = native_context(0);
    const clattn_shape base = small_shape();
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    float buf[9][8 * 4 * 16];
    float lse[8 * 4 * 2];
    for (int i = 0; i < 9; ++i)
        for (size_t j = 0; j < sizeof buf[i] / sizeof(float); ++j)
            buf[i][j] = i < 6 ? (float)(j % 7) * 0.125f : 42.0f;
    for (size_t j = 0; j < sizeof lse / sizeof(float); ++j)
        lse[j] = 0.0f;
    const struct {
        float softcap, slope, p;
        const char *says;
    } bad[] = {
        {-1.0f, 0.5f, 0.0f, "softcap -1"},     {NAN, 0.5f, 0.0f, "softcap nan"},
        {INFINITY, 0.5f, 0.0f, "softcap inf"}, {0.0f, NAN, 0.0f, "alibi_slopes[2] is nan"},
        {0.0f, -INFINITY, 0.0f, "alibi_slopes[2] is -inf"},
        {0.0f, 0.5f, 1.0f, "dropout_p 1"},     {0.0f, 0.5f, -0.25f, "dropout_p -0.25"},
        {0.0f, 0.5f, NAN, "dropout_p nan"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        clattn_shape s = base;
        s.softcap = bad[i].softcap;
        slopes[2] = bad[i].slope;
        s.alibi_slopes = slopes;
        s.dropout_p = bad[i].p;
        ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert_msg(strstr(clattn_last_error(), bad[i].says), "%s", clattn_last_error());
        ck_assert_status(clattn_forward(ctx, &s, buf[0], buf[1], buf[2], buf[6], lse),
                         CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert_status(clattn_backward(ctx, &s, buf[0], buf[1], buf[2], buf[3], lse, buf[5],
                                         buf[6], buf[7], buf[8]),
                         CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert_status(clattn_grad_v(ctx, &s, buf[5], buf[0], buf[1], lse, buf[8]),
                         CLATTN_ERROR_INVALID_MODIFIER);
        uint8_t keep[64];
        ck_assert_status(clattn_dropout_mask(&s, 0, 0, keep), CLATTN_ERROR_INVALID_MODIFIER);
    }
    /* sinks: NaN and +inf refused (-inf is none), by the forward and by
     * their gradient, which writes nothing then */
    float sinks[4] = {0.5f, -INFINITY, 0.0f, 1.0f}, ds[4] = {42.0f, 42.0f, 42.0f, 42.0f};
    const float bad_sink[2] = {NAN, INFINITY};
    for (int i = 0; i < 2; ++i) {
        clattn_shape s = base;
        sinks[3] = bad_sink[i];
        s.sinks = sinks;
        ck_assert_status(clattn_shape_validate(&s), CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert_msg(strstr(clattn_last_error(), "sinks[3]"), "%s", clattn_last_error());
        ck_assert_status(clattn_forward(ctx, &s, buf[0], buf[1], buf[2], buf[6], lse),
                         CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert_status(clattn_grad_sinks(ctx, &s, buf[3], lse, buf[5], ds),
                         CLATTN_ERROR_INVALID_MODIFIER);
        ck_assert(ds[0] == 42.0f && ds[3] == 42.0f);
    }
    sinks[3] = 1.0f;
    clattn_shape with = base;
    with.sinks = sinks;
    ck_assert_status(clattn_shape_validate(&with), CLATTN_OK);
    ck_assert_status(clattn_grad_sinks(ctx, &base, buf[3], lse, buf[5], ds),
                     CLATTN_ERROR_NULL_POINTER); /* no sinks */
    ck_assert_msg(strstr(clattn_last_error(), "sinks"), "%s", clattn_last_error());
    ck_assert_status(clattn_grad_sinks(ctx, &with, buf[3], lse, buf[5], NULL),
                     CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_grad_sinks(ctx, &with, NULL, lse, buf[5], ds),
                     CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_grad_sinks(NULL, &with, buf[3], lse, buf[5], ds),
                     CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_grad_sinks(ctx, &with, buf[3], lse, buf[5], buf[5]),
                     CLATTN_ERROR_INVALID_BUFFER); /* the output on dO */
    ck_assert(ds[0] == 42.0f && ds[3] == 42.0f);
    ck_assert_status(clattn_grad_sinks(ctx, &with, buf[3], lse, buf[5], ds), CLATTN_OK);
    ck_assert(ds[1] == 0.0f && ds[0] != 42.0f);
    for (int i = 6; i < 9; ++i)
        for (size_t j = 0; j < sizeof buf[i] / sizeof(float); ++j)
            ck_assert(buf[i][j] == 42.0f); /* nothing written */
    /* the mask's own arguments */
    clattn_shape s = base;
    s.dropout_p = 0.5f;
    uint8_t keep[64];
    ck_assert_status(clattn_dropout_mask(&s, 0, 0, NULL), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_dropout_mask(&s, 1, 0, keep), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_status(clattn_dropout_mask(&s, 0, 4, keep), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_status(clattn_dropout_mask(NULL, 0, 0, keep), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_dropout_mask(&s, 0, 3, keep), CLATTN_OK);
    /* a new offset draws a new mask */
    uint8_t again[64];
    s.dropout_offset = 1;
    ck_assert_status(clattn_dropout_mask(&s, 0, 3, again), CLATTN_OK);
    ck_assert(memcmp(keep, again, sizeof keep) != 0);
    clattn_context_destroy(ctx);
}
END_TEST

/* Every op names the NULL tensor it was given, before touching any. */
START_TEST(op_null_pointers)
{
    clattn_context *ctx = native_context(0);
    clattn_shape s = small_shape();
    float buf[8 * 4 * 16];
    for (int i = 0; i < 9; ++i) {
        float *a[9];
        for (int j = 0; j < 9; ++j)
            a[j] = j == i ? NULL : buf;
        ck_assert_status(clattn_backward(ctx, &s, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
                                         a[8]),
                         CLATTN_ERROR_NULL_POINTER);
        if (i < 7)
            ck_assert_status(clattn_grad_q(ctx, &s, a[0], a[1], a[2], a[3], a[4], a[5], a[6]),
                             CLATTN_ERROR_NULL_POINTER);
        if (i < 7)
            ck_assert_status(clattn_grad_k(ctx, &s, a[0], a[1], a[2], a[3], a[4], a[5], a[6]),
                             CLATTN_ERROR_NULL_POINTER);
        if (i < 5)
            ck_assert_status(clattn_forward(ctx, &s, a[0], a[1], a[2], a[3], a[4]),
                             CLATTN_ERROR_NULL_POINTER);
    }
    ck_assert(strstr(clattn_last_error(), "is NULL") != NULL);
    s.causal = 1;
    s.kv_seq = 3;
    ck_assert_status(clattn_backward(NULL, &s, buf, buf, buf, buf, buf, buf, buf, buf, buf),
                     CLATTN_ERROR_NULL_POINTER);
    /* Outputs may not alias another tensor of the call (inputs may share):
     * refused before anything is written, whichever backend. */
    s = small_shape();
    const struct {
        size_t q, kv, lse;
    } z = {(size_t)s.batch * s.q_seq * s.num_heads * s.head_dim,
           (size_t)s.batch * s.kv_seq * s.num_kv_heads * s.head_dim,
           (size_t)s.batch * s.q_seq * s.num_heads * 2};
    float *in = calloc(z.q * 4 + z.kv * 2 + z.lse, sizeof(float));
    float *q = in, *d_out = in + z.q, *o = in + 2 * z.q, *k = in + 3 * z.q, *v = k + z.kv;
    float *lse = v + z.kv, *dq = malloc(z.q * 4), *dk = malloc(z.kv * 4), *dv = malloc(z.kv * 4);
    ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, lse, d_out, q, dk, dv),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "dq overlaps q"));
    ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, lse, d_out, dq, dk, dk),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_status(clattn_backward(ctx, &s, q, k, v, o, lse, d_out, dq, dk, v + 1),
                     CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, v, dq), CLATTN_ERROR_INVALID_BUFFER);
    ck_assert_status(clattn_forward(ctx, &s, q, k, v, dq, dq + z.q - 1),
                     CLATTN_ERROR_INVALID_BUFFER); /* O's last float is LSE's first */
    ck_assert_status(clattn_grad_v(ctx, &s, d_out, q, k, lse, lse), CLATTN_ERROR_INVALID_BUFFER);
    for (size_t i = 0; i < z.q; ++i)
        ck_assert_float_eq(q[i], 0.0f); /* nothing was written */
    /* Inputs that share memory are fine. */
    ck_assert_status(clattn_backward(ctx, &s, q, k, k, o, lse, q, dq, dk, dv), CLATTN_OK);
    free(in), free(dq), free(dk), free(dv);
    clattn_context_destroy(ctx);
}
END_TEST

START_TEST(options_statuses)
{
    clattn_context *ctx = (clattn_context *)&ctx; /* must come back NULL */
    ck_assert_status(clattn_context_create(NULL, NULL), CLATTN_ERROR_NULL_POINTER);
    clattn_options o = clattn_options_default();
    o.backend = (clattn_backend)42;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_ptr_null(ctx);
    o = clattn_options_default();
    o.num_threads = -2;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
    const char *bad_selectors[] = {"", "  ", "1:", ":0", "1:2:3", "99999999:0"};
    for (size_t i = 0; i < sizeof bad_selectors / sizeof *bad_selectors; ++i) {
        o = clattn_options_default();
        o.device = bad_selectors[i];
        ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
        ck_assert_ptr_null(ctx);
    }
    o = clattn_options_default();
    o.variant = "no-such-variant";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_UNKNOWN_VARIANT);
    o.backend = CLATTN_BACKEND_NATIVE;
    o.variant = "tree";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_UNKNOWN_VARIANT);
    ck_assert(strstr(clattn_last_error(), "blocked") != NULL);
    /* "auto" is the default, as NULL is */
    o.variant = "auto";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    ck_assert_str_eq(clattn_context_variant(ctx), "blocked");
    clattn_context_destroy(ctx);
}
END_TEST

/* Selectors that parse but match nothing: not found, or no platform at all. */
START_TEST(selector_matches_nothing)
{
    size_t n = 0;
    ck_assert_status(clattn_list_devices(NULL, 0, &n), CLATTN_OK);
    clattn_status want = n > 1 ? CLATTN_ERROR_DEVICE_NOT_FOUND : CLATTN_ERROR_NO_PLATFORM;
    const char *sel[] = {"no-such-device-anywhere", "77:0", "0:999"};
    for (int i = 0; i < 3; ++i) {
        clattn_options o = clattn_options_default();
        o.device = sel[i];
        clattn_context *ctx = NULL;
        ck_assert_status(clattn_context_create(&o, &ctx), want);
        ck_assert_ptr_null(ctx);
    }
}
END_TEST

/* Each of values in the environment variable `name` makes context creation
 * with o fail with CLATTN_ERROR_INVALID_OPTION, no context, and a message
 * naming the variable. */
static void refuses_each(const clattn_options *o, const char *name, const char *const *values,
                         size_t n)
{
    char said[64];
    snprintf(said, sizeof said, "%s=", name);
    for (size_t i = 0; i < n; ++i) {
        setenv(name, values[i], 1);
        clattn_context *ctx = NULL;
        ck_assert_status(clattn_context_create(o, &ctx), CLATTN_ERROR_INVALID_OPTION);
        ck_assert_ptr_null(ctx);
        ck_assert_msg(strstr(clattn_last_error(), said) != NULL, "%s='%s': %s", name, values[i],
                      clattn_last_error());
    }
}

START_TEST(environment_selects)
{
    setenv("CLATTN_DEVICE", "native", 1);
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(NULL, &ctx), CLATTN_OK);
    ck_assert_int_eq(clattn_context_backend(ctx), CLATTN_BACKEND_NATIVE);
    clattn_context_destroy(ctx);
    /* An explicit selector in the options wins over the environment. */
    setenv("CLATTN_DEVICE", "no-such-device-anywhere", 1);
    clattn_options o = clattn_options_default();
    o.device = "native";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    clattn_context_destroy(ctx);
    o = clattn_options_default();
    o.backend = CLATTN_BACKEND_NATIVE;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
    clattn_context_destroy(ctx);
    setenv("CLATTN_DEVICE", "", 1);
    ck_assert_status(clattn_context_create(NULL, &ctx), CLATTN_ERROR_INVALID_OPTION);
    setenv("CLATTN_NUM_THREADS", "3", 1);
    ctx = native_context(0);
    ck_assert_ptr_nonnull(strstr(clattn_context_device(ctx), "native: 3 threads, "));
    clattn_context_destroy(ctx);
    ctx = native_context(1);
    ck_assert_ptr_nonnull(strstr(clattn_context_device(ctx), "native: 1 thread, "));
    clattn_context_destroy(ctx);
    /* A CLATTN_NUM_THREADS that is no count is refused, as every knob's bad
     * value is, and so are negative num_threads. */
    static const char *const bad_threads[] = {"abc", "-3", "0", "3x", "99999999999999999999"};
    o = clattn_options_default();
    o.device = "native";
    refuses_each(&o, "CLATTN_NUM_THREADS", bad_threads,
                 sizeof bad_threads / sizeof bad_threads[0]);
    setenv("CLATTN_NUM_THREADS", "3", 1);
    o.num_threads = -2;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
    /* CLATTN_NATIVE_LEVEL caps the hot loops' level, and the device string
     * names the one that runs. */
    setenv("CLATTN_NATIVE_LEVEL", "baseline", 1);
    ctx = native_context(1);
    ck_assert_str_eq(clattn_context_device(ctx), "native: 1 thread, baseline code");
    clattn_context_destroy(ctx);
    setenv("CLATTN_NATIVE_LEVEL", "v5", 1);
    o = clattn_options_default();
    o.device = "native";
    ctx = NULL;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
    ck_assert_ptr_null(ctx);
    ck_assert_ptr_nonnull(strstr(clattn_last_error(), "CLATTN_NATIVE_LEVEL='v5'"));
    unsetenv("CLATTN_NATIVE_LEVEL");
    /* CLATTN_NATIVE_PARTS=QUERY,KEY: two counts, 0 to 4095 */
    static const char *const bad_parts[] = {"4", "4,", ",4", "4,5,", "-1,2", "4096,1", "a,b"};
    refuses_each(&o, "CLATTN_NATIVE_PARTS", bad_parts, sizeof bad_parts / sizeof bad_parts[0]);
    setenv("CLATTN_NATIVE_PARTS", "0,4095", 1);
    ctx = native_context(1);
    clattn_context_destroy(ctx);
    unsetenv("CLATTN_NATIVE_PARTS");
}
END_TEST

/* No OpenCL driver at all: the ICD loader is pointed at an empty vendor
 * folder. auto falls back to native and says so; OpenCL picks fail. */
START_TEST(no_platform)
{
    setenv("OCL_ICD_VENDORS", "/nonexistent/clattn-empty-vendors", 1);
    setenv("OCL_ICD_FILENAMES", "", 1);
    unsetenv("CLATTN_DEVICE");
    clattn_context *ctx = NULL;
    ck_assert_status(clattn_context_create(NULL, &ctx), CLATTN_OK);
    ck_assert_int_eq(clattn_context_backend(ctx), CLATTN_BACKEND_NATIVE);
    ck_assert_msg(strstr(clattn_context_log(ctx), "fell back to native") != NULL, "log: %s",
                  clattn_context_log(ctx));
    clattn_context_destroy(ctx);
    clattn_options o = clattn_options_default();
    o.backend = CLATTN_BACKEND_OPENCL_GPU;
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_NO_PLATFORM);
    o.device = "0:0";
    ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_NO_PLATFORM);
    size_t n = 0;
    clattn_device_info info[4];
    ck_assert_status(clattn_list_devices(info, 4, &n), CLATTN_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(info[0].backend, CLATTN_BACKEND_NATIVE);
}
END_TEST

START_TEST(list_devices)
{
    size_t n = 0;
    ck_assert_status(clattn_list_devices(NULL, 0, NULL), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_list_devices(NULL, 3, &n), CLATTN_ERROR_NULL_POINTER);
    ck_assert_status(clattn_list_devices(NULL, 0, &n), CLATTN_OK);
    ck_assert_uint_ge(n, 1);
    clattn_device_info *list = calloc(n, sizeof *list);
    size_t again = 0;
    ck_assert_status(clattn_list_devices(list, n, &again), CLATTN_OK);
    ck_assert_uint_eq(again, n);
    ck_assert_int_eq(list[n - 1].backend, CLATTN_BACKEND_NATIVE);
    for (size_t i = 0; i + 1 < n; ++i) {
        ck_assert(list[i].backend == CLATTN_BACKEND_OPENCL_GPU ||
                  list[i].backend == CLATTN_BACKEND_OPENCL_CPU);
        ck_assert_int_ge(list[i].platform_index, 0);
        /* Each listed device is reachable by its index. */
        char sel[32];
        snprintf(sel, sizeof sel, "%d:%d", list[i].platform_index, list[i].device_index);
        clattn_options o = clattn_options_default();
        o.device = sel;
        clattn_context *ctx = NULL;
        ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
        ck_assert_int_eq(clattn_context_backend(ctx), list[i].backend);
        ck_assert(strstr(clattn_context_device(ctx), list[i].name) != NULL);
        clattn_context_destroy(ctx);
    }
    free(list);
}
END_TEST

/* The mma shape knobs (and CLATTN_GRAD_BIAS) are read as an OpenCL context
 * is made, whatever its variant: bad ones refuse it with a status and a
 * message naming them, on every OpenCL device listed; CLATTN_MMA_SINGLE=0
 * (two passes) is good. */
START_TEST(mma_knob_statuses)
{
    size_t n = 0;
    ck_assert_status(clattn_list_devices(NULL, 0, &n), CLATTN_OK);
    clattn_device_info *list = calloc(n, sizeof *list);
    ck_assert_status(clattn_list_devices(list, n, &n), CLATTN_OK);
    static const char *const bad[][2] = {{"CLATTN_MMA_SINGLE", "4,2,16,1"},
                                         {"CLATTN_MMA_SINGLE", "x"},
                                         {"CLATTN_MMA", "3,1,16,1"},
                                         {"CLATTN_MMA_GRAD_Q", "4,1,16"},
                                         {"CLATTN_MMA_KEY_PARTS", "0"},
                                         {"CLATTN_MMA_KEY_PARTS", "17"},
                                         {"CLATTN_MMA_KEY_PARTS", "au"},
                                         {"CLATTN_MMA_ORDER", "sideways"},
                                         {"CLATTN_GRAD_BIAS", "gpu"}};
    for (size_t i = 0; i < n; ++i) {
        if (list[i].backend == CLATTN_BACKEND_NATIVE)
            continue;
        char sel[32];
        snprintf(sel, sizeof sel, "%d:%d", list[i].platform_index, list[i].device_index);
        clattn_options o = clattn_options_default();
        o.device = sel;
        clattn_context *ctx = NULL;
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; ++b) {
            setenv(bad[b][0], bad[b][1], 1);
            ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_ERROR_INVALID_OPTION);
            ck_assert_ptr_null(ctx);
            ck_assert_msg(strstr(clattn_last_error(), bad[b][0]) != NULL, "%s='%s': %s",
                          bad[b][0], bad[b][1], clattn_last_error());
            unsetenv(bad[b][0]);
        }
        setenv("CLATTN_MMA_SINGLE", "0", 1);
        ck_assert_status(clattn_context_create(&o, &ctx), CLATTN_OK);
        clattn_context_destroy(ctx);
        unsetenv("CLATTN_MMA_SINGLE");
    }
    free(list);
}
END_TEST

START_TEST(null_context_queries)
{
    ck_assert_int_eq(clattn_context_backend(NULL), CLATTN_BACKEND_AUTO);
    ck_assert_str_eq(clattn_context_device(NULL), "");
    ck_assert_str_eq(clattn_context_variant(NULL), "");
    ck_assert_str_eq(clattn_context_log(NULL), "");
    clattn_context_destroy(NULL);
}
END_TEST

Suite *api_suite(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, status_strings);
    tcase_add_test(tc, dtype_conversions);
    tcase_add_test(tc, version);
    tcase_add_test(tc, shape_statuses);
    tcase_add_test(tc, grad_v_statuses);
    tcase_add_test(tc, packed_statuses);
    tcase_add_test(tc, modifier_statuses);
    tcase_add_test(tc, op_null_pointers);
    tcase_add_test(tc, options_statuses);
    tcase_add_test(tc, selector_matches_nothing);
    tcase_add_test(tc, environment_selects);
    tcase_add_test(tc, no_platform);
    tcase_add_test(tc, list_devices);
    tcase_add_test(tc, mma_knob_statuses);
    tcase_add_test(tc, null_context_queries);
    add_api_call_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}

