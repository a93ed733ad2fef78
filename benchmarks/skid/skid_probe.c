/* Timer-skid probe (issue 11): where do cpu-clock samples land relative to a contended access?
 *
 * Two threads share one cache line: thread 0 loops `probe_load: mov (%rdi),%rcx` followed by a
 * chain of 24 register-only instructions, thread 1 loops `probe_store: mov %rcx,8(%rdi)`
 * followed by the same chain. The store invalidates the line the load reads, so both
 * accesses miss; the chain is cheap (4 independent adds a cycle). measure.py records this
 * program with laser, takes every sample's IP in the two functions and prints how many
 * instructions after the access each one landed (0 = on the access itself).
 *
 *   gcc -O2 -pthread benchmarks/skid/skid_probe.c -o /tmp/skid_probe && /tmp/skid_probe 2
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHAIN                                                                              \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"                                 \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"                                 \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"                                 \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"                                 \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"                                 \
    "add $1,%r8\n add $1,%r9\n add $1,%r10\n add $1,%r11\n"

/* void probe_loads(uint64_t *p, uint64_t n), void probe_stores(uint64_t *p, uint64_t n) */
__asm__(".text\n"
        ".globl probe_loads\n .type probe_loads,@function\n"
        "probe_loads:\n"
        "1:\n"
        ".globl probe_load\n probe_load: mov (%rdi),%rcx\n" CHAIN
        " dec %rsi\n jnz 1b\n ret\n .size probe_loads,.-probe_loads\n"
        ".globl probe_stores\n .type probe_stores,@function\n"
        "probe_stores:\n"
        "1:\n"
        ".globl probe_store\n probe_store: mov %rsi,8(%rdi)\n" CHAIN
        " dec %rsi\n jnz 1b\n ret\n .size probe_stores,.-probe_stores\n");

void probe_loads(uint64_t *p, uint64_t n);
void probe_stores(uint64_t *p, uint64_t n);

static uint64_t line[8] __attribute__((aligned(64)));
static double seconds = 2.0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *run(void *arg) {
    int t = (int)(intptr_t)arg;
    double end = now() + seconds;
    while (now() < end) {
        if (t == 0)
            probe_loads(line, 100000);
        else
            probe_stores(line, 100000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        seconds = atof(argv[1]);
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, run, (void *)(intptr_t)t);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    printf("done %lu\n", (unsigned long)line[1]);
    return 0;
}
