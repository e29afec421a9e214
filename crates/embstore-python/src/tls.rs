//! TLS settings from PEM files, for the serving port, its clients and the sync port.

use embstore_common::{Error, ErrorKind};
use pyo3::prelude::*;

use crate::to_py_err;

/// The serving port's TLS from PEM files (both a certificate and its key, a client CA only
/// with them), checked: a certificate and key that cannot serve (swapped, of two pairs) stop
/// the server here, before it says it serves, rather than at every handshake.
pub(crate) fn serving_tls(
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
    client_ca: Option<std::path::PathBuf>,
) -> PyResult<Option<embstore_server::ServerTls>> {
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => embstore_server::ServerTls {
            cert_pem: read_pem(&cert)?,
            key_pem: read_pem(&key)?,
            client_ca_pem: client_ca.as_deref().map(read_pem).transpose()?,
        },
        (None, None) if client_ca.is_none() => return Ok(None),
        _ => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "TLS needs both a certificate and its key (a client CA only with them)",
            )))
        }
    };
    tls.check().map_err(to_py_err)?;
    Ok(Some(tls))
}

/// TLS to a sync source: the CA to trust, a client certificate and key (mutual TLS), the name
/// the source's certificate carries. `None` without a CA.
pub(crate) fn sync_client_tls(
    ca: Option<std::path::PathBuf>,
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
    domain: Option<String>,
) -> PyResult<Option<embstore_sync::ClientTls>> {
    let Some(ca) = ca else {
        if cert.is_some() || key.is_some() || domain.is_some() {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "sync TLS needs the CA to trust (tls_ca) before a certificate, key or domain",
            )));
        }
        return Ok(None);
    };
    let tls = client_tls(Some((ca, cert, key, domain)))?;
    if let Some(t) = &tls {
        t.config().map_err(to_py_err)?; // refused here, before any connection
    }
    Ok(tls)
}

/// `(ca, cert, key, domain)`: a CA file, an optional client certificate and key (mutual TLS)
/// and an optional name to check the servers' certificates against.
pub(crate) type TlsPaths =
    (std::path::PathBuf, Option<std::path::PathBuf>, Option<std::path::PathBuf>, Option<String>);

pub(crate) fn read_pem(path: &std::path::Path) -> PyResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        to_py_err(Error::new(
            ErrorKind::InvalidArgument,
            format!("cannot read {}: {e}", path.display()),
        ))
    })
}

pub(crate) fn client_tls(tls: Option<TlsPaths>) -> PyResult<Option<embstore_client::ClientTls>> {
    let Some((ca, cert, key, domain)) = tls else { return Ok(None) };
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((read_pem(&c)?, read_pem(&k)?)),
        (None, None) => None,
        _ => {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "a client certificate needs its key, and a key its certificate",
            )))
        }
    };
    Ok(Some(embstore_client::ClientTls { ca_pem: read_pem(&ca)?, domain, identity }))
}
