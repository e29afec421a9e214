//! The sync port and the follower over loopback TCP: a follower that joins empty holds the
//! primary's rows and then follows its writes; a wrong token, garbage, a truncated frame and a
//! reply with a version a day ahead are typed errors that change nothing, and the follower
//! keeps serving and recovers.
mod common;
use common::{pki, rows};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use embstore_common::ErrorKind;
use embstore_sync::wire::{self, Kind};
use embstore_sync::{FollowOptions, Follower, ServeOptions, SyncServer};
use embstore_table::sync::{PartReply, SyncOptions};
use embstore_table::{Optimizer, RowMeta, Store, Table, TableConfig, Version};

const D: usize = 8;

fn primary() -> (Arc<Store>, Arc<Table>, SyncServer) {
    let store = Arc::new(Store::with_replica(1).unwrap());
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    let t = store.create_table(TableConfig::new("items", D).with_optimizer(opt)).unwrap();
    let options = ServeOptions {
        token: Some("s3cret".into()),
        sync: SyncOptions { parts: 64, ..SyncOptions::default() },
        tls: None,
    };
    let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
    (store, t, server)
}

/// Protocol 5 (every frame on its own, uncompressed), for the tests that count bytes to tell
/// what was pulled.
fn plain() -> FollowOptions {
    FollowOptions { protocol: Some(wire::PACKED_PROTOCOL - 1), ..follow_options() }
}

fn follow_options() -> FollowOptions {
    FollowOptions { token: "s3cret".into(), wait_ms: 200, retry_ms: 50, ..FollowOptions::default() }
}

#[test]
fn a_follower_joins_empty_then_follows_writes() {
    let (_p, t, server) = primary();
    let ids: Vec<u64> = (0..5000).collect();
    t.apply_gradients(&ids, &vec![0.5; ids.len() * D], None).unwrap();
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let f = Follower::start(replica.clone(), &server.addr().to_string(), follow_options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    let r = replica.table("items").unwrap();
    assert_eq!(rows(&r), rows(&t));
    // Writes while it follows: a few rows, then a removal.
    for step in 0..20u64 {
        let ids = [step * 7 % 5000, 9000 + step];
        t.apply_gradients(&ids, &[0.25; 2 * D], None).unwrap();
    }
    t.remove(&[3]).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&r), rows(&t));
    let s = &f.status()[0];
    assert!(s.connected && s.caught_up && s.errors == 0, "{s:?}");
    assert!(s.rows_applied >= 5000 + 21, "{s:?}");
    assert!(s.parts_from_cache > 0, "incremental pulls hit the cache: {s:?}");
    // The rows (all 0.5) came zstd-compressed (protocol 6): far fewer bytes than 4 × D each.
    assert!(s.lag_ms_p50.is_some() && s.bytes_in > 5000 * 2, "{s:?}");
    assert!(s.bytes_in < 5000 * (D as u64) * 4, "{s:?}");
    assert!(server.stats().pulls > 0);
    f.stop();
    server.stop();
}

#[test]
fn a_wrong_token_or_an_unknown_table_is_refused() {
    let (_p, _t, server) = primary();
    let addr = server.addr().to_string();
    let store = Arc::new(Store::with_replica(2).unwrap());
    let bad = FollowOptions { token: "guess".into(), ..follow_options() };
    let e = Follower::start(store.clone(), &addr, bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("wrong replication token"), "{e}");
    let same = Arc::new(Store::with_replica(1).unwrap());
    let e = Follower::start(same, &addr, follow_options()).unwrap_err();
    assert!(e.to_string().contains("same replica id 1"), "{e}");
    let unknown = FollowOptions { tables: vec!["nope".into()], ..follow_options() };
    let e = Follower::start(store.clone(), &addr, unknown).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TableNotFound, "{e}");
    assert!(store.tables().is_empty(), "nothing was created");
    assert_eq!(server.stats().refused, 1);
}

#[test]
fn garbage_and_truncated_frames_are_refused_and_the_port_keeps_serving() {
    let (_p, t, server) = primary();
    t.assign(&[1, 2], &[1.0; 2 * D]).unwrap();
    // Garbage: an Error frame back, then the connection closes.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(&[3, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
    let (k, body) = wire::read_frame(&mut s).unwrap();
    assert_eq!(k, Kind::Error);
    let e = wire::decode_error(&body).unwrap();
    assert_eq!(e.kind(), ErrorKind::Corruption, "{e}");
    // A frame cut short, then EOF: the server drops it without answering.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    let hello = wire::Hello {
        protocol: wire::PROTOCOL,
        token: "s3cret".into(),
        with_state: false,
        tables: vec![],
        precision: wire::Precision::F32,
    };
    let mut framed = Vec::new();
    wire::write_frame(&mut framed, Kind::Hello, &hello.encode()).unwrap();
    s.write_all(&framed[..framed.len() - 3]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read_to_end(&mut rest);
    // A checksum mismatch is refused too.
    assert!(wire::read_frame(&mut &framed[..]).is_ok());
    let mut flipped = framed.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let e = wire::read_frame(&mut &flipped[..]).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    // Still serving.
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let f = Follower::start(replica.clone(), &server.addr().to_string(), follow_options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)));
    assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
}

/// The frames of one answer on a raw connection, up to PULL_DONE: (kind on the wire, its
/// body), PACKED frames as they came.
fn answer(s: &mut TcpStream) -> Vec<(Kind, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let (k, b) = wire::read_frame(s).unwrap();
        let done = k == Kind::PullDone
            || k == Kind::Packed && wire::unpack(&b).unwrap().last().unwrap().0 == Kind::PullDone;
        out.push((k, b));
        if done {
            return out;
        }
    }
}

/// A raw connection to `server` that said Hello in `protocol`.
fn raw_hello(server: &SyncServer, protocol: u16) -> TcpStream {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = wire::Hello {
        protocol,
        token: "s3cret".into(),
        with_state: false,
        tables: vec![],
        precision: wire::Precision::F32,
    };
    wire::write_frame(&mut s, Kind::Hello, &hello.encode()).unwrap();
    assert_eq!(wire::read_frame(&mut s).unwrap().0, Kind::Welcome);
    s
}

/// A follower of protocol 5 gets every frame on its own, uncompressed, as before; one of
/// protocol 6 gets the same answer as one zstd-compressed PACKED frame, smaller, that reads
/// back to the same parts.
#[test]
fn an_old_protocol_follower_is_served_uncompressed() {
    let (_p, t, server) = primary();
    let ids: Vec<u64> = (0..3000).collect();
    let values: Vec<f32> = (0..ids.len() * D).map(|i| (i as f32 * 0.37).sin()).collect();
    t.assign(&ids, &values).unwrap();
    let parts: Vec<_> = (0..64).map(|p| (p, embstore_replication::Vv::default())).collect();
    let pull = wire::encode_pull("items", &parts);
    let mut got = Vec::new();
    for protocol in [wire::PACKED_PROTOCOL - 1, wire::PROTOCOL] {
        let mut s = raw_hello(&server, protocol);
        wire::write_frame(&mut s, Kind::Pull, &pull).unwrap();
        let frames = answer(&mut s);
        let wire_bytes: usize = frames.iter().map(|(_, b)| 16 + b.len()).sum();
        let inner: Vec<(Kind, Vec<u8>)> = if protocol < wire::PACKED_PROTOCOL {
            assert!(frames.iter().all(|(k, _)| matches!(k, Kind::Part | Kind::PullDone)));
            frames
        } else {
            assert_eq!(frames.len(), 1, "one packed frame");
            assert_eq!((frames[0].0, frames[0].1[0]), (Kind::Packed, 1), "zstd");
            wire::unpack(&frames[0].1).unwrap()
        };
        let mut replies: Vec<PartReply> = inner
            .iter()
            .filter(|(k, _)| *k == Kind::Part)
            .map(|(_, b)| wire::decode_part(b, D, 0).unwrap())
            .collect();
        replies.sort_by_key(|r| r.part);
        assert_eq!(replies.iter().map(|r| r.len()).sum::<usize>(), 3000);
        got.push((replies, wire_bytes));
    }
    assert_eq!(got[0].0, got[1].0, "the same parts either way");
    assert!(got[1].1 < got[0].1, "packed {} B, plain {} B", got[1].1, got[0].1);
    let st = server.stats();
    assert_eq!(st.packed_out, 1);
    assert!(st.bytes_out < st.bytes_out_raw, "{st:?}");
    assert_eq!(st.part_rows, 6000);
    server.stop();
}

/// Followers of protocol 6 (compressed answers, exact or f16 values) and of protocol 5 follow
/// the same source over loopback: the exact ones hold its rows to the bit, the f16 one holds
/// them rounded to half precision.
#[test]
fn followers_with_compression_follow_writes() {
    let (_p, t, server) = primary();
    let ids: Vec<u64> = (0..4000).collect();
    t.apply_gradients(&ids, &vec![0.5; ids.len() * D], None).unwrap();
    let start = |id: u32, protocol: u16, precision: wire::Precision| {
        let replica = Arc::new(Store::with_replica(id).unwrap());
        let options = FollowOptions {
            protocol: Some(protocol),
            precision: Some(precision),
            ..follow_options()
        };
        let f = Follower::start(replica.clone(), &server.addr().to_string(), options).unwrap();
        (replica, f)
    };
    let followers = [
        start(2, wire::PROTOCOL, wire::Precision::F32),
        start(3, wire::PACKED_PROTOCOL - 1, wire::Precision::F32),
        start(4, wire::PROTOCOL, wire::Precision::F16),
    ];
    for step in 0..30u64 {
        let ids = [step * 13 % 4000, 7000 + step, step];
        let g: Vec<f32> = (0..3 * D).map(|i| (i as f32 + step as f32).cos()).collect();
        t.apply_gradients(&ids, &g, None).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    t.remove(&[5]).unwrap();
    for (_, f) in &followers {
        assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
        assert_eq!(f.status()[0].errors, 0, "{:?}", f.status());
    }
    let want = rows(&t);
    assert_eq!(rows(&followers[0].0.table("items").unwrap()), want);
    assert_eq!(rows(&followers[1].0.table("items").unwrap()), want);
    let half = rows(&followers[2].0.table("items").unwrap());
    assert_eq!(half.len(), want.len());
    for ((k, v, m), (hk, hv, hm)) in want.iter().zip(&half) {
        assert_eq!((k, m), (hk, hm));
        for (a, b) in v.iter().zip(hv) {
            assert_eq!(*b, half::f16::from_f32(*a).to_f32(), "row {k}");
        }
    }
    let st = server.stats();
    assert!(st.packed_out > 0 && st.bytes_out < st.bytes_out_raw, "{st:?}");
    for (_, f) in followers {
        f.stop();
    }
    server.stop();
}

/// A fake source that serves one table whose every reply carries `reply`.
fn fake_source(
    reply: PartReply,
    config: TableConfig,
    parts: u32,
) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        // Two connections: the follower's start, then its table thread.
        for _ in 0..2 {
            let Ok((mut s, _)) = l.accept() else { return };
            let Ok((_, hello)) = wire::read_frame(&mut s) else { return };
            assert!(wire::Hello::decode(&hello).is_ok());
            let info =
                wire::TableInfo { name: "items".into(), config: config.to_text(), parts, epoch: 7 };
            wire::write_frame(&mut s, Kind::Welcome, &wire::encode_welcome(1, &[info])).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
            while let Ok((k, _)) = wire::read_frame(&mut s) {
                let c = embstore_table::sync::Changes {
                    epoch: 7,
                    upto: 1,
                    parts: vec![(reply.part, embstore_table::sync::Sv::new(5, 1))],
                };
                match k {
                    Kind::List => {
                        wire::write_frame(&mut s, Kind::Changed, &wire::encode_changed(&c, 0))
                            .unwrap();
                        wire::write_frame(&mut s, Kind::PullDone, &[]).unwrap();
                    }
                    Kind::Pull => {
                        wire::write_frame(&mut s, Kind::Part, &wire::encode_part(&reply)).unwrap();
                        wire::write_frame(&mut s, Kind::PullDone, &[]).unwrap();
                    }
                    _ => return,
                }
            }
        }
    });
    (addr, h)
}

/// A frame of the older sync framing (`len u32 | kind u8 | crc u32 | body`).
fn legacy_frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    f.extend_from_slice(body);
    f
}

#[test]
fn peers_of_an_older_build_are_told_which_side_to_upgrade() {
    // An older follower (its Hello: "EKSY", protocol 3, a token, no state, no tables) is
    // answered in its own framing: an Error of kind Unsupported (its code 8) that says so.
    let (_p, _t, server) = primary();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = b"EKSY".to_vec();
    hello.extend_from_slice(&3u16.to_le_bytes());
    hello.extend_from_slice(&6u32.to_le_bytes());
    hello.extend_from_slice(b"s3cret");
    hello.extend_from_slice(&[0, 0, 0, 0, 0]);
    s.write_all(&legacy_frame(1, &hello)).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(answer.len() > 14, "{answer:?}");
    let len = u32::from_le_bytes(answer[..4].try_into().unwrap()) as usize;
    assert_eq!((answer.len(), answer[4], answer[9]), (9 + len, 8, 8), "{answer:?}");
    let message = String::from_utf8_lossy(&answer[14..]);
    assert!(message.contains("upgrade the follower"), "{message}");
    assert_eq!(server.stats().refused, 1);
    // A follower of this build to an older source, which refuses its Hello in the older
    // framing: the follower says to upgrade the source, and creates nothing.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let old = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut head = [0u8; 9];
        s.read_exact(&mut head).unwrap();
        let mut body = vec![4u8]; // Corruption, as an older source answers a huge length
        let message = b"a sync frame announces 16843499 bytes, over the limit of 1048576";
        body.extend_from_slice(&(message.len() as u32).to_le_bytes());
        body.extend_from_slice(message);
        s.write_all(&legacy_frame(8, &body)).unwrap();
    });
    let store = Arc::new(Store::with_replica(2).unwrap());
    let e = Follower::start(store.clone(), &addr, follow_options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("upgrade the source"), "{e}");
    assert!(store.tables().is_empty());
    old.join().unwrap();
}

#[test]
fn a_reply_a_day_ahead_is_refused_and_the_follower_keeps_serving() {
    let config = TableConfig::new("items", D);
    let parts = 64;
    let probe = Table::new(config.clone()).unwrap();
    probe.enable_sync(&SyncOptions { parts, ..SyncOptions::default() }).unwrap();
    let key = 42;
    let part = probe.sync_part_of(key).unwrap();
    let ahead = (embstore_table::now_ms() + 3 * 86_400_000) << 16;
    let reply = PartReply {
        part,
        keys: vec![key],
        meta: vec![RowMeta {
            version: Version { timestamp: ahead, replica: 1 },
            update_count: 1,
            last_update_ms: 0,
        }],
        tombstone: vec![false],
        values: vec![1.0; D],
        ..PartReply::default()
    };
    {
        let (addr, h) = fake_source(reply.clone(), config.clone(), parts);
        let store = Arc::new(Store::with_replica(2).unwrap());
        let f = Follower::start(store.clone(), &addr, follow_options()).unwrap();
        let t = store.table("items").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while f.status()[0].errors == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = &f.status()[0];
        assert!(
            s.errors > 0 && s.last_error.as_deref().unwrap_or("").contains("more than a day ahead"),
            "{s:?}"
        );
        assert!(t.is_empty(), "nothing applied");
        let mut out = vec![0.0; D];
        t.lookup(&[key], embstore_table::OnMiss::Zeros, &mut out, None).unwrap();
        f.stop();
        let _ = h.join();
    }
}

#[test]
fn mutual_tls_serves_trusted_followers_and_refuses_the_others() {
    let (ca, server_id, client_id) = pki();
    let other_ca = pki().0;
    let store = Arc::new(Store::with_replica(1).unwrap());
    let t = store.create_table(TableConfig::new("items", D)).unwrap();
    let tls = embstore_server::ServerTls {
        cert_pem: server_id.0.into_bytes(),
        key_pem: server_id.1.into_bytes(),
        client_ca_pem: Some(ca.clone().into_bytes()),
    };
    let options = ServeOptions { tls: Some(tls), ..ServeOptions::default() };
    let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
    t.assign(&[1, 2, 3], &[0.5; 3 * D]).unwrap();
    let addr = format!("localhost:{}", server.addr().port());
    let with = |ca: &str, identity: bool| {
        let c = embstore_sync::ClientTls {
            ca_pem: ca.as_bytes().to_vec(),
            identity: identity
                .then(|| (client_id.0.clone().into_bytes(), client_id.1.clone().into_bytes())),
            domain: None,
        };
        FollowOptions { tls: Some(c), timeout_ms: 3000, ..FollowOptions::default() }
    };
    // Trusted both ways: it follows.
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let f = Follower::start(replica.clone(), &addr, with(&ca, true)).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
    f.stop();
    // A source whose certificate chains to another CA: not trusted, nothing created.
    let e =
        Follower::start(Arc::new(Store::with_replica(3).unwrap()), &addr, with(&other_ca, true))
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    // No client certificate, or plaintext: refused by the port.
    assert!(Follower::start(Arc::new(Store::with_replica(4).unwrap()), &addr, with(&ca, false))
        .is_err());
    let plain = FollowOptions { timeout_ms: 3000, ..FollowOptions::default() };
    assert!(Follower::start(Arc::new(Store::with_replica(5).unwrap()), &addr, plain).is_err());
    // A client identity that holds no certificate is a clear error when the follower starts,
    // before it connects.
    let empty = embstore_sync::ClientTls {
        ca_pem: ca.into_bytes(),
        identity: Some((vec![], client_id.1.clone().into_bytes())),
        ..Default::default()
    };
    let options = FollowOptions { tls: Some(empty), ..FollowOptions::default() };
    let e = Follower::start(Arc::new(Store::with_replica(6).unwrap()), "127.0.0.1:1", options)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(e.message(), "the tls client certificate: the file holds no pem certificate");
}

#[test]
fn a_follower_in_a_directory_restarts_serving_its_rows_and_pulls_only_what_changed() {
    let (_p, t, server) = primary();
    let ids: Vec<u64> = (0..3000).collect();
    t.assign(&ids, &vec![0.5; ids.len() * D]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let open = || {
        let options = embstore_table::StoreOptions::default().with_replica(7);
        let fs = Arc::new(embstore_table::disk::vfs::RealFs);
        Arc::new(Store::open_with_options(&dir, &options, fs).unwrap())
    };
    let addr = server.addr().to_string();
    {
        let replica = open();
        let f = Follower::start(replica.clone(), &addr, plain()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(20)));
        f.stop(); // flushes once more as it stops
        replica.close().unwrap();
    }
    // Writes while the follower is down.
    t.apply_gradients(&[1, 2, 3000], &[1.0; 3 * D], None).unwrap();
    let replica = open();
    let r = replica.table("items").unwrap();
    assert_eq!(r.len(), 3000, "it serves its flushed rows at once");
    let f = Follower::start(replica.clone(), &addr, plain()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&r), rows(&t));
    let s = &f.status()[0];
    assert_eq!(s.rows_applied, 3, "only the rows that changed were written: {s:?}");
    // What it knew at its last flush was saved beside its rows: only the 3 changed rows
    // travel, not the 3,000 (about 130 kB when it joined).
    assert!(s.bytes_in < 20_000, "{s:?}");
    f.stop();
    replica.close().unwrap();
    // Without the saved knowledge (a damaged file is ignored), it pulls everything again
    // and still ends exact.
    std::fs::write(dir.join("sync").join("items.vv"), b"damaged").unwrap();
    let replica = open();
    let f = Follower::start(replica.clone(), &addr, plain()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
    assert!(f.status()[0].bytes_in > 100_000, "{:?}", f.status());
    f.stop();
}

#[test]
fn without_the_cache_or_shard_versions_the_result_is_the_same_at_a_higher_cost() {
    for (use_cache, skip_by_sv) in [(false, true), (true, false), (false, false)] {
        let store = Arc::new(Store::with_replica(1).unwrap());
        let t = store.create_table(TableConfig::new("items", D)).unwrap();
        let sync = SyncOptions { parts: 64, use_cache, ..SyncOptions::default() };
        let options = ServeOptions { sync, ..ServeOptions::default() };
        let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        let opts = FollowOptions { skip_by_sv, wait_ms: 100, ..FollowOptions::default() };
        let f = Follower::start(replica.clone(), &server.addr().to_string(), opts).unwrap();
        for round in 0..5u64 {
            t.assign(&[round, 100 + round], &[round as f32; 2 * D]).unwrap();
            assert!(f.wait_caught_up(Duration::from_secs(20)));
        }
        assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
        let (s, src) = (&f.status()[0], t.sync_stats().unwrap());
        assert_eq!(src.pulls_cached == 0, !use_cache, "{src:?}");
        // With shard versions, a round pulls only the parts that changed.
        assert_eq!(s.parts > 64 + 5 * 2 + 10, !skip_by_sv, "{s:?}");
        f.stop();
    }
}

#[test]
fn a_follower_away_while_tombstones_were_collected_drops_the_removed_rows() {
    let store = Arc::new(Store::with_replica(1).unwrap());
    let t = store.create_table(TableConfig::new("items", D)).unwrap();
    let sync = SyncOptions { parts: 64, tombstone_horizon_ms: 0, ..SyncOptions::default() };
    let options = ServeOptions { token: Some("s3cret".into()), sync, tls: None };
    let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
    let ids: Vec<u64> = (0..3000).collect();
    t.assign(&ids, &vec![1.0; ids.len() * D]).unwrap();
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let addr = server.addr().to_string();
    let f = Follower::start(replica.clone(), &addr, follow_options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    f.stop();
    // Away: rows removed, their tombstones collected.
    let gone: Vec<u64> = (0..3000).step_by(3).collect();
    t.remove(&gone).unwrap();
    t.sync_prune().unwrap();
    assert_eq!(t.sync_stats().unwrap().tombstones, 0);
    let f = Follower::start(replica.clone(), &addr, follow_options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    let r = replica.table("items").unwrap();
    assert_eq!(r.len(), 2000);
    assert_eq!(rows(&r), rows(&t));
    f.stop();
    server.stop();
}

#[test]
fn small_changes_come_with_the_change_list_without_a_pull() {
    let (_p, t, server) = primary();
    let ids: Vec<u64> = (0..2000).collect();
    t.apply_gradients(&ids, &vec![0.5; ids.len() * D], None).unwrap();
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let f = Follower::start(replica.clone(), &server.addr().to_string(), follow_options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    let r = replica.table("items").unwrap();
    let before = f.status()[0].clone();
    // One small write at a time, each waited for: the follower, waiting in its long-poll,
    // gets each with the change list.
    for i in 0..20u64 {
        let key = 10_000 + i;
        t.apply_gradients(&[key], &[0.25; D], None).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while r.meta(&[key]).unwrap()[0].is_none() {
            assert!(std::time::Instant::now() < deadline, "key {key} never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&r), rows(&t));
    let s = f.status()[0].clone();
    assert!(s.parts_inline - before.parts_inline >= 15, "{s:?}");
    assert!(s.pulls - before.pulls <= 5, "few pulls: {} then {}", before.pulls, s.pulls);
    assert!(server.stats().parts_inline >= 15);
    f.stop();
    server.stop();
}
