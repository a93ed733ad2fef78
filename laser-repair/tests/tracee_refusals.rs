//! Clean refusals: seccomp, a refused mmap. Nothing in the target may change.

mod tracee_support;

use laser_repair::tracee::{self, apply, ApplyOptions, ProcMem, TraceeError, UndoOptions};
use tracee_support::{anon_exec_mappings, serial, LoopRepair, Target, ORIGINAL};

#[test]
fn a_seccomp_filtered_process_is_refused_before_any_syscall() {
    let _g = serial();
    let mut t = Target::spawn_with(2, false, true);
    let before = anon_exec_mappings(t.pid);
    match apply(t.pid, &LoopRepair::new(&t, 8), &ApplyOptions::default()) {
        Err(TraceeError::Seccomp { mode, .. }) => assert_eq!(mode, 2),
        other => panic!("expected a seccomp refusal, got {other:?}"),
    }
    assert_eq!(anon_exec_mappings(t.pid), before);
    assert_eq!(
        ProcMem::open(t.pid).unwrap().read(t.site, 7).unwrap(),
        ORIGINAL
    );
    assert!(t.report().last.iter().all(|&v| v == 1));
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}

fn set_address_space_limit(pid: i32, bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit reads the rlimit we pass and writes nothing (old-limit pointer is null).
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_AS, &lim, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_refused_mmap_is_a_typed_refusal_and_changes_nothing() {
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let before = anon_exec_mappings(t.pid);
    let status = std::fs::read_to_string(format!("/proc/{}/status", t.pid)).unwrap();
    let vm_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    // No room for one more page.
    set_address_space_limit(t.pid, vm_kb * 1024);
    match apply(t.pid, &LoopRepair::new(&t, 8), &ApplyOptions::default()) {
        Err(TraceeError::RemoteSyscall { name, errno, .. }) => {
            assert_eq!((name, errno), ("mmap", nix::errno::Errno::ENOMEM))
        }
        other => panic!("expected a refused mmap, got {other:?}"),
    }
    assert_eq!(anon_exec_mappings(t.pid), before);
    assert_eq!(
        ProcMem::open(t.pid).unwrap().read(t.site, 7).unwrap(),
        ORIGINAL
    );
    assert!(t.report().last.iter().all(|&v| v == 1));

    // With the limit lifted the same repair goes in and comes out.
    set_address_space_limit(t.pid, libc::RLIM_INFINITY);
    let a = apply(t.pid, &LoopRepair::new(&t, 8), &ApplyOptions::default()).unwrap();
    t.poll(|r| r.last.iter().all(|&v| v == 8), "repaired");
    tracee::undo(t.pid, &UndoOptions::default()).unwrap();
    assert!(tracee::find_repairs(t.pid).unwrap().is_empty());
    drop(a);
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}

#[test]
fn a_job_control_stopped_process_is_refused_and_stays_stopped() {
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let before = anon_exec_mappings(t.pid);
    // SAFETY: kill with integer arguments, on our own child.
    assert_eq!(unsafe { libc::kill(t.pid, libc::SIGSTOP) }, 0);
    let stopped = || {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", t.pid)).unwrap();
        s.rsplit(')').next().unwrap().trim_start().starts_with('T')
    };
    let start = std::time::Instant::now();
    while !stopped() {
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    match apply(t.pid, &LoopRepair::new(&t, 8), &ApplyOptions::default()) {
        Err(TraceeError::ProcessStopped { pid }) => assert_eq!(pid, t.pid),
        other => panic!("expected a refusal for a stopped process, got {other:?}"),
    }
    assert_eq!(anon_exec_mappings(t.pid), before);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(stopped(), "laser must not resume a stopped process");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(t.pid, libc::SIGCONT) }, 0);
    assert!(t.report().last.iter().all(|&v| v == 1));
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}
