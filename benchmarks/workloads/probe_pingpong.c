/*
 * probe_pingpong: the machine's cache-line round trip between two threads, in ns.
 *
 * Not a workload: scripts/bench runs it before and after measuring, because the cost of
 * contention scales with this number and, on a VM, changes when the host moves the vCPUs
 * (or when the machine is loaded and the threads share one CPU: then it is microseconds).
 * Two threads take turns incrementing one flag; each turn moves the line across.
 * usage: probe_pingpong [ROUNDS]   prints `round_trip_ns: <n>`
 */
#include "common.h"
#include <time.h>

static volatile long flag __attribute__((aligned(CACHE_LINE)));
static long rounds = 200000;

static void *player(void *arg)
{
    long me = (long)(intptr_t)arg;
    for (long i = 0; i < rounds; i++) {
        while (flag != 2 * i + me) /* no pause: it would add its own ~25 ns to each turn */
            ;
        flag = 2 * i + me + 1;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = bench_parse_long("rounds", argv[1]);
    struct timespec s, e;
    pthread_t a, b;
    clock_gettime(CLOCK_MONOTONIC, &s);
    pthread_create(&a, NULL, player, (void *)0);
    pthread_create(&b, NULL, player, (void *)1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    clock_gettime(CLOCK_MONOTONIC, &e);
    double ns = ((double)(e.tv_sec - s.tv_sec) * 1e9 + (double)(e.tv_nsec - s.tv_nsec)) / rounds;
    printf("round_trip_ns: %.0f\n", ns);
    return 0;
}
