// What whole-CPU watch windows cost a program by themselves, without laser (thirtieth
// session: laser's survey windows made benchmarks/watch-cost/thread_churn 10-30% slower while
// breakpoints held on its words for a whole run cost nothing measurable).
// Four write breakpoints per CPU on four words nobody writes (or ADDR, ADDR+8, ... in the
// command's address space: run it with `setarch -R` for a fixed address), opened before CMD
// starts and closed after it exits:
//   armed_windows MODE PERIOD_MS CMD...
//   MODE 0: counting events (what `perf stat -e mem:ADDR:w` opens)
//   MODE 1: sampling every hit, exclude_kernel and exclude_hv (laser's window events)
//   MODE 2: as 1, the four events of a CPU writing into one ring (laser's launch windows)
//   PERIOD_MS > 0: every PERIOD_MS, close all and open them again (a window each), or with
//   MODIFY=1 in the environment re-point them (DISABLE, MODIFY_ATTRIBUTES, ENABLE).
//   gcc -O2 -o armed_windows armed_windows.c
//   e.g. side by side: ./thread_churn 400 10000000, ./armed_windows 2 0 ./thread_churn ...,
//   ./armed_windows 2 10 ./thread_churn ..., MODIFY=1 ./armed_windows 2 10 ./thread_churn ...
// (root or perf_event_paranoid <= 0: the events are CPU-wide.)
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
static volatile long quiet[8];
static int fds[64][4]; static void *rings[64];
static int ncpu, mode;
static pid_t child = -1; /* killed if the events cannot be opened again */
static void openall(void) {
    for (int c = 0; c < ncpu; c++) for (int s = 0; s < 4; s++) {
        struct perf_event_attr a; memset(&a, 0, sizeof a); a.size = sizeof a;
        a.type = PERF_TYPE_BREAKPOINT; a.bp_type = HW_BREAKPOINT_W; a.bp_len = HW_BREAKPOINT_LEN_8;
        a.bp_addr = getenv("ADDR") ? strtoul(getenv("ADDR"), 0, 0) + 8 * s : (unsigned long)&quiet[s];
        if (mode >= 1) { a.sample_period = 1; a.exclude_kernel = 1; a.exclude_hv = 1;
            a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_REGS_USER; a.sample_regs_user = 0xff0fff; }
        int fd = -1;
        for (int tries = 0; tries < 5000 && fd < 0; tries++) { fd = syscall(SYS_perf_event_open, &a, -1, c, -1, 0); if (fd < 0) usleep(100); }
        if (fd < 0) { perror("perf_event_open"); if (child > 0) kill(child, SIGKILL); exit(1); }
        fds[c][s] = fd;
        if (mode == 2) { if (s == 0) { rings[c] = mmap(0, 9 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); }
                         else ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, fds[c][0]); }
    }
}
static void closeall(void) {
    for (int c = 0; c < ncpu; c++) { for (int s = 0; s < 4; s++) close(fds[c][s]); if (rings[c]) { munmap(rings[c], 9 * 4096); rings[c] = 0; } }
}
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODE PERIOD_MS CMD...\n", argv[0]); return 2; }
    mode = atoi(argv[1]); int period = atoi(argv[2]); ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    openall();
    pid_t p = fork();
    if (p == 0) { execvp(argv[3], argv + 3); _exit(127); }
    child = p;
    int st;
    for (;;) {
        if (period > 0) {
            usleep(period * 1000);
            if (waitpid(p, &st, WNOHANG) == p) break;
            if (getenv("MODIFY")) { /* re-point the open events: no close, no open */
                static int flip; flip ^= 1;
                for (int c = 0; c < ncpu; c++) for (int s = 0; s < 4; s++) {
                    struct perf_event_attr a; memset(&a, 0, sizeof a); a.size = sizeof a;
                    a.type = PERF_TYPE_BREAKPOINT; a.bp_type = HW_BREAKPOINT_W; a.bp_len = HW_BREAKPOINT_LEN_8;
                    unsigned long base = getenv("ADDR") ? strtoul(getenv("ADDR"), 0, 0) : (unsigned long)&quiet[0];
                    a.bp_addr = base + 8 * s + (flip ? 32 : 0);
                    a.sample_period = 1; a.exclude_kernel = 1; a.exclude_hv = 1;
                    a.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_REGS_USER; a.sample_regs_user = 0xff0fff;
                    ioctl(fds[c][s], PERF_EVENT_IOC_DISABLE, 0);
                    if (ioctl(fds[c][s], PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a) != 0) { perror("modify"); kill(p, 9); exit(1); }
                    ioctl(fds[c][s], PERF_EVENT_IOC_ENABLE, 0);
                }
            } else { closeall(); openall(); }
        }
        else { waitpid(p, &st, 0); break; }
    }
    closeall();
    return 0;
}
