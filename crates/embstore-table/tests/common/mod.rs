//! Helpers shared by the integration tests that need them.

/// A small deterministic generator (xorshift64*), seeded per test (tests print the seed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` ids uniform in `0..range`.
    #[allow(dead_code)] // each test crate uses one of the two id makers
    pub fn ids(&mut self, n: usize, range: u64) -> Vec<u64> {
        (0..n).map(|_| self.next() % range).collect()
    }

    /// `n` ids skewed towards the low ones: a quarter uniform in `0..range`, the rest in the
    /// first tenth (a hot set and a long tail).
    #[allow(dead_code)]
    pub fn skewed_ids(&mut self, n: usize, range: u64) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let r = self.next();
                if r.is_multiple_of(4) {
                    r % range
                } else {
                    (r >> 8) % (range / 10)
                }
            })
            .collect()
    }
}

/// A table's rows sorted by id: values, state, and metadata (as text, to compare).
#[allow(dead_code)]
pub fn snapshot_of(t: &embstore_table::Table) -> Vec<(u64, Vec<f32>, Vec<f32>, String)> {
    let (d, s) = (t.dim(), t.state_dim());
    let mut rows = Vec::new();
    for c in t.export(1000) {
        for i in 0..c.len() {
            rows.push((
                c.ids[i],
                c.values[i * d..][..d].to_vec(),
                c.state[i * s..][..s].to_vec(),
                format!("{:?}", c.meta[i]),
            ));
        }
    }
    rows.sort_by_key(|r| r.0);
    rows
}

/// The segment files of the store in `dir`, sorted.
#[allow(dead_code)]
pub fn segment_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("seg"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A store of replica `replica` with one table "t" of `dim` floats in 4 shards that syncs in
/// `parts` parts.
#[allow(dead_code)]
pub fn syncing(
    replica: u32,
    dim: usize,
    parts: u32,
) -> (embstore_table::Store, std::sync::Arc<embstore_table::Table>) {
    use embstore_table::sync::SyncOptions;
    let store = embstore_table::Store::with_replica(replica).unwrap();
    let t = store.create_table(embstore_table::TableConfig::new("t", dim).with_shards(4)).unwrap();
    t.enable_sync(&SyncOptions { parts, ..SyncOptions::default() }).unwrap();
    (store, t)
}

/// One normal sync of every part of `dst` from `src`.
#[allow(dead_code)]
pub fn sync_all(src: &embstore_table::Table, dst: &embstore_table::Table) {
    for p in 0..dst.sync_parts().unwrap() {
        let vv = dst.sync_knowledge(p).unwrap().0;
        dst.sync_apply(&src.sync_pull(p, &vv, false).unwrap()).unwrap();
    }
}
