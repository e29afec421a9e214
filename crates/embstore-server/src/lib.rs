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
//!
//! - [`member`] — membership in a cluster in etcd: registration under a lease, and the
//!   reconciler that loads what the control records assign here.

pub mod member;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use embstore_proto::v1::admin_server::AdminServer;
use embstore_proto::v1::serving_server::ServingServer;
use embstore_proto::v1::{
    DescribeRequest, Held, LoadRequest, LookupRequest, LookupResponse, ServerInfo,
    State as WireState, VersionRequest,
};
use embstore_table::{now_ms, ErrorKind, OnMiss, Table};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use prost::Message;
use tonic::{Code, Request, Response, Status};

/// Ids one lookup may carry, by default (the "a batch above the configured maximum"
/// gets `RESOURCE_EXHAUSTED`): 1M ids of D 256 are a 1 GiB answer.
pub const DEFAULT_MAX_BATCH: usize = 1 << 20;

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
            registry: Registry::with_prefix("embstore"),
        };
        let r = &mut m.registry;
        r.register("lookups", "Lookups by table and outcome", m.lookups.clone());
        r.register("lookup_ids", "Ids looked up, by table", m.ids.clone());
        r.register("lookup_seconds", "Server time of a lookup, by table", m.seconds.clone());
        r.register("versions_held", "Table versions held, by table and state", m.held.clone());
        r.register("rows_held", "Rows held, by table and version", m.rows.clone());
        r.register("bytes_in_memory", "Bytes of rows held in memory, by table", m.bytes.clone());
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
}

impl Server {
    /// An empty server named `instance` (its address, usually), answering batches of at most
    /// `max_batch` ids.
    pub fn new(instance: impl Into<String>, max_batch: usize) -> Arc<Self> {
        Arc::new(Self {
            instance: instance.into(),
            metrics: Metrics::new(),
            gen: AtomicU64::new(1),
            max_batch: max_batch.max(1),
            tables: RwLock::new(HashMap::new()),
            loading: RwLock::new(Vec::new()),
        })
    }

    /// Loads shard `shard` of `num_shards` of table `name` from the checkpoint at `ckpt` and
    /// hosts it as version `version` (LOADING meanwhile, READY when this returns). On failure
    /// the server holds what it held before. Blocking: the whole shard is read.
    pub fn load(
        &self,
        name: &str,
        version: u64,
        shard: u32,
        num_shards: u32,
        ckpt: &std::path::Path,
    ) -> embstore_table::Result<()> {
        let key = (name.to_string(), version, shard, num_shards);
        self.loading.write().push(key.clone());
        self.gen.fetch_add(1, Ordering::AcqRel);
        let loaded =
            embstore_table::load_checkpoint_shard(ckpt, name, shard as usize, num_shards as usize);
        self.loading.write().retain(|k| k != &key);
        self.gen.fetch_add(1, Ordering::AcqRel);
        self.host(name, version, shard, num_shards, loaded?)
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
        self.find(req)
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
        m.held.clear();
        m.rows.clear();
        m.bytes.clear();
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
                let bytes = h.table.bytes() as i64;
                m.bytes.get_or_create(&vec![("table".to_string(), name.clone())]).inc_by(bytes);
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
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
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
    let t = tokens.clone();
    let admin = admin.then(|| {
        AdminServer::with_interceptor(Admin(server.clone()), move |req: Request<()>| {
            Tokens::check(&req, &t.for_admin()).map(|()| req)
        })
    });
    let t = tokens;
    let serving = ServingServer::with_interceptor(Serving(server), move |req: Request<()>| {
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
}
