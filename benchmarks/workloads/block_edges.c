/*
 * block_edges: false sharing at the edges of blocks that move (issue 11, class 3, the matrix
 * form). A heap matrix of ROWS x COLS doubles is processed one row at a time, as an LU or a
 * stencil sweep works through its rows: thread t owns the columns [t*COLS/2, (t+1)*COLS/2) of
 * the current row and updates them over and over for ~10 ms, then both threads move to the
 * next row and never come back. COLS/2 = 60 is not a multiple of 8, so the line holding
 * columns 56..63 of a row is written by both owners: the contended line moves one row (960
 * bytes) every 10 ms, while every other line of a row stays private. Unlike migrating_line,
 * the store that contends writes 8 lines per sweep and only one of them is shared.
 *
 * The threads agree on the row from the clock (CLOCK_MONOTONIC through the vDSO every sweep),
 * not from shared memory, so nothing else is contended.
 *
 * FIXED: each row is padded to 128 columns and the second owner's block starts at column 64,
 * a line of its own (the same work, the block edges on line boundaries).
 * SIZE: tenths of a second of run time.
 */
#include "common.h"

#define PHASE_NS 10000000L
#define ROWS 1024
#define HALF 60 /* columns per owner */

#ifdef FIXED
#define STRIDE 128
#define FIRST(t) ((t) * 64)
#else
#define STRIDE (2 * HALF)
#define FIRST(t) ((t) * HALF)
#endif

static double *matrix;
static long phases;
static double start_s;

/* One sweep over the owner's block of row r: each element relaxes toward the row above. */
static NOINLINE void sweep(double *row, const double *above, int first)
{
    for (int j = first; j < first + HALF; j++)
        row[j] = row[j] * 0.5 + above[j] * 0.25; /* LASER-EXPECT: false_sharing heap */
}

static void *owner(void *arg)
{
    int t = (int)(intptr_t)arg;
    long p = 1, sweeps = 0;
    while (p < phases) {
        long r = p % ROWS;
        double *row = matrix + r * STRIDE;
        const double *above = matrix + (r ? r - 1 : ROWS - 1) * STRIDE;
        sweep(row, above, FIRST(t));
        sweeps++;
        p = 1 + (long)((bench_now_s() - start_s) * 1e9 / PHASE_NS);
    }
    return (void *)(uintptr_t)(sweeps & 1);
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 15, 2);
    phases = a.size * 100000000L / PHASE_NS;
    /* 64-aligned, so the edge line is the same in every run (columns 56..63 of each row). */
    matrix = xaligned(CACHE_LINE, (size_t)ROWS * STRIDE * sizeof(double)); /* LASER-ALLOC */
    for (long i = 0; i < (long)ROWS * STRIDE; i++)
        matrix[i] = (double)(mix64((uint64_t)i) & 0xffff);
    start_s = bench_now_s();
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, owner, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    /* The work depends on timing; the checksum only on the phases reached. */
    print_checksum(mix64((uint64_t)phases));
    free(matrix);
    return 0;
}
