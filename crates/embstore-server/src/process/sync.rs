//! The sync side of a serving process: the sync port of its store, its registration in the
//! sync membership in etcd, and the follower that keeps the store (or the versions rolls
//! load) current.

use std::sync::Arc;

use embstore_cluster::{Etcd, LeaseKeeper};
use embstore_common::Result;
use embstore_sync::{Directory, Follower, Source, SyncServer};
use embstore_table::sync::SyncOptions;
use embstore_table::Store;

use super::config::{Follow, ServeConfig, SyncConfig};
use crate::{Followed, Server, ServerTls, SyncLoads};

/// What [`start`] started.
#[derive(Default)]
pub(crate) struct Synced {
    pub(crate) server: Option<SyncServer>,
    pub(crate) follower: Option<Follower>,
    pub(crate) directory: Option<Arc<Directory>>,
}

/// A random replica id (1..2^31): every replica of a table needs its own.
pub(crate) fn random_replica() -> u32 {
    let seed = embstore_common::now_ms() ^ (u64::from(std::process::id()) << 32);
    1 + (embstore_common::fmix64(seed) % u64::from(embstore_table::MAX_REPLICA)) as u32
}

fn follow_options(a: &SyncConfig) -> embstore_sync::FollowOptions {
    embstore_sync::FollowOptions {
        token: a.token.clone().unwrap_or_default(),
        events: a.events.clone(),
        tls: a.tls.clone(),
        skip_by_sv: a.shard_versions,
        with_state: a.with_state,
        priority: a.priority.then(embstore_replication::CongestionConfig::default),
        precision: a.precision,
        ..embstore_sync::FollowOptions::default()
    }
}

/// The one lease of a process that serves in a cluster and syncs through the same etcd, with
/// the etcd client both use: its keeper renews the naming key and the sync member's key
/// together, puts both back under a new lease when it is lost, and one revoke removes both.
#[derive(Clone, Debug)]
pub(crate) struct SharedLease {
    pub(crate) etcd: Arc<Etcd>,
    pub(crate) keeper: Arc<LeaseKeeper>,
}

/// The process's one lease (see [`SharedLease`]), when it both serves in a cluster in etcd and
/// syncs through the same endpoints with a store; its TTL is the shorter of the two
/// registrations' (the naming lease's and the sync membership's), so neither outlives a dead
/// process longer than before. Blocks: call it outside the runtime.
pub(crate) fn shared_lease(
    runtime: &tokio::runtime::Runtime,
    config: &ServeConfig,
    has_store: bool,
) -> Result<Option<SharedLease>> {
    let a = &config.sync;
    let (Some(naming), Some(sync), Some(_), true) = (&config.etcd, &a.etcd, &a.dc, has_store)
    else {
        return Ok(None);
    };
    if naming != sync {
        return Ok(None); // two etcd clusters: a lease of each
    }
    let _in = runtime.enter(); // the client's connections live on this runtime
    let etcd = Arc::new(Etcd::connect(naming, std::time::Duration::from_secs(2))?);
    let ttl = config.lease_ttl.min(embstore_sync::discovery::DEFAULT_TTL);
    let keeper = Arc::new(runtime.block_on(LeaseKeeper::shared(etcd.clone(), ttl))?);
    Ok(Some(SharedLease { etcd, keeper }))
}

/// Starts the sync port of `store`, its registration in etcd (under `lease` when the process
/// keeps one for all its registrations, on `runtime`), and a follower into it (which creates
/// the source's tables before the server hosts them). `follow` is the source of the store's
/// own follower (not a roll member's). Blocks: call it outside the runtime.
pub(crate) fn start(
    store: Option<&Arc<Store>>,
    a: &SyncConfig,
    follow: Option<&Follow>,
    server_tls: Option<ServerTls>,
    (runtime, lease): (&tokio::runtime::Runtime, Option<&SharedLease>),
) -> Result<Synced> {
    let Some(store) = store else { return Ok(Synced::default()) };
    let mut out = Synced::default();
    let follow_options = embstore_sync::FollowOptions {
        // The flags of the sync port this store may also serve (a DC's leader).
        sync: SyncOptions {
            use_cache: a.use_cache,
            tombstone_horizon_ms: a.tombstone_horizon_ms,
            ..Default::default()
        },
        ..follow_options(a)
    };
    // A follower of a fixed source creates its tables first (with the source's layout), then
    // serves them.
    if let Some(Follow::Source(source)) = follow {
        out.follower = Some(Follower::start(store.clone(), source, follow_options.clone())?);
    }
    if let Some(addr) = &a.listen {
        let options = embstore_sync::ServeOptions {
            token: a.token.clone(),
            // A follower's rows on disk prove nothing about what it knows (see
            // `SyncOptions::knowledge_from_rows`).
            sync: store.sync_options().unwrap_or(SyncOptions {
                knowledge_from_rows: follow.is_none(),
                use_cache: a.use_cache,
                tombstone_horizon_ms: a.tombstone_horizon_ms,
                ..Default::default()
            }),
            tls: server_tls,
        };
        out.server = Some(SyncServer::start(store.clone(), addr, options)?);
    }
    if let (Some(etcd), Some(dc)) = (&a.etcd, &a.dc) {
        let addr =
            a.advertise.clone().or_else(|| out.server.as_ref().map(|s| s.addr().to_string()));
        let me = embstore_sync::Member {
            dc: dc.clone(),
            replica: store.replica(),
            addr: addr.unwrap_or_default(),
            primary: follow.is_none(),
            status: String::new(),
        };
        let dir = match lease {
            Some(l) => {
                runtime.block_on(Directory::start_under(l.etcd.clone(), l.keeper.clone(), me))?
            }
            None => Directory::start(etcd, me, embstore_sync::discovery::DEFAULT_TTL)?,
        };
        if follow.is_none() {
            let s = store.clone();
            dir.set_report(Box::new(move || format!("primary tables={}", s.tables().join(","))));
        }
        if follow == Some(&Follow::Etcd) {
            let source = Source::Directory(dir.clone());
            out.follower = Some(Follower::start_with(store.clone(), source, follow_options)?);
        }
        out.directory = Some(dir);
    }
    Ok(out)
}

/// The follower of a roll cluster's member: it keeps the versions rolls load into `server`
/// current from `source` (each catches up from its load on).
pub(crate) fn follow_rolls(
    server: &Arc<Server>,
    source: &str,
    replica: u32,
    a: &SyncConfig,
) -> Result<Follower> {
    let options = SyncOptions { knowledge_from_rows: false, ..Default::default() };
    server.set_sync_loads(SyncLoads { replica, options });
    let follow_options = embstore_sync::FollowOptions { flush_every: None, ..follow_options(a) };
    let source = Source::Fixed(source.to_string());
    Follower::start_into(server.clone(), source, follow_options)
}

/// A followed table's status as `/metrics` shows it.
pub(crate) fn followed(s: &embstore_sync::TableSync) -> Followed {
    Followed {
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
        congested: s.congested,
        congestions: s.congestions,
        prioritised_rows: s.prioritised_rows,
    }
}

/// The store's own follower's source: none for a roll cluster's member (its follower follows
/// the versions rolls load, see [`follow_rolls`]).
pub(crate) fn store_follow(config: &ServeConfig) -> Option<&Follow> {
    config.sync.follow.as_ref().filter(|_| config.roll_follow().is_none())
}
