//! The process cache (the arena of planned rows and the map of the others) and the workers'
//! delta buffers.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use embstore_common::Result;
use embstore_index::NeighborHash;
use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};

use crate::config::Options;
use crate::masters::{Masters, Prepared};
use crate::plan::{Block, Plan, NONE};

/// Shards of the dynamic row map.
const SHARDS: usize = 64;

/// An age no clock has: a copy never fetched.
pub(crate) const NEVER: i64 = i64::MIN;

/// A row of the dynamic map: its values as of clock `age`.
pub(crate) struct DynRow {
    pub(crate) age: i64,
    pub(crate) values: Box<[f32]>,
}

/// A table's part of the process cache.
pub(crate) struct TableCache {
    pub(crate) dim: usize,
    /// Planned key → arena slot (static store only).
    pub(crate) index: NeighborHash,
    /// Arena slot → key, in arena order.
    pub(crate) keys: Vec<u64>,
    /// The arena's blocks, one per owner.
    pub(crate) blocks: Vec<Block>,
    /// Per block: its early and normal prefetch, encoded once.
    pub(crate) prepared: Vec<[Prepared; 2]>,
    /// The arena with prefetch: replaced whole by each refresh, so that a worker reads its
    /// own snapshot without locking.
    pub(crate) arena: RwLock<Arc<Arena>>,
    /// The arena without prefetch: rows filled one at a time as they are read.
    pub(crate) values: RwLock<Vec<f32>>,
    /// Static store without prefetch: the age of each slot's copy.
    pub(crate) slot_age: Vec<AtomicI64>,
    /// Every other row (all of them without a static store), sharded by key.
    pub(crate) dynamic: Vec<Mutex<HashMap<u64, DynRow>>>,
}

/// A refreshed arena: `keys.len() × dim` values and the clock each block reflects.
#[derive(Default)]
pub(crate) struct Arena {
    pub(crate) values: Vec<f32>,
    pub(crate) ages: Vec<i64>,
}

impl TableCache {
    /// The block of arena slot `slot`.
    #[inline]
    pub(crate) fn block_of(&self, slot: usize) -> usize {
        if self.blocks.len() == 1 {
            return 0;
        }
        self.blocks.partition_point(|b| b.end <= slot)
    }

    pub(crate) fn shard(&self, key: u64) -> &Mutex<HashMap<u64, DynRow>> {
        // The high bits of a multiplicative hash: keys that differ only in high bits spread too.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.dynamic[(h >> 58) as usize % SHARDS]
    }
}

/// A worker's view of a table's plan: key → (arena slot, own slot).
pub(crate) struct WorkerIndex {
    pub(crate) index: NeighborHash,
    pub(crate) entries: Vec<(u32, u32)>,
}

/// Everything built from one plan (or from none: every row dynamic).
pub(crate) struct ProcessCache {
    pub(crate) generation: u64,
    pub(crate) plan: Option<Arc<Plan>>,
    pub(crate) tables: Vec<TableCache>,
    /// `[worker][table]`; empty without a plan or without static thread caches.
    pub(crate) workers: Vec<Vec<WorkerIndex>>,
    /// The clock the arena's (and the prefetched map rows') values reflect.
    pub(crate) arena_age: AtomicI64,
    pub(crate) refresh: Mutex<()>,
    pub(crate) static_store: bool,
}

impl ProcessCache {
    /// The cache of `plan` (none: everything dynamic).
    pub(crate) fn build(
        generation: u64,
        plan: Option<Arc<Plan>>,
        dims: &[usize],
        opts: &Options,
        masters: &dyn Masters,
    ) -> Result<Self> {
        let static_store = opts.static_store && plan.is_some();
        let mut tables = Vec::new();
        for (t, &dim) in dims.iter().enumerate() {
            let (keys, blocks) = match (&plan, static_store) {
                (Some(p), true) => (p.tables[t].keys.clone(), p.tables[t].blocks.clone()),
                _ => (Vec::new(), Vec::new()),
            };
            let prepared = blocks
                .iter()
                .map(|b| {
                    [
                        masters.prepare(t, b.owner, &keys[b.start..b.early]),
                        masters.prepare(t, b.owner, &keys[b.early..b.read]),
                    ]
                })
                .collect();
            let mut index = NeighborHash::with_capacity(keys.len().max(1))?;
            let slots: Vec<u64> = (0..keys.len() as u64).collect();
            index.insert_batch(&keys, &slots)?;
            let slot_age = if opts.prefetch {
                Vec::new()
            } else {
                (0..keys.len()).map(|_| AtomicI64::new(NEVER)).collect()
            };
            tables.push(TableCache {
                dim,
                index,
                arena: RwLock::new(Arc::new(Arena::default())),
                values: RwLock::new(if opts.prefetch {
                    Vec::new()
                } else {
                    vec![0.0; keys.len() * dim]
                }),
                keys,
                blocks,
                prepared,
                slot_age,
                dynamic: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            });
        }
        let mut workers = Vec::new();
        if let (Some(p), true) = (&plan, opts.thread_caches) {
            for wp in &p.workers {
                let mut per_table = Vec::new();
                for (t, wt) in wp.tables.iter().enumerate() {
                    let mut index = NeighborHash::with_capacity(wt.keys.len().max(1))?;
                    let payloads: Vec<u64> = (0..wt.keys.len() as u64).collect();
                    index.insert_batch(&wt.keys, &payloads)?;
                    let entries = wt
                        .keys
                        .iter()
                        .zip(&wt.own)
                        .map(|(k, &own)| {
                            let arena = if static_store {
                                tables[t].index.get(*k).map_or(NONE, |s| s as u32)
                            } else {
                                NONE
                            };
                            (arena, own)
                        })
                        .collect();
                    per_table.push(WorkerIndex { index, entries });
                }
                workers.push(per_table);
            }
        }
        Ok(Self {
            generation,
            plan,
            tables,
            workers,
            arena_age: AtomicI64::new(NEVER),
            refresh: Mutex::new(()),
            static_store,
        })
    }

    /// The age of the arena's values.
    pub(crate) fn arena_age(&self) -> i64 {
        self.arena_age.load(Ordering::Acquire)
    }
}

/// A table's part of a worker's delta buffer.
#[derive(Default)]
pub(crate) struct BufTable {
    pub(crate) dim: usize,
    /// The static part: one row per own slot of the plan.
    pub(crate) dense: Vec<f32>,
    pub(crate) dirty: Vec<bool>,
    pub(crate) touched: Vec<u32>,
    /// Every other row.
    pub(crate) map: HashMap<u64, Box<[f32]>>,
}

/// A worker's updates of one clock, summed per row in the order it made them.
pub(crate) struct DeltaBuf {
    pub(crate) clock: u32,
    /// The plan whose own slots `dense` follows (and its worker).
    pub(crate) plan: Option<Arc<Plan>>,
    pub(crate) worker: usize,
    pub(crate) tables: Vec<BufTable>,
}

impl DeltaBuf {
    /// An empty buffer for `worker` under `cache`'s plan.
    pub(crate) fn new(cache: &ProcessCache, worker: usize, clock: u32) -> Self {
        let own = !cache.workers.is_empty();
        let tables = cache
            .tables
            .iter()
            .enumerate()
            .map(|(t, tc)| {
                let rows = match (&cache.plan, own) {
                    (Some(p), true) => p.workers[worker].tables[t].own_keys.len(),
                    _ => 0,
                };
                BufTable {
                    dim: tc.dim,
                    dense: vec![0.0; rows * tc.dim],
                    dirty: vec![false; rows],
                    ..BufTable::default()
                }
            })
            .collect();
        Self { clock, plan: if own { cache.plan.clone() } else { None }, worker, tables }
    }

    /// Empties the buffer for reuse in `clock`.
    pub(crate) fn reset(&mut self, clock: u32) {
        self.clock = clock;
        for t in &mut self.tables {
            for &s in &t.touched {
                let d = t.dim;
                t.dense[s as usize * d..(s as usize + 1) * d].fill(0.0);
                t.dirty[s as usize] = false;
            }
            t.touched.clear();
            t.map.clear();
        }
    }

    /// Adds `delta` to the row of `key` (own slot `own`, or [`NONE`]).
    #[inline]
    pub(crate) fn add(&mut self, table: usize, key: u64, own: u32, delta: &[f32]) {
        let t = &mut self.tables[table];
        let row: &mut [f32] = if own != NONE {
            let s = own as usize;
            if !t.dirty[s] {
                t.dirty[s] = true;
                t.touched.push(own);
            }
            &mut t.dense[s * t.dim..(s + 1) * t.dim]
        } else {
            t.map.entry(key).or_insert_with(|| vec![0.0; delta.len()].into_boxed_slice())
        };
        for (r, d) in row.iter_mut().zip(delta) {
            *r += d;
        }
    }

    /// Adds this buffer's delta of `key` (own slot `own`, or [`NONE`]) into `out`.
    #[inline]
    pub(crate) fn add_into(&self, table: usize, key: u64, own: u32, out: &mut [f32]) {
        let t = &self.tables[table];
        let row = if own != NONE {
            let s = own as usize;
            if !t.dirty[s] {
                return;
            }
            &t.dense[s * t.dim..(s + 1) * t.dim]
        } else {
            match t.map.get(&key) {
                Some(r) => r,
                None => return,
            }
        };
        for (o, d) in out.iter_mut().zip(row.iter()) {
            *o += d;
        }
    }

    /// The rows it changed in `table` and their deltas, dense rows first (slot order).
    pub(crate) fn rows(&self, table: usize) -> (Vec<u64>, Vec<f32>) {
        let t = &self.tables[table];
        let mut keys = Vec::with_capacity(t.touched.len() + t.map.len());
        let mut deltas = Vec::with_capacity((t.touched.len() + t.map.len()) * t.dim);
        if let Some(p) = &self.plan {
            let own_keys = &p.workers[self.worker].tables[table].own_keys;
            let mut touched = t.touched.clone();
            touched.sort_unstable();
            for s in touched {
                keys.push(own_keys[s as usize]);
                deltas.extend_from_slice(&t.dense[s as usize * t.dim..(s as usize + 1) * t.dim]);
            }
        }
        for (k, row) in &t.map {
            keys.push(*k);
            deltas.extend_from_slice(row);
        }
        (keys, deltas)
    }

    /// Rows changed, all tables.
    pub(crate) fn len(&self) -> usize {
        self.tables.iter().map(|t| t.touched.len() + t.map.len()).sum()
    }
}
