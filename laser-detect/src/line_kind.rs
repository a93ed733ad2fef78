//! Naming a contended line's kind from its true and false events.

use crate::findings::Kind;

/// Share of a line's events one kind needs to name the line (else [`Kind::Mixed`]).
///
/// Neighbour accesses of an exchanged word already count as true sharing
/// ([`crate::recent`]), so the false events left are ones padding would remove. A line is
/// named by its dominant kind when that kind's fix addresses at least 4 in 5 of its
/// transfers; `mixed` is kept for lines where the minority is a fifth or more: both fixes
/// are needed. (With the exchange test, `regs_rw_true`, `spinlock_tas` and the mutex line of
/// `locked_queue` measure 87–100% true; 80% leaves room for the first events of a line,
/// which have no history yet, on short runs with few events.)
pub const KIND_SHARE: f64 = 0.8;

/// The kind of a line from its true and false events.
pub fn line_kind(true_events: u64, false_events: u64) -> Kind {
    let events = true_events + false_events;
    if events > 0 && true_events as f64 >= KIND_SHARE * events as f64 {
        Kind::TrueSharing
    } else if events > 0 && false_events as f64 >= KIND_SHARE * events as f64 {
        Kind::FalseSharing
    } else {
        Kind::Mixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dominant_kind_names_the_line() {
        assert_eq!(line_kind(7, 1), Kind::TrueSharing); // spinlock_tas on a loaded run
        assert_eq!(line_kind(1, 9), Kind::FalseSharing);
        assert_eq!(line_kind(80, 20), Kind::TrueSharing);
    }

    #[test]
    fn a_genuinely_split_line_is_mixed() {
        assert_eq!(line_kind(70, 30), Kind::Mixed);
        assert_eq!(line_kind(50, 50), Kind::Mixed);
        assert_eq!(line_kind(21, 79), Kind::Mixed);
    }

    #[test]
    fn no_events_is_mixed_not_a_panic() {
        assert_eq!(line_kind(0, 0), Kind::Mixed);
    }
}
