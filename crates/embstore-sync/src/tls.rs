//! TLS for the sync port: the server side takes the serving TLS (`embstore_proto::tls::ServerTls`, and
//! with a client CA, mutual TLS); a follower trusts a CA ([`ClientTls`]) and may present a
//! certificate. [`Stream`] is a connection either way, plain or TLS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use embstore_common::{Error, Result};
use embstore_proto::tls::rustls;
use embstore_proto::tls::rustls::pki_types::ServerName;

fn invalid(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("{what}: {e}"))
}

/// A connection of the sync port, plain or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Server(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
    Client(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    /// The server side of `tcp`, with TLS when `config` is given (the handshake runs on the
    /// first read).
    pub(crate) fn server(
        tcp: TcpStream,
        config: Option<&Arc<rustls::ServerConfig>>,
    ) -> Result<Self> {
        Ok(match config {
            None => Stream::Plain(tcp),
            Some(c) => {
                let conn =
                    rustls::ServerConnection::new(c.clone()).map_err(|e| invalid("tls", e))?;
                Stream::Server(Box::new(rustls::StreamOwned::new(conn, tcp)))
            }
        })
    }

    /// The client side of `tcp` to `host`, with TLS when `config` is given.
    pub(crate) fn client(
        tcp: TcpStream,
        config: Option<(&Arc<rustls::ClientConfig>, &str)>,
    ) -> Result<Self> {
        Ok(match config {
            None => Stream::Plain(tcp),
            Some((c, host)) => {
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|e| invalid(&format!("sync tls name '{host}'"), e))?;
                let conn = rustls::ClientConnection::new(c.clone(), name)
                    .map_err(|e| invalid("tls", e))?;
                Stream::Client(Box::new(rustls::StreamOwned::new(conn, tcp)))
            }
        })
    }
}

impl Stream {
    /// Writes all of `buf` (through TLS, and the TLS records it makes) by `deadline`, or fails
    /// with `TimedOut`: each system call gets the time left, so a reader that takes a few bytes
    /// now and then cannot stretch it.
    pub(crate) fn write_all_by(&mut self, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => plain_write_by(s, buf, deadline),
            Stream::Server(s) => tls_write_by(&mut s.conn, &mut s.sock, buf, deadline),
            Stream::Client(s) => tls_write_by(&mut s.conn, &mut s.sock, buf, deadline),
        }
    }
}

/// Sets `sock`'s write timeout to the time left before `deadline` (`TimedOut` when none is).
fn time_left(sock: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    sock.set_write_timeout(Some(left))
}

fn plain_write_by(s: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !buf.is_empty() {
        time_left(s, deadline)?;
        match s.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn tls_write_by<D>(
    conn: &mut rustls::ConnectionCommon<D>,
    sock: &mut TcpStream,
    mut buf: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    loop {
        while conn.wants_write() {
            time_left(sock, deadline)?;
            match conn.write_tls(sock) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if buf.is_empty() {
            return Ok(());
        }
        // rustls takes what its buffer limit allows; the records it made go out above.
        let n = conn.writer().write(buf)?;
        if n == 0 && !conn.wants_write() {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Server(s) => s.read(buf),
            Stream::Client(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Server(s) => s.write(buf),
            Stream::Client(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Server(s) => s.flush(),
            Stream::Client(s) => s.flush(),
        }
    }
}
