//! DWARF type layouts: enough of `.debug_info`'s types (structs, unions, classes, arrays,
//! typedefs, qualifiers, pointers, base types) to turn a byte offset into a value of a type
//! into a field path (`[1].sum_x`) and to print the type C-style (`struct acc[4]`).
//!
//! C++ base classes (`DW_TAG_inheritance`) are members without a name at their offset, so a
//! field of a base is named as the user writes it (`a.x`, not `a.Base.x`), and members with
//! names reserved for the implementation (`_M_i` inside `std::atomic<int>`, glibc's `__data`
//! inside `pthread_mutex_t`) are not descended into: `a.x` names the atomic, as in the source.
//!
//! Types are copied into a table once, keyed by their DIE, so lookups never re-parse DWARF.
//! A type reached again while it is being read (a struct with a pointer to itself) resolves
//! to a placeholder, and every walk is depth-limited: malformed DWARF cannot loop.

use std::collections::HashMap;

use gimli::{AttributeValue, UnitOffset};

use crate::naming::debug_module::DwarfReader;

pub(crate) type Dwarf = gimli::Dwarf<DwarfReader>;
pub(crate) type Unit = gimli::Unit<DwarfReader>;
pub(crate) type TypeId = usize;

/// Nesting deeper than this is malformed or cyclic DWARF; stop there.
const MAX_DEPTH: u32 = 24;

#[derive(Clone, Debug)]
pub(crate) enum TypeNode {
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
pub(crate) struct Member {
    /// `None` for an anonymous struct/union member and for a base class: their fields are
    /// named as if they were the record's own.
    pub(crate) name: Option<String>,
    pub(crate) offset: u64,
    pub(crate) ty: TypeId,
}

/// All types read so far, and which DIE (unit index, offset) each came from.
#[derive(Clone, Debug, Default)]
pub(crate) struct TypeTable {
    pub(crate) types: Vec<TypeNode>,
    pub(crate) ids: HashMap<(usize, usize), TypeId>,
}

impl TypeTable {
    pub(crate) fn size(&self, t: TypeId, depth: u32) -> u64 {
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
    pub(crate) fn strip(&self, mut t: TypeId) -> TypeId {
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

    pub(crate) fn element(&self, t: TypeId) -> Option<(String, u64)> {
        match &self.types[self.strip(t)] {
            TypeNode::Array { elem, .. } => Some((self.type_name(*elem, 0), self.size(*elem, 0))),
            _ => None,
        }
    }

    /// `.field[2].sub` for byte `off` of a value of type `t`.
    pub(crate) fn field_path(&self, t: TypeId, off: u64, depth: u32) -> String {
        if depth > MAX_DEPTH {
            return String::new();
        }
        match &self.types[self.strip(t)] {
            TypeNode::Record { members, .. } => {
                const PADDING: &str = ".<padding>";
                let mut first: Option<String> = None;
                let hits = members.iter().filter(|m| {
                    let size = self.size(m.ty, 0).max(1);
                    off >= m.offset && off - m.offset < size
                });
                for m in hits {
                    let path = match &m.name {
                        // The implementation's own member (`std::atomic<int>`'s `_M_i`): the
                        // enclosing path is the name a user writes.
                        Some(n) if is_reserved(n) => String::new(),
                        Some(n) => {
                            format!(".{n}{}", self.field_path(m.ty, off - m.offset, depth + 1))
                        }
                        // Anonymous struct/union member or base class.
                        None => self.field_path(m.ty, off - m.offset, depth + 1),
                    };
                    // An empty base class (size 1 in DWARF, 0 bytes in the layout) overlaps
                    // the first member: a member that names the byte wins over its padding.
                    if !path.ends_with(PADDING) {
                        return path;
                    }
                    first.get_or_insert(path);
                }
                first.unwrap_or_else(|| PADDING.to_string())
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
    pub(crate) fn type_name(&self, t: TypeId, depth: u32) -> String {
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
                    // gcc qualifies a `volatile long a[n]` twice, on the array and on its
                    // element: C writes the qualifier once.
                    Some(q) if inner.starts_with(&format!("{q} ")) && !inner.contains('*') => inner,
                    // C writes restrict after the pointer it qualifies: `int *restrict`.
                    Some("restrict") => format!("{inner}restrict"),
                    Some(q) => format!("{q} {inner}"),
                    None => inner,
                }
            }
            TypeNode::Opaque { name, .. } => name.clone().unwrap_or_else(|| "?".into()),
        }
    }

    pub(crate) fn resolve(
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
                    let location = member_offset(c.attr_value(gimli::DW_AT_data_member_location));
                    let (name, offset) = match c.tag() {
                        // Static data members live elsewhere.
                        gimli::DW_TAG_member if c.attr_value(gimli::DW_AT_external).is_some() => {
                            continue
                        }
                        gimli::DW_TAG_member => (
                            attr_str(dwarf, unit, c.attr_value(gimli::DW_AT_name)),
                            location
                                .or_else(|| {
                                    udata(c.attr_value(gimli::DW_AT_data_bit_offset)).map(|b| b / 8)
                                })
                                .unwrap_or(0),
                        ),
                        // A base class at a constant offset; a virtual base's offset is
                        // computed at run time (an expression), so it is left out.
                        gimli::DW_TAG_inheritance => match location {
                            Some(offset) => (None, offset),
                            None => continue,
                        },
                        _ => continue,
                    };
                    raw.push((name, offset, unit_ref(c.attr_value(gimli::DW_AT_type))));
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
            // `struct s *restrict p` is a restrict_type over the pointer type: without it
            // here, every access through a restrict-qualified pointer was untyped.
            gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type
            | gimli::DW_TAG_atomic_type
            | gimli::DW_TAG_restrict_type => {
                let qualifier = match e.tag() {
                    gimli::DW_TAG_const_type => "const",
                    gimli::DW_TAG_volatile_type => "volatile",
                    gimli::DW_TAG_restrict_type => "restrict",
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

/// Whether `name` is reserved for the implementation in C and C++ (`__x`, `_Mx`): the
/// members of library types (`std::atomic`'s `_M_i`, `pthread_mutex_t`'s `__data`), which a
/// program never names itself.
pub(crate) fn is_reserved(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2 && b[0] == b'_' && (b[1] == b'_' || b[1].is_ascii_uppercase())
}

pub(crate) fn attr_str(
    dwarf: &Dwarf,
    unit: &Unit,
    v: Option<AttributeValue<DwarfReader>>,
) -> Option<String> {
    use gimli::Reader;
    let s = dwarf.attr_string(unit, v?).ok()?;
    Some(s.to_string_lossy().ok()?.into_owned())
}

pub(crate) fn unit_ref(v: Option<AttributeValue<DwarfReader>>) -> Option<UnitOffset<usize>> {
    match v? {
        AttributeValue::UnitRef(off) => Some(off),
        _ => None,
    }
}

fn udata(v: Option<AttributeValue<DwarfReader>>) -> Option<u64> {
    v?.udata_value()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, size: u64, members: &[(Option<&str>, u64, TypeId)]) -> TypeNode {
        TypeNode::Record {
            keyword: "struct",
            name: Some(name.into()),
            size,
            members: members
                .iter()
                .map(|&(n, offset, ty)| Member {
                    name: n.map(str::to_string),
                    offset,
                    ty,
                })
                .collect(),
        }
    }

    /// ```text
    ///   struct Empty {};  struct Base { std::atomic<int> x; };
    ///   struct A : Empty, Base { int y; };     bytes 0..4 Base::x (Empty takes none), 4..8 y
    ///   std::atomic<int> : __atomic_base<int> { int _M_i; }
    /// ```
    #[test]
    fn base_classes_are_transparent_and_library_internals_are_not_named() {
        let t = TypeTable {
            types: vec![
                TypeNode::Base {
                    name: "int".into(),
                    size: 4,
                },
                record("__atomic_base<int>", 4, &[(Some("_M_i"), 0, 0)]),
                record("atomic<int>", 4, &[(None, 0, 1)]),
                record("Empty", 1, &[]),
                record("Base", 4, &[(Some("x"), 0, 2)]),
                record("A", 8, &[(None, 0, 3), (None, 0, 4), (Some("y"), 4, 0)]),
                record("P", 8, &[(Some("a"), 0, 0)]),
            ],
            ids: HashMap::new(),
        };
        assert_eq!(t.field_path(5, 0, 0), ".x");
        assert_eq!(t.field_path(5, 3, 0), ".x");
        assert_eq!(t.field_path(5, 4, 0), ".y");
        // A bare std::atomic<int> is named by its variable alone.
        assert_eq!(t.field_path(2, 0, 0), "");
        // Real padding is still padding.
        assert_eq!(t.field_path(6, 5, 0), ".<padding>");
        assert_eq!(t.field_path(3, 0, 0), ".<padding>");
    }

    #[test]
    fn reserved_names_are_the_implementations() {
        for n in ["_M_i", "__data", "__lock", "_Value"] {
            assert!(is_reserved(n), "{n}");
        }
        for n in ["x", "_x", "m_count", "_", "sum_x"] {
            assert!(!is_reserved(n), "{n}");
        }
    }
}
