//! The data type and member of one contended access, from DWARF: for the instruction at a PC,
//! the variable whose location there is the memory operand's base register (or the stack
//! slot or global the operand addresses), its pointer type, and the member at the access
//! offset. When no variable covers the register, `naming::reg_track` walks back
//! through the function. This is Linux perf's data-type profiling (`perf report -s
//! type,typeoff`), done at report time for the few contended PCs only, never per sample.
//!
//! ```text
//!   heap line 0x55d0c2a4e2c0            access at worker+0x2c: mov %rdx,0x8(%rax)
//!   ┌─────────────┬─────────────┐       rax ← -0x18(%rbp), the slot of `args`
//!   │ args->SX    │ args->SY    │       `args` is `struct lreg_args *`
//!   └─────────────┴─────────────┘       member at 8 of struct lreg_args: SX
//! ```
//!
//! C++ base classes and anonymous members are transparent (a member of a base is named as
//! the class's own), an access through a pointer into an array of structs is typed by the
//! element (`per[*].hits`), typedefs name anonymous structs, and a library type reached first
//! (`std::__atomic_base<int>`'s `this`, inlined from `<atomic>`) gives way to the program's
//! type around it (`struct counters`, member `hits`).

use std::sync::Arc;

use gimli::{BaseAddresses, CfaRule, EhFrame, UnwindContext, UnwindSection};
use iced_x86::{Decoder, DecoderOptions, Instruction};
use object::{Object, ObjectSection, SectionKind};

use crate::naming::dataname::DataIndex;
use crate::naming::debug_module::{ElfSymbol, SymKind};
use crate::naming::dwarf_types::{Dwarf, TypeId, TypeNode, TypeTable, Unit};
use crate::naming::reg_track::{self, How, Oracle, Place, PlaceName};
use crate::naming::scope_vars::{self, DwReg, FrameBase, FunctionVars, LocLists, VarLoc, OMP_DATA};

/// The type and member an access touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypedAccess {
    /// C-style: `struct lreg_args`, `class Counter`, a typedef's name for an anonymous struct,
    /// `long int` for an array of longs.
    pub type_name: String,
    /// `sizeof` the type, from DWARF.
    pub type_size: u64,
    /// Member path inside the type (`SX`, `in[2].hi`, `counts[*]`); empty for the whole
    /// object (a scalar).
    pub member: String,
    /// Offset of the access in the type (in one element, for arrays of the type).
    pub offset: u64,
    /// The access as the program writes it: `args->SX`, `per[*].hits`, `acc[1].sum_x`.
    pub expr: String,
    /// `variable`, `tracked`, `stack` or `global`: how the type was found.
    pub how: &'static str,
    /// The type's own members (a struct's or class's), for padding fixes; empty otherwise.
    pub layout: Vec<LayoutMember>,
}

/// One member of a type's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutMember {
    /// The member's name; `<base Name>` for a base class, `<anonymous>` for an unnamed
    /// struct or union member.
    pub name: String,
    pub offset: u64,
    pub size: u64,
    pub type_name: String,
}

/// What code and unwind data typing needs from a module file, copied once.
pub(crate) struct ModuleCode {
    /// Executable sections: (vaddr, bytes).
    sections: Vec<(u64, Vec<u8>)>,
    eh_frame: Option<(u64, Vec<u8>)>,
    text: u64,
}

impl ModuleCode {
    pub(crate) fn parse(bytes: &[u8]) -> Option<ModuleCode> {
        let file = object::File::parse(bytes).ok()?;
        let mut sections = Vec::new();
        let mut text = 0;
        for s in file.sections() {
            if s.kind() == SectionKind::Text {
                if let Ok(data) = s.data() {
                    sections.push((s.address(), data.to_vec()));
                }
            }
            if s.name() == Ok(".text") {
                text = s.address();
            }
        }
        let eh_frame = file
            .section_by_name(".eh_frame")
            .and_then(|s| Some((s.address(), s.data().ok()?.to_vec())));
        Some(ModuleCode {
            sections,
            eh_frame,
            text,
        })
    }

    fn bytes(&self, start: u64, end: u64) -> Option<&[u8]> {
        self.sections.iter().find_map(|(addr, data)| {
            let lo = start.checked_sub(*addr)? as usize;
            let hi = (end.checked_sub(*addr)? as usize).min(data.len());
            (lo < hi).then(|| &data[lo..hi])
        })
    }

    /// The CFA at `pc` as register + offset, from `.eh_frame`.
    fn cfa(&self, pc: u64) -> Option<(DwReg, i64)> {
        let (addr, data) = self.eh_frame.as_ref()?;
        let eh = EhFrame::new(data, gimli::LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(*addr)
            .set_text(self.text);
        let mut ctx = Box::new(UnwindContext::new());
        let row = eh
            .unwind_info_for_address(&bases, &mut ctx, pc, EhFrame::cie_from_offset)
            .ok()?;
        match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => Some((register.0, *offset)),
            CfaRule::Expression(_) => None,
        }
    }
}

/// `.debug_loc` and `.debug_loclists` of a module file (empty when it has none, e.g. when its
/// DWARF is in a separate debug file: variables with location lists are then not matched).
fn location_lists(bytes: Option<&[u8]>) -> LocLists {
    let file = bytes.and_then(|b| object::File::parse(b).ok());
    let section = |name: &str| {
        let data: Arc<[u8]> = file
            .as_ref()
            .and_then(|f| f.section_by_name(name))
            .and_then(|s| s.uncompressed_data().ok())
            .map_or_else(|| Arc::from(&[][..]), |d| Arc::from(d.as_ref()));
        gimli::EndianArcSlice::new(data, gimli::RunTimeEndian::Little)
    };
    LocLists::new(
        gimli::DebugLoc::from(section(".debug_loc")),
        gimli::DebugLocLists::from(section(".debug_loclists")),
    )
}

/// Per-module state for typing: the module's code, unwind data and compilation units.
pub(crate) struct AccessTyper {
    code: Option<ModuleCode>,
    dwarf: Arc<Dwarf>,
    /// Every unit, in `.debug_info` order (its index keys the type table, as in
    /// [`DataIndex`]), with its PC ranges.
    units: Vec<(Unit, Vec<(u64, u64)>)>,
    /// From the module file: the shared DWARF leaves location lists out.
    locs: LocLists,
    /// Functions read so far, with their unit index.
    functions: Vec<(usize, FunctionVars)>,
}

impl AccessTyper {
    pub(crate) fn new(bytes: Option<&[u8]>, dwarf: Arc<Dwarf>) -> AccessTyper {
        let mut units = Vec::new();
        let mut headers = dwarf.units();
        while let Ok(Some(header)) = headers.next() {
            // Unit indices key the type table as in `DataIndex`, which stops at a bad unit.
            let Ok(unit) = dwarf.unit(header) else {
                break;
            };
            let mut ranges = Vec::new();
            if let Ok(mut it) = dwarf.unit_ranges(&unit) {
                while let Ok(Some(r)) = it.next() {
                    ranges.push((r.begin, r.end));
                }
            }
            units.push((unit, ranges));
        }
        AccessTyper {
            code: bytes.and_then(ModuleCode::parse),
            locs: location_lists(bytes),
            dwarf,
            units,
            functions: Vec::new(),
        }
    }

    /// Types the access at ELF vaddr `pc`. `Err` says why not (the coverage reason).
    pub(crate) fn type_at(
        &mut self,
        index: &mut DataIndex,
        symbols: &[ElfSymbol],
        pc: u64,
    ) -> Result<TypedAccess, &'static str> {
        let code = self.code.as_ref().ok_or("code not readable")?;
        let (uidx, unit) = self
            .units
            .iter()
            .enumerate()
            .find(|(_, (_, ranges))| ranges.iter().any(|r| (r.0..r.1).contains(&pc)))
            .map(|(i, (u, _))| (i, u))
            .ok_or("no DWARF function")?;
        // Functions read once: a function's DIE tree is walked once however many of its
        // instructions are contended.
        let cached = self
            .functions
            .iter()
            .position(|(u, f)| *u == uidx && f.ranges.iter().any(|r| (r.0..r.1).contains(&pc)));
        let fi = match cached {
            Some(i) => i,
            None => {
                let f = scope_vars::function_at(&self.dwarf, unit, &self.locs, pc)
                    .ok()
                    .flatten()
                    .ok_or("no DWARF function")?;
                self.functions.push((uidx, f));
                self.functions.len() - 1
            }
        };
        let vars = &self.functions[fi].1;
        let (start, end) = match symbols
            .iter()
            .rev()
            .find(|s| s.kind == SymKind::Text && s.addr <= pc && pc - s.addr < s.size)
        {
            Some(s) => (s.addr, s.addr + s.size),
            None => (vars.low, pc + 16),
        };
        let bytes = code.bytes(start, end).ok_or("code not readable")?;
        let mut d = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
        let mut insns: Vec<Instruction> = Vec::new();
        while d.can_decode() {
            insns.push(d.decode());
        }
        let at = insns
            .iter()
            .position(|i| i.ip() == pc)
            .ok_or("not an instruction start")?;
        let mut oracle = DwarfOracle {
            dwarf: &self.dwarf,
            unit,
            uidx,
            vars,
            index,
            code,
        };
        let place = reg_track::type_access(&insns, at, &mut oracle).map_err(|e| e.as_str())?;
        describe(index.types_mut(), &place).ok_or("type has no layout")
    }
}

/// The type and member at address `addr` of a global (a contended global line's bytes are
/// known exactly, so no instruction is needed).
pub(crate) fn type_global(index: &mut DataIndex, addr: u64) -> Option<TypedAccess> {
    let (name, ty, start) = index.typed_global_at(addr)?;
    let place = Place {
        ty,
        name: PlaceName::Var(name.to_string()),
        offset: (addr - start) as i64,
        indexed: false,
        how: How::Global,
    };
    describe(index.types_mut(), &place)
}

/// The DWARF facts the register walk asks for, for one function.
struct DwarfOracle<'a> {
    dwarf: &'a Dwarf,
    unit: &'a Unit,
    uidx: usize,
    vars: &'a FunctionVars,
    index: &'a mut DataIndex,
    code: &'a ModuleCode,
}

impl DwarfOracle<'_> {
    fn var_type(&mut self, off: Option<gimli::UnitOffset<usize>>) -> Option<TypeId> {
        let off = off?;
        Some(
            self.index
                .types_mut()
                .resolve(self.dwarf, self.unit, self.uidx, off, 0),
        )
    }

    /// Where a frame-based location is at `pc`, as register + offset.
    fn slot(&self, pc: u64, loc: VarLoc) -> Option<(DwReg, i64)> {
        match loc {
            VarLoc::Mem(r, k) => Some((r, k)),
            VarLoc::Frame(k) => match self.vars.frame_base {
                FrameBase::Reg(r, k0) => Some((r, k0 + k)),
                FrameBase::Cfa => self.code.cfa(pc).map(|(r, c)| (r, c + k)),
                FrameBase::Unknown => None,
            },
            _ => None,
        }
    }
}

impl Oracle for DwarfOracle<'_> {
    fn reg_pointer(&mut self, pc: u64, reg: DwReg) -> Option<Place> {
        let found: Vec<(String, Option<gimli::UnitOffset<usize>>, i64)> = self
            .vars
            .at(pc)
            .filter_map(|(v, loc)| match loc {
                VarLoc::Reg(r) if r == reg => Some((v.name.clone(), v.ty, 0)),
                VarLoc::RegPlus(r, k) if r == reg => Some((v.name.clone(), v.ty, -k)),
                _ => None,
            })
            .collect();
        // Inlined library code (`__atomic_base<long>::fetch_add`) may hold its own `this` in
        // the same register as the program's pointer: the program's type wins.
        let mut library = None;
        for (name, ty, offset) in found {
            let Some(t) = self.var_type(ty) else { continue };
            let types = self.index.types_mut();
            let TypeNode::Pointer {
                target: Some(target),
                ..
            } = &types.types[types.strip(t)]
            else {
                continue;
            };
            let p = Place {
                ty: *target,
                name: PlaceName::Deref(name),
                offset,
                indexed: false,
                how: How::Variable,
            };
            if !self.is_library(&p) {
                return Some(p);
            }
            library.get_or_insert(p);
        }
        library
    }

    fn frame_object(&mut self, pc: u64, reg: DwReg, disp: i64) -> Option<Place> {
        let found: Vec<(String, Option<gimli::UnitOffset<usize>>, i64)> = self
            .vars
            .at(pc)
            .filter_map(|(v, loc)| {
                let (r, k) = self.slot(pc, loc)?;
                (r == reg).then(|| (v.name.clone(), v.ty, k))
            })
            .collect();
        for (name, ty, start) in found {
            let Some(t) = self.var_type(ty) else { continue };
            let size = self.index.types_mut().size(t, 0).max(1) as i64;
            if disp >= start && disp - start < size {
                return Some(Place {
                    ty: t,
                    name: PlaceName::Var(name),
                    offset: disp - start,
                    indexed: false,
                    how: How::Stack,
                });
            }
        }
        None
    }

    fn global_object(&mut self, addr: u64) -> Option<Place> {
        let (name, ty, start) = self.index.typed_global_at(addr)?;
        Some(Place {
            ty,
            name: PlaceName::Var(name.to_string()),
            offset: (addr - start) as i64,
            indexed: false,
            how: How::Global,
        })
    }

    fn load_pointer(&mut self, from: &Place) -> Option<Place> {
        let types = self.index.types_mut();
        // Past the pointee, or moved by an index: an element of an array of it (`p[*].next`).
        let size = types.size(from.ty, 0) as i64;
        let (offset, element) = if size > 0 && (from.offset < 0 || from.offset >= size) {
            (from.offset.rem_euclid(size), true)
        } else {
            (from.offset, from.indexed)
        };
        let (target, mut path) = pointer_at(types, from.ty, offset.max(0) as u64, 0)?;
        // In an OpenMP region, a pointer loaded from `.omp_data_i` to a shared local of the
        // function the region came from points at that local, named as the source names it
        // (`sum`, not `*.omp_data_i->sum`); a firstprivate copy of that function's pointer
        // points where the pointer does (`parts`, not `.omp_data_i->parts`).
        let omp_member = match (&from.name, element) {
            (PlaceName::Deref(p), false) if p == OMP_DATA => path.strip_prefix('.'),
            _ => None,
        };
        if let Some(m) = omp_member {
            let is = |names: &[String]| names.iter().any(|n| n == m);
            let name = if is(&self.vars.shared) {
                Some(PlaceName::Var(m.to_string()))
            } else if is(&self.vars.copied) {
                Some(PlaceName::Deref(m.to_string()))
            } else {
                None
            };
            if let Some(name) = name {
                return Some(Place {
                    ty: target,
                    name,
                    offset: 0,
                    indexed: false,
                    how: How::Tracked,
                });
            }
        }
        // An array variable (`ptrs[i]`): the index is the array's, not an outer one.
        let element = if let (PlaceName::Var(_), true, Some(end)) =
            (&from.name, element && path.starts_with('['), path.find(']'))
        {
            path.replace_range(1..end, "*");
            false
        } else {
            element
        };
        let lvalue = match &from.name {
            PlaceName::Var(v) if element => format!("{v}[*]{path}"),
            PlaceName::Var(v) => format!("{v}{path}"),
            PlaceName::Deref(p) if element => format!("{p}[*]{path}"),
            PlaceName::Deref(p) if path.is_empty() => format!("*{p}"),
            PlaceName::Deref(p) => match path.strip_prefix('.') {
                Some(rest) => format!("{p}->{rest}"),
                None => format!("(*{p}){path}"),
            },
        };
        Some(Place {
            ty: target,
            name: PlaceName::Deref(lvalue),
            offset: 0,
            indexed: false,
            how: How::Tracked,
        })
    }

    fn is_library(&mut self, p: &Place) -> bool {
        let types = self.index.types_mut();
        let t = element_type(types, p.ty);
        library_type(types, t, 0)
    }
}

/// Through arrays to the element type.
fn element_type(types: &TypeTable, mut t: TypeId) -> TypeId {
    for _ in 0..8 {
        match &types.types[types.strip(t)] {
            TypeNode::Array { elem, .. } => t = *elem,
            _ => break,
        }
    }
    types.strip(t)
}

/// Whether every named member of record `t` (through bases and anonymous members) has a name
/// reserved for the implementation: a library's internals (`std::atomic`, `pthread_mutex_t`).
fn library_type(types: &TypeTable, t: TypeId, depth: u32) -> bool {
    if depth > 8 {
        return false;
    }
    match &types.types[types.strip(t)] {
        TypeNode::Record { members, .. } if !members.is_empty() => {
            members.iter().all(|m| match &m.name {
                Some(n) => crate::naming::dwarf_types::is_reserved(n),
                None => library_type(types, m.ty, depth + 1),
            })
        }
        _ => false,
    }
}

/// The pointer member starting at byte `off` of type `t`: its target type and its path
/// (`.next`, `[2].p`, empty for `t` itself).
fn pointer_at(types: &TypeTable, t: TypeId, off: u64, depth: u32) -> Option<(TypeId, String)> {
    if depth > 16 {
        return None;
    }
    match &types.types[types.strip(t)] {
        TypeNode::Pointer {
            target: Some(target),
            ..
        } if off == 0 => Some((*target, String::new())),
        TypeNode::Record { members, .. } => members.iter().find_map(|m| {
            let size = types.size(m.ty, 0);
            if off < m.offset || off - m.offset >= size.max(1) {
                return None;
            }
            let (target, rest) = pointer_at(types, m.ty, off - m.offset, depth + 1)?;
            Some(match &m.name {
                Some(n) => (target, format!(".{n}{rest}")),
                None => (target, rest),
            })
        }),
        TypeNode::Array { elem, .. } => {
            let esize = types.size(*elem, 0);
            if esize == 0 {
                return None;
            }
            let (target, rest) = pointer_at(types, *elem, off % esize, depth + 1)?;
            Some((target, format!("[{}]{rest}", off / esize)))
        }
        _ => None,
    }
}

/// An expression without the libstdc++ and gcc closure plumbing its reader did not write:
/// the callable `std::thread` stores (`this->_M_func._M_t._M_head_impl.`), the member a
/// lambda keeps a capture in (gcc names it `__hist` for `hist`), and `std::vector`'s element
/// pointer (`->_M_impl._M_start[*]`). `this->_M_func._M_t._M_head_impl.__hist->_M_impl.
/// _M_start[*]` in a thread's lambda reads `hist[*]`.
fn readable_cxx(expr: &str) -> String {
    let (deref, path) = match expr.find("this->") {
        Some(at) if expr[..at].chars().all(|c| c == '*' || c == '(') => expr.split_at(at),
        _ => ("", expr),
    };
    let mut out = deref.to_string();
    let rest = ["this->_M_func._M_t._M_head_impl.__", "this->__"]
        .iter()
        .find_map(|closure| {
            path.strip_prefix(closure)
                .filter(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()))
        });
    out.push_str(rest.unwrap_or(path));
    out.replace("->_M_impl._M_start[", "[")
        .replace("._M_impl._M_start[", "[")
}

/// The report's view of a place: element type of arrays, offset inside one element, member
/// path and the expression as written.
fn describe(types: &TypeTable, p: &Place) -> Option<TypedAccess> {
    let mut t = p.ty;
    let mut off = p.offset;
    let mut index = String::new();
    let mut indexed = p.indexed;
    for _ in 0..8 {
        let TypeNode::Array { elem, .. } = &types.types[types.strip(t)] else {
            break;
        };
        let esize = types.size(*elem, 0) as i64;
        if esize == 0 {
            break;
        }
        if indexed {
            index.push_str("[*]");
        } else {
            index.push_str(&format!("[{}]", off.div_euclid(esize)));
        }
        off = off.rem_euclid(esize);
        t = *elem;
        indexed = false;
    }
    let st = types.strip(t);
    let size = types.size(st, 0);
    // Outside the pointee: the pointer walks an array of it (`p[i].x`).
    let mut outer_index = false;
    if size > 0 && (off < 0 || off >= size as i64) {
        off = off.rem_euclid(size as i64);
        outer_index = true;
    }
    if matches!(types.types[st], TypeNode::Opaque { .. }) || size == 0 {
        return None;
    }
    let off = off as u64;
    let mut member = types
        .field_path(st, off, 0)
        .trim_start_matches('.')
        .to_string();
    // An index register on an access inside the object indexes the member array it lands
    // in (`p->counts[i]`): the digits are the displacement's, not the element's.
    // Otherwise it walks an array of the type (`stats[id].misses`).
    if indexed && !outer_index {
        match (member.find('['), member.find(']')) {
            (Some(a), Some(b)) if a < b => member.replace_range(a + 1..b, "*"),
            _ => outer_index = true,
        }
    }
    let type_name = match &types.types[st] {
        TypeNode::Record { name: None, .. } => types.type_name(t, 0),
        _ => types.type_name(st, 0),
    };
    let dot = |m: &str| {
        if m.is_empty() || m.starts_with('[') {
            m.to_string()
        } else {
            format!(".{m}")
        }
    };
    let expr = match &p.name {
        PlaceName::Var(v) if outer_index => format!("{v}{index}[*]{}", dot(&member)),
        PlaceName::Var(v) => format!("{v}{index}{}", dot(&member)),
        PlaceName::Deref(ptr) if outer_index => {
            format!("{ptr}[*]{}", dot(&member))
        }
        PlaceName::Deref(ptr) if member.is_empty() => format!("*{ptr}"),
        PlaceName::Deref(ptr) if member.starts_with('[') => format!("(*{ptr}){member}"),
        PlaceName::Deref(ptr) => format!("{ptr}->{member}"),
    };
    let expr = readable_cxx(&expr);
    let how = match p.how {
        How::Variable => "variable",
        How::Tracked => "tracked",
        How::Stack => "stack",
        How::Global => "global",
    };
    Some(TypedAccess {
        type_name,
        type_size: size,
        member,
        offset: off,
        expr,
        how,
        layout: layout(types, st),
    })
}

/// The members of record `t`, in offset order.
fn layout(types: &TypeTable, t: TypeId) -> Vec<LayoutMember> {
    let TypeNode::Record { members, .. } = &types.types[types.strip(t)] else {
        return Vec::new();
    };
    let mut out: Vec<LayoutMember> = members
        .iter()
        .map(|m| {
            let type_name = types.type_name(m.ty, 0);
            LayoutMember {
                name: match &m.name {
                    Some(n) => n.clone(),
                    None if matches!(
                        &types.types[types.strip(m.ty)],
                        TypeNode::Record { name: Some(_), .. }
                    ) =>
                    {
                        format!("<base {type_name}>")
                    }
                    None => "<anonymous>".to_string(),
                },
                offset: m.offset,
                size: types.size(m.ty, 0),
                type_name,
            }
        })
        // An empty base class takes no bytes.
        .filter(|m| !(m.name.starts_with("<base") && m.size <= 1 && m.offset == 0))
        .collect();
    out.sort_by_key(|m| m.offset);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::dwarf_types::Member;
    use std::collections::HashMap;

    fn table() -> TypeTable {
        let rec =
            |name: &str, size: u64, members: Vec<(Option<&str>, u64, TypeId)>| TypeNode::Record {
                keyword: "struct",
                name: Some(name.into()),
                size,
                members: members
                    .into_iter()
                    .map(|(n, offset, ty)| Member {
                        name: n.map(str::to_string),
                        offset,
                        ty,
                    })
                    .collect(),
            };
        TypeTable {
            types: vec![
                /* 0 */
                TypeNode::Base {
                    name: "long int".into(),
                    size: 8,
                },
                /* 1 */
                rec(
                    "stat",
                    24,
                    vec![
                        (Some("hits"), 0, 0),
                        (Some("misses"), 8, 0),
                        (Some("n"), 16, 0),
                    ],
                ),
                /* 2 */
                TypeNode::Array {
                    elem: 1,
                    count: Some(4),
                },
                /* 3 */
                TypeNode::Array {
                    elem: 0,
                    count: Some(4),
                },
                /* 4 */
                rec(
                    "hist",
                    40,
                    vec![(Some("total"), 0, 0), (Some("counts"), 8, 3)],
                ),
            ],
            ids: HashMap::new(),
        }
    }

    fn place(ty: TypeId, name: PlaceName, offset: i64, indexed: bool) -> Place {
        Place {
            ty,
            name,
            offset,
            indexed,
            how: How::Variable,
        }
    }

    #[test]
    fn arrays_of_structs_and_member_arrays_are_named_as_written() {
        let t = table();
        // A global array at a known offset: element [1], member misses.
        let a = describe(&t, &place(2, PlaceName::Var("per".into()), 32, false)).unwrap();
        assert_eq!(
            (
                a.type_name.as_str(),
                a.member.as_str(),
                a.expr.as_str(),
                a.offset
            ),
            ("struct stat", "misses", "per[1].misses", 8)
        );
        // Through a pointer with an index register: the element is unknown.
        let a = describe(&t, &place(1, PlaceName::Deref("s".into()), 64, true)).unwrap();
        assert_eq!((a.member.as_str(), a.expr.as_str()), ("n", "s[*].n"));
        // p->counts[i]: the index lands in the member array.
        let a = describe(&t, &place(4, PlaceName::Deref("h".into()), 8, true)).unwrap();
        assert_eq!(a.expr, "h->counts[*]");
        assert_eq!(a.type_size, 40);
        assert_eq!(
            a.layout
                .iter()
                .map(|m| (m.name.as_str(), m.offset, m.size))
                .collect::<Vec<_>>(),
            vec![("total", 0, 8), ("counts", 8, 32)]
        );
        // A scalar through a pointer.
        let a = describe(&t, &place(0, PlaceName::Deref("c".into()), 0, false)).unwrap();
        assert_eq!((a.type_name.as_str(), a.expr.as_str()), ("long int", "*c"));
    }

    #[test]
    fn closure_and_library_plumbing_is_left_out_of_expressions() {
        let thread_lambda = "this->_M_func._M_t._M_head_impl.__hist->_M_impl._M_start[*]";
        assert_eq!(readable_cxx(thread_lambda), "hist[*]");
        assert_eq!(
            readable_cxx("*this->_M_func._M_t._M_head_impl.__counts"),
            "*counts"
        );
        assert_eq!(readable_cxx("this->__total"), "total");
        assert_eq!(readable_cxx("v._M_impl._M_start[*]"), "v[*]");
        // What a program wrote stays as it is.
        for e in ["h->counts[*]", "this->count", "__libc_lock", "s[*].n", "*c"] {
            assert_eq!(readable_cxx(e), e);
        }
    }
}
