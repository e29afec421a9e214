//! A roll onto a new base with sync on top: a serving [`Server`] loads a version from a
//! checkpoint of the syncing primary, and a follower keeps that version current, pulling only
//! what is newer than the checkpoint; when a roll loads a newer base, the follower switches to
//! it (the old version stays as it was, a fixed snapshot); when that version is unloaded (a
//! failed roll), it goes back to the newest version still held.
mod common;
use common::rows;
use std::sync::Arc;
use std::time::Duration;

use embstore_server::{Server, SyncLoads};
use embstore_sync::{FollowOptions, Follower, ServeOptions, Source, SyncServer};
use embstore_table::disk::vfs::RealFs;
use embstore_table::sync::SyncOptions;
use embstore_table::{Optimizer, Store, TableConfig};

const D: usize = 8;
const PARTS: u32 = 64;

fn syncing_server(replica: u32) -> Arc<Server> {
    let s = Server::new("replica", 1 << 16);
    let options = SyncOptions { parts: PARTS, knowledge_from_rows: false, ..Default::default() };
    s.set_sync_loads(SyncLoads { replica, options });
    s
}

/// Protocol 5 (every frame on its own, uncompressed): these tests count bytes to tell what
/// was pulled.
fn options() -> FollowOptions {
    FollowOptions {
        wait_ms: 200,
        retry_ms: 50,
        protocol: Some(embstore_sync::wire::PACKED_PROTOCOL - 1),
        ..FollowOptions::default()
    }
}

fn grads(ids: &[u64], g: f32) -> Vec<f32> {
    vec![g; ids.len() * D]
}

#[test]
fn a_rolled_in_base_syncs_on_top_and_a_new_roll_switches_the_follower() {
    let dir = tempfile::tempdir().unwrap();
    let p = Store::open_with(dir.path().join("primary"), 1, Arc::new(RealFs)).unwrap();
    let p = Arc::new(p);
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    let t = p.create_table(TableConfig::new("items", D).with_optimizer(opt)).unwrap();
    let serve = ServeOptions {
        token: None,
        sync: SyncOptions { parts: PARTS, ..SyncOptions::default() },
        tls: None,
    };
    let sync = SyncServer::start(p.clone(), "127.0.0.1:0", serve).unwrap();
    let source = Source::Fixed(sync.addr().to_string());
    let ids: Vec<u64> = (0..5000).collect();
    t.apply_gradients(&ids, &grads(&ids, 0.5), None).unwrap();
    let c1 = dir.path().join("c1");
    p.checkpoint(&c1, None).unwrap();
    // Written after the checkpoint: what the follower must pull on top of it.
    let fresh: Vec<u64> = (0..100).map(|i| i * 37).collect();
    t.apply_gradients(&fresh, &grads(&fresh, 0.25), None).unwrap();

    let server = syncing_server(2);
    server.load("items", 1, 0, 1, &c1).unwrap();
    let v1 = server.live_table("items").expect("a version that syncs");
    let f = Follower::start_into(server.clone(), source.clone(), options()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&v1), rows(&t));
    let s = f.status()[0].clone();
    // Only the rows newer than the checkpoint moved: 100 of 5,000.
    assert_eq!(s.rows_applied, 100, "{s:?}");
    let full = 5000 * D as u64 * 4;
    assert!(s.bytes_in < full / 5, "{} bytes in for 100 rows (the table is {full})", s.bytes_in);

    // The same checkpoint without its saved knowledge: every part is pulled whole.
    let c1_bare = dir.path().join("c1-bare");
    copy_dir(&c1, &c1_bare);
    std::fs::remove_dir_all(c1_bare.join("sync")).unwrap();
    let bare = syncing_server(3);
    bare.load("items", 1, 0, 1, &c1_bare).unwrap();
    let g = Follower::start_into(bare.clone(), source.clone(), options()).unwrap();
    assert!(g.wait_caught_up(Duration::from_secs(20)), "{:?}", g.status());
    assert_eq!(rows(&bare.live_table("items").unwrap()), rows(&t));
    let b = g.status()[0].clone();
    assert!(b.bytes_in > full, "without knowledge every row moves: {b:?}");
    g.stop();

    // A roll onto a newer base: the follower switches to it; version 1 stays as it was.
    let more: Vec<u64> = (0..200).map(|i| i * 11).collect();
    t.apply_gradients(&more, &grads(&more, 0.125), None).unwrap();
    let c2 = dir.path().join("c2");
    p.checkpoint(&c2, None).unwrap();
    server.load("items", 2, 0, 1, &c2).unwrap();
    let v2 = server.live_table("items").unwrap();
    assert!(!Arc::ptr_eq(&v1, &v2));
    // Once a row written now reaches version 2, the follower has switched (it may also have
    // reached version 1, in the round that was running when the roll loaded version 2).
    t.apply_gradients(&[8000], &grads(&[8000], 1.0), None).unwrap();
    wait_until(|| v2.len() == t.len(), "the follower switches to version 2");
    let new: Vec<u64> = (9000..9050).collect();
    t.apply_gradients(&new, &grads(&new, 1.0), None).unwrap();
    wait_until(|| v2.len() == t.len(), "version 2 gets the rows written after the roll");
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&v2), rows(&t));
    let v1_rows = rows(&v1);
    assert!(v1_rows.iter().all(|r| r.0 < 9000), "version 1 is a fixed snapshot now");

    // The roll fails and version 2 is unloaded: the follower goes back to version 1, which
    // catches up from what it knew.
    assert!(server.unload("items", 2, None));
    assert!(Arc::ptr_eq(&server.live_table("items").unwrap(), &v1));
    let last: Vec<u64> = (9100..9110).collect();
    t.apply_gradients(&last, &grads(&last, 2.0), None).unwrap();
    wait_until(|| v1.len() == t.len(), "version 1 follows again");
    assert!(f.wait_caught_up(Duration::from_secs(20)), "{:?}", f.status());
    assert_eq!(rows(&v1), rows(&t));
    let s = f.status()[0].clone();
    assert!(s.errors == 0 && s.caught_up, "{s:?}");
    f.stop();
    sync.stop();
}

#[test]
fn a_server_without_sync_loads_cannot_be_followed_into() {
    let p = Arc::new(Store::with_replica(1).unwrap());
    p.create_table(TableConfig::new("items", D)).unwrap();
    let serve = ServeOptions { token: None, sync: SyncOptions::default(), tls: None };
    let sync = SyncServer::start(p.clone(), "127.0.0.1:0", serve).unwrap();
    let server = Server::new("replica", 1 << 16);
    let e = Follower::start_into(server, Source::Fixed(sync.addr().to_string()), options());
    assert_eq!(e.unwrap_err().kind(), embstore_common::ErrorKind::InvalidArgument);
    sync.stop();
}

fn wait_until(mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}
