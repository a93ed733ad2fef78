//! ThreadLock and injected syscalls on a live process: every thread held (including threads
//! born during the seize), signals sent meanwhile delivered, interrupted syscalls restarted.

mod tracee_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use laser_repair::tracee::{
    self, apply, maps, remote, threads::list_tasks, ApplyOptions, ProcMem, StopKind, ThreadLock,
    UndoOptions,
};
use tracee_support::{serial, LoopRepair, Target};

fn task_is_dead_or_gone(pid: i32, tid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
        Ok(s) => maps::is_dead(&s),
        Err(_) => true,
    }
}

#[test]
fn every_thread_is_held_including_ones_born_during_the_seize() {
    let _g = serial();
    let mut t = Target::spawn(3, true);
    let mem = ProcMem::open(t.pid).unwrap();
    let (mut clones, mut max_pause) = (0, Duration::ZERO);
    for _ in 0..30 {
        let lock = ThreadLock::seize_all(t.pid).unwrap();
        let held = lock.tids();
        for tid in list_tasks(t.pid).unwrap() {
            assert!(
                held.contains(&tid) || task_is_dead_or_gone(t.pid, tid),
                "thread {tid} of {} not held: {held:?}",
                t.pid
            );
        }
        // Nothing runs: the workers' counters stand still while held.
        let a = mem.read(t.slots, 8).unwrap();
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(a, mem.read(t.slots, 8).unwrap());
        let stats = lock.release();
        clones += stats.clone_events;
        max_pause = max_pause.max(stats.paused);
        assert!(stats.threads >= 5, "{stats:?}");
    }
    eprintln!(
        "30 holds (3 ms each inside): {clones} threads born during seize, max hold {max_pause:?}"
    );
    let r = t.report();
    assert_eq!(r.eintr, 0);
    assert!(r.last.iter().all(|&v| v == 1));
    let (_, code) = t.quit();
    assert_eq!(code, 0);
}

#[test]
fn injected_syscalls_return_results_and_restart_the_interrupted_syscall() {
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let mem = ProcMem::open(t.pid).unwrap();
    for _ in 0..20 {
        let mut lock = ThreadLock::seize_all(t.pid).unwrap();
        let text = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
        let regions = maps::parse_maps(&text).unwrap();
        // The main thread is blocked in read(): it stopped with a restart pending.
        let site = remote::choose_site(&lock, &mem, &regions, Some(t.pid)).unwrap();
        assert_eq!(site.tid, t.pid);
        let before = lock.regs(t.pid).unwrap();
        let got =
            remote::remote_syscall(&mut lock, &mem, &site, remote::SYS_GETPID, [0; 6]).unwrap();
        assert_eq!(got, t.pid as i64);
        let after = lock.regs(t.pid).unwrap();
        assert_eq!(
            (before.rip, before.rax, before.orig_rax),
            (after.rip, after.rax, after.orig_rax)
        );
        lock.release();
    }
    let r = t.report();
    assert_eq!(r.eintr, 0, "read() or nanosleep() saw EINTR: {r:?}");
    let (_, code) = t.quit();
    assert_eq!(code, 0);
}

#[test]
fn a_signal_arriving_while_laser_runs_a_thread_is_delivered_once() {
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let mem = ProcMem::open(t.pid).unwrap();
    let worker = *list_tasks(t.pid)
        .unwrap()
        .iter()
        .find(|&&tid| tid != t.pid)
        .unwrap();
    let mut passed = 0;
    for i in 0..10 {
        let mut lock = ThreadLock::seize_all(t.pid).unwrap();
        // Queued while the worker is held; it surfaces as a signal-delivery-stop when laser
        // single-steps the worker for the injected syscall.
        // SAFETY: tgkill with integer arguments.
        assert_eq!(
            unsafe { libc::syscall(libc::SYS_tgkill, t.pid, worker, libc::SIGUSR1) },
            0
        );
        let text = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
        let regions = maps::parse_maps(&text).unwrap();
        let site = remote::choose_site(&lock, &mem, &regions, Some(worker)).unwrap();
        let got =
            remote::remote_syscall(&mut lock, &mem, &site, remote::SYS_GETPID, [0; 6]).unwrap();
        assert_eq!(got, t.pid as i64);
        passed += lock.release().signals_passed;
        // SIGUSR1 is not queued: a second one sent while the first is still pending merges
        // with it (POSIX), so wait for each delivery before the next round.
        let r = t.poll(|r| r.usr1 > i, "SIGUSR1 delivered");
        assert_eq!(r.usr1, i + 1, "each signal delivered exactly once");
    }
    assert_eq!(passed, 10);
    let (_, code) = t.quit();
    assert_eq!(code, 0);
}

#[test]
fn a_signal_taken_before_the_interrupt_is_passed_on_at_detach() {
    // The thread dequeues SIGUSR1 while seized but not yet interrupted: its first stop is a
    // signal-delivery-stop, the lock keeps it there, and PTRACE_DETACH(SIGUSR1) delivers it.
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let worker = *list_tasks(t.pid)
        .unwrap()
        .iter()
        .find(|&&tid| tid != t.pid)
        .unwrap();
    for i in 0..5 {
        let pid = t.pid;
        let lock = ThreadLock::seize_all_with_hook(pid, &mut |tid| {
            if tid == worker {
                // SAFETY: tgkill with integer arguments.
                assert_eq!(
                    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) },
                    0
                );
                // Until the worker takes it and sits in its signal-delivery-stop ('t').
                let start = Instant::now();
                while !std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                    .unwrap()
                    .rsplit(')')
                    .next()
                    .unwrap()
                    .trim_start()
                    .starts_with('t')
                {
                    assert!(start.elapsed() < Duration::from_secs(10));
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
        .unwrap();
        assert_eq!(
            lock.stop_kind(worker),
            Some(StopKind::Signal(libc::SIGUSR1))
        );
        assert!(lock.has_pending_signal(worker));
        let stats = lock.release();
        assert_eq!(stats.signals_passed, 1);
        let r = t.poll(|r| r.usr1 > i, "SIGUSR1 delivered");
        assert_eq!(r.usr1, i + 1, "delivered exactly once");
    }
    let (_, code) = t.quit();
    assert_eq!(code, 0);
}

#[test]
fn realtime_signals_sent_during_repairs_are_all_delivered() {
    let _g = serial();
    let mut t = Target::spawn(3, true);
    let pid = t.pid;
    let done = AtomicBool::new(false);
    let mut passed = 0;
    let sent = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut sent = 0;
            // ATOMICS: Relaxed: a plain stop flag; no data is published through it.
            while !done.load(Ordering::Relaxed) && sent < 400 {
                // SAFETY: kill with integer arguments; signal 40 is queued (real-time).
                if unsafe { libc::kill(pid, 40) } == 0 {
                    sent += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            sent
        });
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(400) {
            let a = apply(pid, &LoopRepair::new(&t, 4), &ApplyOptions::default()).unwrap();
            passed += a.pause.signals_passed;
            let u = a.undo(&UndoOptions::default()).unwrap();
            passed += u.pause.signals_passed;
        }
        // ATOMICS: Relaxed, see above.
        done.store(true, Ordering::Relaxed);
        sender.join().unwrap() as i64
    });
    let r = t.poll(|r| r.rt >= sent, "every real-time signal delivered");
    eprintln!("{sent} real-time signals sent during repairs, {passed} handed back by laser");
    assert_eq!(r.rt, sent, "signals lost or duplicated");
    // A handler that interrupted a thread inside the cache keeps the cache's address in its
    // signal frame: undo then retires the cache instead of unmapping it, and a later undo
    // collects it once no thread refers to it.
    let start = Instant::now();
    while !tracee::find_repairs(pid).unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "retired cache never collected"
        );
        tracee::undo(pid, &UndoOptions::default()).unwrap();
    }
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}

#[test]
fn a_syscall_instruction_written_over_rip_is_restored() {
    // The fallback for a target without any `0f 05` in its executable mappings: laser writes
    // the instruction at the thread's RIP for the call and puts the old bytes back.
    let _g = serial();
    let mut t = Target::spawn(2, false);
    let mem = ProcMem::open(t.pid).unwrap();
    let worker = *list_tasks(t.pid)
        .unwrap()
        .iter()
        .find(|&&tid| tid != t.pid)
        .unwrap();
    for _ in 0..10 {
        let mut lock = ThreadLock::seize_all(t.pid).unwrap();
        let before = lock.regs(worker).unwrap();
        let old = mem.read(before.rip, 2).unwrap();
        let site = remote::SyscallSite {
            tid: worker,
            addr: before.rip,
            scratch: Some(old.clone()),
        };
        let got =
            remote::remote_syscall(&mut lock, &mem, &site, remote::SYS_GETPID, [0; 6]).unwrap();
        assert_eq!(got, t.pid as i64);
        assert_eq!(mem.read(before.rip, 2).unwrap(), old);
        let after = lock.regs(worker).unwrap();
        assert_eq!(
            (after.rip, after.rax, after.rsp),
            (before.rip, before.rax, before.rsp)
        );
        lock.release();
    }
    assert!(t.report().last.iter().all(|&v| v == 1));
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}

/// The calling thread's scheduling policy (without the reset-on-fork bit).
fn policy() -> i32 {
    // SAFETY: a plain syscall on the calling thread.
    unsafe { libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK }
}

#[test]
fn the_tracer_is_real_time_only_while_it_holds_the_target() {
    let _g = serial();
    let t = Target::spawn(2, false);
    let before = policy();
    assert_eq!(before, libc::SCHED_OTHER);
    let lock = ThreadLock::seize_all(t.pid).unwrap();
    // As root (or with CAP_SYS_NICE) the hold runs at SCHED_FIFO; otherwise as before.
    // SAFETY: geteuid takes nothing and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(
        policy(),
        if root { libc::SCHED_FIFO } else { before },
        "during the hold"
    );
    let stats = lock.release();
    assert_eq!(policy(), before, "after release");
    assert!(stats.phases.seize <= stats.paused, "{stats:?}");
    // Dropped instead of released, and a failed seize: restored as well.
    drop(ThreadLock::seize_all(t.pid).unwrap());
    assert_eq!(policy(), before, "after drop");
    assert!(ThreadLock::seize_all(i32::MAX).is_err());
    assert_eq!(policy(), before, "after a failed seize");
    let (fin, code) = t.quit();
    assert_eq!((code, fin.eintr), (0, 0));
}

#[test]
fn a_missing_process_is_a_typed_error() {
    // PIDs above pid_max never exist.
    let e = ThreadLock::seize_all(i32::MAX).unwrap_err();
    assert!(
        matches!(e, tracee::TraceeError::NoSuchProcess { .. }),
        "{e}"
    );
    assert!(tracee::find_repairs(i32::MAX).is_err());
}
