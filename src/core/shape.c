/* Shapes: defaults, validation, the mask's ranges, visible pairs and
 * meganeura's uniform block. */
#include <math.h>
#include <string.h>

#include "internal.h"

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
 * slopes, sinks finite or -inf, dropout_p in [0, 1). */
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
    if (s->sinks)
        for (uint32_t h = 0; h < s->num_heads; ++h)
            if (isnan(s->sinks[h]) || s->sinks[h] == INFINITY)
                return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                                   "sinks[%u] is %g: a sink is finite, or -inf for none", h,
                                   (double)s->sinks[h]);
    if (!(s->dropout_p >= 0.0f && s->dropout_p < 1.0f))
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "dropout_p %g is outside [0, 1)", (double)s->dropout_p);
    if ((s->score_fn && !s->score_fn[0]) || (s->mask_fn && !s->mask_fn[0]))
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER, "%s is an empty string (NULL for none)",
                           s->score_fn && !s->score_fn[0] ? "score_fn" : "mask_fn");
    if (!s->score_native != !s->score_ds_native)
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "score_native and score_ds_native go together: a score function "
                           "needs its derivative");
    if (s->score_params_count && !s->score_params)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "score_params is NULL with %u parameters",
                           s->score_params_count);
    if (s->bias_batch > 1 && s->bias_batch != s->batch)
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "bias_batch %u does not broadcast to batch %u: it is 1 or batch",
                           s->bias_batch, s->batch);
    if (s->bias_heads > 1 && s->bias_heads != s->num_heads)
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "bias_heads %u does not broadcast to %u query heads: it is 1 or "
                           "num_heads",
                           s->bias_heads, s->num_heads);
    if ((s->bias || s->bias_cl) && s->bias_dtype != CLATTN_DTYPE_F32 &&
        s->bias_dtype != CLATTN_DTYPE_BF16 && s->bias_dtype != CLATTN_DTYPE_F16)
        return clattn_fail(CLATTN_ERROR_INVALID_MODIFIER,
                           "bias_dtype %d is not a dtype: CLATTN_DTYPE_F32, _BF16 or _F16",
                           (int)s->bias_dtype);
    if ((s->bias || s->bool_mask || s->bias_cl || s->bool_mask_cl) && clattn_packed(s))
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "a bias or bool_mask with packed sequences: their rows differ per "
                           "sequence; a score or mask function takes the sequence's index");
    return CLATTN_OK;
}

unsigned clattn_modifiers(const clattn_shape *s)
{
    return (s->softcap > 0.0f ? CLATTN_MOD_SOFTCAP : 0u) |
           (s->alibi_slopes ? CLATTN_MOD_ALIBI : 0u) |
           (s->dropout_p > 0.0f ? CLATTN_MOD_DROPOUT : 0u) |
           (s->score_fn || s->score_native ? CLATTN_MOD_SCORE : 0u) |
           (s->mask_fn || s->mask_native ? CLATTN_MOD_MASK : 0u) |
           (s->bias || s->bias_cl ? CLATTN_MOD_BIAS : 0u) |
           (s->bool_mask || s->bool_mask_cl ? CLATTN_MOD_BOOL : 0u);
}

unsigned clattn_op_modifiers(const clattn_shape *s, clattn_op op)
{
    return clattn_modifiers(s) | (op == CLATTN_OP_FORWARD && s->sinks ? CLATTN_MOD_SINK : 0u);
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
    if (s->window_right && !s->causal)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "window_right %u without causal: the right side of a window needs "
                           "causal (its alignment); no right side is causal 0",
                           s->window_right);
    if (s->window_right > (uint32_t)INT32_MAX - 1)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "window_right %u is above 2^31 - 2; an unbounded right side is "
                           "causal 0",
                           s->window_right);
    clattn_status st = check_seqlens(s);
    if (st == CLATTN_OK)
        st = check_modifiers(s);
    if (st != CLATTN_OK)
        return st;
    const size_t batch = clattn_packed(s) ? 1u : s->batch; /* packed: no batch dimension */
    clattn_sizes z;
    size_t bias_elems;
    const int biased = s->bias || s->bool_mask || s->bias_cl || s->bool_mask_cl;
    if (!tensor_fits(batch, s->q_seq, s->num_heads, s->head_dim, &z.q) ||
        (biased && !tensor_fits(s->bias_batch ? s->bias_batch : 1u,
                                s->bias_heads ? s->bias_heads : 1u, s->q_seq, s->kv_seq,
                                &bias_elems)) ||
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

clattn_status clattn_shape_validate(const clattn_shape *shape)
{
    return clattn_check_shape(shape, NULL);
}

float clattn_effective_scale(const clattn_shape *s)
{
    return s->scale > 0.0f ? s->scale : 1.0f / sqrtf((float)s->head_dim);
}

int32_t clattn_mask_right(const clattn_shape *s)
{
    return s->causal ? (int32_t)s->window_right + 1 : 0;
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
    /* Key t sees the queries i with t <= i + delta + window_right
     * (causal) and i + delta < t + window, in 64 bits so that nothing
     * wraps. */
    const int64_t delta = clattn_mask_delta(s);
    *end = s->window > 0 ? clamp_to((int64_t)t - delta + s->window, s->q_seq) : s->q_seq;
    *start = s->causal ? clamp_to((int64_t)t - delta - s->window_right, *end) : 0;
}

void clattn_key_range(const clattn_shape *s, uint32_t pos, uint32_t *lo, uint32_t *hi)
{
    const int64_t at = (int64_t)pos + clattn_mask_delta(s);
    *hi = s->causal ? clamp_to(at + 1 + s->window_right, s->kv_seq) : s->kv_seq;
    *lo = s->window > 0 ? clamp_to(at - s->window + 1, *hi) : 0;
}

/* A query at mask position x (its row plus the mask's delta) sees the keys
 * [lo, hi): hi = x + 1 + right clamped to [0, kv_seq] under a causal mask
 * (right: window_right), else kv_seq; lo = x - window + 1 clamped at 0
 * under a window, else 0. Both are piecewise linear in x, with kinks at
 * -1 - right, kv_seq - 1 - right and window - 1 only. */
static int64_t key_hi(const clattn_shape *s, int64_t x)
{
    const int64_t kv = s->kv_seq, end = x + 1 + (int64_t)s->window_right;
    return !s->causal ? kv : end < 0 ? 0 : end > kv ? kv : end;
}

static int64_t key_lo(const clattn_shape *s, int64_t x)
{
    return s->window > 0 && x - (int64_t)s->window + 1 > 0 ? x - (int64_t)s->window + 1 : 0;
}

/* The sum over k < n of max(0, g0 + slope * k), slope -1, 0 or 1: the
 * positive terms form one arithmetic run. Each product is the run's exact
 * sum, which a uniform problem's count bounds below 2^64. */
static uint64_t positive_run(int64_t g0, int64_t slope, uint64_t n)
{
    uint64_t count;
    int64_t first;
    if (slope == 0) {
        return g0 > 0 ? (uint64_t)g0 * n : 0;
    } else if (slope > 0) {
        const uint64_t skip = g0 > 0 ? 0 : (uint64_t)(1 - g0);
        if (skip >= n)
            return 0;
        count = n - skip;
        first = g0 + (int64_t)skip;
    } else {
        count = g0 > 0 ? ((uint64_t)g0 < n ? (uint64_t)g0 : n) : 0;
        first = g0 - (int64_t)count + 1; /* the run's smallest term */
    }
    const uint64_t ends = (uint64_t)first * 2 + (count - 1); /* first + last */
    return count % 2 == 0 ? count / 2 * ends : count * (ends / 2);
}

/* Visible pairs of one uniform problem, over its heads and batch: the rows'
 * counts summed in closed form over the pieces between the kinks. */
static uint64_t uniform_pairs(const clattn_shape *s)
{
    const int64_t x0 = clattn_mask_delta(s), x1 = x0 + (int64_t)s->q_seq - 1;
    const int64_t right = s->causal ? (int64_t)s->window_right : 0;
    int64_t cuts[3] = {-1 - right, (int64_t)s->kv_seq - 1 - right,
                       s->window > 0 ? (int64_t)s->window - 1 : -1};
    for (int i = 0; i < 3; ++i) /* sorted, so the pieces come in order */
        for (int j = i + 1; j < 3; ++j)
            if (cuts[j] < cuts[i]) {
                const int64_t t = cuts[i];
                cuts[i] = cuts[j];
                cuts[j] = t;
            }
    uint64_t pairs = 0;
    int64_t a = x0;
    for (int i = 0; i <= 3 && a <= x1; ++i) {
        const int64_t b = i < 3 && cuts[i] >= a && cuts[i] < x1 ? cuts[i] : i < 3 ? a - 1 : x1;
        if (b < a)
            continue;
        const uint64_t n = (uint64_t)(b - a + 1);
        const int64_t g0 = key_hi(s, a) - key_lo(s, a);
        const int64_t slope = n > 1 ? key_hi(s, a + 1) - key_lo(s, a + 1) - g0 : 0;
        pairs += positive_run(g0, slope, n);
        a = b + 1;
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
