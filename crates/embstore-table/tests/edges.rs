//! The edges of a durable store: a damaged manifest never deletes segments, a close that cannot
//! flush keeps the store open, handles of a closed store refuse calls, table names never become
//! paths, `verify` of a live store sees one consistent state, a checkpoint path that is not
//! there is a not-found error.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::segment_files;
use embstore_table::disk::vfs::FaultFs;
use embstore_table::{verify, ErrorKind, OnMiss, Store, TableConfig};

/// A store in `dir` with one table of 1,000 rows, flushed `flushes` times (each flush after
/// new writes adds a segment); returns the MANIFEST's bytes after each flush.
fn store_with_flushes(dir: &Path, flushes: usize) -> Vec<Vec<u8>> {
    let store = Store::open(dir).unwrap();
    let t = store.create_table(TableConfig::new("user", 8)).unwrap();
    let mut manifests = Vec::new();
    for f in 0..flushes {
        let ids: Vec<u64> = (0..1_000).map(|i| i + 1_000 * f as u64).collect();
        t.assign(&ids, &vec![f as f32; ids.len() * 8]).unwrap();
        store.flush().unwrap();
        manifests.push(std::fs::read(dir.join("MANIFEST")).unwrap());
    }
    manifests
}

#[test]
fn a_truncated_manifest_is_corruption_and_deletes_no_segment() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = store_with_flushes(dir.path(), 1);
    let full = manifests.last().unwrap().clone();
    let before = segment_files(dir.path());
    assert_eq!(before.len(), 1);
    // Cut anywhere inside the header or the first record (the snapshot): 40 bytes is the
    // header plus part of that record.
    let first_record_end = {
        let n = u32::from_le_bytes(full[16..20].try_into().unwrap()) as usize;
        16 + 12 + n
    };
    for cut in [0, 10, 16, 20, 28, 40, first_record_end - 1] {
        std::fs::write(dir.path().join("MANIFEST"), &full[..cut]).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corruption, "cut at {cut}: {err}");
        assert!(err.message().contains("MANIFEST"), "cut at {cut}: names the file: {err}");
        assert_eq!(segment_files(dir.path()), before, "cut at {cut}: no segment deleted");
        assert_eq!(std::fs::read(dir.path().join("MANIFEST")).unwrap(), &full[..cut]);
        let report = verify(dir.path(), |_, _| {}).unwrap();
        assert!(!report.damage.is_empty(), "cut at {cut}: verify reports it: {report:?}");
    }
    // Put back, the store opens with its rows.
    std::fs::write(dir.path().join("MANIFEST"), &full).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.table("user").unwrap().len(), 1_000);
}

#[test]
fn segments_the_manifest_cannot_account_for_are_kept_and_the_open_refused() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = store_with_flushes(dir.path(), 3);
    let all = segment_files(dir.path());
    assert_eq!(all.len(), 3);
    // The manifest as of the first flush: two later segments that no record names, where a
    // crash leaves at most one (the flush in flight).
    std::fs::write(dir.path().join("MANIFEST"), &manifests[0]).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    assert!(err.message().contains(&all[1]) && err.message().contains(&all[2]), "{err}");
    assert_eq!(segment_files(dir.path()), all, "nothing deleted");
    let report = verify(dir.path(), |_, _| {}).unwrap();
    assert!(report.damage.iter().any(|d| d.contains("newer")), "{report:?}");
    // As of the second flush: the one segment newer than the manifest is the flush a crash cut
    // short, deleted as before.
    std::fs::write(dir.path().join("MANIFEST"), &manifests[1]).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.recovery().unwrap().orphan_segments, vec![all[2].clone()]);
    assert_eq!(store.table("user").unwrap().len(), 2_000);
}

#[test]
fn an_unknown_file_newer_than_the_manifest_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    store_with_flushes(dir.path(), 1);
    // Not a segment at all, under a seq the manifest never handed out.
    let stray = dir.path().join("seg").join(format!("{:016x}.seg", 1u64 << 40));
    std::fs::write(&stray, vec![7u8; 8192]).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    assert!(stray.exists());
}

#[test]
fn a_close_that_cannot_flush_keeps_the_store_open_and_a_retry_writes_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new(u64::MAX);
    let store = Store::open_with(dir.path(), 0, Arc::new(fs.clone())).unwrap();
    let t = store.create_table(TableConfig::new("a", 4)).unwrap();
    t.assign(&[1, 2, 3], &[1.0; 12]).unwrap();
    fs.set_full(true);
    assert_eq!(store.close().unwrap_err().kind(), ErrorKind::NoSpace);
    // Still open: the handle takes writes, the store takes flushes.
    assert!(!store.is_closed());
    t.assign(&[4], &[2.0; 4]).unwrap();
    assert_eq!(store.close().unwrap_err().kind(), ErrorKind::NoSpace);
    fs.set_full(false);
    store.close().unwrap();
    assert!(store.is_closed());
    store.close().unwrap(); // a no-op
                            // The directory is unlocked at once, and holds every row.
    let again = Store::open(dir.path()).unwrap();
    let mut rows = vec![0.0; 4 * 4];
    again.table("a").unwrap().lookup(&[1, 2, 3, 4], OnMiss::Error, &mut rows, None).unwrap();
    assert_eq!(&rows[12..], &[2.0; 4]);
}

#[test]
fn handles_of_a_closed_store_refuse_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = store.create_table(TableConfig::new("a", 4)).unwrap();
    t.assign(&[1], &[1.0; 4]).unwrap();
    store.close().unwrap();
    let other = Store::open(dir.path()).unwrap();
    let closed = |r: embstore_table::Result<()>, what: &str| {
        let err = r.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed, "{what}: {err}");
    };
    let mut row = vec![0.0; 4];
    closed(t.apply_gradients(&[1], &[1.0; 4], None).map(drop), "apply_gradients");
    closed(t.lookup(&[1], OnMiss::Init, &mut row, None).map(drop), "lookup");
    closed(t.assign(&[2], &[1.0; 4]).map(drop), "assign");
    closed(t.remove(&[1]).map(drop), "remove");
    closed(t.clear().map(drop), "clear");
    closed(store.table("a").map(drop), "store.table");
    closed(store.flush().map(drop), "store.flush");
    closed(store.create_table(TableConfig::new("b", 4)).map(drop), "store.create_table");
    // The other store saw none of it.
    let mut got = vec![0.0; 4];
    other.table("a").unwrap().lookup(&[1], OnMiss::Error, &mut got, None).unwrap();
    assert_eq!(got, vec![1.0; 4]);
}

#[test]
fn table_names_that_could_become_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s")).unwrap();
    for name in ["../../escape", "a/b", "/abs", "a\\b", ".", "..", "a\0b", ""] {
        let err = store.create_table(TableConfig::new(name, 4)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}: {err}");
    }
    let saved = dir.path().join("t.embt");
    let t = store.create_table(TableConfig::new("ok.name-1", 4)).unwrap();
    t.assign(&[1], &[1.0; 4]).unwrap();
    t.save(&saved).unwrap();
    let err = store.load_table(&saved, Some("../x")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(store.tables(), vec!["ok.name-1".to_owned()]);
}

#[test]
fn verify_of_a_store_compacting_in_another_thread_never_reports_damage() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    println!("seed {}", seed.as_nanos() as u64);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let t = store.create_table(TableConfig::new("user", 16)).unwrap();
    let ids: Vec<u64> = (0..20_000).collect();
    t.assign(&ids, &vec![1.0; ids.len() * 16]).unwrap();
    store.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, t, stop) = (store.clone(), t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let some: Vec<u64> = (0..2_000).map(|i| (i * 7 + round * 13) % 20_000).collect();
                t.assign(&some, &vec![round as f32; some.len() * 16]).unwrap();
                store.flush().unwrap();
                if round.is_multiple_of(2) {
                    store.compact(|_, _| {}).unwrap(); // deletes every older segment
                }
                round += 1;
            }
            round
        })
    };
    let (mut restarts, mut walks) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(8);
    while walks < 400 && Instant::now() < deadline {
        let report = verify(dir.path(), |_, _| {}).unwrap();
        assert!(report.damage.is_empty(), "walk {walks}: {:?}", report.damage);
        assert_eq!(report.tables[0].rows, Some(20_000), "walk {walks}");
        restarts += report.restarts;
        walks += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    println!("{rounds} flush rounds, {restarts} restarts over {walks} walks");
}

#[test]
fn a_checkpoint_path_that_is_not_there_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s")).unwrap();
    store.create_table(TableConfig::new("a", 4)).unwrap();
    let err = store.checkpoint(dir.path().join("c"), Some(&dir.path().join("typo"))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err =
        Store::restore(dir.path().join("typo"), dir.path().join("r"), None, |_, _| {}).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}
