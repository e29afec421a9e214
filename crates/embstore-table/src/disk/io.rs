//! Batch reads of aligned page ranges with the page cache kept out (`O_DIRECT`): the I/O engine
//! under the memory tier's cold reads (spec B.2 and E.2).
//!
//! Parts:
//! - [`PageRead`]: one read of whole blocks, `[offset, offset + len)` of an open file (offset
//!   and length multiples of the file's [`read_alignment`], itself a multiple of [`MIN_ALIGN`]);
//! - [`AlignedBuf`]: a zeroed buffer at a 4 KiB-aligned address, as `O_DIRECT` requires;
//! - [`ReadEngine`]: performs a batch of reads, all in flight together up to its queue depth;
//!   - [`Uring`]: io_uring, one thread keeping up to `depth` reads in flight;
//!   - [`PreadPool`]: blocking `pread(2)` from `threads` scoped threads (1 = sequential);
//! - [`open_direct`] opens a file for such reads, [`read_alignment`] finds the unit its reads
//!   must be aligned to (the device's logical block: 512 B on most disks, not the 4 KiB page);
//!   [`default_engine`] picks the engine.
//!
//! Invariants:
//! - offsets and lengths are multiples of [`MIN_ALIGN`] (checked before any read is issued, so a
//!   bug shows up on tmpfs too and not only on a device that enforces `O_DIRECT` alignment; the
//!   planner aligns them to the file's own [`read_alignment`], which the kernel enforces);
//! - `read_all` returns only once the kernel holds no pointer into the caller's buffers: after an
//!   error it stops issuing reads and waits for those in flight; if it cannot wait (the ring
//!   itself failed), the buffers still in flight are replaced by fresh ones and leaked;
//! - a read that ends short (end of file) is an `UnexpectedEof` error, never partial data.
//!
//! A segment record (a few hundred bytes at 64-byte alignment) spans one or two blocks, so one
//! cold record is one `PageRead` of 512 B or 1 KiB on a disk with 512-byte logical blocks (4 or
//! 8 KiB where the device's block is 4 KiB). Measured on the development VM (virtio disk,
//! 4 KiB random reads with `O_DIRECT`, fio): 19k IOPS at queue depth 1, 61k at 8, 81k at 32 and
//! 91k at 128, so a batch needs many reads in flight; `embstore-bench cold-reads` compares the
//! engines against that bound.

// Callers: the memory tier's cold reads (`tier/fault.rs`, which plans its batches with
// `plan::merged_reads`) and `embstore-bench cold-reads`.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring, Probe};

/// The alignment of every buffer's address (what `O_DIRECT` asks of memory on any device whose
/// DMA alignment is at most a page), and the alignment [`read_alignment`] falls back to when
/// it cannot find the device's.
pub const PAGE: usize = 4096;

/// The smallest logical block of a Linux block device: offsets and lengths of every read are
/// multiples of it.
pub const MIN_ALIGN: usize = 512;

/// The longest single read accepted (1 GiB): io_uring takes a `u32` length, and a cold read is
/// one or two pages.
const MAX_READ: usize = 1 << 30;

/// The queue depth of [`default_engine`]'s ring. A batch of 4,096 cold 320-byte records on the
/// development VM took 52 ms at depth 32, 47 ms at 64, 41 ms at 128 and 42 ms at 256
/// (`embstore-bench cold-reads`; the disk bound is 45 ms): 128 is where the device saturates.
/// A smaller batch keeps only as many reads in flight as it has.
pub const DEFAULT_DEPTH: u32 = 128;

/// The threads of [`default_engine`]'s fallback: blocking reads need one thread per read in
/// flight; 16 threads read a batch of 4,096 records in 53 ms, against 41 ms for io_uring at
/// depth 128 (32 threads: 48 ms, on a 2-core VM).
pub const DEFAULT_THREADS: usize = 16;

/// One read: bytes `[offset, offset + len)` of the file `fd` (`offset` and `len` multiples of
/// the file's [`read_alignment`], so of [`MIN_ALIGN`]). The caller keeps the file open until `read_all` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRead {
    pub fd: RawFd,
    pub offset: u64,
    pub len: usize,
}

/// A zero-sized type with the alignment of a page, for the dangling pointer of an empty buffer.
#[repr(C, align(4096))]
struct PageAligned([u8; 0]);

/// A buffer at an address aligned to [`PAGE`] (as `O_DIRECT` requires), zeroed, of a multiple
/// of [`MIN_ALIGN`] bytes.
pub struct AlignedBuf {
    /// Start of `len` bytes from `alloc_zeroed` with [`AlignedBuf::layout`], or a dangling
    /// page-aligned pointer when `len` is 0.
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an `AlignedBuf` owns its allocation alone (like `Box<[u8]>`); nothing else points into
// it, so moving it to another thread moves all access with it.
unsafe impl Send for AlignedBuf {}
// SAFETY: `&AlignedBuf` gives only `&[u8]` (no interior mutability), as `&Box<[u8]>` does.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    ///
    /// # Panics
    /// If `len` is not a multiple of [`MIN_ALIGN`] (a caller's bug: buffers are sized from
    /// [`PageRead::len`], which `read_all` also checks).
    pub fn new(len: usize) -> AlignedBuf {
        assert!(
            len.is_multiple_of(MIN_ALIGN),
            "buffer length {len} is not a multiple of {MIN_ALIGN}"
        );
        if len == 0 {
            return AlignedBuf { ptr: NonNull::<PageAligned>::dangling().cast(), len: 0 };
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (`len > 0`).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// A buffer of `len` bytes: one that [`AlignedBuf::recycle`] gave back to this thread's
    /// pool if it holds one of that length, else a new zeroed one. A pooled buffer still holds
    /// an earlier read's bytes; `read_all` overwrites every byte or fails. Batches of cold reads
    /// take their buffers here: fresh ones cost a page fault and a zeroing per page on every
    /// batch (28 % of the CPU time of benchmark 1 at 50M rows, in `clear_page`).
    pub fn pooled(len: usize) -> AlignedBuf {
        let reused = POOL.with(|p| {
            let mut p = p.borrow_mut();
            let buf = p.free.get_mut(&len).and_then(Vec::pop);
            if buf.is_some() {
                p.bytes -= len;
            }
            buf
        });
        reused.unwrap_or_else(|| AlignedBuf::new(len))
    }

    /// Gives `bufs` back to this thread's pool for [`AlignedBuf::pooled`], up to
    /// [`POOL_BYTES`] in all (the rest are freed).
    pub fn recycle(bufs: impl IntoIterator<Item = AlignedBuf>) {
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            for b in bufs {
                if b.len > 0 && p.bytes + b.len <= POOL_BYTES {
                    p.bytes += b.len;
                    p.free.entry(b.len).or_default().push(b);
                }
            }
        });
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, PAGE).expect("buffer length overflows isize")
    }

    /// The start of the buffer, for the kernel to write into.
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// Bytes of buffers a thread keeps for its next batch of reads: enough for ~2,000 cold records
/// of 1–2 pages (benchmark 1 reads ~700 a batch); a larger batch gets the rest from the
/// allocator.
pub const POOL_BYTES: usize = 16 << 20;

/// A thread's buffers given back by [`AlignedBuf::recycle`], by length.
#[derive(Default)]
struct Pool {
    free: std::collections::HashMap<usize, Vec<AlignedBuf>>,
    bytes: usize,
}

thread_local! {
    static POOL: std::cell::RefCell<Pool> = std::cell::RefCell::new(Pool::default());
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` by `alloc_zeroed` with this layout; `&mut self` ends all
            // use, and `read_all` never lets a buffer with a read in flight be dropped.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed, then written) bytes for the life
        // of `self`, or dangling, non-null and aligned when `len` is 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

/// Performs batches of page reads.
pub trait ReadEngine: Send + Sync + fmt::Debug {
    /// Performs every read of `reqs` into `bufs[i]` (`bufs[i].len() == reqs[i].len`), all in
    /// flight together up to the engine's queue depth; returns when all are done. The first
    /// error wins (a short read is an `UnexpectedEof` error); a malformed batch (lengths that
    /// differ, an unaligned offset or length) is an `InvalidInput` error before any read.
    fn read_all(&self, reqs: &[PageRead], bufs: &mut [AlignedBuf]) -> io::Result<()>;
}

/// Checks a batch before any read is issued.
fn check_batch(reqs: &[PageRead], bufs: &[AlignedBuf]) -> io::Result<()> {
    let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
    if reqs.len() != bufs.len() {
        return invalid(format!("{} reads but {} buffers", reqs.len(), bufs.len()));
    }
    for (i, (r, b)) in reqs.iter().zip(bufs).enumerate() {
        if !r.offset.is_multiple_of(MIN_ALIGN as u64)
            || !r.len.is_multiple_of(MIN_ALIGN)
            || r.len > MAX_READ
        {
            return invalid(format!(
                "read {i}: offset {} and length {} must be multiples of {MIN_ALIGN}, length at \
                 most {MAX_READ}",
                r.offset, r.len
            ));
        }
        if r.offset > i64::MAX as u64 - r.len as u64 {
            return invalid(format!("read {i}: offset {} out of range", r.offset));
        }
        if b.len() != r.len {
            return invalid(format!(
                "read {i}: buffer of {} bytes for a read of {}",
                b.len(),
                r.len
            ));
        }
    }
    Ok(())
}

/// What a read that returned `got` bytes (`0 < got`), `filled` in total of `len`, does next:
/// `Ok(true)` to read the rest, `Ok(false)` when complete. A short read that does not end on a
/// block boundary can only be the end of the file (and the rest could not be read with
/// `O_DIRECT` from an unaligned offset anyway).
fn after_read(filled: usize, len: usize) -> io::Result<bool> {
    if filled >= len {
        Ok(false)
    } else if !filled.is_multiple_of(MIN_ALIGN) {
        Err(eof())
    } else {
        Ok(true)
    }
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the file")
}

/// Whether a failed read or `io_uring_enter` may simply be tried again.
fn is_transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN
}

/// io_uring: one calling thread keeps up to `depth` reads in flight, with a single system call
/// to submit a round of reads and wait for the next completion.
///
/// Rings are kept in a pool so that concurrent callers each get their own (a ring is not shared
/// by two threads at once); the pool grows to the largest number of concurrent callers.
pub struct Uring {
    depth: u32,
    rings: Mutex<Vec<IoUring>>,
}

impl Uring {
    /// An engine with `depth` reads in flight per call (clamped to 1..=4096). Fails where the
    /// kernel has no io_uring (older than 5.6, or disabled by `kernel.io_uring_disabled` or a
    /// seccomp filter).
    pub fn new(depth: u32) -> io::Result<Uring> {
        let depth = depth.clamp(1, 4096);
        let ring = Self::ring(depth)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring has no IORING_OP_READ (kernel older than 5.6)",
            ));
        }
        Ok(Uring { depth, rings: Mutex::new(vec![ring]) })
    }

    fn ring(depth: u32) -> io::Result<IoUring> {
        // `depth` SQEs and the default 2 × depth CQEs: at most `depth` reads are in flight, so
        // the completion queue cannot overflow.
        IoUring::new(depth)
    }

    fn take_ring(&self) -> io::Result<IoUring> {
        let pooled = self.rings.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(ring) => Ok(ring),
            None => Self::ring(self.depth),
        }
    }

    fn put_ring(&self, ring: IoUring) {
        self.rings.lock().unwrap_or_else(|e| e.into_inner()).push(ring);
    }
}

impl fmt::Debug for Uring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Uring").field("depth", &self.depth).finish()
    }
}

/// How a batch on one ring ended.
enum RingOutcome {
    /// Every read finished (or failed); the kernel holds no pointer into the buffers.
    Done(io::Result<()>),
    /// `io_uring_enter` failed with reads still in flight (marked in `in_flight`).
    Broken(io::Error),
}

impl ReadEngine for Uring {
    fn read_all(&self, reqs: &[PageRead], bufs: &mut [AlignedBuf]) -> io::Result<()> {
        check_batch(reqs, bufs)?;
        if reqs.is_empty() {
            return Ok(());
        }
        let mut ring = self.take_ring()?;
        let mut in_flight = vec![false; reqs.len()];
        let guard = AbortOnUnwind;
        let outcome = run_ring(&mut ring, self.depth, reqs, bufs, &mut in_flight);
        std::mem::forget(guard);
        match outcome {
            RingOutcome::Done(result) => {
                self.put_ring(ring);
                result
            }
            RingOutcome::Broken(e) => {
                // The kernel may still write into the buffers of reads in flight: give the
                // caller fresh buffers and leak those (a few pages, on a failure that should
                // not happen), and drop the ring, whose teardown ends the reads.
                for (i, _) in in_flight.iter().enumerate().filter(|(_, f)| **f) {
                    let fresh = AlignedBuf::new(bufs[i].len());
                    std::mem::forget(std::mem::replace(&mut bufs[i], fresh));
                }
                drop(ring);
                Err(e)
            }
        }
    }
}

/// Aborts the process if dropped while unwinding: a panic inside the ring loop would free (or
/// hand back) buffers that reads in flight still write into. The loop has no panic path that
/// is known to be reachable; this makes the buffers' safety independent of that.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("embstore: panic with io_uring reads in flight; aborting");
        std::process::abort();
    }
}

/// The submission and completion loop of one batch (already checked by `check_batch`).
fn run_ring(
    ring: &mut IoUring,
    depth: u32,
    reqs: &[PageRead],
    bufs: &mut [AlignedBuf],
    in_flight: &mut [bool],
) -> RingOutcome {
    let n = reqs.len();
    let depth = depth as usize;
    // Bytes read so far by each request (more than one round only after a short read).
    let mut filled = vec![0usize; n];
    // Requests to issue (again) before new ones: short reads and transient failures.
    let mut again: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut pending = 0;
    let mut first_err: Option<io::Error> = None;
    loop {
        {
            let mut sq = ring.submission();
            while pending < depth && first_err.is_none() {
                let i = match again.pop() {
                    Some(i) => i,
                    None if next < n => {
                        next += 1;
                        next - 1
                    }
                    None => break,
                };
                let (r, done) = (reqs[i], filled[i]);
                // SAFETY: `done < r.len == bufs[i].len()` (checked), so the pointer stays in
                // bounds of the buffer's allocation.
                let ptr = unsafe { bufs[i].as_mut_ptr().add(done) };
                // `r.len - done` fits in a u32: `r.len <= MAX_READ` (checked).
                let sqe = opcode::Read::new(types::Fd(r.fd), ptr, (r.len - done) as u32)
                    .offset(r.offset + done as u64)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the read writes at most `r.len - done` bytes at `ptr`, inside
                // `bufs[i]`, which this call borrows mutably and does not touch until the read
                // completes: this function returns only with no read in flight (`Done`), or
                // the caller leaks the buffers still in flight (`Broken`). One read at a time
                // per buffer: `i` is in flight at most once.
                if unsafe { sq.push(&sqe) }.is_err() {
                    again.push(i);
                    break;
                }
                in_flight[i] = true;
                pending += 1;
            }
        }
        if pending == 0 {
            return RingOutcome::Done(first_err.map_or(Ok(()), Err));
        }
        if let Err(e) = ring.submit_and_wait(1) {
            let errno = e.raw_os_error().unwrap_or(0);
            // EBUSY: completions must be reaped first; EINTR, EAGAIN: try again.
            if !(is_transient(errno) || errno == libc::EBUSY) {
                return RingOutcome::Broken(e);
            }
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            let res = cqe.result();
            pending -= 1;
            in_flight[i] = false;
            if res < 0 {
                if is_transient(-res) {
                    again.push(i);
                } else if first_err.is_none() {
                    first_err = Some(io::Error::from_raw_os_error(-res));
                }
            } else if res == 0 {
                first_err.get_or_insert_with(eof);
            } else {
                filled[i] += res as usize;
                match after_read(filled[i], reqs[i].len) {
                    Ok(true) => again.push(i),
                    Ok(false) => {}
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
    }
}

/// Blocking `pread(2)` from `threads` scoped threads, each taking a contiguous share of the
/// batch; `threads == 1` reads sequentially on the calling thread. The reads in flight are at
/// most `threads`.
///
/// Threads are spawned per call: little next to a batch of thousands of reads, but on the
/// development VM a batch of 32 reads took 0.88 ms from 16 threads and 0.44 ms with io_uring.
#[derive(Debug, Clone, Copy)]
pub struct PreadPool {
    threads: usize,
}

impl PreadPool {
    /// An engine reading from `threads` threads (at least 1).
    pub fn new(threads: usize) -> PreadPool {
        PreadPool { threads: threads.max(1) }
    }
}

impl ReadEngine for PreadPool {
    fn read_all(&self, reqs: &[PageRead], bufs: &mut [AlignedBuf]) -> io::Result<()> {
        check_batch(reqs, bufs)?;
        let threads = self.threads.min(reqs.len());
        if threads <= 1 {
            return pread_each(reqs, bufs, &AtomicBool::new(false));
        }
        let share = reqs.len().div_ceil(threads);
        let failed = AtomicBool::new(false);
        std::thread::scope(|s| {
            let workers: Vec<_> = reqs
                .chunks(share)
                .zip(bufs.chunks_mut(share))
                .map(|(r, b)| {
                    let failed = &failed;
                    s.spawn(move || pread_each(r, b, failed))
                })
                .collect();
            // Every worker is joined; the error of the earliest share wins.
            let mut result = Ok(());
            for w in workers {
                let r = w.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    }
}

/// Reads `reqs` into `bufs` one after the other; stops early once `failed` is set (by this or
/// another thread of the batch).
fn pread_each(reqs: &[PageRead], bufs: &mut [AlignedBuf], failed: &AtomicBool) -> io::Result<()> {
    for (r, b) in reqs.iter().zip(bufs.iter_mut()) {
        if failed.load(Ordering::Relaxed) {
            // Another share failed: its error is the batch's.
            return Ok(());
        }
        if let Err(e) = pread_exact(r, b) {
            failed.store(true, Ordering::Relaxed);
            return Err(e);
        }
    }
    Ok(())
}

/// Fills `buf` from `[r.offset, r.offset + r.len)` with `pread(2)`, called directly on the raw
/// fd (std's `read_exact_at` needs a `File`, which a `RawFd` can only become by claiming
/// ownership of the fd).
fn pread_exact(r: &PageRead, buf: &mut AlignedBuf) -> io::Result<()> {
    let mut filled = 0;
    while filled < r.len {
        // SAFETY: `filled < r.len == buf.len()` (checked), so the `r.len - filled` bytes at
        // `ptr + filled` lie inside the buffer, which `&mut` gives this call alone. A closed or
        // foreign fd makes `pread` fail or read other bytes, never write outside the buffer.
        let got = unsafe {
            libc::pread(
                r.fd,
                buf.as_mut_ptr().add(filled).cast(),
                r.len - filled,
                // In range: `offset + len <= i64::MAX` (checked).
                (r.offset + filled as u64) as libc::off_t,
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            if is_transient(e.raw_os_error().unwrap_or(0)) {
                continue;
            }
            return Err(e);
        }
        if got == 0 {
            return Err(eof());
        }
        filled += got as usize;
        if !after_read(filled, r.len)? {
            break;
        }
    }
    Ok(())
}

/// Opens `path` for reading with `O_DIRECT` (the page cache kept out). Where the file system
/// refuses `O_DIRECT` (`EINVAL`, e.g. tmpfs before Linux 6.6), opens it buffered instead. The
/// flag is `true` when the file is open with `O_DIRECT`.
pub fn open_direct(path: &Path) -> io::Result<(File, bool)> {
    match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok((file, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((File::open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// The unit that offsets and lengths of reads of `file` (opened by [`open_direct`]) must be
/// multiples of: [`MIN_ALIGN`] for a file open without `O_DIRECT` (the page cache takes reads
/// of any alignment); with `O_DIRECT`, the alignment the file system reports for the file
/// (`statx`: `STATX_DIO_READ_ALIGN` since Linux 6.14, else `STATX_DIOALIGN` since 6.1), else
/// the logical block size of the file's block device (`/sys/dev/block/MAJ:MIN`, or its parent
/// for a partition), else [`PAGE`]. Always a power of two from [`MIN_ALIGN`] to 1 MiB; found
/// once per file, when a segment is opened.
pub fn read_alignment(file: &File) -> usize {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on an fd the caller's `File` keeps open; no pointer is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags >= 0 && flags & libc::O_DIRECT == 0 {
        return MIN_ALIGN;
    }
    let valid = |a: u64| a.is_power_of_two() && (MIN_ALIGN as u64..=1 << 20).contains(&a);
    // SAFETY: `statx` is all integers: any bit pattern, zeroes included, is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_DIOALIGN | libc::STATX_DIO_READ_ALIGN;
    // SAFETY: an empty path with AT_EMPTY_PATH stats the fd itself; the kernel writes at most
    // one `struct statx` into `stx`, which lives across the call.
    let rc = unsafe { libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, mask, &mut stx) };
    let (mut dev_major, mut dev_minor) = (None, None);
    if rc == 0 {
        // A buffer address aligned to PAGE must satisfy the device's memory alignment.
        let mem_ok =
            stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_mem_align as usize <= PAGE;
        if mem_ok && stx.stx_mask & libc::STATX_DIO_READ_ALIGN != 0 {
            let a = u64::from(stx.stx_dio_read_offset_align);
            if valid(a) {
                return a as usize;
            }
        }
        if mem_ok && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
            let a = u64::from(stx.stx_dio_offset_align);
            if valid(a) {
                return a as usize;
            }
        }
        (dev_major, dev_minor) = (Some(stx.stx_dev_major), Some(stx.stx_dev_minor));
    }
    if let (Some(major), Some(minor)) = (dev_major, dev_minor) {
        if let Some(a) = sysfs_logical_block(major, minor).filter(|&a| valid(a)) {
            return a as usize;
        }
    }
    PAGE
}

/// The logical block size of block device `major:minor` from sysfs: its own queue, or its
/// parent's for a partition. Cached per device (a store opens many segments on one device).
fn sysfs_logical_block(major: u32, minor: u32) -> Option<u64> {
    /// A device and its logical block, if sysfs gave one.
    type Known = ((u32, u32), Option<u64>);
    static CACHE: Mutex<Vec<Known>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, a)) = cache.iter().find(|(d, _)| *d == (major, minor)) {
        return a;
    }
    let dev = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let read = |p: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    };
    let a = read(dev.join("queue/logical_block_size"))
        .or_else(|| read(dev.join("../queue/logical_block_size")));
    cache.push(((major, minor), a));
    a
}

/// The engine for this kernel: [`Uring`] at depth [`DEFAULT_DEPTH`] where io_uring works, else
/// [`PreadPool`] with [`DEFAULT_THREADS`].
pub fn default_engine() -> Box<dyn ReadEngine> {
    match Uring::new(DEFAULT_DEPTH) {
        Ok(uring) => Box::new(uring),
        Err(_) => Box::new(PreadPool::new(DEFAULT_THREADS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embstore_common::SplitMix64;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::path::PathBuf;

    /// A seeded generator (the shared SplitMix64): tests print the seed, so a failure can be
    /// replayed. `below` draws by modulo, as these tests always have, so old seeds replay.
    struct SplitMix(SplitMix64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0.next_u64()
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A file of random bytes in the temporary directory, removed on drop.
    struct TestFile {
        path: PathBuf,
        bytes: Vec<u8>,
        file: File,
        direct: bool,
    }

    impl TestFile {
        fn new(name: &str, len: usize, seed: u64) -> TestFile {
            let path = std::env::temp_dir()
                .join(format!("embstore-io-{}-{name}-{seed:x}", std::process::id()));
            let mut rng = SplitMix(SplitMix64::new(seed));
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mut f = File::create(&path).unwrap();
            f.write_all(&bytes).unwrap();
            f.sync_all().unwrap();
            let (file, direct) = open_direct(&path).unwrap();
            TestFile { path, bytes, file, direct }
        }

        fn fd(&self) -> RawFd {
            self.file.as_raw_fd()
        }
    }

    impl Drop for TestFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn engines() -> Vec<Box<dyn ReadEngine>> {
        let mut e: Vec<Box<dyn ReadEngine>> =
            vec![Box::new(PreadPool::new(1)), Box::new(PreadPool::new(4)), default_engine()];
        // Small rings make the loop refill its queue many times per batch.
        if let Ok(u) = Uring::new(4) {
            e.push(Box::new(u));
        }
        if let Ok(u) = Uring::new(1) {
            e.push(Box::new(u));
        }
        e
    }

    fn bufs_for(reqs: &[PageRead]) -> Vec<AlignedBuf> {
        reqs.iter().map(|r| AlignedBuf::new(r.len)).collect()
    }

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_writable() {
        for len in [0, MIN_ALIGN, 3 * MIN_ALIGN, PAGE, 2 * PAGE, 17 * PAGE] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % PAGE, 0);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xab);
            assert!(b.iter().all(|&x| x == 0xab));
        }
    }

    #[test]
    fn pooled_buffers_are_reused_by_length_within_the_pool_limit() {
        // A thread of its own: the pool is per thread.
        std::thread::spawn(|| {
            let a = AlignedBuf::pooled(2 * PAGE);
            let ptr = a.as_ptr();
            AlignedBuf::recycle([a]);
            assert_eq!(AlignedBuf::pooled(PAGE).len(), PAGE, "another length: a new one");
            let b = AlignedBuf::pooled(2 * PAGE);
            assert_eq!((b.as_ptr(), b.len()), (ptr, 2 * PAGE), "the same buffer again");
            assert_eq!(b.as_ptr() as usize % PAGE, 0);
            // Past POOL_BYTES, buffers given back are freed.
            let big: Vec<AlignedBuf> =
                (0..POOL_BYTES / PAGE + 8).map(|_| AlignedBuf::pooled(PAGE)).collect();
            AlignedBuf::recycle(big);
            let kept = POOL.with(|p| (p.borrow().bytes, p.borrow().free[&PAGE].len()));
            assert_eq!(kept, (POOL_BYTES, POOL_BYTES / PAGE));
        })
        .join()
        .unwrap();
    }

    #[test]
    #[should_panic(expected = "not a multiple")]
    fn aligned_buf_rejects_partial_pages() {
        let _ = AlignedBuf::new(100);
    }

    #[test]
    fn random_ranges_from_two_files_match_their_bytes() {
        let seed = 0x5eed_0001;
        println!("seed {seed:#x}");
        let a = TestFile::new("a", 64 * PAGE, seed);
        // Not a whole number of pages: the last page is partial.
        let b = TestFile::new("b", 40 * PAGE + 123, seed + 1);
        println!("O_DIRECT: {} {}", a.direct, b.direct);
        let mut rng = SplitMix(SplitMix64::new(seed));
        for engine in engines() {
            for round in 0..5 {
                let n = [1, 7, 64, 300, 1000][round];
                let mut reqs = Vec::with_capacity(n);
                for _ in 0..n {
                    let f = if rng.next() & 1 == 0 { &a } else { &b };
                    let whole_pages = f.bytes.len() / PAGE;
                    let pages = 1 + rng.below(2);
                    let first = rng.below(whole_pages - pages + 1);
                    reqs.push(PageRead {
                        fd: f.fd(),
                        offset: (first * PAGE) as u64,
                        len: pages * PAGE,
                    });
                }
                let mut bufs = bufs_for(&reqs);
                engine.read_all(&reqs, &mut bufs).unwrap();
                for (r, buf) in reqs.iter().zip(&bufs) {
                    let f = if r.fd == a.fd() { &a } else { &b };
                    let at = r.offset as usize;
                    assert!(
                        buf[..] == f.bytes[at..at + r.len],
                        "{engine:?}: seed {seed:#x}, round {round}: bytes differ at {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn read_alignment_is_a_power_of_two_the_kernel_accepts() {
        let f = TestFile::new("align", 64 * PAGE + 700, 0x5eed_0002);
        let align = read_alignment(&f.file);
        println!("O_DIRECT: {}, alignment {align}", f.direct);
        assert!(align.is_power_of_two() && (MIN_ALIGN..=1 << 20).contains(&align));
        if !f.direct {
            assert_eq!(align, MIN_ALIGN, "a buffered file takes any alignment");
        }
        // A file open without O_DIRECT: the page cache takes reads of any alignment.
        assert_eq!(read_alignment(&File::open(&f.path).unwrap()), MIN_ALIGN);
        // Reads of one or two blocks at every block of the file, at the reported alignment,
        // from every engine: the kernel accepts them and they hold the file's bytes.
        let blocks = f.bytes.len() / align;
        let mut rng = SplitMix(SplitMix64::new(3));
        let reqs: Vec<PageRead> = (0..200)
            .map(|_| {
                let n = 1 + rng.below(2);
                let first = rng.below(blocks - n + 1);
                PageRead { fd: f.fd(), offset: (first * align) as u64, len: n * align }
            })
            .collect();
        for engine in engines() {
            let mut bufs = bufs_for(&reqs);
            engine.read_all(&reqs, &mut bufs).unwrap();
            for (r, b) in reqs.iter().zip(&bufs) {
                let at = r.offset as usize;
                assert!(b[..] == f.bytes[at..at + r.len], "{engine:?}: bytes differ at {r:?}");
            }
        }
    }

    #[test]
    fn reads_past_the_end_are_errors() {
        let f = TestFile::new("eof", 8 * PAGE + 100, 7);
        let cases = [
            // Starts past the end of the file: 0 bytes.
            PageRead { fd: f.fd(), offset: (9 * PAGE) as u64, len: PAGE },
            // Covers the partial last page: a short read.
            PageRead { fd: f.fd(), offset: (7 * PAGE) as u64, len: 2 * PAGE },
            // Far beyond the end.
            PageRead { fd: f.fd(), offset: (1 << 30) as u64, len: PAGE },
        ];
        let ok = PageRead { fd: f.fd(), offset: 0, len: PAGE };
        for engine in engines() {
            for bad in cases {
                // The bad read among good ones, so that the others are in flight around it.
                let reqs = [ok, ok, bad, ok];
                let mut bufs = bufs_for(&reqs);
                let err = engine.read_all(&reqs, &mut bufs).unwrap_err();
                assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{engine:?} {bad:?}");
            }
            // The whole page just before the partial one reads fine.
            let reqs = [PageRead { fd: f.fd(), offset: (7 * PAGE) as u64, len: PAGE }];
            let mut bufs = bufs_for(&reqs);
            engine.read_all(&reqs, &mut bufs).unwrap();
            assert!(bufs[0][..] == f.bytes[7 * PAGE..8 * PAGE]);
        }
    }

    #[test]
    fn zero_requests_are_ok() {
        for engine in engines() {
            engine.read_all(&[], &mut []).unwrap();
        }
    }

    #[test]
    fn malformed_batches_are_refused_before_reading() {
        let f = TestFile::new("bad", 4 * PAGE, 9);
        let r = PageRead { fd: f.fd(), offset: 0, len: PAGE };
        let cases: [(Vec<PageRead>, Vec<usize>); 4] = [
            (vec![r, r], vec![PAGE]),
            (vec![PageRead { offset: 100, ..r }], vec![PAGE]),
            (vec![PageRead { len: 100, ..r }], vec![0]),
            (vec![r], vec![2 * PAGE]),
        ];
        for engine in engines() {
            for (reqs, lens) in &cases {
                let mut bufs: Vec<AlignedBuf> = lens.iter().map(|&l| AlignedBuf::new(l)).collect();
                let err = engine.read_all(reqs, &mut bufs).unwrap_err();
                assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{engine:?} {reqs:?}");
            }
        }
    }

    #[test]
    fn a_bad_fd_is_an_error() {
        let reqs = [PageRead { fd: -1, offset: 0, len: PAGE }];
        for engine in engines() {
            let mut bufs = bufs_for(&reqs);
            let err = engine.read_all(&reqs, &mut bufs).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{engine:?}");
        }
    }

    #[test]
    fn one_engine_serves_concurrent_callers() {
        let f = TestFile::new("conc", 32 * PAGE, 11);
        let Ok(engine) = Uring::new(8) else {
            return; // no io_uring on this kernel: PreadPool holds no shared state
        };
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (engine, f) = (&engine, &f);
                s.spawn(move || {
                    let mut rng = SplitMix(SplitMix64::new(t));
                    for _ in 0..20 {
                        let reqs: Vec<PageRead> = (0..50)
                            .map(|_| PageRead {
                                fd: f.fd(),
                                offset: (rng.below(32) * PAGE) as u64,
                                len: PAGE,
                            })
                            .collect();
                        let mut bufs = bufs_for(&reqs);
                        engine.read_all(&reqs, &mut bufs).unwrap();
                        for (r, b) in reqs.iter().zip(&bufs) {
                            let at = r.offset as usize;
                            assert!(b[..] == f.bytes[at..at + PAGE]);
                        }
                    }
                });
            }
        });
    }
}
