/*
 * control_threadlocal: per-thread counters in thread-local storage (a control).
 *
 * `__thread` variables live in each thread's own TLS block, far apart: no contention. A
 * detector must report nothing. The FIXED twin is identical; its timing gap should be ~1.0.
 * SIZE: millions of iterations per thread.
 */
#include "common.h"

static __thread volatile long tl_count;
static __thread volatile long tl_sum;
static long iters;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE void count(int t)
{
    for (long i = 0; i < iters; i++) {
        tl_count++;
        tl_sum += i ^ t;
    }
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    count(t);
    results[t * 16] = mix64((uint64_t)tl_count) ^ (uint64_t)tl_sum;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 1200, MAX_THREADS);
    iters = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ results[t * 16]);
    print_checksum(sum);
    return 0;
}
