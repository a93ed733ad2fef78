/*
 * rare_reader: a line two threads' counters make contended, and a third access on it that
 * timer samples almost never show.
 *
 * A worker pool's shared block: thread 0 counts jobs done, thread 1 counts bytes written,
 * side by side (false sharing, dense: samples find the line at once). Thread 1 also checks
 * the pool's `limit` beside them, once every 64 of its jobs, inside a job loop of a few dozen
 * instructions of private arithmetic: the load is ~1/1,000 of its instructions, so a 250 Hz
 * timer lands on it about once in three runs of a second. It reads a word the other thread's
 * stores keep taking away, so it is part of the line's false sharing and the fix has to move
 * it too (issue 11, class 2, "sparse per instruction"; the asm-test body_big_rw_false is the
 * same shape in a bigger loop body).
 *
 * What it exercises: a candidate line's watch windows watch the words samples showed; the
 * `limit` load is found only if the debug registers those leave free watch the rest of the
 * line.
 *
 * FIXED: each field aligned to FIX_ALIGN bytes inside the struct.
 * THREADS: 1..2 (one per role). SIZE: thousands of jobs per thread.
 */
#include "common.h"

#ifdef FIXED
#define FIELD_ATTR __attribute__((aligned(FIX_ALIGN)))
#else
#define FIELD_ATTR
#endif

struct pool_block {
    volatile long jobs_done FIELD_ATTR;
    volatile long bytes_written FIELD_ATTR;
    volatile long limit FIELD_ATTR;
};

struct pool_block g_pool __attribute__((aligned(64)));

static long jobs;

/* A job's private work: a dependent chain the compiler cannot shorten. */
static inline uint64_t job(uint64_t x)
{
    for (int k = 0; k < 6; k++)
        x = x * 0x9e3779b97f4a7c15ULL + (x >> 31);
    return x;
}

static NOINLINE uint64_t counter(void)
{
    uint64_t x = 1;
    for (long i = 0; i < jobs; i++) {
        x = job(x);
        g_pool.jobs_done++; /* LASER-EXPECT: false_sharing g_pool */
    }
    return x;
}

static NOINLINE uint64_t writer(void)
{
    uint64_t x = 2;
    long over = 0;
    for (long i = 0; i < jobs; i++) {
        x = job(x);
        g_pool.bytes_written += (long)(x & 255); /* LASER-EXPECT: false_sharing g_pool */
        if ((i & 255) == 0 && g_pool.bytes_written > g_pool.limit) /* LASER-EXPECT: false_sharing g_pool */
            over++;
    }
    return x ^ (uint64_t)over;
}

static uint64_t results[2 * 16];

static void *role_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    results[t * 16] = t == 0 ? counter() : writer();
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 60000, 2);
    jobs = a.size * 1000L;
    g_pool.limit = 1L << 62;
    pthread_t tid[2];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, role_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = mix64(results[0] ^ mix64(results[16])) ^ (uint64_t)g_pool.jobs_done ^
                   (uint64_t)g_pool.bytes_written;
    print_checksum(sum);
    return 0;
}
