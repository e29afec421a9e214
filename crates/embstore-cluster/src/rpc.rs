//! Calls to embstore servers over gRPC, shared by the data plane (the client's lookups) and
//! the control plane (a roll's admin calls): a lazy [`channel`] (TLS when asked), a
//! [`request`] carrying the bearer token, [`from_status`] (the one mapping from gRPC statuses
//! to table errors) and [`tls_cause`], which says why a connect failed when the cause is TLS.

use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use tonic::transport::Channel;
use tonic::Code;

/// TLS towards the servers (PEM: a CA, the name to check, an identity for mutual TLS).
pub use embstore_proto::tls::ClientTls;

/// A channel to `addr` (lazy: it connects on first use).
pub fn channel(addr: &str, timeout: Duration, tls: Option<&ClientTls>) -> Result<Channel> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::new(ErrorKind::InvalidArgument, format!("bad address '{addr}': {e}"))
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let uri = if addr.contains("://") { addr.to_string() } else { format!("{scheme}://{addr}") };
    let mut ep = Channel::from_shared(uri).map_err(|e| bad(&e))?.connect_timeout(timeout);
    if let Some(t) = tls {
        t.config()?; // the PEM checked as every port checks it, with the same errors
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&t.ca_pem));
        if let Some(d) = &t.domain {
            config = config.domain_name(d.clone());
        }
        if let Some((cert, key)) = &t.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        ep = ep.tls_config(config).map_err(|e| bad(&e))?;
    }
    Ok(ep.connect_lazy())
}

/// The table error for a gRPC status (the one mapping of this boundary; the server's
/// `to_status` is its inverse where one exists).
pub fn from_status(status: &tonic::Status) -> Error {
    if let Some(kind) = embstore_proto::frame::kind_of(status) {
        return Error::new(kind, status.message());
    }
    let kind = match status.code() {
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::NotFound => ErrorKind::TableNotFound,
        Code::AlreadyExists => ErrorKind::TableExists,
        // OUT_OF_RANGE: a message over a limit of the transport (a request too large).
        Code::ResourceExhausted | Code::OutOfRange => ErrorKind::Capacity,
        Code::DataLoss => ErrorKind::Corruption,
        Code::Unimplemented => ErrorKind::Unsupported,
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::PermissionDenied,
        _ => ErrorKind::Unavailable,
    };
    Error::new(kind, status.message())
}

/// Why a call to `addr` failed at the transport, when the cause is TLS: the TLS error of the
/// handshake (`tls`: the client speaks TLS), or, for a plaintext client, whether the server
/// answers a plaintext greeting with a TLS alert. `None`: not a TLS matter.
pub async fn tls_cause(addr: &str, status: &tonic::Status, tls: bool) -> Option<String> {
    // The whole chain, to search; the innermost error, to say.
    let (mut chain, mut last) = (status.message().to_string(), status.message().to_string());
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        last = e.to_string();
        chain.push_str(&format!(": {last}"));
        source = e.source();
    }
    let has = |what: &str| chain.to_ascii_lowercase().contains(&what.to_ascii_lowercase());
    if !tls {
        return speaks_tls(addr).await.then(|| {
            "the server speaks tls: give the ca its certificate chains to (tls_ca, --tls-ca)"
                .to_string()
        });
    }
    let cause = if has("UnknownIssuer") || has("BadSignature") || has("unknown ca") {
        "unknown ca: the server's certificate does not chain to the ca given (tls_ca, --tls-ca)"
    } else if has("NotValidForName") {
        "the server's certificate is not valid for this name (tls_domain, --tls-domain)"
    } else if has("CertificateRequired") || has("BadCertificate") || has("UnknownCA") {
        "the server refused the client certificate, or needs one (tls_cert, --tls-cert)"
    } else if has("Expired") {
        "the server's certificate has expired or is not valid yet"
    } else if has("InvalidContentType") || has("corrupt message") {
        "the server does not speak tls (leave out tls_ca, --tls-ca)"
    } else if has("invalid peer certificate") || has("alert") || has("handshake") {
        return Some(format!("tls handshake failed: {last}"));
    } else {
        return None;
    };
    Some(format!("tls handshake failed: {cause}"))
}

/// Whether the server at `addr` answers an HTTP/2 greeting with a TLS record (an alert, as a
/// TLS server answers bytes that are not a handshake), within a second.
async fn speaks_tls(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(host).await.ok()?;
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.ok()?;
        let mut head = [0u8; 3];
        conn.read_exact(&mut head).await.ok()?;
        // A TLS record: content type 21 (alert) or 22 (handshake), version 3.x.
        Some(matches!(head, [21 | 22, 3, 0..=4]))
    };
    matches!(tokio::time::timeout(Duration::from_secs(1), probe).await, Ok(Some(true)))
}

/// `msg` as a request, with `authorization: Bearer <token>` when there is a token.
pub fn request<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(t) = token {
        if let Ok(v) = format!("Bearer {}", t.trim()).parse() {
            req.metadata_mut().insert("authorization", v);
        }
    }
    req
}
