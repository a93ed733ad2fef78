/* x86-TSO litmus runner: repeats each test's thread bodies many times, counts every outcome,
 * and flags any outcome the x86-TSO model forbids (the table comes from gen.py's exhaustive
 * exploration of the model, see asm-tests/litmus/manifest.json).
 *
 *   usage: litmus [-n ITERS] [-b BATCH] [-j JITTER] [-w SECONDS] [-s] [-l] [TEST ...]
 *          ITERS also from LITMUS_ITERS (default 100000); -l lists the tests; -s also runs the
 *          runner's self-tests (bodies deliberately wrong: they pass only if the runner reports
 *          forbidden outcomes for them); -w waits SECONDS after printing the pid before the
 *          first test, so a tool can attach and rewrite the bodies first; -f runs tests needing
 *          more CPUs than available anyway, threads sharing CPUs round-robin (no relaxed
 *          outcome is likely then, but forbidden ones must still never appear).
 *
 * One iteration = every thread passes a spin barrier on a shared counter, then runs its body on
 * that iteration's own x and y (each in its own cache line, fresh zeros), so no thread waits for
 * the others to finish an iteration before starting the next:
 *
 *   P0:  ─barrier k─▶ body(x_k, y_k, out0_k) ─barrier k+1─▶ body(x_k+1, …) …
 *   P1:  ─barrier k─▶ body(x_k, y_k, out1_k) ─barrier k+1─▶ …
 *
 * After BATCH iterations all threads meet, thread 0 tallies the batch and re-zeroes it. Threads
 * are pinned to distinct CPUs; a test needing more CPUs than this process may use is skipped
 * with the reason printed. Exit status: 1 if any forbidden outcome was seen, 2 on usage error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "litmus.h"

#define WORDS_PER_LINE 8
#define OUT_WORDS 4
#define MAX_OUTCOMES 256

struct outcome {
    unsigned char v[LITMUS_MAX_OBS];
    uint64_t count;
};

struct run {
    const struct litmus_test *test;
    uint64_t iters, batch;
    unsigned jitter;
    unsigned spin_limit; /* spins before sched_yield: small when threads share CPUs (-f) */
    int cpus[LITMUS_MAX_THREADS];
    uint64_t *locs;                    /* batch * 2 lines: x_k, y_k */
    uint64_t *outs[LITMUS_MAX_THREADS]; /* batch * OUT_WORDS per thread */
    _Atomic uint64_t arrive;
    struct outcome seen[MAX_OUTCOMES];
    int nseen;
    uint64_t overflow;
};

struct worker {
    struct run *run;
    int t;
};

static void spin_barrier(struct run *r, uint64_t *passed)
{
    uint64_t target = ++*passed * (uint64_t)r->test->nthreads;
    /* ATOMICS: acq_rel on the arrival publishes this thread's earlier stores (outputs of the
     * batch) to whoever sees the count complete; acquire on the spin load makes the others'
     * stores visible to us once we leave. */
    atomic_fetch_add_explicit(&r->arrive, 1, memory_order_acq_rel);
    unsigned spins = 0;
    while (atomic_load_explicit(&r->arrive, memory_order_acquire) < target) {
        __builtin_ia32_pause();
        /* The CPUs may be shared with other work: give a preempted peer the CPU back. */
        if (++spins > r->spin_limit) {
            sched_yield();
            spins = 0;
        }
    }
}

static int in_set(const unsigned char *set, int n, int width, const unsigned char *v)
{
    for (int i = 0; i < n; i++)
        if (!memcmp(set + (size_t)i * width, v, width))
            return 1;
    return 0;
}

static void tally(struct run *r, uint64_t n)
{
    const struct litmus_test *T = r->test;
    for (uint64_t k = 0; k < n; k++) {
        unsigned char v[LITMUS_MAX_OBS] = {0};
        for (int o = 0; o < T->nobs; o++) {
            const struct litmus_obs *ob = &T->obs[o];
            uint64_t x = ob->is_loc ? r->locs[(2 * k + ob->index) * WORDS_PER_LINE]
                                    : r->outs[ob->index][k * OUT_WORDS + ob->reg];
            v[o] = x > 255 ? 255 : (unsigned char)x;
        }
        int i;
        for (i = 0; i < r->nseen; i++)
            if (!memcmp(r->seen[i].v, v, T->nobs))
                break;
        if (i == r->nseen) {
            if (r->nseen == MAX_OUTCOMES) {
                r->overflow++;
                continue;
            }
            memcpy(r->seen[i].v, v, sizeof v);
            r->seen[i].count = 0;
            r->nseen++;
        }
        r->seen[i].count++;
    }
    memset(r->locs, 0, n * 2 * WORDS_PER_LINE * sizeof(uint64_t));
    for (int t = 0; t < T->nthreads; t++)
        memset(r->outs[t], 0, n * OUT_WORDS * sizeof(uint64_t));
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->run;
    int t = w->t;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(r->cpus[t], &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    litmus_body body = r->test->bodies[t];
    uint64_t *out = r->outs[t];
    uint64_t passed = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ULL * (uint64_t)(t + 1);
    for (uint64_t start = 0; start < r->iters; start += r->batch) {
        uint64_t n = r->iters - start < r->batch ? r->iters - start : r->batch;
        for (uint64_t k = 0; k < n; k++) {
            spin_barrier(r, &passed);
            if (r->jitter) {
                /* A few cycles of random delay so the threads' start skew varies. */
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                for (unsigned d = (unsigned)(rng % (r->jitter + 1)); d; d--)
                    __asm__ volatile("" ::: "memory");
            }
            body(r->locs + 2 * k * WORDS_PER_LINE, r->locs + (2 * k + 1) * WORDS_PER_LINE,
                 out + k * OUT_WORDS);
        }
        spin_barrier(r, &passed);
        if (t == 0)
            tally(r, n);
        spin_barrier(r, &passed);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void show_outcome(const struct litmus_test *T, const unsigned char *v)
{
    int col = 0;
    for (int o = 0; o < T->nobs; o++)
        col += printf("%s%s=%u", o ? " " : "", T->obs[o].name, v[o]);
    printf("%*s", col < 40 ? 40 - col : 1, "");
}

static int cmp_count(const void *a, const void *b)
{
    const struct outcome *x = a, *y = b;
    return x->count < y->count ? 1 : x->count > y->count ? -1 : 0;
}

/* Returns the number of forbidden outcomes seen. */
static uint64_t report(struct run *r, double secs)
{
    const struct litmus_test *T = r->test;
    uint64_t forbidden = 0, relaxed = 0, cond = 0;
    qsort(r->seen, r->nseen, sizeof r->seen[0], cmp_count);
    printf("%s%s%s%s: %d threads on CPUs", T->name, *T->aliases ? " (" : "", T->aliases,
           *T->aliases ? ")" : "", T->nthreads);
    for (int t = 0; t < T->nthreads; t++)
        printf("%s%d", t ? "," : " ", r->cpus[t]);
    printf(", %llu iterations, %.2f s\n", (unsigned long long)r->iters, secs);
    for (int i = 0; i < r->nseen; i++) {
        const unsigned char *v = r->seen[i].v;
        int is_cond = in_set(T->cond, T->ncond, T->nobs, v);
        const char *cls;
        if (!in_set(T->tso, T->ntso, T->nobs, v)) {
            cls = "FORBIDDEN by x86-TSO";
            forbidden += r->seen[i].count;
        } else if (!in_set(T->sc, T->nsc, T->nobs, v)) {
            cls = "relaxed (x86-TSO allows, SC does not)";
            relaxed += r->seen[i].count;
        } else {
            cls = "sc";
        }
        if (is_cond)
            cond += r->seen[i].count;
        printf("  ");
        show_outcome(T, v);
        printf("%12llu  %s%s\n", (unsigned long long)r->seen[i].count, cls,
               is_cond ? "  <- condition" : "");
    }
    if (r->overflow)
        printf("  (%llu iterations had outcomes beyond the first %d distinct ones)\n",
               (unsigned long long)r->overflow, MAX_OUTCOMES);
    /* Allowed relaxed outcomes this run missed: worth knowing, not a failure. */
    for (int i = 0; i < T->ntso; i++) {
        const unsigned char *v = T->tso + (size_t)i * T->nobs;
        if (in_set(T->sc, T->nsc, T->nobs, v))
            continue;
        int found = 0;
        for (int j = 0; j < r->nseen; j++)
            found |= !memcmp(r->seen[j].v, v, T->nobs);
        if (!found) {
            printf("  ");
            show_outcome(T, v);
            printf("%12s  relaxed, allowed, not observed this run\n", "0");
        }
    }
    printf("  exists (%s): %s by x86-TSO, observed %llu times; relaxed outcomes %llu; "
           "forbidden outcomes %llu -> %s\n\n",
           T->condition, T->condition_forbidden ? "forbidden" : "allowed",
           (unsigned long long)cond, (unsigned long long)relaxed,
           (unsigned long long)forbidden, forbidden ? "FAIL" : "ok");
    return forbidden;
}

static int usable_cpus(int *cpus, int max)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set))
        return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return CPU_COUNT(&set);
}

static void usage(void)
{
    fprintf(stderr, "usage: litmus [-n ITERS] [-b BATCH] [-j JITTER] [-w SECONDS] [-s] [-f] [-l] "
                    "[TEST ...]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    uint64_t iters = 100000, batch = 4096;
    unsigned jitter = 0, wait_s = 0;
    int selftests = 0, force = 0;
    const char *e = getenv("LITMUS_ITERS");
    if (e)
        iters = strtoull(e, NULL, 0);
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-s")) {
            selftests = 1;
        } else if (!strcmp(argv[i], "-f")) {
            force = 1;
        } else if (!strcmp(argv[i], "-l")) {
            for (int k = 0; k < litmus_ntests; k++)
                printf("%s\n", litmus_tests[k].name);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] && !argv[i][2] && strchr("nbjw", argv[i][1])) {
            if (i + 1 >= argc)
                usage();
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 0);
            if (*end)
                usage();
            if (argv[i - 1][1] == 'n')
                iters = v;
            else if (argv[i - 1][1] == 'w')
                wait_s = (unsigned)v;
            else if (argv[i - 1][1] == 'b')
                batch = v ? v : 1;
            else
                jitter = (unsigned)v;
        } else if (argv[i][0] == '-') {
            usage();
        } else {
            first = i;
            break;
        }
    }
    for (int i = first; i < argc; i++) {
        int known = 0;
        for (int k = 0; k < litmus_ntests; k++)
            known |= !strcmp(argv[i], litmus_tests[k].name);
        if (!known) {
            fprintf(stderr, "litmus: unknown test %s (-l lists them)\n", argv[i]);
            return 2;
        }
    }
    if (wait_s) {
        printf("litmus: pid %d, starting in %u s\n", (int)getpid(), wait_s);
        fflush(stdout);
        sleep(wait_s);
    }
    int cpus[LITMUS_MAX_THREADS];
    int ncpu = usable_cpus(cpus, LITMUS_MAX_THREADS);
    int passed = 0, failed = 0, skipped = 0;
    for (int k = 0; k < litmus_ntests; k++) {
        const struct litmus_test *T = &litmus_tests[k];
        int wanted = first == argc && (!T->selftest || selftests);
        for (int i = first; i < argc; i++)
            wanted |= !strcmp(argv[i], T->name);
        if (!wanted)
            continue;
        if (T->nthreads > ncpu && !force) {
            printf("%s: SKIP, needs %d CPUs, this process may use %d\n\n", T->name, T->nthreads,
                   ncpu);
            skipped++;
            continue;
        }
        struct run *r = calloc(1, sizeof *r);
        if (!r)
            return 2;
        r->test = T;
        r->iters = iters;
        r->batch = batch < iters ? batch : (iters ? iters : 1);
        r->jitter = jitter;
        for (int t = 0; t < T->nthreads; t++)
            r->cpus[t] = cpus[t % (ncpu > 0 ? ncpu : 1)];
        /* Sharing a CPU, the peer we wait for can only run once we yield. */
        r->spin_limit = T->nthreads > ncpu ? 20 : 50000;
        r->locs = aligned_alloc(64, r->batch * 2 * WORDS_PER_LINE * sizeof(uint64_t));
        if (!r->locs)
            return 2;
        memset(r->locs, 0, r->batch * 2 * WORDS_PER_LINE * sizeof(uint64_t));
        for (int t = 0; t < T->nthreads; t++) {
            r->outs[t] = aligned_alloc(64, r->batch * OUT_WORDS * sizeof(uint64_t));
            if (!r->outs[t])
                return 2;
            memset(r->outs[t], 0, r->batch * OUT_WORDS * sizeof(uint64_t));
        }
        double t0 = now_s();
        pthread_t th[LITMUS_MAX_THREADS];
        struct worker w[LITMUS_MAX_THREADS];
        for (int t = 0; t < T->nthreads; t++) {
            w[t] = (struct worker){r, t};
            if (pthread_create(&th[t], NULL, work, &w[t])) {
                perror("pthread_create");
                return 2;
            }
        }
        for (int t = 0; t < T->nthreads; t++)
            pthread_join(th[t], NULL);
        uint64_t bad = report(r, now_s() - t0);
        if (T->selftest) {
            /* The body is wrong on purpose: seeing no forbidden outcome means the runner
             * cannot detect a broken body (or the run was too short to show it). */
            printf("  self-test: %s\n\n", bad ? "forbidden outcomes detected as they must be, ok"
                                              : "NO forbidden outcome detected -> FAIL");
            bad = !bad;
        }
        if (bad)
            failed++;
        else
            passed++;
        for (int t = 0; t < T->nthreads; t++)
            free(r->outs[t]);
        free(r->locs);
        free(r);
    }
    if (skipped)
        printf("%d passed, %d failed (%d skipped: too few CPUs)\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
