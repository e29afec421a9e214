//! Durable stores: reopen gives back the last flush; crashes at every write, fsync, rename and
//! unlink of a scripted workload reopen to what was acknowledged; compaction bounds disk use.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

mod common;

use common::{snapshot_of, Rng};
use embstore_table::disk::vfs::{FaultFs, RealFs, Vfs};
use embstore_table::{ErrorKind, OnMiss, Optimizer, Store, StoreOptions, TableConfig};

/// Every table's rows (sorted by id, with values, state and metadata) and step.
type Snapshot = BTreeMap<String, (Vec<(u64, Vec<f32>, Vec<f32>, String)>, u64)>;

fn snapshot(store: &Store) -> Snapshot {
    let mut out = BTreeMap::new();
    for name in store.tables() {
        let t = store.table(&name).unwrap();
        out.insert(name, (snapshot_of(&t), t.step()));
    }
    out
}

/// Asserts `got == want`, naming the first difference (whole snapshots are too long to print).
fn assert_same(got: &Snapshot, want: &Snapshot, what: &str) {
    let names = |s: &Snapshot| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: tables differ");
    for (name, (rows, step)) in want {
        let (g, gstep) = &got[name];
        assert_eq!(gstep, step, "{what}: step of {name}");
        assert_eq!(g.len(), rows.len(), "{what}: rows of {name}");
        if let Some((a, b)) = g.iter().zip(rows).find(|(a, b)| a != b) {
            panic!("{what}: table {name}: got {a:?}, want {b:?}");
        }
    }
}

fn adam() -> Optimizer {
    Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 }
}

/// One step of the scripted workload on `store` (no file I/O except create/drop/flush).
fn work(store: &Store, rng: &mut Rng, step: usize) -> embstore_table::Result<()> {
    let names = store.tables();
    match step % 7 {
        0 if names.len() < 3 => {
            let name = format!("t{step}");
            let opt = if step.is_multiple_of(2) { adam() } else { Optimizer::Sgd { lr: 0.1 } };
            store.create_table(TableConfig::new(name, 4).with_optimizer(opt).with_shards(2))?;
        }
        6 if names.len() > 2 => store.drop_table(&names[0])?,
        _ => {}
    }
    for name in store.tables() {
        let t = store.table(&name)?;
        let ids = rng.ids(40, 200);
        t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 40 * 4], None)?;
        let grads: Vec<f32> =
            (0..40 * 4).map(|i| ((i as u64 + rng.next()) % 7) as f32 * 0.1).collect();
        t.apply_gradients(&ids, &grads, None)?;
        t.remove(&rng.ids(5, 200))?;
        t.assign(&rng.ids(3, 200), &[0.25; 12])?;
        let meta = embstore_table::RowMeta {
            version: embstore_table::Version { timestamp: (1 << 40) + step as u64, replica: 3 },
            update_count: 9,
            last_update_ms: 0,
        };
        t.import(&rng.ids(2, 200), &[0.75; 8], None, Some(&[meta, meta]))?;
        if rng.next().is_multiple_of(11) {
            t.clear()?;
        }
    }
    Ok(())
}

#[test]
fn reopen_gives_back_the_last_flush_and_a_second_open_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed_0001);
    println!("seed 0x5eed0001");
    let flushed = {
        let store = Store::open(dir.path()).unwrap();
        assert!(store.recovery().unwrap().created);
        let err = Store::open(dir.path()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Locked, "{err}");
        for step in 0..20 {
            work(&store, &mut rng, step).unwrap();
            if step % 5 == 4 {
                store.flush().unwrap();
            }
        }
        store.flush().unwrap();
        let flushed = snapshot(&store);
        // Unflushed work is lost at close.
        work(&store, &mut rng, 22).unwrap(); // 22 % 7: rows only (creates and drops are durable at once)
        flushed
    };
    let store = Store::open(dir.path()).unwrap();
    let report = store.recovery().unwrap();
    assert!(!report.created && report.orphan_segments.is_empty(), "{report:?}");
    assert_same(&snapshot(&store), &flushed, "reopened");
    assert!(!flushed.is_empty());
}

#[test]
fn a_crash_at_any_file_operation_reopens_to_what_was_flushed() {
    // First run without faults to count the file operations of the workload.
    let script = |vfs: Arc<dyn Vfs>, dir: &Path| -> (Vec<Snapshot>, Option<Snapshot>) {
        // Returns the snapshots at each completed flush, and the state at a failed one.
        let mut rng = Rng(0x5eed_0002);
        let mut done = vec![Snapshot::new()];
        let store = match Store::open_with(dir, 0, vfs) {
            Ok(s) => s,
            Err(_) => return (done, None),
        };
        for step in 0..24 {
            if work(&store, &mut rng, step).is_err() {
                return (done, Some(snapshot(&store)));
            }
            if step % 3 == 2 {
                let at = snapshot(&store);
                if store.flush().is_err() {
                    return (done, Some(at));
                }
                done.push(at);
            }
        }
        (done, None)
    };
    let dir = tempfile::tempdir().unwrap();
    let counter = FaultFs::new(u64::MAX);
    let (all, _) = script(Arc::new(counter.clone()), dir.path());
    let total = counter.ops();
    println!("seed 0x5eed0002: {total} file operations, {} flushes", all.len() - 1);
    assert!(total > 50 && all.len() > 5);
    for fail_at in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(fail_at);
        let (done, failed) = script(Arc::new(fs.clone()), dir.path());
        fs.crash().unwrap();
        let store = Store::open_with(dir.path(), 0, Arc::new(RealFs))
            .unwrap_or_else(|e| panic!("fault at op {fail_at}: reopen failed: {e}"));
        let got = snapshot(&store);
        let last = done.last().unwrap();
        match &failed {
            None => assert_same(&got, last, &format!("fault at op {fail_at}")),
            // Creating and dropping tables is durable at once; a flush is durable table by
            // table, so each table must hold its rows of the last flush or of the failed one
            // (a table created since the last flush: no rows).
            Some(at) => {
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    at.keys().collect::<Vec<_>>(),
                    "fault at op {fail_at}"
                );
                for (name, rows) in &got {
                    let ok = Some(rows) == last.get(name)
                        || Some(rows) == at.get(name)
                        || (!last.contains_key(name) && rows.0.is_empty());
                    assert!(
                        ok,
                        "fault at op {fail_at}: table {name} matches no acknowledged state"
                    );
                }
            }
        }
    }
}

#[test]
fn compaction_keeps_disk_use_within_twice_the_live_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = store
        .create_table(TableConfig::new("churn", 8).with_optimizer(Optimizer::Sgd { lr: 0.1 }))
        .unwrap();
    let ids: Vec<u64> = (0..50_000).collect();
    let mut rng = Rng(0x5eed_0003);
    let mut worst: f64 = 0.0;
    let mut compactions = 0;
    for round in 0..20 {
        let hot = rng.ids(30_000, 50_000);
        if round == 0 {
            t.assign(&ids, &vec![1.0; ids.len() * 8]).unwrap();
        } else {
            t.apply_gradients(&hot, &vec![0.5; hot.len() * 8], None).unwrap();
        }
        let st = store.flush().unwrap();
        compactions += st.compactions + st.compacted_segments;
        let disk: u64 = std::fs::read_dir(dir.path().join("seg"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let live = t.len() as u64 * embstore_table_record_bytes(8, 0);
        worst = worst.max(disk as f64 / live as f64);
    }
    println!("worst disk / live: {worst:.2}, compactions: {compactions}");
    assert!(compactions > 0);
    // 2× live after a rewrite, plus at most the flush that triggered it.
    assert!(worst <= 2.0 + 0.7, "disk reached {worst:.2}× the live rows");
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.table("churn").unwrap().len(), 50_000);
}

fn embstore_table_record_bytes(dim: u64, state: u64) -> u64 {
    (40 + 4 * (dim + state) + 4).next_multiple_of(64)
}

#[test]
fn clear_load_and_drop_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.embt");
    {
        let store = Store::open(dir.path().join("store")).unwrap();
        let t = store.create_table(TableConfig::new("a", 2)).unwrap();
        t.assign(&[1, 2, 3], &[1.0; 6]).unwrap();
        store.flush().unwrap();
        t.save(&file).unwrap();
        t.clear().unwrap();
        t.assign(&[9], &[9.0; 2]).unwrap();
        store.create_table(TableConfig::new("gone", 2)).unwrap().assign(&[1], &[1.0; 2]).unwrap();
        store.flush().unwrap();
        store.drop_table("gone").unwrap();
        store.load_table(&file, Some("copy")).unwrap();
        store.flush().unwrap();
    }
    let store = Store::open(dir.path().join("store")).unwrap();
    assert_eq!(store.tables(), vec!["a".to_owned(), "copy".to_owned()]);
    let a = store.table("a").unwrap();
    let mut found = [false];
    a.contains(&[9], &mut found).unwrap();
    assert_eq!((a.len(), found[0]), (1, true));
    assert_eq!(store.table("copy").unwrap().len(), 3);
    // Every superseded or dropped segment was deleted.
    let files = std::fs::read_dir(dir.path().join("store/seg")).unwrap().count();
    assert_eq!(files, 2);
}

#[test]
fn a_missing_or_damaged_manifest_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.create_table(TableConfig::new("a", 2)).unwrap().assign(&[1], &[1.0; 2]).unwrap();
        store.flush().unwrap();
    }
    let manifest = dir.path().join("MANIFEST");
    let bytes = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption);
    assert!(err.message().contains("MANIFEST is missing"), "{err}");
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&99u32.to_le_bytes());
    let crc = crc32fast::hash(&newer[..12]);
    newer[12..16].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&manifest, &newer).unwrap();
    assert_eq!(Store::open(dir.path()).unwrap_err().kind(), ErrorKind::Unsupported);
    std::fs::write(&manifest, &bytes).unwrap();
    assert_eq!(Store::open(dir.path()).unwrap().table("a").unwrap().len(), 1);
}

#[test]
fn checkpoints_full_and_incremental_restore_onto_another_shard_count() {
    let root = tempfile::tempdir().unwrap();
    let (dir, c1, c2, c3) = (
        root.path().join("store"),
        root.path().join("c1"),
        root.path().join("c2"),
        root.path().join("c3"),
    );
    let mut rng = Rng(0x5eed_0004);
    println!("seed 0x5eed0004");
    let store = Store::open(&dir).unwrap();
    let mut at = Vec::new();
    for step in 0..9 {
        work(&store, &mut rng, step).unwrap();
    }
    let full = store.checkpoint(&c1, None).unwrap();
    at.push(snapshot(&store));
    for step in 9..15 {
        work(&store, &mut rng, step).unwrap();
    }
    let inc = store.checkpoint(&c2, Some(&c1)).unwrap();
    assert_eq!(inc.parent_id, full.id);
    assert!(inc.segments < full.segments + 10);
    at.push(snapshot(&store));
    store.table(&store.tables()[0]).unwrap().clear().unwrap(); // supersedes the parent's files
    for step in 15..20 {
        work(&store, &mut rng, step).unwrap();
    }
    store.checkpoint(&c3, Some(&c2)).unwrap();
    at.push(snapshot(&store));
    // A checkpoint needs a new or empty directory.
    assert_eq!(store.checkpoint(&c1, None).unwrap_err().kind(), ErrorKind::InvalidArgument);
    for (i, ckpt) in [&c1, &c2, &c3].into_iter().enumerate() {
        for shards in [1, 16] {
            let dest = root.path().join(format!("restored-{i}-{shards}"));
            let mut calls = 0;
            let restored = Store::restore(ckpt, &dest, Some(shards), |_, _| calls += 1).unwrap();
            assert_same(
                &snapshot(&restored),
                &at[i],
                &format!("restore of checkpoint {i} on {shards} shards"),
            );
            for name in restored.tables() {
                assert_eq!(restored.table(&name).unwrap().config().num_shards, shards);
            }
            drop(restored);
            // The restored store is a store: it reopens to the same rows.
            assert_same(&snapshot(&Store::open(&dest).unwrap()), &at[i], "reopened restore");
        }
    }
    // A chain with a gap: the middle checkpoint is gone.
    std::fs::rename(&c2, root.path().join("elsewhere")).unwrap();
    let err = Store::restore(&c3, root.path().join("r-gap"), None, |_, _| {}).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Corruption);
    assert!(err.message().contains("gap"), "{err}");
    // A store directory is not a checkpoint; a checkpoint of another store is not a parent.
    let err = Store::restore(&dir, root.path().join("r-store"), None, |_, _| {}).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let other = Store::open(root.path().join("other")).unwrap();
    let err = other.checkpoint(root.path().join("c-other"), Some(&c1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // Checkpoints verify clean.
    let report = embstore_table::verify(&c3, |_, _| {}).unwrap();
    assert!(report.damage.is_empty() && report.checkpoint.is_some(), "{report:?}");
    // A serving shard of a table of a checkpoint chain: exactly the table's rows of that shard
    // (values, state, metadata) and its step; together the shards hold every row once.
    std::fs::rename(root.path().join("elsewhere"), &c2).unwrap();
    for (name, (rows, step)) in &at[2] {
        let mut union = Vec::new();
        for shard in 0..4 {
            let t = embstore_table::load_checkpoint_shard(&c3, name, shard, 4).unwrap();
            assert_eq!(t.step(), *step, "step of {name}");
            let got = snapshot_of(&t);
            assert!(got.iter().all(|r| embstore_table::shard_of_key(r.0, 4) == shard));
            union.extend(got);
        }
        union.sort_by_key(|r| r.0);
        assert_eq!(&union, rows, "the shards of {name} together");
        let whole = embstore_table::load_checkpoint_shard(&c3, name, 0, 1).unwrap();
        assert_eq!(&snapshot_of(&whole), rows, "{name} as one shard");
        // The budgeted load of each shard (linked segments, keys from the footers) holds the
        // same rows as the load into memory, under a budget far below the table.
        let budget = embstore_table::Budget::shared(4 << 10).unwrap();
        let options = StoreOptions::default().with_shared_budget(budget.clone());
        for shard in 0..4 {
            let part = root.path().join(format!("part-{name}-{shard}"));
            let (s, t) =
                embstore_table::open_checkpoint_shard(&c3, name, shard, 4, &part, &options)
                    .unwrap();
            assert!(t.is_tiered());
            let want = embstore_table::load_checkpoint_shard(&c3, name, shard, 4).unwrap();
            assert_eq!(snapshot_of(&t), snapshot_of(&want), "budgeted shard {shard} of {name}");
            assert_eq!(t.step(), *step);
            // Lookups bring rows in; ids of other shards are not found.
            let ids: Vec<u64> = rows.iter().map(|r| r.0).collect();
            let mut out = vec![0.0; ids.len() * t.dim()];
            let mut found = vec![false; ids.len()];
            t.lookup(&ids, OnMiss::Zeros, &mut out, Some(&mut found)).unwrap();
            for (i, (id, values, _, _)) in rows.iter().enumerate() {
                let mine = embstore_table::shard_of_key(*id, 4) == shard;
                assert_eq!(found[i], mine, "id {id} in shard {shard}");
                let want = if mine { values.clone() } else { vec![0.0; t.dim()] };
                assert_eq!(&out[i * t.dim()..][..t.dim()], &want[..], "id {id}");
            }
            drop((s, t));
            // The parts gave their bytes back to the shared budget.
            assert_eq!(budget.used(), 0, "budget after dropping shard {shard}");
        }
    }
    let err = embstore_table::open_checkpoint_shard(
        &c3,
        &store.tables()[0],
        0,
        1,
        &root.path().join("no-budget"),
        &StoreOptions::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let name = &store.tables()[0];
    let err = embstore_table::load_checkpoint_shard(&c3, "nope", 0, 1).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::TableNotFound);
    for (shard, of) in [(0, 3), (4, 4)] {
        let err = embstore_table::load_checkpoint_shard(&c3, name, shard, of).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "shard {shard} of {of}");
    }
}

#[test]
fn verify_finds_a_flipped_byte_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let t = store.create_table(TableConfig::new("a", 4)).unwrap();
        t.assign(&(0..1000).collect::<Vec<_>>(), &vec![0.5; 4000]).unwrap();
        store.flush().unwrap();
    }
    let report = embstore_table::verify(dir.path(), |_, _| {}).unwrap();
    assert!(report.damage.is_empty());
    assert_eq!(report.tables[0].rows, Some(1000));
    let seg = std::fs::read_dir(dir.path().join("seg")).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[4096 + 64 * 300 + 50] ^= 0x20; // inside a record's values
    std::fs::write(&seg, &bytes).unwrap();
    let report = embstore_table::verify(dir.path(), |_, _| {}).unwrap();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    assert!(report.damage[0].contains("fails its checksum"), "{:?}", report.damage);
    // Opening the store refuses the damaged file instead of serving a wrong value.
    assert_eq!(Store::open(dir.path()).unwrap_err().kind(), ErrorKind::Corruption);
}

#[test]
fn a_full_disk_is_a_no_space_error_and_flushing_resumes_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultFs::new(u64::MAX);
    let store = Store::open_with(dir.path(), 0, Arc::new(fs.clone())).unwrap();
    let t = store.create_table(TableConfig::new("a", 4)).unwrap();
    t.assign(&[1, 2, 3], &[1.0; 12]).unwrap();
    store.flush().unwrap();
    t.assign(&[4, 5], &[2.0; 8]).unwrap();
    t.remove(&[1]).unwrap();
    fs.set_full(true);
    let err = store.flush().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
    // Still serving, nothing lost in memory; a second attempt fails the same way.
    assert_eq!(t.len(), 4);
    assert_eq!(store.flush().unwrap_err().kind(), ErrorKind::NoSpace);
    t.assign(&[6], &[3.0; 4]).unwrap();
    fs.set_full(false);
    store.flush().unwrap();
    let want = snapshot(&store);
    drop(store);
    assert_same(&snapshot(&Store::open(dir.path()).unwrap()), &want, "after the disk was freed");
}

/// Options for the manifest-failure tests: none, or a memory budget small enough that rows
/// leave memory (evictions on the calling thread).
fn failure_options(budget: bool) -> StoreOptions {
    match budget {
        false => StoreOptions::default(),
        true => {
            StoreOptions::default().with_memory_budget(12 << 10).with_background_eviction(false)
        }
    }
}

/// A nearly full disk: a small segment still fits, the manifest's append and then its rewrite
/// do not (each write fails part-way). Flushes fail, one after another, and then the machine
/// stops: the reopened store holds what the last flush that returned wrote, and opens.
#[test]
fn failed_manifest_appends_and_rewrites_then_a_crash_reopen_to_what_was_flushed() {
    for budget in [false, true] {
        for failures in 1..=4u64 {
            let what = format!("budget {budget}, {failures} failed flush(es)");
            let dir = tempfile::tempdir().unwrap();
            let fs = FaultFs::new(u64::MAX);
            let store = Store::open_with_options(
                dir.path(),
                &failure_options(budget),
                Arc::new(fs.clone()),
            )
            .unwrap();
            let t = store.create_table(TableConfig::new("a", 4).with_shards(2)).unwrap();
            let ids: Vec<u64> = (0..400).collect();
            t.assign(&ids, &vec![1.0; 4 * ids.len()]).unwrap();
            store.flush().unwrap();
            let flushed = snapshot(&store);
            fs.set_full_for(Some("MANIFEST"));
            for i in 0..failures {
                // With a budget a write may have to evict, and eviction writes a segment: it
                // fails the same way.
                let writes = t
                    .assign(&[1000 + i, 7], &[2.0 + i as f32; 8])
                    .and_then(|()| t.remove(&[100 + i]).map(drop));
                if let Err(e) = writes {
                    assert!(budget && e.kind() == ErrorKind::NoSpace, "{what}: {e}");
                }
                let err = store.flush().unwrap_err();
                assert_eq!(err.kind(), ErrorKind::NoSpace, "{what}: {err}");
            }
            drop(store);
            fs.crash().unwrap();
            let store =
                Store::open_with_options(dir.path(), &failure_options(budget), Arc::new(RealFs))
                    .unwrap_or_else(|e| panic!("{what}: reopen refused: {e}"));
            assert_same(&snapshot(&store), &flushed, &what);
            // What the failed flushes left is provably superseded and was deleted.
            let report = store.recovery().unwrap();
            assert!(report.orphan_segments.len() <= 1, "{what}: {report:?}");
            let report = embstore_table::verify(dir.path(), |_, _| {}).unwrap();
            assert!(report.damage.is_empty(), "{what}: {:?}", report.damage);
            assert!(report.unaccounted_segments.is_empty(), "{what}: {report:?}");
        }
    }
}

/// A removal goes into the segment of the flush after it; when that segment's manifest record
/// fails, the removal must be written by the next flush, or the row comes back on reopen.
#[test]
fn a_removal_whose_manifest_append_failed_is_written_by_the_next_flush() {
    for budget in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(u64::MAX);
        let store =
            Store::open_with_options(dir.path(), &failure_options(budget), Arc::new(fs.clone()))
                .unwrap();
        let t = store.create_table(TableConfig::new("a", 4).with_shards(2)).unwrap();
        let ids: Vec<u64> = (0..400).collect();
        t.assign(&ids, &vec![1.0; 4 * ids.len()]).unwrap();
        store.flush().unwrap();
        assert!(t.remove(&[1, 2, 300]).unwrap() > 0);
        fs.set_full_for(Some("MANIFEST"));
        let err = store.flush().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoSpace, "budget {budget}: {err}");
        fs.set_full_for(None);
        store.flush().unwrap();
        let want = snapshot(&store);
        assert_eq!(want["a"].0.len(), 397, "budget {budget}");
        drop(store);
        let store =
            Store::open_with_options(dir.path(), &failure_options(budget), Arc::new(RealFs))
                .unwrap();
        let got = snapshot(&store);
        let back: Vec<u64> =
            got["a"].0.iter().map(|r| r.0).filter(|k| [1, 2, 300].contains(k)).collect();
        assert!(back.is_empty(), "budget {budget}: removed rows {back:?} came back on reopen");
        assert_same(&got, &want, &format!("budget {budget}"));
    }
}

/// A directory whose manifest cannot account for its segments (several newer than every
/// record, as an older build left behind failed manifest writes, or a manifest that lost
/// records): `verify` names the files that are safe to remove apart from the unaccounted ones,
/// and opening refuses, naming both.
#[test]
fn verify_of_a_manifest_that_lost_records_says_which_files_are_safe_to_remove() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("MANIFEST");
    let seg_dir = dir.path().join("seg");
    let seg_names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&seg_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let (before, old) = {
        let store = Store::open(dir.path()).unwrap();
        let t = store.create_table(TableConfig::new("a", 4)).unwrap();
        t.assign(&[1, 2, 3], &[1.0; 12]).unwrap();
        store.flush().unwrap();
        let old = std::fs::read(&manifest).unwrap();
        let before = seg_names();
        for i in 0..2u64 {
            t.assign(&[10 + i], &[2.0; 4]).unwrap();
            store.flush().unwrap();
        }
        (before, old)
    };
    let all = seg_names();
    let newer: Vec<String> = all.iter().filter(|n| !before.contains(n)).cloned().collect();
    assert_eq!(newer.len(), 2, "{all:?}");
    // The manifest as it was before the two newer segments, and a superseded leftover (seq 0,
    // below every seq the manifest handed out).
    std::fs::write(&manifest, &old).unwrap();
    let leftover = "0000000000000000.seg".to_owned();
    std::fs::copy(seg_dir.join(&before[0]), seg_dir.join(&leftover)).unwrap();

    let report = embstore_table::verify(dir.path(), |_, _| {}).unwrap();
    assert_eq!(report.orphan_segments, vec![leftover.clone()], "{report:?}");
    assert_eq!(report.unaccounted_segments, newer, "{report:?}");
    assert_eq!(report.damage.len(), 1, "{:?}", report.damage);
    let line = &report.damage[0];
    assert!(line.contains(&format!("Safe to remove (superseded): {leftover}")), "{line}");
    assert!(line.contains(&format!("not safe to delete: {}", newer.join(", "))), "{line}");
    assert!(line.contains("moving them aside opens the store"), "{line}");
    // inspect says the same without reading every record.
    let report = embstore_table::inspect(dir.path()).unwrap();
    assert_eq!(
        (report.orphan_segments, report.unaccounted_segments),
        (vec![leftover.clone()], newer.clone())
    );
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&newer[0]) && msg.contains(&newer[1]), "{msg}");
    assert!(msg.contains(&format!("{leftover} the manifest proves superseded")), "{msg}");
    assert!(seg_dir.join(&leftover).exists(), "nothing is deleted when the open is refused");
    // Moving the unaccounted files aside opens the store at the manifest's state.
    for n in &newer {
        std::fs::rename(seg_dir.join(n), dir.path().join(n)).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.table("a").unwrap().len(), 3);
    assert_eq!(store.recovery().unwrap().orphan_segments, vec![leftover]);
}

#[test]
fn a_crash_with_a_memory_budget_keeps_every_row_at_a_flushed_or_later_value() {
    // With a budget, evictions write segments between flushes, so after a crash a row may hold
    // any value it had from the last flush on: each reopened row must equal that row (or its
    // absence) in one of the states the store went through since the last completed flush.
    use embstore_table::StoreOptions;
    // Evictions on the calling thread: the N-th file operation is the same one in every run.
    let options =
        StoreOptions::default().with_memory_budget(12 << 10).with_background_eviction(false);
    let script = |vfs: Arc<dyn Vfs>, dir: &Path| -> Vec<Snapshot> {
        // Rows change several times within a step, and an eviction after any call may make
        // that value durable: the states are taken after every call.
        let mut rng = Rng(0x5eed_0005);
        let mut states = vec![Snapshot::new()];
        let Ok(store) = Store::open_with_options(dir, &options, vfs) else { return states };
        let Ok(t) =
            store.create_table(TableConfig::new("t", 4).with_optimizer(adam()).with_shards(2))
        else {
            return states;
        };
        states.push(snapshot(&store));
        for step in 0..30 {
            let ids = rng.ids(30, 300);
            let grads: Vec<f32> =
                (0..30 * 4).map(|i| ((i as u64 + rng.next()) % 7) as f32 * 0.1).collect();
            let calls: [&dyn Fn() -> embstore_table::Result<()>; 4] = [
                &|| t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 30 * 4], None),
                &|| t.apply_gradients(&ids, &grads, None).map(drop),
                &|| t.remove(&ids[..3]).map(drop),
                &|| t.assign(&ids[3..5], &[0.25; 8]),
            ];
            for call in calls {
                call().unwrap();
                states.push(snapshot(&store));
            }
            if step % 4 == 3 {
                if store.flush().is_err() {
                    return states;
                }
                states = vec![snapshot(&store)];
            }
        }
        states
    };
    let counter = FaultFs::new(u64::MAX);
    let dir = tempfile::tempdir().unwrap();
    script(Arc::new(counter.clone()), dir.path());
    let total = counter.ops();
    println!("seed 0x5eed0005: {total} file operations with a 12 KiB budget");
    // Flushes alone take ~40: the rest are evictions writing segments.
    assert!(total > 80, "only {total} file operations: the budget does not make rows leave");
    for fail_at in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(fail_at);
        let states = script(Arc::new(fs.clone()), dir.path());
        fs.crash().unwrap();
        let store = Store::open_with_options(dir.path(), &options, Arc::new(RealFs))
            .unwrap_or_else(|e| panic!("fault at op {fail_at}: reopen failed: {e}"));
        let got = snapshot(&store);
        for (name, (rows, _)) in &got {
            for row in rows {
                let ok = states.iter().any(|s| s.get(name).is_some_and(|(r, _)| r.contains(row)));
                assert!(
                    ok,
                    "fault at op {fail_at}: table {name} row {} holds a value it never had",
                    row.0
                );
            }
            // A row present in every state since the flush cannot have vanished.
            let last = &states[0];
            if let Some((rows0, _)) = last.get(name) {
                for r in rows0 {
                    let always = states
                        .iter()
                        .all(|s| s.get(name).is_some_and(|(rs, _)| rs.iter().any(|x| x.0 == r.0)));
                    if always {
                        assert!(
                            rows.iter().any(|x| x.0 == r.0),
                            "fault at op {fail_at}: row {} of {name} vanished",
                            r.0
                        );
                    }
                }
            }
        }
    }
}

/// Bytes of the segment files in `dir`.
fn seg_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("seg")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

#[test]
fn a_flush_after_many_overwrites_writes_what_changed_not_the_whole_table() {
    // 100k rows, then 40 flushes of 5,000 overwrites each (uniform: the worst case for picking
    // stale files). Records on disk pass 2× the live rows by the 20th flush: a flush that then
    // rewrote the whole table would write 100k records.
    let root = tempfile::tempdir().unwrap();
    let (dir, c1, c2) = (root.path().join("s"), root.path().join("c1"), root.path().join("c2"));
    let store = Store::open(&dir).unwrap();
    let t = store
        .create_table(TableConfig::new("t", 8).with_optimizer(Optimizer::Sgd { lr: 0.1 }))
        .unwrap();
    let n = 100_000u64;
    let ids: Vec<u64> = (0..n).collect();
    t.assign(&ids, &vec![1.0; ids.len() * 8]).unwrap();
    store.flush().unwrap();
    store.checkpoint(&c1, None).unwrap();
    let mut rng = Rng(0x5eed_0007);
    println!("seed 0x5eed0007");
    let (mut worst, mut steady, mut most, mut compacted) = (0f64, 0f64, 0u64, 0u64);
    for round in 0..40 {
        let hot = rng.ids(5_000, n);
        t.apply_gradients(&hot, &vec![0.5; hot.len() * 8], None).unwrap();
        t.remove(&rng.ids(20, n)).unwrap();
        t.assign(&rng.ids(20, n + 1_000), &[0.25; 20 * 8]).unwrap();
        let dirty = {
            let mut u = hot.clone();
            u.sort_unstable();
            u.dedup();
            u.len() as u64 + 40
        };
        let st = store.flush().unwrap();
        assert_eq!(st.compactions, 0, "round {round}: the whole table was rewritten");
        // The flush's records and at most max(2× its records, 4,096) more from compaction (four
        // times that in the step that finishes a file drained over several flushes).
        assert!(
            st.records <= dirty + 4 * (2 * dirty).max(4096),
            "round {round}: a flush of {dirty} changed rows wrote {} records",
            st.records
        );
        most = most.max(st.records);
        compacted += st.compacted_segments;
        // A live row takes a record and a 24-byte footer entry.
        let live = t.len() as u64 * (embstore_table_record_bytes(8, 0) + 24);
        let ratio = seg_bytes(&dir) as f64 / live as f64;
        worst = worst.max(ratio);
        if round >= 25 {
            steady = steady.max(ratio);
        }
    }
    println!("worst disk / live {worst:.2}, most records in a flush {most}, files compacted {compacted}, steady {steady:.2}");
    assert!(compacted > 5, "no stale file was compacted");
    // Compaction runs from 1.5× the live rows; the first flush's file, drained over several
    // flushes, is finished before disk use passes 2× (plus 4 KiB headers and the last flush).
    assert!(steady <= 1.75, "disk stayed at {steady:.2}x the live rows");
    assert!(worst <= 2.05, "disk reached {worst:.2}x the live rows");
    // An incremental checkpoint over files compaction deleted restores to the same rows.
    store.checkpoint(&c2, Some(&c1)).unwrap();
    let want = snapshot(&store);
    let restored = Store::restore(&c2, root.path().join("r"), None, |_, _| {}).unwrap();
    assert_same(&snapshot(&restored), &want, "restored incremental checkpoint");
    drop((t, store));
    let store = Store::open(&dir).unwrap();
    assert!(store.recovery().unwrap().orphan_segments.is_empty());
    assert_same(&snapshot(&store), &want, "reopened");
    // Reopened, the store indexes its files again over the next flushes and goes on compacting.
    let t = store.table("t").unwrap();
    let mut compacted = 0;
    for _ in 0..15 {
        let hot = rng.ids(5_000, n);
        t.apply_gradients(&hot, &vec![0.5; hot.len() * 8], None).unwrap();
        let st = store.flush().unwrap();
        assert!(st.compactions == 0 && st.records <= 5_000 + 4 * 10_000, "{st:?}");
        compacted += st.compacted_segments;
        let live = t.len() as u64 * (embstore_table_record_bytes(8, 0) + 24);
        worst = worst.max(seg_bytes(&dir) as f64 / live as f64);
    }
    assert!(compacted > 0 && worst <= 2.05, "after reopen: {compacted} files, {worst:.2}x");
    let want = snapshot(&store);
    drop(t);
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_same(&snapshot(&store), &want, "reopened after compacting again");
    // Store::compact still rewrites every table whole.
    let st = store.compact(|_, _| {}).unwrap();
    assert_eq!(st.compactions, 1);
    // One record and one 24-byte footer entry a row.
    let whole = n * (embstore_table_record_bytes(8, 0) + 24);
    assert!(seg_bytes(&dir) <= whole + whole / 50, "{} bytes after compact", seg_bytes(&dir));
}

#[test]
fn a_crash_during_incremental_compaction_reopens_to_what_was_flushed() {
    // 30k rows, then flushes of ~8k overwrites with removals and new rows: from the third
    // flush on each flush runs a compaction step (records on disk pass 1.5× the live rows and
    // 64Ki). A crash at every file operation from the first step on reopens to what was flushed.
    // Returns the snapshots at each completed flush, the state at a failed one, and the file
    // operations before the first flush that compacted.
    let script = |fs: &FaultFs, dir: &Path| -> (Vec<Snapshot>, Option<Snapshot>, u64) {
        let mut rng = Rng(0x5eed_0008);
        let mut done = vec![Snapshot::new()];
        let mut first = 0;
        let Ok(store) = Store::open_with(dir, 0, Arc::new(fs.clone())) else {
            return (done, None, 0);
        };
        let config = TableConfig::new("t", 4).with_optimizer(adam()).with_shards(2);
        let Ok(t) = store.create_table(config) else {
            return (done, Some(Snapshot::new()), 0);
        };
        for round in 0..12 {
            let mut step = || -> embstore_table::Result<()> {
                if round == 0 {
                    let ids: Vec<u64> = (0..30_000).collect();
                    return t.assign(&ids, &vec![1.0; ids.len() * 4]);
                }
                let ids = rng.ids(8_000, 30_000);
                t.apply_gradients(&ids, &vec![0.5; ids.len() * 4], None)?;
                t.remove(&rng.ids(300, 30_000))?;
                t.assign(&rng.ids(300, 31_000), &[0.25; 300 * 4])
            };
            if step().is_err() {
                return (done, Some(snapshot(&store)), first);
            }
            let at = snapshot(&store);
            let before = fs.ops();
            match store.flush() {
                Ok(st) if st.compacted_segments > 0 && first == 0 => first = before,
                Ok(_) => {}
                Err(_) => return (done, Some(at), first),
            }
            done.push(at);
        }
        (done, None, first)
    };
    let dir = tempfile::tempdir().unwrap();
    let counter = FaultFs::new(u64::MAX);
    let (all, _, first) = script(&counter, dir.path());
    let total = counter.ops();
    println!(
        "seed 0x5eed0008: {total} file operations, {} flushes, from op {first}",
        all.len() - 1
    );
    assert!(first > 0 && all.len() == 13, "the workload must compact");
    // Earlier operations are those of plain flushes (the test above covers them).
    for fail_at in first..=total {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(fail_at);
        let (done, failed, _) = script(&fs, dir.path());
        fs.crash().unwrap();
        let store = Store::open_with(dir.path(), 0, Arc::new(RealFs))
            .unwrap_or_else(|e| panic!("fault at op {fail_at}: reopen failed: {e}"));
        let got = snapshot(&store);
        let last = done.last().unwrap();
        // Before the first flush: the table may exist (created, durable at once) or not, empty.
        let empty = done.len() == 1 && got.values().all(|(rows, _)| rows.is_empty());
        let ok = &got == last || failed.as_ref() == Some(&got) || empty;
        if !ok {
            assert_same(&got, last, &format!("fault at op {fail_at}"));
        }
    }
}

#[test]
fn writes_during_compaction_steps_never_take_a_row_back_past_the_last_flush() {
    // One writer assigns every row a value that only grows (its round number) while the main
    // thread flushes; compaction steps copy rows as they are at that moment. After the last
    // flush the store is dropped unflushed and reopened: every row must hold a value at or
    // after the one it had when the last flush began, and never one it did not have.
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let config = TableConfig::new("t", 4).with_optimizer(Optimizer::Sgd { lr: 0.1 });
    let t = store.create_table(config.with_shards(4)).unwrap();
    let n = 40_000u64;
    let ids: Vec<u64> = (0..n).collect();
    t.assign(&ids, &vec![0.0; ids.len() * 4]).unwrap();
    store.flush().unwrap();
    let values = |t: &embstore_table::Table| -> Vec<f32> {
        let mut out = vec![0.0; ids.len() * 4];
        t.lookup(&ids, OnMiss::Error, &mut out, None).unwrap();
        out.chunks(4).map(|r| r[0]).collect()
    };
    let stop = AtomicBool::new(false);
    let (lower, last, compacted) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rng = Rng(0x5eed_0009);
            for round in 1..200_000u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let some = rng.ids(4_000, n);
                t.assign(&some, &vec![round as f32; some.len() * 4]).unwrap();
            }
        });
        let (mut lower, mut compacted) = (Vec::new(), 0);
        let started = std::time::Instant::now();
        for _ in 0..12 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            lower = values(&t); // what the flush below must keep, at least
            compacted += store.flush().unwrap().compacted_segments;
            if started.elapsed() > std::time::Duration::from_secs(60) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        (lower, values(&t), compacted)
    });
    println!("seed 0x5eed0009: {compacted} files compacted");
    assert!(compacted > 0, "no compaction step ran");
    drop(t);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let got = values(&store.table("t").unwrap());
    for i in 0..ids.len() {
        assert!(
            lower[i] <= got[i] && got[i] <= last[i],
            "row {i}: {} after reopen, {} when the last flush began, {} at the end",
            got[i],
            lower[i],
            last[i]
        );
    }
}

/// The names under `dir` (none when it does not exist), sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn a_store_in_memory_checkpoints_as_a_store_in_a_directory_does() {
    let root = tempfile::tempdir().unwrap();
    let ckpt = root.path().join("ckpt");
    let mut rng = Rng(0x5eed_0046);
    println!("seed 0x5eed0046");
    let store = Store::new();
    for step in 0..12 {
        work(&store, &mut rng, step).unwrap();
    }
    store.create_table(TableConfig::new("empty", 3).with_optimizer(adam())).unwrap();
    store.table(&store.tables()[0]).unwrap().set_step(41);
    let want = snapshot(&store);
    assert!(want.values().filter(|(rows, _)| !rows.is_empty()).count() >= 2, "{want:?}");
    let mut calls = Vec::new();
    let report = store.checkpoint_with_progress(&ckpt, None, |d, t| calls.push((d, t))).unwrap();
    let rows: u64 = want.values().map(|(r, _)| r.len() as u64).sum();
    assert_eq!(calls.last(), Some(&(rows, rows)), "progress ends at every row");
    assert_eq!((report.tables, report.parent_id), (want.len(), 0));
    assert!(report.segments >= 2 && report.bytes > 0, "{report:?}");
    // Restore reads it as any checkpoint: every table, its config, rows with state and
    // metadata, and its step; on the saved shard count or another.
    for shards in [None, Some(1), Some(16)] {
        let dest = root.path().join(format!("restored-{shards:?}"));
        let restored = Store::restore(&ckpt, &dest, shards, |_, _| {}).unwrap();
        assert_same(&snapshot(&restored), &want, &format!("restore on {shards:?} shards"));
        for name in restored.tables() {
            let (got, src) = (restored.table(&name).unwrap(), store.table(&name).unwrap());
            let mut config = src.config().clone();
            config.num_shards = shards.unwrap_or(config.num_shards);
            assert_eq!(got.config(), &config, "config of {name}");
        }
        drop(restored);
        assert_same(&snapshot(&Store::open(&dest).unwrap()), &want, "reopened restore");
    }
    // inspect and verify read it; serving loads its shards.
    let report = embstore_table::verify(&ckpt, |_, _| {}).unwrap();
    assert!(report.damage.is_empty() && report.checkpoint.is_some(), "{report:?}");
    let inspected = embstore_table::inspect(&ckpt).unwrap();
    assert_eq!(inspected.checkpoint.map(|c| c.1), Some(0));
    for t in &inspected.tables {
        assert_eq!(t.rows, Some(want[&t.name].0.len() as u64), "rows of {}", t.name);
        assert_eq!(t.step, want[&t.name].1, "step of {}", t.name);
    }
    for (name, (rows, step)) in &want {
        let mut union = Vec::new();
        for shard in 0..2 {
            let t = embstore_table::load_checkpoint_shard(&ckpt, name, shard, 2).unwrap();
            assert_eq!(t.step(), *step);
            union.extend(snapshot_of(&t));
        }
        union.sort_by_key(|r| r.0);
        assert_eq!(&union, rows, "the shards of {name} together");
        let budget = embstore_table::Budget::shared(4 << 10).unwrap();
        let options = StoreOptions::default().with_shared_budget(budget);
        let part = root.path().join(format!("part-{name}"));
        let (_s, t) =
            embstore_table::open_checkpoint_shard(&ckpt, name, 0, 1, &part, &options).unwrap();
        assert_eq!(&snapshot_of(&t), rows, "budgeted load of {name}");
    }
    // A store in a directory builds on it no more than on another store's checkpoint.
    let durable = Store::restore(&ckpt, root.path().join("d"), None, |_, _| {}).unwrap();
    let err = durable.checkpoint(root.path().join("inc"), Some(&ckpt)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_store_in_memory_refuses_since_a_used_directory_and_after_close() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::new();
    let t = store.create_table(TableConfig::new("t", 4)).unwrap();
    t.assign(&[1, 2, 3], &[0.5; 12]).unwrap();
    let c1 = root.path().join("c1");
    store.checkpoint(&c1, None).unwrap();
    // Incremental checkpoints need a store in a directory: a typed error saying what works.
    let c2 = root.path().join("c2");
    let err = store.checkpoint(&c2, Some(&c1)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("only full checkpoints"), "{err}");
    assert!(!c2.exists(), "nothing written");
    // A used directory is refused, and left as it was.
    std::fs::create_dir(&c2).unwrap();
    std::fs::write(c2.join("notes.txt"), "mine").unwrap();
    let err = store.checkpoint(&c2, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("not empty"), "{err}");
    assert_eq!(entries(&c2), ["notes.txt"]);
    assert_eq!(store.checkpoint(&c1, None).unwrap_err().kind(), ErrorKind::InvalidArgument);
    // An empty one is taken.
    let c3 = root.path().join("c3");
    std::fs::create_dir(&c3).unwrap();
    store.checkpoint(&c3, None).unwrap();
    store.close().unwrap();
    let err = store.checkpoint(root.path().join("c4"), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
}

#[test]
fn a_full_disk_fails_a_checkpoint_of_a_store_in_memory_and_leaves_no_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::new();
    for name in ["a", "b"] {
        let t = store.create_table(TableConfig::new(name, 4).with_optimizer(adam())).unwrap();
        t.apply_gradients(&(0..500).collect::<Vec<_>>(), &[0.1; 2000], None).unwrap();
    }
    let want = snapshot(&store);
    // The disk fills up at the second table's segment, then at the manifest.
    for (full, existed) in [("0000000000000002", false), ("MANIFEST", true)] {
        let dest = root.path().join("ckpt");
        if existed {
            std::fs::create_dir(&dest).unwrap();
        }
        let fs = FaultFs::new(u64::MAX);
        fs.set_full_for(Some(full));
        let err = store.checkpoint_memory_on(&fs, &dest, None, &mut |_, _| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoSpace, "full at {full}: {err}");
        // What was written is gone: no manifest, no segment, and the directory as it was.
        assert_eq!(dest.exists(), existed, "full at {full}");
        assert!(entries(&dest).is_empty(), "full at {full}: {:?}", entries(&dest));
        let err = Store::restore(&dest, root.path().join("r"), None, |_, _| {}).err().unwrap();
        let kind = if existed { ErrorKind::Corruption } else { ErrorKind::NotFound };
        assert_eq!(err.kind(), kind, "no checkpoint to restore: {err}");
        // Space again: the same directory takes the checkpoint.
        fs.set_full_for(None);
        store.checkpoint_memory_on(&fs, &dest, None, &mut |_, _| {}).unwrap();
        let restored = Store::restore(&dest, root.path().join("r"), None, |_, _| {}).unwrap();
        assert_same(&snapshot(&restored), &want, &format!("after full at {full}"));
        drop(restored);
        std::fs::remove_dir_all(&dest).unwrap();
        std::fs::remove_dir_all(root.path().join("r")).unwrap();
    }
}

#[test]
fn a_checkpoint_of_a_store_in_memory_taken_while_a_thread_writes_holds_whole_rows() {
    let root = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::new());
    let t = store.create_table(TableConfig::new("t", 8).with_shards(4)).unwrap();
    let ids: Vec<u64> = (0..20_000).collect();
    t.assign(&ids, &vec![0.0; ids.len() * 8]).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded in count; every write gives a row one value in all its columns.
            for k in 1..=2_000u64 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let ids: Vec<u64> = (0..64).map(|i| (k * 97 + i * 311) % 20_000).collect();
                t.assign(&ids, &vec![k as f32; ids.len() * 8]).unwrap();
                t.assign(&[20_000 + k], &[k as f32; 8]).unwrap();
            }
        })
    };
    let ckpt = root.path().join("ckpt");
    let report = store.checkpoint(&ckpt, None);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    report.unwrap();
    let restored = Store::restore(&ckpt, root.path().join("r"), None, |_, _| {}).unwrap();
    let rows = snapshot_of(&restored.table("t").unwrap());
    // Every row present when the checkpoint began is in it, each whole.
    assert!(rows.iter().filter(|r| r.0 < 20_000).count() == 20_000);
    for (id, values, _, _) in &rows {
        assert!(values.iter().all(|v| *v == values[0]), "row {id} torn: {values:?}");
    }
}
