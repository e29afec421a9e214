//! The framed lookup path ([`serve_framed`]): `Lookup` and `Describe` as binary frames
//! (`embstore_proto::frame`, documented in docs/serving.md) on a TCP port of their own, with
//! TLS when the serving port has it, or on a Unix socket for clients on the same host.
//!
//! It answers through the gRPC service's own steps — [`Server::target`] (size and version
//! checks), [`Server::read_into`] (the rows), [`Server::count`] (the metrics) and the same
//! token check — so both transports give the same answers, errors and counts. What it saves:
//! HTTP/2 framing, protobuf for the rows, and one copy of them: each answer is one buffer,
//! header and rows, that the table writes its rows into and the socket sends as it is.
//!
//! A connection starts with HELLO (the token), optionally after a DESCRIBE that a client uses
//! to check which server it reached before it sends its token (the answer names only the
//! server's `boot_id` and instance); requests may be pipelined and are answered in order. A
//! frame that is not of this protocol or version, or a request too large for the server's
//! maximum batch, gets an ERROR and the connection is closed; a malformed body gets an ERROR
//! and the connection goes on.
//!
//! What a connection may take is bounded ([`FramedLimits`]): a few KiB and a few seconds before
//! HELLO, a deadline for each frame once it has started and for each answer's write, and a
//! cap on connections; frame bodies are allocated as their bytes come.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use embstore_proto::frame::{self, Header, Kind, RowsHead, HEADER, ROWS_FIXED};
use embstore_proto::v1::{LookupRequest, ServerInfo};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::hosting::Server;
use crate::service::request_limit;
use crate::tls::{ServerTls, Tokens};

/// Where the framed path listens.
#[derive(Debug)]
pub enum FramedListener {
    /// A TCP port (TLS when the serving port has it).
    Tcp(tokio::net::TcpListener),
    /// A Unix socket at this path (plain: the socket file's permissions guard it), removed
    /// when serving stops.
    Unix(tokio::net::UnixListener, PathBuf),
}

impl FramedListener {
    /// Binds `addr` (`host:port`).
    pub async fn tcp(addr: &str) -> std::io::Result<Self> {
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            let socket = match a {
                std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            // Accepted connections inherit it: an answer of a few hundred KiB goes into the
            // socket in one write instead of waiting for the client to drain a small buffer.
            let _ = socket.set_send_buffer_size(SEND_BUFFER);
            match socket.bind(a).and_then(|()| socket.listen(1024)) {
                Ok(l) => return Ok(Self::Tcp(l)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{addr} names no address"),
            )
        }))
    }

    /// Binds a Unix socket at `path`. A socket file left there by a server that is gone is
    /// replaced; one a live server answers on is not (`AddrInUse`), nor any other file.
    pub fn unix(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("a server answers on {} already", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        Ok(Self::Unix(tokio::net::UnixListener::bind(&path)?, path))
    }
}

/// Answers above this many bytes get a buffer of their own, dropped after sending; smaller ones
/// reuse the connection's.
const KEEP_BUFFER: usize = 8 << 20;

/// The send buffer of framed connections (the kernel caps it at `net.core.wmem_max`).
const SEND_BUFFER: u32 = 4 << 20;

/// What the framed port lets one connection take, and how many connections it holds
/// ([`serve_framed_with`]; docs/serving.md, "Limits of the framed port"). The defaults are
/// [`serve_framed`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FramedLimits {
    /// The largest frame body (bytes) a connection may send before its HELLO is accepted: a
    /// token, or an empty DESCRIBE, takes far less. A larger announced frame is answered
    /// `RESOURCE_EXHAUSTED` and the connection closed, before any of it is read.
    pub before_hello: u32,
    /// How long a connection has, from being accepted (its TLS handshake included), to send
    /// a HELLO the server accepts; then it is closed.
    pub hello_within: Duration,
    /// Once a frame's first byte has come, how long the rest of it may take. An idle
    /// authenticated connection (a client's pool) waits for its next frame without limit.
    pub frame_within: Duration,
    /// The most connections open at once, over every framed listener of the server; one more
    /// is answered `UNAVAILABLE` (plain TCP and the Unix socket) and closed at once.
    pub max_connections: usize,
    /// How long writing one answer may take, plus [`FramedLimits::write_per_8_mib`] for each
    /// 8 MiB of it; a client that does not read its answer in that time is disconnected and
    /// the answer dropped.
    pub write_within: Duration,
    /// See [`FramedLimits::write_within`].
    pub write_per_8_mib: Duration,
}

impl Default for FramedLimits {
    fn default() -> Self {
        Self {
            before_hello: 4 << 10,
            hello_within: Duration::from_secs(10),
            frame_within: Duration::from_secs(30),
            max_connections: 4096,
            write_within: Duration::from_secs(10),
            write_per_8_mib: Duration::from_secs(1),
        }
    }
}

impl FramedLimits {
    /// How long writing an answer of `bytes` bytes may take.
    pub fn write_deadline(&self, bytes: usize) -> Duration {
        let chunks = u32::try_from(bytes.div_ceil(8 << 20)).unwrap_or(u32::MAX);
        self.write_within.saturating_add(self.write_per_8_mib.saturating_mul(chunks))
    }
}

/// Serves the framed lookup path of `server` on `listener` until `shutdown` resolves (then
/// stops accepting, lets each connection finish the request it is answering, and returns),
/// under the default [`FramedLimits`]. `tokens` and `tls` are the serving port's; TLS applies to
/// TCP only. Clients learn the port (or socket) from `ServerInfo`: the server offers it as
/// soon as this is called (the listener is bound, so connections made before the returned
/// future first runs wait in its backlog), not when the future first runs.
pub fn serve_framed(
    server: Arc<Server>,
    listener: FramedListener,
    tokens: Tokens,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()>,
) -> impl Future<Output = std::io::Result<()>> {
    serve_framed_with(server, listener, tokens, tls, FramedLimits::default(), shutdown)
}

/// [`serve_framed`] under `limits`.
pub fn serve_framed_with(
    server: Arc<Server>,
    listener: FramedListener,
    tokens: Tokens,
    tls: Option<ServerTls>,
    limits: FramedLimits,
    shutdown: impl Future<Output = ()>,
) -> impl Future<Output = std::io::Result<()>> {
    let acceptor = match (&listener, &tls) {
        (FramedListener::Tcp(_), Some(t)) => t
            .config()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
            .map(|config| Some(tokio_rustls::TlsAcceptor::from(config))),
        _ => Ok(None),
    };
    let offered = acceptor.and_then(|a| {
        match &listener {
            FramedListener::Tcp(l) => {
                server.offer_framed(Some(l.local_addr()?.port() as u32), None)
            }
            FramedListener::Unix(_, p) => server.offer_framed(None, Some(p.display().to_string())),
        }
        Ok(a)
    });
    async move {
        let acceptor = offered?;
        accept_loop(server, listener, tokens, acceptor, Arc::new(limits), shutdown).await;
        Ok(())
    }
}

async fn accept_loop(
    server: Arc<Server>,
    listener: FramedListener,
    tokens: Tokens,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    limits: Arc<FramedLimits>,
    shutdown: impl Future<Output = ()>,
) {
    let accepted: Arc<Vec<String>> = Arc::new(tokens.for_lookups().into_iter().cloned().collect());
    let (quit_tx, quit) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = accept(&listener) => match accepted {
                Ok(stream) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        let open = &server.metrics.framed_connections;
        if open.get() >= limits.max_connections as i64 {
            stream.refuse(&server, limits.max_connections, acceptor.is_some());
            continue;
        }
        open.inc();
        let guard = Open(server.clone());
        let since = tokio::time::Instant::now();
        let (server, accepted, quit, acceptor, limits) =
            (server.clone(), accepted.clone(), quit.clone(), acceptor.clone(), limits.clone());
        conns.spawn(async move {
            let _guard = guard;
            let io = stream.into_io();
            let hello_by = since + limits.hello_within;
            match acceptor {
                None => connection(server, io, accepted, quit, limits, hello_by).await,
                Some(a) => match tokio::time::timeout_at(hello_by, a.accept(io)).await {
                    Ok(Ok(io)) => connection(server, io, accepted, quit, limits, hello_by).await,
                    Ok(Err(_)) => {}
                    Err(_) => server.closed_for("hello_deadline"),
                },
            }
        });
    }
    let _ = quit_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
    match listener {
        FramedListener::Tcp(_) => server.offer_framed(Some(0), None),
        FramedListener::Unix(l, path) => {
            drop(l);
            server.offer_framed(None, Some(String::new()));
            let _ = std::fs::remove_file(path);
        }
    }
}

/// An open framed connection, counted in `embstore_framed_connections` until dropped.
struct Open(Arc<Server>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.metrics.framed_connections.dec();
    }
}

/// A byte stream of either listener, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection as accepted, before TLS.
enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Accepted {
    fn into_io(self) -> Box<dyn Io> {
        match self {
            Accepted::Tcp(s) => Box::new(s),
            Accepted::Unix(s) => Box::new(s),
        }
    }

    /// Answers a connection over the cap `UNAVAILABLE` where the socket takes the frame at
    /// once, and closes it (a TLS listener's only closes it: its client sees its handshake
    /// fail).
    fn refuse(self, server: &Server, cap: usize, tls: bool) {
        server.closed_for("over_cap");
        if tls {
            return;
        }
        let status = Status::unavailable(format!(
            "this server's framed port holds its limit of {cap} connections: retry later, or \
             take gRPC"
        ));
        let frame = error_frame(0, &status);
        let _ = match &self {
            Accepted::Tcp(s) => s.try_write(&frame),
            Accepted::Unix(s) => s.try_write(&frame),
        };
    }
}

async fn accept(listener: &FramedListener) -> std::io::Result<Accepted> {
    Ok(match listener {
        FramedListener::Tcp(l) => {
            let (s, _) = l.accept().await?;
            // No Nagle: a small answer would otherwise wait for the client's delayed ACK.
            let _ = s.set_nodelay(true);
            Accepted::Tcp(s)
        }
        FramedListener::Unix(l, _) => Accepted::Unix(l.accept().await?.0),
    })
}

impl Server {
    /// Records where the framed path listens (`Some(0)` / `Some("")`: no longer), so that
    /// `ServerInfo` tells clients; a change raises `gen`.
    pub(crate) fn offer_framed(&self, port: Option<u32>, unix: Option<String>) {
        let mut framed = self.framed.write();
        if let Some(p) = port {
            framed.0 = p;
        }
        if let Some(u) = unix {
            framed.1 = u;
        }
        self.gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Counts a framed connection closed for a limit (`embstore_framed_closed_total`).
    fn closed_for(&self, reason: &str) {
        self.metrics.framed_closed.get_or_create(&vec![("reason".into(), reason.into())]).inc();
    }

    /// Framed connections open now.
    pub fn framed_connections(&self) -> usize {
        self.metrics.framed_connections.get().max(0) as usize
    }

    /// What the framed path's DESCRIBE answers before HELLO: who this server is, and nothing
    /// of what it holds.
    fn identity(&self) -> ServerInfo {
        ServerInfo {
            instance: self.instance.clone(),
            boot_id: self.boot_id.clone(),
            ..Default::default()
        }
    }
}

/// The ERROR frame of `status` answering request `id`.
fn error_frame(id: u32, status: &Status) -> Vec<u8> {
    let body = frame::ErrorBody {
        kind: frame::kind_of(status),
        code: status.code() as i32,
        message: status.message().to_owned(),
        details: status.details().to_vec(),
    };
    frame::encode_error(id, &body)
}

/// Writes `bytes` within the deadline of an answer of their size; whether they went.
async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    limits: &FramedLimits,
    server: &Server,
) -> bool {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    match tokio::time::timeout(limits.write_deadline(bytes.len()), write).await {
        Ok(done) => done.is_ok(),
        Err(_) => {
            server.closed_for("write_deadline");
            false
        }
    }
}

/// Frame bodies above this many bytes are not kept for the connection's next frame.
const KEEP_BODY: usize = 1 << 20;

/// Serves one connection until the client closes it, it breaks, a limit closes it
/// ([`FramedLimits`]; before HELLO, everything must be done by `hello_by`), or `quit` is set
/// between requests.
async fn connection<S: Io>(
    server: Arc<Server>,
    io: S,
    accepted: Arc<Vec<String>>,
    mut quit: watch::Receiver<bool>,
    limits: Arc<FramedLimits>,
    hello_by: tokio::time::Instant,
) {
    let (r, mut w) = tokio::io::split(io);
    let mut r = BufReader::with_capacity(64 << 10, r);
    let limit = request_limit(server.max_batch);
    let mut body = Vec::new();
    let mut buf: Vec<f32> = Vec::new();
    let mut hello = false;
    loop {
        // The next frame's first byte: an authenticated connection may wait for it as long as
        // the client keeps it; one that has not said HELLO, until `hello_by`.
        let mut h = [0u8; HEADER];
        let first = r.read_exact(&mut h[..1]);
        let wait = if hello { None } else { Some(hello_by) };
        let started = tokio::select! {
            read = async {
                match wait {
                    None => Some(first.await),
                    Some(by) => tokio::time::timeout_at(by, first).await.ok(),
                }
            } => read,
            _ = quit.wait_for(|q| *q) => return,
        };
        match started {
            Some(Ok(_)) => {}
            Some(Err(_)) => return,
            None => return server.closed_for("hello_deadline"),
        }
        // The rest of the frame within its deadline.
        let by = if hello { tokio::time::Instant::now() + limits.frame_within } else { hello_by };
        let late = if hello { "frame_deadline" } else { "hello_deadline" };
        match tokio::time::timeout_at(by, r.read_exact(&mut h[1..])).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => return server.closed_for(late),
        }
        let header = match frame::parse_header(&h) {
            Ok(header) => header,
            Err(e) => {
                let status = Status::unimplemented(e.to_string());
                send(&mut w, &error_frame(0, &status), &limits, &server).await;
                return;
            }
        };
        let Header { kind, len, id, .. } = header;
        if !hello && len > limits.before_hello {
            server.closed_for("frame_too_large_before_hello");
            let status = Status::resource_exhausted(format!(
                "a frame of {len} bytes before HELLO is over the {} bytes this server reads \
                 from a connection that has not authenticated",
                limits.before_hello
            ));
            send(&mut w, &error_frame(id, &status), &limits, &server).await;
            return;
        }
        if len as usize > limit {
            let status = server.status(
                Code::ResourceExhausted,
                format!(
                    "a request frame of {len} bytes is over this server's limit of {limit} (a \
                     lookup holds at most {} ids)",
                    server.max_batch
                ),
            );
            send(&mut w, &error_frame(id, &status), &limits, &server).await;
            return;
        }
        // The body as its bytes come: a frame that announces much and sends little holds
        // little.
        if body.capacity() > KEEP_BODY {
            body = Vec::new();
        }
        body.clear();
        body.reserve((len as usize).min(64 << 10));
        let mut rest = (&mut r).take(u64::from(len));
        match tokio::time::timeout_at(by, rest.read_to_end(&mut body)).await {
            Ok(Ok(n)) if n == len as usize => {}
            Ok(_) => return,
            Err(_) => return server.closed_for(late),
        }
        if let Err(e) = header.check(&body) {
            let status = Status::invalid_argument(e.to_string());
            send(&mut w, &error_frame(id, &status), &limits, &server).await;
            return;
        }
        let answer = match kind {
            Kind::Hello => {
                let hello_body = match frame::decode_hello(&body) {
                    Ok(h) if h.service == frame::Service::Lookups => h,
                    Ok(_) => {
                        let status = Status::invalid_argument(
                            "this is a framed lookup port, not a sync port: follow the sync \
                             port the server announces",
                        );
                        send(&mut w, &error_frame(id, &status), &limits, &server).await;
                        return;
                    }
                    Err(e) => {
                        let status = Status::invalid_argument(e.to_string());
                        send(&mut w, &error_frame(id, &status), &limits, &server).await;
                        return;
                    }
                };
                let token = hello_body.token.as_bytes();
                let token = (!token.is_empty()).then_some(token);
                let refs: Vec<&String> = accepted.iter().collect();
                match Tokens::check_token(token, &refs) {
                    Ok(()) => {
                        hello = true;
                        frame::frame(Kind::Info, id, &server.info().encode_to_vec())
                    }
                    Err(status) => {
                        send(&mut w, &error_frame(id, &status), &limits, &server).await;
                        return;
                    }
                }
            }
            // Before HELLO, who this server is (a client checks it before sending its
            // token); after, what it holds too.
            Kind::Describe if !hello => {
                frame::frame(Kind::Info, id, &server.identity().encode_to_vec())
            }
            _ if !hello => {
                let status = Status::unauthenticated("the first frame must be HELLO (or DESCRIBE)");
                send(&mut w, &error_frame(id, &status), &limits, &server).await;
                return;
            }
            Kind::Describe => frame::frame(Kind::Info, id, &server.info().encode_to_vec()),
            Kind::Lookup | Kind::LookupShards => {
                let req = match frame::decode_lookup(&body, kind == Kind::LookupShards) {
                    Ok(req) => req,
                    Err(e) => {
                        let status = server.status(Code::InvalidArgument, e.to_string());
                        if !send(&mut w, &error_frame(id, &status), &limits, &server).await {
                            return;
                        }
                        continue;
                    }
                };
                let target = server.target(&req);
                let (result, back) = if Server::inline(&req, &target) {
                    let result = server.answer(&req, target, id, &mut buf);
                    (result, None)
                } else {
                    let (server, mut own) = (server.clone(), std::mem::take(&mut buf));
                    let done = tokio::task::spawn_blocking(move || {
                        let result = server.answer(&req, target, id, &mut own);
                        (result, own)
                    })
                    .await;
                    match done {
                        Ok((result, own)) => (result, Some(own)),
                        Err(e) => (Err(Status::internal(format!("lookup task failed: {e}"))), None),
                    }
                };
                if let Some(own) = back {
                    buf = own;
                }
                // A client that does not read its answer within the deadline is dropped,
                // and the answer with it.
                let sent = match result {
                    Ok(words) => {
                        let bytes = embstore_proto::f32_bytes(&buf[..words]);
                        send(&mut w, bytes, &limits, &server).await
                    }
                    Err(status) => send(&mut w, &error_frame(id, &status), &limits, &server).await,
                };
                if buf.len() > KEEP_BUFFER / 4 {
                    buf = Vec::new();
                }
                if !sent {
                    return;
                }
                continue;
            }
            Kind::Info | Kind::Rows | Kind::Error => {
                let status = Status::invalid_argument(format!("{kind:?} is not a request"));
                send(&mut w, &error_frame(id, &status), &limits, &server).await;
                return;
            }
            Kind::Welcome
            | Kind::List
            | Kind::Changed
            | Kind::Pull
            | Kind::Part
            | Kind::PullDone
            | Kind::PrioritisedPull
            | Kind::PrioritisedPart
            | Kind::Packed
            | Kind::Rollback
            | Kind::RollbackDone => {
                let status = Status::invalid_argument(format!(
                    "{kind:?} is a sync frame: this is a framed lookup port, not a sync port"
                ));
                send(&mut w, &error_frame(id, &status), &limits, &server).await;
                return;
            }
            Kind::PsRead
            | Kind::PsRows
            | Kind::PsAdd
            | Kind::PsAck
            | Kind::PsDone
            | Kind::PsApply
            | Kind::PsGather
            | Kind::PsGathered
            | Kind::PsMove => {
                let status = Status::invalid_argument(format!(
                    "{kind:?} is a parameter-server frame: this is a framed lookup port"
                ));
                send(&mut w, &error_frame(id, &status), &limits, &server).await;
                return;
            }
        };
        if !send(&mut w, &answer, &limits, &server).await {
            return;
        }
    }
}

impl Server {
    /// The ROWS frame answering `req` (for `target`, what [`Server::target`] gave), written
    /// into `buf` (grown as needed, never shrunk): header, fixed part, the server's info when
    /// the client's is stale, found flags, padding, then the rows the table writes in place.
    /// Returns the frame's length in floats; counted as a lookup either way.
    pub(crate) fn answer(
        &self,
        req: &LookupRequest,
        target: Result<crate::service::Shards, Status>,
        id: u32,
        buf: &mut Vec<f32>,
    ) -> Result<usize, Status> {
        let start = std::time::Instant::now();
        let result = target.and_then(|hosted| {
            let (n, dim) = (req.ids.len(), hosted.dim());
            let current = self.gen.load(std::sync::atomic::Ordering::Acquire);
            let info =
                if req.known_gen != current { self.info().encode_to_vec() } else { Vec::new() };
            let head = RowsHead {
                version: hosted.version(),
                dim: dim as u32,
                n: n as u32,
                info_len: info.len() as u32,
            };
            let prefix = head.prefix_len();
            let words = prefix / 4 + n * dim;
            if buf.len() < words {
                buf.resize(words, 0.0);
            }
            let (pre, rows) = buf[..words].split_at_mut(prefix / 4);
            let mut found = vec![false; n];
            self.read_into(req, &hosted, rows, &mut found)?;
            #[cfg(not(target_endian = "little"))]
            for x in rows.iter_mut() {
                *x = f32::from_bits(x.to_bits().to_le());
            }
            let pre = embstore_proto::f32_bytes_mut(pre);
            head.write(id, pre);
            let at = HEADER + ROWS_FIXED;
            pre[at..at + info.len()].copy_from_slice(&info);
            let at = at + info.len();
            for (b, f) in pre[at..at + n].iter_mut().zip(&found) {
                *b = u8::from(*f);
            }
            pre[at + n..].fill(0);
            Ok(words)
        });
        self.count(req, start, result.as_ref().err());
        result
    }
}
