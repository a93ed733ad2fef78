//! Any bytes as a perf.data file: `laser import`'s reader must return an error or a partial
//! read, never panic, abort on a huge allocation, or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(imp) = laser_driver::import::read(data) {
        // Everything the importer hands on must be usable without further checks.
        let _ = imp.duration_s();
        for e in &imp.events {
            let _ = e.time();
        }
    }
});
