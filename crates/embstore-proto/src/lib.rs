//! embstore's gRPC wire contract, generated from `proto/embstore/v1/*.proto` at build time (see
//! `docs/serving.md` for the protocol those messages carry).
//!
//! - [`v1`] — messages ([`v1::LookupRequest`], [`v1::LookupResponse`], [`v1::ServerInfo`], …)
//!   and the `Serving` service: [`v1::serving_server`] for servers, [`v1::serving_client`] for
//!   clients.
//!
//! Generated code only, plus the two helpers every party needs to read a response's row bytes
//! the same way: [`encode_rows`] and [`decode_rows`].

/// Version 1 of the contract (package `embstore.v1`).
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod v1 {
    tonic::include_proto!("embstore.v1");
}

/// The part of etcd's v3 API that cluster coordination uses (package `etcdserverpb`; see
/// `proto/etcd/rpc.proto`): `KV` (range, put, delete, transactions) and `Lease`.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

/// Rows as a [`v1::LookupResponse`] carries them: float32, little-endian, row-major.
pub fn encode_rows(rows: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 4);
    for x in rows {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The floats of [`v1::LookupResponse::values`]; `None` if the byte count is not `rows × dim`
/// float32s (a truncated or foreign frame).
pub fn decode_rows(bytes: &[u8], rows: usize, dim: usize) -> Option<Vec<f32>> {
    let want = rows.checked_mul(dim)?.checked_mul(4)?;
    if bytes.len() != want {
        return None;
    }
    let mut out = Vec::with_capacity(rows * dim);
    out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::v1::{Held, LookupRequest, LookupResponse, ServerInfo, State};
    use super::*;
    use prost::Message;

    #[test]
    fn a_lookup_round_trips_through_its_wire_bytes() {
        let req = LookupRequest {
            table: "user".into(),
            version: 42,
            shard: 1,
            num_shards: 4,
            ids: vec![0, 7, u64::MAX],
            known_gen: 3,
        };
        let back = LookupRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, req);

        let rows = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.25, 1e30, -7.0];
        let info = ServerInfo {
            instance: "a:7000".into(),
            gen: 3,
            held: vec![Held {
                table: "user".into(),
                version: 42,
                shard: 1,
                num_shards: 4,
                state: State::Draining as i32,
                embedding_dim: 2,
                rows: 10,
                last_request_ms: 1_700_000_000_000,
            }],
        };
        let resp = LookupResponse {
            info: Some(info),
            version: 42,
            embedding_dim: 2,
            values: encode_rows(&rows),
            found: vec![1, 0, 1],
        };
        let back = LookupResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, resp);
        assert_eq!(back.info.unwrap().held[0].state(), State::Draining);
        let got = decode_rows(&back.values, 3, 2).unwrap();
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), rows.map(f32::to_bits));
    }

    #[test]
    fn rows_of_the_wrong_size_and_garbage_frames_are_refused() {
        let bytes = encode_rows(&[1.0, 2.0, 3.0]);
        assert!(decode_rows(&bytes, 2, 2).is_none());
        assert!(decode_rows(&bytes[..11], 3, 1).is_none());
        assert!(decode_rows(&bytes, usize::MAX, 2).is_none());
        assert_eq!(decode_rows(&bytes, 3, 1).unwrap(), [1.0, 2.0, 3.0]);
        // A truncated frame is a decode error, never a panic.
        let req = LookupRequest { table: "t".into(), ids: vec![1, 2, 3], ..Default::default() };
        let wire = req.encode_to_vec();
        for cut in 1..wire.len() {
            let _ = LookupRequest::decode(&wire[..cut]);
        }
        assert!(LookupRequest::decode(&[0xff, 0xff, 0xff][..]).is_err());
    }
}
