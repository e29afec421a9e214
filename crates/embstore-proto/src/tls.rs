//! TLS for every embstore port, from PEM: one shape for what a server presents
//! ([`ServerTls`]: its certificate chain and key, and with a client CA, mutual TLS) and one for
//! what a client trusts ([`ClientTls`]: a CA, the name to check, and an identity for mutual
//! TLS), each turned into a rustls configuration here and nowhere else. The serving port
//! (gRPC, framed), the metrics port and the sync port take these; no public API takes a built
//! rustls configuration.
//!
//! Every problem with the PEM is an `InvalidArgument` error naming the file's role and the
//! cause (a file that holds no certificate, a certificate and key given the wrong way round, a
//! key of another certificate), found when the configuration is built, before a port opens.

use std::sync::Arc;

use embstore_common::{Error, Result};
pub use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn invalid(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("{what}: {e}"))
}

/// Whether `pem` holds a block whose label contains `label`.
fn holds(pem: &[u8], label: &str) -> bool {
    pem.windows(label.len()).any(|w| w == label.as_bytes())
}

const SWAPPED: &str = "are the certificate and the key swapped?";

/// The certificates of `pem` (the file's `role` names it in errors); at least one.
fn certificates(pem: &[u8], role: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| invalid(role, e))?;
    if certs.is_empty() {
        return Err(if holds(pem, "PRIVATE KEY") {
            invalid(role, format!("the file holds a private key, no certificate: {SWAPPED}"))
        } else {
            invalid(role, "the file holds no pem certificate")
        });
    }
    Ok(certs)
}

/// The private key of `pem`.
fn private_key(pem: &[u8], role: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        if holds(pem, "CERTIFICATE") {
            invalid(role, format!("the file holds a certificate, no private key: {SWAPPED}"))
        } else {
            invalid(role, e)
        }
    })
}

/// The roots of `pem` (a CA file: at least one certificate).
fn roots(pem: &[u8], role: &str) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(pem, role)? {
        roots.add(cert).map_err(|e| invalid(role, e))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a server presents: its certificate chain and key (PEM), and with `client_ca_pem`, the
/// CA that client certificates must chain to (mutual TLS: a client without one is refused
/// during the handshake).
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl ServerTls {
    /// Whether this identity (and client CA) can serve: the certificate file holds a
    /// certificate, the key file a private key, and the key is the certificate's; an
    /// `InvalidArgument` error naming the cause otherwise, so that a server refuses to start
    /// rather than fail each handshake.
    pub fn check(&self) -> Result<()> {
        self.config().map(drop)
    }

    /// The rustls server configuration (no ALPN: a port that negotiates one sets it).
    pub fn config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let certs = certificates(&self.cert_pem, "the tls certificate")?;
        let key = private_key(&self.key_pem, "the tls private key")?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("tls", e))?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = roots(ca, "the tls client ca")?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider(),
                )
                .build()
                .map_err(|e| invalid("the tls client ca", e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                Error::invalid("the tls private key does not match the certificate")
            }
            e => invalid("the tls certificate", e),
        })?;
        Ok(Arc::new(config))
    }
}

/// What a client trusts: the CA the servers' certificates chain to, the name to check them
/// against (default: the host of the address dialled), and a client certificate and key
/// (PEM) for servers that ask for one (mutual TLS).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub ca_pem: Vec<u8>,
    pub domain: Option<String>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTls {
    /// The rustls client configuration.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let roots = roots(&self.ca_pem, "the tls ca")?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("tls", e))?
            .with_root_certificates(roots);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates(cert, "the tls client certificate")?;
                let key = private_key(key, "the tls client key")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid("the tls client certificate", e))?
            }
        };
        Ok(Arc::new(config))
    }

    /// The name a server's certificate must carry when dialled at `host`.
    pub fn name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.domain.as_deref().unwrap_or(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embstore_common::ErrorKind;

    const NOT_PEM: &[u8] = b"hello";
    const A_KEY: &[u8] = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_on_both_sides() {
        let e = ClientTls { ca_pem: NOT_PEM.to_vec(), ..Default::default() }.config().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.message(), "the tls ca: the file holds no pem certificate");
        let e = ClientTls { ca_pem: A_KEY.to_vec(), ..Default::default() }.config().unwrap_err();
        assert!(e.message().contains("swapped"), "{e}");
        let server = ServerTls {
            cert_pem: A_KEY.to_vec(),
            key_pem: NOT_PEM.to_vec(),
            client_ca_pem: Some(NOT_PEM.to_vec()),
        };
        let e = server.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().starts_with("the tls certificate: the file holds a private key"),
            "{e}"
        );
    }

    #[test]
    fn the_name_checked_is_the_domain_else_the_host() {
        let mut t = ClientTls::default();
        assert_eq!(t.name_for("10.0.0.1"), "10.0.0.1");
        t.domain = Some("store.example".into());
        assert_eq!(t.name_for("10.0.0.1"), "store.example");
    }
}
