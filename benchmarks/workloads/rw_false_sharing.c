/*
 * rw_false_sharing: one thread writes a field, the others only read a neighbouring field.
 *
 * A worker publishes its progress in `g_state.progress` after every item, with a C11 atomic
 * store (sequentially consistent, the default: gcc emits xchg); the other threads read the
 * tuning parameters `scale` and `mask` from the same struct on every item. The readers never
 * write, yet each of the writer's stores invalidates their copy of the line: read-write false
 * sharing. (The parameters are volatile: readers must see updates, and that keeps the
 * compiler from hoisting the reads.) With a plain store instead, the writer's store buffer
 * commits dozens of stores per line transfer and the cost nearly vanishes on this machine.
 *
 * FIXED: the parameters aligned onto their own FIX_ALIGN-byte block.
 * THREADS: >= 1 (thread 0 writes, the rest read). SIZE: millions of items per thread.
 */
#include "common.h"
#include <stdatomic.h>

#ifdef FIXED
#define PARAM_ATTR __attribute__((aligned(FIX_ALIGN)))
#else
#define PARAM_ATTR
#endif

struct shared_state {
    _Atomic long progress;
    volatile long scale PARAM_ATTR;
    volatile long mask;
};

struct shared_state g_state = {0, 3, 0xffff};

static long items;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE uint64_t produce(void)
{
    uint64_t acc = 0;
    for (long i = 0; i < items; i++) {
        acc = acc * 33 + (uint64_t)i;
        atomic_store(&g_state.progress, i); /* LASER-EXPECT: false_sharing g_state */
    }
    return acc;
}

static NOINLINE uint64_t consume(int t)
{
    uint64_t acc = (uint64_t)t;
    for (long i = 0; i < items; i++) {
        long s = g_state.scale; /* LASER-EXPECT: false_sharing g_state */
        long m = g_state.mask; /* LASER-EXPECT: false_sharing g_state */
        acc += ((uint64_t)i * (uint64_t)s) & (uint64_t)m;
    }
    return acc;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    results[t * 16] = t == 0 ? produce() : consume(t);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 200, MAX_THREADS);
    items = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = mix64((uint64_t)atomic_load(&g_state.progress));
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ results[t * 16]);
    print_checksum(sum);
    return 0;
}
