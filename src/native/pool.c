/* The native backend's thread pool. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"

/* A context's worker threads, started on its first threaded call and kept
 * until it is destroyed, rather than started and joined for each of a
 * call's rounds of jobs (packing, Dsum, each side's pass). Each round
 * bumps `round`; helper i takes part when i < want, and the caller waits
 * until `running` is 0. Between rounds a helper (and the caller, for
 * `running`) first spins for up to SPIN_NS, and only then sleeps on the
 * condition variable: a call's rounds follow each other within
 * microseconds, and a thread that slept must be woken. The context's lock
 * keeps one call at a time. */
enum { SPIN_NS = 200000 };

static void *worker(void *arg)
{
    native_call *c = arg;
    for (;;) {
        size_t job = atomic_fetch_add(&c->next, 1);
        if (job >= c->jobs)
            return NULL;
        c->job(c, job);
    }
}

typedef struct native_pool {
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    native_call *call;
    atomic_ulong round;
    atomic_int running, stop;
    int want, started;
    struct native_helper {
        struct native_pool *pool;
        int index;
        pthread_t tid;
    } helper[NATIVE_MAX_THREADS];
} native_pool;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until *x is no longer `was` or SPIN_NS have passed. */
static void spin_while(const atomic_ulong *x, unsigned long was)
{
    const long long end = now_ns() + SPIN_NS;
    do {
        for (int i = 0; i < 64; ++i) {
            if (atomic_load_explicit(x, memory_order_acquire) != was)
                return;
            cpu_relax();
        }
    } while (now_ns() < end);
}

static void *helper_main(void *arg)
{
    struct native_helper *h = arg;
    native_pool *p = h->pool;
    unsigned long seen = 0;
    for (;;) {
        spin_while(&p->round, seen);
        pthread_mutex_lock(&p->lock);
        while (!atomic_load(&p->stop) && atomic_load(&p->round) == seen)
            pthread_cond_wait(&p->start, &p->lock);
        if (atomic_load(&p->stop)) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = atomic_load(&p->round);
        native_call *c = p->call;
        const int mine = h->index < p->want;
        pthread_mutex_unlock(&p->lock);
        if (!mine)
            continue;
        worker(c);
        if (atomic_fetch_sub(&p->running, 1) == 1) {
            pthread_mutex_lock(&p->lock); /* the caller waits under it */
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

void clattn_native_pool_destroy(native_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->started; ++i)
        pthread_join(p->helper[i].tid, NULL);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

native_pool *clattn_native_pool_create(int helpers)
{
    native_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    atomic_init(&p->round, 0);
    atomic_init(&p->running, 0);
    atomic_init(&p->stop, 0);
    if (pthread_mutex_init(&p->lock, NULL)) {
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->start, NULL)) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->done, NULL)) {
        pthread_cond_destroy(&p->start);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL;
    }
    for (int i = 0; i < helpers; ++i) {
        struct native_helper *h = &p->helper[p->started];
        h->pool = p;
        h->index = p->started;
        if (pthread_create(&h->tid, NULL, helper_main, h) == 0)
            ++p->started;
    }
    return p;
}

void clattn_native_run_jobs(native_pool *p, native_call *c,
                            void (*job)(const native_call *, size_t), size_t jobs, int n)
{
    c->job = job;
    c->jobs = jobs;
    atomic_store(&c->next, 0);
    int helpers = (size_t)n > jobs ? (int)jobs - 1 : n - 1;
    if (!p || helpers > p->started)
        helpers = p ? p->started : 0;
    if (helpers <= 0) {
        worker(c);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->call = c;
    p->want = helpers;
    atomic_store(&p->running, helpers);
    atomic_fetch_add(&p->round, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    worker(c);
    const long long end = now_ns() + SPIN_NS;
    while (atomic_load(&p->running) && now_ns() < end)
        for (int i = 0; i < 64 && atomic_load(&p->running); ++i)
            cpu_relax();
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->running))
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}
