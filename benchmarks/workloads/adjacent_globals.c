/*
 * adjacent_globals: separate global variables that the linker places side by side.
 *
 * A four-stage pipeline; each stage runs on its own thread and publishes its progress in
 * its own global counter (volatile, as progress counters that a monitor reads are). The
 * counters are distinct variables, but .bss packs them into one cache line.
 *
 * FIXED: each counter aligned to FIX_ALIGN bytes.
 * THREADS: 1..4 (one per stage). SIZE: millions of items per stage.
 */
#include "common.h"

#ifdef FIXED
#define COUNTER_ATTR __attribute__((aligned(FIX_ALIGN)))
#else
#define COUNTER_ATTR
#endif

volatile long parse_done COUNTER_ATTR;
volatile long hash_done COUNTER_ATTR;
volatile long compress_done COUNTER_ATTR;
volatile long emit_done COUNTER_ATTR;

static long items;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE uint64_t stage_parse(void)
{
    uint64_t acc = 0;
    for (long i = 0; i < items; i++) {
        acc += (uint64_t)i * 31 + (acc >> 7);
        parse_done++; /* LASER-EXPECT: false_sharing parse_done,hash_done,compress_done,emit_done */
    }
    return acc;
}

static NOINLINE uint64_t stage_hash(void)
{
    uint64_t acc = 1;
    for (long i = 0; i < items; i++) {
        acc = (acc ^ (uint64_t)i) * 0x100000001b3ULL;
        hash_done++; /* LASER-EXPECT: false_sharing parse_done,hash_done,compress_done,emit_done */
    }
    return acc;
}

static NOINLINE uint64_t stage_compress(void)
{
    uint64_t acc = 2;
    for (long i = 0; i < items; i++) {
        acc = (acc << 3 | acc >> 61) ^ (uint64_t)i;
        compress_done++; /* LASER-EXPECT: false_sharing parse_done,hash_done,compress_done,emit_done */
    }
    return acc;
}

static NOINLINE uint64_t stage_emit(void)
{
    uint64_t acc = 3;
    for (long i = 0; i < items; i++) {
        acc += acc * 5 + (uint64_t)i;
        emit_done++; /* LASER-EXPECT: false_sharing parse_done,hash_done,compress_done,emit_done */
    }
    return acc;
}

static void *stage_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t r = 0;
    switch (t) {
    case 0: r = stage_parse(); break;
    case 1: r = stage_hash(); break;
    case 2: r = stage_compress(); break;
    case 3: r = stage_emit(); break;
    }
    results[t * 16] = r;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 150, 4);
    items = a.size * 1000000L;
    pthread_t tid[4];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, stage_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = mix64((uint64_t)parse_done) ^ mix64((uint64_t)hash_done + 1) ^
                   mix64((uint64_t)compress_done + 2) ^ mix64((uint64_t)emit_done + 3);
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ results[t * 16]);
    print_checksum(sum);
    return 0;
}
