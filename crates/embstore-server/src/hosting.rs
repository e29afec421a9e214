//! What a server hosts: per table, the versions and shards it holds ([`Hosted`]), each in a
//! [`State`], with the rows behind them ([`RowSource`]: a [`Table`] in memory, or a budgeted
//! [`Part`] linked from a checkpoint under [`TierOptions`]); loading from checkpoints, and
//! `host`, `drain`, `unload`, which change what is held. The [`Server`]'s lookup path is in
//! `service.rs`, its metrics in `metrics.rs`.
//!
//! Every change to what is held raises `gen`, so that answers carry a fresh `ServerInfo` to
//! clients whose `known_gen` is older.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use embstore_common::ErrorKind;
use embstore_proto::v1::{Held, ServerInfo, State as WireState};
use embstore_table::{OnMiss, Table};
use parking_lot::RwLock;

use crate::metrics::Metrics;

/// The state of a hosted (table, version, shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Being loaded: not served.
    Loading,
    /// Served.
    Ready,
    /// Still served; clients prefer other replicas; unloaded once quiet.
    Draining,
}

impl State {
    pub(crate) fn wire(self) -> WireState {
        match self {
            State::Loading => WireState::Loading,
            State::Ready => WireState::Ready,
            State::Draining => WireState::Draining,
        }
    }
}

/// Where a hosted shard's rows come from: an embstore [`Table`] (in memory or tiered), or, for
/// the benchmark's side-by-side peer, another store behind the same server.
pub trait RowSource: Send + Sync + std::fmt::Debug {
    /// Floats per row.
    fn dim(&self) -> usize;
    /// Rows held.
    fn len(&self) -> usize;
    /// Whether no row is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of memory the rows take.
    fn bytes(&self) -> u64;
    /// Bytes of files on disk the rows are read from (0: all in memory).
    fn disk_bytes(&self) -> u64 {
        0
    }
    /// Rows read from disk so far (0: all in memory).
    fn disk_reads(&self) -> u64 {
        0
    }
    /// Whether a lookup may wait on a disk (then it runs on the blocking pool).
    fn may_block(&self) -> bool;
    /// Writes the rows of `ids` into `out` (`ids.len() × dim`), zeros and `found = false` for
    /// ids not held.
    fn lookup(
        &self,
        ids: &[u64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> embstore_common::Result<()>;
    /// What the table's sync port side has done (`None`: the rows do not sync).
    fn sync_stats(&self) -> Option<embstore_table::sync::SyncStats> {
        None
    }
}

impl RowSource for Table {
    fn dim(&self) -> usize {
        Table::dim(self)
    }
    fn len(&self) -> usize {
        Table::len(self)
    }
    fn bytes(&self) -> u64 {
        self.stats().bytes_used as u64
    }
    fn may_block(&self) -> bool {
        self.is_tiered()
    }
    fn lookup(
        &self,
        ids: &[u64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> embstore_common::Result<()> {
        Table::lookup(self, ids, OnMiss::Zeros, out, Some(found))
    }
    fn sync_stats(&self) -> Option<embstore_table::sync::SyncStats> {
        Table::sync_stats(self).ok()
    }
}

/// A shard loaded under the server's memory budget ([`TierOptions`]): a store of its own in a
/// directory of the data dir, whose segments are links to the checkpoint's. The directory goes
/// when the last lookup that reads the part has finished and it is dropped.
#[derive(Debug)]
struct Part {
    store: Option<embstore_table::Store>,
    table: Arc<Table>,
    dir: std::path::PathBuf,
    disk_bytes: u64,
}

impl Drop for Part {
    fn drop(&mut self) {
        drop(self.store.take()); // releases the directory's lock
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RowSource for Part {
    fn dim(&self) -> usize {
        self.table.dim()
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn bytes(&self) -> u64 {
        RowSource::bytes(&*self.table)
    }
    fn disk_bytes(&self) -> u64 {
        self.disk_bytes
    }
    fn disk_reads(&self) -> u64 {
        self.table.stats().cold_reads
    }
    fn may_block(&self) -> bool {
        true
    }
    fn lookup(
        &self,
        ids: &[u64],
        out: &mut [f32],
        found: &mut [bool],
    ) -> embstore_common::Result<()> {
        RowSource::lookup(&*self.table, ids, out, found)
    }
}

/// Where and under what memory budget a server loads shards (`embstore serve --memory-budget
/// --data-dir`): each loaded shard's segments are linked into a directory of `dir` and only
/// the rows lookups use come into memory, all loaded shards (and a static store opened with
/// the same budget) sharing `budget`. The server owns `dir`: directories of parts left there
/// by an earlier process (`*.part`) are removed when the server starts.
#[derive(Clone, Debug)]
pub struct TierOptions {
    pub dir: std::path::PathBuf,
    pub budget: Arc<embstore_table::Budget>,
}

/// The suffix of a loaded part's directory in the data dir.
const PART_SUFFIX: &str = ".part";

/// One shard of one table version held by this server.
#[derive(Debug)]
pub struct Hosted {
    /// The table version.
    pub version: u64,
    /// Which shard of `num_shards` this is.
    pub shard: u32,
    /// The version's shard count (a power of two).
    pub num_shards: u32,
    /// Served or not (see [`State`]).
    pub state: State,
    /// The rows: exactly the ids of this shard.
    pub table: Arc<dyn RowSource>,
    /// When a request last named this version (ms since the epoch), for draining.
    pub last_request_ms: AtomicU64,
}

/// What this server hosts, per table name (see the crate docs).
#[derive(Debug)]
pub struct Server {
    pub(crate) instance: String,
    /// A random id drawn when this server was made ([`Server::boot_id`]).
    pub(crate) boot_id: String,
    pub(crate) metrics: Metrics,
    pub(crate) gen: AtomicU64,
    pub(crate) max_batch: usize,
    pub(crate) tables: RwLock<HashMap<String, Vec<Arc<Hosted>>>>,
    /// (table, version, shard, num_shards) being loaded: LOADING in the ServerInfo.
    pub(crate) loading: RwLock<Vec<(String, u64, u32, u32)>>,
    /// Budgeted loads: where and under what budget (`None`: loads hold shards in memory).
    pub(crate) tier: Option<TierOptions>,
    /// The tables' control records as a cluster member last read them (for `/metrics`).
    pub(crate) controls: RwLock<Vec<embstore_cluster::Control>>,
    /// Where the tables this server follows stand, read at each scrape (for `/metrics`).
    pub(crate) followed: RwLock<Option<Reporter>>,
    /// Whether loaded versions sync, and how ([`Server::set_sync_loads`]).
    sync_loads: RwLock<Option<SyncLoads>>,
    /// Per table, the versions loaded with sync on (oldest first): a follower writes into the
    /// newest ([`Server::live_table`]).
    live: RwLock<HashMap<String, Vec<Syncing>>>,
    /// Where the framed lookup path listens: its TCP port (0: none) and Unix socket ("": none),
    /// as `ServerInfo` tells clients ([`Server::offer_framed`]).
    pub(crate) framed: RwLock<(u32, String)>,
}

/// A version loaded with sync on: (version, its table).
type Syncing = (u64, Arc<Table>);

/// A loaded shard's rows, and its table when it syncs.
type Loaded = (Arc<dyn RowSource>, Option<Arc<Table>>);

/// How a follower's server loads versions that sync ([`Server::set_sync_loads`]).
#[derive(Clone, Debug)]
pub struct SyncLoads {
    /// The follower's replica id (its rows' versions; never the source's).
    pub replica: u32,
    /// The sync options (parts must agree with the source's).
    pub options: embstore_table::sync::SyncOptions,
}

/// Where one followed table stands (see [`Server::set_followed`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Followed {
    pub table: String,
    /// The sync source's address.
    pub source: String,
    pub connected: bool,
    pub caught_up: bool,
    pub parts_pending: u64,
    /// Freshness lag quantiles over recent replies (ms; `None` before the first).
    pub lag_ms_p50: Option<f64>,
    pub lag_ms_p99: Option<f64>,
    pub rows_applied: u64,
    pub bytes_in: u64,
    pub errors: u64,
    /// Whether the link counts as congested (prioritised pulls run), how often it became so,
    /// and the rows taken ahead of normal sync.
    pub congested: bool,
    pub congestions: u64,
    pub prioritised_rows: u64,
}

/// Reads where the followed tables stand (called at each `/metrics` scrape).
pub type FollowedReport = Box<dyn Fn() -> Vec<Followed> + Send + Sync>;

/// A [`FollowedReport`] the server holds.
pub(crate) struct Reporter(pub(crate) FollowedReport);

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporter")
    }
}

impl Server {
    /// An empty server named `instance` (its address, usually), answering batches of at most
    /// `max_batch` ids.
    pub fn new(instance: impl Into<String>, max_batch: usize) -> Arc<Self> {
        Self::build(instance.into(), max_batch, None)
    }

    /// [`Server::new`] whose loads are budgeted (see [`TierOptions`]). Creates `tier.dir` and
    /// removes the parts an earlier process left there.
    pub fn with_tier(
        instance: impl Into<String>,
        max_batch: usize,
        tier: TierOptions,
    ) -> embstore_common::Result<Arc<Self>> {
        let io = |e: std::io::Error| {
            embstore_common::Error::new(ErrorKind::Io, format!("{}: {e}", tier.dir.display()))
        };
        std::fs::create_dir_all(&tier.dir).map_err(io)?;
        for entry in std::fs::read_dir(&tier.dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.to_string_lossy().ends_with(PART_SUFFIX) && path.is_dir() {
                std::fs::remove_dir_all(&path).map_err(io)?;
            }
        }
        Ok(Self::build(instance.into(), max_batch, Some(tier)))
    }

    fn build(instance: String, max_batch: usize, tier: Option<TierOptions>) -> Arc<Self> {
        Arc::new(Self {
            instance,
            boot_id: new_boot_id(),
            metrics: Metrics::new(),
            gen: AtomicU64::new(1),
            max_batch: max_batch.max(1),
            tables: RwLock::new(HashMap::new()),
            loading: RwLock::new(Vec::new()),
            tier,
            controls: RwLock::new(Vec::new()),
            followed: RwLock::new(None),
            sync_loads: RwLock::new(None),
            live: RwLock::new(HashMap::new()),
            framed: RwLock::new((0, String::new())),
        })
    }

    /// A random id (32 hex digits) drawn when this server was made, which its `ServerInfo` and
    /// the framed path's DESCRIBE both carry: a client reads over the framed path only from an
    /// endpoint that names the id the gRPC port named (docs/serving.md, "Limits of the framed
    /// port").
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Rows the shards held now have read from disk so far.
    pub fn cold_reads(&self) -> u64 {
        self.tables.read().values().flatten().map(|h| h.table.disk_reads()).sum()
    }

    /// Notes the tables' control records, as a cluster member read them, for `/metrics`
    /// (versions and roll progress).
    pub fn set_controls(&self, controls: Vec<embstore_cluster::Control>) {
        *self.controls.write() = controls;
    }

    /// Makes every later whole-table load ([`Server::load`] with one shard) sync: the loaded
    /// version knows what its checkpoint's store knew (`Table::follow_from_checkpoint`) and
    /// becomes the table's [`Server::live_table`], into which a follower writes fresh rows on
    /// top of the checkpoint's. Versions of more than one shard are loaded as fixed snapshots.
    pub fn set_sync_loads(&self, loads: SyncLoads) {
        *self.sync_loads.write() = Some(loads);
    }

    /// The replica id of versions that sync here ([`Server::set_sync_loads`]).
    pub fn sync_replica(&self) -> Option<u32> {
        self.sync_loads.read().as_ref().map(|l| l.replica)
    }

    /// The newest version of `name` loaded with sync on and still held: where a follower
    /// writes the rows it pulls (`None`: no such version yet).
    pub fn live_table(&self, name: &str) -> Option<Arc<Table>> {
        self.live.read().get(name)?.last().map(|(_, t)| t.clone())
    }

    /// Makes `/metrics` show where the tables this server follows stand, as `report` tells at
    /// each scrape (freshness lag, pending parts, rows and bytes synced).
    pub fn set_followed(&self, report: FollowedReport) {
        *self.followed.write() = Some(Reporter(report));
    }

    /// Loads shard `shard` of `num_shards` of table `name` from the checkpoint at `ckpt` and
    /// hosts it as version `version` (LOADING meanwhile, READY when this returns). On failure
    /// the server holds what it held before. Blocking. A server with [`TierOptions`] links the
    /// checkpoint's segments and reads only their footers (the shard may be larger than
    /// memory); one without reads the whole table once and keeps the shard's rows in memory.
    pub fn load(
        &self,
        name: &str,
        version: u64,
        shard: u32,
        num_shards: u32,
        ckpt: &std::path::Path,
    ) -> embstore_common::Result<()> {
        // The name becomes part of a directory's name (a budgeted server's shard parts).
        embstore_table::validate_table_name(name)?;
        let key = (name.to_string(), version, shard, num_shards);
        self.loading.write().push(key.clone());
        self.gen.fetch_add(1, Ordering::AcqRel);
        let loaded = self.load_rows(name, version, shard, num_shards, ckpt);
        self.loading.write().retain(|k| k != &key);
        self.gen.fetch_add(1, Ordering::AcqRel);
        let (rows, syncing) = loaded?;
        self.host(name, version, shard, num_shards, rows)?;
        if let Some(t) = syncing {
            let mut live = self.live.write();
            let versions = live.entry(name.to_string()).or_default();
            versions.retain(|(v, _)| *v != version);
            versions.push((version, t));
            versions.sort_by_key(|(v, _)| *v);
        }
        Ok(())
    }

    /// The rows of a shard loaded from a checkpoint (see [`Server::load`]).
    fn load_rows(
        &self,
        name: &str,
        version: u64,
        shard: u32,
        num_shards: u32,
        ckpt: &std::path::Path,
    ) -> embstore_common::Result<Loaded> {
        let (s, n) = (shard as usize, num_shards as usize);
        let sync = self.sync_loads.read().clone().filter(|_| num_shards == 1);
        let replica = sync.as_ref().map_or(0, |l| l.replica);
        let follow = |t: &Arc<Table>| -> embstore_common::Result<Option<Arc<Table>>> {
            let Some(l) = &sync else { return Ok(None) };
            t.follow_from_checkpoint(ckpt, &l.options)?;
            Ok(Some(t.clone()))
        };
        let Some(tier) = &self.tier else {
            let t = embstore_table::load_checkpoint_shard_as(ckpt, name, s, n, replica)?;
            let syncing = follow(&t)?;
            return Ok((t, syncing));
        };
        static NONCE: AtomicU64 = AtomicU64::new(0);
        let nonce = NONCE.fetch_add(1, Ordering::Relaxed);
        let dir = tier.dir.join(format!(
            "{name}.v{version}.s{shard}of{num_shards}.{}-{nonce}{PART_SUFFIX}",
            std::process::id()
        ));
        let options = embstore_table::StoreOptions::default()
            .with_shared_budget(tier.budget.clone())
            .with_replica(replica);
        let opened = embstore_table::open_checkpoint_shard(ckpt, name, s, n, &dir, &options);
        match opened.and_then(|(store, table)| Ok((follow(&table)?, store, table))) {
            Ok((syncing, store, table)) => {
                let disk_bytes = dir_bytes(&dir.join("seg"));
                Ok((Arc::new(Part { store: Some(store), table, dir, disk_bytes }), syncing))
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Hosts `table` as shard `shard` of `num_shards` of version `version` of `name`, READY
    /// (replacing what this server held for that version and shard). Fails with `InvalidArgument` for a
    /// shard count that is not a power of two or a shard past it.
    pub fn host(
        &self,
        name: &str,
        version: u64,
        shard: u32,
        num_shards: u32,
        table: Arc<dyn RowSource>,
    ) -> embstore_common::Result<()> {
        if !num_shards.is_power_of_two() || shard >= num_shards {
            return Err(embstore_common::Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "shard {shard} of {num_shards}: the shard count must be a power of two above \
                 the shard"
                ),
            ));
        }
        let hosted = Arc::new(Hosted {
            version,
            shard,
            num_shards,
            state: State::Ready,
            table,
            last_request_ms: AtomicU64::new(0),
        });
        let mut tables = self.tables.write();
        let held = tables.entry(name.to_string()).or_default();
        held.retain(|h| !(h.version == version && h.shard == shard));
        held.push(hosted);
        held.sort_by_key(|h| (h.version, h.shard));
        self.gen.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Marks version `version` of `name` DRAINING (only its shard `shard`, if given); whether
    /// this server held it.
    pub fn drain(&self, name: &str, version: u64, shard: Option<u32>) -> bool {
        let mut tables = self.tables.write();
        let Some(held) = tables.get_mut(name) else { return false };
        let mut changed = false;
        for h in held.iter_mut().filter(|h| Self::named(h, version, shard)) {
            *h = Arc::new(Hosted {
                version: h.version,
                shard: h.shard,
                num_shards: h.num_shards,
                state: State::Draining,
                table: h.table.clone(),
                last_request_ms: AtomicU64::new(h.last_request_ms.load(Ordering::Relaxed)),
            });
            changed = true;
        }
        if changed {
            self.gen.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    fn named(h: &Hosted, version: u64, shard: Option<u32>) -> bool {
        h.version == version && shard.is_none_or(|s| s == h.shard)
    }

    /// Stops hosting version `version` of `name` (only its shard `shard`, if given); whether
    /// this server held it.
    pub fn unload(&self, name: &str, version: u64, shard: Option<u32>) -> bool {
        let mut tables = self.tables.write();
        let Some(held) = tables.get_mut(name) else { return false };
        let before = held.len();
        held.retain(|h| !Self::named(h, version, shard));
        let removed = held.len() < before;
        if held.is_empty() {
            tables.remove(name);
        }
        if let Some(versions) = self.live.write().get_mut(name) {
            // A follower goes back to the newest version still held (a failed roll's).
            versions.retain(|(v, _)| *v != version);
        }
        if removed {
            self.gen.fetch_add(1, Ordering::AcqRel);
        }
        removed
    }

    /// Whether shard `shard` of `version` of `name` is held here (loading or not).
    pub fn holds(&self, name: &str, version: u64, shard: u32) -> bool {
        let loading = self
            .loading
            .read()
            .iter()
            .any(|(t, v, s, _)| t == name && *v == version && *s == shard);
        loading
            || self
                .tables
                .read()
                .get(name)
                .is_some_and(|held| held.iter().any(|h| h.version == version && h.shard == shard))
    }

    /// What this server holds, as every response carries it.
    pub fn info(&self) -> ServerInfo {
        let tables = self.tables.read();
        let mut held: Vec<Held> = tables
            .iter()
            .flat_map(|(name, hs)| {
                hs.iter().map(move |h| Held {
                    table: name.clone(),
                    version: h.version,
                    shard: h.shard,
                    num_shards: h.num_shards,
                    state: h.state.wire() as i32,
                    embedding_dim: h.table.dim() as u32,
                    rows: h.table.len() as u64,
                    last_request_ms: h.last_request_ms.load(Ordering::Relaxed),
                })
            })
            .collect();
        held.extend(self.loading.read().iter().map(|(table, version, shard, num_shards)| Held {
            table: table.clone(),
            version: *version,
            shard: *shard,
            num_shards: *num_shards,
            state: WireState::Loading as i32,
            embedding_dim: 0,
            rows: 0,
            last_request_ms: 0,
        }));
        held.sort_by(|a, b| (&a.table, a.version).cmp(&(&b.table, b.version)));
        let (framed_port, framed_unix) = self.framed.read().clone();
        ServerInfo {
            instance: self.instance.clone(),
            gen: self.gen.load(Ordering::Acquire),
            held,
            framed_port,
            framed_unix,
            boot_id: self.boot_id.clone(),
            spans_shards: true,
        }
    }
}

/// 128 unpredictable bits as hex.
fn new_boot_id() -> String {
    let (a, b) =
        (embstore_common::rand::unpredictable_u64(), embstore_common::rand::unpredictable_u64());
    format!("{a:016x}{b:016x}")
}

/// Bytes of the files in `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// A follower writes into the newest version of each table loaded with sync on
/// ([`Server::set_sync_loads`]); a server that loads none refuses to be followed into.
impl embstore_table::sync::Target for Server {
    fn replica(&self) -> u32 {
        self.sync_replica().unwrap_or(0)
    }

    fn prepare(
        &self,
        _source: &str,
        _infos: &[embstore_table::sync::TableInfo],
        _: &embstore_table::sync::SyncOptions,
    ) -> embstore_common::Result<()> {
        if self.sync_replica().is_none() {
            return Err(embstore_common::Error::invalid(
                "a server follows into the versions it loads with sync on: call set_sync_loads",
            ));
        }
        Ok(())
    }

    fn table(&self, name: &str) -> Option<Arc<Table>> {
        self.live_table(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::tests::req;
    use embstore_table::{Store, TableConfig};

    /// A table name that could become a path is refused before any directory is made: a
    /// budgeted server names its shard parts after the table.
    #[test]
    fn a_load_of_a_name_that_could_become_a_path_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("a/b/data");
        let budget = embstore_table::Budget::shared(1 << 20).unwrap();
        let tier = TierOptions { dir: data.clone(), budget };
        let s = Server::with_tier("tiered", 1 << 16, tier).unwrap();
        for name in ["../../escape", "a/b", "..", "/abs"] {
            let err = s.load(name, 1, 0, 1, &root.path().join("ckpt")).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name}: {err}");
        }
        assert!(!root.path().join("a/escape.v1.s0of1").exists());
        // Only the data directory itself was made.
        let made: Vec<String> = walk(root.path())
            .into_iter()
            .map(|p| p.strip_prefix(&*root.path().display().to_string()).unwrap().to_owned())
            .collect();
        assert_eq!(made, vec!["/a", "/a/b", "/a/b/data"], "{made:?}");
    }

    fn walk(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            out.push(e.path().display().to_string());
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    /// A budgeted load: the shard's rows equal the checkpoint's, memory stays under a budget
    /// a fifth of the shard, the part's directory goes when it is unloaded, a failed load
    /// leaves no directory, and parts an earlier process left are removed at start.
    #[test]
    fn budgeted_loads_serve_a_shard_larger_than_their_budget() {
        let root = tempfile::tempdir().unwrap();
        let (n, d) = (20_000u64, 256usize);
        let ids: Vec<u64> = (0..n).map(|i| i * 7 + 3).collect();
        let row = |k: u64| (0..d).map(|j| (k * 64 + j as u64) as f32).collect::<Vec<f32>>();
        {
            let store = Store::open(root.path().join("store")).unwrap();
            let t = store.create_table(TableConfig::new("user", d)).unwrap();
            t.assign(&ids, &ids.iter().flat_map(|&k| row(k)).collect::<Vec<_>>()).unwrap();
            store.checkpoint(root.path().join("ckpt"), None).unwrap();
        }
        let data = root.path().join("data");
        std::fs::create_dir_all(data.join("old.v1.s0of1.1-0.part/seg")).unwrap();
        let table_bytes = n * (d as u64) * 4;
        let budget = embstore_table::Budget::shared(table_bytes / 10).unwrap();
        let tier = TierOptions { dir: data.clone(), budget: budget.clone() };
        let s = Server::with_tier("tiered", 1 << 16, tier).unwrap();
        assert!(!data.join("old.v1.s0of1.1-0.part").exists(), "leftover part removed");
        let ckpt = root.path().join("ckpt");
        for shard in 0..2 {
            s.load("user", 4, shard, 2, &ckpt).unwrap();
        }
        let parts = || std::fs::read_dir(&data).unwrap().count();
        assert_eq!(parts(), 2);
        let err = s.load("user", 5, 0, 2, &root.path().join("nope")).unwrap_err();
        assert_ne!(err.kind(), ErrorKind::TableNotFound, "{err}");
        assert_eq!(parts(), 2, "a failed load leaves no directory");
        let mut peak = 0;
        for shard in 0..2u32 {
            for chunk in ids.chunks(500) {
                let mut r = req(4, chunk.to_vec());
                (r.shard, r.num_shards) = (shard, 2);
                let got = s.lookup(&r).unwrap();
                let values = embstore_proto::decode_rows(&got.values, chunk.len(), d).unwrap();
                for (i, &k) in chunk.iter().enumerate() {
                    let mine = embstore_common::shard_of_key(k, 2) == shard as usize;
                    assert_eq!(got.found[i] == 1, mine, "id {k}");
                    let want = if mine { row(k) } else { vec![0.0; d] };
                    assert_eq!(&values[i * d..][..d], &want[..], "id {k}");
                }
                // On the caller's thread a call that brings rows in evicts once over the
                // budget: at most one call's rows beyond it (indexes are never evicted).
                let (used, fixed, limit) = (budget.used(), budget.fixed(), budget.limit());
                let cap = limit.max(fixed + limit / 20) + 500 * (d as u64 * 4 + 64);
                assert!(used <= cap, "{used} bytes held ({fixed} fixed), budget {limit}");
                peak = peak.max(used);
            }
        }
        assert!(peak <= budget.limit() * 11 / 10, "peak {peak} of {}", budget.limit());
        let text = s.metrics_text();
        assert!(text.contains("embstore_bytes_on_disk{table=\"user\"}"), "{text}");
        assert!(text.contains("embstore_memory_budget_bytes{kind=\"limit\"}"), "{text}");
        assert!(s.unload("user", 4, Some(0)));
        assert_eq!(parts(), 1, "the unloaded part's directory is removed");
        assert!(s.unload("user", 4, None));
        assert_eq!(parts(), 0);
        assert_eq!(budget.used(), 0);
    }
}
