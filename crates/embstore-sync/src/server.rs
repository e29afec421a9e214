//! [`SyncServer`]: the sync port of a store. Each connection says `Hello` (token, tables,
//! whether it wants optimizer state), then asks `List` (long-poll: the parts changed since its
//! cursor) and `Pull` (the rows of parts newer than its VVs), one request at a time. One thread
//! per connection: a replica has a few neighbours, each with one connection per table.
//!
//! A change list also carries the rows of small changes: the connection
//! remembers, per part, what the client knows at least (the VV it pulled with, merged with the
//! VV of the reply it got: the client applies replies in order or drops the connection), and a
//! listed part whose rows since then the update cache can give is answered with the list, up to
//! [`INLINE_ROWS`] rows a list. The client is spared a round trip for it.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use embstore_common::{now_ms, Error, ErrorKind, Result};
use embstore_replication::Vv;
use embstore_table::sync::{PrioritisedReply, PrioritisedSent, SyncOptions};
use embstore_table::{Store, Table};
use parking_lot::Mutex;
use wire::ALL_PARTS;

use crate::tls::Stream;
use crate::wire::{self, Kind};
use embstore_proto::frame::HEADER;
use embstore_proto::tls::rustls::ServerConfig;
use embstore_proto::tls::ServerTls;

/// The longest a `List` waits for a change.
pub const MAX_WAIT_MS: u32 = 5_000;

/// The most rows a change list carries.
pub const INLINE_ROWS: usize = 4096;

/// A connection with no request for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A write that makes no progress for this long drops the connection and what it buffered: a
/// client that never reads cannot pin its answers (an 8 MiB piece takes ~0.7 s at 100 Mbit/s,
/// so a live reader is never near this).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest Hello accepted (before the token is checked): a client that announces more is
/// refused before anything is allocated for it. A Hello is a token and table names: 1 MiB
/// holds thousands.
const MAX_HELLO: usize = 1 << 20;

/// How long a TLS port waits for a new connection's first byte to tell a plaintext client
/// (told to use TLS) from a TLS one.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a [`SyncServer`] runs.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// The replication token a client must present (`None`: any client is served).
    pub token: Option<String>,
    /// The sync options the store's tables get (see [`Store::enable_sync`]).
    pub sync: SyncOptions,
    /// TLS (with a client CA, mutual TLS; the serving port's identity, typically); `None`:
    /// plaintext.
    pub tls: Option<ServerTls>,
}

/// What the sync port did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections refused (bad token, bad hello).
    pub refused: u64,
    /// Frame bytes received and sent.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Pull requests served and parts answered.
    pub pulls: u64,
    pub parts: u64,
    /// Parts answered with a change list, without a pull.
    pub parts_inline: u64,
    /// Prioritised pulls served, and the rows they carried.
    pub prioritised_pulls: u64,
    pub prioritised_rows: u64,
    /// What the frames sent would have taken unpacked (16-byte headers and bodies as they
    /// are): `bytes_out` over this is what packing and compression saved (protocol 6).
    pub bytes_out_raw: u64,
    /// Frames sent (after packing), and PACKED frames among them.
    pub frames_out: u64,
    pub packed_out: u64,
    /// Where the raw bytes went: change lists' bodies, parts' bodies, the rows those parts
    /// carried, and the value (and state) bytes among those bodies.
    pub changed_bytes: u64,
    pub part_bytes: u64,
    pub part_rows: u64,
    pub value_bytes: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    pulls: AtomicU64,
    parts_inline: AtomicU64,
    parts: AtomicU64,
    prioritised_pulls: AtomicU64,
    prioritised_rows: AtomicU64,
    bytes_out_raw: AtomicU64,
    frames_out: AtomicU64,
    packed_out: AtomicU64,
    changed_bytes: AtomicU64,
    part_bytes: AtomicU64,
    part_rows: AtomicU64,
    value_bytes: AtomicU64,
}

/// A running sync port; [`SyncServer::stop`] (or drop) closes it and its connections.
#[derive(Debug)]
pub struct SyncServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    counters: Arc<Counters>,
    accept: Option<JoinHandle<()>>,
}

/// The open connections (a clone of each, so that a stop can shut them), by number; each
/// connection's thread takes its own out when it ends, so its socket closes then.
#[derive(Debug, Default)]
struct Conns {
    next: AtomicU64,
    open: Mutex<HashMap<u64, TcpStream>>,
}

impl Conns {
    fn add(&self, s: &TcpStream) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = s.try_clone() {
            self.open.lock().insert(id, c);
        }
        id
    }

    fn remove(&self, id: u64) {
        self.open.lock().remove(&id);
    }

    fn shutdown_all(&self) {
        for (_, c) in self.open.lock().drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counters")
    }
}

impl SyncServer {
    /// Turns sync on in `store` ([`Store::enable_sync`]) and serves it on `addr`
    /// (`host:port`; port 0 picks one, see [`SyncServer::addr`]).
    pub fn start(store: Arc<Store>, addr: &str, options: ServeOptions) -> Result<Self> {
        let tls = options.tls.as_ref().map(ServerTls::config).transpose()?;
        store.enable_sync(&options.sync)?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("cannot listen for sync on {addr}"), e))?;
        let local = listener.local_addr().map_err(|e| Error::io("sync listener", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("sync listener", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Conns::default());
        warn_if_open(&local, options.token.as_deref());
        let counters = Arc::new(Counters::default());
        let token = Arc::new((options.token, tls));
        let accept = {
            let (stop, conns, counters) = (stop.clone(), conns.clone(), counters.clone());
            std::thread::Builder::new()
                .name("embstore-sync-accept".into())
                .spawn(move || accept_loop(listener, store, token, stop, conns, counters))
                .map_err(|e| Error::io("cannot start the sync thread", e))?
        };
        Ok(Self { addr: local, stop, conns, counters, accept: Some(accept) })
    }

    /// The address the port listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the port did so far.
    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections: g(&c.connections),
            refused: g(&c.refused),
            bytes_in: g(&c.bytes_in),
            bytes_out: g(&c.bytes_out),
            pulls: g(&c.pulls),
            parts: g(&c.parts),
            parts_inline: g(&c.parts_inline),
            prioritised_pulls: g(&c.prioritised_pulls),
            prioritised_rows: g(&c.prioritised_rows),
            bytes_out_raw: g(&c.bytes_out_raw),
            frames_out: g(&c.frames_out),
            packed_out: g(&c.packed_out),
            changed_bytes: g(&c.changed_bytes),
            part_bytes: g(&c.part_bytes),
            part_rows: g(&c.part_rows),
            value_bytes: g(&c.value_bytes),
        }
    }

    /// Stops accepting and closes every connection.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.conns.shutdown_all();
    }
}

impl Drop for SyncServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(
    listener: TcpListener,
    store: Arc<Store>,
    token: Arc<(Option<String>, Option<Arc<ServerConfig>>)>,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    counters: Arc<Counters>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                counters.connections.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                // A client that goes quiet for longer than any long-poll is gone.
                let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                let id = conns.add(&stream);
                let (store, token, counters) = (store.clone(), token.clone(), counters.clone());
                let conns2 = conns.clone();
                let spawned = std::thread::Builder::new().name("embstore-sync-conn".into()).spawn(
                    move || {
                        let guard = (token.0.as_deref(), token.1.as_ref());
                        let _ = serve_conn(&store, stream, guard, &counters);
                        conns2.remove(id);
                    },
                );
                if spawned.is_err() {
                    conns.remove(id);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Says loudly when a port that other hosts can reach takes any client.
fn warn_if_open(addr: &SocketAddr, token: Option<&str>) {
    if token.is_none() && !addr.ip().is_loopback() {
        eprintln!(
            "embstore: WARNING: the sync port on {addr} serves every row to any client that \
             connects: it has no replication token (pass token= to serve_sync, or \
             --sync-token-file to embstore serve)"
        );
    }
}

struct Conn<'a> {
    /// Reads through a buffer; writes gather in `out` until [`Conn::flush`].
    r: BufReader<Stream>,
    out: Vec<u8>,
    counters: &'a Counters,
    /// A send failed (the client is gone, or stopped reading past the deadline): nothing
    /// more is sent, and the connection ends.
    broken: bool,
    /// A client of protocol 6: the frames of an answer gather here and go as one PACKED
    /// frame (compressed where that pays) when the answer is flushed.
    pack: Option<wire::Packer>,
}

impl Conn<'_> {
    fn recv(&mut self) -> Result<(Kind, Vec<u8>)> {
        let (k, b) = wire::read_frame(&mut self.r)?;
        self.counters.bytes_in.fetch_add((HEADER + b.len()) as u64, Ordering::Relaxed);
        Ok((k, b))
    }

    fn send(&mut self, kind: Kind, body: &[u8]) -> Result<()> {
        let raw = (HEADER + body.len()) as u64;
        self.counters.bytes_out_raw.fetch_add(raw, Ordering::Relaxed);
        if kind == Kind::Changed {
            self.counters.changed_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        }
        match &mut self.pack {
            Some(p) if wire::packs(kind) => {
                p.push(kind, body);
                if p.len() >= wire::PACK_MAX {
                    self.seal()?;
                }
            }
            _ => {
                self.seal()?;
                self.put(kind, body)?;
            }
        }
        if self.out.len() >= 256 << 10 {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes one frame to the buffer.
    fn put(&mut self, kind: Kind, body: &[u8]) -> Result<()> {
        wire::write_frame(&mut self.out, kind, body)?;
        self.counters.bytes_out.fetch_add((HEADER + body.len()) as u64, Ordering::Relaxed);
        self.counters.frames_out.fetch_add(1, Ordering::Relaxed);
        if kind == Kind::Packed {
            self.counters.packed_out.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes what the packer gathered, as one frame.
    fn seal(&mut self) -> Result<()> {
        match self.pack.as_mut().and_then(wire::Packer::seal) {
            Some((kind, body)) => self.put(kind, &body),
            None => Ok(()),
        }
    }

    /// Counts a part's body: its rows and value bytes.
    fn count_part(&self, body: &[u8], rows: usize, value_bytes: usize) {
        let c = self.counters;
        c.part_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        c.part_rows.fetch_add(rows as u64, Ordering::Relaxed);
        c.value_bytes.fetch_add(value_bytes as u64, Ordering::Relaxed);
    }

    /// Sends what is buffered within [`WRITE_TIMEOUT`] in all (not per system call: a reader
    /// that takes a byte now and then does not keep the connection), or fails, and the
    /// connection ends with its buffers.
    fn flush(&mut self) -> Result<()> {
        let r = self.seal().and_then(|()| self.flush_within());
        self.broken |= r.is_err();
        r
    }

    fn flush_within(&mut self) -> Result<()> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let w = self.r.get_mut();
        w.write_all_by(&self.out, deadline).map_err(|e| Error::io("sync send", e))?;
        self.out.clear();
        Ok(())
    }

    fn fail(&mut self, e: &Error) -> Result<()> {
        if self.broken {
            return Err(e.clone());
        }
        self.send(Kind::Error, &wire::encode_error(e))?;
        self.flush()
    }
}

fn serve_conn(
    store: &Store,
    stream: TcpStream,
    (token, tls): (Option<&str>, Option<&Arc<ServerConfig>>),
    counters: &Counters,
) -> Result<()> {
    if tls.is_some() && !starts_tls(&stream) {
        // A plaintext client of a TLS port: tell it so, in plaintext (its Hello would only
        // fail the handshake, and it would hear nothing).
        counters.refused.fetch_add(1, Ordering::Relaxed);
        let e = Error::new(
            ErrorKind::PermissionDenied,
            "this sync port speaks TLS: follow it with TLS (tls_ca= in Python, --sync-tls-ca \
             on the command line)",
        );
        let mut out = Vec::new();
        wire::write_frame(&mut out, Kind::Error, &wire::encode_error(&e))?;
        let mut s = &stream;
        return s.write_all(&out).map_err(|e| Error::io("sync send", e));
    }
    let r = BufReader::with_capacity(256 << 10, Stream::server(stream, tls)?);
    let mut c = Conn { r, out: Vec::new(), counters, broken: false, pack: None };
    let first = match wire::read_or_legacy(&mut c.r, MAX_HELLO) {
        Ok(Err(wire::Legacy::Hello)) => {
            // A follower of an older build: told in its own framing to upgrade.
            counters.refused.fetch_add(1, Ordering::Relaxed);
            c.out = wire::legacy_error_frame();
            return c.flush();
        }
        Ok(Err(_)) => Err(Error::corrupt("not an embstore sync frame")),
        Ok(Ok((k, b))) => {
            c.counters.bytes_in.fetch_add((HEADER + b.len()) as u64, Ordering::Relaxed);
            Ok((k, b))
        }
        Err(e) => Err(e),
    };
    let hello = match first.and_then(|(k, b)| match k {
        Kind::Hello => wire::Hello::decode(&b),
        _ => Err(Error::corrupt("a sync connection must start with Hello")),
    }) {
        Ok(h) => h,
        Err(e) => {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return c.fail(&e);
        }
    };
    if let Some(want) = token {
        if !embstore_common::same_secret(want.as_bytes(), hello.token.as_bytes()) {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            let e = Error::new(
                ErrorKind::PermissionDenied,
                if hello.token.is_empty() {
                    "this sync port requires a replication token and the follower sent none \
                     (token= in Python, --sync-token-file on the command line)"
                } else {
                    "wrong replication token"
                },
            );
            return c.fail(&e);
        }
    }
    let names = if hello.tables.is_empty() { store.tables() } else { hello.tables.clone() };
    let tables = match names.iter().map(|n| store.table(n)).collect::<Result<Vec<_>>>() {
        Ok(t) => t,
        Err(e) => return c.fail(&e),
    };
    let infos = tables
        .iter()
        .map(|t| {
            let s = t.sync_stats()?;
            Ok(wire::TableInfo {
                name: t.name().to_owned(),
                config: t.config().to_text(),
                parts: s.parts,
                epoch: s.epoch,
            })
        })
        .collect::<Result<Vec<_>>>();
    match infos {
        Ok(infos) => {
            c.send(Kind::Welcome, &wire::encode_welcome(store.replica(), &infos))?;
            c.flush()?;
        }
        Err(e) => return c.fail(&e),
    }
    if hello.protocol >= wire::PACKED_PROTOCOL {
        c.pack = Some(wire::Packer::default());
    }
    // Per (table, part): what the client knows at least.
    let mut known: HashMap<(String, u32), Vv> = HashMap::new();
    // Per table, per part: the significant writes prioritised pulls sent it (their TSVVs).
    let mut ahead: HashMap<String, PrioritisedSent> = HashMap::new();
    loop {
        let (kind, body) = c.recv()?;
        let done = match kind {
            Kind::List => list(store, &mut c, &body, &mut known, &hello),
            Kind::Pull => pull(store, &mut c, &body, &hello, &mut known),
            Kind::PrioritisedPull => prioritised_pull(store, &mut c, &body, &hello, &mut ahead),
            Kind::Rollback => rollback(store, &mut c, &body),
            _ => Err(Error::corrupt(format!("unexpected sync frame {kind:?}"))),
        };
        match done {
            Ok(()) => c.flush()?,
            // A frame that does not parse ends the connection; any other error is answered.
            Err(e) if e.kind() == ErrorKind::Corruption => return c.fail(&e),
            Err(e) => c.fail(&e)?,
        }
    }
}

/// Whether a new connection's first byte opens a TLS handshake record (0x16); `false` when
/// the client sends something else, or nothing for [`FIRST_BYTE_TIMEOUT`].
fn starts_tls(s: &TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(FIRST_BYTE_TIMEOUT));
    let mut b = [0u8; 1];
    let tls = matches!(s.peek(&mut b), Ok(1) if b[0] == 0x16);
    let _ = s.set_read_timeout(Some(IDLE_TIMEOUT));
    tls
}

/// A rollback's request: pause or resume writes (and prioritised sync) on one table or every
/// table, or write a witness's rows; answered with how many tables or rows it changed.
fn rollback(store: &Store, c: &mut Conn, body: &[u8]) -> Result<()> {
    let req = wire::Rollback::decode(body, |t| Ok(table_of(store, t)?.dim()))?;
    let tables = match req.table() {
        "" => store.tables().iter().map(|n| store.table(n)).collect::<Result<Vec<_>>>()?,
        name => vec![table_of(store, name)?],
    };
    let mut done = 0u64;
    for t in &tables {
        match &req {
            wire::Rollback::Pause { reason, .. } => {
                t.pause_writes(Some(reason));
                t.set_prioritised_sync(false)?;
                done += 1;
            }
            wire::Rollback::Resume { .. } => {
                t.pause_writes(None);
                t.set_prioritised_sync(true)?;
                done += 1;
            }
            wire::Rollback::Write { rows, .. } => {
                let (keys, values): (Vec<u64>, Vec<Option<Vec<f32>>>) =
                    rows.iter().cloned().unzip();
                done += t.rollback_write(&keys, &values)? as u64;
            }
        }
    }
    c.send(Kind::RollbackDone, &done.to_le_bytes())
}

fn table_of(store: &Store, name: &str) -> Result<Arc<Table>> {
    store.table(name)
}

/// Answers a `List`; also sends the rows of the listed parts the
/// update cache can give, then `PullDone`.
fn list(
    store: &Store,
    c: &mut Conn<'_>,
    body: &[u8],
    known: &mut HashMap<(String, u32), Vv>,
    hello: &wire::Hello,
) -> Result<()> {
    let with_state = hello.with_state;
    let l = wire::List::decode(body)?;
    let t = table_of(store, &l.table)?;
    let wait = Duration::from_millis(u64::from(l.wait_ms.min(MAX_WAIT_MS)));
    t.sync_wait(l.epoch, l.cursor, wait)?;
    let changes = t.sync_changes(l.epoch, l.cursor)?;
    c.send(Kind::Changed, &wire::encode_changed(&changes, now_ms()))?;
    let mut budget = INLINE_ROWS;
    for &(part, _) in &changes.parts {
        let key = (l.table.clone(), part);
        let Some(vv) = known.get(&key) else { continue };
        let Some(reply) = t.sync_pull_cached(part, vv, with_state, budget)? else { continue };
        budget -= reply.len();
        send_reply(c, &t, reply, hello, known, key, vv.clone())?;
        c.counters.parts_inline.fetch_add(1, Ordering::Relaxed);
    }
    c.send(Kind::PullDone, &[])
}

fn pull(
    store: &Store,
    c: &mut Conn<'_>,
    body: &[u8],
    hello: &wire::Hello,
    known: &mut HashMap<(String, u32), Vv>,
) -> Result<()> {
    let with_state = hello.with_state;
    let (name, mut parts) = wire::decode_pull(body)?;
    let t = table_of(store, &name)?;
    // A part named twice is answered once: each answer is a scan or a cache walk, so a small
    // request must not ask for the same work many times over.
    let mut seen = std::collections::HashSet::new();
    parts.retain(|(p, _)| seen.insert(*p));
    if parts.len() > t.sync_parts()? as usize {
        return Err(Error::invalid(format!(
            "a pull of {} parts of table '{name}', which has {}",
            parts.len(),
            t.sync_parts()?
        )));
    }
    c.counters.pulls.fetch_add(1, Ordering::Relaxed);
    let rows = piece_rows(&t, with_state);
    for (part, vv) in parts {
        // Read and sent a piece at a time: a part of any size costs one piece here.
        let mut knows = vv.clone();
        t.sync_pull_pieces(part, &vv, with_state, rows, &mut |piece| {
            if !piece.partial {
                knows.merge(&piece.vv);
            }
            send_part(c, piece, hello)
        })?;
        known.insert((name.clone(), part), knows);
        c.counters.parts.fetch_add(1, Ordering::Relaxed);
    }
    c.send(Kind::PullDone, &[])
}

/// A part's piece for this requester: significant versions and the SVV only to one that
/// speaks prioritised sync (an older one would refuse the frame); values at the precision it
/// asked for (f16 only from protocol 6, see [`wire::Hello::precision`]).
fn encode_for(mut piece: embstore_table::sync::PartReply, hello: &wire::Hello) -> Vec<u8> {
    if hello.protocol < wire::PRIORITY_PROTOCOL {
        piece.sigv.clear();
        piece.svv = None;
    }
    let precision = if hello.protocol >= wire::PACKED_PROTOCOL {
        hello.precision
    } else {
        wire::Precision::F32
    };
    wire::encode_part_as(&piece, precision)
}

/// Encodes `piece` for the requester and sends it.
fn send_part(
    c: &mut Conn<'_>,
    piece: embstore_table::sync::PartReply,
    hello: &wire::Hello,
) -> Result<()> {
    let rows = piece.len();
    let half = hello.protocol >= wire::PACKED_PROTOCOL && hello.precision == wire::Precision::F16;
    let values = piece.values.len() * if half { 2 } else { 4 }
        + piece.state.as_ref().map_or(0, |s| s.len() * 4);
    let body = encode_for(piece, hello);
    c.count_part(&body, rows, values);
    c.send(Kind::Part, &body)
}

/// Answers a prioritised pull: per part, the rows with significant writes the requester's
/// TSVV lacks (`Table::sync_pull_prioritised`), then `PullDone`. A pull of the one part
/// [`ALL_PARTS`] asks for the whole table with one TSVV: the parts that have rows for it,
/// then a last part [`ALL_PARTS`] with no row that carries the table's TSVV.
/// How long a prioritised pull of the whole table waits for a significant write when there
/// is none it could send (a long-poll: the row leaves as soon as it is written).
const AHEAD_WAIT: Duration = Duration::from_millis(100);

fn prioritised_pull(
    store: &Store,
    c: &mut Conn<'_>,
    body: &[u8],
    hello: &wire::Hello,
    ahead: &mut HashMap<String, PrioritisedSent>,
) -> Result<()> {
    if hello.protocol < wire::PRIORITY_PROTOCOL {
        return Err(Error::corrupt("a prioritised pull from a follower of protocol 4"));
    }
    let (name, mut parts) = wire::decode_pull(body)?;
    let t = table_of(store, &name)?;
    let mut seen = std::collections::HashSet::new();
    parts.retain(|(p, _)| seen.insert(*p));
    if parts.len() > t.sync_parts()? as usize {
        return Err(Error::invalid(format!(
            "a prioritised pull of {} parts of table '{name}', which has {}",
            parts.len(),
            t.sync_parts()?
        )));
    }
    c.counters.prioritised_pulls.fetch_add(1, Ordering::Relaxed);
    if let [(ALL_PARTS, tsvv)] = parts.as_slice() {
        // The whole table: the parts with rows, then the table's TSVV (every part knows it).
        let sent = ahead.entry(name.clone()).or_default();
        let known = t.sync_pull_prioritised_all(tsvv, sent, AHEAD_WAIT, &mut |reply| {
            c.counters.prioritised_rows.fetch_add(reply.len() as u64, Ordering::Relaxed);
            c.send(Kind::PrioritisedPart, &wire::encode_prioritised(&reply))
        })?;
        let last = PrioritisedReply { part: ALL_PARTS, tsvv: known, ..Default::default() };
        c.send(Kind::PrioritisedPart, &wire::encode_prioritised(&last))?;
        return c.send(Kind::PullDone, &[]);
    }
    for (part, tsvv) in parts {
        let reply = t.sync_pull_prioritised(part, &tsvv)?;
        c.counters.prioritised_rows.fetch_add(reply.len() as u64, Ordering::Relaxed);
        c.send(Kind::PrioritisedPart, &wire::encode_prioritised(&reply))?;
    }
    c.send(Kind::PullDone, &[])
}

/// Rows in a reply's piece: about 8 MiB on the wire, well under the frame limit.
fn piece_rows(t: &Table, with_state: bool) -> usize {
    let row_bytes = 41 + 4 * (t.dim() + if with_state { t.state_dim() } else { 0 });
    (8 << 20) / row_bytes
}

/// Sends `reply` (in pieces of about 8 MiB, well under the frame limit) to a client that knew
/// `vv`, and notes what it knows once it applied it: `vv` merged with the reply's.
fn send_reply(
    c: &mut Conn<'_>,
    t: &Table,
    reply: embstore_table::sync::PartReply,
    hello: &wire::Hello,
    known: &mut HashMap<(String, u32), Vv>,
    key: (String, u32),
    mut vv: Vv,
) -> Result<()> {
    vv.merge(&reply.vv);
    for piece in reply.split(piece_rows(t, hello.with_state)) {
        send_part(c, piece, hello)?;
    }
    known.insert(key, vv);
    Ok(())
}
