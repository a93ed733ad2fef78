/*
 * known_transfers: two threads whose cache-line transfers are known exactly, so the watch
 * estimator's rates can be checked against the truth (scripts/estimator-check).
 *
 * Not a manifest workload. The clock, not shared memory, sets the pace: thread k (0 or 1)
 * updates at times start + n·PERIOD + k·PERIOD/2, n = 0, 1, …, waiting for each on
 * CLOCK_MONOTONIC (the vDSO: no shared line is touched while waiting). At each of those times
 * it increments its own word of `slots` (one line, disjoint words: false sharing) and the one
 * word `shared` (true sharing). The updates of the two threads strictly alternate, 2 / PERIOD
 * per second, whether or not anyone watches, as long as every update happens before the other
 * thread's next one (the program checks, and prints how late the latest was). An update is a
 * load and a store: the load misses on the line the other thread dirtied (a cross-core data
 * transfer) and the store then upgrades the shared copy (a cross-core invalidation), so each
 * line sees 4 / PERIOD coherence transfers per second: what laser's estimator counts.
 *
 * Timer samples hardly ever land on these updates (the threads spend their time in the vDSO
 * clock), so laser's soft backend does not find the lines by itself: scripts/estimator-check
 * builds this without PIE and names the words with `laser run --watch-addr`.
 *
 * usage: known_transfers [PERIOD_NS] [SECONDS]   defaults 100000 (20,000 transfers/s) and 1
 * Output: `updates: N`, `seconds: S`, `true_rate_per_line: R` (coherence transfers per second
 * on each line, 2·N / S), `max_late_ns: L` (updates later than PERIOD/2 may break the
 * alternation) and a checksum.
 */
#include "common.h"

static volatile long slots[CACHE_LINE / sizeof(long)] __attribute__((aligned(CACHE_LINE)));
static volatile long shared __attribute__((aligned(CACHE_LINE)));
static long period_ns = 100000, writes_per_thread;
static double start_s;
static long max_late_ns[2];

static NOINLINE void write_both(long me, long n)
{
    slots[me] += n; /* false sharing: the line changes owner once per call */
    shared += n;    /* true sharing: the same */
}

static void *player(void *arg)
{
    long me = (long)(intptr_t)arg;
    for (long n = 0; n < writes_per_thread; n++) {
        double due = start_s + ((double)n * period_ns + (double)me * period_ns / 2) * 1e-9;
        double now;
        while ((now = bench_now_s()) < due)
            ;
        long late = (long)((now - due) * 1e9);
        if (late > max_late_ns[me])
            max_late_ns[me] = late;
        write_both(me, n);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    double seconds = 1.0;
    if (argc > 1)
        period_ns = bench_parse_long("period_ns", argv[1]);
    if (argc > 2)
        seconds = (double)bench_parse_long("seconds", argv[2]);
    writes_per_thread = (long)(seconds * 1e9 / (double)period_ns);
    if (writes_per_thread < 2) {
        fprintf(stderr, "known_transfers: SECONDS must hold at least two periods\n");
        return 2;
    }
    pthread_t a, b;
    start_s = bench_now_s() + 0.01; /* both threads start on the same schedule */
    pthread_create(&a, NULL, player, (void *)0);
    pthread_create(&b, NULL, player, (void *)1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    double secs = bench_now_s() - start_s;
    long late = max_late_ns[0] > max_late_ns[1] ? max_late_ns[0] : max_late_ns[1];
    /* 2 transfers per update (read miss + upgrade), 2 updates per period */
    printf("updates: %ld\nseconds: %.6f\ntrue_rate_per_line: %.0f\nmax_late_ns: %ld\n",
           2 * writes_per_thread, secs, 4.0 * (double)writes_per_thread / secs, late);
    printf("checksum: %016llx\n",
           (unsigned long long)mix64((uint64_t)slots[0] * 31 + (uint64_t)slots[1] + (uint64_t)shared));
    return 0;
}
