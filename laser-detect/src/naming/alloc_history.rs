//! DProf's data flow view for one allocation site: which code, in which thread and on which
//! CPU, touched the words of a freshly allocated object, in order, from its allocation to its
//! free. The live half (arming watchpoints when the recorder announces an object) is the
//! CLI's; here are the pure parts: from `FILE:LINE` to the call sites whose return addresses
//! the recorder looks for, and the history itself.
//!
//! Resolving a type ([`type_size`]): its DWARF size; allocations of exactly that many bytes
//! are taken as objects of the type (a rule the history makes checkable: each object says
//! where it was allocated). Arrays of the type and other types of the same size are not told
//! apart; DWARF access typing (which sites store the result into a `TYPE *`) would narrow it.
//!
//! Resolving a site: the line-table rows of `FILE:LINE` give address ranges; the call
//! instructions in them give return addresses. An allocation whose stack holds one of them
//! was made by that line, directly (malloc called there) or through a wrapper.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

use crate::decode::code::ElfImage;

/// Return addresses (ELF vaddrs) of the call instructions on `file:line` in `image`, whose
/// DWARF is `dwarf`. `file` matches a row's path by suffix (`wrap.c`, `src/wrap.c`).
pub fn call_sites_at_line<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    image: &ElfImage,
    file: &str,
    line: u64,
) -> Vec<u64> {
    let mut ranges = Vec::new();
    let mut units = dwarf.units();
    while let Ok(Some(h)) = units.next() {
        let Ok(unit) = dwarf.unit(h) else { continue };
        let Some(prog) = unit.line_program.clone() else {
            continue;
        };
        let mut rows = prog.rows();
        let mut open: Option<u64> = None;
        while let Ok(Some((header, row))) = rows.next_row() {
            if let Some(start) = open.take() {
                ranges.push((start, row.address()));
            }
            if row.end_sequence() || row.line().map(|l| l.get()) != Some(line) {
                continue;
            }
            let name = row.file(header).and_then(|f| {
                let n = dwarf.attr_string(&unit, f.path_name()).ok()?;
                Some(n.to_string_lossy().ok()?.into_owned())
            });
            if name.is_some_and(|n| n == file || n.ends_with(&format!("/{file}"))) {
                open = Some(row.address());
            }
        }
    }
    let mut out = Vec::new();
    for (start, end) in ranges {
        if end <= start || end - start > 1 << 16 {
            continue;
        }
        let mut code = vec![0u8; (end - start) as usize];
        let n = image.read_vaddr(start, &mut code);
        let mut dec = Decoder::with_ip(64, &code[..n], start, DecoderOptions::NONE);
        for i in dec.iter() {
            if i.flow_control() == FlowControl::Call
                || i.flow_control() == FlowControl::IndirectCall
            {
                out.push(i.next_ip());
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `sizeof(name)` from DWARF: the byte size of a struct, class or union named `name` (with or
/// without a `struct `/`class `/`union ` prefix), or of what a typedef of that name stands
/// for. The first complete definition wins.
pub fn type_size<R: gimli::Reader>(dwarf: &gimli::Dwarf<R>, name: &str) -> Option<u64> {
    let bare = ["struct ", "class ", "union "]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let mut units = dwarf.units();
    while let Ok(Some(h)) = units.next() {
        let Ok(unit) = dwarf.unit(h) else { continue };
        let mut entries = unit.entries();
        while let Ok(Some(e)) = entries.next_dfs() {
            let tag = e.tag();
            let aggregate = matches!(
                tag,
                gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type
            );
            if !aggregate && tag != gimli::DW_TAG_typedef {
                continue;
            }
            let named = e
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok())
                .and_then(|s| s.to_string_lossy().ok().map(|s| s == bare))
                .unwrap_or(false);
            if !named {
                continue;
            }
            if aggregate {
                if let Some(n) = e.attr_value(gimli::DW_AT_byte_size) {
                    if let Some(n) = n.udata_value() {
                        return Some(n);
                    }
                }
                continue; // a declaration: keep looking for the definition
            }
            // A typedef: the size of what it names (one level, then any further typedefs).
            if let Some(gimli::AttributeValue::UnitRef(off)) = e.attr_value(gimli::DW_AT_type) {
                let mut off = off;
                for _ in 0..8 {
                    let Ok(t) = unit.entry(off) else { break };
                    if let Some(n) = t
                        .attr_value(gimli::DW_AT_byte_size)
                        .and_then(|v| v.udata_value())
                    {
                        return Some(n);
                    }
                    match t.attr_value(gimli::DW_AT_type) {
                        Some(gimli::AttributeValue::UnitRef(o)) => off = o,
                        _ => break,
                    }
                }
            }
        }
    }
    None
}

/// How an instruction touched memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    Read,
    Write,
    ReadWrite,
}

impl Touch {
    pub fn as_str(self) -> &'static str {
        match self {
            Touch::Read => "read",
            Touch::Write => "write",
            Touch::ReadWrite => "read+write",
        }
    }
}

/// How the instruction that ends at `ip` in `code` (the function's bytes from ELF vaddr
/// `start`) touches memory: a watchpoint's sample IP is the instruction after the access, so
/// the function is decoded from its start to find the instruction before it.
pub fn touch_before(code: &[u8], start: u64, ip: u64) -> Option<Touch> {
    let mut dec = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut info = iced_x86::InstructionInfoFactory::new();
    for i in dec.iter() {
        if i.next_ip() == ip {
            let (mut r, mut w) = (false, false);
            for m in info.info(&i).used_memory() {
                use iced_x86::OpAccess::*;
                match m.access() {
                    Read | CondRead => r = true,
                    Write | CondWrite => w = true,
                    ReadWrite | ReadCondWrite => (r, w) = (true, true),
                    _ => {}
                }
            }
            return match (r, w) {
                (true, true) => Some(Touch::ReadWrite),
                (false, true) => Some(Touch::Write),
                (true, false) => Some(Touch::Read),
                _ => None,
            };
        }
        if i.next_ip() > ip {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    #[test]
    fn the_instruction_before_a_trap_ip_says_read_or_write() {
        let mut a = CodeAssembler::new(64).unwrap();
        a.mov(rax, qword_ptr(rdi)).unwrap(); // 0x1000, 3 bytes
        a.mov(qword_ptr(rdi + 8), rax).unwrap(); // 0x1003, 4 bytes
        a.add(qword_ptr(rdi), 1).unwrap(); // 0x1007
        a.ret().unwrap();
        let code = a.assemble(0x1000).unwrap();
        assert_eq!(touch_before(&code, 0x1000, 0x1003), Some(Touch::Read));
        assert_eq!(touch_before(&code, 0x1000, 0x1007), Some(Touch::Write));
        let after_add = 0x1007 + 4;
        assert_eq!(
            touch_before(&code, 0x1000, after_add),
            Some(Touch::ReadWrite)
        );
        assert_eq!(
            touch_before(&code, 0x1000, 0x1005),
            None,
            "not an instruction end"
        );
    }
}
