// A program that starts its worker threads afresh for every round, as Phoenix kmeans does
// (two threads per phase, a phase every few milliseconds): what `laser run` costs a program
// whose threads come and go, against one that keeps them (issue 11, thirtieth session).
// Each round starts two threads that each sum squares for WORK iterations (10,000,000:
// ~2.8 ms here) and joins them. Nothing is shared: any finding is laser's or glibc's.
//   gcc -O2 -g -pthread -o thread_churn thread_churn.c
//   ./thread_churn ROUNDS WORK         e.g. 400 10000000 (~1.1 s; 800 threads)
//                                      or 1 4000000000 (the same work, two threads)
// Compare side by side in rotating rounds (bare, `laser run -q`, `laser run -q --watch
// false`), and laser's own thread with `perf stat --no-inherit -e task-clock,context-switches
// laser run -q ./thread_churn 400 10000000`.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Each thread's result on its own line (two lines apart), so nothing here contends. */
static volatile long sink[2][16];
static long work;

static void *worker(void *arg) {
    long id = (long)arg, s = 0;
    for (long i = 0; i < work; i++)
        s += i * i;
    sink[id][0] = s;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ROUNDS WORK\n", argv[0]);
        return 2;
    }
    int rounds = atoi(argv[1]);
    work = atol(argv[2]);
    for (int r = 0; r < rounds; r++) {
        pthread_t t[2];
        for (long i = 0; i < 2; i++)
            if (pthread_create(&t[i], NULL, worker, (void *)i) != 0) {
                perror("pthread_create");
                return 1;
            }
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
    }
    return 0;
}
