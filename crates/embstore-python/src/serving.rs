//! The batch-query service from Python: `Server` (what `embstore serve` runs) and `Client`
//! (what `embstore.connect` returns). Each owns a tokio runtime; every blocking call releases
//! the GIL.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use embstore_client::{Client, ClientOptions};
use embstore_server::Server;
use embstore_table::{Error, ErrorKind, Store, StoreOptions};
use numpy::{IntoPyArray, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tokio::sync::watch;

use crate::detached;
use crate::table::{slice, to_py_err};
use crate::tls::{client_tls, serving_tls, sync_client_tls, TlsPaths};

fn runtime(threads: usize) -> PyResult<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| to_py_err(Error::new(ErrorKind::Io, format!("start a tokio runtime: {e}"))))
}

/// A server: of every table of a store directory (static mode: each table is version 1, shard
/// 0 of 1), or empty, to be loaded through admin calls. `run()` serves until SIGINT, SIGTERM or
/// `stop()`.
#[pyclass(module = "embstore._native", name = "Server", frozen)]
pub(crate) struct PyServer {
    runtime: tokio::runtime::Runtime,
    server: Arc<Server>,
    listener: parking_lot::Mutex<Option<tokio::net::TcpListener>>,
    metrics: parking_lot::Mutex<Option<tokio::net::TcpListener>>,
    /// The framed lookup path's listeners (TCP port, Unix socket), served by `run()`.
    fast: parking_lot::Mutex<Vec<embstore_server::FastListener>>,
    fast_address: Option<String>,
    address: String,
    metrics_address: Option<String>,
    stop: watch::Sender<bool>,
    options: embstore_server::ServeOptions,
    /// Membership in a cluster in etcd, joined by `run()`.
    member: Option<embstore_server::member::MemberOptions>,
    _store: Option<Arc<Store>>,
    /// The sync port (`--sync-listen`) and the follower (`--follow`), if any.
    sync: Option<embstore_sync::SyncServer>,
    follower: Option<embstore_sync::Follower>,
    directory: Option<Arc<embstore_sync::Directory>>,
    /// How long `run()` waits for the follower to catch up before serving (`None`: it serves
    /// at once).
    catch_up: Option<Duration>,
    /// The data dir this server made for itself (no `data_dir` given): removed with it.
    _scratch: Option<Scratch>,
}

/// A directory removed when dropped.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// The steps of `Server(...)` (PyServer::new), in the order it takes them.

/// The lease TTL of a cluster member: at least a second.
fn lease_ttl(seconds: f64) -> PyResult<Duration> {
    if !(seconds.is_finite() && seconds >= 1.0) {
        return Err(to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("lease_ttl_s must be at least 1 second, got {seconds}"),
        )));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Refuses a store directory that holds no store, except where a follower creates its copy
/// (`follow`): a directory that does not exist yet, or an empty one.
fn check_store_dir(dir: &std::path::Path, follow: bool) -> PyResult<()> {
    if dir.join("MANIFEST").is_file() {
        return Ok(());
    }
    let refuse = |why: String| Err(to_py_err(Error::new(ErrorKind::InvalidArgument, why)));
    if !follow {
        return refuse(format!("{} holds no store (no MANIFEST)", dir.display()));
    }
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(true) => Ok(()),
        Ok(false) => refuse(format!(
            "{} holds no store (no MANIFEST) and is not empty: a follower keeps its copy in a \
             new or empty directory, or in the store it kept there before",
            dir.display()
        )),
        Err(e) => refuse(format!("cannot use {} as the follower's store: {e}", dir.display())),
    }
}

/// Where budgeted shards are loaded: `data_dir`, or without one, a scratch directory this
/// server removes when it goes. `None` without a budget (shards are loaded into memory).
fn tier_options(
    budget: Option<Arc<embstore_table::Budget>>,
    data_dir: Option<std::path::PathBuf>,
) -> (Option<embstore_server::TierOptions>, Option<Scratch>) {
    let scratch = match (&budget, &data_dir) {
        (Some(_), None) => Some(Scratch(
            std::env::temp_dir().join(format!("embstore-serve-{}", std::process::id())),
        )),
        _ => None,
    };
    let tier = budget.map(|budget| embstore_server::TierOptions {
        dir: data_dir.or_else(|| scratch.as_ref().map(|s| s.0.clone())).unwrap_or_default(),
        budget,
    });
    (tier, scratch)
}

/// The listeners a server binds.
type Listeners = (tokio::net::TcpListener, Option<tokio::net::TcpListener>);

/// Opens the store at `store_dir` (under `budget`, if any) and binds `listen` and `metrics`,
/// without the GIL.
fn open_and_bind(
    py: Python<'_>,
    runtime: &tokio::runtime::Runtime,
    store_dir: Option<&std::path::Path>,
    budget: Option<Arc<embstore_table::Budget>>,
    listen: &str,
    metrics: Option<&str>,
    replica: u32,
) -> PyResult<(Option<Arc<Store>>, Listeners)> {
    detached(py, || -> embstore_table::Result<_> {
        let mut options = StoreOptions::default().with_replica(replica);
        if let Some(b) = &budget {
            options = options.with_shared_budget(b.clone());
        }
        let store = match store_dir {
            Some(dir) => Some(Arc::new(Store::open_with_options(
                dir,
                &options,
                Arc::new(embstore_table::disk::vfs::RealFs),
            )?)),
            None => None,
        };
        let bind = |addr: &str| {
            runtime.block_on(tokio::net::TcpListener::bind(addr)).map_err(|e| {
                Error::new(ErrorKind::InvalidArgument, format!("cannot listen on {addr}: {e}"))
            })
        };
        let listeners: Listeners = (bind(listen)?, metrics.map(bind).transpose()?);
        Ok((store, listeners))
    })
    .map_err(to_py_err)
}

/// Binds the framed lookup path: `fast_listen` "auto" (the serving address's host, a free
/// port), "" or "off" (none), or `host:port`; and the Unix socket `fast_unix`, if given.
fn bind_fast(
    py: Python<'_>,
    runtime: &tokio::runtime::Runtime,
    serving: &tokio::net::TcpListener,
    fast_listen: Option<&str>,
    fast_unix: Option<std::path::PathBuf>,
) -> PyResult<Vec<embstore_server::FastListener>> {
    let addr = match fast_listen {
        None | Some("" | "off") => None,
        Some("auto") => {
            let ip = serving.local_addr().map_err(|e| invalid(&e.to_string()))?.ip();
            Some(if ip.is_ipv6() { format!("[{ip}]:0") } else { format!("{ip}:0") })
        }
        Some(a) => Some(a.to_string()),
    };
    detached(py, || {
        let mut out = Vec::new();
        if let Some(a) = addr {
            let l = runtime.block_on(embstore_server::FastListener::tcp(&a)).map_err(|e| {
                Error::new(ErrorKind::InvalidArgument, format!("cannot listen on {a}: {e}"))
            })?;
            out.push(l);
        }
        if let Some(path) = fast_unix {
            let l = runtime
                .block_on(async { embstore_server::FastListener::unix(&path) })
                .map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        format!("cannot listen on the unix socket {}: {e}", path.display()),
                    )
                })?;
            out.push(l);
        }
        Ok(out)
    })
    .map_err(to_py_err)
}

/// A random replica id (1..2^31): every replica of a table needs its own.
fn random_replica() -> u32 {
    let seed = embstore_common::now_ms() ^ (u64::from(std::process::id()) << 32);
    1 + (embstore_common::fmix64(seed) % u64::from(embstore_table::MAX_REPLICA)) as u32
}

/// The sync flags of `embstore serve` (docs/dissemination.md).
#[derive(Default)]
pub(crate) struct SyncArgs {
    /// `--sync-listen`: serve a sync port there.
    listen: Option<String>,
    /// `--sync-advertise`: the address others dial (default: the bound one).
    advertise: Option<String>,
    /// `--sync-token-file`'s token.
    token: Option<String>,
    /// `--follow HOST:PORT`, or `Some("")` for `--follow` through etcd.
    follow: Option<String>,
    /// `--sync-events`.
    events: Option<std::path::PathBuf>,
    /// `--etcd` with `--dc`: register there, and find sources there.
    etcd: Option<Vec<String>>,
    dc: Option<String>,
    /// The serving TLS, which the sync port takes too.
    server_tls: Option<embstore_sync::ServerTls>,
    /// `--sync-tls-*`: TLS to the source followed.
    client_tls: Option<embstore_sync::ClientTls>,
    /// `--sync-no-cache`, `--sync-no-shard-versions` (for measuring what each gains).
    use_cache: bool,
    skip_by_sv: bool,
    /// `--sync-with-state`: take optimizer state too.
    with_state: bool,
    /// `--sync-tombstone-horizon`, in ms.
    tombstone_horizon_ms: u64,
}

/// What [`start_sync`] started.
#[derive(Default)]
struct Synced {
    server: Option<embstore_sync::SyncServer>,
    follower: Option<embstore_sync::Follower>,
    directory: Option<Arc<embstore_sync::Directory>>,
}

fn invalid(msg: &str) -> PyErr {
    to_py_err(Error::new(ErrorKind::InvalidArgument, msg))
}

/// Starts the sync port of `store`, its registration in etcd, and a follower into it (which
/// creates the source's tables before the server hosts them).
fn start_sync(py: Python<'_>, store: Option<&Arc<Store>>, a: SyncArgs) -> PyResult<Synced> {
    if a.etcd.is_some() != a.dc.is_some() {
        return Err(invalid("syncing through etcd needs both etcd and dc"));
    }
    let through_etcd = a.follow.as_deref() == Some("");
    if through_etcd && a.etcd.is_none() {
        return Err(invalid(
            "follow without an address finds its source in etcd: give etcd and dc",
        ));
    }
    let Some(store) = store else {
        if a.listen.is_some() || a.etcd.is_some() {
            return Err(invalid("sync_listen needs a store (store_dir) or a source to follow"));
        }
        return Ok(Synced::default());
    };
    detached(py, || {
        let mut out = Synced::default();
        let follow_options = embstore_sync::FollowOptions {
            token: a.token.clone().unwrap_or_default(),
            events: a.events.clone(),
            tls: a.client_tls.clone(),
            skip_by_sv: a.skip_by_sv,
            with_state: a.with_state,
            // The flags of the sync port this store may also serve (a DC's leader).
            sync: embstore_table::sync::SyncOptions {
                use_cache: a.use_cache,
                tombstone_horizon_ms: a.tombstone_horizon_ms,
                ..Default::default()
            },
            ..embstore_sync::FollowOptions::default()
        };
        // A follower of a fixed source creates its tables first (with the source's layout),
        // then serves them.
        if let Some(source) = a.follow.as_deref().filter(|s| !s.is_empty()) {
            let f = embstore_sync::Follower::start(store.clone(), source, follow_options.clone());
            out.follower = Some(f?);
        }
        if let Some(addr) = &a.listen {
            let options = embstore_sync::ServeOptions {
                token: a.token.clone(),
                // A follower's rows on disk prove nothing about what it knows (see
                // `SyncOptions::knowledge_from_rows`).
                sync: store.sync_options().unwrap_or(embstore_table::sync::SyncOptions {
                    knowledge_from_rows: a.follow.is_none(),
                    use_cache: a.use_cache,
                    tombstone_horizon_ms: a.tombstone_horizon_ms,
                    ..Default::default()
                }),
                tls: a.server_tls.clone(),
            };
            out.server = Some(embstore_sync::SyncServer::start(store.clone(), addr, options)?);
        }
        if let (Some(etcd), Some(dc)) = (&a.etcd, &a.dc) {
            let addr =
                a.advertise.clone().or_else(|| out.server.as_ref().map(|s| s.addr().to_string()));
            let me = embstore_sync::Member {
                dc: dc.clone(),
                replica: store.replica(),
                addr: addr.unwrap_or_default(),
                primary: a.follow.is_none(),
                status: String::new(),
            };
            let dir =
                embstore_sync::Directory::start(etcd, me, embstore_sync::discovery::DEFAULT_TTL)?;
            if a.follow.is_none() {
                let s = store.clone();
                dir.set_report(Box::new(move || {
                    format!("primary tables={}", s.tables().join(","))
                }));
            }
            if through_etcd {
                let source = embstore_sync::Source::Directory(dir.clone());
                out.follower = Some(embstore_sync::Follower::start_with(
                    store.clone(),
                    source,
                    follow_options,
                )?);
            }
            out.directory = Some(dir);
        }
        Ok(out)
    })
    .map_err(to_py_err)
}

/// A followed table's status as `/metrics` shows it.
fn followed(s: &embstore_sync::TableSync) -> embstore_server::Followed {
    embstore_server::Followed {
        table: s.table.clone(),
        source: s.source.clone(),
        connected: s.connected,
        caught_up: s.caught_up,
        parts_pending: s.parts_pending as u64,
        lag_ms_p50: s.lag_ms_p50,
        lag_ms_p99: s.lag_ms_p99,
        rows_applied: s.rows_applied,
        bytes_in: s.bytes_in,
        errors: s.errors,
    }
}

/// The address `listener` is bound to (port 0 resolved).
fn local_address(listener: &tokio::net::TcpListener) -> PyResult<String> {
    let addr = listener.local_addr();
    Ok(addr.map_err(|e| to_py_err(Error::new(ErrorKind::Io, e.to_string())))?.to_string())
}

/// The server named `address`, budgeted when `tier` is given, hosting every table of `store`
/// as version 1, shard 0 of 1 (static mode).
fn hosting(
    address: &str,
    max_batch: usize,
    tier: Option<embstore_server::TierOptions>,
    store: Option<&Store>,
) -> PyResult<Arc<Server>> {
    let server = match tier {
        Some(tier) => Server::with_tier(address, max_batch, tier).map_err(to_py_err)?,
        None => Server::new(address, max_batch),
    };
    for name in store.map(|s| s.tables()).unwrap_or_default() {
        let table = store.expect("listed").table(&name).map_err(to_py_err)?;
        server.host(&name, 1, 0, 1, table).map_err(to_py_err)?;
    }
    Ok(server)
}

#[pymethods]
impl PyServer {
    #[new]
    #[pyo3(signature = (store_dir, listen, memory_budget_bytes=None, max_batch=embstore_server::DEFAULT_MAX_BATCH, admin=false, metrics=None, read_token=None, admin_token=None, tls_cert=None, tls_key=None, tls_client_ca=None, etcd=None, advertise=None, lease_ttl_s=10.0, data_dir=None, sync_listen=None, sync_token=None, follow=None, replica=None, sync_events=None, sync_etcd=None, dc=None, sync_advertise=None, sync_tls_ca=None, sync_tls_cert=None, sync_tls_key=None, sync_tls_domain=None, sync_cache=true, sync_shard_versions=true, sync_tombstone_horizon_ms=3_600_000, sync_with_state=false, catch_up_timeout_s=60.0, fast_listen=Some("auto".to_string()), fast_unix=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store_dir: Option<std::path::PathBuf>,
        listen: String,
        memory_budget_bytes: Option<u64>,
        max_batch: usize,
        admin: bool,
        metrics: Option<String>,
        read_token: Option<String>,
        admin_token: Option<String>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_client_ca: Option<std::path::PathBuf>,
        etcd: Option<Vec<String>>,
        advertise: Option<String>,
        lease_ttl_s: f64,
        data_dir: Option<std::path::PathBuf>,
        sync_listen: Option<String>,
        sync_token: Option<String>,
        follow: Option<String>,
        replica: Option<u32>,
        sync_events: Option<std::path::PathBuf>,
        sync_etcd: Option<Vec<String>>,
        dc: Option<String>,
        sync_advertise: Option<String>,
        sync_tls_ca: Option<std::path::PathBuf>,
        sync_tls_cert: Option<std::path::PathBuf>,
        sync_tls_key: Option<std::path::PathBuf>,
        sync_tls_domain: Option<String>,
        sync_cache: bool,
        sync_shard_versions: bool,
        sync_tombstone_horizon_ms: u64,
        sync_with_state: bool,
        catch_up_timeout_s: f64,
        fast_listen: Option<String>,
        fast_unix: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        if !(0.0..=86_400.0).contains(&catch_up_timeout_s) {
            return Err(invalid("catch_up_timeout_s must be in 0..=86400 seconds"));
        }
        let lease_ttl = lease_ttl(lease_ttl_s)?;
        let tls = serving_tls(tls_cert, tls_key, tls_client_ca)?;
        if let Some(dir) = &store_dir {
            // A follower (not a roll cluster's member, which takes no directory) creates it.
            check_store_dir(dir, follow.is_some() && etcd.is_none())?;
        }
        let runtime = runtime(2)?;
        // One budget for the store's tables and every shard loaded later.
        let budget = memory_budget_bytes.map(embstore_table::Budget::shared).transpose();
        let budget = budget.map_err(to_py_err)?;
        let (tier, scratch) = tier_options(budget.clone(), data_dir);
        let (store, (listener, metrics)) = open_and_bind(
            py,
            &runtime,
            store_dir.as_deref(),
            budget,
            &listen,
            metrics.as_deref(),
            replica.unwrap_or(if follow.is_some() { random_replica() } else { 0 }),
        )?;
        // A cluster member that follows a source keeps the versions rolls load current (a roll
        // replaces the base; sync continues on top): its follower starts once it serves.
        let mut follow = follow;
        let roll_follow = if etcd.is_some() && follow.as_deref().is_some_and(|f| !f.is_empty()) {
            if store_dir.is_some() {
                return Err(invalid(
                    "a cluster member that follows syncs the versions rolls load: it takes no \
                     store directory",
                ));
            }
            follow.take()
        } else {
            None
        };
        // A follower without a store directory holds its copy in memory.
        let store = match (store, &follow) {
            (None, Some(_)) => {
                let r = replica.unwrap_or_else(random_replica);
                Some(Arc::new(Store::with_replica(r).map_err(to_py_err)?))
            }
            (store, _) => store,
        };
        let fast = bind_fast(py, &runtime, &listener, fast_listen.as_deref(), fast_unix)?;
        let fast_address = fast.iter().find_map(|l| match l {
            embstore_server::FastListener::Tcp(t) => t.local_addr().ok().map(|a| a.to_string()),
            embstore_server::FastListener::Unix(..) => None,
        });
        let client_tls =
            sync_client_tls(sync_tls_ca, sync_tls_cert, sync_tls_key, sync_tls_domain)?;
        let (sync_args_token, sync_args_events, sync_args_tls) =
            (sync_token.clone(), sync_events.clone(), client_tls.clone());
        let sync_args = SyncArgs {
            listen: sync_listen,
            advertise: sync_advertise,
            token: sync_token,
            follow,
            events: sync_events,
            etcd: sync_etcd,
            dc,
            server_tls: tls.clone(),
            client_tls,
            use_cache: sync_cache,
            skip_by_sv: sync_shard_versions,
            with_state: sync_with_state,
            tombstone_horizon_ms: sync_tombstone_horizon_ms,
        };
        let synced = start_sync(py, store.as_ref(), sync_args)?;
        let metrics_address =
            metrics.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string());
        // A cluster member is known by the address clients dial: --advertise, or the bound
        // address (port 0 resolved).
        let address = advertise.unwrap_or(local_address(&listener)?);
        let member = etcd.map(|e| {
            let mut m = embstore_server::member::MemberOptions::new(e, &address);
            m.lease_ttl = lease_ttl;
            m
        });
        let server = hosting(&address, max_batch, tier, store.as_deref())?;
        // A follower of live tables serves once caught up; one that keeps rolled-in versions
        // current serves what rolls load (each catches up from its load on).
        let catch_up = (catch_up_timeout_s > 0.0 && roll_follow.is_none())
            .then(|| Duration::from_secs_f64(catch_up_timeout_s));
        let follower = match roll_follow {
            Some(source) => {
                let r = replica.unwrap_or_else(random_replica);
                let options = embstore_table::sync::SyncOptions {
                    knowledge_from_rows: false,
                    ..Default::default()
                };
                server.set_sync_loads(embstore_server::SyncLoads { replica: r, options });
                let follow_options = embstore_sync::FollowOptions {
                    token: sync_args_token.unwrap_or_default(),
                    events: sync_args_events,
                    tls: sync_args_tls,
                    skip_by_sv: sync_shard_versions,
                    with_state: sync_with_state,
                    flush_every: None,
                    ..embstore_sync::FollowOptions::default()
                };
                let (target, source) = (server.clone(), embstore_sync::Source::Fixed(source));
                let f = detached(py, || {
                    embstore_sync::Follower::start_into(target, source, follow_options)
                });
                Some(f.map_err(to_py_err)?)
            }
            None => synced.follower,
        };
        if let Some(view) = follower.as_ref().map(|f| f.status_view()) {
            server.set_followed(Box::new(move || view.status().iter().map(followed).collect()));
        }
        let (stop, _) = watch::channel(false);
        Ok(Self {
            runtime,
            server,
            listener: parking_lot::Mutex::new(Some(listener)),
            metrics: parking_lot::Mutex::new(metrics),
            fast: parking_lot::Mutex::new(fast),
            fast_address,
            address,
            metrics_address,
            stop,
            options: embstore_server::ServeOptions {
                // A cluster member takes the roll coordinator's admin calls.
                admin: admin || member.is_some(),
                tokens: embstore_server::Tokens { read: read_token, admin: admin_token },
                tls,
            },
            member,
            _store: store,
            sync: synced.server,
            follower,
            directory: synced.directory,
            catch_up,
            _scratch: scratch,
        })
    }

    /// `host:port` of the framed lookup path's TCP port (`fast_listen`), if it is offered.
    #[getter]
    fn fast_address(&self) -> Option<String> {
        self.fast_address.clone()
    }

    /// `host:port` of the sync port (`sync_listen`), if one runs.
    #[getter]
    fn sync_address(&self) -> Option<String> {
        self.sync.as_ref().map(|s| s.addr().to_string())
    }

    /// Where each followed table stands (empty when the server follows nothing).
    fn sync_status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        let all = self.follower.as_ref().map(|f| f.status()).unwrap_or_default();
        all.iter().map(|s| crate::sync::status_dict(py, s)).collect()
    }

    /// `host:port` the server listens on (the port the OS chose for port 0).
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// `host:port` of `GET /metrics`, if asked for.
    #[getter]
    fn metrics_address(&self) -> Option<String> {
        self.metrics_address.clone()
    }

    /// Names of the tables served (each as version 1).
    #[getter]
    fn tables(&self) -> Vec<String> {
        let mut names: Vec<String> = self.server.info().held.into_iter().map(|h| h.table).collect();
        names.dedup();
        names
    }

    /// Serves until SIGINT, SIGTERM or `stop()`; then stops accepting, finishes the requests
    /// in flight and returns. Once only.
    fn run(&self, py: Python<'_>) -> PyResult<()> {
        let listener = self.listener.lock().take().ok_or_else(|| {
            to_py_err(Error::new(ErrorKind::InvalidArgument, "this server has run already"))
        })?;
        let server = self.server.clone();
        let mut stop = self.stop.subscribe();
        let metrics = self.metrics.lock().take();
        let fast = std::mem::take(&mut *self.fast.lock());
        let member = self.member.clone();
        let directory = self.directory.clone();
        let catch_up = self.follower.as_ref().map(|f| f.status_view());
        let result = detached(py, || {
            self.runtime.block_on(async move {
                let member = match member {
                    Some(options) => {
                        let joined =
                            embstore_server::member::Member::join(server.clone(), options).await;
                        Some(Arc::new(joined.map_err(|e| {
                            Error::new(e.kind(), format!("cannot join the cluster: {e}"))
                        })?))
                    }
                    None => None,
                };
                let (quit_tx, quit_rx) = watch::channel(false);
                let quit_tx = Arc::new(quit_tx);
                let quit_on_return = quit_tx.clone();
                let quit = |mut rx: watch::Receiver<bool>| async move {
                    let _ = rx.wait_for(|q| *q).await;
                };
                // The metrics port takes the serving port's TLS settings.
                let metrics = metrics.map(|l| {
                    tokio::spawn(embstore_server::serve_metrics_with(
                        server.clone(),
                        l,
                        self.options.tls.clone(),
                        quit(quit_rx.clone()),
                    ))
                });
                let signals = async move {
                    let mut term =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                            .ok();
                    let term = async {
                        match term.as_mut() {
                            Some(t) => {
                                t.recv().await;
                            }
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                    let _ = quit_tx.send(true);
                };
                let signals = tokio::spawn(signals);
                if let (Some(view), Some(limit)) = (&catch_up, self.catch_up) {
                    // A joining or restarted replica would answer with missing or old rows:
                    // it serves once caught up, or after `limit` at most.
                    let mark = view.mark();
                    let mut q = quit_rx.clone();
                    let caught_up = tokio::time::timeout(limit, async {
                        while !view.caught_up_after(&mark) {
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                                _ = q.wait_for(|q| *q) => break,
                            }
                        }
                    })
                    .await;
                    if caught_up.is_err() {
                        let pending: usize = view.status().iter().map(|s| s.parts_pending).sum();
                        eprintln!(
                            "embstore serve: not caught up after {:.0} s ({pending} parts \
                             pending): serving what it holds",
                            limit.as_secs_f64()
                        );
                    }
                }
                let member = member.map(|m| tokio::spawn(m.run(quit(quit_rx.clone()))));
                let fast: Vec<_> = fast
                    .into_iter()
                    .map(|l| {
                        let (tokens, tls) = (self.options.tokens.clone(), self.options.tls.clone());
                        let q = quit(quit_rx.clone());
                        tokio::spawn(embstore_server::serve_fast(server.clone(), l, tokens, tls, q))
                    })
                    .collect();
                let served =
                    embstore_server::serve(server, listener, self.options.clone(), quit(quit_rx))
                        .await;
                signals.abort();
                // Also when serving failed: the metrics endpoint stops with it.
                let _ = quit_on_return.send(true);
                if let Some(m) = metrics {
                    let _ = m.await;
                }
                for f in fast {
                    let _ = f.await;
                }
                // Deregisters from etcd (the naming key goes at once).
                if let Some(m) = member {
                    let _ = m.await;
                }
                served.map_err(|e| Error::new(ErrorKind::Io, format!("serving failed: {e}")))
            })
        });
        // Leaves the sync membership at once (revoking its lease), so followers move on.
        if let Some(d) = directory {
            detached(py, || d.stop());
        }
        result.map_err(to_py_err)
    }

    /// Asks `run()` to return (from another thread).
    fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// `(table, version, shard, num_shards, state)`, as `Client.view` lists what a server holds.
type HeldRow = (String, u64, u32, u32, String);

/// A client of a fixed set of servers (see `embstore.connect`).
#[pyclass(module = "embstore._native", name = "Client", frozen)]
pub(crate) struct PyClient {
    runtime: tokio::runtime::Runtime,
    inner: Client,
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (addresses, deadline_s=5.0, max_restarts=2, token=None, tls=None, etcd=None, transport="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addresses: Vec<String>,
        deadline_s: f64,
        max_restarts: usize,
        token: Option<String>,
        tls: Option<TlsPaths>,
        etcd: Option<Vec<String>>,
        transport: &str,
    ) -> PyResult<Self> {
        let transport: embstore_client::Transport = transport.parse().map_err(to_py_err)?;
        if !(deadline_s.is_finite() && deadline_s > 0.0) {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                format!("deadline_s must be a positive number of seconds, got {deadline_s}"),
            )));
        }
        let runtime = runtime(1)?;
        let options = ClientOptions {
            deadline: Duration::from_secs_f64(deadline_s),
            max_restarts,
            token,
            tls: client_tls(tls)?,
            transport,
            ..Default::default()
        };
        let inner = detached(py, || match &etcd {
            Some(e) => runtime.block_on(Client::connect_etcd(e, options)),
            None => runtime.block_on(Client::connect(&addresses, options)),
        })
        .map_err(to_py_err)?;
        Ok(Self { runtime, inner })
    }

    /// `(values float32[B, D], found bool[B], version)` for `ids` in `table`.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        ids: PyReadonlyArray1<'py, u64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let keys = slice(&ids, "ids")?;
        let rows = detached(py, || self.runtime.block_on(self.inner.lookup(table, keys)))
            .map_err(to_py_err)?;
        let (b, d) = (rows.found.len(), rows.embedding_dim);
        let values = rows.values.into_pyarray(py).reshape([b, d])?;
        PyTuple::new(
            py,
            [
                values.into_any(),
                rows.found.into_pyarray(py).into_any(),
                rows.version.into_pyobject(py)?.into_any(),
            ],
        )
    }

    /// The transport lookups take to the server at `address` now: "fast" (the framed path over
    /// TCP), "fast-unix" (over its Unix socket) or "grpc"; `None` for an unknown address.
    fn transport_to(&self, address: &str) -> Option<&'static str> {
        self.inner.transport_to(address)
    }

    /// Per server: `(address, [(table, version, shard, num_shards, state), ...])` as last seen,
    /// or `None` for a server that has not answered.
    fn view(&self) -> Vec<(String, Option<Vec<HeldRow>>)> {
        self.inner.view().into_iter().map(|(addr, info)| (addr, info.map(held_rows))).collect()
    }
}

/// Makes an admin call (`op`: "load", "drain" or "unload") to the server at `address`; returns
/// what it holds afterwards, as `Client.view` lists it.
#[pyfunction]
#[pyo3(signature = (address, op, table, version, shard=0, num_shards=1, checkpoint=None, timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn admin(
    py: Python<'_>,
    address: String,
    op: &str,
    table: String,
    version: u64,
    shard: u32,
    num_shards: u32,
    checkpoint: Option<String>,
    timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<Vec<HeldRow>> {
    let tls = client_tls(tls)?;
    use embstore_cluster::AdminCall;
    let call = match (op, checkpoint) {
        ("load", Some(checkpoint)) => {
            AdminCall::Load { table, version, shard, num_shards, checkpoint }
        }
        ("load", None) => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "load needs a checkpoint",
            )))
        }
        ("drain", _) => AdminCall::Drain { table, version, shard: None },
        ("unload", _) => AdminCall::Unload { table, version, shard: None },
        (other, _) => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown admin call '{other}': load, drain or unload"),
            )))
        }
    };
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        return Err(to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("timeout_s must be a positive number of seconds, got {timeout_s}"),
        )));
    }
    let rt = runtime(1)?;
    let timeout = Duration::from_secs_f64(timeout_s);
    let info = detached(py, || {
        rt.block_on(embstore_cluster::admin(
            &address,
            call,
            timeout,
            token.as_deref(),
            tls.as_ref(),
        ))
    })
    .map_err(to_py_err)?;
    Ok(held_rows(info))
}

fn held_rows(info: embstore_proto::v1::ServerInfo) -> Vec<HeldRow> {
    info.held
        .into_iter()
        .map(|h| {
            let state = h.state().as_str_name().to_lowercase();
            (h.table, h.version, h.shard, h.num_shards, state)
        })
        .collect()
}

/// Rolls `table` to `version` over a fixed cluster (`embstore_cluster::roll`), printing a line
/// per step.
#[pyfunction]
#[pyo3(signature = (table, version, checkpoint, columns, spare, old_version=None, drain_quiet_s=2.0, drain_max_s=30.0, load_timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn roll(
    py: Python<'_>,
    table: String,
    version: u64,
    checkpoint: String,
    columns: Vec<Vec<String>>,
    spare: Vec<String>,
    old_version: Option<u64>,
    drain_quiet_s: f64,
    drain_max_s: f64,
    load_timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<()> {
    let (drain_quiet, drain_max, load_timeout) =
        roll_timing(drain_quiet_s, drain_max_s, load_timeout_s)?;
    let plan = embstore_cluster::RollPlan {
        table,
        version,
        checkpoint,
        old_version,
        old_num_shards: None,
        columns,
        spare,
        drain_quiet,
        drain_max,
        load_timeout,
        token,
        tls: client_tls(tls)?,
    };
    let rt = runtime(1)?;
    detached(py, || rt.block_on(embstore_cluster::roll(&plan, print_step))).map_err(to_py_err)
}

/// Publishes `checkpoint` as the next version of `table` over the cluster in etcd at `etcd`
/// (`embstore_cluster::publish`), printing a line per step; returns the version now served.
#[pyfunction]
#[pyo3(signature = (etcd, table, checkpoint, num_shards=None, max_shard_bytes=1 << 30, replicas=None, drain_quiet_s=2.0, drain_max_s=30.0, load_timeout_s=600.0, token=None, tls=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn publish(
    py: Python<'_>,
    etcd: Vec<String>,
    table: String,
    checkpoint: String,
    num_shards: Option<u32>,
    max_shard_bytes: u64,
    replicas: Option<u32>,
    drain_quiet_s: f64,
    drain_max_s: f64,
    load_timeout_s: f64,
    token: Option<String>,
    tls: Option<TlsPaths>,
) -> PyResult<u64> {
    if replicas == Some(0) {
        return Err(to_py_err(Error::new(ErrorKind::InvalidArgument, "replicas must be >= 1")));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let (drain_quiet, drain_max, load_timeout) =
        roll_timing(drain_quiet_s, drain_max_s, load_timeout_s)?;
    // Without a shard count, the checkpoint's size picks one: measured here, where the table
    // crate is linked (the control plane does not read checkpoints).
    let checkpoint_bytes = match num_shards {
        Some(_) => None,
        None => Some(embstore_table::checkpoint_table_bytes(Path::new(&checkpoint), &table)),
    };
    let p = embstore_cluster::Publish {
        table,
        checkpoint,
        num_shards,
        checkpoint_bytes,
        max_shard_bytes,
        replicas,
        coordinator: format!("{}:{}", host.trim(), std::process::id()),
        drain_quiet,
        drain_max,
        load_timeout,
        token,
        tls: client_tls(tls)?,
    };
    let rt = runtime(1)?;
    detached(py, || {
        rt.block_on(async {
            let etcd = Arc::new(embstore_cluster::Etcd::connect(&etcd, Duration::from_secs(3))?);
            embstore_cluster::publish(etcd, &p, print_step).await
        })
    })
    .map_err(to_py_err)
}

/// A cluster as etcd holds it: `[(instance, address)]` registered, and the control records as
/// JSON strings.
type ClusterRows = (Vec<(String, String)>, Vec<String>);

/// The members and control records of the cluster in etcd at `etcd`.
#[pyfunction]
pub(crate) fn cluster(py: Python<'_>, etcd: Vec<String>) -> PyResult<ClusterRows> {
    let rt = runtime(1)?;
    detached(py, || {
        rt.block_on(async {
            let etcd = embstore_cluster::Etcd::connect(&etcd, Duration::from_secs(3))?;
            let members = embstore_cluster::members(&etcd).await?;
            let controls = embstore_cluster::controls(&etcd).await?;
            let json = controls
                .into_iter()
                .map(|(c, _)| String::from_utf8_lossy(&c.to_json()).into_owned())
                .collect();
            Ok::<_, Error>((members, json))
        })
    })
    .map_err(to_py_err)
}

fn print_step(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "embstore publish: {line}");
    let _ = out.flush();
}

/// A roll's drain-quiet, drain-max and load timeout, checked.
fn roll_timing(quiet: f64, max: f64, load: f64) -> PyResult<(Duration, Duration, Duration)> {
    Ok((
        seconds("drain_quiet_s", quiet)?,
        seconds("drain_max_s", max)?,
        seconds("load_timeout_s", load)?,
    ))
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{what} must be a number of seconds >= 0, got {s}"),
        )))
    }
}
