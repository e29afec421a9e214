//! Reclaim: a tiered table gives memory back to its store's [`Budget`](crate::Budget).
//!
//! **Eviction** of `n` bytes: the policy picks victims per shard, never pinned ones; victims
//! that are dirty are first written to a new segment, a *spill* (as a flush writes them: copied
//! under the shard lock, their dirty bit cleared, their disk location set), sealed but not
//! fsynced and named by no manifest record: the next flush adopts it and makes it durable
//! (`durable::spill`), so an eviction keeps the store's durability contract (what was flushed
//! survives a crash) without an fsync in the training loop; then, under the gate for writing (no
//! call in flight), every victim still clean and unpinned moves to the cold index — no I/O for a
//! clean row. A dirty row is dropped from memory only once its copy is in a sealed segment that
//! reads find; a pinned row is never evicted.
//!
//! After a call (gate released) the table reports its memory to the budget and evicts its
//! share of the excess, or hands it to the store's evictor ([`Reclaim`], one dynamic call per
//! round). A failed eviction (a full disk) leaves every row in memory, dirty, and is noted in
//! the table's `stats()` and the budget; the next call over the budget meets it.

use std::sync::atomic::Ordering;
use std::sync::Weak;

use super::keys::{KeyHash, Pins};
use super::{Gate, Host, Tier};
use crate::budget::Reclaim;
use crate::meta::PackedMeta;
use crate::shard::cold::loc_parts;
use crate::{ErrorKind, Result};

/// The most the evictor frees in one round (~50k rows of D 32 with Adagrad): it lets go of
/// the shard locks it takes to choose and copy victims between rounds, so that a call waits for
/// one round at most, not for a whole large eviction (10 % of the room is ~120 MB at 50M rows).
const EVICTOR_ROUND: u64 = 16 << 20;

/// Victims chosen per hold of a shard's write lock.
const VICTIM_CHUNK: usize = 1024;

/// After a call that brought in, or an eviction that moved, at least this many bytes of rows,
/// the C allocator's free memory goes back to the kernel ([`trim_heap`]).
const TRIM_AFTER: u64 = 16 << 20;

/// After eviction a shard keeps arena room for a fifth more rows than it holds (eviction goes
/// down to 85 % of the room, so calls refill it without regrowing), and gives back the rest.
const KEEP_HEADROOM: usize = 5;

/// Gives the C allocator's free memory back to the kernel. glibc keeps freed blocks in its
/// heaps for reuse: after one 300k-row lookup over a 64 MiB budget, 1.56 GiB stayed resident
/// for the rest of the process (96 MiB after `malloc_trim`).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory of the allocator's heaps to the kernel;
    // it takes the allocator's locks and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Which part of the store's excess over its low mark a table evicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    /// Its share, by the bytes each table can free.
    Mine,
    /// As much as it can: what a call's own share left over.
    Rest,
}

/// What [`Evict::report`] found: the store's bytes, whether this table grew since its last
/// report (a call brought rows in), and the bytes of this table that eviction can free (hot,
/// unpinned rows).
pub(crate) struct Report {
    pub(crate) used: u64,
    pub(crate) grew: bool,
    pub(crate) evictable: u64,
}

impl Tier {
    /// Notes `bytes` of rows brought in or moved out (their temporaries and freed storage).
    pub(super) fn churned(&self, bytes: u64) {
        self.churn.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Trims the heap ([`trim_heap`]) once [`TRIM_AFTER`] bytes of rows came or went.
    pub(super) fn trim_if_due(&self) {
        if self.churn.load(Ordering::Relaxed) >= TRIM_AFTER {
            self.churn.store(0, Ordering::Relaxed);
            trim_heap();
        }
    }
}

/// Reclaim, for the table above the tier ([`Host`]).
pub(crate) trait Evict: Host {
    /// Bytes this table holds in memory, as the budget counts them: per hot row its values,
    /// state, metadata and tier state — freed slots counted as rows —, plus the hot and cold
    /// indexes at their capacity. Eviction leaves no freed slot behind and gives back the arena
    /// room past a fifth more rows than the shard holds (`Shard::compact_tiered`), so resident
    /// memory passes this by that headroom at most (and by a call's temporaries, during it).
    /// Returns them with the number of rows in memory.
    fn memory_and_rows(&self) -> (u64, usize) {
        let row = self.dim() * self.value_bytes()
            + self.state_dim() * 4
            + std::mem::size_of::<PackedMeta>();
        let (mut b, mut rows) = (0, 0);
        for shard in self.shards().iter() {
            let shard = shard.read();
            // Freed slots count as rows: their memory is still held (eviction moves rows down
            // into them and gives the room back, see `Shard::compact_tiered`).
            let held = shard.slots();
            let t = shard.cold.as_ref().map_or(0, |t| t.index.bytes() + held * t.slot_bytes());
            // A syncing shard's tombstones and cached rows are memory too.
            let sync = shard.sync.as_ref().map_or(0, |s| s.bytes());
            b += held * row + shard.index.bytes() + t + sync;
            rows += shard.len();
        }
        (b as u64, rows)
    }

    /// Reports this table's memory to the budget (see [`Report`]).
    fn report(&self, tier: &Tier) -> Report {
        let (mine, hot) = self.memory_and_rows();
        let pinned = tier.pins.lock().len().min(hot) as u64;
        let evictable = ((hot as u64 - pinned) * self.evict_row_bytes()).min(mine);
        let before = tier.reported_fixed.swap(mine - evictable, Ordering::Relaxed);
        tier.budget.adjust_fixed(before, mine - evictable);
        let before = tier.reported.swap(mine, Ordering::Relaxed);
        Report { used: tier.budget.adjust_used(before, mine), grew: mine > before, evictable }
    }

    /// After a call: reports this table's memory. A call that brought rows in and left the
    /// store past its budget ([`Budget::marks`]) evicts its table's share of the excess here —
    /// without an evictor, unless an eviction of the table runs already; with one, after
    /// waiting for the evictor's eviction of the table if one runs. A call that added nothing
    /// (its rows were in, read ahead by `prefetch`, say) never evicts: the next call that adds
    /// rows does, or the evictor, which takes over past the background mark.
    fn after_call(&self) {
        let Some(tier) = self.tier() else { return };
        self.evict_after_call(tier);
        tier.trim_if_due();
    }

    /// [`Evict::after_call`]'s eviction.
    fn evict_after_call(&self, tier: &Tier) {
        let Report { used, grew, .. } = self.report(tier);
        let (background, over, _) = tier.budget.marks();
        if tier.budget.background() {
            if used <= background {
                return;
            }
            let me = tier.me.get().cloned().unwrap_or_else(|| Weak::<Self>::new());
            if (used <= over || !grew) && tier.budget.queue(me, &tier.queued) {
                return;
            }
            // Over the budget and growing: wait for the evictor's eviction of this table (if
            // one runs), then evict what is still over — backpressure on whoever adds rows.
            // A failure is noted; the next call meets it in `make_room`.
            let _ = self.evict_share(tier, true, u64::MAX, Share::Mine);
            tier.budget.evict_others(self);
        } else if used > over && grew {
            let _ = self.evict_share(tier, false, u64::MAX, Share::Mine);
            tier.budget.evict_others(self);
        }
    }

    /// Before a call: if the store is over its budget (an eviction failed, or the evictor fell
    /// behind), evicts this table's share on this thread first, and fails with the eviction's
    /// error — before the call changes anything — if it cannot. So a store whose evictions
    /// fail (a full disk: `NoSpace`) passes its budget by one call's rows at most, its rows
    /// stay in memory, dirty, and calls go on once space is freed.
    ///
    /// Only a full disk fails the call: another I/O error (a failing device) is noted and the
    /// call goes on in memory, as before, so that a store whose disk went away keeps serving.
    fn make_room(&self, tier: &Tier) -> Result<()> {
        let (_, over, _) = tier.budget.marks();
        if tier.budget.used() <= over {
            return Ok(());
        }
        match self.evict_share(tier, true, u64::MAX, Share::Mine) {
            Err(e) if e.kind() == ErrorKind::NoSpace => Err(e),
            _ => Ok(()),
        }
    }

    /// Evicts this table's share of the store's excess over its low mark ([`Budget::marks`]),
    /// at most `cap` bytes of it; `wait`: behind an eviction of this table in flight, else
    /// none if one is. Whether the cap left some of the share for another round; a failed
    /// eviction (its rows stay in memory) is noted in the table's and the budget's counters and
    /// returned.
    fn evict_share(&self, tier: &Tier, wait: bool, cap: u64, of: Share) -> Result<bool> {
        let _one = if wait {
            tier.evicting.lock()
        } else {
            match tier.evicting.try_lock() {
                Some(g) => g,
                None => return Ok(false),
            }
        };
        let Report { used, evictable: mine, .. } = self.report(tier);
        let (_, _, low) = tier.budget.marks();
        if used <= low || mine == 0 {
            return Ok(false);
        }
        // Shares of the excess by what each table can free (its hot, unpinned rows).
        let all = used.saturating_sub(tier.budget.fixed()).max(mine);
        let share = match of {
            Share::Mine => ((used - low) as f64 * mine as f64 / all as f64).ceil() as u64,
            Share::Rest => (used - low).min(mine),
        };
        if let Err(e) = self.evict_bytes(tier, share.clamp(1, cap), wait) {
            let message = e.to_string();
            tier.counters.errors.fetch_add(1, Ordering::Relaxed);
            *tier.counters.last_error.lock() = Some(message.clone());
            tier.budget.note_error(message);
            self.report(tier);
            return Err(e);
        }
        self.report(tier);
        Ok(share > cap)
    }

    /// What one hot row costs, as eviction (what it frees) and pinning (what it holds) count it.
    fn evict_row_bytes(&self) -> u64 {
        (self.dim() * self.value_bytes() + self.state_dim() * 4 + 16 + 16 + 16) as u64
    }

    /// Evicts about `bytes` of hot rows (see the module docs).
    /// `yield_to_calls`: take the gate for demotion only between calls
    /// ([`Gate::gate_when_idle`]), as the evictor and callers waiting on it do.
    fn evict_bytes(&self, tier: &Tier, bytes: u64, yield_to_calls: bool) -> Result<()> {
        tier.counters.eviction_rounds.fetch_add(1, Ordering::Relaxed);
        let row = self.evict_row_bytes();
        let n = (bytes / row).max(1) as usize;
        let pins = tier.pins.lock().clone();
        // Steps 1 and 2 hold the gate for reading: `clear` and `load` (which take it for
        // writing) cannot run between choosing victims and writing them.
        let read_gate = tier.gate.read();
        // 1. Victims, and the dirty ones among them.
        let (victims, dirty) = self.choose_victims(n, &pins);
        // 2. Dirty victims to a spill first (durable at the next flush).
        if !dirty.is_empty() {
            let spill = tier.durable.get().ok_or_else(super::store_closed)?;
            spill(&dirty)?;
            tier.counters.evicted_dirty.fetch_add(dirty.len() as u64, Ordering::Relaxed);
        }
        // 3. Demote, with no call in flight.
        drop(read_gate);
        let _gate = if yield_to_calls { Self::gate_when_idle(tier) } else { tier.gate.write() };
        let moved = self.demote_victims(tier, &victims)?;
        tier.counters.evicted_rows.fetch_add(moved, Ordering::Relaxed);
        tier.churned(moved * row);
        Ok(())
    }

    /// Step 1 of [`Evict::evict_bytes`]: `n` victims that are not pinned, by shard, and the
    /// dirty ones among them. Shares of `n` per shard; what a shard cannot give (its rows are
    /// pinned, or few) goes to the shards after it.
    fn choose_victims(&self, n: usize, pins: &Pins) -> (Vec<Vec<u64>>, Vec<u64>) {
        let mut left = n;
        let mut victims: Vec<Vec<u64>> = Vec::with_capacity(self.shards().len());
        let mut dirty = Vec::new();
        for (i, lock) in self.shards().iter().enumerate() {
            let per_shard = left.div_ceil(self.shards().len() - i);
            let mut keys = Vec::with_capacity(per_shard);
            let mut slots = Vec::new();
            // Slots chosen by earlier chunks: still in the policy's lists until step 3.
            let mut chosen: std::collections::HashSet<u64, KeyHash> = Default::default();
            // In chunks, each under the shard's write lock: a call on the shard waits for one
            // chunk at most (each draw of a victim is a few cache misses).
            let mut first = true;
            while keys.len() < per_shard {
                let want = (per_shard - keys.len()).min(VICTIM_CHUNK);
                let mut shard = lock.write();
                let shard = &mut *shard;
                let t = shard.cold.as_mut().expect("tiered");
                if std::mem::take(&mut first) {
                    t.policy.victim_round(true);
                }
                slots.clear();
                let (tk, ch) = (&t.keys, &chosen);
                let held =
                    |slot: usize| pins.contains_key(&tk[slot]) || ch.contains(&(slot as u64));
                t.policy.victims(want, &held, &mut slots);
                for &s in &slots {
                    chosen.insert(s as u64);
                    keys.push(t.keys[s]);
                    if shard.meta[s].is_dirty() {
                        dirty.push(t.keys[s]);
                    }
                }
                if slots.len() < want {
                    break; // everything left is pinned
                }
            }
            if !first {
                lock.write().cold.as_mut().expect("tiered").policy.victim_round(false);
            }
            left -= keys.len().min(left);
            victims.push(keys);
        }
        (victims, dirty)
    }

    /// Step 3 of [`Evict::evict_bytes`], under the gate for writing: moves every victim still
    /// clean and unpinned to the cold index, then compacts each shard; returns the rows moved.
    fn demote_victims(&self, tier: &Tier, victims: &[Vec<u64>]) -> Result<u64> {
        let pins = tier.pins.lock();
        // A disk location in a slot not installed yet belongs to a segment a flush is still
        // writing: such a row stays in memory until that segment is durable.
        let files = tier.files.read();
        let mut moved = 0u64;
        for (lock, keys) in self.shards().iter().zip(victims) {
            let mut shard = lock.write();
            for &key in keys {
                if !pins.contains_key(&key)
                    && shard.demote(key, |l| files.installed(loc_parts(l).0))?
                {
                    moved += 1;
                }
            }
            // The freed slots go (rows move down into them) and so does the arena room past a
            // fifth more rows than are left: resident memory follows the rows out.
            shard.shrink_if_sparse()?;
            let len = shard.len();
            shard.compact_tiered(len + len / KEEP_HEADROOM);
        }
        Ok(moved)
    }
}

impl<H: Host> Evict for H {}

impl<H: Host> Reclaim for H {
    fn reclaim_rest(&self) {
        if let Some(tier) = self.tier() {
            let _ = self.evict_share(tier, false, u64::MAX, Share::Rest);
        }
    }

    fn reclaim_queued(&self) {
        let Some(tier) = self.tier() else { return };
        tier.queued.store(false, Ordering::Release);
        // Rounds of at most EVICTOR_ROUND bytes, letting go of every lock between them: calls
        // wait for one round at most, never for a whole large eviction.
        for _ in 0..1024 {
            // A failure (a full disk) is noted; the next call over the budget meets it.
            if !self.evict_share(tier, true, EVICTOR_ROUND, Share::Mine).unwrap_or(false) {
                break;
            }
            std::thread::yield_now();
        }
        // The other tables' shares too: no call of theirs may come to evict them.
        tier.budget.evict_others(self);
        tier.trim_if_due();
    }
}
