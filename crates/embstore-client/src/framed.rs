//! The client side of the framed lookup path (`embstore_proto::frame`, docs/serving.md): per
//! server, a pool of connections to the port (or Unix socket) its `ServerInfo` offers; a lookup
//! takes an idle connection (or opens one: DESCRIBE, to check that the endpoint is the server
//! that offered it, then HELLO with the token), writes one LOOKUP frame and reads the ROWS
//! answer straight into a float buffer.
//!
//! Answers come back as the gRPC call's would — a [`tonic::Status`] on error, with the
//! server's info in its details — so that the lookup logic above treats both transports alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_proto::frame::{self, Kind, RowsHead, Service, HEADER, ROWS_FIXED};
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
    /// server on this host and a client without TLS, a Unix socket) and the endpoint proves
    /// to be that server (its DESCRIBE names the `boot_id` the gRPC port named); gRPC
    /// elsewhere, and while the framed port does not accept connections.
    #[default]
    Auto,
    /// gRPC only.
    Grpc,
    /// The framed path only: a server that does not offer it is not read from.
    Framed,
}

impl std::str::FromStr for Transport {
    type Err = embstore_common::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Transport::Auto),
            "grpc" => Ok(Transport::Grpc),
            // "fast": the framed path's old name, still taken (Python warns that it is deprecated).
            "framed" | "fast" => Ok(Transport::Framed),
            _ => Err(embstore_common::Error::new(
                embstore_common::ErrorKind::InvalidArgument,
                format!("transport must be 'auto', 'grpc' or 'framed', got '{s}'"),
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

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp { addr, .. } => write!(f, "the framed port {addr}"),
            Target::Unix(path) => write!(f, "the framed Unix socket {}", path.display()),
        }
    }
}

/// A framed endpoint a server's `ServerInfo` offers, and the `boot_id` that info named: the
/// endpoint is read from only when it names the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Offer {
    target: Target,
    boot_id: String,
}

/// After a failed connect, how long lookups of that server take gRPC before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The longest a connect to a framed port may take (within the call's deadline): a port a
/// firewall drops costs the first lookup this much, then gRPC for [`RETRY_AFTER`]. Only the
/// connect itself: a port that accepted is waited for (see [`answer_within`]).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a framed endpoint that accepted a connection has to finish its TLS handshake and
/// answer DESCRIBE and HELLO, within a call of deadline `deadline`: half of it (at least
/// [`CONNECT_TIMEOUT`]), so that a busy server is waited for, and a port that accepts but
/// never answers still leaves the call time for gRPC.
fn answer_within(deadline: Duration) -> Duration {
    (deadline / 2).max(CONNECT_TIMEOUT)
}

/// Idle connections kept per server.
const KEEP_IDLE: usize = 64;

/// One server's framed path: where it is, and the idle connections to it.
#[derive(Default)]
pub(crate) struct FramedPath {
    offer: Mutex<Option<Offer>>,
    /// An offer whose endpoint answered as another server (or did not say which): `Auto`
    /// takes gRPC until the server offers another endpoint or restarts.
    foreign: Mutex<Option<Offer>>,
    idle: Mutex<Vec<Conn>>,
    off_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for FramedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramedPath").field("offer", &*self.offer.lock()).finish()
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
pub(crate) struct FramedRows {
    pub version: u64,
    pub dim: usize,
    pub values: Vec<f32>,
    pub found: Vec<u8>,
    pub info: Option<ServerInfo>,
}

/// Why a framed call failed.
#[derive(Debug)]
pub(crate) enum FramedError {
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

impl FramedPath {
    /// Learns where the server at `addr` offers the framed path from its `info`: its Unix
    /// socket when the server is on this host (a loopback address), the socket exists and the
    /// client does not talk TLS (`tls`: the socket is plaintext, and TLS asked for is never
    /// dropped), else its port on the address's host. A server that names no `boot_id` (its
    /// framed endpoint cannot be checked to be its own) offers none.
    pub(crate) fn learn(&self, addr: &str, info: &ServerInfo, tls: bool) {
        let host = host_of(addr);
        let unix = (!tls
            && !info.framed_unix.is_empty()
            && is_loopback(host)
            && std::path::Path::new(&info.framed_unix).exists())
        .then(|| Target::Unix(PathBuf::from(&info.framed_unix)));
        let target = unix.or_else(|| {
            (info.framed_port != 0).then(|| Target::Tcp {
                addr: format!("{host}:{}", info.framed_port),
                host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            })
        });
        let offer = target
            .filter(|_| !info.boot_id.is_empty())
            .map(|target| Offer { target, boot_id: info.boot_id.clone() });
        let mut current = self.offer.lock();
        if *current != offer {
            *current = offer;
            self.idle.lock().clear();
        }
    }

    /// Whether a lookup should take this path now (`transport` allowing).
    pub(crate) fn usable(&self, transport: Transport) -> bool {
        match transport {
            Transport::Grpc => false,
            Transport::Framed => true,
            Transport::Auto => {
                let offer = self.offer.lock().clone();
                offer.is_some()
                    && *self.foreign.lock() != offer
                    && self.off_until.lock().is_none_or(|t| Instant::now() >= t)
            }
        }
    }

    /// Lookups take gRPC for [`RETRY_AFTER`].
    fn pause(&self) {
        *self.off_until.lock() = Some(Instant::now() + RETRY_AFTER);
    }

    /// One lookup: `req` on an idle connection or a new one; the connection goes back to the
    /// pool after a complete answer (rows or an error frame).
    pub(crate) async fn lookup(
        &self,
        req: &LookupRequest,
        token: Option<&str>,
        tls: Option<&Tls>,
        timeout: Duration,
    ) -> Result<FramedRows, FramedError> {
        // A pooled connection the server closed meanwhile (it restarted, or dropped idle
        // connections) fails at once: the lookup then takes a fresh one.
        let pooled = self.idle.lock().pop();
        if let Some(mut conn) = pooled {
            if let Ok(answer) = conn.lookup(req).await {
                self.keep(conn);
                return answer.map_err(FramedError::Call);
            }
        }
        let offer = self.offer.lock().clone().ok_or_else(|| {
            FramedError::Connect(Status::unavailable(
                "this server offers no framed lookup path this client can check and use",
            ))
        })?;
        let io = match tokio::time::timeout(timeout.min(CONNECT_TIMEOUT), connect(&offer.target))
            .await
        {
            Ok(Ok(io)) => io,
            Ok(Err(s)) => {
                self.pause();
                return Err(FramedError::Connect(s));
            }
            Err(_) => {
                self.pause();
                return Err(FramedError::Connect(Status::unavailable(format!(
                    "connecting to {} timed out",
                    offer.target
                ))));
            }
        };
        // The port accepted: a server slow to answer (loaded, or still starting) is waited
        // for rather than left for gRPC.
        let within = answer_within(timeout);
        let mut conn = match tokio::time::timeout(within, open(io, &offer, token, tls)).await {
            Ok(Ok(c)) => c,
            Ok(Err(Opened::Foreign(s))) => {
                *self.foreign.lock() = Some(offer);
                return Err(FramedError::Connect(s));
            }
            Ok(Err(Opened::Failed(s))) if s.code() == Code::Unavailable => {
                self.pause();
                return Err(FramedError::Connect(s));
            }
            Ok(Err(Opened::Failed(s))) => return Err(FramedError::Call(s)),
            Err(_) => {
                self.pause();
                return Err(FramedError::Connect(Status::unavailable(format!(
                    "{} accepted a connection but did not answer within {within:?}",
                    offer.target
                ))));
            }
        };
        match conn.lookup(req).await {
            Ok(answer) => {
                self.keep(conn);
                answer.map_err(FramedError::Call)
            }
            Err(broken) => Err(FramedError::Call(broken)),
        }
    }

    /// How lookups reach this server over the framed path: over TCP or a Unix socket.
    pub(crate) fn describe(&self) -> &'static str {
        match self.offer.lock().as_ref().map(|o| &o.target) {
            Some(Target::Unix(_)) => "framed-unix",
            _ => "framed",
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
        Ok(Self { config: t.config()?, domain: t.domain.clone() })
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// Why a connection could not be opened.
enum Opened {
    /// The endpoint is another server's, or does not say whose: never read from.
    Foreign(Status),
    /// Anything else (`UNAVAILABLE`: the caller may take gRPC).
    Failed(Status),
}

impl From<Status> for Opened {
    fn from(s: Status) -> Self {
        Opened::Failed(s)
    }
}

/// Connects to `target` (the socket only: no byte is exchanged).
async fn connect(target: &Target) -> Result<Box<dyn Io>, Status> {
    Ok(match target {
        Target::Unix(path) => Box::new(
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| unavailable(&format!("connecting to {target}"), e))?,
        ),
        Target::Tcp { addr, .. } => {
            let tcp = tokio::net::TcpStream::connect(addr.as_str())
                .await
                .map_err(|e| unavailable(&format!("connecting to {target}"), e))?;
            let _ = tcp.set_nodelay(true);
            Box::new(tcp)
        }
    })
}

/// Opens a connection on `io` (connected to `offer`'s endpoint): TLS over TCP when the client
/// talks TLS; DESCRIBE, to check the endpoint is the server that offered it (its `boot_id`)
/// before the token goes to it; then HELLO with `token`.
async fn open(
    io: Box<dyn Io>,
    offer: &Offer,
    token: Option<&str>,
    tls: Option<&Tls>,
) -> Result<Conn, Opened> {
    let io: Box<dyn Io> =
        match (&offer.target, tls) {
            (Target::Tcp { addr, host }, Some(t)) => {
                let name = t.domain.clone().unwrap_or_else(|| host.clone());
                let name = rustls::pki_types::ServerName::try_from(name)
                    .map_err(|e| Status::invalid_argument(format!("tls name: {e}")))?;
                let connector = tokio_rustls::TlsConnector::from(t.config.clone());
                // A handshake the server refuses is no reason to fall back to plaintext gRPC: it
                // fails the call (UNAUTHENTICATED names the cause).
                Box::new(connector.connect(name, io).await.map_err(|e| {
                    Status::unauthenticated(format!("tls handshake with {addr}: {e}"))
                })?)
            }
            // The Unix socket is plaintext: `learn` never picks it for a client that talks TLS.
            _ => io,
        };
    let mut conn = Conn { io: BufReader::with_capacity(64 << 10, io), next_id: 1 };
    let whose = |info: &ServerInfo| -> Result<(), Opened> {
        if info.boot_id == offer.boot_id {
            return Ok(());
        }
        let instance = match info.instance.as_str() {
            "" => String::new(),
            i => format!(" (instance '{i}')"),
        };
        Err(Opened::Foreign(Status::unavailable(format!(
            "{} answers as another server{instance} than the one whose ServerInfo offered it \
             (a tunnel, a port mapping or a reused socket path): not read from; lookups to this \
             server take gRPC",
            offer.target
        ))))
    };
    conn.send(&frame::frame(Kind::Describe, 0, &[])).await?;
    let (header, body) = conn.read_frame(1 << 20).await?;
    match header.kind {
        Kind::Info => whose(&info_of(&body)?)?,
        Kind::Error => {
            let status = error_status(&body);
            if status.code() == Code::Unavailable {
                return Err(Opened::Failed(status));
            }
            return Err(Opened::Foreign(Status::unavailable(format!(
                "{} does not say which server it is (it answered DESCRIBE: {}): not read from; \
                 lookups to this server take gRPC",
                offer.target,
                status.message()
            ))));
        }
        k => {
            return Err(Opened::Failed(Status::internal(format!(
                "the server answered DESCRIBE with {k:?}"
            ))))
        }
    }
    let token = token.unwrap_or("").trim();
    let hello = frame::frame(Kind::Hello, 0, &frame::encode_hello(token, Service::Lookups, &[]));
    conn.send(&hello).await?;
    let (header, body) = conn.read_frame(1 << 24).await?;
    match header.kind {
        Kind::Info => {
            whose(&info_of(&body)?)?;
            Ok(conn)
        }
        Kind::Error => Err(Opened::Failed(error_status(&body))),
        k => Err(Opened::Failed(Status::internal(format!("the server answered HELLO with {k:?}")))),
    }
}

/// The `ServerInfo` an INFO body carries.
fn info_of(body: &[u8]) -> Result<ServerInfo, Status> {
    ServerInfo::decode(body).map_err(|e| Status::internal(format!("a malformed server info: {e}")))
}

/// The status an ERROR body carries.
fn error_status(body: &[u8]) -> Status {
    match frame::decode_error(body) {
        Ok(e) => {
            let status = Status::with_details(Code::from_i32(e.code), e.message, e.details.into());
            match e.kind {
                Some(kind) => frame::with_kind(status, kind),
                None => status,
            }
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
        h.check(&body).map_err(|e| Status::internal(e.to_string()))?;
        Ok((h, body))
    }

    /// Sends `req` and reads its answer. The outer error: the connection is unusable; the
    /// inner one: the server's answer was an error (the connection stays good).
    async fn lookup(&mut self, req: &LookupRequest) -> Result<Result<FramedRows, Status>, Status> {
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
        Ok(Ok(FramedRows { version: head.version, dim, values, found, info }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind survives the framed path's ERROR frame into the client's error, and an
    /// ERROR without a kind falls back to the status code's.
    #[test]
    fn every_kind_survives_an_error_frame() {
        for kind in embstore_common::ErrorKind::ALL.into_iter().map(Some).chain([None]) {
            let code = kind.map_or(Code::NotFound, frame::status_code);
            let body =
                frame::ErrorBody { kind, code: code as i32, message: "m".into(), details: vec![] };
            let e = crate::from_status(&error_status(&frame::encode_error_body(&body)));
            let want = kind.unwrap_or(embstore_common::ErrorKind::TableNotFound);
            assert_eq!((e.kind(), e.message()), (want, "m"), "{kind:?}");
        }
    }

    #[test]
    fn hosts_and_loopback() {
        assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7000"), "[::1]");
        assert_eq!(host_of("http://a.b:1"), "a.b");
        assert!(is_loopback("[::1]") && is_loopback("localhost") && is_loopback("127.0.0.2"));
        assert!(!is_loopback("10.0.0.1") && !is_loopback("a.b"));
        let p = FramedPath::default();
        let target = |p: &FramedPath| p.offer.lock().clone().map(|o| o.target);
        let info = ServerInfo { framed_port: 7001, boot_id: "b".into(), ..Default::default() };
        p.learn("10.0.0.1:7000", &info, false);
        assert!(p.usable(Transport::Auto) && !p.usable(Transport::Grpc));
        assert_eq!(
            target(&p),
            Some(Target::Tcp { addr: "10.0.0.1:7001".into(), host: "10.0.0.1".into() })
        );
        // A server that names no boot id offers nothing a client can check.
        p.learn("10.0.0.1:7000", &ServerInfo { framed_port: 7001, ..Default::default() }, false);
        assert!(!p.usable(Transport::Auto));
        // A socket on another host is never dialled; no port: no framed path.
        let info =
            ServerInfo { framed_unix: "/".into(), boot_id: "b".into(), ..Default::default() };
        p.learn("10.0.0.1:7000", &info, false);
        assert!(!p.usable(Transport::Auto));
        p.learn("127.0.0.1:7000", &info, false);
        assert_eq!(target(&p), Some(Target::Unix("/".into())));
        // A client that talks TLS never takes the (plaintext) socket: the TLS port instead.
        p.learn("127.0.0.1:7000", &info, true);
        assert!(!p.usable(Transport::Auto));
        let info = ServerInfo { framed_port: 7001, ..info };
        p.learn("127.0.0.1:7000", &info, true);
        assert!(matches!(target(&p), Some(Target::Tcp { .. })));
    }
}
