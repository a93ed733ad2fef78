/*
 * heap_objects: small heap objects from one malloc size class landing in one cache line.
 *
 * The main thread allocates one 16-byte `conn_stats` per worker, one after the other. glibc
 * serves them from the same size class as neighbouring 32-byte chunks, so two workers'
 * objects share a line, although no code ever touches another thread's object. The counters
 * are updated in a function the compiler does not inline, so every update is a real
 * load and store (a program's accounting helper usually lives elsewhere too).
 *
 * FIXED: each object allocated aligned to, and as large as, FIX_ALIGN bytes.
 * SIZE: millions of packets per thread.
 */
#include "common.h"

struct conn_stats {
    long packets;
    long bytes;
};

/* gcc -O2 merges the two updates into one 16-byte SSE load/add/store (movdqu, paddq,
 * movups) and attributes it to the first line; the second line has no code of its own. */
static NOINLINE void account(struct conn_stats *s, long len)
{
    s->packets++; /* LASER-EXPECT: false_sharing heap */
    s->bytes += len;
}

static void *volatile heap_probe;

struct worker {
    struct conn_stats *stats;
    long packets;
    int id;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint64_t seed = (uint64_t)w->id << 40;
    for (long i = 0; i < w->packets; i++)
        account(w->stats, 40 + (long)(mix64(seed + (uint64_t)i) & 1023));
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 200, MAX_THREADS);
    struct worker workers[MAX_THREADS];
#ifndef FIXED
    /* glibc hands out 32-byte chunks back to back, two per line; whether objects 0 and 1
     * share a line depends on where the chunk run starts. Keep one chunk as a spacer when
     * they would not, so the ground truth does not depend on malloc's state. (The probe goes
     * through a volatile global: gcc would otherwise delete the malloc/free pair.) */
    heap_probe = malloc(sizeof(struct conn_stats));
    void *spacer = heap_probe;
    if (((uintptr_t)spacer & (CACHE_LINE - 1)) < CACHE_LINE / 2) {
        free(spacer); /* the next malloc of this size class returns it again */
        spacer = NULL;
    }
#endif
    for (int t = 0; t < a.threads; t++) {
#ifdef FIXED
        workers[t].stats = xaligned(FIX_ALIGN, FIX_ALIGN);
#else
        workers[t].stats = xmalloc(sizeof(struct conn_stats)); /* LASER-ALLOC */
#endif
        workers[t].stats->packets = 0;
        workers[t].stats->bytes = 0;
        workers[t].packets = a.size * 1000000L;
        workers[t].id = t;
    }

#ifndef FIXED
    if (a.threads > 1 && (uintptr_t)workers[0].stats / CACHE_LINE !=
                             (uintptr_t)workers[1].stats / CACHE_LINE)
        fprintf(stderr, "heap_objects: objects %p and %p do not share a line\n",
                (void *)workers[0].stats, (void *)workers[1].stats);
#endif
    run_threads(a.threads, worker_main, workers, sizeof(struct worker));

    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        sum = mix64(sum ^ (uint64_t)workers[t].stats->packets) + (uint64_t)workers[t].stats->bytes;
        free(workers[t].stats);
    }
    print_checksum(sum);
#ifndef FIXED
    free(spacer);
#endif
    return 0;
}
