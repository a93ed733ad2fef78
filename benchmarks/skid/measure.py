#!/usr/bin/env python3
"""Where cpu-clock samples land around an access: a histogram of sampled IPs per instruction.

    benchmarks/skid/measure.py [--laser L] [--record OUT] [--func F ...] -- PROG ARGS
    benchmarks/skid/measure.py --recording REC --binary PROG [--func F ...]

Records PROG with `laser record` (or reads REC), takes the soft samples whose IP lies in the
named functions of PROG (default: probe_loads, probe_stores of skid_probe.c) and prints, per
function, every instruction with its share of the function's samples. For skid_probe the
access is the function's first instruction, so the row index is the skid in instructions.
"""

import argparse
import collections
import re
import subprocess
import sys


def text_map(dump, binary):
    """(addr, len, pgoff) of PROG's executable mapping, from `laser dump` output."""
    for line in dump.splitlines():
        if line.startswith("Mmap(") and "prot: 5" in line and f'path: "{binary}"' in line:
            g = lambda k: int(re.search(rf"{k}: (\d+)", line).group(1))
            return g("addr"), g("len"), g("pgoff")
    raise SystemExit(f"no executable mapping of {binary} in the recording")


def functions(binary, names):
    """{name: [(vaddr, text)]} from objdump (file offsets = vaddrs for these PIE builds)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], check=True,
                         capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <([^>]+)>:", line)
        if m:
            cur = m.group(2) if m.group(2) in names else None
            if cur:
                funcs[cur] = []
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if cur and m:
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--laser", default="target/x86_64-unknown-linux-gnu/release/laser")
    ap.add_argument("--record", default="/tmp/skid_probe.laser")
    ap.add_argument("--recording")
    ap.add_argument("--binary")
    ap.add_argument("--func", action="append")
    ap.add_argument("cmd", nargs="*")
    a = ap.parse_args()
    names = a.func or ["probe_loads", "probe_stores"]
    rec = a.recording
    binary = a.binary or (a.cmd[0] if a.cmd else None)
    if not rec:
        subprocess.run([a.laser, "record", "-o", a.record, "--"] + a.cmd, check=True,
                       stdout=subprocess.DEVNULL)
        rec = a.record
    import os
    binary = os.path.abspath(binary)
    dump = subprocess.run([a.laser, "dump", rec], check=True, capture_output=True,
                          text=True).stdout
    base, length, pgoff = text_map(dump, binary)
    ips = collections.Counter()
    for line in dump.splitlines():
        if line.startswith("Sample(Sample { backend: Soft"):
            ip = int(re.search(r"ip: (\d+)", line).group(1))
            if base <= ip < base + length:
                ips[ip - base + pgoff] += 1
    for name, insns in functions(binary, names).items():
        total = sum(ips[v] for v, _ in insns)
        print(f"{name}: {total} samples")
        cum = 0
        for i, (v, text) in enumerate(insns):
            n = ips[v]
            cum += n
            if n:
                print(f"  {i:3d}  {v:#7x}  {text:36s} {n:6d}  {100 * n / max(total, 1):5.1f}%"
                      f"  cum {100 * cum / max(total, 1):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
