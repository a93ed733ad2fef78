//! The local variables and parameters of the function holding a PC, with where DWARF says each
//! one lives at each PC: what [`crate::naming::access_type`] matches an instruction's base
//! register or stack slot against.
//!
//! ```text
//!   void *worker(void *arg) {            DW_TAG_subprogram  [0x1189, 0x1210)
//!     struct lreg_args *args = arg;        DW_TAG_variable "args"
//!                                            -O0: DW_OP_fbreg -24   (a stack slot, all along)
//!                                            -O2: [0x1190,0x11c0) DW_OP_reg3 (rbx) …
//!     for (…) { long x = …; }              DW_TAG_lexical_block [0x11a0, 0x11f0)
//!   }                                        DW_TAG_variable "x" (only inside the block)
//! ```
//!
//! Variables of functions inlined into this one (`DW_TAG_inlined_subroutine`) are included
//! with their own scopes: at -O2 the pointer an access goes through is often the `this` or
//! parameter of an inlined callee. Names and types of inlined and out-of-line instances come
//! from their `DW_AT_abstract_origin`.

use gimli::{AttributeValue, UnitOffset};

use crate::naming::debug_module::DwarfReader;

/// The location lists, which the shared DWARF leaves out (symbolization never needs them):
/// [`crate::naming::access_type`] loads them from the module file when it types an access.
pub(crate) type LocLists = gimli::LocationLists<DwarfReader>;

/// What the walk over one unit's DIEs reads.
struct Ctx<'a> {
    dwarf: &'a Dwarf,
    unit: &'a Unit,
    locs: &'a LocLists,
    pc: u64,
}
use crate::naming::dwarf_types::{attr_str, unit_ref, Dwarf, Unit};

/// DWARF register numbers of x86-64 (System V psABI): rax 0, rdx 1, rcx 2, rbx 3, rsi 4,
/// rdi 5, rbp 6, rsp 7, r8..r15 8..15.
pub(crate) type DwReg = u16;
pub(crate) const RBP: DwReg = 6;
pub(crate) const RSP: DwReg = 7;

/// Where a variable is during one PC range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VarLoc {
    /// Its value is in a register (`DW_OP_regN`).
    Reg(DwReg),
    /// Its value is register + k (`DW_OP_bregN k; DW_OP_stack_value`).
    RegPlus(DwReg, i64),
    /// It is in memory at register + k (`DW_OP_bregN k`).
    Mem(DwReg, i64),
    /// It is in memory at the frame base + k (`DW_OP_fbreg k`).
    Frame(i64),
    /// It is in memory at a static address (`DW_OP_addr`: a function-local static).
    Addr(u64),
}

/// The function's frame base (`DW_AT_frame_base`), what `DW_OP_fbreg` counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameBase {
    /// gcc: `DW_OP_call_frame_cfa`, the CFA from the CFI at the PC.
    Cfa,
    /// clang: `DW_OP_reg6` (rbp) or a register + offset.
    Reg(DwReg, i64),
    Unknown,
}

#[derive(Clone, Debug)]
pub(crate) struct ScopeVar {
    pub(crate) name: String,
    /// Type DIE in the same unit.
    pub(crate) ty: Option<UnitOffset<usize>>,
    /// `[begin, end)` PC ranges with the location valid there.
    pub(crate) locs: Vec<(u64, u64, VarLoc)>,
}

/// The variables of one function, each with the PC ranges where DWARF says where it is.
#[derive(Clone, Debug)]
pub(crate) struct FunctionVars {
    /// The function's own PC ranges.
    pub(crate) ranges: Vec<(u64, u64)>,
    pub(crate) low: u64,
    pub(crate) frame_base: FrameBase,
    pub(crate) vars: Vec<ScopeVar>,
    /// For a function gcc outlined for an OpenMP region: the members of its `.omp_data_i`
    /// that point at the enclosing function's variable of the same name (a shared local:
    /// member `sum` of type `double (*)[2]` for main's `double sum[2]`). Accesses through
    /// them are that variable's, named as in the source.
    pub(crate) shared: Vec<String>,
    /// The members that are copies of the enclosing function's variable of the same name and
    /// type (firstprivate: a pointer `parts` the region only reads): a pointer loaded from
    /// one points where that variable does.
    pub(crate) copied: Vec<String>,
}

impl FunctionVars {
    /// Variables with a location at `pc`, innermost scope first (the order they were read
    /// in is outermost first, so reversed).
    pub(crate) fn at(&self, pc: u64) -> impl Iterator<Item = (&ScopeVar, VarLoc)> {
        self.vars.iter().rev().filter_map(move |v| {
            v.locs
                .iter()
                .find(|(b, e, _)| (*b..*e).contains(&pc))
                .map(|&(_, _, l)| (v, l))
        })
    }
}

/// Nesting deeper than this is malformed DWARF.
const MAX_DEPTH: usize = 64;

/// Reads the function of `unit` whose ranges contain `pc` (with the variables of all its
/// blocks, so the result serves any PC of the function), or `None`.
pub(crate) fn function_at(
    dwarf: &Dwarf,
    unit: &Unit,
    locs: &LocLists,
    pc: u64,
) -> Result<Option<FunctionVars>, gimli::Error> {
    let mut tree = unit.entries_tree(None)?;
    let root = tree.root()?;
    let cx = Ctx {
        dwarf,
        unit,
        locs,
        pc,
    };
    find_function(&cx, root, None, 0)
}

/// The DIE's PC ranges. A DIE whose ranges cannot be read has none: one malformed entry must
/// not hide the rest of the unit.
fn ranges_of(cx: &Ctx<'_>, e: &Entry<'_>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    if let Ok(mut ranges) = cx.dwarf.die_ranges(cx.unit, e) {
        while let Ok(Some(r)) = ranges.next() {
            out.push((r.begin, r.end));
        }
    }
    out
}

fn contains(ranges: &[(u64, u64)], pc: u64) -> bool {
    ranges.iter().any(|r| (r.0..r.1).contains(&pc))
}

type Entry<'a> = gimli::DebuggingInformationEntry<DwarfReader>;
type Node<'a, 'b> = gimli::EntriesTreeNode<'a, 'b, DwarfReader>;

/// `outer`: the function whose DIE holds `node`, if any (see [`FunctionVars::shared`]).
fn find_function(
    cx: &Ctx<'_>,
    node: Node<'_, '_>,
    outer: Option<UnitOffset<usize>>,
    depth: usize,
) -> Result<Option<FunctionVars>, gimli::Error> {
    if depth > MAX_DEPTH {
        return Ok(None);
    }
    let mut children = node.children();
    while let Some(child) = children.next()? {
        let e = child.entry();
        match e.tag() {
            gimli::DW_TAG_subprogram => {
                let ranges = ranges_of(cx, e);
                if !contains(&ranges, cx.pc) {
                    // gcc nests the functions it outlines from a function inside that
                    // function's DIE: OpenMP regions (`main._omp_fn.0`, in a lexical block
                    // of main) and GNU C nested functions. Their PCs lie outside the
                    // parent's ranges.
                    let this = Some(e.offset());
                    if let Some(f) = find_function(cx, child, this, depth + 1)? {
                        return Ok(Some(f));
                    }
                    continue;
                }
                let low = ranges.iter().map(|r| r.0).min().unwrap_or(0);
                let frame_base = frame_base(cx.unit, e.attr_value(gimli::DW_AT_frame_base));
                let mut f = FunctionVars {
                    ranges: ranges.clone(),
                    low,
                    frame_base,
                    vars: Vec::new(),
                    shared: Vec::new(),
                    copied: Vec::new(),
                };
                collect(cx, child, &ranges, &mut f.vars, depth + 1)?;
                if let Some(outer) = outer {
                    (f.shared, f.copied) = omp_members(cx, outer, &f.vars).unwrap_or_default();
                }
                return Ok(Some(f));
            }
            // C++ may nest definitions in namespaces (and gcc in classes, rarely); a
            // function's blocks hold the functions outlined from them.
            gimli::DW_TAG_namespace
            | gimli::DW_TAG_lexical_block
            | gimli::DW_TAG_structure_type
            | gimli::DW_TAG_class_type
            | gimli::DW_TAG_union_type => {
                if let Some(f) = find_function(cx, child, outer, depth + 1)? {
                    return Ok(Some(f));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Variables and parameters under `node` (a function, block or inlined call) whose scope
/// contains `pc`; `scope` is the node's PC ranges.
fn collect(
    cx: &Ctx<'_>,
    node: Node<'_, '_>,
    scope: &[(u64, u64)],
    out: &mut Vec<ScopeVar>,
    depth: usize,
) -> Result<(), gimli::Error> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let mut children = node.children();
    while let Some(child) = children.next()? {
        let e = child.entry();
        match e.tag() {
            gimli::DW_TAG_variable | gimli::DW_TAG_formal_parameter => {
                // A location that cannot be read loses that variable only.
                if let Ok(Some(v)) = variable(cx, e, scope) {
                    out.push(v);
                }
            }
            gimli::DW_TAG_lexical_block | gimli::DW_TAG_inlined_subroutine => {
                // A block without ranges (gcc emits some) shares its parent's.
                // Every block, not only the PC's: the result serves every PC of the
                // function, each variable valid only inside its block's ranges.
                let own = ranges_of(cx, e);
                let has_ranges = e.attr_value(gimli::DW_AT_low_pc).is_some()
                    || e.attr_value(gimli::DW_AT_ranges).is_some();
                if !has_ranges {
                    collect(cx, child, scope, out, depth + 1)?;
                } else if !own.is_empty() {
                    collect(cx, child, &own, out, depth + 1)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn variable(
    cx: &Ctx<'_>,
    e: &Entry<'_>,
    scope: &[(u64, u64)],
) -> Result<Option<ScopeVar>, gimli::Error> {
    let (dwarf, unit) = (cx.dwarf, cx.unit);
    let Some(loc) = e.attr_value(gimli::DW_AT_location) else {
        return Ok(None);
    };
    let (name, ty) = name_and_type(dwarf, unit, e);
    let Some(name) = name.or_else(|| omp_data_param(unit, e, ty)) else {
        return Ok(None);
    };
    let mut locs = Vec::new();
    match loc {
        AttributeValue::Exprloc(expr) => {
            if let Some(l) = eval(dwarf, unit, expr) {
                locs.extend(scope.iter().map(|&(b, e)| (b, e, l)));
            }
        }
        AttributeValue::LocationListsRef(offset) => list(cx, offset, &mut locs)?,
        AttributeValue::DebugLocListsIndex(index) => {
            let offset = cx
                .locs
                .get_offset(unit.encoding(), unit.loclists_base, index)?;
            list(cx, offset, &mut locs)?;
        }
        _ => {}
    }
    Ok((!locs.is_empty()).then_some(ScopeVar { name, ty, locs }))
}

fn list(
    cx: &Ctx<'_>,
    offset: gimli::LocationListsOffset<usize>,
    out: &mut Vec<(u64, u64, VarLoc)>,
) -> Result<(), gimli::Error> {
    let unit = cx.unit;
    let mut it = cx.locs.locations(
        offset,
        unit.encoding(),
        unit.low_pc,
        &cx.dwarf.debug_addr,
        unit.addr_base,
    )?;
    while let Some(entry) = it.next()? {
        if let Some(l) = eval(cx.dwarf, unit, entry.data) {
            out.push((entry.range.begin, entry.range.end, l));
        }
    }
    Ok(())
}

/// The name gcc gives (in its dumps, not in DWARF) to the one parameter of a function it
/// outlines for an OpenMP region, `main._omp_fn.0(struct .omp_data_s.0 &.omp_data_i)`.
pub(crate) const OMP_DATA: &str = ".omp_data_i";

/// [`OMP_DATA`] for an unnamed artificial parameter whose type leads (through qualifiers,
/// pointers and references) to an unnamed artificial struct. Its members are the region's
/// shared variables (as pointers to the enclosing function's locals) and firstprivate
/// copies: what they reach is named as the enclosing function names it
/// ([`FunctionVars::shared`]), the block's own bytes as `.omp_data_i->sum`. The walk into
/// every function's DIEs this needs (`find_function`) runs once per typed function.
fn omp_data_param(unit: &Unit, e: &Entry<'_>, ty: Option<UnitOffset<usize>>) -> Option<String> {
    let artificial = e.attr_value(gimli::DW_AT_artificial).is_some();
    (e.tag() == gimli::DW_TAG_formal_parameter && artificial && omp_struct(unit, ty).is_some())
        .then(|| OMP_DATA.to_string())
}

/// The unnamed artificial struct `ty` leads to through qualifiers, pointers and references.
fn omp_struct(unit: &Unit, ty: Option<UnitOffset<usize>>) -> Option<UnitOffset<usize>> {
    let mut next = ty;
    for _ in 0..8 {
        let off = next?;
        let t = unit.entry(off).ok()?;
        match t.tag() {
            gimli::DW_TAG_structure_type => {
                let unnamed = t.attr_value(gimli::DW_AT_name).is_none();
                let artificial = t.attr_value(gimli::DW_AT_artificial).is_some();
                return (unnamed && artificial).then_some(off);
            }
            gimli::DW_TAG_pointer_type
            | gimli::DW_TAG_reference_type
            | gimli::DW_TAG_restrict_type
            | gimli::DW_TAG_const_type
            | gimli::DW_TAG_volatile_type => next = unit_ref(t.attr_value(gimli::DW_AT_type)),
            _ => return None,
        }
    }
    None
}

/// [`FunctionVars::shared`] and [`FunctionVars::copied`] for a function nested in `outer`
/// whose variables are `vars`.
fn omp_members(
    cx: &Ctx<'_>,
    outer: UnitOffset<usize>,
    vars: &[ScopeVar],
) -> Result<(Vec<String>, Vec<String>), gimli::Error> {
    let (dwarf, unit) = (cx.dwarf, cx.unit);
    let Some(st) = vars
        .iter()
        .find(|v| v.name == OMP_DATA)
        .and_then(|v| omp_struct(unit, v.ty))
    else {
        return Ok(Default::default());
    };
    // The enclosing function's variables, its blocks' too (a shared local lives in memory,
    // so it has a location: `collect` keeps it).
    let mut tree = unit.entries_tree(Some(outer))?;
    let root = tree.root()?;
    let ranges = ranges_of(cx, root.entry());
    let mut vars = Vec::new();
    collect(cx, root, &ranges, &mut vars, 0)?;
    let locals: Vec<(String, UnitOffset<usize>)> = vars
        .into_iter()
        .filter_map(|v| Some((v.name, v.ty?)))
        .collect();
    let (mut shared, mut copied) = (Vec::new(), Vec::new());
    let mut tree = unit.entries_tree(Some(st))?;
    let mut members = tree.root()?.children();
    while let Some(m) = members.next()? {
        let e = m.entry();
        let (Some(name), Some(ty)) = (
            attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_name)),
            unit_ref(e.attr_value(gimli::DW_AT_type)),
        ) else {
            continue;
        };
        let local = |t: UnitOffset<usize>| locals.iter().any(|(n, lt)| *n == name && *lt == t);
        let t = unit.entry(ty)?;
        let pointee = unit_ref(t.attr_value(gimli::DW_AT_type));
        if local(ty) {
            copied.push(name);
        } else if t.tag() == gimli::DW_TAG_pointer_type && pointee.is_some_and(local) {
            shared.push(name);
        }
    }
    Ok((shared, copied))
}

/// Name and type of a variable, through `DW_AT_abstract_origin` (inlined and out-of-line
/// instances carry only the location).
fn name_and_type(
    dwarf: &Dwarf,
    unit: &Unit,
    e: &Entry<'_>,
) -> (Option<String>, Option<UnitOffset<usize>>) {
    let mut name = attr_str(dwarf, unit, e.attr_value(gimli::DW_AT_name));
    let mut ty = unit_ref(e.attr_value(gimli::DW_AT_type));
    let mut next = unit_ref(e.attr_value(gimli::DW_AT_abstract_origin));
    for _ in 0..4 {
        let Some(off) = next else { break };
        let Ok(o) = unit.entry(off) else { break };
        name = name.or_else(|| attr_str(dwarf, unit, o.attr_value(gimli::DW_AT_name)));
        ty = ty.or_else(|| unit_ref(o.attr_value(gimli::DW_AT_type)));
        next = unit_ref(o.attr_value(gimli::DW_AT_abstract_origin));
    }
    (name, ty)
}

fn frame_base(unit: &Unit, v: Option<AttributeValue<DwarfReader>>) -> FrameBase {
    let Some(AttributeValue::Exprloc(expr)) = v else {
        return FrameBase::Unknown;
    };
    let mut ops = expr.operations(unit.encoding());
    match ops.next() {
        Ok(Some(gimli::Operation::CallFrameCFA)) => FrameBase::Cfa,
        Ok(Some(gimli::Operation::Register { register })) => FrameBase::Reg(register.0, 0),
        Ok(Some(gimli::Operation::RegisterOffset {
            register, offset, ..
        })) => FrameBase::Reg(register.0, offset),
        _ => FrameBase::Unknown,
    }
}

/// The location forms a pointer variable takes in practice; anything else (pieces, entry
/// values, computed expressions) is not matched.
fn eval(dwarf: &Dwarf, unit: &Unit, expr: gimli::Expression<DwarfReader>) -> Option<VarLoc> {
    let mut ops = expr.operations(unit.encoding());
    let first = ops.next().ok()??;
    let second = ops.next().ok()?;
    let only = second.is_none();
    match (first, second) {
        (gimli::Operation::Register { register }, None) => Some(VarLoc::Reg(register.0)),
        (
            gimli::Operation::RegisterOffset {
                register, offset, ..
            },
            Some(gimli::Operation::StackValue),
        ) => Some(VarLoc::RegPlus(register.0, offset)),
        (
            gimli::Operation::RegisterOffset {
                register, offset, ..
            },
            None,
        ) => Some(VarLoc::Mem(register.0, offset)),
        (gimli::Operation::FrameOffset { offset }, None) => Some(VarLoc::Frame(offset)),
        (gimli::Operation::Address { address }, None) => Some(VarLoc::Addr(address)),
        (gimli::Operation::AddressIndex { index }, None) if only => {
            dwarf.address(unit, index).ok().map(VarLoc::Addr)
        }
        _ => None,
    }
}
