/*
 * moving_scratch: false sharing on a scratch block that is freed and allocated again every
 * round, at an address that changes with the program's phase.
 *
 * As PARSEC streamcluster's work_mem in pgain: each round thread 0 allocates the round's
 * block, one part per thread of STRIDE doubles (the entries rounded up to 32 bytes, as
 * streamcluster's CACHE_LINE of 32), so one 64-byte line holds the tail of one thread's part
 * and the head of the next; every thread adds each of its points' costs into its part's
 * entry for the point's centre, between long distance computations; thread 0 frees the
 * block after the round. The block is allocated before the last round's is freed (so it
 * alternates between two addresses), and each phase of PHASE_ROUNDS rounds allocates a
 * spacer first and changes the number of centres: the shared line moves every phase, and in
 * one phase of four the parts end on a line boundary and nothing is shared.
 * A data window on one address sees the contention only while the block lies there, often
 * one thread's stores only (streamcluster: 1 run in 6 reported nothing).
 *
 * FIXED: each part rounded up to FIX_ALIGN bytes.
 * SIZE: rounds.
 */
#include "common.h"

#define DIM 32
#define POINTS 8000
#define PHASE_ROUNDS 100
#define LINE_DOUBLES 4 /* streamcluster's CACHE_LINE / sizeof(double) */

/* Centres per phase: parts of 12, 4, 20 and 8 doubles (96, 32, 160 and 64 bytes). The
 * block is line-aligned, so with parts of 96, 32 and 160 bytes the next thread's part starts
 * mid-line: its first entries share a line with the last entries of this thread's (centres
 * 8-9 of 10, both of 2, 16-17 of 18), and with 64-byte parts nothing is shared. */
static const int centres[4] = {10, 2, 18, 6};

static long rounds;
static int nthreads;
/* The rounds' barrier, and the round's block and part size (set by thread 0 before the
 * round's first barrier, read by every thread after it: true sharing once a round), each on
 * a line of its own. */
static struct {
    pthread_barrier_t b;
} __attribute__((aligned(64))) sync_;
static struct {
    double *block;
    long stride;
} __attribute__((aligned(64))) round_;
static float (*points)[POINTS][DIM]; /* per thread */
static double results[MAX_THREADS * 8];

static long part_stride(int k)
{
#ifdef FIXED
    long per_line = FIX_ALIGN / (long)sizeof(double);
#else
    long per_line = LINE_DOUBLES;
#endif
    return (k + 2 + per_line - 1) / per_line * per_line;
}

static NOINLINE float dist(const float *a, const float *b)
{
    float s = 0;
    for (int d = 0; d < DIM; d++)
        s += (a[d] - b[d]) * (a[d] - b[d]);
    return s;
}

/* Thread t's round: its points' costs into its part of the block; returns the part's sum. */
static NOINLINE double gain(int t, int k, const float *centre)
{
    double *lower = round_.block + (long)t * round_.stride;
    for (int i = 0; i < POINTS; i++) {
        float cost = dist(points[t][i], centre);
        int c = (int)(mix64((uint64_t)i * 31 + (uint64_t)t) % (uint64_t)k);
        lower[c] += cost; /* LASER-EXPECT: false_sharing heap */
    }
    lower[k] += 1.0;
    double sum = 0;
    for (int c = 0; c <= k; c++)
        sum += lower[c];
    return sum;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    void *spacer = NULL;
    double *old = NULL;
    double sum = 0;
    for (long r = 0; r < rounds; r++) {
        int phase = (int)(r / PHASE_ROUNDS);
        int k = centres[phase % 4];
        if (t == 0) {
            if (r % PHASE_ROUNDS == 0) {
                free(spacer);
                spacer = malloc(64 + 192 * (size_t)(phase % 3));
            }
            long stride = part_stride(k);
            size_t n = (size_t)stride * (size_t)(nthreads + 1) * sizeof(double);
            double *b = aligned_alloc(FIX_ALIGN, (n + FIX_ALIGN - 1) / FIX_ALIGN * FIX_ALIGN);
            if (!b)
                abort();
            memset(b, 0, n);
            round_.block = b;
            round_.stride = stride;
            free(old);
            old = b;
        }
        pthread_barrier_wait(&sync_.b);
        sum += gain(t, k, points[(t + 1) % nthreads][r % POINTS]);
        pthread_barrier_wait(&sync_.b);
    }
    if (t == 0) {
        free(old);
        free(spacer);
    }
    results[t * 8] = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 6000, MAX_THREADS);
    rounds = a.size;
    nthreads = a.threads;
    points = malloc(sizeof(*points) * (size_t)nthreads);
    if (!points)
        abort();
    for (int t = 0; t < nthreads; t++)
        for (int i = 0; i < POINTS; i++)
            for (int d = 0; d < DIM; d++)
                points[t][i][d] = (float)(mix64((uint64_t)(t * POINTS + i) * DIM + (uint64_t)d) % 1000) / 100.0f;
    pthread_barrier_init(&sync_.b, NULL, (unsigned)a.threads);
    run_threads(a.threads, thread_main, NULL, 1); /* thread t gets (void *)t */
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ (uint64_t)results[t * 8]);
    print_checksum(sum);
    return 0;
}
