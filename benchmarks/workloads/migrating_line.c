/*
 * migrating_line: false sharing that moves (issue 11, class 3). Two threads work through a
 * global array one cache line at a time: for ~10 ms both store into line p (thread 0 into
 * word 0, thread 1 into word 1), then both move to line p+1, and never come back. Each line
 * is hot for 10 ms of a ~1.5 s run, so its rate over the run is small; the loop that moves
 * along the array pays for the transfers all the time.
 *
 * grid is volatile: gcc would otherwise keep only the last of the 256 stores.
 * The threads agree on p from the clock (CLOCK_MONOTONIC through the vDSO every 256 stores),
 * not from shared memory, so nothing else is contended.
 *
 * FIXED: each thread's word on its own line (line 2p+t).
 * SIZE: tenths of a second of run time.
 */
#include "common.h"

#define PHASE_NS 10000000L
#define WORDS_PER_LINE (CACHE_LINE / sizeof(long))
#define LINES 4096

#ifdef FIXED
#define SLOT(p, t) (((p) * 2 + (t)) * WORDS_PER_LINE)
#else
#define SLOT(p, t) ((p) * WORDS_PER_LINE + (t))
#endif

static volatile long grid[2 * LINES * WORDS_PER_LINE] __attribute__((aligned(CACHE_LINE)));
static long phases;
static double start_s;

static void *mover(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t h = (uint64_t)t + 1;
    long p = 0;
    while (p < phases) {
        for (int i = 0; i < 256; i++) {
            h = mix64(h);
            grid[SLOT(p % LINES, t)] = (long)h; /* LASER-EXPECT: false_sharing grid */
        }
        p = (long)((bench_now_s() - start_s) * 1e9 / PHASE_NS);
    }
    return (void *)(uintptr_t)(h & 1);
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 15, 2);
    phases = a.size * 100000000L / PHASE_NS;
    start_s = bench_now_s();
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, mover, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    /* The work depends on timing; the checksum only on the phases reached. */
    print_checksum(mix64((uint64_t)phases));
    return 0;
}
