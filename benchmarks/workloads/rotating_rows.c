/*
 * rotating_rows: per-row results of an array whose rows the threads take from a shared
 * counter, pass after pass (dynamic scheduling: Phoenix pca hands out the rows of its matrix
 * from a counter under a lock; an OpenMP loop with a dynamic schedule inside a solver's
 * iterations does the same).
 *
 * A thread takes CHUNK rows at a time (an atomic add on `next_chunk`), sums each of its input
 * rows (~20 ns) and stores the row's result. Two threads' chunks meet in every line of
 * `result` (16 results a line, chunks of 8): false sharing between their stores, while both
 * work through the same part of the array. Which thread takes a chunk changes from pass to
 * pass, so every word of a line is written by both threads over time, a pass (~0.1 ms) apart;
 * no thread ever reads a result. The counter itself is true sharing (a line of its own).
 *
 * What it exercises: telling false sharing from true sharing when each word changes hands
 * once a pass. Padding the results removes every transfer on them but the hand-over of each
 * chunk once a pass.
 *
 * FIXED: each result on its own FIX_ALIGN-byte slot (the counter stays shared).
 * SIZE: passes over the rows.
 */
#include "common.h"

#define ROWS 4096
#define COLS 64
#define CHUNK 8
#define CHUNKS (ROWS / CHUNK)

#ifdef FIXED
#define STRIDE (FIX_ALIGN / sizeof(uint32_t))
#else
#define STRIDE 1
#endif

static uint32_t *result;
static uint32_t input[ROWS][COLS];
static long passes;
static struct {
    long v;
} __attribute__((aligned(64))) next_chunk;
static volatile uint64_t sink[MAX_THREADS * 8];

static NOINLINE uint64_t chunk_rows(long first)
{
    uint64_t acc = 0;
    for (long i = first; i < first + CHUNK; i++) {
        uint32_t s = 0;
        for (int j = 0; j < COLS; j++)
            s += input[i][j] * (uint32_t)(j + 1);
        result[i * STRIDE] = s; /* LASER-EXPECT: false_sharing heap */
        acc += s;
    }
    return acc;
}

static NOINLINE void *row_thread(void *arg)
{
    int me = (int)(intptr_t)arg;
    uint64_t acc = 0;
    for (;;) {
        long c = __atomic_fetch_add(&next_chunk.v, 1, __ATOMIC_RELAXED); /* LASER-EXPECT: true_sharing next_chunk */
        if (c >= passes * CHUNKS)
            break;
        acc += chunk_rows(c % CHUNKS * CHUNK);
    }
    sink[me * 8] = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 4000, MAX_THREADS);
    passes = a.size;
    uint64_t x = 7;
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < COLS; j++)
            input[i][j] = (uint32_t)(x = mix64(x)) & 0xffff;
    result = xaligned(64, ROWS * STRIDE * sizeof *result); /* LASER-ALLOC */
    memset(result, 0, ROWS * STRIDE * sizeof *result);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, row_thread, (void *)(intptr_t)t);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    for (int i = 0; i < ROWS; i++)
        sum = sum * 31 + result[i * STRIDE];
    print_checksum(mix64(sum));
    return 0;
}
