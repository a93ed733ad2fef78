//! `laser run` shows where the program called into a library: two threads take one pthread
//! mutex from two call sites, the contended instructions are in glibc's mutex code, and the
//! report must name both of the program's calling lines (JSON `called_from`, text "called
//! from"), found from return addresses on the sampled stacks.

mod c_run;

use c_run::Run;

const PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <time.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static long shared;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void from_a(void) {
    pthread_mutex_lock(&m); /* @call_a */
    shared++;
    pthread_mutex_unlock(&m);
}

__attribute__((noinline)) static void from_b(void) {
    pthread_mutex_lock(&m); /* @call_b */
    shared += 2;
    pthread_mutex_unlock(&m);
}

static void *worker(void *arg) {
    double end = now() + 1.0;
    while (now() < end)
        for (int i = 0; i < 1000; i++)
            arg ? from_b() : from_a();
    return NULL;
}

int main(void) {
    pthread_t t[2];
    for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, worker, (void *)k);
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    printf("%ld\n", shared);
    return 0;
}
"#;

fn marker_line(tag: &str) -> u64 {
    PROGRAM
        .lines()
        .position(|l| l.contains(tag))
        .map(|i| i as u64) // PROGRAM starts with a newline: line 1 is the empty first line
        .unwrap()
}

#[test]
fn run_names_the_programs_lines_that_called_the_contended_library_code() {
    let dir = c_run::temp_dir("call-sites");
    let exe = c_run::compile(&dir, "callsites", PROGRAM.strip_prefix('\n').unwrap());
    let Run {
        stdout,
        ctx,
        report,
    } = c_run::laser_run(&exe);

    let (line_a, line_b) = (marker_line("@call_a"), marker_line("@call_b"));
    let mut lib_sources = 0;
    let mut sites = std::collections::BTreeSet::new();
    for f in report["findings"].as_array().unwrap() {
        for s in f["sources"].as_array().unwrap() {
            let in_libc = s["module"].as_str().is_some_and(|m| m.contains("libc"));
            if !in_libc {
                continue;
            }
            lib_sources += 1;
            for c in s["called_from"].as_array().into_iter().flatten() {
                assert!(
                    c["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with("callsites.c")),
                    "a call site outside the program: {c:#}\n{ctx}"
                );
                sites.insert((c["line"].as_u64().unwrap(), c["function"].to_string()));
            }
        }
    }
    assert!(
        lib_sources > 0,
        "no contended glibc instruction found:\n{ctx}"
    );
    // Both lock calls; the unlocks are tail calls at -O2 (a jmp leaves no return address),
    // so they show the line in `worker` that called from_a or from_b.
    for want in [
        (line_a, "\"from_a\"".to_string()),
        (line_b, "\"from_b\"".to_string()),
    ] {
        assert!(sites.contains(&want), "{want:?} not in {sites:?}\n{ctx}");
    }
    assert!(
        stdout.contains(&format!("called from callsites.c:{line_a} in from_a"))
            || stdout.contains(&format!("callsites.c:{line_a} in from_a (")),
        "{ctx}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
