/*
 * Shared scaffolding for laser's benchmark workloads.
 *
 * Every workload is one C file compiled twice: as is (the contended layout real programs have)
 * and with -DFIXED (the contended data padded, aligned or privatized). Both twins do the same
 * work and print the same deterministic checksum, so the twins can be checked against each
 * other and their run times compared.
 *
 * Command line of every workload:   prog [THREADS] [SIZE]
 *   THREADS  worker threads (default $LASER_BENCH_THREADS, else 2)
 *   SIZE     amount of work in the workload's own unit (default $LASER_BENCH_SIZE, else the
 *            workload's full size, which runs 1-5 s on two cores)
 * Output: one line `checksum: <16 hex digits>` on stdout. Exit 0 on success, 2 on bad
 * arguments.
 *
 * Opt-in measurement aids for scripts/bench (unset: no effect on behaviour or output):
 *   LASER_BENCH_PIN=1     pin the k-th thread the program creates to CPU k mod (CPUs), so
 *                         the workers run side by side instead of wherever the scheduler
 *                         puts them (contended workloads are bimodal unpinned: two threads
 *                         time-sharing one CPU never move the line and run several times
 *                         faster than two threads on two CPUs).
 *   LASER_BENCH_RUSAGE=1  print one line `laser-bench-rusage: wall_s=… user_s=… sys_s=…
 *                         vcsw=… ivcsw=…` on stderr with the checksum: the program's own
 *                         wall time (from its first constructor) and CPU time (all threads,
 *                         getrusage), so a harness can split `laser run` time into the
 *                         target's and laser's own.
 *
 * Markers: a source line carrying a contended access has a comment
 *   LASER-EXPECT: <kind> <data>
 * (kind = false_sharing | true_sharing; data = the variable's name or "heap"). The allocation
 * of contended heap data carries LASER-ALLOC. scripts/build-benchmarks checks that
 * benchmarks/manifest.json lists exactly the marked lines.
 *
 * Functions that hold contended accesses are `noinline` so a report names the function the
 * reader sees in the source, not the thread entry it was inlined into.
 */
#ifndef LASER_BENCH_COMMON_H
#define LASER_BENCH_COMMON_H

#ifndef _GNU_SOURCE /* g++ defines it already (C++ workloads include this too) */
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define CACHE_LINE 64
#define MAX_THREADS 64

/* Alignment the FIXED twins use for separated data. 64 is one line; AMD and Intel parts also
 * prefetch the adjacent line, so 128 keeps even the pair apart. */
#define FIX_ALIGN 128

#define NOINLINE __attribute__((noinline))

static inline void cpu_relax(void) { __asm__ __volatile__("pause" ::: "memory"); }

/* splitmix64: deterministic pseudo-random data, the same on every run and machine. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

struct bench_args {
    int threads;
    long size;
};

static inline long bench_parse_long(const char *what, const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v <= 0) {
        fprintf(stderr, "bad %s '%s': want a positive integer\n", what, s);
        exit(2);
    }
    return v;
}

/* Parse `prog [THREADS] [SIZE]`; max_threads caps workloads whose roles are fixed. */
static inline struct bench_args bench_parse(int argc, char **argv, long default_size, int max_threads)
{
    struct bench_args a = {2, default_size};
    const char *env;
    if ((env = getenv("LASER_BENCH_THREADS")) && *env)
        a.threads = (int)bench_parse_long("LASER_BENCH_THREADS", env);
    if ((env = getenv("LASER_BENCH_SIZE")) && *env)
        a.size = bench_parse_long("LASER_BENCH_SIZE", env);
    if (argc > 1)
        a.threads = (int)bench_parse_long("thread count", argv[1]);
    if (argc > 2)
        a.size = bench_parse_long("size", argv[2]);
    if (argc > 3) {
        fprintf(stderr, "usage: %s [THREADS] [SIZE]\n", argv[0]);
        exit(2);
    }
    if (max_threads > MAX_THREADS)
        max_threads = MAX_THREADS;
    if (a.threads > max_threads) {
        fprintf(stderr, "%s: %d threads asked, this workload takes 1..%d\n", argv[0], a.threads,
                max_threads);
        exit(2);
    }
    return a;
}

static inline int bench_env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* When LASER_BENCH_RUSAGE is set: the program's start, for its own wall time. */
static double bench_start_s;

__attribute__((constructor)) static void bench_note_start(void)
{
    if (bench_env_on("LASER_BENCH_RUSAGE"))
        bench_start_s = bench_now_s();
}

/* pthread_create, plus (LASER_BENCH_PIN only) an affinity of one CPU for the new thread:
 * the k-th thread created goes to the k-th online CPU, round robin. The affinity is set
 * through the thread's attributes so it never runs elsewhere first. Every workload creates its
 * threads through this (the macro below), with no change to its source. */
static inline int bench_pthread_create(pthread_t *tid, const pthread_attr_t *attr,
                                       void *(*fn)(void *), void *arg)
{
    static int next_cpu;
    if (!bench_env_on("LASER_BENCH_PIN"))
        return pthread_create(tid, attr, fn, arg);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1)
        ncpu = 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(next_cpu++ % ncpu, &set);
    if (attr) /* the caller's attributes are theirs: pin right after creation */
        return pthread_create(tid, attr, fn, arg) ?: pthread_setaffinity_np(*tid, sizeof set, &set);
    pthread_attr_t own;
    pthread_attr_init(&own);
    int rc = pthread_attr_setaffinity_np(&own, sizeof set, &set);
    if (rc == 0)
        rc = pthread_create(tid, &own, fn, arg);
    pthread_attr_destroy(&own);
    return rc;
}
#define pthread_create bench_pthread_create

/* Start fn(arg_base + i * arg_stride) on n threads and join them all. */
static inline void run_threads(int n, void *(*fn)(void *), void *arg_base, size_t arg_stride)
{
    pthread_t tid[MAX_THREADS];
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&tid[i], NULL, fn, (char *)arg_base + (size_t)i * arg_stride);
        if (rc) {
            fprintf(stderr, "pthread_create: %s\n", strerror(rc));
            exit(1);
        }
    }
    for (int i = 0; i < n; i++)
        pthread_join(tid[i], NULL);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static inline void *xaligned(size_t align, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, align, (n + align - 1) / align * align)) {
        fprintf(stderr, "out of memory (%zu bytes aligned to %zu)\n", n, align);
        exit(1);
    }
    return p;
}

static inline void print_checksum(uint64_t sum)
{
    printf("checksum: %016llx\n", (unsigned long long)sum);
    if (bench_env_on("LASER_BENCH_RUSAGE")) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        fprintf(stderr,
                "laser-bench-rusage: wall_s=%.6f user_s=%.6f sys_s=%.6f vcsw=%ld ivcsw=%ld\n",
                bench_now_s() - bench_start_s,
                (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
                (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6, ru.ru_nvcsw,
                ru.ru_nivcsw);
    }
}

#endif
