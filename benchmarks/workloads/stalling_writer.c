/*
 * stalling_writer: a thread's sparse counter stores on the line from which its neighbour
 * reads its arguments on every byte, while the storing thread spends half its time blocked
 * (Phoenix histogram -O0 reading a 600 MB mmapped image: its threads wait for page faults
 * for milliseconds at a time; issue 11 class 2).
 *
 * Layout as in reader_neighbour: each thread's `struct targ` holds 256 counters, then its
 * input window (data, pos, len, reloaded on every byte as -O0 code does). The structs sit
 * back to back in one 64-byte aligned heap block, 1048 bytes each, so thread 0's data/pos/len
 * share a line with thread 1's counts[0..9]. Thread 0 only reads there; thread 1 increments
 * one of those ten counters for 10 of 256 byte values, and does a few multiply-adds of
 * private work per byte, so a timer sample seldom lands on that store. After every 256 KiB
 * of input thread 1 sleeps for about as long as the bytes took (like a page-fault wait).
 *
 * Thread 0 does the same bytes without sleeping, so it is done halfway through the run: the
 * line is contended for ~0.35 s, room for a few watch windows only.
 *
 * What it exercises: a store-only survey window sees thread 1 alone, so the line's
 * contention shows only in a read+write window while thread 1 is running. One such window
 * taken while it sleeps sees thread 0 alone, and so does one whose events thread 0's hot
 * reads spent while the window was still opening.
 *
 * FIXED: each struct padded to a multiple of FIX_ALIGN bytes.
 * SIZE: passes over each thread's 8 MB of input.
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
static struct targ *args;
static volatile uint64_t sink[MAX_THREADS * 8];

/* A chunk of bytes: the counters and a little private arithmetic per byte. */
static NOINLINE uint64_t count_chunk(struct targ *t, long from, long to)
{
    uint64_t acc = 0;
    for (long i = from; i < to && i < t->pos + t->len; i++) { /* LASER-EXPECT: false_sharing heap */
        unsigned v = t->data[i]; /* LASER-EXPECT: false_sharing heap */
        t->counts[v]++; /* LASER-EXPECT: false_sharing heap */
        acc = acc * 0x9e3779b97f4a7c15ULL + v;
        acc ^= acc >> 29;
    }
    return acc;
}

static NOINLINE void *count_thread(void *arg)
{
    struct targ *t = arg;
    int me = (int)(t - args);
    const long chunk = 256 << 10;
    uint64_t acc = 0;
    for (long p = 0; p < passes; p++)
        for (long i = t->pos; i < t->pos + t->len; i += chunk) {
            double t0 = bench_now_s();
            acc += count_chunk(t, i, i + chunk);
            if (me == 1) {
                double spent = bench_now_s() - t0;
                struct timespec ts = {0, (long)(spent * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
    sink[me * 8] = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 6, MAX_THREADS);
    long per_thread = 8L << 20;
    passes = a.size;
    unsigned char *data = xmalloc((size_t)(per_thread * a.threads));
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < per_thread * a.threads; i += 8) {
        x = mix64(x);
        memcpy(data + i, &x, 8);
    }
    args = xaligned(64, (size_t)a.threads * sizeof *args); /* LASER-ALLOC */
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
