/*
 * phase_kind: one line whose contention changes kind with the program's phases.
 *
 * Rounds of two phases, as PARSEC streamcluster's work_mem: a long phase in which each
 * thread adds into its own slot of a packed per-thread array (false sharing: the slots share
 * a line), then a short one in which every thread adds into slot 0, the round's total (true
 * sharing, on the same line). Nearly all of the run is the first phase; a
 * detector that judges the line's kind from the watch windows alone calls it true sharing
 * whenever its windows happen to fall in the short phases (streamcluster: 1 run in ~8).
 *
 * FIXED: each slot aligned and padded to FIX_ALIGN bytes (the total keeps its true sharing).
 * SIZE: rounds.
 */
#include "common.h"

#ifdef FIXED
static struct {
    volatile long v;
} __attribute__((aligned(FIX_ALIGN))) slot[MAX_THREADS];
#define SLOT(t) slot[t].v
#else
static volatile long slot[MAX_THREADS];
#define SLOT(t) slot[t]
#endif

/* Increments per thread in a round's long phase, and in its short phase: atomic adds into
 * one word, each far slower than a plain increment, so a few thousand take a small share of
 * the round's time. */
#define LONG_PHASE 1000000L
#define SHORT_PHASE 2000L

static long rounds;
static pthread_barrier_t barrier;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE void own_slot(int t, uint64_t *seed)
{
    for (long i = 0; i < LONG_PHASE; i++) {
        *seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
        SLOT(t) += (long)(*seed >> 62); /* LASER-EXPECT: false_sharing slot */
    }
}

static NOINLINE void round_total(uint64_t *seed)
{
    for (long i = 0; i < SHORT_PHASE; i++) {
        *seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
        __atomic_fetch_add(&SLOT(0), (long)(*seed >> 62), __ATOMIC_RELAXED);
    }
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t seed = mix64((uint64_t)t + 1);
    for (long r = 0; r < rounds; r++) {
        own_slot(t, &seed);
        pthread_barrier_wait(&barrier);
        round_total(&seed);
        pthread_barrier_wait(&barrier);
    }
    results[t * 16] = seed;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 600, MAX_THREADS);
    rounds = a.size;
    pthread_barrier_init(&barrier, NULL, (unsigned)a.threads);
    run_threads(a.threads, thread_main, NULL, 1); /* thread t gets (void *)t */
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ results[t * 16] ^ (uint64_t)SLOT(t));
    print_checksum(sum);
    return 0;
}
