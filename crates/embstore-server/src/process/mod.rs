//! A serving process: everything `embstore serve` composes, from one [`ServeConfig`]: the
//! store opened from a directory (under a memory budget, with the NVMe tier), its tables
//! hosted, the gRPC services with TLS and tokens, the metrics endpoint, the framed lookup path
//! (TCP and a Unix socket), membership in a roll cluster in etcd, the sync port, a follower
//! and its catch-up gate before serving.
//!
//! [`ServerProcess::start`] checks the config, opens and binds everything (so a bad option or
//! a taken port fails there, typed, before anything serves); [`ServerProcess::run`] serves
//! until its shutdown future resolves or [`ServerProcess::stop`] is called. The process owns
//! its tokio runtime: `start`, `run` and dropping it block, so call them outside async code
//! (from `main`, a thread, or `spawn_blocking`).
//!
//! ```no_run
//! use embstore_server::process::{FramedListen, ServeConfig, ServerProcess};
//!
//! let config = ServeConfig {
//!     framed_unix: Some("/run/embstore/ctr.sock".into()), // the framed path on a Unix socket too
//!     ..ServeConfig::for_store("/data/ctr", "127.0.0.1:7000")
//! };
//! assert_eq!(config.framed_listen, FramedListen::Auto);   // and on a free TCP port
//! let process = ServerProcess::start(config)?;
//! println!("{:?} on {}", process.tables(), process.address());
//! process.run(embstore_server::process::signals())?;    // until SIGINT or SIGTERM
//! # Ok::<(), embstore_common::Error>(())
//! ```

mod config;
mod sync;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use embstore_table::{Store, StoreOptions};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Follow, FramedListen, ServeConfig, SyncConfig};

use crate::member::{Member, MemberOptions};
use crate::{FramedListener, ServeOptions, Server, TierOptions};

/// A started serving process (see the module docs).
pub struct ServerProcess {
    runtime: tokio::runtime::Runtime,
    server: Arc<Server>,
    /// What `run` serves, taken by it (it runs once).
    listeners: Mutex<Option<Listeners>>,
    address: String,
    framed_address: Option<String>,
    metrics_address: Option<String>,
    stop: watch::Sender<bool>,
    options: ServeOptions,
    /// Membership in a cluster in etcd, joined by `run`.
    member: Option<MemberOptions>,
    store: Option<Arc<Store>>,
    /// The sync port, the follower and the sync membership, if any.
    sync: Option<embstore_sync::SyncServer>,
    follower: Option<embstore_sync::Follower>,
    directory: Option<Arc<embstore_sync::Directory>>,
    /// How long `run` waits for the follower to catch up before serving (`None`: it serves at
    /// once).
    catch_up: Option<Duration>,
    /// The data dir this process made for itself (no `data_dir` given): removed with it.
    _scratch: Option<Scratch>,
}

/// The listeners `run` serves: gRPC, metrics, the framed path's.
struct Listeners {
    grpc: TcpListener,
    metrics: Option<TcpListener>,
    framed: Vec<FramedListener>,
}

/// A directory this process created (never one that was there before), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    /// A new directory under `parent` with a name no one else holds: `create_dir` fails on
    /// an existing path, so a stale directory or another server's is never taken (and so
    /// never removed).
    fn create(parent: &Path) -> Result<Self> {
        let mut last = None;
        for _ in 0..16 {
            let name = format!(
                "embstore-serve-{}-{:016x}",
                std::process::id(),
                embstore_common::rand::unpredictable_u64()
            );
            let dir = parent.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(Self(dir)),
                Err(e) => last = Some(e),
            }
        }
        let e = last.expect("16 tries");
        Err(Error::io(format!("create a scratch data dir under {}", parent.display()), e))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("address", &self.address)
            .field("framed_address", &self.framed_address)
            .field("metrics_address", &self.metrics_address)
            .field("sync_address", &self.sync_address())
            .finish_non_exhaustive()
    }
}

/// Resolves on SIGINT or SIGTERM (what `embstore serve` stops on); pass it to
/// [`ServerProcess::run`].
pub async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
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
    }
}

impl ServerProcess {
    /// Checks `config`, opens the store, binds every port, starts the sync port and the
    /// follower, and hosts the store's tables; nothing is served until [`run`](Self::run).
    /// Blocks (call it outside async code).
    pub fn start(config: ServeConfig) -> Result<Self> {
        config.check()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads.max(1))
            .enable_all()
            .build()
            .map_err(|e| Error::new(ErrorKind::Io, format!("start a tokio runtime: {e}")))?;
        // One budget for the store's tables and every shard loaded later.
        let budget = config.memory_budget_bytes.map(embstore_table::Budget::shared).transpose()?;
        let (tier, scratch) = tier_options(budget.clone(), config.data_dir.clone())?;
        let roll_follow = config.roll_follow().map(str::to_string);
        let follow = sync::store_follow(&config);
        let replica =
            config.replica.unwrap_or(if follow.is_some() { sync::random_replica() } else { 0 });
        let store = open_store(&config, budget, replica)?;
        // A follower without a store directory holds its copy in memory.
        let store = match (store, follow) {
            (None, Some(_)) => {
                let r = config.replica.unwrap_or_else(sync::random_replica);
                Some(Arc::new(Store::with_replica(r)?))
            }
            (store, _) => store,
        };
        let grpc = bind(&runtime, &config.listen)?;
        let metrics = config.metrics.as_deref().map(|a| bind(&runtime, a)).transpose()?;
        let framed =
            bind_framed(&runtime, &grpc, &config.framed_listen, config.framed_unix.clone())?;
        let framed_address = framed.iter().find_map(|l| match l {
            FramedListener::Tcp(t) => t.local_addr().ok().map(|a| a.to_string()),
            FramedListener::Unix(..) => None,
        });
        let lease = sync::shared_lease(&runtime, &config, store.is_some())?;
        let synced = sync::start(
            store.as_ref(),
            &config.sync,
            follow,
            config.tls.clone(),
            (&runtime, lease.as_ref()),
        )?;
        let metrics_address =
            metrics.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string());
        // A cluster member is known by the address clients dial: `advertise`, or the bound
        // address (port 0 resolved).
        let address = match config.advertise.clone() {
            Some(a) => a,
            None => {
                grpc.local_addr().map_err(|e| Error::new(ErrorKind::Io, e.to_string()))?.to_string()
            }
        };
        let member = config.etcd.clone().map(|e| {
            let mut m = MemberOptions::new(e, &address);
            m.lease_ttl = config.lease_ttl;
            m.lease = lease.map(|l| (l.etcd, l.keeper));
            m
        });
        let server = hosting(&address, config.max_batch, tier, store.as_deref())?;
        // A follower of live tables serves once caught up; one that keeps rolled-in versions
        // current serves what rolls load (each catches up from its load on).
        let catch_up = (!config.catch_up_timeout.is_zero() && roll_follow.is_none())
            .then_some(config.catch_up_timeout);
        let follower = match roll_follow {
            Some(source) => {
                let r = config.replica.unwrap_or_else(sync::random_replica);
                Some(sync::follow_rolls(&server, &source, r, &config.sync)?)
            }
            None => synced.follower,
        };
        if let Some(view) = follower.as_ref().map(|f| f.status_view()) {
            server
                .set_followed(Box::new(move || view.status().iter().map(sync::followed).collect()));
        }
        let (stop, _) = watch::channel(false);
        Ok(Self {
            runtime,
            server,
            listeners: Mutex::new(Some(Listeners { grpc, metrics, framed })),
            address,
            framed_address,
            metrics_address,
            stop,
            options: ServeOptions {
                // A cluster member takes the roll coordinator's admin calls.
                admin: config.admin || member.is_some(),
                tokens: config.tokens,
                tls: config.tls,
            },
            member,
            store,
            sync: synced.server,
            follower,
            directory: synced.directory,
            catch_up,
            _scratch: scratch,
        })
    }

    /// `host:port` the gRPC port is known by: `advertise`, or the bound address (the port the
    /// OS chose for port 0).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// `host:port` of the framed lookup path's TCP port, if it is offered.
    pub fn framed_address(&self) -> Option<&str> {
        self.framed_address.as_deref()
    }

    /// `host:port` of `GET /metrics`, if asked for.
    pub fn metrics_address(&self) -> Option<&str> {
        self.metrics_address.as_deref()
    }

    /// `host:port` of the sync port, if one runs.
    pub fn sync_address(&self) -> Option<String> {
        self.sync.as_ref().map(|s| s.addr().to_string())
    }

    /// Names of the tables served.
    pub fn tables(&self) -> Vec<String> {
        let mut names: Vec<String> = self.server.info().held.into_iter().map(|h| h.table).collect();
        names.dedup();
        names
    }

    /// Where each followed table stands (empty when the process follows nothing).
    pub fn sync_status(&self) -> Vec<embstore_sync::TableSync> {
        self.follower.as_ref().map(|f| f.status()).unwrap_or_default()
    }

    /// What is hosted (to load, drain or unload versions in process).
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// The store whose tables are served (or the follower's copy), if any.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Asks `run` to return (from another thread); a `run` that starts later returns at once.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Serves until `shutdown` resolves or [`stop`](Self::stop) is called; then stops
    /// accepting, finishes the requests in flight, leaves the cluster and the sync membership,
    /// and returns. Once only. With a follower, it first waits (up to `catch_up_timeout`) for
    /// it to catch up. Blocks (call it outside async code).
    pub fn run(&self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let Listeners { grpc, metrics, framed } =
            self.listeners.lock().take().ok_or_else(|| {
                Error::new(ErrorKind::InvalidArgument, "this server has run already")
            })?;
        let server = self.server.clone();
        let mut stop = self.stop.subscribe();
        let member = self.member.clone();
        let catch_up = self.follower.as_ref().map(|f| f.status_view());
        let result = self.runtime.block_on(async move {
            let member = match member {
                Some(options) => {
                    let joined = Member::join(server.clone(), options).await;
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
                tokio::spawn(crate::serve_metrics_with(
                    server.clone(),
                    l,
                    self.options.tls.clone(),
                    quit(quit_rx.clone()),
                ))
            });
            let signals = tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
                let _ = quit_tx.send(true);
            });
            if let (Some(view), Some(limit)) = (&catch_up, self.catch_up) {
                // A joining or restarted replica would answer with missing or old rows: it
                // serves once caught up, or after `limit` at most.
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
                        "embstore serve: not caught up after {:.0} s ({pending} parts pending): \
                         serving what it holds",
                        limit.as_secs_f64()
                    );
                }
            }
            let member = member.map(|m| tokio::spawn(m.run(quit(quit_rx.clone()))));
            let framed: Vec<_> = framed
                .into_iter()
                .map(|l| {
                    let (tokens, tls) = (self.options.tokens.clone(), self.options.tls.clone());
                    let q = quit(quit_rx.clone());
                    tokio::spawn(crate::serve_framed(server.clone(), l, tokens, tls, q))
                })
                .collect();
            let served = crate::serve(server, grpc, self.options.clone(), quit(quit_rx)).await;
            signals.abort();
            // Also when serving failed: the metrics endpoint stops with it.
            let _ = quit_on_return.send(true);
            if let Some(m) = metrics {
                let _ = m.await;
            }
            for f in framed {
                let _ = f.await;
            }
            // Deregisters from etcd (the naming key goes at once).
            if let Some(m) = member {
                let _ = m.await;
            }
            served.map_err(|e| Error::new(ErrorKind::Io, format!("serving failed: {e}")))
        });
        // Leaves the sync membership at once (revoking its lease), so followers move on.
        if let Some(d) = &self.directory {
            d.stop();
        }
        result
    }
}

/// Where budgeted shards are loaded: `data_dir`, or without one, a scratch directory the
/// process removes when it goes. `None` without a budget (shards are loaded into memory).
fn tier_options(
    budget: Option<Arc<embstore_table::Budget>>,
    data_dir: Option<PathBuf>,
) -> Result<(Option<TierOptions>, Option<Scratch>)> {
    let scratch = match (&budget, &data_dir) {
        (Some(_), None) => Some(Scratch::create(&std::env::temp_dir())?),
        _ => None,
    };
    let tier = budget.map(|budget| TierOptions {
        dir: data_dir.or_else(|| scratch.as_ref().map(|s| s.0.clone())).unwrap_or_default(),
        budget,
    });
    Ok((tier, scratch))
}

/// Opens the store at `store_dir` (under `budget`, if any).
fn open_store(
    config: &ServeConfig,
    budget: Option<Arc<embstore_table::Budget>>,
    replica: u32,
) -> Result<Option<Arc<Store>>> {
    let Some(dir) = &config.store_dir else { return Ok(None) };
    let mut options = StoreOptions::default().with_replica(replica);
    if let Some(b) = budget {
        options = options.with_shared_budget(b);
    }
    let fs = Arc::new(embstore_table::disk::vfs::RealFs);
    Ok(Some(Arc::new(Store::open_with_options(dir, &options, fs)?)))
}

fn bind(runtime: &tokio::runtime::Runtime, addr: &str) -> Result<TcpListener> {
    runtime.block_on(TcpListener::bind(addr)).map_err(|e| {
        Error::new(ErrorKind::InvalidArgument, format!("cannot listen on {addr}: {e}"))
    })
}

/// Binds the framed lookup path: on TCP as `framed_listen` says ("auto": the serving address's
/// host, a free port), and the Unix socket `framed_unix`, if given.
fn bind_framed(
    runtime: &tokio::runtime::Runtime,
    serving: &TcpListener,
    framed_listen: &FramedListen,
    framed_unix: Option<PathBuf>,
) -> Result<Vec<FramedListener>> {
    let addr = match framed_listen {
        FramedListen::Off => None,
        FramedListen::Auto => {
            let ip = serving.local_addr().map_err(|e| config::invalid(e.to_string()))?.ip();
            Some(if ip.is_ipv6() { format!("[{ip}]:0") } else { format!("{ip}:0") })
        }
        FramedListen::At(a) => Some(a.clone()),
    };
    let mut out = Vec::new();
    if let Some(a) = addr {
        let l = runtime.block_on(FramedListener::tcp(&a)).map_err(|e| {
            Error::new(ErrorKind::InvalidArgument, format!("cannot listen on {a}: {e}"))
        })?;
        out.push(l);
    }
    if let Some(path) = framed_unix {
        let l = runtime.block_on(async { FramedListener::unix(&path) }).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("cannot listen on the unix socket {}: {e}", path.display()),
            )
        })?;
        out.push(l);
    }
    Ok(out)
}

/// The server named `address`, budgeted when `tier` is given, hosting every table of `store`
/// as version 1, shard 0 of 1 (static mode).
fn hosting(
    address: &str,
    max_batch: usize,
    tier: Option<TierOptions>,
    store: Option<&Store>,
) -> Result<Arc<Server>> {
    let server = match tier {
        Some(tier) => Server::with_tier(address, max_batch, tier)?,
        None => Server::new(address, max_batch),
    };
    for name in store.map(|s| s.tables()).unwrap_or_default() {
        let table = store.expect("listed").table(&name)?;
        server.host(&name, 1, 0, 1, table)?;
    }
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    /// Two processes' (or one process's two servers') scratch dirs never share a path, a
    /// directory already there is never taken, and dropping one removes only its own.
    #[test]
    fn a_scratch_dir_is_new_and_only_its_own_is_removed() {
        let parent = tempfile::tempdir().unwrap();
        let stale = parent.path().join(format!("embstore-serve-{}", std::process::id()));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("keep"), b"x").unwrap();
        let (a, b) =
            (Scratch::create(parent.path()).unwrap(), Scratch::create(parent.path()).unwrap());
        assert_ne!(a.0, b.0);
        assert!(a.0 != stale && b.0 != stale);
        std::fs::write(b.0.join("rows"), b"y").unwrap();
        let (a_dir, b_dir) = (a.0.clone(), b.0.clone());
        drop(a);
        assert!(!a_dir.exists());
        assert!(b_dir.join("rows").exists() && stale.join("keep").exists());
        drop(b);
        assert!(!b_dir.exists() && stale.join("keep").exists());
        let e = Scratch::create(&parent.path().join("missing/deeper")).err().unwrap();
        assert_eq!(e.kind(), embstore_common::ErrorKind::Io, "{e}");
    }
}
