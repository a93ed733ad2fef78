/*
 * rand_lock: every thread draws a number with rand() between ~20 us stretches of private
 * arithmetic (issue 11 class 2: glibc's rand() lock).
 *
 * glibc's rand() is __random(), which takes a lock in libc's own data (random.c's `lock`)
 * and steps the generator state all threads share: true sharing inside glibc, ~50 k calls a
 * second per thread, while the calls are ~0.2% of the run, so a timer sample lands in
 * rand() about once a second and on its lock almost never. The program's line is the call;
 * a report names glibc's lines and that call site ("called from").
 *
 * The draws go into per-thread sums the checksum leaves out: which thread draws which number
 * varies run to run (and the FIXED twin draws other numbers).
 *
 * FIXED: rand_r() on a per-thread seed, which shares nothing.
 * SIZE: draws per thread, in thousands.
 */
#include "common.h"

/* Iterations of private arithmetic between two draws (~20 us). */
#define WORK 20000

struct draws {
    unsigned long sum;
    unsigned seed;
} __attribute__((aligned(FIX_ALIGN)));

static struct draws draws[MAX_THREADS];
static long per_thread;

static NOINLINE uint64_t private_work(uint64_t h)
{
    for (int k = 0; k < WORK; k++)
        h = h * 6364136223846793005ULL + 1442695040888963407ULL;
    return h;
}

static NOINLINE uint64_t draw_loop(struct draws *d, uint64_t h)
{
    for (long i = 0; i < per_thread; i++) {
        h = private_work(h);
#ifdef FIXED
        d->sum += (unsigned long)rand_r(&d->seed);
#else
        d->sum += (unsigned long)rand(); /* LASER-EXPECT: true_sharing library */
#endif
    }
    return h;
}

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    draws[t].seed = (unsigned)t + 1;
    return (void *)(uintptr_t)draw_loop(&draws[t], mix64((uint64_t)t + 1));
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 60, MAX_THREADS);
    per_thread = a.size * 1000;
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < a.threads; t++)
        pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++) {
        void *h;
        pthread_join(tid[t], &h);
        sum = mix64(sum ^ (uint64_t)(uintptr_t)h);
    }
    print_checksum(sum);
    return 0;
}
