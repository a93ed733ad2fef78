/*
 * alloc_churn: an allocation-heavy program, for measuring what allocation tracking costs.
 *
 * Each thread keeps a ring of RING live blocks of mixed sizes (16–1040 bytes) and, per step,
 * frees the oldest and allocates a new one through a wrapper (`churn_alloc`), touching its first
 * word: tens of millions of malloc/free pairs a second on a fast machine, with ~RING live
 * blocks per thread. Not a contention workload (no LASER-EXPECT): each thread's blocks are
 * its own. Used by scripts/alloc-overhead.
 *
 * SIZE: millions of malloc/free pairs per thread.
 */
#include "common.h"

#define RING 512

static NOINLINE void *churn_alloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    return p;
}

struct churn {
    long steps;
    long sum;
    int id;
};

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    void *ring[RING] = {0};
    uint64_t seed = (uint64_t)c->id << 40;
    long sum = 0;
    for (long i = 0; i < c->steps; i++) {
        int slot = (int)(i % RING);
        free(ring[slot]);
        size_t n = 16 + (size_t)(mix64(seed + (uint64_t)i) & 1023);
        long *p = churn_alloc(n);
        p[0] = i;
        sum += p[0];
        ring[slot] = p;
    }
    for (int s = 0; s < RING; s++)
        free(ring[s]);
    c->sum = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 10, MAX_THREADS);
    struct churn c[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < a.threads; i++) {
        c[i].steps = a.size * 1000000L;
        c[i].id = i;
        pthread_create(&t[i], NULL, churn_main, &c[i]);
    }
    long total = 0;
    for (int i = 0; i < a.threads; i++) {
        pthread_join(t[i], NULL);
        total += c[i].sum;
    }
    printf("alloc_churn: %d threads, %ld pairs each, checksum %ld\n", a.threads,
           a.size * 1000000L, total);
    return 0;
}
