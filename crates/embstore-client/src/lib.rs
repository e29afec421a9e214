//! The Rust client of the batch-query service (docs/serving.md): a batch lookup reads every row
//! at ONE table version, fanned out to the shards of that version in parallel.
//!
//! ## Parts
//! - [`Client`] — the servers it knows (address, newest `ServerInfo`, health, requests in
//!   flight) and, per table, the version it pinned last.
//! - [`Rows`] — a lookup's answer: `values` `[B, D]`, `found` `[B]`, and the `version`.
//! - [`ClientOptions`] — the call deadline, the restart limit, the token and [`ClientTls`].
//! - [`from_status`] — the one mapping from gRPC statuses to table errors.
//!
//! [`ClientTls`], [`from_status`] and the channel and TLS diagnosis the client calls through
//! live in `embstore_cluster::rpc`, which the roll's admin calls share; the roll coordinator
//! itself (`admin`, `roll`, `publish`) is the control plane's, in `embstore_cluster`.
//!
//! ## How a lookup runs
//! 1. **Pick a version** from the view: the newest *complete* one (every shard has a READY or
//!    DRAINING replica) whose *capacity* (the least number of READY replicas over its shards)
//!    is at least the pinned version's, so that clients move to v+1 only once it can carry the
//!    load. If the pinned version is no longer complete, the client takes the newest complete
//!    one.
//! 2. **Split the ids by shard** of that version (`shard_of_key`) and send each shard's ids to
//!    its READY replica with the fewest requests in flight (DRAINING ones only when no READY one
//!    is left), all shards at once: **one request per server**, since the shards a server
//!    would be asked for go in one request (`more_shards`) when it says it reads several
//!    (`ServerInfo.spans_shards`), over either transport.
//! 3. **Every answer updates the view** (each carries the server's `ServerInfo`). A
//!    "version not held here" answer (`FAILED_PRECONDITION`) or a transport error tries the
//!    next replica of that shard (a request for several shards is split into one per shard
//!    for the others); when none is left, the whole batch starts again with a fresh
//!    pick, at most `max_restarts` times. Partial results are thrown away: **a batch never mixes
//!    two versions**.
//!
//! ## At the edges
//! - **Message limits** are sized per call: a client reads an answer as large as its ids × the
//!   table's dim make it (`answer_limit`), not gRPC's 4 MiB default; the server decodes any
//!   request of up to its maximum batch.
//! - **A failed connect says why** when the cause is TLS (the server speaks TLS, an unknown
//!   CA, a server without TLS), instead of only "no server answered" (`embstore_cluster::rpc::tls_cause`).
//! - **Tokens** lose surrounding whitespace, as when read from a file.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embstore_cluster::rpc::{channel, request, tls_cause};
use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::shard_of_key;
use embstore_proto::v1::serving_client::ServingClient;
use embstore_proto::v1::{DescribeRequest, LookupRequest, LookupResponse, ServerInfo, State};
use parking_lot::Mutex;
use prost::Message;
use tonic::transport::Channel;
use tonic::Code;

mod framed;

pub use embstore_cluster::rpc::{from_status, ClientTls};
pub use framed::Transport;

/// How a [`Client`] calls.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The longest a lookup may take, all tries included.
    pub deadline: Duration,
    /// Times a batch starts again with a fresh version pick before failing with `Unavailable`.
    pub max_restarts: usize,
    /// A lookup first asks every server what it holds when the view is older than this, so
    /// that the client moves to a new version soon after it is complete even when the servers
    /// it reads from have not changed.
    pub refresh_every: Duration,
    /// Read every shard of a batch at one version (the protocol). `false` switches it off:
    /// each server answers with the newest version it holds, so a batch may mix versions —
    /// only for tests and benchmarks that measure what the protocol prevents.
    pub consistent: bool,
    /// Sent as `authorization: Bearer <token>` on every call (a server with a read token
    /// refuses calls without it).
    pub token: Option<String>,
    /// Talk TLS to the servers.
    pub tls: Option<ClientTls>,
    /// Which transport lookups take ([`Transport::Auto`]: the framed path where a server
    /// offers it). `Describe` and refreshes always take gRPC.
    pub transport: Transport,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(5),
            max_restarts: 2,
            refresh_every: Duration::from_secs(1),
            consistent: true,
            token: None,
            tls: None,
            transport: Transport::Auto,
        }
    }
}

/// A lookup's answer: one version for every row.
#[derive(Clone, Debug, PartialEq)]
pub struct Rows {
    /// `[B, D]`, row-major; zeros for ids without a row.
    pub values: Vec<f32>,
    /// `[B]`: whether each id has a row.
    pub found: Vec<bool>,
    /// `D`.
    pub embedding_dim: usize,
    /// The table version every row was read at.
    pub version: u64,
}

#[derive(Debug)]
struct Endpoint {
    addr: String,
    rpc: ServingClient<Channel>,
    healthy: AtomicBool,
    outstanding: AtomicUsize,
    framed: framed::FramedPath,
}

impl Endpoint {
    fn new(addr: &str, options: &ClientOptions) -> Result<Self> {
        let channel = channel(addr, options.deadline, options.tls.as_ref())?;
        Ok(Self {
            addr: addr.to_string(),
            rpc: ServingClient::new(channel),
            healthy: AtomicBool::new(true),
            outstanding: AtomicUsize::new(0),
            framed: framed::FramedPath::default(),
        })
    }
}

/// How often a client that found its servers through etcd re-reads the registered ones.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);

/// A client's view of etcd's naming: the addresses registered there, re-read by a task every
/// [`DISCOVER_EVERY`] (kept as they were while etcd is away).
#[derive(Debug)]
struct Discovery {
    addrs: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client of a set of servers, fixed or found through etcd (see the crate docs).
#[derive(Debug)]
pub struct Client {
    /// Only ever grows (indices stay valid); servers that went away are unhealthy.
    endpoints: parking_lot::RwLock<Vec<Arc<Endpoint>>>,
    discovery: Option<Discovery>,
    /// Per endpoint, the newest `ServerInfo` seen (by `gen`).
    infos: Mutex<Vec<Option<ServerInfo>>>,
    /// Per table, the version of its last batch.
    pinned: Mutex<HashMap<String, u64>>,
    /// When every server was last asked what it holds.
    refreshed: Mutex<std::time::Instant>,
    /// Round-robin position with the protocol off.
    turn: AtomicUsize,
    options: ClientOptions,
    /// The TLS configuration of the framed path (from `options.tls`).
    framed_tls: Option<framed::Tls>,
}

/// Where a version's shards are: per shard, the endpoints holding it READY and DRAINING.
#[derive(Debug)]
struct Placement {
    version: u64,
    num_shards: u32,
    embedding_dim: u32,
    replicas: Vec<(Vec<usize>, Vec<usize>)>,
}

impl Client {
    /// A client of the servers at `addrs` (`host:port`), which asks each what it holds. Fails
    /// with `Unavailable` when none answers, `InvalidArgument` for a malformed address.
    pub async fn connect(addrs: &[String], options: ClientOptions) -> Result<Self> {
        if addrs.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "no server address given"));
        }
        let mut options = options;
        options.token = options.token.as_deref().map(checked_token).transpose()?;
        let mut endpoints = Vec::with_capacity(addrs.len());
        for addr in addrs {
            endpoints.push(Arc::new(Endpoint::new(addr, &options)?));
        }
        let framed_tls = options.tls.as_ref().map(framed::Tls::new).transpose()?;
        let client = Self {
            framed_tls,
            infos: Mutex::new(vec![None; endpoints.len()]),
            endpoints: parking_lot::RwLock::new(endpoints),
            discovery: None,
            pinned: Mutex::new(HashMap::new()),
            refreshed: Mutex::new(std::time::Instant::now()),
            turn: AtomicUsize::new(0),
            options,
        };
        if client.refresh().await == 0 {
            // A refusal (a missing or wrong token) or a failed TLS handshake says more than
            // "no answer".
            let req = request(DescribeRequest {}, client.options.token.as_deref());
            let mut rpc = client.endpoint(0).rpc.clone();
            let first = rpc.describe(req);
            let mut why = String::new();
            if let Ok(Err(status)) = tokio::time::timeout(client.options.deadline, first).await {
                if matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied) {
                    return Err(from_status(&status));
                }
                let tls = client.options.tls.is_some();
                if let Some(cause) = tls_cause(&addrs[0], &status, tls).await {
                    why = match addrs.len() {
                        1 => format!(": {cause}"),
                        _ => format!(" ({}: {cause})", addrs[0]),
                    };
                }
            }
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("no server answered: {}{why}", addrs.join(", ")),
            ));
        }
        Ok(client)
    }

    /// A client of the servers registered in etcd at `etcd` (see [`Client::connect`]). It
    /// keeps re-reading the registrations, so servers that join later are used; while etcd is
    /// away it goes on with the servers it knows. Fails with `Unavailable` when etcd does not
    /// answer or no server is registered.
    pub async fn connect_etcd(etcd: &[String], options: ClientOptions) -> Result<Self> {
        let etcd = Arc::new(embstore_cluster::Etcd::connect(etcd, Duration::from_secs(2))?);
        let addrs: Vec<String> =
            embstore_cluster::members(&etcd).await?.into_iter().map(|(_, a)| a).collect();
        if addrs.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("no server is registered in etcd at {}", etcd.endpoints().join(",")),
            ));
        }
        let mut client = Self::connect(&addrs, options).await?;
        let found = Arc::new(Mutex::new(addrs));
        let shared = found.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(DISCOVER_EVERY).await;
                if let Ok(m) = embstore_cluster::members(&etcd).await {
                    *shared.lock() = m.into_iter().map(|(_, a)| a).collect();
                }
            }
        });
        client.discovery = Some(Discovery { addrs: found, task });
        Ok(client)
    }

    /// Every server known now (a snapshot).
    fn endpoints(&self) -> Vec<Arc<Endpoint>> {
        self.endpoints.read().clone()
    }

    fn endpoint(&self, i: usize) -> Arc<Endpoint> {
        self.endpoints.read()[i].clone()
    }

    /// Adds the servers of `addrs` not known yet.
    fn add(&self, addrs: &[String]) {
        // The lock order everywhere: infos, then endpoints.
        let mut infos = self.infos.lock();
        let mut eps = self.endpoints.write();
        for addr in addrs {
            if eps.iter().any(|e| &e.addr == addr) {
                continue;
            }
            let Ok(ep) = Endpoint::new(addr, &self.options) else { continue };
            eps.push(Arc::new(ep));
            infos.push(None);
        }
    }

    /// Asks every server what it holds; returns how many answered (the others are marked
    /// unhealthy until they answer again). A client found through etcd first adds the servers
    /// registered since.
    pub async fn refresh(&self) -> usize {
        *self.refreshed.lock() = std::time::Instant::now();
        if let Some(d) = &self.discovery {
            let addrs = d.addrs.lock().clone();
            self.add(&addrs);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (i, ep) in self.endpoints().iter().enumerate() {
            let mut rpc = ep.rpc.clone();
            let deadline = self.options.deadline;
            let req = request(DescribeRequest {}, self.options.token.as_deref());
            tasks.spawn(async move {
                let call = rpc.describe(req);
                (i, tokio::time::timeout(deadline, call).await)
            });
        }
        let mut answered = 0;
        while let Some(done) = tasks.join_next().await {
            let Ok((i, result)) = done else { continue };
            match result {
                Ok(Ok(info)) => {
                    answered += 1;
                    self.endpoint(i).healthy.store(true, Ordering::Relaxed);
                    self.learn(i, info.into_inner());
                }
                _ => self.endpoint(i).healthy.store(false, Ordering::Relaxed),
            }
        }
        answered
    }

    /// The servers' addresses and the newest `ServerInfo` seen from each.
    pub fn view(&self) -> Vec<(String, Option<ServerInfo>)> {
        let infos = self.infos.lock();
        self.endpoints()
            .iter()
            .zip(infos.iter())
            .map(|(e, i)| (e.addr.clone(), i.clone()))
            .collect()
    }

    fn learn(&self, endpoint: usize, info: ServerInfo) {
        let mut infos = self.infos.lock();
        if infos[endpoint].as_ref().is_none_or(|old| info.gen >= old.gen) {
            let ep = self.endpoint(endpoint);
            ep.framed.learn(&ep.addr, &info, self.framed_tls.is_some());
            infos[endpoint] = Some(info);
        }
    }

    /// The transport a lookup from this client takes to the server at `addr` now: `"framed"`
    /// (the framed path, over TCP or a Unix socket) or `"grpc"`.
    pub fn transport_to(&self, addr: &str) -> Option<&'static str> {
        let ep = self.endpoints().into_iter().find(|e| e.addr == addr)?;
        Some(if ep.framed.usable(self.options.transport) { ep.framed.describe() } else { "grpc" })
    }

    /// The version to read `table` at (see the crate docs), with its placement.
    fn pick(&self, table: &str) -> Result<Placement> {
        let infos = self.infos.lock();
        // version → (num_shards, dim, per shard: (ready endpoints, draining endpoints))
        type Shards = Vec<(Vec<usize>, Vec<usize>)>;
        let mut versions: BTreeMap<u64, (u32, u32, Shards)> = BTreeMap::new();
        for (i, info) in infos.iter().enumerate() {
            let Some(info) = info else { continue };
            if !self.endpoint(i).healthy.load(Ordering::Relaxed) {
                continue;
            }
            for h in info.held.iter().filter(|h| h.table == table) {
                let state = h.state();
                if !matches!(state, State::Ready | State::Draining) || h.shard >= h.num_shards {
                    continue;
                }
                let entry = versions.entry(h.version).or_insert_with(|| {
                    (h.num_shards, h.embedding_dim, vec![(vec![], vec![]); h.num_shards as usize])
                });
                if entry.0 != h.num_shards {
                    continue; // a server disagreeing on the shard count is not used
                }
                let slot = &mut entry.2[h.shard as usize];
                if state == State::Ready {
                    slot.0.push(i);
                } else {
                    slot.1.push(i);
                }
            }
        }
        let complete = |shards: &Shards| shards.iter().all(|(r, d)| !r.is_empty() || !d.is_empty());
        let capacity = |shards: &Shards| shards.iter().map(|(r, _)| r.len()).min().unwrap_or(0);
        let pinned = self.pinned.lock().get(table).copied();
        let floor = pinned
            .and_then(|v| versions.get(&v))
            .filter(|(_, _, s)| complete(s))
            .map(|(_, _, s)| capacity(s));
        let chosen = versions
            .iter()
            .rev()
            .filter(|(_, (_, _, s))| complete(s))
            .find(|(_, (_, _, s))| floor.is_none_or(|f| capacity(s) >= f))
            .or_else(|| pinned.and_then(|v| versions.get_key_value(&v)));
        let Some((&version, (num_shards, dim, shards))) = chosen else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("no complete version of table '{table}' is served by a healthy server"),
            ));
        };
        Ok(Placement {
            version,
            num_shards: *num_shards,
            embedding_dim: *dim,
            replicas: shards.clone(),
        })
    }

    /// The rows of `ids` in `table`, all at one version (see the crate docs). Fails with
    /// `TableNotFound` when no server holds the table, `Unavailable` when no complete version
    /// can be read within the deadline and the restarts, and with the server's error for a bad
    /// request.
    pub async fn lookup(&self, table: &str, ids: &[u64]) -> Result<Rows> {
        let deadline = self.options.deadline;
        match tokio::time::timeout(deadline, self.lookup_inner(table, ids)).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("lookup in table '{table}' passed its deadline of {deadline:?}"),
            )),
        }
    }

    async fn lookup_inner(&self, table: &str, ids: &[u64]) -> Result<Rows> {
        let mut last = None;
        for attempt in 0..=self.options.max_restarts {
            let stale = self.refreshed.lock().elapsed() >= self.options.refresh_every;
            if attempt > 0 || stale {
                self.refresh().await;
            }
            let place = match self.pick(table) {
                Ok(p) => p,
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            match self.read_at(table, ids, &place).await {
                Ok(rows) => {
                    self.pinned.lock().insert(table.to_string(), place.version);
                    return Ok(rows);
                }
                Err(Retry::Restart(e)) => last = Some(e),
                Err(Retry::Fail(e)) => return Err(e),
            }
        }
        if !self.known(table) {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("no server holds table '{table}'"),
            ));
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorKind::Unavailable, "lookup failed")))
    }

    /// Servers that hold shard `shard` of `num_shards` of `table` at any version, rotated by
    /// one on every call (the placement of a client with the protocol off).
    fn any_version(&self, table: &str, shard: u32, num_shards: u32) -> Vec<usize> {
        let infos = self.infos.lock();
        let mut order: Vec<usize> = (0..infos.len())
            .filter(|&i| {
                infos[i].as_ref().is_some_and(|info| {
                    info.held.iter().any(|h| {
                        h.table == table
                            && h.shard == shard
                            && h.num_shards == num_shards
                            && matches!(h.state(), State::Ready | State::Draining)
                    })
                })
            })
            .collect();
        if !order.is_empty() {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed) % order.len();
            order.rotate_left(turn);
        }
        order
    }

    /// Whether some server's info names `table`.
    fn known(&self, table: &str) -> bool {
        self.infos.lock().iter().flatten().any(|i| i.held.iter().any(|h| h.table == table))
    }

    /// One attempt at version `place.version`: every shard's ids at once, one request per
    /// server (see [`Client::plan`]). A request for several shards that no replica could
    /// answer is split, in the same attempt, into one per shard sent to their other replicas.
    async fn read_at(
        &self,
        table: &str,
        ids: &[u64],
        place: &Placement,
    ) -> std::result::Result<Rows, Retry> {
        let d = place.embedding_dim as usize;
        let shard_of: Vec<u32> =
            ids.iter().map(|&id| shard_of_key(id, place.num_shards as usize) as u32).collect();
        let mut pending = self.plan(table, ids, &shard_of, place);
        let mut values = Vec::new();
        let mut found = vec![false; ids.len()];
        let mut outcome = Ok(());
        while !pending.is_empty() {
            // One request holding the whole batch, answered over the framed path: its rows are
            // the batch's as they came off the socket (no copy).
            let whole = pending.len() == 1 && pending[0].keys.len() == ids.len();
            // The calls run concurrently in this task (no task per call: a batch of a few ids
            // is all fixed cost, and each hand-off to another worker adds a wake-up).
            let calls = pending.iter().map(|call| {
                let req = LookupRequest {
                    table: table.to_string(),
                    version: if self.options.consistent { place.version } else { 0 },
                    shard: call.shards[0],
                    num_shards: place.num_shards,
                    ids: call.keys.clone(),
                    known_gen: 0,
                    more_shards: call.shards[1..].to_vec(),
                };
                let known: Vec<u64> = {
                    let infos = self.infos.lock();
                    call.order.iter().map(|&i| infos[i].as_ref().map_or(0, |x| x.gen)).collect()
                };
                let endpoints: Vec<Arc<Endpoint>> =
                    call.order.iter().map(|&i| self.endpoint(i).clone()).collect();
                let how = How {
                    token: self.options.token.clone(),
                    limit: answer_limit(call.keys.len(), d),
                    transport: self.options.transport,
                    tls: self.framed_tls.clone(),
                    deadline: self.options.deadline,
                };
                shard_call(endpoints, known, req, how)
            });
            let results = futures_util::future::join_all(calls).await;
            let mut split = Vec::new();
            for (call, result) in pending.iter().zip(results) {
                for (i, info) in &result.infos {
                    self.learn(call.order[*i], info.clone());
                }
                let failed: Vec<usize> = result.failed.iter().map(|&i| call.order[i]).collect();
                for &e in &failed {
                    self.endpoint(e).healthy.store(false, Ordering::Relaxed);
                }
                let shards = &call.shards;
                let resp = match result.outcome {
                    Ok(resp) => resp,
                    Err(Retry::Restart(_)) if shards.len() > 1 => {
                        split.extend(call.split(&shard_of, |s| {
                            let mut order = self.replica_order(table, s as usize, place);
                            order.retain(|e| !failed.contains(e));
                            order
                        }));
                        continue;
                    }
                    Err(e) => {
                        if outcome.is_ok() || matches!(e, Retry::Fail(_)) {
                            outcome = Err(e);
                        }
                        continue;
                    }
                };
                let malformed = || {
                    Retry::Fail(Error::new(
                        ErrorKind::Corruption,
                        format!("a malformed answer for shards {shards:?} of table '{table}'"),
                    ))
                };
                let version_ok = resp.version() == place.version || !self.options.consistent;
                if whole && values.is_empty() {
                    if let Answer::Framed(f) = resp {
                        if version_ok && f.dim == d && f.values.len() == ids.len() * d {
                            values = f.values;
                            for (to, &b) in found.iter_mut().zip(&f.found) {
                                *to = b != 0;
                            }
                        } else {
                            outcome = Err(malformed());
                        }
                        continue;
                    }
                }
                if values.is_empty() {
                    values = vec![0f32; ids.len() * d];
                }
                if !place_rows(&resp, &call.positions, d, version_ok, &mut values, &mut found) {
                    outcome = Err(malformed());
                }
            }
            pending = split;
        }
        outcome?;
        values.resize(ids.len() * d, 0.0);
        Ok(Rows { values, found, embedding_dim: d, version: place.version })
    }

    /// The requests of one attempt: the shards the batch's ids fall in, grouped by the server
    /// each would be sent to first, when that server reads several shards in one request
    /// (`ServerInfo.spans_shards`); a group's replicas are those that hold all its shards.
    /// Each request's ids keep their batch order.
    fn plan(&self, table: &str, ids: &[u64], shard_of: &[u32], place: &Placement) -> Vec<Call> {
        let spans: Vec<bool> =
            self.infos.lock().iter().map(|i| i.as_ref().is_some_and(|i| i.spans_shards)).collect();
        let mut present = vec![false; place.num_shards as usize];
        for &s in shard_of {
            present[s as usize] = true;
        }
        let mut calls: Vec<Call> = Vec::new();
        let mut call_of = vec![usize::MAX; present.len()];
        let mut by_server: HashMap<usize, usize> = HashMap::new();
        for s in (0..present.len()).filter(|&s| present[s]) {
            let order = self.replica_order(table, s, place);
            let first = order.first().copied().filter(|&e| spans.get(e) == Some(&true));
            match first.and_then(|e| by_server.get(&e).copied()) {
                Some(c) => {
                    calls[c].shards.push(s as u32);
                    calls[c].order.retain(|e| order.contains(e));
                    call_of[s] = c;
                }
                None => {
                    if let Some(e) = first {
                        by_server.insert(e, calls.len());
                    }
                    call_of[s] = calls.len();
                    calls.push(Call { shards: vec![s as u32], order, ..Call::default() });
                }
            }
        }
        for (pos, (&id, &s)) in ids.iter().zip(shard_of).enumerate() {
            let call = &mut calls[call_of[s as usize]];
            call.keys.push(id);
            call.positions.push(pos);
        }
        calls
    }

    /// Whom to ask for shard `s`, in turn: READY replicas by fewest requests in flight, then
    /// the DRAINING ones. With the protocol off: every server holding the shard at any version
    /// (a client that knows shards but not versions).
    fn replica_order(&self, table: &str, s: usize, place: &Placement) -> Vec<usize> {
        if !self.options.consistent {
            return self.any_version(table, s as u32, place.num_shards);
        }
        let (ready, draining) = &place.replicas[s];
        let mut order = ready.clone();
        order.sort_by_key(|&i| self.endpoint(i).outstanding.load(Ordering::Relaxed));
        order.extend(draining);
        order
    }
}

/// One request of a batch: the shards it reads (the first is the request's `shard`), the
/// replicas to try in turn (indices into the client's endpoints), and its ids with their
/// positions in the batch, in batch order.
#[derive(Debug, Default)]
struct Call {
    shards: Vec<u32>,
    order: Vec<usize>,
    keys: Vec<u64>,
    positions: Vec<usize>,
}

impl Call {
    /// One call per shard of this one (`shard_of`: the batch's shard of each position), each
    /// to the replicas `order` names for it.
    fn split(&self, shard_of: &[u32], order: impl Fn(u32) -> Vec<usize>) -> Vec<Call> {
        let mut out: Vec<Call> = self
            .shards
            .iter()
            .map(|&s| Call { shards: vec![s], order: order(s), ..Call::default() })
            .collect();
        for (&id, &pos) in self.keys.iter().zip(&self.positions) {
            let i = self.shards.iter().position(|&s| s == shard_of[pos]).expect("a call's shard");
            out[i].keys.push(id);
            out[i].positions.push(pos);
        }
        out
    }
}

/// Copies a shard's answer into its batch positions of `values`/`found` (rows of `d`). The
/// frame's size (and its version, `version_ok`) is checked once, before any row moves; `false`
/// when it is malformed (nothing is copied).
fn place_rows(
    resp: &Answer,
    positions: &[usize],
    d: usize,
    version_ok: bool,
    values: &mut [f32],
    found: &mut [bool],
) -> bool {
    match resp {
        Answer::Grpc(resp) => {
            let well_formed = resp.values.len() == positions.len() * d * 4
                && version_ok
                && resp.found.len() == positions.len();
            if !well_formed {
                return false;
            }
            for (j, &pos) in positions.iter().enumerate() {
                let row = &resp.values[j * d * 4..][..d * 4];
                embstore_proto::copy_row(row, &mut values[pos * d..][..d]);
                found[pos] = resp.found[j] != 0;
            }
        }
        Answer::Framed(f) => {
            let well_formed = f.values.len() == positions.len() * d
                && f.dim == d
                && version_ok
                && f.found.len() == positions.len();
            if !well_formed {
                return false;
            }
            for (j, &pos) in positions.iter().enumerate() {
                values[pos * d..][..d].copy_from_slice(&f.values[j * d..][..d]);
                found[pos] = f.found[j] != 0;
            }
        }
    }
    true
}

/// One shard's answer, by the transport that carried it.
#[derive(Debug)]
enum Answer {
    Grpc(LookupResponse),
    Framed(framed::FramedRows),
}

impl Answer {
    fn version(&self) -> u64 {
        match self {
            Answer::Grpc(r) => r.version,
            Answer::Framed(f) => f.version,
        }
    }
}

/// How a shard call is made: the token, the most bytes of a gRPC answer read, the transport,
/// the framed path's TLS, and the deadline of a connect.
struct How {
    token: Option<String>,
    limit: usize,
    transport: Transport,
    tls: Option<framed::Tls>,
    deadline: Duration,
}

/// What a failed attempt means for the batch.
#[derive(Debug)]
enum Retry {
    /// No replica of a shard could answer for the version: start again with a fresh pick.
    Restart(Error),
    /// The request itself is bad (or the answer malformed): no retry helps.
    Fail(Error),
}

/// What one shard's tries gave: the answer or why not, the infos learnt (by index into the
/// replica order) and the replicas that failed at the transport.
struct ShardResult {
    outcome: std::result::Result<Answer, Retry>,
    infos: Vec<(usize, ServerInfo)>,
    failed: Vec<usize>,
}

/// Bytes of an answer beyond its rows and found flags that a client decodes: the server's
/// `ServerInfo` (about 50 bytes per version held) and framing.
const ANSWER_SLACK: usize = 4 << 20;

/// The most bytes a client decodes of the answer to a lookup of `ids` ids of dim `dim`: its
/// rows (`4·dim` bytes each), found flags and the server's info. Sized per call, so that an
/// answer of any batch the server takes is read, and nothing larger is buffered.
fn answer_limit(ids: usize, dim: usize) -> usize {
    ids.saturating_mul(dim.saturating_mul(4).saturating_add(1)).saturating_add(ANSWER_SLACK)
}

/// Tries the replicas of one shard in order until one answers; `known[i]` is the `gen` of
/// replica `i`'s info the client holds (it answers without its info when that is current);
/// `limit` is the most bytes of an answer read (see [`answer_limit`]).
async fn shard_call(
    replicas: Vec<Arc<Endpoint>>,
    known: Vec<u64>,
    mut req: LookupRequest,
    how: How,
) -> ShardResult {
    let mut out = ShardResult {
        outcome: Err(Retry::Restart(Error::new(ErrorKind::Unavailable, "no replica"))),
        infos: Vec::new(),
        failed: Vec::new(),
    };
    for (i, ep) in replicas.iter().enumerate() {
        req.known_gen = known[i];
        ep.outstanding.fetch_add(1, Ordering::Relaxed);
        let answer = call(ep, &req, &how).await;
        ep.outstanding.fetch_sub(1, Ordering::Relaxed);
        match answer {
            Ok((resp, info)) => {
                if let Some(info) = info {
                    out.infos.push((i, info));
                }
                out.outcome = Ok(resp);
                return out;
            }
            Err(status) => {
                if let Ok(info) = ServerInfo::decode(status.details()) {
                    if !info.instance.is_empty() {
                        out.infos.push((i, info));
                    }
                }
                match status.code() {
                    // Not (or no longer) held there: the view was stale.
                    Code::FailedPrecondition | Code::NotFound => {
                        out.outcome = Err(Retry::Restart(from_status(&status)));
                    }
                    // A connection that broke mid-call (the server died) surfaces as an
                    // internal h2 error: that replica failed, not the request.
                    Code::Internal if status.message().starts_with("h2 protocol error") => {
                        out.failed.push(i);
                        out.outcome = Err(Retry::Restart(from_status(&status)));
                    }
                    Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Unknown
                    | Code::Cancelled => {
                        out.failed.push(i);
                        out.outcome = Err(Retry::Restart(from_status(&status)));
                    }
                    _ => {
                        out.outcome = Err(Retry::Fail(from_status(&status)));
                        return out;
                    }
                }
            }
        }
    }
    out
}

/// One lookup at one replica, over the framed path where it is offered (gRPC when its port
/// does not accept connections and the transport is `Auto`), else over gRPC: the answer and the
/// server info it carried, or the status either transport failed with.
async fn call(
    ep: &Endpoint,
    req: &LookupRequest,
    how: &How,
) -> std::result::Result<(Answer, Option<ServerInfo>), tonic::Status> {
    let token = how.token.as_deref();
    if ep.framed.usable(how.transport) {
        match ep.framed.lookup(req, token, how.tls.as_ref(), how.deadline).await {
            Ok(mut rows) => {
                let info = rows.info.take();
                return Ok((Answer::Framed(rows), info));
            }
            Err(framed::FramedError::Call(status)) => return Err(status),
            Err(framed::FramedError::Connect(status)) if how.transport == Transport::Framed => {
                return Err(status)
            }
            Err(framed::FramedError::Connect(_)) => {}
        }
    }
    let mut rpc = ep.rpc.clone().max_decoding_message_size(how.limit);
    let mut resp = rpc.lookup(request(req.clone(), token)).await?.into_inner();
    let info = resp.info.take();
    Ok((Answer::Grpc(resp), info))
}

/// `token` without surrounding whitespace (a token read from a file, or typed, often ends in
/// a newline), checked to be one a header can carry.
fn checked_token(token: &str) -> Result<String> {
    let t = token.trim();
    if t.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, "the token is empty"));
    }
    if !t.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "the token holds characters a header cannot carry (printable ascii only)",
        ));
    }
    Ok(t.to_string())
}
