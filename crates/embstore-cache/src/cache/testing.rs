//! Helpers of the cache's unit tests: a backing store of known rows, surrogate builds over
//! it, and checks that a served row is what its source promises.

use super::*;
use crate::trace::{SplitMix64, Synthetic, Trace};
use crate::GroupLfuConfig;
use embstore_policy::PolicyConfig;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Row of (table, id): a deterministic function, so every returned row can be checked.
pub(super) fn row_of(t: usize, id: u64, d: usize) -> Vec<f32> {
    let mut r = SplitMix64::new((t as u64) << 40 ^ id);
    (0..d).map(|_| (r.next_f64() as f32 - 0.5) * 0.2).collect()
}

#[derive(Default)]
pub(super) struct Mem {
    pub(super) dim: usize,
    pub(super) reads: AtomicU64,
    pub(super) fail: AtomicBool,
}

impl Backing for Mem {
    fn read(&self, t: usize, ids: &[u64], out: &mut [f32]) -> std::result::Result<(), String> {
        if self.fail.load(Ordering::Relaxed) {
            return Err("disk on fire".into());
        }
        self.reads.fetch_add(ids.len() as u64, Ordering::Relaxed);
        for (j, &id) in ids.iter().enumerate() {
            out[j * self.dim..(j + 1) * self.dim].copy_from_slice(&row_of(t, id, self.dim));
        }
        Ok(())
    }
}

pub(super) fn mem(dim: usize) -> Arc<Mem> {
    Arc::new(Mem { dim, ..Default::default() })
}

pub(super) fn one(keys: &[u64]) -> [usize; 2] {
    [0, keys.len()]
}

/// `trace` with each key replaced by the u64 the cache's policies know it by.
pub(super) fn as_policy_keys(trace: &Trace) -> Trace {
    let keys: Vec<u64> = trace
        .keys()
        .iter()
        .map(|&k| {
            let (t, id) = split_key(k);
            policy_key(key_of(t, id))
        })
        .collect();
    Trace::from_ragged(&keys, trace.offsets()).unwrap()
}

/// Every returned row is what its source promises.
pub(super) fn check_rows(c: &InferenceCache, keys: &[u64], rows: &[f32], src: &[Source]) {
    let d = c.cfg.dim;
    for (j, (&k, &s)) in keys.iter().zip(src).enumerate() {
        let (t, id) = split_key(k);
        let exact = row_of(usize::from(t), id, d);
        let got = &rows[j * d..(j + 1) * d];
        let level = match s {
            Source::Store => {
                assert_eq!(got, &exact[..], "a store row is exact");
                continue;
            }
            Source::Surrogate => continue,
            Source::L1 => 0,
            Source::L2 => 1,
        };
        let codec = c.cfg.levels[level].codec.codec();
        let mut code = vec![0u8; codec.bytes_per_row(d)];
        codec.encode(&exact, &mut code);
        let mut want = vec![0f32; d];
        codec.decode(&code, &mut want);
        assert_eq!(got, &want[..], "a level-{level} hit is decode(encode(row)) of its codec");
    }
}

/// The row-holding policies, as the tests below build caches with them (S = `t` tables).
pub(super) fn slot_policies(t: u8) -> Vec<PolicyConfig> {
    vec![
        PolicyConfig::GroupLfu(GroupLfuConfig { max_score: t, ..Default::default() }),
        PolicyConfig::GroupAssoc(crate::GroupAssocConfig { max_score: t, ..Default::default() }),
        // Per-key policies do not pin a request: a miss may evict a key of the same
        // request that hit, and a later key of it admit that key again (a new slot).
        PolicyConfig::Lru,
        PolicyConfig::Lfu(Default::default()),
    ]
}

/// Surrogates over row_of rows of every table, nearest neighbour within a loose bound.
pub(super) fn surrogates(tables: usize, rows: u64, d: usize) -> Vec<Option<SurrogateTable>> {
    let cfg = crate::surrogate::SurrogateConfig {
        max_dist: 1.5,
        popularity: false,
        ..Default::default()
    };
    (0..tables)
        .map(|t| {
            let ids: Vec<u64> = (0..rows).collect();
            let flat: Vec<f32> = ids.iter().flat_map(|&i| row_of(t, i, d)).collect();
            Some(crate::surrogate::build(&ids, &flat, d, None, &cfg, 1).unwrap().into())
        })
        .collect()
}

/// The synthetic trace of the surrogate tests: 4 tables of up to 400 ids, 300 contexts.
pub(super) fn four_tables(seed: u64, num_requests: usize) -> Trace {
    Synthetic {
        num_requests,
        num_tables: 4,
        num_contexts: 300,
        max_table_size: 400,
        seed,
        ..Default::default()
    }
    .generate()
    .unwrap()
}

/// What `src` promises for row `id` of table `t`: exact from the store or an f32 level, the
/// codec's `decode(encode(row))` from the others.
pub(super) fn promised(c: &InferenceCache, t: u16, id: u64, src: Source) -> Vec<f32> {
    let d = c.cfg.dim;
    let exact = row_of(usize::from(t), id, d);
    let level = match src {
        Source::L1 => 0,
        Source::L2 => 1,
        Source::Store | Source::Surrogate => return exact,
    };
    let codec = c.cfg.levels[level].codec.codec();
    let mut code = vec![0u8; codec.bytes_per_row(d)];
    codec.encode(&exact, &mut code);
    let mut want = vec![0f32; d];
    codec.decode(&code, &mut want);
    want
}
