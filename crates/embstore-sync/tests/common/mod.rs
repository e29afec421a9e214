//! Helpers shared by the sync integration tests.

use std::time::Duration;

use embstore_sync::FollowOptions;
use embstore_table::{RowMeta, Table};

/// Runs `f` on a thread of its own and fails (leaving that thread behind) if it has not
/// finished within `secs`: a deadlock is a failure, not a hung suite.
#[allow(dead_code)]
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("did not finish within {secs} s (a deadlock?)"))
}

/// Follow options for tests: token "t0k", a short long-poll and retry.
#[allow(dead_code)]
pub fn follow() -> FollowOptions {
    FollowOptions { token: "t0k".into(), wait_ms: 200, retry_ms: 50, ..FollowOptions::default() }
}

/// `n` ids spread over the key space from `offset`.
#[allow(dead_code)]
pub fn ids(n: u64, offset: u64) -> Vec<u64> {
    (0..n).map(|i| offset + i * 7919).collect()
}

#[allow(dead_code)]
/// Every row of `t` (key, values, metadata), in key order.
pub fn rows(t: &Table) -> Vec<(u64, Vec<f32>, RowMeta)> {
    let d = t.dim();
    let mut out: Vec<_> = t
        .export(1 << 20)
        .flat_map(|c| {
            (0..c.len())
                .map(|i| (c.ids[i], c.values[i * d..][..d].to_vec(), c.meta[i]))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by_key(|r| r.0);
    out
}

/// A CA, a server certificate for localhost and a client certificate, as PEM.
#[allow(dead_code)]
pub fn pki() -> (String, (String, String), (String, String)) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec![name.to_string()]).unwrap();
        (params.signed_by(&key, &issuer).unwrap().pem(), key.serialize_pem())
    };
    (ca.pem(), leaf("localhost"), leaf("client"))
}
