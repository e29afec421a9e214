//! [`Follower`]: keeps a store's tables current from a peer's sync port.
//!
//! One thread per table, each with its own connection, runs pull rounds (Ekko's four steps):
//! ask which parts changed since the cursor (a long-poll that returns at once on a change),
//! keep the parts whose sv this replica does not already succeed, pull them with this
//! replica's VVs, and apply each reply (rows last-writer-wins, then the knowledge). A part
//! stays pending until a reply for it is applied, so a broken connection or a refused reply is
//! retried without the peer listing it again. The follower keeps serving reads throughout.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use embstore_common::{now_ms, Error, ErrorKind, Result};
use embstore_replication::Sv;
use embstore_table::sync::{check_parts, SyncOptions, Target};
use embstore_table::{Store, Table};
use parking_lot::Mutex;

use crate::discovery::Directory;
use crate::tls::Stream;
use crate::wire::{self, Kind};
use embstore_proto::frame::HEADER;
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
        }
    }
}

/// Where one followed table stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableSync {
    /// The table.
    pub table: String,
    /// The source's address.
    pub source: String,
    /// Whether the connection is up now.
    pub connected: bool,
    /// Whether the last round left nothing pending (every changed part pulled and applied)
    /// and finished recently (within the long-poll's wait plus 3 s: a link cut silently, with
    /// no reset, is not caught up even before its connection times out).
    pub caught_up: bool,
    /// Parts known changed at the source and not yet applied here.
    pub parts_pending: usize,
    /// Freshness: for each applied reply with new rows, now − the newest row's write time,
    /// over the last 4,096 replies (ms).
    pub lag_ms_p50: Option<f64>,
    pub lag_ms_p99: Option<f64>,
    /// When the last round finished (ms since the epoch; 0: never).
    pub last_round_ms: u64,
    /// Rounds finished (each asks for the change list once).
    pub rounds: u64,
    /// Pull requests, parts received, replies answered from the source's update cache.
    pub pulls: u64,
    pub parts: u64,
    pub parts_from_cache: u64,
    /// Parts whose rows came with the change list (no pull: one round trip fewer).
    pub parts_inline: u64,
    /// Parts listed as changed that were not pulled: this replica already held their shard
    /// version (it had their changes from another source, or from an earlier round).
    pub parts_skipped: u64,
    /// Rows (and tombstones) written here.
    pub rows_applied: u64,
    /// Frame bytes received and sent.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Errors (connection lost, a refused reply) and the last one.
    pub errors: u64,
    pub last_error: Option<String>,
}

/// How often a follower of every table asks its source for the tables it serves, to follow
/// those created since.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// What a follower's threads share: each table's status (a table the source creates later is
/// added), and how far the watch for new tables has come.
#[derive(Debug, Default)]
struct Shared {
    tables: Mutex<Vec<Arc<Mutex<Status>>>>,
    /// Whether new tables are watched for (the follower follows every table).
    watching: bool,
    /// Table lists asked for, and the number of the last one that was answered and whose new
    /// tables are followed.
    lists_begun: AtomicU64,
    lists_done: AtomicU64,
    /// Asks the watch for a table list now (a caller waits to catch up).
    nudge: AtomicBool,
}

impl Shared {
    fn tables(&self) -> Vec<Arc<Mutex<Status>>> {
        self.tables.lock().clone()
    }
}

/// Reads where a follower's tables stand ([`Follower::status_view`]).
#[derive(Clone, Debug)]
pub struct StatusView(Arc<Shared>);

impl StatusView {
    /// Where each followed table stands.
    pub fn status(&self) -> Vec<TableSync> {
        self.0
            .tables()
            .iter()
            .map(|s| {
                let s = s.lock();
                let mut out = s.s.clone();
                (out.lag_ms_p50, out.lag_ms_p99) =
                    (quantile(&s.lags, 0.5), quantile(&s.lags, 0.99));
                out.caught_up &= now_ms().saturating_sub(out.last_round_ms) <= s.stale_ms;
                out
            })
            .collect()
    }

    /// A mark of now for [`StatusView::caught_up_after`]: the rounds each table has begun,
    /// and (following every table) the table lists asked for; the watch is asked for one now.
    pub fn mark(&self) -> CatchUpMark {
        let lists = self.0.watching.then(|| {
            self.0.nudge.store(true, Ordering::Relaxed);
            self.0.lists_begun.load(Ordering::Acquire)
        });
        let rounds = self.0.tables().iter().map(|s| s.lock().rounds_begun).collect();
        CatchUpMark { rounds, lists }
    }

    /// Whether every table is caught up by a round that *began* after `mark` was taken: its
    /// change list was asked for after the mark, so it covers every write the source made
    /// before it, and the round left nothing pending. (A round that began before the mark may
    /// have listed the source's changes before writes made just before it: it never counts.)
    /// Following every table, a table list asked for after the mark must have been answered
    /// too, so a table the source created before the mark is among them.
    pub fn caught_up_after(&self, mark: &CatchUpMark) -> bool {
        if mark.lists.is_some_and(|l| self.0.lists_done.load(Ordering::Acquire) <= l) {
            return false;
        }
        let status = self.status();
        let tables = self.0.tables();
        tables.iter().zip(&status).enumerate().all(|(i, (s, out))| {
            // A table found after the mark: any round counts (all began after it).
            let begun = mark.rounds.get(i).copied().unwrap_or(0);
            out.caught_up && s.lock().caught_up_round > begun
        })
    }

    /// Waits until every table is caught up (a round that left nothing pending and began
    /// after this call, so after the source's writes before it), or `timeout`; whether they
    /// all are.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let mark = self.mark();
        let deadline = Instant::now() + timeout;
        loop {
            let all = self.caught_up_after(&mark);
            if all || Instant::now() >= deadline {
                return all;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The rounds each followed table had begun at [`StatusView::mark`], and the table lists.
#[derive(Clone, Debug)]
pub struct CatchUpMark {
    rounds: Vec<u64>,
    lists: Option<u64>,
}

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

#[derive(Debug, Default)]
struct Status {
    s: TableSync,
    lags: VecDeque<f64>,
    /// A round that has not finished for this long means the link is stuck (a silent cut
    /// drops packets without a reset): `caught_up` then reads false (ms).
    stale_ms: u64,
    /// Rounds begun: the number of the round whose change list was asked for last.
    rounds_begun: u64,
    /// The number of the last round that finished with nothing pending (0: none).
    caught_up_round: u64,
}

/// How long past the long-poll's wait a round may take before the table no longer counts as
/// caught up (ms).
const ROUND_GRACE_MS: u64 = 3000;

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

/// An io error of a send: a failed TLS handshake (rustls reports it as invalid data) means
/// the source is not trusted, or does not trust this follower.
fn untrusted(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::new(
            ErrorKind::PermissionDenied,
            format!("{what}: the TLS handshake with the sync source failed: {e}"),
        ),
        _ => Error::io(what, e),
    }
}

/// One connection to a source's sync port.
struct Link {
    r: BufReader<Stream>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Link {
    fn send(&mut self, kind: Kind, body: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(HEADER + body.len());
        wire::write_frame(&mut frame, kind, body)?;
        let w = self.r.get_mut();
        w.write_all(&frame).and_then(|_| w.flush()).map_err(untrusted("sync send"))?;
        self.bytes_out += frame.len() as u64;
        Ok(())
    }

    /// The next frame; an `Error` frame becomes the error it carries.
    fn recv(&mut self) -> Result<(Kind, Vec<u8>)> {
        let (k, b) = wire::read_frame(&mut self.r).map_err(|e| {
            // TLS failures surface as io errors carrying rustls's message.
            if e.kind() == ErrorKind::Io && e.message().contains("certificate") {
                Error::new(
                    ErrorKind::PermissionDenied,
                    format!("the sync source is not trusted: {e}"),
                )
            } else {
                e
            }
        })?;
        self.bytes_in += (HEADER + b.len()) as u64;
        if k == Kind::Error {
            return Err(wire::decode_error(&b)?);
        }
        Ok((k, b))
    }

    fn expect(&mut self, want: Kind) -> Result<Vec<u8>> {
        let (k, b) = self.recv()?;
        if k != want {
            return Err(Error::corrupt(format!("expected a {want:?} frame, got {k:?}")));
        }
        Ok(b)
    }
}

fn connect(
    source: &str,
    options: &FollowOptions,
    tables: &[String],
) -> Result<(Link, u32, Vec<wire::TableInfo>)> {
    let timeout = Duration::from_millis(options.timeout_ms.max(1));
    let addr = source
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("cannot resolve sync source {source}"), e))?
        .next()
        .ok_or_else(|| Error::invalid(format!("sync source {source} resolves to no address")))?;
    let s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| Error::io(format!("cannot reach sync source {source}"), e))?;
    let _ = s.set_nodelay(true);
    // Replies may take the long-poll's wait plus the transfer.
    let read_timeout = timeout + Duration::from_millis(u64::from(options.wait_ms));
    s.set_read_timeout(Some(read_timeout)).map_err(|e| Error::io("sync connection", e))?;
    let host = source.rsplit_once(':').map_or(source, |(h, _)| h).trim_matches(['[', ']']);
    let config = options.tls.as_ref().map(ClientTls::config).transpose()?;
    let tls = config.as_ref().zip(options.tls.as_ref()).map(|(c, t)| (c, t.name_for(host)));
    let r = BufReader::with_capacity(256 << 10, Stream::client(s, tls)?);
    let mut link = Link { r, bytes_in: 0, bytes_out: 0 };
    let hello = wire::Hello {
        protocol: wire::PROTOCOL,
        token: options.token.clone(),
        with_state: options.with_state,
        tables: tables.to_vec(),
    };
    link.send(Kind::Hello, &hello.encode())?;
    let (replica, infos) = wire::decode_welcome(&link.expect(Kind::Welcome)?)?;
    Ok((link, replica, infos))
}

/// What a follower knows of its source's parts (the neighbour book).
#[derive(Default)]
struct Book {
    epoch: u64,
    cursor: u64,
    their_sv: HashMap<u32, Sv>,
    pending: BTreeSet<u32>,
    /// Where applied replies are recorded ([`FollowOptions::events`]).
    events: Option<BufWriter<std::fs::File>>,
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

/// One line per table for a directory's `status`: lag, pending parts, bytes in, source.
fn report(all: &[Arc<Mutex<Status>>]) -> String {
    all.iter()
        .map(|s| {
            let s = s.lock();
            let p99 = quantile(&s.lags, 0.99).map_or("-".to_owned(), |v| format!("{v:.0}"));
            format!(
                "{} lag_p99_ms={p99} pending={} bytes_in={} source={} errors={};",
                s.s.table, s.s.parts_pending, s.s.bytes_in, s.s.source, s.s.errors
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn quantile(lags: &VecDeque<f64>, q: f64) -> Option<f64> {
    if lags.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = lags.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * q).round() as usize])
}

fn follow_table(
    target: &dyn Target,
    info: &wire::TableInfo,
    source: &Source,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Mutex<Status>,
) {
    let events = options.events.as_ref().and_then(|p| {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(p);
        match f {
            Ok(f) => Some(BufWriter::new(f)),
            Err(e) => {
                status.lock().s.last_error = Some(format!("cannot open {}: {e}", p.display()));
                None
            }
        }
    });
    let mut book = Book { events, ..Book::default() };
    let mut current: Option<Arc<Table>> = None;
    let name = info.name.as_str();
    while !stop.load(Ordering::Relaxed) {
        let (addr, t) = match (source.pick(name), target.table(name)) {
            (Some(addr), Some(t)) => (addr, t),
            (addr, _) => {
                let mut s = status.lock();
                s.s.last_error = Some(if addr.is_some() {
                    "no version of this table that syncs is held here".into()
                } else {
                    "no sync source is registered for this table".into()
                });
                s.s.caught_up = false;
                drop(s);
                std::thread::sleep(Duration::from_millis(options.retry_ms));
                continue;
            }
        };
        if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &t)) {
            // A new version to write into (a roll loaded it): its knowledge is its own, so
            // start over with the source's complete change list.
            book = Book { events: book.events.take(), ..Book::default() };
            current = Some(t.clone());
        }
        status.lock().s.source = addr.clone();
        let result = check_parts(&t, info.parts, &addr)
            .and_then(|_| connect(&addr, options, &[name.to_owned()]))
            .and_then(|(mut link, _, _)| {
                status.lock().s.connected = true;
                let here = (source, addr.as_str(), target);
                let r = rounds(&t, &mut link, options, stop, status, &mut book, here);
                let mut s = status.lock();
                s.s.bytes_in += link.bytes_in;
                s.s.bytes_out += link.bytes_out;
                r
            });
        let mut s = status.lock();
        s.s.connected = false;
        if let Err(e) = result {
            s.s.errors += 1;
            s.s.last_error = Some(e.to_string());
            s.s.caught_up = false;
        }
        drop(s);
        // Sleep in small steps so that a stop is seen quickly.
        let until = Instant::now() + Duration::from_millis(options.retry_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn rounds(
    t: &Arc<Table>,
    link: &mut Link,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Mutex<Status>,
    book: &mut Book,
    (source, addr, target): (&Source, &str, &dyn Target),
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        if source.pick(t.name()).as_deref() != Some(addr) {
            return Ok(()); // the directory names another source now: switch to it
        }
        if !target.table(t.name()).is_some_and(|now| Arc::ptr_eq(&now, t)) {
            return Ok(()); // another version to write into now (a roll)
        }
        let round = {
            let mut s = status.lock();
            s.rounds_begun += 1;
            s.rounds_begun
        };
        let list = wire::List {
            table: t.name().to_owned(),
            epoch: book.epoch,
            cursor: book.cursor,
            // With parts pending (a failed pull), ask without waiting.
            wait_ms: if book.pending.is_empty() { options.wait_ms } else { 0 },
        };
        link.send(Kind::List, &list.encode())?;
        let (changes, _their_now) = wire::decode_changed(&link.expect(Kind::Changed)?)?;
        if changes.epoch != book.epoch {
            // The source restarted (or this is the first round): its list is complete.
            book.their_sv.clear();
            book.pending.clear();
        }
        for (p, sv) in &changes.parts {
            book.their_sv.insert(*p, *sv);
            book.pending.insert(*p);
        }
        let listed: Vec<u32> = changes.parts.iter().map(|(p, _)| *p).collect();
        // The rows of small changes come with the list: those parts are done.
        pull_replies(t, link, status, book, true)?;
        let inlined: BTreeSet<u32> =
            listed.into_iter().filter(|p| !book.pending.contains(p)).collect();
        (book.epoch, book.cursor) = (changes.epoch, changes.upto);
        if !options.skip_by_sv {
            // Every part, every round: what a replica without shard versions must do (but
            // those that just came with the list).
            book.pending.extend((0..t.sync_parts()?).filter(|p| !inlined.contains(p)));
            book.their_sv.clear();
        }
        let mut todo = Vec::new();
        for &p in &book.pending {
            let mine = t.sync_knowledge(p)?.1;
            if !book.their_sv.get(&p).is_some_and(|sv| mine.succeq(sv)) {
                todo.push(p);
            }
        }
        let skipped = (book.pending.len() - todo.len()) as u64;
        book.pending = todo.iter().copied().collect();
        // Every pull request goes out at once (they are small), then the replies are read in
        // order: a round costs one round trip for the list and one for all the pulls.
        let batches: Vec<&[u32]> = todo.chunks(PARTS_PER_PULL).collect();
        for batch in &batches {
            let parts = batch
                .iter()
                .map(|&p| Ok((p, t.sync_knowledge(p)?.0)))
                .collect::<Result<Vec<_>>>()?;
            link.send(Kind::Pull, &wire::encode_pull(t.name(), &parts))?;
        }
        for _ in &batches {
            pull_replies(t, link, status, book, false)?;
        }
        if let Some(e) = book.events.as_mut() {
            let _ = e.flush();
        }
        let mut s = status.lock();
        s.s.pulls += todo.len().div_ceil(PARTS_PER_PULL) as u64;
        s.s.parts_skipped += skipped;
        s.s.parts_pending = book.pending.len();
        s.s.caught_up = book.pending.is_empty();
        if s.s.caught_up {
            s.caught_up_round = round;
        }
        s.s.last_round_ms = now_ms();
        s.s.rounds += 1;
        s.s.bytes_in += std::mem::take(&mut link.bytes_in);
        s.s.bytes_out += std::mem::take(&mut link.bytes_out);
    }
    Ok(())
}

/// Reads and applies `Part`s up to `PullDone`: a pull's replies, or (`inline`) those that came
/// with a change list.
fn pull_replies(
    t: &Table,
    link: &mut Link,
    status: &Mutex<Status>,
    book: &mut Book,
    inline: bool,
) -> Result<()> {
    loop {
        let (kind, body) = link.recv()?;
        match kind {
            Kind::PullDone => return Ok(()),
            Kind::Part => {
                let reply = wire::decode_part(&body, t.dim(), t.state_dim())?;
                let newest = reply.meta.iter().map(|m| m.version.ms()).max();
                let written = t.sync_apply(&reply)?;
                if !reply.partial {
                    book.pending.remove(&reply.part);
                    if let Some(e) = book.events.as_mut() {
                        let newest = t.sync_knowledge(reply.part)?.0.max_timestamp();
                        let us = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_micros() as u64);
                        let mut rec = [0u8; 24];
                        rec[..8].copy_from_slice(&us.to_le_bytes());
                        rec[8..12].copy_from_slice(&table_id(t.name()).to_le_bytes());
                        rec[12..16].copy_from_slice(&reply.part.to_le_bytes());
                        rec[16..].copy_from_slice(&newest.to_le_bytes());
                        let _ = e.write_all(&rec);
                    }
                }
                let mut s = status.lock();
                s.s.parts += u64::from(!reply.partial);
                s.s.parts_from_cache += u64::from(!reply.partial && reply.from_cache);
                s.s.parts_inline += u64::from(!reply.partial && inline);
                s.s.rows_applied += written as u64;
                if let (Some(newest), true) = (newest, written > 0) {
                    let lag = now_ms().saturating_sub(newest) as f64;
                    if s.lags.len() == LAG_SAMPLES {
                        s.lags.pop_front();
                    }
                    s.lags.push_back(lag);
                }
            }
            k => return Err(Error::corrupt(format!("unexpected sync frame {k:?} in a pull"))),
        }
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
