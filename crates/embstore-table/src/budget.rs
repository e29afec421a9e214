//! The memory budget of a store, shared by its tables, and its evictor thread.
//!
//! [`Budget`] sums the bytes its tables report and says, through its marks, when they must give
//! memory back; it never names a table: its members are [`Reclaim`]ers (the tiered tables),
//! which it asks to evict once per round, not per row. The evictor is a thread that the first
//! call past the background mark starts and the store's drop stops ([`Budget::stop`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result};

/// A member of a [`Budget`]: what can give memory back (a tiered table). Called once per
/// eviction round, never per row, so a trait object costs nothing that shows.
pub(crate) trait Reclaim: Send + Sync {
    /// Evicts as much of the store's excess over its low mark as this member can, on the
    /// calling thread; does nothing while an eviction of this member runs already. A failure is
    /// noted where the member keeps its errors (its next call meets it).
    fn reclaim_rest(&self);
    /// The evictor's turn for this member (it was [`Budget::queue`]d): its share in rounds that
    /// let go of every lock between them, then the other members' shares.
    fn reclaim_queued(&self);
}

/// Eviction brings the rows it can free down to this share of the room the budget leaves them
/// ([`Budget::marks`]), so that it runs in batches rather than after every call.
const LOW_WATERMARK: f64 = 0.85;
/// With background eviction, a call that leaves those rows above this share of their room
/// hands the eviction to the store's evictor thread and returns; only a call that leaves the
/// store over its budget (the evictor fell behind) evicts on the caller's thread.
const BACKGROUND_MARK: f64 = 0.95;

/// The memory budget of a store, shared by its tables, and its evictor.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
    /// Of `used`, the bytes no eviction can free: indexes and pinned rows.
    fixed: AtomicU64,
    /// `None`: tables evict on the caller's thread after each call that leaves the store over
    /// its budget.
    evictor: Option<Evictor>,
    /// The tables under this budget, so that a call evicting on its thread also takes the
    /// shares of tables no call touches (idle tables would otherwise keep the budget exceeded).
    members: Mutex<Vec<Weak<dyn Reclaim>>>,
    /// Bytes of the rows pinned in the tables under this budget, as `Table::pin` counts them.
    pinned: AtomicU64,
    /// Evictions that failed (a full disk, say), and the last one's error.
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// The thread that evicts for the tables of a store whose calls left it above
/// [`BACKGROUND_MARK`] of its budget (NeighborKV §2.1.2: eviction off the lookup path). It
/// starts with the first such call and stops when the store is dropped ([`Budget::stop`]).
#[derive(Debug, Default)]
struct Evictor {
    shared: Arc<EvictorShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct EvictorShared {
    queue: Mutex<EvictQueue>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct EvictQueue {
    tables: std::collections::VecDeque<Weak<dyn Reclaim>>,
    busy: bool,
    stop: bool,
}

impl Budget {
    pub(crate) fn new(limit: u64, background: bool) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
            fixed: AtomicU64::new(0),
            evictor: background.then(Evictor::default),
            members: Mutex::new(Vec::new()),
            pinned: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            last_error: Mutex::new(None),
        })
    }

    /// Evictions of the store's tables that failed so far (each left its rows in memory).
    pub fn eviction_errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The error of the last eviction that failed, if one has (it stays after later ones
    /// succeed: [`Budget::eviction_errors`] counts them).
    pub fn last_eviction_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Notes a table under this budget (dropped tables are forgotten as they go).
    pub(crate) fn register(&self, table: Weak<dyn Reclaim>) {
        let mut members = self.members.lock();
        members.retain(|t| t.strong_count() > 0);
        members.push(table);
    }

    /// After a call's own eviction: the other tables' shares of what is still over the low
    /// mark, on this thread (a table whose eviction runs already is skipped).
    pub(crate) fn evict_others(&self, caller: &dyn Reclaim) {
        let (_, _, low) = self.marks();
        if self.used() <= low {
            return;
        }
        let caller = caller as *const dyn Reclaim as *const ();
        let others: Vec<Arc<dyn Reclaim>> = self
            .members
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|t| Arc::as_ptr(t) as *const () != caller)
            .collect();
        for t in others {
            // What is left over is the other tables' (the caller took its share): each takes
            // as much of it as it can. A failure is noted in the budget; that table's next
            // call meets it.
            t.reclaim_rest();
        }
    }

    /// A budget of `limit` bytes for several stores to share ([`crate::StoreOptions::with_shared_budget`]):
    /// each table reports its bytes to it and evicts its share of the excess on the thread of
    /// the call that brought rows in (no evictor thread). A table gives its bytes back when it
    /// is dropped.
    pub fn shared(limit: u64) -> Result<Arc<Self>> {
        if limit == 0 {
            return Err(Error::invalid("a memory budget must be at least 1 byte"));
        }
        Ok(Self::new(limit, false))
    }

    /// Replaces a table's `before` bytes by `after` in the total `of`; returns the new total.
    fn adjust(of: &AtomicU64, before: u64, after: u64) -> u64 {
        let update = |used: u64| Some(used.saturating_sub(before).saturating_add(after));
        let prev = of.fetch_update(Ordering::Relaxed, Ordering::Relaxed, update);
        update(prev.unwrap_or_else(|v| v)).unwrap_or(0)
    }

    /// Replaces a member's `before` bytes by `after` in the store's total; returns the new
    /// total.
    pub(crate) fn adjust_used(&self, before: u64, after: u64) -> u64 {
        Self::adjust(&self.used, before, after)
    }

    /// Replaces a member's `before` bytes that no eviction can free by `after`.
    pub(crate) fn adjust_fixed(&self, before: u64, after: u64) {
        Self::adjust(&self.fixed, before, after);
    }

    /// Adds `bytes` of newly pinned rows; returns the pinned bytes of all members.
    pub(crate) fn add_pinned(&self, bytes: u64) -> u64 {
        self.pinned.fetch_add(bytes, Ordering::Relaxed) + bytes
    }

    /// Takes back `bytes` of pinned rows (unpinned, or a pin refused).
    pub(crate) fn sub_pinned(&self, bytes: u64) {
        Self::adjust(&self.pinned, bytes, 0);
    }

    /// Notes a member's failed eviction and its error.
    pub(crate) fn note_error(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(message);
    }

    /// The eviction marks for the store's current bytes: `(background, over, low)`. The rows
    /// eviction can free (hot and unpinned) may take what the indexes and pinned rows leave of
    /// the budget — at least 5 % of it, so that a pinned working set larger than the budget
    /// leaves a small cache rather than an eviction after every call that frees nothing.
    /// Past `background` the evictor starts, past `over` calls evict themselves, and either
    /// evicts down to `low`.
    pub(crate) fn marks(&self) -> (u64, u64, u64) {
        let fixed = self.fixed.load(Ordering::Relaxed);
        let room = self.limit.saturating_sub(fixed).max(self.limit / 20) as f64;
        let at = |share: f64| fixed.saturating_add((room * share) as u64);
        (at(BACKGROUND_MARK), at(1.0), at(LOW_WATERMARK))
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes the store's tables reported at their last call.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Of [`Budget::used`], the bytes no eviction can free: indexes and pinned rows. When they
    /// pass the budget (a pinned working set larger than it), the store holds them plus at
    /// most 5 % of the budget of other rows.
    pub fn fixed(&self) -> u64 {
        self.fixed.load(Ordering::Relaxed)
    }

    /// Bytes of the rows pinned in the store's tables, all together (at most 60 % of the
    /// budget).
    pub fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Whether evictions run on the store's evictor thread.
    pub fn background(&self) -> bool {
        self.evictor.is_some()
    }

    /// Hands `table` to the evictor (starting it if need be); false if there is no evictor,
    /// it is stopped, or it could not be started (the caller then evicts itself).
    pub(crate) fn queue(
        &self,
        table: Weak<dyn Reclaim>,
        queued: &std::sync::atomic::AtomicBool,
    ) -> bool {
        let Some(ev) = &self.evictor else { return false };
        let mut thread = ev.thread.lock();
        if thread.is_none() {
            let shared = ev.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("embstore-evict".into())
                .spawn(move || evictor_loop(&shared));
            match spawned {
                Ok(handle) => *thread = Some(handle),
                Err(_) => return false,
            }
        }
        drop(thread);
        let mut q = ev.shared.queue.lock();
        if q.stop {
            return false;
        }
        if !queued.swap(true, Ordering::AcqRel) {
            q.tables.push_back(table);
            ev.shared.wake.notify_all();
        }
        true
    }

    /// Waits until the evictor has nothing queued or running (for tests and benchmarks that
    /// read memory figures).
    pub fn settle(&self) {
        let Some(ev) = &self.evictor else { return };
        let mut q = ev.shared.queue.lock();
        while !q.stop && (q.busy || !q.tables.is_empty()) {
            ev.shared.wake.wait(&mut q);
        }
    }

    /// Stops the evictor and waits for its thread (when the store is dropped).
    pub(crate) fn stop(&self) {
        let Some(ev) = &self.evictor else { return };
        ev.shared.queue.lock().stop = true;
        ev.shared.wake.notify_all();
        if let Some(handle) = ev.thread.lock().take() {
            // Not on the evictor itself: it holds no store, so it never drops one.
            let _ = handle.join();
        }
    }
}

fn evictor_loop(shared: &EvictorShared) {
    loop {
        let table = {
            let mut q = shared.queue.lock();
            loop {
                if q.stop {
                    q.tables.clear();
                    shared.wake.notify_all();
                    return;
                }
                if let Some(t) = q.tables.pop_front() {
                    q.busy = true;
                    break t;
                }
                shared.wake.wait(&mut q);
            }
        };
        if let Some(table) = table.upgrade() {
            table.reclaim_queued();
        }
        let mut q = shared.queue.lock();
        q.busy = false;
        shared.wake.notify_all();
    }
}
