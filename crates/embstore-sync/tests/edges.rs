//! Dissemination at its edges, as a new user and an adversary meet it: a follower with a
//! memory budget, rows that lookups created, a catch-up wait that must mean what it says, a
//! promoted replica's step counter, a port that must not leak sockets or multiply work, and
//! errors that say what to do.
mod common;
use common::{follow, ids, pki, rows, within};
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_common::ErrorKind;
use embstore_sync::wire::{self, Kind};
use embstore_sync::{FollowOptions, Follower, ServeOptions, SyncServer};
use embstore_table::disk::vfs::RealFs;
use embstore_table::sync::SyncOptions;
use embstore_table::{OnMiss, Optimizer, Store, StoreOptions, Table, TableConfig, Version};

const D: usize = 8;

fn serve(store: &Arc<Store>, sync: SyncOptions) -> SyncServer {
    let options = ServeOptions { token: Some("t0k".into()), sync, tls: None };
    SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap()
}

fn primary(config: TableConfig) -> (Arc<Store>, Arc<Table>, SyncServer) {
    let store = Arc::new(Store::with_replica(1).unwrap());
    let t = store.create_table(config).unwrap();
    let server = serve(&store, SyncOptions { parts: 16, ..SyncOptions::default() });
    (store, t, server)
}

fn adagrad(name: &str) -> TableConfig {
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    TableConfig::new(name, D).with_optimizer(opt).with_shards(4)
}

#[test]
fn a_follower_with_a_memory_budget_joins_follows_and_restarts() {
    within(120, || {
        let (_p, t, server) = primary(adagrad("items"));
        let first = ids(20_000, 0);
        t.apply_gradients(&first, &vec![0.5; first.len() * D], None).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        // 20,000 rows of D 8 with Adagrad state are ~1.5 MB: a 256 KiB budget keeps most on disk.
        let open = || {
            let o = StoreOptions::default().with_replica(7).with_memory_budget(256 << 10);
            Arc::new(Store::open_with_options(&dir, &o, Arc::new(RealFs)).unwrap())
        };
        let addr = server.addr().to_string();
        // Joins.
        let replica = open();
        let f = Follower::start(replica.clone(), &addr, follow()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(60)), "{:?}", f.status());
        let r = replica.table("items").unwrap();
        assert_eq!(rows(&r), rows(&t));
        assert!(r.stats().rows_on_disk > 0, "the budget kept rows on disk: {:?}", r.stats());
        // Steady state: writes to rows in memory and on disk, and a removal.
        for step in 0..20u64 {
            let some = [first[(step * 997) as usize % first.len()], 1_000_000_000 + step];
            t.apply_gradients(&some, &[0.25; 2 * D], None).unwrap();
        }
        t.remove(&first[..10]).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(60)), "{:?}", f.status());
        assert_eq!(rows(&r), rows(&t));
        // A restart from its directory.
        f.stop();
        drop(r);
        replica.close().unwrap();
        drop(replica);
        t.apply_gradients(&first[100..200], &vec![1.0; 100 * D], None).unwrap();
        let replica = open();
        let f = Follower::start(replica.clone(), &addr, follow()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(60)), "{:?}", f.status());
        assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
        assert_eq!(f.status()[0].errors, 0, "{:?}", f.status());
        f.stop();
        replica.close().unwrap();
    });
}

#[test]
fn a_replica_joining_after_a_collected_tombstone_catches_up_past_rows_lookups_created() {
    within(60, || {
        let store = Arc::new(Store::with_replica(1).unwrap());
        let t = store.create_table(adagrad("items")).unwrap();
        let sync = SyncOptions { parts: 4, tombstone_horizon_ms: 0, ..SyncOptions::default() };
        let server = serve(&store, sync);
        let written = ids(2000, 1);
        t.apply_gradients(&written, &vec![0.5; written.len() * D], None).unwrap();
        // Rows created by lookups and never written: version 0.
        let looked: Vec<u64> = (0..500).map(|i| 5_000_000 + i).collect();
        let mut out = vec![0.0; looked.len() * D];
        t.lookup(&looked, OnMiss::Init, &mut out, None).unwrap();
        // A removal whose tombstone is collected at once (a 0 s horizon).
        t.remove(&written[..50]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        t.sync_prune().unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        let f = Follower::start(replica.clone(), &server.addr().to_string(), follow()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
        let s = &f.status()[0];
        assert_eq!(s.errors, 0, "{s:?}");
        let written_rows: Vec<_> =
            rows(&t).into_iter().filter(|r| r.2.version != Version::default()).collect();
        assert_eq!(rows(&replica.table("items").unwrap()), written_rows);
        f.stop();
    });
}

#[test]
fn wait_caught_up_covers_every_write_made_before_it() {
    let (_p, t, server) = primary(TableConfig::new("items", D).with_shards(16));
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let options = FollowOptions { wait_ms: 1000, ..follow() };
    let f = Follower::start(replica.clone(), &server.addr().to_string(), options).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)));
    let r = replica.table("items").unwrap();
    let mut stale = Vec::new();
    for round in 0..30u64 {
        let batch = ids(2000, round * 100_000_000 + 3);
        t.assign(&batch, &vec![round as f32 + 1.0; batch.len() * D]).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
        // Compared at once: every write made before the wait is here.
        let mut out = vec![0.0; batch.len() * D];
        r.lookup(&batch, OnMiss::Zeros, &mut out, None).unwrap();
        let wrong = out.iter().filter(|&&v| v != round as f32 + 1.0).count() / D;
        if wrong > 0 {
            stale.push((round, wrong));
        }
    }
    assert!(stale.is_empty(), "rounds with rows missing after wait_caught_up: {stale:?}");
    f.stop();
}

#[test]
fn a_promoted_replica_continues_the_sources_step_counter() {
    let adam = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let (_p, t, server) = primary(TableConfig::new("items", D).with_optimizer(adam));
    let batch = ids(100, 11);
    for _ in 0..200 {
        t.apply_gradients(&batch, &vec![0.1; batch.len() * D], None).unwrap();
    }
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let options = FollowOptions { with_state: true, ..follow() };
    let f = Follower::start(replica.clone(), &server.addr().to_string(), options).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    f.stop();
    let r = replica.table("items").unwrap();
    assert_eq!(r.step(), t.step(), "the promoted replica's step counter");
    // Its first step is the source's next one, to the bit.
    let g = vec![-0.3; batch.len() * D];
    t.apply_gradients(&batch, &g, None).unwrap();
    r.apply_gradients(&batch, &g, None).unwrap();
    let (a, b) = (rows(&t), rows(&r));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.1, y.1, "row {}", x.0);
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[test]
fn refused_connections_leave_no_descriptor_behind() {
    let (_p, _t, server) = primary(adagrad("items"));
    let before = open_fds();
    let hello = wire::Hello {
        protocol: wire::PROTOCOL,
        token: "wrong".into(),
        with_state: false,
        tables: vec![],
        precision: wire::Precision::F32,
    };
    let mut frame = Vec::new();
    wire::write_frame(&mut frame, Kind::Hello, &hello.encode()).unwrap();
    for _ in 0..300 {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&frame).unwrap();
        let (k, _) = wire::read_frame(&mut s).unwrap();
        assert_eq!(k, Kind::Error);
    }
    // The port's side of each closes once its thread ends (bounded wait: threads finish at
    // their own pace on a busy machine).
    let deadline = Instant::now() + Duration::from_secs(20);
    while open_fds() > before + 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(open_fds() <= before + 20, "{} descriptors before, {} after", before, open_fds());
    assert_eq!(server.stats().refused, 300);
}

/// A connection that said Hello (right token) to `server`, in protocol 5: these tests read
/// an answer's frames one by one (protocol 6 packs them: see `loopback.rs`).
fn hello(server: &SyncServer) -> TcpStream {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = wire::Hello {
        protocol: wire::PACKED_PROTOCOL - 1,
        token: "t0k".into(),
        with_state: false,
        tables: vec![],
        precision: wire::Precision::F32,
    };
    let mut frame = Vec::new();
    wire::write_frame(&mut frame, Kind::Hello, &hello.encode()).unwrap();
    s.write_all(&frame).unwrap();
    assert_eq!(wire::read_frame(&mut s).unwrap().0, Kind::Welcome);
    s
}

#[test]
fn a_pull_that_names_a_part_many_times_is_answered_once() {
    let (_p, t, server) = primary(adagrad("items"));
    let batch = ids(1000, 5);
    t.assign(&batch, &vec![0.5; batch.len() * D]).unwrap();
    let mut s = hello(&server);
    let parts: Vec<(u32, embstore_replication::Vv)> =
        (0..50_000).map(|_| (3, embstore_replication::Vv::default())).collect();
    let mut frame = Vec::new();
    wire::write_frame(&mut frame, Kind::Pull, &wire::encode_pull("items", &parts)).unwrap();
    s.write_all(&frame).unwrap();
    let mut answered = 0;
    loop {
        let (k, _) = wire::read_frame(&mut s).unwrap();
        match k {
            Kind::Part => answered += 1,
            Kind::PullDone => break,
            k => panic!("unexpected {k:?}"),
        }
    }
    assert_eq!(answered, 1);
    // More distinct parts than the table has: refused, and the connection still serves.
    let many: Vec<_> = (0..17).map(|p| (p, embstore_replication::Vv::default())).collect();
    let mut frame = Vec::new();
    wire::write_frame(&mut frame, Kind::Pull, &wire::encode_pull("items", &many)).unwrap();
    s.write_all(&frame).unwrap();
    let (k, body) = wire::read_frame(&mut s).unwrap();
    assert_eq!(k, Kind::Error);
    assert_eq!(wire::decode_error(&body).unwrap().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_hello_announcing_a_large_frame_is_refused_before_anything_is_read() {
    let (_p, _t, server) = primary(adagrad("items"));
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A header that announces 10 MB, and nothing after it.
    let head = embstore_proto::frame::header(Kind::Hello, 10 << 20, 0);
    s.write_all(&head).unwrap();
    let (k, body) = wire::read_frame(&mut s).unwrap();
    assert_eq!(k, Kind::Error);
    let e = wire::decode_error(&body).unwrap();
    assert!(e.to_string().contains("over the limit"), "{e}");
}

#[test]
fn errors_say_what_to_do_about_tls_and_tokens() {
    let (ca, server_id, _) = pki();
    let store = Arc::new(Store::with_replica(1).unwrap());
    store.create_table(TableConfig::new("items", D)).unwrap();
    let tls = embstore_server::ServerTls {
        cert_pem: server_id.0.into_bytes(),
        key_pem: server_id.1.into_bytes(),
        client_ca_pem: None,
    };
    let options =
        ServeOptions { token: Some("t0k".into()), tls: Some(tls), ..ServeOptions::default() };
    let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
    let addr = format!("localhost:{}", server.addr().port());
    // Plaintext to a TLS port: told at once, naming TLS.
    let started = Instant::now();
    let plain = FollowOptions { timeout_ms: 30_000, ..follow() };
    let e = Follower::start(Arc::new(Store::with_replica(2).unwrap()), &addr, plain).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("speaks TLS") && e.to_string().contains("tls_ca"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(25), "answered, not timed out");
    // TLS without a token: told that a token is needed, not that it is wrong.
    let c = embstore_sync::ClientTls { ca_pem: ca.into_bytes(), ..Default::default() };
    let no_token = FollowOptions { token: String::new(), tls: Some(c), ..follow() };
    let e =
        Follower::start(Arc::new(Store::with_replica(3).unwrap()), &addr, no_token).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("requires a replication token"), "{e}");
    server.stop();
}

#[test]
fn a_table_the_source_creates_later_is_followed_and_waited_for() {
    within(120, || {
        let (store, t, server) = primary(adagrad("items"));
        t.assign(&ids(100, 1), &vec![1.0; 100 * D]).unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        let f = Follower::start(replica.clone(), &server.addr().to_string(), follow()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(30)));
        assert_eq!(f.status().len(), 1);
        // Created at the source after the follower started, and written at once.
        let users = store.create_table(adagrad("users")).unwrap();
        users.assign(&ids(500, 3), &vec![2.0; 500 * D]).unwrap();
        // Waiting to catch up covers it (it existed before the wait began).
        assert!(f.wait_caught_up(Duration::from_secs(30)));
        let mine = replica.table("users").expect("the new table is followed");
        assert_eq!(rows(&mine), rows(&users));
        let names: Vec<String> = f.status().into_iter().map(|s| s.table).collect();
        assert_eq!(names, ["items", "users"]);
        // A follower of named tables follows only those.
        let other = Arc::new(Store::with_replica(3).unwrap());
        let only = FollowOptions { tables: vec!["items".into()], ..follow() };
        let g = Follower::start(other.clone(), &server.addr().to_string(), only).unwrap();
        assert!(g.wait_caught_up(Duration::from_secs(30)));
        store.create_table(adagrad("later")).unwrap();
        assert!(g.wait_caught_up(Duration::from_secs(30)));
        assert_eq!(other.tables(), ["items"]);
        g.stop();
        f.stop();
        server.stop();
    });
}

#[test]
fn a_table_is_not_dropped_from_a_store_that_syncs_and_a_clear_reaches_followers() {
    within(120, || {
        let (store, t, server) = primary(adagrad("items"));
        t.assign(&ids(300, 1), &vec![1.0; 300 * D]).unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        let f = Follower::start(replica.clone(), &server.addr().to_string(), follow()).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(30)));
        for s in [&store, &replica] {
            let e = s.drop_table("items").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains("syncs") && e.message().contains("clear()"), "{e}");
        }
        // What the message offers works: the followers drop the rows.
        t.clear().unwrap();
        t.assign(&ids(3, 5), &[4.0; 3 * D]).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(30)));
        let mine = replica.table("items").unwrap();
        assert_eq!(rows(&mine), rows(&t));
        assert_eq!(mine.len(), 3);
        f.stop();
        server.stop();
    });
}

/// A follower that asks for rows and never reads them: after the 30 s write deadline the port
/// drops the connection and what it held for it (the client then reads what its socket had
/// buffered, and the end). Before the deadline existed, the port kept writing once the reader
/// drained, and the connection never ended.
#[test]
fn a_follower_that_never_reads_is_dropped_after_the_write_deadline() {
    const WIDE: usize = 64;
    let store = Arc::new(Store::with_replica(1).unwrap());
    let t = store.create_table(TableConfig::new("items", WIDE)).unwrap();
    let batch: Vec<u64> = (0..200_000).collect();
    t.assign(&batch, &vec![0.5; batch.len() * WIDE]).unwrap(); // ~51 MB of rows
    let server = serve(&store, SyncOptions { parts: 16, ..SyncOptions::default() });
    let mut s = hello(&server);
    let parts: Vec<_> = (0..16).map(|p| (p, embstore_replication::Vv::default())).collect();
    let mut frame = Vec::new();
    wire::write_frame(&mut frame, Kind::Pull, &wire::encode_pull("items", &parts)).unwrap();
    s.write_all(&frame).unwrap();
    std::thread::sleep(Duration::from_secs(33));
    // Drain: with the connection dropped this ends well before the 51 MB; alive, the port
    // would go on sending every part and then wait for the next request (a read timeout).
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut got, mut buf) = (0usize, vec![0u8; 1 << 16]);
    let ended = loop {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(ended, "the connection is still open after {got} bytes");
    assert!(got < 40 << 20, "{got} bytes were sent to a client that did not read");
    server.stop();
}
