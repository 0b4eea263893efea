/* Each function is written once, in the subset that OpenCL C and C share:
 * TWICE() keeps its text, unexpanded, for the OpenCL backends and compiles
 * it here as C, under the names the macros its file gives it, for native
 * and the reference. Included once a test file, before its functions. */
#ifndef CLATTN_TESTS_TWICE_H
#define CLATTN_TESTS_TWICE_H

#include <math.h>

typedef unsigned int uint;
#define __global
/* as the C wrappers define it */
static inline float clattn_tanh(float y) { return tanhf(y); }
#define TWICE(name, ...)              \
    const char name[] = #__VA_ARGS__; \
    __VA_ARGS__
#pragma GCC diagnostic ignored "-Wunused-parameter"

#endif
