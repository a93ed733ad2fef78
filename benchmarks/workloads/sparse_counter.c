/*
 * sparse_counter: per-thread progress counters in one small heap block, written between long
 * computations (Phoenix word_count's `use_len[t]`, issue 11 class 2).
 *
 * `counts` is a global pointer to malloc(nthreads * sizeof(long)): every thread's slot sits on
 * one cache line. Each thread hashes a private buffer for ~2.5 µs, then stores its progress
 * in its own slot: ~4·10^5 stores per second per thread, one per ~5,000 instructions. A plain
 * store (not a read-modify-write) never stalls the thread (the store buffer absorbs the
 * line's ownership request), so timer samples do not pile up on it either: they land on it
 * in some runs and not in others. No thread reads another's slot: pure false sharing between
 * the stores.
 *
 * FIXED: each slot on its own FIX_ALIGN-byte block (xaligned).
 * SIZE: hundreds of thousands of increments per thread.
 */
#include "common.h"

#define WORK 512

#ifdef FIXED
#define STRIDE (FIX_ALIGN / sizeof(long))
#else
#define STRIDE 1
#endif

static long *counts;
static long per_thread;

static NOINLINE uint64_t work(uint64_t *buf, uint64_t seed)
{
    uint64_t h = seed;
    for (int i = 0; i < WORK; i++) {
        h = mix64(h ^ buf[i]);
        buf[i] = h;
    }
    return h;
}

static void *counter_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t buf[WORK];
    for (int i = 0; i < WORK; i++)
        buf[i] = mix64((uint64_t)(t * WORK + i));
    uint64_t h = (uint64_t)t;
    for (long n = 0; n < per_thread; n++) {
        h = work(buf, h);
        counts[t * STRIDE] = n + 1; /* LASER-EXPECT: false_sharing heap */
    }
    return (void *)(uintptr_t)h;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 6, MAX_THREADS);
    per_thread = a.size * 100000L;
#ifdef FIXED
    counts = xaligned(FIX_ALIGN, (size_t)a.threads * FIX_ALIGN);
    memset(counts, 0, (size_t)a.threads * FIX_ALIGN);
#else
    counts = xmalloc((size_t)a.threads * sizeof(long));
    memset(counts, 0, (size_t)a.threads * sizeof(long));
#endif
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, counter_thread, (void *)(intptr_t)t);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        void *r;
        pthread_join(tid[t], &r);
        sum = sum * 31 + (uint64_t)(uintptr_t)r + (uint64_t)counts[t * STRIDE];
    }
    print_checksum(mix64(sum));
    return 0;
}
