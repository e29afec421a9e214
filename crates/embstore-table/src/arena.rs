//! Row arenas: fixed-stride rows of f32 (or, for 16-bit values, u16 bits) in chunks.
//!
//! A slot `i` lives in chunk `i >> CHUNK_LOG2` at row `i & (CHUNK_ROWS - 1)`. The first chunk
//! grows gradually — by 1.5× from [`FIRST_ROWS`] rows, moving its rows — up to [`CHUNK_ROWS`]
//! rows; every later chunk is full-size from the start and never moves. So a shard with 100
//! rows holds room for about 100 rows (not 16 Ki), while a big one is a list of full chunks:
//! growing it never copies rows or doubles the memory for a moment, as a `Vec` would. A chunk of
//! 2 MiB or more is a zeroed map advised for transparent huge pages (16 Ki rows × 64 floats ×
//! 4 B = 4 MiB), so a 10-GB arena costs no TLB misses beyond the index's; smaller chunks come
//! from the allocator, where a huge page would cost more memory than it saves in misses.

use std::marker::PhantomData;
use std::ptr::NonNull;

use embstore_index::mem;

/// Rows per chunk: 2^14.
const CHUNK_LOG2: u32 = 14;
const CHUNK_ROWS: usize = 1 << CHUNK_LOG2;
/// Rows of the first chunk when it is first made (it then grows by 1.5×: a shard holding one
/// row of `D = 4096` holds 16 KiB, not 64).
const FIRST_ROWS: usize = 1;

/// An arena's element: a plain number whose all-zero bytes are a valid zero.
pub(crate) trait Elem: Copy + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for u16 {}

struct Chunk<T> {
    ptr: NonNull<T>,
    bytes: usize,
    rows: usize,
    mapped: bool,
}

impl<T: Elem> Chunk<T> {
    /// A zeroed chunk of `rows` rows of `stride` elements (`stride > 0`).
    fn new(rows: usize, stride: usize, huge_pages: bool) -> Option<Self> {
        let bytes = rows.checked_mul(stride)?.checked_mul(std::mem::size_of::<T>())?;
        if bytes >= mem::HUGE_PAGE {
            let ptr = mem::map_zeroed(bytes, huge_pages)?;
            Some(Self { ptr: ptr.cast(), bytes, rows, mapped: true })
        } else {
            let layout = std::alloc::Layout::from_size_align(bytes, 64).ok()?;
            // SAFETY: `bytes > 0` (the arena never makes chunks for stride 0 or 0 rows) and the
            // layout is valid (checked by `from_size_align`).
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            Some(Self { ptr: NonNull::new(ptr)?.cast(), bytes, rows, mapped: false })
        }
    }
}

impl<T> Drop for Chunk<T> {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: the pointer and size are those `map_zeroed` returned and were asked for,
            // released once, here, and no row borrows outlive the arena that owns this chunk.
            unsafe { mem::unmap(self.ptr.cast(), self.bytes) };
        } else {
            let layout = std::alloc::Layout::from_size_align(self.bytes, 64).expect("valid layout");
            // SAFETY: allocated by `alloc_zeroed` with this very layout in `Chunk::new`.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

/// Fixed-stride rows of `T` addressed by slot.
pub(crate) struct Arena<T: Elem = f32> {
    stride: usize,
    huge_pages: bool,
    chunks: Vec<Chunk<T>>,
    _elem: PhantomData<T>,
}

// SAFETY: an `Arena` owns its chunks exclusively (like a `Vec<T>`); shared access only reads
// through `&self` and writes need `&mut self`.
unsafe impl<T: Elem> Send for Arena<T> {}
// SAFETY: as above; `&Arena` gives out only shared slices.
unsafe impl<T: Elem> Sync for Arena<T> {}

impl<T: Elem> std::fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("stride", &self.stride)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl<T: Elem> Arena<T> {
    pub(crate) fn new(stride: usize, huge_pages: bool) -> Self {
        Self { stride, huge_pages, chunks: Vec::new(), _elem: PhantomData }
    }

    /// Elements per row.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Slots the arena can hold without allocating.
    pub(crate) fn capacity(&self) -> usize {
        match self.chunks.first() {
            _ if self.stride == 0 => usize::MAX,
            None => 0,
            Some(first) => first.rows + (self.chunks.len() - 1) * CHUNK_ROWS,
        }
    }

    /// Bytes mapped or allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.bytes).sum()
    }

    /// Makes room for slots `0..slots`; false when the memory cannot be had (the arena is then
    /// as it was). The first chunk grows by 1.5× (or to `slots` when that is more) until it is
    /// full-size; then whole chunks are added.
    pub(crate) fn ensure(&mut self, slots: usize) -> bool {
        if self.stride == 0 {
            return true;
        }
        while self.capacity() < slots {
            let grown = match self.chunks.first() {
                None => {
                    Chunk::new(slots.clamp(FIRST_ROWS, CHUNK_ROWS), self.stride, self.huge_pages)
                        .map(|c| self.chunks.push(c))
                }
                Some(first) if first.rows < CHUNK_ROWS => {
                    let rows = (first.rows + first.rows / 2).max(slots).min(CHUNK_ROWS);
                    self.regrow_first(rows)
                }
                Some(_) => Chunk::new(CHUNK_ROWS, self.stride, self.huge_pages)
                    .map(|c| self.chunks.push(c)),
            };
            if grown.is_none() {
                return false;
            }
        }
        true
    }

    /// Moves the first (and only) chunk into one of `rows` rows, bigger or smaller: the rows
    /// it can hold keep their values.
    fn regrow_first(&mut self, rows: usize) -> Option<()> {
        debug_assert_eq!(self.chunks.len(), 1);
        let next = Chunk::new(rows, self.stride, self.huge_pages)?;
        let old = &self.chunks[0];
        // SAFETY: both chunks are live, distinct allocations, and the copy is no longer than
        // either of them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                old.ptr.as_ptr(),
                next.ptr.as_ptr(),
                old.bytes.min(next.bytes) / std::mem::size_of::<T>(),
            )
        };
        self.chunks[0] = next;
        Some(())
    }

    /// Gives back the room past slot `rows` (slots `0..rows` keep their values): whole chunks
    /// are dropped, and a first chunk that is the only one is moved into one of `rows` rows.
    /// A no-op where that would free nothing, or (the arena is then as it was) where the
    /// smaller chunk cannot be had.
    pub(crate) fn truncate(&mut self, rows: usize) {
        if self.stride == 0 || self.capacity() <= rows {
            return;
        }
        if rows == 0 {
            self.chunks.clear();
        } else if self.chunks.len() > 1 {
            self.chunks.truncate(rows.div_ceil(CHUNK_ROWS));
        } else {
            let _ = self.regrow_first(rows);
        }
    }

    /// Copies the row at `from` over the row at `to` (both below `capacity()`).
    pub(crate) fn copy_row(&mut self, from: usize, to: usize) {
        if self.stride == 0 || from == to {
            return;
        }
        let (src, dst) = (self.ptr(from), self.ptr(to));
        // SAFETY: both rows lie inside live chunks (`ptr` checks the slots), hold `stride`
        // elements each, and are distinct rows (`from != to`), so they do not overlap; `&mut
        // self` keeps every other borrow away.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, self.stride) };
    }

    /// Copies the row at `from` of `other` (an arena of the same stride) over this arena's
    /// row at `to`.
    pub(crate) fn copy_row_from(&mut self, other: &Arena<T>, from: usize, to: usize) {
        debug_assert_eq!(self.stride, other.stride);
        let row = other.row(from);
        self.row_mut(to).copy_from_slice(row);
    }

    #[inline(always)]
    fn ptr(&self, slot: usize) -> *mut T {
        let chunk = &self.chunks[slot >> CHUNK_LOG2];
        let row = slot & (CHUNK_ROWS - 1);
        assert!(row < chunk.rows, "slot {slot} is past the arena's {} rows", self.capacity());
        // SAFETY: the assert above keeps the row inside the chunk (the chunk lookup is bounds
        // checked too), so the offset stays inside the chunk's allocation.
        unsafe { chunk.ptr.as_ptr().add(row * self.stride) }
    }

    /// The row at `slot` (which must be below `capacity()`).
    #[inline(always)]
    pub(crate) fn row(&self, slot: usize) -> &[T] {
        if self.stride == 0 {
            return &[];
        }
        // SAFETY: `ptr` points at `stride` initialised (zeroed or written) elements inside a live
        // chunk; the shared borrow of `self` keeps every writer (`&mut self`) away.
        unsafe { std::slice::from_raw_parts(self.ptr(slot), self.stride) }
    }

    /// The row at `slot`, mutably.
    #[inline(always)]
    pub(crate) fn row_mut(&mut self, slot: usize) -> &mut [T] {
        if self.stride == 0 {
            return &mut [];
        }
        // SAFETY: as in `row`, and `&mut self` makes this the only borrow of the row.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(slot), self.stride) }
    }

    /// Hints that `slot`'s row will be read soon (every cacheline of it).
    #[inline(always)]
    pub(crate) fn prefetch(&self, slot: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.stride != 0 {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.ptr(slot).cast::<i8>();
            for line in (0..self.stride * std::mem::size_of::<T>()).step_by(64) {
                // SAFETY: prefetching never faults; the address is inside the row.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_chunk_grows_gradually() {
        let mut a = Arena::<f32>::new(64, true);
        assert!(a.ensure(1));
        assert_eq!((a.capacity(), a.bytes()), (FIRST_ROWS, FIRST_ROWS * 256));
        a.row_mut(0).fill(7.0);
        assert!(a.ensure(2) && a.ensure(3) && a.ensure(4) && a.ensure(5));
        assert_eq!(a.capacity(), 6);
        assert!(a.ensure(100));
        assert_eq!(a.capacity(), 100);
        assert_eq!(a.row(0), &[7.0; 64]);
        assert!(!a.chunks[0].mapped);
    }

    #[test]
    fn rows_are_zeroed_distinct_and_stable_across_growth() {
        let mut a = Arena::<f32>::new(3, false);
        assert!(a.ensure(1));
        a.row_mut(0).copy_from_slice(&[1.0, 2.0, 3.0]);
        assert!(a.ensure(3 * CHUNK_ROWS));
        assert_eq!(a.row(0), &[1.0, 2.0, 3.0]);
        assert_eq!(a.row(2 * CHUNK_ROWS + 5), &[0.0; 3]);
        a.row_mut(CHUNK_ROWS).fill(9.0);
        assert_eq!(a.row(CHUNK_ROWS - 1), &[0.0; 3]);
        assert_eq!(a.capacity(), 3 * CHUNK_ROWS);
    }

    #[test]
    fn stride_zero_needs_no_memory() {
        let mut a = Arena::<f32>::new(0, true);
        assert!(a.ensure(1 << 40));
        assert_eq!(a.bytes(), 0);
        assert!(a.row(123).is_empty());
    }

    #[test]
    fn truncating_keeps_the_rows_below_and_frees_the_rest() {
        let mut a = Arena::<f32>::new(4, false);
        assert!(a.ensure(1000));
        for s in 0..1000 {
            a.row_mut(s).fill(s as f32);
        }
        a.copy_row(999, 3);
        a.truncate(500);
        assert_eq!((a.capacity(), a.bytes()), (500, 500 * 16));
        assert_eq!(a.row(3), &[999.0; 4]);
        assert_eq!(a.row(499), &[499.0; 4]);
        assert!(a.ensure(CHUNK_ROWS * 3));
        a.truncate(CHUNK_ROWS + 1);
        assert_eq!(a.capacity(), 2 * CHUNK_ROWS);
        assert_eq!(a.row(10), &[10.0; 4]);
        a.truncate(0);
        assert_eq!((a.capacity(), a.bytes()), (0, 0));
    }

    #[test]
    fn half_width_rows_take_half_the_bytes() {
        let mut a = Arena::<u16>::new(64, false);
        assert!(a.ensure(1000));
        assert_eq!(a.bytes(), 1000 * 128);
        a.row_mut(999).fill(0x3f80);
        assert!(a.ensure(CHUNK_ROWS + 1));
        assert_eq!(a.row(999), &[0x3f80; 64]);
        assert_eq!(a.row(CHUNK_ROWS), &[0; 64]);
    }

    #[test]
    fn big_chunks_are_mapped() {
        let mut a = Arena::<f32>::new(64, true);
        assert!(a.ensure(CHUNK_ROWS + 1));
        assert!(a.chunks[0].mapped && a.chunks[1].mapped);
        assert_eq!(a.bytes(), 2 * CHUNK_ROWS * 256);
    }
}
