//! The framed lookup path ([`serve_fast`]): `Lookup` and `Describe` as binary frames
//! (`embstore_proto::frame`, documented in docs/serving.md) on a TCP port of their own, with
//! TLS when the serving port has it, or on a Unix socket for clients on the same host.
//!
//! It answers through the gRPC service's own steps — [`Server::target`] (size and version
//! checks), [`Server::read_into`] (the rows), [`Server::count`] (the metrics) and the same
//! token check — so both transports give the same answers, errors and counts. What it saves:
//! HTTP/2 framing, protobuf for the rows, and one copy of them: each answer is one buffer,
//! header and rows, that the table writes its rows into and the socket sends as it is.
//!
//! A connection starts with HELLO (the token); requests may be pipelined and are answered in
//! order. A frame that is not of this protocol or version, or a request too large for the
//! server's maximum batch, gets an ERROR and the connection is closed; a malformed body gets
//! an ERROR and the connection goes on.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use embstore_proto::frame::{self, Header, Kind, RowsHead, HEADER, ROWS_FIXED};
use embstore_proto::v1::LookupRequest;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::hosting::Server;
use crate::service::request_limit;
use crate::tls::{Tls, Tokens};

/// Where the framed path listens.
#[derive(Debug)]
pub enum FastListener {
    /// A TCP port (TLS when the serving port has it).
    Tcp(tokio::net::TcpListener),
    /// A Unix socket at this path (plain: the socket file's permissions guard it), removed
    /// when serving stops.
    Unix(tokio::net::UnixListener, PathBuf),
}

impl FastListener {
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

/// How long a connection has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Serves the framed lookup path of `server` on `listener` until `shutdown` resolves (then
/// stops accepting, lets each connection finish the request it is answering, and returns).
/// `tokens` and `tls` are the serving port's; TLS applies to TCP only. Clients learn the port
/// (or socket) from `ServerInfo`.
pub async fn serve_fast(
    server: Arc<Server>,
    listener: FastListener,
    tokens: Tokens,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = match (&listener, &tls) {
        (FastListener::Tcp(_), Some(t)) => {
            let config = t
                .rustls_config()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            Some(tokio_rustls::TlsAcceptor::from(config))
        }
        _ => None,
    };
    let accepted: Arc<Vec<String>> = Arc::new(tokens.for_lookups().into_iter().cloned().collect());
    match &listener {
        FastListener::Tcp(l) => server.offer_fast(Some(l.local_addr()?.port() as u32), None),
        FastListener::Unix(_, p) => server.offer_fast(None, Some(p.display().to_string())),
    }
    let (quit_tx, quit) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let io: Box<dyn Io> = tokio::select! {
            _ = &mut shutdown => break,
            accepted = accept(&listener) => match accepted {
                Ok(io) => io,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let (server, accepted, quit, acceptor) =
            (server.clone(), accepted.clone(), quit.clone(), acceptor.clone());
        conns.spawn(async move {
            match acceptor {
                None => connection(server, io, accepted, quit).await,
                Some(a) => {
                    if let Ok(Ok(io)) = tokio::time::timeout(HANDSHAKE, a.accept(io)).await {
                        connection(server, io, accepted, quit).await;
                    }
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
    let _ = quit_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
    match listener {
        FastListener::Tcp(_) => server.offer_fast(Some(0), None),
        FastListener::Unix(l, path) => {
            drop(l);
            server.offer_fast(None, Some(String::new()));
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(())
}

/// A byte stream of either listener, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn accept(listener: &FastListener) -> std::io::Result<Box<dyn Io>> {
    Ok(match listener {
        FastListener::Tcp(l) => {
            let (s, _) = l.accept().await?;
            // No Nagle: a small answer would otherwise wait for the client's delayed ACK.
            let _ = s.set_nodelay(true);
            Box::new(s)
        }
        FastListener::Unix(l, _) => Box::new(l.accept().await?.0),
    })
}

impl Server {
    /// Records where the framed path listens (`Some(0)` / `Some("")`: no longer), so that
    /// `ServerInfo` tells clients; a change raises `gen`.
    pub(crate) fn offer_fast(&self, port: Option<u32>, unix: Option<String>) {
        let mut fast = self.fast.write();
        if let Some(p) = port {
            fast.0 = p;
        }
        if let Some(u) = unix {
            fast.1 = u;
        }
        self.gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The ERROR frame of `status` answering request `id`.
fn error_frame(id: u32, status: &Status) -> Vec<u8> {
    frame::encode_error(id, status.code() as i32, status.message(), status.details())
}

/// Serves one connection until the client closes it, it breaks, or `quit` is set between
/// requests.
async fn connection<S: Io>(
    server: Arc<Server>,
    io: S,
    accepted: Arc<Vec<String>>,
    mut quit: watch::Receiver<bool>,
) {
    let (r, mut w) = tokio::io::split(io);
    let mut r = BufReader::with_capacity(64 << 10, r);
    let limit = request_limit(server.max_batch);
    let mut body = Vec::new();
    let mut buf: Vec<f32> = Vec::new();
    let mut hello = false;
    loop {
        let mut h = [0u8; HEADER];
        tokio::select! {
            read = r.read_exact(&mut h) => if read.is_err() { return },
            _ = quit.wait_for(|q| *q) => return,
        }
        let header = match frame::parse_header(&h) {
            Ok(header) => header,
            Err(e) => {
                let status = Status::unimplemented(e.to_string());
                let _ = w.write_all(&error_frame(0, &status)).await;
                return;
            }
        };
        let Header { kind, len, id } = header;
        if len as usize > limit {
            let status = server.status(
                Code::ResourceExhausted,
                format!(
                    "a request frame of {len} bytes is over this server's limit of {limit} (a \
                     lookup holds at most {} ids)",
                    server.max_batch
                ),
            );
            let _ = w.write_all(&error_frame(id, &status)).await;
            return;
        }
        body.resize(len as usize, 0);
        if r.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer = match kind {
            Kind::Hello => {
                let token = (!body.is_empty()).then_some(body.as_slice());
                let refs: Vec<&String> = accepted.iter().collect();
                match Tokens::check_token(token, &refs) {
                    Ok(()) => {
                        hello = true;
                        frame::frame(Kind::Info, id, &server.info().encode_to_vec())
                    }
                    Err(status) => {
                        let _ = w.write_all(&error_frame(id, &status)).await;
                        return;
                    }
                }
            }
            _ if !hello => {
                let status = Status::unauthenticated("the first frame must be HELLO");
                let _ = w.write_all(&error_frame(id, &status)).await;
                return;
            }
            Kind::Describe => frame::frame(Kind::Info, id, &server.info().encode_to_vec()),
            Kind::Lookup => {
                let req = match frame::decode_lookup(&body) {
                    Ok(req) => req,
                    Err(e) => {
                        let status = server.status(Code::InvalidArgument, e.to_string());
                        if w.write_all(&error_frame(id, &status)).await.is_err() {
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
                let sent = match result {
                    Ok(words) => w.write_all(embstore_proto::f32_bytes(&buf[..words])).await,
                    Err(status) => w.write_all(&error_frame(id, &status)).await,
                };
                if buf.len() > KEEP_BUFFER / 4 {
                    buf = Vec::new();
                }
                if sent.is_err() {
                    return;
                }
                continue;
            }
            Kind::Info | Kind::Rows | Kind::Error => {
                let status = Status::invalid_argument(format!("{kind:?} is not a request"));
                let _ = w.write_all(&error_frame(id, &status)).await;
                return;
            }
        };
        if w.write_all(&answer).await.is_err() {
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
        target: Result<Arc<crate::Hosted>, Status>,
        id: u32,
        buf: &mut Vec<f32>,
    ) -> Result<usize, Status> {
        let start = std::time::Instant::now();
        let result = target.and_then(|hosted| {
            let (n, dim) = (req.ids.len(), hosted.table.dim());
            let current = self.gen.load(std::sync::atomic::Ordering::Acquire);
            let info =
                if req.known_gen != current { self.info().encode_to_vec() } else { Vec::new() };
            let head = RowsHead {
                version: hosted.version,
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
