/*
 * known_transfers: two threads whose cache-line transfers are known exactly, so the watch
 * estimator's rates can be checked against the truth (scripts/estimator-check).
 *
 * Not a manifest workload. Two threads take strict turns, handing over through `turn` (its own
 * line). On its turn a thread writes its own word of `slots` (one line, disjoint words) WORK
 * times, then passes the turn. A coherent cache therefore moves each line exactly once per
 * turn:
 *   slots: the first write of a turn finds the line dirty in the other thread's cache
 *          (false sharing; the later writes of the turn hit);
 *   turn:  the waiting thread's first read after the hand-over finds it dirty in the other
 *          thread's cache (true sharing; its spinning re-reads until then hit, and the write
 *          that hands the turn back finds the line shared, an upgrade, not a data transfer).
 * So both lines see TURNS transfers (less one) in the program's own run time: the true rate
 * is `turns / seconds`, printed at the end.
 *
 * usage: known_transfers [TURNS] [WORK]   defaults 200000 and 64
 * Output: `turns: N`, `seconds: S`, `true_rate_per_line: R` (transfers/s on each line) and a
 * checksum (the slots' final values; deterministic).
 */
#include "common.h"

static volatile long turn __attribute__((aligned(CACHE_LINE)));
static volatile long slots[CACHE_LINE / sizeof(long)] __attribute__((aligned(CACHE_LINE)));
static long turns = 200000, work = 64;

static NOINLINE void write_slot(long me)
{
    for (long k = 0; k < work; k++)
        slots[me] = slots[me] + 1; /* false sharing: one transfer per turn */
}

static void *player(void *arg)
{
    long me = (long)(intptr_t)arg;
    for (long i = me; i < turns; i += 2) {
        while (turn != i) /* true sharing: one transfer per turn */
            cpu_relax();
        write_slot(me);
        turn = i + 1;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        turns = bench_parse_long("turns", argv[1]);
    if (argc > 2)
        work = bench_parse_long("work", argv[2]);
    if (turns < 2 || work < 1) {
        fprintf(stderr, "known_transfers: TURNS must be >= 2 and WORK >= 1\n");
        return 2;
    }
    pthread_t a, b;
    double s = bench_now_s();
    pthread_create(&a, NULL, player, (void *)0);
    pthread_create(&b, NULL, player, (void *)1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    double secs = bench_now_s() - s;
    printf("turns: %ld\nseconds: %.6f\ntrue_rate_per_line: %.0f\n", turns, secs, turns / secs);
    printf("checksum: %016llx\n", (unsigned long long)mix64((uint64_t)slots[0] * 31 + slots[1]));
    return 0;
}
