//! [`ServeConfig`]: every option of a serving process (what `embstore serve` takes), and the
//! checks [`ServerProcess::start`](super::ServerProcess::start) runs before it opens or binds
//! anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::tls::ClientTls;

use crate::{ServerTls, Tokens, DEFAULT_MAX_BATCH};

/// Everything a serving process composes. `Default` is a server of nothing on `127.0.0.1:0`
/// (loaded through admin calls), with the framed lookup path on a free port of the same host.
///
/// A server of every table of a store directory (static mode: each table is version 1,
/// shard 0 of 1) sets [`store_dir`](Self::store_dir); see [`ServeConfig::for_store`].
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The store whose tables are served. `None`: nothing, until admin calls or the cluster
    /// in etcd load versions (or a follower creates its copy in memory).
    pub store_dir: Option<PathBuf>,
    /// `host:port` of the gRPC port (port 0: one the OS picks).
    pub listen: String,
    /// The address clients dial, if not the bound one (the name a cluster member registers).
    pub advertise: Option<String>,
    /// One memory budget for the store's tables and every shard loaded later: rows beyond it
    /// live on disk (the NVMe tier), under `data_dir`.
    pub memory_budget_bytes: Option<u64>,
    /// Where budgeted shards that are loaded keep their cold rows; without one, a scratch
    /// directory the process removes when it goes.
    pub data_dir: Option<PathBuf>,
    /// The most ids one lookup may name.
    pub max_batch: usize,
    /// Serve the admin service (always on for a cluster member).
    pub admin: bool,
    /// `host:port` of `GET /metrics`, if any.
    pub metrics: Option<String>,
    /// The bearer tokens lookups and admin calls ask for.
    pub tokens: Tokens,
    /// TLS on the gRPC, framed, metrics and sync ports.
    pub tls: Option<ServerTls>,
    /// Membership in the roll cluster in etcd at these endpoints.
    pub etcd: Option<Vec<String>>,
    /// The membership's lease (at least a second).
    pub lease_ttl: Duration,
    /// The store's replica id (every replica of a table needs its own); a follower without
    /// one picks a random id.
    pub replica: Option<u32>,
    /// Where the framed lookup path listens on TCP.
    pub framed_listen: FramedListen,
    /// The framed lookup path's Unix socket, if any.
    pub framed_unix: Option<PathBuf>,
    /// The sync port and the follower (docs/dissemination.md).
    pub sync: SyncConfig,
    /// How long `run` waits for a follower to catch up before it serves (zero: it serves at
    /// once); at most a day.
    pub catch_up_timeout: Duration,
    /// The tokio worker threads of the process's runtime.
    pub worker_threads: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            store_dir: None,
            listen: "127.0.0.1:0".to_string(),
            advertise: None,
            memory_budget_bytes: None,
            data_dir: None,
            max_batch: DEFAULT_MAX_BATCH,
            admin: false,
            metrics: None,
            tokens: Tokens::default(),
            tls: None,
            etcd: None,
            lease_ttl: Duration::from_secs(10),
            replica: None,
            framed_listen: FramedListen::Auto,
            framed_unix: None,
            sync: SyncConfig::default(),
            catch_up_timeout: Duration::from_secs(60),
            worker_threads: 2,
        }
    }
}

impl ServeConfig {
    /// A server of every table of the store at `dir`, on `listen`; the rest as `Default`.
    pub fn for_store(dir: impl Into<PathBuf>, listen: impl Into<String>) -> Self {
        Self { store_dir: Some(dir.into()), listen: listen.into(), ..Self::default() }
    }

    /// The checks that need nothing opened or bound.
    pub(crate) fn check(&self) -> Result<()> {
        if self.catch_up_timeout > Duration::from_secs(86_400) {
            return Err(invalid("catch_up_timeout_s must be in 0..=86400 seconds"));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(invalid(format!(
                "lease_ttl_s must be at least 1 second, got {}",
                self.lease_ttl.as_secs_f64()
            )));
        }
        if let Some(tls) = &self.tls {
            tls.check()?;
        }
        if let Some(tls) = &self.sync.tls {
            tls.config()?; // refused here, before any connection
        }
        if let Some(dir) = &self.store_dir {
            // A follower (not a roll cluster's member, which takes no directory) creates it.
            check_store_dir(dir, self.sync.follow.is_some() && self.etcd.is_none())?;
        }
        if self.roll_follow().is_some() && self.store_dir.is_some() {
            return Err(invalid(
                "a cluster member that follows syncs the versions rolls load: it takes no \
                 store directory",
            ));
        }
        let sync = &self.sync;
        if sync.etcd.is_some() != sync.dc.is_some() {
            return Err(invalid("syncing through etcd needs both etcd and dc"));
        }
        if sync.follow == Some(Follow::Etcd) && sync.etcd.is_none() {
            return Err(invalid(
                "follow without an address finds its source in etcd: give etcd and dc",
            ));
        }
        // A roll cluster's member that follows has no store of its own.
        let has_store =
            self.store_dir.is_some() || (sync.follow.is_some() && self.roll_follow().is_none());
        if !has_store && (sync.listen.is_some() || sync.etcd.is_some()) {
            return Err(invalid("sync_listen needs a store (store_dir) or a source to follow"));
        }
        Ok(())
    }

    /// The source a roll cluster's member follows: it keeps the versions rolls load current
    /// (a roll replaces the base; sync continues on top).
    pub(crate) fn roll_follow(&self) -> Option<&str> {
        match (&self.etcd, &self.sync.follow) {
            (Some(_), Some(Follow::Source(source))) => Some(source),
            _ => None,
        }
    }
}

/// Where the framed lookup path listens on TCP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FramedListen {
    /// Nowhere (lookups take gRPC, or the Unix socket).
    Off,
    /// The serving address's host, a free port.
    #[default]
    Auto,
    /// `host:port`.
    At(String),
}

impl FramedListen {
    /// `"auto"`, `""` or `"off"`, or `host:port` (as `embstore serve --framed-listen` takes it).
    pub fn parse(s: &str) -> Self {
        match s {
            "" | "off" => FramedListen::Off,
            "auto" => FramedListen::Auto,
            a => FramedListen::At(a.to_string()),
        }
    }
}

/// Where a follower finds its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Follow {
    /// The sync port at `host:port`.
    Source(String),
    /// A primary of its data center, found in etcd ([`SyncConfig::etcd`] and `dc`).
    Etcd,
}

/// The sync flags of `embstore serve` (docs/dissemination.md).
#[derive(Clone, Debug)]
pub struct SyncConfig {
    /// Serve a sync port there (it takes the serving port's TLS).
    pub listen: Option<String>,
    /// The address others dial (default: the bound one).
    pub advertise: Option<String>,
    /// The token the sync port asks for, and the follower gives.
    pub token: Option<String>,
    /// Follow a source: the process's store is its copy (created when the store directory
    /// is new or empty, or in memory without one).
    pub follow: Option<Follow>,
    /// Append the follower's events (JSON lines) here.
    pub events: Option<PathBuf>,
    /// Register in the sync membership in etcd (with `dc`), and find sources there.
    pub etcd: Option<Vec<String>>,
    pub dc: Option<String>,
    /// TLS to the source followed.
    pub tls: Option<ClientTls>,
    /// Whether the sync port keeps a cache of encoded parts (off: to measure what it gains).
    pub use_cache: bool,
    /// Whether the follower skips parts by shard version (off: to measure what it gains).
    pub shard_versions: bool,
    /// Take optimizer state too.
    pub with_state: bool,
    /// The precision of the values the follower asks for (`None`: f32, exact, unless the
    /// environment's `EMBSTORE_SYNC_PRECISION` says f16; see `FollowOptions::precision`).
    pub precision: Option<embstore_sync::wire::Precision>,
    /// How long deletions are remembered for followers, in ms.
    pub tombstone_horizon_ms: u64,
    /// Whether the follower pulls significant writes ahead while its link is congested
    /// (prioritised sync; off: to measure what it gains).
    pub priority: bool,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            listen: None,
            advertise: None,
            token: None,
            follow: None,
            events: None,
            etcd: None,
            dc: None,
            tls: None,
            use_cache: true,
            shard_versions: true,
            with_state: false,
            precision: None,
            tombstone_horizon_ms: 3_600_000,
            priority: true,
        }
    }
}

pub(crate) fn invalid(msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// Refuses a store directory that holds no store, except where a follower creates its copy
/// (`follow`): a directory that does not exist yet, or an empty one.
fn check_store_dir(dir: &Path, follow: bool) -> Result<()> {
    if dir.join("MANIFEST").is_file() {
        return Ok(());
    }
    if !follow {
        return Err(invalid(format!("{} holds no store (no MANIFEST)", dir.display())));
    }
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(true) => Ok(()),
        Ok(false) => Err(invalid(format!(
            "{} holds no store (no MANIFEST) and is not empty: a follower keeps its copy in a \
             new or empty directory, or in the store it kept there before",
            dir.display()
        ))),
        Err(e) => {
            Err(invalid(format!("cannot use {} as the follower's store: {e}", dir.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(c: &ServeConfig) -> String {
        let e = c.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        e.to_string()
    }

    #[test]
    fn the_default_is_valid_and_each_bad_option_is_named() {
        ServeConfig::default().check().unwrap();
        let c = ServeConfig { lease_ttl: Duration::from_millis(500), ..Default::default() };
        assert!(refused(&c).contains("lease_ttl_s must be at least 1 second, got 0.5"));
        let c = ServeConfig { catch_up_timeout: Duration::from_secs(86_401), ..Default::default() };
        assert!(refused(&c).contains("catch_up_timeout_s"));
        let mut c = ServeConfig::default();
        c.sync.etcd = Some(vec!["127.0.0.1:2379".into()]);
        assert!(refused(&c).contains("needs both etcd and dc"));
        let mut c = ServeConfig::default();
        c.sync.follow = Some(Follow::Etcd);
        assert!(refused(&c).contains("finds its source in etcd"));
        let mut c = ServeConfig::default();
        c.sync.listen = Some("127.0.0.1:0".into());
        assert!(refused(&c).contains("sync_listen needs a store"));
    }

    #[test]
    fn a_store_directory_holds_a_store_unless_a_follower_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = ServeConfig::for_store(dir.path(), "127.0.0.1:0");
        assert!(refused(&c).contains("holds no store (no MANIFEST)"));
        let mut c = c;
        c.sync.follow = Some(Follow::Source("127.0.0.1:1".into()));
        c.check().unwrap(); // empty: the follower's copy goes there
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        assert!(refused(&c).contains("not empty"));
        c.etcd = Some(vec!["127.0.0.1:2379".into()]);
        c.store_dir = None;
        c.check().unwrap();
        c.store_dir = Some(dir.path().join("new"));
        assert!(refused(&c).contains("holds no store"), "a roll member's store dir is its own");
    }

    #[test]
    fn framed_listen_parses_the_cli_words() {
        assert_eq!(FramedListen::parse("auto"), FramedListen::Auto);
        assert_eq!(FramedListen::parse(""), FramedListen::Off);
        assert_eq!(FramedListen::parse("off"), FramedListen::Off);
        assert_eq!(FramedListen::parse("[::1]:7"), FramedListen::At("[::1]:7".into()));
    }
}
