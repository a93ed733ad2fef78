/* laser's allocation recorder, preloaded into programs `laser run` launches (LD_PRELOAD).
 *
 * Why a preloaded shim and not uprobes: a uprobe on malloc costs two kernel traps per call
 * (entry and return, ~µs each here) on every allocation of the program, while the shim costs
 * a few nanoseconds in the program's own address space; benchmarks/RESULTS.md has both
 * measured. The shim never changes what the program gets: every call goes to the next
 * malloc (glibc's) with the same arguments, and its result is returned unchanged.
 *
 * What it records: for each live block, in a fixed table laser reads through /proc/PID/mem
 * once a heap line is found contended, the pointer, the requested size, the caller's return
 * address, stack pointer and frame pointer, and the first STACK_WORDS words of the caller's
 * stack. laser unwinds that copy with the modules' .eh_frame to the allocation's call stack.
 * free() and realloc() drop the entry, so the table holds live blocks; a block that finds its
 * set full is not recorded: the first blocks allocated stay, which are the long-lived ones a
 * contended line usually holds.
 *
 * History mode (LASER_ALLOC_ACK): allocations whose stack holds one of the given call-site
 * addresses (LASER_ALLOC_SITES), or of the given requested size (LASER_ALLOC_SIZE, alone for a
 * type), are announced on the pipe and the allocating thread waits until laser has armed its
 * watchpoints on the new object; its free is announced the same way.
 *
 * Environment (set by laser): LASER_ALLOC_PARENT (the pid of laser: only the process laser
 * launched records, not programs it runs in turn; unset: record in any process), LASER_ALLOC_MODE (`record`, or `off` to
 * measure the bare interposition), LASER_ALLOC_FD (pipe to announce the table's address),
 * LASER_ALLOC_ACK (pipe for laser's answers), LASER_ALLOC_SITES (hex vaddrs in the
 * executable, comma-separated), LASER_ALLOC_SIZE (requested size filter, decimal).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SETS 4096
#define WAYS 4
#define STACK_WORDS 24
#define MAX_SITES 16
#define MAGIC 0x31636f6c6c61736cULL /* "lsalloc1" */

/* One recorded allocation. Layout read by laser (laser-detect/src/naming/alloc_record.rs). */
struct entry {
    uint64_t ptr, size, ret, sp, bp;
    uint64_t stack[STACK_WORDS];
};

#define MAX_ARMED 8

/* The table. `tags[i]` is the live pointer of entry i (0 free, 1 being written).
 * laser writes `armed_*` through /proc/PID/mem: blocks overlapping an armed range are
 * recorded whenever they are allocated; other blocks only among each thread's first
 * `early` allocations. */
struct table {
    uint64_t magic, sets, ways, stack_words, reserved1, reserved2;
    uint64_t early, armed_n;
    uint64_t armed_lo[MAX_ARMED], armed_hi[MAX_ARMED];
    uint64_t tags[SETS * WAYS];
    struct entry entries[SETS * WAYS];
};

__attribute__((visibility("default"))) struct table laser_alloc_table;

/* A message on the announce pipe: kind 0 hello (ptr = &table), 1 alloc, 2 free; the
 * thread and the CPU it runs on. */
struct message {
    uint64_t kind, pid, tid, cpu;
    struct entry e;
};

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);

static int recording;
/* One bit per hash of every pointer ever recorded (never cleared): free() probes the table
 * only when its pointer's bit is set. The table's tags (128 KiB) would cost most frees a
 * cache miss; these 8 KiB stay in cache, and most blocks freed were never recorded. */
#define SEEN_BITS (1 << 16)
static uint64_t seen[SEEN_BITS / 64];
/* Allocations this thread has made (initial-exec: a preloaded library has static TLS). */
static __thread uint64_t thread_allocs __attribute__((tls_model("initial-exec")));
static int announce_fd = -1, ack_fd = -1;
static uint64_t sites[MAX_SITES];
static int nsites;
static uint64_t size_filter;
static uint64_t watched; /* the object laser is watching, 0 if none */
static int announce_lock;

/* dlsym may allocate before the next malloc is known: serve it from a static buffer. */
static char boot[4096];
static size_t boot_used;

static void *boot_alloc(size_t n) {
    size_t at = (boot_used + 15) & ~(size_t)15;
    if (at + n > sizeof boot) return NULL;
    boot_used = at + n;
    return boot + at;
}

static int in_boot(void *p) { return (char *)p >= boot && (char *)p < boot + sizeof boot; }

static void resolve(void) {
    next_malloc = dlsym(RTLD_NEXT, "malloc");
    next_calloc = dlsym(RTLD_NEXT, "calloc");
    next_realloc = dlsym(RTLD_NEXT, "realloc");
    next_free = dlsym(RTLD_NEXT, "free");
    next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    next_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    next_memalign = dlsym(RTLD_NEXT, "memalign");
}

static uint64_t bias;
static int first_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    bias = info->dlpi_addr; /* the first object is the executable */
    return 1;
}

static uint64_t parse_hex(const char **s) {
    uint64_t v = 0;
    for (;; (*s)++) {
        char c = **s;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return v;
        v = v * 16 + (uint64_t)d;
    }
}

static void write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

__attribute__((constructor)) static void init(void) {
    if (!next_malloc) resolve();
    const char *parent = getenv("LASER_ALLOC_PARENT");
    if (parent && strtol(parent, NULL, 10) != (long)getppid()) return;
    const char *mode = getenv("LASER_ALLOC_MODE");
    if (mode && strcmp(mode, "off") == 0) return;
    laser_alloc_table.magic = MAGIC;
    laser_alloc_table.sets = SETS;
    laser_alloc_table.ways = WAYS;
    laser_alloc_table.stack_words = STACK_WORDS;
    const char *early = getenv("LASER_ALLOC_EARLY");
    laser_alloc_table.early = early ? strtoull(early, NULL, 10) : 16384;
    const char *fd = getenv("LASER_ALLOC_FD");
    if (fd) {
        announce_fd = (int)strtol(fd, NULL, 10);
        struct message m = {0};
        m.pid = (uint64_t)getpid();
        m.e.ptr = (uint64_t)(uintptr_t)&laser_alloc_table;
        write_all(announce_fd, &m, sizeof m);
    }
    const char *ack = getenv("LASER_ALLOC_ACK");
    const char *s = getenv("LASER_ALLOC_SITES");
    if (!s && getenv("LASER_ALLOC_SIZE")) s = "";
    if (ack && s) {
        ack_fd = (int)strtol(ack, NULL, 10);
        dl_iterate_phdr(first_object, NULL);
        while (*s && nsites < MAX_SITES) {
            sites[nsites++] = bias + parse_hex(&s);
            if (*s != ',') break;
            s++;
        }
        const char *sz = getenv("LASER_ALLOC_SIZE");
        if (sz) size_filter = strtoull(sz, NULL, 10);
    }
    recording = 1;
}

/* The caller's context: its return address, stack pointer after the call returns, frame
 * pointer and stack words. Needs this file built with frame pointers, and must expand inside
 * the exported function itself (a macro, not a call). */
#define CALLER(e)                                                                   \
    do {                                                                            \
        void **fp_ = __builtin_frame_address(0);                                    \
        (e).ret = (uint64_t)(uintptr_t)fp_[1];                                      \
        (e).bp = (uint64_t)(uintptr_t)fp_[0];                                       \
        (e).sp = (uint64_t)(uintptr_t)(fp_ + 2);                                    \
        memcpy((e).stack, fp_ + 2, sizeof(e).stack);                                \
    } while (0)

static inline uint64_t set_of(uint64_t ptr) {
    return ((ptr >> 4) * 0x9E3779B97F4A7C15ULL) >> (64 - 12);
}

static inline uint64_t seen_bit(uint64_t ptr) {
    return ((ptr >> 4) * 0xD6E8FEB86659FD93ULL) >> (64 - 16);
}

static int matches_site(const struct entry *e) {
    if (size_filter && e->size != size_filter) return 0;
    if (nsites == 0) return size_filter != 0; /* a type: its size alone */
    for (int i = 0; i < nsites; i++) {
        if (e->ret == sites[i]) return 1;
        for (int w = 0; w < STACK_WORDS; w++)
            if (e->stack[w] == sites[i]) return 1;
    }
    return 0;
}

/* Sends a message and waits (≤ 2 s) for laser's one-byte answer: 'w' watching this object,
 * 'n' not this one, 'q' stop announcing. One announcement at a time. */
static void announce(uint64_t kind, const struct entry *e) {
    while (__atomic_exchange_n(&announce_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
    if (ack_fd >= 0) {
        struct message m = {kind, (uint64_t)getpid(), (uint64_t)gettid(),
                            (uint64_t)sched_getcpu(), *e};
        write_all(announce_fd, &m, sizeof m);
        struct pollfd p = {ack_fd, POLLIN, 0};
        char c = 'q';
        if (poll(&p, 1, 2000) != 1 || read(ack_fd, &c, 1) != 1) c = 'q';
        if (kind == 1 && c == 'w') watched = e->ptr;
        if (kind == 2) watched = 0;
        if (c == 'q') ack_fd = -1;
    }
    __atomic_store_n(&announce_lock, 0, __ATOMIC_RELEASE);
}

/* Whether to record a block: among this thread's first `early` allocations, on an armed
 * line, or wanted for the access history. The common case (past `early`, nothing armed) is
 * a TLS increment and two loads. */
static inline int wanted(uint64_t ptr, uint64_t size) {
    if (thread_allocs++ < laser_alloc_table.early) return 1;
    uint64_t n = __atomic_load_n(&laser_alloc_table.armed_n, __ATOMIC_RELAXED);
    for (uint64_t i = 0; i < n && i < MAX_ARMED; i++)
        if (ptr < laser_alloc_table.armed_hi[i] && ptr + size > laser_alloc_table.armed_lo[i])
            return 1;
    return ack_fd >= 0;
}

static inline void record(struct entry *e) {
    if (!recording || e->ptr == 0) return;
    uint64_t s = set_of(e->ptr) * WAYS;
    for (int w = 0; w < WAYS; w++) {
        uint64_t t = __atomic_load_n(&laser_alloc_table.tags[s + w], __ATOMIC_RELAXED);
        if (t == 0 && __atomic_compare_exchange_n(&laser_alloc_table.tags[s + w], &t, 1, 0,
                                                  __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            laser_alloc_table.entries[s + w] = *e;
            /* Release: laser reads the tag, then the entry, and checks entry.ptr == tag. */
            __atomic_store_n(&laser_alloc_table.tags[s + w], e->ptr, __ATOMIC_RELEASE);
            uint64_t b = seen_bit(e->ptr);
            if (!(__atomic_load_n(&seen[b / 64], __ATOMIC_RELAXED) & (1ULL << (b % 64))))
                __atomic_fetch_or(&seen[b / 64], 1ULL << (b % 64), __ATOMIC_RELAXED);
            goto recorded;
        }
    }
    /* Set full: not recorded. (Not counted: a shared counter on the header's line would
     * make every thread's malloc, which reads `armed_n` there, miss the cache.) */
recorded:
    if (__builtin_expect(ack_fd >= 0, 0) && matches_site(e)) announce(1, e);
}

static inline void forget(void *p) {
    uint64_t ptr = (uint64_t)(uintptr_t)p;
    if (!recording || ptr == 0) return;
    if (__builtin_expect(watched == ptr, 0) && ptr) {
        struct entry e = {0};
        e.ptr = ptr;
        announce(2, &e);
    }
    uint64_t b = seen_bit(ptr);
    if (!(__atomic_load_n(&seen[b / 64], __ATOMIC_RELAXED) & (1ULL << (b % 64)))) return;
    uint64_t s = set_of(ptr) * WAYS;
    for (int w = 0; w < WAYS; w++) {
        if (__atomic_load_n(&laser_alloc_table.tags[s + w], __ATOMIC_RELAXED) == ptr) {
            __atomic_store_n(&laser_alloc_table.tags[s + w], 0, __ATOMIC_RELAXED);
            return;
        }
    }
}

__attribute__((visibility("default"))) void *malloc(size_t n) {
    if (__builtin_expect(!next_malloc, 0)) {
        if (boot_used) return boot_alloc(n);
        boot_used = 1;
        resolve();
        if (!next_malloc) return boot_alloc(n);
    }
    void *p = next_malloc(n);
    if (recording && p && wanted((uint64_t)(uintptr_t)p, n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)p;
        e.size = n;
        CALLER(e);
        record(&e);
    }
    return p;
}

__attribute__((visibility("default"))) void *calloc(size_t k, size_t n) {
    if (__builtin_expect(!next_calloc, 0)) {
        void *p = boot_alloc(k * n);
        if (p) memset(p, 0, k * n);
        return p;
    }
    void *p = next_calloc(k, n);
    if (recording && p && wanted((uint64_t)(uintptr_t)p, k * n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)p;
        e.size = k * n;
        CALLER(e);
        record(&e);
    }
    return p;
}

__attribute__((visibility("default"))) void free(void *p) {
    if (!p || in_boot(p)) return;
    forget(p);
    next_free(p);
}

__attribute__((visibility("default"))) void *realloc(void *old, size_t n) {
    if (in_boot(old)) {
        void *p = malloc(n);
        if (p) memcpy(p, old, n < sizeof boot ? n : sizeof boot);
        return p;
    }
    if (old) forget(old);
    void *p = next_realloc(old, n);
    if (recording && p && wanted((uint64_t)(uintptr_t)p, n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)p;
        e.size = n;
        CALLER(e);
        record(&e);
    }
    return p;
}

__attribute__((visibility("default"))) int posix_memalign(void **out, size_t a, size_t n) {
    int r = next_posix_memalign(out, a, n);
    if (recording && r == 0 && wanted((uint64_t)(uintptr_t)*out, n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)*out;
        e.size = n;
        CALLER(e);
        record(&e);
    }
    return r;
}

__attribute__((visibility("default"))) void *aligned_alloc(size_t a, size_t n) {
    void *p = next_aligned_alloc(a, n);
    if (recording && p && wanted((uint64_t)(uintptr_t)p, n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)p;
        e.size = n;
        CALLER(e);
        record(&e);
    }
    return p;
}

__attribute__((visibility("default"))) void *memalign(size_t a, size_t n) {
    void *p = next_memalign(a, n);
    if (recording && p && wanted((uint64_t)(uintptr_t)p, n)) {
        struct entry e;
        e.ptr = (uint64_t)(uintptr_t)p;
        e.size = n;
        CALLER(e);
        record(&e);
    }
    return p;
}
