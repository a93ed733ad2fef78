//! Threads of a process we did not start (attach): listing `/proc/PID/task` and telling
//! whether the process is still alive.

use std::io;

/// Thread ids currently listed under `/proc/PID/task`. `Ok(empty)` never happens for a live
/// process (its main thread is listed even after it exits, while others run).
pub fn list_tids(pid: i32) -> io::Result<Vec<i32>> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The state letter of a `/proc/PID/stat` line (`R`, `S`, `Z`, …). The comm field may contain
/// spaces and parentheses, so the state is the first field after the *last* `)`.
pub fn parse_stat_state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// True while any thread of the process is not a zombie/dead (`Z`, `X`, `x`). The group
/// leader alone is not enough: after the main thread calls `pthread_exit` it stays a zombie
/// while the other threads run on.
pub fn is_alive(pid: i32) -> bool {
    let live = |path: String| match std::fs::read_to_string(path) {
        Ok(s) => !matches!(parse_stat_state(&s), Some('Z' | 'X' | 'x') | None),
        Err(_) => false,
    };
    if live(format!("/proc/{pid}/stat")) {
        return true;
    }
    list_tids(pid).is_ok_and(|tids| {
        tids.iter()
            .any(|t| live(format!("/proc/{pid}/task/{t}/stat")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_state_survives_odd_comm_names() {
        assert_eq!(parse_stat_state("42 (a) b) R 1 2 3"), Some('R'));
        assert_eq!(parse_stat_state("42 (zz) Z 1"), Some('Z'));
        assert_eq!(parse_stat_state("garbage"), None);
        assert_eq!(parse_stat_state("1 (x)"), None);
    }

    #[test]
    fn own_threads_are_listed() {
        let me = std::process::id() as i32;
        let tids = list_tids(me).unwrap();
        assert!(tids.contains(&me));
        assert!(is_alive(me));
        assert!(!is_alive(i32::MAX));
    }
}
