/* The native backend's thread pool: a context's helper threads, started on
 * its first threaded call and kept until it is destroyed, each call's
 * rounds of jobs taken from a shared counter (pool.c says how they wait). */
#ifndef CLATTN_NATIVE_POOL_H
#define CLATTN_NATIVE_POOL_H

#include "native.h"

enum { NATIVE_MAX_THREADS = 256 };

typedef struct native_pool native_pool;

/* A pool of up to `helpers` threads; NULL (the caller then works alone)
 * when not even its memory can be had. Threads that cannot be started
 * leave their share to the others. */
native_pool *clattn_native_pool_create(int helpers);
/* Stops and joins the threads and frees p; NULL is a no-op. */
void clattn_native_pool_destroy(native_pool *p);
/* Runs every job of c on up to n threads: the caller's and the pool's
 * (p may be NULL). This cannot fail. */
void clattn_native_run_jobs(native_pool *p, native_call *c,
                            void (*job)(const native_call *, size_t), size_t jobs, int n);

#endif
