//! Batches split by shard: [`Groups`] (one stable counting sort of the ids by shard) and
//! [`SharedOut`] (disjoint writes of shard tasks into one output buffer).

use crate::{Error, Result};

/// Ids grouped by shard: `keys[bounds[s]..bounds[s + 1]]` are shard `s`'s ids, in batch order,
/// and `pos` gives each one's position in the batch.
pub(crate) struct Groups {
    pub(crate) keys: Vec<u64>,
    pub(crate) pos: Vec<u32>,
    pub(crate) bounds: Vec<usize>,
}

impl Groups {
    /// Shard `s`'s ids and their batch positions.
    pub(crate) fn shard(&self, s: usize) -> (&[u64], &[u32]) {
        let (a, b) = (self.bounds[s], self.bounds[s + 1]);
        (&self.keys[a..b], &self.pos[a..b])
    }
}

impl Groups {
    /// Groups `ids` over `n` shards by `shard_of` (see [`Groups`]).
    #[inline]
    pub(crate) fn new(ids: &[u64], n: usize, shard_of: impl Fn(u64) -> usize) -> Result<Self> {
        if ids.len() > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "a batch holds at most 2^32 - 1 ids, got {}",
                ids.len()
            )));
        }
        if n == 1 {
            return Ok(Groups {
                keys: ids.to_vec(),
                pos: (0..ids.len() as u32).collect(),
                bounds: vec![0, ids.len()],
            });
        }
        let shard: Vec<u16> = ids.iter().map(|&k| shard_of(k) as u16).collect();
        let mut bounds = vec![0usize; n + 1];
        for &s in &shard {
            bounds[s as usize + 1] += 1;
        }
        for s in 0..n {
            bounds[s + 1] += bounds[s];
        }
        let mut next = bounds[..n].to_vec();
        let mut keys = vec![0u64; ids.len()];
        let mut pos = vec![0u32; ids.len()];
        for (i, (&k, &s)) in ids.iter().zip(&shard).enumerate() {
            let at = &mut next[s as usize];
            keys[*at] = k;
            pos[*at] = i as u32;
            *at += 1;
        }
        Ok(Groups { keys, pos, bounds })
    }
}

/// A raw pointer that shard tasks share to write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut<T>(pub(crate) *mut T);
// SAFETY: only used to write disjoint elements from different threads (every batch position
// belongs to exactly one shard); the buffer outlives the call that runs the shard tasks.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The `len` elements starting at `start`.
    ///
    /// # Safety
    /// The range must be inside the buffer and no other live reference may overlap it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: forwarded from this function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
