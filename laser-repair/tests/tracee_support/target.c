/* Test target for laser-repair's tracee tests (compiled with gcc at test time).
 *
 * Workers spin in `spin`, adding %rax (set by the 7-byte `movq $1,%rax` at `spin_site`) to their
 * slot's count and storing it in `last`. A repair replaces that instruction by a jump to a copy
 * that loads another constant, so `last` shows which code each thread runs.
 * main blocks in read() on stdin (exercises interrupted-syscall restarts), a sleeper blocks in
 * nanosleep (restart block), an optional spawner creates short threads all the time (threads
 * born while laser seizes), argv[3]=1 installs a seccomp filter. SIGUSR1 and signal 40 are counted. Commands: "report", "quit".
 * Any EINTR seen where none should happen is counted in `eintr`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct slot { long count; long last; char pad[48]; };
struct slot slots[8] __attribute__((aligned(64)));
volatile int stop_flag;
atomic_long usr1, rt, eintr, spawned;

__asm__(
    ".text\n"
    ".globl spin\n"
    ".type spin,@function\n"
    "spin:\n"
    ".globl spin_site\n"
    "spin_site:\n"
    "  movq $1, %rax\n"
    ".globl spin_after\n"
    "spin_after:\n"
    "  addq %rax, (%rdi)\n"
    "  movq %rax, 8(%rdi)\n"
    "  cmpl $0, stop_flag(%rip)\n"
    "  je spin_site\n"
    "  ret\n"
    ".size spin, .-spin\n");
void spin(struct slot *s);
extern char spin_site[], spin_after[];

static void on_usr1(int s) { (void)s; atomic_fetch_add(&usr1, 1); }
static void on_rt(int s) { (void)s; atomic_fetch_add(&rt, 1); }

static void *worker(void *arg) { spin(arg); return NULL; }

static void *sleeper(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* only ptrace may interrupt this nanosleep */
    while (!stop_flag) {
        struct timespec ts = {0, 3000000};
        if (nanosleep(&ts, NULL) != 0 && errno == EINTR) atomic_fetch_add(&eintr, 1);
    }
    return NULL;
}

static void *noop(void *arg) { (void)arg; return NULL; }

static void *spawner(void *arg) {
    (void)arg;
    while (!stop_flag) {
        pthread_t t;
        if (pthread_create(&t, NULL, noop, NULL) == 0) {
            pthread_join(t, NULL);
            atomic_fetch_add(&spawned, 1);
        }
        usleep(100);
    }
    return NULL;
}

static void report(const char *tag, int n) {
    printf("%s", tag);
    for (int i = 0; i < n; i++) printf(" %ld", slots[i].last);
    printf(" usr1=%ld rt=%ld eintr=%ld spawned=%ld\n", atomic_load(&usr1), atomic_load(&rt),
           atomic_load(&eintr), atomic_load(&spawned));
    fflush(stdout);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    int with_spawner = argc > 2 ? atoi(argv[2]) : 0;
    if (n < 1 || n > 8) return 2;
    if (argc > 3 && atoi(argv[3])) {
        /* An allow-everything seccomp filter: laser must refuse to inject syscalls anyway. */
        struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
        struct sock_fprog prog = {1, allow};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
            return 3;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_rt;
    sigaction(40, &sa, NULL);
    pthread_t th[12];
    int k = 0;
    for (int i = 0; i < n; i++) pthread_create(&th[k++], NULL, worker, &slots[i]);
    pthread_create(&th[k++], NULL, sleeper, NULL);
    if (with_spawner) pthread_create(&th[k++], NULL, spawner, NULL);
    printf("ready pid=%d site=%p after=%p slots=%p\n", getpid(), (void *)spin_site,
           (void *)spin_after, (void *)slots);
    fflush(stdout);
    char line[64];
    for (;;) {
        /* Raw read(): an EINTR here means a restart was lost. */
        ssize_t r = read(0, line, sizeof line - 1);
        if (r < 0 && errno == EINTR) { atomic_fetch_add(&eintr, 1); continue; }
        if (r <= 0) break;
        line[r] = 0;
        if (!strncmp(line, "report", 6)) report("report", n);
        else if (!strncmp(line, "quit", 4)) break;
    }
    stop_flag = 1;
    for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
    report("final", n);
    return 0;
}
