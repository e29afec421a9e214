//! embstore's one binary wire: the frames of the framed lookup path (docs/serving.md, "The
//! framed lookup path") and of the sync port (docs/dissemination.md, "The wire"), two message
//! sets on one header, one HELLO, one ERROR and one codec. The lookup set carries the same
//! `Lookup` and `Describe` as the gRPC service, so that a batch pays neither HTTP/2 nor
//! protobuf for its rows: the server writes rows from the table straight into the answer's
//! buffer, and a client reads them straight into its output array. The sync set carries a
//! source's changes to its followers.
//!
//! Every frame is a 16-byte header and a body; integers are little-endian:
//!
//! ```text
//! header   magic u8 (0xEB) | version u8 (2) | kind u8 | flags u8 | body length u32 | id u32
//!          | crc u32 (flags & 1: the body's CRC-32, checked by the reader; else 0)
//!
//! Both sets
//! HELLO     1  client → server, first frame: token (len u32 | UTF-8, empty for none)
//!              | service u8 (1 lookups, 2 sync) | the service's fields (sync: below)
//! ERROR     5  server → client: kind u8 (ErrorKind::code; 255: none) | code u32 (a gRPC
//!              status code) | message (len u32 | UTF-8) | details (len u32 | bytes:
//!              ServerInfo, protobuf, may be empty)
//! Lookups
//! INFO      2  server → client: ServerInfo (protobuf), answering HELLO and DESCRIBE
//! LOOKUP    3  table length u16 | table | version u64 | known_gen u64 | shard u32
//!              | num_shards u32 | n u32 | n ids (u64)
//! LOOKUP_SHARDS 7  a LOOKUP whose ids fall in several shards of the version, all held by
//!              the server (sent only to one whose ServerInfo sets spans_shards):
//!              LOOKUP's fields to num_shards | m u32 | m more shards (u32) | n u32 | n ids
//! ROWS      4  version u64 | dim u32 | n u32 | info length u32 | ServerInfo (protobuf, empty
//!              when the client's known_gen is current) | found (n bytes, 0 or 1)
//!              | zero bytes up to a multiple of 4 from the frame's start | n × dim float32
//! DESCRIBE  6  empty
//! Sync (every sync frame carries its CRC; the bodies are in embstore-sync's `wire`)
//! WELCOME  16, LIST 17, CHANGED 18, PULL 19, PART 20, PULL_DONE 21
//! Parameter server (between the processes of one `embstore-ps` run; bodies in its `cluster`)
//! PS_READ 32, PS_ROWS 33, PS_ADD 34, PS_ACK 35, PS_DONE 36, PS_APPLY 37, PS_GATHER 38,
//! PS_GATHERED 39, PS_MOVE 40
//! ```
//!
//! A server answers every lookup-set request with one frame of the same `id`, in the order
//! the requests came (requests may be pipelined). A frame of another magic or version gets an
//! ERROR (`UNIMPLEMENTED`, naming the versions spoken) and the connection is closed.
//!
//! This module holds the codec only (no I/O beyond [`read_blocking`]): the framed server is in
//! `embstore-server`, its client in `embstore-client`, the sync port in `embstore-sync`, and
//! all parse with these functions, which take any bytes and never panic.

use std::io::Read;

use embstore_common::bytes::{Reader, Writer};
use embstore_common::{Error, ErrorKind};

use crate::v1::LookupRequest;

/// The first byte of every frame.
pub const MAGIC: u8 = 0xEB;
/// The version of the wire this codec speaks (1: the framed path before the sync port joined
/// it, with a 12-byte header).
pub const VERSION: u8 = 2;
/// Bytes of a frame header.
pub const HEADER: usize = 16;
/// Bytes of a ROWS body before the server's info.
pub const ROWS_FIXED: usize = 20;
/// The header flag that says the crc field holds the body's CRC-32.
pub const FLAG_CRC: u8 = 1;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Info = 2,
    Lookup = 3,
    Rows = 4,
    Error = 5,
    Describe = 6,
    LookupShards = 7,
    Welcome = 16,
    List = 17,
    Changed = 18,
    Pull = 19,
    Part = 20,
    PullDone = 21,
    /// A prioritised pull (sync protocol 5): parts with the requester's TSVV.
    PrioritisedPull = 22,
    /// A prioritised pull's answer for one part.
    PrioritisedPart = 23,
    /// A request's answer packed in one frame, compressed where that pays (sync protocol 6).
    Packed = 24,
    /// A rollback's request to a source: pause or resume its tables' writes, or write rows.
    Rollback = 25,
    /// A rollback request's answer: how many tables or rows it changed.
    RollbackDone = 26,
    /// Parameter server: read rows from their owner.
    PsRead = 32,
    /// Parameter server: the rows read, in request order, and the clock they reflect.
    PsRows = 33,
    /// Parameter server: a clock's deltas for rows of the receiver, staged until applied.
    PsAdd = 34,
    /// Parameter server: a request done (the answer to ADD, APPLY and DONE).
    PsAck = 35,
    /// Parameter server: a process has pushed a clock (to the coordinator; answered once
    /// every process has and every owner applied it).
    PsDone = 36,
    /// Parameter server: apply the deltas staged for a clock (from the coordinator).
    PsApply = 37,
    /// Parameter server: a process's part of an all-gather (to the coordinator).
    PsGather = 38,
    /// Parameter server: every process's part of an all-gather, once all have sent theirs.
    PsGathered = 39,
    /// Parameter server: rows that placement moved to the receiver.
    PsMove = 40,
}

impl Kind {
    /// The kind of a kind byte, if this version knows it.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Info,
            3 => Kind::Lookup,
            4 => Kind::Rows,
            5 => Kind::Error,
            6 => Kind::Describe,
            7 => Kind::LookupShards,
            16 => Kind::Welcome,
            17 => Kind::List,
            18 => Kind::Changed,
            19 => Kind::Pull,
            20 => Kind::Part,
            21 => Kind::PullDone,
            22 => Kind::PrioritisedPull,
            23 => Kind::PrioritisedPart,
            24 => Kind::Packed,
            25 => Kind::Rollback,
            26 => Kind::RollbackDone,
            32 => Kind::PsRead,
            33 => Kind::PsRows,
            34 => Kind::PsAdd,
            35 => Kind::PsAck,
            36 => Kind::PsDone,
            37 => Kind::PsApply,
            38 => Kind::PsGather,
            39 => Kind::PsGathered,
            40 => Kind::PsMove,
            _ => return None,
        })
    }
}

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// Bytes of the body that follows.
    pub len: u32,
    /// The request's id, echoed by its answer.
    pub id: u32,
    /// The body's CRC-32, when the sender gave one.
    pub crc: Option<u32>,
}

impl Header {
    /// Whether `body` is the body this header announced (its length, and its CRC if given).
    pub fn check(&self, body: &[u8]) -> Result<(), FrameError> {
        if body.len() != self.len as usize {
            return Err(FrameError::Malformed("the body is not as long as its header says".into()));
        }
        match self.crc {
            Some(crc) if crc32fast::hash(body) != crc => Err(FrameError::Checksum),
            _ => Ok(()),
        }
    }
}

/// Why bytes are not a frame of this protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The first byte is not [`MAGIC`]: not this protocol.
    Magic(u8),
    /// Another version of the protocol.
    Version(u8),
    /// A kind this version does not know, or flags it does not define.
    Kind(u8),
    /// A body shorter or longer than its fields say, or a table name not UTF-8.
    Malformed(String),
    /// A body that fails the CRC its header gives.
    Checksum,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Magic(b) => write!(f, "not an embstore frame (first byte {b:#04x})"),
            FrameError::Version(v) => {
                write!(f, "frame version {v}, this side speaks version {VERSION}")
            }
            FrameError::Kind(k) => write!(f, "unknown frame kind or flags {k}"),
            FrameError::Malformed(what) => write!(f, "malformed frame: {what}"),
            FrameError::Checksum => write!(f, "a frame failed its checksum"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<embstore_common::Error> for FrameError {
    fn from(e: embstore_common::Error) -> Self {
        FrameError::Malformed(e.message().to_owned())
    }
}

impl From<FrameError> for Error {
    /// Another version is [`ErrorKind::Unsupported`]; anything else is corruption.
    fn from(e: FrameError) -> Self {
        let kind = match e {
            FrameError::Version(_) => ErrorKind::Unsupported,
            _ => ErrorKind::Corruption,
        };
        Error::new(kind, e.to_string())
    }
}

/// A reader of a frame's body.
fn reader(body: &[u8]) -> Reader<'_> {
    Reader::new(body, "the frame's body")
}

/// The header of a frame of `kind` with a body of `len` bytes, without a CRC.
pub fn header(kind: Kind, len: usize, id: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = MAGIC;
    h[1] = VERSION;
    h[2] = kind as u8;
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..12].copy_from_slice(&id.to_le_bytes());
    h
}

/// Parses a header.
pub fn parse_header(h: &[u8; HEADER]) -> Result<Header, FrameError> {
    if h[0] != MAGIC {
        return Err(FrameError::Magic(h[0]));
    }
    if h[1] != VERSION {
        return Err(FrameError::Version(h[1]));
    }
    let kind = Kind::from_u8(h[2]).ok_or(FrameError::Kind(h[2]))?;
    if h[3] & !FLAG_CRC != 0 {
        return Err(FrameError::Kind(h[3]));
    }
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let crc = (h[3] & FLAG_CRC != 0).then(|| word(12));
    Ok(Header { kind, len: word(4), id: word(8), crc })
}

/// A whole frame: header and `body`, without a CRC.
pub fn frame(kind: Kind, id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&header(kind, body.len(), id));
    out.extend_from_slice(body);
    out
}

/// Appends a whole frame with its body's CRC to `out`.
pub fn frame_checked_into(out: &mut Vec<u8>, kind: Kind, id: u32, body: &[u8]) {
    let mut h = header(kind, body.len(), id);
    h[3] = FLAG_CRC;
    h[12..16].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(body);
}

/// Reads one frame from a blocking reader: its header and body (at most `max` body bytes,
/// checked before any is read; the body grows as its bytes arrive, from 64 KiB, so that a peer
/// announcing much and sending nothing pins nothing). `first`: the header's bytes when the
/// caller read them already. Errors are embstore errors: [`ErrorKind::Unsupported`] for
/// another version, [`ErrorKind::Corruption`] for anything else that is not a frame,
/// [`ErrorKind::Io`] when reading fails.
pub fn read_blocking(
    r: &mut impl Read,
    max: usize,
    first: Option<[u8; HEADER]>,
) -> embstore_common::Result<(Header, Vec<u8>)> {
    let h = match first {
        Some(h) => h,
        None => {
            let mut h = [0u8; HEADER];
            r.read_exact(&mut h).map_err(|e| Error::io("receive", e))?;
            h
        }
    };
    let header = parse_header(&h)?;
    let len = header.len as usize;
    if len > max {
        return Err(Error::corrupt(format!(
            "a frame announces {len} bytes, over the limit of {max}"
        )));
    }
    let mut body = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut body).map_err(|e| Error::io("receive", e))?;
    if body.len() < len {
        return Err(Error::corrupt(format!("a frame was cut short (expected {len} bytes)")));
    }
    header.check(&body)?;
    Ok((header, body))
}

/// Which message set a HELLO opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Service {
    Lookups = 1,
    Sync = 2,
    /// The processes of a parameter server.
    Ps = 3,
}

/// A HELLO's body: the token, the service, and the service's own fields (`rest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    pub token: String,
    pub service: Service,
    pub rest: &'a [u8],
}

/// The body of a HELLO: `token`, `service`, then `rest`.
pub fn encode_hello(token: &str, service: Service, rest: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_capacity(5 + token.len() + rest.len());
    w.str(token).u8(service as u8).raw(rest);
    w.0
}

/// Parses a HELLO body.
pub fn decode_hello(body: &[u8]) -> Result<Hello<'_>, FrameError> {
    let mut c = reader(body);
    let token = c.str()?;
    let service = match c.u8()? {
        1 => Service::Lookups,
        2 => Service::Sync,
        3 => Service::Ps,
        s => return Err(FrameError::Malformed(format!("a HELLO names unknown service {s}"))),
    };
    Ok(Hello { token, service, rest: c.rest() })
}

/// Bytes of the LOOKUP (or LOOKUP_SHARDS) body of `req`.
pub fn lookup_len(req: &LookupRequest) -> usize {
    let more = if req.more_shards.is_empty() { 0 } else { 4 + 4 * req.more_shards.len() };
    2 + req.table.len() + 8 + 8 + 4 + 4 + more + 4 + req.ids.len() * 8
}

/// The LOOKUP frame of `req`, or LOOKUP_SHARDS when it names more shards (its table name must
/// be under 64 KiB: longer ones are cut, and then name no table).
pub fn encode_lookup(req: &LookupRequest, id: u32) -> Vec<u8> {
    let table = &req.table.as_bytes()[..req.table.len().min(u16::MAX as usize)];
    let len = lookup_len(req) - req.table.len() + table.len();
    let kind = if req.more_shards.is_empty() { Kind::Lookup } else { Kind::LookupShards };
    let mut w = Writer::with_capacity(HEADER + len);
    w.raw(&header(kind, len, id)).u16(table.len() as u16).raw(table);
    w.u64(req.version).u64(req.known_gen).u32(req.shard).u32(req.num_shards);
    if kind == Kind::LookupShards {
        w.u32(req.more_shards.len() as u32);
        for &s in &req.more_shards {
            w.u32(s);
        }
    }
    w.u32(req.ids.len() as u32);
    for &id in &req.ids {
        w.u64(id);
    }
    w.0
}

/// Parses the body of a LOOKUP (`many` false) or LOOKUP_SHARDS (`many` true) frame.
pub fn decode_lookup(body: &[u8], many: bool) -> Result<LookupRequest, FrameError> {
    let mut c = reader(body);
    let table = c.str16()?;
    let version = c.u64()?;
    let known_gen = c.u64()?;
    let shard = c.u32()?;
    let num_shards = c.u32()?;
    let more_shards = if many {
        let m = c.count(4)?;
        (0..m).map(|_| c.u32()).collect::<Result<Vec<u32>, _>>()?
    } else {
        Vec::new()
    };
    let n = c.u32()? as usize;
    if c.left() != n.saturating_mul(8) {
        return Err(FrameError::Malformed("the id count and the body's length differ".into()));
    }
    let ids = c.rest().chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let ids = ids.collect();
    Ok(LookupRequest { table, version, shard, num_shards, ids, known_gen, more_shards })
}

/// The fixed part of a ROWS body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsHead {
    pub version: u64,
    pub dim: u32,
    pub n: u32,
    pub info_len: u32,
}

impl RowsHead {
    /// Bytes from the frame's start to the first float: header, fixed part, info, found, and
    /// padding to a multiple of 4.
    pub fn prefix_len(&self) -> usize {
        (HEADER + ROWS_FIXED + self.info_len as usize + self.n as usize).next_multiple_of(4)
    }

    /// Bytes of the rows.
    pub fn values_len(&self) -> usize {
        (self.n as usize).saturating_mul(self.dim as usize).saturating_mul(4)
    }

    /// Bytes of the body: everything after the header.
    pub fn body_len(&self) -> usize {
        (self.prefix_len() - HEADER).saturating_add(self.values_len())
    }

    /// Writes the header and the fixed part of the frame into `out[..HEADER + ROWS_FIXED]`.
    pub fn write(&self, id: u32, out: &mut [u8]) {
        out[..HEADER].copy_from_slice(&header(Kind::Rows, self.body_len(), id));
        let f = &mut out[HEADER..HEADER + ROWS_FIXED];
        f[0..8].copy_from_slice(&self.version.to_le_bytes());
        f[8..12].copy_from_slice(&self.dim.to_le_bytes());
        f[12..16].copy_from_slice(&self.n.to_le_bytes());
        f[16..20].copy_from_slice(&self.info_len.to_le_bytes());
    }

    /// Parses the fixed part of a ROWS body, checking it against the body's length `len`.
    pub fn parse(fixed: &[u8; ROWS_FIXED], len: u32) -> Result<Self, FrameError> {
        let mut c = reader(fixed);
        let head = RowsHead { version: c.u64()?, dim: c.u32()?, n: c.u32()?, info_len: c.u32()? };
        if head.body_len() != len as usize {
            return Err(FrameError::Malformed("the rows and the body's length differ".into()));
        }
        Ok(head)
    }
}

/// What an ERROR frame says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorBody {
    /// The embstore error kind, when the error is one.
    pub kind: Option<ErrorKind>,
    /// The gRPC status code (as the gRPC service would answer).
    pub code: i32,
    pub message: String,
    /// The server's ServerInfo (protobuf) where the code needs it; may be empty.
    pub details: Vec<u8>,
}

/// Code 255 on the wire: no kind.
const NO_KIND: u8 = u8::MAX;

/// The body of an ERROR frame.
pub fn encode_error_body(e: &ErrorBody) -> Vec<u8> {
    let mut body = Writer::with_capacity(13 + e.message.len() + e.details.len());
    body.u8(e.kind.map_or(NO_KIND, ErrorKind::code)).u32(e.code as u32);
    body.str(&e.message).bytes(&e.details);
    body.0
}

/// The ERROR frame of `e` answering request `id`.
pub fn encode_error(id: u32, e: &ErrorBody) -> Vec<u8> {
    frame(Kind::Error, id, &encode_error_body(e))
}

/// Parses an ERROR body (a kind this build does not know reads as [`ErrorKind::Io`]).
pub fn decode_error(body: &[u8]) -> Result<ErrorBody, FrameError> {
    let mut c = reader(body);
    let kind = match c.u8()? {
        NO_KIND => None,
        k => Some(ErrorKind::from_code(k).unwrap_or(ErrorKind::Io)),
    };
    let code = c.u32()? as i32;
    let message = String::from_utf8_lossy(c.bytes()?).into_owned();
    let details = c.bytes()?.to_vec();
    c.end()?;
    Ok(ErrorBody { kind, code, message, details })
}

/// The gRPC status code of an error kind: the one mapping, for the gRPC service and the
/// framed path's ERROR alike (clients read the kind itself where the answer carries it).
pub fn status_code(kind: ErrorKind) -> tonic::Code {
    use tonic::Code;
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::ShapeMismatch | ErrorKind::NonFinite => {
            Code::InvalidArgument
        }
        ErrorKind::TableNotFound | ErrorKind::KeyNotFound => Code::NotFound,
        ErrorKind::TableExists => Code::AlreadyExists,
        ErrorKind::Capacity | ErrorKind::NoSpace => Code::ResourceExhausted,
        ErrorKind::Corruption => Code::DataLoss,
        ErrorKind::Unavailable | ErrorKind::Locked | ErrorKind::RollingBack => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// The gRPC metadata key that carries an error's kind (its [`ErrorKind::code`]) beside the
/// status code, which names several kinds alike.
pub const KIND_METADATA: &str = "embstore-error-kind";

/// `status` carrying `kind` in its metadata.
pub fn with_kind(mut status: tonic::Status, kind: ErrorKind) -> tonic::Status {
    status.metadata_mut().insert(KIND_METADATA, u32::from(kind.code()).into());
    status
}

/// The kind a status carries in its metadata, if any.
pub fn kind_of(status: &tonic::Status) -> Option<ErrorKind> {
    let v = status.metadata().get(KIND_METADATA)?.to_str().ok()?;
    ErrorKind::from_code(v.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed, TestRunner};

    fn runner(cases: u32) -> (TestRunner, u64) {
        let seed = std::env::var("EMBSTORE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x00f2_a3e5);
        eprintln!("seed {seed} (EMBSTORE_TEST_SEED={seed} replays)");
        let config = Config {
            cases,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            ..Config::default()
        };
        (TestRunner::new(config), seed)
    }

    fn request() -> impl Strategy<Value = LookupRequest> {
        (
            "[a-z_]{0,20}",
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            proptest::collection::vec(any::<u64>(), 0..64),
            proptest::collection::vec(any::<u32>(), 0..4),
        )
            .prop_map(
                |(table, version, known_gen, shard, num_shards, ids, more_shards)| LookupRequest {
                    table,
                    version,
                    shard,
                    num_shards,
                    ids,
                    known_gen,
                    more_shards,
                },
            )
    }

    /// Requests and errors go through the codec unchanged; a rows head too.
    #[test]
    fn frames_round_trip() {
        let (mut r, seed) = runner(500);
        let strategy = (request(), any::<u32>(), ".{0,40}", any::<i32>());
        r.run(&strategy, |(req, id, msg, code)| {
            let wire = encode_lookup(&req, id);
            let h = parse_header(wire[..HEADER].try_into().unwrap()).unwrap();
            let kind = if req.more_shards.is_empty() { Kind::Lookup } else { Kind::LookupShards };
            prop_assert_eq!((h.kind, h.id, h.len as usize), (kind, id, wire.len() - HEADER));
            let many = h.kind == Kind::LookupShards;
            prop_assert_eq!(decode_lookup(&wire[HEADER..], many).unwrap(), req.clone());
            for kind in ErrorKind::ALL.iter().copied().map(Some).chain([None]) {
                let body = ErrorBody { kind, code, message: msg.clone(), details: vec![1, 2, 3] };
                let e = encode_error(id, &body);
                prop_assert_eq!(decode_error(&e[HEADER..]).unwrap(), body);
            }
            let mut checked = Vec::new();
            frame_checked_into(&mut checked, Kind::Part, id, msg.as_bytes());
            let h = parse_header(checked[..HEADER].try_into().unwrap()).unwrap();
            prop_assert_eq!(h.check(&checked[HEADER..]), Ok(()));
            let (h2, body) = read_blocking(&mut checked.as_slice(), 1 << 20, None).unwrap();
            prop_assert_eq!((h2, body.as_slice()), (h, msg.as_bytes()));
            let hello = encode_hello(&msg, Service::Sync, &[9, 8]);
            let got = decode_hello(&hello).unwrap();
            prop_assert_eq!(
                (got.token.as_str(), got.service, got.rest),
                (msg.as_str(), Service::Sync, &[9u8, 8][..])
            );
            let head =
                RowsHead { version: req.version, dim: 3, n: req.ids.len() as u32, info_len: 5 };
            let mut buf = vec![0u8; head.prefix_len()];
            head.write(id, &mut buf);
            prop_assert_eq!(head.prefix_len() % 4, 0);
            let h = parse_header(buf[..HEADER].try_into().unwrap()).unwrap();
            let fixed: &[u8; ROWS_FIXED] = buf[HEADER..HEADER + ROWS_FIXED].try_into().unwrap();
            prop_assert_eq!(RowsHead::parse(fixed, h.len).unwrap(), head);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }

    /// The decoders take any bytes, and valid frames with a byte flipped or cut short: an
    /// error or a value, never a panic, and never a request whose ids disagree with its body.
    /// The wire's fuzz target: `make fuzz` runs it for `EMBSTORE_FUZZ_CASES` cases (3,000 in
    /// `make test`) from a fresh seed (stable Rust has no libFuzzer; the seed replays a find).
    #[test]
    fn the_decoders_take_any_bytes_without_panicking() {
        let cases = std::env::var("EMBSTORE_FUZZ_CASES").ok().and_then(|c| c.parse().ok());
        let (mut r, seed) = runner(cases.unwrap_or(3000));
        let strategy = (
            proptest::collection::vec(any::<u8>(), 0..200),
            request(),
            any::<(usize, u8, usize)>(),
        );
        r.run(&strategy, |(bytes, req, (at, flip, cut))| {
            let mut valid = encode_lookup(&req, 7);
            let i = at % valid.len();
            valid[i] ^= flip;
            valid.truncate(valid.len() - cut % 9);
            for wire in [bytes.as_slice(), valid.as_slice()] {
                if wire.len() >= HEADER {
                    let _ = parse_header(wire[..HEADER].try_into().unwrap());
                    for many in [false, true] {
                        if let Ok(r) = decode_lookup(&wire[HEADER..], many) {
                            prop_assert_eq!(lookup_len(&r), wire.len() - HEADER);
                        }
                    }
                    let _ = decode_error(&wire[HEADER..]);
                    let _ = decode_hello(&wire[HEADER..]);
                    let _ = read_blocking(&mut &wire[..], 1 << 20, None);
                }
                if wire.len() >= ROWS_FIXED {
                    let fixed: &[u8; ROWS_FIXED] = wire[..ROWS_FIXED].try_into().unwrap();
                    if let Ok(h) = RowsHead::parse(fixed, wire.len() as u32) {
                        prop_assert_eq!(h.body_len(), wire.len());
                    }
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }

    #[test]
    fn another_version_or_magic_is_named() {
        let mut h = header(Kind::Describe, 0, 1);
        h[1] = 1;
        assert_eq!(parse_header(&h), Err(FrameError::Version(1)));
        assert!(FrameError::Version(1).to_string().contains("speaks version 2"));
        assert_eq!(Error::from(FrameError::Version(1)).kind(), ErrorKind::Unsupported);
        // An HTTP/2 client on this port: its preface starts with "PRI".
        let h: [u8; HEADER] = *b"PRI * HTTP/2.0\r\n";
        assert_eq!(parse_header(&h), Err(FrameError::Magic(b'P')));
        let mut h = header(Kind::Describe, 0, 1);
        h[2] = 99;
        assert_eq!(parse_header(&h), Err(FrameError::Kind(99)));
        let mut h = header(Kind::Describe, 0, 1);
        h[3] = 2;
        assert_eq!(parse_header(&h), Err(FrameError::Kind(2)));
        // A body that fails its CRC.
        let mut f = Vec::new();
        frame_checked_into(&mut f, Kind::List, 3, b"abc");
        f[HEADER] ^= 1;
        let e = read_blocking(&mut f.as_slice(), 100, None).unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::Corruption, "a frame failed its checksum"));
    }
}
