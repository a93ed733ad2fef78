/*
 * switch_rounds: what a perf event on a thread costs it at every context switch, with no
 * sample or trap at all: an armed hardware breakpoint (laser-driver/src/switches.rs) or a
 * cpu-clock sampling timer (attr::soft_cpu_wide), sixteenth session.
 *
 * Two threads run ROUNDS rounds of WORK xorshift steps and meet at a pthread barrier (a
 * futex sleep and wake-up per round). With EVENTS > 0 each thread first opens EVENTS write
 * breakpoints on itself, one per CPU 0 and 1, on words nobody writes: the kernel loads them
 * into the debug registers whenever the thread is switched in and clears DR7 when it is
 * switched out, and that is all they do. With KIND `clock`, the events are cpu-clock
 * samplers at 500 Hz with no ring (their timer is started at every switch-in and cancelled
 * at every switch-out). With KIND `bpcpu`, main opens the EVENTS breakpoints once per CPU for
 * the whole CPU (pid -1, as laser's launch windows do where CPU-wide events are allowed):
 * they stay in the debug registers whatever task runs, so no switch reloads them. Prints the
 * wall time per round.
 *
 * usage: switch_rounds ROUNDS WORK EVENTS [bp|clock|bpcpu]   (scripts/switch-cost runs it)
 */
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile long count[2] __attribute__((aligned(64)));
static volatile long never_written[4] __attribute__((aligned(64)));
static pthread_barrier_t barrier;
static long rounds, work;
static int events, clock_kind, cpu_wide;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* EVENTS events on `pid` (0: the calling thread; -1: whole CPUs), one per CPU 0 and 1. */
static void open_events(pid_t pid)
{
    for (int cpu = 0; cpu < 2; cpu++) {
        for (int s = 0; s < events; s++) {
            struct perf_event_attr a;
            memset(&a, 0, sizeof a);
            a.size = sizeof a;
            a.exclude_kernel = 1;
            if (clock_kind) {
                a.type = PERF_TYPE_SOFTWARE;
                a.config = PERF_COUNT_SW_CPU_CLOCK;
                a.freq = 1;
                a.sample_freq = 500;
                a.sample_type = PERF_SAMPLE_IP;
            } else {
                a.type = PERF_TYPE_BREAKPOINT;
                a.bp_type = HW_BREAKPOINT_W;
                a.bp_addr = (unsigned long)&never_written[s];
                a.bp_len = HW_BREAKPOINT_LEN_8;
                a.sample_period = 1;
            }
            if (syscall(SYS_perf_event_open, &a, pid, cpu, -1, 0) < 0) {
                perror("perf_event_open");
                exit(1);
            }
        }
    }
}

static void *worker(void *arg)
{
    long t = (long)arg;
    uint64_t x = (uint64_t)t + 1;
    if (!cpu_wide)
        open_events(0);
    pthread_barrier_wait(&barrier);
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < work; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            __asm__ volatile("" : "+r"(x));
        }
        count[t]++;
        pthread_barrier_wait(&barrier);
    }
    return (void *)(uintptr_t)x;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5 || (rounds = atol(argv[1])) <= 0 || (work = atol(argv[2])) < 0 ||
        (events = atoi(argv[3])) < 0 || events > 4 ||
        (argc == 5 && strcmp(argv[4], "bp") != 0 && strcmp(argv[4], "clock") != 0 &&
         strcmp(argv[4], "bpcpu") != 0)) {
        fprintf(stderr, "usage: switch_rounds ROUNDS WORK EVENTS(0-4) [bp|clock|bpcpu]\n");
        return 2;
    }
    clock_kind = argc == 5 && strcmp(argv[4], "clock") == 0;
    cpu_wide = argc == 5 && strcmp(argv[4], "bpcpu") == 0;
    if (cpu_wide)
        open_events(-1);
    pthread_barrier_init(&barrier, NULL, 2);
    pthread_t th[2];
    double t0 = now();
    for (long t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    double s = now() - t0;
    printf("events %d: %.3f s, %.2f us per round\n", events, s, s / rounds * 1e6);
    return 0;
}
