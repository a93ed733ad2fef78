/*
 * cpu_phases: read-write false sharing between two threads that share one CPU for half of
 * the run: thread 0 stores its progress into a 4-byte field on every item, thread 1 loads
 * a neighbouring 4-byte parameter on every item, and the main thread holds both workers on
 * one CPU for 150 ms, then lets them run anywhere for 150 ms, and so on (as a busy host, a
 * container's CPU quota or an oversubscribed machine does; the accuracy run that missed
 * idx4_rw_false had its threads side by side in 48% of it).
 *
 * What it exercises: while the workers take turns on one CPU, a watch window on the line sees
 * whichever runs fill its trap cap alone, so windows must open when the two run on different
 * CPUs (laser-driver's `company`), and code windows on an instruction only one thread runs
 * (each thread here has its own) can never show a transfer and must not take the line's
 * trap budget (`Detector::code_candidates`).
 *
 * FIXED: the parameter aligned onto its own FIX_ALIGN-byte block.
 * THREADS: 2 (thread 0 stores, thread 1 loads). SIZE: millions of items per thread.
 */
#include "common.h"
#include <sched.h>

#ifdef FIXED
#define PARAM_ATTR __attribute__((aligned(FIX_ALIGN)))
#else
#define PARAM_ATTR
#endif

#ifndef SHARED_MS
#define SHARED_MS 250
#endif
#ifndef FREE_MS
#define FREE_MS 100
#endif

struct shared_state {
    volatile unsigned progress;
    volatile unsigned param PARAM_ATTR;
};

struct shared_state g_state __attribute__((aligned(FIX_ALIGN))) = {0, 7};

static long items;
static uint64_t results[2 * 16];
static volatile int done;

static NOINLINE uint64_t produce(void)
{
    uint64_t acc = 0;
    for (long i = 0; i < items; i++) {
        acc = acc * 33 + (uint64_t)i;
        g_state.progress = (unsigned)i; /* LASER-EXPECT: false_sharing g_state */
    }
    return acc;
}

static NOINLINE uint64_t consume(void)
{
    uint64_t acc = 1;
    for (long i = 0; i < items; i++) {
        unsigned p = g_state.param; /* LASER-EXPECT: false_sharing g_state */
        acc = acc * 31 + ((uint64_t)i ^ p);
    }
    return acc;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    results[t * 16] = t == 0 ? produce() : consume();
    __atomic_add_fetch(&done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 800, 2);
    items = a.size * 1000000L;
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0) {
        perror("sched_getaffinity");
        return 1;
    }
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    pthread_t tid[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    /* Shared CPU first, then free, until both are done (a worker that has exited takes no
     * affinity: its error is ignored). */
    for (int phase = 0; __atomic_load_n(&done, __ATOMIC_ACQUIRE) < 2; phase++) {
        for (int t = 0; t < 2; t++)
            pthread_setaffinity_np(tid[t], sizeof(cpu_set_t), phase % 2 == 0 ? &one : &all);
        int len = phase % 2 == 0 ? SHARED_MS : FREE_MS;
        for (int ms = 0; ms < len && __atomic_load_n(&done, __ATOMIC_ACQUIRE) < 2; ms++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    for (int t = 0; t < 2; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = mix64((uint64_t)g_state.progress);
    for (int t = 0; t < 2; t++)
        sum = mix64(sum ^ results[t * 16]);
    print_checksum(sum);
    return 0;
}
