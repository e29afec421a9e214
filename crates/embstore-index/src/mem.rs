//! Zeroed memory for multi-GB arrays, backed by transparent huge pages.
//!
//! Large arrays that are read at random (bucket arrays, row arenas) are TLB-bound with 4 KiB
//! pages. [`map_zeroed`] maps them on a 2 MiB boundary, so that every 2 MiB can be one huge page,
//! and advises the kernel either way: `MADV_HUGEPAGE`, or `MADV_NOHUGEPAGE` so that "without"
//! really means 4 KiB pages even where the system default is `always`. Zeroed pages are
//! materialised lazily, on first touch. Elsewhere than Linux the memory comes from the global
//! allocator with 2 MiB alignment and no advice.
//!
//! The three libc calls are declared here rather than pulled from the `libc` crate: this crate
//! has no dependencies beyond std, and std already links libc on Linux.

use std::ptr::NonNull;

/// The huge-page size these maps are aligned to.
pub const HUGE_PAGE: usize = 2 << 20;

/// Maps `bytes` (> 0) of zeroed, readable and writable memory starting on a [`HUGE_PAGE`]
/// boundary, advised to use huge pages or not. `None` when the memory cannot be had. Release it
/// with [`unmap`].
pub fn map_zeroed(bytes: usize, huge_pages: bool) -> Option<NonNull<u8>> {
    if bytes == 0 || bytes > isize::MAX as usize / 2 {
        return None;
    }
    sys::map_zeroed(bytes, huge_pages)
}

/// Releases memory from [`map_zeroed`].
///
/// # Safety
/// `ptr` and `bytes` must be exactly a pointer returned by [`map_zeroed`] and the size it was
/// asked for, not released before, and no reference into the memory may be used afterwards.
pub unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: forwarded from this function's contract.
    unsafe { sys::unmap(ptr, bytes) }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::c_void;
    use std::ptr::NonNull;

    const PROT_READ: i32 = 1;
    const PROT_WRITE: i32 = 2;
    const MAP_PRIVATE: i32 = 0x02;
    const MAP_ANONYMOUS: i32 = 0x20;
    const MAP_NORESERVE: i32 = 0x4000;
    const MADV_HUGEPAGE: i32 = 14;
    const MADV_NOHUGEPAGE: i32 = 15;
    const MAP_FAILED: *mut c_void = !0usize as *mut c_void;

    extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> i32;
        fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32;
    }

    pub(super) fn map_zeroed(bytes: usize, huge_pages: bool) -> Option<NonNull<u8>> {
        let align = super::HUGE_PAGE;
        let padded = bytes.checked_add(align)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            mmap(
                std::ptr::null_mut(),
                padded,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == MAP_FAILED || raw.is_null() {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let head = aligned - start;
        let tail = padded - head - bytes;
        // SAFETY: [start, aligned) and [aligned + bytes, start + padded) lie inside the mapping
        // made above and are not handed out; unmapping them trims the padding.
        unsafe {
            if head > 0 {
                munmap(raw, head);
            }
            if tail > 0 {
                munmap((aligned + bytes) as *mut c_void, tail);
            }
        }
        let advice = if huge_pages { MADV_HUGEPAGE } else { MADV_NOHUGEPAGE };
        // SAFETY: [aligned, aligned + bytes) is mapped by us. The advice is only a hint: a kernel
        // without THP answers EINVAL and the array works the same with 4 KiB pages.
        unsafe { madvise(aligned as *mut c_void, bytes, advice) };
        NonNull::new(aligned as *mut u8)
    }

    /// # Safety
    /// See [`super::unmap`].
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: `ptr..ptr + bytes` is a live range returned by `map_zeroed` (caller's contract).
        unsafe { munmap(ptr.as_ptr().cast(), bytes) };
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::alloc::Layout;
    use std::ptr::NonNull;

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes, super::HUGE_PAGE).expect("bytes checked by map_zeroed")
    }

    pub(super) fn map_zeroed(bytes: usize, _huge_pages: bool) -> Option<NonNull<u8>> {
        // SAFETY: the layout has a non-zero size (checked by `map_zeroed`).
        NonNull::new(unsafe { std::alloc::alloc_zeroed(layout(bytes)) })
    }

    /// # Safety
    /// See [`super::unmap`].
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: allocated by `map_zeroed` with this very layout (caller's contract).
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(bytes)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_zeroed_aligned_and_writable() {
        for (bytes, huge) in [(64, true), (HUGE_PAGE, true), (3 * HUGE_PAGE + 64, false)] {
            let p = map_zeroed(bytes, huge).unwrap();
            assert_eq!(p.as_ptr() as usize % HUGE_PAGE, 0);
            // SAFETY: `bytes` mapped, zeroed bytes that only this test uses.
            let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), bytes) };
            assert!(s.iter().all(|&b| b == 0));
            s[bytes - 1] = 7;
            // SAFETY: exactly what `map_zeroed` returned; `s` is not used again.
            unsafe { unmap(p, bytes) };
        }
        assert!(map_zeroed(0, true).is_none());
        assert!(map_zeroed(usize::MAX, true).is_none());
    }
}
