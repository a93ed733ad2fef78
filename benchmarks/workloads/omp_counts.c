/*
 * omp_counts: per-thread counters in a local array of main, updated inside an OpenMP
 * worksharing loop (`counts[omp_get_thread_num()]++` under `#pragma omp for`).
 *
 * The classic OpenMP false sharing (Mattson's `sum[id]`, per-thread histograms and tallies):
 * gcc outlines the parallel region into `main._omp_fn.0`, which reaches main's shared locals
 * through one artificial parameter, `.omp_data_i`, holding a pointer to each. At -O2 the
 * increment stays in memory on every element (the input is `unsigned char`, which may alias
 * the counters), and the counters of the team's threads sit 4 bytes apart on one line of the
 * master thread's stack. DWARF nests the outlined function inside main, where laser's typing
 * did not look: until the fifty-second session the access came out untyped ("no DWARF
 * function"); it is now `counts[*].v`, as main names it.
 *
 * FIXED: each counter aligned and padded to FIX_ALIGN bytes (still main's local).
 * SIZE: passes over 16 MB of input.
 */
#include <omp.h>

#include "common.h"

#ifdef FIXED
struct tally {
    int v;
} __attribute__((aligned(FIX_ALIGN)));
#else
struct tally {
    int v;
};
#endif

int main(int argc, char **argv)
{
    struct bench_args a = bench_parse(argc, argv, 64, MAX_THREADS);
    const long n = 16L << 20;
    unsigned char *data = xmalloc((size_t)n);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < n; i += 8) {
        x = mix64(x);
        memcpy(data + i, &x, 8);
    }
    struct tally counts[MAX_THREADS];
    memset(counts, 0, sizeof counts);
    omp_set_dynamic(0);
    uint64_t sum = 0;
    for (long pass = 0; pass < a.size; pass++) {
#pragma omp parallel num_threads(a.threads)
        {
            int id = omp_get_thread_num();
#pragma omp for schedule(static)
            for (long i = 0; i < n; i++)
                if (data[i] >= 8)
                    counts[id].v++; /* LASER-EXPECT: false_sharing stack */
        }
        for (int t = 0; t < a.threads; t++)
            sum = sum * 31 + (uint64_t)counts[t].v;
    }
    print_checksum(mix64(sum));
    free(data);
    return 0;
}
