//! Spills: under a memory budget an eviction writes its dirty rows to a segment without fsync
//! and without a manifest record; the next flush fsyncs and records them all at once. A crash
//! at any file operation of a spill or of its adoption reopens to exactly what was flushed, and
//! recovery deletes only the spills no flush adopted (proven superseded by the spill range the
//! manifest records).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod common;

use common::{segment_files, snapshot_of, Rng};
use embstore_table::disk::vfs::{FaultFs, ReadFile, RealFs, Vfs, WriteFile};
use embstore_table::{OnMiss, Optimizer, Store, StoreOptions, TableConfig};

const D: usize = 4;

/// The table's rows (sorted by id: values, state, metadata) and step.
type Snapshot = (Vec<(u64, Vec<f32>, Vec<f32>, String)>, u64);

fn snapshot(store: &Store) -> Snapshot {
    let t = store.table("t").unwrap();
    (snapshot_of(&t), t.step())
}

/// Evictions on the calling thread: the N-th file operation is the same one in every run.
fn options() -> StoreOptions {
    StoreOptions::default().with_memory_budget(12 << 10).with_background_eviction(false)
}

fn config() -> TableConfig {
    let opt = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    TableConfig::new("t", D).with_optimizer(opt).with_shards(2)
}

/// One step of training on 60 of 600 ids: rows come in, change, and are evicted (spilled).
fn train(store: &Store, rng: &mut Rng) -> embstore_table::Result<()> {
    let t = store.table("t")?;
    let ids = rng.ids(60, 600);
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 60 * D], None)?;
    let grads: Vec<f32> = (0..60 * D).map(|i| ((i as u64 + rng.next()) % 7) as f32 * 0.1).collect();
    t.apply_gradients(&ids, &grads, None)?;
    t.assign(&rng.ids(2, 600), &[0.25; 2 * D])?;
    Ok(())
}

/// What a run of the script saw: the snapshot at each completed flush (the first: the empty
/// table), the snapshot a failed flush was asked to make durable, and the spills flushes
/// adopted.
struct Run {
    flushed: Vec<Snapshot>,
    failed: Option<Snapshot>,
    adopted: u64,
}

/// Rounds of training steps (each evicting, so spilling) closed by a flush (adopting the
/// spills); stops at the first flush that fails. A failed eviction is noted by the store and
/// training goes on in memory, as it does on a failing device.
fn script(vfs: Arc<dyn Vfs>, dir: &Path) -> Run {
    let mut run = Run { flushed: Vec::new(), failed: None, adopted: 0 };
    let Ok(store) = Store::open_with_options(dir, &options(), vfs) else { return run };
    if store.create_table(config()).is_err() {
        return run;
    }
    run.flushed.push(snapshot(&store));
    let mut rng = Rng(0x5eed_0040);
    for _ in 0..4 {
        for _ in 0..4 {
            if train(&store, &mut rng).is_err() {
                run.failed = Some(snapshot(&store));
                return run;
            }
        }
        let at = snapshot(&store);
        match store.flush() {
            Ok(stats) => {
                run.adopted += stats.spills_adopted;
                run.flushed.push(at);
            }
            Err(_) => {
                run.failed = Some(at);
                return run;
            }
        }
    }
    // Spills after the last flush: never adopted.
    for _ in 0..3 {
        if train(&store, &mut rng).is_err() {
            break;
        }
    }
    run
}

#[test]
fn a_crash_at_any_file_operation_of_a_spill_or_its_adoption_reopens_to_the_last_flush() {
    let counter = FaultFs::new(u64::MAX);
    let dir = tempfile::tempdir().unwrap();
    let run = script(Arc::new(counter.clone()), dir.path());
    let total = counter.ops();
    println!("seed 0x5eed0040: {total} file operations, {} spills adopted", run.adopted);
    assert_eq!(run.flushed.len(), 5, "every flush of the fault-free run completes");
    assert!(run.adopted >= 8, "only {} spills adopted: the budget does not evict", run.adopted);
    // The spills written after the last flush are lost in a crash, as the contract allows.
    counter.crash().unwrap();
    let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap();
    let (got, last) = (snapshot(&store), run.flushed.last().unwrap());
    assert!(&got == last, "no fault: {} rows, not the last flush's {}", got.0.len(), last.0.len());
    assert!(!store.recovery().unwrap().orphan_segments.is_empty(), "unadopted spills deleted");
    drop(store);
    for fail_at in 1..=total {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new(fail_at);
        let run = script(Arc::new(fs.clone()), dir.path());
        fs.crash().unwrap();
        let before = segment_files(dir.path());
        let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs))
            .unwrap_or_else(|e| panic!("fault at op {fail_at}: reopen failed: {e}"));
        if run.flushed.is_empty() {
            continue; // the fault came before the table was created
        }
        let got = snapshot(&store);
        // Every flushed row with its flushed value, and no spilled row taken as flushed: the
        // table is exactly the last completed flush — or the failed flush, if its record
        // landed before the fault.
        let last = run.flushed.last().unwrap();
        assert!(
            &got == last || Some(&got) == run.failed.as_ref(),
            "fault at op {fail_at}: reopened rows match no flush ({} rows, last flush {})",
            got.0.len(),
            last.0.len()
        );
        // Recovery deleted only unnamed segments: every file a table needs is still there (it
        // opened), and what it deleted is what it reported.
        let report = store.recovery().unwrap().clone();
        let after = segment_files(dir.path());
        let gone: Vec<String> = before.iter().filter(|n| !after.contains(n)).cloned().collect();
        assert_eq!(gone, report.orphan_segments, "fault at op {fail_at}");
        // The reopened store goes on: a flush and a second reopen keep every row.
        train(&store, &mut Rng(fail_at)).unwrap();
        store.flush().unwrap();
        let want = snapshot(&store);
        drop(store);
        let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap();
        assert!(
            snapshot(&store) == want,
            "fault at op {fail_at}: rows differ after a second reopen"
        );
        assert!(store.recovery().unwrap().orphan_segments.is_empty(), "fault at op {fail_at}");
    }
}

/// A file layer that counts fsyncs (of files and of directories) and file creations, by
/// folder: `seg` or the store's own (the manifest).
#[derive(Debug, Default)]
struct Counting {
    seg_syncs: AtomicU64,
    other_syncs: AtomicU64,
    seg_creates: AtomicU64,
}

impl Counting {
    fn syncs(&self) -> (u64, u64) {
        (self.seg_syncs.load(Ordering::Relaxed), self.other_syncs.load(Ordering::Relaxed))
    }
}

#[derive(Debug, Clone, Default)]
struct CountingFs(Arc<Counting>);

struct CountingWrite {
    inner: Box<dyn WriteFile>,
    seg: bool,
    counts: Arc<Counting>,
}

impl WriteFile for CountingWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        let c = if self.seg { &self.counts.seg_syncs } else { &self.counts.other_syncs };
        c.fetch_add(1, Ordering::Relaxed);
        self.inner.sync()
    }
}

fn in_seg(path: &Path) -> bool {
    path.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "seg")
}

impl CountingFs {
    fn wrap(&self, path: &Path, inner: Box<dyn WriteFile>) -> Box<dyn WriteFile> {
        Box::new(CountingWrite { inner, seg: in_seg(path), counts: self.0.clone() })
    }
}

impl Vfs for CountingFs {
    fn create(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        if in_seg(path) {
            self.0.seg_creates.fetch_add(1, Ordering::Relaxed);
        }
        Ok(self.wrap(path, RealFs.create(path)?))
    }

    fn append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        Ok(self.wrap(path, RealFs.append(path)?))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        RealFs.open(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        RealFs.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.0.other_syncs.fetch_add(1, Ordering::Relaxed);
        RealFs.sync_dir(dir)
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.link(from, to)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        RealFs.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealFs.list(dir)
    }
}

#[test]
fn evictions_fsync_nothing_and_the_flush_fsyncs_each_spill_once_with_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let fs = CountingFs::default();
    let store = Store::open_with_options(dir.path(), &options(), Arc::new(fs.clone())).unwrap();
    store.create_table(config()).unwrap();
    let mut rng = Rng(0x5eed_0041);
    train(&store, &mut rng).unwrap();
    store.flush().unwrap();
    let t = store.table("t").unwrap();
    let (seg0, other0) = fs.0.syncs();
    let (files0, rounds0) = (fs.0.seg_creates.load(Ordering::Relaxed), t.stats().eviction_rounds);
    for _ in 0..20 {
        train(&store, &mut rng).unwrap();
    }
    let spills = fs.0.seg_creates.load(Ordering::Relaxed) - files0;
    let rounds = t.stats().eviction_rounds - rounds0;
    let (seg, other) = fs.0.syncs();
    println!(
        "{rounds} eviction rounds wrote {spills} spills: {} segment and {} manifest fsyncs",
        seg - seg0,
        other - other0
    );
    assert!(spills >= 10, "only {spills} spills in {rounds} eviction rounds");
    assert_eq!(seg - seg0, 0, "{spills} spills fsynced their segments");
    // At most the one record that reserves the spills' seqs (a range of 1024).
    assert!(other - other0 <= 1, "{spills} spills fsynced the manifest {} times", other - other0);
    let stats = store.flush().unwrap();
    assert_eq!(stats.spills_adopted, spills, "the flush adopts every spill");
    let (seg2, other2) = fs.0.syncs();
    // One fsync per spill and per segment of the flush itself; the manifest: one record for
    // all spills, one per flushed segment (or a compaction: a few more).
    assert!(seg2 - seg >= spills && seg2 - seg <= spills + 2 * stats.segments, "{stats:?}");
    assert!(
        other2 - other <= 1 + stats.segments + 3,
        "{} manifest fsyncs: {stats:?}",
        other2 - other
    );
}

#[test]
fn unadopted_spills_are_safe_to_remove_for_verify_and_deleted_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let (flushed, spills) = {
        let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap();
        store.create_table(config()).unwrap();
        let mut rng = Rng(0x5eed_0042);
        for _ in 0..3 {
            train(&store, &mut rng).unwrap();
        }
        store.flush().unwrap();
        let flushed = snapshot(&store);
        let named = segment_files(dir.path());
        for _ in 0..6 {
            train(&store, &mut rng).unwrap();
        }
        let spills: Vec<String> =
            segment_files(dir.path()).into_iter().filter(|n| !named.contains(n)).collect();
        assert!(!spills.is_empty(), "the training after the flush evicted nothing");
        // Dropped without a flush (a process killed): its spills stay unadopted.
        drop(store);
        (flushed, spills)
    };
    let report = embstore_table::verify(dir.path(), |_, _| {}).unwrap();
    assert!(report.damage.is_empty(), "{:?}", report.damage);
    assert!(report.unaccounted_segments.is_empty(), "{:?}", report.unaccounted_segments);
    assert_eq!(report.orphan_segments, spills, "every unadopted spill is safe to remove");
    assert_eq!(report.manifest_format, 2, "a manifest recording a spill range");
    let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap();
    assert_eq!(store.recovery().unwrap().orphan_segments, spills);
    assert_eq!(snapshot(&store), flushed, "the reopened store holds the flushed rows");
}

/// The spill range alone proves nothing about a file whose record was lost: a manifest that
/// lost the records of two flushes (a file system that dropped fsynced appends) leaves their
/// segments, inside the range, unnamed. They are flushes' segments, not spills (their headers
/// say so): the open refuses and deletes nothing, as it does outside the range.
#[test]
fn flushed_segments_in_the_spill_range_are_never_taken_for_spills() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("MANIFEST");
    let kept = {
        let store = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap();
        store.create_table(config()).unwrap();
        let mut rng = Rng(0x5eed_0043);
        train(&store, &mut rng).unwrap();
        store.flush().unwrap(); // reserves the spill range
        let len = std::fs::metadata(&manifest).unwrap().len();
        for _ in 0..2 {
            train(&store, &mut rng).unwrap();
            store.flush().unwrap();
        }
        store.close().unwrap();
        len
    };
    let before = segment_files(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&manifest).unwrap();
    f.set_len(kept).unwrap(); // the last two flushes' records lost, at a record boundary
    drop(f);
    let e = Store::open_with_options(dir.path(), &options(), Arc::new(RealFs)).unwrap_err();
    assert_eq!(e.kind(), embstore_table::ErrorKind::Corruption, "{e}");
    assert_eq!(segment_files(dir.path()), before, "a segment was deleted");
}
