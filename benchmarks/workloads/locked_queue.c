/*
 * locked_queue: a mutex-protected work queue shared by all threads (true sharing).
 *
 * Every thread pushes an item and pops one (perhaps another thread's), over and over, on one
 * ring buffer guarded by a pthread mutex. The mutex word, head, tail and slots are the same
 * bytes for all threads: true sharing, in this file and in libc's pthread_mutex_lock/unlock.
 * Push-then-pop keeps at most THREADS items queued, so the ring never fills.
 *
 * FIXED (the same program with less sharing): one queue per thread, each on its own
 * FIX_ALIGN-aligned block, so the same pushes and pops never leave the thread.
 * SIZE: millions of items per thread.
 */
#include "common.h"

#define QCAP 256 /* power of two, >= MAX_THREADS */

struct work_queue {
    pthread_mutex_t mutex;
    unsigned long head;
    unsigned long tail;
    long slots[QCAP];
} __attribute__((aligned(FIX_ALIGN)));

#ifdef FIXED
static struct work_queue queues[MAX_THREADS];
#define QUEUE_OF(t) (&queues[t])
#else
static struct work_queue work_queue;
#define QUEUE_OF(t) (&work_queue)
#endif

static long items;
static uint64_t results[MAX_THREADS * 16];

static NOINLINE void push(struct work_queue *q, long v)
{
    pthread_mutex_lock(&q->mutex);
    q->slots[q->tail % QCAP] = v; /* LASER-EXPECT: true_sharing work_queue */
    q->tail++; /* LASER-EXPECT: true_sharing work_queue */
    pthread_mutex_unlock(&q->mutex);
}

static NOINLINE long pop(struct work_queue *q)
{
    for (;;) {
        pthread_mutex_lock(&q->mutex);
        if (q->head != q->tail) { /* LASER-EXPECT: true_sharing work_queue */
            long v = q->slots[q->head % QCAP]; /* LASER-EXPECT: true_sharing work_queue */
            q->head++; /* LASER-EXPECT: true_sharing work_queue */
            pthread_mutex_unlock(&q->mutex);
            return v;
        }
        pthread_mutex_unlock(&q->mutex);
        cpu_relax();
    }
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    struct work_queue *q = QUEUE_OF(t);
    uint64_t acc = 0;
    for (long i = 0; i < items; i++) {
        push(q, (long)t * items + i);
        acc += mix64((uint64_t)pop(q));
    }
    results[t * 16] = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 6, MAX_THREADS);
    items = a.size * 1000000L;
    for (int t = 0; t < MAX_THREADS; t++)
        pthread_mutex_init(&QUEUE_OF(t)->mutex, NULL);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < a.threads; t++)
        pthread_join(tid[t], NULL);
    /* Which thread popped which item varies run to run; the sum over all items does not. */
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum += results[t * 16];
    print_checksum(sum);
    return 0;
}
