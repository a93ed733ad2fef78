#!/usr/bin/env python3
"""Generate the asm-tests: one assembly program per case plus its ground truth.

    python3 asm-tests/gen.py            write asm-tests/build/*.S, build/Makefile, manifest.json
    python3 asm-tests/gen.py --check    fail if asm-tests/manifest.json differs from what the
                                        generator produces now (it is committed; build/ is not)

Every case is data (a list of threads, each a list of memory operations plus a loop-body
shape); the assembly, the labels of the contending instructions with their .S line, the bytes
each thread touches, the expected kind and the expected final memory are all derived from that
data by the same code, so the manifest cannot drift from the programs.

Register convention inside a body (all callee-saved, so calls out of the loop keep them):

    rbx  global iteration index i        r12  shared area base
    rbp  addend A_t of RMW operations    r13  iterations left in this call
    r14  value V_t(i) = B_t + i*S_t      r15  step S_t

A store writes V_t(i) (low bytes; 16/32-byte stores write it replicated), an RMW adds A_t (inc
adds 1), so the final memory is a function of the per-thread iteration counts n_t the harness
prints.
"""

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build")
MANIFEST = os.path.join(HERE, "manifest.json")

SHARED_SIZE = 512
SHARED_ALIGN = 128
LINE = 64
PRIV_PER_THREAD = 256
MASK64 = (1 << 64) - 1
SUFFIX = {1: "b", 2: "w", 4: "l", 8: "q"}
R14 = {1: "%r14b", 2: "%r14w", 4: "%r14d", 8: "%r14"}
RBP = {1: "%bpl", 2: "%bp", 4: "%ebp", 8: "%rbp"}
RAX = {1: "%al", 2: "%ax", 4: "%eax", 8: "%rax"}
RCX = {1: "%cl", 2: "%cx", 4: "%ecx", 8: "%rcx"}


def initial_byte(k):
    """Initial content of shared byte k: a pattern, so any stray write is visible."""
    return (k * 37 + 11) & 0xFF


def thread_base(t):
    return (0xA1B2C3D4E5F60718 + t * 0x0102030405060708) & MASK64


def thread_step(t):
    return 0x0000000100010003 + 2 * t  # odd: low bytes take every value


def thread_addend(t):
    return 3 + 2 * t


# ---------------------------------------------------------------------------------------------
# Case description


@dataclass
class Op:
    kind: str  # store load add inc lock_add lock_inc xadd cmpxchg xchg
    off: int
    size: int
    mode: str = "base"  # base | rip | idx1 | idx2 | idx4 | idx8 | reg:<r64>
    cond: str = "always"  # always | even | odd (only on even/odd iterations: a branch)
    helper: bool = False  # the access lives in a function the loop calls
    vec: str = ""  # 16/32-byte form, filled in by the generator


@dataclass
class Thread:
    ops: list
    shape: str = "min"  # min | arith | big | call_asm | call_c | jmp_back | if_else


@dataclass
class Case:
    name: str
    threads: list
    pattern: str
    form: str
    align: str = "aligned"
    note: str = ""


WRITES = {"store", "add", "inc", "lock_add", "lock_inc", "xadd", "cmpxchg", "xchg"}
ATOMIC = {"lock_add", "lock_inc", "xadd", "cmpxchg", "xchg"}
ADDITIVE = {"add", "inc", "lock_add", "lock_inc", "xadd", "cmpxchg"}


def rw_of(kind):
    if kind == "load":
        return "r"
    if kind == "store":
        return "w"
    return "rw"


def addend_of(kind, t):
    return 1 if kind in ("inc", "lock_inc") else thread_addend(t)


# ---------------------------------------------------------------------------------------------
# The cases


def two(a, b, **kw):
    return [Thread(a, **kw), Thread(b, **kw)]


def cases():
    out = []
    sizes = [1, 2, 4, 8, 16, 32]

    def add(name, threads, pattern, form, align="aligned", note=""):
        out.append(Case(name, threads, pattern, form, align, note))

    def form_of(size, kind="mov"):
        if size == 16:
            return "sse"
        if size == 32:
            return "avx"
        return kind

    # A. sharing pattern x access size, aligned, base+displacement addressing.
    for s in sizes:
        f = form_of(s)
        add(f"ww_true_s{s}", two([Op("store", 0, s)], [Op("store", 0, s)]), "write-write", f)
        add(f"ww_false_s{s}", two([Op("store", 0, s)], [Op("store", s, s)]), "write-write", f)
        add(f"rw_true_s{s}", two([Op("store", 0, s)], [Op("load", 0, s)]), "read-write", f)
        add(f"rw_false_s{s}", two([Op("store", 0, s)], [Op("load", s, s)]), "read-write", f)
        add(f"rr_same_s{s}", two([Op("load", 0, s)], [Op("load", 0, s)]), "read-read", f,
            note="control: read-only sharing is not contention")
        add(f"ww_none_s{s}", two([Op("store", 0, s)], [Op("store", 128, s)]), "write-write", f,
            note="control: different lines (and different 128-byte pairs)")
        add(f"rw_none_s{s}", two([Op("store", 0, s)], [Op("load", 128, s)]), "read-write", f,
            note="control: different lines (and different 128-byte pairs)")

    # B. unaligned (offset not a multiple of the size), inside one line.
    for s in [2, 4, 8, 16, 32]:
        f = form_of(s)
        add(f"ww_true_s{s}_unaligned", two([Op("store", 1, s)], [Op("store", 1, s)]),
            "write-write", f, "unaligned")
        other = Op("store", 1 + s, s) if s < 32 else Op("store", 40, 8)
        add(f"ww_false_s{s}_unaligned", two([Op("store", 1, s)], [other]),
            "write-write", f, "unaligned")

    # C. line-straddling: the access covers the end of line 0 and the start of line 1.
    for s in [2, 4, 8, 16, 32]:
        f = form_of(s)
        st = 64 - s // 2
        add(f"ww_true_s{s}_straddle", two([Op("store", st, s)], [Op("store", st, s)]),
            "write-write", f, "straddle")
        add(f"ww_false_s{s}_straddle", two([Op("store", st, s)], [Op("store", 0, 8)]),
            "write-write", f, "straddle",
            note="thread 1 writes the first word of line 0; thread 0 straddles lines 0 and 1")

    # D. instruction forms.
    for s in [1, 4, 8]:
        add(f"add_true_s{s}", two([Op("add", 0, s)], [Op("add", 0, s)]), "write-write", "add_mr",
            note="non-atomic RMW race: lost updates, final value only bounded")
        add(f"add_false_s{s}", two([Op("add", 0, s)], [Op("add", 8, s)]), "write-write", "add_mr")
    add("inc_true_s8", two([Op("inc", 0, 8)], [Op("inc", 0, 8)]), "write-write", "inc",
        note="non-atomic RMW race: lost updates, final value only bounded")
    add("inc_false_s8", two([Op("inc", 0, 8)], [Op("inc", 8, 8)]), "write-write", "inc")
    add("inc_false_s1", two([Op("inc", 0, 1)], [Op("inc", 1, 1)]), "write-write", "inc")
    add("lockadd_true_s8", two([Op("lock_add", 0, 8)], [Op("lock_add", 0, 8)]), "write-write",
        "lock_add")
    add("lockadd_false_s8", two([Op("lock_add", 0, 8)], [Op("lock_add", 8, 8)]), "write-write",
        "lock_add")
    add("lockinc_true_s4", two([Op("lock_inc", 0, 4)], [Op("lock_inc", 0, 4)]), "write-write",
        "lock_inc")
    for s in [1, 4, 8]:
        add(f"xadd_true_s{s}", two([Op("xadd", 0, s)], [Op("xadd", 0, s)]), "write-write",
            "lock_xadd")
    for s in [4, 8]:
        add(f"xadd_false_s{s}", two([Op("xadd", 0, s)], [Op("xadd", s, s)]), "write-write",
            "lock_xadd")
    for s in [4, 8]:
        add(f"cmpxchg_true_s{s}", two([Op("cmpxchg", 0, s)], [Op("cmpxchg", 0, s)]),
            "write-write", "lock_cmpxchg", note="CAS-increment loop: a retry branch in the body")
    add("cmpxchg_false_s8", two([Op("cmpxchg", 0, 8)], [Op("cmpxchg", 8, 8)]), "write-write",
        "lock_cmpxchg")
    add("xchg_true_s8", two([Op("xchg", 0, 8)], [Op("xchg", 0, 8)]), "write-write", "xchg")
    add("xchg_false_s8", two([Op("xchg", 0, 8)], [Op("xchg", 8, 8)]), "write-write", "xchg")
    add("xchg_false_s2", two([Op("xchg", 0, 2)], [Op("xchg", 2, 2)]), "write-write", "xchg")
    add("xadd_vs_load_true", two([Op("xadd", 0, 8)], [Op("load", 0, 8)]), "read-write",
        "lock_xadd")
    add("xadd_vs_store_false", two([Op("xadd", 0, 8)], [Op("store", 8, 8)]), "write-write",
        "lock_xadd")
    add("avx_store_sse_load_false", two([Op("store", 0, 32)], [Op("load", 32, 16)]),
        "read-write", "avx")
    add("sse_unaligned_true", two([Op("store", 8, 16)], [Op("store", 8, 16)]), "write-write",
        "sse", "unaligned", note="movdqu on an 8-aligned, not 16-aligned address")
    # rip-relative globals
    add("rip_ww_true_s8", two([Op("store", 0, 8, "rip")], [Op("store", 0, 8, "rip")]),
        "write-write", "rip")
    add("rip_ww_false_s8", two([Op("store", 0, 8, "rip")], [Op("store", 8, 8, "rip")]),
        "write-write", "rip")
    add("rip_rw_false_s4", two([Op("store", 0, 4, "rip")], [Op("load", 4, 4, "rip")]),
        "read-write", "rip")
    add("rip_xadd_false_s8", two([Op("xadd", 0, 8, "rip")], [Op("xadd", 8, 8, "rip")]),
        "write-write", "rip")
    # base + index * scale
    for sc in [1, 2, 4, 8]:
        add(f"idx{sc}_ww_false", two([Op("store", 16, 8, f"idx{sc}")],
                                     [Op("store", 24, 8, f"idx{sc}")]), "write-write", "index")
    add("idx8_ww_true", two([Op("store", 16, 8, "idx8")], [Op("store", 16, 8, "idx8")]),
        "write-write", "index")
    add("idx4_rw_false", two([Op("store", 0, 4, "idx4")], [Op("load", 4, 4, "idx4")]),
        "read-write", "index")
    # stores through different registers to the same line
    add("regs_ww_false", two([Op("store", 0, 8, "reg:rsi"), Op("store", 16, 8, "reg:rdi")],
                             [Op("store", 8, 8, "reg:r8")]), "write-write", "regs")
    add("regs_rw_true", two([Op("store", 0, 8, "reg:rsi"), Op("store", 16, 8, "reg:rdi")],
                            [Op("load", 0, 8, "reg:r10")]), "read-write", "regs")
    add("regs_same_thread_none",
        two([Op("store", 0, 8, "reg:rsi"), Op("store", 8, 8, "reg:rdi")],
            [Op("store", 128, 8, "reg:rsi"), Op("store", 136, 8, "reg:rdi")]),
        "write-write", "regs", note="control: each thread writes two words of its own line")

    # E. loop bodies: arithmetic, branches, calls, dozens of instructions.
    add("body_arith_ww_false", two([Op("store", 0, 8)], [Op("store", 8, 8)], shape="arith"),
        "write-write", "mov")
    add("body_arith_rw_true", two([Op("store", 0, 8)], [Op("load", 0, 8)], shape="arith"),
        "read-write", "mov")
    add("body_branch_ww_false", two([Op("store", 0, 8, cond="even")],
                                    [Op("store", 8, 8, cond="even")]),
        "write-write", "mov", note="stores skipped on odd iterations")
    add("body_branch_ww_true", two([Op("store", 0, 4, cond="even")],
                                   [Op("store", 0, 4, cond="even")]),
        "write-write", "mov", note="stores skipped on odd iterations")
    add("body_big_ww_false", two([Op("load", 0, 8), Op("store", 0, 8)],
                                 [Op("load", 8, 8), Op("store", 8, 8)], shape="big"),
        "write-write", "mov", note="dozens of instructions: private memory, stack, branches")
    add("body_big_xadd_true", two([Op("xadd", 0, 8)], [Op("xadd", 0, 8)], shape="big"),
        "write-write", "lock_xadd")
    add("body_big_rw_false", two([Op("store", 0, 8), Op("store", 16, 4, cond="even")],
                                 [Op("load", 8, 8), Op("load", 24, 8)], shape="big"),
        "read-write", "mov")
    add("body_call_asm_ww_false", two([Op("store", 0, 8)], [Op("store", 8, 8)],
                                      shape="call_asm"), "write-write", "mov")
    add("body_call_c_ww_false", two([Op("store", 0, 8)], [Op("store", 8, 8)], shape="call_c"),
        "write-write", "mov", note="the loop calls a C function in the harness")
    add("body_call_c_add_false", two([Op("add", 0, 8)], [Op("add", 8, 8)], shape="call_c"),
        "write-write", "add_mr")
    add("helper_store_ww_false", two([Op("store", 0, 8, helper=True)],
                                     [Op("store", 8, 8, helper=True)]),
        "write-write", "mov", note="the contending store is in a function the loop calls")
    add("helper_store_ww_true", two([Op("store", 0, 8, helper=True)],
                                    [Op("store", 0, 8, helper=True)]),
        "write-write", "mov", note="the contending store is in a function the loop calls")
    add("helper_mixed_rw_false", two([Op("store", 0, 8, helper=True), Op("store", 8, 8)],
                                     [Op("load", 16, 8, helper=True)], shape="arith"),
        "read-write", "mov")

    # H. timer skid past control flow (issue 11): the loop control sits at the head; on even
    # iterations the contending store runs, then two register steps and the `jmp` back. The
    # samples that skid past the store land on the steps (the first is the join of the odd
    # iterations' branch), the `jmp` and at the head, where the instruction before in address
    # order is the function's prologue.
    add("skid_jmp_ww_false", two([Op("store", 0, 8, cond="even")], [Op("store", 8, 8, cond="even")],
                                 shape="jmp_back"),
        "write-write", "mov", note="if (even) store; 2 register steps; jmp to the loop head")
    # An if/else whose arms store to different words: the odd arm falls through into the
    # join, which the even arm's `jmp` also targets, so the samples right after the odd
    # store (at the join) need the sampled flags to say which arm ran.
    add("skid_join_ww_false",
        two([Op("store", 0, 8, cond="even"), Op("store", 16, 8, cond="odd")],
            [Op("store", 8, 8, cond="even"), Op("store", 24, 8, cond="odd")], shape="if_else"),
        "write-write", "mov", note="if (even) A = v; else B = v; at the join")
    # Watch hits whose pointer the access overwrites (`movl (%rax),%eax`): the trap's registers
    # cannot say which half of an 8-byte watched word the 4-byte load read.
    add("watch_bytes_rw_false_s4",
        two([Op("load", 0, 4, "reg:rax"), Op("store", 0, 4)],
            [Op("load", 4, 4, "reg:rax"), Op("store", 4, 4)]),
        "read-write", "mov", note="4-byte counters side by side, loads through a clobbered pointer")

    # F. more threads (run anywhere; on 2 CPUs they time-share).
    add("t4_ww_false_s8", [Thread([Op("store", 8 * t, 8)]) for t in range(4)], "write-write",
        "mov")
    add("t4_xadd_true_s8", [Thread([Op("xadd", 0, 8)]) for t in range(4)], "write-write",
        "lock_xadd")
    add("t3_rw_false_s8", [Thread([Op("store", 0, 8)]), Thread([Op("store", 8, 8)]),
                           Thread([Op("load", 16, 8)])], "read-write", "mov")
    add("t4_none_s8", [Thread([Op("store", 128 * t, 8)]) for t in range(4)], "write-write",
        "mov", note="control: one 128-byte pair per thread")

    # G. adjacent lines: no sharing at 64 bytes, false sharing if lines are paired (128 B).
    add("adjacent_ww_s8", two([Op("store", 0, 8)], [Op("store", 64, 8)]), "write-write", "mov",
        note="control at 64 B; false sharing under adjacent-line prefetch (128 B)")
    add("adjacent_rw_s8", two([Op("store", 56, 8)], [Op("load", 64, 8)]), "read-write", "mov",
        note="control at 64 B; false sharing under adjacent-line prefetch (128 B)")
    return out


# ---------------------------------------------------------------------------------------------
# Code generation


class Src:
    """The .S text being written, with the line number of each labelled instruction."""

    def __init__(self):
        self.lines = []

    def emit(self, text):
        self.lines.append(text)
        return len(self.lines)

    def text(self):
        return "\n".join(self.lines) + "\n"


def mem_operand(op, src):
    """Addressing-mode setup instructions are emitted here; returns the operand text."""
    if op.mode == "base":
        return f"{op.off}(%r12)"
    if op.mode == "rip":
        return f"asmtest_shared+{op.off}(%rip)"
    if op.mode.startswith("idx"):
        scale = int(op.mode[3:])
        k = op.off // scale
        disp = op.off - k * scale
        src.emit(f"    mov ${k}, %r9d")
        return f"{disp}(%r12,%r9,{scale})"
    if op.mode.startswith("reg:"):
        reg = op.mode[4:]
        src.emit(f"    lea {op.off}(%r12), %{reg}")
        return f"(%{reg})"
    raise ValueError(op.mode)


def emit_op(op, t, label, src, marks):
    """Emit one memory operation; `marks` collects (label, line, op-role) of its accesses."""

    def labelled(lab, insn, role):
        src.emit(f"    .globl {lab}")
        src.emit(f"{lab}:")
        line = src.emit(f"    {insn}")
        marks.append((lab, line, role))

    m = mem_operand(op, src)
    s = op.size
    k = op.kind
    if k == "store":
        if s <= 8:
            labelled(label, f"mov{SUFFIX[s]} {R14[s]}, {m}", "store")
        elif s == 16:
            src.emit("    movq %r14, %xmm0")
            src.emit("    punpcklqdq %xmm0, %xmm0")
            labelled(label, f"{op.vec} %xmm0, {m}", "store")
        else:
            src.emit("    vmovq %r14, %xmm0")
            src.emit("    vpunpcklqdq %xmm0, %xmm0, %xmm0")
            src.emit("    vinsertf128 $1, %xmm0, %ymm0, %ymm0")
            labelled(label, f"vmovdqu %ymm0, {m}", "store")
    elif k == "load":
        if s <= 8:
            labelled(label, f"mov{SUFFIX[s]} {m}, {RAX[s]}", "load")
            src.emit("    add %rax, %r11")
        elif s == 16:
            labelled(label, f"{op.vec} {m}, %xmm1", "load")
        else:
            labelled(label, f"vmovdqu {m}, %ymm1", "load")
    elif k == "add":
        labelled(label, f"add{SUFFIX[s]} {RBP[s]}, {m}", "rmw")
    elif k == "lock_add":
        labelled(label, f"lock add{SUFFIX[s]} {RBP[s]}, {m}", "rmw")
    elif k == "inc":
        labelled(label, f"inc{SUFFIX[s]} {m}", "rmw")
    elif k == "lock_inc":
        labelled(label, f"lock inc{SUFFIX[s]} {m}", "rmw")
    elif k == "xadd":
        src.emit("    mov %rbp, %rax")
        labelled(label, f"lock xadd{SUFFIX[s]} {RAX[s]}, {m}", "rmw")
    elif k == "xchg":
        src.emit("    mov %r14, %rax")
        labelled(label, f"xchg{SUFFIX[s]} {RAX[s]}, {m}", "rmw")
    elif k == "cmpxchg":
        retry = f".Lretry_{label}"
        src.emit(f"{retry}:")
        labelled(label + "_load", f"mov{SUFFIX[s]} {m}, {RAX[s]}", "load")
        src.emit(f"    lea (%rax,%rbp), {RCX[s] if s >= 4 else '%ecx'}")
        labelled(label, f"lock cmpxchg{SUFFIX[s]} {RCX[s]}, {m}", "rmw")
        src.emit(f"    jnz {retry}")
    else:
        raise ValueError(k)


def fill_arith(src, t):
    """Ten ALU instructions with a data-dependent branch: work between the memory operations."""
    for insn in ["lea 1(%rbx), %rax", "imul $13, %rax, %rax", "xor %rbx, %rax",
                 "shr $3, %rax", "add %rax, %r11", "rol $7, %r11", "mov %r11, %rdx",
                 "and $15, %edx", "cmp $7, %edx"]:
        src.emit(f"    {insn}")
    skip = f".Larith_skip_{t}_{len(src.lines)}"
    src.emit(f"    jb {skip}")
    src.emit("    sub %rdx, %r11")
    src.emit(f"{skip}:")


def fill_big_head(src, t):
    """About two dozen instructions before the memory operations: private memory (a per-thread
    line of asmtest_priv and the stack), an inner loop and two branches."""
    priv = f"asmtest_priv+{t * PRIV_PER_THREAD}"
    body = [
        "mov %rbx, %rax", "imul $0x3779b1, %rax, %rax", "mov %rax, %rcx", "shr $16, %rcx",
        f"mov %rax, {priv}(%rip)", f"mov %rcx, {priv}+8(%rip)", "push %rax", "push %rcx",
        f"mov {priv}(%rip), %rdx", "add %rdx, %r11", "xor %rcx, %r11", "pop %rcx", "pop %rax",
        "mov $4, %ecx",
    ]
    for insn in body:
        src.emit(f"    {insn}")
    inner = f".Lbig_inner_{t}"
    src.emit(f"{inner}:")
    for insn in ["add %rcx, %r11", f"addq %rcx, {priv}+16(%rip)", "dec %ecx", f"jnz {inner}",
                 "test $3, %bl"]:
        src.emit(f"    {insn}")
    src.emit(f"    jnz .Lbig_a_{t}")
    for insn in [f"mov {priv}+16(%rip), %rdx", "lea (%rdx,%rdx,2), %rdx", f"mov %rdx, {priv}+24(%rip)"]:
        src.emit(f"    {insn}")
    src.emit(f".Lbig_a_{t}:")


def fill_big_tail(src, t):
    priv = f"asmtest_priv+{t * PRIV_PER_THREAD}"
    for insn in [f"mov {priv}+8(%rip), %rax", "bswap %rax", "add %rax, %r11", "cmp %rax, %r11"]:
        src.emit(f"    {insn}")
    src.emit(f"    jae .Lbig_b_{t}")
    for insn in ["not %r11", f"movl %r11d, {priv}+32(%rip)"]:
        src.emit(f"    {insn}")
    src.emit(f".Lbig_b_{t}:")
    for insn in ["imul $7, %r11, %rdx", "add %rdx, %rax", f"mov %rax, {priv}+40(%rip)"]:
        src.emit(f"    {insn}")


def labels_for(threads):
    """Global label of each op: t<thread>_<kind>, numbered when a kind repeats in a thread."""
    short = {"lock_add": "lockadd", "lock_inc": "lockinc", "cmpxchg": "cas"}
    result = []
    for t, th in enumerate(threads):
        bases = [short.get(op.kind, op.kind) for op in th.ops]
        seen = {}
        names = []
        for b in bases:
            n = seen.get(b, 0)
            seen[b] = n + 1
            names.append(f"t{t}_{b}{n}" if bases.count(b) > 1 else f"t{t}_{b}")
        result.append(names)
    return result


def gen_case(case):
    """Return (assembly text, marks) where marks[t] = [(label, line, role, op, function)]."""
    src = Src()
    nt = len(case.threads)
    needs_avx = any(op.size == 32 for th in case.threads for op in th.ops)
    for th in case.threads:
        for op in th.ops:
            if op.size == 16:
                op.vec = "movdqa" if op.off % 16 == 0 else "movdqu"
    src.emit(f"/* asm-test {case.name}: generated by asm-tests/gen.py, do not edit.")
    src.emit(f" * {case.pattern}, form {case.form}, {case.align}. {case.note}")
    src.emit(" * Register use: rbx=i r12=shared r13=count r14=value r15=step rbp=addend */")
    src.emit("    .section .data")
    src.emit(f"    .balign {SHARED_ALIGN}")
    src.emit("    .globl asmtest_shared")
    src.emit("    .type asmtest_shared, @object")
    src.emit(f"    .size asmtest_shared, {SHARED_SIZE}")
    src.emit("asmtest_shared:")
    for row in range(0, SHARED_SIZE, 16):
        src.emit("    .byte " + ", ".join(f"0x{initial_byte(k):02x}" for k in range(row, row + 16)))
    src.emit("    .section .bss")
    src.emit(f"    .balign {SHARED_ALIGN}")
    src.emit("    .globl asmtest_priv")
    src.emit("    .type asmtest_priv, @object")
    src.emit(f"    .size asmtest_priv, {PRIV_PER_THREAD * 8}")
    src.emit("asmtest_priv:")
    src.emit(f"    .zero {PRIV_PER_THREAD * 8}")
    src.emit("    .section .rodata")
    for sym, val in [("asmtest_shared_size", SHARED_SIZE), ("asmtest_nthreads", nt),
                     ("asmtest_needs_avx", int(needs_avx))]:
        src.emit(f"    .globl {sym}")
        src.emit("    .balign 4")
        src.emit(f"{sym}: .long {val}")
    src.emit("    .globl asmtest_name")
    src.emit(f'asmtest_name: .asciz "{case.name}"')
    src.emit('    .section .data.rel.ro, "aw"')
    src.emit("    .balign 8")
    src.emit("    .globl asmtest_bodies")
    src.emit("asmtest_bodies:")
    for t in range(nt):
        src.emit(f"    .quad asm_t{t}")
    src.emit("    .text")

    labels = labels_for(case.threads)
    marks = []
    helpers = []  # (function name, op, label, t)
    for t, th in enumerate(case.threads):
        fn = f"asm_t{t}"
        tmarks = []
        src.emit("")
        src.emit(f"/* thread {t}: {', '.join(o.kind + '@' + str(o.off) + '/' + str(o.size) for o in th.ops)} */")
        src.emit(f"    .globl {fn}")
        src.emit(f"    .type {fn}, @function")
        src.emit(f"{fn}:")
        for r in ["rbx", "rbp", "r12", "r13", "r14", "r15"]:
            src.emit(f"    push %{r}")
        src.emit("    sub $8, %rsp            # 16-byte stack alignment for calls into C")
        src.emit("    mov %rdx, %r12")
        src.emit("    mov %rdi, %r13")
        src.emit("    mov %rsi, %rbx")
        src.emit(f"    movabs ${thread_step(t)}, %r15")
        src.emit("    mov %rbx, %r14")
        src.emit("    imul %r15, %r14")
        src.emit(f"    movabs ${thread_base(t)}, %rax")
        src.emit("    add %rax, %r14")
        src.emit(f"    mov ${thread_addend(t)}, %ebp")
        src.emit("    xor %r11d, %r11d")
        src.emit(f".Lloop_{t}:")
        if th.shape == "jmp_back":
            # r11 counts this call's iterations from the prologue's `xor`: once it has moved,
            # the prologue cannot be the way a sample came to the head.
            src.emit("    inc %r11")
            src.emit("    dec %r13")
            src.emit(f"    js .Ldone_{t}")
        if th.shape == "arith":
            fill_arith(src, t)
        elif th.shape == "big":
            fill_big_head(src, t)
        elif th.shape == "call_asm":
            src.emit("    mov %rbx, %rdi")
            src.emit("    call asmtest_mix")
            src.emit("    add %rax, %r11")
        elif th.shape == "call_c":
            src.emit("    mov %rbx, %rdi")
            src.emit("    call asmtest_c_mix")
            src.emit("    mov %rax, %r11")
        if th.shape == "if_else":
            # if (i even) op0; else op1;  — the else arm falls through into the join.
            assert [op.cond for op in th.ops] == ["even", "odd"]
            src.emit("    test $1, %bl")
            src.emit(f"    jnz .Lodd_{t}")
        for i, op in enumerate(th.ops):
            label = labels[t][i]
            skip = f".Lskip_{t}_{i}"
            if th.shape == "if_else":
                if i == 1:
                    src.emit(f"    jmp .Ljoin_{t}")
                    src.emit(f".Lodd_{t}:")
                opmarks = []
                emit_op(op, t, label, src, opmarks)
                tmarks.extend((lab, line, role, op, fn) for lab, line, role in opmarks)
                if i == 1:
                    src.emit(f".Ljoin_{t}:")
                continue
            if op.cond == "even":
                src.emit("    test $1, %bl             # odd iteration: skip the access")
                src.emit(f"    jnz {skip}")
                if th.shape == "jmp_back":
                    # Work between the branch and the store (flags untouched): the join after
                    # the store is no longer `jcc; store; join`.
                    src.emit("    mov %r14, %rax")
            if op.helper:
                hfn = f"{label}_fn"
                helpers.append((hfn, op, label, t))
                src.emit(f"    call {hfn}")
            else:
                before = len(tmarks)
                opmarks = []
                emit_op(op, t, label, src, opmarks)
                tmarks.extend((lab, line, role, op, fn) for lab, line, role in opmarks)
                assert len(tmarks) > before
            if op.cond == "even":
                src.emit(f"{skip}:")
            if th.shape == "arith" and i + 1 < len(th.ops):
                fill_arith(src, t)
        if th.shape == "big":
            fill_big_tail(src, t)
        if th.shape == "jmp_back":
            # The next iteration's value, then back to the head: the store is 3 instructions
            # before the `jmp` and 4-6 before the head's instructions.
            src.emit("    add %r15, %r14")
            src.emit("    inc %rbx")
            src.emit(f"    jmp .Lloop_{t}")
            src.emit(f".Ldone_{t}:")
        else:
            src.emit("    add %r15, %r14")
            src.emit("    inc %rbx")
            src.emit("    dec %r13")
            src.emit(f"    jnz .Lloop_{t}")
        if needs_avx:
            src.emit("    vzeroupper")
        src.emit("    add $8, %rsp")
        for r in ["r15", "r14", "r13", "r12", "rbp", "rbx"]:
            src.emit(f"    pop %{r}")
        src.emit("    ret")
        src.emit(f"    .size {fn}, .-{fn}")
        marks.append(tmarks)

    # Functions the loops call. Helpers use the caller's r12/r14/rbp (a private convention:
    # they are only called from this file) and clobber rax, rcx, r9.
    for hfn, op, label, t in helpers:
        src.emit("")
        src.emit(f"    .globl {hfn}")
        src.emit(f"    .type {hfn}, @function")
        src.emit(f"{hfn}:")
        opmarks = []
        emit_op(op, t, label, src, opmarks)
        marks[t].extend((lab, line, role, op, hfn) for lab, line, role in opmarks)
        src.emit("    ret")
        src.emit(f"    .size {hfn}, .-{hfn}")
    src.emit("")
    src.emit("/* An out-of-line arithmetic helper (the call_asm bodies call it). */")
    src.emit("    .globl asmtest_mix")
    src.emit("    .type asmtest_mix, @function")
    src.emit("asmtest_mix:")
    for insn in ["mov %rdi, %rax", "shr $7, %rax", "xor %rdi, %rax", "imul $0x2545f491, %rax, %rax",
                 "ret"]:
        src.emit(f"    {insn}")
    src.emit("    .size asmtest_mix, .-asmtest_mix")
    src.emit('    .section .note.GNU-stack, "", @progbits')
    return src.text(), marks, needs_avx


# ---------------------------------------------------------------------------------------------
# Ground truth


def byte_range(op):
    return op.off, op.off + op.size


def classify(case, line_size):
    """Per line: true sharing if two threads' bytes overlap where one of them writes, false if
    threads touch disjoint bytes and one writes, nothing if only one thread (or only reads)."""
    touches = {}  # line -> thread -> (read bytes, written bytes)
    for t, th in enumerate(case.threads):
        for op in th.ops:
            lo, hi = byte_range(op)
            rw = rw_of(op.kind)
            for b in range(lo, hi):
                r, w = touches.setdefault(b // line_size, {}).setdefault(t, (set(), set()))
                if "r" in rw:
                    r.add(b)
                if "w" in rw:
                    w.add(b)
    kinds = {}
    for line, per in touches.items():
        kind = None
        ts = sorted(per)
        for i, a in enumerate(ts):
            for b in ts[i + 1:]:
                ra, wa = per[a]
                rb, wb = per[b]
                if not wa and not wb:
                    continue
                if wa & (rb | wb) or wb & (ra | wa):
                    kind = "true_sharing"
                elif kind is None:
                    kind = "false_sharing"
        if kind:
            kinds[line] = kind
    return kinds


def overall_kind(kinds):
    if "true_sharing" in kinds.values():
        return "true_sharing"
    if "false_sharing" in kinds.values():
        return "false_sharing"
    return "none"


def contending_ops(case, line_size):
    """(thread, op index) pairs that take part in a conflicting pair on some line."""
    spans = []
    for t, th in enumerate(case.threads):
        for i, op in enumerate(th.ops):
            lo, hi = byte_range(op)
            lines = set(range(lo // line_size, (hi - 1) // line_size + 1))
            spans.append((t, i, lines, "w" in rw_of(op.kind)))
    result = set()
    for t, i, la, wa in spans:
        for u, j, lb, wb in spans:
            if t != u and la & lb and (wa or wb):
                result.add((t, i))
    return result


def value_expr(t, cond):
    # The last iteration index (from 0) of that parity; runs are ≥ 2 iterations.
    last = {"always": f"(n{t} - 1)", "even": f"((n{t} - 1) // 2 * 2)",
            "odd": f"(n{t} // 2 * 2 - 1)"}[cond]
    return f"(({thread_base(t):#x} + {last} * {thread_step(t):#x}) & {MASK64:#x})"


def slice_expr(expr, width, rel, size):
    """Bytes [rel, rel+size) of a value of `width` bytes that holds `expr` replicated every 8."""
    parts = []
    j = 0
    while j < size:
        start = (rel + j) % 8
        run = min(8 - start, size - j)
        piece = f"(({expr} >> {8 * start}) & {(1 << (8 * run)) - 1:#x})"
        parts.append(piece if j == 0 else f"({piece} << {8 * j})")
        j += run
    return " | ".join(parts) if len(parts) > 1 else parts[0]


def initial_value(lo, hi):
    return sum(initial_byte(k) << (8 * (k - lo)) for k in range(lo, hi))


def final_memory(case):
    """Cells of the shared area that can change, each with a rule over n0..n{T-1}."""
    writers = []  # (thread, op)
    for t, th in enumerate(case.threads):
        for op in th.ops:
            if op.kind in WRITES:
                writers.append((t, op))
    bounds = set()
    for t, op in writers:
        lo, hi = byte_range(op)
        bounds |= {lo, hi}
        bounds |= set(range((lo + 7) // 8 * 8, hi, 8))
    bounds = sorted(bounds)
    cells = []
    for a, b in zip(bounds, bounds[1:]):
        cov = [(t, op) for t, op in writers if byte_range(op)[0] <= a and b <= byte_range(op)[1]]
        if not cov:
            continue
        kinds = {op.kind in ADDITIVE for _, op in cov}
        if len(kinds) != 1:
            raise ValueError(f"{case.name}: stores and RMWs on the same bytes")
        cell = {"offset": a, "size": b - a}
        if kinds == {True}:
            ranges = {byte_range(op) for _, op in cov}
            if len(ranges) != 1:
                raise ValueError(f"{case.name}: RMWs on overlapping but different bytes")
            lo, hi = ranges.pop()
            width = hi - lo
            init = initial_value(lo, hi)
            total = " + ".join(f"{addend_of(op.kind, t)} * n{t}" for t, op in cov)
            whole = f"(({init:#x} + {total}) & {(1 << (8 * width)) - 1:#x})"
            threads = {t for t, _ in cov}
            if len(threads) > 1 and not all(op.kind in ATOMIC for _, op in cov):
                # Every value ever stored is init + (some of the addends), so the last one is at
                # least init + the smallest addend and at most init + all of them; with 8 bytes
                # that sum cannot wrap in any feasible run, narrower cells may wrap.
                cell["rule"] = "range"
                if width == 8 and (a, b) == (lo, hi):
                    low = min(addend_of(op.kind, t) for t, op in cov)
                    cell["lo"] = f"{init + low:#x}"
                    cell["hi"] = f"{init:#x} + {total}"
                else:
                    cell["lo"] = "0"
                    cell["hi"] = f"{(1 << (8 * (b - a))) - 1:#x}"
                cell["note"] = ("non-atomic read-modify-write race: updates may be lost; "
                                f"without a race the value would be {whole}")
            else:
                cell["rule"] = "exact"
                cell["value"] = slice_expr(whole, width, a - lo, b - a) if width > 8 or a != lo \
                    or b != hi else whole
        else:
            vals = []
            for t, op in cov:
                v = slice_expr(value_expr(t, op.cond), op.size, a - op.off, b - a)
                if v not in vals:
                    vals.append(v)
            if len(vals) == 1:
                cell["rule"] = "exact"
                cell["value"] = vals[0]
            else:
                cell["rule"] = "one_of"
                cell["values"] = vals
                cell["note"] = "stores race: the last store of either thread"
        cells.append(cell)
    return cells


def manifest_entry(case, marks, needs_avx):
    kinds64 = classify(case, 64)
    kinds128 = classify(case, 128)
    cont = contending_ops(case, LINE)
    contending = []
    accesses = []
    for t, th in enumerate(case.threads):
        for lab, line, role, op, fn in marks[t]:
            i = th.ops.index(op)
            lo, hi = byte_range(op)
            entry = {"label": lab, "thread": t, "file": f"{case.name}.S", "line": line,
                     "function": fn, "op": role, "offset": op.off, "size": op.size}
            if (t, i) in cont:
                contending.append(entry)
            rw = {"load": "r", "store": "w", "rmw": "rw"}[role]
            for ln in range(lo // LINE, (hi - 1) // LINE + 1):
                a, b = max(lo, ln * LINE), min(hi, (ln + 1) * LINE)
                accesses.append({"thread": t, "label": lab, "line_offset": ln * LINE,
                                 "bytes": [a - ln * LINE, b - ln * LINE], "rw": rw})
    return {
        "name": case.name,
        "binary": f"asm-tests/build/{case.name}",
        "source": f"asm-tests/build/{case.name}.S",
        "threads": len(case.threads),
        "pattern": case.pattern,
        "form": case.form,
        "alignment": case.align,
        "shape": sorted({th.shape for th in case.threads}),
        "needs_avx": needs_avx,
        "expected_kind": overall_kind(kinds64),
        "line_size": LINE,
        "lines": [{"line_offset": ln * LINE, "kind": k} for ln, k in sorted(kinds64.items())],
        "expected_kind_128": overall_kind(kinds128),
        "contending": contending,
        "accesses": accesses,
        "final_memory": final_memory(case),
        "knobs": {"iters_env": "ASMTEST_ITERS", "seconds_env": "ASMTEST_SECONDS",
                  "default_seconds": 1.5, "args": ["--iters", "N", "--seconds", "S"]},
        "note": case.note,
    }


def manifest_doc(entries):
    return {
        "schema": "asm-tests-manifest/1",
        "generator": "asm-tests/gen.py",
        "shared_symbol": "asmtest_shared",
        "shared_size": SHARED_SIZE,
        "shared_align": SHARED_ALIGN,
        "line_size": LINE,
        "initial_memory": "byte k of asmtest_shared = (k * 37 + 11) & 0xff",
        "final_memory_rules": {
            "variables": "n<t> = iterations thread t ran (the harness prints them on the 'iters' "
                         "line); little-endian cells, bytes outside every cell keep their "
                         "initial value",
            "exact": "the cell equals `value`",
            "one_of": "the cell equals one of `values` (racing stores: the last store wins)",
            "range": "lo <= cell <= hi (non-atomic RMW races lose updates)",
        },
        "knobs": {
            "env": {"ASMTEST_ITERS": "iterations per thread", "ASMTEST_SECONDS":
                    "seconds per thread (default 1.5)", "ASMTEST_CHUNK":
                    "iterations per body call (default 1024)", "ASMTEST_PIN":
                    "1: pin thread t to CPU t", "ASMTEST_WAIT":
                    "print the pid and sleep this long before starting (attach window)"},
            "args": "--iters N --seconds S --chunk C --wait W (override the environment); "
                    "--seconds 0 alone runs until SIGINT/SIGTERM, which also end any run early",
            "default_seconds": 1.5,
        },
        "output": "lines 'iters n0 n1 ...', 'mem +0xOFF w0 .. w7' (hex 64-bit words), "
                  "'checksum 0x<fnv1a-64 of the area>'; exit 77 = skipped (no AVX)",
        "tests": entries,
    }


MAKEFILE_HEAD = """# generated by asm-tests/gen.py
CC ?= gcc
CFLAGS = -g -O2 -pthread -Wall
all: {targets}
harness.o: ../harness.c
\t$(CC) $(CFLAGS) -c $< -o $@
%: %.S harness.o
\t$(CC) -g -pthread $< harness.o -o $@
"""


def intended_kind(name):
    """The kind a case's name promises; the byte model must agree (a typo in an offset that
    turns a false-sharing case into true sharing, or into no sharing, fails generation)."""
    tokens = name.split("_")
    if "true" in tokens:
        return "true_sharing"
    if "false" in tokens:
        return "false_sharing"
    if "none" in tokens or tokens[0] in ("rr", "adjacent"):
        return "none"
    raise ValueError(f"{name}: the name does not say which kind it is")


def generate(write):
    entries = []
    files = {}
    for case in cases():
        text, marks, needs_avx = gen_case(case)
        files[f"{case.name}.S"] = text
        entry = manifest_entry(case, marks, needs_avx)
        if entry["expected_kind"] != intended_kind(case.name):
            raise SystemExit(f"{case.name}: the byte model says {entry['expected_kind']}")
        if (entry["expected_kind"] == "none") != (not entry["contending"]):
            raise SystemExit(f"{case.name}: contending labels disagree with the kind")
        if case.name.startswith("adjacent") and entry["expected_kind_128"] != "false_sharing":
            raise SystemExit(f"{case.name}: not false sharing at 128 bytes")
        entries.append(entry)
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate test names")
    doc = json.dumps(manifest_doc(entries), indent=1) + "\n"
    if write:
        os.makedirs(BUILD, exist_ok=True)
        for fname, text in files.items():
            path = os.path.join(BUILD, fname)
            old = open(path).read() if os.path.exists(path) else None
            if old != text:  # keep mtimes so make rebuilds only what changed
                with open(path, "w") as f:
                    f.write(text)
        mk = MAKEFILE_HEAD.format(targets=" ".join(names))
        with open(os.path.join(BUILD, "Makefile"), "w") as f:
            f.write(mk)
    return doc, len(entries)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the committed manifest with a fresh generation, write nothing")
    args = ap.parse_args()
    doc, n = generate(write=not args.check)
    if args.check:
        old = open(MANIFEST).read() if os.path.exists(MANIFEST) else ""
        if old != doc:
            print("asm-tests/manifest.json is stale: run python3 asm-tests/gen.py", file=sys.stderr)
            return 1
        print(f"manifest up to date ({n} tests)")
        return 0
    with open(MANIFEST, "w") as f:
        f.write(doc)
    print(f"generated {n} asm-tests into {os.path.relpath(BUILD)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
