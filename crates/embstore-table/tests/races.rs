//! Races between flushes, rewrites, evictions, `clear` and `drop_table`, and failures in the
//! middle of a manifest append: each test holds one thread at a chosen file operation (a file
//! layer that blocks it) while another thread acts. Each was a defect found in review; they
//! failed before their fixes.
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use embstore_table::disk::vfs::{ReadFile, RealFs, Vfs, WriteFile};
use embstore_table::{OnMiss, Optimizer, Store, StoreOptions, TableConfig};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Trigger {
    SegCreate,
    PartSync,
    FlusherRecordRead(usize),
}

#[derive(Default, Debug)]
struct St {
    armed: Option<Trigger>,
    blocked: bool,
    release: Option<Option<io::ErrorKind>>,
}

#[derive(Default, Debug)]
struct Blocker {
    st: Mutex<St>,
    cv: Condvar,
    man_partial: std::sync::atomic::AtomicBool,
    man_sync_fail: std::sync::atomic::AtomicBool,
}
struct MW(Box<dyn WriteFile>, Arc<Blocker>);
impl WriteFile for MW {
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        if self.1.man_partial.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.0.write_all(&b[..b.len() / 2])?;
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        self.0.write_all(b)
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.1.man_sync_fail.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        self.0.sync()
    }
}

impl Blocker {
    fn arm(&self, t: Trigger) {
        let mut s = self.st.lock().unwrap();
        s.armed = Some(t);
        s.blocked = false;
        s.release = None;
    }
    fn disarm(&self) {
        self.st.lock().unwrap().armed = None;
    }
    fn hit(&self, t: Trigger) -> io::Result<()> {
        let mut s = self.st.lock().unwrap();
        if s.armed != Some(t) {
            return Ok(());
        }
        s.armed = None;
        s.blocked = true;
        self.cv.notify_all();
        while s.release.is_none() {
            s = self.cv.wait(s).unwrap();
        }
        let r = s.release.take().unwrap();
        s.blocked = false;
        match r {
            None => Ok(()),
            Some(k) => Err(io::Error::from(k)),
        }
    }
    fn is_blocked(&self) -> bool {
        self.st.lock().unwrap().blocked
    }
    fn release(&self, err: Option<io::ErrorKind>) {
        let mut s = self.st.lock().unwrap();
        s.release = Some(err);
        self.cv.notify_all();
    }
}

#[derive(Debug, Clone, Default)]
struct BFs(Arc<Blocker>);
struct BW(Box<dyn WriteFile>, Arc<Blocker>, bool);
impl WriteFile for BW {
    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.0.write_all(b)
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.2 {
            self.1.hit(Trigger::PartSync)?;
        }
        self.0.sync()
    }
}
struct BR(Box<dyn ReadFile>, Arc<Blocker>);
impl ReadFile for BR {
    fn read_exact_at(&self, b: &mut [u8], off: u64) -> io::Result<()> {
        if std::thread::current().name() == Some("flusher") {
            self.1.hit(Trigger::FlusherRecordRead(b.len()))?;
        }
        self.0.read_exact_at(b, off)
    }
    fn size(&self) -> io::Result<u64> {
        self.0.size()
    }
}
fn is_seg(p: &Path) -> bool {
    p.to_string_lossy().contains("/seg/")
}
impl Vfs for BFs {
    fn create(&self, p: &Path) -> io::Result<Box<dyn WriteFile>> {
        if is_seg(p) {
            self.0.hit(Trigger::SegCreate)?;
        }
        Ok(Box::new(BW(RealFs.create(p)?, self.0.clone(), is_seg(p))))
    }
    fn append(&self, p: &Path) -> io::Result<Box<dyn WriteFile>> {
        Ok(Box::new(MW(RealFs.append(p)?, self.0.clone())))
    }
    fn open(&self, p: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(BR(RealFs.open(p)?, self.0.clone())))
    }
    fn rename(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename(a, b)
    }
    fn remove(&self, p: &Path) -> io::Result<()> {
        RealFs.remove(p)
    }
    fn sync_dir(&self, d: &Path) -> io::Result<()> {
        RealFs.sync_dir(d)
    }
    fn link(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.link(a, b)
    }
    fn create_dir_all(&self, d: &Path) -> io::Result<()> {
        RealFs.create_dir_all(d)
    }
    fn list(&self, d: &Path) -> io::Result<Vec<String>> {
        RealFs.list(d)
    }
}

const D: usize = 8;
fn config() -> TableConfig {
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    TableConfig::new("t", D).with_optimizer(opt).with_shards(4)
}
fn open(dir: &Path, budget: Option<u64>, fs: &BFs) -> Store {
    // Evictions on the calling thread, where each test schedules them.
    let mut o = StoreOptions::default().with_background_eviction(false);
    if let Some(b) = budget {
        o = o.with_memory_budget(b);
    }
    Store::open_with_options(dir, &o, Arc::new(fs.clone())).unwrap()
}
fn wait_blocked(
    b: &Blocker,
    h: &std::thread::ScopedJoinHandle<'_, embstore_table::Result<embstore_table::FlushStats>>,
) -> bool {
    let t0 = Instant::now();
    loop {
        if b.is_blocked() {
            return true;
        }
        if h.is_finished() || t0.elapsed() > Duration::from_secs(30) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
fn record_bytes() -> usize {
    (40 + 4 * (D + D) + 4usize).next_multiple_of(64)
}

/// A row promoted while a rewrite copies the cold rows is in neither part of the rewrite:
/// the rewrite supersedes its only durable copy; a crash right after flush() returned loses it.
#[test]
fn rewrite_loses_rows_promoted_during_copy_cold() {
    let dir = tempfile::tempdir().unwrap();
    let fs = BFs::default();
    let budget = 256 << 10;
    let ids: Vec<u64> = (0..30_000).collect();
    let store = open(dir.path(), Some(budget), &fs);
    let t = store.create_table(config()).unwrap();
    let mut rewrote = false;
    for round in 0..10 {
        t.apply_gradients(&ids, &vec![0.01 * (round + 1) as f32; ids.len() * D], None).unwrap();
        fs.0.arm(Trigger::FlusherRecordRead(record_bytes()));
        let stats = std::thread::scope(|s| {
            let h = std::thread::Builder::new()
                .name("flusher".into())
                .spawn_scoped(s, || store.flush())
                .unwrap();
            if wait_blocked(&fs.0, &h) {
                // The rewrite is in copy_cold (shard 0 snapshotted). Another thread looks rows up.
                let before = t.stats().cold_reads;
                let c = s.spawn(|| {
                    let mut out = vec![0.0; ids.len() * D];
                    t.lookup(&ids, OnMiss::Error, &mut out, None).unwrap();
                });
                while t.stats().cold_reads == before {
                    std::thread::sleep(Duration::from_millis(1));
                }
                fs.0.release(None);
                c.join().unwrap();
            }
            fs.0.disarm();
            h.join().unwrap().unwrap()
        });
        if stats.compactions > 0 {
            rewrote = true;
            break;
        }
    }
    assert!(rewrote, "no rewrite ran");
    // flush() returned Ok. Crash now (no further flush) and reopen.
    drop(t);
    drop(store);
    let store = open(dir.path(), Some(budget), &BFs::default());
    let t = store.table("t").unwrap();
    let mut found = vec![false; ids.len()];
    t.contains(&ids, &mut found).unwrap();
    let lost = found.iter().filter(|f| !**f).count();
    assert_eq!(lost, 0, "{lost} of {} rows vanished after a completed flush", ids.len());
}

/// A clean row demoted while a flush that wrote it is still in flight points into a file slot
/// with no segment yet: a lookup fails with CorruptionError; if the flush then fails (full disk),
/// the row's only copy is gone.
#[test]
fn demotion_during_a_flush_points_into_an_uninstalled_slot() {
    let dir = tempfile::tempdir().unwrap();
    let fs = BFs::default();
    let budget = 256 << 10;
    let store = open(dir.path(), Some(budget), &fs);
    let t = store.create_table(config()).unwrap();
    let all: Vec<u64> = (0..3000).collect();
    for c in all.chunks(100) {
        t.lookup(c, OnMiss::Init, &mut vec![0.0; c.len() * D], None).unwrap();
    }
    store.flush().unwrap();
    // Dirty the rows that are hot now (the most recent ones).
    let hot: Vec<u64> = (2700..3000).collect();
    t.apply_gradients(&hot, &vec![0.5; hot.len() * D], None).unwrap();
    let mut want = vec![0.0; hot.len() * D];
    // read the expected values without changing anything (they are hot or cold; both fine)
    t.lookup(&hot, OnMiss::Error, &mut want, None).unwrap();
    t.apply_gradients(&hot, &vec![0.5; hot.len() * D], None).unwrap();
    t.lookup(&hot, OnMiss::Error, &mut want, None).unwrap();
    fs.0.arm(Trigger::PartSync);
    let errs = std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("flusher".into())
            .spawn_scoped(s, || store.flush())
            .unwrap();
        if !wait_blocked(&fs.0, &h) {
            panic!("flush did not block: {:?} {:?}", h.join().unwrap(), t.stats());
        }
        // Only reads of cold rows now: every victim is clean (the flush cleared the bits).
        for c in (0..2700u64).collect::<Vec<_>>().chunks(100) {
            t.lookup(c, OnMiss::Error, &mut vec![0.0; c.len() * D], None).unwrap();
        }
        let mut out = vec![0.0; hot.len() * D];
        let during = t.lookup(&hot, OnMiss::Error, &mut out, None).err();
        fs.0.release(Some(io::ErrorKind::StorageFull));
        let flush = h.join().unwrap();
        (during, flush.err())
    });
    println!("lookup during the flush: {:?}\nflush: {:?}", errs.0, errs.1);
    store.flush().unwrap();
    let mut out = vec![0.0; hot.len() * D];
    let after = t.lookup(&hot, OnMiss::Error, &mut out, None);
    println!("lookup after a successful retry flush: {:?}", after.as_ref().err());
    assert!(errs.0.is_none(), "a lookup during a flush failed: {:?}", errs.0);
    assert!(after.is_ok() && out == want, "rows lost after a failed flush and a good one");
}

/// clear() while a flush is under way: the flush took `cleared` = false, then writes the rows
/// written after the clear, clearing their dirty bits; the next flush supersedes it and does not
/// write them again: after a reopen they are gone.
#[test]
fn a_clear_during_a_flush_loses_rows_written_after_it() {
    let mut failed = false;
    for budget in [None, Some(64u64 << 10)] {
        let dir = tempfile::tempdir().unwrap();
        let fs = BFs::default();
        let store = open(dir.path(), budget, &fs);
        let t = store.create_table(config()).unwrap();
        let ids: Vec<u64> = (0..100).collect();
        t.assign(&ids, &vec![1.0; ids.len() * D]).unwrap();
        store.flush().unwrap();
        t.assign(&ids, &vec![2.0; ids.len() * D]).unwrap();
        fs.0.arm(Trigger::SegCreate);
        std::thread::scope(|s| {
            let h = std::thread::Builder::new()
                .name("flusher".into())
                .spawn_scoped(s, || store.flush())
                .unwrap();
            assert!(wait_blocked(&fs.0, &h));
            t.clear().unwrap();
            t.assign(&[7, 8, 9], &[3.0; 3 * D]).unwrap();
            fs.0.release(None);
            h.join().unwrap().unwrap();
        });
        store.flush().unwrap(); // every write so far is durable
        let mut want = vec![false; ids.len()];
        t.contains(&ids, &mut want).unwrap();
        drop(t);
        drop(store);
        let store = open(dir.path(), budget, &BFs::default());
        let t = store.table("t").unwrap();
        let mut got = vec![false; ids.len()];
        t.contains(&ids, &mut got).unwrap();
        let w: Vec<u64> = ids.iter().copied().filter(|&i| want[i as usize]).collect();
        let g: Vec<u64> = ids.iter().copied().filter(|&i| got[i as usize]).collect();
        println!("budget {budget:?}: want {w:?} got {g:?}");
        if g != w {
            failed = true;
        }
    }
    assert!(!failed, "rows written after a clear and flushed vanished on reopen");
}

/// An eviction that runs after its table was dropped and a table of the same name created
/// writes the dropped table's rows into the new table (write_segment looks the table up by name).
#[test]
fn an_eviction_of_a_dropped_table_writes_into_its_namesake() {
    let dir = tempfile::tempdir().unwrap();
    let fs = BFs::default();
    let budget = 64 << 10;
    // One shard: the cold reads run on the calling thread (the one the file layer blocks),
    // not on a pool helper.
    let store = open(dir.path(), Some(budget), &fs);
    let t = store.create_table(config().with_shards(1)).unwrap();
    let all: Vec<u64> = (0..3000).collect();
    for c in all.chunks(100) {
        t.lookup(c, OnMiss::Init, &mut vec![0.0; c.len() * D], None).unwrap();
    }
    store.flush().unwrap();
    let hot: Vec<u64> = (2700..3000).collect();
    t.apply_gradients(&hot, &vec![0.5; hot.len() * D], None).unwrap();
    fs.0.arm(Trigger::FlusherRecordRead(record_bytes()));
    std::thread::scope(|s| {
        let a = std::thread::Builder::new()
            .name("flusher".into())
            .spawn_scoped(s, || {
                let ids: Vec<u64> = (0..1000).collect();
                t.lookup(&ids, OnMiss::Error, &mut vec![0.0; ids.len() * D], None)
            })
            .unwrap();
        let start = Instant::now();
        while !fs.0.is_blocked() {
            if a.is_finished() {
                panic!(
                    "the lookup read nothing from disk: {:?}, {:?}",
                    a.join().unwrap().err(),
                    t.stats()
                );
            }
            assert!(start.elapsed() < Duration::from_secs(30), "the lookup never blocked");
            std::thread::sleep(Duration::from_millis(1));
        }
        store.drop_table("t").unwrap();
        let t2 = store.create_table(config().with_shards(1)).unwrap();
        assert_eq!(t2.len(), 0);
        fs.0.release(None);
        a.join().unwrap().unwrap();
    });
    println!("old table's stats: {:?}", t.stats());
    drop(t);
    store.flush().unwrap();
    drop(store);
    let store = open(dir.path(), Some(budget), &BFs::default());
    let n = store.table("t").unwrap().len();
    assert_eq!(n, 0, "the new table 't' holds {n} rows of the dropped one after a reopen");
}

/// Flushes once with a manifest append that fails (`failure` armed), then once more; the
/// store must then reopen with every row.
fn a_failed_manifest_append_then_a_good_flush(failure: impl Fn(&Blocker)) {
    let dir = tempfile::tempdir().unwrap();
    let fs = BFs::default();
    {
        let store = open(dir.path(), None, &fs);
        let t = store.create_table(config()).unwrap();
        t.assign(&[1, 2, 3], &[1.0; 3 * D]).unwrap();
        failure(&fs.0);
        let err = store.flush().unwrap_err();
        assert_eq!(err.kind(), embstore_table::ErrorKind::NoSpace, "{err}");
        assert!(store.flush().unwrap().records >= 3);
    }
    let r = Store::open_with_options(dir.path(), &StoreOptions::default(), Arc::new(RealFs));
    let store = r.unwrap_or_else(|e| panic!("reopen after a failed flush and a good one: {e}"));
    assert_eq!(store.table("t").unwrap().len(), 3);
}

/// A manifest append cut short by a full disk left half a record in MANIFEST; the next
/// (successful) append landed after it: the store no longer opened.
#[test]
fn a_partial_manifest_write_then_a_good_flush_makes_the_store_unopenable() {
    a_failed_manifest_append_then_a_good_flush(|b| {
        b.man_partial.store(true, std::sync::atomic::Ordering::SeqCst)
    });
}

/// A manifest fsync that failed: the record was in the file (and reaches the disk later), but
/// the flush deleted the segment it names: the store no longer opened.
#[test]
fn a_failed_manifest_fsync_deletes_a_segment_the_manifest_names() {
    a_failed_manifest_append_then_a_good_flush(|b| {
        b.man_sync_fail.store(true, std::sync::atomic::Ordering::SeqCst)
    });
}
