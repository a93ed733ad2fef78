/*
 * atomic_inherit: per-thread std::atomic<int> counters declared in a base class, packed in a
 * global array (false sharing through C++ atomics; issue 11, classes 4 and 6).
 *
 * Each thread bumps `slots[t].hits` with `++`: a `lock add` that gcc inlines from libstdc++'s
 * atomic_base.h (`__atomic_base<int>::operator++` → `fetch_add`), so the instruction's
 * innermost source line is the header's. A report must name this file's line, and the data
 * as the program writes it: `slots[0].hits`, reached through the base class `Counter`,
 * never `slots[0].<padding>` or `slots[0].hits._M_i`. Slots are 8 bytes: 8 threads' counters
 * share one line.
 *
 * FIXED: `Slot` aligned to FIX_ALIGN, one slot per line pair.
 * SIZE: millions of increments per thread.
 */
#include "common.h"

#include <atomic>

#ifdef FIXED
#define SLOT_ALIGN alignas(FIX_ALIGN)
#else
#define SLOT_ALIGN
#endif

struct Counter {
    std::atomic<int> hits;
};

struct SLOT_ALIGN Slot : Counter {
    int id;
};

Slot slots[MAX_THREADS];

static long per_thread;

static NOINLINE void worker(int t)
{
    Slot &s = slots[t];
    s.id = t;
    for (long i = 0; i < per_thread; i++)
        s.hits++; /* LASER-EXPECT: false_sharing slots */
}

static void *thread_main(void *arg)
{
    worker((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 20, MAX_THREADS);
    per_thread = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum + (uint64_t)slots[t].hits.load() * 64 + (uint64_t)slots[t].id);
    print_checksum(sum);
    return 0;
}
