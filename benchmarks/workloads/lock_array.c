/*
 * lock_array: an array of spinlocks packed together (lock striping).
 *
 * A hash table striped into NBUCKETS buckets, each with its own 4-byte spinlock; the locks
 * sit packed in one array, 16 to a cache line. Keys are partitioned so that thread t only
 * ever touches buckets b with b % THREADS == t: no bucket and no lock is shared, but
 * neighbouring locks belong to different threads and share lines. The buckets themselves
 * are padded, so the locks are the only contended data.
 *
 * FIXED: each lock aligned and padded to FIX_ALIGN bytes.
 * SIZE: millions of inserts per thread.
 */
#include "common.h"

#define NBUCKETS 64

#ifdef FIXED
static struct {
    volatile int v;
} __attribute__((aligned(FIX_ALIGN))) bucket_locks[NBUCKETS];
#define LOCK_OF(b) (&bucket_locks[b].v)
#else
static volatile int bucket_locks[NBUCKETS];
#define LOCK_OF(b) (&bucket_locks[b])
#endif

static struct bucket {
    long count;
    uint64_t sum;
} __attribute__((aligned(FIX_ALIGN))) buckets[NBUCKETS];

static inline void bucket_lock(volatile int *l)
{
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) /* LASER-EXPECT: false_sharing bucket_locks */
        while (*l)
            cpu_relax();
}

static inline void bucket_unlock(volatile int *l)
{
    __atomic_store_n(l, 0, __ATOMIC_RELEASE); /* LASER-EXPECT: false_sharing bucket_locks */
}

static long inserts;
static int nthreads;

static NOINLINE void insert_keys(int t)
{
    int per_thread = NBUCKETS / nthreads;
    for (long i = 0; i < inserts; i++) {
        uint64_t key = mix64(((uint64_t)t << 40) + (uint64_t)i);
        int b = (int)(key % (uint64_t)per_thread) * nthreads + t;
        bucket_lock(LOCK_OF(b));
        buckets[b].count++;
        buckets[b].sum += key;
        bucket_unlock(LOCK_OF(b));
    }
}

static void *thread_main(void *arg)
{
    insert_keys((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 60, NBUCKETS);
    inserts = a.size * 1000000L;
    nthreads = a.threads;
    pthread_t tid[NBUCKETS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    uint64_t sum = 0;
    for (int b = 0; b < NBUCKETS; b++)
        sum = mix64(sum ^ (uint64_t)buckets[b].count) + buckets[b].sum;
    print_checksum(sum);
    return 0;
}
