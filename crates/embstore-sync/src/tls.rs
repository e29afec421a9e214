//! TLS for the sync port: the server side takes the serving TLS (`embstore_server::Tls`, and
//! with a client CA, mutual TLS); a follower trusts a CA ([`ClientTls`]) and may present a
//! certificate. [`Stream`] is a connection either way, plain or TLS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use embstore_common::{Error, ErrorKind, Result};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
pub use tokio_rustls::rustls::{ClientConfig, ServerConfig};

/// What a follower trusts, and the certificate it presents (mutual TLS), as PEM.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// The CA the source's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// A client certificate chain and its key, for sources that ask for one.
    pub cert_pem: Option<Vec<u8>>,
    pub key_pem: Option<Vec<u8>>,
    /// The name the source's certificate carries (default: the host of its address).
    pub domain: Option<String>,
}

fn invalid(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("{what}: {e}"))
}

impl ClientTls {
    /// The rustls client configuration; `InvalidArgument` naming what is wrong.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            roots
                .add(cert.map_err(|e| invalid("the sync tls ca", e))?)
                .map_err(|e| invalid("the sync tls ca", e))?;
        }
        if roots.is_empty() {
            return Err(invalid("the sync tls ca", "the file holds no pem certificate"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("tls", e))?
            .with_root_certificates(roots);
        let config = match (&self.cert_pem, &self.key_pem) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| invalid("the sync tls certificate", e))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| invalid("the sync tls key", e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid("the sync tls certificate", e))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(invalid("sync tls", "a client certificate needs its key, and back")),
        };
        Ok(Arc::new(config))
    }
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
