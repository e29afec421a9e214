//! A table as a witness, and a rollback through a paused source: the witness logs what it
//! pulls by arrival time, flushes only what a healthy decision covers into its healthy store
//! (persisted), and its diff, written through the source's pause, puts the source back to
//! the healthy state with versions above every earlier one. A restarted witness keeps its
//! healthy store and drops its logs; a torn file end is cut off, damage elsewhere refused.

mod common;

use std::sync::Arc;
use std::time::Duration;

use embstore_replication::witness::Corrupted;
use embstore_table::sync::SyncOptions;
use embstore_table::{ErrorKind, OnMiss, Store, Table, TableConfig};

const D: usize = 4;
const PARTS: u32 = 8;
const BUCKET_MS: u64 = 20;

fn syncing(replica: u32) -> (Store, Arc<Table>) {
    common::syncing(replica, D, PARTS)
}

fn sync(src: &Table, dst: &Table) {
    common::sync_all(src, dst)
}

fn rows(ids: &[u64], v: f32) -> Vec<f32> {
    ids.iter().flat_map(|&i| vec![v + i as f32; D]).collect()
}

fn read(t: &Table, ids: &[u64]) -> (Vec<f32>, Vec<bool>) {
    let mut out = vec![0.0; ids.len() * D];
    let mut found = vec![false; ids.len()];
    t.lookup(ids, OnMiss::Zeros, &mut out, Some(&mut found)).unwrap();
    (out, found)
}

/// Waits past the current bucket, so that what arrived so far is in buckets that have ended.
fn next_bucket() -> u64 {
    std::thread::sleep(Duration::from_millis(2 * BUCKET_MS + 5));
    embstore_common::clock::now_ms()
}

#[test]
fn a_rollback_writes_the_diff_and_restores_the_healthy_state() {
    let dir = tempfile::tempdir().unwrap();
    let (_ps, primary) = syncing(1);
    let (_ws, witness) = syncing(2);
    witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap();
    let healthy: Vec<u64> = (0..100).collect();
    primary.assign(&healthy, &rows(&healthy, 0.0)).unwrap();
    primary.remove(&[99]).unwrap();
    sync(&primary, &witness);
    let st = witness.witness_stats().unwrap();
    assert_eq!((st.t_max_ms, st.logged_keys, st.healthy_rows), (0, 100, 0), "{st:?}");
    // Healthy up to now: everything so far is flushed, and persisted.
    let t_healthy = next_bucket();
    let t_max = witness.witness_flush(t_healthy, &[]).unwrap().expect("a flush");
    assert!(t_max <= t_healthy && t_max + BUCKET_MS > t_healthy - BUCKET_MS, "{t_max}");
    let st = witness.witness_stats().unwrap();
    assert_eq!((st.logged_keys, st.healthy_rows), (0, 100), "{st:?}");
    assert!(st.file_bytes > 100 * (21 + 4 * D as u64), "{st:?}");
    let t_bad = next_bucket();
    // A bad model: rows 0..10 overwritten, 99 written again, 500 created.
    let bad: Vec<u64> = (0..10).chain([99, 500]).collect();
    primary.assign(&bad, &rows(&bad, 1000.0)).unwrap();
    sync(&primary, &witness);
    assert_eq!(witness.witness_stats().unwrap().logged_keys, 12);
    // A healthy decision that reaches into the corrupted time flushes nothing after it.
    let corrupted = [Corrupted { start_ms: t_bad, end_ms: None }];
    let later = next_bucket();
    if let Some(t) = witness.witness_flush(later, &corrupted).unwrap() {
        assert!(t <= t_bad, "flushed to {t}, past the corruption at {t_bad}");
    }
    assert_eq!(witness.witness_stats().unwrap().logged_keys, 12);
    let diff = witness.witness_diff(false).unwrap();
    assert_eq!(diff.len(), 12);
    assert!(diff.iter().all(|(k, v)| (*k == 99 || *k == 500) == v.is_none()), "{diff:?}");
    assert_eq!(witness.witness_diff(true).unwrap().len(), 11, "500 is new: kept");

    // ① writes paused: every write refused with RollingBack, sync still served.
    primary.pause_writes(Some("model 'ctr' is rolling back"));
    for e in [
        primary.assign(&[1], &[0.0; D]).unwrap_err(),
        primary.apply_gradients(&[1], &[0.1; D], None).unwrap_err(),
        primary.remove(&[1]).unwrap_err(),
        primary.clear().unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::RollingBack, "{e}");
        assert!(e.to_string().contains("rolling back"), "{e}");
    }
    let before: Vec<_> = primary.meta(&bad).unwrap();
    // ④ the diff, written through the pause.
    let (keys, values): (Vec<u64>, Vec<Option<Vec<f32>>>) = diff.into_iter().unzip();
    assert_eq!(primary.rollback_write(&keys, &values).unwrap(), 12);
    witness.witness_clear_logs().unwrap();
    let want: Vec<u64> = (0..10).collect();
    assert_eq!(read(&primary, &want).0, rows(&want, 0.0));
    assert_eq!(read(&primary, &[99, 500]).1, vec![false, false]);
    assert_eq!(read(&primary, &[10, 50]).0, rows(&[10, 50], 0.0), "untouched rows stay");
    let after = primary.meta(&want).unwrap();
    for (b, a) in before.iter().zip(&after) {
        assert!(a.unwrap().version > b.unwrap().version, "a rollback's version is newer");
    }
    // Replicas converge by normal sync: the witness takes the restored rows.
    sync(&primary, &witness);
    assert_eq!(read(&witness, &want).0, rows(&want, 0.0));
    assert_eq!(read(&witness, &[99, 500]).1, vec![false, false]);
    // ⑤ writes again.
    primary.pause_writes(None);
    primary.assign(&[1], &[0.0; D]).unwrap();
    assert_eq!(
        primary.rollback_write(&[1], &[Some(vec![0.0; 3])]).unwrap_err().kind(),
        ErrorKind::ShapeMismatch
    );
}

#[test]
fn a_restarted_witness_keeps_its_healthy_store_and_drops_its_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (_ps, primary) = syncing(1);
    let ids: Vec<u64> = (0..50).collect();
    primary.assign(&ids, &rows(&ids, 0.0)).unwrap();
    {
        let (_ws, witness) = syncing(2);
        witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap();
        sync(&primary, &witness);
        witness.witness_flush(next_bucket(), &[]).unwrap().unwrap();
        // Flushed twice more, so the file holds several blocks.
        primary.assign(&ids[..5], &rows(&ids[..5], 10.0)).unwrap();
        sync(&primary, &witness);
        witness.witness_flush(next_bucket(), &[]).unwrap().unwrap();
        // Unflushed when it stops: never flushed after the restart (RB4).
        primary.assign(&ids[..3], &rows(&ids[..3], 20.0)).unwrap();
        sync(&primary, &witness);
        assert_eq!(witness.witness_stats().unwrap().logged_keys, 3);
    }
    let file = dir.path().join("t.witness");
    let len = std::fs::metadata(&file).unwrap().len();
    let (_ws, witness) = syncing(3);
    let st = witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap();
    assert_eq!((st.restored_rows, st.healthy_rows, st.logged_keys), (50, 50, 0), "{st:?}");
    assert!(st.t_max_ms > 0);
    // Pulling everything again logs only what is newer than the healthy store.
    sync(&primary, &witness);
    assert_eq!(witness.witness_stats().unwrap().logged_keys, 3);
    let diff = witness.witness_diff(false).unwrap();
    assert_eq!(diff.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(
        diff[1].1.as_deref(),
        Some(&rows(&[1], 10.0)[..]),
        "the healthy row after the restart"
    );
    drop((_ws, witness));

    // A torn last block (a crash while appending) is cut off; the rest loads.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&file, &bytes).unwrap();
    let (_ws, witness) = syncing(4);
    assert_eq!(witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap().healthy_rows, 50);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), len, "cut back to the good part");
    let torn = dir.path().join(format!("t.witness.torn-{len}"));
    assert_eq!(std::fs::read(&torn).unwrap(), vec![200, 0, 0, 0, 1, 2, 3], "the torn end is kept");
    drop((_ws, witness));
    // Damage inside: refused, and the file left as it is.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let (_ws, witness) = syncing(5);
    let e = witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corruption, "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    // Another shape: refused with a way out.
    let store = Store::with_replica(6).unwrap();
    let t = store.create_table(TableConfig::new("t", 8).with_shards(4)).unwrap();
    t.enable_sync(&SyncOptions { parts: PARTS, ..SyncOptions::default() }).unwrap();
    let e = t.witness_start(BUCKET_MS, Some(dir.path())).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

#[test]
fn a_witness_needs_sync_and_starts_once() {
    let store = Store::with_replica(1).unwrap();
    let t = store.create_table(TableConfig::new("t", D)).unwrap();
    assert!(t.witness_start(BUCKET_MS, None).is_err(), "no sync");
    let (_s, w) = syncing(2);
    w.witness_start(BUCKET_MS, None).unwrap();
    assert!(w.witnesses());
    assert_eq!(w.witness_start(BUCKET_MS, None).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(w.witness_stats().unwrap().file_bytes, 0);
}
