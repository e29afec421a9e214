//! The sync port's messages: the sync set of embstore's one wire (`embstore_proto::frame`: a
//! 16-byte header, HELLO and ERROR shared with the framed lookup path; every sync frame
//! carries its body's CRC). `docs/dissemination.md` lists them byte by byte.
//!
//! ```text
//! HELLO    = token str | service u8 (2: sync) | protocol u16 (4..6) | with_state u8 | tables [str]
//!            | (protocol 6: precision u8, 0 f32 values, 1 f16 values)
//! WELCOME  = replica u32 | tables [name str | config str | parts u32 | epoch u64]
//! LIST     = table str | epoch u64 | cursor u64 | wait_ms u32
//! CHANGED  = epoch u64 | upto u64 | now_ms u64 | parts [part u32 | sv_c u64 | sv_id u32],
//!            then the PARTs of small changes, then PULL_DONE
//! PULL     = table str | parts [part u32 | vv]
//! PART     = part u32 | flags u8 (1 cache, 2 partial, 4 complete, 8 svv, 16 f16 values)
//!            | vv | sv_c u64 | sv_id u32 | (svv: svv vv)
//!            | (complete: lo u64 | hi u64 | floor vv) | n u32
//!            | has_state u8 (1 state, 2 step) | origins [replica u32] | base_ts u64
//!            | n × (key_delta var | ts − base_ts var | origin_index var | update_count var
//!                   | flags u8 | (2: sigv_below var | sigv_origin var)), in key order
//!            | n×D f32 values (16: f16) | (n×S f32 state)
//!            | (step: step u64, the responder's step counter, with state)
//! PULL_DONE = (empty)       ERROR = the wire's (kind u8 | code u32 | message str | details)
//! PACKED   = method u8 (0 stored, 1 zstd) | raw_len u32 | data: the frames of one answer
//!            (protocol 6): raw = n × (kind u8 | len var | body), zstd-compressed (method 1)
//! ROLLBACK = op u8 (1 pause, 2 resume, 3 write) | table str ("": every table) | reason str
//!            | (write: n u32 | n × (key u64 | removed u8) | the kept rows' values, D f32 each)
//! ROLLBACK_DONE = count u64 (tables paused or resumed, rows written)
//! vv = n u16 | n × (origin u32 | ts u64);  str = len u32 | utf-8;  [x] = n u32 | n × x
//! var = LEB128 (7 bits a byte, low first)
//! ```
//!
//! A frame that is truncated, oversized, fails its checksum or does not parse is an
//! [`ErrorKind::Corruption`] error; the connection is then dropped and nothing of it applied.
//! A peer of an older build, which framed sync differently (a 9-byte header), is told so in
//! its own framing, and a source of an older build is recognised by its answer: either side
//! then fails with an [`ErrorKind::Unsupported`] error that says which side to upgrade.

use std::io::{Read, Write};

use embstore_common::bytes::{Reader, Writer};
use embstore_common::{Error, ErrorKind, Result};
pub use embstore_proto::frame::Kind;
use embstore_proto::frame::{self, Service, HEADER};
use embstore_replication::{Sv, Vv};
use embstore_table::sync::{Changes, Complete, PartReply, PrioritisedReply};
use embstore_table::{RowMeta, Version};

/// The sync protocol this build speaks (on wire version 2; 1 to 3 were spoken on the older
/// framing): change lists carry the rows of small changes, and parts with optimizer state
/// the responder's step counter; from 5, parts carry significant versions and the SVV, and
/// prioritised pulls are answered; from 6, an answer's frames come packed in one frame,
/// compressed where that pays ([`Packer`]), and a follower may ask for f16 values.
pub const PROTOCOL: u16 = 6;
/// The first protocol with prioritised sync: a responder sends significant versions only
/// to a requester that speaks it.
pub const PRIORITY_PROTOCOL: u16 = 5;
/// The first protocol whose requesters take an answer's frames packed in one PACKED frame,
/// zstd-compressed where that pays, and may ask for values at reduced precision.
pub const PACKED_PROTOCOL: u16 = 6;
/// The oldest sync protocol this build still speaks.
pub const MIN_PROTOCOL: u16 = 4;
/// The part a prioritised pull names to ask for the whole table with one TSVV (and the part
/// of the last frame of its answer, which carries the table's TSVV and no row).
pub const ALL_PARTS: u32 = u32::MAX;
/// The largest frame body accepted (a reply larger than this is split by the responder).
pub const MAX_FRAME: usize = 64 << 20;

/// Writes one frame (with its CRC).
pub fn write_frame(w: &mut impl Write, kind: Kind, body: &[u8]) -> Result<()> {
    if body.len() > MAX_FRAME {
        return Err(Error::invalid(format!(
            "a sync frame of {} bytes exceeds the limit of {MAX_FRAME}",
            body.len()
        )));
    }
    let mut out = Vec::with_capacity(HEADER + body.len());
    frame::frame_checked_into(&mut out, kind, 0, body);
    w.write_all(&out).map_err(|e| Error::io("sync send", e))
}

/// Reads one frame: its kind and body (bytes read = [`HEADER`] + body length).
pub fn read_frame(r: &mut impl Read) -> Result<(Kind, Vec<u8>)> {
    read_frame_limited(r, MAX_FRAME)
}

/// [`read_frame`] of a frame of at most `max` body bytes (see [`frame::read_blocking`]). The
/// answer of a source of an older build (its 9-byte framing) becomes an
/// [`ErrorKind::Unsupported`] error carrying what it said.
pub fn read_frame_limited(r: &mut impl Read, max: usize) -> Result<(Kind, Vec<u8>)> {
    match read_or_legacy(r, max)? {
        Ok(f) => Ok(f),
        Err(Legacy::Error(said)) => Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "the sync source runs an older embstore, whose sync wire this build no longer \
                 speaks: upgrade the source (it answered: {said})"
            ),
        )),
        Err(Legacy::Hello | Legacy::Other) => Err(Error::corrupt("not an embstore sync frame")),
    }
}

/// A frame of the sync port's older framing (`len u32 | kind u8 | crc u32 | body`).
#[derive(Debug, PartialEq, Eq)]
pub enum Legacy {
    /// An older follower's Hello.
    Hello,
    /// An older source's Error frame, and its message.
    Error(String),
    /// Neither, or not that framing at all.
    Other,
}

/// Kinds of the older framing.
const LEGACY_HELLO: u8 = 1;
const LEGACY_ERROR: u8 = 8;
/// The first bytes of an older Hello's body ("EKSY").
const LEGACY_MAGIC: &[u8; 4] = b"EKSY";
/// The older framing's code of `Unsupported`.
const LEGACY_UNSUPPORTED: u8 = 8;

/// One frame, or what a peer of the older framing sent instead.
pub fn read_or_legacy(r: &mut impl Read, max: usize) -> Result<Result<(Kind, Vec<u8>), Legacy>> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h).map_err(|e| Error::io("sync receive", e))?;
    if h[0] == frame::MAGIC {
        let (header, body) = frame::read_blocking(r, max.min(MAX_FRAME), Some(h))?;
        return Ok(Ok((header.kind, body)));
    }
    let len = u32::from_le_bytes(h[..4].try_into().expect("4 bytes")) as usize;
    Ok(Err(match h[4] {
        LEGACY_HELLO if &h[9..13] == LEGACY_MAGIC => Legacy::Hello,
        // An older Error body: kind u8 | message (len u32 | utf-8); 7 of its bytes are in `h`.
        LEGACY_ERROR if (7..=1 << 16).contains(&len) => {
            let mut body = h[9..].to_vec();
            r.take((len - 7) as u64)
                .read_to_end(&mut body)
                .map_err(|e| Error::io("sync receive", e))?;
            let mut d = Reader::new(&body, "an older sync error frame");
            d.u8()?;
            Legacy::Error(d.str()?)
        }
        _ => Legacy::Other,
    }))
}

/// An Error frame in the older framing, which an older follower reads and shows: it is told
/// that this source speaks a newer wire.
pub fn legacy_error_frame() -> Vec<u8> {
    let mut body = Writer::default();
    body.u8(LEGACY_UNSUPPORTED).str(
        "this sync source runs a newer embstore, whose sync wire this follower does not speak: \
         upgrade the follower",
    );
    let mut out = Writer::with_capacity(9 + body.0.len());
    out.u32(body.0.len() as u32).u8(LEGACY_ERROR).u32(crc32fast::hash(&body.0)).raw(&body.0);
    out.0
}

/// `vv = n u16 | n × (origin u32 | ts u64)`.
fn put_vv(e: &mut Writer, vv: &Vv) {
    e.u16(vv.entries().len() as u16);
    for &(o, t) in vv.entries() {
        e.u32(o).u64(t);
    }
}

fn get_vv(d: &mut Reader<'_>) -> Result<Vv> {
    let n = d.u16()?;
    let mut vv = Vv::new();
    for _ in 0..n {
        let (o, t) = (d.u32()?, d.u64()?);
        vv.raise(o, t);
    }
    Ok(vv)
}

/// A reader of a sync frame's body.
fn reader(b: &[u8]) -> Reader<'_> {
    Reader::new(b, "a sync frame")
}

/// A client's first frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Hello {
    /// The protocol version the client speaks ([`MIN_PROTOCOL`]..=[`PROTOCOL`]).
    pub protocol: u16,
    pub token: String,
    pub with_state: bool,
    /// The tables wanted (empty: all).
    pub tables: Vec<String>,
    /// The precision of the values the client wants (protocol 6; an older client's is
    /// [`Precision::F32`]).
    pub precision: Precision,
}

/// The precision of the values of the rows a follower is sent: exact (the default), or
/// rounded to half precision on the wire (lossy, half the value bytes; optimizer state stays
/// f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32 = 0,
    F16 = 1,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Writer::default();
        e.u16(self.protocol).u8(self.with_state as u8);
        e.u32(self.tables.len() as u32);
        self.tables.iter().for_each(|t| {
            e.str(t);
        });
        if self.protocol >= PACKED_PROTOCOL {
            e.u8(self.precision as u8);
        }
        frame::encode_hello(&self.token, Service::Sync, &e.0)
    }
    pub fn decode(b: &[u8]) -> Result<Self> {
        let hello = frame::decode_hello(b)?;
        if hello.service != Service::Sync {
            return Err(Error::invalid(
                "this is a sync port, not a framed lookup port: look up on the port the \
                 server's info names",
            ));
        }
        let mut d = reader(hello.rest);
        let protocol = d.u16()?;
        if !(MIN_PROTOCOL..=PROTOCOL).contains(&protocol) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "sync protocol {protocol} is not spoken here (this build speaks \
                     {MIN_PROTOCOL} to {PROTOCOL})"
                ),
            ));
        }
        let with_state = d.u8()? != 0;
        let n = d.count(4)?;
        let tables = (0..n).map(|_| d.str()).collect::<Result<_>>()?;
        let precision = if protocol >= PACKED_PROTOCOL {
            match d.u8()? {
                0 => Precision::F32,
                1 => Precision::F16,
                p => return Err(Error::corrupt(format!("a sync hello asks for precision {p}"))),
            }
        } else {
            Precision::F32
        };
        d.end()?;
        Ok(Self { protocol, token: hello.token, with_state, tables, precision })
    }
}

pub use embstore_table::sync::TableInfo;

/// The server's replica id and its tables.
pub fn encode_welcome(replica: u32, tables: &[TableInfo]) -> Vec<u8> {
    let mut e = Writer::default();
    e.u32(replica).u32(tables.len() as u32);
    for t in tables {
        e.str(&t.name).str(&t.config).u32(t.parts).u64(t.epoch);
    }
    e.0
}

pub fn decode_welcome(b: &[u8]) -> Result<(u32, Vec<TableInfo>)> {
    let mut d = reader(b);
    let replica = d.u32()?;
    let n = d.count(20)?;
    let tables = (0..n)
        .map(|_| {
            Ok(TableInfo { name: d.str()?, config: d.str()?, parts: d.u32()?, epoch: d.u64()? })
        })
        .collect::<Result<_>>()?;
    d.end()?;
    Ok((replica, tables))
}

/// A long-poll for changes.
#[derive(Clone, Debug, PartialEq)]
pub struct List {
    pub table: String,
    pub epoch: u64,
    pub cursor: u64,
    pub wait_ms: u32,
}

impl List {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Writer::default();
        e.str(&self.table).u64(self.epoch).u64(self.cursor).u32(self.wait_ms);
        e.0
    }
    pub fn decode(b: &[u8]) -> Result<Self> {
        let mut d = reader(b);
        let l = Self { table: d.str()?, epoch: d.u64()?, cursor: d.u64()?, wait_ms: d.u32()? };
        d.end()?;
        Ok(l)
    }
}

/// A rollback's request to a source (Ekko Fig 5: ① pause, ④ write, ⑤ resume).
#[derive(Clone, Debug, PartialEq)]
pub enum Rollback {
    /// Refuse the writes of `table` (every table when empty) with `RollingBack` and `reason`,
    /// and stop prioritised sync.
    Pause { table: String, reason: String },
    /// Take writes again, and prioritised sync.
    Resume { table: String },
    /// Write these rows (`None`: remove the key) through the pause, with fresh versions.
    Write { table: String, rows: Vec<(u64, Option<Vec<f32>>)> },
}

impl Rollback {
    /// The table it names ("" for every table).
    pub fn table(&self) -> &str {
        match self {
            Rollback::Pause { table, .. }
            | Rollback::Resume { table }
            | Rollback::Write { table, .. } => table,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Writer::default();
        match self {
            Rollback::Pause { table, reason } => {
                e.u8(1).str(table).str(reason);
            }
            Rollback::Resume { table } => {
                e.u8(2).str(table).str("");
            }
            Rollback::Write { table, rows } => {
                e.u8(3).str(table).str("").u32(rows.len() as u32);
                for (k, v) in rows {
                    e.u64(*k).u8(u8::from(v.is_none()));
                }
                for v in rows.iter().filter_map(|(_, v)| v.as_ref()) {
                    e.f32s(v);
                }
            }
        }
        e.0
    }

    /// `dim` gives the named table's width (for a write's rows).
    pub fn decode(b: &[u8], dim: impl Fn(&str) -> Result<usize>) -> Result<Self> {
        let mut d = reader(b);
        let (op, table, reason) = (d.u8()?, d.str()?, d.str()?);
        let r = match op {
            1 => Rollback::Pause { table, reason },
            2 => Rollback::Resume { table },
            3 => {
                let n = d.count(9)?;
                let keys =
                    (0..n).map(|_| Ok((d.u64()?, d.u8()? != 0))).collect::<Result<Vec<_>>>()?;
                let width = dim(&table)?;
                let mut rows = Vec::with_capacity(n);
                for (k, removed) in keys {
                    rows.push((k, if removed { None } else { Some(d.f32s(width)?) }));
                }
                Rollback::Write { table, rows }
            }
            x => return Err(Error::corrupt(format!("unknown rollback request {x}"))),
        };
        d.end()?;
        Ok(r)
    }
}

pub fn encode_changed(c: &Changes, now_ms: u64) -> Vec<u8> {
    let mut e = Writer::default();
    e.u64(c.epoch).u64(c.upto).u64(now_ms).u32(c.parts.len() as u32);
    for (p, sv) in &c.parts {
        e.u32(*p).u64(sv.c).u32(sv.id);
    }
    e.0
}

/// `Changed`: the changes and the responder's clock when it answered.
pub fn decode_changed(b: &[u8]) -> Result<(Changes, u64)> {
    let mut d = reader(b);
    let (epoch, upto, now) = (d.u64()?, d.u64()?, d.u64()?);
    let n = d.count(16)?;
    let parts =
        (0..n).map(|_| Ok((d.u32()?, Sv::new(d.u64()?, d.u32()?)))).collect::<Result<_>>()?;
    d.end()?;
    Ok((Changes { epoch, upto, parts }, now))
}

/// A pull: the table and each part with the requester's VV.
pub fn encode_pull(table: &str, parts: &[(u32, Vv)]) -> Vec<u8> {
    let mut e = Writer::default();
    e.str(table).u32(parts.len() as u32);
    for (p, vv) in parts {
        e.u32(*p);
        put_vv(&mut e, vv);
    }
    e.0
}

pub fn decode_pull(b: &[u8]) -> Result<(String, Vec<(u32, Vv)>)> {
    let mut d = reader(b);
    let table = d.str()?;
    let n = d.count(6)?;
    let parts = (0..n).map(|_| Ok((d.u32()?, get_vv(&mut d)?))).collect::<Result<_>>()?;
    d.end()?;
    Ok((table, parts))
}

const TOMBSTONE: u8 = 1;
/// A row flag: its significant version follows (protocol 5).
const SIGNIFICANT: u8 = 2;
/// A part flag: the SVV follows the sv, and rows may carry significant versions (protocol 5).
const WITH_SVV: u8 = 8;
/// A part flag: values are f16 (protocol 6, a follower that asked for [`Precision::F16`]).
const HALF: u8 = 16;

/// The origins of a reply's rows (their versions' and significant versions' replicas),
/// sorted, and the smallest timestamp, which row timestamps are sent as deltas from.
fn origins_of(meta: &[RowMeta], sigv: &[Version]) -> (Vec<u32>, u64) {
    let mut origins: Vec<u32> = meta.iter().map(|m| m.version.replica).collect();
    origins.extend(sigv.iter().filter(|v| **v != Version::default()).map(|v| v.replica));
    origins.sort_unstable();
    origins.dedup();
    let base = meta.iter().map(|m| m.version.timestamp).min().unwrap_or(0);
    (origins, base)
}

/// One part's reply (rows of `dim` values, and `state_dim` state floats when it carries state).
///
/// Rows go in key order, compactly: the key as a varint delta from the previous key, the
/// version's timestamp as a varint delta from the reply's smallest, its replica as an index
/// into the reply's list of origins, the update count as a varint, a flags byte; then the
/// values (and state) as raw columns. A row's last-update time is its version's milliseconds,
/// so it is not sent. About 10 bytes of header a row instead of 37.
/// A reply with significant versions or an SVV sends them (protocol 5: see
/// [`PRIORITY_PROTOCOL`]; a responder strips them for an older requester).
pub fn encode_part(r: &PartReply) -> Vec<u8> {
    encode_part_as(r, Precision::F32)
}

/// [`encode_part`] with values at `precision` (f16 only to a requester of protocol 6 that
/// asked for it).
pub fn encode_part_as(r: &PartReply, precision: Precision) -> Vec<u8> {
    let n = r.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| r.keys[i]);
    let (origins, base) = origins_of(&r.meta, &r.sigv);
    let mut e = Writer(Vec::with_capacity(64 + n * 12 + r.values.len() * 4));
    let with_svv = r.svv.is_some() || r.sigv.iter().any(|v| *v != Version::default());
    let flags = r.from_cache as u8
        | (r.partial as u8) << 1
        | (r.complete.is_some() as u8) << 2
        | if with_svv { WITH_SVV } else { 0 }
        | if precision == Precision::F16 { HALF } else { 0 };
    e.u32(r.part).u8(flags);
    put_vv(&mut e, &r.vv);
    e.u64(r.sv.c).u32(r.sv.id);
    if with_svv {
        put_vv(&mut e, r.svv.as_ref().unwrap_or(&Vv::new()));
    }
    if let Some(c) = &r.complete {
        e.u64(c.lo).u64(c.hi);
        put_vv(&mut e, &c.floor);
    }
    let step = r.step.filter(|_| r.state.is_some());
    e.u32(n as u32).u8(r.state.is_some() as u8 | (step.is_some() as u8) << 1);
    e.u32(origins.len() as u32);
    origins.iter().for_each(|&o| {
        e.u32(o);
    });
    e.u64(base);
    let mut prev = 0u64;
    for &i in &order {
        let m = &r.meta[i];
        let origin = origins.binary_search(&m.version.replica).expect("listed") as u64;
        e.varint(r.keys[i] - prev).varint(m.version.timestamp - base).varint(origin);
        let sigv = r.sigv.get(i).copied().unwrap_or_default();
        let sig = with_svv && sigv != Version::default();
        let flags = if r.tombstone[i] { TOMBSTONE } else { 0 } | if sig { SIGNIFICANT } else { 0 };
        e.varint(m.update_count).u8(flags);
        if sig {
            put_sigv(&mut e, &origins, m.version, sigv);
        }
        prev = r.keys[i];
    }
    let (d, sd) = (r.values.len() / n.max(1), r.state.as_ref().map_or(0, |s| s.len() / n.max(1)));
    for &i in &order {
        match precision {
            Precision::F32 => {
                e.f32s(&r.values[i * d..][..d]);
            }
            Precision::F16 => r.values[i * d..][..d].iter().for_each(|v| {
                e.raw(&half::f16::from_f32(*v).to_le_bytes());
            }),
        }
    }
    if let Some(st) = &r.state {
        for &i in &order {
            e.f32s(&st[i * sd..][..sd]);
        }
    }
    if let Some(step) = step {
        e.u64(step);
    }
    e.0
}

/// Reads a `Part` frame for a table of `dim` values and `state_dim` state floats; keys must
/// strictly increase (a frame that repeats one is corrupt).
pub fn decode_part(b: &[u8], dim: usize, state_dim: usize) -> Result<PartReply> {
    let mut d = reader(b);
    let part = d.u32()?;
    let flags = d.u8()?;
    if flags > 31 {
        return Err(Error::corrupt(format!("a sync part has unknown flags {flags:#x}")));
    }
    let vv = get_vv(&mut d)?;
    let sv = Sv::new(d.u64()?, d.u32()?);
    let svv = if flags & WITH_SVV != 0 { Some(get_vv(&mut d)?) } else { None };
    let complete = if flags & 4 != 0 {
        Some(Complete { lo: d.u64()?, hi: d.u64()?, floor: get_vv(&mut d)? })
    } else {
        None
    };
    let n = d.count(5)?;
    let has = d.u8()?;
    // A step comes only with state.
    if has > 3 || has == 2 {
        return Err(Error::corrupt(format!("a sync part has unknown state flags {has:#x}")));
    }
    let (has_state, has_step) = (has & 1 != 0, has & 2 != 0);
    let k = d.count(4)?;
    let origins = (0..k).map(|_| d.u32()).collect::<Result<Vec<u32>>>()?;
    let base = d.u64()?;
    let (from_cache, partial) = (flags & 1 != 0, flags & 2 != 0);
    let mut r = PartReply { part, from_cache, partial, vv, sv, complete, ..PartReply::default() };
    let with_svv = svv.is_some();
    r.svv = svv;
    let mut prev = 0u64;
    for i in 0..n {
        let delta = d.varint()?;
        if i > 0 && delta == 0 {
            return Err(Error::corrupt("a sync part repeats a key"));
        }
        let key = prev.checked_add(delta).ok_or_else(|| Error::corrupt("a sync key overflows"))?;
        let ts = base
            .checked_add(d.varint()?)
            .ok_or_else(|| Error::corrupt("a sync version overflows"))?;
        let origin = usize::try_from(d.varint()?).ok().and_then(|o| origins.get(o));
        let replica = *origin.ok_or_else(|| Error::corrupt("a sync row names no listed origin"))?;
        let update_count = d.varint()?;
        let flags = d.u8()?;
        let known = if with_svv { TOMBSTONE | SIGNIFICANT } else { TOMBSTONE };
        if flags & !known != 0 {
            return Err(Error::corrupt(format!("a sync row has unknown flags {flags:#x}")));
        }
        let version = Version { timestamp: ts, replica };
        if with_svv {
            let sigv = if flags & SIGNIFICANT != 0 {
                get_sigv(&mut d, &origins, version)?
            } else {
                Version::default()
            };
            r.sigv.push(sigv);
        }
        r.keys.push(key);
        r.meta.push(RowMeta { version, update_count, last_update_ms: version.ms() });
        r.tombstone.push(flags & TOMBSTONE != 0);
        prev = key;
    }
    r.values = if flags & HALF != 0 {
        let len = n.checked_mul(dim).and_then(|x| x.checked_mul(2));
        let raw = d.take(len.ok_or_else(|| Error::corrupt("a sync part's values overflow"))?)?;
        raw.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
    } else {
        d.f32s(n * dim)?
    };
    if has_state {
        r.state = Some(d.f32s(n * state_dim)?);
    }
    if has_step {
        r.step = Some(d.u64()?);
    }
    d.end()?;
    Ok(r)
}

/// A row's significant version: its timestamp as a delta below the row's version (a sigv is
/// never newer than the row), its replica as an index into the origins.
fn put_sigv(e: &mut Writer, origins: &[u32], version: Version, sigv: Version) {
    let origin = origins.binary_search(&sigv.replica).expect("listed") as u64;
    e.varint(version.timestamp.saturating_sub(sigv.timestamp)).varint(origin);
}

fn get_sigv(d: &mut Reader<'_>, origins: &[u32], version: Version) -> Result<Version> {
    let below = d.varint()?;
    let timestamp = version
        .timestamp
        .checked_sub(below)
        .filter(|t| *t > 0)
        .ok_or_else(|| Error::corrupt("a significant version is not below its row's"))?;
    let origin = usize::try_from(d.varint()?).ok().and_then(|o| origins.get(o));
    let replica = *origin.ok_or_else(|| Error::corrupt("a sigv names no listed origin"))?;
    Ok(Version { timestamp, replica })
}

/// A prioritised pull's answer for one part (protocol 5):
///
/// ```text
/// PRIORITISED_PART = part u32 | tsvv | n u32 | origins [replica u32] | base_ts u64
///   | n × (key_delta var | ts − base_ts var | origin_index var | sigv_below var
///          | sigv_origin_index var | flags u8 (1: removed)), in key order | n×D f32 values
/// ```
pub fn encode_prioritised(r: &PrioritisedReply) -> Vec<u8> {
    let n = r.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| r.keys[i]);
    let (origins, base) = origins_of(&r.meta, &r.sigv);
    let mut e = Writer(Vec::with_capacity(64 + n * 14 + r.values.len() * 4));
    e.u32(r.part);
    put_vv(&mut e, &r.tsvv);
    e.u32(n as u32).u32(origins.len() as u32);
    origins.iter().for_each(|&o| {
        e.u32(o);
    });
    e.u64(base);
    let mut prev = 0u64;
    for &i in &order {
        let m = &r.meta[i];
        let origin = origins.binary_search(&m.version.replica).expect("listed") as u64;
        e.varint(r.keys[i] - prev).varint(m.version.timestamp - base).varint(origin);
        put_sigv(&mut e, &origins, m.version, r.sigv[i]);
        e.u8(if r.tombstone[i] { TOMBSTONE } else { 0 });
        prev = r.keys[i];
    }
    let d = r.values.len() / n.max(1);
    for &i in &order {
        e.f32s(&r.values[i * d..][..d]);
    }
    e.0
}

/// Reads a prioritised part for a table of `dim` values; keys must strictly increase.
pub fn decode_prioritised(b: &[u8], dim: usize) -> Result<PrioritisedReply> {
    let mut d = reader(b);
    let part = d.u32()?;
    let tsvv = get_vv(&mut d)?;
    let n = d.count(5)?;
    let k = d.count(4)?;
    let origins = (0..k).map(|_| d.u32()).collect::<Result<Vec<u32>>>()?;
    let base = d.u64()?;
    let mut r = PrioritisedReply { part, tsvv, ..PrioritisedReply::default() };
    let mut prev = 0u64;
    for i in 0..n {
        let delta = d.varint()?;
        if i > 0 && delta == 0 {
            return Err(Error::corrupt("a prioritised part repeats a key"));
        }
        let key = prev.checked_add(delta).ok_or_else(|| Error::corrupt("a sync key overflows"))?;
        let ts = base
            .checked_add(d.varint()?)
            .ok_or_else(|| Error::corrupt("a sync version overflows"))?;
        let origin = usize::try_from(d.varint()?).ok().and_then(|o| origins.get(o));
        let replica = *origin.ok_or_else(|| Error::corrupt("a sync row names no listed origin"))?;
        let version = Version { timestamp: ts, replica };
        let sigv = get_sigv(&mut d, &origins, version)?;
        let flags = d.u8()?;
        if flags & !TOMBSTONE != 0 {
            return Err(Error::corrupt(format!("a prioritised row has unknown flags {flags:#x}")));
        }
        r.keys.push(key);
        r.meta.push(RowMeta { version, update_count: 0, last_update_ms: version.ms() });
        r.sigv.push(sigv);
        r.tombstone.push(flags & TOMBSTONE != 0);
        prev = key;
    }
    r.values = d.f32s(n * dim)?;
    d.end()?;
    Ok(r)
}

/// A PACKED frame's methods.
const STORED: u8 = 0;
const ZSTD: u8 = 1;
/// Answers with fewer raw bytes than this are packed but not compressed (zstd's frame and
/// tables cost more than it saves there).
pub const COMPRESS_MIN: usize = 256;
/// The zstd level: 1, the fastest of the standard levels. On a round's answer of small parts
/// it is within 1 % of level 3's size (the values' mantissas are what is left, and no level
/// shrinks those), at about half its CPU, which the source spends once per follower.
pub const ZSTD_LEVEL: i32 = 1;
/// The raw bytes a packer holds before it is sealed into a frame of its own (the size at which
/// the port flushes what it buffered): an answer larger than this goes as several PACKED
/// frames, so that the follower applies the first while the rest arrive.
pub const PACK_MAX: usize = 256 << 10;

/// The frames a kind packs (the answers to LIST, PULL and PRIORITISED_PULL).
pub fn packs(kind: Kind) -> bool {
    matches!(kind, Kind::Changed | Kind::Part | Kind::PullDone | Kind::PrioritisedPart)
}

/// Gathers the frames of one answer for a requester of protocol 6 ([`PACKED_PROTOCOL`]), and
/// seals them into one frame: PACKED, zstd-compressed when the answer is large enough and
/// compression makes it smaller, else stored; a lone small frame goes as itself.
#[derive(Debug, Default)]
pub struct Packer {
    raw: Vec<u8>,
    frames: usize,
    /// The single frame's kind and where its body starts in `raw`, while there is one.
    first: Option<(Kind, usize)>,
}

impl Packer {
    /// Adds one frame (of a kind that [`packs`]).
    pub fn push(&mut self, kind: Kind, body: &[u8]) {
        debug_assert!(packs(kind), "{kind:?} is not packed");
        let mut e = Writer(std::mem::take(&mut self.raw));
        e.u8(kind as u8).varint(body.len() as u64);
        if self.frames == 0 {
            self.first = Some((kind, e.0.len()));
        }
        e.raw(body);
        self.raw = e.0;
        self.frames += 1;
    }

    /// The raw bytes gathered.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// The frame of what was gathered (its kind and body), and empties the packer; `None`
    /// when nothing was.
    pub fn seal(&mut self) -> Option<(Kind, Vec<u8>)> {
        let frames = std::mem::take(&mut self.frames);
        let raw = std::mem::take(&mut self.raw);
        let first = self.first.take();
        if frames == 0 {
            return None;
        }
        if frames == 1 && raw.len() < COMPRESS_MIN {
            let (kind, at) = first.expect("one frame");
            return Some((kind, raw[at..].to_vec()));
        }
        let packed = |method: u8, data: &[u8]| {
            let mut e = Writer::with_capacity(5 + data.len());
            e.u8(method).u32(raw.len() as u32).raw(data);
            e.0
        };
        if raw.len() >= COMPRESS_MIN {
            if let Ok(z) = zstd::bulk::compress(&raw, ZSTD_LEVEL) {
                if z.len() < raw.len() {
                    return Some((Kind::Packed, packed(ZSTD, &z)));
                }
            }
        }
        Some((Kind::Packed, packed(STORED, &raw)))
    }
}

/// The frames of a PACKED frame's body, in order. Anything that does not read back exactly
/// (a short or long payload, a bad zstd frame, an unknown or unpackable kind, a frame that
/// runs past the end) is an [`ErrorKind::Corruption`] error.
pub fn unpack(b: &[u8]) -> Result<Vec<(Kind, Vec<u8>)>> {
    let mut d = Reader::new(b, "a packed sync frame");
    let method = d.u8()?;
    let len = d.u32()? as usize;
    if len > MAX_FRAME {
        return Err(Error::corrupt(format!("a packed sync frame announces {len} bytes")));
    }
    let data = d.rest();
    let raw = match method {
        STORED => data.to_vec(),
        ZSTD => zstd::bulk::decompress(data, len)
            .map_err(|e| Error::corrupt(format!("a packed sync frame does not decompress: {e}")))?,
        m => return Err(Error::corrupt(format!("a packed sync frame has method {m}"))),
    };
    if raw.len() != len {
        return Err(Error::corrupt("a packed sync frame is not as long as it says"));
    }
    let mut d = Reader::new(&raw, "a packed sync frame");
    let mut out = Vec::new();
    while d.left() > 0 {
        let k = d.u8()?;
        let kind = Kind::from_u8(k)
            .filter(|k| packs(*k))
            .ok_or_else(|| Error::corrupt(format!("a packed sync frame holds kind {k}")))?;
        let n = usize::try_from(d.varint()?).unwrap_or(usize::MAX);
        if n > d.left() {
            return Err(Error::corrupt("a packed sync frame's frame runs past its end"));
        }
        out.push((kind, d.take(n)?.to_vec()));
    }
    if out.is_empty() {
        return Err(Error::corrupt("a packed sync frame holds no frame"));
    }
    Ok(out)
}

/// The body of the ERROR frame of `e`.
pub fn encode_error(e: &Error) -> Vec<u8> {
    frame::encode_error_body(&frame::ErrorBody {
        kind: Some(e.kind()),
        code: frame::status_code(e.kind()) as i32,
        message: e.message().to_owned(),
        details: Vec::new(),
    })
}

/// The error an ERROR frame's body carries.
pub fn decode_error(b: &[u8]) -> Result<Error> {
    let e = frame::decode_error(b)?;
    Ok(Error::new(e.kind.unwrap_or(ErrorKind::Io), e.message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reply(n: usize, d: usize, s: Option<usize>, partial: bool) -> PartReply {
        let mut vv = Vv::new();
        vv.raise(1, 77);
        vv.raise(9, 5);
        PartReply {
            part: 3,
            keys: (0..n as u64).map(|k| k * 31).collect(),
            meta: (0..n as u64)
                .map(|i| RowMeta {
                    version: Version {
                        timestamp: (100 + i) << 20,
                        replica: 1 + 4 * (i as u32 % 2),
                    },
                    update_count: i * 1000,
                    last_update_ms: (100 + i) << 4,
                })
                .collect(),
            tombstone: (0..n).map(|i| i.is_multiple_of(3)).collect(),
            values: (0..n * d).map(|i| i as f32 * 0.5).collect(),
            state: s.map(|s| (0..n * s).map(|i| i as f32).collect()),
            vv,
            sv: Sv::new(42, 1),
            from_cache: n.is_multiple_of(2),
            partial,
            // Every fourth size: a complete reply (a key range and a floor).
            complete: n.is_multiple_of(4).then(|| Complete {
                lo: n as u64,
                hi: u64::MAX - n as u64,
                floor: {
                    let mut f = Vv::new();
                    f.raise(2, 1 << 30);
                    f
                },
            }),
            // With state: a step counter (protocol 3).
            step: s.map(|_| 200 + n as u64),
            // Every other size: significant versions (protocol 5), some rows without one.
            sigv: if n % 2 == 1 {
                (0..n as u64)
                    .map(|i| {
                        if i % 3 == 1 {
                            Version { timestamp: (90 + i) << 20, replica: 9 }
                        } else {
                            Version::default()
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            },
            svv: (n % 2 == 1).then(|| {
                let mut v = Vv::new();
                v.raise(9, 1 << 24);
                v
            }),
        }
    }

    fn prioritised(n: usize, d: usize) -> PrioritisedReply {
        let r = reply(n, d, None, false);
        PrioritisedReply {
            part: r.part,
            keys: r.keys,
            meta: r.meta.iter().map(|m| RowMeta { update_count: 0, ..*m }).collect(),
            sigv: r
                .meta
                .iter()
                .map(|m| Version { timestamp: m.version.timestamp - 7, replica: 4 })
                .collect(),
            tombstone: r.tombstone,
            values: r.values,
            tsvv: r.vv,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// Every message reads back as written, and every truncation of it is a clean
        /// `Corruption` error, never a panic or a wrong value.
        #[test]
        fn messages_round_trip_and_truncations_are_errors(
            n in 0usize..20, d in 1usize..6, s in proptest::option::of(1usize..4), partial: bool,
        ) {
            let r = reply(n, d, s, partial);
            let b = encode_part(&r);
            prop_assert_eq!(&decode_part(&b, d, s.unwrap_or(0)).unwrap(), &r);
            // Rows in any order come back in key order, each whole.
            let mut rev = r.clone();
            rev.keys.reverse();
            rev.meta.reverse();
            rev.tombstone.reverse();
            rev.sigv.reverse();
            rev.values = r.values.chunks(d).rev().flatten().copied().collect();
            rev.state = r.state.as_ref().zip(s).map(|(st, sd)| st.chunks(sd).rev().flatten().copied().collect());
            prop_assert_eq!(&decode_part(&encode_part(&rev), d, s.unwrap_or(0)).unwrap(), &r);
            for cut in 0..b.len() {
                let e = decode_part(&b[..cut], d, s.unwrap_or(0)).unwrap_err();
                prop_assert_eq!(e.kind(), ErrorKind::Corruption);
            }
            let precision = if partial { Precision::F16 } else { Precision::F32 };
            let h = Hello { protocol: PROTOCOL, token: "t".repeat(n), with_state: partial, tables: vec!["a".into(); n % 3], precision };
            prop_assert_eq!(Hello::decode(&h.encode()).unwrap(), h.clone());
            // A protocol-5 hello has no precision: it reads back as f32.
            let old = Hello { protocol: 5, precision: Precision::F32, ..h.clone() };
            prop_assert_eq!(Hello::decode(&Hello { protocol: 5, ..h }.encode()).unwrap(), old);
            // f16 values: every value comes back rounded to half precision, the rest exact.
            let hb = encode_part_as(&r, Precision::F16);
            let mut half = r.clone();
            half.values = r.values.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect();
            prop_assert_eq!(&decode_part(&hb, d, s.unwrap_or(0)).unwrap(), &half);
            prop_assert_eq!(hb.len() + 2 * n * d, b.len());
            for cut in 0..hb.len() {
                prop_assert_eq!(decode_part(&hb[..cut], d, s.unwrap_or(0)).unwrap_err().kind(), ErrorKind::Corruption);
            }
            // An answer packed (protocol 6): stored when small, zstd when large; it reads back
            // frame by frame, and every truncation of it is a Corruption error.
            let changes = Changes { epoch: 3, upto: n as u64, parts: (0..n as u32).map(|p| (p, Sv::new(p as u64, 1))).collect() };
            let mut frames = vec![(Kind::Changed, encode_changed(&changes, 77))];
            frames.extend((0..n % 5 + 1).map(|k| (Kind::Part, encode_part(&reply(n + k, d, s, partial)))));
            frames.push((Kind::PullDone, Vec::new()));
            let mut packer = Packer::default();
            frames.iter().for_each(|(k, b)| packer.push(*k, b));
            let raw = packer.len();
            let (kind, packed) = packer.seal().unwrap();
            prop_assert!(packer.is_empty() && packer.seal().is_none());
            prop_assert_eq!(kind, Kind::Packed);
            prop_assert_eq!(packed[0], if raw >= COMPRESS_MIN { ZSTD } else { STORED });
            prop_assert_eq!(&unpack(&packed).unwrap(), &frames);
            for cut in 0..packed.len() {
                prop_assert_eq!(unpack(&packed[..cut]).unwrap_err().kind(), ErrorKind::Corruption);
            }
            let parts: Vec<(u32, Vv)> = (0..n as u32).map(|p| (p, r.vv.clone())).collect();
            prop_assert_eq!(decode_pull(&encode_pull("items", &parts)).unwrap(), ("items".to_owned(), parts));
            let p = prioritised(n, d);
            let pb = encode_prioritised(&p);
            prop_assert_eq!(&decode_prioritised(&pb, d).unwrap(), &p);
            for cut in 0..pb.len() {
                prop_assert_eq!(decode_prioritised(&pb[..cut], d).unwrap_err().kind(), ErrorKind::Corruption);
            }
            let mut framed = Vec::new();
            write_frame(&mut framed, Kind::Part, &b).unwrap();
            for cut in 0..framed.len() {
                prop_assert!(read_frame(&mut &framed[..cut]).is_err());
            }
        }
    }

    /// A round's answer as the benchmark's 15,000 rows/s makes it (a change list of 500 parts,
    /// one or two rows each, values' signs and mantissas random): packing and zstd take out the
    /// parts' headers, frame headers and most of the change list; the values stay.
    #[test]
    fn a_rounds_answer_of_small_parts_compresses_to_about_its_values() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (parts, d) = (500u32, 16);
        let changes = Changes {
            epoch: 9,
            upto: 1 << 40,
            parts: (0..parts).map(|p| (p * 2, Sv::new((1 << 40) + u64::from(p), 1))).collect(),
        };
        let mut packer = Packer::default();
        packer.push(Kind::Changed, &encode_changed(&changes, 1 << 41));
        let (mut raw, mut values) = (HEADER + encode_changed(&changes, 1 << 41).len(), 0);
        for p in 0..parts {
            let n = 1 + (p % 5 == 0) as usize;
            let mut r = reply(n, d, None, false);
            r.part = p * 2;
            r.keys = (0..n).map(|_| rnd() >> 24).collect();
            r.keys.sort_unstable();
            r.keys.dedup();
            let n = r.keys.len();
            r.meta.truncate(n);
            r.tombstone = vec![false; n];
            r.sigv.clear();
            r.svv = None;
            r.complete = None;
            r.values = (0..n * d)
                .map(|_| {
                    f32::from_bits(rnd() as u32 & 0x8000_0000 | 0x3f80_0000 | rnd() as u32 >> 9)
                })
                .collect();
            values += n * d * 4;
            let b = encode_part(&r);
            raw += HEADER + b.len();
            packer.push(Kind::Part, &b);
        }
        packer.push(Kind::PullDone, &[]);
        raw += HEADER;
        let (_, packed) = packer.seal().unwrap();
        let sent = HEADER + packed.len();
        eprintln!("raw {raw} B, values {values} B, packed {sent} B");
        assert!(sent < raw * 6 / 10, "raw {raw} B, values {values} B, packed {sent} B");
        assert!(sent < values * 115 / 100, "raw {raw} B, values {values} B, packed {sent} B");
    }

    /// A lone small frame goes as itself; what a packed frame must not hold is refused.
    #[test]
    fn packing_edges() {
        let mut p = Packer::default();
        p.push(Kind::PullDone, &[]);
        assert_eq!(p.seal(), Some((Kind::PullDone, Vec::new())));
        let big = encode_part(&reply(40, 16, None, false));
        p.push(Kind::Part, &big);
        let (kind, body) = p.seal().unwrap();
        assert_eq!((kind, body[0]), (Kind::Packed, ZSTD));
        assert_eq!(unpack(&body).unwrap(), vec![(Kind::Part, big)]);
        let stored = |raw: &[u8]| {
            let mut e = Writer::default();
            e.u8(STORED).u32(raw.len() as u32).raw(raw);
            e.0
        };
        for (raw, why) in [
            (&[Kind::Packed as u8, 0][..], "kind 24"),
            (&[Kind::Hello as u8, 0][..], "kind 1"),
            (&[99, 0][..], "kind 99"),
            (&[Kind::Part as u8, 5, 1][..], "past its end"),
            (&[][..], "no frame"),
        ] {
            let e = unpack(&stored(raw)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corruption);
            assert!(e.to_string().contains(why), "{e}");
        }
        let mut wrong = stored(&[Kind::PullDone as u8, 0]);
        wrong[1] = 3; // announces 3 raw bytes, holds 2
        assert_eq!(unpack(&wrong).unwrap_err().kind(), ErrorKind::Corruption);
        wrong[0] = 7;
        assert!(unpack(&wrong).unwrap_err().to_string().contains("method 7"));
        let e = Hello::decode(&frame::encode_hello("t", Service::Sync, &[6, 0, 0, 0, 0, 0, 0, 2]));
        assert_eq!(e.unwrap_err().kind(), ErrorKind::Corruption);
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_reading_it() {
        let head = frame::header(Kind::Part, MAX_FRAME + 1, 0);
        let e = read_frame(&mut &head[..]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
        assert!(e.to_string().contains("over the limit"), "{e}");
        let e = Hello::decode(&[1, 2, 3, 4, 1, 0]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption, "{e}");
        let lookups = frame::encode_hello("t", Service::Lookups, &[]);
        let e = Hello::decode(&lookups).unwrap_err();
        assert!(e.to_string().contains("not a framed lookup port"), "{e}");
    }

    /// The older framing (9-byte header): an older follower's Hello is recognised, and an
    /// older source's Error becomes an error that says to upgrade the source; the Error this
    /// build sends an older follower reads in that framing.
    #[test]
    fn peers_of_the_older_framing_are_recognised_and_told() {
        let legacy = |kind: u8, body: &[u8]| {
            let mut w = Writer::default();
            w.u32(body.len() as u32).u8(kind).u32(crc32fast::hash(body)).raw(body);
            w.0
        };
        let mut old_hello = Writer::default();
        old_hello.raw(b"EKSY").u16(3).str("tok").u8(0).u32(0);
        let f = legacy(LEGACY_HELLO, &old_hello.0);
        assert_eq!(read_or_legacy(&mut f.as_slice(), 1 << 20).unwrap(), Err(Legacy::Hello));
        let mut old_error = Writer::default();
        old_error.u8(4).str("a sync frame announces 16843499 bytes, over the limit");
        let f = legacy(LEGACY_ERROR, &old_error.0);
        let e = read_frame(&mut f.as_slice()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.message().contains("upgrade the source"), "{e}");
        assert!(e.message().contains("over the limit"), "{e}");
        // What an older follower reads: its header, an Unsupported kind (8), the message.
        let f = legacy_error_frame();
        let len = u32::from_le_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!((f.len(), f[4], f[9]), (9 + len, LEGACY_ERROR, LEGACY_UNSUPPORTED));
        assert_eq!(u32::from_le_bytes(f[5..9].try_into().unwrap()), crc32fast::hash(&f[9..]));
        let mut d = Reader::new(&f[10..], "x");
        assert!(d.str().unwrap().contains("upgrade the follower"));
    }
}
