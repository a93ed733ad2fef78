//! The chunk walker on a real glibc heap: a C program mallocs known sizes (main arena, one
//! mmapped block, one block from a thread arena), prints each pointer with its
//! `malloc_usable_size`, and waits; we read its heap through /proc/PID/mem and check that each
//! pointer is a block of that size.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};

use laser_detect::naming::heap_blocks::{blocks_on_line, ArenaKind, BlockState, Memory};

const PROGRAM: &str = r#"
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void show(const char *arena, void *p) {
    printf("%s %p %zu\n", arena, p, malloc_usable_size(p));
}

static void *thread_main(void *arg) {
    (void)arg;
    void *a = malloc(24), *b = malloc(40), *c = malloc(300);
    show("thread", a);
    show("thread", b);
    show("thread", c);
    return NULL;
}

int main(void) {
    size_t sizes[] = {16, 24, 40, 100, 1000, 5000};
    void *keep[8];
    for (int i = 0; i < 6; i++) {
        keep[i] = malloc(sizes[i]);
        show("main", keep[i]);
    }
    free(keep[3]); /* to tcache: still looks in use */
    keep[6] = malloc(300000);
    show("mmap", keep[6]);
    pthread_t t;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, NULL);
    printf("ready\n");
    fflush(stdout);
    getchar(); /* wait until the test has read us */
    return 0;
}
"#;

struct ProcMem(std::fs::File);

impl Memory for ProcMem {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.0.read_at(buf, addr).unwrap_or(0)
    }
}

#[test]
fn printed_pointers_are_blocks_of_their_usable_size() {
    if Command::new("gcc").arg("--version").output().is_err() {
        eprintln!("SKIPPED: gcc not found; this test needs it to build its C program");
        return;
    }
    let dir = std::env::temp_dir().join(format!("laser-heap-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("heap.c");
    let exe = dir.join("heap");
    std::fs::write(&src, PROGRAM).unwrap();
    let out = Command::new("gcc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut objects: Vec<(String, u64, u64)> = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l == "ready" {
            break;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let p = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
        objects.push((f[0].to_string(), p, f[2].parse().unwrap()));
    }
    let pid = child.id();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let regions = laser_detect::decode::maps::parse(&maps);
    let mut mem = ProcMem(std::fs::File::open(format!("/proc/{pid}/mem")).unwrap());
    let mut checked = Vec::new();
    for (arena, p, usable) in &objects {
        let blocks = blocks_on_line(&regions, &mut mem, p & !63, 64, 64 << 20);
        let blocks = blocks.unwrap_or_else(|e| panic!("{arena} {p:#x}: {e}\n{maps}"));
        let b = blocks
            .iter()
            .find(|b| b.user == *p)
            .unwrap_or_else(|| panic!("{arena} {p:#x} not among {blocks:x?}"));
        assert_eq!(b.usable, *usable, "{arena} {p:#x}: {b:x?}");
        let want = match arena.as_str() {
            "main" => ArenaKind::Main,
            "thread" => ArenaKind::Thread,
            _ => ArenaKind::Mmapped,
        };
        assert_eq!(b.arena, want, "{p:#x}");
        assert_ne!(b.state, BlockState::Free, "{p:#x} is live or in tcache");
        checked.push(arena.clone());
    }
    let _ = child.stdin.take().unwrap().write_all(b"\n");
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(checked.len(), 10, "{checked:?}");
}
