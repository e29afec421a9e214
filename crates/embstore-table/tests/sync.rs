//! Sync between tables: a follower that pulls the changed parts of a primary holds exactly the
//! primary's rows (values, versions, removals); a pull from a nearly current follower is
//! answered from the update cache; a bad reply changes nothing; concurrent writers and pulls
//! converge; rows on disk (a memory budget) are shipped like rows in memory.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use embstore_table::disk::vfs::RealFs;
use embstore_table::sync::{Changes, SyncOptions};
use embstore_table::{ErrorKind, Optimizer, RowMeta, Store, StoreOptions, Table, TableConfig};

const D: usize = 4;

fn config() -> TableConfig {
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    TableConfig::new("t", D).with_optimizer(opt).with_shards(4)
}

fn options() -> SyncOptions {
    SyncOptions { parts: 16, ..SyncOptions::default() }
}

/// A store with replica id `replica` holding one syncing table.
fn syncing(replica: u32) -> (Store, Arc<Table>) {
    let store = Store::with_replica(replica).unwrap();
    let t = store.create_table(config()).unwrap();
    t.enable_sync(&options()).unwrap();
    (store, t)
}

/// Every row: key → (values, meta).
fn rows(t: &Table) -> BTreeMap<u64, (Vec<f32>, RowMeta)> {
    let mut out = BTreeMap::new();
    for c in t.export(1 << 20) {
        for (i, k) in c.ids.iter().enumerate() {
            out.insert(*k, (c.values[i * D..][..D].to_vec(), c.meta[i]));
        }
    }
    out
}

/// The follower's cursor on a primary.
#[derive(Default)]
struct Book {
    epoch: u64,
    upto: u64,
}

/// One pull round of `dst` from `src`: the parts changed since the cursor whose sv `dst` does
/// not already succeed; returns (parts listed, parts pulled, rows applied, cache answers).
fn round(src: &Table, dst: &Table, book: &mut Book, state: bool) -> (usize, usize, usize, usize) {
    let Changes { epoch, upto, parts } = src.sync_changes(book.epoch, book.upto).unwrap();
    let (mut pulled, mut applied, mut cached) = (0, 0, 0);
    for &(part, sv) in &parts {
        let (vv, mine) = dst.sync_knowledge(part).unwrap();
        if mine.succeq(&sv) {
            continue;
        }
        let reply = src.sync_pull(part, &vv, state).unwrap();
        cached += reply.from_cache as usize;
        applied += dst.sync_apply(&reply).unwrap();
        pulled += 1;
    }
    (book.epoch, book.upto) = (epoch, upto);
    (parts.len(), pulled, applied, cached)
}

#[test]
fn a_follower_holds_exactly_the_primarys_rows_and_pulls_only_what_changed() {
    let (_p, primary) = syncing(1);
    let (_f, follower) = syncing(2);
    let ids: Vec<u64> = (0..500).collect();
    let grads: Vec<f32> = (0..ids.len() * D).map(|i| (i % 7) as f32 - 3.0).collect();
    primary.apply_gradients(&ids, &grads, None).unwrap();
    let mut book = Book::default();
    let (listed, pulled, applied, _) = round(&primary, &follower, &mut book, false);
    assert_eq!((listed, pulled, applied), (16, 16, 500));
    assert_eq!(rows(&follower), rows(&primary));
    // Nothing changed: nothing listed.
    assert_eq!(round(&primary, &follower, &mut book, false).0, 0);
    // Three rows change: only their parts are listed, answered from the cache.
    let few = [3u64, 77, 401];
    primary.assign(&few, &[1.5; 3 * D]).unwrap();
    let parts: std::collections::BTreeSet<u32> =
        few.iter().map(|&k| primary.sync_part_of(k).unwrap()).collect();
    let (listed, pulled, applied, cached) = round(&primary, &follower, &mut book, false);
    assert_eq!((listed, pulled, applied, cached), (parts.len(), parts.len(), 3, parts.len()));
    assert_eq!(rows(&follower), rows(&primary));
    // The follower knows what the primary knows, part by part, under the same name.
    for part in 0..16 {
        assert_eq!(follower.sync_knowledge(part).unwrap(), primary.sync_knowledge(part).unwrap());
    }
    // A removal travels as a tombstone.
    assert_eq!(primary.remove(&[77, 9999]).unwrap(), 1);
    round(&primary, &follower, &mut book, false);
    assert!(follower.meta(&[77]).unwrap()[0].is_none());
    assert_eq!(rows(&follower), rows(&primary));
    assert_eq!(primary.sync_stats().unwrap().tombstones, 1);
}

#[test]
fn optimizer_state_travels_only_when_asked_for() {
    let (_p, primary) = syncing(1);
    let (_f, inference) = syncing(2);
    let (_g, standby) = syncing(3);
    primary.apply_gradients(&[5, 6], &[1.0; 2 * D], None).unwrap();
    round(&primary, &inference, &mut Book::default(), false);
    round(&primary, &standby, &mut Book::default(), true);
    let state = |t: &Table| t.export(16).flat_map(|c| c.state).collect::<Vec<f32>>();
    assert_eq!(state(&standby), state(&primary));
    assert!(state(&primary).iter().any(|&s| s != 0.0));
    assert!(state(&inference).iter().all(|&s| s == 0.0), "inference replicas get values only");
    assert_eq!(rows(&inference), rows(&primary));
}

#[test]
fn a_bad_reply_is_a_typed_error_and_changes_nothing() {
    let (_p, primary) = syncing(1);
    let (_f, follower) = syncing(2);
    primary.assign(&[1, 2, 3], &[0.5; 3 * D]).unwrap();
    let part = primary.sync_part_of(1).unwrap();
    let (vv, _) = follower.sync_knowledge(part).unwrap();
    let good = primary.sync_pull(part, &vv, false).unwrap();
    assert!(!good.is_empty());
    let mut bad = Vec::new();
    let mut r = good.clone();
    r.values[0] = f32::NAN;
    bad.push((r, ErrorKind::NonFinite, "are not finite"));
    let mut r = good.clone();
    r.values.pop();
    bad.push((r, ErrorKind::ShapeMismatch, "values must hold"));
    let mut r = good.clone();
    r.meta[0].version.timestamp = (embstore_table::now_ms() + 2 * 86_400_000) << 16;
    bad.push((r, ErrorKind::InvalidArgument, "more than a day ahead"));
    let mut r = good.clone();
    r.keys[0] = (0..).find(|&k| primary.sync_part_of(k).unwrap() != part).unwrap();
    bad.push((r, ErrorKind::InvalidArgument, "is not in sync part"));
    let mut r = good.clone();
    r.part = 99;
    bad.push((r, ErrorKind::InvalidArgument, "out of range"));
    let before = (rows(&follower), follower.sync_knowledge(part).unwrap());
    for (r, kind, msg) in bad {
        let e = follower.sync_apply(&r).unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(msg), "{e}");
        assert_eq!((rows(&follower), follower.sync_knowledge(part).unwrap()), before);
    }
    assert_eq!(follower.sync_stats().unwrap().replies_rejected, 5);
    follower.sync_apply(&good).unwrap();
    let e = follower.sync_pull(1 << 20, &vv, false).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    let plain = Table::new(config()).unwrap();
    assert!(plain.sync_pull(0, &vv, false).unwrap_err().to_string().contains("does not sync"));
}

#[test]
fn concurrent_writers_and_pulls_converge() {
    let (_p, primary) = syncing(1);
    let (_f, follower) = syncing(2);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (t, stop) = (primary.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && n < 200_000 {
                    let ids = [(n * 31 + w) % 2000, (n * 17 + 3 * w) % 2000];
                    if n % 50 == 49 {
                        t.remove(&ids[..1]).unwrap();
                    } else {
                        t.apply_gradients(&ids, &[0.25; 2 * D], None).unwrap();
                    }
                    n += 1;
                }
            })
        })
        .collect();
    let mut book = Book::default();
    for _ in 0..200 {
        round(&primary, &follower, &mut book, false);
    }
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().for_each(|w| w.join().unwrap());
    round(&primary, &follower, &mut book, false);
    assert_eq!(rows(&follower), rows(&primary));
    let s = primary.sync_stats().unwrap();
    assert!(s.pulls_cached > 0, "{s:?}");
}

#[test]
fn rows_on_disk_are_shipped_like_rows_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let opened = StoreOptions::default().with_replica(1).with_memory_budget(24 << 10);
    let store = Store::open_with_options(dir.path(), &opened, Arc::new(RealFs)).unwrap();
    let primary = store.create_table(config()).unwrap();
    let ids: Vec<u64> = (0..3000).collect();
    primary.assign(&ids, &vec![0.75; ids.len() * D]).unwrap();
    store.flush().unwrap();
    store.memory_budget().unwrap().settle();
    primary.enable_sync(&options()).unwrap();
    assert!(primary.stats().rows_on_disk > 0, "some rows are on disk only");
    let (_f, follower) = syncing(2);
    round(&primary, &follower, &mut Book::default(), true);
    assert_eq!(rows(&follower), rows(&primary));
    assert_eq!(follower.len(), 3000);
}

/// A store with replica id `replica` holding one table that syncs with `options`.
fn syncing_with(replica: u32, options: &SyncOptions) -> (Store, Arc<Table>) {
    let store = Store::with_replica(replica).unwrap();
    let t = store.create_table(config()).unwrap();
    t.enable_sync(options).unwrap();
    (store, t)
}

/// Pulls every part of `src` into `dst`, each reply split into pieces of `piece` rows;
/// returns how many replies were complete (whole parts).
fn pull_all(src: &Table, dst: &Table, piece: usize) -> usize {
    let mut complete = 0;
    for part in 0..src.sync_parts().unwrap() {
        let (vv, _) = dst.sync_knowledge(part).unwrap();
        let reply = src.sync_pull(part, &vv, false).unwrap();
        complete += reply.complete.is_some() as usize;
        for p in reply.split(piece) {
            dst.sync_apply(&p).unwrap();
        }
    }
    complete
}

#[test]
fn removals_whose_tombstones_were_collected_reach_lagging_replicas_as_whole_parts() {
    // A collects tombstones at once (horizon 0); B follows A, C follows B.
    let horizon0 = SyncOptions { parts: 16, tombstone_horizon_ms: 0, ..SyncOptions::default() };
    let (_a, a) = syncing_with(1, &horizon0);
    let (_b, b) = syncing_with(2, &horizon0);
    let (_c, c) = syncing(3);
    let ids: Vec<u64> = (0..2000).collect();
    a.assign(&ids, &vec![1.0; ids.len() * D]).unwrap();
    pull_all(&a, &b, 1 << 20);
    pull_all(&b, &c, 1 << 20);
    assert_eq!(rows(&c), rows(&a));

    // Removals and updates while B and C are away; A then collects the tombstones.
    let gone: Vec<u64> = (0..300).collect();
    assert_eq!(a.remove(&gone).unwrap(), 300);
    a.assign(&[500, 501], &[2.0; 2 * D]).unwrap();
    assert_eq!(a.sync_stats().unwrap().tombstones, 300);
    a.sync_prune().unwrap();
    assert_eq!(a.sync_stats().unwrap().tombstones, 0, "collected");

    // B is behind the collected removals: it gets whole parts (in pieces of 7 rows) and drops
    // the rows A no longer has.
    let complete = pull_all(&a, &b, 7);
    assert!(complete > 0 && complete <= 16, "{complete}");
    assert_eq!(rows(&b), rows(&a));
    // C, behind them too, learns of them from B (B took A's floor).
    assert!(pull_all(&b, &c, 1 << 20) > 0);
    assert_eq!(rows(&c), rows(&a));
    assert!(!rows(&c).contains_key(&7));
    // Once past them, pulls are incremental again.
    a.assign(&[9999], &[3.0; D]).unwrap();
    assert_eq!(pull_all(&a, &b, 1 << 20), 0);
    assert_eq!(pull_all(&b, &c, 1 << 20), 0);
    assert_eq!(rows(&c), rows(&a));
    // A row written at B that A never saw survives a complete pull (A's VV does not cover it).
    b.assign(&[7], &[4.0; D]).unwrap();
    a.remove(&[8]).unwrap();
    a.sync_prune().unwrap();
    pull_all(&a, &b, 1 << 20);
    let held = rows(&b);
    assert!(held.contains_key(&7) && !held.contains_key(&8));
}

#[test]
fn tombstones_younger_than_the_horizon_stay() {
    let (_a, a) = syncing(1); // the default horizon: an hour
    a.assign(&[1, 2, 3], &[1.0; 3 * D]).unwrap();
    a.remove(&[1, 2]).unwrap();
    a.sync_prune().unwrap();
    assert_eq!(a.sync_stats().unwrap().tombstones, 2);
    let (_b, b) = syncing(2);
    assert_eq!(pull_all(&a, &b, 1 << 20), 0, "no part is complete: nothing was collected");
    assert_eq!(rows(&b), rows(&a));
}

#[test]
fn a_stale_reply_does_not_bring_back_a_row_whose_removal_was_collected() {
    let horizon0 = SyncOptions { parts: 16, tombstone_horizon_ms: 0, ..SyncOptions::default() };
    let (_a, a) = syncing_with(1, &horizon0);
    let (_b, b) = syncing_with(2, &horizon0);
    a.assign(&[5, 6], &[1.0; 2 * D]).unwrap();
    let part = a.sync_part_of(5).unwrap();
    // A reply that is delayed (a duplicate, a slow source): it carries row 5.
    let stale = a.sync_pull(part, &b.sync_knowledge(part).unwrap().0, false).unwrap();
    a.remove(&[5]).unwrap();
    a.sync_prune().unwrap();
    pull_all(&a, &b, 1 << 20);
    assert!(!rows(&b).contains_key(&5));
    // B knows the write the stale reply carries: it is not applied again.
    assert_eq!(b.sync_apply(&stale).unwrap(), 0);
    assert!(!rows(&b).contains_key(&5));
    assert_eq!(rows(&b), rows(&a));
}

#[test]
fn removals_a_restart_forgets_reach_peers_behind_them_as_whole_parts() {
    // A primary in a directory removes a row while a follower is away, then restarts: its
    // tombstone is gone, so the saved floor must stand for it.
    let dir = tempfile::tempdir().unwrap();
    let opts = options();
    let ids: Vec<u64> = (0..500).collect();
    let (_b, b) = syncing(2);
    {
        let store = Store::open_with(dir.path(), 1, Arc::new(RealFs)).unwrap();
        store.enable_sync(&opts).unwrap();
        let a = store.create_table(config()).unwrap();
        a.assign(&ids, &vec![1.0; ids.len() * D]).unwrap();
        pull_all(&a, &b, 1 << 20);
        assert_eq!(rows(&b), rows(&a));
        a.remove(&[7, 8, 9]).unwrap();
        store.close().unwrap();
    }
    let store = Store::open_with(dir.path(), 1, Arc::new(RealFs)).unwrap();
    store.enable_sync(&opts).unwrap();
    let a = store.table("t").unwrap();
    assert_eq!(a.sync_stats().unwrap().tombstones, 0, "a restart forgets tombstones");
    assert!(pull_all(&a, &b, 1 << 20) > 0, "parts with forgotten removals come whole");
    assert_eq!(rows(&b), rows(&a));
    assert!(!rows(&b).contains_key(&8));
}

/// Pulls every part of `src` into `dst` through `sync_pull_pieces` (pieces of `piece` rows,
/// applied as they come); returns (pieces, the most rows in one).
fn pull_all_in_pieces(src: &Table, dst: &Table, piece: usize) -> (usize, usize) {
    let (mut pieces, mut largest) = (0, 0);
    for part in 0..src.sync_parts().unwrap() {
        let (vv, _) = dst.sync_knowledge(part).unwrap();
        src.sync_pull_pieces(part, &vv, false, piece, &mut |p| {
            pieces += 1;
            largest = largest.max(p.len());
            dst.sync_apply(&p).map(drop)
        })
        .unwrap();
    }
    (pieces, largest)
}

#[test]
fn a_cleared_table_leaves_no_tombstone_per_row_and_its_followers_drop_every_row() {
    let (_p, primary) = syncing(1);
    let (_f, follower) = syncing(2);
    let ids: Vec<u64> = (0..20_000).collect();
    primary.assign(&ids, &vec![0.5; ids.len() * D]).unwrap();
    pull_all(&primary, &follower, usize::MAX);
    assert_eq!(follower.len(), ids.len());
    primary.clear().unwrap();
    assert_eq!(primary.sync_stats().unwrap().tombstones, 0, "a clear kept a tombstone per row");
    // Written after the clear: the followers keep these.
    primary.assign(&[7, 8], &[1.5; 2 * D]).unwrap();
    let mut book = Book::default();
    round(&primary, &follower, &mut book, false);
    assert_eq!(rows(&follower), rows(&primary));
    assert_eq!(follower.len(), 2);
    // A replica that joins after the clear gets the same rows, in whole parts.
    let (_g, late) = syncing(3);
    let complete = pull_all(&primary, &late, 3);
    assert_eq!(complete, 16);
    assert_eq!(rows(&late), rows(&primary));
}

#[test]
fn a_part_is_read_and_sent_in_pieces_and_whole_parts_cover_every_key() {
    let horizon0 = SyncOptions { parts: 16, tombstone_horizon_ms: 0, ..SyncOptions::default() };
    let (_p, primary) = syncing_with(1, &horizon0);
    let ids: Vec<u64> = (0..30_000).collect();
    primary.assign(&ids, &vec![0.25; ids.len() * D]).unwrap();
    // A joining replica: every row, in pieces of at most 100 rows.
    let (_f, follower) = syncing(2);
    let (pieces, largest) = pull_all_in_pieces(&primary, &follower, 100);
    assert!(largest <= 100, "a piece of {largest} rows");
    assert!(pieces >= 300, "{pieces} pieces");
    assert_eq!(rows(&follower), rows(&primary));
    // Removals whose tombstones are collected: whole parts, in pieces that cover every key.
    let gone: Vec<u64> = (0..30_000).step_by(3).collect();
    primary.remove(&gone).unwrap();
    primary.sync_prune().unwrap();
    primary.assign(&[1, 2], &[3.0; 2 * D]).unwrap();
    let (_, largest) = pull_all_in_pieces(&primary, &follower, 64);
    assert!(largest <= 64);
    assert_eq!(rows(&follower), rows(&primary));
    assert_eq!(follower.len(), primary.len());
}
