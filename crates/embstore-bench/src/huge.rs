//! Memory for the peers, backed like the index's (`embstore_index::mem`): 2 MiB-aligned maps
//! advised to use transparent huge pages (or not), so every structure pays the same TLB costs.

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};
use embstore_index::mem::{map_zeroed, unmap, HUGE_PAGE};

/// An allocator for `hashbrown`: allocations of 2 MiB and more are mapped like the index's
/// bucket array; smaller ones go to the global allocator.
#[derive(Clone, Copy, Debug)]
pub struct PageAlloc {
    pub huge_pages: bool,
}

// SAFETY: large blocks are fresh maps of at least `layout.size()` bytes aligned to 2 MiB (which
// satisfies any alignment up to 2 MiB) and are returned to `munmap` with the same size; small
// blocks are delegated to `Global` both ways, chosen by the same size test.
unsafe impl Allocator for PageAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() < HUGE_PAGE || layout.align() > HUGE_PAGE {
            return Global.allocate(layout);
        }
        let ptr = map_zeroed(layout.size(), self.huge_pages).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(ptr, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() < HUGE_PAGE || layout.align() > HUGE_PAGE {
            // SAFETY: this block came from `Global.allocate` with this layout (same test).
            unsafe { Global.deallocate(ptr, layout) };
        } else {
            // SAFETY: this block came from `map_zeroed` with this size (same test), and the
            // caller (hashbrown) no longer uses it.
            unsafe { unmap(ptr, layout.size()) };
        }
    }
}

/// A zero-initialised `[u64]` backed by a map with huge-page advice (the random-access bound).
pub struct PageArray {
    ptr: NonNull<u64>,
    len: usize,
}

impl PageArray {
    pub fn zeroed(len: usize, huge_pages: bool) -> PageArray {
        let bytes = len.checked_mul(8).expect("array size").max(8);
        let ptr = map_zeroed(bytes, huge_pages).expect("out of memory").cast();
        PageArray { ptr, len }
    }

    pub fn as_slice(&self) -> &[u64] {
        // SAFETY: `len` zeroed u64s mapped for the lifetime of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u64] {
        // SAFETY: as in `as_slice`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageArray {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_zeroed` with this size in `zeroed`; `&mut self` ends all use.
        unsafe { unmap(self.ptr.cast(), (self.len * 8).max(8)) };
    }
}

/// Kilobytes of anonymous memory backed by huge pages in this process right now.
pub fn anon_huge_kb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
