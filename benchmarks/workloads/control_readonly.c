/*
 * control_readonly: all threads read one shared table and never write it (a control).
 *
 * Read-only sharing costs nothing: every core keeps its own copy of the lines. A detector
 * must report nothing. The FIXED twin is identical; its timing gap should be ~1.0.
 * SIZE: millions of lookups per thread.
 */
#include "common.h"

#define TABLE 4096

static uint32_t lookup[TABLE];
static volatile long config_mask = TABLE - 1; /* read by every thread on every lookup */
static long iters;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE uint64_t walk(int t)
{
    uint64_t x = (uint64_t)t, acc = 0;
    for (long i = 0; i < iters; i++) {
        x = lookup[(x ^ (uint64_t)i) & (uint64_t)config_mask];
        acc += x;
    }
    return acc;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    results[t * 16] = walk(t);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 600, MAX_THREADS);
    iters = a.size * 1000000L;
    for (int i = 0; i < TABLE; i++)
        lookup[i] = (uint32_t)mix64((uint64_t)i);
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
