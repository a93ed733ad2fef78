//! `laser run` names a falsely shared heap object by its malloc block: a program mallocs one
//! 40-byte struct whose first two longs two threads bump; the JSON report must name that
//! block (the pointer the program printed, its usable size) with the contended bytes as
//! offsets inside it.

mod c_run;

use c_run::Run;

const PROGRAM: &str = r#"
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct stats { long a; long b; char note[24]; };  /* 40 bytes: a 48-byte chunk */
static struct stats *s;
static volatile int stop;

__attribute__((noinline)) void bump(volatile long *p) { (*p)++; }

static void *worker(void *arg) {
    volatile long *p = arg ? &s->b : &s->a;
    while (!stop) bump(p);
    return NULL;
}

int main(void) {
    void *other[3] = { malloc(100), malloc(16), malloc(300) };  /* not the first block */
    s = malloc(sizeof *s);
    printf("block %p %zu\n", (void *)s, malloc_usable_size(s));
    fflush(stdout);
    pthread_t t[2];
    for (long k = 0; k < 2; k++) pthread_create(&t[k], NULL, worker, (void *)k);
    usleep(2000000);
    stop = 1;
    for (int k = 0; k < 2; k++) pthread_join(t[k], NULL);
    printf("a %ld b %ld\n", s->a, s->b);
    free(other[0]); free(other[1]); free(other[2]);
    return 0;
}
"#;

#[test]
fn run_names_the_malloc_block_and_offsets_inside_it() {
    let dir = c_run::temp_dir("heap-naming");
    let exe = c_run::compile(&dir, "heapfs", PROGRAM);
    let Run {
        stdout,
        ctx,
        report,
    } = c_run::laser_run(&exe);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("block "))
        .unwrap_or_else(|| panic!("program printed no block: {ctx}"));
    let (ptr, usable) = line.split_once(' ').unwrap();
    let ptr = u64::from_str_radix(ptr.trim_start_matches("0x"), 16).unwrap();
    let usable: u64 = usable.parse().unwrap();
    assert_eq!(usable, 40, "glibc's usable size for a 40-byte request");

    let findings = report["findings"].as_array().unwrap();
    let f = findings
        .iter()
        .find(|f| f["data"]["kind"] == "heap" && f["line_addr"] == format!("{:#x}", ptr & !63))
        .unwrap_or_else(|| panic!("no heap finding on {ptr:#x}'s line: {report:#}\n{ctx}"));
    assert_eq!(f["kind"], "false_sharing", "{f:#}");
    let blocks = f["data"]["blocks"].as_array().expect("blocks named");
    assert_eq!(blocks.len(), 1, "{f:#}");
    let b = &blocks[0];
    assert_eq!(b["addr"], format!("{ptr:#x}"), "{f:#}");
    assert_eq!(b["size"], 40, "{f:#}");
    assert_eq!(b["arena"], "main", "{f:#}");
    let offsets: Vec<u64> = b["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    // `a` is bytes 0..8 of the block, `b` bytes 8..16: both written, nothing else.
    assert!(
        offsets.contains(&0) && offsets.contains(&8) && offsets.iter().all(|&o| o < 16),
        "{offsets:?}\n{f:#}"
    );
    assert_eq!(
        f["data"]["name"],
        format!("heap block {ptr:#x} (40 bytes)"),
        "{f:#}"
    );
    let fix = f["fix"].as_str().unwrap();
    assert!(
        fix.starts_with(&format!(
            "False sharing inside one 40-byte heap block at {ptr:#x}"
        )),
        "{fix}"
    );
    assert!(
        stdout.contains(&format!(
            "data     heap block {ptr:#x} (40 bytes, main arena)"
        )),
        "{ctx}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
