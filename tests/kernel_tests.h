/* What the files of the numeric suite share (check_kernels.c,
 * check_edges.c, check_dtypes.c, check_packed.c, check_modifiers.c): helpers, case types,
 * and each file's tests by name with their loop counts, from which
 * check_kernels.c builds the suites. */
#ifndef CLATTN_TESTS_KERNEL_TESTS_H
#define CLATTN_TESTS_KERNEL_TESTS_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "clattn.h"
#include "numerics.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A test and the runs of its loop, [0, count). */
typedef struct loop_test {
    const TTest *test;
    int count;
} loop_test;

/* check_kernels.c */
/* A context for the next variant of the backend under test from *v on
 * (CLATTN_TEST_VARIANT keeps those it lists), with current_variant set;
 * NULL past the last. */
clattn_context *next_variant(size_t *v);
/* A shape on every variant of the backend, one context each. */
void run_shape(const clattn_shape *s, float q_gain, uint64_t seed);
/* Case i on every variant of the backend. */
void run_cases(const shape_case *cases, int i);
/* ALiBi slopes for up to 8 heads. */
extern const float slopes8[8];
/* Learnable sinks for up to 8 heads: dominant, small, negative and -inf (none). */
extern const float sinks8[8];
/* An array of n doubles (free() it). */
double *doubles(size_t n);
/* The LSE pairs: empty rows exactly as meganeura's forward, others close. */
void expect_lse(const clattn_shape *s, const float *got, const double *ref, size_t n);

/* check_edges.c */
typedef struct edge_tests {
    const TTest *non_finite;
    loop_test seed_blocks;
    const TTest *loop_cap;
} edge_tests;
edge_tests get_edge_tests(void);

/* check_dtypes.c */
/* An array of n 16-bit elements, NaN in both formats (free() it). */
uint16_t *halves(size_t n);
/* A 16-bit output against the float64 reference, within its rounding. */
void expect_close_16(const char *what, const clattn_shape *s, const uint16_t *got,
                     const double *ref, const double *mag, size_t n);
void check_ops_16(clattn_context *ctx, const clattn_shape *s, float q_gain, uint64_t seed);
/* Whether dtype runs here: f16's reference needs the compiler's _Float16. */
int dtype_runs(clattn_dtype dtype);
typedef struct dtype_tests {
    loop_test sweep, wgmma, modifiers_16, emulated_16, emulated, split, key_parts, launch_order,
        simulated;
    const TTest *exact, *buffers, *emulated_16_buffers, *emulated_16_exact;
    int wgmma_asked; /* CLATTN_MMA_WGMMA=1 */
} dtype_tests;
dtype_tests get_dtype_tests(void);

/* check_packed.c */
typedef struct packed_case {
    uint32_t heads, kv_heads, head_dim;
    int causal;
    uint32_t window, q_offset, kv_offset, count;
    uint32_t q[6], kv[6];
} packed_case;
typedef struct packed_tests {
    loop_test packed, offsets, splits, split_modifiers;
    const TTest *modifiers;
} packed_tests;
packed_tests get_packed_tests(void);
/* A packed case (GQA, bottom-right, an empty key sequence) with dropout
 * and the caller's functions of fns on ctx, against the reference. */
void packed_functions(clattn_context *ctx, uint64_t seed, const clattn_shape *fns);

/* check_modifiers.c */
/* The score modifiers against the float64 reference: a shape with softcap,
 * ALiBi (slopes8) or dropout, at offsets. */
typedef struct modifier_case {
    shape_case c;
    float softcap;
    int alibi;
    float dropout_p;
    uint32_t q_offset, kv_offset;
    int sinks; /* sinks8 */
} modifier_case;
/* The case with all three, also in bf16; and dropout alone at kv_offset
 * 0, where mma's keys start on a Philox block (at ALL_MODIFIERS' 5 each
 * row draws one block more), in bf16 too on mma; sinks with all three,
 * also in bf16. */
enum { ALL_MODIFIERS = 3, DROPOUT_ALIGNED = 2, SINKS_ALL = 6 };
clattn_shape modifier_shape(const modifier_case *m, uint64_t seed);
typedef struct modifier_tests {
    loop_test sweep;
    const TTest *tiled, *dropout_mask;
} modifier_tests;
modifier_tests get_modifier_tests(void);

/* check_programmable.c */
typedef struct programmable_tests {
    const TTest *builtins, *bias_table;
    loop_test masks;
    const TTest *finite_differences, *bad_functions, *packed, *tiled, *mma;
} programmable_tests;
programmable_tests get_programmable_tests(void);

/* check_bias.c */
typedef struct bias_tests {
    loop_test tensors;
    const TTest *gradient, *sixteen;
} bias_tests;
bias_tests get_bias_tests(void);
/* check_tuning.c's tests, for the cache suite: the tuning file's shapes,
 * its entries in calls, and the default's choice of variant. */
typedef struct tuning_tests {
    const TTest *file, *calls, *choice;
} tuning_tests;
tuning_tests get_tuning_tests(void);

#endif
