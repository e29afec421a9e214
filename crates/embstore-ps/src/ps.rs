//! The parameter server: workers, clocks, gathering, refreshes and pushes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use embstore_common::{Error, ErrorKind, Result};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::cache::{Arena, DeltaBuf, DynRow, ProcessCache, NEVER};
use crate::config::{Consistency, Options, Replan};
use crate::masters::Masters;
use crate::plan::{Log, Op, Plan, PlanStats, NONE};

/// Counters of a parameter server's work since it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Clocks every worker has finished. (The counts of rows read, updated and fetched are
    /// as of each worker's last clock.)
    pub clocks: u64,
    /// Rows read by the workers.
    pub reads: u64,
    /// Rows updated by the workers.
    pub updates: u64,
    /// Accesses to rows outside the plan (0 without a plan).
    pub overflow: u64,
    /// Rows fetched one at a time (on demand).
    pub fetches: u64,
    /// Rows read in bulk by prefetches, and the bulk requests.
    pub prefetch_rows: u64,
    /// Bulk prefetch requests.
    pub prefetch_requests: u64,
    /// Rows pushed to the masters (one per row per worker per clock), and the requests.
    pub pushed_rows: u64,
    /// Push requests.
    pub push_requests: u64,
    /// Bytes of values read from and added to the masters.
    pub bytes_read: u64,
    /// Bytes of deltas added to the masters.
    pub bytes_pushed: u64,
    /// Seconds workers spent waiting at clock boundaries, all workers.
    pub wait_s: f64,
    /// Times overflow passed 10 % of a clock's accesses two clocks running.
    pub overflow_warnings: u64,
    /// Plans rebuilt automatically.
    pub replans: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    updates: AtomicU64,
    overflow: AtomicU64,
    fetches: AtomicU64,
    prefetch_rows: AtomicU64,
    prefetch_requests: AtomicU64,
    pushed_rows: AtomicU64,
    push_requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_pushed: AtomicU64,
    wait_ns: AtomicU64,
    overflow_warnings: AtomicU64,
    replans: AtomicU64,
    /// This clock's accesses and overflow accesses (reset at each clock boundary).
    clock_accesses: AtomicU64,
    clock_overflow: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GatherMode {
    Off,
    Virtual,
    Real,
}

struct ClockState {
    clocks: Vec<u32>,
    /// Buffers published by `clock()` and not pushed yet, by (clock, worker): pushed in that
    /// order, so that every row receives its deltas in the same order in every variant.
    published: BTreeMap<(u32, usize), Arc<DeltaBuf>>,
    error: Option<Error>,
    /// Consecutive clocks whose overflow passed 10 %.
    over: u32,
    /// The clock whose accesses are being gathered for an automatic re-plan.
    record: Option<u32>,
    recorded: Vec<Option<Log>>,
}

struct WorkerState {
    clock: u32,
    cache: Arc<ProcessCache>,
    current: DeltaBuf,
    /// Buffers of earlier clocks that some cached row may not reflect yet (SSP).
    history: VecDeque<Arc<DeltaBuf>>,
    spare: Vec<DeltaBuf>,
    log: Option<Log>,
    virtual_clocks: u32,
    /// Per table: this worker's snapshot of the arena and its age.
    snapshots: Vec<(i64, Arc<Arena>)>,
    /// Counted here, added to the shared counters at each clock.
    local: Local,
}

/// A worker's counts since its last clock.
#[derive(Default)]
struct Local {
    reads: u64,
    updates: u64,
    overflow: u64,
    fetches: u64,
}

pub(crate) struct Inner {
    masters: Arc<dyn Masters>,
    dims: Vec<usize>,
    names: Vec<String>,
    workers: usize,
    opts: Options,
    sync: Mutex<ClockState>,
    cv: Condvar,
    /// Every update of clocks `<= pushed` is in the masters.
    pushed: AtomicI64,
    /// A push failed (`ClockState::error` says why): every call fails from then on.
    failed: std::sync::atomic::AtomicBool,
    /// Pushes hold it exclusively; reads from the masters share it, so that a copy's age is
    /// exact.
    push_lock: RwLock<()>,
    cache: RwLock<Arc<ProcessCache>>,
    generation: AtomicU64,
    states: Vec<Mutex<WorkerState>>,
    gather: Mutex<(GatherMode, u64)>,
    logs: Mutex<Vec<Log>>,
    plan_stats: Mutex<Option<PlanStats>>,
    counters: Counters,
}

/// A parameter server over `workers` workers (threads of this process): see the crate docs.
#[derive(Clone)]
pub struct Ps {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ps")
            .field("tables", &self.inner.names)
            .field("workers", &self.inner.workers)
            .field("options", &self.inner.opts)
            .finish()
    }
}

/// One worker's handle: `read`, `update`, `clock`. Its calls must come from one thread at a
/// time (they lock the worker's state).
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
    w: usize,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.w).finish()
    }
}

impl Ps {
    /// A parameter server over `masters` with `workers` workers.
    pub fn new(masters: Arc<dyn Masters>, workers: usize, opts: Options) -> Result<Self> {
        opts.validate()?;
        if workers == 0 || workers > 4096 {
            return Err(Error::invalid(format!("workers must be in 1..=4096, got {workers}")));
        }
        let names = masters.names();
        let dims: Vec<usize> = (0..names.len()).map(|t| masters.dim(t)).collect();
        let cache = Arc::new(ProcessCache::build(0, None, &dims, &opts, &*masters)?);
        let states = (0..workers)
            .map(|w| {
                Mutex::new(WorkerState {
                    clock: 1,
                    current: DeltaBuf::new(&cache, w, 1),
                    cache: cache.clone(),
                    history: VecDeque::new(),
                    spare: Vec::new(),
                    log: None,
                    virtual_clocks: 0,
                    snapshots: Vec::new(),
                    local: Local::default(),
                })
            })
            .collect();
        let inner = Inner {
            masters,
            dims,
            names,
            workers,
            opts,
            sync: Mutex::new(ClockState {
                clocks: vec![1; workers],
                published: BTreeMap::new(),
                error: None,
                over: 0,
                record: None,
                recorded: vec![None; workers],
            }),
            cv: Condvar::new(),
            pushed: AtomicI64::new(0),
            failed: std::sync::atomic::AtomicBool::new(false),
            push_lock: RwLock::new(()),
            cache: RwLock::new(cache),
            generation: AtomicU64::new(0),
            states,
            gather: Mutex::new((GatherMode::Off, 0)),
            logs: Mutex::new(Vec::new()),
            plan_stats: Mutex::new(None),
            counters: Counters::default(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The handle of worker `w`.
    pub fn worker(&self, w: usize) -> Result<Worker> {
        if w >= self.inner.workers {
            return Err(Error::invalid(format!(
                "worker {w} out of range: this parameter server has {} workers",
                self.inner.workers
            )));
        }
        Ok(Worker { inner: self.inner.clone(), w })
    }

    /// The workers.
    pub fn workers(&self) -> usize {
        self.inner.workers
    }

    /// The tables' names, in order (a table's number is its position).
    pub fn tables(&self) -> &[String] {
        &self.inner.names
    }

    /// Values per row of each table.
    pub fn dims(&self) -> &[usize] {
        &self.inner.dims
    }

    /// The options it runs with.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Each worker's clock (the first is 1).
    pub fn clocks(&self) -> Vec<u32> {
        self.inner.sync.lock().clocks.clone()
    }

    /// Starts gathering: every access the workers make from now on is logged until
    /// [`Ps::finish_gather`]. Virtual: the accesses read and write nothing (reads return
    /// zeros, `clock()` returns at once); real: they run as usual. Every worker must be at the
    /// same clock with nothing updated in it.
    pub fn start_gather(&self, virtual_: bool) -> Result<()> {
        let mut g = self.inner.gather.lock();
        if g.0 != GatherMode::Off {
            return Err(Error::invalid("a gather is already running: finish_gather() first"));
        }
        self.inner.at_boundary("gather")?;
        for s in &self.inner.states {
            let mut st = s.lock();
            st.log = Some(Vec::new());
            st.virtual_clocks = 0;
        }
        *g = (if virtual_ { GatherMode::Virtual } else { GatherMode::Real }, 0);
        Ok(())
    }

    /// Ends the gather and builds the plan and every specialised structure from it; returns
    /// what it found and cost. The workers use the plan from their next access on.
    pub fn finish_gather(&self) -> Result<PlanStats> {
        let mut g = self.inner.gather.lock();
        let mode = g.0;
        if mode == GatherMode::Off {
            return Err(Error::invalid("no gather is running: start_gather() first"));
        }
        if mode == GatherMode::Real {
            self.inner.at_boundary("finish_gather")?;
        }
        let mut logs = Vec::new();
        let mut clocks = 0;
        for s in &self.inner.states {
            let mut st = s.lock();
            logs.push(st.log.take().unwrap_or_default());
            clocks = clocks.max(u64::from(st.virtual_clocks));
            st.virtual_clocks = 0;
        }
        if mode == GatherMode::Real {
            clocks = g.1.max(1);
        }
        *g = (GatherMode::Off, 0);
        drop(g);
        let stats = self.inner.install(&logs, clocks)?;
        *self.inner.logs.lock() = logs;
        Ok(stats)
    }

    /// Stops the parameter server: every worker waiting at a clock, and every later call,
    /// fails with `reason` (a worker that failed ends the run for the others this way).
    pub fn abort(&self, reason: &str) {
        let mut s = self.inner.sync.lock();
        if s.error.is_none() {
            s.error =
                Some(Error::new(ErrorKind::Closed, format!("parameter server stopped: {reason}")));
        }
        self.inner.failed.store(true, Ordering::Release);
        self.inner.cv.notify_all();
    }

    /// Worker `w`'s accesses in the last gather, in order: `(table, key, op)`.
    pub fn gathered(&self, w: usize) -> Log {
        self.inner.logs.lock().get(w).cloned().unwrap_or_default()
    }

    /// The current plan's statistics (`None` before the first plan).
    pub fn plan_stats(&self) -> Option<PlanStats> {
        self.inner.plan_stats.lock().clone()
    }

    /// Counters since the start.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            clocks: self.inner.pushed.load(Ordering::Acquire).max(0) as u64,
            reads: get(&c.reads),
            updates: get(&c.updates),
            overflow: get(&c.overflow),
            fetches: get(&c.fetches),
            prefetch_rows: get(&c.prefetch_rows),
            prefetch_requests: get(&c.prefetch_requests),
            pushed_rows: get(&c.pushed_rows),
            push_requests: get(&c.push_requests),
            bytes_read: get(&c.bytes_read),
            bytes_pushed: get(&c.bytes_pushed),
            wait_s: get(&c.wait_ns) as f64 / 1e9,
            overflow_warnings: get(&c.overflow_warnings),
            replans: get(&c.replans),
        }
    }
}

impl Inner {
    fn check(&self) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match &self.sync.lock().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Fails unless every worker is at the same clock with every earlier clock pushed.
    fn at_boundary(&self, what: &str) -> Result<()> {
        let s = self.sync.lock();
        let (lo, hi) = (s.clocks.iter().min(), s.clocks.iter().max());
        if lo != hi {
            return Err(Error::invalid(format!(
                "{what}: the workers are at clocks {:?}; it must run at a clock boundary that \
                 every worker has reached",
                s.clocks
            )));
        }
        drop(s);
        for (w, st) in self.states.iter().enumerate() {
            if st.lock().current.len() > 0 {
                return Err(Error::invalid(format!(
                    "{what}: worker {w} has updated rows in its current clock; call clock() first"
                )));
            }
        }
        Ok(())
    }

    /// Builds the plan of `logs` and installs its cache.
    fn install(&self, logs: &[Log], clocks: u64) -> Result<PlanStats> {
        let masters = &*self.masters;
        let t_place = Instant::now();
        let mut moves = 0;
        if self.opts.placement && masters.processes() > 1 {
            // Every row on a process that accesses it (all processes place together).
            let mut rows: Vec<Vec<u64>> = vec![Vec::new(); self.dims.len()];
            for log in logs {
                for &(t, k, _) in log {
                    rows[t as usize].push(k);
                }
            }
            moves = masters.place(&rows)?;
        }
        let place_s = t_place.elapsed().as_secs_f64();
        let mut plan =
            Plan::build(logs, self.dims.len(), &self.dims, &self.opts, clocks, &|t, k| {
                masters.owner(t, k)
            });
        let t = Instant::now();
        let generation = self.generation.load(Ordering::Acquire) + 1;
        let plan_arc = Arc::new(std::mem::take(&mut plan));
        let cache = ProcessCache::build(
            generation,
            Some(plan_arc.clone()),
            &self.dims,
            &self.opts,
            masters,
        )?;
        let mut stats = plan_arc.stats.clone();
        stats.static_s = t.elapsed().as_secs_f64();
        stats.placement_moves = moves;
        stats.placement_s = place_s;
        *self.cache.write() = Arc::new(cache);
        self.generation.store(generation, Ordering::Release);
        *self.plan_stats.lock() = Some(stats.clone());
        Ok(stats)
    }

    /// Reads `keys` of `table` from the masters into `out`; returns the age of the copy.
    fn fetch(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<i64> {
        let _shared = self.push_lock.read();
        let age = self.pushed.load(Ordering::Acquire);
        let at = self.masters.read_at(table, keys, out)?;
        bump(&self.counters.bytes_read, (out.len() * 4) as u64);
        Ok(at.unwrap_or(age))
    }

    /// Makes the arena (or, without a static store, the planned rows of the map) reflect at
    /// least clock `need`.
    fn ensure_fresh(&self, cache: &ProcessCache, need: i64) -> Result<()> {
        if cache.arena_age() >= need {
            return Ok(());
        }
        let _one = cache.refresh.lock();
        if cache.arena_age() >= need {
            return Ok(());
        }
        let Some(plan) = &cache.plan else { return Ok(()) };
        let _shared = self.push_lock.read();
        let pushed = self.pushed.load(Ordering::Acquire);
        let mut oldest = pushed;
        for (t, tc) in cache.tables.iter().enumerate() {
            let d = tc.dim;
            if cache.static_store {
                let mut arena = Arena { values: vec![0.0f32; tc.keys.len() * d], ages: Vec::new() };
                for (b, prepared) in tc.blocks.iter().zip(&tc.prepared) {
                    let mut age = i64::MAX;
                    for (p, (lo, hi)) in
                        prepared.iter().zip([(b.start, b.early), (b.early, b.read)])
                    {
                        if hi > lo {
                            let at =
                                self.masters.read_prepared(p, &mut arena.values[lo * d..hi * d])?;
                            age = age.min(at.unwrap_or(pushed));
                            bump(&self.counters.prefetch_requests, 1);
                        }
                    }
                    let age = if age == i64::MAX { pushed } else { age };
                    oldest = oldest.min(age);
                    arena.ages.push(age);
                    bump(&self.counters.prefetch_rows, (b.read - b.start) as u64);
                    bump(&self.counters.bytes_read, ((b.read - b.start) * d * 4) as u64);
                }
                *tc.arena.write() = Arc::new(arena);
            } else {
                let tp = &plan.tables[t];
                for b in &tp.blocks {
                    let keys = &tp.keys[b.start..b.read];
                    if keys.is_empty() {
                        continue;
                    }
                    let mut buf = vec![0.0f32; keys.len() * d];
                    let age = self.masters.read_at(t, keys, &mut buf)?.unwrap_or(pushed);
                    oldest = oldest.min(age);
                    bump(&self.counters.prefetch_requests, 1);
                    bump(&self.counters.prefetch_rows, keys.len() as u64);
                    bump(&self.counters.bytes_read, (keys.len() * d * 4) as u64);
                    for (k, row) in keys.iter().zip(buf.chunks_exact(d)) {
                        let mut shard = tc.shard(*k).lock();
                        match shard.get_mut(k) {
                            Some(r) => {
                                r.values.copy_from_slice(row);
                                r.age = age;
                            }
                            None => {
                                shard.insert(*k, DynRow { age, values: row.into() });
                            }
                        }
                    }
                }
            }
        }
        cache.arena_age.store(oldest, Ordering::Release);
        Ok(())
    }

    /// Pushes clock `k`'s buffers (every worker has finished `k`), in worker order.
    fn advance(&self, s: &mut ClockState, k: u32) -> Result<()> {
        let _exclusive = self.push_lock.write();
        for w in 0..self.workers {
            let Some(buf) = s.published.remove(&(k, w)) else { continue };
            for t in 0..self.dims.len() {
                let (keys, deltas) = buf.rows(t);
                if keys.is_empty() {
                    continue;
                }
                self.masters.add_at(k, t, &keys, &deltas)?;
                bump(&self.counters.pushed_rows, keys.len() as u64);
                bump(&self.counters.push_requests, 1);
                bump(&self.counters.bytes_pushed, (deltas.len() * 4) as u64);
            }
        }
        self.masters.barrier(k)?;
        self.pushed.store(i64::from(k), Ordering::Release);
        // Overflow: more than 10 % of the clock's accesses outside the plan, two clocks running.
        let accesses = self.counters.clock_accesses.swap(0, Ordering::Relaxed);
        let overflow = self.counters.clock_overflow.swap(0, Ordering::Relaxed);
        if overflow * 10 > accesses && accesses > 0 {
            s.over += 1;
        } else {
            s.over = 0;
        }
        if s.record == Some(k) {
            // The recorded clock is over: every worker waits at this boundary (BSP).
            let logs: Vec<Log> =
                s.recorded.iter_mut().map(|l| l.take().unwrap_or_default()).collect();
            s.record = None;
            s.over = 0;
            self.install(&logs, 1)?;
            bump(&self.counters.replans, 1);
        } else if s.over >= 2 && self.opts.replan != Replan::Off {
            bump(&self.counters.overflow_warnings, 1);
            s.over = 0;
            if self.opts.replan == Replan::Auto
                && self.opts.consistency == Consistency::Bsp
                && s.record.is_none()
            {
                s.record = Some(k + 1);
            }
        }
        Ok(())
    }
}

impl Worker {
    /// The worker's number.
    pub fn id(&self) -> usize {
        self.w
    }

    /// Whether a virtual gather is running: reads return zeros and nothing is written, so an
    /// iteration that keeps state of its own (sampled assignments, a random generator) should
    /// leave it alone.
    pub fn in_virtual_gather(&self) -> bool {
        self.gather_mode() == GatherMode::Virtual
    }

    /// The worker's clock (the first is 1).
    pub fn clock_now(&self) -> u32 {
        self.inner.states[self.w].lock().clock
    }

    fn check_table(&self, table: usize) -> Result<usize> {
        self.inner.dims.get(table).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::TableNotFound,
                format!(
                    "table {table} out of range: this parameter server has {}",
                    self.inner.dims.len()
                ),
            )
        })
    }

    /// Adopts the current cache if a new plan was installed (its buffers are empty then).
    fn adopt(&self, st: &mut WorkerState) {
        let generation = self.inner.generation.load(Ordering::Acquire);
        if st.cache.generation == generation {
            return;
        }
        let cache = self.inner.cache.read().clone();
        st.current = DeltaBuf::new(&cache, self.w, st.clock);
        st.history.clear();
        st.spare.clear();
        st.snapshots.clear();
        st.cache = cache;
    }

    /// Reads the rows of `keys` of `table` into `out` (`[keys, dim]`): as of a clock no older
    /// than the consistency model allows, plus this worker's own updates since.
    pub fn read(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<()> {
        let d = self.check_table(table)?;
        if out.len() != keys.len() * d {
            return Err(Error::shape(format!(
                "read: the output holds {} values; {} keys of dim {d} need {}",
                out.len(),
                keys.len(),
                keys.len() * d
            )));
        }
        let mut guard = self.inner.states[self.w].lock();
        let st = &mut *guard;
        if let Some(log) = &mut st.log {
            log.extend(keys.iter().map(|&k| (table as u32, k, Op::Read)));
            if self.gather_mode() == GatherMode::Virtual {
                out.fill(0.0);
                return Ok(());
            }
        }
        self.inner.check()?;
        self.adopt(st);
        let inner = &*self.inner;
        let need = i64::from(st.clock) - 1 - i64::from(inner.opts.consistency.slack());
        let WorkerState { cache, current, history, snapshots, local, .. } = st;
        let prefetch = inner.opts.prefetch && cache.plan.is_some();
        if prefetch {
            inner.ensure_fresh(cache, need)?;
        }
        let tc = &cache.tables[table];
        let arena_age = cache.arena_age();
        let arena: Option<&Arena> = if prefetch && cache.static_store {
            if snapshots.len() != cache.tables.len() {
                *snapshots = vec![(NEVER, Arc::new(Arena::default())); cache.tables.len()];
            }
            let snap = &mut snapshots[table];
            if snap.0 != arena_age {
                *snap = (arena_age, tc.arena.read().clone());
            }
            Some(&snap.1)
        } else {
            None
        };
        let windex = cache.workers.get(self.w).map(|v| &v[table]);
        let mut overflow = 0u64;
        for (i, &key) in keys.iter().enumerate() {
            let row = &mut out[i * d..(i + 1) * d];
            let (mut slot, mut own) = (NONE, NONE);
            if let Some(wi) = windex {
                if let Some(e) = wi.index.get(key) {
                    (slot, own) = wi.entries[e as usize];
                }
            }
            if slot == NONE && cache.static_store {
                slot = tc.index.get(key).map_or(NONE, |s| s as u32);
            }
            let age = if slot != NONE {
                let s = slot as usize;
                if let Some(arena) = arena {
                    row.copy_from_slice(&arena.values[s * d..(s + 1) * d]);
                    arena.ages[tc.block_of(s)]
                } else {
                    let a = tc.slot_age[s].load(Ordering::Acquire);
                    if a >= need {
                        row.copy_from_slice(&tc.values.read()[s * d..(s + 1) * d]);
                        a
                    } else {
                        let a = inner.fetch(table, &[key], row)?;
                        local.fetches += 1;
                        tc.values.write()[s * d..(s + 1) * d].copy_from_slice(row);
                        tc.slot_age[s].fetch_max(a, Ordering::AcqRel);
                        a
                    }
                }
            } else {
                // Outside the plan: no arena slot (static store) or not among the worker's rows.
                if cache.plan.is_some() && (cache.static_store || windex.is_some()) {
                    overflow += 1;
                }
                let shard = tc.shard(key).lock();
                match shard.get(&key) {
                    Some(r) if r.age >= need => {
                        row.copy_from_slice(&r.values);
                        r.age
                    }
                    _ => {
                        drop(shard);
                        let a = inner.fetch(table, &[key], row)?;
                        local.fetches += 1;
                        let mut shard = tc.shard(key).lock();
                        let r = shard
                            .entry(key)
                            .or_insert_with(|| DynRow { age: NEVER, values: row.to_vec().into() });
                        if a >= r.age {
                            r.values.copy_from_slice(row);
                            r.age = a;
                        }
                        a
                    }
                }
            };
            for buf in history.iter().filter(|b| i64::from(b.clock) > age) {
                let own_here = if buf.plan.is_some() { own } else { NONE };
                buf.add_into(table, key, own_here, row);
            }
            let own_here = if current.plan.is_some() { own } else { NONE };
            current.add_into(table, key, own_here, row);
        }
        local.reads += keys.len() as u64;
        local.overflow += overflow;
        Ok(())
    }

    fn gather_mode(&self) -> GatherMode {
        self.inner.gather.lock().0
    }

    /// Adds `deltas` (`[keys, dim]`) to the rows of `keys` of `table`; this worker's reads see
    /// them at once, every worker's once the clock they were made in is pushed.
    pub fn update(&self, table: usize, keys: &[u64], deltas: &[f32]) -> Result<()> {
        let d = self.check_table(table)?;
        if deltas.len() != keys.len() * d {
            return Err(Error::shape(format!(
                "update: {} values for {} keys of dim {d} (need {})",
                deltas.len(),
                keys.len(),
                keys.len() * d
            )));
        }
        // An integer max vectorises where a per-value `is_finite` test does not.
        let max_bits = deltas.iter().map(|x| x.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
        if max_bits >= f32::INFINITY.to_bits() {
            let i = deltas.iter().position(|x| !x.is_finite()).unwrap_or(0);
            return Err(Error::new(
                ErrorKind::NonFinite,
                format!("update: delta of key {} is not finite ({})", keys[i / d], deltas[i]),
            ));
        }
        let mut guard = self.inner.states[self.w].lock();
        let st = &mut *guard;
        if let Some(log) = &mut st.log {
            log.extend(keys.iter().map(|&k| (table as u32, k, Op::Update)));
            if self.gather_mode() == GatherMode::Virtual {
                return Ok(());
            }
        }
        self.inner.check()?;
        self.adopt(st);
        let WorkerState { cache, current, local, .. } = st;
        let windex = if current.plan.is_some() { cache.workers.get(self.w) } else { None };
        let mut overflow = 0u64;
        for (i, &key) in keys.iter().enumerate() {
            let mut own = NONE;
            if let Some(wi) = windex.map(|v| &v[table]) {
                if let Some(e) = wi.index.get(key) {
                    own = wi.entries[e as usize].1;
                } else {
                    overflow += 1;
                }
            } else if cache.plan.is_some()
                && (cache.static_store && cache.tables[table].index.get(key).is_none())
            {
                overflow += 1;
            }
            current.add(table, key, own, &deltas[i * d..(i + 1) * d]);
        }
        local.updates += keys.len() as u64;
        local.overflow += overflow;
        Ok(())
    }

    /// Ends this worker's clock: its updates are published (pushed once every worker has
    /// finished the clock), and it waits as the consistency model requires.
    pub fn clock(&self) -> Result<()> {
        let inner = &*self.inner;
        let mut guard = inner.states[self.w].lock();
        let st = &mut *guard;
        if st.log.is_some() && self.gather_mode() == GatherMode::Virtual {
            st.virtual_clocks += 1;
            return Ok(());
        }
        inner.check()?;
        self.adopt(st);
        let local = std::mem::take(&mut st.local);
        let ctr = &inner.counters;
        bump(&ctr.reads, local.reads);
        bump(&ctr.updates, local.updates);
        bump(&ctr.overflow, local.overflow);
        bump(&ctr.fetches, local.fetches);
        bump(&ctr.clock_accesses, local.reads + local.updates);
        bump(&ctr.clock_overflow, local.overflow);
        let c = st.clock;
        let fresh = match st.spare.pop() {
            Some(mut b) => {
                b.reset(c + 1);
                b
            }
            None => DeltaBuf::new(&st.cache, self.w, c + 1),
        };
        let buf = Arc::new(std::mem::replace(&mut st.current, fresh));
        st.history.push_back(buf.clone());
        let need = i64::from(c) - i64::from(inner.opts.consistency.slack());
        {
            let mut s = inner.sync.lock();
            if s.record == Some(c) {
                s.recorded[self.w] = st.log.take();
            }
            s.published.insert((c, self.w), buf);
            let old_min = *s.clocks.iter().min().unwrap_or(&c);
            s.clocks[self.w] = c + 1;
            let new_min = *s.clocks.iter().min().unwrap_or(&c);
            if new_min > old_min {
                if let Err(e) = inner.advance(&mut s, old_min) {
                    s.error = Some(e);
                    inner.failed.store(true, Ordering::Release);
                }
                inner.cv.notify_all();
                if let Some(g) = inner.gather.try_lock().as_deref_mut() {
                    if g.0 == GatherMode::Real {
                        g.1 += 1;
                    }
                }
            }
            let t = Instant::now();
            while inner.pushed.load(Ordering::Acquire) < need && s.error.is_none() {
                inner.cv.wait(&mut s);
            }
            bump(&inner.counters.wait_ns, t.elapsed().as_nanos() as u64);
            if let Some(e) = &s.error {
                return Err(e.clone());
            }
            if s.record == Some(c + 1) {
                st.log = Some(Vec::new());
            }
        }
        st.clock = c + 1;
        // Buffers every cached copy now reflects are no longer needed.
        while st.history.front().is_some_and(|b| i64::from(b.clock) <= need) {
            let b = st.history.pop_front().expect("front exists");
            if let Ok(b) = Arc::try_unwrap(b) {
                if b.plan.as_ref().map(Arc::as_ptr) == st.current.plan.as_ref().map(Arc::as_ptr) {
                    st.spare.push(b);
                }
            }
        }
        self.adopt(st);
        Ok(())
    }
}
