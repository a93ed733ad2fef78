/*
 * global_struct: different fields of one global struct written by different threads.
 *
 * A server's statistics block: the receiver counts requests, the parser counts bytes in,
 * the sender counts bytes out, the logger counts errors. Each field has exactly one writer,
 * but the four 8-byte fields share a cache line.
 *
 * FIXED: each field aligned to FIX_ALIGN bytes inside the struct.
 * THREADS: 1..4 (one per role). SIZE: millions of events per role.
 */
#include "common.h"

#ifdef FIXED
#define FIELD_ATTR __attribute__((aligned(FIX_ALIGN)))
#else
#define FIELD_ATTR
#endif

struct server_stats {
    volatile long requests FIELD_ATTR;
    volatile long bytes_in FIELD_ATTR;
    volatile long bytes_out FIELD_ATTR;
    volatile long errors FIELD_ATTR;
};

struct server_stats g_stats;

static long events;

static NOINLINE void receiver(void)
{
    for (long i = 0; i < events; i++)
        g_stats.requests++; /* LASER-EXPECT: false_sharing g_stats */
}

static NOINLINE void parser(void)
{
    for (long i = 0; i < events; i++)
        g_stats.bytes_in += 64 + (i & 511); /* LASER-EXPECT: false_sharing g_stats */
}

static NOINLINE void sender(void)
{
    for (long i = 0; i < events; i++)
        g_stats.bytes_out += 128 + (i & 255); /* LASER-EXPECT: false_sharing g_stats */
}

static NOINLINE void logger(void)
{
    for (long i = 0; i < events; i++)
        if ((mix64((uint64_t)i) & 7) == 0)
            g_stats.errors++; /* LASER-EXPECT: false_sharing g_stats */
}

static void *role_main(void *arg)
{
    switch ((int)(intptr_t)arg) {
    case 0: receiver(); break;
    case 1: parser(); break;
    case 2: sender(); break;
    case 3: logger(); break;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 600, 4);
    events = a.size * 1000000L;
    pthread_t tid[4];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, role_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    print_checksum(mix64((uint64_t)g_stats.requests) ^ mix64((uint64_t)g_stats.bytes_in + 1) ^
                   mix64((uint64_t)g_stats.bytes_out + 2) ^ mix64((uint64_t)g_stats.errors + 3));
    return 0;
}
