//! Fault-in: a call on a tiered table brings the rows of its ids that are on disk into memory
//! before it runs ([`Gate::enter`]): under each shard's read lock it notes an access for every
//! hot id and collects the cold ones, reads their records in one batch from the segments (each
//! checked against its CRC and key), and promotes them under the shard's write lock (unless
//! another call did first). No lock or dynamic call is added per row: the engine is reached once
//! per batch of reads.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use super::reclaim::Evict;
use super::{Entered, Host, Tier};
use crate::batch::Groups;
use crate::disk::plan::{merged_reads, DirectRange};
use crate::disk::segment::Record;
use crate::shard::cold::{loc_parts, FileTable};
use crate::{Error, Result};

/// Cold rows a call reads and promotes per round: its temporaries (records and their block
/// buffers, at most ~5 KiB a row) stay near 20 MiB, which the allocator reuses from call to call,
/// however many rows the call brings in (a 300k-row lookup held 1.5 GiB of them at once).
const FAULT_ROUND: usize = 4096;

/// The process's engine for batched cold reads (io_uring where the kernel has it).
fn engine() -> &'static dyn crate::disk::io::ReadEngine {
    static ENGINE: OnceLock<Box<dyn crate::disk::io::ReadEngine>> = OnceLock::new();
    &**ENGINE.get_or_init(crate::disk::io::default_engine)
}

/// Who notes a call's accesses to rows already in memory, for the replacement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `fault_in`, which probes the hot index for them.
    Noted,
    /// The call itself, in its shard pass
    /// ([`Shard::note_accesses`](crate::shard::Shard::note_accesses)).
    ByCaller,
}

/// Fault-in, for the table above the tier ([`Host`]).
pub(crate) trait Fault: Host {
    /// Promotes the cold ids among `groups` (and with [`Access::Noted`], notes accesses to the
    /// hot ones): one read lock per shard to sort them out, one batch of reads for all of them,
    /// then the shards promote their rows in parallel.
    fn fault_in(&self, tier: &Tier, groups: &Groups, access: Access) -> Result<usize> {
        // Held from capturing locations to reading them: a rewrite cannot release the slots
        // they point into meanwhile (it takes the file table for writing).
        let files = tier.files.read();
        let files = &*files;
        let mut cold: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.shards().len()];
        let (mut slots, mut misses) = (Vec::new(), Vec::new());
        for (s, wanted) in cold.iter_mut().enumerate() {
            let (keys, _) = groups.shard(s);
            if keys.is_empty() {
                continue;
            }
            let shard = self.shards()[s].read();
            let note_hot = access == Access::Noted;
            shard.find_cold(keys, note_hot, &mut slots, &mut misses, wanted)?;
        }
        // Every shard's cold rows in one batch of reads (so the engine keeps the whole batch in
        // flight, up to its queue depth), then each shard promotes its rows.
        let mut wanted: Vec<(u64, u64)> = Vec::new();
        let mut bounds = vec![0usize];
        for c in &mut cold {
            c.sort_unstable_by_key(|&(_, l)| l);
            c.dedup();
            wanted.extend_from_slice(c);
            bounds.push(wanted.len());
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        // In rounds of FAULT_ROUND rows, so that the records and their page buffers of a large
        // call never pile up.
        for lo in (0..wanted.len()).step_by(FAULT_ROUND) {
            let hi = (lo + FAULT_ROUND).min(wanted.len());
            self.promote_round(files, tier, &wanted, &bounds, lo..hi)?;
        }
        tier.churned(wanted.len() as u64 * self.evict_row_bytes());
        Ok(wanted.len())
    }

    /// One round of [`Fault::fault_in`]: reads the records of `wanted[round]` (by shard between
    /// `bounds`) and promotes them, the shards in parallel.
    fn promote_round(
        &self,
        files: &FileTable,
        tier: &Tier,
        wanted: &[(u64, u64)],
        bounds: &[usize],
        round: std::ops::Range<usize>,
    ) -> Result<()> {
        let (lo, hi) = (round.start, round.end);
        let records = self.read_records(files, tier, &wanted[lo..hi])?;
        let span = |s: usize| (bounds[s].max(lo), bounds[s + 1].min(hi));
        let busy: Vec<usize> = (0..bounds.len() - 1)
            .filter(|&s| {
                let (a, b) = span(s);
                a < b
            })
            .collect();
        crate::sched::Scheduler::global().run(busy.len(), busy.len() > 1, |i| {
            let (a, b) = span(busy[i]);
            let mut shard = self.shards()[busy[i]].write();
            for ((key, l), rec) in wanted[a..b].iter().zip(&records[a - lo..b - lo]) {
                // Unless another call promoted it (or it moved) meanwhile.
                shard.promote_if_cold(*key, *l, rec)?;
            }
            Ok(())
        })
    }

    /// Reads the records at `locs` (sorted by location), checking each one's key.
    fn read_records(
        &self,
        files: &FileTable,
        tier: &Tier,
        wanted: &[(u64, u64)],
    ) -> Result<Vec<Record>> {
        // All records whose blocks can be read directly go to the I/O engine in one batch, all
        // in flight together: each record's 1–2 blocks at its file's alignment (the device's
        // logical block), merged with its neighbours' in the same file when they share or touch
        // a block or lie close ([`merged_reads`]). The rest are read one by one through the
        // file layer.
        let mut out: Vec<Option<Record>> = vec![None; wanted.len()];
        let mut ranges = Vec::new();
        for (n, &(_, l)) in wanted.iter().enumerate() {
            let (slot, idx) = loc_parts(l);
            if let Some((fd, offset, len, skip)) = files.reader(slot)?.direct_range(idx) {
                ranges.push(DirectRange { fd, offset, len, skip, n });
            }
        }
        if !ranges.is_empty() {
            let (reqs, at) = merged_reads(&mut ranges);
            let mut bufs: Vec<_> =
                reqs.iter().map(|r| crate::disk::io::AlignedBuf::pooled(r.len)).collect();
            engine()
                .read_all(&reqs, &mut bufs)
                .map_err(|e| Error::io("read records of the memory tier", e))?;
            for (n, req, from) in at {
                let (slot, idx) = loc_parts(wanted[n].1);
                out[n] = Some(files.reader(slot)?.decode(&bufs[req][from..], idx)?);
            }
            crate::disk::io::AlignedBuf::recycle(bufs);
            tier.counters.cold_ios.fetch_add(reqs.len() as u64, Ordering::Relaxed);
            let bytes: usize = reqs.iter().map(|r| r.len).sum();
            tier.counters.cold_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        let mut records = Vec::with_capacity(wanted.len());
        for (&(key, l), got) in wanted.iter().zip(out) {
            let (slot, idx) = loc_parts(l);
            let reader = files.reader(slot)?;
            let rec = match got {
                Some(rec) => rec,
                None => reader.read(idx)?,
            };
            if rec.key != key || rec.tombstone {
                return Err(Error::corrupt(format!(
                    "record {idx} of segment {} holds key {}, expected {key}",
                    reader.header().seq,
                    rec.key
                )));
            }
            records.push(rec);
        }
        tier.counters.cold_reads.fetch_add(wanted.len() as u64, Ordering::Relaxed);
        Ok(records)
    }

    /// Brings the rows of `ids` that are on disk into memory, as a call on them would, and
    /// returns how many it read; rows in memory count as used, ids with no row are ignored,
    /// and no value changes. For a pipeline that reads batch n+1's rows while batch n trains
    /// (pin them first, with [`Table::pin`](crate::Table::pin), so that no eviction drops them
    /// before their batch). A no-op (0) on a table without a memory budget.
    fn prefetch(&self, ids: &[u64]) -> Result<usize> {
        let Some(tier) = self.tier() else { return Ok(0) };
        let groups = self.group(ids)?;
        self.make_room(tier)?;
        let gate = tier.gate.read();
        let read = self.fault_in(tier, &groups, Access::Noted);
        drop(Entered { table: self, gate: Some(gate) });
        read
    }
}

impl<H: Host> Fault for H {}
