//! The batch-query server (docs/serving.md): it hosts shards of table versions and answers
//! `Lookup` for exactly the (table, version, shard) a request names, with its [`ServerInfo`]
//! on every answer, OK or not, so that shard and version facts travel in the protocol.
//!
//! ## Parts
//! - [`Server`] — what this process hosts: per table, the versions and shards it holds
//!   ([`Hosted`]), each in a [`State`]; `host`, `drain`, `unload` change it and raise `gen`.
//! - [`Serving`] — the tonic service over a `Server` (`Lookup`, `Describe`).
//! - [`Admin`] — the tonic service a roll's coordinator calls (`Load` from a checkpoint,
//!   `Drain`, `Unload`), served only when asked for.
//! - [`serve`] — runs the services on a listener until a shutdown future resolves.
//! - [`serve_metrics`] — `GET /metrics` in Prometheus' text format.
//! - [`to_status`] — the one mapping from table errors to gRPC codes.
//!
//! ## Invariants
//! - A lookup is answered from the named version only; no answer mixes versions, and a server
//!   that lacks the version (or holds it under another shard count or shard) answers
//!   `FAILED_PRECONDITION` with its `ServerInfo` encoded in the status details.
//! - Missing ids get zero rows and `found = 0`; serving never inserts.
//! - A bad request gets a typed status; the server keeps serving.
//! - Every request of up to `max_batch` ids decodes ([`request_limit`]); a batch over it, or
//!   one whose answer no gRPC frame can carry, is refused `RESOURCE_EXHAUSTED` before any row
//!   is read, and counted as such, never as `ok`.
//! - A TLS identity that cannot serve (certificate and key swapped, or of two pairs) is
//!   refused by [`Tls::check`], naming the cause.
//!
//! - [`member`] — membership in a cluster in etcd: registration under a lease, and the
//!   reconciler that loads what the control records assign here.

pub mod member;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use embstore_common::{now_ms, ErrorKind};
use embstore_proto::v1::admin_server::AdminServer;
use embstore_proto::v1::serving_server::ServingServer;
use embstore_proto::v1::{
    DescribeRequest, Held, LoadRequest, LookupRequest, LookupResponse, ServerInfo,
    State as WireState, VersionRequest,
};
use embstore_table::{OnMiss, Table};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use prost::Message;
use tonic::{Code, Request, Response, Status};

/// Ids one lookup may carry, by default (the issue's "a batch above the configured maximum"
/// gets `RESOURCE_EXHAUSTED`): 1M ids of D 256 are a 1 GiB answer.
pub const DEFAULT_MAX_BATCH: usize = 1 << 20;

/// Bytes of a lookup request beyond its ids (table name, version, shard, framing) that a
/// server decodes: table names are short, 64 KiB is ample.
const REQUEST_SLACK: usize = 64 << 10;

/// The most bytes a server decodes of one lookup request of at most `max_batch` ids: each id
/// takes at most 10 bytes on the wire (a varint), so every batch within the maximum decodes
/// and is answered, or refused by the maximum, never by the transport.
pub fn request_limit(max_batch: usize) -> usize {
    max_batch.saturating_mul(10).saturating_add(REQUEST_SLACK)
}

/// The largest answer a server sends: a gRPC frame's length is 32 bits. A lookup whose rows
/// would pass it (over 4M ids at D 256) is refused as too large, before any row is read.
const MAX_ANSWER_BYTES: usize = u32::MAX as usize - (64 << 20);

/// Lookups of at most this many ids of a table in memory run on the I/O thread that received
/// them (about 100 µs of copying at D 256); larger ones and tiered tables' go to the blocking
/// pool.
const INLINE_LOOKUP_IDS: usize = 1024;

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
    fn wire(self) -> WireState {
        match self {
            State::Loading => WireState::Loading,
            State::Ready => WireState::Ready,
            State::Draining => WireState::Draining,
        }
    }
}

/// Where a hosted shard's rows come from: an embstore [`Table`] (in memory or tiered), or, for
/// the benchmark's side-by-side peer, another store behind the same server.
pub trait Rows: Send + Sync + std::fmt::Debug {
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
    ) -> embstore_table::Result<()>;
}

impl Rows for Table {
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
    ) -> embstore_table::Result<()> {
        Table::lookup(self, ids, OnMiss::Zeros, out, Some(found))
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

impl Rows for Part {
    fn dim(&self) -> usize {
        self.table.dim()
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn bytes(&self) -> u64 {
        Rows::bytes(&*self.table)
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
    ) -> embstore_table::Result<()> {
        Rows::lookup(&*self.table, ids, out, found)
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
    pub table: Arc<dyn Rows>,
    /// When a request last named this version (ms since the epoch), for draining.
    pub last_request_ms: AtomicU64,
}

/// Labels of a metric: (name, value) pairs.
type Labels = Vec<(String, String)>;

/// The server's Prometheus metrics (`/metrics`, see [`serve_metrics`]).
#[derive(Debug)]
struct Metrics {
    /// Lookups by table and outcome (`ok` or the gRPC code's name).
    lookups: Family<Labels, Counter>,
    /// Ids looked up, by table.
    ids: Family<Labels, Counter>,
    /// Seconds a lookup took on the server, by table.
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Set at each scrape from what the server holds.
    held: Family<Labels, Gauge>,
    rows: Family<Labels, Gauge>,
    bytes: Family<Labels, Gauge>,
    disk: Family<Labels, Gauge>,
    disk_reads: Family<Labels, Gauge>,
    budget: Family<Labels, Gauge>,
    /// Failed evictions of budgeted shards, labelled with the last one's error.
    eviction_errors: Family<Labels, Gauge>,
    /// From the tables' control records, as a cluster member last read them.
    cluster_version: Family<Labels, Gauge>,
    roll: Family<Labels, Gauge>,
    roll_to: Family<Labels, Gauge>,
    roll_seconds: Family<Labels, Gauge>,
    registry: Registry,
}

fn latency_histogram() -> Histogram {
    // 10 µs to ~0.3 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 16))
}

impl Metrics {
    fn new() -> Self {
        let mut m = Self {
            lookups: Family::default(),
            ids: Family::default(),
            seconds: Family::new_with_constructor(latency_histogram),
            held: Family::default(),
            rows: Family::default(),
            bytes: Family::default(),
            disk: Family::default(),
            disk_reads: Family::default(),
            budget: Family::default(),
            eviction_errors: Family::default(),
            cluster_version: Family::default(),
            roll: Family::default(),
            roll_to: Family::default(),
            roll_seconds: Family::default(),
            registry: Registry::with_prefix("embstore"),
        };
        let r = &mut m.registry;
        r.register("lookups", "Lookups by table and outcome", m.lookups.clone());
        r.register("lookup_ids", "Ids looked up, by table", m.ids.clone());
        r.register("lookup_seconds", "Server time of a lookup, by table", m.seconds.clone());
        r.register("versions_held", "Table versions held, by table and state", m.held.clone());
        r.register("rows_held", "Rows held, by table and version", m.rows.clone());
        r.register("bytes_in_memory", "Bytes of rows held in memory, by table", m.bytes.clone());
        r.register(
            "bytes_on_disk",
            "Bytes of segment files budgeted shards read from, by table",
            m.disk.clone(),
        );
        r.register(
            "disk_rows_read",
            "Rows the shards held now have read from disk, by table",
            m.disk_reads.clone(),
        );
        r.register(
            "memory_budget_bytes",
            "The memory budget of budgeted shards (kind=limit) and what they hold (kind=used)",
            m.budget.clone(),
        );
        r.register(
            "eviction_errors",
            "Evictions of budgeted shards that failed (a full disk), with the last one's error",
            m.eviction_errors.clone(),
        );
        r.register(
            "cluster_version",
            "The table version the cluster records in etcd, by table",
            m.cluster_version.clone(),
        );
        r.register(
            "roll",
            "The table's last roll: 1 for its state (running, done or failed) and step",
            m.roll.clone(),
        );
        r.register("roll_to_version", "The version the last roll moves to", m.roll_to.clone());
        r.register(
            "roll_seconds",
            "Seconds from the last roll's start to its last recorded step",
            m.roll_seconds.clone(),
        );
        m
    }
}

/// What this server hosts, per table name (see the crate docs).
#[derive(Debug)]
pub struct Server {
    instance: String,
    metrics: Metrics,
    gen: AtomicU64,
    max_batch: usize,
    tables: RwLock<HashMap<String, Vec<Arc<Hosted>>>>,
    /// (table, version, shard, num_shards) being loaded: LOADING in the ServerInfo.
    loading: RwLock<Vec<(String, u64, u32, u32)>>,
    /// Budgeted loads: where and under what budget (`None`: loads hold shards in memory).
    tier: Option<TierOptions>,
    /// The tables' control records as a cluster member last read them (for `/metrics`).
    controls: RwLock<Vec<embstore_cluster::Control>>,
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
    ) -> embstore_table::Result<Arc<Self>> {
        let io = |e: std::io::Error| {
            embstore_table::Error::new(ErrorKind::Io, format!("{}: {e}", tier.dir.display()))
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
            metrics: Metrics::new(),
            gen: AtomicU64::new(1),
            max_batch: max_batch.max(1),
            tables: RwLock::new(HashMap::new()),
            loading: RwLock::new(Vec::new()),
            tier,
            controls: RwLock::new(Vec::new()),
        })
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
    ) -> embstore_table::Result<()> {
        // The name becomes part of a directory's name (a budgeted server's shard parts).
        embstore_table::validate_table_name(name)?;
        let key = (name.to_string(), version, shard, num_shards);
        self.loading.write().push(key.clone());
        self.gen.fetch_add(1, Ordering::AcqRel);
        let loaded = self.load_rows(name, version, shard, num_shards, ckpt);
        self.loading.write().retain(|k| k != &key);
        self.gen.fetch_add(1, Ordering::AcqRel);
        self.host(name, version, shard, num_shards, loaded?)
    }

    /// The rows of a shard loaded from a checkpoint (see [`Server::load`]).
    fn load_rows(
        &self,
        name: &str,
        version: u64,
        shard: u32,
        num_shards: u32,
        ckpt: &std::path::Path,
    ) -> embstore_table::Result<Arc<dyn Rows>> {
        let (s, n) = (shard as usize, num_shards as usize);
        let Some(tier) = &self.tier else {
            return Ok(embstore_table::load_checkpoint_shard(ckpt, name, s, n)?);
        };
        static NONCE: AtomicU64 = AtomicU64::new(0);
        let nonce = NONCE.fetch_add(1, Ordering::Relaxed);
        let dir = tier.dir.join(format!(
            "{name}.v{version}.s{shard}of{num_shards}.{}-{nonce}{PART_SUFFIX}",
            std::process::id()
        ));
        let options =
            embstore_table::StoreOptions::default().with_shared_budget(tier.budget.clone());
        match embstore_table::open_checkpoint_shard(ckpt, name, s, n, &dir, &options) {
            Ok((store, table)) => {
                let disk_bytes = dir_bytes(&dir.join("seg"));
                Ok(Arc::new(Part { store: Some(store), table, dir, disk_bytes }))
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
        table: Arc<dyn Rows>,
    ) -> embstore_table::Result<()> {
        if !num_shards.is_power_of_two() || shard >= num_shards {
            return Err(embstore_table::Error::new(
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
        ServerInfo { instance: self.instance.clone(), gen: self.gen.load(Ordering::Acquire), held }
    }

    /// The hosted shard a request names, if this server serves it.
    fn find(&self, req: &LookupRequest) -> Result<Arc<Hosted>, Status> {
        let tables = self.tables.read();
        let Some(held) = tables.get(&req.table) else {
            return Err(
                self.status(Code::NotFound, format!("table '{}' is not served here", req.table))
            );
        };
        // Version 0: the newest version held for this shard (the protocol switched off, for
        // the checker and the benchmark: answers of one batch may then mix versions).
        let hosted = match req.version {
            0 => held
                .iter()
                .rev()
                .find(|h| h.state != State::Loading && h.shard == req.shard)
                .cloned(),
            v => held.iter().find(|h| h.version == v && h.shard == req.shard).cloned(),
        };
        match hosted {
            Some(h)
                if h.state != State::Loading
                    && h.shard == req.shard
                    && h.num_shards == req.num_shards =>
            {
                h.last_request_ms.store(now_ms(), Ordering::Relaxed);
                Ok(h)
            }
            _ => Err(self.status(
                Code::FailedPrecondition,
                format!(
                    "version {} shard {} of {} of table '{}' is not served here",
                    req.version, req.shard, req.num_shards, req.table
                ),
            )),
        }
    }

    /// A status of `code` carrying this server's `ServerInfo` in its details.
    fn status(&self, code: Code, message: String) -> Status {
        Status::with_details(code, message, self.info().encode_to_vec().into())
    }

    /// A lookup as the service answers it (for the tests, which call it without the service).
    #[cfg(test)]
    fn lookup(&self, req: &LookupRequest) -> Result<LookupResponse, Status> {
        self.lookup_in(req, self.target(req))
    }

    /// The hosted shard a lookup reads, after checking its size.
    fn target(&self, req: &LookupRequest) -> Result<Arc<Hosted>, Status> {
        if req.ids.len() > self.max_batch {
            return Err(self.status(
                Code::ResourceExhausted,
                format!("a lookup holds at most {} ids, got {}", self.max_batch, req.ids.len()),
            ));
        }
        let hosted = self.find(req)?;
        let answer = req.ids.len().saturating_mul(hosted.table.dim() * 4 + 1);
        if answer > MAX_ANSWER_BYTES {
            return Err(self.status(
                Code::ResourceExhausted,
                format!(
                    "the answer to {} ids of dim {} would be {answer} bytes, over the limit of \
                     {MAX_ANSWER_BYTES}: split the batch",
                    req.ids.len(),
                    hosted.table.dim()
                ),
            ));
        }
        Ok(hosted)
    }

    /// Answers `req` from `target` (what [`Server::target`] gave for it) and counts it.
    fn lookup_in(
        &self,
        req: &LookupRequest,
        target: Result<Arc<Hosted>, Status>,
    ) -> Result<LookupResponse, Status> {
        let start = std::time::Instant::now();
        let result = target.and_then(|hosted| self.read(req, &hosted));
        let table = vec![("table".to_string(), req.table.clone())];
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(s) => format!("{:?}", s.code()).to_lowercase(),
        };
        let mut labels = table.clone();
        labels.push(("outcome".to_string(), outcome));
        self.metrics.lookups.get_or_create(&labels).inc();
        if result.is_ok() {
            self.metrics.ids.get_or_create(&table).inc_by(req.ids.len() as u64);
            self.metrics.seconds.get_or_create(&table).observe(start.elapsed().as_secs_f64());
        }
        result
    }

    /// The metrics in Prometheus' text format, with the gauges of what is held set now.
    pub fn metrics_text(&self) -> String {
        let m = &self.metrics;
        for f in [&m.held, &m.rows, &m.bytes, &m.disk, &m.disk_reads, &m.budget, &m.eviction_errors]
        {
            f.clear();
        }
        for f in [&m.cluster_version, &m.roll, &m.roll_to, &m.roll_seconds] {
            f.clear();
        }
        let of = |table: &str| vec![("table".to_string(), table.to_string())];
        for c in self.controls.read().iter() {
            m.cluster_version.get_or_create(&of(&c.table)).set(c.version as i64);
            if let Some(r) = &c.roll {
                let mut l = of(&c.table);
                let state = format!("{:?}", r.state).to_lowercase();
                l.extend([("state".to_string(), state), ("step".to_string(), r.step.clone())]);
                m.roll.get_or_create(&l).set(1);
                m.roll_to.get_or_create(&of(&c.table)).set(r.to_version as i64);
                let ms = r.updated_ms.saturating_sub(r.started_ms);
                m.roll_seconds.get_or_create(&of(&c.table)).set((ms / 1000) as i64);
            }
        }
        if let Some(t) = &self.tier {
            let kind = |k: &str| vec![("kind".to_string(), k.to_string())];
            m.budget.get_or_create(&kind("limit")).set(t.budget.limit() as i64);
            m.budget.get_or_create(&kind("used")).set(t.budget.used() as i64);
            if let Some(e) = t.budget.last_eviction_error() {
                let l = vec![("error".to_string(), e)];
                m.eviction_errors.get_or_create(&l).set(t.budget.eviction_errors() as i64);
            }
        }
        for (name, held) in self.tables.read().iter() {
            for h in held {
                let state = format!("{:?}", h.state).to_lowercase();
                let l = vec![("table".to_string(), name.clone()), ("state".to_string(), state)];
                m.held.get_or_create(&l).inc();
                let l = vec![
                    ("table".to_string(), name.clone()),
                    ("version".to_string(), h.version.to_string()),
                ];
                m.rows.get_or_create(&l).set(h.table.len() as i64);
                m.bytes.get_or_create(&of(name)).inc_by(h.table.bytes() as i64);
                m.disk.get_or_create(&of(name)).inc_by(h.table.disk_bytes() as i64);
                m.disk_reads.get_or_create(&of(name)).inc_by(h.table.disk_reads() as i64);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }

    fn read(&self, req: &LookupRequest, hosted: &Hosted) -> Result<LookupResponse, Status> {
        let t = &hosted.table;
        let mut values = vec![0f32; req.ids.len() * t.dim()];
        let mut found = vec![false; req.ids.len()];
        t.lookup(&req.ids, &mut values, &mut found)
            .map_err(|e| self.status(to_status(e.kind()), e.to_string()))?;
        let current = self.gen.load(Ordering::Acquire);
        Ok(LookupResponse {
            info: (req.known_gen != current).then(|| self.info()),
            version: hosted.version,
            embedding_dim: t.dim() as u32,
            values: embstore_proto::encode_rows(&values),
            found: found.into_iter().map(u8::from).collect(),
        })
    }
}

/// Bytes of the files in `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// The gRPC code for a table error (the one mapping of this boundary; the client maps back).
pub fn to_status(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::ShapeMismatch | ErrorKind::NonFinite => {
            Code::InvalidArgument
        }
        ErrorKind::TableNotFound | ErrorKind::KeyNotFound => Code::NotFound,
        ErrorKind::TableExists => Code::AlreadyExists,
        ErrorKind::Capacity | ErrorKind::NoSpace => Code::ResourceExhausted,
        ErrorKind::Corruption => Code::DataLoss,
        ErrorKind::Unavailable | ErrorKind::Locked => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// The `Serving` service over a [`Server`].
#[derive(Debug, Clone)]
pub struct Serving(pub Arc<Server>);

#[tonic::async_trait]
impl embstore_proto::v1::serving_server::Serving for Serving {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let server = self.0.clone();
        let req = request.into_inner();
        // A small lookup of rows in memory takes microseconds: on this thread (a hand-off to
        // the blocking pool costs more). A large one, or one that may read from disk, goes off
        // the I/O threads.
        let target = server.target(&req);
        let inline = target
            .as_ref()
            .map_or(true, |h| req.ids.len() <= INLINE_LOOKUP_IDS && !h.table.may_block());
        if inline {
            return server.lookup_in(&req, target).map(Response::new);
        }
        tokio::task::spawn_blocking(move || server.lookup_in(&req, target))
            .await
            .map_err(|e| Status::internal(format!("lookup task failed: {e}")))?
            .map(Response::new)
    }

    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        Ok(Response::new(self.0.info()))
    }
}

/// The `Admin` service over a [`Server`]: what a roll's coordinator calls.
#[derive(Debug, Clone)]
pub struct Admin(pub Arc<Server>);

#[tonic::async_trait]
impl embstore_proto::v1::admin_server::Admin for Admin {
    async fn load(&self, request: Request<LoadRequest>) -> Result<Response<ServerInfo>, Status> {
        let server = self.0.clone();
        let r = request.into_inner();
        tokio::task::spawn_blocking(move || {
            let ckpt = std::path::Path::new(&r.checkpoint);
            server.load(&r.table, r.version, r.shard, r.num_shards, ckpt).map_err(|e| {
                server.status(to_status(e.kind()), format!("load of '{}': {e}", r.table))
            })?;
            Ok(Response::new(server.info()))
        })
        .await
        .map_err(|e| Status::internal(format!("load task failed: {e}")))?
    }

    async fn drain(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        self.change(request.into_inner(), Server::drain)
    }

    async fn unload(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        self.change(request.into_inner(), Server::unload)
    }
}

impl Admin {
    /// Applies `change` to the version `r` names; NOT_FOUND (with the ServerInfo) if this
    /// server does not hold it.
    fn change(
        &self,
        r: VersionRequest,
        change: fn(&Server, &str, u64, Option<u32>) -> bool,
    ) -> Result<Response<ServerInfo>, Status> {
        if !change(&self.0, &r.table, r.version, r.shard) {
            return Err(self.0.status(
                Code::NotFound,
                format!("version {} of table '{}' is not held here", r.version, r.table),
            ));
        }
        Ok(Response::new(self.0.info()))
    }
}

/// Serves `GET /metrics` (Prometheus text format: lookups by table and outcome, ids, a latency
/// histogram, versions, rows and bytes held) on `listener` until `shutdown` resolves.
pub async fn serve_metrics(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_metrics_with(server, listener, None, shutdown).await
}

/// [`serve_metrics`] over TLS when `tls` is given (the serving port's certificate, and with a
/// client CA, mutual TLS: Prometheus then scrapes with a client certificate). A connection
/// whose handshake fails or takes over 10 s is dropped; others are not held up by it.
pub async fn serve_metrics_with(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let server = server.clone();
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                    server.metrics_text(),
                )
            }
        }),
    );
    match tls {
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await,
        Some(tls) => {
            let config = tls
                .rustls_config()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let listener = TlsListener::new(listener, config);
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await
        }
    }
}

impl Tls {
    /// Whether this identity (and client CA) can serve: the certificate file holds a
    /// certificate, the key file a private key, and the key is the certificate's. Fails with
    /// `InvalidArgument` naming the cause (a certificate and key given the wrong way round, a
    /// key of another certificate), so that a server refuses to start rather than fail each
    /// handshake.
    pub fn check(&self) -> embstore_table::Result<()> {
        self.rustls_config()
            .map(drop)
            .map_err(|e| embstore_table::Error::new(ErrorKind::InvalidArgument, e))
    }

    /// This identity (and client CA) as a rustls server configuration, or why not.
    fn rustls_config(&self) -> Result<Arc<tokio_rustls::rustls::ServerConfig>, String> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
        let holds = |pem: &[u8], what: &str| pem.windows(what.len()).any(|w| w == what.as_bytes());
        const SWAPPED: &str = "are the certificate and the key swapped?";
        let certs = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("the tls certificate", &e))?;
        if certs.is_empty() {
            return Err(if holds(&self.cert_pem, "PRIVATE KEY") {
                format!("the tls certificate file holds a private key, no certificate: {SWAPPED}")
            } else {
                "the tls certificate file holds no pem certificate".to_string()
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| {
            if holds(&self.key_pem, "CERTIFICATE") {
                format!("the tls key file holds a certificate, no private key: {SWAPPED}")
            } else {
                bad("the tls private key", &e)
            }
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", &e))?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert = cert.map_err(|e| bad("the tls client ca", &e))?;
                    roots.add(cert).map_err(|e| bad("the tls client ca", &e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .map_err(|e| bad("the tls client ca", &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                "the tls private key does not match the certificate".to_string()
            }
            e => bad("the tls certificate", &e),
        })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A TLS listener for axum: a task accepts TCP connections and runs each handshake in a task
/// of its own, so a slow or failing client holds up no other; finished ones queue here.
struct TlsListener {
    local: std::net::SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsIo, std::net::SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

type TlsIo = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

impl TlsListener {
    fn new(tcp: tokio::net::TcpListener, config: Arc<tokio_rustls::rustls::ServerConfig>) -> Self {
        let local = tcp.local_addr().unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((stream, addr)) = tcp.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = tls.accept(stream);
                    let timeout = std::time::Duration::from_secs(10);
                    if let Ok(Ok(io)) = tokio::time::timeout(timeout, handshake).await {
                        let _ = tx.send((io, addr)).await;
                    }
                });
            }
        });
        Self { local, ready, acceptor }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task is gone only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Tokens a server asks for, sent by clients as `authorization: Bearer <token>`. Without a
/// read token, lookups need none; without an admin token, admin calls need none (trusted
/// networks only). The admin token is also good for lookups.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    pub read: Option<String>,
    pub admin: Option<String>,
}

/// Whether `a` equals `b`, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Whether a call carrying `req`'s metadata may go on, given the tokens that allow it
    /// (none: anyone may call).
    fn check(req: &Request<()>, accepted: &[&String]) -> Result<(), Status> {
        if accepted.is_empty() {
            return Ok(());
        }
        let Some(got) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "this server needs a token (authorization: Bearer <token>)",
            ));
        };
        let got = got.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b"");
        if accepted.iter().any(|w| same(got, w.as_bytes())) {
            Ok(())
        } else {
            Err(Status::permission_denied("the token does not allow this call"))
        }
    }

    /// Tokens that allow a lookup: the read token and the admin token, if a read token is set.
    fn for_lookups(&self) -> Vec<&String> {
        match &self.read {
            None => Vec::new(),
            Some(r) => std::iter::once(r).chain(&self.admin).collect(),
        }
    }

    /// Tokens that allow an admin call: the admin token; without one, the read token (so that
    /// a reader-protected server does not leave admin calls open).
    fn for_admin(&self) -> Vec<&String> {
        self.admin.as_ref().or(self.read.as_ref()).into_iter().collect()
    }
}

/// TLS for the serving port: the server's certificate chain and key (PEM), and with
/// `client_ca`, the CA that client certificates must chain to (mutual TLS: a client without one
/// is refused during the handshake).
#[derive(Clone, Debug)]
pub struct Tls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

/// How [`serve`] serves: with `admin`, the [`Admin`] service too; the `tokens` it asks for;
/// TLS when `tls` is given. The default: lookups only, no tokens, plaintext.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    pub admin: bool,
    pub tokens: Tokens,
    pub tls: Option<Tls>,
}

/// Serves `server` on `listener` as `options` say until `shutdown` resolves (then stops
/// accepting and finishes the requests in flight).
pub async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let ServeOptions { admin, tokens, tls } = options;
    use tokio_stream::StreamExt;
    // No Nagle: a small answer would otherwise wait for the client's delayed ACK (~40 ms).
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|c| {
            let _ = c.set_nodelay(true);
        })
    });
    use tonic::service::interceptor::InterceptedService;
    let t = tokens.clone();
    let admin = admin.then(|| {
        AdminServer::with_interceptor(Admin(server.clone()), move |req: Request<()>| {
            Tokens::check(&req, &t.for_admin()).map(|()| req)
        })
    });
    let t = tokens;
    // A batch of up to `max_batch` ids decodes whatever its ids; answers are as large as
    // `max_batch` ids of the table's dim make them (checked against MAX_ANSWER_BYTES).
    let limit = request_limit(server.max_batch);
    let serving = ServingServer::new(Serving(server))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let serving = InterceptedService::new(serving, move |req: Request<()>| {
        Tokens::check(&req, &t.for_lookups()).map(|()| req)
    });
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(tls.cert_pem, tls.key_pem));
        if let Some(ca) = tls.client_ca_pem {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        builder = builder.tls_config(config)?;
    }
    builder
        .add_service(serving)
        .add_optional_service(admin)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use embstore_table::{Store, TableConfig};

    fn table(ids: &[u64]) -> Arc<Table> {
        let store = Store::new();
        let t = store.create_table(TableConfig::new("t", 2)).unwrap();
        let values: Vec<f32> = ids.iter().flat_map(|&k| [k as f32, 0.5]).collect();
        t.assign(ids, &values).unwrap();
        t
    }

    fn req(version: u64, ids: Vec<u64>) -> LookupRequest {
        LookupRequest { table: "user".into(), version, shard: 0, num_shards: 1, ids, known_gen: 0 }
    }

    /// The request decoder and the lookup path take any bytes: a decode error, a typed status
    /// or rows — never a panic — and the server answers a good request afterwards. 2,000 cases
    /// of random bytes and of valid requests with a byte flipped; `EMBSTORE_TEST_SEED` replays.
    #[test]
    fn any_bytes_give_an_error_or_an_answer_never_a_panic() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed, TestRunner};
        let seed = std::env::var("EMBSTORE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x00f0_22ed);
        eprintln!("seed {seed} (EMBSTORE_TEST_SEED={seed} replays)");
        let mut runner = TestRunner::new(Config {
            cases: 2000,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            ..Config::default()
        });
        let s = Server::new("fuzz", 64);
        s.host("user", 7, 0, 1, table(&[1, 2])).unwrap();
        let strategy = (proptest::collection::vec(any::<u8>(), 0..256), any::<(usize, u8)>());
        runner
            .run(&strategy, |(bytes, (at, flip))| {
                let mut valid = req(7, vec![1, 2, 3]).encode_to_vec();
                let i = at % valid.len();
                valid[i] ^= flip;
                for wire in [bytes.as_slice(), valid.as_slice()] {
                    if let Ok(r) = LookupRequest::decode(wire) {
                        if let Ok(resp) = s.lookup(&r) {
                            prop_assert_eq!(resp.found.len(), r.ids.len());
                            prop_assert_eq!(resp.values.len(), r.ids.len() * 2 * 4);
                        }
                    }
                }
                prop_assert!(s.lookup(&req(7, vec![1])).is_ok());
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }

    #[test]
    fn lookups_answer_the_named_version_and_say_what_is_held_otherwise() {
        let s = Server::new("test", 4);
        s.host("user", 7, 0, 1, table(&[1, 2])).unwrap();
        let gen = s.info().gen;
        let r = s.lookup(&req(7, vec![2, 9])).unwrap();
        assert_eq!(r.version, 7);
        assert_eq!(embstore_proto::decode_rows(&r.values, 2, 2).unwrap(), [2.0, 0.5, 0.0, 0.0]);
        assert_eq!(r.found, [1, 0]);
        assert_eq!(r.info.unwrap().held[0].rows, 2);
        // A client that holds the current info gets none back; a stale one gets it.
        let current = LookupRequest { known_gen: gen, ..req(7, vec![1]) };
        assert!(s.lookup(&current).unwrap().info.is_none());
        let stale = LookupRequest { known_gen: gen - 1, ..req(7, vec![1]) };
        assert_eq!(s.lookup(&stale).unwrap().info.unwrap().gen, gen);
        // A version not held: FAILED_PRECONDITION, with the ServerInfo in the details.
        let e = s.lookup(&req(8, vec![1])).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        let info = ServerInfo::decode(e.details()).unwrap();
        assert_eq!((info.held[0].version, info.gen), (7, gen));
        // Another shard count: refused too.
        let mut r2 = req(7, vec![1]);
        r2.num_shards = 2;
        assert_eq!(s.lookup(&r2).unwrap_err().code(), Code::FailedPrecondition);
        assert_eq!(
            s.lookup(&LookupRequest { table: "x".into(), ..req(7, vec![]) }).unwrap_err().code(),
            Code::NotFound
        );
        assert_eq!(s.lookup(&req(7, vec![1; 5])).unwrap_err().code(), Code::ResourceExhausted);
        assert!(s.lookup(&req(7, vec![])).unwrap().values.is_empty());
        // Draining still serves; unloading does not; each change raises gen.
        assert!(s.drain("user", 7, None));
        assert_eq!(s.info().held[0].state(), WireState::Draining);
        assert!(s.lookup(&req(7, vec![1])).is_ok());
        assert!(s.unload("user", 7, None) && !s.unload("user", 7, None));
        assert_eq!(s.lookup(&req(7, vec![1])).unwrap_err().code(), Code::NotFound);
        assert!(s.info().gen >= gen + 2);
        assert!(s.host("user", 1, 2, 2, table(&[])).is_err());
        assert!(s.host("user", 1, 0, 3, table(&[])).is_err());
    }

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

    /// Rows of a dim too large to answer many of: every lookup would be refused first.
    #[derive(Debug)]
    struct Wide;

    impl Rows for Wide {
        fn dim(&self) -> usize {
            1 << 22
        }
        fn len(&self) -> usize {
            0
        }
        fn bytes(&self) -> u64 {
            0
        }
        fn may_block(&self) -> bool {
            false
        }
        fn lookup(&self, _: &[u64], _: &mut [f32], _: &mut [bool]) -> embstore_table::Result<()> {
            panic!("a lookup whose answer no frame can carry must be refused before reading")
        }
    }

    /// A batch within the maximum whose answer passes what a gRPC frame carries (300 rows of
    /// 16 MiB) is refused before any row is read or buffered, and counted as refused, not ok.
    #[test]
    fn an_answer_no_frame_can_carry_is_refused_and_counted() {
        let s = Server::new("wide", 1 << 20);
        s.host("user", 1, 0, 1, Arc::new(Wide)).unwrap();
        let e = s.lookup(&req(1, (0..300).collect())).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("split the batch"), "{e:?}");
        let text = s.metrics_text();
        assert!(text.contains(r#"{table="user",outcome="resourceexhausted"} 1"#), "{text}");
        assert!(!text.contains(r#"outcome="ok""#), "{text}");
        // Sized from --max-batch: a request of that many ids of 10 bytes each decodes.
        let ids: Vec<u64> = vec![u64::MAX; 1000];
        let wire = LookupRequest { ids, ..req(1, vec![]) }.encoded_len();
        assert!(wire <= request_limit(1000), "{wire} > {}", request_limit(1000));
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
                    let mine = embstore_table::shard_of_key(k, 2) == shard as usize;
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

    #[test]
    fn metrics_show_the_last_eviction_error_of_the_budget() {
        // A store that shares the server's budget cannot evict onto its full disk: the
        // failure, counted with its message, is in /metrics.
        use embstore_table::disk::vfs::FaultFs;
        let root = tempfile::tempdir().unwrap();
        let budget = embstore_table::Budget::shared(64 << 10).unwrap();
        let tier = TierOptions { dir: root.path().join("data"), budget: budget.clone() };
        let s = Server::with_tier("tiered", 1 << 16, tier).unwrap();
        assert!(!s.metrics_text().contains("embstore_eviction_errors"));
        let fs = FaultFs::new(u64::MAX);
        let options = embstore_table::StoreOptions::default().with_shared_budget(budget.clone());
        let store = Store::open_with_options(root.path().join("s"), &options, Arc::new(fs.clone()))
            .unwrap();
        let t = store.create_table(TableConfig::new("t", 8)).unwrap();
        fs.set_full(true);
        let ids: Vec<u64> = (0..4000).collect();
        let mut out = vec![0.0; ids.len() * 8];
        let _ = t.lookup(&ids, embstore_table::OnMiss::Init, &mut out, None);
        assert!(budget.eviction_errors() > 0);
        let text = s.metrics_text();
        assert!(text.contains("embstore_eviction_errors{error=\""), "{text}");
        assert!(text.contains("No space left"), "{text}");
    }
}
