/* The test table the litmus runner iterates over; generated into build/litmus/tests.c by
 * asm-tests/litmus/gen.py. */
#ifndef LITMUS_H
#define LITMUS_H
#include <stdint.h>

#define LITMUS_MAX_THREADS 4
#define LITMUS_MAX_OBS 8

typedef void (*litmus_body)(uint64_t *x, uint64_t *y, uint64_t *out);

/* What an outcome is made of: a register a thread loaded, or a location's final value. */
struct litmus_obs {
    const char *name; /* "P1:r0" or "x" */
    int is_loc;
    int index;        /* thread (register) or location (0 = x, 1 = y) */
    int reg;          /* register number within the thread */
};

struct litmus_test {
    const char *name;
    const char *aliases;
    const char *condition;  /* herd-style "exists" clause */
    int condition_forbidden;
    int selftest; /* body deliberately wrong: the runner must see forbidden outcomes */
    int nthreads;
    litmus_body bodies[LITMUS_MAX_THREADS];
    int nobs;
    struct litmus_obs obs[LITMUS_MAX_OBS];
    /* Outcome sets, each a flat array of n rows of nobs values. */
    int ntso; /* allowed by x86-TSO */
    const unsigned char *tso;
    int nsc; /* allowed by sequential consistency */
    const unsigned char *sc;
    int ncond; /* satisfying the condition */
    const unsigned char *cond;
};

extern const struct litmus_test litmus_tests[];
extern const int litmus_ntests;
#endif
