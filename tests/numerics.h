/* What the numeric suite (check_kernels.c) lends the suites of the cl_mem
 * calls, the program cache and device faults: a shape in a line, and every
 * op checked against the float64 reference. */
#ifndef CLATTN_TESTS_NUMERICS_H
#define CLATTN_TESTS_NUMERICS_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* A problem's shape, by name. Fields left 0 take defaults: batch 1,
 * kv_seq q_seq, kv_heads heads, q_gain 1 (Q's scale against the other
 * inputs: past 1, large logits); causal, window and scale none. */
typedef struct shape_case {
    uint32_t batch, q_seq, kv_seq, heads, kv_heads, head_dim;
    int causal;
    uint32_t window, window_right;
    float scale, q_gain;
} shape_case;

clattn_shape to_shape(const shape_case *c);
/* A case's q_gain, 1 where left 0. */
float case_gain(const shape_case *c);

/* The variant under test, for messages. */
extern const char *current_variant;

/* Fails the test when an element of got is past the tolerance of ref. */
void expect_close(const char *what, const clattn_shape *s, float q_gain, const float *got,
                  const double *ref, const double *mag, size_t n);

/* Runs every op on ctx for the shape and compares each with the float64
 * reference: forward, grad-V, backward, grad-Q and grad-K alone, and the
 * backward from this backend's own forward. */
void check_ops(clattn_context *ctx, const clattn_shape *s, float q_gain, uint64_t seed);
/* As check_ops(), the calls with shape s against the reference of shape
 * ref (the same sizes; other modifiers that should give the same results). */
void check_ops_against(clattn_context *ctx, const clattn_shape *s, const clattn_shape *ref,
                       float q_gain, uint64_t seed);

#endif
