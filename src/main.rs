//! `laser`: find and repair cache-line contention in multithreaded x86-64 Linux programs.

fn main() {
    println!("laser {}", env!("CARGO_PKG_VERSION"));
}
