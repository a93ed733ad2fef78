/*
 * spinlock_tas: a test-and-set spinlock guarding a shared total (true sharing).
 *
 * Every thread computes a value per item and adds it to the shared total under one global
 * test-and-set spinlock. The lock word and the total are the same bytes for every thread:
 * true sharing, which padding cannot remove.
 *
 * FIXED (the same program with less sharing, as one fixes true sharing): each thread sums
 * BATCH items privately and takes the lock once per batch.
 * SIZE: millions of items per thread.
 */
#include "common.h"

#ifdef FIXED
#define BATCH 256
#else
#define BATCH 1
#endif

struct spin_total {
    volatile int lock;
    long total;
    long ops;
};

struct spin_total g_spin;

static inline void spin_lock(volatile int *l)
{
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) /* LASER-EXPECT: true_sharing g_spin */
        while (*l) /* LASER-EXPECT: true_sharing g_spin */
            cpu_relax();
}

static inline void spin_unlock(volatile int *l)
{
    __atomic_store_n(l, 0, __ATOMIC_RELEASE); /* LASER-EXPECT: true_sharing g_spin */
}

static long items;

static NOINLINE void add_items(int t)
{
    uint64_t seed = (uint64_t)t << 40;
    long local = 0, n = 0;
    for (long i = 0; i < items; i++) {
        local += (long)(mix64(seed + (uint64_t)i) & 0xffff);
        if (++n == BATCH) {
            spin_lock(&g_spin.lock);
            /* gcc -O2 merges these two into one 16-byte SSE update on the first line. */
            g_spin.total += local; /* LASER-EXPECT: true_sharing g_spin */
            g_spin.ops += n;
            spin_unlock(&g_spin.lock);
            local = 0;
            n = 0;
        }
    }
    spin_lock(&g_spin.lock);
    g_spin.total += local;
    g_spin.ops += n;
    spin_unlock(&g_spin.lock);
}

static void *thread_main(void *arg)
{
    add_items((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 20, MAX_THREADS);
    items = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    print_checksum(mix64((uint64_t)g_spin.total) ^ (uint64_t)g_spin.ops);
    return 0;
}
