#!/usr/bin/env python3
"""Timer skid on the asm-tests: where soft samples land relative to the contending access.

    benchmarks/skid/asm_skid.py RECDIR [LASER]

RECDIR holds one recording per asm-test, RECDIR/<name>.laser, made with
`ASMTEST_SECONDS=1.5 laser record -o RECDIR/<name>.laser -- asm-tests/build/<name>`.
For the single-access loops (shape "min": `label: access; add %r15,%r14; inc %rbx;
dec %r13; jnz loop`) it counts each soft sample by its distance in instructions from the
contending access (0 = the access itself) and prints the histogram over all of them.
"""
import json, re, subprocess, collections, os, sys
RECDIR = sys.argv[1]
LASER = sys.argv[2] if len(sys.argv) > 2 else "target/x86_64-unknown-linux-gnu/release/laser"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
m = json.load(open(os.path.join(ROOT, 'asm-tests/manifest.json')))
hist = collections.Counter(); total = 0; cases = 0
for e in m['tests']:
    if e['shape'] != ['min'] or not e['contending'] or len(e['contending']) != e['threads']:
        continue
    rec = os.path.join(RECDIR, e["name"] + ".laser")
    if not os.path.exists(rec): continue
    binary = os.path.join(ROOT, e['binary']) if not e['binary'].startswith('/') else e['binary']
    dis = subprocess.run(['objdump', '-d', '--no-show-raw-insn', binary], capture_output=True, text=True).stdout
    funcs = collections.defaultdict(list); cur = None
    for line in dis.splitlines():
        mm = re.match(r'^([0-9a-f]+) <([^>]+)>:', line)
        if mm: cur = mm.group(2); continue
        mm = re.match(r'^\s+([0-9a-f]+):\s+(.*)$', line)
        if mm and cur: funcs[cur].append((int(mm.group(1), 16), mm.group(2)))
    # the loop: from the access label to the jnz back, and the loop head before it
    labels = [c['label'] for c in e['contending']]
    if any(l.endswith('_load') for l in labels) or any(len(funcs[l]) < 5 for l in labels): continue
    dump = subprocess.run([LASER, 'dump', rec], capture_output=True, text=True).stdout
    mp = [l for l in dump.splitlines() if l.startswith('Mmap(') and 'prot: 5' in l and binary in l]
    if not mp: continue
    base = int(re.search(r'addr: (\d+)', mp[0]).group(1)); pgoff = int(re.search(r'pgoff: (\d+)', mp[0]).group(1))
    pos = {}
    for l in labels:
        body = funcs[l]
        jnz = next(i for i, (_, t) in enumerate(body) if t.startswith('jne') or t.startswith('jnz'))
        for i, (v, _) in enumerate(body[:jnz + 1]): pos[v] = i
        head = int(body[jnz][1].split()[1], 16)  # the loop head: first insn after the jump
        pos[head] = ('head',)
    cases += 1
    for line in dump.splitlines():
        if line.startswith('Sample(Sample { backend: Soft'):
            ip = int(re.search(r'ip: (\d+)', line).group(1)) - base + pgoff
            if ip in pos:
                hist[pos[ip] if isinstance(pos[ip], int) else 'head (after jnz)'] += 1; total += 1
print(f"{cases} cases, {total} samples in their loops")
for k in [0, 1, 2, 3, 4, 'head (after jnz)']:
    print(f"  {k!s:18s} {hist[k]:6d}  {100*hist[k]/max(total,1):5.1f}%")
