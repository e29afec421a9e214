//! What guards the serving port: TLS ([`Tls`]: an identity, checked before a server starts,
//! and with a client CA, mutual TLS), the TLS listener the metrics port uses, and the bearer
//! [`Tokens`] lookups and admin calls ask for (compared in constant time).

use std::sync::Arc;

use embstore_common::ErrorKind;
use tonic::{Request, Status};

impl Tls {
    /// Whether this identity (and client CA) can serve: the certificate file holds a
    /// certificate, the key file a private key, and the key is the certificate's. Fails with
    /// `InvalidArgument` naming the cause (a certificate and key given the wrong way round, a
    /// key of another certificate), so that a server refuses to start rather than fail each
    /// handshake.
    pub fn check(&self) -> embstore_common::Result<()> {
        self.rustls_config()
            .map(drop)
            .map_err(|e| embstore_common::Error::new(ErrorKind::InvalidArgument, e))
    }

    /// This identity (and client CA) as a rustls server configuration, for other ports that
    /// take the serving TLS (the sync port); `InvalidArgument` naming the cause.
    pub fn server_config(
        &self,
    ) -> embstore_common::Result<Arc<tokio_rustls::rustls::ServerConfig>> {
        self.rustls_config().map_err(|e| embstore_common::Error::new(ErrorKind::InvalidArgument, e))
    }

    /// This identity (and client CA) as a rustls server configuration, or why not.
    pub(crate) fn rustls_config(&self) -> Result<Arc<tokio_rustls::rustls::ServerConfig>, String> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
        let holds = |pem: &[u8], what: &str| pem.windows(what.len()).any(|w| w == what.as_bytes());
        const SWAPPED: &str = "are the certificate and the key swapped?";
        let certs = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("the tls certificate", &e))?;
        if certs.is_empty() {
            return Err(if holds(&self.cert_pem, "PRIVATE KEY") {
                format!("the tls certificate file holds a private key, no certificate: {SWAPPED}")
            } else {
                "the tls certificate file holds no pem certificate".to_string()
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| {
            if holds(&self.key_pem, "CERTIFICATE") {
                format!("the tls key file holds a certificate, no private key: {SWAPPED}")
            } else {
                bad("the tls private key", &e)
            }
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", &e))?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert = cert.map_err(|e| bad("the tls client ca", &e))?;
                    roots.add(cert).map_err(|e| bad("the tls client ca", &e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .map_err(|e| bad("the tls client ca", &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                "the tls private key does not match the certificate".to_string()
            }
            e => bad("the tls certificate", &e),
        })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

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

/// Whether `a` equals `b`, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        if accepted.iter().any(|w| same(got, w.as_bytes())) {
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

/// TLS for the serving port: the server's certificate chain and key (PEM), and with
/// `client_ca`, the CA that client certificates must chain to (mutual TLS: a client without one
/// is refused during the handshake).
#[derive(Clone, Debug)]
pub struct Tls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}
