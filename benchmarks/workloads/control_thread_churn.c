/*
 * control_thread_churn: a program that creates short-lived threads all the time (a control).
 *
 * Phoenix's kmeans creates ~400 threads a second, one set per iteration; servers and thread
 * pools that shrink and grow do the same. Each round starts THREADS threads, each sums a
 * private array (its own, on its own stack: no contention) for ~0.1 ms, and joins them. A
 * detector must report nothing, and what it costs per thread creation (events inherited into
 * every new thread) shows here as overhead: 4,000 threads in ~0.5 s on two cores.
 * The FIXED twin is identical; its timing gap should be ~1.0.
 * SIZE: rounds (each creates THREADS threads).
 */
#include "common.h"

#define WORK 4096

static NOINLINE uint64_t work(uint64_t seed)
{
    uint64_t v[WORK];
    for (int i = 0; i < WORK; i++)
        v[i] = mix64(seed + (uint64_t)i);
    uint64_t s = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < WORK; i++)
            s = mix64(s ^ v[(i * 7 + r) % WORK]);
    return s;
}

/* The result goes back through pthread_join: no shared slot for successive threads. */
static void *thread_main(void *arg)
{
    return (void *)(uintptr_t)work((uint64_t)(uintptr_t)arg);
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 2000, MAX_THREADS);
    pthread_t tid[MAX_THREADS];
    uint64_t sum = 0;
    for (long r = 0; r < a.size; r++) {
        for (int t = 0; t < a.threads; t++)
            pthread_create(&tid[t], NULL, thread_main, (void *)(uintptr_t)(r * MAX_THREADS + t));
        for (int t = 0; t < a.threads; t++) {
            void *ret;
            pthread_join(tid[t], &ret);
            sum = mix64(sum ^ (uint64_t)(uintptr_t)ret);
        }
    }
    print_checksum(sum);
    return 0;
}
