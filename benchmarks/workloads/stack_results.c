/*
 * stack_results: per-thread partial results in an array that is a local of main.
 *
 * The shape of OpenMP's `double sum[NT]` shared local (OpenMP's shared locals live on the
 * master thread's stack) and of pthread programs that hand each worker a pointer to
 * `long results[NTHREADS]` declared in main: each worker adds to its own slot through that
 * pointer on every item, and the slots are 8 bytes apart on one line of main's stack. laser
 * drops accesses to a thread's own stack (they cannot contend), so until the twenty-third
 * session it dropped these too and reported nothing. The slot is written through a
 * `volatile` pointer so the compiler keeps every update in memory, as -O0 code and code
 * whose partial result escapes do.
 *
 * FIXED: each slot aligned and padded to FIX_ALIGN bytes (still on main's stack).
 * SIZE: items per thread, in millions.
 */
#include "common.h"

#ifdef FIXED
struct slot {
    long v;
} __attribute__((aligned(FIX_ALIGN)));
#else
struct slot {
    long v;
};
#endif

struct worker_arg {
    volatile struct slot *results;
    int t;
    long items;
};

static NOINLINE void accumulate(volatile struct slot *results, int t, long items)
{
    uint64_t seed = (uint64_t)(t + 1) << 32;
    for (long i = 0; i < items; i++)
        results[t].v += (long)(mix64(seed + (uint64_t)i) & 0xff); /* LASER-EXPECT: false_sharing stack */
}

static void *worker(void *p)
{
    struct worker_arg *a = p;
    accumulate(a->results, a->t, a->items);
    return NULL;
}

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 300, MAX_THREADS);
    struct slot results[MAX_THREADS];
    struct worker_arg args[MAX_THREADS];
    for (int t = 0; t < a.threads; t++) {
        results[t].v = 0;
        args[t] = (struct worker_arg){results, t, a.size * 1000000L};
    }
    run_threads(a.threads, worker, args, sizeof args[0]);
    uint64_t sum = 0;
    for (int t = 0; t < a.threads; t++)
        sum = mix64(sum ^ (uint64_t)results[t].v);
    print_checksum(sum);
    return 0;
}
