//! Names the data on a contended line: which global objects lie there (DWARF variables, or ELF
//! data symbols when there is no debug info) and which field each contended byte belongs to.
//!
//! ```text
//!   struct acc { long sum_x, sum_y, n; } acc[4];      (24-byte elements)
//!
//!   line 0x4040: | acc[0].sum_x | acc[0].sum_y | acc[0].n | acc[1].sum_x | acc[1].sum_y | ...
//!   offset        0              8              16         24             32
//!   mask (T1 writes 0..8, T2 writes 24..32)  →  fields ["acc[0].sum_x", "acc[1].sum_x"]
//! ```
//!
//! The index is built once per module from `.debug_info`: every variable with a static address
//! (`DW_OP_addr`, including function-local statics; TLS variables are skipped since a
//! per-thread copy cannot be shared) and the layout of its type (structs, unions, nested
//! arrays, typedefs), so a byte offset maps to a path like `acc[1].sum_x`.

use std::collections::HashMap;

use gimli::{AttributeValue, UnitOffset};

use crate::debug_module::{DwarfReader, ElfSymbol, SymKind};
use crate::symbolize::demangle;

type Dwarf = gimli::Dwarf<DwarfReader>;
type Unit = gimli::Unit<DwarfReader>;
type TypeId = usize;

/// Nesting deeper than this is malformed or cyclic DWARF; stop there.
const MAX_DEPTH: u32 = 24;

#[derive(Clone, Debug)]
enum TypeNode {
    Base {
        name: String,
        size: u64,
    },
    Record {
        keyword: &'static str,
        name: Option<String>,
        size: u64,
        members: Vec<Member>,
    },
    Array {
        elem: TypeId,
        count: Option<u64>,
    },
    Pointer {
        target: Option<TypeId>,
        size: u64,
    },
    /// typedef (named) or const/volatile (qualifier).
    Alias {
        name: Option<String>,
        qualifier: Option<&'static str>,
        target: Option<TypeId>,
    },
    Opaque {
        name: Option<String>,
        size: u64,
    },
}

#[derive(Clone, Debug)]
struct Member {
    name: Option<String>,
    offset: u64,
    ty: TypeId,
}

#[derive(Clone, Debug)]
struct GlobalVar {
    name: String,
    addr: u64,
    size: u64,
    ty: Option<TypeId>,
}

/// Global variables and their type layouts of one module.
#[derive(Clone, Debug, Default)]
pub struct DataIndex {
    /// Sorted by address.
    vars: Vec<GlobalVar>,
    types: Vec<TypeNode>,
}

/// One object (variable or data symbol) with contended bytes on the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataObject {
    pub name: String,
    /// C-style type, e.g. `struct acc[4]`; `None` without debug info.
    pub type_name: Option<String>,
    pub vaddr: u64,
    pub size: u64,
    /// For arrays: element type and size, what a fix pads.
    pub element: Option<(String, u64)>,
}

/// A run of contended bytes `[start, end)` of the line that belong to one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSpan {
    pub start: u32,
    pub end: u32,
    /// Index into [`LineData::objects`].
    pub object: usize,
    /// `acc[1].sum_x`, or `name+0x8` when only an ELF symbol is known.
    pub field: String,
}

/// What lies at the contended bytes of one line.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LineData {
    /// In address order.
    pub objects: Vec<DataObject>,
    /// In offset order; bytes no object covers have no span.
    pub spans: Vec<DataSpan>,
}

impl LineData {
    /// Distinct fields touched by the bytes in `mask`, in offset order.
    pub fn fields_for(&self, mask: u128) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.spans {
            if span_mask(s.start, s.end) & mask != 0 && !out.contains(&s.field) {
                out.push(s.field.clone());
            }
        }
        out
    }
}

fn span_mask(start: u32, end: u32) -> u128 {
    (start..end.min(128)).fold(0u128, |m, b| m | (1u128 << b))
}

impl DataIndex {
    /// Reads every statically addressed variable and its type from `.debug_info`.
    pub fn from_dwarf(dwarf: &Dwarf) -> Result<Self, gimli::Error> {
        let mut b = Builder::default();
        let mut units = dwarf.units();
        let mut uidx = 0usize;
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            // One bad unit must not lose the others.
            let _ = b.unit(dwarf, &unit, uidx);
            uidx += 1;
        }
        let mut vars = b.vars;
        vars.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
        vars.dedup_by(|later, earlier| later.addr == earlier.addr && later.name == earlier.name);
        let mut index = DataIndex {
            vars,
            types: b.types,
        };
        for i in 0..index.vars.len() {
            if index.vars[i].size == 0 {
                index.vars[i].size = index.vars[i].ty.map_or(0, |t| index.size(t, 0));
            }
        }
        Ok(index)
    }

    fn var_at(&self, addr: u64) -> Option<usize> {
        let idx = self.vars.partition_point(|v| v.addr <= addr);
        (0..idx)
            .rev()
            .take(8)
            .find(|&i| addr - self.vars[i].addr < self.vars[i].size)
    }

    /// Names the bytes in `mask` of the line at `line_vaddr`. `symbols` (the module's ELF
    /// symbols) name bytes that no DWARF variable covers.
    pub fn name_line(
        &self,
        symbols: &[ElfSymbol],
        line_vaddr: u64,
        line_size: u32,
        mask: u128,
    ) -> LineData {
        let mut out = LineData::default();
        // (object key, field key) of the span being extended.
        let mut keys: HashMap<(bool, usize), usize> = HashMap::new();
        let mut last: Option<(usize, String)> = None;
        for b in 0..line_size.min(128) {
            if mask & (1u128 << b) == 0 {
                last = None;
                continue;
            }
            let addr = line_vaddr + u64::from(b);
            let (key, obj, field) = if let Some(vi) = self.var_at(addr) {
                let v = &self.vars[vi];
                let path = match v.ty {
                    Some(t) => self.field_path(t, addr - v.addr, 0),
                    None => String::new(),
                };
                let obj = DataObject {
                    name: v.name.clone(),
                    type_name: v.ty.map(|t| self.type_name(t, 0)),
                    vaddr: v.addr,
                    size: v.size,
                    element: v.ty.and_then(|t| self.element(t)),
                };
                ((true, vi), obj, format!("{}{path}", v.name))
            } else if let Some(si) = data_symbol_at(symbols, addr) {
                let s = &symbols[si];
                let obj = DataObject {
                    name: demangle(&s.name, None),
                    type_name: None,
                    vaddr: s.addr,
                    size: s.size,
                    element: None,
                };
                let field = obj.name.clone();
                ((false, si), obj, field)
            } else {
                last = None;
                continue;
            };
            let oi = *keys.entry(key).or_insert_with(|| {
                out.objects.push(obj.clone());
                out.objects.len() - 1
            });
            if let Some((lo, lf)) = &last {
                if *lo == oi && *lf == field {
                    if let Some(span) = out.spans.last_mut() {
                        span.end = b + 1;
                    }
                    continue;
                }
            }
            let shown = if key.0 {
                field.clone()
            } else {
                // Symbol only: say where in the object the run starts.
                let off = addr - obj.vaddr;
                if off == 0 {
                    field.clone()
                } else {
                    format!("{field}+{off:#x}")
                }
            };
            out.spans.push(DataSpan {
                start: b,
                end: b + 1,
                object: oi,
                field: shown,
            });
            last = Some((oi, field));
        }
        // Objects in address order, spans re-pointed.
        let mut order: Vec<usize> = (0..out.objects.len()).collect();
        order.sort_by_key(|&i| (out.objects[i].vaddr, out.objects[i].name.clone()));
        let mut remap = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            remap[old] = new;
        }
        out.objects = order.iter().map(|&i| out.objects[i].clone()).collect();
        for s in &mut out.spans {
            s.object = remap[s.object];
        }
        out
    }

    fn size(&self, t: TypeId, depth: u32) -> u64 {
        if depth > MAX_DEPTH {
            return 0;
        }
        match &self.types[t] {
            TypeNode::Base { size, .. }
            | TypeNode::Record { size, .. }
            | TypeNode::Opaque { size, .. }
            | TypeNode::Pointer { size, .. } => *size,
            TypeNode::Array { elem, count } => count
                .unwrap_or(0)
                .saturating_mul(self.size(*elem, depth + 1)),
            TypeNode::Alias { target, .. } => target.map_or(0, |t| self.size(t, depth + 1)),
        }
    }

    /// Through typedefs and qualifiers to the type that has the layout.
    fn strip(&self, mut t: TypeId) -> TypeId {
        for _ in 0..MAX_DEPTH {
            match &self.types[t] {
                TypeNode::Alias {
                    target: Some(next), ..
                } => t = *next,
                _ => break,
            }
        }
        t
    }

    fn element(&self, t: TypeId) -> Option<(String, u64)> {
        match &self.types[self.strip(t)] {
            TypeNode::Array { elem, .. } => Some((self.type_name(*elem, 0), self.size(*elem, 0))),
            _ => None,
        }
    }

    /// `.field[2].sub` for byte `off` of a value of type `t`.
    fn field_path(&self, t: TypeId, off: u64, depth: u32) -> String {
        if depth > MAX_DEPTH {
            return String::new();
        }
        match &self.types[self.strip(t)] {
            TypeNode::Record { members, .. } => {
                let hit = members.iter().find(|m| {
                    let size = self.size(m.ty, 0).max(1);
                    off >= m.offset && off - m.offset < size
                });
                match hit {
                    Some(m) => {
                        let inner = self.field_path(m.ty, off - m.offset, depth + 1);
                        match &m.name {
                            Some(n) => format!(".{n}{inner}"),
                            None => inner, // anonymous struct/union member
                        }
                    }
                    None => ".<padding>".to_string(),
                }
            }
            TypeNode::Array { elem, .. } => {
                let esize = self.size(*elem, 0);
                if esize == 0 {
                    return String::new();
                }
                let inner = self.field_path(*elem, off % esize, depth + 1);
                format!("[{}]{inner}", off / esize)
            }
            _ => String::new(),
        }
    }

    /// C-style name: `struct acc[4]`, `long int`, `const char *`, `counter_t`.
    fn type_name(&self, t: TypeId, depth: u32) -> String {
        if depth > MAX_DEPTH {
            return "?".into();
        }
        match &self.types[t] {
            TypeNode::Base { name, .. } => name.clone(),
            TypeNode::Record { keyword, name, .. } => {
                format!("{keyword} {}", name.as_deref().unwrap_or("<anonymous>"))
            }
            TypeNode::Array { .. } => {
                let mut dims = String::new();
                let mut cur = t;
                while let TypeNode::Array { elem, count } = &self.types[cur] {
                    match count {
                        Some(n) => dims.push_str(&format!("[{n}]")),
                        None => dims.push_str("[]"),
                    }
                    cur = *elem;
                    if dims.len() > 200 {
                        break;
                    }
                }
                format!("{}{dims}", self.type_name(cur, depth + 1))
            }
            TypeNode::Pointer { target, .. } => match target {
                Some(t) => format!("{} *", self.type_name(*t, depth + 1)),
                None => "void *".into(),
            },
            TypeNode::Alias { name: Some(n), .. } => n.clone(),
            TypeNode::Alias {
                name: None,
                qualifier,
                target,
            } => {
                let inner = target.map_or_else(|| "void".into(), |t| self.type_name(t, depth + 1));
                match qualifier {
                    Some(q) => format!("{q} {inner}"),
                    None => inner,
                }
            }
            TypeNode::Opaque { name, .. } => name.clone().unwrap_or_else(|| "?".into()),
        }
    }
}

fn data_symbol_at(symbols: &[ElfSymbol], addr: u64) -> Option<usize> {
    let idx = symbols.partition_point(|s| s.addr <= addr);
    (0..idx)
        .rev()
        .take(16)
        .find(|&i| symbols[i].kind == SymKind::Data && addr - symbols[i].addr < symbols[i].size)
}

#[derive(Default)]
struct Builder {
    vars: Vec<GlobalVar>,
    types: Vec<TypeNode>,
    ids: HashMap<(usize, usize), TypeId>,
}

fn attr_str(dwarf: &Dwarf, unit: &Unit, v: Option<AttributeValue<DwarfReader>>) -> Option<String> {
    use gimli::Reader;
    let s = dwarf.attr_string(unit, v?).ok()?;
    Some(s.to_string_lossy().ok()?.into_owned())
}

fn linkage_name(
    dwarf: &Dwarf,
    unit: &Unit,
    e: &gimli::DebuggingInformationEntry<DwarfReader>,
) -> Option<String> {
    attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_linkage_name))
        .or_else(|| attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_MIPS_linkage_name)))
}

fn unit_ref(v: Option<AttributeValue<DwarfReader>>) -> Option<UnitOffset<usize>> {
    match v? {
        AttributeValue::UnitRef(off) => Some(off),
        _ => None,
    }
}

fn udata(v: Option<AttributeValue<DwarfReader>>) -> Option<u64> {
    v?.udata_value()
}

impl Builder {
    fn unit(&mut self, dwarf: &Dwarf, unit: &Unit, uidx: usize) -> Result<(), gimli::Error> {
        let mut cursor = unit.entries();
        // Enclosing namespaces as (depth, name), to qualify C++ globals.
        let mut scopes: Vec<(isize, String)> = Vec::new();
        while let Some(e) = cursor.next_dfs()? {
            let depth = e.depth();
            while scopes.last().is_some_and(|(d, _)| *d >= depth) {
                scopes.pop();
            }
            match e.tag() {
                gimli::DW_TAG_namespace => {
                    let name = attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_name))
                        .unwrap_or_else(|| "(anonymous namespace)".into());
                    scopes.push((depth, name));
                }
                gimli::DW_TAG_variable => {
                    let Some(addr) =
                        static_address(dwarf, unit, e.attr_value(gimli::DW_AT_location))
                    else {
                        continue;
                    };
                    let mut name = attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_name));
                    let mut linkage = linkage_name(dwarf, unit, e);
                    let mut ty = unit_ref(e.attr_value(gimli::DW_AT_type));
                    // A C++ definition outside its class points at the declaration.
                    let spec = unit_ref(e.attr_value(gimli::DW_AT_specification))
                        .or_else(|| unit_ref(e.attr_value(gimli::DW_AT_abstract_origin)));
                    if let Some(spec) = spec {
                        if let Ok(d) = unit.entry(spec) {
                            name = name
                                .or_else(|| attr_str(dwarf, unit, d.attr_value(gimli::DW_AT_name)));
                            ty = ty.or_else(|| unit_ref(d.attr_value(gimli::DW_AT_type)));
                            linkage = linkage.or_else(|| linkage_name(dwarf, unit, &d));
                        }
                    }
                    let Some(name) = name else { continue };
                    // C++ and Rust: the mangled name carries the full path (namespaces,
                    // classes, Rust modules), which the DIE nesting may not (a definition
                    // outside its class sits at unit level).
                    let demangled = linkage
                        .map(|l| (demangle(&l, None), l))
                        .filter(|(d, l)| d != l)
                        .map(|(d, _)| d);
                    let qualified = demangled.unwrap_or_else(|| {
                        scopes
                            .iter()
                            .map(|(_, n)| n.as_str())
                            .chain(std::iter::once(name.as_str()))
                            .collect::<Vec<_>>()
                            .join("::")
                    });
                    let ty = ty.map(|t| self.resolve(dwarf, unit, uidx, t, 0));
                    self.vars.push(GlobalVar {
                        name: qualified,
                        addr,
                        size: 0,
                        ty,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn resolve(
        &mut self,
        dwarf: &Dwarf,
        unit: &Unit,
        uidx: usize,
        off: UnitOffset<usize>,
        depth: u32,
    ) -> TypeId {
        if let Some(&id) = self.ids.get(&(uidx, off.0)) {
            return id;
        }
        // Placeholder first: a struct reached again through its own pointer member stops here.
        let id = self.types.len();
        self.types.push(TypeNode::Opaque {
            name: None,
            size: 0,
        });
        self.ids.insert((uidx, off.0), id);
        let node = if depth > MAX_DEPTH {
            None
        } else {
            self.node(dwarf, unit, uidx, off, depth).ok()
        };
        if let Some(node) = node {
            self.types[id] = node;
        }
        id
    }

    fn node(
        &mut self,
        dwarf: &Dwarf,
        unit: &Unit,
        uidx: usize,
        off: UnitOffset<usize>,
        depth: u32,
    ) -> Result<TypeNode, gimli::Error> {
        let e = unit.entry(off)?;
        let name = attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_name));
        let size = udata(e.attr_value(gimli::DW_AT_byte_size));
        let target = unit_ref(e.attr_value(gimli::DW_AT_type));
        let sub = |b: &mut Self, t: Option<UnitOffset<usize>>| {
            t.map(|t| b.resolve(dwarf, unit, uidx, t, depth + 1))
        };
        let node = match e.tag() {
            gimli::DW_TAG_base_type => TypeNode::Base {
                name: name.unwrap_or_else(|| "?".into()),
                size: size.unwrap_or(0),
            },
            gimli::DW_TAG_structure_type | gimli::DW_TAG_class_type | gimli::DW_TAG_union_type => {
                let keyword = match e.tag() {
                    gimli::DW_TAG_union_type => "union",
                    gimli::DW_TAG_class_type => "class",
                    _ => "struct",
                };
                let mut members = Vec::new();
                let mut tree = unit.entries_tree(Some(off))?;
                let mut children = tree.root()?.children();
                let mut raw = Vec::new();
                while let Some(child) = children.next()? {
                    let c = child.entry();
                    if c.tag() != gimli::DW_TAG_member
                        || c.attr_value(gimli::DW_AT_external).is_some()
                    {
                        continue; // static data members live elsewhere
                    }
                    let offset = member_offset(c.attr_value(gimli::DW_AT_data_member_location))
                        .or_else(|| {
                            udata(c.attr_value(gimli::DW_AT_data_bit_offset)).map(|b| b / 8)
                        })
                        .unwrap_or(0);
                    raw.push((
                        attr_str(dwarf, unit, c.attr_value(gimli::DW_AT_name)),
                        offset,
                        unit_ref(c.attr_value(gimli::DW_AT_type)),
                    ));
                }
                for (name, offset, ty) in raw {
                    if let Some(ty) = sub(self, ty) {
                        members.push(Member { name, offset, ty });
                    }
                }
                TypeNode::Record {
                    keyword,
                    name,
                    size: size.unwrap_or(0),
                    members,
                }
            }
            gimli::DW_TAG_array_type => {
                let mut dims = Vec::new();
                let mut tree = unit.entries_tree(Some(off))?;
                let mut children = tree.root()?.children();
                while let Some(child) = children.next()? {
                    let c = child.entry();
                    if c.tag() != gimli::DW_TAG_subrange_type {
                        continue;
                    }
                    let count = udata(c.attr_value(gimli::DW_AT_count)).or_else(|| {
                        let upper = udata(c.attr_value(gimli::DW_AT_upper_bound))?;
                        let lower = udata(c.attr_value(gimli::DW_AT_lower_bound)).unwrap_or(0);
                        upper.checked_sub(lower)?.checked_add(1)
                    });
                    dims.push(count);
                }
                let Some(mut elem) = sub(self, target) else {
                    return Ok(TypeNode::Opaque {
                        name: None,
                        size: size.unwrap_or(0),
                    });
                };
                if dims.is_empty() {
                    dims.push(None);
                }
                // `int m[2][3]`: the outermost dimension is the first subrange.
                for count in dims.iter().skip(1).rev() {
                    self.types.push(TypeNode::Array {
                        elem,
                        count: *count,
                    });
                    elem = self.types.len() - 1;
                }
                TypeNode::Array {
                    elem,
                    count: dims[0],
                }
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_rvalue_reference_type => TypeNode::Pointer {
                target: sub(self, target),
                size: size.unwrap_or(8),
            },
            gimli::DW_TAG_typedef => TypeNode::Alias {
                name,
                qualifier: None,
                target: sub(self, target),
            },
            gimli::DW_TAG_const_type | gimli::DW_TAG_volatile_type | gimli::DW_TAG_atomic_type => {
                let qualifier = match e.tag() {
                    gimli::DW_TAG_const_type => "const",
                    gimli::DW_TAG_volatile_type => "volatile",
                    _ => "_Atomic",
                };
                TypeNode::Alias {
                    name: None,
                    qualifier: Some(qualifier),
                    target: sub(self, target),
                }
            }
            gimli::DW_TAG_enumeration_type => TypeNode::Base {
                name: format!("enum {}", name.as_deref().unwrap_or("<anonymous>")),
                size: size.unwrap_or(4),
            },
            _ => TypeNode::Opaque {
                name,
                size: size.unwrap_or(0),
            },
        };
        Ok(node)
    }
}

/// `DW_AT_data_member_location`: a constant, or (DWARF 2) `DW_OP_plus_uconst N`.
fn member_offset(v: Option<AttributeValue<DwarfReader>>) -> Option<u64> {
    let v = v?;
    if let Some(n) = v.udata_value() {
        return Some(n);
    }
    let AttributeValue::Exprloc(expr) = v else {
        return None;
    };
    let encoding = gimli::Encoding {
        address_size: 8,
        format: gimli::Format::Dwarf32,
        version: 4,
    };
    match expr.operations(encoding).next().ok()?? {
        gimli::Operation::PlusConstant { value } => Some(value),
        _ => None,
    }
}

/// The address of a variable whose location is exactly `DW_OP_addr X` (or `DW_OP_addrx`).
/// Anything longer (TLS: `… DW_OP_form_tls_address`, registers, pieces) is not a global.
fn static_address(
    dwarf: &Dwarf,
    unit: &Unit,
    v: Option<AttributeValue<DwarfReader>>,
) -> Option<u64> {
    let AttributeValue::Exprloc(expr) = v? else {
        return None;
    };
    let mut ops = expr.operations(unit.encoding());
    let addr = match ops.next().ok()?? {
        gimli::Operation::Address { address } => address,
        gimli::Operation::AddressIndex { index } => dwarf.address(unit, index).ok()?,
        _ => return None,
    };
    match ops.next() {
        Ok(None) => Some(addr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_acc() -> DataIndex {
        // struct acc { long sum_x; long sum_y; long n; } acc[4];  at 0x4040
        let types = vec![
            TypeNode::Base {
                name: "long int".into(),
                size: 8,
            },
            TypeNode::Record {
                keyword: "struct",
                name: Some("acc".into()),
                size: 24,
                members: vec![
                    Member {
                        name: Some("sum_x".into()),
                        offset: 0,
                        ty: 0,
                    },
                    Member {
                        name: Some("sum_y".into()),
                        offset: 8,
                        ty: 0,
                    },
                    Member {
                        name: Some("n".into()),
                        offset: 16,
                        ty: 0,
                    },
                ],
            },
            TypeNode::Array {
                elem: 1,
                count: Some(4),
            },
        ];
        DataIndex {
            vars: vec![GlobalVar {
                name: "acc".into(),
                addr: 0x4040,
                size: 96,
                ty: Some(2),
            }],
            types,
        }
    }

    #[test]
    fn array_of_structs_names_element_and_field() {
        let idx = index_acc();
        let mask = 0xffu128 | (0xffu128 << 24);
        let d = idx.name_line(&[], 0x4040, 64, mask);
        assert_eq!(d.fields_for(mask), vec!["acc[0].sum_x", "acc[1].sum_x"]);
        assert_eq!(d.objects.len(), 1);
        assert_eq!(d.objects[0].type_name.as_deref(), Some("struct acc[4]"));
        assert_eq!(d.objects[0].element, Some(("struct acc".into(), 24)));
        assert_eq!(d.spans[0].start, 0);
        assert_eq!(d.spans[0].end, 8);
        assert_eq!(d.spans[1].start, 24);
        // Only T2's bytes:
        assert_eq!(d.fields_for(0xff << 24), vec!["acc[1].sum_x"]);
    }

    #[test]
    fn symbol_only_bytes_say_offset_into_the_symbol() {
        let syms = vec![ElfSymbol {
            addr: 0x5000,
            size: 32,
            name: "counters".into(),
            kind: SymKind::Data,
        }];
        let d = DataIndex::default().name_line(&syms, 0x5000, 64, 0xff | (0xff << 16));
        let fields = d.fields_for(u128::MAX);
        assert_eq!(fields, vec!["counters", "counters+0x10"]);
        assert_eq!(d.objects[0].type_name, None);
        // Bytes beyond every object get no span.
        let d = DataIndex::default().name_line(&syms, 0x5000, 64, 1 << 40);
        assert!(d.spans.is_empty() && d.objects.is_empty());
    }
}
