#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float uniform(uint64_t *x)
{
    /* splitmix64: independent of the library's own generators */
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 16777216.0 * 2.0 - 1.0);
}

int ref_visible(const clattn_shape *s, uint32_t pos, uint32_t t)
{
    /* Global positions: the masks compare q_offset + pos with kv_offset + t;
     * bottom-right alignment moves the queries by kv_seq - q_seq. */
    const int64_t shift =
        s->causal == CLATTN_CAUSAL_BOTTOM_RIGHT ? (int64_t)s->kv_seq - (int64_t)s->q_seq : 0;
    const int64_t at = (int64_t)s->q_offset + pos + shift, key = (int64_t)s->kv_offset + t;
    return t < s->kv_seq && (!s->causal || key <= at + (int64_t)s->window_right) &&
           (s->window == 0 || at < key + (int64_t)s->window);
}

static double ref_scale(const clattn_shape *s)
{
    return s->scale > 0.0f ? (double)s->scale : 1.0 / sqrt((double)s->head_dim);
}

/* The global positions of query row pos and key t. */
static int64_t query_at(const clattn_shape *s, size_t pos)
{
    const int64_t shift =
        s->causal == CLATTN_CAUSAL_BOTTOM_RIGHT ? (int64_t)s->kv_seq - (int64_t)s->q_seq : 0;
    return (int64_t)s->q_offset + (int64_t)pos + shift;
}

void ref_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    static const uint32_t mul[2] = {0xD2511F53u, 0xCD9E8D57u};
    static const uint32_t weyl[2] = {0x9E3779B9u, 0xBB67AE85u};
    uint32_t x[4], k[2] = {key[0], key[1]};
    memcpy(x, ctr, sizeof x);
    for (int r = 1; r <= 10; ++r) {
        if (r >= 2) /* the key schedule: bumped before rounds 2 .. 10 */
            for (int i = 0; i < 2; ++i)
                k[i] = (uint32_t)(k[i] + weyl[i]);
        const uint64_t p0 = (uint64_t)mul[0] * x[0], p1 = (uint64_t)mul[1] * x[2];
        const uint32_t y[4] = {(uint32_t)(p1 >> 32) ^ x[1] ^ k[0], (uint32_t)p1,
                               (uint32_t)(p0 >> 32) ^ x[3] ^ k[1], (uint32_t)p0};
        memcpy(x, y, sizeof x);
    }
    memcpy(out, x, sizeof x);
}

double ref_dropout(const clattn_shape *s, uint32_t b, uint32_t head, uint32_t pos, uint32_t t)
{
    if (!(s->dropout_p > 0.0f))
        return 1.0;
    /* the call's key: Philox of (offset, 0, 0) under the seed */
    const uint32_t seed[2] = {(uint32_t)(s->dropout_seed & 0xFFFFFFFFu),
                              (uint32_t)(s->dropout_seed >> 32)};
    const uint32_t at[4] = {(uint32_t)(s->dropout_offset & 0xFFFFFFFFu),
                            (uint32_t)(s->dropout_offset >> 32), 0, 0};
    uint32_t step[4];
    ref_philox(at, seed, step);
    const uint32_t T = s->kv_offset + t, P = (uint32_t)query_at(s, pos);
    const uint32_t ctr[4] = {T / 16u, P, head, b}, key[2] = {step[0], step[1]};
    uint32_t draw[4];
    ref_philox(ctr, key, draw);
    /* key T's 8 bits: byte T % 4 (low first) of word T % 16 / 4; u = bits
     * / 2^8 is kept iff u >= p */
    const uint32_t bits = draw[T % 16u / 4u] / (1u << (8u * (T % 4u))) % 256u;
    return (double)bits / 256.0 >= (double)s->dropout_p ? 1.0 / (1.0 - (double)s->dropout_p)
                                                         : 0.0;
}

/* The element of the shape's bias and bool mask of (b, head, pos, t),
 * broadcast where their dimension is 1. */
static size_t bias_at(const clattn_shape *s, size_t b, size_t head, size_t pos, size_t t)
{
    const size_t heads = s->bias_heads > 1 ? s->bias_heads : 1;
    return (((s->bias_batch > 1 ? b : 0) * heads + (heads > 1 ? head : 0)) * s->q_seq + pos) *
               s->kv_seq + t;
}

/* Element i of the shape's bias, of its bias_dtype, by the tests' own
 * conversions. */
static double bias_of(const clattn_shape *s, size_t i)
{
    if (s->bias_dtype == CLATTN_DTYPE_F32)
        return (double)((const float *)s->bias)[i];
    return (double)from_16(((const uint16_t *)s->bias)[i], s->bias_dtype);
}

/* The score of (b, pos, head) against key t, from the float inputs, with
 * the softcap and ALiBi modifiers; *dz (when not NULL) gets the softcap's
 * derivative. */
static double score_d(const problem *p, size_t b, size_t pos, size_t head, size_t t,
                      double *dz)
{
    const clattn_shape *s = &p->s;
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const float *qr = p->q + ((b * s->q_seq + pos) * s->num_heads + head) * D;
    const float *kr = p->k + ((b * s->kv_seq + t) * s->num_kv_heads + head / group) * D;
    double dot = 0.0;
    for (size_t d = 0; d < D; ++d)
        dot += (double)qr[d] * (double)kr[d];
    double x = dot * ref_scale(s), g = 1.0;
    if (s->softcap > 0.0f) {
        const double th = tanh(x / s->softcap);
        x = s->softcap * th;
        g = 1.0 - th * th;
    }
    if (s->alibi_slopes)
        x -= (double)s->alibi_slopes[head] *
             fabs((double)(query_at(s, pos) - ((int64_t)s->kv_offset + (int64_t)t)));
    if (s->score_native) { /* the shape's score function, its C form, in float */
        const uint32_t bb = (uint32_t)(p->seq_base + b), P = (uint32_t)query_at(s, pos),
                       T = (uint32_t)(s->kv_offset + t);
        g *= (double)s->score_ds_native((float)x, bb, (uint32_t)head, P, T, s->score_params);
        x = (double)s->score_native((float)x, bb, (uint32_t)head, P, T, s->score_params);
    }
    if (s->bias)
        x += bias_of(s, bias_at(s, b, head, pos, t));
    if (dz)
        *dz = g;
    return x;
}

/* Whether query row pos of head `head` of element b sees key t: the masks,
 * the bool mask and a bias not -inf, then the shape's mask function (its
 * C form) at the global positions. */
static int seen(const problem *p, size_t b, size_t pos, size_t head, size_t t)
{
    const clattn_shape *s = &p->s;
    return ref_visible(s, (uint32_t)pos, (uint32_t)t) &&
           (!s->bool_mask || s->bool_mask[bias_at(s, b, head, pos, t)]) &&
           (!s->bias || bias_of(s, bias_at(s, b, head, pos, t)) != -INFINITY) &&
           (!s->mask_native ||
            s->mask_native((uint32_t)(p->seq_base + b), (uint32_t)head,
                           (uint32_t)query_at(s, pos), (uint32_t)(s->kv_offset + t)));
}

static double score(const problem *p, size_t b, size_t pos, size_t head, size_t t)
{
    return score_d(p, b, pos, head, t, NULL);
}

void problem_make(problem *p, const clattn_shape *s, uint64_t seed, float q_gain)
{
    memset(p, 0, sizeof *p);
    p->s = *s;
    p->nq = (size_t)s->batch * s->q_seq * s->num_heads * s->head_dim;
    p->nkv = (size_t)s->batch * s->kv_seq * s->num_kv_heads * s->head_dim;
    p->nlse = (size_t)s->batch * s->q_seq * s->num_heads * 2;
    p->q = malloc(p->nq * sizeof(float));
    p->d_out = malloc(p->nq * sizeof(float));
    p->k = malloc(p->nkv * sizeof(float));
    p->lse = malloc(p->nlse * sizeof(float));
    p->v = malloc(p->nkv * sizeof(float));
    p->o = malloc(p->nq * sizeof(float));
    if (!p->q || !p->d_out || !p->k || !p->lse || !p->v || !p->o)
        abort(); /* a test harness may; the library never does */
    uint64_t x = seed;
    for (size_t i = 0; i < p->nq; ++i) {
        p->q[i] = uniform(&x) * q_gain;
        p->d_out[i] = uniform(&x);
    }
    for (size_t i = 0; i < p->nkv; ++i)
        p->k[i] = uniform(&x);
    for (size_t i = 0; i < p->nkv; ++i)
        p->v[i] = uniform(&x);
    double *o = malloc(p->nq * sizeof(double)), *mag = malloc(p->nq * sizeof(double));
    double *lse = malloc(p->nlse * sizeof(double));
    if (!o || !mag || !lse)
        abort();
    ref_forward(p, o, mag, lse);
    for (size_t i = 0; i < p->nq; ++i)
        p->o[i] = (float)o[i];
    for (size_t i = 0; i < p->nlse; ++i)
        p->lse[i] = (float)lse[i];
    free(o);
    free(mag);
    free(lse);
}

void ref_forward(const problem *p, double *o, double *o_mag, double *lse)
{
    const clattn_shape *s = &p->s;
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    memset(o, 0, p->nq * sizeof(double));
    memset(o_mag, 0, p->nq * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t pos = 0; pos < s->q_seq; ++pos)
            for (size_t h = 0; h < s->num_heads; ++h) {
                const size_t row = (b * s->q_seq + pos) * s->num_heads + h;
                double m = -1e30, l = -1e30, sum = 0.0;
                int any = 0;
                for (size_t t = 0; t < s->kv_seq; ++t)
                    if (seen(p, b, pos, h, t)) {
                        double sc = score(p, b, pos, h, t);
                        m = any && m > sc ? m : sc;
                        any = 1;
                    }
                /* a sink: one more logit in the sum, with no value */
                const double sink = s->sinks ? (double)s->sinks[h] : -INFINITY;
                if (sink > -INFINITY) {
                    m = any && m > sink ? m : sink;
                    any = 1;
                    sum = exp(sink - m);
                }
                if (any) {
                    for (size_t t = 0; t < s->kv_seq; ++t)
                        if (seen(p, b, pos, h, t))
                            sum += exp(score(p, b, pos, h, t) - m);
                    l = log(sum);
                    for (size_t t = 0; t < s->kv_seq; ++t) {
                        if (!seen(p, b, pos, h, t))
                            continue;
                        const double pr = exp(score(p, b, pos, h, t) - m - l) *
                                          ref_dropout(s, (uint32_t)(p->seq_base + b),
                                                      (uint32_t)h, (uint32_t)pos, (uint32_t)t);
                        const float *vr = p->v + ((b * s->kv_seq + t) * s->num_kv_heads + h / group) * D;
                        for (size_t d = 0; d < D; ++d) {
                            o[row * D + d] += pr * vr[d];
                            o_mag[row * D + d] += pr * fabs((double)vr[d]);
                        }
                    }
                }
                lse[2 * row] = m;
                lse[2 * row + 1] = l;
            }
}

/* Dsum = dO . O of query row `row` (float64 over the float inputs), and
 * in *mag the sum of its terms' magnitudes. */
static double row_dsum(const problem *p, size_t row, double *mag)
{
    const size_t D = p->s.head_dim;
    const float *dor = p->d_out + row * D, *orow = p->o + row * D;
    double dsum = 0.0;
    *mag = 0.0;
    for (size_t d = 0; d < D; ++d) {
        dsum += (double)dor[d] * orow[d];
        *mag += fabs((double)dor[d] * orow[d]);
    }
    return dsum;
}

void ref_backward(const problem *p, double *dq, double *dq_mag, double *dk, double *dk_mag,
                  double *dv, double *dv_mag)
{
    const clattn_shape *s = &p->s;
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const double scale = ref_scale(s);
    memset(dq, 0, p->nq * sizeof(double));
    memset(dq_mag, 0, p->nq * sizeof(double));
    memset(dk, 0, p->nkv * sizeof(double));
    memset(dk_mag, 0, p->nkv * sizeof(double));
    memset(dv, 0, p->nkv * sizeof(double));
    memset(dv_mag, 0, p->nkv * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t pos = 0; pos < s->q_seq; ++pos)
            for (size_t h = 0; h < s->num_heads; ++h) {
                const size_t row = (b * s->q_seq + pos) * s->num_heads + h;
                const float *qr = p->q + row * D, *dor = p->d_out + row * D;
                double dsum_mag;
                const double dsum = row_dsum(p, row, &dsum_mag);
                for (size_t t = 0; t < s->kv_seq; ++t) {
                    if (!seen(p, b, pos, h, t))
                        continue;
                    const size_t kv = ((b * s->kv_seq + t) * s->num_kv_heads + h / group) * D;
                    const float *kr = p->k + kv, *vr = p->v + kv;
                    double dz;
                    const double x = score_d(p, b, pos, h, t, &dz) - p->lse[2 * row];
                    const double pr0 = exp((x < 0.0 ? x : 0.0) - p->lse[2 * row + 1]);
                    const double keep = ref_dropout(s, (uint32_t)(p->seq_base + b), (uint32_t)h,
                                                    (uint32_t)pos, (uint32_t)t);
                    const double pr = pr0 * keep; /* the probability O took */
                    double dp = 0.0, dp_mag = 0.0;
                    for (size_t d = 0; d < D; ++d) {
                        dp += (double)dor[d] * vr[d];
                        dp_mag += fabs((double)dor[d] * vr[d]);
                    }
                    const double ds = pr0 * (keep * dp - dsum) * dz,
                                 ds_mag = pr0 * (keep * dp_mag + dsum_mag) * dz;
                    for (size_t d = 0; d < D; ++d) {
                        dq[row * D + d] += scale * ds * kr[d];
                        dq_mag[row * D + d] += scale * ds_mag * fabs((double)kr[d]);
                        dk[kv + d] += scale * ds * qr[d];
                        dk_mag[kv + d] += scale * ds_mag * fabs((double)qr[d]);
                        dv[kv + d] += pr * dor[d];
                        dv_mag[kv + d] += fabs(pr * dor[d]);
                    }
                }
            }
}

void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->d_out);
    free(p->lse);
    free(p->v);
    free(p->o);
    memset(p, 0, sizeof *p);
}

void ref_grad_v(const problem *p, double *dv, double *mag)
{
    const clattn_shape *s = &p->s;
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    memset(dv, 0, p->nkv * sizeof(double));
    memset(mag, 0, p->nkv * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t t = 0; t < s->kv_seq; ++t)
            for (size_t kvh = 0; kvh < s->num_kv_heads; ++kvh) {
                double *out = dv + ((b * s->kv_seq + t) * s->num_kv_heads + kvh) * D;
                double *mg = mag + ((b * s->kv_seq + t) * s->num_kv_heads + kvh) * D;
                for (size_t pos = 0; pos < s->q_seq; ++pos) {
                    if (!ref_visible(s, (uint32_t)pos, (uint32_t)t))
                        continue;
                    for (size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
                        if (!seen(p, b, pos, h, t))
                            continue;
                        const float *pair =
                            p->lse + ((b * s->q_seq + pos) * s->num_heads + h) * 2;
                        double x = score(p, b, pos, h, t) - pair[0];
                        double pr = exp((x < 0.0 ? x : 0.0) - pair[1]) *
                                    ref_dropout(s, (uint32_t)(p->seq_base + b), (uint32_t)h,
                                                (uint32_t)pos, (uint32_t)t);
                        const float *o =
                            p->d_out + ((b * s->q_seq + pos) * s->num_heads + h) * D;
                        for (size_t d = 0; d < D; ++d) {
                            out[d] += pr * o[d];
                            mg[d] += fabs(pr * o[d]);
                        }
                    }
                }
            }
}

void seed_grad_v(const uint32_t params[8], const float *d_out, const float *q, const float *k,
                 const float *lse, double *dv)
{
    const uint32_t q_seq = params[0], kv_seq = params[1];
    const uint32_t num_heads = params[2] >> 16, num_kv_heads = params[2] & 0xFFFFu;
    const uint32_t head_dim = params[3], window = params[4];
    const uint32_t effective_kv_seq = kv_seq == 0 ? q_seq : kv_seq;
    const uint32_t heads_per_kv = num_heads / num_kv_heads;
    const uint32_t kv_dim = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
    const double scale = 1.0 / sqrt((double)head_dim);
    /* Dispatch [kv_seq, num_kv_heads, 1], 64 lanes: tid walks head_dim. */
    for (uint32_t t = 0; t < effective_kv_seq; ++t)
        for (uint32_t kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
            const uint32_t kv_base = t * kv_dim + kv_head * head_dim;
            const uint32_t start_pos = kv_seq == 0 ? t : 0;
            const uint32_t end_pos =
                window > 0 ? (q_seq < t + window ? q_seq : t + window) : q_seq;
            for (uint32_t tid = 0; tid < 64; ++tid) {
                double my_dv = 0.0;
                for (uint32_t pos = start_pos; pos < end_pos; ++pos)
                    for (uint32_t head_rel = 0; head_rel < heads_per_kv; ++head_rel) {
                        const uint32_t head = kv_head * heads_per_kv + head_rel;
                        const uint32_t q_base = pos * q_dim + head * head_dim;
                        double dot = 0.0; /* the tree reduction, in one sum */
                        for (uint32_t i = 0; i < 64; ++i)
                            dot += (double)q[q_base + i] * k[kv_base + i];
                        const double sc = dot * scale;
                        const uint32_t lse_idx = (pos * num_heads + head) * 2;
                        const double x = sc - lse[lse_idx];
                        const double p_t = exp((x < 0.0 ? x : 0.0) - lse[lse_idx + 1]);
                        my_dv += p_t * d_out[q_base + tid];
                    }
                dv[kv_base + tid] = my_dv;
            }
        }
}

double worst_error(const float *got, const double *ref, const double *mag, size_t n,
                   size_t *worst_at)
{
    double worst = 0.0;
    *worst_at = 0;
    for (size_t i = 0; i < n; ++i) {
        double e = fabs((double)got[i] - ref[i]) / (TOL_REL * mag[i] + TOL_ABS);
        if (isnan(e))
            e = INFINITY;
        if (e > worst) {
            worst = e;
            *worst_at = i;
        }
    }
    return worst;
}

float *nan_array(size_t n)
{
    float *a = malloc((n ? n : 1) * sizeof(float));
    if (!a)
        abort();
    for (size_t i = 0; i < n; ++i)
        a[i] = NAN;
    return a;
}

float from_16(uint16_t h, clattn_dtype dtype)
{
    if (dtype == CLATTN_DTYPE_BF16) {
        const uint32_t x = (uint32_t)h << 16;
        float f;
        memcpy(&f, &x, sizeof f);
        return f;
    }
#if HAVE_F16
    _Float16 f;
    memcpy(&f, &h, sizeof h);
    return (float)f;
#else
    return NAN;
#endif
}

void round_16(float *x, uint16_t *out, size_t n, clattn_dtype dtype)
{
    for (size_t i = 0; i < n; ++i) {
        if (dtype == CLATTN_DTYPE_BF16) {
            uint32_t b;
            memcpy(&b, &x[i], sizeof b);
            out[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
        } else {
#if HAVE_F16
            const _Float16 f = (_Float16)x[i];
            memcpy(&out[i], &f, sizeof f);
#endif
        }
        x[i] = from_16(out[i], dtype);
    }
}

void ref_grad_sinks(const problem *p, double *d_sinks, double *mag)
{
    const clattn_shape *s = &p->s;
    const size_t H = s->num_heads, D = s->head_dim, rows = p->nlse / 2;
    const double eps = 1.0 / 1024.0;
    float *moved = malloc(H * sizeof(float));
    double *o = malloc(p->nq * sizeof(double)), *o_mag = malloc(p->nq * sizeof(double));
    double *lse = malloc(p->nlse * sizeof(double)), *loss = calloc(2 * H, sizeof(double));
    double *step = malloc(H * sizeof(double));
    if (!moved || !o || !o_mag || !lse || !loss || !step)
        abort();
    problem q = *p;
    q.s.sinks = moved;
    for (int side = 0; side < 2; ++side) {
        for (size_t h = 0; h < H; ++h)
            moved[h] = (float)((double)s->sinks[h] + (side ? eps : -eps));
        ref_forward(&q, o, o_mag, lse);
        for (size_t r = 0; r < rows; ++r)
            for (size_t d = 0; d < D; ++d)
                loss[side * H + r % H] += (double)p->d_out[r * D + d] * o[r * D + d];
        for (size_t h = 0; h < H; ++h)
            step[h] = side ? (double)moved[h] - step[h] : (double)moved[h];
    }
    for (size_t h = 0; h < H; ++h) {
        d_sinks[h] = isinf(s->sinks[h]) ? 0.0 : (loss[H + h] - loss[h]) / step[h];
        mag[h] = 0.0;
    }
    for (size_t r = 0; r < rows; ++r) {
        const size_t h = r % H;
        double dot = 0.0;
        for (size_t d = 0; d < D; ++d)
            dot += fabs((double)p->d_out[r * D + d] * p->o[r * D + d]);
        if (p->lse[2 * r] != -1e30f)
            mag[h] += exp((double)s->sinks[h] - ((double)p->lse[2 * r] + p->lse[2 * r + 1])) * dot;
    }
    free(moved);
    free(o);
    free(o_mag);
    free(lse);
    free(loss);
    free(step);
}

void ref_grad_bias(const problem *p, double *d_bias, double *mag)
{
    const clattn_shape *s = &p->s;
    const size_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const size_t heads = s->bias_heads > 1 ? s->bias_heads : 1;
    const size_t n = (s->bias_batch > 1 ? s->bias_batch : 1) * heads * s->q_seq * s->kv_seq;
    memset(d_bias, 0, n * sizeof(double));
    memset(mag, 0, n * sizeof(double));
    for (size_t b = 0; b < s->batch; ++b)
        for (size_t pos = 0; pos < s->q_seq; ++pos)
            for (size_t h = 0; h < s->num_heads; ++h) {
                const size_t row = (b * s->q_seq + pos) * s->num_heads + h;
                const float *dor = p->d_out + row * D;
                double dsum_mag;
                const double dsum = row_dsum(p, row, &dsum_mag);
                for (size_t t = 0; t < s->kv_seq; ++t) {
                    if (!seen(p, b, pos, h, t))
                        continue;
                    const float *vr =
                        p->v + ((b * s->kv_seq + t) * s->num_kv_heads + h / group) * D;
                    const double x = score(p, b, pos, h, t) - p->lse[2 * row];
                    const double pr = exp((x < 0.0 ? x : 0.0) - p->lse[2 * row + 1]);
                    const double keep = ref_dropout(s, (uint32_t)(p->seq_base + b), (uint32_t)h,
                                                    (uint32_t)pos, (uint32_t)t);
                    double dp = 0.0, dp_mag = 0.0;
                    for (size_t d = 0; d < D; ++d) {
                        dp += (double)dor[d] * vr[d];
                        dp_mag += fabs((double)dor[d] * vr[d]);
                    }
                    const size_t at = bias_at(s, b, h, pos, t);
                    d_bias[at] += pr * (keep * dp - dsum);
                    mag[at] += pr * (keep * dp_mag + dsum_mag);
                }
            }
}
