//! What guards the serving port: TLS ([`ServerTls`], from `embstore_proto::tls`: an identity,
//! checked before a server starts, and with a client CA, mutual TLS), the TLS listener the
//! metrics port uses, and the bearer [`Tokens`] lookups and admin calls ask for (compared in
//! constant time).

use std::sync::Arc;

pub use embstore_proto::tls::ServerTls;
use tonic::{Request, Status};

/// A TLS listener for axum: a task accepts TCP connections and runs each handshake in a task
/// of its own, so a slow or failing client holds up no other; finished ones queue here.
pub(crate) struct TlsListener {
    local: std::net::SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsIo, std::net::SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

type TlsIo = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

impl TlsListener {
    pub(crate) fn new(
        tcp: tokio::net::TcpListener,
        config: Arc<tokio_rustls::rustls::ServerConfig>,
    ) -> Self {
        let local = tcp.local_addr().unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((stream, addr)) = tcp.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = tls.accept(stream);
                    let timeout = std::time::Duration::from_secs(10);
                    if let Ok(Ok(io)) = tokio::time::timeout(timeout, handshake).await {
                        let _ = tx.send((io, addr)).await;
                    }
                });
            }
        });
        Self { local, ready, acceptor }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task is gone only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Tokens a server asks for, sent by clients as `authorization: Bearer <token>`. Without a
/// read token, lookups need none; without an admin token, admin calls need none (trusted
/// networks only). The admin token is also good for lookups.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    pub read: Option<String>,
    pub admin: Option<String>,
}

impl Tokens {
    /// Whether a call carrying `req`'s metadata may go on, given the tokens that allow it
    /// (none: anyone may call).
    pub(crate) fn check(req: &Request<()>, accepted: &[&String]) -> Result<(), Status> {
        if accepted.is_empty() {
            return Ok(());
        }
        let Some(got) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated(
                "this server needs a token (authorization: Bearer <token>)",
            ));
        };
        let got = got.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b"");
        Self::check_token(Some(got), accepted)
    }

    /// Whether a call presenting `got` (`None`: no token) may go on, given the tokens that
    /// allow it (none: anyone may call). Both transports check through here.
    pub(crate) fn check_token(got: Option<&[u8]>, accepted: &[&String]) -> Result<(), Status> {
        if accepted.is_empty() {
            return Ok(());
        }
        let Some(got) = got else {
            return Err(Status::unauthenticated("this server needs a token"));
        };
        if accepted.iter().any(|w| embstore_common::same_secret(got, w.as_bytes())) {
            Ok(())
        } else {
            Err(Status::permission_denied("the token does not allow this call"))
        }
    }

    /// Tokens that allow a lookup: the read token and the admin token, if a read token is set.
    pub(crate) fn for_lookups(&self) -> Vec<&String> {
        match &self.read {
            None => Vec::new(),
            Some(r) => std::iter::once(r).chain(&self.admin).collect(),
        }
    }

    /// Tokens that allow an admin call: the admin token; without one, the read token (so that
    /// a reader-protected server does not leave admin calls open).
    pub(crate) fn for_admin(&self) -> Vec<&String> {
        self.admin.as_ref().or(self.read.as_ref()).into_iter().collect()
    }
}
