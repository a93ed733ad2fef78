/*
 * barrier_rounds: two threads in lock-step rounds, for measuring what laser's watch windows
 * cost a program whose threads wait for each other (scripts/watch-cost).
 *
 * Each round, each thread does WORK iterations of register-only work, then increments its own
 * counter (the two counters share one cache line: false sharing, so laser watches them), then
 * waits at a barrier. Thread 0 records CLOCK_MONOTONIC after every barrier; at exit the
 * timestamps (ns, one per line) go to the file named by argv[3]. laser's recordings use the
 * same clock, so each round can be matched against the watch windows armed while it ran.
 *
 * usage: barrier_rounds ROUNDS WORK OUTFILE     (prints `checksum: …` on stdout)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static struct {
    volatile long count[2];
} __attribute__((aligned(64))) shared;

static pthread_barrier_t barrier;
static long rounds, work;
static uint64_t *stamps;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker(void *arg)
{
    long t = (long)arg;
    uint64_t x = 0x9e3779b97f4a7c15u ^ (uint64_t)t;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < work; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            __asm__ volatile("" : "+r"(x));
        }
        shared.count[t]++;
        pthread_barrier_wait(&barrier);
        if (t == 0)
            stamps[r] = now_ns();
    }
    return (void *)(uintptr_t)x;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (rounds = atol(argv[1])) <= 0 || (work = atol(argv[2])) < 0) {
        fprintf(stderr, "usage: barrier_rounds ROUNDS WORK OUTFILE\n");
        return 2;
    }
    stamps = calloc((size_t)rounds, sizeof *stamps);
    if (!stamps)
        return 1;
    pthread_barrier_init(&barrier, NULL, 2);
    pthread_t th[2];
    uint64_t start = now_ns();
    for (long t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    uint64_t sum = 0;
    for (long t = 0; t < 2; t++) {
        void *v;
        pthread_join(th[t], &v);
        sum ^= (uint64_t)(uintptr_t)v;
    }
    FILE *f = fopen(argv[3], "w");
    if (!f)
        return 1;
    fprintf(f, "%llu\n", (unsigned long long)start);
    for (long r = 0; r < rounds; r++)
        fprintf(f, "%llu\n", (unsigned long long)stamps[r]);
    fclose(f);
    printf("checksum: %016llx\n", (unsigned long long)(sum ^ (uint64_t)(shared.count[0] + shared.count[1])));
    return 0;
}
