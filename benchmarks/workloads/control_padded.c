/*
 * control_padded: per-thread counters done right (no contention; a control).
 *
 * The per-thread accumulator pattern of linear_regression, but each thread's struct is
 * aligned and padded to FIX_ALIGN bytes in both twins. A detector must report nothing.
 * The FIXED twin is identical (nothing to fix); its timing gap should be ~1.0.
 * SIZE: millions of iterations per thread.
 */
#include "common.h"

struct acc {
    volatile long sum;
    volatile long count;
} __attribute__((aligned(FIX_ALIGN)));

static struct acc accs[MAX_THREADS];
static long iters;

static NOINLINE void accumulate(int t)
{
    for (long i = 0; i < iters; i++) {
        accs[t].sum += i ^ t;
        accs[t].count++;
    }
}

static void *thread_main(void *arg)
{
    accumulate((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 1500, MAX_THREADS);
    iters = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ (uint64_t)accs[t].sum) + (uint64_t)accs[t].count;
    print_checksum(sum);
    return 0;
}
