//! The L3 filler thread: reads surrogates of evicted keys from builds on disk.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::key::{id_of, key_of, table_of, Key};
use crate::surrogate::SurrogateFile;
use crate::{Error, Result};

/// Keys a filler read takes at once.
const FILL_BATCH: usize = 64;

/// The L3 filler: a thread that reads the surrogates of evicted keys from builds on disk. It
/// touches no shard: what it finds waits in `ready` until a lookup (or `sync_l3`) moves it
/// into L3 under the shard's lock. Both queues are bounded by `cap`, allocated up front.
pub(super) struct Filler {
    pub(super) shared: Arc<FillShared>,
    worker: Option<std::thread::JoinHandle<()>>,
}

pub(super) struct FillShared {
    pub(super) state: Mutex<FillState>,
    /// Signalled when keys arrive or on stop.
    wake: Condvar,
    /// Signalled when the worker has nothing pending and is not reading.
    pub(super) idle: Condvar,
    files: Vec<Option<Arc<SurrogateFile>>>,
    cap: usize,
}

#[derive(Default)]
pub(super) struct FillState {
    pub(super) pending: Vec<Key>,
    pub(super) ready: Vec<(Key, u64, f32)>,
    pub(super) busy: bool,
    stop: bool,
    /// Counters the next `apply_ready` adds to the cache's stats.
    pub(super) reads: u64,
    pub(super) errors: u64,
    pub(super) drops: u64,
}

impl Filler {
    pub(super) fn start(files: Vec<Option<Arc<SurrogateFile>>>, cap: usize) -> Result<Self> {
        let shared = Arc::new(FillShared {
            state: Mutex::new(FillState {
                pending: Vec::with_capacity(cap),
                ready: Vec::with_capacity(cap),
                ..FillState::default()
            }),
            wake: Condvar::new(),
            idle: Condvar::new(),
            files,
            cap,
        });
        let sh = shared.clone();
        let worker = std::thread::Builder::new()
            .name("embstore-l3-fill".into())
            .spawn(move || sh.run())
            .map_err(|e| Error::io("cannot start the L3 filler thread", e))?;
        Ok(Self { shared, worker: Some(worker) })
    }

    /// Bytes of both queues.
    pub(super) fn bytes(&self) -> usize {
        Self::bytes_for(self.shared.cap)
    }

    /// Bytes of both queues for `cap` keys each.
    pub(super) fn bytes_for(cap: usize) -> usize {
        cap * (std::mem::size_of::<Key>() + std::mem::size_of::<(Key, u64, f32)>())
    }

    /// Queues `key`; false when the queue is full (the key is dropped).
    pub(super) fn push(&self, key: Key) -> bool {
        let mut st = self.shared.state.lock();
        if st.pending.len() == self.shared.cap {
            return false;
        }
        st.pending.push(key);
        self.shared.wake.notify_one();
        true
    }
}

impl FillShared {
    fn run(&self) {
        let mut keys = Vec::with_capacity(FILL_BATCH);
        let mut found = Vec::new();
        loop {
            {
                let mut st = self.state.lock();
                while st.pending.is_empty() && !st.stop {
                    self.wake.wait(&mut st);
                }
                if st.stop {
                    return;
                }
                let n = st.pending.len().min(FILL_BATCH);
                keys.clear();
                keys.extend(st.pending.drain(..n));
                st.busy = true;
            }
            let (mut reads, mut errors) = (0, 0);
            let mut results = Vec::with_capacity(keys.len());
            let mut ids = Vec::new();
            let mut tables: Vec<u16> = keys.iter().map(|&k| table_of(k)).collect();
            tables.sort_unstable();
            tables.dedup();
            for t in tables {
                let Some(Some(file)) = self.files.get(usize::from(t)) else { continue };
                ids.clear();
                ids.extend(keys.iter().filter(|&&k| table_of(k) == t).map(|&k| id_of(k)));
                match file.get_many(&ids, &mut found) {
                    Ok(n) => {
                        reads += n as u64;
                        for (&id, f) in ids.iter().zip(&found) {
                            if let Some((alt, dist)) = *f {
                                results.push((key_of(t, id), alt, dist));
                            }
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            let mut st = self.state.lock();
            let room = self.cap - st.ready.len();
            st.drops += results.len().saturating_sub(room) as u64;
            results.truncate(room);
            st.ready.extend(results);
            st.reads += reads;
            st.errors += errors;
            st.busy = false;
            if st.pending.is_empty() {
                self.idle.notify_all();
            }
        }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cache::testing::*;
    use crate::cache::*;
    use crate::codec::CodecKind;
    use crate::surrogate::{SurrogateFile, SurrogateTable};
    use crate::trace::table_key;

    /// Surrogate builds on disk serve exactly what the same builds in memory serve, read
    /// inline or by the filler thread (synced after every request), at the same level and L3
    /// sizes; the bytes in memory drop from 18 a row to the fences.
    #[test]
    fn surrogates_on_disk_serve_what_the_build_in_memory_serves() {
        let seed = 0xd15c;
        println!("seed {seed:#x}");
        let (t, d) = (4, 6);
        let trace = four_tables(seed, 2_000);
        let dir = tempfile::tempdir().unwrap();
        let in_memory = surrogates(t, 400, d);
        let on_disk: Vec<Option<SurrogateTable>> = in_memory
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let Some(SurrogateTable::Memory(m)) = s else { unreachable!() };
                let path = dir.path().join(format!("t{i}.surr"));
                m.save(&path).unwrap();
                Some(SurrogateFile::open(&path).unwrap().into())
            })
            .collect();
        let base = 12_000;
        let mut cfg = CacheConfig::new(t, d, base + surrogate_table_bytes(&in_memory));
        cfg.levels = vec![
            LevelConfig { codec: CodecKind::F32, share: 0.5 },
            LevelConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        cfg.surrogate_share = 0.1;
        let reference = InferenceCache::new(cfg.clone(), mem(d), in_memory).unwrap();
        let disk_bytes = surrogate_table_bytes(&on_disk);
        assert!(disk_bytes < 4 * 1_000, "fences, not rows: {disk_bytes} B");
        cfg.memory_budget_bytes = base + disk_bytes;
        cfg.l3_fill = L3Fill::Inline;
        let inline = InferenceCache::new(cfg.clone(), mem(d), on_disk.clone()).unwrap();
        cfg.l3_fill = L3Fill::Background;
        // The filler's 10 keys: a 16 B key pending, a 32 B (key, alt, dist) ready.
        cfg.memory_budget_bytes = base + disk_bytes + 10 * 48;
        let background = InferenceCache::new(cfg.clone(), mem(d), on_disk).unwrap();
        assert_eq!(background.memory().l3_queue_bytes, 10 * 48);
        for c in [&inline, &background] {
            let (a, b) = (reference.memory(), c.memory());
            assert_eq!((&a.levels, a.l3_capacity), (&b.levels, b.l3_capacity));
            assert!(b.total_bytes <= b.budget_bytes, "{b:?}");
        }
        for r in trace.iter() {
            let run = |c: &InferenceCache| {
                let mut rows = vec![0.0; r.len() * d];
                let mut src = vec![Source::Store; r.len()];
                c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                (rows, src)
            };
            let want = run(&reference);
            assert_eq!(run(&inline), want);
            assert_eq!(run(&background), want);
            background.sync_l3();
        }
        let (a, b, c) = (reference.stats(), inline.stats(), background.stats());
        assert!(a.approximated > 0 && a.l3_inserts > 0, "{a:?}");
        assert_eq!((a.approximated, a.l3_inserts), (b.approximated, b.l3_inserts));
        assert_eq!((a.approximated, a.l3_inserts), (c.approximated, c.l3_inserts));
        assert_eq!(a.l3_reads, 0);
        assert!(b.l3_reads > 0 && c.l3_reads > 0 && c.l3_reads <= b.l3_reads, "{b:?} {c:?}");
        assert_eq!(b.l3_read_errors + c.l3_read_errors + c.l3_queue_drops, 0);
    }

    /// A surrogate file damaged after it was opened: the read errors are counted and those keys
    /// get no L3 entry, and every request is still served with its exact rows.
    #[test]
    fn a_damaged_surrogate_file_is_counted_and_serving_goes_on() {
        let (t, d) = (2, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.surr");
        let ids: Vec<u64> = (0..300).collect();
        let flat: Vec<f32> = ids.iter().flat_map(|&i| row_of(0, i, d)).collect();
        let sc = crate::surrogate::SurrogateConfig { max_dist: 2.0, ..Default::default() };
        crate::surrogate::build(&ids, &flat, d, None, &sc, 1).unwrap().save(&path).unwrap();
        // Flip a byte of the first data block: open checks only the header and the fences.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[crate::surrogate::BLOCK + 10] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        for fill in [L3Fill::Inline, L3Fill::Background] {
            let mut cfg = CacheConfig::new(t, d, 4_000);
            cfg.l3_fill = fill;
            let sur = vec![Some(SurrogateFile::open(&path).unwrap().into()), None];
            let c = InferenceCache::new(cfg, mem(d), sur).unwrap();
            for i in 0..300u64 {
                let r = [table_key(0, i).unwrap(), table_key(1, i).unwrap()];
                let mut rows = vec![0.0; 2 * d];
                c.lookup(&r, &one(&r), &mut rows, None).unwrap();
                assert_eq!(&rows[..d], &row_of(0, i, d)[..]);
                c.sync_l3();
            }
            let s = c.stats();
            assert!(s.l3_read_errors > 0, "{fill:?}: {s:?}");
            assert!(s.drops > 0);
        }
    }
}
