/*
 * distant_reader: each thread adds into five sums in its own argument struct, and the next
 * thread reloads its input pointer, on every iteration, from the far end of the same line,
 * past a word nobody touches (Phoenix linear_regression at -O0, issue 11 class 2).
 *
 * The 64-byte structs sit back to back in one heap block at 56 mod 64, as calloc placed
 * Phoenix's: thread t's n, sx..sxy and tag fill one line, and thread t+1's `points` is its
 * last word. Thread t stores its sums (words 1-5 of the line) and thread t+1 only loads its
 * pointer (word 7); word 6 (thread t's tag) is never accessed. Between those accesses each
 * thread does ~0.7 us of private arithmetic, so timer samples land on them rarely while the
 * line still moves between the threads on most iterations. A store-only survey window
 * there sees thread t alone; a read+write window must watch word 7, not just the words next
 * to the stores, to see thread t+1.
 *
 * FIXED: each struct starts a line of its own.
 * SIZE: iterations per thread, in thousands.
 */
#include "common.h"

struct targ {
    const long *volatile points;
    volatile long n;
    volatile long sx, sy, sxx, syy, sxy;
    long tag;
};

/* ~0.7 us of arithmetic on private registers. */
static NOINLINE long private_work(long x)
{
    uint64_t h = (uint64_t)x;
    for (int k = 0; k < 600; k++)
        h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    return (long)(h >> 40);
}

static NOINLINE void *sum_thread(void *arg)
{
    struct targ *t = arg;
    for (long i = 0; i < t->n; i++) {
        long x = t->points[i & 1023]; /* LASER-EXPECT: false_sharing heap */
        long y = private_work(x);
        t->sx += x;
        t->sy += y;
        t->sxx += x * x;
        t->syy += y * y;
        t->sxy += x * y;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 400, MAX_THREADS);
    static long points[1024];
    for (int i = 0; i < 1024; i++)
        points[i] = (long)(mix64((uint64_t)i + 1) >> 44);
#ifdef FIXED
    size_t offset = 0;
#else
    size_t offset = 56;
#endif
    /* A local, as Phoenix's thread array is: no global points to the block, so laser's survey
     * reaches its lines through the heap lines samples touched. */
    char *block = xaligned(64, (size_t)(a.threads + 1) * sizeof(struct targ)); /* LASER-ALLOC */
    memset(block, 0, (size_t)(a.threads + 1) * sizeof(struct targ));
    struct targ *args = (struct targ *)(block + offset);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++) {
        args[t].n = a.size * 1000;
        args[t].tag = t;
        args[t].points = points;
        pthread_create(&tid[t], NULL, sum_thread, &args[t]);
    }
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        pthread_join(tid[t], NULL);
        sum = mix64(sum ^ (uint64_t)args[t].sx ^ (uint64_t)args[t].sxy);
    }
    print_checksum(sum);
    return 0;
}
