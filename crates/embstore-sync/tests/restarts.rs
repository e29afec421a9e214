//! Where dissemination's features meet: a clear and a replica's step counter, removals made
//! while a durable source did not sync, and a follower-of-a-follower after a clear.
mod common;
use common::{follow, ids, rows, within};
use std::sync::Arc;
use std::time::Duration;

use embstore_sync::{FollowOptions, Follower, ServeOptions, SyncServer};
use embstore_table::disk::vfs::RealFs;
use embstore_table::sync::SyncOptions;
use embstore_table::{Optimizer, Store, TableConfig};

const D: usize = 8;

fn serve(store: &Arc<Store>) -> SyncServer {
    let sync = SyncOptions { parts: 16, ..SyncOptions::default() };
    let options = ServeOptions { token: Some("t0k".into()), sync, tls: None };
    SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap()
}

/// A durable source in `dir` (replica 1) whose table "items" (100 rows) `replica` followed
/// until caught up; the source then closed (it restarts without sync).
fn known_then_closed(dir: &std::path::Path, replica: &Arc<Store>) {
    let p = open(dir);
    let t = p.create_table(TableConfig::new("items", D).with_shards(4)).unwrap();
    t.assign(&ids(100, 1), &vec![1.0; 100 * D]).unwrap();
    let server = serve(&p);
    follow_until_caught_up(&server, replica);
    assert_eq!(replica.table("items").unwrap().len(), 100);
    server.stop();
    p.close().unwrap();
}

fn open(dir: &std::path::Path) -> Arc<Store> {
    Arc::new(Store::open_with(dir, 1, Arc::new(RealFs)).unwrap())
}

/// Follows `server` into `replica` until caught up, then stops.
fn follow_until_caught_up(server: &SyncServer, replica: &Arc<Store>) {
    let f = Follower::start(replica.clone(), &server.addr().to_string(), follow()).unwrap();
    assert!(f.wait_caught_up(Duration::from_secs(30)), "{:?}", f.status());
    f.stop();
}

/// A clear at the source restarts its step counter (Adam's `t`) at 0; a replica that takes
/// optimizer state (to be promoted) must follow it down, or its first step after a promotion
/// uses another bias correction than the source's would.
#[test]
fn a_state_replica_follows_the_sources_step_counter_down_after_a_clear() {
    within(120, || {
        let adam = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let p = Arc::new(Store::with_replica(1).unwrap());
        let t = p.create_table(TableConfig::new("items", D).with_optimizer(adam)).unwrap();
        let server = serve(&p);
        let batch = ids(100, 11);
        for _ in 0..50 {
            t.apply_gradients(&batch, &vec![0.1; batch.len() * D], None).unwrap();
        }
        let replica = Arc::new(Store::with_replica(2).unwrap());
        let options = FollowOptions { with_state: true, ..follow() };
        let f = Follower::start(replica.clone(), &server.addr().to_string(), options).unwrap();
        assert!(f.wait_caught_up(Duration::from_secs(30)), "{:?}", f.status());
        let r = replica.table("items").unwrap();
        assert_eq!(r.step(), 50);
        t.clear().unwrap();
        for _ in 0..3 {
            t.apply_gradients(&batch, &vec![0.1; batch.len() * D], None).unwrap();
        }
        assert!(f.wait_caught_up(Duration::from_secs(30)), "{:?}", f.status());
        f.stop();
        assert_eq!(rows(&r).len(), rows(&t).len());
        assert_eq!(r.step(), t.step(), "the replica's step counter after the source's clear");
        server.stop();
    });
}

/// A durable source restarted without sync (a trainer opens its store; it serves its port
/// only later), whose table is dropped and created again (the drop refusal's own advice: "drop
/// it in a store that does not sync") before it serves again: a follower that knew the old
/// table must not keep serving its rows.
#[test]
fn a_table_dropped_and_recreated_while_the_source_did_not_sync_reaches_followers() {
    within(120, || {
        let dir = tempfile::tempdir().unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        known_then_closed(dir.path(), &replica);
        let p = open(dir.path());
        p.drop_table("items").unwrap(); // allowed: the store does not sync (yet)
        let t = p.create_table(TableConfig::new("items", D).with_shards(4)).unwrap();
        t.assign(&ids(3, 5), &[4.0; 3 * D]).unwrap();
        p.flush().unwrap();
        let server = serve(&p);
        follow_until_caught_up(&server, &replica);
        let mine = replica.table("items").unwrap();
        assert_eq!(
            mine.len(),
            3,
            "the replica serves the dropped table's rows beside the new table's"
        );
        server.stop();
    });
}

/// The same with a clear made while the source did not sync.
#[test]
fn a_clear_made_while_the_source_did_not_sync_reaches_followers() {
    within(120, || {
        let dir = tempfile::tempdir().unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        known_then_closed(dir.path(), &replica);
        let p = open(dir.path());
        let t = p.table("items").unwrap();
        t.clear().unwrap();
        t.assign(&ids(3, 5), &[4.0; 3 * D]).unwrap();
        p.flush().unwrap();
        let server = serve(&p);
        follow_until_caught_up(&server, &replica);
        assert_eq!(replica.table("items").unwrap().len(), 3, "rows cleared at the source");
        server.stop();
    });
}

/// A chain: source -> a -> b. A clear at the source reaches b through a.
#[test]
fn a_clear_reaches_a_follower_of_a_follower() {
    within(120, || {
        let p = Arc::new(Store::with_replica(1).unwrap());
        let t = p.create_table(TableConfig::new("items", D).with_shards(4)).unwrap();
        t.assign(&ids(300, 1), &vec![1.0; 300 * D]).unwrap();
        let s0 = serve(&p);
        let a = Arc::new(Store::with_replica(2).unwrap());
        let fa = Follower::start(a.clone(), &s0.addr().to_string(), follow()).unwrap();
        assert!(fa.wait_caught_up(Duration::from_secs(30)));
        // A follower serves with the sync options it follows with.
        let sync = a.sync_options().unwrap();
        let options = ServeOptions { token: Some("t0k".into()), sync, tls: None };
        let sa = SyncServer::start(a.clone(), "127.0.0.1:0", options).unwrap();
        let b = Arc::new(Store::with_replica(3).unwrap());
        let fb = Follower::start(b.clone(), &sa.addr().to_string(), follow()).unwrap();
        assert!(fb.wait_caught_up(Duration::from_secs(30)));
        assert_eq!(b.table("items").unwrap().len(), 300);
        t.clear().unwrap();
        t.assign(&ids(3, 5), &[4.0; 3 * D]).unwrap();
        assert!(fa.wait_caught_up(Duration::from_secs(30)));
        assert!(fb.wait_caught_up(Duration::from_secs(30)));
        assert_eq!(rows(&a.table("items").unwrap()), rows(&t));
        assert_eq!(rows(&b.table("items").unwrap()), rows(&t));
        fb.stop();
        fa.stop();
        sa.stop();
        s0.stop();
    });
}

/// Writes made while a durable source did not sync (a trainer opens its store and trains
/// before it serves its port again) reach a follower that knew the table.
#[test]
fn writes_made_while_the_source_did_not_sync_reach_followers() {
    within(120, || {
        let dir = tempfile::tempdir().unwrap();
        let replica = Arc::new(Store::with_replica(2).unwrap());
        known_then_closed(dir.path(), &replica);
        let p = open(dir.path());
        let t = p.table("items").unwrap();
        t.assign(&ids(100, 1), &vec![2.0; 100 * D]).unwrap();
        t.assign(&ids(50, 3), &vec![3.0; 50 * D]).unwrap();
        p.flush().unwrap();
        let server = serve(&p);
        follow_until_caught_up(&server, &replica);
        assert_eq!(rows(&replica.table("items").unwrap()), rows(&t));
        server.stop();
    });
}

/// Serving a follower's store with options that differ only in what a user does not name
/// (the default `SyncOptions` take knowledge from rows; a follower's never do) says how.
#[test]
fn serving_a_followers_store_with_other_options_says_which() {
    within(60, || {
        let p = Arc::new(Store::with_replica(1).unwrap());
        p.create_table(TableConfig::new("items", D).with_shards(4)).unwrap();
        let s0 = serve(&p);
        let a = Arc::new(Store::with_replica(2).unwrap());
        let fa = Follower::start(a.clone(), &s0.addr().to_string(), follow()).unwrap();
        let sync = SyncOptions { parts: 16, ..SyncOptions::default() };
        let options = ServeOptions { token: None, sync, tls: None };
        let e = SyncServer::start(a.clone(), "127.0.0.1:0", options).unwrap_err();
        let m = e.message();
        assert!(m.contains("never from rows") && m.contains("from rows (a source)"), "{m}");
        assert!(!m.contains('{') && !m.contains("SyncOptions"), "{m}");
        fa.stop();
        s0.stop();
    });
}
