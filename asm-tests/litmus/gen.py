#!/usr/bin/env python3
"""Generate the x86-TSO litmus tests: assembly thread bodies, the runner's test table and the
manifest with the allowed / forbidden outcomes.

    python3 asm-tests/litmus/gen.py           write asm-tests/build/litmus/{litmus.S,tests.c,
                                              Makefile} and asm-tests/litmus/manifest.json
    python3 asm-tests/litmus/gen.py --check   fail if the committed manifest is stale

Each test is written once, below, as per-thread lists of operations. From that one text come the
assembly (one global function per thread, `litmus_<test>_P<n>(x, y, out)`, so the repair engine
can rewrite exactly that function), and the outcome sets, computed by exhaustively running the
operational x86-TSO model (per-thread FIFO store buffers, loads read their own buffer first,
MFENCE and locked instructions wait for an empty buffer) and the SC model (no buffers). The
generator refuses to write anything if the model disagrees with the expected verdict taken
from /work/shared/LITMUS.md (herd7, x86tso.cat), which checks both the bodies and the model
(WRC, not in that list, is forbidden by the Intel SDM 8.2.3.6 "stores are transitively visible").

Operations: ("W", loc, value)  store          ("R", loc)  load into the thread's next register
            ("F",)             mfence         ("X", loc, value)  xchg (a locked store)
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", "build", "litmus")
MANIFEST = os.path.join(HERE, "manifest.json")
LOCS = ["x", "y"]
LOAD_REGS = ["%rax", "%rcx", "%r8", "%r9"]
ARG_REGS = {"x": "%rdi", "y": "%rsi"}

# name, aliases, threads, condition (dict of observable -> value), verdict of the condition
TESTS = [
    ("MP", "iwp2.1/amd1", [[("W", "x", 1), ("W", "y", 1)], [("R", "y"), ("R", "x")]],
     {"P1:r0": 1, "P1:r1": 0}, "forbidden"),
    ("SB", "iwp2.3.a/amd4", [[("W", "x", 1), ("R", "y")], [("W", "y", 1), ("R", "x")]],
     {"P0:r0": 0, "P1:r0": 0}, "allowed"),
    ("LB", "iwp2.2/amd2", [[("R", "x"), ("W", "y", 1)], [("R", "y"), ("W", "x", 1)]],
     {"P0:r0": 1, "P1:r0": 1}, "forbidden"),
    ("S", "", [[("W", "x", 2), ("W", "y", 1)], [("R", "y"), ("W", "x", 1)]],
     {"P1:r0": 1, "x": 2}, "forbidden"),
    ("R", "", [[("W", "x", 1), ("W", "y", 1)], [("W", "y", 2), ("R", "x")]],
     {"y": 2, "P1:r0": 0}, "allowed"),
    ("2+2W", "", [[("W", "x", 1), ("W", "y", 2)], [("W", "y", 1), ("W", "x", 2)]],
     {"x": 1, "y": 1}, "forbidden"),
    ("IRIW", "iwp2.7/amd7", [[("W", "x", 1)], [("W", "y", 1)], [("R", "x"), ("R", "y")],
                             [("R", "y"), ("R", "x")]],
     {"P2:r0": 1, "P2:r1": 0, "P3:r0": 1, "P3:r1": 0}, "forbidden"),
    ("n4", "", [[("R", "x"), ("W", "x", 1), ("R", "x")], [("R", "x"), ("W", "x", 2), ("R", "x")]],
     {"P0:r0": 2, "P0:r1": 1, "P1:r0": 1, "P1:r1": 2}, "forbidden"),
    ("n5", "", [[("W", "x", 1), ("R", "x")], [("W", "x", 2), ("R", "x")]],
     {"P0:r0": 2, "P1:r0": 1}, "forbidden"),
    ("amd5", "SB+mfences", [[("W", "x", 1), ("F",), ("R", "y")],
                            [("W", "y", 1), ("F",), ("R", "x")]],
     {"P0:r0": 0, "P1:r0": 0}, "forbidden"),
    ("iwp2.8a", "SB with xchg stores", [[("X", "x", 1), ("R", "y")], [("X", "y", 1), ("R", "x")]],
     {"P0:r0": 0, "P1:r0": 0}, "forbidden"),
    ("iwp2.8b", "MP with an xchg store", [[("X", "x", 1), ("W", "y", 1)],
                                          [("R", "y"), ("R", "x")]],
     {"P1:r0": 1, "P1:r1": 0}, "forbidden"),
    ("CO-IRIW", "", [[("W", "x", 1)], [("W", "x", 2)], [("R", "x"), ("R", "x")],
                     [("R", "x"), ("R", "x")]],
     {"P2:r0": 1, "P2:r1": 2, "P3:r0": 2, "P3:r1": 1}, "forbidden"),
    ("SBM-xy", "store-buffer merge: W x=1; W y=1; W x=2 | R x; R y",
     [[("W", "x", 1), ("W", "y", 1), ("W", "x", 2)], [("R", "x"), ("R", "y")]],
     {"P1:r0": 2, "P1:r1": 0}, "forbidden"),
    ("SBM-yx", "store-buffer merge: W x=1; W y=1; W x=2 | R y; R x",
     [[("W", "x", 1), ("W", "y", 1), ("W", "x", 2)], [("R", "y"), ("R", "x")]],
     {"P1:r0": 1, "P1:r1": 0}, "forbidden"),
    ("WRC", "iwp2.5", [[("W", "x", 1)], [("R", "x"), ("W", "y", 1)], [("R", "y"), ("R", "x")]],
     {"P1:r0": 1, "P2:r0": 1, "P2:r1": 0}, "forbidden"),
    ("n7", "", [[("W", "x", 1), ("R", "x"), ("R", "y")], [("W", "y", 1)],
                [("R", "y"), ("R", "x")]],
     {"P0:r0": 1, "P0:r1": 0, "P2:r0": 1, "P2:r1": 0}, "allowed"),
    ("n6", "", [[("W", "x", 1), ("R", "x"), ("R", "y")], [("W", "y", 2), ("W", "x", 2)]],
     {"P0:r0": 1, "P0:r1": 0, "x": 1}, "allowed"),
    ("iwp2.4", "amd9", [[("W", "x", 1), ("R", "x"), ("R", "y")],
                        [("W", "y", 1), ("R", "y"), ("R", "x")]],
     {"P0:r0": 1, "P0:r1": 0, "P1:r0": 1, "P1:r1": 0}, "allowed"),
]

# Self-tests of the runner (run with `litmus -s`): the body deliberately differs from the model
# the outcome table was computed from, so the runner must report forbidden outcomes. Here P1
# loads x before y (into the same registers), the way a broken rewrite would reorder them.
SELF_TESTS = [
    ("MP-broken", "self-test: MP's outcome table, P1's loads swapped in the body",
     [[("W", "x", 1), ("W", "y", 1)], [("R", "y"), ("R", "x")]],
     {"P1:r0": 1, "P1:r1": 0}, "forbidden",
     [[("W", "x", 1), ("W", "y", 1)], [("R", "x", 1), ("R", "y", 0)]]),
]


def ident(name):
    return "".join(c if c.isalnum() else "_" for c in name)


def observables(threads):
    """Every load's register, then the final value of every location stored more than once."""
    obs = []
    for t, ops in enumerate(threads):
        n = 0
        for op in ops:
            if op[0] == "R":
                obs.append((f"P{t}:r{n}", ("reg", t, n)))
                n += 1
    for loc in LOCS:
        stores = sum(1 for ops in threads for op in ops if op[0] in "WX" and op[1] == loc)
        if stores > 1:
            obs.append((loc, ("loc", LOCS.index(loc))))
    return obs


def explore(threads, tso):
    """All final outcomes of the operational model: dict name -> value per outcome."""
    nt = len(threads)
    obs = observables(threads)
    outcomes = set()
    seen = set()
    start = (tuple([0] * nt), tuple(() for _ in range(nt)), (0, 0), tuple(() for _ in range(nt)))
    stack = [start]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        pcs, bufs, mem, regs = state
        moved = False
        for t in range(nt):
            # drain the oldest buffered store of thread t
            if bufs[t]:
                (loc, val), rest = bufs[t][0], bufs[t][1:]
                m = list(mem)
                m[loc] = val
                stack.append((pcs, bufs[:t] + (rest,) + bufs[t + 1:], tuple(m), regs))
                moved = True
            if pcs[t] >= len(threads[t]):
                continue
            op = threads[t][pcs[t]]
            npcs = pcs[:t] + (pcs[t] + 1,) + pcs[t + 1:]
            if op[0] == "W":
                loc = LOCS.index(op[1])
                if tso:
                    nb = bufs[:t] + (bufs[t] + ((loc, op[2]),),) + bufs[t + 1:]
                    stack.append((npcs, nb, mem, regs))
                else:
                    m = list(mem)
                    m[loc] = op[2]
                    stack.append((npcs, bufs, tuple(m), regs))
                moved = True
            elif op[0] == "R":
                loc = LOCS.index(op[1])
                val = mem[loc]
                for bl, bv in bufs[t]:  # youngest matching buffered store wins
                    if bl == loc:
                        val = bv
                nr = regs[:t] + (regs[t] + (val,),) + regs[t + 1:]
                stack.append((npcs, bufs, mem, nr))
                moved = True
            elif op[0] in ("F", "X"):
                if bufs[t]:
                    continue  # waits for its buffer to drain
                m = list(mem)
                if op[0] == "X":
                    m[LOCS.index(op[1])] = op[2]
                stack.append((npcs, bufs, tuple(m), regs))
                moved = True
        if not moved:
            values = []
            for _, what in obs:
                if what[0] == "reg":
                    values.append(regs[what[1]][what[2]])
                else:
                    values.append(mem[what[1]])
            outcomes.add(tuple(values))
    return sorted(outcomes)


def matches(outcome, obs, cond):
    names = [n for n, _ in obs]
    return all(outcome[names.index(k)] == v for k, v in cond.items())


def body_asm(fn, ops):
    lines = [f"    .globl {fn}", f"    .type {fn}, @function", f"{fn}:"]
    n = 0
    for op in ops:
        if op[0] == "W":
            lines.append(f"    movq ${op[2]}, ({ARG_REGS[op[1]]})")
        elif op[0] == "R":
            reg = op[2] if len(op) > 2 else n  # an explicit slot only in self-tests
            lines.append(f"    movq ({ARG_REGS[op[1]]}), {LOAD_REGS[reg]}")
            n += 1
        elif op[0] == "F":
            lines.append("    mfence")
        elif op[0] == "X":
            lines.append(f"    movq ${op[2]}, %r10")
            lines.append(f"    xchgq %r10, ({ARG_REGS[op[1]]})")
    for i in range(n):
        lines.append(f"    movq {LOAD_REGS[i]}, {8 * i}(%rdx)")
    lines += ["    ret", f"    .size {fn}, .-{fn}", ""]
    return lines


def op_text(op):
    if op[0] == "W":
        return f"W {op[1]}={op[2]}"
    if op[0] == "R":
        return f"R {op[1]}"
    if op[0] == "X":
        return f"XCHG {op[1]}={op[2]}"
    return "MFENCE"


def c_outcomes(var, outs, width):
    rows = ", ".join("{" + ", ".join(str(v) for v in o) + "}" for o in outs) or "{0}"
    return f"static const unsigned char {var}[][{width}] = {{{rows}}};"


def generate():
    asm = ["/* x86-TSO litmus thread bodies: generated by asm-tests/litmus/gen.py, do not edit.",
           " * litmus_<test>_P<n>(uint64_t *x, uint64_t *y, uint64_t *out): the test's",
           " * instructions on x and y, then each loaded register to out[0], out[1], ... */",
           "    .text", ""]
    c = ["/* generated by asm-tests/litmus/gen.py, do not edit */", '#include "litmus.h"', ""]
    table = []
    entries = []
    all_tests = [t + (None,) for t in TESTS] + SELF_TESTS
    for name, aliases, threads, cond, verdict, body in all_tests:
        selftest = body is not None
        obs = observables(threads)
        tso = explore(threads, tso=True)
        sc = explore(threads, tso=False)
        hit = [o for o in tso if matches(o, obs, cond)]
        if (verdict == "allowed") != bool(hit):
            raise SystemExit(f"{name}: x86-TSO model says the condition is "
                             f"{'allowed' if hit else 'forbidden'}, LITMUS.md says {verdict}")
        if any(matches(o, obs, cond) for o in sc):
            raise SystemExit(f"{name}: condition reachable under SC, not a relaxed outcome")
        cond_outs = []
        # every assignment of the unconstrained observables that satisfies the condition
        domain = sorted({0} | {op[2] for ops in threads for op in ops if op[0] in "WX"})
        free = [n for n, _ in obs if n not in cond]

        def assign(i, acc):
            if i == len(free):
                cond_outs.append(tuple(cond.get(n, acc.get(n)) for n, _ in obs))
                return
            for v in domain:
                assign(i + 1, {**acc, free[i]: v})

        assign(0, {})
        cid = ident(name)
        fns = [f"litmus_{cid}_P{t}" for t in range(len(threads))]
        for fn, ops in zip(fns, body or threads):
            asm += body_asm(fn, ops)
        width = max(1, len(obs))
        c.append(c_outcomes(f"tso_{cid}", tso, width))
        c.append(c_outcomes(f"sc_{cid}", sc, width))
        c.append(c_outcomes(f"cond_{cid}", cond_outs, width))
        for fn in fns:
            c.append(f"void {fn}(uint64_t *x, uint64_t *y, uint64_t *out);")
        obs_c = ", ".join(f'{{"{n}", {0 if w[0] == "reg" else 1}, {w[1]}, '
                          f'{w[2] if w[0] == "reg" else 0}}}' for n, w in obs)
        cond_text = " /\\ ".join(f"{k}={v}" for k, v in cond.items())
        cond_c = cond_text.replace("\\", "\\\\")
        bodies = ", ".join(fns)
        table.append(
            f'    {{"{name}", "{aliases}", "{cond_c}", {int(verdict == "forbidden")}, {int(selftest)}, '
            f'{len(threads)}, {{{bodies}}}, {len(obs)}, {{{obs_c}}}, '
            f'{len(tso)}, &tso_{cid}[0][0], {len(sc)}, &sc_{cid}[0][0], {len(cond_outs)}, '
            f'&cond_{cid}[0][0]}},')

        def show(o):
            return {n: v for (n, _), v in zip(obs, o)}

        if selftest:
            continue
        entries.append({
            "name": name,
            "aliases": aliases,
            "threads": len(threads),
            "needs_cpus": len(threads),
            "body": [" ; ".join(op_text(op) for op in ops) for ops in threads],
            "functions": fns,
            "signature": "void f(uint64_t *x, uint64_t *y, uint64_t *out)",
            "observed": [n for n, _ in obs],
            "condition": cond_text,
            "condition_verdict": verdict,
            "forbidden": [show(o) for o in cond_outs] if verdict == "forbidden" else [],
            "forbidden_rule": "any outcome not in tso_allowed",
            "relaxed_allowed": [show(o) for o in tso if o not in sc],
            "tso_allowed": [show(o) for o in tso],
            "sc": [show(o) for o in sc],
        })
    c.append("")
    c.append("const struct litmus_test litmus_tests[] = {")
    c += table
    c.append("};")
    c.append(f"const int litmus_ntests = {len(table)};")
    asm.append('    .section .note.GNU-stack, "", @progbits')
    doc = {
        "schema": "litmus-manifest/1",
        "generator": "asm-tests/litmus/gen.py",
        "model": "operational x86-TSO (FIFO store buffers; MFENCE/XCHG drain) explored "
                 "exhaustively; verdicts cross-checked with herd7 x86tso.cat (LITMUS.md)",
        "runner": "asm-tests/build/litmus/litmus [-n ITERS] [TEST ...]",
        "locations": "x and y start at 0, each in its own 64-byte line",
        "tests": entries,
    }
    return "\n".join(asm) + "\n", "\n".join(c) + "\n", json.dumps(doc, indent=1) + "\n"


MAKEFILE = """# generated by asm-tests/litmus/gen.py
CC ?= gcc
litmus: litmus.S tests.c ../../litmus/runner.c ../../litmus/litmus.h
\t$(CC) -g -O2 -Wall -pthread -I../../litmus litmus.S tests.c ../../litmus/runner.c -o $@
"""


def write_if_changed(path, text):
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description="generate the x86-TSO litmus tests")
    ap.add_argument("--check", action="store_true", help="only check the committed manifest")
    args = ap.parse_args()
    asm, c, doc = generate()
    if args.check:
        old = open(MANIFEST).read() if os.path.exists(MANIFEST) else ""
        if old != doc:
            print("asm-tests/litmus/manifest.json is stale: run python3 asm-tests/litmus/gen.py",
                  file=sys.stderr)
            return 1
        print(f"litmus manifest up to date ({len(TESTS)} tests)")
        return 0
    os.makedirs(BUILD, exist_ok=True)
    write_if_changed(os.path.join(BUILD, "litmus.S"), asm)
    write_if_changed(os.path.join(BUILD, "tests.c"), c)
    write_if_changed(os.path.join(BUILD, "Makefile"), MAKEFILE)
    write_if_changed(MANIFEST, doc)
    print(f"generated {len(TESTS)} litmus tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
