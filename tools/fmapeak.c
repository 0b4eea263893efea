/* The FMA peak of this CPU, the figure the native backend's GFLOP/s are a
 * share of: T threads, each running CHAINS independent chains of fused
 * multiply-adds on vectors of the widest width the build targets (build it
 * with -O2 -march=native). The chains are separate variables, not an array,
 * so that they stay in registers: in an array GCC leaves them in memory at
 * -O2 (one load, FMA and store a step, a tenth of the peak).
 *   usage: fmapeak [threads]   prints GFLOP/s (2 FLOP a lane a FMA) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static volatile float sink;
static long steps = 20000000;

/* Twelve chains: two FMA units of four cycles' latency need eight in
 * flight; twelve leave room, and fit the sixteen registers of AVX2. */
#define STEP(x) x = x * b + c
static void *run(void *arg)
{
    (void)arg;
    vec b, c;
    for (int i = 0; i < LANES; ++i) {
        b[i] = 0.999999f;
        c[i] = 1e-7f;
    }
    vec x0 = b, x1 = b * 2, x2 = b * 3, x3 = b * 4, x4 = b * 5, x5 = b * 6;
    vec x6 = b * 7, x7 = b * 8, x8 = b * 9, x9 = b * 10, x10 = b * 11, x11 = b * 12;
    for (long i = 0; i < steps; ++i) {
        STEP(x0); STEP(x1); STEP(x2); STEP(x3); STEP(x4); STEP(x5);
        STEP(x6); STEP(x7); STEP(x8); STEP(x9); STEP(x10); STEP(x11);
    }
    vec s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
    sink = s[0];
    return NULL;
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > 1024) {
        fprintf(stderr, "fmapeak: threads must be 1..1024\n");
        return 2;
    }
    pthread_t *tid = malloc(threads * sizeof *tid);
    if (!tid)
        return 1;
    const double t0 = now();
    for (int i = 0; i < threads; ++i)
        if (pthread_create(&tid[i], NULL, run, NULL)) {
            fprintf(stderr, "fmapeak: cannot start thread %d\n", i);
            for (int j = 0; j < i; ++j)
                pthread_join(tid[j], NULL);
            free(tid);
            return 1;
        }
    for (int i = 0; i < threads; ++i)
        pthread_join(tid[i], NULL);
    const double s = now() - t0;
    printf("%.1f\n", 2.0 * LANES * 12 * (double)steps * threads / s * 1e-9);
    free(tid);
    return 0;
}
