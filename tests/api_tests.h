/* What check_api.c and check_api_calls.c share. */
#ifndef CLATTN_TESTS_API_TESTS_H
#define CLATTN_TESTS_API_TESTS_H

#include <check.h>

#include "clattn.h"

/* 8 positions, 4 query heads on 2 KV heads, head_dim 16. */
clattn_shape small_shape(void);
/* A native context with that many threads (0: the default). */
clattn_context *native_context(int threads);
/* check_api_calls.c: its tests, added to tc. */
void add_api_call_tests(TCase *tc);

#endif
