/*
 * linear_regression: Phoenix's linear_regression-pthread, the classic false-sharing case.
 *
 * Each thread sums SX, SY, SXX, SYY, SXY over its slice of points into its own lreg_args,
 * but all the lreg_args sit packed in one malloc'd array, so neighbouring threads' sums share
 * cache lines. Phoenix's struct also held the pthread_t, making it exactly 64 bytes: whether
 * it shared lines then depended on where malloc put the array. Here the tid lives elsewhere
 * (56-byte struct), so neighbours share a line whatever the array's alignment.
 *
 * The sums are volatile: gcc -O2 otherwise keeps them in registers for the whole loop (the
 * pointer store-motion Phoenix's authors' compiler did not do) and the contention vanishes.
 *
 * FIXED: each lreg_args aligned and padded to FIX_ALIGN bytes.
 * SIZE: passes over each thread's 1M points.
 */
#include "common.h"

#define POINTS_PER_THREAD (1L << 20)

typedef struct {
    char x;
    char y;
} POINT_T;

typedef struct {
    POINT_T *points;
    long num_elems;
    volatile long long SX;
    volatile long long SY;
    volatile long long SXX;
    volatile long long SYY;
    volatile long long SXY;
#ifdef FIXED
} __attribute__((aligned(FIX_ALIGN))) lreg_args;
#else
} lreg_args;
#endif

static long passes;

static NOINLINE void linear_regression_map(lreg_args *args)
{
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < args->num_elems; i++) {
            args->SX += args->points[i].x; /* LASER-EXPECT: false_sharing heap */
            args->SXX += args->points[i].x * args->points[i].x; /* LASER-EXPECT: false_sharing heap */
            args->SY += args->points[i].y; /* LASER-EXPECT: false_sharing heap */
            args->SYY += args->points[i].y * args->points[i].y; /* LASER-EXPECT: false_sharing heap */
            args->SXY += args->points[i].x * args->points[i].y; /* LASER-EXPECT: false_sharing heap */
        }
    }
}

static void *lreg_thread(void *arg)
{
    linear_regression_map(arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 100, MAX_THREADS);
    passes = a.size;

    long n = POINTS_PER_THREAD * a.threads;
    POINT_T *points = xmalloc(sizeof(POINT_T) * (size_t)n);
    for (long i = 0; i < n; i++) {
        uint64_t r = mix64((uint64_t)i);
        points[i].x = (char)(r & 0x7f);
        points[i].y = (char)((r >> 8) & 0x7f);
    }

#ifdef FIXED
    lreg_args *args = xaligned(FIX_ALIGN, sizeof(lreg_args) * (size_t)a.threads);
#else
    lreg_args *args = xmalloc(sizeof(lreg_args) * (size_t)a.threads); /* LASER-ALLOC */
#endif
    memset(args, 0, sizeof(lreg_args) * (size_t)a.threads);
    for (int i = 0; i < a.threads; i++) {
        args[i].points = points + POINTS_PER_THREAD * i;
        args[i].num_elems = POINTS_PER_THREAD;
    }

    run_threads(a.threads, lreg_thread, args, sizeof(lreg_args));

    long long SX = 0, SY = 0, SXX = 0, SYY = 0, SXY = 0;
    for (int i = 0; i < a.threads; i++) {
        SX += args[i].SX;
        SY += args[i].SY;
        SXX += args[i].SXX;
        SYY += args[i].SYY;
        SXY += args[i].SXY;
    }
    /* Phoenix's reduce: slope and intercept, here in fixed point so the checksum is exact. */
    long long N = n * passes;
    long long den = N * SXX - SX * SX;
    long long slope_q16 = den ? ((N * SXY - SX * SY) << 16) / den : 0;
    uint64_t sum = mix64((uint64_t)SX) ^ mix64((uint64_t)SY + 1) ^ mix64((uint64_t)SXX + 2) ^
                   mix64((uint64_t)SYY + 3) ^ mix64((uint64_t)SXY + 4) ^
                   mix64((uint64_t)slope_q16 + 5);
    print_checksum(sum);
    free(args);
    free(points);
    return 0;
}
