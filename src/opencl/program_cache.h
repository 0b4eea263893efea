/* The on-disk cache of built OpenCL programs (src/program_cache.c). */
#ifndef CLATTN_PROGRAM_CACHE_H
#define CLATTN_PROGRAM_CACHE_H

#include <stdint.h>

#include "clattn_cl.h"

/* A program built for device from the cached binary of source with
 * options, or NULL on a miss (no cache, no file, a stale or damaged one). */
cl_program clattn_cache_load(cl_context context, cl_device_id device, const char *source,
                             const char *options);

/* Stores a program built from source with options for device; 1 when it
 * was written. */
int clattn_cache_store(cl_program program, cl_device_id device, const char *source,
                       const char *options);

/* The cache's bound in bytes from CLATTN_CACHE_MAX_MB (MiB; 0: none;
 * default 1 GiB): 1, or 0 where the variable is not a whole number. */
int clattn_cache_bound(uint64_t *bytes);

#endif
