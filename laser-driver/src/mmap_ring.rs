//! The live perf ring buffer: `1 + 2^n` pages mapped from a perf event fd. Page 0 is the
//! `perf_event_mmap_page` control page (data_head/data_tail), the rest the data area.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys::bindings::perf_event_mmap_page;

use crate::error::DriverError;
use crate::ring::RingMemory;

/// A mapped ring buffer. Owns the mapping (not the fd; the session keeps the fd).
pub struct MmapRing {
    base: NonNull<u8>,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by this value alone; the kernel side synchronises through
// data_head/data_tail atomics, so moving the owner to another thread is sound.
unsafe impl Send for MmapRing {}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl MmapRing {
    /// Maps `data_pages` (rounded up to a power of two) data pages plus the control page.
    pub fn new(fd: &OwnedFd, data_pages: usize) -> Result<Self, DriverError> {
        let pages = data_pages.max(1).next_power_of_two();
        let page = page_size();
        let map_len = (pages + 1) * page;
        // SAFETY: mapping a perf event fd read-write and shared is the documented way to get
        // its ring buffer; the kernel validates the length. We own the result until munmap.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let source = io::Error::last_os_error();
            let kib = map_len / 1024;
            let hint = if source.raw_os_error() == Some(libc::EPERM) {
                let limit = std::fs::read_to_string("/proc/sys/kernel/perf_event_mlock_kb")
                    .unwrap_or_default();
                format!(
                    " (perf_event_mlock_kb is {}: use fewer buffer pages, or raise it with \
                     `sudo sysctl kernel.perf_event_mlock_kb={}`)",
                    limit.trim(),
                    kib * 4
                )
            } else {
                String::new()
            };
            return Err(DriverError::Mmap {
                pages,
                kib,
                hint,
                source,
            });
        }
        let base = NonNull::new(p as *mut u8).ok_or_else(|| DriverError::Mmap {
            pages,
            kib: map_len / 1024,
            hint: String::new(),
            source: io::Error::other("mmap returned null"),
        })?;
        let mut ring = MmapRing {
            base,
            map_len,
            data_offset: page,
            data_size: pages * page,
        };
        // Kernels since 4.1 publish the data area's placement; trust them when set.
        let meta = ring.meta();
        // SAFETY: the control page is mapped and the kernel initialised these fields before
        // mmap returned; they never change afterwards.
        let (off, size) = unsafe { ((*meta).data_offset, (*meta).data_size) };
        if size != 0 && off as usize + size as usize <= map_len {
            ring.data_offset = off as usize;
            ring.data_size = size as usize;
        }
        Ok(ring)
    }

    fn meta(&self) -> *mut perf_event_mmap_page {
        self.base.as_ptr() as *mut perf_event_mmap_page
    }

    fn head_atomic(&self) -> &AtomicU64 {
        // SAFETY: data_head is an 8-aligned u64 in the mapped control page, valid while the
        // mapping lives (as long as &self); the kernel writes it concurrently, which is why it
        // is only accessed through an atomic.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.meta()).data_head)) }
    }

    fn tail_atomic(&self) -> &AtomicU64 {
        // SAFETY: as for data_head; data_tail is written only by us and read by the kernel.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.meta()).data_tail)) }
    }
}

impl RingMemory for MmapRing {
    fn data_size(&self) -> usize {
        self.data_size
    }

    fn head(&self) -> u64 {
        // ATOMICS: acquire pairs with the kernel's smp_store_release of data_head in
        // perf_output_put_handle: record bytes written before it are visible after this load.
        self.head_atomic().load(Ordering::Acquire)
    }

    fn tail(&self) -> u64 {
        // ATOMICS: only this reader writes data_tail, so a relaxed load sees our last store.
        self.tail_atomic().load(Ordering::Relaxed)
    }

    fn set_tail(&mut self, tail: u64) {
        // ATOMICS: release orders our reads of the consumed records before the kernel (which
        // reads data_tail with smp_load_acquire-equivalent ordering) may overwrite them.
        self.tail_atomic().store(tail, Ordering::Release)
    }

    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.data_size, "ring read out of bounds");
        // SAFETY: in bounds of the data area (checked above). The caller only asks for bytes
        // between data_tail and data_head, which the kernel does not write until we advance
        // data_tail, so no concurrent mutation aliases this shared slice.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.data_offset + off), len) }
    }
}

impl Drop for MmapRing {
    fn drop(&mut self) {
        // SAFETY: base/map_len are exactly what mmap returned; nothing borrows the mapping
        // once the owner is dropped.
        unsafe {
            libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.map_len);
        }
    }
}
