/*
 * header_reader: each thread counts its items into bins in its own argument struct, and reads
 * its input pointer and bounds from the struct's header on every item. The structs sit back
 * to back in one heap block, so thread t's last bin shares a line with thread t+1's header
 * (Phoenix histogram at -O0 on its false-sharing input, issue 11).
 *
 * Thread 0's items all fall in its last bin: it stores that bin on every item, without a
 * pause. Thread 1 only loads its header there, also on every item. Both accesses are dense,
 * so timer samples make the line a candidate at once, and a read+write window on it fills at
 * its cap with thread 1's loads. Its store-only windows see thread 0 alone, and there is
 * nothing in them to rate: the line's contention is only seen in read+write windows.
 *
 * FIXED: each struct starts a line of its own, its header apart from the bins before it.
 * SIZE: item triples per thread, in thousands.
 */
#include "common.h"

#define BINS 64
#define ITEMS (3 * 16384) /* each thread's items, (first, second, last) triples gone over again
                           * and again */

struct targ {
    const uint8_t *volatile items;
    volatile long begin, end;
    int first[BINS], second[BINS], last[BINS];
};

static NOINLINE void count_items(struct targ *t)
{
    long j = 0;
    for (long i = t->begin; i < t->end; i++) { /* LASER-EXPECT: false_sharing heap */
        t->first[t->items[j]]++; /* LASER-EXPECT: false_sharing heap */
        t->second[t->items[j + 1]]++; /* LASER-EXPECT: false_sharing heap */
        uint8_t v = t->items[j + 2]; /* LASER-EXPECT: false_sharing heap */
        t->last[v]++; /* LASER-EXPECT: false_sharing heap */
        j = j + 3 == ITEMS ? 0 : j + 3;
    }
}

static void *count_thread(void *arg)
{
    count_items(arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 60000, MAX_THREADS);
    long n = a.size * 1000;
    /* Thread 0's last bin is 63, on the line of thread 1's header; every other count of
     * every thread falls in bins 16-47, on lines no other thread touches (bins 0-3 share the
     * line of their header, and so thread t-1's last bin). */
    uint8_t *items = xaligned(64, (size_t)a.threads * ITEMS);
    for (int t = 0; t < a.threads; t++)
        for (long i = 0; i < ITEMS; i++)
            items[(size_t)t * ITEMS + (size_t)i] = t == 0 && i % 3 == 2
                ? BINS - 1
                : (uint8_t)(16 + mix64((uint64_t)(t * ITEMS + i)) % (BINS / 2));
#ifdef FIXED
    size_t stride = (sizeof(struct targ) + FIX_ALIGN - 1) / FIX_ALIGN * FIX_ALIGN;
#else
    size_t stride = sizeof(struct targ);
#endif
    /* 24 + 768 bytes: thread t's struct ends 24 bytes into a line, which thread t+1's header
     * fills. */
    char *block = xaligned(64, (size_t)a.threads * stride); /* LASER-ALLOC */
    memset(block, 0, (size_t)a.threads * stride);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++) {
        struct targ *arg = (struct targ *)(block + (size_t)t * stride);
        arg->items = items + (size_t)t * ITEMS;
        arg->begin = 0;
        arg->end = n;
        pthread_create(&tid[t], NULL, count_thread, arg);
    }
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        pthread_join(tid[t], NULL);
        struct targ *arg = (struct targ *)(block + (size_t)t * stride);
        for (int b = 0; b < BINS; b++)
            sum = mix64(sum ^ (uint64_t)arg->first[b] ^ (uint64_t)arg->second[b] << 21 ^
                        (uint64_t)arg->last[b] << 42);
    }
    print_checksum(sum);
    free(items);
    return 0;
}
