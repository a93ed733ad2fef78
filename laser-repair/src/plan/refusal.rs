//! Why a region was left untouched. Every reason names the instruction or numbers involved so
//! the CLI can print it as is.

/// A repair the planner declined; the target stays untouched.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("repair refused: {reason}")]
pub struct Refusal {
    pub reason: RefusalReason,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusalReason {
    #[error("no contending PC given")]
    NoContendingPcs,
    #[error("cannot read code at {addr:#x}..{end:#x}")]
    CodeUnreadable { addr: u64, end: u64 },
    #[error("no function start found within {scanned} bytes before {pc:#x}")]
    NoFunctionFound { pc: u64, scanned: u64 },
    #[error(
        "contending PC {pc:#x} is not an instruction boundary of the function {start:#x}..{end:#x}"
    )]
    PcNotOnInstruction { pc: u64, start: u64, end: u64 },
    #[error("undecodable bytes at {pc:#x}")]
    Undecodable { pc: u64 },
    #[error("instruction at {pc:#x} (`{text}`) cannot be rewritten: {why}")]
    UnsupportedInstruction {
        pc: u64,
        text: String,
        why: &'static str,
    },
    #[error("indirect jump at {pc:#x} (`{text}`) inside the region: its targets are unknown")]
    IndirectJump { pc: u64, text: String },
    #[error("region entry block at {pc:#x} is {len} bytes, shorter than the 5-byte jmp patch")]
    EntryTooShort { pc: u64, len: u64 },
    #[error("call at {pc:#x} lies under the entry jmp patched at {entry:#x}: the region cannot leave through it")]
    CallUnderPatch { pc: u64, entry: u64 },
    #[error("region entry {pc:#x} and code cache {cache:#x} are more than 2 GiB apart")]
    CacheOutOfReach { pc: u64, cache: u64 },
    #[error(
        "estimated {estimated:.1} stores per flush, below the {minimum:.1} that pays for the SSB"
    )]
    TooFewStoresPerFlush { estimated: f64, minimum: f64 },
    #[error(
        "store addresses change inside the loop, so every access would need a log lookup \
         (the general path of the store buffer, measured slower than the contended original)"
    )]
    GeneralPath,
    #[error("code cache needs {need} bytes, {have} reserved")]
    CacheTooSmall { need: u64, have: u64 },
    #[error("code generation failed: {0}")]
    Encoding(String),
}

impl From<RefusalReason> for Refusal {
    fn from(reason: RefusalReason) -> Self {
        Refusal { reason }
    }
}
