// What a whole-CPU watch window's events cost laser and the CPU they watch, per window, five
// ways (issue 11: most of laser's own CPU on a busy program is the cross-CPU calls of its
// window events). Four write breakpoints bound to CPU 1 (where a thread spins, as a target
// would), moved between two sets of words each "window" from a thread pinned to CPU 0:
//   mode 0: open 4 + REFRESH 4 + close 4 (what laser's launch windows did until the
//           thirty-first session, and its per-thread windows still do)
//   mode 1: MODIFY_ATTRIBUTES 4 (disabled) + REFRESH 4 + DISABLE 4 (events kept open)
//   mode 2: one group (leader disabled, members enabled): DISABLE leader, MODIFY 4,
//           ENABLE + REFRESH members, REFRESH leader (one enable for the group)
//   mode 3: one group opened afresh each window (leader disabled, members enabled): open 4,
//           REFRESH members (no interrupt: their leader is off), REFRESH leader, close
//           members then leader (what laser's whole-CPU launch windows do since the
//           thirty-first session)
//   mode 4: as 3, with the leader disabled before the closes
// NS=1..4 in the environment: that many slots (default 4).
// Prints laser's CPU and wall time per window and the spinner's rate; the cross-CPU calls a
// window takes are the CAL line of /proc/interrupts before and after, over WINDOWS.
//   gcc -O2 -pthread -o window_ops window_ops.c && for m in 0 1 2 3 4; do ./window_ops $m 2000; done
// (root or perf_event_paranoid <= 0: the events are CPU-wide.)
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LIMIT 50 /* each event's share of a window's hit cap */

static volatile long words[64];
static volatile long spins;
static volatile int stop;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *spin(void *arg) {
    (void)arg;
    pin(1);
    while (!stop)
        spins++;
    return NULL;
}

static void attr_for(struct perf_event_attr *a, int word, int disabled) {
    memset(a, 0, sizeof *a);
    a->type = PERF_TYPE_BREAKPOINT;
    a->size = sizeof *a;
    a->bp_type = HW_BREAKPOINT_W;
    a->bp_addr = (unsigned long)&words[word * 8];
    a->bp_len = 8;
    a->sample_period = 1;
    a->disabled = disabled;
    a->exclude_kernel = 1;
    a->exclude_hv = 1;
}

static int open_bp(int word, int group, int disabled) {
    struct perf_event_attr a;
    attr_for(&a, word, disabled);
    int fd = syscall(SYS_perf_event_open, &a, -1, 1, group, 0);
    if (fd < 0) {
        perror("perf_event_open");
        exit(1);
    }
    return fd;
}

static void repoint(int fd, int word) {
    struct perf_event_attr a;
    attr_for(&a, word, 1);
    if (ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a) < 0) {
        perror("MODIFY_ATTRIBUTES");
        exit(1);
    }
}

static double now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3 || (getenv("NS") && (atoi(getenv("NS")) < 1 || atoi(getenv("NS")) > 4))) {
        fprintf(stderr, "usage: %s MODE(0-4) WINDOWS (NS=1..4 in the environment: slots)\n",
                argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]), n = atoi(argv[2]);
    int ns = getenv("NS") ? atoi(getenv("NS")) : 4;
    pin(0);
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    usleep(100000);
    int fds[4];
    if (mode == 1)
        for (int i = 0; i < ns; i++)
            fds[i] = open_bp(i, -1, 1);
    if (mode == 2) {
        fds[0] = open_bp(0, -1, 1);
        for (int i = 1; i < ns; i++)
            fds[i] = open_bp(i, fds[0], 0);
    }
    long s0 = spins;
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    for (int k = 0; k < n; k++) {
        int off = (k % 2) * 4; /* alternate between two sets of words */
        if (mode == 0) {
            for (int i = 0; i < ns; i++)
                fds[i] = open_bp(i + off, -1, 1);
            for (int i = 0; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_REFRESH, LIMIT);
            usleep(200);
            for (int i = 0; i < ns; i++)
                close(fds[i]);
        } else if (mode == 1) {
            for (int i = 0; i < ns; i++)
                repoint(fds[i], i + off);
            for (int i = 0; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_REFRESH, LIMIT);
            usleep(200);
            for (int i = 0; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_DISABLE, 0);
        } else if (mode == 3 || mode == 4) {
            fds[0] = open_bp(off, -1, 1);
            for (int i = 1; i < ns; i++)
                fds[i] = open_bp(i + off, fds[0], 0);
            for (int i = 1; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_REFRESH, LIMIT);
            ioctl(fds[0], PERF_EVENT_IOC_REFRESH, LIMIT);
            usleep(200);
            if (mode == 4)
                ioctl(fds[0], PERF_EVENT_IOC_DISABLE, 0);
            for (int i = ns - 1; i >= 0; i--)
                close(fds[i]);
        } else {
            ioctl(fds[0], PERF_EVENT_IOC_DISABLE, 0);
            for (int i = 0; i < ns; i++)
                repoint(fds[i], i + off);
            for (int i = 1; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_ENABLE, 0);
            for (int i = 0; i < ns; i++)
                ioctl(fds[i], PERF_EVENT_IOC_REFRESH, LIMIT);
            usleep(200);
            ioctl(fds[0], PERF_EVENT_IOC_DISABLE, 0);
        }
    }
    double w = now(CLOCK_MONOTONIC) - w0, c = now(CLOCK_THREAD_CPUTIME_ID) - c0;
    long sp = spins - s0;
    stop = 1;
    pthread_join(t, NULL);
    printf("mode %d: %d windows, laser CPU %.1f us/window, wall %.1f us/window, "
           "spinner %.3f Gspins/s\n",
           mode, n, c / n * 1e6, w / n * 1e6, sp / w / 1e9);
    return 0;
}
