/* The float64 reference the tests compare every backend against, and the
 * random problems they run. */
#ifndef CLATTN_TESTS_REFERENCE_H
#define CLATTN_TESTS_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* Tolerance of every comparison: |got - ref| <= TOL_REL * mag + TOL_ABS per
 * element, where mag is the sum of the magnitudes of the terms summed into
 * it (for dV: sum of |p * dO|). float32 sums of n terms drift by about
 * sqrt(n) * 6e-8 of mag; 1e-4 leaves room for n in the tens of thousands
 * and for exp() of scores rounded in float32, and still fails for any
 * wrong term. */
#define TOL_REL 1e-4
#define TOL_ABS 1e-6

typedef struct problem {
    clattn_shape s;
    size_t nq, nkv, nlse; /* elements */
    float *q, *k, *v, *d_out, *o, *lse;
    uint32_t seq_base; /* dropout's b of element 0: a packed sequence's index */
} problem;

/* Random Q, K, V and dO in [-1, 1) from seed, Q scaled by q_gain (large
 * logits), and the forward's O and LSE pairs computed in float64 and
 * rounded to float. */
void problem_make(problem *p, const clattn_shape *s, uint64_t seed, float q_gain);
void problem_free(problem *p);

/* Is key t visible to query pos, by the contract's rule? */
int ref_visible(const clattn_shape *s, uint32_t pos, uint32_t t);

/* Philox4x32-10 (Salmon et al., SC 2011), written apart from the
 * library's: out = philox(ctr, key). */
void ref_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Dropout's factor of (b, head, pos, t) by docs/numerics.md: 0 where the
 * pair is dropped, 1 / (1 - p) where kept, 1 without dropout. */
double ref_dropout(const clattn_shape *s, uint32_t b, uint32_t head, uint32_t pos, uint32_t t);

/* dV in float64 from the problem's float inputs; mag receives the sum of
 * |p * dO| of each element. Both arrays hold p->nkv doubles. */
void ref_grad_v(const problem *p, double *dv, double *mag);

/* The forward in float64: O with its magnitudes (sum of p * |V|) and the
 * LSE pairs; each array holds p->nq or p->nlse doubles. */
void ref_forward(const problem *p, double *o, double *o_mag, double *lse);

/* dQ, dK and dV in float64 from the problem's float inputs, O and LSE, with
 * the magnitude of the terms summed into each element (the cancellation in
 * dO.V - Dsum counted at full size). */
void ref_backward(const problem *p, double *dq, double *dq_mag, double *dk, double *dk_mag,
                  double *dv, double *dv_mag);

/* The sinks' gradient d(sum of dO . O)/d sigma_h in float64 by central
 * differences of ref_forward (the sinks moved by 2^-10 each way), and its
 * magnitude: the sum over the head's rows of exp(sigma - L) |dO| . |O|.
 * Both arrays hold num_heads doubles; p->s.sinks is set. */
void ref_grad_sinks(const problem *p, double *d_sinks, double *mag);

/* The bias's gradient: each pair's dS = p (keep dP - Dsum), summed over
 * the batch elements and heads that p->s.bias_batch and bias_heads
 * broadcast, from the problem's float O and LSE; mag: the sums of its
 * terms' magnitudes. Both hold the bias's elements. */
void ref_grad_bias(const problem *p, double *d_bias, double *mag);

/* The seed's algorithm, transliterated from mha_grad_v.wgsl: params is its
 * uniform block, head_dim must be 64 as its work-group is. In float64. */
void seed_grad_v(const uint32_t params[8], const float *d_out, const float *q, const float *k,
                 const float *lse, double *dv);

/* The worst of |got - ref| / (TOL_REL * mag + TOL_ABS) over n elements: at
 * most 1 passes. NaN anywhere gives infinity. *worst_at gets its index. */
double worst_error(const float *got, const double *ref, const double *mag, size_t n,
                   size_t *worst_at);

/* 16-bit tensors, by the tests' own conversions (not the library's): bf16
 * by its bits, f16 by the compiler's _Float16 where it has one (HAVE_F16;
 * else f16 cases are not run, and say so). from_16 gives NaN for f16
 * without _Float16. */
#if defined(__FLT16_MAX__)
#define HAVE_F16 1
#else
#define HAVE_F16 0
#endif
float from_16(uint16_t h, clattn_dtype dtype);
/* x rounded to nearest even in dtype, in place; the bits in out. */
void round_16(float *x, uint16_t *out, size_t n, clattn_dtype dtype);

/* A float array of n NaNs, so that unwritten outputs fail comparisons. */
float *nan_array(size_t n);

#endif
