//! Loading modules' debug info before the report needs it, in CPU time the program leaves idle.
//!
//! Building a report opens the DWARF of every module a finding's instruction sits in. For a
//! program whose contention is inside glibc (a mutex, a barrier) that means inflating glibc's
//! separate debug file: ~10 MB of DWARF, ~80–110 ms here, paid after the program has exited
//! and so counted in `laser run`'s wall time. A live run knows long before the end which
//! modules its contended lines' instructions are in ([`crate::model::detector::Detector::contended_modules`]),
//! so it asks for them here, and one worker thread at `SCHED_IDLE` priority loads them: it runs
//! only on a CPU nothing else wants (a program waiting on a lock leaves plenty), and never
//! takes a CPU from the program. Whatever it has not finished when the report starts, the
//! report finishes: waiting for a module the worker is loading (once the program is gone it
//! runs at full speed) or loading one still queued itself.
//!
//! The registry is process-wide: the monitor loop that prefetches and the report that takes
//! live in different layers of the CLI, and there is only ever one set of modules per process
//! of laser. A module is handed out once ([`take`]); a later symbolizer loads it again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use crate::naming::symbolize::{load_module, LoadedModule};

#[derive(Default)]
struct State {
    queued: VecDeque<String>,
    /// Every path ever requested (a path is loaded at most once).
    requested: HashSet<String>,
    loading: Option<String>,
    done: HashMap<String, Result<LoadedModule, String>>,
    worker: bool,
}

struct Registry {
    state: Mutex<State>,
    changed: Condvar,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
    })
}

fn lock(r: &Registry) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    r.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Queues `paths` for loading on the idle-priority worker (started on first use). Paths
/// requested before are ignored. Returns how many were newly queued.
pub fn prefetch<I: IntoIterator<Item = String>>(paths: I) -> usize {
    let r = registry();
    let mut st = lock(r);
    let mut n = 0;
    for p in paths {
        if st.requested.insert(p.clone()) {
            st.queued.push_back(p);
            n += 1;
        }
    }
    if n > 0 && !st.worker {
        let spawned = std::thread::Builder::new()
            .name("laser-prefetch".into())
            .spawn(worker);
        // No thread, no prefetch: the report loads everything itself, as without this.
        st.worker = spawned.is_ok();
        if !st.worker {
            st.queued.clear();
        }
    }
    if n > 0 {
        r.changed.notify_all();
    }
    n
}

/// The prefetched module at `path`, if one was requested: waits while the worker is loading
/// it; a path still queued is dropped from the queue and `None` returned (the caller loads it
/// now rather than wait behind other modules).
pub(crate) fn take(path: &str) -> Option<Result<LoadedModule, String>> {
    let r = registry();
    let mut st = lock(r);
    loop {
        if let Some(done) = st.done.remove(path) {
            return Some(done);
        }
        if st.loading.as_deref() == Some(path) {
            st = r.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        }
        st.queued.retain(|q| q != path);
        return None;
    }
}

fn worker() {
    lower_priority();
    let r = registry();
    loop {
        let path = {
            let mut st = lock(r);
            loop {
                if let Some(p) = st.queued.pop_front() {
                    st.loading = Some(p.clone());
                    break p;
                }
                st = r.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let loaded = load_module(&mut |p: &str| std::fs::read(p), &path, true);
        let mut st = lock(r);
        st.loading = None;
        st.done.insert(path, loaded);
        r.changed.notify_all();
    }
}

/// `SCHED_IDLE` for the calling thread: it runs only when a CPU would otherwise idle. If the
/// kernel refuses (it does not, for lowering), the worker still runs, at normal priority.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes only the calling thread's policy; `param`
    // is a valid sched_param that outlives the call.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetched_module_is_handed_out_once_and_an_unrequested_one_not_at_all() {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap().to_string();
        assert_eq!(prefetch([exe.clone(), exe.clone()]), 1, "requested once");
        assert_eq!(prefetch([exe.clone()]), 0, "and never again");
        // Waits for the worker if it is loading; if still queued, take drops it: either way
        // the answer is definite and the second take has nothing.
        if let Some(m) = take(&exe) {
            assert!(m.is_ok(), "the test binary loads");
        }
        assert!(take(&exe).is_none());
        assert!(take("/nonexistent/never-requested").is_none());
    }

    #[test]
    fn an_unreadable_module_comes_back_as_its_error() {
        let path = "/nonexistent/laser-prefetch-test.so".to_string();
        prefetch([path.clone()]);
        // Give the worker time to get to it (it is idle priority, but the test machine has
        // idle time while this thread sleeps).
        for _ in 0..200 {
            if lock(registry()).done.contains_key(&path) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        match take(&path) {
            Some(Err(e)) => assert!(e.contains("cannot read"), "{e}"),
            Some(Ok(_)) => panic!("a missing file loaded"),
            None => {} // still queued after 2 s on a saturated machine: dropped, not lost
        }
    }
}
