//! `--backend auto|pebs|ibs|soft|watch`: what this machine can do, and why laser chose what
//! it chose. Facts are gathered once ([`Facts::gather`]: sysfs PMUs and test opens) and the
//! decision is pure ([`decide`]) so it is tested on every kind of machine.

use crate::attr::{self, Binding};
use crate::error::DriverError;
use crate::event::BackendKind;
use crate::sys;

const PMU_DIR: &str = "/sys/bus/event_source/devices";

/// Whether the PEBS/IBS backends are built (issue "PEBS and IBS backends"). While false,
/// `auto` does not pick them even on hardware that has them.
const PRECISE_BACKENDS_IMPLEMENTED: bool = false;

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
    /// `/sys/bus/event_source/devices/cpu` exists (a core PMU is exposed).
    pub cpu_pmu: bool,
    /// Its `caps/pmu_name` (e.g. "skylake"), if present.
    pub pmu_name: Option<String>,
    /// `cpu/events/mem-loads` exists (PEBS load-latency events).
    pub mem_loads: bool,
    /// `ibs_op` PMU exists (AMD IBS).
    pub ibs_op: bool,
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
    /// Reads sysfs and test-opens the soft and watch events on this process.
    pub fn gather() -> Facts {
        let cpu_dir = format!("{PMU_DIR}/cpu");
        let exists = |p: &str| std::path::Path::new(p).exists();
        let test = |a: &perf_event_open_sys::bindings::perf_event_attr, what: &str| {
            sys::open(a, 0, -1, what)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        Facts {
            cpu_pmu: exists(&cpu_dir),
            pmu_name: std::fs::read_to_string(format!("{cpu_dir}/caps/pmu_name"))
                .ok()
                .map(|s| s.trim().to_string()),
            mem_loads: exists(&format!("{cpu_dir}/events/mem-loads")),
            ibs_op: exists(&format!("{PMU_DIR}/ibs_op")),
            soft_open: test(
                &attr::soft(Binding::Attach, 1000, 4096),
                "probe: cpu-clock on laser itself",
            ),
            watch_open: test(
                &attr::watch(Binding::Attach, 1),
                "probe: hardware breakpoint on laser itself",
            ),
        }
    }

    fn pebs_missing(&self) -> Option<String> {
        if !self.cpu_pmu {
            return Some(format!(
                "no PEBS: {PMU_DIR}/cpu does not exist (virtual machine without a PMU, or not \
                 an Intel CPU?)"
            ));
        }
        if !self.mem_loads {
            return Some(format!(
                "no PEBS: {PMU_DIR}/cpu/events/mem-loads does not exist (PMU {} has no \
                 load-latency events)",
                self.pmu_name.as_deref().unwrap_or("without caps/pmu_name")
            ));
        }
        None
    }

    fn ibs_missing(&self) -> Option<String> {
        (!self.ibs_op).then(|| {
            format!(
                "no IBS: {PMU_DIR}/ibs_op does not exist (not an AMD CPU, or a virtual \
                 machine that does not pass IBS through)"
            )
        })
    }
}

/// Picks a backend for `request` on a machine described by `facts`.
pub fn decide(facts: &Facts, request: Request) -> Result<Choice, DriverError> {
    let unavailable = |backend, reason: String| DriverError::BackendUnavailable { backend, reason };
    let not_built = |backend: BackendKind| {
        unavailable(
            backend,
            format!(
                "this machine has {backend} hardware, but laser's {backend} backend is not \
                 implemented yet (issue \"PEBS and IBS backends\") — use --backend soft"
            ),
        )
    };
    match request {
        Request::Backend(BackendKind::Pebs) => Err(match facts.pebs_missing() {
            Some(why) => unavailable(BackendKind::Pebs, format!("{why} — use --backend soft")),
            None => not_built(BackendKind::Pebs),
        }),
        Request::Backend(BackendKind::Ibs) => Err(match facts.ibs_missing() {
            Some(why) => unavailable(BackendKind::Ibs, format!("{why} — use --backend soft")),
            None => not_built(BackendKind::Ibs),
        }),
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
                    None if PRECISE_BACKENDS_IMPLEMENTED => {
                        return Ok(Choice {
                            backend: kind,
                            reason: format!("{kind} hardware found"),
                        })
                    }
                    None => why.push(format!(
                        "{kind} hardware found but the {kind} backend is not implemented yet"
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

/// [`Facts::gather`] + [`decide`].
pub fn probe(request: Request) -> Result<Choice, DriverError> {
    decide(&Facts::gather(), request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm() -> Facts {
        Facts {
            cpu_pmu: false,
            pmu_name: None,
            mem_loads: false,
            ibs_op: false,
            soft_open: Ok(()),
            watch_open: Ok(()),
        }
    }

    #[test]
    fn vm_without_pmu_chooses_soft_and_says_why() {
        let c = decide(&vm(), Request::Auto).unwrap();
        assert_eq!(c.backend, BackendKind::Soft);
        assert!(
            c.reason.contains("devices/cpu does not exist"),
            "{}",
            c.reason
        );
        assert!(c.reason.contains("ibs_op does not exist"), "{}", c.reason);
    }

    #[test]
    fn explicit_pebs_and_ibs_name_what_is_missing() {
        let e = decide(&vm(), Request::Backend(BackendKind::Pebs)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("no PEBS") && m.contains("--backend soft"), "{m}");
        let mut f = vm();
        f.cpu_pmu = true;
        f.pmu_name = Some("zen".into());
        let m = decide(&f, Request::Backend(BackendKind::Pebs))
            .unwrap_err()
            .to_string();
        assert!(m.contains("mem-loads") && m.contains("zen"), "{m}");
        f.mem_loads = true;
        let m = decide(&f, Request::Backend(BackendKind::Pebs))
            .unwrap_err()
            .to_string();
        assert!(m.contains("not implemented yet"), "{m}");
        let m = decide(&vm(), Request::Backend(BackendKind::Ibs))
            .unwrap_err()
            .to_string();
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
        let f = Facts::gather();
        let c = decide(&f, Request::Auto);
        if f.soft_open.is_ok() && !PRECISE_BACKENDS_IMPLEMENTED {
            let c = c.unwrap();
            assert_eq!(c.backend, BackendKind::Soft, "{}", c.reason);
        } else {
            assert!(c.is_err());
        }
    }
}
