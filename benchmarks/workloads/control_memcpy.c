/*
 * control_memcpy: threads copying their own buffers with glibc's memcpy/memset (a control).
 *
 * Nothing is shared: each thread copies 8 KiB blocks between two private, line-aligned
 * buffers and clears them, which glibc does with `rep movsb` / `rep stosb` at this size (its
 * ERMS paths), and counts blocks in its own padded slot. A detector must report nothing.
 *
 * It is the overhead control for watchpoints that do not trap: an enabled data breakpoint
 * turns off the CPU's fast-string microcode, so with one armed anywhere these copies run
 * element by element (measured ~30x slower per copy here). laser measures that cost from its
 * samples and keeps its watch windows within the overhead budget (laser-detect's
 * model/armed_cost.rs); `laser run` on this program must cost about what sampling alone does.
 * The FIXED twin is identical (nothing to fix).
 * SIZE: thousands of 8 KiB copies per thread.
 */
#include "common.h"

#include <string.h>

#define BLOCK 8192
#define BLOCKS 8

struct slot {
    volatile long copies;
} __attribute__((aligned(FIX_ALIGN)));

static struct slot slots[MAX_THREADS];
static long iters;

struct buffers {
    unsigned char a[BLOCK * BLOCKS];
    unsigned char b[BLOCK * BLOCKS];
} __attribute__((aligned(FIX_ALIGN)));

static NOINLINE uint64_t copy_blocks(int t, struct buffers *buf)
{
    uint64_t sum = 0;
    for (long i = 0; i < iters; i++) {
        int k = (int)(i % BLOCKS);
        buf->a[k * BLOCK + (i & (BLOCK - 1))] = (unsigned char)(i ^ t);
        memcpy(buf->b + k * BLOCK, buf->a + k * BLOCK, BLOCK);
        sum += buf->b[k * BLOCK + ((i * 7) & (BLOCK - 1))];
        if (k == BLOCKS - 1)
            memset(buf->a, (int)(i & 0xff), BLOCK);
        slots[t].copies++;
    }
    return sum;
}

static uint64_t sums[MAX_THREADS];

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    struct buffers *buf;
    if (posix_memalign((void **)&buf, FIX_ALIGN, sizeof *buf) != 0)
        abort();
    memset(buf, 0, sizeof *buf);
    sums[t] = copy_blocks(t, buf);
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 4000, MAX_THREADS);
    iters = a.size * 1000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ sums[t]) + (uint64_t)slots[t].copies;
    print_checksum(sum);
    return 0;
}
