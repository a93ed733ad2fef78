//! PEBS and IBS events planned from the sysfs trees of machine generations this project does
//! not have (`fixtures/sysfs/README.md` gives each tree's provenance). Expected encodings are
//! the kernel's event strings placed by hand: `event` in config bits 0–7, `umask` 8–15,
//! `ldlat` in config1 bits 0–15.

use std::path::PathBuf;

use laser_driver::attr::{Binding, MEM_SAMPLE_TYPE};
use laser_driver::pmu::cpuinfo::CpuId;
use laser_driver::pmu::pebs::{self, open_precise, CorePlan, PebsOptions};
use laser_driver::pmu::sysfs::{read_all, DirTree, Pmu};
use laser_driver::pmu::{ibs, PmuError};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn pmus(name: &str) -> Vec<Pmu> {
    read_all(&DirTree(dir(name).join("devices"))).unwrap()
}

fn cpu(name: &str) -> CpuId {
    CpuId::parse(&std::fs::read_to_string(dir(name).join("cpuinfo")).unwrap()).unwrap()
}

fn plan(name: &str) -> Vec<CorePlan> {
    pebs::plan(&pmus(name), &PebsOptions::default()).unwrap()
}

// SAFETY (all three): the unions hold plain u64s, any bits are valid.
fn config1(a: &perf_event_open_sys::bindings::perf_event_attr) -> u64 {
    unsafe { a.__bindgen_anon_3.config1 }
}
fn period(a: &perf_event_open_sys::bindings::perf_event_attr) -> u64 {
    unsafe { a.__bindgen_anon_1.sample_period }
}

/// (pmu, type, load config, store config, aux config, precise start)
type Expect = (&'static str, u32, u64, Option<u64>, Option<u64>, u8);

fn check(name: &str, expect: &[Expect]) {
    let plans = plan(name);
    assert_eq!(plans.len(), expect.len(), "{name}");
    for (p, &(pmu, ty, load, store, aux, precise)) in plans.iter().zip(expect) {
        assert_eq!(p.pmu, pmu, "{name}");
        assert_eq!(p.load.type_, ty, "{name} {pmu}");
        assert_eq!(p.load.config, load, "{name} {pmu} load");
        // ldlat=3 from sysfs is overridden by c2c's 30, in the place the format file says.
        assert_eq!(config1(&p.load), pebs::DEFAULT_LDLAT, "{name} {pmu} ldlat");
        assert_eq!(period(&p.load), pebs::DEFAULT_LOAD_PERIOD);
        assert_eq!(p.load.sample_type, MEM_SAMPLE_TYPE);
        assert_eq!(p.load.precise_ip() as u8, precise, "{name} {pmu}");
        assert_eq!(p.precise_start, precise);
        assert_eq!(p.store.map(|s| s.config), store, "{name} {pmu} store");
        if let Some(s) = &p.store {
            assert_eq!((s.type_, config1(s)), (ty, 0), "{name} {pmu} store");
            assert_eq!(period(s), pebs::DEFAULT_STORE_PERIOD);
        }
        assert_eq!(p.aux_leader.map(|a| a.config), aux, "{name} {pmu} aux");
        if let Some(a) = &p.aux_leader {
            // The leader only counts; the member is enabled through it.
            assert_eq!((period(a), a.sample_type, a.type_), (0, 0, ty));
            assert_eq!((a.enable_on_exec(), p.load.enable_on_exec()), (1, 0));
            assert_eq!(p.load.disabled(), 0);
        } else {
            assert_eq!(p.load.enable_on_exec(), 1);
        }
        assert_eq!(p.load.exclude_kernel(), 1);
    }
}

#[test]
fn haswell_has_no_max_precise_so_starts_at_3() {
    check("haswell", &[("cpu", 4, 0x01cd, Some(0x82d0), None, 3)]);
}

#[test]
fn skylake_sp_and_icelake_sp_use_hsw_memory_events() {
    check("skylake-sp", &[("cpu", 4, 0x01cd, Some(0x82d0), None, 3)]);
    check("icelake-sp", &[("cpu", 4, 0x01cd, Some(0x82d0), None, 3)]);
}

#[test]
fn sapphire_rapids_groups_loads_under_mem_loads_aux() {
    check(
        "sapphire-rapids",
        &[("cpu", 4, 0x01cd, Some(0x02cd), Some(0x8203), 3)],
    );
}

#[test]
fn alder_lake_gets_one_plan_per_core_pmu_with_its_own_type_and_encodings() {
    check(
        "alderlake",
        &[
            ("cpu_core", 4, 0x01cd, Some(0x02cd), Some(0x8203), 3),
            ("cpu_atom", 10, 0x05d0, Some(0x06d0), None, 3),
        ],
    );
}

#[test]
fn store_sampling_is_optional_and_ldlat_must_fit_its_format() {
    let opts = PebsOptions {
        store_period: None,
        ldlat: 0x1_0000,
        ..PebsOptions::default()
    };
    let e = pebs::plan(&pmus("skylake-sp"), &opts).unwrap_err();
    assert!(matches!(e, PmuError::TermTooWide { width: 16, .. }), "{e}");
    let opts = PebsOptions {
        store_period: None,
        binding: Binding::Attach,
        ..PebsOptions::default()
    };
    let p = pebs::plan(&pmus("skylake-sp"), &opts).unwrap();
    assert!(p[0].store.is_none());
    assert_eq!((p[0].load.enable_on_exec(), p[0].load.inherit()), (0, 0));
}

#[test]
fn amd_and_pmu_less_machines_have_no_pebs_and_say_what_is_missing() {
    for (name, want) in [
        ("zen2", "no event mem-loads"),
        ("zen4", "no event mem-loads"),
        ("kvm-no-pmu", "no core PMU"),
    ] {
        let e = pebs::plan(&pmus(name), &PebsOptions::default()).unwrap_err();
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
}

#[test]
fn precise_ip_is_tried_from_3_down_and_stops_at_1() {
    let a = plan("haswell")[0].load;
    // A Haswell-like kernel: precise 3 is EINVAL, 2 works.
    let mut tried = Vec::new();
    let (fd, p) = open_precise(
        &a,
        3,
        |a| {
            tried.push(a.precise_ip());
            if a.precise_ip() > 2 {
                Err(libc::EINVAL)
            } else {
                Ok(7)
            }
        },
        |e| pebs::precise_retry_errno(*e),
    )
    .unwrap();
    assert_eq!((fd, p, tried), (7, 2, vec![3, 2]));
    // EACCES is not a precision problem: no retry. EINVAL all the way: 3, 2, 1, then the error.
    let mut n = 0;
    let r: Result<((), u8), i32> = open_precise(
        &a,
        3,
        |_| {
            n += 1;
            Err(libc::EACCES)
        },
        |e| pebs::precise_retry_errno(*e),
    );
    assert_eq!((r, n), (Err(libc::EACCES), 1));
    let mut tried = Vec::new();
    let r: Result<((), u8), i32> = open_precise(
        &a,
        3,
        |a| {
            tried.push(a.precise_ip());
            Err(libc::EOPNOTSUPP)
        },
        |e| pebs::precise_retry_errno(*e),
    );
    assert_eq!((r, tried), (Err(libc::EOPNOTSUPP), vec![3, 2, 1]));
}

#[test]
fn ibs_op_on_zen2_and_zen4_refused_on_zen3() {
    for name in ["zen2", "zen4"] {
        let a = ibs::plan(
            &pmus(name),
            Some(&cpu(name)),
            Binding::Launch,
            ibs::DEFAULT_OP_PERIOD,
        )
        .unwrap();
        assert_eq!(a.type_, 11, "{name}: the ibs_op type from sysfs");
        assert_eq!(a.config, 1 << 19, "{name}: cnt_ctl");
        assert_eq!(period(&a) % 16, 0);
        assert_eq!(a.sample_type, MEM_SAMPLE_TYPE);
        assert_eq!(a.exclude_kernel(), 0);
    }
    let e = ibs::plan(&pmus("zen3"), Some(&cpu("zen3")), Binding::Launch, 100_000).unwrap_err();
    assert!(e.to_string().contains("Zen 3"), "{e}");
    let e = ibs::plan(
        &pmus("kvm-no-pmu"),
        Some(&cpu("kvm-no-pmu")),
        Binding::Launch,
        1,
    )
    .unwrap_err();
    assert_eq!(e, PmuError::NoIbsOp);
    // A period below the hardware's minimum is raised and kept a multiple of 16.
    let a = ibs::plan(&pmus("zen4"), None, Binding::Launch, 0x37).unwrap();
    assert_eq!(period(&a), 0x30);
}
