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

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
}

#endif
