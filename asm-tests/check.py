#!/usr/bin/env python3
"""Run asm-tests and check their final memory against asm-tests/manifest.json.

    python3 asm-tests/check.py [--seconds 0.02 | --iters N] [--jobs 2] [NAME ...]

Prints one line per failure, then `N passed, N failed` (and skips, if any) on a line by
itself; exits 1 on any failure. The parsing and rule evaluation are also imported by
scripts/accuracy and by the repair engine's tests (`check_output(entry, text)`).
"""

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MANIFEST = os.path.join(HERE, "manifest.json")
SKIP_EXIT = 77


class OutputError(Exception):
    pass


def initial_byte(k):
    return (k * 37 + 11) & 0xFF


def parse_output(text, size):
    """(iteration counts, final memory bytes) from a harness's stdout."""
    iters = None
    mem = bytearray(size)
    seen = set()
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "iters":
            iters = [int(x) for x in f[1:]]
        elif f[0] == "mem" and len(f) >= 2 and f[1].startswith("+"):
            base = int(f[1][1:], 16)
            for i, w in enumerate(f[2:]):
                off = base + 8 * i
                if off + 8 > size:
                    raise OutputError(f"word at +{off:#x} is outside the {size}-byte area")
                mem[off:off + 8] = int(w, 16).to_bytes(8, "little")
                seen.add(off)
    if iters is None:
        raise OutputError("no 'iters' line in the output")
    missing = [o for o in range(0, size, 8) if o not in seen]
    if missing:
        raise OutputError(f"{len(missing)} words missing from the output (first +{missing[0]:#x})")
    return iters, bytes(mem)


def evaluate(expr, env):
    # The manifest is ours and expressions are arithmetic over n0..n7.
    return eval(expr, {"__builtins__": {}, "min": min, "max": max}, env)  # noqa: S307


def check_memory(entry, iters, mem):
    """List of human-readable mismatches (empty: the final memory is what the manifest says)."""
    errors = []
    if len(iters) != entry["threads"]:
        return [f"{len(iters)} iteration counts for {entry['threads']} threads"]
    if any(n < 1 for n in iters):
        return [f"a thread ran no iteration: {iters}"]
    env = {f"n{t}": n for t, n in enumerate(iters)}
    covered = set()
    for cell in entry["final_memory"]:
        off, size = cell["offset"], cell["size"]
        covered |= set(range(off, off + size))
        got = int.from_bytes(mem[off:off + size], "little")
        rule = cell["rule"]
        if rule == "exact":
            want = evaluate(cell["value"], env)
            ok = got == want
            desc = f"{want:#x}"
        elif rule == "one_of":
            wants = [evaluate(v, env) for v in cell["values"]]
            ok = got in wants
            desc = "one of " + ", ".join(f"{w:#x}" for w in wants)
        elif rule == "range":
            lo, hi = evaluate(cell["lo"], env), evaluate(cell["hi"], env)
            ok = lo <= got <= hi
            desc = f"in [{lo:#x}, {hi:#x}]"
        else:
            errors.append(f"unknown rule {rule!r} at +{off:#x}")
            continue
        if not ok:
            errors.append(f"+{off:#x}/{size}: got {got:#x}, want {desc}")
    for k in range(len(mem)):
        if k not in covered and mem[k] != initial_byte(k):
            errors.append(f"+{k:#x}: untouched byte changed to {mem[k]:#04x} "
                          f"(initial {initial_byte(k):#04x})")
            break
    return errors


def check_output(entry, text, size):
    iters, mem = parse_output(text, size)
    return check_memory(entry, iters, mem)


def run_one(entry, size, env, timeout):
    path = os.path.join(ROOT, entry["binary"])
    try:
        p = subprocess.run([path], env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return "fail", [f"{entry['binary']} not built (run scripts/build-asm-tests)"]
    except subprocess.TimeoutExpired:
        return "fail", [f"did not finish in {timeout} s"]
    if p.returncode == SKIP_EXIT:
        return "skip", [p.stdout.strip()]
    if p.returncode != 0:
        return "fail", [f"exit status {p.returncode}: {p.stderr.strip()[:200]}"]
    try:
        errs = check_output(entry, p.stdout, size)
    except OutputError as e:
        return "fail", [str(e)]
    return ("fail" if errs else "pass"), errs


def check_dwarf(entry):
    """The manifest's file:line of each contending label is what the binary's DWARF says, so a
    report naming that line names that instruction."""
    path = os.path.join(ROOT, entry["binary"])
    labels = {c["label"]: c for c in entry["contending"]}
    if not labels:
        return []
    try:
        nm = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True,
                            check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return [f"nm failed: {e}"]
    addrs = {}
    for line in nm.splitlines():
        f = line.split()
        if len(f) == 3 and f[2] in labels:
            addrs[f[2]] = f[0]
    missing = sorted(set(labels) - set(addrs))
    if missing:
        return [f"labels missing from the symbol table: {' '.join(missing)}"]
    names = sorted(addrs)
    try:
        out = subprocess.run(["addr2line", "-e", path] + [addrs[n] for n in names],
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        return [f"addr2line failed: {e}"]
    errors = []
    for name, where in zip(names, out):
        want = f"{labels[name]['file']}:{labels[name]['line']}"
        got = os.path.basename(where.split(" ")[0])
        if got != want:
            errors.append(f"{name}: DWARF says {got}, manifest says {want}")
    return errors


def self_test(doc):
    """The checker must reject a corrupted result: flip a written byte and an untouched one."""
    entry = next(e for e in doc["tests"] if e["name"] == "xadd_true_s8")
    size = doc["shared_size"]
    mem = bytearray(initial_byte(k) for k in range(size))
    init = int.from_bytes(mem[0:8], "little")
    good = mem[:]
    good[0:8] = ((init + 3 * 10 + 5 * 7) & (2**64 - 1)).to_bytes(8, "little")
    problems = []
    if check_memory(entry, [10, 7], bytes(good)):
        problems.append("a correct xadd_true_s8 result was rejected")
    lost = good[:]
    lost[0] ^= 1
    if not check_memory(entry, [10, 7], bytes(lost)):
        problems.append("a lost atomic update was accepted")
    stray = good[:]
    stray[200] ^= 0x40
    if not check_memory(entry, [10, 7], bytes(stray)):
        problems.append("a stray write outside the cells was accepted")
    return problems


def main():
    ap = argparse.ArgumentParser(description="run asm-tests and check their final memory")
    ap.add_argument("--seconds", type=float, default=0.02, help="run bound per test")
    ap.add_argument("--iters", type=int, help="exact iterations per thread instead of seconds")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--dwarf", action="store_true",
                    help="only check each contending label's DWARF file:line against the manifest")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    with open(MANIFEST) as f:
        doc = json.load(f)
    size = doc["shared_size"]
    tests = [e for e in doc["tests"] if not args.names or e["name"] in args.names]
    if args.names and len(tests) != len(args.names):
        known = {e["name"] for e in doc["tests"]}
        print("unknown tests: " + " ".join(n for n in args.names if n not in known))
        return 2
    env = dict(os.environ)
    env.pop("ASMTEST_ITERS", None)
    if args.iters:
        env["ASMTEST_ITERS"] = str(args.iters)
        env.pop("ASMTEST_SECONDS", None)
    else:
        env["ASMTEST_SECONDS"] = str(args.seconds)

    if args.dwarf:
        bad = 0
        with ThreadPoolExecutor(max_workers=4) as pool:
            found = list(pool.map(lambda e: (e, check_dwarf(e)), tests))
        for e, msgs in found:
            for m in msgs:
                bad += 1
                print(f"FAIL {e['name']}: {m}")
        print(f"{len(tests)} tests' labels checked against DWARF, {bad} mismatches")
        return 1 if bad else 0

    passed = failed = skipped = 0
    problems = self_test(doc)
    for p in problems:
        print(f"FAIL checker self-test: {p}")
    failed += len(problems)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = pool.map(lambda e: (e, run_one(e, size, env, args.timeout)), tests)
        for entry, (status, msgs) in results:
            if status == "pass":
                passed += 1
            elif status == "skip":
                skipped += 1
                print(f"SKIP {entry['name']}: {' '.join(msgs)}")
            else:
                failed += 1
                for m in msgs[:4]:
                    print(f"FAIL {entry['name']}: {m}")
    tail = f" ({skipped} skipped)" if skipped else ""
    print(f"{passed} passed, {failed} failed{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
