//! A shard's row values in the table's storage [`Dtype`]: an f32 [`Arena`], or one of 16-bit
//! values (bf16 or f16 bits) at half the bytes.
//!
//! Every reader and writer sees f32: [`Values::read`] widens a 16-bit row (exactly),
//! [`Values::write`] rounds to the dtype (to nearest, ties to even, saturating), and
//! [`Values::update`] hands an optimizer step an f32 copy of the row and rounds the result
//! back. For f32 rows each of them works on the arena's row in place, as before.

use std::mem::MaybeUninit;

use crate::arena::Arena;
use crate::config::{bf16_to_f32, f16_to_f32_slice, f32_to_bf16, f32_to_f16_slice};
use crate::{Dtype, MAX_EMBEDDING_DIM};

/// The row values of one shard.
pub(crate) enum Values {
    F32(Arena<f32>),
    Bf16(Arena<u16>),
    F16(Arena<u16>),
}

impl std::fmt::Debug for Values {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Values").field("dtype", &self.dtype()).finish_non_exhaustive()
    }
}

/// Runs `$body` with `$a` bound to the arena, whatever the dtype.
macro_rules! each {
    ($self:expr, $a:ident => $body:expr) => {
        match $self {
            Values::F32($a) => $body,
            Values::Bf16($a) | Values::F16($a) => $body,
        }
    };
}

#[inline(always)]
fn widen(dtype: Dtype, src: &[u16], dst: &mut [f32]) {
    match dtype {
        Dtype::Bf16 => dst.iter_mut().zip(src).for_each(|(d, &h)| *d = bf16_to_f32(h)),
        _ => f16_to_f32_slice(src, dst),
    }
}

/// `src` widened to f32 into `buf` (a buffer on the stack, left uninitialised past the row:
/// zeroing 16 KiB per row would cost more than the step); returns the row.
#[inline(always)]
fn widen_into<'a>(dtype: Dtype, src: &[u16], buf: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
    let row = &mut buf[..src.len()];
    match dtype {
        Dtype::Bf16 => row.iter_mut().zip(src).for_each(|(d, &h)| _ = d.write(bf16_to_f32(h))),
        // The slice conversion takes initialised f32s: zero the row first (cheap beside
        // converting it value by value).
        _ => row.iter_mut().for_each(|d| _ = d.write(0.0)),
    }
    // SAFETY: every element of `row` was written just above, and `MaybeUninit<f32>` has the
    // layout of `f32`.
    let row = unsafe { &mut *(row as *mut [MaybeUninit<f32>] as *mut [f32]) };
    if dtype != Dtype::Bf16 {
        f16_to_f32_slice(src, row);
    }
    row
}

const UNINIT: MaybeUninit<f32> = MaybeUninit::uninit();

#[inline(always)]
fn narrow(dtype: Dtype, src: &[f32], dst: &mut [u16]) {
    match dtype {
        Dtype::Bf16 => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = f32_to_bf16(x)),
        _ => f32_to_f16_slice(src, dst),
    }
}

impl Values {
    pub(crate) fn new(dim: usize, dtype: Dtype, huge_pages: bool) -> Self {
        match dtype {
            Dtype::F32 => Values::F32(Arena::new(dim, huge_pages)),
            Dtype::Bf16 => Values::Bf16(Arena::new(dim, huge_pages)),
            Dtype::F16 => Values::F16(Arena::new(dim, huge_pages)),
        }
    }

    pub(crate) fn dtype(&self) -> Dtype {
        match self {
            Values::F32(_) => Dtype::F32,
            Values::Bf16(_) => Dtype::Bf16,
            Values::F16(_) => Dtype::F16,
        }
    }

    /// Values per row.
    pub(crate) fn stride(&self) -> usize {
        each!(self, a => a.stride())
    }

    /// Bytes per row.
    pub(crate) fn row_bytes(&self) -> usize {
        self.stride() * self.dtype().bytes()
    }

    pub(crate) fn capacity(&self) -> usize {
        each!(self, a => a.capacity())
    }

    pub(crate) fn bytes(&self) -> usize {
        each!(self, a => a.bytes())
    }

    pub(crate) fn ensure(&mut self, slots: usize) -> bool {
        each!(self, a => a.ensure(slots))
    }

    pub(crate) fn truncate(&mut self, rows: usize) {
        each!(self, a => a.truncate(rows))
    }

    pub(crate) fn copy_row(&mut self, from: usize, to: usize) {
        each!(self, a => a.copy_row(from, to))
    }

    #[inline(always)]
    pub(crate) fn prefetch(&self, slot: usize) {
        each!(self, a => a.prefetch(slot))
    }

    /// Copies `other`'s row at `from` (same dim and dtype) over this row at `to`, bit for bit.
    pub(crate) fn copy_row_from(&mut self, other: &Values, from: usize, to: usize) {
        match (self, other) {
            (Values::F32(a), Values::F32(b)) => a.copy_row_from(b, from, to),
            (Values::Bf16(a), Values::Bf16(b)) | (Values::F16(a), Values::F16(b)) => {
                a.copy_row_from(b, from, to)
            }
            _ => unreachable!("rows are copied between shards of one table"),
        }
    }

    /// Writes the row at `slot` to `dst` (`stride` floats).
    #[inline(always)]
    pub(crate) fn read(&self, slot: usize, dst: &mut [f32]) {
        match self {
            Values::F32(a) => dst.copy_from_slice(a.row(slot)),
            Values::Bf16(a) => widen(Dtype::Bf16, a.row(slot), dst),
            Values::F16(a) => widen(Dtype::F16, a.row(slot), dst),
        }
    }

    /// Appends the row at `slot` to `out`.
    #[inline]
    pub(crate) fn extend(&self, slot: usize, out: &mut Vec<f32>) {
        let at = out.len();
        out.resize(at + self.stride(), 0.0);
        self.read(slot, &mut out[at..]);
    }

    /// Calls `f` with the row at `slot` as f32 (for a 16-bit row, a copy on the stack).
    #[inline]
    pub(crate) fn with_row<R>(&self, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        let dtype = self.dtype();
        match self {
            Values::F32(a) => f(a.row(slot)),
            Values::Bf16(a) | Values::F16(a) => {
                let mut buf = [UNINIT; MAX_EMBEDDING_DIM];
                f(widen_into(dtype, a.row(slot), &mut buf))
            }
        }
    }

    /// Stores `src` (`stride` floats) as the row at `slot`, rounded to the dtype.
    #[inline(always)]
    pub(crate) fn write(&mut self, slot: usize, src: &[f32]) {
        match self {
            Values::F32(a) => a.row_mut(slot).copy_from_slice(src),
            Values::Bf16(a) => narrow(Dtype::Bf16, src, a.row_mut(slot)),
            Values::F16(a) => narrow(Dtype::F16, src, a.row_mut(slot)),
        }
    }

    /// Calls `f` with the row at `slot` as mutable f32 values: in place for f32 rows; for a
    /// 16-bit row, on a copy that is rounded back into the row afterwards (so an optimizer
    /// step is computed in f32 and stored rounded).
    #[inline(always)]
    pub(crate) fn update<R>(&mut self, slot: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let dtype = self.dtype();
        match self {
            Values::F32(a) => f(a.row_mut(slot)),
            Values::Bf16(a) | Values::F16(a) => {
                let row = a.row_mut(slot);
                let mut buf = [UNINIT; MAX_EMBEDDING_DIM];
                let wide = widen_into(dtype, row, &mut buf);
                let out = f(wide);
                narrow(dtype, wide, row);
                out
            }
        }
    }
}
