//! The bucket layout and the flat, cacheline-aligned bucket array.
//!
//! A bucket is 16 bytes: the key, then a *value word* whose high 12 bits are the *link field*
//! and whose low 52 bits are the payload. Four buckets fill one 64-byte cacheline, and the array
//! starts on a cacheline boundary, so bucket `i` lives in cacheline `i / 4`.
//!
//! ## How an empty bucket is marked
//! Keys use all 64 bits (0 and `u64::MAX` are ordinary keys), so emptiness cannot live in the
//! key. It lives in the link field instead. The field stores `offset + 2048`, where `offset` is
//! the signed distance, in buckets, to the next node of the chain:
//!
//! | link field | meaning                                        |
//! |-----------:|------------------------------------------------|
//! | 0          | the bucket is empty (key and payload ignored)  |
//! | 1..=2047   | next node at offset -2047..=-1                 |
//! | 2048       | end of chain (offset 0: a node never points to itself) |
//! | 2049..=4095| next node at offset 1..=2047                   |
//!
//! So a bucket is empty exactly when its value word is below 2^52, and an all-zero bucket is
//! empty: freshly mapped (zero) memory is an empty table with nothing to initialise, which lets
//! the kernel hand out huge pages lazily.

use crate::mem::{self, HUGE_PAGE};
use crate::Error;

/// Bits of the value word that hold the payload.
pub(crate) const PAYLOAD_BITS: u32 = 52;
/// Mask of the payload bits.
pub(crate) const PAYLOAD_MASK: u64 = (1 << PAYLOAD_BITS) - 1;
/// Largest distance, in buckets, between two neighbouring nodes of a chain.
pub const MAX_OFFSET: usize = 2047;
/// Link-field bias: the stored field is `offset + LINK_BIAS`.
const LINK_BIAS: i64 = 2048;
/// The link bits below the top one: zero exactly for link fields 0 (empty) and 2048 (end of
/// chain), so `word & STOP_MASK == 0` tells a walking lookup to stop, whichever of the two it
/// met, with one test.
pub(crate) const STOP_MASK: u64 = 0x7ff << PAYLOAD_BITS;
/// Buckets per 64-byte cacheline.
pub(crate) const BUCKETS_PER_LINE: usize = 4;
/// Bytes per bucket: a u64 key and a u64 value word (link and payload).
pub const BUCKET_BYTES: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) key: u64,
    pub(crate) word: u64,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES);
const _: () = assert!(BUCKET_BYTES * BUCKETS_PER_LINE == 64);

impl Bucket {
    pub(crate) const EMPTY: Bucket = Bucket { key: 0, word: 0 };

    #[inline(always)]
    pub(crate) fn new(key: u64, payload: u64, offset: isize) -> Bucket {
        debug_assert!(payload <= PAYLOAD_MASK);
        debug_assert!(offset.unsigned_abs() <= MAX_OFFSET);
        let field = (offset as i64 + LINK_BIAS) as u64;
        Bucket { key, word: (field << PAYLOAD_BITS) | payload }
    }

    #[inline(always)]
    pub(crate) fn is_empty(self) -> bool {
        self.word >> PAYLOAD_BITS == 0
    }

    #[inline(always)]
    pub(crate) fn payload(self) -> u64 {
        self.word & PAYLOAD_MASK
    }

    /// Offset to the next node; 0 at the end of a chain. Meaningless for an empty bucket.
    #[inline(always)]
    pub(crate) fn offset(self) -> isize {
        ((self.word >> PAYLOAD_BITS) as i64 - LINK_BIAS) as isize
    }

    #[inline(always)]
    pub(crate) fn with_offset(self, offset: isize) -> Bucket {
        Bucket::new(self.key, self.payload(), offset)
    }

    #[inline(always)]
    pub(crate) fn with_payload(self, payload: u64) -> Bucket {
        Bucket { key: self.key, word: (self.word & !PAYLOAD_MASK) | payload }
    }
}

/// Whether buckets `a` and `b` share a cacheline.
#[inline(always)]
pub(crate) fn same_line(a: usize, b: usize) -> bool {
    a / BUCKETS_PER_LINE == b / BUCKETS_PER_LINE
}

/// A zero-initialised, 64-byte-aligned array of buckets: the table's only allocation.
pub(crate) struct Buckets {
    ptr: std::ptr::NonNull<Bucket>,
    len: usize,
    mapped: bool,
}

// SAFETY: `Buckets` owns its allocation exclusively, like a `Box<[Bucket]>`; `Bucket` is plain
// data, so moving the owner or sharing `&Buckets` across threads is sound.
unsafe impl Send for Buckets {}
// SAFETY: see `Send`: shared access only reads through `&[Bucket]`.
unsafe impl Sync for Buckets {}

impl Buckets {
    /// Allocates `len` empty buckets. Arrays of 2 MiB and more are mapped with [`mem::map_zeroed`]
    /// (huge-page advice as asked); smaller ones come from the global allocator.
    pub(crate) fn zeroed(len: usize, huge_pages: bool) -> Result<Buckets, Error> {
        let overflow = crate::error::capacity_overflow(len);
        let bytes = len.checked_mul(std::mem::size_of::<Bucket>()).ok_or(overflow.clone())?;
        if bytes > isize::MAX as usize / 2 || len == 0 {
            return Err(overflow);
        }
        if bytes >= HUGE_PAGE {
            let ptr = mem::map_zeroed(bytes, huge_pages).ok_or(overflow)?;
            return Ok(Buckets { ptr: ptr.cast(), len, mapped: true });
        }
        let layout = Self::layout(bytes);
        // SAFETY: `layout` has a non-zero size (len > 0).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw.cast::<Bucket>()).ok_or(overflow)?;
        Ok(Buckets { ptr, len, mapped: false })
    }

    fn layout(bytes: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(bytes, 64).expect("bucket array layout")
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The first bucket (for lookups that index without bounds checks).
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *const Bucket {
        self.ptr.as_ptr()
    }

    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[Bucket] {
        // SAFETY: `ptr` points to `len` initialised (zeroed or written) buckets that live as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[inline(always)]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [Bucket] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Empties every bucket.
    pub(crate) fn clear(&mut self) {
        self.as_mut_slice().fill(Bucket::EMPTY);
    }
}

impl Drop for Buckets {
    fn drop(&mut self) {
        let bytes = self.len * std::mem::size_of::<Bucket>();
        if self.mapped {
            // SAFETY: mapped by `mem::map_zeroed` with exactly these bytes in `zeroed`; `&mut
            // self` in `drop` means no reference into the array outlives this.
            unsafe { mem::unmap(self.ptr.cast(), bytes) };
        } else {
            // SAFETY: allocated by `alloc_zeroed` with this very layout in `zeroed`.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), Self::layout(bytes)) }
        }
    }
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets").field("len", &self.len).field("mapped", &self.mapped).finish()
    }
}

/// Issues a prefetch of the cacheline holding `b` into all cache levels. A hint only: it never
/// faults and changes no state that the program can observe.
#[inline(always)]
pub(crate) fn prefetch(b: &Bucket) {
    prefetch_ptr::<false>(b);
}

/// [`prefetch`] of a raw address, into L2 only (`_MM_HINT_T1`) if `L2`, else into every level
/// (`_MM_HINT_T0`): any address, even an invalid one, is allowed (a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch_ptr<const L2: bool>(b: *const Bucket) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: prefetching an address never faults and has no observable effect.
        unsafe {
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(b.cast());
            } else {
                _mm_prefetch::<_MM_HINT_T0>(b.cast());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_all_zero_and_links_round_trip() {
        assert!(Bucket::EMPTY.is_empty());
        for off in [-2047isize, -1, 0, 1, 2047] {
            for payload in [0, 1, PAYLOAD_MASK] {
                for key in [0, 1, u64::MAX] {
                    let b = Bucket::new(key, payload, off);
                    assert!(!b.is_empty());
                    assert_eq!((b.key, b.payload(), b.offset()), (key, payload, off));
                }
            }
        }
    }

    #[test]
    fn stop_mask_catches_empty_and_chain_ends_only() {
        assert_eq!(Bucket::EMPTY.word & STOP_MASK, 0);
        for payload in [0, 1, PAYLOAD_MASK] {
            assert_eq!(Bucket::new(u64::MAX, payload, 0).word & STOP_MASK, 0);
            for off in (-2047isize..=2047).filter(|&o| o != 0) {
                let b = Bucket::new(0, payload, off);
                assert_ne!(b.word & STOP_MASK, 0, "offset {off}");
            }
        }
    }

    #[test]
    fn arrays_are_zeroed_and_aligned() {
        for (len, huge) in [(8, true), (1 << 17, true), (1 << 17, false), (3 << 16, true)] {
            let b = Buckets::zeroed(len, huge).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|x| x.is_empty()));
        }
        assert!(Buckets::zeroed(0, true).is_err());
        assert!(Buckets::zeroed(usize::MAX / 4, true).is_err());
    }
}
