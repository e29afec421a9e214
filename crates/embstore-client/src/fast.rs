//! The client side of the framed lookup path (`embstore_proto::frame`, docs/serving.md): per
//! server, a pool of connections to the port (or Unix socket) its `ServerInfo` offers; a lookup
//! takes an idle connection (or opens one, sending HELLO with the token), writes one LOOKUP
//! frame and reads the ROWS answer straight into a float buffer.
//!
//! Answers come back as the gRPC call's would — a [`tonic::Status`] on error, with the
//! server's info in its details — so that the lookup logic above treats both transports alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_proto::frame::{self, Kind, RowsHead, HEADER, ROWS_FIXED};
use embstore_proto::v1::{LookupRequest, ServerInfo};
use parking_lot::Mutex;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_rustls::rustls;
use tonic::{Code, Status};

use crate::ClientTls;

/// Which transport a client's lookups take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// The framed path where a server offers it (its `ServerInfo` names a port or, for a
    /// server on this host, a Unix socket), gRPC elsewhere and while the framed port does not
    /// accept connections.
    #[default]
    Auto,
    /// gRPC only.
    Grpc,
    /// The framed path only: a server that does not offer it is not read from.
    Fast,
}

impl std::str::FromStr for Transport {
    type Err = embstore_common::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Transport::Auto),
            "grpc" => Ok(Transport::Grpc),
            "fast" => Ok(Transport::Fast),
            _ => Err(embstore_common::Error::new(
                embstore_common::ErrorKind::InvalidArgument,
                format!("transport must be 'auto', 'grpc' or 'fast', got '{s}'"),
            )),
        }
    }
}

/// Where a server's framed path is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Tcp { addr: String, host: String },
    Unix(PathBuf),
}

/// After a failed connect, how long lookups of that server take gRPC before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The longest a connect to a framed port may take (within the call's deadline): a port a
/// firewall drops costs the first lookup this much, then gRPC for [`RETRY_AFTER`].
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Idle connections kept per server.
const KEEP_IDLE: usize = 64;

/// One server's framed path: where it is, and the idle connections to it.
#[derive(Default)]
pub(crate) struct FastPath {
    target: Mutex<Option<Target>>,
    idle: Mutex<Vec<Conn>>,
    off_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for FastPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastPath").field("target", &*self.target.lock()).finish()
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

struct Conn {
    io: BufReader<Box<dyn Io>>,
    next_id: u32,
}

/// A shard's rows as the framed path answers them.
#[derive(Debug)]
pub(crate) struct FastRows {
    pub version: u64,
    pub dim: usize,
    pub values: Vec<f32>,
    pub found: Vec<u8>,
    pub info: Option<ServerInfo>,
}

/// Why a framed call failed.
#[derive(Debug)]
pub(crate) enum FastError {
    /// No connection could be opened: the caller may take gRPC instead.
    Connect(Status),
    /// The server answered with an error, or the connection broke mid-call.
    Call(Status),
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `host` of `host:port` (brackets of an IPv6 literal kept).
fn host_of(addr: &str) -> &str {
    let a = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

impl FastPath {
    /// Learns where the server at `addr` offers the framed path from its `info`: its Unix
    /// socket when the server is on this host (a loopback address) and the socket exists, else
    /// its port on the address's host.
    pub(crate) fn learn(&self, addr: &str, info: &ServerInfo) {
        let host = host_of(addr);
        let unix = (!info.fast_unix.is_empty()
            && is_loopback(host)
            && std::path::Path::new(&info.fast_unix).exists())
        .then(|| Target::Unix(PathBuf::from(&info.fast_unix)));
        let target = unix.or_else(|| {
            (info.fast_port != 0).then(|| Target::Tcp {
                addr: format!("{host}:{}", info.fast_port),
                host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            })
        });
        let mut t = self.target.lock();
        if *t != target {
            *t = target;
            self.idle.lock().clear();
        }
    }

    /// Whether a lookup should take this path now (`transport` allowing).
    pub(crate) fn usable(&self, transport: Transport) -> bool {
        match transport {
            Transport::Grpc => false,
            Transport::Fast => true,
            Transport::Auto => {
                self.target.lock().is_some()
                    && self.off_until.lock().is_none_or(|t| Instant::now() >= t)
            }
        }
    }

    /// One lookup: `req` on an idle connection or a new one; the connection goes back to the
    /// pool after a complete answer (rows or an error frame).
    pub(crate) async fn lookup(
        &self,
        req: &LookupRequest,
        token: Option<&str>,
        tls: Option<&Tls>,
        timeout: Duration,
    ) -> Result<FastRows, FastError> {
        // A pooled connection the server closed meanwhile (it restarted, or dropped idle
        // connections) fails at once: the lookup then takes a fresh one.
        let pooled = self.idle.lock().pop();
        if let Some(mut conn) = pooled {
            if let Ok(answer) = conn.lookup(req).await {
                self.keep(conn);
                return answer.map_err(FastError::Call);
            }
        }
        let mut conn = {
            let target = self.target.lock().clone().ok_or_else(|| {
                FastError::Connect(Status::unavailable("this server offers no framed lookup path"))
            })?;
            let limit = timeout.min(CONNECT_TIMEOUT);
            match tokio::time::timeout(limit, open(&target, token, tls)).await {
                Ok(Ok(c)) => c,
                Ok(Err(s)) if s.code() == Code::Unavailable => {
                    *self.off_until.lock() = Some(Instant::now() + RETRY_AFTER);
                    return Err(FastError::Connect(s));
                }
                Ok(Err(s)) => return Err(FastError::Call(s)),
                Err(_) => {
                    *self.off_until.lock() = Some(Instant::now() + RETRY_AFTER);
                    return Err(FastError::Connect(Status::unavailable(
                        "connecting to the framed lookup port timed out",
                    )));
                }
            }
        };
        match conn.lookup(req).await {
            Ok(answer) => {
                self.keep(conn);
                answer.map_err(FastError::Call)
            }
            Err(broken) => Err(FastError::Call(broken)),
        }
    }

    /// How lookups reach this server over the framed path: over TCP or a Unix socket.
    pub(crate) fn describe(&self) -> &'static str {
        match &*self.target.lock() {
            Some(Target::Unix(_)) => "fast-unix",
            _ => "fast",
        }
    }

    fn keep(&self, conn: Conn) {
        let mut idle = self.idle.lock();
        if idle.len() < KEEP_IDLE {
            idle.push(conn);
        }
    }
}

/// A client TLS configuration for the framed path, built once per client.
#[derive(Clone)]
pub(crate) struct Tls {
    config: Arc<rustls::ClientConfig>,
    domain: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("domain", &self.domain).finish()
    }
}

impl Tls {
    /// The rustls configuration of `t` (its CA, and its identity for mutual TLS).
    pub(crate) fn new(t: &ClientTls) -> embstore_common::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            embstore_common::Error::new(
                embstore_common::ErrorKind::InvalidArgument,
                format!("{what}: {e}"),
            )
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&t.ca_pem) {
            let cert = cert.map_err(|e| bad("the tls ca", &e))?;
            roots.add(cert).map_err(|e| bad("the tls ca", &e))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", &e))?
            .with_root_certificates(roots);
        let config = match &t.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("the tls client certificate", &e))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| bad("the tls client key", &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("the tls client certificate", &e))?
            }
        };
        Ok(Self { config: Arc::new(config), domain: t.domain.clone() })
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// Opens a connection to `target` and says HELLO with `token`.
async fn open(target: &Target, token: Option<&str>, tls: Option<&Tls>) -> Result<Conn, Status> {
    let io: Box<dyn Io> = match target {
        Target::Unix(path) => Box::new(
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| unavailable(&format!("connecting to {}", path.display()), e))?,
        ),
        Target::Tcp { addr, host } => {
            let tcp = tokio::net::TcpStream::connect(addr.as_str())
                .await
                .map_err(|e| unavailable(&format!("connecting to {addr}"), e))?;
            let _ = tcp.set_nodelay(true);
            match tls {
                None => Box::new(tcp),
                Some(t) => {
                    let name = t.domain.clone().unwrap_or_else(|| host.clone());
                    let name = rustls::pki_types::ServerName::try_from(name)
                        .map_err(|e| Status::invalid_argument(format!("tls name: {e}")))?;
                    let connector = tokio_rustls::TlsConnector::from(t.config.clone());
                    // A handshake the server refuses is no reason to fall back to plaintext
                    // gRPC: it fails the call (UNAUTHENTICATED names the cause).
                    Box::new(connector.connect(name, tcp).await.map_err(|e| {
                        Status::unauthenticated(format!("tls handshake with {addr}: {e}"))
                    })?)
                }
            }
        }
    };
    let mut conn = Conn { io: BufReader::with_capacity(64 << 10, io), next_id: 1 };
    let hello = frame::frame(Kind::Hello, 0, token.unwrap_or("").trim().as_bytes());
    conn.send(&hello).await?;
    let (header, body) = conn.read_frame(1 << 24).await?;
    match header.kind {
        Kind::Info => Ok(conn),
        Kind::Error => Err(error_status(&body)),
        k => Err(Status::internal(format!("the server answered HELLO with {k:?}"))),
    }
}

/// The status an ERROR body carries.
fn error_status(body: &[u8]) -> Status {
    match frame::decode_error(body) {
        Ok((code, message, details)) => {
            Status::with_details(Code::from_i32(code), message, details.into())
        }
        Err(e) => Status::internal(format!("a malformed error frame: {e}")),
    }
}

impl Conn {
    async fn send(&mut self, bytes: &[u8]) -> Result<(), Status> {
        let io = self.io.get_mut();
        io.write_all(bytes).await.map_err(|e| unavailable("sending", e))?;
        io.flush().await.map_err(|e| unavailable("sending", e))
    }

    async fn header(&mut self) -> Result<frame::Header, Status> {
        let mut h = [0u8; HEADER];
        self.io.read_exact(&mut h).await.map_err(|e| unavailable("reading an answer", e))?;
        frame::parse_header(&h).map_err(|e| Status::internal(e.to_string()))
    }

    async fn read_frame(&mut self, limit: u32) -> Result<(frame::Header, Vec<u8>), Status> {
        let h = self.header().await?;
        if h.len > limit {
            return Err(Status::internal(format!("an answer of {} bytes", h.len)));
        }
        let mut body = vec![0u8; h.len as usize];
        self.io.read_exact(&mut body).await.map_err(|e| unavailable("reading an answer", e))?;
        Ok((h, body))
    }

    /// Sends `req` and reads its answer. The outer error: the connection is unusable; the
    /// inner one: the server's answer was an error (the connection stays good).
    async fn lookup(&mut self, req: &LookupRequest) -> Result<Result<FastRows, Status>, Status> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.send(&frame::encode_lookup(req, id)).await?;
        let h = self.header().await?;
        if h.id != id {
            return Err(Status::internal(format!("answer {} to request {id}", h.id)));
        }
        let read = |e| unavailable("reading an answer", e);
        match h.kind {
            Kind::Rows => {}
            Kind::Error => {
                let mut body = vec![0u8; h.len as usize];
                self.io.read_exact(&mut body).await.map_err(read)?;
                return Ok(Err(error_status(&body)));
            }
            k => return Err(Status::internal(format!("the server answered LOOKUP with {k:?}"))),
        }
        let mut fixed = [0u8; ROWS_FIXED];
        self.io.read_exact(&mut fixed).await.map_err(read)?;
        let head = RowsHead::parse(&fixed, h.len).map_err(|e| Status::internal(e.to_string()))?;
        if head.n as usize != req.ids.len() {
            return Err(Status::internal(format!(
                "an answer of {} rows to {} ids",
                head.n,
                req.ids.len()
            )));
        }
        let mut info = vec![0u8; head.info_len as usize];
        self.io.read_exact(&mut info).await.map_err(read)?;
        let mut found = vec![0u8; head.n as usize];
        self.io.read_exact(&mut found).await.map_err(read)?;
        let pad = head.prefix_len() - HEADER - ROWS_FIXED - info.len() - found.len();
        self.io.read_exact(&mut [0u8; 3][..pad]).await.map_err(read)?;
        let dim = head.dim as usize;
        let mut values = vec![0f32; head.n as usize * dim];
        // The rows go from the socket straight into the floats (little-endian on the wire).
        self.io.read_exact(embstore_proto::f32_bytes_mut(&mut values)).await.map_err(read)?;
        #[cfg(not(target_endian = "little"))]
        for x in values.iter_mut() {
            *x = f32::from_bits(u32::from_le(x.to_bits()));
        }
        let info = if info.is_empty() {
            None
        } else {
            Some(
                ServerInfo::decode(info.as_slice())
                    .map_err(|e| Status::internal(format!("a malformed server info: {e}")))?,
            )
        };
        Ok(Ok(FastRows { version: head.version, dim, values, found, info }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_loopback() {
        assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7000"), "[::1]");
        assert_eq!(host_of("http://a.b:1"), "a.b");
        assert!(is_loopback("[::1]") && is_loopback("localhost") && is_loopback("127.0.0.2"));
        assert!(!is_loopback("10.0.0.1") && !is_loopback("a.b"));
        let p = FastPath::default();
        let info = ServerInfo { fast_port: 7001, ..Default::default() };
        p.learn("10.0.0.1:7000", &info);
        assert!(p.usable(Transport::Auto) && !p.usable(Transport::Grpc));
        assert_eq!(
            *p.target.lock(),
            Some(Target::Tcp { addr: "10.0.0.1:7001".into(), host: "10.0.0.1".into() })
        );
        // A socket on another host is never dialled; no port: no framed path.
        let info = ServerInfo { fast_unix: "/".into(), ..Default::default() };
        p.learn("10.0.0.1:7000", &info);
        assert!(!p.usable(Transport::Auto));
        p.learn("127.0.0.1:7000", &info);
        assert_eq!(*p.target.lock(), Some(Target::Unix("/".into())));
    }
}
