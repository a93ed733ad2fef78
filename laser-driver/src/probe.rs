//! `--backend auto|pebs|ibs|soft|watch`: what this machine can do, and why laser chose what
//! it chose. Facts are gathered once ([`Facts::gather`]: sysfs PMUs, `/proc/cpuinfo` and test
//! opens) and the decision is pure ([`decide`]) so it is tested on every kind of machine
//! ([`Facts::from_tree`] reads fixture sysfs trees).

use crate::attr::{self, Binding};
use crate::error::DriverError;
use crate::event::BackendKind;
use crate::pmu::cpuinfo::CpuId;
use crate::pmu::sysfs::{self, DirTree, SysfsTree};
use crate::pmu::{ibs, pebs, PmuError};
use crate::sys;

/// Whether `auto` picks PEBS/IBS where the hardware has them. Live PEBS/IBS sessions are
/// built from the kernel's interfaces but have not run on such hardware yet (this project has
/// none), so `auto` keeps to `soft` and says so; `--backend pebs|ibs` opens them.
const AUTO_PICKS_PRECISE: bool = false;

/// What the backend request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Auto,
    Backend(BackendKind),
}

impl Request {
    /// Parses the `--backend` value.
    pub fn parse(s: &str) -> Option<Request> {
        if s == "auto" {
            return Some(Request::Auto);
        }
        BackendKind::from_name(s).map(Request::Backend)
    }
}

/// The machine, as far as backend choice is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// PEBS events planned from sysfs (a one-line summary), or why there are none.
    pub pebs: Result<String, String>,
    /// The IBS op event planned from sysfs and cpuinfo, or why there is none.
    pub ibs: Result<String, String>,
    /// A test open of cpu-clock with user registers on ourselves: Ok or the error text.
    pub soft_open: Result<(), String>,
    /// A test open of a hardware breakpoint on ourselves.
    pub watch_open: Result<(), String>,
}

/// The decision and its reason, for the CLI to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub backend: BackendKind,
    pub reason: String,
}

impl Facts {
    /// Reads sysfs and `/proc/cpuinfo` and test-opens the soft and watch events: every fact
    /// (`laser backends`).
    pub fn gather() -> Facts {
        let mut f = Facts::gather_for(Request::Auto);
        f.watch_open = test_watch();
        f
    }

    /// The facts [`decide`] consults for `request`, and no more: a test open has its price.
    /// The soft test opens a disabled cpu-clock event on CPU 0 for everything that runs
    /// there, or, where CPU-wide events are not allowed, on laser itself; a task's event is
    /// what turns on the kernel's context-switch hooks for perf (a code patch and an RCU
    /// grace period, 5–19 ms on this VM when no task had an event for a second), which a
    /// launch that samples whole CPUs never needs otherwise. The breakpoint test (on laser
    /// itself) is made for `--backend watch` only: `auto` does not consult it, and a
    /// session whose breakpoints are refused says so.
    pub fn gather_for(request: Request) -> Facts {
        let mut f = match request {
            Request::Auto | Request::Backend(BackendKind::Pebs | BackendKind::Ibs) => {
                Facts::from_tree_with(&DirTree::system(), || {
                    std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()
                })
            }
            Request::Backend(_) => Facts {
                pebs: Err("not examined".into()),
                ibs: Err("not examined".into()),
                soft_open: Ok(()),
                watch_open: Ok(()),
            },
        };
        match request {
            Request::Auto | Request::Backend(BackendKind::Soft) => f.soft_open = test_soft(),
            Request::Backend(BackendKind::Watch) => f.watch_open = test_watch(),
            Request::Backend(_) => {}
        }
        f
    }

    /// The PEBS and IBS facts of a machine whose PMU directory is `tree` and whose
    /// `/proc/cpuinfo` reads `cpuinfo`; soft and watch are assumed to open.
    pub fn from_tree(tree: &dyn SysfsTree, cpuinfo: &str) -> Facts {
        Facts::from_tree_with(tree, || cpuinfo.to_string())
    }

    /// [`Facts::from_tree`], reading `/proc/cpuinfo` (`cpuinfo()`) only where an IBS PMU
    /// exists: only IBS's plan asks which CPU this is, and the read takes 50–120 µs of every
    /// `laser run` here (the kernel asks each CPU for its frequency).
    fn from_tree_with(tree: &dyn SysfsTree, cpuinfo: impl FnOnce() -> String) -> Facts {
        // The PMUs the PEBS and IBS plans look at (`pebs::core_pmus`, `ibs::plan`).
        let pmus = sysfs::read_named(tree, |n| {
            matches!(n, "cpu" | "cpu_core" | "cpu_atom" | "ibs_op")
        });
        let has_ibs = pmus
            .as_ref()
            .is_ok_and(|p| p.iter().any(|p| p.name == "ibs_op"));
        let cpu = if has_ibs {
            CpuId::parse(&cpuinfo())
        } else {
            None
        };
        let pebs = pmus
            .as_ref()
            .map_err(PmuError::to_string)
            .and_then(|p| pebs_summary(p).map_err(|e| format!("no PEBS: {e}")));
        let ibs = pmus.as_ref().map_err(PmuError::to_string).and_then(|p| {
            ibs::plan(p, cpu.as_ref(), Binding::Launch, ibs::DEFAULT_OP_PERIOD)
                .map(|a| format!("ibs_op type {} config {:#x}", a.type_, a.config))
                .map_err(|e| format!("no IBS: {e}"))
        });
        Facts {
            pebs,
            ibs,
            soft_open: Ok(()),
            watch_open: Ok(()),
        }
    }

    fn pebs_missing(&self) -> Option<String> {
        self.pebs.as_ref().err().cloned()
    }

    fn ibs_missing(&self) -> Option<String> {
        self.ibs.as_ref().err().cloned()
    }
}

/// "cpu (skylake): mem-loads config 0x1cd ldlat 30 …" for each core PMU.
fn pebs_summary(pmus: &[sysfs::Pmu]) -> Result<String, PmuError> {
    let plans = pebs::plan(pmus, &pebs::PebsOptions::default())?;
    Ok(plans
        .iter()
        .map(|p| {
            // SAFETY: config1 shares a union with bp_addr; both are u64, any bits are valid.
            let config1 = unsafe { p.load.__bindgen_anon_3.config1 };
            format!(
                "{} ({}): mem-loads type {} config {:#x} config1 {:#x}{}{}",
                p.pmu,
                p.pmu_name.as_deref().unwrap_or("?"),
                p.load.type_,
                p.load.config,
                config1,
                if p.aux_leader.is_some() {
                    " in a mem-loads-aux group"
                } else {
                    ""
                },
                if p.store.is_some() {
                    ", mem-stores"
                } else {
                    ""
                },
            )
        })
        .collect::<Vec<_>>()
        .join("; "))
}

/// Picks a backend for `request` on a machine described by `facts`.
pub fn decide(facts: &Facts, request: Request) -> Result<Choice, DriverError> {
    let unavailable = |backend, reason: String| DriverError::BackendUnavailable { backend, reason };
    let precise = |backend: BackendKind, plan: &Result<String, String>| match plan {
        Err(why) => Err(unavailable(backend, format!("{why} — use --backend soft"))),
        Ok(summary) => Ok(Choice {
            backend,
            reason: format!(
                "requested with --backend {backend} ({summary}); first runs on real {backend} \
                 hardware: compare with `perf c2c record` + `laser import` if in doubt"
            ),
        }),
    };
    match request {
        Request::Backend(BackendKind::Pebs) => precise(BackendKind::Pebs, &facts.pebs),
        Request::Backend(BackendKind::Ibs) => precise(BackendKind::Ibs, &facts.ibs),
        Request::Backend(BackendKind::Soft) => match &facts.soft_open {
            Ok(()) => Ok(Choice {
                backend: BackendKind::Soft,
                reason: "requested with --backend soft".into(),
            }),
            Err(e) => Err(unavailable(
                BackendKind::Soft,
                format!("test open of cpu-clock failed: {e}"),
            )),
        },
        Request::Backend(BackendKind::Watch) => match &facts.watch_open {
            Ok(()) => Ok(Choice {
                backend: BackendKind::Watch,
                reason: "requested with --backend watch".into(),
            }),
            Err(e) => Err(unavailable(
                BackendKind::Watch,
                format!("test open of a hardware breakpoint failed: {e}"),
            )),
        },
        Request::Auto => {
            let mut why = Vec::new();
            for (kind, missing) in [
                (BackendKind::Pebs, facts.pebs_missing()),
                (BackendKind::Ibs, facts.ibs_missing()),
            ] {
                match missing {
                    Some(m) => why.push(m),
                    None if AUTO_PICKS_PRECISE => {
                        return Ok(Choice {
                            backend: kind,
                            reason: format!("{kind} hardware found"),
                        })
                    }
                    None => why.push(format!(
                        "{kind} hardware found, but auto does not pick {kind} until it has been \
                         checked on such hardware (use --backend {kind}, or record with perf and \
                         `laser import`)"
                    )),
                }
            }
            match &facts.soft_open {
                Ok(()) => Ok(Choice {
                    backend: BackendKind::Soft,
                    reason: format!(
                        "soft (cpu-clock sampling with user registers): {}",
                        why.join("; ")
                    ),
                }),
                Err(e) => Err(unavailable(
                    BackendKind::Soft,
                    format!("{}; and test open of cpu-clock failed: {e}", why.join("; ")),
                )),
            }
        }
    }
}

/// Test-opens a disabled cpu-clock event with user registers: on CPU 0 for every task, else
/// (CPU-wide events not allowed) on laser itself. Ok, or the error text of the last try.
fn test_soft() -> Result<(), String> {
    let mut a = attr::soft(Binding::Attach, 1000, 4096);
    a.set_disabled(1);
    sys::open(&a, -1, 0, "probe: cpu-clock on CPU 0")
        .or_else(|_| sys::open(&a, 0, -1, "probe: cpu-clock on laser itself"))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Test-opens a hardware breakpoint on laser itself.
fn test_watch() -> Result<(), String> {
    sys::open(
        &attr::watch(Binding::Attach, 1),
        0,
        -1,
        "probe: hardware breakpoint on laser itself",
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// [`Facts::gather_for`] + [`decide`].
pub fn probe(request: Request) -> Result<Choice, DriverError> {
    decide(&Facts::gather_for(request), request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Facts {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs")
            .join(name);
        let cpuinfo = std::fs::read_to_string(dir.join("cpuinfo")).unwrap();
        Facts::from_tree(&DirTree(dir.join("devices")), &cpuinfo)
    }

    fn vm() -> Facts {
        fixture("kvm-no-pmu")
    }

    #[test]
    fn vm_without_pmu_chooses_soft_and_says_why() {
        let c = decide(&vm(), Request::Auto).unwrap();
        assert_eq!(c.backend, BackendKind::Soft);
        assert!(c.reason.contains("no core PMU"), "{}", c.reason);
        assert!(c.reason.contains("ibs_op does not exist"), "{}", c.reason);
    }

    #[test]
    fn explicit_pebs_and_ibs_name_what_is_missing() {
        let m = decide(&vm(), Request::Backend(BackendKind::Pebs))
            .unwrap_err()
            .to_string();
        assert!(m.contains("no PEBS") && m.contains("--backend soft"), "{m}");
        // An AMD machine has a `cpu` PMU but no mem-loads event.
        let m = decide(&fixture("zen4"), Request::Backend(BackendKind::Pebs))
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("no event mem-loads") && m.contains("cpu/events"),
            "{m}"
        );
        let c = decide(&fixture("skylake-sp"), Request::Backend(BackendKind::Pebs)).unwrap();
        assert_eq!(c.backend, BackendKind::Pebs);
        assert!(
            c.reason.contains("mem-loads type 4 config 0x1cd"),
            "{}",
            c.reason
        );
        let c = decide(&fixture("zen4"), Request::Backend(BackendKind::Ibs)).unwrap();
        assert!(c.reason.contains("ibs_op type 11"), "{}", c.reason);
        let m = decide(&vm(), Request::Backend(BackendKind::Ibs))
            .unwrap_err()
            .to_string();
        assert!(m.contains("no IBS"), "{m}");
        let m = decide(&fixture("zen3"), Request::Backend(BackendKind::Ibs))
            .unwrap_err()
            .to_string();
        assert!(m.contains("Zen 3") && m.contains("unreliably"), "{m}");
        let m = decide(&fixture("skylake-sp"), Request::Auto)
            .unwrap()
            .reason;
        assert!(
            m.contains("pebs hardware found, but auto does not pick pebs"),
            "{m}"
        );
        assert!(m.contains("no IBS"), "{m}");
    }

    #[test]
    fn soft_failing_is_an_error_with_the_cause() {
        let mut f = vm();
        f.soft_open = Err("permission denied".into());
        let m = decide(&f, Request::Auto).unwrap_err().to_string();
        assert!(m.contains("permission denied"), "{m}");
        assert!(decide(&f, Request::Backend(BackendKind::Watch)).is_ok());
    }

    #[test]
    fn cpuinfo_is_read_only_where_ibs_may_need_it() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs");
        let read = std::cell::Cell::new(0);
        let read = &read;
        let cpuinfo = |name: &str| {
            let text = std::fs::read_to_string(root.join(name).join("cpuinfo")).unwrap();
            move || {
                read.set(read.get() + 1);
                text
            }
        };
        for name in ["kvm-no-pmu", "skylake-sp"] {
            let tree = DirTree(root.join(name).join("devices"));
            let f = Facts::from_tree_with(&tree, cpuinfo(name));
            assert!(f.ibs.is_err(), "{name}");
        }
        assert_eq!(read.get(), 0, "no ibs_op PMU: /proc/cpuinfo is not read");
        // With an IBS PMU the CPU's identity still decides (Zen 3's IBS is refused).
        let tree = DirTree(root.join("zen3").join("devices"));
        let f = Facts::from_tree_with(&tree, cpuinfo("zen3"));
        assert_eq!(read.get(), 1);
        assert!(f.ibs.unwrap_err().contains("Zen 3"));
    }

    #[test]
    fn request_parsing() {
        assert_eq!(Request::parse("auto"), Some(Request::Auto));
        assert_eq!(
            Request::parse("watch"),
            Some(Request::Backend(BackendKind::Watch))
        );
        assert_eq!(Request::parse("fast"), None);
    }

    #[test]
    fn this_machine_gathers_facts_and_auto_decides() {
        // No PMU is exposed on the machines this project runs on: the facts say so. (On a
        // machine with one, this checks only that gathering and deciding agree.)
        let f = Facts::gather();
        let c = decide(&f, Request::Auto);
        if f.soft_open.is_ok() && !AUTO_PICKS_PRECISE {
            let c = c.unwrap();
            assert_eq!(c.backend, BackendKind::Soft, "{}", c.reason);
        } else {
            assert!(c.is_err());
        }
    }
}
