/*
 * laser's trap guard: traces a watched target so that the SIGTRAP of a lost debug exception
 * never reaches it (laser-driver/src/trap_guard.rs says why and how laser uses it).
 *
 *   laser_trap_guard PID
 *
 * Seizes every thread of PID (PTRACE_SEIZE, which stops nothing) and follows the threads and
 * processes they create, for the first CHURN_CLONES thread creations; after those, a thread
 * is seized when laser writes its id on stdin (one a line). Every signal is passed on as it
 * came, except a SIGTRAP only a lost debug exception explains (see spurious()), which is
 * dropped and counted. Prints "ready N" once every thread is seized ("gone …" if PID ended
 * first, "error …" if it cannot be traced), and "done KEPT PASSED CLONES FORWARDED" when the
 * target's last thread is gone or stdin closes; its exit then detaches the rest.
 *
 * C with no C library, on raw system calls: laser starts one for every watched run, and a
 * second laser process (its glibc start-up probes the caches with cpuid, a VM exit each) took
 * ~1 ms of the CPUs the program runs on; this starts in a few dozen microseconds.
 */

#define SYS_read 0
#define SYS_write 1
#define SYS_open 2
#define SYS_close 3
#define SYS_poll 7
#define SYS_rt_sigaction 13
#define SYS_rt_sigprocmask 14
#define SYS_exit_group 231
#define SYS_wait4 61
#define SYS_ptrace 101
#define SYS_getdents64 217
#define SYS_getpid 39
#define SYS_signalfd4 289
#define SYS_setpriority 141

#define PTRACE_PEEKDATA 2
#define PTRACE_CONT 7
#define PTRACE_SETOPTIONS 0x4200
#define PTRACE_GETSIGINFO 0x4202
#define PTRACE_SEIZE 0x4206
#define PTRACE_LISTEN 0x4208
#define PTRACE_O_TRACEFORK 0x02
#define PTRACE_O_TRACEVFORK 0x04
#define PTRACE_O_TRACECLONE 0x08
#define PTRACE_EVENT_CLONE 3
#define PTRACE_EVENT_STOP 128

#define SIGHUP 1
#define SIGINT 2
#define SIGQUIT 3
#define SIGTRAP 5
#define SIGPIPE 13
#define SIGTERM 15
#define SIGCHLD 17
#define SIGSTOP 19
#define SIGTSTP 20
#define SIGTTIN 21
#define SIGTTOU 22

#define TRAP_BRKPT 1
#define TRAP_HWBKPT 4
#define INT1 0xf1

#define WNOHANG 1
#define WALL 0x40000000
#define O_RDONLY 0
#define O_DIRECTORY 0200000
#define O_CLOEXEC 02000000
#define SFD_NONBLOCK 04000
#define SFD_CLOEXEC 02000000
#define POLLIN 1
#define ESRCH 3
#define EPERM 1

#define CHURN_CLONES 64

/* The guard's nice value. Whatever it does, a thread of the target waits for: a thread
 * creation stops the creator and the new thread until the guard resumes them, and an exiting
 * thread is the guard's to reap before the program's parent hears of it. Woken at the default
 * priority it queued behind laser's own threads (a trace showed a creation stopped 0.5 ms
 * while laser's main thread finished its start-up on that CPU); it uses ~0.1 ms of CPU a run,
 * so a higher priority takes nothing measurable from anyone. Side by side on the 16 real
 * programs (benchmarks/RESULTS.md, thirty-ninth session): geomean 1.035 -> 1.028 of bare. */
#define GUARD_NICE (-10)

typedef unsigned long u64;

static long sys(long n, long a, long b, long c, long d, long e) {
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return r;
}

/* The compiler may emit calls to these for struct copies and zeroing. */
void *memset(void *d, int c, u64 n) {
    unsigned char *p = d;
    while (n--) *p++ = (unsigned char)c;
    return d;
}
void *memcpy(void *d, const void *s, u64 n) {
    unsigned char *p = d;
    const unsigned char *q = s;
    while (n--) *p++ = *q++;
    return d;
}

static long ptrace(long req, long tid, long addr, long data) {
    return sys(SYS_ptrace, req, tid, addr, data, 0);
}

/* ---- text: the output line and /proc paths ---- */

struct text {
    char b[256];
    int len;
};

static void put(struct text *t, const char *s) {
    while (*s && t->len < (int)sizeof t->b - 1) t->b[t->len++] = *s++;
    t->b[t->len] = 0;
}
static void put_num(struct text *t, u64 v) {
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10); while ((v /= 10) && n < 24);
    while (n && t->len < (int)sizeof t->b - 1) t->b[t->len++] = d[--n];
    t->b[t->len] = 0;
}

static struct text out;

static void flush_line(void) {
    out.b[out.len++] = '\n';
    sys(SYS_write, 1, (long)out.b, out.len, 0, 0);
    out.len = 0;
}

static long parse_num(const char *s, int *ok) {
    long v = 0;
    *ok = *s != 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') { *ok = 0; return 0; }
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* ---- the traced threads: an open-addressed set of tids ---- */

#define SET_SIZE (1 << 16) /* a power of two, above any thread count worth tracing */
static int set[SET_SIZE];  /* 0 empty, -1 removed */
static long set_count;

static unsigned slot_of(int tid) { return ((unsigned)tid * 2654435761u) & (SET_SIZE - 1); }

static int set_has(int tid) {
    for (unsigned i = slot_of(tid), n = 0; n < SET_SIZE; i = (i + 1) & (SET_SIZE - 1), n++) {
        if (set[i] == tid) return 1;
        if (set[i] == 0) return 0;
    }
    return 0;
}
static int set_add(int tid) {
    int *free = 0;
    for (unsigned i = slot_of(tid), n = 0; n < SET_SIZE; i = (i + 1) & (SET_SIZE - 1), n++) {
        if (set[i] == tid) return 1;
        if (set[i] == -1 && !free) free = &set[i];
        if (set[i] == 0) {
            if (!free) free = &set[i];
            break;
        }
    }
    /* Keep a quarter free, so that a search always ends at an empty slot. */
    if (!free || set_count >= SET_SIZE - SET_SIZE / 4) return 0;
    *free = tid;
    set_count++;
    return 1;
}
static void set_remove(int tid) {
    for (unsigned i = slot_of(tid), n = 0; n < SET_SIZE; i = (i + 1) & (SET_SIZE - 1), n++) {
        if (set[i] == tid) { set[i] = -1; set_count--; return; }
        if (set[i] == 0) return;
    }
}

/* ---- the guard ---- */

static long options = PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK;
static u64 kept, passed, clones, forwarded;

/* Whether a SIGTRAP is a lost debug exception: TRAP_BRKPT whose address neither follows an
 * int1 nor is one (a program's own int1 traps right after itself; on some hypervisors its
 * #DB comes as a fault, at the int1 itself, as on the KVM guests of 2026-12-02), or
 * TRAP_HWBKPT (a breakpoint the kernel found no handler for: only a ptrace tracer sets
 * those, and the guard sets none). */
static int spurious(int tid) {
    long si[16]; /* siginfo_t: signo, errno, code (ints), then si_addr at byte 16 */
    if (ptrace(PTRACE_GETSIGINFO, tid, 0, (long)si) != 0) return 0;
    int code = ((int *)si)[2];
    if (code == TRAP_HWBKPT) return 1;
    if (code != TRAP_BRKPT) return 0;
    u64 addr = (u64)si[2];
    long word = 0;
    if (addr == 0 || ptrace(PTRACE_PEEKDATA, tid, (long)(addr - 1), (long)&word) != 0) return 1;
    /* word's first byte is at addr - 1, its second at addr. */
    return (unsigned char)word != INT1 && (unsigned char)(word >> 8) != INT1;
}

static void stopped(int tid, int status) {
    int sig = (status >> 8) & 0xff, event = status >> 16;
    long r;
    if (event == 0) {
        int deliver = sig;
        if (sig == SIGTRAP && spurious(tid)) {
            kept++;
            deliver = 0;
        } else {
            passed++;
        }
        r = ptrace(PTRACE_CONT, tid, 0, deliver);
    } else if (event == PTRACE_EVENT_STOP &&
               (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU)) {
        /* A group-stop: it stays stopped, and still reports SIGCONT or a kill. */
        r = ptrace(PTRACE_LISTEN, tid, 0, 0);
    } else {
        if (event == PTRACE_EVENT_CLONE && ++clones > CHURN_CLONES) {
            /* Past the stops the guard makes at thread creations: laser forwards them. */
            options = PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK;
            ptrace(PTRACE_SETOPTIONS, tid, 0, options);
        }
        r = ptrace(PTRACE_CONT, tid, 0, 0);
    }
    if (r != 0) set_remove(tid); /* killed while stopped: its exit comes next */
}

static void reap(void) {
    for (;;) {
        int status = 0;
        long tid = sys(SYS_wait4, -1, (long)&status, WNOHANG | WALL, 0, 0);
        if (tid <= 0) return;
        if ((status & 0xff) == 0x7f) { /* stopped */
            set_add((int)tid);
            stopped((int)tid, status);
        } else { /* exited or killed */
            set_remove((int)tid);
        }
    }
}

static void follow(int tid) {
    if (!set_has(tid) && ptrace(PTRACE_SEIZE, tid, 0, options) == 0) {
        set_add(tid);
        forwarded++;
    }
}

/* Reads /proc/PID/task/TID/NAME (name starts with '/') into b, NUL-terminated: the length
 * read, or a negative errno. */
static long read_task_file(long pid, long tid, const char *name, char *b, long size) {
    struct text path = {{0}, 0};
    put(&path, "/proc/");
    put_num(&path, (u64)pid);
    put(&path, "/task/");
    put_num(&path, (u64)tid);
    put(&path, name);
    long fd = sys(SYS_open, (long)path.b, O_RDONLY | O_CLOEXEC, 0, 0, 0);
    if (fd < 0) return fd;
    long n = sys(SYS_read, fd, (long)b, size - 1, 0, 0);
    sys(SYS_close, fd, 0, 0, 0, 0);
    b[n > 0 ? n : 0] = 0;
    return n;
}

/* A thread that has exited cannot be seized (the kernel refuses any task with an exit state,
 * EPERM): a zombie (an exited leader whose threads run on) or a thread being released, which
 * /proc shows as 'X' until it is gone (a live test's worker, exiting while the guard started,
 * failed a CI run). Nothing there traps. */
static int exited(long pid, long tid) {
    char b[512];
    long n = read_task_file(pid, tid, "/stat", b, sizeof b);
    if (n <= 0) return 1;
    for (long i = n - 1; i > 0; i--)
        if (b[i] == ')') return i + 2 < n && (b[i + 2] == 'Z' || b[i + 2] == 'X');
    return 1;
}

/* Whether tid is traced by this guard already. A thread seized with PTRACE_O_TRACECLONE that
 * creates one while the guard lists the threads hands the new one to the guard at once, but
 * the guard hears of it only at its first stop; seized again from the listing it is refused
 * (EPERM, as for any traced task). A CI run lost a live test to that refusal. */
static int traced_by_us(long pid, long tid) {
    char b[2048];
    long n = read_task_file(pid, tid, "/status", b, sizeof b);
    if (n <= 0) return 0;
    static const char key[] = "\nTracerPid:";
    for (long i = 0; i + (long)sizeof key - 1 < n; i++) {
        long k = 0;
        while (key[k] && b[i + k] == key[k]) k++;
        if (key[k]) continue;
        long v = 0, j = i + k;
        while (b[j] == ' ' || b[j] == '\t') j++;
        while (b[j] >= '0' && b[j] <= '9') v = v * 10 + (b[j++] - '0');
        return v == sys(SYS_getpid, 0, 0, 0, 0, 0);
    }
    return 0;
}

/* Seizes every thread of pid, again until a listing shows none new. 0 ok, 1 gone, 2 error
 * (with the errno in *err and the thread in *who). */
static int seize_all(long pid, long *err, long *who) {
    for (;;) {
        struct text path = {{0}, 0};
        put(&path, "/proc/");
        put_num(&path, (u64)pid);
        put(&path, "/task");
        long fd = sys(SYS_open, (long)path.b, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, 0, 0);
        if (fd < 0) return 1;
        long fresh = 0;
        char b[4096];
        long n;
        while ((n = sys(SYS_getdents64, fd, (long)b, sizeof b, 0, 0)) > 0) {
            for (long o = 0; o < n;) {
                unsigned short reclen = *(unsigned short *)(b + o + 16);
                int ok;
                long tid = parse_num(b + o + 19, &ok);
                o += reclen;
                if (!ok || set_has((int)tid)) continue;
                long r = ptrace(PTRACE_SEIZE, tid, 0, options);
                if (r == 0 || (r == -EPERM && traced_by_us(pid, tid))) {
                    set_add((int)tid);
                    fresh++;
                } else if (r != -ESRCH && !exited(pid, tid)) {
                    sys(SYS_close, fd, 0, 0, 0, 0);
                    *err = -r;
                    *who = tid;
                    return 2;
                }
            }
        }
        sys(SYS_close, fd, 0, 0, 0, 0);
        if (!fresh) return set_count ? 0 : 1;
    }
}

struct kernel_sigaction {
    void *handler;
    u64 flags;
    void *restorer;
    u64 mask;
};

int cmain(long *sp) {
    char **argv = (char **)(sp + 1);
    int ok = sp[0] == 2;
    long pid = ok ? parse_num(argv[1], &ok) : 0;
    if (!ok || pid <= 0) return 2;
    /* The guard outlives whatever ends the run: a Ctrl-C or Ctrl-Z reaches it too, and laser
     * closes its stdin when it is done. */
    static const int ignored[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE};
    for (unsigned i = 0; i < sizeof ignored / sizeof *ignored; i++) {
        struct kernel_sigaction sa = {(void *)1 /* SIG_IGN */, 0, 0, 0};
        sys(SYS_rt_sigaction, ignored[i], (long)&sa, 0, 8, 0);
    }
    /* Without the privilege (CAP_SYS_NICE) it runs at the default priority, and still works. */
    sys(SYS_setpriority, 0 /* PRIO_PROCESS */, 0 /* this process */, GUARD_NICE, 0, 0);
    /* Tracee stops arrive as SIGCHLD: blocked, and read from a signalfd beside stdin. */
    u64 mask = 1ul << (SIGCHLD - 1);
    sys(SYS_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&mask, 0, 8, 0);
    long sfd = sys(SYS_signalfd4, -1, (long)&mask, 8, SFD_NONBLOCK | SFD_CLOEXEC, 0);
    if (sfd < 0) {
        put(&out, "error signalfd: errno ");
        put_num(&out, (u64)-sfd);
        flush_line();
        return 1;
    }
    long err = 0, who = 0;
    switch (seize_all(pid, &err, &who)) {
    case 1:
        put(&out, "gone process ");
        put_num(&out, (u64)pid);
        flush_line();
        return 1;
    case 2:
        put(&out, "error PTRACE_SEIZE of thread ");
        put_num(&out, (u64)who);
        put(&out, err == 1 ? ": Operation not permitted (os error 1)" : ": errno ");
        if (err != 1) put_num(&out, (u64)err);
        flush_line();
        return 1;
    }
    put(&out, "ready ");
    put_num(&out, (u64)set_count);
    flush_line();
    reap();
    char line[64];
    int line_len = 0;
    while (set_count > 0) {
        struct { int fd; short events, revents; } fds[2] = {{0, POLLIN, 0}, {(int)sfd, POLLIN, 0}};
        if (sys(SYS_poll, (long)fds, 2, -1, 0, 0) < 0) continue;
        if (fds[1].revents) {
            char drain[128 * 8];
            while (sys(SYS_read, sfd, (long)drain, sizeof drain, 0, 0) > 0) {}
            reap();
        }
        if (fds[0].revents) {
            char b[512];
            long n = sys(SYS_read, 0, (long)b, sizeof b, 0, 0);
            if (n <= 0) break;
            for (long i = 0; i < n; i++) {
                if (b[i] != '\n') {
                    if (line_len < (int)sizeof line - 1) line[line_len++] = b[i];
                    continue;
                }
                line[line_len] = 0;
                line_len = 0;
                long tid = parse_num(line, &ok);
                if (ok && tid > 0) follow((int)tid);
            }
        }
    }
    /* Whatever stopped meanwhile is resumed (and filtered) before the exit detaches the rest. */
    reap();
    put(&out, "done ");
    put_num(&out, kept);
    put(&out, " ");
    put_num(&out, passed);
    put(&out, " ");
    put_num(&out, clones);
    put(&out, " ");
    put_num(&out, forwarded);
    flush_line();
    return 0;
}

__attribute__((naked, noreturn)) void _start(void) {
    __asm__ volatile("xor %ebp, %ebp\n\t"
                     "mov %rsp, %rdi\n\t"
                     "and $-16, %rsp\n\t"
                     "call cmain\n\t"
                     "mov %eax, %edi\n\t"
                     "mov $231, %eax\n\t"
                     "syscall\n\t"
                     "hlt");
}
