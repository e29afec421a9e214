//! [`Table::apply_gradients`]: checks, coalescing of duplicate ids, one optimizer step per
//! unique id.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::priority::Scoring;
use embstore_index::MISSING;
use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::config::NonFinite;
use crate::counters::Counters;
use crate::lookup::PREFETCH_AHEAD;
use crate::meta::PackedMeta;
use crate::optim::{max_abs_bits, Step};
use crate::tier::Gate;
use crate::version::now_ms;
use crate::{Error, ErrorKind, Result, Table};

/// The largest gradient whose square is finite in float32 (√f32::MAX ≈ 1.84e19): every
/// optimizer but SGD squares the gradient.
const MAX_GRAD: f32 = 1.844_674_3e19;

/// The largest gradient `optimizer` can take: [`MAX_GRAD`], or any finite one for SGD.
fn max_grad(optimizer: &crate::Optimizer) -> f32 {
    match optimizer {
        crate::Optimizer::Sgd { .. } | crate::Optimizer::Delta => f32::MAX,
        _ => MAX_GRAD,
    }
}

/// One shard's unique ids and their summed gradients (`[U, D]`, row-major).
type Coalesced = (Vec<u64>, Vec<f32>);

/// What one shard's steps came to.
#[derive(Default)]
struct Tally {
    stepped: usize,
    inserted: usize,
    dropped: usize,
    skipped: usize,
    /// An id whose step would have made its row non-finite (left unchanged).
    first_refused: Option<u64>,
}

impl Table {
    /// Sums the gradients of duplicate ids, then runs one optimizer step per unique id. `grads`
    /// is `[B, D]`, row-major; `lr` overrides the configured learning rate for this call.
    /// Returns the number of rows stepped.
    ///
    /// An id without a row gets its initial row first, unless admission is on and the id has
    /// not been seen `admission_min_count` times: then its gradient is dropped, as the row the
    /// forward pass used was never stored.
    ///
    /// Nothing non-finite is ever written to a row or its state. With
    /// [`NonFinite::Reject`], a NaN or infinite gradient, a sum of duplicates that overflows, or
    /// a gradient whose square overflows float32 (`|g| > 1.8e19`; SGD, which does not square
    /// it, takes any finite gradient) rejects the whole call before
    /// anything changes; with [`NonFinite::Skip`] those ids are skipped. A step that would still
    /// leave a non-finite value (an accumulator already at the edge of float32's range) leaves
    /// that row unchanged and counts it in `skipped_non_finite`; with `Reject` the call then
    /// fails with [`ErrorKind::NonFinite`] after stepping the other ids.
    pub fn apply_gradients(&self, ids: &[u64], grads: &[f32], lr: Option<f32>) -> Result<usize> {
        let d = self.dim();
        self.check_rows("grads", ids.len(), grads.len(), d)?;
        self.check_writable()?;
        let optimizer = self.config.optimizer;
        let lr = lr.unwrap_or(optimizer.lr());
        optimizer.validate_lr(lr)?;
        let max_abs = max_abs_bits(grads);
        let reject = self.config.non_finite == NonFinite::Reject;
        if reject && max_abs >= f32::INFINITY.to_bits() {
            if let Some(i) = grads.iter().position(|g| !g.is_finite()) {
                return Err(self.bad_gradient("gradient", ids[i / d], "is not finite", grads[i]));
            }
        }
        let groups = self.group(ids)?;
        let _entered = self.enter_grouped(&groups)?;
        if ids.is_empty() {
            return Ok(0);
        }
        // When every sum is safely below MAX_GRAD (|g| · B well below it: always, in practice)
        // each shard sums and steps in one pass; otherwise every sum is computed and checked
        // first, so that a rejected call writes nothing.
        let max_abs = f32::from_bits(max_abs.min(f32::MAX.to_bits())) as f64;
        let summed = if reject && max_abs * ids.len() as f64 * 2.0 >= max_grad(&optimizer) as f64 {
            Some(self.coalesce_checked(&groups, grads)?)
        } else {
            None
        };
        let step = optimizer.prepare(lr, self.next_step());
        let stepped = AtomicU64::new(0);
        let refused = Mutex::new(None::<u64>);
        // Priority (a syncing table that scores its writes): the threshold of the moment, the
        // rows scored once every shard stepped, off the shards' locks.
        let scoring = Scoring::start(self.prioritiser());
        let ran = self.run(&groups, |s, keys, pos| {
            let sums = match &summed {
                Some(all) => std::mem::take(&mut *all[s].lock()),
                None => coalesce(keys, pos, grads, d),
            };
            let tally = self.step_shard(s, &sums, &step, scoring.as_ref())?;
            let c = &self.counters;
            Counters::add(&c.updates, tally.stepped);
            Counters::add(&c.inserts, tally.inserted);
            Counters::add(&c.dropped_unadmitted, tally.dropped);
            Counters::add(&c.skipped_non_finite, tally.skipped);
            stepped.fetch_add(tally.stepped as u64, Ordering::Relaxed);
            if let Some(id) = tally.first_refused {
                refused.lock().get_or_insert(id);
            }
            Ok(())
        });
        // The shards that stepped are scored even when another failed.
        if let Some(sc) = scoring {
            sc.finish(&self.shards);
        }
        ran?;
        match refused.into_inner() {
            Some(id) if reject => Err(Error::new(
                ErrorKind::NonFinite,
                format!(
                    "the step for id {id} in table '{}' would make its row non-finite (its \
                     optimizer state is at the edge of float32's range); that row and any other \
                     such row were left unchanged, the other ids were stepped",
                    self.name()
                ),
            )),
            _ => Ok(stepped.into_inner() as usize),
        }
    }

    fn bad_gradient(&self, kind: &str, id: u64, what: &str, g: f32) -> Error {
        Error::new(
            ErrorKind::NonFinite,
            format!(
                "{kind} for id {id} in table '{}' {what} ({g}); nothing was applied",
                self.name()
            ),
        )
    }

    /// Sums every shard's duplicates and checks every sum (finite, square finite) before
    /// anything is written.
    fn coalesce_checked(
        &self,
        groups: &crate::batch::Groups,
        grads: &[f32],
    ) -> Result<Vec<Mutex<Coalesced>>> {
        let d = self.dim();
        let all: Vec<_> = (0..self.shards.len()).map(|_| Mutex::default()).collect();
        self.run(groups, |s, keys, pos| {
            *all[s].lock() = coalesce(keys, pos, grads, d);
            Ok(())
        })?;
        for c in &all {
            let (uniq, sums) = &*c.lock();
            if let Some(i) = sums.iter().position(|g| !g.is_finite()) {
                return Err(self.bad_gradient(
                    "summed gradient",
                    uniq[i / d],
                    "is not finite",
                    sums[i],
                ));
            }
            if let Some(i) = sums.iter().position(|g| g.abs() > max_grad(&self.config.optimizer)) {
                return Err(self.bad_gradient(
                    "gradient",
                    uniq[i / d],
                    "is too large: its square overflows float32 (|g| > 1.8e19)",
                    sums[i],
                ));
            }
        }
        Ok(all)
    }

    /// Steps one shard's unique ids under its write lock.
    fn step_shard(
        &self,
        s: usize,
        sums: &Coalesced,
        step: &Step,
        scoring: Option<&Scoring>,
    ) -> Result<Tally> {
        let (uniq, sums) = sums;
        let d = self.dim();
        let skip_non_finite = self.config.non_finite == NonFinite::Skip;
        let max_grad_bits = max_grad(&self.config.optimizer).to_bits();
        let mut slots = vec![0u64; uniq.len()];
        let mut notes = scoring.map(Scoring::notes);
        let mut guard = self.shards[s].write();
        let shard = &mut *guard;
        // Drawn under the shard's write lock: in every shard, versions follow the order of
        // writes, so a reader that has seen a shard up to version V finds every later write
        // above V (tests/versions.rs).
        let version = self.clock.tick();
        shard.index.get_batch(uniq, &mut slots)?;
        shard.note_accesses(&slots);
        let mut tally = Tally::default();
        let mut scratch = Vec::with_capacity(d + self.state_dim);
        let created = PackedMeta::created(now_ms());
        for (u, &key) in uniq.iter().enumerate() {
            if let Some(&ahead) = slots.get(u + PREFETCH_AHEAD) {
                if ahead != MISSING {
                    shard.values.prefetch(ahead as usize);
                    shard.state.prefetch(ahead as usize);
                }
            }
            let g = &sums[u * d..][..d];
            if skip_non_finite && max_abs_bits(g) > max_grad_bits {
                tally.skipped += 1; // NaN, infinite, or a square that overflows
                continue;
            }
            let slot = if slots[u] != MISSING {
                slots[u] as usize
            } else {
                if let Some(sketch) = self.sketch() {
                    if sketch.estimate(key) < self.config.admission_min_count {
                        tally.dropped += 1;
                        continue;
                    }
                }
                let slot = shard.insert(key, created, &self.config.optimizer)?;
                shard.values.update(slot, |w| self.initial_row(key, w));
                tally.inserted += 1;
                slot
            };
            let writes = shard.meta[slot].unpack().update_count;
            let st = shard.state.row_mut(slot);
            if !shard.values.update(slot, |w| step.apply(w, st, g, &mut scratch)) {
                tally.skipped += 1;
                tally.first_refused.get_or_insert(key);
                continue;
            }
            shard.record_write(slot, key, version);
            if let Some(n) = &mut notes {
                let v = shard.meta[slot].unpack().version;
                let young = shard.sync.as_deref_mut().map(|sy| &mut sy.young);
                n.note(key, l1_norm(g), writes, v, young);
            }
            tally.stepped += 1;
        }
        drop(guard);
        if let (Some(sc), Some(n)) = (scoring, notes) {
            sc.done(s, n);
        }
        Ok(tally)
    }
}

/// `Σ |g_i|`, in eight independent f32 lanes (the compiler vectorises them; one serial f64
/// chain cost a 64-float row about as much as the rest of its scoring).
#[inline]
fn l1_norm(g: &[f32]) -> f64 {
    let mut acc = [0f32; 8];
    let chunks = g.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().map(|x| x.abs()).sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x.abs();
        }
    }
    f64::from(acc.iter().sum::<f32>() + rest)
}

/// Sums the gradients of duplicate ids, keeping first-seen order.
fn coalesce(keys: &[u64], pos: &[u32], grads: &[f32], d: usize) -> Coalesced {
    let mut at: HashMap<u64, u32> = HashMap::with_capacity(keys.len());
    let mut uniq: Vec<u64> = Vec::with_capacity(keys.len());
    let mut sums: Vec<f32> = Vec::with_capacity(keys.len() * d);
    for (&k, &p) in keys.iter().zip(pos) {
        let g = &grads[p as usize * d..][..d];
        match at.entry(k) {
            hashbrown::hash_map::Entry::Occupied(e) => {
                let u = *e.get() as usize;
                sums[u * d..][..d].iter_mut().zip(g).for_each(|(a, b)| *a += b);
            }
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(uniq.len() as u32);
                uniq.push(k);
                sums.extend_from_slice(g);
            }
        }
    }
    (uniq, sums)
}
