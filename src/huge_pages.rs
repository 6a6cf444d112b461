//! The process's allocator: the system's, with every block of 2 MiB or more
//! marked for transparent huge pages (`madvise(MADV_HUGEPAGE)`).
//!
//! A long simulation holds a few very large vectors (a 10,000,000-request
//! run: 3.3 GB of request records, workload and results). Where the kernel
//! gives huge pages only on request (`/sys/kernel/mm/transparent_hugepage/
//! enabled` = `madvise`, the common distribution default), each 4 KiB page
//! of them is a separate page fault and TLB entry. On the 2-core build VM
//! (docs/speed.md, "Huge pages for large blocks") that run took 1,063,174–
//! 1,065,594 minor faults and 2.26–2.28 s of system time without the hint,
//! 106,487–106,770 faults and 1.15 s with it. Where the setting is `never`
//! the hint changes nothing; where it is `always`, the hint changes only the
//! defragmentation policy (with `defrag = madvise`, the default, a fault in
//! an advised range may compact memory directly, a stall of its own).
//!
//! The advice covers the whole pages the block spans. glibc serves a large
//! block from a mapping of its own or, once its dynamic threshold has risen
//! (up to 32 MiB), from the heap or an arena; advising part of the heap
//! splits that mapping, which costs nothing. For a block of its own mapping,
//! the advice starts at the mapping's start; for a size within 24 bytes
//! below a page multiple the mapping's last page is left out, which splits
//! it, and a later `realloc` of that block copies instead of remapping in
//! place. A failed `madvise` is ignored (it is a hint; errno is left set).

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

/// Advises the pages of `[ptr, ptr + size)` (`size` in bytes) to use huge
/// pages when `size` is at least [`HUGE_PAGE`]; returns `ptr`. A null `ptr`
/// is returned as is, and a failed `madvise` is ignored.
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
