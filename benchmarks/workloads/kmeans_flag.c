/*
 * kmeans_flag: a flag every thread re-writes (Phoenix kmeans' global `modified`).
 *
 * Each round, every thread assigns its points to the nearest centre and sets the global
 * `modified` whenever a point changes cluster; the main thread reads and clears it between
 * rounds to decide whether to go on. All threads store to the same bytes: true sharing.
 * Here the centres are relabelled every round, so every point changes cluster every round
 * and the flag is written once per point (Phoenix's first rounds look like this).
 * volatile, because gcc otherwise sinks a conditional store out of the loop.
 *
 * FIXED: one flag per thread, each on its own FIX_ALIGN-byte block, OR'ed by the main thread.
 * SIZE: rounds over each thread's 64Ki points.
 */
#include "common.h"

#define POINTS_PER_THREAD 65536
#define K 8
#define DIM 3

#ifdef FIXED
static struct {
    volatile int v;
} __attribute__((aligned(FIX_ALIGN))) modified_by[MAX_THREADS];
#define SET_MODIFIED(t) (modified_by[t].v = 1)
#else
static volatile int modified;
#define SET_MODIFIED(t) (modified = 1)
#endif

static int points[MAX_THREADS * POINTS_PER_THREAD][DIM];
static int clusters[MAX_THREADS * POINTS_PER_THREAD];
static int base_centres[K][DIM];
static int centres[K][DIM];
static int nthreads;
static long rounds;
static pthread_barrier_t barrier;
static long rounds_modified;

static NOINLINE void find_clusters(int t)
{
    long lo = (long)POINTS_PER_THREAD * t, hi = lo + POINTS_PER_THREAD;
    for (long i = lo; i < hi; i++) {
        int best = 0;
        long best_d = -1;
        for (int c = 0; c < K; c++) {
            long d = 0;
            for (int k = 0; k < DIM; k++) {
                long diff = points[i][k] - centres[c][k];
                d += diff * diff;
            }
            if (best_d < 0 || d < best_d) {
                best_d = d;
                best = c;
            }
        }
        if (clusters[i] != best) {
            clusters[i] = best;
            SET_MODIFIED(t); /* LASER-EXPECT: true_sharing modified */
        }
    }
}

static void *kmeans_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (long r = 0; r < rounds; r++) {
        pthread_barrier_wait(&barrier); /* centres for round r are ready */
        find_clusters(t);
        pthread_barrier_wait(&barrier); /* round r done */
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 400, MAX_THREADS);
    nthreads = a.threads;
    rounds = a.size;
    long npoints = (long)POINTS_PER_THREAD * nthreads;
    for (long i = 0; i < npoints; i++)
        for (int k = 0; k < DIM; k++)
            points[i][k] = (int)(mix64((uint64_t)(i * DIM + k)) % 1000);
    for (int c = 0; c < K; c++)
        for (int k = 0; k < DIM; k++)
            base_centres[c][k] = (int)(mix64((uint64_t)(c * DIM + k) + 777) % 1000);
    for (long i = 0; i < npoints; i++)
        clusters[i] = -1;

    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads + 1);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < nthreads; t++)
        pthread_create(&tid[t], NULL, kmeans_thread, (void *)(intptr_t)t);
    for (long r = 0; r < rounds; r++) {
        /* Relabel: centre c of round r is base centre (c + r) % K. */
        for (int c = 0; c < K; c++)
            memcpy(centres[c], base_centres[(c + r) % K], sizeof centres[c]);
        pthread_barrier_wait(&barrier);
        pthread_barrier_wait(&barrier);
#ifdef FIXED
        int m = 0;
        for (int t = 0; t < nthreads; t++) {
            m |= modified_by[t].v;
            modified_by[t].v = 0;
        }
#else
        int m = modified;
        modified = 0;
#endif
        rounds_modified += m;
    }
    for (int t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);

    uint64_t sum = (uint64_t)rounds_modified;
    for (long i = 0; i < npoints; i++)
        sum = sum * 31 + (uint64_t)clusters[i];
    print_checksum(mix64(sum));
    return 0;
}
