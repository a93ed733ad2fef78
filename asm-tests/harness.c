/* Harness shared by every asm-test.
 *
 * Each test is one generated assembly file (asm-tests/build/<name>.S) linked with this file.
 * The assembly defines the shared area and one body per thread; this file starts the threads,
 * releases them together from a barrier, calls each body in chunks until the run-time bound is
 * reached, and prints the final memory of the shared area so a checker can compare it with the
 * manifest (asm-tests/manifest.json).
 *
 *   thread t:  barrier ─▶ body_t(chunk, start, shared) ─▶ body_t(chunk, start+chunk, …) ─▶ … ─▶ n_t
 *
 * Bodies take (iterations >= 1, global index of the first iteration, shared area) so the value a
 * thread stores in iteration i is a function of i alone and the final memory is computable from
 * the per-thread iteration counts n_t that this harness prints.
 *
 * Knobs (argument wins over environment):
 *   --iters N   / ASMTEST_ITERS=N     iterations per thread (exact)          default: unbounded
 *   --seconds S / ASMTEST_SECONDS=S   wall-clock bound per thread            default: 1.5
 *   --chunk C   / ASMTEST_CHUNK=C     iterations per body call               default: 1024
 *   --wait W    / ASMTEST_WAIT=W      print the pid, sleep W seconds, then start (time for a
 *                                     tool to attach and rewrite the bodies first)
 *   ASMTEST_PIN=1                     pin thread t to CPU t % ncpus
 * With both bounds a thread stops at whichever comes first. --seconds 0 without --iters runs
 * until SIGINT or SIGTERM; either signal also ends a bounded run early. Either way the threads
 * finish their current chunk and the final memory is printed as usual. Exit status 77: the CPU lacks an
 * instruction set the test needs (AVX), nothing was run.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*asmtest_body)(uint64_t iters, uint64_t start, unsigned char *shared);

/* Defined by the generated assembly. */
extern unsigned char asmtest_shared[];
extern const uint32_t asmtest_shared_size;
extern const uint32_t asmtest_nthreads;
extern const uint32_t asmtest_needs_avx;
extern const char asmtest_name[];
extern const asmtest_body asmtest_bodies[];

#define MAX_THREADS 8

static uint64_t opt_iters = 0; /* 0: no iteration bound */
static double opt_seconds = 1.5;
static uint64_t opt_chunk = 1024;
static int opt_pin = 0;
static double opt_wait = 0;
static volatile sig_atomic_t stop_requested = 0;
static pthread_barrier_t start_barrier;
static uint64_t thread_iters[MAX_THREADS];

/* Called from the "call out of the loop" bodies: a real ABI call into C that the repair engine
 * must flush its store buffer before. Kept out of line so the call stays a call. */
__attribute__((noinline)) uint64_t asmtest_c_mix(uint64_t x)
{
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 32);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run_thread(void *arg)
{
    uint64_t t = (uint64_t)(uintptr_t)arg;
    if (opt_pin) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)(t % (uint64_t)(ncpu > 0 ? ncpu : 1)), &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    pthread_barrier_wait(&start_barrier);
    double deadline = opt_seconds > 0 ? now_s() + opt_seconds : 0;
    uint64_t done = 0;
    for (;;) {
        uint64_t n = opt_chunk;
        if (opt_iters && opt_iters - done < n)
            n = opt_iters - done;
        asmtest_bodies[t](n, done, asmtest_shared);
        done += n;
        if (opt_iters && done >= opt_iters)
            break;
        if (deadline && now_s() >= deadline)
            break;
        if (stop_requested)
            break;
    }
    thread_iters[t] = done;
    return NULL;
}

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*s == '\0' || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_f64(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || v < 0)
        return -1;
    *out = v;
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr, "usage: %s [--iters N] [--seconds S] [--chunk C] [--wait W]\n", argv0);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *e;
    int seconds_given = 0;
    if ((e = getenv("ASMTEST_ITERS")) && parse_u64(e, &opt_iters))
        usage(argv[0]);
    if ((e = getenv("ASMTEST_SECONDS"))) {
        if (parse_f64(e, &opt_seconds))
            usage(argv[0]);
        seconds_given = 1;
    }
    if ((e = getenv("ASMTEST_CHUNK")) && parse_u64(e, &opt_chunk))
        usage(argv[0]);
    if ((e = getenv("ASMTEST_WAIT")) && parse_f64(e, &opt_wait))
        usage(argv[0]);
    if ((e = getenv("ASMTEST_PIN")))
        opt_pin = atoi(e);
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage(argv[0]);
        if (!strcmp(argv[i], "--iters")) {
            if (parse_u64(argv[++i], &opt_iters))
                usage(argv[0]);
        } else if (!strcmp(argv[i], "--seconds")) {
            if (parse_f64(argv[++i], &opt_seconds))
                usage(argv[0]);
            seconds_given = 1;
        } else if (!strcmp(argv[i], "--wait")) {
            if (parse_f64(argv[++i], &opt_wait))
                usage(argv[0]);
        } else if (!strcmp(argv[i], "--chunk")) {
            if (parse_u64(argv[++i], &opt_chunk))
                usage(argv[0]);
        } else {
            usage(argv[0]);
        }
    }
    /* An explicit iteration count alone means "exactly N", not "N or 1.5 s". */
    if (opt_iters && !seconds_given)
        opt_seconds = 0;
    if (opt_chunk == 0)
        opt_chunk = 1;

    uint32_t nt = asmtest_nthreads;
    if (nt == 0 || nt > MAX_THREADS) {
        fprintf(stderr, "%s: bad thread count %u\n", asmtest_name, nt);
        return 2;
    }
    __builtin_cpu_init();
    if (asmtest_needs_avx && !__builtin_cpu_supports("avx")) {
        printf("asmtest %s: SKIP (CPU lacks AVX)\n", asmtest_name);
        return 77;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (opt_wait > 0) {
        printf("asmtest %s: pid %d, starting in %.1f s\n", asmtest_name, (int)getpid(), opt_wait);
        fflush(stdout);
        struct timespec ts = {(time_t)opt_wait, (long)((opt_wait - (double)(time_t)opt_wait) * 1e9)};
        while (nanosleep(&ts, &ts) && !stop_requested)
            ;
    }

    pthread_barrier_init(&start_barrier, NULL, nt);
    pthread_t th[MAX_THREADS];
    for (uint32_t t = 0; t < nt; t++) {
        if (pthread_create(&th[t], NULL, run_thread, (void *)(uintptr_t)t)) {
            perror("pthread_create");
            return 2;
        }
    }
    for (uint32_t t = 0; t < nt; t++)
        pthread_join(th[t], NULL);

    printf("asmtest %s threads=%u\n", asmtest_name, nt);
    printf("iters");
    for (uint32_t t = 0; t < nt; t++)
        printf(" %" PRIu64, thread_iters[t]);
    printf("\n");
    /* Little-endian 64-bit words, eight per row, offsets relative to asmtest_shared. */
    uint64_t fnv = 0xcbf29ce484222325ULL;
    for (uint32_t off = 0; off < asmtest_shared_size; off += 64) {
        printf("mem +0x%03x", off);
        for (uint32_t w = off; w < off + 64 && w < asmtest_shared_size; w += 8) {
            uint64_t v;
            memcpy(&v, asmtest_shared + w, 8);
            printf(" %016" PRIx64, v);
        }
        printf("\n");
    }
    for (uint32_t i = 0; i < asmtest_shared_size; i++) {
        fnv ^= asmtest_shared[i];
        fnv *= 0x100000001b3ULL;
    }
    printf("checksum 0x%016" PRIx64 "\n", fnv);
    return 0;
}
