/*
 * round_threads: a flag stored by threads that are started afresh every round (the shape of
 * Phoenix kmeans: new `find_clusters` and `calc_means` threads every iteration).
 *
 * Each round the main thread clears `changed`, starts the threads of the *assign* phase, which
 * walk their points and store `changed = 1` whenever a point's label changes, joins them, then
 * starts the threads of the *sum* phase, which only read the points and never store the flag,
 * joins them, and works alone for a while. All assign threads store the same flag: true
 * sharing. Labels change often in the first rounds and ever less (one point in 8 + 8r), as
 * k-means converges, so the flag is hot early and sparse late, in phases, from threads that
 * live a few milliseconds each. `npoints` and `dim` share the flag's line and are read on every
 * point. What it tests: a watch window must see threads created while it counts (laser reads
 * their creation every 0.5 ms while the target makes threads), a survey turn must not end
 * before its window has counted, and a line the samples show contended must still be surveyed
 * until some window has watched it (benchmarks/RESULTS.md, twenty-second session).
 *
 * FIXED: one flag per thread, each on its own FIX_ALIGN-byte block, OR'ed by the main thread.
 * SIZE: rounds.
 */
#include "common.h"

#define POINTS_PER_THREAD 131072
#define DIM 4
#define K 8

static int (*points)[DIM];
static int *labels;
#ifdef FIXED
static struct {
    volatile int v;
} __attribute__((aligned(FIX_ALIGN))) changed_by[MAX_THREADS];
#define SET_CHANGED(t) (changed_by[t].v = 1)
#else
static volatile int changed;
#define SET_CHANGED(t) (changed = 1)
#endif

static long npoints;
static int dim;
static long sums[MAX_THREADS][DIM];
static int centres[K][DIM];
static int nthreads;
static long round_no;

struct phase_arg {
    int t;
};

static NOINLINE void assign(int t)
{
    long lo = (long)POINTS_PER_THREAD * t, hi = lo + POINTS_PER_THREAD;
    uint64_t every = 8 + 8 * (uint64_t)round_no;
    for (long i = lo; i < hi && i < npoints; i++) {
        /* The distance work of a k-means step, to K centres; which points change label is
         * decided by a hash so that it thins out round by round. */
        long best = 0;
        for (int c = 0; c < K; c++) {
            long d = 0;
            for (int k = 0; k < dim; k++) {
                long diff = points[i][k] - centres[c][k];
                d += diff * diff;
            }
            best += d & c;
        }
        int label = labels[i];
        if (mix64((uint64_t)i * 1315423911u + (uint64_t)round_no) % every == 0)
            label = (label + 1 + (int)(best & 1)) % K;
        if (labels[i] != label) {
            labels[i] = label;
            SET_CHANGED(t); /* LASER-EXPECT: true_sharing changed */
        }
    }
}

static NOINLINE void sum(int t)
{
    long lo = (long)POINTS_PER_THREAD * t, hi = lo + POINTS_PER_THREAD;
    long s[DIM] = {0};
    for (long i = lo; i < hi && i < npoints; i++)
        for (int k = 0; k < dim; k++)
            s[k] += points[i][k] * (labels[i] + 1);
    for (int k = 0; k < DIM; k++)
        sums[t][k] += s[k];
}

static void *assign_main(void *arg)
{
    assign(((struct phase_arg *)arg)->t);
    return NULL;
}

static void *sum_main(void *arg)
{
    sum(((struct phase_arg *)arg)->t);
    return NULL;
}

static void phase(void *(*fn)(void *))
{
    pthread_t tid[MAX_THREADS];
    struct phase_arg args[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        args[t].t = t;
        pthread_create(&tid[t], NULL, fn, &args[t]);
    }
    for (int t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 150, MAX_THREADS);
    nthreads = a.threads;
    npoints = (long)POINTS_PER_THREAD * nthreads;
    dim = DIM;
    points = xmalloc(sizeof *points * (size_t)npoints);
    labels = xmalloc(sizeof *labels * (size_t)npoints);
    memset(labels, 0, sizeof *labels * (size_t)npoints);
    for (int c = 0; c < K; c++)
        for (int k = 0; k < DIM; k++)
            centres[c][k] = (int)(mix64((uint64_t)(c * DIM + k) + 777) % 1000);
    for (long i = 0; i < npoints; i++)
        for (int k = 0; k < DIM; k++)
            points[i][k] = (int)(mix64((uint64_t)(i * DIM + k)) % 1000);
    long rounds_changed = 0;
    uint64_t serial = 0;
    for (round_no = 0; round_no < a.size; round_no++) {
#ifndef FIXED
        changed = 0;
#endif
        phase(assign_main);
        phase(sum_main);
#ifdef FIXED
        int c = 0;
        for (int t = 0; t < nthreads; t++) {
            c |= changed_by[t].v;
            changed_by[t].v = 0;
        }
#else
        int c = changed;
#endif
        rounds_changed += c;
        /* The serial phase: the main thread alone. */
        for (long i = 0; i < npoints; i++)
            serial = serial * 31 + (uint64_t)labels[i];
    }
    uint64_t s = serial ^ (uint64_t)rounds_changed;
    for (int t = 0; t < nthreads; t++)
        for (int k = 0; k < DIM; k++)
            s = s * 31 + (uint64_t)sums[t][k];
    print_checksum(mix64(s));
    return 0;
}
