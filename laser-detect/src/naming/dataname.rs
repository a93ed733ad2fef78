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
use std::sync::Arc;

use gimli::AttributeValue;

use crate::naming::debug_module::{DwarfReader, ElfSymbol, SymKind};
use crate::naming::symbolize::demangle;

use crate::naming::dwarf_types::{attr_str, unit_ref, Dwarf, TypeId, TypeTable, Unit};

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
    types: TypeTable,
    /// The DWARF whose globals are not read yet ([`DataIndex::types_first`]).
    pending: Option<Arc<Dwarf>>,
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
        let mut index = DataIndex::default();
        index.read_globals(dwarf)?;
        Ok(index)
    }

    /// An index whose type table is filled as types are asked for, and whose globals are read
    /// only when one is looked up ([`DataIndex::typed_global_at`], or
    /// [`DataIndex::read_pending`] before naming). Typing an instruction's access through a
    /// pointer in a register needs only the types of its function's variables: reading every
    /// global of glibc's separate debug info for that (a barrier's counter, a mutex's lock
    /// word) took ~40–50 ms of laser's thread after parsec streamcluster had exited, one run in
    /// two (benchmarks/RESULTS.md, twenty-seventh session).
    pub(crate) fn types_first(dwarf: Arc<Dwarf>) -> Self {
        DataIndex {
            pending: Some(dwarf),
            ..DataIndex::default()
        }
    }

    /// Reads the globals of a [`DataIndex::types_first`] index, if not read yet.
    pub(crate) fn read_pending(&mut self) {
        if let Some(dwarf) = self.pending.take() {
            // As `from_dwarf`: a bad unit header keeps what was read before it.
            let _ = self.read_globals(&dwarf);
        }
    }

    /// Adds the globals of `dwarf`'s units (in `.debug_info` order, which keys the type
    /// table) to the index, their types to the table as it stands.
    fn read_globals(&mut self, dwarf: &Dwarf) -> Result<(), gimli::Error> {
        let mut b = Builder {
            vars: Vec::new(),
            types: std::mem::take(&mut self.types),
        };
        // What was read before a bad unit header is kept, and so is the type table.
        let r = b.units(dwarf);
        let mut vars = b.vars;
        vars.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
        vars.dedup_by(|later, earlier| later.addr == earlier.addr && later.name == earlier.name);
        self.vars = vars;
        self.types = b.types;
        for i in 0..self.vars.len() {
            if self.vars[i].size == 0 {
                self.vars[i].size = self.vars[i].ty.map_or(0, |t| self.types.size(t, 0));
            }
        }
        r
    }

    /// The global variable covering `addr` with a DWARF type: its name, type, and address
    /// (for [`crate::naming::access_type`]), and the type table to read that type in.
    pub(crate) fn typed_global_at(&mut self, addr: u64) -> Option<(&str, TypeId, u64)> {
        self.read_pending();
        let v = &self.vars[self.var_at(addr)?];
        Some((v.name.as_str(), v.ty?, v.addr))
    }

    /// The type table, which [`crate::naming::access_type`] extends with the types of local
    /// variables (ids stay valid: types are only added).
    pub(crate) fn types_mut(&mut self) -> &mut TypeTable {
        &mut self.types
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
            let Some(addr) = line_vaddr.checked_add(u64::from(b)) else {
                break;
            };
            let (key, obj, field) = if let Some(vi) = self.var_at(addr) {
                let v = &self.vars[vi];
                let path = match v.ty {
                    Some(t) => self.types.field_path(t, addr - v.addr, 0),
                    None => String::new(),
                };
                let obj = DataObject {
                    name: v.name.clone(),
                    type_name: v.ty.map(|t| self.types.type_name(t, 0)),
                    vaddr: v.addr,
                    size: v.size,
                    element: v.ty.and_then(|t| self.types.element(t)),
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
    types: TypeTable,
}

fn linkage_name(
    dwarf: &Dwarf,
    unit: &Unit,
    e: &gimli::DebuggingInformationEntry<DwarfReader>,
) -> Option<String> {
    attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_linkage_name))
        .or_else(|| attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_MIPS_linkage_name)))
}

impl Builder {
    /// Every unit in `.debug_info` order (its index keys the type table), until a unit
    /// header cannot be read.
    fn units(&mut self, dwarf: &Dwarf) -> Result<(), gimli::Error> {
        let mut units = dwarf.units();
        let mut uidx = 0usize;
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            // One bad unit must not lose the others.
            let _ = self.unit(dwarf, &unit, uidx);
            uidx += 1;
        }
        Ok(())
    }

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
                    let ty = ty.map(|t| self.types.resolve(dwarf, unit, uidx, t, 0));
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
    use crate::naming::dwarf_types::{Member, TypeNode};

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
            types: TypeTable {
                types,
                ..TypeTable::default()
            },
            pending: None,
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
