//! One fix suggestion per finding, from what the report already knows: the kind, each
//! source's op, offsets and threads, and the DWARF names of the data.
//!
//! False sharing is removed by separating the data the threads touch (padding / alignment to
//! the line size, 128 where the adjacent-line prefetcher pairs lines). True sharing cannot be
//! padded away: the suggestion names the pattern (lock word, counter updated by everyone, flag
//! re-written by everyone, one writer and readers) and its usual remedy.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::findings::{Kind, Op};
use crate::report::{Finding, Source};

/// The suggestion for `f` on lines of `line_size` bytes.
pub fn suggest(f: &Finding, line_size: u32) -> String {
    match f.kind {
        Kind::FalseSharing => false_sharing(f, line_size),
        Kind::TrueSharing => true_sharing_per_variable(f, line_size),
        Kind::Mixed => mixed(f, line_size),
    }
}

/// Bytes two or more threads touch where one of them writes: the truly shared part.
pub fn true_shared_mask(sources: &[Source]) -> u128 {
    let mut out = 0u128;
    for b in 0..128u32 {
        let bit = 1u128 << b;
        let touching = sources.iter().filter(|s| s.mask() & bit != 0);
        let mut threads = BTreeSet::new();
        let mut writes = false;
        for s in touching {
            threads.extend(s.threads.iter().copied());
            writes |= s.op.writes();
        }
        if threads.len() >= 2 && writes {
            out |= bit;
        }
    }
    out
}

/// Splits the line into its truly shared bytes and the rest and suggests for each.
fn mixed(f: &Finding, line_size: u32) -> String {
    let shared = true_shared_mask(&f.sources);
    let part = |want_shared: bool| {
        let mut p = f.clone();
        p.sources
            .retain(|s| (s.mask() & shared != 0) == want_shared);
        p.data.fields = Vec::new();
        for s in &p.sources {
            for field in &s.fields {
                if !p.data.fields.contains(field) {
                    p.data.fields.push(field.clone());
                }
            }
        }
        p
    };
    let (t, fs) = (part(true), part(false));
    if t.sources.is_empty() || fs.sources.is_empty() {
        return format!(
            "True and false sharing on the same bytes. {} {}",
            true_sharing_per_variable(f, line_size),
            false_sharing(f, line_size)
        );
    }
    format!(
        "Two problems on one line. True sharing: {} False sharing: {}",
        true_sharing_per_variable(&t, line_size),
        false_sharing(&fs, line_size)
    )
}

/// The alignment to suggest and, for 64-byte lines, the adjacent-line prefetch caveat.
fn align_words(line_size: u32) -> (u32, &'static str) {
    if line_size >= 128 {
        (line_size, "")
    } else {
        (
            64,
            " Use 128 instead where adjacent-line prefetch pairs lines.",
        )
    }
}

fn quoted(names: &[String]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match q.len() {
        0 => String::new(),
        1 => q[0].clone(),
        n => format!("{} and {}", q[..n - 1].join(", "), q[n - 1]),
    }
}

/// [`quoted`], with three or more elements of one array as one range (`q.slots[26..33]`):
/// a line of eight slots is one name, not eight.
fn quoted_elements(fields: &[String]) -> String {
    let names: Vec<String> = element_groups(fields)
        .into_iter()
        .flat_map(|(name, members)| {
            if members.len() >= 3 {
                vec![name]
            } else {
                members
            }
        })
        .collect();
    quoted(&names)
}

/// `[0..8)`, `[0..8)+[24..32)`.
pub fn byte_ranges(mask: u128) -> String {
    let mut out = Vec::new();
    let mut b = 0u32;
    while b < 128 {
        if mask & (1u128 << b) != 0 {
            let start = b;
            while b < 128 && mask & (1u128 << b) != 0 {
                b += 1;
            }
            out.push(format!("[{start}..{b})"));
        } else {
            b += 1;
        }
    }
    out.join("+")
}

/// Which bytes each thread touched, `T11 [0..8), T12 [24..32)`.
/// Sources run by several threads (an analysis may merge them) would smear every thread
/// over the union of their bytes, so they count only when no single-thread source exists;
/// where none does (every thread runs the same code, `sum[id] += …`), the threads are named
/// with the bytes they touch between them (`T11, T12 within [32..48)`), not each with all.
fn per_thread_bytes(sources: &[Source]) -> String {
    let mut by_thread: BTreeMap<u32, u128> = BTreeMap::new();
    let single = sources.iter().any(|s| s.threads.len() == 1);
    for s in sources.iter().filter(|s| !single || s.threads.len() == 1) {
        for &t in &s.threads {
            *by_thread.entry(t).or_default() |= s.mask();
        }
    }
    if !single && by_thread.len() > 1 {
        let all = by_thread.values().fold(0u128, |a, m| a | m);
        let who: Vec<String> = by_thread.keys().map(|t| format!("T{t}")).collect();
        return format!("{} within {}", who.join(", "), byte_ranges(all));
    }
    by_thread
        .iter()
        .map(|(t, m)| format!("T{t} {}", byte_ranges(*m)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn false_sharing(f: &Finding, line_size: u32) -> String {
    let layout = false_sharing_layout(f, line_size);
    match openmp_region(f) {
        Some(region) => format!(
            "{layout} In the OpenMP region `{region}`: accumulate in a private variable and \
             combine once with a `reduction(…)` clause or after the loop; for an array the \
             threads split, `schedule(static)` gives each thread contiguous chunks (its own \
             lines), where `schedule(static, 1)` interleaves their elements on every line."
        ),
        None => layout,
    }
}

/// The OpenMP region a contending source runs in: gcc outlines a parallel region's body
/// into `FN._omp_fn.N`, clang into `.omp_outlined.` functions.
fn openmp_region(f: &Finding) -> Option<&str> {
    f.sources
        .iter()
        .filter_map(|s| s.function.as_deref())
        .find(|func| func.contains("._omp_fn.") || func.contains(".omp_outlined."))
}

fn false_sharing_layout(f: &Finding, line_size: u32) -> String {
    let (align, prefetch) = align_words(line_size);
    let attr = format!(
        "`__attribute__((aligned({align})))` (C11 `_Alignas({align})`, C++ `alignas({align})`)"
    );
    let who = per_thread_bytes(&f.sources);
    match f.data.kind.as_str() {
        "global" => false_sharing_global(f, align, prefetch, &attr, &who),
        "heap" if !f.data.blocks.is_empty() => false_sharing_heap(f, align, prefetch),
        "heap" => format!(
            "Threads touch different parts of one heap block ({who}). Allocate each thread's \
             object separately with `aligned_alloc({align}, size rounded up to {align})` (or \
             `posix_memalign`; C++: `new` of an `alignas({align})` type), or pad the object \
             type to {align} bytes.{prefetch}"
        ),
        "stack" => format!(
            "Threads touch different parts of a stack object ({who}). Give each thread its own \
             copy, or align and pad the shared object to {align} bytes with {attr}.{prefetch}"
        ),
        _ => format!(
            "Threads touch different bytes of one line ({who}). Put each thread's part on its \
             own line: pad or align it to {align} bytes.{prefetch}"
        ),
    }
}

/// Which bytes of which block each thread touched: `T1 [0..8) of 0x…2a0`.
fn per_thread_block_bytes(f: &Finding) -> String {
    let mut by_thread: BTreeMap<u32, u128> = BTreeMap::new();
    let single = f.sources.iter().any(|s| s.threads.len() == 1);
    if !single {
        // Each source ran in several threads: who touched which part is not known, only
        // which parts were touched.
        let threads: Vec<String> = f.threads.iter().map(|t| format!("T{t}")).collect();
        return format!("{} touch {}", threads.join(", "), f.data.fields.join(", "));
    }
    for s in f.sources.iter().filter(|s| s.threads.len() == 1) {
        for &t in &s.threads {
            *by_thread.entry(t).or_default() |= s.mask();
        }
    }
    by_thread
        .iter()
        .map(|(t, m)| {
            let parts = crate::report::build::heap_fields(&f.data.blocks, f.line_addr, 128, *m);
            format!("T{t} {}", parts.join(" and "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// False sharing on a heap line whose malloc blocks are known: inside one object, or
/// between neighbouring objects.
fn false_sharing_heap(f: &Finding, align: u32, prefetch: &str) -> String {
    let blocks = &f.data.blocks;
    let who = per_thread_block_bytes(f);
    let alloc = format!(
        "`aligned_alloc({align}, size rounded up to {align})` (or `posix_memalign`; C++: `new` \
         of an `alignas({align})` type)"
    );
    if let [b] = blocks.as_slice() {
        return format!(
            "False sharing inside one {}-byte heap block at {:#x} ({who}): one object whose \
             parts different threads write. Split it so each thread's part starts its own \
             line: pad the type so those fields are {align} bytes apart (`alignas({align})` / \
             `__attribute__((aligned({align})))` on the first field of each part) and allocate \
             it with {alloc}; or give each thread its own object.{prefetch}",
            b.size, b.addr
        );
    }
    let list: Vec<String> = blocks
        .iter()
        .map(|b| format!("{:#x} ({} bytes)", b.addr, b.size))
        .collect();
    format!(
        "{} heap blocks share this line: {} ({who}). Each thread uses its own object, but \
         malloc placed them next to each other. Allocate each with {alloc}, or pad the object \
         type to {align} bytes, so no two objects share a line.{prefetch}",
        blocks.len(),
        list.join(", ")
    )
}

fn false_sharing_global(f: &Finding, align: u32, prefetch: &str, attr: &str, who: &str) -> String {
    let objs = &f.data.objects;
    let fields = quoted_elements(&f.data.fields);
    if objs.len() >= 2 {
        let names: Vec<String> = objs.iter().map(|o| o.name.clone()).collect();
        return format!(
            "Place {} on different cache lines: declare each with {attr}, or group each \
             thread's variables in one struct aligned to {align}.{prefetch}",
            quoted(&names)
        );
    }
    let Some(obj) = objs.first() else {
        return format!(
            "Threads touch different bytes of one line in `{}` ({who}). Put each thread's part \
             on its own line: pad or align it to {align} bytes.{prefetch}",
            f.data.name
        );
    };
    let name = &obj.name;
    let is_record =
        |t: &str| t.starts_with("struct ") || t.starts_with("union ") || t.starts_with("class ");
    if let (Some(ty), Some(size)) = (&obj.element_type, obj.element_size) {
        if is_record(ty) {
            let (kw, tag) = ty.split_once(' ').unwrap_or(("struct", ty));
            let grow = if size % u64::from(align) == 0 {
                format!("Align `{ty}` ({size} bytes) to {align}")
            } else {
                format!(
                    "Pad `{ty}` ({size} bytes) to {} bytes and align it",
                    size.div_ceil(u64::from(align))
                        .saturating_mul(u64::from(align))
                )
            };
            return format!(
                "Threads update different elements of `{name}` ({fields}) that share a line. \
                 {grow} so each element starts its own line: `{kw} {tag} {{ … }} \
                 __attribute__((aligned({align})));` (C++ `{kw} alignas({align}) {tag}`).{prefetch}"
            );
        }
        return format!(
            "Threads update different elements of `{name}` ({ty}, {size} bytes each: {fields}) \
             that share a line. Give each thread's element its own line: \
             `struct {{ {ty} v; }} __attribute__((aligned({align}))) {name}[N];`, or space the \
             elements {align} bytes apart.{prefetch}"
        );
    }
    if let Some(ty) = obj.type_name.as_deref().filter(|t| is_record(t)) {
        // One writer and readers beside it (a ring's producer and consumer): "threads write
        // different fields" would send the reader looking for stores it does not make.
        if let [w] = writer_threads(f).into_iter().collect::<Vec<_>>().as_slice() {
            return format!(
                "T{w} writes fields of `{name}` ({ty}) that other threads read beside them, on \
                 one line: {fields}. Move the written fields to their own cache line with \
                 {attr} on the first of them, or split `{name}` so each thread's fields are \
                 aligned to {align}.{prefetch}"
            );
        }
        return format!(
            "Threads write different fields of `{name}` ({ty}): {fields}. Move each thread's \
             fields to their own cache line with {attr} on the first field of each group, or \
             split `{name}` into per-thread structs aligned to {align}.{prefetch}"
        );
    }
    format!(
        "Threads touch different bytes of `{name}` ({who}). Split it so each thread's part is on \
         its own line, aligned to {align}.{prefetch}"
    )
}

/// True sharing on a line holding several variables (or fields): `modified` re-written by
/// every thread next to `num_points` that they only read. One sentence per variable the
/// threads really share (its pattern and remedy, with its own name in the snippet, never
/// `if (modified, num_points != v)`), then the neighbours that merely sit on the line: they
/// false-share with it, and moving the shared variable to a line of its own ends that.
/// A line with one variable, or with no per-source field names, gets [`true_sharing`].
fn true_sharing_per_variable(f: &Finding, line_size: u32) -> String {
    if f.data.kind != "global" || f.data.fields.len() < 2 {
        return true_sharing(f, None);
    }
    let mut sentences: Vec<String> = Vec::new();
    let mut shared: Vec<String> = Vec::new();
    let mut neighbours: Vec<String> = Vec::new();
    let parts: Vec<Finding> = element_groups(&f.data.fields)
        .into_iter()
        .filter_map(|(name, members)| {
            let mut p = f.clone();
            p.sources
                .retain(|s| s.fields.iter().any(|x| members.contains(x)));
            p.data.fields = vec![name.clone()];
            p.data.name = name;
            (!p.sources.is_empty()).then_some(p)
        })
        .collect();
    // A lock word on the line that the same threads take: the line's other shared variables
    // may well be what it guards (a work index `next++` under `lock`), so their sentences
    // neither call a plain update a data race nor offer per-thread counters as the only way.
    let locks: Vec<(&str, BTreeSet<u32>)> = parts
        .iter()
        .filter(|p| true_shared_mask(&p.sources) != 0 && is_lock_word(p))
        .map(|p| (p.data.name.as_str(), writer_threads(p)))
        .filter(|(_, t)| !t.is_empty())
        .collect();
    for p in &parts {
        if true_shared_mask(&p.sources) != 0 {
            let writers = writer_threads(p);
            let guard = locks
                .iter()
                .find(|(name, t)| *name != p.data.name && t.intersection(&writers).count() >= 2)
                .map(|(name, _)| *name);
            sentences.push(true_sharing(p, guard));
            shared.push(p.data.name.clone());
        } else {
            neighbours.push(p.data.name.clone());
        }
    }
    if sentences.is_empty() {
        return true_sharing(f, None);
    }
    if !neighbours.is_empty() {
        let (align, prefetch) = align_words(line_size);
        let (verb, it) = match (neighbours.len(), shared.len()) {
            (1, 1) => ("shares", "it"),
            (1, _) => ("shares", "them"),
            (_, 1) => ("share", "it"),
            _ => ("share", "them"),
        };
        let one = if shared.len() == 1 {
            "its own cache line"
        } else {
            "cache lines of their own"
        };
        sentences.push(format!(
            "{} {verb} the line with {} and false-share{} with {it}: put {} on {one} (declare \
             with `__attribute__((aligned({align})))`, C++ `alignas({align})`, or pad \
             around {it}).{prefetch}",
            quoted(&neighbours),
            quoted(&shared),
            if verb == "shares" { "s" } else { "" },
            quoted(&shared),
        ));
    }
    sentences.join(" ")
}

/// The line's fields with the elements of one array taken together, in their first order:
/// `q.slots[18]` … `q.slots[25]` (a ring buffer's slots, producer writes and consumer reads)
/// are one variable for the remedy, `q.slots[18..25]`, not eight sentences that say the same.
/// Each group's name, and the field names it stands for.
fn element_groups(fields: &[String]) -> Vec<(String, Vec<String>)> {
    /// Fields `prefix[N]suffix` with one prefix and suffix (`key`), or one field of
    /// another form (`key` None).
    struct Group {
        key: Option<(String, String)>,
        indices: Vec<u64>,
        members: Vec<String>,
    }
    // `prefix[N]suffix` at the first index, when it is a number.
    let split = |f: &str| -> Option<((String, String), u64)> {
        let (pre, index, suf) = first_index(f)?;
        Some(((pre.to_string(), suf.to_string()), index.parse().ok()?))
    };
    let mut groups: Vec<Group> = Vec::new();
    for field in fields {
        let (key, n) = match split(field) {
            Some((k, n)) => (Some(k), Some(n)),
            None => (None, None),
        };
        match groups.iter_mut().find(|g| key.is_some() && g.key == key) {
            Some(g) => {
                g.indices.extend(n);
                g.members.push(field.clone());
            }
            None => groups.push(Group {
                key,
                indices: n.into_iter().collect(),
                members: vec![field.clone()],
            }),
        }
    }
    groups
        .into_iter()
        .map(
            |g| match (&g.key, g.indices.iter().min(), g.indices.iter().max()) {
                (Some((pre, suf)), Some(lo), Some(hi)) if g.members.len() >= 2 => {
                    (format!("{pre}[{lo}..{hi}]{suf}"), g.members)
                }
                _ => (g.members[0].clone(), g.members),
            },
        )
        .collect()
}

/// `q.slots[18..25].x` as (`q.slots`, `18..25`, `.x`): a field name split at its first index.
fn first_index(field: &str) -> Option<(&str, &str, &str)> {
    let open = field.find('[')?;
    let close = open + field[open..].find(']')?;
    Some((&field[..open], &field[open + 1..close], &field[close + 1..]))
}

/// The pattern of a truly shared line and its remedy.
/// ", taken at app.c:15 (from_a), app.c:21 (from_b)": the program's lines that called into
/// the library code contending on the line (most samples first, at most 3), or nothing.
fn taken_at(f: &Finding) -> String {
    let mut sites: BTreeMap<(String, u32, String), u64> = BTreeMap::new();
    for c in f.sources.iter().flat_map(|s| &s.called_from) {
        if let (Some(file), Some(line)) = (&c.file, c.line) {
            let base = file.rsplit('/').next().unwrap_or(file).to_string();
            let func = c.function.clone().unwrap_or_default();
            *sites.entry((base, line, func)).or_default() += c.samples;
        }
    }
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let shown: Vec<String> = sites
        .iter()
        .take(3)
        .map(|((file, line, func), _)| match func.as_str() {
            "" => format!("{file}:{line}"),
            _ => format!("{file}:{line} ({func})"),
        })
        .collect();
    if shown.is_empty() {
        String::new()
    } else {
        format!(", taken at {}", shown.join(", "))
    }
}

/// Whether `f`'s data is a lock word: its name, or a function that touches it (the library
/// frames too: a header-only spinlock's `spin_mutex::lock()` inlined into the program's
/// function is headlined at the program's line), says lock, mutex, spin, sem or futex.
fn is_lock_word(f: &Finding) -> bool {
    f.sources
        .iter()
        .flat_map(|s| {
            [s.function.as_deref(), s.symbol.as_deref()]
                .into_iter()
                .chain(s.library_frames.iter().map(|l| l.function.as_deref()))
        })
        .flatten()
        .chain(std::iter::once(f.data.name.as_str()))
        .chain(f.data.fields.iter().map(String::as_str))
        .map(str::to_ascii_lowercase)
        .any(|h| {
            ["lock", "mutex", "spin", "sem", "futex"]
                .iter()
                .any(|k| h.contains(k))
        })
}

/// Whether the source line `text` updates the variable `var` in place (`v++`, `++v`, `v--`,
/// `v += …`, `v -= …`; `var`'s last name component, so `q->head++` updates `work_queue.head`).
fn updates(text: &str, var: &str) -> bool {
    let v = var
        .rsplit(['.', '>', ']'])
        .next()
        .unwrap_or(var)
        .trim_end_matches("[*]");
    if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return false;
    }
    let t: String = text.split_whitespace().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    t.match_indices(v).any(|(i, _)| {
        let before = t[..i].chars().next_back();
        let after = &t[i + v.len()..];
        before.is_none_or(|c| !ident(c))
            && (after.starts_with("++")
                || after.starts_with("--")
                || after.starts_with("+=")
                || after.starts_with("-=")
                || t[..i].ends_with("++")
                || t[..i].ends_with("--"))
    })
}

/// The threads that store to or read-modify-write `f`'s data.
fn writer_threads(f: &Finding) -> BTreeSet<u32> {
    f.sources
        .iter()
        .filter(|s| s.op.writes())
        .flat_map(|s| s.threads.iter().copied())
        .collect()
}

/// `guard`: a lock word on the same line taken by the same threads (see
/// [`true_sharing_per_variable`]).
fn true_sharing(f: &Finding, guard: Option<&str>) -> String {
    // `label` reads in a sentence; `var` stands for the data in a code snippet.
    let (label, var) = if f.data.kind == "heap" && !f.data.blocks.is_empty() {
        let label = format!("The heap data at {}", f.data.fields.join(", "));
        (label, "x".to_string())
    } else if f.data.kind != "global" {
        let all = f.sources.iter().fold(0u128, |m, s| m | s.mask());
        let label = format!("The {} data at bytes {}", f.data.kind, byte_ranges(all));
        (label, "x".to_string())
    } else if let [field] = f.data.fields.as_slice() {
        // A group of elements (`q.slots[18..25]`, from `element_groups`): any one of them
        // in a snippet.
        let var = match first_index(field) {
            Some((pre, index, suf)) if index.contains("..") => format!("{pre}[i]{suf}"),
            _ => field.clone(),
        };
        (format!("`{field}`"), var)
    } else if f.data.fields.len() >= 2 || f.data.objects.len() >= 2 {
        // Several variables the sources do not tell apart: no one name fits a snippet.
        let names: Vec<String> = if f.data.fields.len() >= 2 {
            f.data.fields.clone()
        } else {
            f.data.objects.iter().map(|o| o.name.clone()).collect()
        };
        (
            format!("The line's data ({})", quoted(&names)),
            "x".to_string(),
        )
    } else {
        (format!("`{}`", f.data.name), f.data.name.clone())
    };
    let threads_with = |pred: &dyn Fn(&Source) -> bool| -> BTreeSet<u32> {
        f.sources
            .iter()
            .filter(|s| pred(s))
            .flat_map(|s| s.threads.iter().copied())
            .collect()
    };
    let all: BTreeSet<u32> = f
        .sources
        .iter()
        .flat_map(|s| s.threads.iter().copied())
        .collect();
    let rmw = threads_with(&|s| s.op == Op::Rmw);
    let stores = threads_with(&|s| s.op == Op::Store);
    let writers = writer_threads(f);
    let loads = threads_with(&|s| s.op == Op::Load);
    // A plain `x += 1` is a load and a store of the same bytes on the same source line.
    // (loaded bytes, stored bytes) per (file, line).
    let mut by_line: BTreeMap<(Option<&str>, u32), (u128, u128)> = BTreeMap::new();
    for s in &f.sources {
        let Some(line) = s.line else { continue };
        let e = by_line.entry((s.file.as_deref(), line)).or_default();
        match s.op {
            Op::Load => e.0 |= s.mask(),
            Op::Store => e.1 |= s.mask(),
            Op::Rmw => {}
        }
    }
    // The load of an `x++` is not always seen (store-only windows see the store alone, and
    // a timer sample may land on either): the stored line's own text says it too.
    let plain_update = by_line
        .values()
        .any(|(loaded, stored)| loaded & stored != 0)
        || f.sources
            .iter()
            .filter(|s| s.op == Op::Store)
            .any(|s| var != "x" && s.text.as_deref().is_some_and(|t| updates(t, &var)));
    let list = |set: &BTreeSet<u32>| {
        set.iter()
            .map(|t| format!("T{t}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if is_lock_word(f) && !writers.is_empty() {
        return format!(
            "{label} is a lock word contended by {}{}: reduce lock contention — finer-grained \
             locks (one per data item), per-thread batching of the protected updates, or \
             shorter critical sections; keep the lock alone on its line so the data it guards \
             does not add false sharing.",
            list(&all),
            taken_at(f)
        );
    }
    if let (Some(lock), true) = (guard, writers.len() >= 2) {
        // Whether the samples saw its load too (`x++`) or only its store is luck here: the
        // remedy is the same either way.
        return format!(
            "{label} is written by every thread ({}) next to the lock `{lock}` they take, most \
             likely under it: if it hands out work, take several items per acquisition (chunks) \
             or replace lock and counter with one atomic fetch-and-add; if it counts, keep a \
             per-thread count (each on its own cache line) and combine them at the end.",
            list(&writers)
        );
    }
    if rmw.len() >= 2 || (plain_update && writers.len() >= 2) {
        let race = if rmw.len() < 2 {
            " (a plain load and store: unless a lock serializes them, updates are lost, a data \
             race)"
        } else {
            ""
        };
        return format!(
            "{label} is a counter updated by every thread ({}){race}: keep a per-thread counter \
             (each on its own cache line) and combine them at the end, or add locally and \
             publish once every N updates; if its value hands out work, take several items at \
             a time.",
            list(&writers)
        );
    }
    if stores.len() >= 2 {
        return format!(
            "{label} is re-written by every thread ({}) even when it already holds the value: \
             write only when the value changes (test before set: `if ({var} != v) {var} = v;`).",
            list(&stores)
        );
    }
    let readers: BTreeSet<u32> = loads.difference(&writers).copied().collect();
    if writers.len() == 1 && !readers.is_empty() {
        return format!(
            "{label} is written by {} and read by {}: this is real communication — write it \
             less often (batch updates), or let readers poll less often or keep a private copy.",
            list(&writers),
            list(&readers)
        );
    }
    format!(
        "{label}: the same bytes are written and read by different threads ({}). Reduce the \
         sharing: per-thread copies combined later, or batched updates.",
        list(&all)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Data, DataObject};

    fn src(op: Op, offsets: std::ops::Range<u32>, thread: u32, line: u32) -> Source {
        Source {
            pc: 0x1000,
            module: None,
            offset: None,
            file: Some("lr.c".into()),
            line: Some(line),
            column: None,
            function: Some("worker".into()),
            symbol: None,
            inlined: vec![],
            library_frames: vec![],
            debug_info: true,
            text: None,
            op,
            offsets: offsets.collect(),
            fields: vec![],
            events: 10,
            threads: vec![thread],
            called_from: vec![],
            data_type: None,
            untyped: None,
        }
    }

    fn finding(kind: Kind, name: &str, objects: Vec<DataObject>, sources: Vec<Source>) -> Finding {
        Finding {
            kind,
            line_addr: 0x4080,
            process: None,
            rate_per_s: 5000.0,
            events: 100,
            true_events: 0,
            false_events: 0,
            share: 1.0,
            threads: vec![1, 2],
            data: Data {
                kind: "global".into(),
                name: name.into(),
                fields: vec![],
                module: None,
                vaddr: None,
                objects,
                blocks: vec![],
                types: vec![],
                type_fields: vec![],
            },
            sources,
            fix: String::new(),
            extent: None,
        }
    }

    fn obj(name: &str, ty: &str, elem: Option<(&str, u64)>) -> DataObject {
        DataObject {
            name: name.into(),
            type_name: Some(ty.into()),
            vaddr: 0x4080,
            size: 96,
            element_type: elem.map(|e| e.0.into()),
            element_size: elem.map(|e| e.1),
        }
    }

    #[test]
    fn struct_array_is_padded_to_the_next_multiple_of_the_line() {
        let f = finding(
            Kind::FalseSharing,
            "acc",
            vec![obj("acc", "struct acc[4]", Some(("struct acc", 24)))],
            vec![src(Op::Store, 0..8, 1, 42), src(Op::Store, 24..32, 2, 42)],
        );
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("Pad `struct acc` (24 bytes) to 64 bytes"),
            "{fix}"
        );
        assert!(
            fix.contains("struct acc { … } __attribute__((aligned(64)))"),
            "{fix}"
        );
        assert!(
            fix.contains("Use 128 instead where adjacent-line prefetch"),
            "{fix}"
        );
        // With 128-byte lines the 128 is the alignment itself.
        let fix = suggest(&f, 128);
        assert!(
            fix.contains("to 128 bytes") && !fix.contains("prefetch"),
            "{fix}"
        );
    }

    #[test]
    fn two_globals_are_placed_on_different_lines() {
        let f = finding(
            Kind::FalseSharing,
            "hits_a, hits_b",
            vec![
                obj("hits_a", "long int", None),
                obj("hits_b", "long int", None),
            ],
            vec![src(Op::Rmw, 0..8, 1, 40), src(Op::Rmw, 8..16, 2, 40)],
        );
        let fix = suggest(&f, 64);
        assert!(
            fix.starts_with("Place `hits_a` and `hits_b` on different cache lines"),
            "{fix}"
        );
    }

    #[test]
    fn heap_suggests_aligned_alloc_and_names_thread_bytes() {
        let mut f = finding(
            Kind::FalseSharing,
            "heap",
            vec![],
            vec![src(Op::Store, 0..8, 1, 1), src(Op::Store, 8..16, 2, 1)],
        );
        f.data.kind = "heap".into();
        let fix = suggest(&f, 64);
        assert!(fix.contains("aligned_alloc(64"), "{fix}");
        assert!(fix.contains("T1 [0..8), T2 [8..16)"), "{fix}");
    }

    #[test]
    fn false_sharing_in_an_openmp_region_suggests_a_reduction_or_chunks() {
        let mut s = src(Op::Store, 16..32, 1, 13);
        s.threads = vec![1, 2];
        s.function = Some("main._omp_fn.0".into());
        let mut f = finding(Kind::FalseSharing, "stack", vec![], vec![s]);
        f.data.kind = "stack".into();
        let fix = suggest(&f, 64);
        assert!(
            fix.starts_with("Threads touch different parts of a stack object"),
            "{fix}"
        );
        assert!(fix.contains("OpenMP region `main._omp_fn.0`"), "{fix}");
        assert!(
            fix.contains("`reduction(…)`") && fix.contains("`schedule(static)`"),
            "{fix}"
        );
        // Code outside OpenMP regions gets no such sentence.
        f.sources[0].function = Some("worker".into());
        assert!(!suggest(&f, 64).contains("OpenMP"));
    }

    #[test]
    fn code_every_thread_runs_does_not_smear_each_thread_over_all_bytes() {
        // `sum[id] += …` from two threads: one source with both threads on [32..48).
        let mut s = src(Op::Store, 32..48, 1, 13);
        s.threads = vec![1, 2];
        let mut f = finding(Kind::FalseSharing, "stack", vec![], vec![s]);
        f.data.kind = "stack".into();
        let fix = suggest(&f, 64);
        assert!(fix.contains("(T1, T2 within [32..48))"), "{fix}");
        assert!(!fix.contains("T1 [32..48)"), "{fix}");
    }

    #[test]
    fn true_sharing_patterns() {
        // Counter: locked RMW from both threads.
        let f = finding(
            Kind::TrueSharing,
            "counter",
            vec![],
            vec![src(Op::Rmw, 0..8, 1, 66), src(Op::Rmw, 0..8, 2, 66)],
        );
        assert!(suggest(&f, 64).contains("per-thread counter"));
        // Counter as a plain load + store on one source line: also a race.
        let f = finding(
            Kind::TrueSharing,
            "total",
            vec![],
            vec![
                src(Op::Load, 0..8, 1, 70),
                src(Op::Store, 0..8, 1, 70),
                src(Op::Store, 0..8, 2, 70),
            ],
        );
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("per-thread counter") && fix.contains("data race"),
            "{fix}"
        );
        // Flag: plain stores only.
        let f = finding(
            Kind::TrueSharing,
            "done_flag",
            vec![],
            vec![src(Op::Store, 0..4, 1, 67), src(Op::Store, 0..4, 2, 67)],
        );
        assert!(suggest(&f, 64).contains("test before set"));
        // Lock word: named so.
        let f = finding(
            Kind::TrueSharing,
            "lock_word",
            vec![],
            vec![src(Op::Rmw, 0..4, 1, 45), src(Op::Rmw, 0..4, 2, 45)],
        );
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("lock word") && !fix.contains("taken at"),
            "{fix}"
        );
        // A lock taken in library code: the program's calling lines, most samples first.
        let mut f = f;
        let site = |line: u32, func: &str, samples: u64| crate::report::CalledFrom {
            ret: 0x1000,
            module: None,
            offset: None,
            file: Some("/src/app.c".into()),
            line: Some(line),
            function: Some(func.into()),
            symbol: None,
            samples,
            share: 0.5,
        };
        f.sources[0].called_from = vec![site(15, "from_a", 3), site(21, "from_b", 5)];
        f.sources[1].called_from = vec![site(15, "from_a", 4)];
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("contended by T1, T2, taken at app.c:15 (from_a), app.c:21 (from_b):"),
            "{fix}"
        );
        // A header-only spinlock inlined into the program: its library frame says "lock".
        let mut s1 = src(Op::Rmw, 0..4, 1, 45);
        s1.library_frames = vec![crate::report::Inlined {
            function: Some("tbb::spin_mutex::lock()".into()),
            file: Some("/usr/include/tbb/spin_mutex.h".into()),
            line: Some(80),
        }];
        let f = finding(
            Kind::TrueSharing,
            "guard",
            vec![],
            vec![s1.clone(), {
                let mut s2 = s1;
                s2.threads = vec![2];
                s2
            }],
        );
        assert!(suggest(&f, 64).contains("lock word"), "{}", suggest(&f, 64));
        // One writer, one reader.
        let f = finding(
            Kind::TrueSharing,
            "seq",
            vec![],
            vec![src(Op::Store, 0..8, 1, 3), src(Op::Load, 0..8, 2, 4)],
        );
        let fix = suggest(&f, 64);
        assert!(fix.contains("written by T1 and read by T2"), "{fix}");
    }

    #[test]
    fn mixed_splits_true_and_false_parts() {
        // T1 and T2 write their own `hi` fields (false) and both bump `total` (true).
        let mut a = src(Op::Store, 8..12, 1, 65);
        a.fields = vec!["cfg.in[0].hi".into()];
        let mut b = src(Op::Store, 16..20, 2, 65);
        b.fields = vec!["cfg.in[1].hi".into()];
        let mut c = src(Op::Rmw, 24..32, 1, 69);
        c.threads = vec![1, 2];
        c.fields = vec!["cfg.total".into()];
        let f = finding(
            Kind::Mixed,
            "cfg",
            vec![obj("cfg", "struct outer", None)],
            vec![a, b, c],
        );
        assert_eq!(true_shared_mask(&f.sources), 0xffu128 << 24);
        let fix = suggest(&f, 64);
        let (t, fs) = fix.split_once("False sharing:").unwrap();
        assert!(t.contains("`cfg.total` is a counter"), "{fix}");
        assert!(fs.contains("`cfg.in[0].hi` and `cfg.in[1].hi`"), "{fix}");
        assert!(!fs.contains("total"), "{fix}");
    }

    /// streamcluster's line: every thread sets `modified`, and reads `num_points` next to it.
    #[test]
    fn two_globals_on_a_truly_shared_line_get_a_sentence_each() {
        let field = |mut s: Source, name: &str| {
            s.fields = vec![name.to_string()];
            s
        };
        let mut f = finding(
            Kind::TrueSharing,
            "modified, num_points",
            vec![
                obj("modified", "bool", None),
                obj("num_points", "int", None),
            ],
            vec![
                field(src(Op::Store, 0..1, 1, 80), "modified"),
                field(src(Op::Store, 0..1, 2, 80), "modified"),
                field(src(Op::Load, 4..8, 1, 81), "num_points"),
                field(src(Op::Load, 4..8, 2, 81), "num_points"),
            ],
        );
        f.data.fields = vec!["modified".into(), "num_points".into()];
        let fix = suggest(&f, 64);
        assert!(!fix.contains("modified, num_points"), "{fix}");
        assert!(
            fix.contains("`modified` is re-written by every thread (T1, T2)")
                && fix.contains("`if (modified != v) modified = v;`"),
            "{fix}"
        );
        assert!(
            fix.contains(
                "`num_points` shares the line with `modified` and false-shares with it: put \
                 `modified` on its own cache line"
            ),
            "{fix}"
        );
        // Both written by every thread: two sentences, no neighbour.
        f.sources[2].op = Op::Store;
        f.sources[3].op = Op::Store;
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("`if (num_points != v) num_points = v;`"),
            "{fix}"
        );
        assert!(fix.contains("`if (modified != v) modified = v;`"), "{fix}");
        assert!(!fix.contains("false-share"), "{fix}");
        // Without per-source fields there is nothing to split: the line's name stays.
        for s in &mut f.sources {
            s.fields.clear();
        }
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("The line's data (`modified` and `num_points`) is re-written")
                && fix.contains("`if (x != v) x = v;`"),
            "{fix}"
        );
    }

    /// A single-producer ring: the producer writes slots the consumer then reads, a line of
    /// eight slots at a time. One sentence for the slots, not one per slot and a ninth that
    /// calls the last slot a neighbour of the others.
    #[test]
    fn elements_of_one_array_on_a_truly_shared_line_are_one_variable() {
        let field = |mut s: Source, name: &str| {
            s.fields = vec![name.to_string()];
            s
        };
        let mut sources = Vec::new();
        let mut fields = Vec::new();
        for i in 0..8u32 {
            let name = format!("q.slots[{}]", 18 + i);
            sources.push(field(src(Op::Store, i * 8..i * 8 + 8, 1, 15), &name));
            if i < 7 {
                sources.push(field(src(Op::Load, i * 8..i * 8 + 8, 2, 25), &name));
            }
            fields.push(name);
        }
        let mut f = finding(
            Kind::TrueSharing,
            "q",
            vec![obj("q", "struct ring", None)],
            sources,
        );
        f.data.fields = fields;
        let fix = suggest(&f, 64);
        assert!(
            fix.starts_with(
                "`q.slots[18..25]` is written by T1 and read by T2: this is real communication"
            ),
            "{fix}"
        );
        assert_eq!(fix.matches("real communication").count(), 1, "{fix}");
        assert!(!fix.contains("false-share"), "{fix}");
        // Every thread re-writes the slots: the snippet names one element.
        for s in &mut f.sources {
            s.op = Op::Store;
        }
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("`if (q.slots[i] != v) q.slots[i] = v;`"),
            "{fix}"
        );
        // Read-write false sharing between the slots (the consumer reads one while the
        // producer writes the next): one writer, named as such, and the slots as one range.
        for s in &mut f.sources {
            s.op = if s.threads == [1] {
                Op::Store
            } else {
                Op::Load
            };
        }
        f.kind = Kind::FalseSharing;
        let fix = suggest(&f, 64);
        assert!(
            fix.starts_with(
                "T1 writes fields of `q` (struct ring) that other threads read beside them, on \
                 one line: `q.slots[18..25]`."
            ),
            "{fix}"
        );
        // Fields that are not elements of one array keep a sentence each.
        assert_eq!(
            element_groups(&["a".into(), "b[1]".into(), "c[2].x".into(), "c[4].x".into()]),
            vec![
                ("a".to_string(), vec!["a".to_string()]),
                ("b[1]".to_string(), vec!["b[1]".to_string()]),
                (
                    "c[2..4].x".to_string(),
                    vec!["c[2].x".to_string(), "c[4].x".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn a_counter_next_to_the_lock_its_threads_take_is_not_called_a_race() {
        let field = |mut s: Source, name: &str, func: &str| {
            s.fields = vec![name.to_string()];
            s.function = Some(func.into());
            s
        };
        // Phoenix-style work distribution: `i = row_num++` between lock and unlock.
        let mut f = finding(
            Kind::TrueSharing,
            "row_lock, row_num",
            vec![
                obj("row_lock", "pthread_mutex_t", None),
                obj("row_num", "int", None),
            ],
            vec![
                field(
                    src(Op::Rmw, 0..4, 1, 48),
                    "row_lock",
                    "___pthread_mutex_lock",
                ),
                field(
                    src(Op::Rmw, 0..4, 2, 48),
                    "row_lock",
                    "___pthread_mutex_lock",
                ),
                field(src(Op::Load, 40..44, 1, 25), "row_num", "calc"),
                field(src(Op::Store, 40..44, 1, 25), "row_num", "calc"),
                field(src(Op::Store, 40..44, 2, 25), "row_num", "calc"),
            ],
        );
        f.data.fields = vec!["row_lock".into(), "row_num".into()];
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("`row_lock` is a lock word contended by T1, T2"),
            "{fix}"
        );
        assert!(
            fix.contains(
                "`row_num` is written by every thread (T1, T2) next to the lock `row_lock`"
            ) && fix.contains("atomic fetch-and-add")
                && !fix.contains("data race"),
            "{fix}"
        );
        // Its load unsampled (only the stores seen): the same sentence, not "test before set".
        let lock_and_stores = {
            let mut g = f.clone();
            g.sources.remove(2);
            g
        };
        let fix = suggest(&lock_and_stores, 64);
        assert!(
            fix.contains("next to the lock `row_lock`") && !fix.contains("test before set"),
            "{fix}"
        );
        // The lock taken by other threads than the counter's writers guards nothing here.
        for s in &mut f.sources[..2] {
            s.threads = vec![s.threads[0] + 10];
        }
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("data race") && !fix.contains("next to the lock"),
            "{fix}"
        );
    }

    #[test]
    fn an_increment_seen_by_its_store_alone_is_a_counter() {
        // `int d = next_doc++;` under a lock on another line: only its stores were seen.
        let mut a = src(Op::Store, 8..12, 1, 18);
        a.text = Some("    int d = next_doc++;".into());
        let mut b = a.clone();
        b.threads = vec![2];
        let f = finding(Kind::TrueSharing, "next_doc", vec![], vec![a, b]);
        let fix = suggest(&f, 64);
        assert!(
            fix.contains("`next_doc` is a counter updated by every thread (T1, T2)")
                && fix.contains("unless a lock serializes them")
                && !fix.contains("test before set"),
            "{fix}"
        );
        assert!(updates("q->head++;", "work_queue.head"));
        assert!(updates("++count;", "count"));
        assert!(updates("total += n;", "total"));
        assert!(!updates("flag = 1; other++;", "flag"));
        assert!(!updates("my_count++;", "count"));
    }

    #[test]
    fn byte_ranges_merge_runs() {
        assert_eq!(byte_ranges(0xff | (0xff << 24)), "[0..8)+[24..32)");
        assert_eq!(byte_ranges(1 << 127), "[127..128)");
        assert_eq!(byte_ranges(0), "");
    }
}
