/* What check_programmable.c writes once for OpenCL and C, and lends to
 * check_bias.c and check_params.c: the relative-bias score function, the
 * prefix-LM mask, the shapes that carry them, and the loss that central
 * differences take; and check_bias.c's tensors and check_params.c's
 * checks, lent back. */
#ifndef CLATTN_TESTS_FUNCTIONS_H
#define CLATTN_TESTS_FUNCTIONS_H

#include <stdint.h>

#include "clattn.h"
#include "reference.h"

/* 17 buckets of k - q a query head, in relbias_table (fill_relbias), and
 * a batch element's offset, capped at 6 */
extern const char relbias_cl[];
float relbias_score(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p);
float relbias_ds(float s, uint32_t b, uint32_t h, uint32_t q, uint32_t k, const float *p);
extern float relbias_table[8 * 17];
void fill_relbias(void);
/* the first 10 positions see each other; the rest are causal */
extern const char prefix_cl[];
int prefix_mask_int(uint32_t b, uint32_t h, uint32_t q, uint32_t k);

clattn_shape with_score(clattn_shape s, const char *source,
                        float (*fn)(float, uint32_t, uint32_t, uint32_t, uint32_t, const float *),
                        float (*ds)(float, uint32_t, uint32_t, uint32_t, uint32_t, const float *),
                        const float *params, uint32_t count);
clattn_shape with_mask(clattn_shape s, const char *source,
                       int (*fn)(uint32_t, uint32_t, uint32_t, uint32_t));
/* L = sum of O . dO from the reference's forward of p. */
double loss(const problem *p);
/* check_params.c: the parameters' gradient of s (relbias_table's, dtable
 * the context's) on the device and from bfloat16 tensors, O and LSE of
 * p's forward given. */
void params_checks(clattn_context *ctx, const clattn_shape *s, const problem *p, const float *o,
                   const float *lse, const float *dtable);

/* check_bias.c: a bias of s's layout in [-2, 2) (with_inf: about one in
 * 11 -inf), and a bool mask hiding about one pair in four (rows_out:
 * query rows 2 mod 9 whole); malloc'd. */
float *make_bias(const clattn_shape *s, uint64_t seed, int with_inf);
uint8_t *make_bool(const clattn_shape *s, uint64_t seed, int rows_out);

#endif
