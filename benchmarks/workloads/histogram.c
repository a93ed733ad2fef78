/*
 * histogram: per-thread counter arrays packed in one global (Phoenix's histogram keeps one
 * bin array per thread the same way).
 *
 * Each thread counts the brightness of its slice of an image into its own row of `hist`.
 * A row is 8 bins of 4 bytes, so two threads' rows share one cache line and every increment
 * steals the line from the neighbour. The bin index comes from the data, so the compiler
 * cannot keep the bins in registers.
 *
 * FIXED: each row aligned and padded to FIX_ALIGN bytes.
 * SIZE: passes over the 4 MiB image.
 */
#include "common.h"

#define NBINS 8
#define IMAGE_BYTES (4L << 20)

#ifdef FIXED
struct hist_row {
    unsigned int bins[NBINS];
} __attribute__((aligned(FIX_ALIGN)));
#else
struct hist_row {
    unsigned int bins[NBINS];
};
#endif

/* Aligned to a line in both twins: gcc only aligns it to 32, and at an odd 32 the rows of
 * threads 0 and 1 would fall into different lines by luck of the layout. */
static struct hist_row hist[MAX_THREADS] __attribute__((aligned(CACHE_LINE)));
static unsigned char *image;
static long passes;
static int nthreads;

static NOINLINE void histogram_slice(int t)
{
    long lo = IMAGE_BYTES * t / nthreads, hi = IMAGE_BYTES * (t + 1) / nthreads;
    for (long p = 0; p < passes; p++)
        for (long i = lo; i < hi; i++)
            hist[t].bins[image[i] >> 5]++; /* LASER-EXPECT: false_sharing hist */
}

static void *hist_thread(void *arg)
{
    histogram_slice((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 300, MAX_THREADS);
    passes = a.size;
    nthreads = a.threads;
    image = xmalloc(IMAGE_BYTES);
    for (long i = 0; i < IMAGE_BYTES; i += 8) {
        uint64_t r = mix64((uint64_t)i);
        memcpy(image + i, &r, 8);
    }

    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, hist_thread, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);

    uint64_t sum = 0;
    for (int b = 0; b < NBINS; b++) {
        unsigned long long total = 0;
        for (int t = 0; t < a.threads; t++)
            total += hist[t].bins[b];
        sum = mix64(sum ^ total);
    }
    print_checksum(sum);
    free(image);
    return 0;
}
