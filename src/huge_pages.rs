//! The process's allocator: the system's, with every block of 2 MiB or more
//! marked for transparent huge pages (`madvise(MADV_HUGEPAGE)`).
//!
//! A long simulation holds a few very large vectors (a 10,000,000-request
//! run: 3.3 GB of request records, workload and results). Where the kernel
//! gives huge pages only on request (`/sys/kernel/mm/transparent_hugepage/
//! enabled` = `madvise`, the common distribution default), each 4 KiB page
//! of them is a separate page fault and TLB entry: 1,058,906 minor faults and
//! 2.2 s of system time for that run on the 2-core build VM, 18,988 and 0.9 s
//! with the blocks marked (docs/speed.md). Where the kernel's setting is
//! `always` or `never`, the hint changes nothing.
//!
//! The advice covers the whole pages the block spans. A block of this size
//! comes from its own `mmap` in glibc (or from the top of the heap), so the
//! advice does not split the mapping, and `realloc` can still grow it in
//! place with `mremap`. A failed `madvise` is ignored: it is a hint.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks at least this large are advised (bytes): one huge page on x86-64
/// and on aarch64 with 4 KiB base pages.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// [`System`], advising large blocks to use transparent huge pages.
pub struct HugePageHint;

// SAFETY: every call is forwarded to `System` unchanged; `advise` only passes
// the kernel a hint about pages of a block this allocator just returned.
unsafe impl GlobalAlloc for HugePageHint {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        advise(System.alloc(layout), layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        advise(System.alloc_zeroed(layout), layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        advise(System.realloc(ptr, layout, new_size), new_size)
    }
}

/// Marks the pages of `[ptr, ptr + size)` for huge pages when the block is
/// large; returns `ptr`.
#[cfg(target_os = "linux")]
fn advise(ptr: *mut u8, size: usize) -> *mut u8 {
    if ptr.is_null() || size < HUGE_PAGE {
        return ptr;
    }
    // SAFETY: `sysconf` has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return ptr,
    };
    let start = ptr as usize & !(page - 1);
    let end = (ptr as usize + size).div_ceil(page) * page;
    // SAFETY: the range lies within the pages of a block the allocator just
    // returned; MADV_HUGEPAGE changes no contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
    ptr
}

/// Elsewhere there is no `madvise(MADV_HUGEPAGE)`: the block is returned as is.
#[cfg(not(target_os = "linux"))]
fn advise(ptr: *mut u8, _size: usize) -> *mut u8 {
    ptr
}
