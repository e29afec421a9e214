//! One connection to a source's sync port ([`Conn`]): the HELLO/WELCOME exchange and framed
//! sends and receives, with TLS failures named as trust errors; and a table's pulls over it
//! ([`TableLink`]), the TCP implementation of `embstore_replication`'s [`Link`], which the
//! protocol's round ([`embstore_replication::round`]) runs over, as the simulator's does.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::frame::HEADER;
use embstore_proto::tls::ClientTls;
use embstore_replication::{Link, ListAsk, Vv};
use embstore_table::sync::{Changes, PartReply};

use super::FollowOptions;
use crate::tls::Stream;
use crate::wire::{self, Kind};

/// An io error of a send: a failed TLS handshake (rustls reports it as invalid data) means
/// the source is not trusted, or does not trust this follower.
pub(super) fn untrusted(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::new(
            ErrorKind::PermissionDenied,
            format!("{what}: the TLS handshake with the sync source failed: {e}"),
        ),
        _ => Error::io(what, e),
    }
}

/// One connection to a source's sync port.
pub(super) struct Conn {
    pub(super) r: BufReader<Stream>,
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    /// The frames of a PACKED frame not read yet (protocol 6), in order.
    pending: std::collections::VecDeque<(Kind, Vec<u8>)>,
}

impl Conn {
    pub(super) fn send(&mut self, kind: Kind, body: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(HEADER + body.len());
        wire::write_frame(&mut frame, kind, body)?;
        let w = self.r.get_mut();
        w.write_all(&frame).and_then(|_| w.flush()).map_err(untrusted("sync send"))?;
        self.bytes_out += frame.len() as u64;
        Ok(())
    }

    /// The next frame (those of a PACKED frame one by one); an `Error` frame becomes the
    /// error it carries.
    pub(super) fn recv(&mut self) -> Result<(Kind, Vec<u8>)> {
        if let Some(f) = self.pending.pop_front() {
            return Ok(f);
        }
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
        if k == Kind::Packed {
            self.pending = wire::unpack(&b)?.into();
            return Ok(self.pending.pop_front().expect("a packed frame holds one"));
        }
        Ok((k, b))
    }

    pub(super) fn expect(&mut self, want: Kind) -> Result<Vec<u8>> {
        let (k, b) = self.recv()?;
        if k != want {
            return Err(Error::corrupt(format!("expected a {want:?} frame, got {k:?}")));
        }
        Ok(b)
    }
}

pub(super) fn connect(
    source: &str,
    options: &FollowOptions,
    tables: &[String],
) -> Result<(Conn, u32, Vec<wire::TableInfo>)> {
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
    let mut link = Conn { r, bytes_in: 0, bytes_out: 0, pending: Default::default() };
    let hello = wire::Hello {
        protocol: options.protocol(),
        token: options.token.clone(),
        with_state: options.with_state,
        tables: tables.to_vec(),
        precision: options.precision(),
    };
    link.send(Kind::Hello, &hello.encode())?;
    let (replica, infos) = wire::decode_welcome(&link.expect(Kind::Welcome)?)?;
    Ok((link, replica, infos))
}

/// A table's pulls over a connection: a `List` frame answered by `Changed` and the `Part`s
/// that come with it up to `PullDone`; a `Pull` frame answered by its `Part`s up to
/// `PullDone`. The responder answers frames in order, so exchanges end in the order they
/// were opened.
pub(super) struct TableLink<'a> {
    pub(super) conn: &'a mut Conn,
    pub(super) table: &'a str,
    /// The table's embedding and optimizer-state widths, to decode rows.
    pub(super) dim: usize,
    pub(super) state_dim: usize,
    /// The source's clock in its last change list, and when that list arrived here.
    pub(super) their_now: &'a std::cell::Cell<Option<(u64, std::time::Instant)>>,
}

impl Link for TableLink<'_> {
    type Reply = PartReply;

    fn list(&mut self, ask: &ListAsk) -> Result<Changes> {
        let list = wire::List {
            table: self.table.to_owned(),
            epoch: ask.epoch,
            cursor: ask.cursor,
            wait_ms: ask.wait_ms,
        };
        self.conn.send(Kind::List, &list.encode())?;
        let (changes, their_now) = wire::decode_changed(&self.conn.expect(Kind::Changed)?)?;
        self.their_now.set(Some((their_now, std::time::Instant::now())));
        Ok(changes)
    }

    fn pull(&mut self, parts: &[(u32, Vv)]) -> Result<()> {
        self.conn.send(Kind::Pull, &wire::encode_pull(self.table, parts))
    }

    fn next(&mut self) -> Result<Option<PartReply>> {
        let (kind, body) = self.conn.recv()?;
        match kind {
            Kind::PullDone => Ok(None),
            Kind::Part => Ok(Some(wire::decode_part(&body, self.dim, self.state_dim)?)),
            k => Err(Error::corrupt(format!("unexpected sync frame {k:?} in a pull"))),
        }
    }
}
