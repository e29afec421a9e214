//! [`Table::lookup`] and [`Table::contains`]: reads, with [`OnMiss`] for ids without a row.

use embstore_index::MISSING;
use parking_lot::Mutex;

use crate::batch::SharedOut;
use crate::counters::Counters;
use crate::meta::PackedMeta;
use crate::tier::Gate;
use crate::version::now_ms;
use crate::{Error, ErrorKind, Result, Table};

/// Rows ahead of the copy that are prefetched.
pub(crate) const PREFETCH_AHEAD: usize = 8;

/// What `lookup` does for an id that has no row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMiss {
    /// Return the initial value and store it (training). With admission on, the row is stored
    /// only once the id has been seen often enough; until then the initial value is returned.
    #[default]
    Init,
    /// Return zeros; store nothing (serving).
    Zeros,
    /// Fail with [`ErrorKind::KeyNotFound`].
    Error,
}

impl OnMiss {
    /// The names, as the Python API spells them: the one definition every layer checks against.
    pub const NAMES: [&'static str; 3] = ["init", "zeros", "error"];

    /// The mode called `name` (one of [`OnMiss::NAMES`]).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "init" => Ok(Self::Init),
            "zeros" => Ok(Self::Zeros),
            "error" => Ok(Self::Error),
            _ => Err(Error::invalid(format!(
                "on_miss must be one of {:?}, got {name:?}",
                Self::NAMES
            ))),
        }
    }
}

impl Table {
    /// Reads the rows of `ids` into `out` (`[B, D]`, row-major) and, when given, whether each id
    /// had a row into `found` (`[B]`). See [`OnMiss`] for ids without a row.
    pub fn lookup(
        &self,
        ids: &[u64],
        on_miss: OnMiss,
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<()> {
        let d = self.dim();
        self.check_rows("the output", ids.len(), out.len(), d)?;
        if let Some(found) = &found {
            if found.len() != ids.len() {
                return Err(Error::shape(format!(
                    "found mask must hold {} entries, got {}",
                    ids.len(),
                    found.len()
                )));
            }
        }
        let groups = self.group(ids)?;
        if ids.is_empty() {
            return Ok(());
        }
        let _entered = self.enter_grouped(&groups)?;
        let out = SharedOut(out.as_mut_ptr());
        let found = found.map(|f| SharedOut(f.as_mut_ptr()));
        // (batch position, id) of the first missing id, for OnMiss::Error.
        let first_missing = Mutex::new(None::<(u32, u64)>);
        self.run(&groups, |s, keys, pos| {
            let shard_out = ShardOut { out, found, pos, d };
            let missing = self.read_shard(s, keys, on_miss, &shard_out, &first_missing)?;
            self.insert_missing(s, keys, missing, &shard_out)
        })?;
        match first_missing.into_inner() {
            Some((_, key)) => Err(Error::new(
                ErrorKind::KeyNotFound,
                format!("id {key} is not stored in table '{}'", self.name()),
            )),
            None => Ok(()),
        }
    }

    /// The read pass of one shard, under its read lock: copies hits, fills misses as `on_miss`
    /// says; returns the indexes (into `keys`) of misses to store (with [`OnMiss::Init`]).
    fn read_shard(
        &self,
        s: usize,
        keys: &[u64],
        on_miss: OnMiss,
        out: &ShardOut<'_>,
        first_missing: &Mutex<Option<(u32, u64)>>,
    ) -> Result<Vec<usize>> {
        let mut slots = vec![0u64; keys.len()];
        let mut missing = Vec::new();
        let shard = self.shards[s].read();
        shard.index.get_batch(keys, &mut slots)?;
        shard.note_accesses(&slots);
        // Rows taken ahead of normal sync (prioritised sync): read instead of the shard's
        // older row (P3); none at all in a table that does not prioritise.
        let significant = shard.sync.as_ref().filter(|sy| sy.significant_len > 0);
        for i in 0..keys.len() {
            if let Some(e) = significant.and_then(|sy| sy.significant(keys[i])) {
                // SAFETY: see `ShardOut`; the row is dropped at the end of this block.
                let row = unsafe { out.row(i) };
                match &e.values {
                    Some(v) => {
                        row.copy_from_slice(v);
                        out.set_found(i, true);
                        slots[i] = 0; // counted as a hit below
                    }
                    // A removal taken ahead: the id has no row (and none is made for it).
                    None => {
                        row.fill(0.0);
                        out.set_found(i, false);
                        slots[i] = MISSING;
                    }
                }
                continue;
            }
            if let Some(&ahead) = slots.get(i + PREFETCH_AHEAD) {
                if ahead != MISSING {
                    shard.values.prefetch(ahead as usize);
                }
            }
            let slot = slots[i];
            out.set_found(i, slot != MISSING);
            if slot != MISSING {
                // SAFETY: see `ShardOut`; the row is dropped at the end of this statement.
                let row = unsafe { out.row(i) };
                shard.values.read(slot as usize, row);
                continue;
            }
            // SAFETY: as above.
            let row = unsafe { out.row(i) };
            match on_miss {
                OnMiss::Zeros => row.fill(0.0),
                OnMiss::Init => {
                    self.initial_row(keys[i], row);
                    missing.push(i);
                }
                OnMiss::Error => {
                    let mut first = first_missing.lock();
                    if first.is_none_or(|(p, _)| out.pos[i] < p) {
                        *first = Some((out.pos[i], keys[i]));
                    }
                    row.fill(0.0);
                }
            }
        }
        let misses = slots.iter().filter(|&&x| x == MISSING).count();
        Counters::add(&self.counters.hits, keys.len() - misses);
        Counters::add(&self.counters.misses, misses);
        Ok(missing)
    }

    /// The write pass of one shard for [`OnMiss::Init`]: stores the admitted misses (their
    /// initial values are in `out` already) under the write lock.
    fn insert_missing(
        &self,
        s: usize,
        keys: &[u64],
        mut missing: Vec<usize>,
        out: &ShardOut<'_>,
    ) -> Result<()> {
        if missing.is_empty() {
            return Ok(());
        }
        if let Some(sketch) = self.sketch() {
            let min = self.config.admission_min_count;
            missing.retain(|&i| sketch.increment(keys[i]) >= min);
            if missing.is_empty() {
                return Ok(());
            }
        }
        let mut shard = self.shards[s].write();
        let meta = PackedMeta::created(now_ms());
        let mut inserted = 0;
        for i in missing {
            // SAFETY: see `ShardOut`.
            let row = unsafe { out.row(i) };
            match shard.slot(keys[i]) {
                // Another thread stored the row between our two locks: return its values.
                Some(slot) => shard.values.read(slot, row),
                None => {
                    let slot = shard.insert(keys[i], meta, &self.config.optimizer)?;
                    shard.values.write(slot, row);
                    inserted += 1;
                }
            }
        }
        Counters::add(&self.counters.inserts, inserted);
        Ok(())
    }

    /// Writes whether each id has a row to `out` (`[B]`).
    pub fn contains(&self, ids: &[u64], out: &mut [bool]) -> Result<()> {
        if out.len() != ids.len() {
            return Err(Error::shape(format!(
                "output must hold {} entries, got {}",
                ids.len(),
                out.len()
            )));
        }
        let groups = self.group(ids)?;
        let _entered = self.enter(ids)?;
        let out_ptr = SharedOut(out.as_mut_ptr());
        self.run(&groups, |s, keys, pos| {
            let mut hit = vec![false; keys.len()];
            self.shards[s].read().index.contains_batch(keys, &mut hit)?;
            for (&p, h) in pos.iter().zip(hit) {
                // SAFETY: positions are distinct, below `ids.len()` and owned by this shard.
                unsafe { out_ptr.slice(p as usize, 1)[0] = h };
            }
            Ok(())
        })
    }
}

/// One shard's view of a lookup's outputs: the rows at its batch positions `pos`.
///
/// `pos` values are distinct batch positions below `ids.len()`, owned by this shard alone; `out`
/// holds `ids.len()` rows of `d` floats and `found` `ids.len()` entries. So each row handed out
/// is disjoint from every other shard's; within the shard, callers drop a row before making the
/// next.
struct ShardOut<'a> {
    out: SharedOut<f32>,
    found: Option<SharedOut<bool>>,
    pos: &'a [u32],
    d: usize,
}

impl ShardOut<'_> {
    /// The output row of the shard's `i`-th id.
    ///
    /// # Safety
    /// No other reference to that row may be live (see the type's docs).
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, i: usize) -> &mut [f32] {
        // SAFETY: inside the buffer and exclusive (the type's invariant and this contract).
        unsafe { self.out.slice(self.pos[i] as usize * self.d, self.d) }
    }

    fn set_found(&self, i: usize, v: bool) {
        if let Some(f) = self.found {
            // SAFETY: the entry is this shard's alone (see the type's docs).
            unsafe { f.slice(self.pos[i] as usize, 1)[0] = v };
        }
    }
}
