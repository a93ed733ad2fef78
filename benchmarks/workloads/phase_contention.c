/*
 * phase_contention: contention that appears in one phase only.
 *
 * Three phases separated by barriers. Phases 1 and 3 compute in registers and
 * thread-private memory; phase 2 counts matches into a packed per-thread counter array,
 * falsely shared. A detector must find phase 2's line and keep the other phases' lines out
 * of its report; its rates must not be diluted below threshold by the quiet phases.
 *
 * FIXED: each phase-2 counter aligned and padded to FIX_ALIGN bytes.
 * SIZE: millions of iterations per phase per thread.
 */
#include "common.h"

#ifdef FIXED
static struct {
    volatile long v;
} __attribute__((aligned(FIX_ALIGN))) match_count[MAX_THREADS];
#define MATCHES(t) match_count[t].v
#else
static volatile long match_count[MAX_THREADS];
#define MATCHES(t) match_count[t]
#endif

static long iters;
static pthread_barrier_t barrier;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE uint64_t phase_private(uint64_t seed)
{
    uint64_t acc = seed;
    for (long i = 0; i < iters; i++)
        acc = acc * 6364136223846793005ULL + (uint64_t)i;
    return acc;
}

static NOINLINE void phase_shared(int t, uint64_t seed)
{
    for (long i = 0; i < iters; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        if (seed >> 62)
            MATCHES(t)++; /* LASER-EXPECT: false_sharing match_count */
    }
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t a = phase_private((uint64_t)t);
    pthread_barrier_wait(&barrier);
    phase_shared(t, a);
    pthread_barrier_wait(&barrier);
    results[t * 16] = phase_private(a ^ (uint64_t)MATCHES(t));
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 200, MAX_THREADS);
    iters = a.size * 1000000L;
    pthread_barrier_init(&barrier, NULL, (unsigned)a.threads);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ results[t * 16] ^ (uint64_t)MATCHES(t));
    print_checksum(sum);
    return 0;
}
