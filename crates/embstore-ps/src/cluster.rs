//! A parameter server over several processes: each process holds the masters of the rows
//! hashed to it (as a distributed training store places them) or placed on it and serves them to the others on embstore's one wire (the PS message set of
//! `embstore_proto::frame`); process 0 coordinates the clocks.
//!
//! A clock's deltas are staged at their owners and applied only once every process has pushed
//! the clock (the coordinator then asks every process to apply it, in (clock, process, arrival)
//! order, and releases the barrier once all have): a read always sees whole clocks, and every
//! answer says which clock its rows reflect, so a reader never counts its own updates twice.
//!
//! ```text
//! PS_READ   table u32 | n u32 | n keys (u64)
//! PS_ROWS   applied clock i64 | n u32 | dim u32 | n × dim float32   (in request order)
//! PS_ADD    clock u32 | from u32 | table u32 | n u32 | dim u32 | n keys | n × dim float32
//! PS_DONE   clock u32 | from u32        (to process 0; answered by PS_ACK once applied)
//! PS_APPLY  clock u32                   (from process 0; answered by PS_ACK)
//! PS_GATHER tag u64 | from u32 | payload  (to process 0; answered, once every process has
//!           sent its part, by PS_GATHERED: P × (len u32 | payload), in process order)
//! PS_MOVE   table u32 | n u32 | dim u32 | n keys | n × dim float32   (rows placement hands
//!           to the receiver; answered by PS_ACK)
//! PS_ACK    empty
//! ```
//!
//! Placement: every process sends the rows its workers access to all the others (an all-gather
//! through process 0) and each computes the same map: a row goes to the accessing process with
//! the fewest rows so far (rows in key order, ties to the lower process); rows no process
//! accesses stay hashed. A row's old owner hands it to its new one (PS_MOVE) before the next
//! all-gather releases everyone.

#[cfg(target_endian = "big")]
compile_error!("the parameter server's wire copies float32 rows as little-endian bytes");

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_common::bytes::Writer;
use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::frame::{self, ErrorBody, Kind, Service, HEADER};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::masters::{Masters, Prepared};

/// The largest frame a process accepts (1 GiB).
const MAX_FRAME: usize = 1 << 30;
/// How long a process waits for a peer to come up.
const CONNECT_FOR: Duration = Duration::from_secs(60);

/// One clock's deltas for this process's rows, from one process.
struct Staged {
    clock: u32,
    from: u32,
    seq: u64,
    table: usize,
    keys: Vec<u64>,
    deltas: Vec<f32>,
}

/// An all-gather in progress at the coordinator.
#[derive(Default)]
struct Gathering {
    parts: Vec<Option<Vec<u8>>>,
    answered: usize,
}

#[derive(Default)]
struct Coord {
    gathers: BTreeMap<u64, Gathering>,
    arrived: BTreeMap<u32, usize>,
    released: i64,
    error: Option<Error>,
    /// Per barrier: the releases sent to the other processes.
    answered: BTreeMap<u32, usize>,
}

/// A connection to a peer (requests and answers in turn).
struct Conn {
    stream: TcpStream,
}

/// This process's part of a parameter server spread over processes.
pub struct Cluster {
    rank: usize,
    addrs: Vec<SocketAddr>,
    local: Arc<dyn Masters>,
    /// Per peer: a data connection (reads, adds) and a control one (barriers).
    data: Vec<Mutex<Option<Conn>>>,
    control: Vec<Mutex<Option<Conn>>>,
    staged: Mutex<Vec<Staged>>,
    seq: AtomicU64,
    /// Applying holds it exclusively; reads of the local rows share it.
    apply_lock: RwLock<()>,
    applied: AtomicI64,
    coord: Mutex<Coord>,
    coord_cv: Condvar,
    stop: AtomicBool,
    claimed: AtomicBool,
    /// Per table: rows placement put on another process than their hash's.
    placed: RwLock<Vec<hashbrown::HashMap<u64, u32>>>,
    gather_tag: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("rank", &self.rank).field("addrs", &self.addrs).finish()
    }
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::io(what, e)
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; u8 has alignment 1 and any byte is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `as_bytes`, and every bit pattern is a valid f32, so writing bytes is sound.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn u32_at(b: &[u8], i: usize) -> Result<u32> {
    b.get(i..i + 4)
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .ok_or_else(|| Error::corrupt("a parameter-server frame was cut short"))
}

/// `prefix | table | n | dim | n keys | n × dim float32`: the body of PS_ADD and PS_MOVE.
fn rows_body(prefix: &[u32], table: usize, keys: &[u64], values: &[f32], dim: usize) -> Vec<u8> {
    let mut w = Writer::with_capacity(4 * prefix.len() + 12 + keys.len() * 8 + values.len() * 4);
    for p in prefix {
        w.u32(*p);
    }
    w.u32(table as u32).u32(keys.len() as u32).u32(dim as u32);
    for k in keys {
        w.u64(*k);
    }
    w.raw(as_bytes(values));
    w.0
}

fn keys_at(b: &[u8], at: usize, n: usize) -> Result<Vec<u64>> {
    let raw =
        b.get(at..at + n * 8).ok_or_else(|| Error::corrupt("a frame's keys were cut short"))?;
    Ok(raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

impl Cluster {
    /// Starts this process's part: listens on `addrs[rank]` and serves its rows (`local`, the
    /// masters of the rows hashed to it) to the other processes.
    pub fn start(
        rank: usize,
        addrs: Vec<SocketAddr>,
        local: Arc<dyn Masters>,
    ) -> Result<Arc<Self>> {
        if rank >= addrs.len() {
            return Err(Error::invalid(format!(
                "rank {rank} out of range for {} processes",
                addrs.len()
            )));
        }
        let listener = TcpListener::bind(addrs[rank]).map_err(|e| io("listen", e))?;
        let p = addrs.len();
        let cluster = Arc::new(Self {
            rank,
            addrs,
            local,
            data: (0..p).map(|_| Mutex::new(None)).collect(),
            control: (0..p).map(|_| Mutex::new(None)).collect(),
            staged: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            apply_lock: RwLock::new(()),
            applied: AtomicI64::new(0),
            coord: Mutex::new(Coord::default()),
            coord_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            placed: RwLock::new(Vec::new()),
            gather_tag: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&cluster);
        std::thread::Builder::new()
            .name(format!("ps-accept-{rank}"))
            .spawn(move || {
                for conn in listener.incoming() {
                    let Some(c) = weak.upgrade() else { return };
                    if c.stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let _ = conn.set_nodelay(true);
                    let c2 = c.clone();
                    let _ = std::thread::Builder::new()
                        .name("ps-serve".into())
                        .spawn(move || c2.serve(conn));
                }
            })
            .map_err(|e| io("spawn", e))?;
        Ok(cluster)
    }

    /// The masters of the parameter server this process runs (its clocks are the cluster's:
    /// one parameter server per cluster).
    pub fn masters(self: &Arc<Self>) -> Result<ClusterMasters> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid(
                "a cluster serves one parameter server (their clocks are its barriers): start a new cluster",
            ));
        }
        Ok(ClusterMasters(self.clone()))
    }

    /// Reads rows wherever they live (outside any clock: an inspection, an evaluation).
    pub fn read_any(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.read_rows(table, keys, out).map(|_| ())
    }

    /// Reads rows from their owners (one request per owner); the oldest clock they reflect.
    fn read_rows(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<i64> {
        let d = self.local.dim(table);
        let placed = self.placed.read();
        let first = keys.first().map_or(self.rank, |k| self.owner_in(&placed, table, *k));
        if keys.iter().all(|k| self.owner_in(&placed, table, *k) == first) {
            drop(placed);
            return self.read_owned(first, table, keys, out);
        }
        let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); self.processes()];
        for (i, k) in keys.iter().enumerate() {
            by_owner[self.owner_in(&placed, table, *k)].push(i);
        }
        drop(placed);
        let mut age = i64::MAX;
        for (q, idx) in by_owner.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
            let ks: Vec<u64> = idx.iter().map(|&i| keys[i]).collect();
            let mut buf = vec![0.0f32; ks.len() * d];
            age = age.min(self.read_owned(q, table, &ks, &mut buf)?);
            for (j, &i) in idx.iter().enumerate() {
                out[i * d..(i + 1) * d].copy_from_slice(&buf[j * d..(j + 1) * d]);
            }
        }
        Ok(age)
    }

    /// A barrier outside the clocks (after the parameter server's last clock): returns once
    /// every process has called it with the same `tag` (above every clock the run used).
    pub fn sync(&self, tag: u32) -> Result<()> {
        self.barrier(tag)?;
        if self.rank == 0 {
            // The others' releases are on their way: wait until they are sent, so that this
            // process may exit (up to 10 s).
            let t = Instant::now();
            let mut c = self.coord.lock();
            while c.answered.get(&tag).copied().unwrap_or(0) + 1 < self.addrs.len()
                && t.elapsed() < Duration::from_secs(10)
            {
                self.coord_cv.wait_for(&mut c, Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Returns once every process has arrived at `clock` and every owner applied it.
    fn barrier(&self, clock: u32) -> Result<()> {
        if self.rank == 0 {
            return self.arrive(clock);
        }
        let mut w = Writer::with_capacity(8);
        w.u32(clock).u32(self.rank as u32);
        self.request(&self.control, 0, Kind::PsDone, &w.0, Kind::PsAck, None).map(|_| ())
    }

    /// The process holding the row of `key` of `table` (after placement, if any).
    pub fn owner(&self, table: usize, key: u64) -> usize {
        self.owner_of(table, key)
    }

    /// This process's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The processes.
    pub fn processes(&self) -> usize {
        self.addrs.len()
    }

    /// Bytes sent to and received from the other processes.
    pub fn bytes(&self) -> (u64, u64) {
        (self.bytes_sent.load(Ordering::Relaxed), self.bytes_received.load(Ordering::Relaxed))
    }

    /// Stops serving (connections already open end when their peer closes them).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addrs[self.rank], Duration::from_millis(200));
    }

    /// The process a row lives on before placement: the distributed training store's owner
    /// (`embstore_common::owner_of`), so that a process's tables hold the same rows either way.
    fn hash_owner(&self, key: u64) -> usize {
        embstore_common::owner_of(key, self.addrs.len() as u32) as usize
    }

    /// Where the row of `key` of `table` lives: where placement put it, else its hash's process.
    fn owner_in(&self, placed: &[hashbrown::HashMap<u64, u32>], table: usize, key: u64) -> usize {
        match placed.get(table).and_then(|m| m.get(&key)) {
            Some(&o) => o as usize,
            None => self.hash_owner(key),
        }
    }

    fn owner_of(&self, table: usize, key: u64) -> usize {
        let placed = self.placed.read();
        self.owner_in(&placed, table, key)
    }

    /// An all-gather through process 0: every process's `payload`, in process order.
    fn all_gather(&self, payload: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let tag = self.gather_tag.fetch_add(1, Ordering::AcqRel);
        if self.rank == 0 {
            return self.gather_at_coordinator(tag, 0, payload);
        }
        let mut w = Writer::with_capacity(12 + payload.len());
        w.u64(tag).u32(self.rank as u32).raw(&payload);
        let (_, body) = self.request_raw(
            &self.control,
            0,
            &frame::frame(Kind::PsGather, 1, &w.0),
            Kind::PsGathered,
            None,
        )?;
        Self::split_parts(&body, self.addrs.len())
    }

    fn split_parts(body: &[u8], p: usize) -> Result<Vec<Vec<u8>>> {
        let mut parts = Vec::with_capacity(p);
        let mut at = 0;
        for _ in 0..p {
            let n = u32_at(body, at)? as usize;
            let part = body
                .get(at + 4..at + 4 + n)
                .ok_or_else(|| Error::corrupt("PS_GATHERED cut short"))?;
            parts.push(part.to_vec());
            at += 4 + n;
        }
        Ok(parts)
    }

    /// The coordinator's side: records `from`'s part of gather `tag`, waits for all of them.
    fn gather_at_coordinator(
        &self,
        tag: u64,
        from: usize,
        payload: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>> {
        let p = self.addrs.len();
        let mut c = self.coord.lock();
        let g =
            c.gathers.entry(tag).or_insert_with(|| Gathering { parts: vec![None; p], answered: 0 });
        if from >= p || g.parts[from].is_some() {
            return Err(Error::invalid(format!(
                "all-gather {tag}: a second or unknown part from {from}"
            )));
        }
        g.parts[from] = Some(payload);
        self.coord_cv.notify_all();
        loop {
            if let Some(e) = &c.error {
                return Err(e.clone());
            }
            let g = c.gathers.get_mut(&tag).expect("the gather is kept until all answered");
            if g.parts.iter().all(Option::is_some) {
                let parts: Vec<Vec<u8>> =
                    g.parts.iter().map(|x| x.clone().unwrap_or_default()).collect();
                g.answered += 1;
                if g.answered == p {
                    c.gathers.remove(&tag);
                }
                return Ok(parts);
            }
            self.coord_cv.wait(&mut c);
        }
    }

    fn on_move(&self, body: &[u8]) -> Result<()> {
        let (table, keys, values) = self.rows_at(body, 0, "PS_MOVE")?;
        let _exclusive = self.apply_lock.write();
        self.local.assign(table, &keys, &values)
    }

    /// Parses `table | n | dim | n keys | n × dim float32` at `at`, checking the table.
    fn rows_at(&self, body: &[u8], at: usize, what: &str) -> Result<(usize, Vec<u64>, Vec<f32>)> {
        let (table, n, d) = (
            u32_at(body, at)? as usize,
            u32_at(body, at + 4)? as usize,
            u32_at(body, at + 8)? as usize,
        );
        if table >= self.local.names().len() || d != self.local.dim(table) {
            return Err(Error::shape(format!(
                "{what}: table {table} with dim {d} is not one of this process's"
            )));
        }
        let keys = keys_at(body, at + 12, n)?;
        let start = at + 12 + n * 8;
        let raw = body
            .get(start..start + n * d * 4)
            .ok_or_else(|| Error::corrupt(format!("{what}: rows cut short")))?;
        let mut values = vec![0.0f32; n * d];
        as_bytes_mut(&mut values).copy_from_slice(raw);
        Ok((table, keys, values))
    }

    /// Undoes placement: every row goes back to the process its hash names (where a
    /// distributed training store looks for it); every process calls it together. Returns the
    /// rows this process handed back.
    pub fn unplace(&self) -> Result<u64> {
        let placed = std::mem::take(&mut *self.placed.write());
        let mut moved = 0u64;
        for (t, m) in placed.iter().enumerate() {
            let mut by_owner: Vec<Vec<u64>> = vec![Vec::new(); self.addrs.len()];
            for (&k, &q) in m {
                if q as usize == self.rank && self.hash_owner(k) != self.rank {
                    by_owner[self.hash_owner(k)].push(k);
                }
            }
            moved += self.hand_over(t, by_owner)?;
        }
        self.all_gather(Vec::new())?;
        Ok(moved)
    }

    /// Sends the rows of `by_owner[q]` that exist here to process `q`, and removes them here
    /// only once `q` has them (a failed hand-over loses no row).
    fn hand_over(&self, t: usize, by_owner: Vec<Vec<u64>>) -> Result<u64> {
        let mut moved = 0u64;
        for (q, mut keys) in by_owner.into_iter().enumerate().filter(|(_, k)| !k.is_empty()) {
            keys.sort_unstable();
            let (ks, vs) = self.local.existing(t, &keys)?;
            if ks.is_empty() {
                continue;
            }
            let body = rows_body(&[], t, &ks, &vs, self.local.dim(t));
            self.request(&self.data, q, Kind::PsMove, &body, Kind::PsAck, None)?;
            let _exclusive = self.apply_lock.write();
            self.local.remove(t, &ks)?;
            moved += ks.len() as u64;
        }
        Ok(moved)
    }

    /// Placement (see the module docs); returns the rows this process handed over.
    fn place(&self, rows: &[Vec<u64>]) -> Result<u64> {
        let p = self.addrs.len();
        if p > 64 {
            return Err(Error::invalid("placement takes at most 64 processes"));
        }
        let mut w = Writer::with_capacity(4 + rows.iter().map(|r| 4 + r.len() * 8).sum::<usize>());
        w.u32(rows.len() as u32);
        for r in rows {
            let mut r = r.clone();
            r.sort_unstable();
            r.dedup();
            w.u32(r.len() as u32);
            for k in r {
                w.u64(k);
            }
        }
        let parts = self.all_gather(w.0)?;
        // Which processes access each row, per table.
        let tables = rows.len();
        let mut who: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); tables];
        for (q, part) in parts.iter().enumerate() {
            let nt = u32_at(part, 0)? as usize;
            if nt != tables {
                return Err(Error::invalid(format!(
                    "placement: process {q} runs {nt} tables, this one {tables}: every process must run the same parameter server"
                )));
            }
            let mut at = 4;
            for who_t in who.iter_mut() {
                let n = u32_at(part, at)? as usize;
                for k in keys_at(part, at + 4, n)? {
                    *who_t.entry(k).or_insert(0) |= 1u64 << q;
                }
                at += 4 + n * 8;
            }
        }
        let mut placed = vec![hashbrown::HashMap::new(); tables];
        for (t, who_t) in who.iter().enumerate() {
            let mut load = vec![0u64; p];
            for (&k, &mask) in who_t {
                let q = (0..p)
                    .filter(|q| mask & (1 << q) != 0)
                    .min_by_key(|&q| (load[q], q))
                    .expect("a reader");
                load[q] += 1;
                if q != self.hash_owner(k) {
                    placed[t].insert(k, q as u32);
                }
            }
        }
        // Hand over the rows this process holds by hash that now live elsewhere.
        let mut moved = 0u64;
        for (t, m) in placed.iter().enumerate() {
            let mut by_owner: Vec<Vec<u64>> = vec![Vec::new(); p];
            for (&k, &q) in m {
                if self.hash_owner(k) == self.rank && q as usize != self.rank {
                    by_owner[q as usize].push(k);
                }
            }
            moved += self.hand_over(t, by_owner)?;
        }
        *self.placed.write() = placed;
        // Everyone has handed its rows over before anyone reads again.
        self.all_gather(Vec::new())?;
        Ok(moved)
    }

    // --- serving -----------------------------------------------------------------------

    fn serve(self: Arc<Self>, mut conn: TcpStream) {
        let is_ps = match frame::read_blocking(&mut conn, 1 << 16, None) {
            Ok((h, body)) if h.kind == Kind::Hello => {
                frame::decode_hello(&body).is_ok_and(|h| h.service == Service::Ps)
            }
            _ => false,
        };
        if !is_ps {
            let _ = self.send_error(
                &mut conn,
                0,
                &Error::new(ErrorKind::Unsupported, "expected a parameter-server HELLO"),
            );
            return;
        }
        let mut out = Vec::new();
        loop {
            let mut done = None;
            let (h, body) = match frame::read_blocking(&mut conn, MAX_FRAME, None) {
                Ok(x) => x,
                Err(_) => return,
            };
            self.bytes_received.fetch_add((HEADER + body.len()) as u64, Ordering::Relaxed);
            out.clear();
            let result = match h.kind {
                Kind::PsRead => self.on_read(&body, h.id, &mut out),
                Kind::PsAdd => {
                    self.on_add(&body).map(|()| out.extend(frame::frame(Kind::PsAck, h.id, &[])))
                }
                Kind::PsApply => u32_at(&body, 0)
                    .and_then(|k| self.apply(k))
                    .map(|()| out.extend(frame::frame(Kind::PsAck, h.id, &[]))),
                Kind::PsMove => {
                    self.on_move(&body).map(|()| out.extend(frame::frame(Kind::PsAck, h.id, &[])))
                }
                Kind::PsGather => (|| {
                    let tag = u64::from_le_bytes(
                        body.get(0..8)
                            .ok_or_else(|| Error::corrupt("PS_GATHER cut short"))?
                            .try_into()
                            .expect("8"),
                    );
                    let from = u32_at(&body, 8)? as usize;
                    let parts = self.gather_at_coordinator(tag, from, body[12..].to_vec())?;
                    let mut reply = Vec::new();
                    for part in &parts {
                        reply.extend_from_slice(&(part.len() as u32).to_le_bytes());
                        reply.extend_from_slice(part);
                    }
                    out.extend(frame::frame(Kind::PsGathered, h.id, &reply));
                    Ok(())
                })(),
                Kind::PsDone => (|| {
                    let k = u32_at(&body, 0)?;
                    self.arrive(k)?;
                    out.extend(frame::frame(Kind::PsAck, h.id, &[]));
                    done = Some(k);
                    Ok(())
                })(),
                other => {
                    Err(Error::invalid(format!("{other:?} is not a parameter-server request")))
                }
            };
            let sent = match result {
                Ok(()) => conn.write_all(&out).is_ok(),
                Err(e) => self.send_error(&mut conn, h.id, &e).is_ok(),
            };
            if let Some(k) = done {
                let mut c = self.coord.lock();
                *c.answered.entry(k).or_insert(0) += 1;
                self.coord_cv.notify_all();
            }
            if !sent {
                return;
            }
            self.bytes_sent.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
    }

    fn send_error(&self, conn: &mut TcpStream, id: u32, e: &Error) -> std::io::Result<()> {
        let body = ErrorBody {
            kind: Some(e.kind()),
            code: 2,
            message: e.message().to_string(),
            details: Vec::new(),
        };
        conn.write_all(&frame::encode_error(id, &body))
    }

    fn on_read(&self, body: &[u8], id: u32, out: &mut Vec<u8>) -> Result<()> {
        let table = u32_at(body, 0)? as usize;
        let n = u32_at(body, 4)? as usize;
        let names = self.local.names();
        if table >= names.len() {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("table {table} out of range"),
            ));
        }
        let keys = keys_at(body, 8, n)?;
        let d = self.local.dim(table);
        let mut values = vec![0.0f32; n * d];
        let _shared = self.apply_lock.read();
        let applied = self.applied.load(Ordering::Acquire);
        self.local.read(table, &keys, &mut values)?;
        let len = 16 + values.len() * 4;
        out.reserve(HEADER + len);
        out.extend_from_slice(&frame::header(Kind::PsRows, len, id));
        out.extend_from_slice(&applied.to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&(d as u32).to_le_bytes());
        out.extend_from_slice(as_bytes(&values));
        Ok(())
    }

    fn on_add(&self, body: &[u8]) -> Result<()> {
        let (clock, from) = (u32_at(body, 0)?, u32_at(body, 4)?);
        let (table, keys, deltas) = self.rows_at(body, 8, "PS_ADD")?;
        self.stage(clock, from, table, keys, deltas);
        Ok(())
    }

    fn stage(&self, clock: u32, from: u32, table: usize, keys: Vec<u64>, deltas: Vec<f32>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.staged.lock().push(Staged { clock, from, seq, table, keys, deltas });
    }

    /// Applies every staged clock `<= k`, in (clock, process, arrival) order.
    fn apply(&self, k: u32) -> Result<()> {
        let _exclusive = self.apply_lock.write();
        let mut due: Vec<Staged> = {
            let mut staged = self.staged.lock();
            let (due, keep): (Vec<_>, Vec<_>) = staged.drain(..).partition(|s| s.clock <= k);
            *staged = keep;
            due
        };
        due.sort_by_key(|s| (s.clock, s.from, s.seq));
        for s in due {
            self.local.add(s.table, &s.keys, &s.deltas)?;
        }
        self.applied.fetch_max(i64::from(k), Ordering::AcqRel);
        Ok(())
    }

    /// The coordinator's barrier: the last process to arrive at `k` has every process apply
    /// it, then releases everyone.
    fn arrive(&self, k: u32) -> Result<()> {
        let p = self.addrs.len();
        let mut c = self.coord.lock();
        let n = {
            let e = c.arrived.entry(k).or_insert(0);
            *e += 1;
            *e
        };
        if n == p {
            drop(c);
            let result = (0..p).try_for_each(|q| {
                if q == self.rank {
                    self.apply(k)
                } else {
                    let mut body = Writer::with_capacity(4);
                    body.u32(k);
                    self.request(&self.control, q, Kind::PsApply, &body.0, Kind::PsAck, None)
                        .map(|_| ())
                }
            });
            let mut c = self.coord.lock();
            c.arrived.remove(&k);
            if let Err(e) = result {
                c.error.get_or_insert(e);
            }
            c.released = c.released.max(i64::from(k));
            self.coord_cv.notify_all();
            return match &c.error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            };
        }
        while c.released < i64::from(k) && c.error.is_none() {
            self.coord_cv.wait(&mut c);
        }
        match &c.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    // --- requests ----------------------------------------------------------------------

    fn connect(&self, q: usize) -> Result<Conn> {
        let t = Instant::now();
        loop {
            match TcpStream::connect(self.addrs[q]) {
                Ok(mut stream) => {
                    let _ = stream.set_nodelay(true);
                    let hello =
                        frame::frame(Kind::Hello, 0, &frame::encode_hello("", Service::Ps, &[]));
                    stream.write_all(&hello).map_err(|e| io("send HELLO", e))?;
                    return Ok(Conn { stream });
                }
                Err(e) if t.elapsed() < CONNECT_FOR => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "process {q} at {} did not come up in {CONNECT_FOR:?}: {e}",
                            self.addrs[q]
                        ),
                    ))
                }
            }
        }
    }

    /// Sends a request to process `q` and reads its answer of kind `want`; a ROWS answer's
    /// values go straight into `rows` (and its clock is returned).
    fn request(
        &self,
        conns: &[Mutex<Option<Conn>>],
        q: usize,
        kind: Kind,
        body: &[u8],
        want: Kind,
        rows: Option<&mut [f32]>,
    ) -> Result<i64> {
        let mut msg = Vec::with_capacity(HEADER + body.len());
        msg.extend_from_slice(&frame::header(kind, body.len(), 1));
        msg.extend_from_slice(body);
        self.request_raw(conns, q, &msg, want, rows).map(|(age, _)| age)
    }

    /// Sends a whole frame (`msg`) on `conns[q]`, connecting first if needed (a connection that
    /// fails is dropped, to be opened again by the next request), and reads the answer: a ROWS
    /// answer into `rows` and its clock; any other answer's body.
    fn request_raw(
        &self,
        conns: &[Mutex<Option<Conn>>],
        q: usize,
        msg: &[u8],
        want: Kind,
        rows: Option<&mut [f32]>,
    ) -> Result<(i64, Vec<u8>)> {
        let mut slot = conns[q].lock();
        if slot.is_none() {
            *slot = Some(self.connect(q)?);
        }
        let conn = slot.as_mut().expect("connected");
        let result = Self::exchange(&mut conn.stream, msg, want, rows);
        if result.is_err() {
            *slot = None;
        }
        let (received, age, body) = result?;
        self.bytes_sent.fetch_add(msg.len() as u64, Ordering::Relaxed);
        self.bytes_received.fetch_add(received, Ordering::Relaxed);
        Ok((age, body))
    }

    fn exchange(
        s: &mut TcpStream,
        msg: &[u8],
        want: Kind,
        rows: Option<&mut [f32]>,
    ) -> Result<(u64, i64, Vec<u8>)> {
        s.write_all(msg).map_err(|e| io("send", e))?;
        let mut h = [0u8; HEADER];
        s.read_exact(&mut h).map_err(|e| io("receive", e))?;
        let head = frame::parse_header(&h)?;
        let len = head.len as usize;
        if head.kind == Kind::Error {
            let (_, body) = frame::read_blocking(s, MAX_FRAME, Some(h))?;
            let e = frame::decode_error(&body)?;
            return Err(Error::new(e.kind.unwrap_or(ErrorKind::Io), e.message));
        }
        if head.kind != want {
            return Err(Error::corrupt(format!("expected {want:?}, got {:?}", head.kind)));
        }
        let received = (HEADER + len) as u64;
        match rows {
            Some(out) => {
                let mut fixed = [0u8; 16];
                s.read_exact(&mut fixed).map_err(|e| io("receive", e))?;
                let age = i64::from_le_bytes(fixed[0..8].try_into().expect("8 bytes"));
                let values =
                    len.checked_sub(16).ok_or_else(|| Error::corrupt("PS_ROWS cut short"))?;
                if values != out.len() * 4 {
                    return Err(Error::shape(format!(
                        "PS_ROWS holds {values} bytes of rows; {} expected",
                        out.len() * 4
                    )));
                }
                // The rows land in the caller's memory as they come off the socket.
                s.read_exact(as_bytes_mut(out)).map_err(|e| io("receive", e))?;
                Ok((received, age, Vec::new()))
            }
            None => {
                let (_, body) = frame::read_blocking(s, MAX_FRAME, Some(h))?;
                Ok((received, 0, body))
            }
        }
    }

    fn read_body(table: usize, keys: &[u64]) -> Vec<u8> {
        let mut w = Writer::with_capacity(8 + keys.len() * 8);
        w.u32(table as u32).u32(keys.len() as u32);
        for k in keys {
            w.u64(*k);
        }
        w.0
    }

    /// Reads rows of one owner.
    fn read_owned(&self, owner: usize, table: usize, keys: &[u64], out: &mut [f32]) -> Result<i64> {
        if owner == self.rank {
            let _shared = self.apply_lock.read();
            let applied = self.applied.load(Ordering::Acquire);
            self.local.read(table, keys, out)?;
            return Ok(applied);
        }
        self.request(
            &self.data,
            owner,
            Kind::PsRead,
            &Self::read_body(table, keys),
            Kind::PsRows,
            Some(out),
        )
    }
}

/// The masters of a parameter server spread over processes: this process's [`Cluster`]
/// ([`Cluster::masters`]).
#[derive(Debug, Clone)]
pub struct ClusterMasters(Arc<Cluster>);

impl Masters for ClusterMasters {
    fn dim(&self, table: usize) -> usize {
        self.0.local.dim(table)
    }

    fn names(&self) -> Vec<String> {
        self.0.local.names()
    }

    fn read(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.read_at(table, keys, out).map(|_| ())
    }

    fn add(&self, _table: usize, _keys: &[u64], _deltas: &[f32]) -> Result<()> {
        // Deltas spread over processes are applied at clock boundaries only (`add_at`): one
        // process alone cannot apply them everywhere.
        Err(Error::new(
            ErrorKind::Unsupported,
            "rows spread over processes take deltas inside a clock (add_at) only",
        ))
    }

    fn processes(&self) -> usize {
        self.0.processes()
    }

    fn owner(&self, table: usize, key: u64) -> usize {
        self.0.owner_of(table, key)
    }

    fn place(&self, rows: &[Vec<u64>]) -> Result<u64> {
        self.0.place(rows)
    }

    fn read_at(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<Option<i64>> {
        // Several owners: one request each, the rows scattered back; the oldest clock (the
        // parameter server asks one owner at a time).
        self.0.read_rows(table, keys, out).map(Some)
    }

    fn prepare(&self, table: usize, owner: usize, keys: &[u64]) -> Prepared {
        let mut frame_bytes = Vec::new();
        if owner != self.0.rank && !keys.is_empty() {
            let body = Cluster::read_body(table, keys);
            frame_bytes.extend_from_slice(&frame::header(Kind::PsRead, body.len(), 1));
            frame_bytes.extend_from_slice(&body);
        }
        Prepared { table, owner, keys: keys.to_vec(), frame: frame_bytes }
    }

    fn read_prepared(&self, p: &Prepared, out: &mut [f32]) -> Result<Option<i64>> {
        let c = &self.0;
        if p.frame.is_empty() {
            return c.read_owned(p.owner, p.table, &p.keys, out).map(Some);
        }
        // The request was encoded at plan time: send its bytes as they are.
        c.request_raw(&c.data, p.owner, &p.frame, Kind::PsRows, Some(out)).map(|(age, _)| Some(age))
    }

    fn add_at(&self, clock: u32, table: usize, keys: &[u64], deltas: &[f32]) -> Result<()> {
        let c = &self.0;
        let d = self.dim(table);
        let mut by_owner: Vec<(Vec<u64>, Vec<f32>)> = vec![Default::default(); c.processes()];
        let placed = c.placed.read();
        for (i, k) in keys.iter().enumerate() {
            let o = &mut by_owner[c.owner_in(&placed, table, *k)];
            o.0.push(*k);
            o.1.extend_from_slice(&deltas[i * d..(i + 1) * d]);
        }
        drop(placed);
        for (q, (ks, ds)) in by_owner.into_iter().enumerate().filter(|(_, v)| !v.0.is_empty()) {
            if q == c.rank {
                c.stage(clock, c.rank as u32, table, ks, ds);
            } else {
                let body = rows_body(&[clock, c.rank as u32], table, &ks, &ds, d);
                c.request(&c.data, q, Kind::PsAdd, &body, Kind::PsAck, None)?;
            }
        }
        Ok(())
    }

    fn barrier(&self, clock: u32) -> Result<()> {
        self.0.barrier(clock)
    }
}
