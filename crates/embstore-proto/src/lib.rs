//! embstore's gRPC wire contract, generated from `proto/embstore/v1/*.proto` at build time (see
//! `docs/serving.md` for the protocol those messages carry).
//!
//! - [`v1`] — messages ([`v1::LookupRequest`], [`v1::LookupResponse`], [`v1::ServerInfo`], …)
//!   and the `Serving` service: [`v1::serving_server`] for servers, [`v1::serving_client`] for
//!   clients.
//!
//! - [`frame`] — the framed lookup path's codec; [`tls`] — TLS from PEM for every port
//!   ([`tls::ServerTls`], [`tls::ClientTls`]).
//!
//! Generated code, plus what every party needs to agree on beside the messages: the two
//! helpers that read a response's row bytes the same way ([`encode_rows`], [`decode_rows`]), and
//! the sharding contract [`shard_of_key`] (re-exported from `embstore-common`), which decides
//! the serving shard a client sends each id to.

/// The serving shard of an id: client and server must place ids exactly alike.
pub use embstore_common::shard_of_key;

pub mod frame;
pub mod tls;

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

/// The bytes of `rows` as they are in memory (native order: on a little-endian machine,
/// exactly the wire format of both transports, float32 little-endian).
pub fn f32_bytes(rows: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; the byte slice covers exactly the floats' memory (len × 4
    // bytes) and borrows it; u8 needs no alignment.
    unsafe { std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), std::mem::size_of_val(rows)) }
}

/// The bytes of `rows` as they are in memory, writable (see [`f32_bytes`]).
pub fn f32_bytes_mut(rows: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `f32_bytes`, borrowed mutably; every byte pattern is a valid f32, so writes
    // through the view leave `rows` valid.
    unsafe {
        std::slice::from_raw_parts_mut(rows.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(rows))
    }
}

/// Rows as a [`v1::LookupResponse`] carries them: float32, little-endian, row-major (one
/// copy on little-endian machines).
pub fn encode_rows(rows: &[f32]) -> Vec<u8> {
    #[cfg(target_endian = "little")]
    {
        f32_bytes(rows).to_vec()
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut out = Vec::with_capacity(rows.len() * 4);
        for x in rows {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }
}

/// Copies one row from its wire bytes (`dst.len() × 4` of them, float32 little-endian) into
/// `dst`. Panics if the lengths differ (callers check the frame's size first, as
/// [`decode_rows`] does).
pub fn copy_row(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 4, "a row's bytes and floats differ in length");
    #[cfg(target_endian = "little")]
    {
        let bytes = f32_bytes_mut(dst);
        bytes.copy_from_slice(src);
    }
    #[cfg(not(target_endian = "little"))]
    for (x, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// The floats of [`v1::LookupResponse::values`]; `None` if the byte count is not `rows × dim`
/// float32s (a truncated or foreign frame).
pub fn decode_rows(bytes: &[u8], rows: usize, dim: usize) -> Option<Vec<f32>> {
    let want = rows.checked_mul(dim)?.checked_mul(4)?;
    if bytes.len() != want {
        return None;
    }
    let mut out = vec![0f32; rows * dim];
    copy_row(bytes, &mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::v1::{Held, LookupRequest, LookupResponse, ServerInfo, State};
    use super::*;
    use prost::Message;

    #[test]
    fn rows_cross_the_wire_as_little_endian_float32_bit_for_bit() {
        let rows: Vec<f32> = (0..1000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .chain([0.0, -0.0, f32::INFINITY, f32::MIN_POSITIVE])
            .collect();
        let bytes = encode_rows(&rows);
        let slow: Vec<u8> = rows.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(bytes, slow);
        let back = decode_rows(&bytes, 251, 4).unwrap();
        assert!(back.iter().zip(&rows).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(decode_rows(&bytes[1..], 251, 4).is_none(), "a truncated frame was accepted");
        let mut row = [0f32; 4];
        copy_row(&bytes[16..32], &mut row);
        assert!(row.iter().zip(&rows[4..8]).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn a_lookup_round_trips_through_its_wire_bytes() {
        let req = LookupRequest {
            table: "user".into(),
            version: 42,
            shard: 1,
            num_shards: 4,
            ids: vec![0, 7, u64::MAX],
            known_gen: 3,
            more_shards: vec![3],
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
            framed_port: 7001,
            framed_unix: String::new(),
            boot_id: "0123abcd".into(),
            spans_shards: true,
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
