/*
 * ticket_counter: a shared ticket counter handing out work items (true sharing).
 *
 * Threads take the next item number with an atomic fetch-and-add on one global counter,
 * one item at a time, as a dynamic scheduler does. Every thread RMWs the same 8 bytes.
 *
 * FIXED (the same program with less sharing): take CHUNK tickets per fetch-and-add.
 * SIZE: millions of items in total.
 */
#include "common.h"

#ifdef FIXED
#define CHUNK 256
#else
#define CHUNK 1
#endif

long next_ticket;

static long total_items;
static uint64_t results[MAX_THREADS * 16];

static inline uint64_t process(long item)
{
    return mix64((uint64_t)item) & 0xffffff;
}

static NOINLINE uint64_t worker(void)
{
    uint64_t acc = 0;
    for (;;) {
        /* ATOMICS: relaxed; the ticket only needs to be unique, it publishes nothing. */
        long first = __atomic_fetch_add(&next_ticket, CHUNK, __ATOMIC_RELAXED); /* LASER-EXPECT: true_sharing next_ticket */
        if (first >= total_items)
            return acc;
        long end = first + CHUNK < total_items ? first + CHUNK : total_items;
        for (long i = first; i < end; i++)
            acc += process(i);
    }
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    results[t * 16] = worker();
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 100, MAX_THREADS);
    total_items = a.size * 1000000L;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum += results[t * 16];
    print_checksum(mix64(sum));
    return 0;
}
