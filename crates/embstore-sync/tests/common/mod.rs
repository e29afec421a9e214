//! Helpers shared by the sync integration tests.

use embstore_table::{RowMeta, Table};

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
