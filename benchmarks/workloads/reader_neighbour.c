/*
 * reader_neighbour: one thread's sparse counter stores on the line from which its neighbour
 * reads its own arguments on every iteration (Phoenix histogram at -O0, issue 11 class 2).
 *
 * Each thread's `struct targ` holds 256 counters, then its input window (data, pos, len:
 * reloaded on every byte, as -O0 code reloads them from the argument struct). The structs sit
 * back to back in one heap block, 64-byte aligned, and are 1048 bytes long, so thread 0's
 * data/pos/len share a line with thread 1's counts[0..9]. Thread 1 increments one of those
 * ten counters for 10 bytes in 256 of its (uniformly random) input: sparse per instruction,
 * yet millions of times a second. Thread 0 only *reads* on that line. So the line moves
 * between thread 1's stores and thread 0's loads: false sharing that a timer sample shows
 * only when it lands on the rare store, and that a store-only watch window cannot see at all
 * (thread 1's own stores fill it).
 *
 * FIXED: each struct padded to a multiple of FIX_ALIGN bytes.
 * SIZE: passes over each thread's 16 MB of input (~40 ms each here).
 */
#include "common.h"

struct targ {
    unsigned counts[256];
    const unsigned char *volatile data;
    volatile long pos;
    volatile long len;
#ifdef FIXED
    char pad[FIX_ALIGN - (256 * 4 + 3 * 8) % FIX_ALIGN];
#endif
};

static long passes;

static NOINLINE void *count_thread(void *arg)
{
    struct targ *t = arg;
    for (long p = 0; p < passes; p++)
        for (long i = t->pos; i < t->pos + t->len; i++) /* LASER-EXPECT: false_sharing heap */
            t->counts[t->data[i]]++; /* LASER-EXPECT: false_sharing heap */
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 40, MAX_THREADS);
    long per_thread = 16L << 20;
    passes = a.size;
    unsigned char *data = xmalloc((size_t)(per_thread * a.threads));
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < per_thread * a.threads; i += 8) {
        x = mix64(x);
        memcpy(data + i, &x, 8);
    }
    struct targ *args = xaligned(64, (size_t)a.threads * sizeof *args); /* LASER-ALLOC */
    memset(args, 0, (size_t)a.threads * sizeof *args);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++) {
        args[t].data = data;
        args[t].pos = t * per_thread;
        args[t].len = per_thread;
        pthread_create(&tid[t], NULL, count_thread, &args[t]);
    }
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        pthread_join(tid[t], NULL);
        for (int v = 0; v < 256; v++)
            sum = sum * 31 + args[t].counts[v];
    }
    print_checksum(mix64(sum));
    return 0;
}
