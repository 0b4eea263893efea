/* Status strings, the error message, shapes and their validation. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "philox.h"

/* Large enough for a typical build log; longer ones are cut. */
static _Thread_local char last_error[16384];

clattn_status clattn_fail(clattn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void clattn_fail_append(const char *text)
{
    size_t used = strlen(last_error);
    if (used + 1 < sizeof last_error)
        snprintf(last_error + used, sizeof last_error - used, "\n%s", text);
}

void clattn_clear_error(void) { last_error[0] = '\0'; }

const char *clattn_last_error(void) { return last_error; }

const char *clattn_version(void) { return CLATTN_VERSION; }

const char *clattn_status_string(clattn_status status)
{
    switch (status) {
#define NAME(s) \
    case s:     \
        return #s;
        NAME(CLATTN_OK)
        NAME(CLATTN_ERROR_NULL_POINTER)
        NAME(CLATTN_ERROR_ZERO_SIZE)
        NAME(CLATTN_ERROR_HEADS_NOT_DIVISIBLE)
        NAME(CLATTN_ERROR_HEAD_DIM_TOO_LARGE)
        NAME(CLATTN_ERROR_CAUSAL_SEQ_MISMATCH)
        NAME(CLATTN_ERROR_INVALID_SCALE)
        NAME(CLATTN_ERROR_SIZE_OVERFLOW)
        NAME(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE)
        NAME(CLATTN_ERROR_INVALID_OPTION)
        NAME(CLATTN_ERROR_UNKNOWN_VARIANT)
        NAME(CLATTN_ERROR_DEVICE_NOT_FOUND)
        NAME(CLATTN_ERROR_NO_PLATFORM)
        NAME(CLATTN_ERROR_BUILD_FAILED)
        NAME(CLATTN_ERROR_WORK_GROUP_TOO_LARGE)
        NAME(CLATTN_ERROR_OPENCL)
        NAME(CLATTN_ERROR_OUT_OF_MEMORY)
        NAME(CLATTN_ERROR_WRONG_BACKEND)
        NAME(CLATTN_ERROR_INVALID_BUFFER)
        NAME(CLATTN_ERROR_UNSUPPORTED_SHAPE)
        NAME(CLATTN_ERROR_INVALID_DTYPE)
        NAME(CLATTN_ERROR_INVALID_SEQLENS)
        NAME(CLATTN_ERROR_INVALID_MODIFIER)
#undef NAME
    }
    return "CLATTN_ERROR_UNKNOWN_STATUS";
}

const char *clattn_backend_name(clattn_backend backend)
{
    switch (backend) {
    case CLATTN_BACKEND_AUTO:
        return "auto";
    case CLATTN_BACKEND_OPENCL_GPU:
        return "opencl-gpu";
    case CLATTN_BACKEND_OPENCL_CPU:
        return "opencl-cpu";
    case CLATTN_BACKEND_NATIVE:
        return "native";
    }
    return "unknown";
}

clattn_options clattn_options_default(void)
{
    clattn_options o;
    memset(&o, 0, sizeof o);
    o.backend = CLATTN_BACKEND_AUTO;
    return o;
}

clattn_shape clattn_shape_default(void)
{
    clattn_shape s;
    memset(&s, 0, sizeof s);
    s.batch = 1;
    return s;
}

static int mul_fits(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* Elements of [d0][d1][d2][d3], with the byte count checked too. */
static int tensor_fits(size_t d0, size_t d1, size_t d2, size_t d3, size_t *elems)
{
    size_t n, bytes;
    return mul_fits(d0, d1, &n) && mul_fits(n, d2, &n) && mul_fits(n, d3, &n) &&
           mul_fits(n, sizeof(float), &bytes) && (*elems = n, 1);
}

/* Packed sequences' prefix sums: both or neither, from 0, non-decreasing,
 * within the rows given. */
static clattn_status check_seqlens(const clattn_shape *s)
{
    if (!s->cu_seqlens_q && !s->cu_seqlens_kv)
        return CLATTN_OK;
    if (!s->cu_seqlens_q || !s->cu_seqlens_kv)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER,
                           "cu_seqlens_%s is NULL while cu_seqlens_%s is set: packed sequences "
                           "need both",
                           s->cu_seqlens_q ? "kv" : "q", s->cu_seqlens_q ? "q" : "kv");
    const uint32_t *cu[2] = {s->cu_seqlens_q, s->cu_seqlens_kv};
    const char *name[2] = {"q", "kv"};
    const uint32_t rows[2] = {s->q_seq, s->kv_seq};
    for (int k = 0; k < 2; ++k) {
        if (cu[k][0] != 0)
            return clattn_fail(CLATTN_ERROR_INVALID_SEQLENS,
                               "cu_seqlens_%s[0] is %u; the prefix sums start from 0", name[k],
                               cu[k][0]);
        for (uint32_t i = 0; i < s->batch; ++i)
            if (cu[k][i + 1] < cu[k][i])
                return clattn_fail(CLATTN_ERROR_INVALID_SEQLENS,
                                   "cu_seqlens_%s decreases: entry %u is %u, entry %u is %u",
                                   name[k], i, cu[k][i], i + 1, cu[k][i + 1]);
        if (cu[k][s->batch] > rows[k])
            return clattn_fail(CLATTN_ERROR_INVALID_SEQLENS,
                               "cu_seqlens_%s[%u] is %u, past the %u rows given (%s_seq)",
                               name[k], s->batch, cu[k][s->batch], rows[k], name[k]);
    }
    return CLATTN_OK;
}

/* The score modifiers: a cap that is 0 or positive and finite, finite
 * slopes, dropout_p in [0, 1). */
static clattn_status check_modifiers(const clattn_shape *s)
{
    if (!(s->softcap >= 0.0f) || isinf(s->softcap))
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "softcap %g is not a finite positive number (0 means none)",
                           (double)s->softcap);
    if (s->alibi_slopes)
        for (uint32_t h = 0; h < s->num_heads; ++h)
            if (!isfinite(s->alibi_slopes[h]))
                return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                                   "alibi_slopes[%u] is %g, not a finite number", h,
                                   (double)s->alibi_slopes[h]);
    if (!(s->dropout_p >= 0.0f && s->dropout_p < 1.0f))
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "dropout_p %g is outside [0, 1)", (double)s->dropout_p);
    return CLATTN_OK;
}

unsigned clattn_modifiers(const clattn_shape *s)
{
    return (s->softcap > 0.0f ? CLATTN_MOD_SOFTCAP : 0u) |
           (s->alibi_slopes ? CLATTN_MOD_ALIBI : 0u) |
           (s->dropout_p > 0.0f ? CLATTN_MOD_DROPOUT : 0u);
}

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

clattn_status clattn_check_shape(const clattn_shape *s, clattn_sizes *sizes)
{
    if (!s)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "shape is NULL");
    if (!s->batch || !s->q_seq || !s->kv_seq || !s->num_heads || !s->num_kv_heads ||
        !s->head_dim)
        return clattn_fail(CLATTN_ERROR_ZERO_SIZE,
                           "zero size: batch %u, q_seq %u, kv_seq %u, num_heads %u, "
                           "num_kv_heads %u, head_dim %u",
                           s->batch, s->q_seq, s->kv_seq, s->num_heads, s->num_kv_heads,
                           s->head_dim);
    if (s->num_heads % s->num_kv_heads)
        return clattn_fail(CLATTN_ERROR_HEADS_NOT_DIVISIBLE,
                           "num_heads %u is not a multiple of num_kv_heads %u", s->num_heads,
                           s->num_kv_heads);
    if (s->head_dim > CLATTN_MAX_HEAD_DIM)
        return clattn_fail(CLATTN_ERROR_HEAD_DIM_TOO_LARGE, "head_dim %u is above %d",
                           s->head_dim, CLATTN_MAX_HEAD_DIM);
    /* The last position, offset + seq - 1, must fit in 32 bits. */
    if ((uint64_t)s->q_offset + s->q_seq - 1u > UINT32_MAX ||
        (uint64_t)s->kv_offset + s->kv_seq - 1u > UINT32_MAX)
        return clattn_fail(CLATTN_ERROR_SIZE_OVERFLOW,
                           "positions past 2^32 - 1: q_offset %u + q_seq %u, kv_offset %u + "
                           "kv_seq %u",
                           s->q_offset, s->q_seq, s->kv_offset, s->kv_seq);
    if (s->dtype != CLATTN_DTYPE_F32 && s->dtype != CLATTN_DTYPE_F16 &&
        s->dtype != CLATTN_DTYPE_BF16)
        return clattn_fail(CLATTN_ERROR_INVALID_DTYPE,
                           "dtype %d is not CLATTN_DTYPE_F32, _F16 or _BF16", (int)s->dtype);
    if (!(s->scale >= 0.0f) || isinf(s->scale))
        return clattn_fail(CLATTN_ERROR_INVALID_SCALE,
                           "scale %g is not a finite positive number (0 means default)",
                           (double)s->scale);
    clattn_status st = check_seqlens(s);
    if (st == CLATTN_OK)
        st = check_modifiers(s);
    if (st != CLATTN_OK)
        return st;
    const size_t batch = clattn_packed(s) ? 1u : s->batch; /* packed: no batch dimension */
    clattn_sizes z;
    if (!tensor_fits(batch, s->q_seq, s->num_heads, s->head_dim, &z.q) ||
        !tensor_fits(batch, s->kv_seq, s->num_kv_heads, s->head_dim, &z.kv) ||
        !tensor_fits(batch, s->q_seq, s->num_heads, 2, &z.lse))
        return clattn_fail(CLATTN_ERROR_SIZE_OVERFLOW,
                           "a tensor of batch %u, q_seq %u, kv_seq %u, %u heads, head_dim %u "
                           "does not fit in memory addresses",
                           s->batch, s->q_seq, s->kv_seq, s->num_heads, s->head_dim);
    if (sizes)
        *sizes = z;
    return CLATTN_OK;
}

clattn_status clattn_dropout_mask(const clattn_shape *shape, uint32_t b, uint32_t head,
                                  uint8_t *keep)
{
    clattn_clear_error();
    clattn_status st = clattn_check_shape(shape, NULL);
    if (st != CLATTN_OK)
        return st;
    if (!keep)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "keep is NULL");
    if (b >= shape->batch || head >= shape->num_heads)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "element %u, head %u: the shape has %u and %u", b, head,
                           shape->batch, shape->num_heads);
    const clattn_shape one = clattn_packed(shape) ? clattn_sequence_shape(shape, b) : *shape;
    const clattn_dropout d =
        clattn_dropout_of(one.dropout_p, one.dropout_seed, one.dropout_offset);
    const int64_t delta = clattn_mask_delta(&one);
    for (uint32_t pos = 0; pos < one.q_seq; ++pos)
        for (uint32_t t = 0; t < one.kv_seq; ++t)
            keep[(size_t)pos * one.kv_seq + t] =
                one.dropout_p > 0.0f
                    ? (uint8_t)clattn_dropout_keeps(&d, b, head,
                                                    clattn_query_position(&one, pos, delta),
                                                    one.kv_offset + t)
                    : 1u;
    return CLATTN_OK;
}

clattn_status clattn_shape_validate(const clattn_shape *shape)
{
    return clattn_check_shape(shape, NULL);
}

float clattn_effective_scale(const clattn_shape *s)
{
    return s->scale > 0.0f ? s->scale : 1.0f / sqrtf((float)s->head_dim);
}

int64_t clattn_mask_delta(const clattn_shape *s)
{
    const int64_t align =
        s->causal == CLATTN_CAUSAL_BOTTOM_RIGHT ? (int64_t)s->kv_seq - (int64_t)s->q_seq : 0;
    return (int64_t)s->q_offset - (int64_t)s->kv_offset + align;
}

static uint32_t clamp_to(int64_t x, uint32_t n)
{
    return x < 0 ? 0 : x > (int64_t)n ? n : (uint32_t)x;
}

void clattn_query_range(const clattn_shape *s, uint32_t t, uint32_t *start, uint32_t *end)
{
    /* Key t sees the queries i with t <= i + delta (causal) and
     * i + delta < t + window, in 64 bits so that nothing wraps. */
    const int64_t delta = clattn_mask_delta(s);
    *end = s->window > 0 ? clamp_to((int64_t)t - delta + s->window, s->q_seq) : s->q_seq;
    *start = s->causal ? clamp_to((int64_t)t - delta, *end) : 0;
}

void clattn_key_range(const clattn_shape *s, uint32_t pos, uint32_t *lo, uint32_t *hi)
{
    const int64_t at = (int64_t)pos + clattn_mask_delta(s);
    *hi = s->causal ? clamp_to(at + 1, s->kv_seq) : s->kv_seq;
    *lo = s->window > 0 ? clamp_to(at - s->window + 1, *hi) : 0;
}

/* Visible pairs of one uniform problem, over its heads and batch. */
static uint64_t uniform_pairs(const clattn_shape *s)
{
    uint64_t pairs = 0; /* at most q_seq * kv_seq < 2^64 */
    for (uint32_t pos = 0; pos < s->q_seq; ++pos) {
        uint32_t lo, hi;
        clattn_key_range(s, pos, &lo, &hi);
        pairs += hi - lo;
    }
    const uint64_t copies = (uint64_t)s->num_heads * s->batch;
    return pairs && copies > UINT64_MAX / pairs ? UINT64_MAX : pairs * copies;
}

uint64_t clattn_shape_visible_pairs(const clattn_shape *s)
{
    if (clattn_check_shape(s, NULL) != CLATTN_OK)
        return 0;
    if (!clattn_packed(s))
        return uniform_pairs(s);
    uint64_t pairs = 0;
    for (uint32_t i = 0; i < s->batch; ++i) {
        const clattn_shape one = clattn_sequence_shape(s, i);
        const uint64_t n = one.q_seq && one.kv_seq ? uniform_pairs(&one) : 0;
        pairs = n > UINT64_MAX - pairs ? UINT64_MAX : pairs + n;
    }
    return pairs;
}

clattn_status clattn_shape_from_seed(const uint32_t params[8], clattn_shape *shape)
{
    if (!params || !shape)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", params ? "shape" : "params");
    clattn_shape s = clattn_shape_default();
    s.q_seq = params[0];
    s.causal = params[1] == 0;
    s.kv_seq = s.causal ? params[0] : params[1];
    s.num_heads = params[2] >> 16;
    s.num_kv_heads = params[2] & 0xFFFFu;
    s.head_dim = params[3];
    s.window = params[4];
    *shape = s;
    return clattn_check_shape(&s, NULL);
}

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

/* 16-bit elements to float32 and back (round to nearest even; NaN stays a
 * quiet NaN, overflow becomes infinity), in portable C. */
static float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu, x;
    if (exp == 0x1fu)
        x = sign | 0x7f800000u | (mant << 13);
    else if (exp)
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (!mant)
        x = sign;
    else { /* subnormal: mant * 2^-24 */
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --e;
        }
        x = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    const int exp = (int)((x >> 23) & 0xffu);
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    const int e = exp - 112; /* the binary16 exponent field */
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t m = mant, shift = 13;
    if (e <= 0) { /* subnormal (or zero) in binary16 */
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        shift = (uint32_t)(14 - e);
    }
    uint32_t h = (e > 0 ? (uint32_t)e << 10 : 0u) | (m >> shift);
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u)))
        ++h; /* a carry rounds up into the exponent, as it should */
    return (uint16_t)(sign | h);
}

void clattn_to_f32(clattn_dtype dtype, const void *src, float *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    if (dtype != CLATTN_DTYPE_F16 && dtype != CLATTN_DTYPE_BF16)
        return;
    const uint16_t *h = src;
    for (size_t i = 0; i < n; ++i)
        dst[i] = dtype == CLATTN_DTYPE_BF16 ? clattn_bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}

void clattn_from_f32(clattn_dtype dtype, const float *src, void *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    if (dtype != CLATTN_DTYPE_F16 && dtype != CLATTN_DTYPE_BF16)
        return;
    uint16_t *h = dst;
    for (size_t i = 0; i < n; ++i)
        h[i] = dtype == CLATTN_DTYPE_BF16 ? clattn_f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}
