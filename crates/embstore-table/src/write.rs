//! Writes that are not optimizer steps: [`Table::assign`], [`Table::import`] (and
//! [`Table::import_chunk`]), [`Table::remove`]; and [`Table::meta`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::counters::Counters;
use crate::meta::PackedMeta;
use crate::priority::Scoring;
use crate::tier::Gate;
use crate::version::now_ms;
use crate::{Error, ErrorKind, Result, RowChunk, RowMeta, Table};

/// How far ahead of this store's clock an imported (or synced) version may be: one day.
const MAX_CLOCK_AHEAD_MS: u64 = 24 * 3600 * 1000;

/// The largest version timestamp a write from elsewhere may carry now (one day ahead).
pub(crate) fn clock_horizon() -> u64 {
    (now_ms() + MAX_CLOCK_AHEAD_MS) << 16
}

/// The optimizer state that `write_rows` gives each row.
#[derive(Clone, Copy)]
pub(crate) enum StateIn<'a> {
    /// Keep an existing row's state (a new row gets the initial state).
    Keep,
    /// The optimizer's initial state.
    Init,
    /// `[B, S]`, row-major.
    Given(&'a [f32]),
}

impl Table {
    /// Sets the values of `ids` (`[B, D]`); ids without a row get one (admission does not
    /// apply). For a repeated id the last row wins. State of existing rows is kept.
    pub fn assign(&self, ids: &[u64], values: &[f32]) -> Result<()> {
        self.check_live()?;
        self.check_writable()?;
        self.assign_rows(ids, values)
    }

    /// [`Table::assign`] without the pause's check (a rollback's writes).
    pub(crate) fn assign_rows(&self, ids: &[u64], values: &[f32]) -> Result<()> {
        let _entered = self.enter(ids)?;
        self.write_rows(ids, values, StateIn::Keep, None, true)
    }

    /// Writes rows exported from a table with the same `D` and optimizer: values `[B, D]`,
    /// optimizer state `[B, S]` (or the optimizer's initial state when `None`) and metadata
    /// (or a fresh version when `None`). Imported versions may not be more than a day ahead of
    /// this store's clock, nor carry a replica id of 2^31 or more.
    pub fn import(
        &self,
        ids: &[u64],
        values: &[f32],
        state: Option<&[f32]>,
        meta: Option<&[RowMeta]>,
    ) -> Result<()> {
        let state = state.map_or(StateIn::Init, StateIn::Given);
        self.check_live()?;
        self.check_writable()?;
        let _entered = self.enter(ids)?;
        self.write_rows(ids, values, state, meta, true)
    }

    /// Imports a chunk of [`Table::export`]: refuses one whose optimizer is not this table's
    /// (its state would be misread even when the widths agree), writes the rows as
    /// [`Table::import`] does, and raises the step counter to the chunk's if that is higher
    /// (Adam's bias correction goes on where the exporting table left it).
    pub fn import_chunk(&self, chunk: &RowChunk) -> Result<()> {
        self.check_optimizer(chunk.optimizer)?;
        self.import(&chunk.ids, &chunk.values, Some(&chunk.state), Some(&chunk.meta))?;
        self.raise_step(chunk.step);
        Ok(())
    }

    /// Fails unless `name` is this table's optimizer.
    pub fn check_optimizer(&self, name: &str) -> Result<()> {
        let mine = self.config.optimizer.name();
        if name != mine {
            return Err(Error::invalid(format!(
                "optimizer mismatch for table '{}': expected {mine}, got {name}",
                self.name()
            )));
        }
        Ok(())
    }

    /// Raises the step counter to `step` if it is lower.
    pub fn raise_step(&self, step: u64) {
        if step > self.step() {
            self.set_step(step);
        }
    }

    /// [`Table::import`] of rows read back from a checksummed file; returns how many rows it
    /// repaired. Older embstore versions could write rows that are not finite (an optimizer
    /// drove the state, or the values, to infinity or NaN from finite gradients); such a row
    /// would refuse every later step. So a row whose state is not finite gets the optimizer's
    /// initial state, and a row whose values are not finite is re-initialised as well (its
    /// metadata is kept); [`TableStats::repaired_on_load`](crate::TableStats) counts them. A
    /// replica id that no longer fits (2^31 or more, allowed by older versions) is refused as
    /// a file this version cannot read.
    pub(crate) fn import_saved(&self, chunk: &RowChunk) -> Result<u64> {
        if let Some(m) = chunk.meta.iter().find(|m| m.version.replica > crate::MAX_REPLICA) {
            return Err(Error::new(
                ErrorKind::Corruption,
                format!(
                    "the file holds a row version from replica {}; this version of embstore                      stores replica ids up to 2^31 - 1 and cannot read it",
                    m.version.replica
                ),
            ));
        }
        let (d, sd) = (self.dim(), self.state_dim);
        let finite = |row: &[f32]| row.iter().all(|v| v.is_finite());
        let bad_rows: Vec<usize> = (0..chunk.len())
            .filter(|&i| {
                !finite(&chunk.values[i * d..][..d]) || !finite(&chunk.state[i * sd..][..sd])
            })
            .collect();
        if bad_rows.is_empty() {
            self.write_rows(
                &chunk.ids,
                &chunk.values,
                StateIn::Given(&chunk.state),
                Some(&chunk.meta),
                false,
            )?;
            return Ok(0);
        }
        let (mut values, mut state) = (chunk.values.clone(), chunk.state.clone());
        for &i in &bad_rows {
            let row = &mut values[i * d..][..d];
            if !finite(row) {
                self.initial_row(chunk.ids[i], row);
            }
            self.config.optimizer.init_state(&mut state[i * sd..][..sd]);
        }
        self.write_rows(&chunk.ids, &values, StateIn::Given(&state), Some(&chunk.meta), true)?;
        Counters::add(&self.counters.repaired_on_load, bad_rows.len());
        Ok(bad_rows.len() as u64)
    }

    pub(crate) fn check_meta(&self, ids: &[u64], meta: &[RowMeta]) -> Result<()> {
        if meta.len() != ids.len() {
            return Err(Error::shape(format!(
                "metadata must hold {} entries, got {}",
                ids.len(),
                meta.len()
            )));
        }
        let horizon = clock_horizon();
        if let Some(i) = meta.iter().position(|m| m.version.timestamp > horizon) {
            return Err(Error::invalid(format!(
                "version of id {} is more than a day ahead of this clock ({} ms since the \
                 epoch); nothing was written",
                ids[i],
                meta[i].version.ms()
            )));
        }
        meta.iter().try_for_each(PackedMeta::check)
    }

    pub(crate) fn check_finite(
        &self,
        ids: &[u64],
        values: &[f32],
        state: StateIn<'_>,
    ) -> Result<()> {
        let (d, sd) = (self.dim(), self.state_dim);
        let bad = values.iter().position(|v| !v.is_finite()).map(|i| (i / d, "values"));
        let bad = bad.or_else(|| match state {
            StateIn::Given(st) => {
                st.iter().position(|v| !v.is_finite()).map(|i| (i / sd.max(1), "state"))
            }
            _ => None,
        });
        match bad {
            Some((row, what)) => Err(Error::new(
                ErrorKind::NonFinite,
                format!("{what} for id {} are not finite; nothing was written", ids[row]),
            )),
            None => Ok(()),
        }
    }

    fn write_rows(
        &self,
        ids: &[u64],
        values: &[f32],
        state: StateIn<'_>,
        meta: Option<&[RowMeta]>,
        check_finite: bool,
    ) -> Result<()> {
        let (d, sd) = (self.dim(), self.state_dim);
        self.check_rows("values", ids.len(), values.len(), d)?;
        if let StateIn::Given(state) = state {
            self.check_rows("state", ids.len(), state.len(), sd)?;
        }
        if let Some(meta) = meta {
            self.check_meta(ids, meta)?;
        }
        if check_finite {
            self.check_finite(ids, values, state)?;
        }
        let groups = self.group(ids)?;
        if ids.is_empty() {
            return Ok(());
        }
        if let Some(meta) = meta {
            meta.iter().for_each(|m| self.clock.observe(m.version));
        }
        let created = PackedMeta::created(now_ms());
        // Priority: an assignment scores by the 1-norm of its change (an import keeps its rows'
        // own versions, and is not scored), once every shard wrote.
        let scoring = if meta.is_none() { Scoring::start(self.prioritiser()) } else { None };
        let written = self.run(&groups, |s, keys, pos| {
            let mut notes = scoring.as_ref().map(Scoring::notes);
            let mut old = vec![0f32; if notes.is_some() { d } else { 0 }];
            let mut shard = self.shards[s].write();
            // Drawn under the shard's write lock, so that versions follow the order of writes
            // in every shard (see `apply_gradients`).
            let version = self.clock.tick();
            let mut inserted = 0;
            for (&key, &p) in keys.iter().zip(pos) {
                let p = p as usize;
                let new = &values[p * d..][..d];
                let (slot, writes) = match shard.slot(key) {
                    Some(slot) => {
                        if notes.is_some() {
                            shard.values.read(slot, &mut old);
                        }
                        (slot, shard.meta[slot].unpack().update_count)
                    }
                    None => {
                        inserted += 1;
                        old.fill(0.0);
                        (shard.insert(key, created, &self.config.optimizer)?, 0)
                    }
                };
                shard.values.write(slot, new);
                match state {
                    StateIn::Keep => {}
                    StateIn::Init => self.config.optimizer.init_state(shard.state.row_mut(slot)),
                    StateIn::Given(st) => {
                        shard.state.row_mut(slot).copy_from_slice(&st[p * sd..][..sd])
                    }
                }
                match meta {
                    // In a table that syncs an import is a write like any other: its rows get
                    // a new version (so peers take them) and keep the rest of their metadata.
                    Some(given) if shard.sync.is_some() => {
                        shard.set_meta(slot, key, PackedMeta::pack(&given[p]));
                        shard.record_write(slot, key, version);
                    }
                    Some(given) => shard.set_meta(slot, key, PackedMeta::pack(&given[p])),
                    None => shard.record_write(slot, key, version),
                }
                if let Some(n) = &mut notes {
                    let l1 = new.iter().zip(&old).map(|(a, b)| (a - b).abs() as f64).sum();
                    let v = shard.meta[slot].unpack().version;
                    let young = shard.sync.as_deref_mut().map(|sy| &mut sy.young);
                    n.note(key, l1, writes, v, young);
                }
            }
            drop(shard);
            if let (Some(sc), Some(n)) = (&scoring, notes) {
                sc.done(s, n);
            }
            Counters::add(&self.counters.updates, keys.len());
            Counters::add(&self.counters.inserts, inserted);
            Ok(())
        });
        // The shards that wrote are scored even when another failed.
        if let Some(sc) = scoring {
            sc.finish(&self.shards);
        }
        written
    }

    /// Removes the rows of `ids`; returns how many were stored. Shards left sparse release
    /// memory.
    pub fn remove(&self, ids: &[u64]) -> Result<usize> {
        self.check_writable()?;
        self.remove_rows(ids)
    }

    /// [`Table::remove`] without the pause's check (a rollback's removals).
    pub(crate) fn remove_rows(&self, ids: &[u64]) -> Result<usize> {
        let groups = self.group(ids)?;
        let _entered = self.enter(ids)?;
        let removed = AtomicU64::new(0);
        self.run(&groups, |s, keys, _| {
            let mut shard = self.shards[s].write();
            let n = keys.iter().filter(|&&k| shard.remove(k)).count();
            removed.fetch_add(n as u64, Ordering::Relaxed);
            shard.shrink_if_sparse().map(drop)
        })?;
        let n = removed.into_inner() as usize;
        Counters::add(&self.counters.removed, n);
        drop(_entered);
        self.maybe_collect_tombstones();
        Ok(n)
    }

    /// The metadata of each id's row, `None` for ids without one.
    pub fn meta(&self, ids: &[u64]) -> Result<Vec<Option<RowMeta>>> {
        self.check_live()?;
        let _entered = self.enter(ids)?;
        Ok(ids
            .iter()
            .map(|&k| {
                let shard = self.shards[self.shard_of(k)].read();
                shard.slot(k).map(|slot| shard.meta[slot].unpack())
            })
            .collect())
    }
}
