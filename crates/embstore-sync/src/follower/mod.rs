//! [`Follower`]: keeps a store's tables current from a peer's sync port.
//!
//! One thread per table, each with its own connection, runs pull rounds (Ekko's four steps):
//! ask which parts changed since the cursor (a long-poll that returns at once on a change),
//! keep the parts whose sv this replica does not already succeed, pull them with this
//! replica's VVs, and apply each reply (rows last-writer-wins, then the knowledge). A part
//! stays pending until a reply for it is applied, so a broken connection or a refused reply is
//! retried without the peer listing it again. The follower keeps serving reads throughout.
//!
//! Parts: this file starts and stops a follower and its threads (one per table, the watch for
//! new tables, the flusher); `rounds` runs a table's pull rounds (the protocol's round,
//! `embstore_replication::round`, the simulator's too); `link` is one connection to a sync
//! port and the TCP `Link` the round runs over; `status` is where the tables stand and the
//! catch-up wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use embstore_common::{Error, ErrorKind, Result};
use embstore_table::sync::{SyncOptions, Target};
use embstore_table::Store;
use parking_lot::Mutex;

mod link;
mod prioritised;
mod rollback;
mod rounds;
mod status;

use link::connect;
pub use rollback::rollback;
use rounds::follow_table;
use status::{report, Shared, Status, ROUND_GRACE_MS};
pub use status::{CatchUpMark, StatusView, TableSync};

use crate::discovery::Directory;
use crate::wire;
use embstore_proto::tls::ClientTls;

/// Where a follower pulls from.
#[derive(Clone, Debug)]
pub enum Source {
    /// One sync port (`host:port`).
    Fixed(String),
    /// Chosen per table from the members registered in etcd: the data centre's leader, or a
    /// primary for the leader itself ([`crate::discovery::choose_source`]); re-chosen every
    /// round, so a dead leader is replaced once its lease expires.
    Directory(Arc<Directory>),
}

impl Source {
    fn pick(&self, table: &str) -> Option<String> {
        match self {
            Source::Fixed(a) => Some(a.clone()),
            Source::Directory(d) => d.source(table),
        }
    }

    /// A source for the table list: waits up to `timeout` for one to be registered.
    fn any(&self, tables: &[String], timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let probe = tables.first().map_or("", String::as_str);
        loop {
            if let Some(s) = self.pick(probe) {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "no sync source is registered in etcd (no primary, no leader of this data \
                     centre)",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A table's id in `--sync-events` records: the CRC-32 of its name's UTF-8 bytes (Python:
/// `zlib.crc32(name.encode())`).
pub fn table_id(name: &str) -> u32 {
    crc32fast::hash(name.as_bytes())
}

/// Parts asked for in one pull request.
const PARTS_PER_PULL: usize = 256;
/// Lag samples kept per table (for p50/p99).
const LAG_SAMPLES: usize = 4096;

/// How a [`Follower`] runs.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// The replication token the source expects (empty: none).
    pub token: String,
    /// The tables to follow (empty: every table the source serves, those it creates later
    /// included: the follower asks for the source's tables every [`WATCH_EVERY`]).
    pub tables: Vec<String>,
    /// Whether to take optimizer state as well (a replica that may take over training).
    pub with_state: bool,
    /// How long a change list waits at the source for a change (the long-poll), in ms.
    pub wait_ms: u32,
    /// The pause before reconnecting after an error, in ms.
    pub retry_ms: u64,
    /// How long to wait for a connection and for any reply, in ms.
    pub timeout_ms: u64,
    /// A file to append one record to per applied reply, for measuring dissemination latency:
    /// `time_us u64 | table u32 | part u32 | newest_ts u64` (little-endian; the time in µs
    /// since the Unix epoch, the table as [`table_id`], the part's largest known timestamp
    /// over its origins after the reply).
    pub events: Option<std::path::PathBuf>,
    /// Whether a round skips the parts whose shard version this replica already holds
    /// (`false` pulls every part every round: only for measuring what shard versions gain).
    pub skip_by_sv: bool,
    /// How often a store in a directory is flushed, so that a restart serves recent rows at
    /// once (it then pulls every part again); `None`: never.
    pub flush_every: Option<Duration>,
    /// TLS to the source: the CA it chains to, the name its certificate must carry (default:
    /// the host of its address), a client identity for mutual TLS; `None`: plaintext.
    pub tls: Option<ClientTls>,
    /// The sync options a store that does not sync yet starts with (the part count is the
    /// source's, and its knowledge never comes from its rows).
    pub sync: SyncOptions,
    /// Prioritised sync: when a link counts as congested (its oldest pending change older
    /// than the time-out for three rounds), a second connection pulls the source's
    /// significant writes ahead of the rest until it is calm again; `None`: never.
    pub priority: Option<embstore_replication::CongestionConfig>,
    /// The highest sync protocol offered to the source (`None`: [`wire::PROTOCOL`], or the
    /// environment's `EMBSTORE_SYNC_PROTOCOL` where set, for comparing wires); clamped to
    /// what this build speaks. Below 6 the source sends every frame on its own, uncompressed.
    pub protocol: Option<u16>,
    /// The precision of the values the source sends (protocol 6; `None`: the environment's
    /// `EMBSTORE_SYNC_PRECISION`, `f32` or `f16`, where set, else f32, exact).
    /// [`crate::wire::Precision::F16`] halves the value bytes and rounds every value to half
    /// precision: lossy, a relative error up to 2^-11 for normal values, those beyond
    /// ±65,504 saturate to infinity; optimizer state stays exact.
    pub precision: Option<crate::wire::Precision>,
}

impl FollowOptions {
    /// The protocol offered in HELLO (see [`FollowOptions::protocol`]).
    pub fn protocol(&self) -> u16 {
        let env = || std::env::var("EMBSTORE_SYNC_PROTOCOL").ok()?.trim().parse().ok();
        self.protocol
            .or_else(env)
            .unwrap_or(crate::wire::PROTOCOL)
            .clamp(crate::wire::MIN_PROTOCOL, crate::wire::PROTOCOL)
    }

    /// The precision asked for in HELLO (see [`FollowOptions::precision`]).
    pub fn precision(&self) -> crate::wire::Precision {
        let env = || match std::env::var("EMBSTORE_SYNC_PRECISION").ok()?.trim() {
            "f16" => Some(crate::wire::Precision::F16),
            _ => Some(crate::wire::Precision::F32),
        };
        self.precision.or_else(env).unwrap_or_default()
    }
}

impl Default for FollowOptions {
    fn default() -> Self {
        Self {
            token: String::new(),
            tables: Vec::new(),
            with_state: false,
            wait_ms: 1000,
            retry_ms: 200,
            timeout_ms: 10_000,
            events: None,
            tls: None,
            flush_every: Some(Duration::from_secs(10)),
            skip_by_sv: true,
            sync: SyncOptions::default(),
            priority: Some(embstore_replication::CongestionConfig::default()),
            protocol: None,
            precision: None,
        }
    }
}

/// How often a follower of every table asks its source for the tables it serves, to follow
/// those created since.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// A running follower; [`Follower::stop`] (or drop) ends its threads.
#[derive(Debug)]
pub struct Follower(Parts);

/// What a follower's threads share with it: the stop flag, the tables' status, the threads
/// (the watch for new tables adds to them).
#[derive(Clone, Debug)]
struct Parts {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Follower {
    /// Connects to the sync port at `source`, creates the source's tables that `store` lacks
    /// (with the source's config), turns sync on in `store` with the source's part counts, and
    /// starts one pulling thread per table. Fails when the source cannot be reached, refuses
    /// the token, or serves a table whose config differs from this store's table of that name.
    pub fn start(store: Arc<Store>, source: &str, options: FollowOptions) -> Result<Self> {
        Self::start_with(store, Source::Fixed(source.to_owned()), options)
    }

    /// [`Follower::start`] from any [`Source`]; with a directory, each table's thread follows
    /// whichever source the directory names for it, and this replica reports its status there.
    pub fn start_with(store: Arc<Store>, source: Source, options: FollowOptions) -> Result<Self> {
        let flush = options.flush_every.zip(store.path().map(|_| store.clone()));
        let watch = options.tables.is_empty();
        Self::start_inner(store, source, options, flush, watch)
    }

    /// [`Follower::start_with`] into any [`Target`]: with a serving `Server`, into the versions it
    /// loads with sync on, switching to each newly loaded version (a roll onto a new base) and
    /// waiting while it holds none.
    pub fn start_into(
        target: Arc<dyn Target>,
        source: Source,
        options: FollowOptions,
    ) -> Result<Self> {
        Self::start_inner(target, source, options, None, false)
    }

    fn start_inner(
        target: Arc<dyn Target>,
        source: Source,
        options: FollowOptions,
        flush: Option<(Duration, Arc<Store>)>,
        watch: bool,
    ) -> Result<Self> {
        if let Some(tls) = &options.tls {
            tls.config()?; // a bad CA or identity fails here, not at each connection
        }
        let first =
            source.any(&options.tables, Duration::from_millis(options.timeout_ms.max(1)))?;
        let (_, replica, infos) = connect(&first, &options, &options.tables)?;
        if replica == target.replica() {
            // Shard versions name knowledge by replica id: two replicas sharing one could take
            // each other's names for knowledge they do not have.
            return Err(Error::invalid(format!(
                "this store and the sync source {first} have the same replica id \
                 {replica}: every replica needs its own"
            )));
        }
        target.prepare(&first, &infos, &options.sync)?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared { watching: watch, ..Shared::default() });
        let threads = Arc::new(Mutex::new(Vec::new()));
        let me = Parts { stop, shared, threads };
        let known: std::collections::HashSet<String> =
            infos.iter().map(|i| i.name.clone()).collect();
        for info in infos {
            spawn_table(&me, &target, &source, &options, info)?;
        }
        if let Source::Directory(d) = &source {
            let shared = me.shared.clone();
            d.set_report(Box::new(move || report(&shared.tables())));
        }
        if let Some((every, store)) = flush {
            let (stop, shared) = (me.stop.clone(), me.shared.clone());
            let th = std::thread::Builder::new()
                .name("embstore-follow-flush".into())
                .spawn(move || flush_loop(&store, every, &stop, &shared))
                .map_err(|e| Error::io("cannot start the follower's flush thread", e))?;
            me.threads.lock().push(th);
        }
        if watch {
            let handle = me.clone();
            let (target, source, options) = (target.clone(), source.clone(), options.clone());
            let th = std::thread::Builder::new()
                .name("embstore-follow-watch".into())
                .spawn(move || watch_tables(&handle, &target, &source, &options, known))
                .map_err(|e| Error::io("cannot start the follower's table watch", e))?;
            me.threads.lock().push(th);
        }
        Ok(Self(me))
    }

    /// Where each followed table stands.
    pub fn status(&self) -> Vec<TableSync> {
        self.status_view().status()
    }

    /// A handle that reads [`Follower::status`] (for as long as it is kept; after the
    /// follower stopped, its last status).
    pub fn status_view(&self) -> StatusView {
        StatusView(self.0.shared.clone())
    }

    /// Waits until every table is caught up (a round that left nothing pending after the
    /// source's writes before this call), or `timeout`; whether they all are.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        self.status_view().wait_caught_up(timeout)
    }

    /// Stops every thread (within the long-poll's wait).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
        // The watch may start a table's thread while the first ones are joined: join until
        // none is left.
        loop {
            let threads: Vec<_> = self.0.threads.lock().drain(..).collect();
            if threads.is_empty() {
                return;
            }
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the thread that follows `info`'s table, with its status line.
fn spawn_table(
    f: &Parts,
    target: &Arc<dyn Target>,
    source: &Source,
    options: &FollowOptions,
    info: wire::TableInfo,
) -> Result<()> {
    let stale_ms = u64::from(options.wait_ms) + ROUND_GRACE_MS;
    let st = Arc::new(Mutex::new(Status { stale_ms, ..Status::default() }));
    st.lock().s.table = info.name.clone();
    let (stop, st2, source, options, target) =
        (f.stop.clone(), st.clone(), source.clone(), options.clone(), target.clone());
    let th = std::thread::Builder::new()
        .name(format!("embstore-follow-{}", info.name))
        .spawn(move || follow_table(&*target, &info, &source, &options, &stop, &st2))
        .map_err(|e| Error::io("cannot start a follower thread", e))?;
    f.shared.tables.lock().push(st);
    f.threads.lock().push(th);
    Ok(())
}

/// Asks the source for its tables every [`WATCH_EVERY`] (or at once when a caller waits to
/// catch up) and follows each new one: created here with the source's config, then pulled
/// like the others. A table that cannot be followed (its config here differs) gets a status
/// line with the error.
fn watch_tables(
    f: &Parts,
    target: &Arc<dyn Target>,
    source: &Source,
    options: &FollowOptions,
    mut known: std::collections::HashSet<String>,
) {
    // Short waits: a stop is not held up by a source that does not answer (the tables'
    // threads report it).
    let listing = FollowOptions { timeout_ms: options.timeout_ms.min(2000), ..options.clone() };
    let timeout = Duration::from_millis(500);
    let mut last = Instant::now();
    while !f.stop.load(Ordering::Relaxed) {
        if !f.shared.nudge.swap(false, Ordering::Relaxed) && last.elapsed() < WATCH_EVERY {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        last = Instant::now();
        let seq = f.shared.lists_begun.fetch_add(1, Ordering::AcqRel) + 1;
        let listed = source
            .any(&[], timeout)
            .and_then(|addr| connect(&addr, &listing, &[]).map(|(_, _, infos)| (addr, infos)));
        let Ok((addr, infos)) = listed else { continue }; // the tables' threads say why
        for info in infos {
            if known.contains(&info.name) {
                continue;
            }
            known.insert(info.name.clone());
            let name = info.name.clone();
            let started = target
                .prepare(&addr, std::slice::from_ref(&info), &options.sync)
                .and_then(|()| spawn_table(f, target, source, options, info));
            if let Err(e) = started {
                let st = Status {
                    s: TableSync {
                        table: name,
                        source: addr.clone(),
                        errors: 1,
                        last_error: Some(format!("cannot follow this table: {e}")),
                        ..TableSync::default()
                    },
                    ..Status::default()
                };
                f.shared.tables.lock().push(Arc::new(Mutex::new(st)));
            }
        }
        f.shared.lists_done.fetch_max(seq, Ordering::AcqRel);
    }
}

/// Flushes `store` every `every` until stopped (and once more at the end); a failure is
/// reported on every table's status and retried at the next tick.
fn flush_loop(store: &Store, every: Duration, stop: &AtomicBool, status: &Shared) {
    let mut next = Instant::now() + every;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping || Instant::now() >= next {
            if let Err(e) = store.flush() {
                for s in status.tables() {
                    let mut s = s.lock();
                    s.s.errors += 1;
                    s.s.last_error = Some(format!("flush: {e}"));
                }
            }
            next = Instant::now() + every;
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_ids_are_crc32_of_the_name() {
        // As Python's zlib.crc32(b"hot") (python/benchmarks/dissemination/latency.py).
        assert_eq!(super::table_id("hot"), 210_272_711);
        assert_eq!(super::table_id("item"), 521_872_670);
    }
}
