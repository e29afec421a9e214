//! The framed lookup protocol (docs/serving.md, "The framed lookup path"): the same `Lookup`
//! and `Describe` as the gRPC service, as length-prefixed binary frames on a plain TCP (or
//! TLS, or Unix socket) connection, so that a batch pays neither HTTP/2 nor protobuf for its
//! rows: the server writes rows from the table straight into the answer's buffer, and a client
//! reads them straight into its output array.
//!
//! Every frame is a 12-byte header and a body; integers are little-endian:
//!
//! ```text
//! header   magic u8 (0xEB) | version u8 (1) | kind u8 | flags u8 (0) | body length u32 | id u32
//! HELLO    1  client → server, first frame: the token (UTF-8, empty for none)
//! INFO     2  server → client: ServerInfo (protobuf), answering HELLO and DESCRIBE
//! LOOKUP   3  table length u16 | table | version u64 | known_gen u64 | shard u32
//!             | num_shards u32 | n u32 | n ids (u64)
//! ROWS     4  version u64 | dim u32 | n u32 | info length u32 | ServerInfo (protobuf, empty
//!             when the client's known_gen is current) | found (n bytes, 0 or 1)
//!             | zero bytes up to a multiple of 4 from the frame's start | n × dim float32
//! ERROR    5  code u32 (a gRPC status code) | message length u32 | message (UTF-8)
//!             | details length u32 | details (ServerInfo, protobuf, may be empty)
//! DESCRIBE 6  empty
//! ```
//!
//! A server answers every request frame with one frame of the same `id`, in the order the
//! requests came (requests may be pipelined). A frame of another magic or version gets an
//! ERROR (`UNIMPLEMENTED`, naming the versions spoken) and the connection is closed.
//!
//! This module holds the codec only (no I/O): the server is in `embstore-server`, the client
//! in `embstore-client`, and both parse with these functions, which take any bytes and never
//! panic.

use embstore_common::bytes::{Reader, Writer};

use crate::v1::LookupRequest;

/// The first byte of every frame.
pub const MAGIC: u8 = 0xEB;
/// The protocol version this codec speaks.
pub const VERSION: u8 = 1;
/// Bytes of a frame header.
pub const HEADER: usize = 12;
/// Bytes of a ROWS body before the server's info.
pub const ROWS_FIXED: usize = 20;

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
}

impl Kind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Info,
            3 => Kind::Lookup,
            4 => Kind::Rows,
            5 => Kind::Error,
            6 => Kind::Describe,
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
        }
    }
}

impl std::error::Error for FrameError {}

impl From<embstore_common::Error> for FrameError {
    fn from(e: embstore_common::Error) -> Self {
        FrameError::Malformed(e.message().to_owned())
    }
}

/// A reader of a frame's body.
fn reader(body: &[u8]) -> Reader<'_> {
    Reader::new(body, "the frame's body")
}

/// The header of a frame of `kind` with a body of `len` bytes.
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
    if h[3] != 0 {
        return Err(FrameError::Kind(h[3]));
    }
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let id = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    Ok(Header { kind, len, id })
}

/// A whole frame: header and `body`.
pub fn frame(kind: Kind, id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&header(kind, body.len(), id));
    out.extend_from_slice(body);
    out
}

/// Bytes of the LOOKUP body of `req`.
pub fn lookup_len(req: &LookupRequest) -> usize {
    2 + req.table.len() + 8 + 8 + 4 + 4 + 4 + req.ids.len() * 8
}

/// The LOOKUP frame of `req` (its table name must be under 64 KiB: longer ones are cut, and
/// then name no table).
pub fn encode_lookup(req: &LookupRequest, id: u32) -> Vec<u8> {
    let table = &req.table.as_bytes()[..req.table.len().min(u16::MAX as usize)];
    let len = lookup_len(req) - req.table.len() + table.len();
    let mut w = Writer::with_capacity(HEADER + len);
    w.raw(&header(Kind::Lookup, len, id)).u16(table.len() as u16).raw(table);
    w.u64(req.version).u64(req.known_gen).u32(req.shard).u32(req.num_shards);
    w.u32(req.ids.len() as u32);
    for &id in &req.ids {
        w.u64(id);
    }
    w.0
}

/// Parses a LOOKUP body.
pub fn decode_lookup(body: &[u8]) -> Result<LookupRequest, FrameError> {
    let mut c = reader(body);
    let table = c.str16()?;
    let version = c.u64()?;
    let known_gen = c.u64()?;
    let shard = c.u32()?;
    let num_shards = c.u32()?;
    let n = c.u32()? as usize;
    if c.left() != n.saturating_mul(8) {
        return Err(FrameError::Malformed("the id count and the body's length differ".into()));
    }
    let ids = c.rest().chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    Ok(LookupRequest { table, version, shard, num_shards, ids: ids.collect(), known_gen })
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

/// The ERROR frame of a status `code` (gRPC's numbering) with `message` and `details`.
pub fn encode_error(id: u32, code: i32, message: &str, details: &[u8]) -> Vec<u8> {
    let mut body = Writer::with_capacity(12 + message.len() + details.len());
    body.u32(code as u32).str(message).bytes(details);
    frame(Kind::Error, id, &body.0)
}

/// Parses an ERROR body: (code, message, details).
pub fn decode_error(body: &[u8]) -> Result<(i32, String, Vec<u8>), FrameError> {
    let mut c = reader(body);
    let code = c.u32()? as i32;
    let message = String::from_utf8_lossy(c.bytes()?).into_owned();
    let details = c.bytes()?.to_vec();
    c.end()?;
    Ok((code, message, details))
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
        )
            .prop_map(|(table, version, known_gen, shard, num_shards, ids)| {
                LookupRequest { table, version, shard, num_shards, ids, known_gen }
            })
    }

    /// Requests and errors go through the codec unchanged; a rows head too.
    #[test]
    fn frames_round_trip() {
        let (mut r, seed) = runner(500);
        let strategy = (request(), any::<u32>(), ".{0,40}", any::<i32>());
        r.run(&strategy, |(req, id, msg, code)| {
            let wire = encode_lookup(&req, id);
            let h = parse_header(wire[..HEADER].try_into().unwrap()).unwrap();
            prop_assert_eq!(
                (h.kind, h.id, h.len as usize),
                (Kind::Lookup, id, wire.len() - HEADER)
            );
            prop_assert_eq!(decode_lookup(&wire[HEADER..]).unwrap(), req.clone());
            let e = encode_error(id, code, &msg, &[1, 2, 3]);
            let got = decode_error(&e[HEADER..]).unwrap();
            prop_assert_eq!(got, (code, msg.clone(), vec![1, 2, 3]));
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
    #[test]
    fn the_decoders_take_any_bytes_without_panicking() {
        let (mut r, seed) = runner(3000);
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
                    if let Ok(r) = decode_lookup(&wire[HEADER..]) {
                        prop_assert_eq!(lookup_len(&r), wire.len() - HEADER);
                    }
                    let _ = decode_error(&wire[HEADER..]);
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
        h[1] = 2;
        assert_eq!(parse_header(&h), Err(FrameError::Version(2)));
        assert!(FrameError::Version(2).to_string().contains("speaks version 1"));
        // An HTTP/2 client on this port: its preface starts with "PRI".
        let h: [u8; HEADER] = *b"PRI * HTTP/2";
        assert_eq!(parse_header(&h), Err(FrameError::Magic(b'P')));
        let mut h = header(Kind::Describe, 0, 1);
        h[2] = 99;
        assert_eq!(parse_header(&h), Err(FrameError::Kind(99)));
    }
}
