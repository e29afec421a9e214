//! From the gathered accesses to a plan: each table's row set in arena order (by first read,
//! the early rows first) and each worker's rows, with the ones its static thread cache holds.

use std::time::Instant;

use hashbrown::HashMap;

use crate::config::Options;

/// One logged access: a read or an update of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `read(table, keys)`.
    Read,
    /// `update(table, keys, deltas)`.
    Update,
}

/// One worker's accesses in a gathered clock, in order: `(table, key, op)`.
pub type Log = Vec<(u32, u64, Op)>;

/// "No slot": a key outside the static thread cache.
pub const NONE: u32 = u32::MAX;

/// The rows of one owner in a table's arena: `[start, early)` the early prefetch,
/// `[early, read)` the normal one, `[read, end)` rows only updated (never fetched).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// The process that holds the rows' masters.
    pub owner: usize,
    /// First slot.
    pub start: usize,
    /// End of the early rows.
    pub early: usize,
    /// End of the rows read.
    pub read: usize,
    /// End of the block.
    pub end: usize,
}

/// A table's part of the plan: the process's rows in arena order.
#[derive(Debug, Default)]
pub struct TablePlan {
    /// The rows, in arena order: by owner; within an owner the read rows by first-read rank
    /// (the early ones first), then the rows only updated.
    pub keys: Vec<u64>,
    /// One block per owner with rows here, in arena order.
    pub blocks: Vec<Block>,
}

/// A worker's part of a table's plan.
#[derive(Debug, Default)]
pub struct WorkerTable {
    /// The keys it accesses, in first-access order.
    pub keys: Vec<u64>,
    /// Per key: its slot in the worker's static delta buffer, or [`NONE`].
    pub own: Vec<u32>,
    /// Slot → key of the static delta buffer.
    pub own_keys: Vec<u64>,
    /// Of `own_keys`, the rows the contention rule chose.
    pub contention: usize,
}

/// A worker's part of the plan, per table.
#[derive(Debug, Default)]
pub struct WorkerPlan {
    /// Per table.
    pub tables: Vec<WorkerTable>,
}

/// What building a plan found and cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanStats {
    /// Accesses logged (reads and updates of one row each).
    pub accesses: u64,
    /// Clocks gathered.
    pub clocks: u64,
    /// Rows in the plan, all tables.
    pub rows: u64,
    /// Bytes of the arena (values of every planned row).
    pub bytes: u64,
    /// Rows in the early prefetch.
    pub early_rows: u64,
    /// Rows prefetched (early and normal).
    pub prefetch_rows: u64,
    /// Prefetch requests per clock (early and normal, per table, per owner).
    pub prefetch_frames: u64,
    /// Rows in the workers' static thread caches, all workers.
    pub thread_cache_rows: u64,
    /// Of those, the rows the contention rule chose.
    pub contention_rows: u64,
    /// Rows this process handed to another by placement (one process: 0).
    pub placement_moves: u64,
    /// Seconds placing rows (across processes: the all-gathers and the moves).
    pub placement_s: f64,
    /// Seconds merging the logs into row sets and ranks.
    pub merge_s: f64,
    /// Seconds deciding the thread caches.
    pub thread_cache_s: f64,
    /// Seconds building the static structures (indexes, arenas).
    pub static_s: f64,
}

/// A plan: what the specialised structures are built from.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per table.
    pub tables: Vec<TablePlan>,
    /// Per worker.
    pub workers: Vec<WorkerPlan>,
    /// What it found and cost.
    pub stats: PlanStats,
}

/// A worker's rows of one table in first-access order, and what it did to each.
type Rows = (Vec<u64>, HashMap<u64, Seen>);

#[derive(Clone, Copy, Default)]
struct Seen {
    /// Position of the first read among the worker's reads (u64::MAX: never read).
    first_read: u64,
    accesses: u32,
    updated: bool,
}

impl Plan {
    /// Builds a plan from each worker's log over `tables` tables; `owner(table, key)` names
    /// the process holding a row's master.
    pub fn build(
        logs: &[Log],
        tables: usize,
        dims: &[usize],
        opts: &Options,
        clocks: u64,
        owner: &dyn Fn(usize, u64) -> usize,
    ) -> Plan {
        let t0 = Instant::now();
        // Per worker, per table: what it did to each row, in first-access order.
        let mut per_worker: Vec<Vec<Rows>> = Vec::new();
        let mut totals = Vec::new();
        for log in logs {
            let mut t: Vec<Rows> = (0..tables).map(|_| Default::default()).collect();
            let mut reads = 0u64;
            for &(table, key, op) in log {
                let (order, seen) = &mut t[table as usize];
                let s = seen.entry(key).or_insert_with(|| {
                    order.push(key);
                    Seen { first_read: u64::MAX, ..Seen::default() }
                });
                s.accesses += 1;
                match op {
                    Op::Read => {
                        if s.first_read == u64::MAX {
                            s.first_read = reads;
                        }
                        reads += 1;
                    }
                    Op::Update => s.updated = true,
                }
            }
            totals.push((reads.max(1), log.len().max(1) as f64));
            per_worker.push(t);
        }
        // The process's rows: the lowest first-read rank over the workers (as a share of each
        // worker's reads), and how many workers update each row.
        let mut plan = Plan::default();
        let mut updaters: Vec<HashMap<u64, u32>> = vec![HashMap::new(); tables];
        for table in 0..tables {
            let mut rank: HashMap<u64, f64> = HashMap::new();
            for (w, t) in per_worker.iter().enumerate() {
                let (order, seen) = &t[table];
                for key in order {
                    let s = seen[key];
                    let r = if s.first_read == u64::MAX {
                        f64::INFINITY
                    } else {
                        s.first_read as f64 / totals[w].0 as f64
                    };
                    let e = rank.entry(*key).or_insert(f64::INFINITY);
                    *e = e.min(r);
                    if s.updated {
                        *updaters[table].entry(*key).or_insert(0) += 1;
                    }
                }
            }
            // Arena order: by owner, then read rows by rank (early first), then update-only.
            let mut keys: Vec<(usize, f64, u64)> =
                rank.into_iter().map(|(k, r)| (owner(table, k), r, k)).collect();
            keys.sort_unstable_by(|a, b| {
                a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2))
            });
            let mut tp = TablePlan::default();
            let mut i = 0;
            while i < keys.len() {
                let o = keys[i].0;
                let start = i;
                let end = start + keys[start..].iter().take_while(|k| k.0 == o).count();
                let read = start + keys[start..end].iter().take_while(|k| k.1.is_finite()).count();
                let early =
                    start + keys[start..read].iter().take_while(|k| k.1 < opts.early_ratio).count();
                plan.stats.early_rows += (early - start) as u64;
                plan.stats.prefetch_rows += (read - start) as u64;
                plan.stats.prefetch_frames += u64::from(early > start) + u64::from(read > early);
                tp.blocks.push(Block { owner: o, start, early, read, end });
                i = end;
            }
            let rows = keys.len() as u64;
            plan.stats.rows += rows;
            plan.stats.bytes += rows * dims[table] as u64 * 4;
            tp.keys = keys.into_iter().map(|(_, _, k)| k).collect();
            plan.tables.push(tp);
        }
        plan.stats.merge_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // Static thread caches: the contention rule first (AF > CPB / (n - 1) where n workers
        // update the row), then descending access frequency, up to the capacity.
        for (w, t) in per_worker.into_iter().enumerate() {
            let total = totals[w].1;
            let mut candidates: Vec<(bool, f64, usize, u64)> = Vec::new();
            for (table, (order, seen)) in t.iter().enumerate() {
                for key in order {
                    let s = seen[key];
                    if !s.updated {
                        continue;
                    }
                    let af = f64::from(s.accesses) / total;
                    let n = updaters[table].get(key).copied().unwrap_or(1);
                    let contended = n >= 2 && af > opts.cpb / f64::from(n - 1);
                    candidates.push((contended, af, table, *key));
                }
            }
            let cap = opts.thread_cache_rows.unwrap_or(usize::MAX);
            if candidates.len() > cap {
                candidates.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
                candidates.truncate(cap);
            }
            let mut chosen: Vec<HashMap<u64, bool>> = vec![HashMap::new(); tables];
            for (contended, _, table, key) in candidates {
                chosen[table].insert(key, contended);
            }
            let mut wp = WorkerPlan::default();
            for (table, (order, _)) in t.into_iter().enumerate() {
                let mut wt = WorkerTable { keys: order, ..WorkerTable::default() };
                wt.own = wt
                    .keys
                    .iter()
                    .map(|k| match chosen[table].get(k) {
                        Some(&contended) => {
                            wt.contention += usize::from(contended);
                            wt.own_keys.push(*k);
                            (wt.own_keys.len() - 1) as u32
                        }
                        None => NONE,
                    })
                    .collect();
                plan.stats.thread_cache_rows += wt.own_keys.len() as u64;
                plan.stats.contention_rows += wt.contention as u64;
                wp.tables.push(wt);
            }
            plan.workers.push(wp);
        }
        plan.stats.thread_cache_s = t1.elapsed().as_secs_f64();
        plan.stats.accesses = logs.iter().map(|l| l.len() as u64).sum();
        plan.stats.clocks = clocks;
        plan
    }
}
