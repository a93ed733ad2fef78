//! Fixes per data type, from its real layout in DWARF: which members to separate and what it
//! costs, or the allocation change when objects of the type share lines with each other.
//!
//! ```text
//!   struct lreg_args (32 bytes)        contended: SX (T1 writes), SY (T2 writes)
//!   0  N    │ 8 SX ◀T1 │ 16 SY ◀T2 │ 24 SXX
//!   pad:      `alignas(64)` on SY        → SY at 64, sizeof 128 (was 32)
//!   reorder:  SX, N, SXX, SY             → SY 24 bytes after SX: not a line apart (cold
//!                                          members hold only 16 bytes), so padding it is
//! ```
//!
//! Member alignment is not in DWARF (only an explicit `alignas`), so the new layout assumes
//! natural alignment (a member's size, up to 8): the sizes it prints are what a compiler
//! gives for ordinary members.

use std::collections::BTreeSet;

use crate::report::{TypeMember, TypeProfile};

/// The fix for one type of the data profile.
pub fn suggest(p: &TypeProfile, line_size: u32) -> String {
    let align = u64::from(line_size.max(64));
    let mut parts: Vec<String> = Vec::new();
    let written: Vec<&crate::report::FieldProfile> = p
        .fields
        .iter()
        .filter(|f| f.ops.iter().any(|o| o != "load"))
        .collect();
    // Members by the threads that touch them: each set is one part to keep on its own line.
    let mut groups: Vec<(BTreeSet<u32>, Vec<&str>)> = Vec::new();
    for f in &p.fields {
        let ts: BTreeSet<u32> = f.threads.iter().copied().collect();
        match groups.iter_mut().find(|g| g.0 == ts) {
            Some(g) => g.1.push(&f.member),
            None => groups.push((ts, vec![&f.member])),
        }
    }
    // Objects sharing lines explain different threads on different members by themselves
    // (each thread its own object: the per-thread struct pattern); separating members inside
    // the type is suggested only when no two objects were seen on one line.
    let shared_within =
        groups.len() >= 2 && !written.is_empty() && !p.fields.is_empty() && !p.objects_share_lines;
    if shared_within && !p.layout.is_empty() {
        parts.push(separate(p, &groups, align));
    } else if shared_within {
        let names: Vec<String> = p.fields.iter().map(|f| format!("`{}`", f.member)).collect();
        parts.push(format!(
            "Threads write different members of `{}` ({}): put each thread's members on \
             their own {align}-byte line (`alignas({align})` on the first of each).",
            p.type_name,
            names.join(", ")
        ));
    }
    // One member written by several threads at once, in one object: true sharing.
    for f in &written {
        if f.threads.len() > 1 && f.kinds.iter().any(|k| k == "true_sharing" || k == "mixed") {
            let who: Vec<String> = f.threads.iter().map(|t| format!("T{t}")).collect();
            let member = if f.member.is_empty() {
                p.type_name.clone()
            } else {
                format!("{}.{}", p.type_name, f.member)
            };
            parts.push(format!(
                "`{member}` is written by {} on the same bytes (true sharing): padding cannot \
                 help there; reduce the sharing itself (per-thread copies combined when read, \
                 fewer updates; the findings' fixes name the pattern: counter, flag, lock).",
                who.join(", ")
            ));
        }
    }
    if p.objects_share_lines && p.layout.is_empty() {
        // A scalar type: neighbouring variables or elements of an array of it.
        parts.push(format!(
            "Different threads use neighbouring `{}` values on one line (separate variables \
             or elements of one array): give each thread's data its own line — align each \
             variable (`__attribute__((aligned({align})))`), or pad each thread's part of an \
             array or heap block to a multiple of {align} bytes and align it \
             (`aligned_alloc({align}, …)`).",
            p.type_name
        ));
    } else if p.objects_share_lines {
        let rounded = p.size.div_ceil(align).max(1) * align;
        parts.push(format!(
            "Distinct objects of `{}` ({} bytes) share cache lines, each used by another \
             thread: give each its own line — heap objects with `aligned_alloc({align}, \
             {rounded})` (C++: `new` of an `alignas({align})` type), arrays and globals by \
             aligning the type or variable (`__attribute__((aligned({align})))`), which makes \
             each {rounded} bytes.",
            p.type_name, p.size
        ));
    }
    parts.join(" ")
}

/// Natural alignment assumed for a member of `size` bytes.
fn natural(size: u64) -> u64 {
    match size {
        0..=1 => 1,
        2..=3 => 2,
        4..=7 => 4,
        _ => 8,
    }
}

/// sizeof the type laid out in `order`, with `aligned` members at `align`.
fn layout_size(order: &[&TypeMember], aligned: &BTreeSet<&str>, align: u64) -> u64 {
    let mut at = 0u64;
    let mut max = 1u64;
    for m in order {
        let a = if aligned.contains(m.name.as_str()) {
            align
        } else {
            natural(m.size)
        };
        max = max.max(a);
        at = at.div_ceil(a) * a + m.size;
    }
    at.div_ceil(max) * max
}

/// The top-level layout member holding member path `member` (`in[2].hi` → `in`).
fn top<'a>(layout: &'a [TypeMember], member: &str, offset: u64) -> Option<&'a TypeMember> {
    let head = member.split(['.', '[']).next().filter(|h| !h.is_empty());
    layout
        .iter()
        .find(|m| Some(m.name.as_str()) == head)
        .or_else(|| {
            layout
                .iter()
                .find(|m| offset >= m.offset && offset - m.offset < m.size.max(1))
        })
}

/// Padding and reordering that put each thread group's members on their own line.
fn separate(p: &TypeProfile, groups: &[(BTreeSet<u32>, Vec<&str>)], align: u64) -> String {
    // Top-level members of each group, in layout order.
    let mut group_members: Vec<Vec<&TypeMember>> = Vec::new();
    for g in groups {
        let mut ms: Vec<&TypeMember> = Vec::new();
        for name in &g.1 {
            let off = p
                .fields
                .iter()
                .find(|f| f.member == *name)
                .map_or(0, |f| f.offset);
            if let Some(m) = top(&p.layout, name, off) {
                if !ms.iter().any(|x| x.name == m.name) {
                    ms.push(m);
                }
            }
        }
        ms.sort_by_key(|m| m.offset);
        group_members.push(ms);
    }
    group_members.retain(|g| !g.is_empty());
    group_members.sort_by_key(|g| g[0].offset);
    let hot: BTreeSet<&str> = group_members
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    let described: Vec<String> = groups
        .iter()
        .map(|g| {
            let who: Vec<String> = g.0.iter().map(|t| format!("T{t}")).collect();
            let names: Vec<String> = g.1.iter().map(|n| format!("`{n}`")).collect();
            format!("{} ({})", names.join(", "), who.join(", "))
        })
        .collect();
    let mut text = format!(
        "Threads use different members of `{}` ({} bytes): {}.",
        p.type_name,
        p.size,
        described.join("; ")
    );
    if group_members.len() < 2 {
        return text;
    }
    // Pad: align the first member of every group after the first.
    let aligned: BTreeSet<&str> = group_members[1..]
        .iter()
        .map(|g| g[0].name.as_str())
        .collect();
    let order: Vec<&TypeMember> = p.layout.iter().collect();
    let padded = layout_size(&order, &aligned, align);
    let names: Vec<String> = aligned.iter().map(|n| format!("`{n}`")).collect();
    text.push_str(&format!(
        " Pad: `alignas({align})` (C: `__attribute__((aligned({align})))`) on {} puts each \
         part on its own line; sizeof `{}` becomes {padded} (now {}), and objects must be \
         allocated {align}-aligned.",
        names.join(", "),
        p.type_name,
        p.size
    ));
    // Reorder: the cold members between the groups, if they fill a line.
    let cold: Vec<&TypeMember> = p
        .layout
        .iter()
        .filter(|m| !hot.contains(m.name.as_str()))
        .collect();
    let cold_bytes: u64 = cold.iter().map(|m| m.size).sum();
    let gaps = (group_members.len() - 1) as u64;
    let needed: u64 = group_members[..group_members.len() - 1]
        .iter()
        .map(|g| align.saturating_sub(g.iter().map(|m| m.size).sum::<u64>()))
        .sum();
    if gaps == 1 && cold_bytes >= needed && needed > 0 {
        let mut order: Vec<&TypeMember> = group_members[0].clone();
        order.extend(&cold);
        order.extend(&group_members[1]);
        let names: Vec<&str> = order.iter().map(|m| m.name.as_str()).collect();
        text.push_str(&format!(
            " Or reorder, with no growth: {} keeps the parts a line apart in {} bytes.",
            names.join(", "),
            layout_size(&order, &BTreeSet::new(), align)
        ));
    } else if needed > 0 {
        text.push_str(&format!(
            " Reordering alone cannot separate them: the other members hold {cold_bytes} \
             bytes, {needed} are needed between the parts."
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::FieldProfile;

    fn member(name: &str, offset: u64, size: u64) -> TypeMember {
        TypeMember {
            name: name.into(),
            offset,
            size,
            type_name: "long int".into(),
        }
    }

    fn field(member: &str, offset: u64, t: &[u32], kind: &str) -> FieldProfile {
        FieldProfile {
            member: member.into(),
            offset,
            events: 100,
            ops: vec!["rmw".into()],
            threads: t.to_vec(),
            kinds: vec![kind.into()],
        }
    }

    fn profile(size: u64, layout: Vec<TypeMember>, fields: Vec<FieldProfile>) -> TypeProfile {
        TypeProfile {
            type_name: "struct lreg_args".into(),
            size,
            events: 200,
            share: 1.0,
            lines: 1,
            kinds: vec!["false_sharing".into()],
            threads: vec![1, 2],
            fields,
            sources: vec![],
            objects_share_lines: false,
            layout,
            fix: String::new(),
        }
    }

    #[test]
    fn padding_grows_the_type_and_reordering_is_offered_when_cold_members_fill_a_line() {
        // Two hot longs and only 16 cold bytes: padding, not reordering.
        let p = profile(
            32,
            vec![
                member("N", 0, 8),
                member("SX", 8, 8),
                member("SY", 16, 8),
                member("SXX", 24, 8),
            ],
            vec![
                field("SX", 8, &[1], "false_sharing"),
                field("SY", 16, &[2], "false_sharing"),
            ],
        );
        let fix = suggest(&p, 64);
        assert!(fix.contains("on `SY`"), "{fix}");
        assert!(
            fix.contains("sizeof `struct lreg_args` becomes 128 (now 32)"),
            "{fix}"
        );
        assert!(fix.contains("Reordering alone cannot"), "{fix}");
        // A 64-byte cold array between them makes reordering enough.
        let p = profile(
            88,
            vec![member("a", 0, 8), member("b", 8, 8), member("buf", 16, 72)],
            vec![
                field("a", 0, &[1], "false_sharing"),
                field("b", 8, &[2], "false_sharing"),
            ],
        );
        let fix = suggest(&p, 64);
        assert!(
            fix.contains("Or reorder, with no growth: a, buf, b"),
            "{fix}"
        );
    }

    #[test]
    fn objects_sharing_lines_get_aligned_allocation_and_true_sharing_is_named() {
        let mut p = profile(
            24,
            vec![
                member("hits", 0, 8),
                member("misses", 8, 8),
                member("pad", 16, 8),
            ],
            vec![field("misses", 8, &[1, 2], "false_sharing")],
        );
        p.objects_share_lines = true;
        let fix = suggest(&p, 64);
        assert!(fix.contains("aligned_alloc(64, 64)"), "{fix}");
        assert!(!fix.contains("padding cannot help"), "{fix}");
        let p = profile(
            8,
            vec![member("n", 0, 8)],
            vec![field("n", 0, &[1, 2], "true_sharing")],
        );
        assert!(suggest(&p, 64).contains("padding cannot help"));
    }
}
