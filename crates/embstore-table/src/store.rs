//! [`Store`]: named tables in one process, held in memory or in a directory (`durable`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::validate_name;
use crate::disk::vfs::{RealFs, Vfs};
use crate::durable::table_file as file;
use crate::durable::{Durable, FlushStats, RecoveryReport, Tiering};
use crate::tier::Gate;
use crate::version::Clock;
use crate::{Error, ErrorKind, Result, Table, TableConfig, MAX_REPLICA};

/// Named embedding tables. Held in memory ([`Store::new`]) or kept in a directory
/// ([`Store::open`]), where [`Store::flush`] makes every write so far durable. Cheap to share
/// (`Arc<Table>` per table); every method takes `&self`.
#[derive(Debug)]
pub struct Store {
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    clock: Arc<Clock>,
    durable: Option<Arc<Durable>>,
    tiering: Option<Tiering>,
    /// [`Store::close`] ran.
    closed: std::sync::atomic::AtomicBool,
    /// Set by [`Store::enable_sync`]: every table keeps sync state, new ones from creation.
    sync: parking_lot::Mutex<Option<crate::sync::SyncOptions>>,
    /// Set by [`Store::witness_tables`]: the bucket (ms) and directory of the tables a
    /// follower readies, which become witnesses.
    witness: parking_lot::Mutex<Option<(u64, Option<std::path::PathBuf>)>>,
}

impl StoreOptions {
    /// Options with a memory budget of `bytes` (see [`StoreOptions::memory_budget_bytes`]).
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget_bytes = Some(bytes);
        self
    }

    /// Options with the replica id `replica`.
    pub fn with_replica(mut self, replica: u32) -> Self {
        self.replica = replica;
        self
    }

    /// Options with eviction on the store's evictor thread (`true`) or on the thread of each
    /// call that brings rows in and leaves the store over its budget (`false`, the default;
    /// deterministic, as tests that replay file operations need).
    pub fn with_background_eviction(mut self, background: bool) -> Self {
        self.background_eviction = background;
        self
    }

    /// Options with `budget` as the memory budget, shared with the other stores opened with it
    /// (a server's loaded shards, say): see [`Budget::shared`].
    pub fn with_shared_budget(mut self, budget: Arc<crate::budget::Budget>) -> Self {
        self.shared_budget = Some(budget);
        self
    }

    /// Options with the replacement policy `eviction`.
    pub fn with_eviction(mut self, eviction: embstore_policy::EvictionConfig) -> Self {
        self.eviction = eviction;
        self
    }
}

/// How [`Store::open_with_options`] opens a directory.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct StoreOptions {
    /// The replica id written into row versions (at most [`MAX_REPLICA`]).
    pub replica: u32,
    /// Bytes of memory the tables may hold (indexes, rows, metadata); rows beyond it live on
    /// disk and are read back on use. `None`: every row in memory.
    pub memory_budget_bytes: Option<u64>,
    /// The replacement policy of the memory tier.
    pub eviction: embstore_policy::EvictionConfig,
    /// Whether a thread of the store evicts once its tables pass 95 % of the budget, so that
    /// calls do not wait for evictions (calls that bring rows in evict themselves only when
    /// the store is over its budget). `false` (the default): evictions run on the thread of a
    /// call that brought rows in and left the store over its budget — measured faster for the
    /// demo's training under a budget and no slower at 10M rows (docs/benchmarks.md, "Durable
    /// stores, checkpoints, tables larger than memory", round 3).
    pub background_eviction: bool,
    /// A budget shared with other stores ([`crate::Budget::shared`]); it takes the place of
    /// `memory_budget_bytes` and `background_eviction`.
    pub shared_budget: Option<Arc<crate::budget::Budget>>,
}

impl crate::tier::Spill<Table> for Durable {
    fn write_rows_of(&self, table: &Table, keys: &[u64]) -> Result<()> {
        Durable::write_rows_of(self, table, keys)
    }
}

impl Drop for Store {
    /// Stops the store's evictor (it finishes the eviction in flight first).
    fn drop(&mut self) {
        if let Some(t) = &self.tiering {
            t.budget.stop();
        }
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store; its rows' versions carry replica id 0.
    pub fn new() -> Self {
        Self {
            tables: RwLock::new(BTreeMap::new()),
            sync: parking_lot::Mutex::new(None),
            witness: parking_lot::Mutex::new(None),
            clock: Arc::new(Clock::new(0)),
            durable: None,
            tiering: None,
            closed: Default::default(),
        }
    }

    /// An empty store whose rows' versions carry `replica` (at most [`MAX_REPLICA`]).
    pub fn with_replica(replica: u32) -> Result<Self> {
        let mut store = Self::new();
        store.clock = Arc::new(Clock::new(check_replica(replica)?));
        Ok(store)
    }

    /// Opens the store kept in `dir`, creating it (and `dir`) if there is none, and rebuilds
    /// its tables from the last flush. The directory stays locked until the store is dropped:
    /// a second open fails with [`ErrorKind::Locked`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, 0, Arc::new(RealFs))
    }

    /// [`Store::open`] with a replica id and a file layer (a fault-injecting one in tests).
    pub fn open_with(dir: impl AsRef<Path>, replica: u32, vfs: Arc<dyn Vfs>) -> Result<Self> {
        let options = StoreOptions { replica, ..StoreOptions::default() };
        Self::open_with_options(dir, &options, vfs)
    }

    /// [`Store::open`] with every option: a memory budget makes the tables larger than memory
    /// (rows beyond it stay on disk, read back when used; see `tier`).
    pub fn open_with_options(
        dir: impl AsRef<Path>,
        options: &StoreOptions,
        vfs: Arc<dyn Vfs>,
    ) -> Result<Self> {
        Self::open_part(dir.as_ref(), options, vfs, None)
    }

    /// [`Store::open_with_options`], indexing only the keys of serving shard `keep.0` of
    /// `keep.1` when the store has a memory budget (see `checkpoint::open_checkpoint_shard`).
    pub(crate) fn open_part(
        dir: &Path,
        options: &StoreOptions,
        vfs: Arc<dyn Vfs>,
        keep: Option<(usize, usize)>,
    ) -> Result<Self> {
        let clock = Arc::new(Clock::new(check_replica(options.replica)?));
        options.eviction.validate()?;
        let budget = match (&options.shared_budget, options.memory_budget_bytes) {
            (Some(b), _) => Some(b.clone()),
            (None, Some(0)) => {
                return Err(Error::invalid("memory_budget_bytes must be at least 1"))
            }
            (None, Some(b)) => Some(crate::budget::Budget::new(b, options.background_eviction)),
            (None, None) => None,
        };
        let tiering =
            budget.map(|budget| Tiering { budget, eviction: options.eviction.clone(), keep });
        let (durable, tables) = Durable::open(dir, vfs, &clock, tiering.as_ref())?;
        let durable = Arc::new(durable);
        for t in &tables {
            t.attach_durable(&durable);
        }
        let tables = tables.into_iter().map(|t| (t.name().to_owned(), t)).collect();
        Ok(Self {
            tables: RwLock::new(tables),
            sync: parking_lot::Mutex::new(None),
            witness: parking_lot::Mutex::new(None),
            clock,
            durable: Some(durable),
            tiering,
            closed: Default::default(),
        })
    }

    /// Rewrites every table's rows into one fresh segment each and deletes the older segments
    /// (a flush happens as part of it); `progress(done, total)` after each table. Flushes
    /// compact by themselves, a bounded step after each (see `compact`), keeping disk use
    /// within about twice the live rows; this is for a directory about to be archived.
    pub fn compact(&self, progress: impl FnMut(usize, usize)) -> Result<FlushStats> {
        self.check_open()?;
        match &self.durable {
            Some(d) => d.compact(&self.all_tables(), progress),
            None => Ok(FlushStats::default()),
        }
    }

    /// The memory budget of a store opened with one.
    pub fn memory_budget(&self) -> Option<&crate::budget::Budget> {
        self.tiering.as_ref().map(|t| &*t.budget)
    }

    /// Builds a table for this store: tiered under its budget, if it has one.
    fn new_table(&self, config: TableConfig) -> Result<Table> {
        let mut table = Table::with_clock(config, self.clock.clone())?;
        if let Some(t) = &self.tiering {
            table.enable_tier(t.budget.clone(), t.eviction.clone())?;
        }
        Ok(table)
    }

    /// The directory of a store opened with [`Store::open`]; `None` for one in memory.
    pub fn path(&self) -> Option<&Path> {
        self.durable.as_ref().map(|d| d.dir())
    }

    /// What [`Store::open`] found and repaired; `None` for a store in memory.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.durable.as_ref().map(|d| &d.report)
    }

    /// Makes every write acknowledged before this call durable (see `durable` for exactly what
    /// that means); a no-op for a store in memory. On an error (a full disk:
    /// [`ErrorKind::NoSpace`]) nothing is lost: the rows stay in memory, marked to be written,
    /// and the next flush writes them.
    pub fn flush(&self) -> Result<FlushStats> {
        self.check_open()?;
        let Some(durable) = &self.durable else { return Ok(FlushStats::default()) };
        self.flush_saving_knowledge(durable, &self.all_tables())
    }

    /// Flushes `tables`; for tables that sync, saves what they knew when it started (see
    /// `sync::saved`) once it is durable: a follower's knowledge, and every store's floors.
    fn flush_saving_knowledge(
        &self,
        durable: &Durable,
        tables: &[Arc<Table>],
    ) -> Result<FlushStats> {
        let known: Vec<_> =
            tables.iter().filter_map(|t| Some((t.name(), t.sync_knowledge_snapshot()?))).collect();
        // A table that does not sync now and is about to write changes (its store restarted
        // and serves its port later, or not at all): what it saved when it synced no longer
        // says what it holds. Removed before the rows land, so that the next serve raises its
        // floors instead (followers then take every part whole: writes and removals alike).
        for t in tables {
            if t.sync.get().is_none() && t.has_unflushed_changes() {
                crate::sync::saved::remove(durable.dir(), t.name());
            }
        }
        let stats = durable.flush(tables)?;
        for (name, vvs) in known {
            crate::sync::saved::save(durable.dir(), name, &vvs)?;
        }
        Ok(stats)
    }

    /// Flushes, then closes the store: every handle of its tables fails with
    /// [`ErrorKind::Closed`] from then on (so no write can go unflushed), its evictor stops and
    /// its directory is unlocked (another `Store` may open it). If the flush fails (a full
    /// disk: [`ErrorKind::NoSpace`]) the store stays open with its rows in memory, marked to
    /// be written: free space and close (or flush) again. Closing twice is a no-op. Calls
    /// running on other threads while `close` runs may finish after its flush: stop them
    /// first.
    pub fn close(&self) -> Result<()> {
        if self.is_closed() {
            return Ok(());
        }
        // Closed first, so that no call starts a write the flush would miss.
        let tables = self.all_tables();
        tables.iter().for_each(|t| t.set_closed(true));
        if let Some(durable) = &self.durable {
            if let Err(e) = self.flush_saving_knowledge(durable, &tables) {
                tables.iter().for_each(|t| t.set_closed(false));
                return Err(e);
            }
        }
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = &self.tiering {
            t.budget.stop();
        }
        if let Some(durable) = &self.durable {
            durable.unlock();
        }
        Ok(())
    }

    /// Whether [`Store::close`] closed the store.
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::new(ErrorKind::Closed, "the store is closed"));
        }
        Ok(())
    }

    /// Creates a table; fails if the name is taken or the config is invalid.
    pub fn create_table(&self, config: TableConfig) -> Result<Arc<Table>> {
        self.check_open()?;
        let mut tables = self.tables.write();
        if tables.contains_key(&config.name) {
            return Err(Error::new(
                ErrorKind::TableExists,
                format!("table '{}' already exists", config.name),
            ));
        }
        let table = Arc::new(self.new_table(config)?);
        self.start_sync(&table)?;
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
            table.attach_durable(durable);
        }
        tables.insert(table.name().to_owned(), table.clone());
        Ok(table)
    }

    /// Makes every table a follower readies from now on a witness
    /// ([`Table::witness_start`]`(bucket_ms, dir)`): a store that follows only to keep a
    /// model's healthy state for rollbacks.
    pub fn witness_tables(&self, bucket_ms: u64, dir: Option<&std::path::Path>) -> Result<()> {
        self.check_open()?;
        if bucket_ms == 0 {
            return Err(Error::invalid("a witness's bucket must be at least 1 ms"));
        }
        *self.witness.lock() = Some((bucket_ms, dir.map(std::path::Path::to_path_buf)));
        Ok(())
    }

    /// The witness settings of [`Store::witness_tables`], if set.
    pub fn witness_settings(&self) -> Option<(u64, Option<std::path::PathBuf>)> {
        self.witness.lock().clone()
    }

    /// Makes every table keep sync state (see [`crate::sync`]), and every table created later
    /// from its creation. Call it before other threads write (a server does it as it starts).
    /// Enabling again with the same options is a no-op; with others, an error.
    pub fn enable_sync(&self, options: &crate::sync::SyncOptions) -> Result<()> {
        self.check_open()?;
        let mut sync = self.sync.lock();
        if let Some(have) = &*sync {
            if have != options {
                // Options a user does not name (a follower's knowledge is never taken from its
                // rows, and so on) show only when the named ones agree.
                let (a, b) = if have.to_string() == options.to_string() {
                    (have.in_full(), options.in_full())
                } else {
                    (have.to_string(), options.to_string())
                };
                return Err(Error::invalid(format!(
                    "the store syncs already, with {a}; asked for {b} (leave the options out \
                     to serve with the store's, Store::sync_options)"
                )));
            }
        }
        for table in self.tables.read().values() {
            let fresh = table.sync.get().is_none();
            let known = self.saved_knowledge(table, options);
            let unknown = known.is_none();
            table.enable_sync_knowing(options, known)?;
            if fresh && unknown {
                self.raise_floors_of_unknown(table, options);
            }
        }
        *sync = Some(options.clone());
        Ok(())
    }

    /// The replica id this store writes into row versions.
    pub fn replica(&self) -> u32 {
        self.clock.replica()
    }

    /// The store's sync options, once [`Store::enable_sync`] ran.
    pub fn sync_options(&self) -> Option<crate::sync::SyncOptions> {
        self.sync.lock().clone()
    }

    /// What `table` knew at its last flush, when it was saved beside the rows (a store whose
    /// knowledge comes from its rows takes only the floors).
    fn saved_knowledge(
        &self,
        table: &Table,
        options: &crate::sync::SyncOptions,
    ) -> Option<crate::sync::saved::Knowledge> {
        let dir = self.durable.as_ref()?.dir();
        let parts = options.parts.max(table.shards.len() as u32);
        crate::sync::saved::load(dir, table.name(), Some(parts))
    }

    fn start_sync(&self, table: &Table) -> Result<()> {
        match &*self.sync.lock() {
            Some(options) => {
                table.enable_sync(options)?;
                self.raise_floors_of_unknown(table, options);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// A durable store's table that starts to sync as its own source (knowledge from its
    /// rows) with nothing saved of what it knew, in a store that synced before (it saved
    /// knowledge then): it may have synced under this name and changed since without sync (a
    /// restart that wrote, cleared, removed, or dropped and created the table again before
    /// serving): its floors are raised, so that a follower that knew it takes every part
    /// whole once. (A store that never synced has no follower that knew it.)
    fn raise_floors_of_unknown(&self, table: &Table, options: &crate::sync::SyncOptions) {
        let Some(durable) = &self.durable else { return };
        if options.knowledge_from_rows && durable.dir().join(crate::sync::saved::DIR).exists() {
            table.raise_sync_floors();
        }
    }

    /// The table called `name`.
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.check_open()?;
        self.tables.read().get(name).cloned().ok_or_else(|| not_found(name))
    }

    /// The names of all tables, sorted.
    pub fn tables(&self) -> Vec<String> {
        self.tables.read().keys().cloned().collect()
    }

    /// Removes the table called `name`. Handles still held fail with `TableNotFound` from then
    /// on; the memory is freed once the last one is dropped.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.check_open()?;
        let mut tables = self.tables.write();
        if !tables.contains_key(name) {
            return Err(not_found(name));
        }
        if self.sync.lock().is_some() {
            // Followers learn of rows and removals, not of tables: they would serve the
            // dropped table's rows for ever, and a table created again under its name beside
            // them as if it were the old one.
            return Err(Error::invalid(format!(
                "table '{name}' cannot be dropped while the store syncs (it serves a sync port \
                 or follows a source): followers would keep serving its rows. clear() it \
                 instead (followers drop its rows too), or drop it in a store that does not sync"
            )));
        }
        if let Some(durable) = &self.durable {
            durable.drop_table(name)?;
            crate::sync::saved::remove(durable.dir(), name);
        }
        let table = tables.remove(name).ok_or_else(|| not_found(name))?;
        table.mark_dropped();
        Ok(())
    }

    /// Creates a table from a file written by [`Table::save`], named as in the file or `name`.
    /// The table joins the store only once the whole file has loaded.
    pub fn load_table(&self, path: impl AsRef<Path>, name: Option<&str>) -> Result<Arc<Table>> {
        self.check_open()?;
        let path = path.as_ref();
        let mut config = file::read_config(path)?;
        if let Some(name) = name {
            validate_name(name)?;
            config.name = name.to_owned();
        }
        let exists = |name: &str| {
            Error::new(ErrorKind::TableExists, format!("table '{name}' already exists"))
        };
        if self.tables.read().contains_key(&config.name) {
            return Err(exists(&config.name));
        }
        let table = Arc::new(self.new_table(config)?);
        table.load(path)?;
        self.start_sync(&table)?;
        let mut tables = self.tables.write();
        if tables.contains_key(table.name()) {
            return Err(exists(table.name()));
        }
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
            table.attach_durable(durable);
        }
        tables.insert(table.name().to_owned(), table.clone());
        Ok(table)
    }
}

impl Store {
    pub(crate) fn durable(&self) -> Option<&Durable> {
        self.durable.as_deref()
    }

    pub(crate) fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    pub(crate) fn all_tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().values().cloned().collect()
    }

    /// Adds a table built elsewhere (`restore`); its rows are written by the next flush.
    pub(crate) fn adopt_table(&self, table: Arc<Table>) -> Result<()> {
        let mut tables = self.tables.write();
        if tables.contains_key(table.name()) {
            return Err(Error::new(
                ErrorKind::TableExists,
                format!("table '{}' already exists", table.name()),
            ));
        }
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
            table.attach_durable(durable);
        }
        tables.insert(table.name().to_owned(), table);
        Ok(())
    }
}

fn check_replica(replica: u32) -> Result<u32> {
    if replica > MAX_REPLICA {
        return Err(Error::invalid(format!("replica_id must be in 0..=2^31 - 1, got {replica}")));
    }
    Ok(replica)
}

fn not_found(name: &str) -> Error {
    Error::new(ErrorKind::TableNotFound, format!("no table named '{name}'"))
}
