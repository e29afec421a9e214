//! The lookup pipeline: probe, approximate, fetch, commit, copy.

use super::key::{id_of, key_of, policy_key, table_of, Key};
use super::{CacheStats, InferenceCache, Shard, Source};
use crate::surrogate::SurrogateTable;
use crate::trace::split_key;
use crate::{Error, Result};
use embstore_policy::{Group, NO_SLOT};

/// Per-request scratch of one lookup: the request's distinct keys and what each got.
#[derive(Default)]
struct Scratch {
    /// Distinct keys of every request, request after request.
    keys: Vec<Key>,
    /// Their policy keys ([`policy_key`]).
    pks: Vec<u64>,
    /// `keys[offsets[r]..offsets[r + 1]]` belong to request `r`.
    offsets: Vec<usize>,
    /// For each input position, its distinct key's index in `keys`.
    map: Vec<u32>,
    /// Each distinct key's source at probe time.
    src: Vec<Source>,
    /// Each distinct key's shard.
    shard: Vec<u32>,
    /// Each distinct key's row (`[keys.len() × dim]`).
    vals: Vec<f32>,
    /// For a surrogate-served key: its surrogate's key (for L3's reference bit).
    approx_of: Vec<Key>,
}

impl InferenceCache {
    /// [`lookup_ids`](Self::lookup_ids) with trace keys, `table << 48 | id` ([`split_key`]):
    /// ids below 2^48 only, as [`crate::Trace`] and [`crate::evaluate`] carry them.
    pub fn lookup(
        &self,
        keys: &[u64],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        let keys: Vec<Key> = keys
            .iter()
            .map(|&k| {
                let (t, id) = split_key(k);
                key_of(t, id)
            })
            .collect();
        self.serve(&keys, offsets, out, sources)
    }

    /// Serves a batch of requests: key `j` is row `ids[j]` (any 64-bit id: hashed, or a
    /// negative int64 as its two's complement) of table `tables[j]`, and request `r` is keys
    /// `offsets[r]..offsets[r + 1]`. Writes each key's row into `out` (`[ids.len() × dim]`)
    /// and, when given, its [`Source`] into `sources`. Errors (nothing changes): `tables` and
    /// `ids` of different lengths, offsets that do not cover them, an empty request, a table
    /// number out of range, a wrong output length, a backing-store failure.
    pub fn lookup_ids(
        &self,
        tables: &[u16],
        ids: &[u64],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        if tables.len() != ids.len() {
            return Err(Error::shape(format!(
                "tables and ids must have the same length, got {} and {}",
                tables.len(),
                ids.len()
            )));
        }
        let keys: Vec<Key> = tables.iter().zip(ids).map(|(&t, &id)| key_of(t, id)).collect();
        self.serve(&keys, offsets, out, sources)
    }

    fn serve(
        &self,
        keys: &[Key],
        offsets: &[usize],
        out: &mut [f32],
        sources: Option<&mut [Source]>,
    ) -> Result<()> {
        let d = self.cfg.dim;
        self.check(keys, offsets, out, sources.as_deref())?;
        self.apply_ready();
        let mut sc = Scratch::default();
        self.dedup(keys, offsets, &mut sc);
        let mut stats = CacheStats::default();
        self.probe(&mut sc);
        self.approximate(&mut sc);
        let fetched = self.fetch(&mut sc, &mut stats)?;
        self.commit(&sc, &fetched, &mut stats)?;
        for (i, &u) in sc.map.iter().enumerate() {
            let u = u as usize;
            out[i * d..(i + 1) * d].copy_from_slice(&sc.vals[u * d..(u + 1) * d]);
        }
        if let Some(src) = sources {
            for (s, &u) in src.iter_mut().zip(&sc.map) {
                *s = sc.src[u as usize];
            }
        }
        tally(&sc, &mut stats);
        self.stats.lock().add(&stats);
        Ok(())
    }

    fn check(
        &self,
        keys: &[Key],
        offsets: &[usize],
        out: &[f32],
        sources: Option<&[Source]>,
    ) -> Result<()> {
        if offsets.first() != Some(&0) || offsets.last() != Some(&keys.len()) {
            return Err(Error::shape(format!(
                "offsets must run from 0 to the number of keys ({}), got {:?}..{:?}",
                keys.len(),
                offsets.first(),
                offsets.last()
            )));
        }
        if let Some(r) = offsets.windows(2).position(|w| w[1] <= w[0]) {
            return Err(Error::shape(format!(
                "request {r} is empty (or offsets decrease): every request needs at least one key"
            )));
        }
        if let Some(&k) = keys.iter().find(|&&k| usize::from(table_of(k)) >= self.cfg.num_tables) {
            return Err(Error::unknown_name(format!(
                "id {} names table {}, but the cache has {} tables",
                id_of(k),
                table_of(k),
                self.cfg.num_tables
            )));
        }
        if out.len() != keys.len() * self.cfg.dim {
            return Err(Error::shape(format!(
                "output must hold {} x {} values, got {}",
                keys.len(),
                self.cfg.dim,
                out.len()
            )));
        }
        if let Some(s) = sources {
            if s.len() != keys.len() {
                return Err(Error::shape(format!(
                    "sources must hold {} entries, got {}",
                    keys.len(),
                    s.len()
                )));
            }
        }
        Ok(())
    }

    fn dedup(&self, keys: &[Key], offsets: &[usize], sc: &mut Scratch) {
        sc.offsets.reserve(offsets.len());
        sc.keys.reserve(keys.len());
        sc.pks.reserve(keys.len());
        sc.map.reserve(keys.len());
        sc.offsets.push(0);
        // By policy key (a u64 hashes faster than the u128 key); two keys of a request that
        // share one (different tables) are told apart by a scan of the request.
        let mut seen = hashbrown::HashMap::<u64, u32>::new();
        for w in offsets.windows(2) {
            seen.clear();
            let start = sc.keys.len();
            for &k in &keys[w[0]..w[1]] {
                let pk = policy_key(k);
                let fresh = |sc: &mut Scratch| {
                    sc.keys.push(k);
                    sc.pks.push(pk);
                    (sc.keys.len() - 1) as u32
                };
                let u = match seen.entry(pk) {
                    hashbrown::hash_map::Entry::Vacant(e) => *e.insert(fresh(sc)),
                    hashbrown::hash_map::Entry::Occupied(e) if sc.keys[*e.get() as usize] == k => {
                        *e.get()
                    }
                    hashbrown::hash_map::Entry::Occupied(_) => {
                        match sc.keys[start..].iter().position(|&x| x == k) {
                            Some(p) => (start + p) as u32,
                            None => fresh(sc),
                        }
                    }
                };
                sc.map.push(u);
            }
            sc.offsets.push(sc.keys.len());
        }
        let n = sc.keys.len();
        sc.src = vec![Source::Store; n];
        sc.shard = sc.pks.iter().map(|&pk| self.shard_of_pk(pk) as u32).collect();
        sc.vals = vec![0.0; n * self.cfg.dim];
        sc.approx_of = vec![Key::MAX; n];
    }

    /// P1: exact hits, against the state before the batch.
    fn probe(&self, sc: &mut Scratch) {
        let d = self.cfg.dim;
        for (si, shard) in self.shards.iter().enumerate() {
            let s = shard.read();
            for u in 0..sc.keys.len() {
                if sc.shard[u] as usize != si {
                    continue;
                }
                let v = &mut sc.vals[u * d..(u + 1) * d];
                for (ti, t) in s.levels.iter().enumerate() {
                    if t.get_pk(sc.pks[u], table_of(sc.keys[u]), v) {
                        sc.src[u] = if ti == 0 { Source::L1 } else { Source::L2 };
                        break;
                    }
                }
            }
        }
    }

    /// P1 continued: surrogates for misses, at most `max_approx` per request.
    fn approximate(&self, sc: &mut Scratch) {
        if self.shards[0].read().l3.is_none() || self.cfg.max_approx_per_request == 0 {
            return;
        }
        let d = self.cfg.dim;
        for r in 0..sc.offsets.len() - 1 {
            let mut used = 0;
            for u in sc.offsets[r]..sc.offsets[r + 1] {
                if used == self.cfg.max_approx_per_request {
                    break;
                }
                if sc.src[u] != Source::Store {
                    continue;
                }
                let key = sc.keys[u];
                let (table, id) = (table_of(key), id_of(key));
                let entry = self.shards[sc.shard[u] as usize]
                    .read()
                    .l3
                    .as_ref()
                    .and_then(|l3| l3.peek_tagged(sc.pks[u]));
                // An entry of another table's key with the same policy key is not this key's.
                let Some((alt, dist)) = entry.and_then(|(t, a, d)| (t == table).then_some((a, d)))
                else {
                    continue;
                };
                if alt == id || dist > self.cfg.max_surrogate_dist {
                    continue;
                }
                let alt_key = key_of(table, alt);
                let s = self.shards[self.shard_of(alt_key)].read();
                let v = &mut sc.vals[u * d..(u + 1) * d];
                if s.levels.iter().any(|t| t.get(alt_key, v)) {
                    sc.src[u] = Source::Surrogate;
                    sc.approx_of[u] = alt_key;
                    used += 1;
                }
            }
        }
    }

    /// P2: the batch's distinct full misses, one backing read per table. Returns key → row
    /// index into the rows written into `sc.vals` of the first request that missed it.
    fn fetch(
        &self,
        sc: &mut Scratch,
        stats: &mut CacheStats,
    ) -> Result<hashbrown::HashMap<Key, u32>> {
        let d = self.cfg.dim;
        let mut first = hashbrown::HashMap::<Key, u32>::new();
        let mut by_table: Vec<Vec<u64>> = vec![Vec::new(); self.cfg.num_tables];
        for u in 0..sc.keys.len() {
            if sc.src[u] == Source::Store && !first.contains_key(&sc.keys[u]) {
                first.insert(sc.keys[u], u as u32);
                by_table[usize::from(table_of(sc.keys[u]))].push(id_of(sc.keys[u]));
            }
        }
        let mut rows = Vec::new();
        for (t, ids) in by_table.iter().enumerate() {
            if ids.is_empty() {
                continue;
            }
            rows.resize(ids.len() * d, 0.0);
            self.read_backing(t, ids, &mut rows, stats)?;
            for (j, &id) in ids.iter().enumerate() {
                let u = first[&key_of(t as u16, id)] as usize;
                sc.vals[u * d..(u + 1) * d].copy_from_slice(&rows[j * d..(j + 1) * d]);
            }
        }
        for u in 0..sc.keys.len() {
            if sc.src[u] == Source::Store {
                let f = first[&sc.keys[u]] as usize;
                if f != u {
                    sc.vals.copy_within(f * d..(f + 1) * d, u * d);
                }
            }
        }
        Ok(first)
    }

    fn read_backing(
        &self,
        table: usize,
        ids: &[u64],
        out: &mut [f32],
        stats: &mut CacheStats,
    ) -> Result<()> {
        stats.backing_reads += 1;
        self.backing
            .read(table, ids, out)
            .map_err(|e| Error::backing(format!("backing store read of table {table} failed: {e}")))
    }

    /// P3: requests in order, shards in ascending order.
    fn commit(
        &self,
        sc: &Scratch,
        fetched: &hashbrown::HashMap<Key, u32>,
        stats: &mut CacheStats,
    ) -> Result<()> {
        // The policies' keys of L1's and L2's part of a request, and L1's as keys.
        let mut l1_keys = Vec::new();
        let mut l1_full = Vec::new();
        let mut l2_keys = Vec::new();
        for r in 0..sc.offsets.len() - 1 {
            let (lo, hi) = (sc.offsets[r], sc.offsets[r + 1]);
            let g = hi - lo;
            let h = sc.src[lo..hi].iter().filter(|&&s| s != Source::Store).count();
            for (si, shard) in self.shards.iter().enumerate() {
                if !(lo..hi).any(|u| sc.shard[u] as usize == si) {
                    continue;
                }
                let mut guard = shard.write();
                let s = &mut *guard;
                l1_keys.clear();
                l1_full.clear();
                l2_keys.clear();
                let mut l1_probe_hits = 0;
                let mut l2_probe_hits = 0;
                for u in lo..hi {
                    if sc.shard[u] as usize != si || sc.src[u] == Source::Surrogate {
                        continue;
                    }
                    let pk = sc.pks[u];
                    if s.levels.len() > 1 && s.levels[1].policy.contains(pk) {
                        l2_keys.push(pk);
                        l2_probe_hits += usize::from(sc.src[u] != Source::Store);
                    } else {
                        l1_keys.push(pk);
                        l1_full.push(sc.keys[u]);
                        l1_probe_hits += usize::from(sc.src[u] != Source::Store);
                    }
                }
                if !l2_keys.is_empty() {
                    let group = Group { other_hits: h - l2_probe_hits, size: g };
                    let Shard { levels, out2, .. } = s;
                    levels[1].policy.access_group_into(&l2_keys, group, out2);
                    // Hits only: nothing is admitted or evicted.
                }
                if !l1_keys.is_empty() {
                    // Keys this commit will admit that the batch did not fetch (an earlier
                    // request of the batch evicted them after they hit at probe): read them
                    // first, so a failed read changes nothing.
                    let extra = self.refetch(s, &l1_full, fetched, stats)?;
                    let group = Group { other_hits: h - l1_probe_hits, size: g };
                    {
                        let Shard { levels, out, .. } = s;
                        levels[0].policy.access_group_into(&l1_keys, group, out);
                    }
                    stats.bypasses += u64::from(s.out.bypassed);
                    self.settle_l1(s, &l1_keys, &l1_full, sc, fetched, &extra, stats);
                }
                // L3 reference bits of the surrogates used.
                if let Some(l3) = &mut s.l3 {
                    for u in lo..hi {
                        if sc.shard[u] as usize == si && sc.src[u] == Source::Surrogate {
                            l3.get(sc.pks[u]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// After an L1 commit of `keys` (policy keys; `full[j]` is `keys[j]`'s key): demote its
    /// victims, then write the rows of the keys it admitted (from this batch's fetch, or read
    /// again if an earlier request of the batch evicted a key that hit at probe). Victims are
    /// named by their slots' tags before any slot is written.
    #[allow(clippy::too_many_arguments)]
    fn settle_l1(
        &self,
        s: &mut Shard,
        keys: &[u64],
        full: &[Key],
        sc: &Scratch,
        fetched: &hashbrown::HashMap<Key, u32>,
        extra: &hashbrown::HashMap<Key, Vec<f32>>,
        stats: &mut CacheStats,
    ) {
        let d = self.cfg.dim;
        let evicted = std::mem::take(&mut s.out.evicted);
        let slots = std::mem::take(&mut s.out.evicted_slots);
        stats.l1_evictions += evicted.len() as u64;
        // Keys of this call that hit, were evicted by the commit and admitted again (policies
        // that do not pin a request: a miss evicted the key before its own turn): their coded
        // row, still in the old slot, moves to the new one below; they are not demoted.
        let mut moved: Vec<(u64, Key, Vec<u8>)> = Vec::new();
        for (&pk, &slot) in evicted.iter().zip(&slots) {
            let k = s.levels[0].key_in(slot, pk);
            // A request has a few dozen keys: a scan beats building a set per request.
            if let Some(j) = keys.iter().position(|&a| a == pk) {
                // A miss admitted and evicted within this call never had its row written.
                if !s.out.hit[j] {
                    continue;
                }
                if s.levels[0].policy.contains(pk) {
                    moved.push((pk, k, s.levels[0].row(slot).to_vec()));
                    continue;
                }
            }
            if !self.cfg.demote || s.levels.len() < 2 {
                self.feed_l3(s, k, stats);
                continue;
            }
            self.demote(s, slot, pk, k, stats);
        }
        for (pk, k, row) in &moved {
            if let Some(slot) = s.levels[0].policy.slot_of(*pk) {
                s.levels[0].write_coded(slot, *k, row);
            }
        }
        for (j, &pk) in keys.iter().enumerate() {
            if s.out.hit[j] {
                continue;
            }
            // The slot the commit reported, or a lookup for policies that report none.
            let slot = match s.out.slots.get(j) {
                Some(&slot) => Some(slot).filter(|&slot| slot != NO_SLOT),
                None => s.levels[0].policy.slot_of(pk),
            };
            let Some(slot) = slot else { continue };
            let k = full[j];
            let row = match fetched.get(&k) {
                Some(&f) => &sc.vals[f as usize * d..(f as usize + 1) * d],
                None => &extra[&k][..],
            };
            s.levels[0].write(slot, k, row);
        }
        s.out.evicted = evicted;
        s.out.evicted_slots = slots;
    }

    /// Moves L1's victim `k` (policy key `pk`, still in L1 slot `slot`) into L2: decoded and
    /// re-encoded, no I/O. What L2 evicts to make room goes on to L3.
    fn demote(&self, s: &mut Shard, slot: u32, pk: u64, k: Key, stats: &mut CacheStats) {
        let Shard { levels, out2, tmp, .. } = s;
        levels[0].codec.decode(levels[0].row(slot), tmp);
        levels[1].policy.admit(pk, 0, out2);
        let dropped: Vec<Key> = out2
            .evicted
            .iter()
            .zip(&out2.evicted_slots)
            .map(|(&p, &sl)| levels[1].key_in(sl, p))
            .collect();
        if let Some(slot2) = levels[1].policy.slot_of(pk) {
            levels[1].write(slot2, k, tmp);
            stats.demotions += 1;
        }
        for k2 in dropped {
            self.feed_l3(s, k2, stats);
        }
    }

    /// Rows of `keys` that are not in L1 now and were not fetched by the batch.
    fn refetch(
        &self,
        s: &Shard,
        keys: &[Key],
        fetched: &hashbrown::HashMap<Key, u32>,
        stats: &mut CacheStats,
    ) -> Result<hashbrown::HashMap<Key, Vec<f32>>> {
        let mut extra = hashbrown::HashMap::new();
        for &k in keys {
            if !fetched.contains_key(&k) && !s.levels[0].policy.contains(policy_key(k)) {
                let mut row = vec![0.0; self.cfg.dim];
                self.read_backing(usize::from(table_of(k)), &[id_of(k)], &mut row, stats)?;
                stats.refetches += 1;
                extra.insert(k, row);
            }
        }
        Ok(extra)
    }

    fn feed_l3(&self, s: &mut Shard, key: Key, stats: &mut CacheStats) {
        stats.drops += 1;
        let Some(l3) = &mut s.l3 else { return };
        let (t, id) = (table_of(key), id_of(key));
        let found = match &self.surrogates[usize::from(t)] {
            None => None,
            Some(SurrogateTable::Memory(m)) => m.get(id),
            Some(SurrogateTable::Disk(f)) => match &self.filler {
                Some(filler) => {
                    stats.l3_queue_drops += u64::from(!filler.push(key));
                    None
                }
                None => {
                    stats.l3_reads += 1;
                    f.get(id).unwrap_or_else(|_| {
                        stats.l3_read_errors += 1;
                        None
                    })
                }
            },
        };
        if let Some((alt, dist)) = found {
            l3.insert_tagged(policy_key(key), t, alt, dist);
            stats.l3_inserts += 1;
        }
    }
}

/// Adds each request's figures (its keys by source, perfect or served-perfect, its misses)
/// to `stats`.
fn tally(sc: &Scratch, stats: &mut CacheStats) {
    for r in 0..sc.offsets.len() - 1 {
        let srcs = &sc.src[sc.offsets[r]..sc.offsets[r + 1]];
        let count = |x: Source| srcs.iter().filter(|&&s| s == x).count();
        let (l1, l2, ap, miss) =
            (count(Source::L1), count(Source::L2), count(Source::Surrogate), count(Source::Store));
        stats.requests += 1;
        stats.keys += srcs.len() as u64;
        stats.l1_hits += l1 as u64;
        stats.l2_hits += l2 as u64;
        stats.approximated += ap as u64;
        stats.misses += miss as u64;
        stats.perfect += u64::from(ap + miss == 0);
        stats.served_perfect += u64::from(miss == 0);
        stats.note_request(miss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::testing::*;
    use crate::cache::*;
    use crate::codec::CodecKind;
    use crate::trace::{table_key, Synthetic};
    use crate::ErrorKind;
    use embstore_policy::PolicyConfig;
    use std::sync::atomic::Ordering;

    #[test]
    fn rows_are_exact_or_their_codecs_and_tiers_stay_exclusive() {
        for policy in slot_policies(5) {
            rows_exact_and_exclusive(policy);
        }
    }

    fn rows_exact_and_exclusive(policy: PolicyConfig) {
        let seed = 0x5eed_cace;
        println!("seed {seed:#x}, {}", policy.name());
        let d = 8;
        let trace = Synthetic {
            num_requests: 3_000,
            num_tables: 5,
            num_contexts: 400,
            max_table_size: 2_000,
            seed,
            ..Default::default()
        }
        .generate()
        .unwrap();
        let mut cfg = CacheConfig::new(5, d, 40_000);
        cfg.policy = policy;
        cfg.levels = vec![
            LevelConfig { codec: CodecKind::F32, share: 0.5 },
            LevelConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let mut seen = Vec::new();
        let mut l2_hits = 0;
        for r in trace.iter() {
            let mut rows = vec![0.0; r.len() * d];
            let mut src = vec![Source::Store; r.len()];
            c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
            check_rows(&c, r, &rows, &src);
            l2_hits += src.iter().filter(|&&s| s == Source::L2).count();
            seen.extend_from_slice(r);
        }
        seen.sort_unstable();
        seen.dedup();
        c.check_invariants(&seen).unwrap();
        let s = c.stats();
        assert_eq!(s.requests, 3_000);
        assert!(l2_hits > 0 && s.demotions > 0, "L2 is used: {s:?}");
        let m = c.memory();
        assert!(m.total_bytes <= 40_000 && m.total_bytes > 30_000, "{m:?}");
        assert!(m.metadata_bytes_per_entry <= 48.0, "{m:?}");
    }

    #[test]
    fn bad_input_is_a_typed_error_and_changes_nothing() {
        let d = 4;
        let m = mem(d);
        let c = InferenceCache::new(CacheConfig::new(2, d, 10_000), m.clone(), vec![]).unwrap();
        let k = |t, id| table_key(t, id).unwrap();
        let mut out = vec![0.0; 2 * d];
        let cases: Vec<(Vec<u64>, Vec<usize>, usize, ErrorKind)> = vec![
            (vec![k(0, 1), k(1, 1)], vec![0, 0, 2], 2, ErrorKind::ShapeMismatch), // empty request
            (vec![k(0, 1), k(5, 1)], vec![0, 2], 2, ErrorKind::UnknownName),      // unknown table
            (vec![k(0, 1), k(1, 1)], vec![0, 1], 2, ErrorKind::ShapeMismatch),    // offsets short
            (vec![k(0, 1), k(1, 1)], vec![0, 2], 1, ErrorKind::ShapeMismatch),    // output short
        ];
        for (keys, offs, rows, kind) in cases {
            let e = c.lookup(&keys, &offs, &mut out[..rows * d], None).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
        }
        assert_eq!(c.stats(), CacheStats::default());
        m.fail.store(true, Ordering::Relaxed);
        let keys = [k(0, 1), k(1, 1)];
        let e = c.lookup(&keys, &one(&keys), &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backing);
        assert!(e.to_string().contains("disk on fire"), "{e}");
        assert_eq!(c.memory().levels[0].len, 0, "a failed read caches nothing");
        m.fail.store(false, Ordering::Relaxed);
        c.lookup(&keys, &one(&keys), &mut out, None).unwrap();
        assert_eq!(&out[..d], &row_of(0, 1, d)[..]);
        // Budgets and configurations.
        let small = InferenceCache::new(CacheConfig::new(26, 64, 2_000), mem(64), vec![]);
        assert_eq!(small.unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut arc = CacheConfig::new(2, 4, 10_000);
        arc.policy = PolicyConfig::EvArc(Default::default());
        assert_eq!(
            InferenceCache::new(arc, mem(4), vec![]).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn a_request_larger_than_the_cache_is_served_uncached_and_counted() {
        for policy in slot_policies(2) {
            larger_than_the_cache(policy);
        }
    }

    fn larger_than_the_cache(policy: PolicyConfig) {
        let d = 2;
        let mut cfg = CacheConfig::new(2, d, 4_000);
        cfg.policy = policy;
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let cap = c.capacity();
        let keys: Vec<u64> =
            (0..cap as u64 + 10).map(|i| table_key((i % 2) as u16, i).unwrap()).collect();
        let mut rows = vec![0.0; keys.len() * d];
        let mut src = vec![Source::L1; keys.len()];
        c.lookup(&keys, &one(&keys), &mut rows, Some(&mut src)).unwrap();
        check_rows(&c, &keys, &rows, &src);
        assert_eq!(c.stats().bypasses, 1);
        c.check_invariants(&keys).unwrap();
    }

    #[test]
    fn batches_and_duplicates_serve_every_position() {
        for policy in slot_policies(2) {
            batches_and_duplicates(policy);
        }
    }

    fn batches_and_duplicates(policy: PolicyConfig) {
        let d = 3;
        let m = mem(d);
        let mut cfg = CacheConfig::new(2, d, 8_000);
        cfg.policy = policy;
        let c = InferenceCache::new(cfg, m.clone(), vec![]).unwrap();
        let k = |t, id| table_key(t, id).unwrap();
        // Three requests; the first repeats a key, the second and third share keys.
        let keys = [k(0, 1), k(0, 1), k(1, 2), k(0, 3), k(1, 4), k(0, 3), k(1, 4)];
        let offs = [0, 3, 5, 7];
        let mut rows = vec![0.0; keys.len() * d];
        let mut src = vec![Source::L1; keys.len()];
        c.lookup(&keys, &offs, &mut rows, Some(&mut src)).unwrap();
        check_rows(&c, &keys, &rows, &src);
        // Requests of a batch are concurrent: all missed, each distinct key read once.
        assert!(src.iter().all(|&s| s == Source::Store));
        assert_eq!(m.reads.load(Ordering::Relaxed), 4);
        let s = c.stats();
        assert_eq!((s.requests, s.keys, s.misses), (3, 6, 6));
        c.lookup(&keys, &offs, &mut rows, Some(&mut src)).unwrap();
        assert!(src.iter().all(|&s| s == Source::L1));
        assert_eq!(c.stats().perfect, 3);
    }

    #[test]
    fn shards_serve_correct_rows_from_many_threads() {
        for policy in slot_policies(4) {
            shards_from_threads(policy);
        }
    }

    fn shards_from_threads(policy: PolicyConfig) {
        let d = 4;
        let mut cfg = CacheConfig::new(4, d, 200_000);
        cfg.policy = policy;
        cfg.shards = 4;
        cfg.levels = vec![
            LevelConfig { codec: CodecKind::F32, share: 0.4 },
            LevelConfig { codec: CodecKind::F16, share: 0.6 },
        ];
        let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
        let trace = Synthetic {
            num_requests: 4_000,
            num_tables: 4,
            num_contexts: 300,
            max_table_size: 5_000,
            seed: 11,
            ..Default::default()
        }
        .generate()
        .unwrap();
        std::thread::scope(|s| {
            for part in 0..4 {
                let (c, trace) = (&c, &trace);
                s.spawn(move || {
                    for (i, r) in trace.iter().enumerate() {
                        if i % 4 != part {
                            continue;
                        }
                        let mut rows = vec![0.0; r.len() * d];
                        let mut src = vec![Source::Store; r.len()];
                        c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                        check_rows(c, r, &rows, &src);
                    }
                });
            }
        });
        assert_eq!(c.stats().requests, 4_000);
        assert!(c.stats().perfect > 0);
        c.check_invariants(trace.keys()).unwrap();
    }

    #[test]
    fn surrogates_are_resident_capped_and_change_nothing() {
        for policy in slot_policies(4) {
            surrogates_resident_capped(policy);
        }
    }

    fn surrogates_resident_capped(policy: PolicyConfig) {
        let seed = 0xa1_7e;
        println!("seed {seed:#x}, {}", policy.name());
        let (t, d) = (4, 6);
        let trace = four_tables(seed, 3_000);
        let sur = surrogates(t, 400, d);
        // The surrogate builds in memory are counted: 18 B a row of every table.
        let builds = 4 * 400 * 18;
        let mut cfg = CacheConfig::new(t, d, 12_000 + builds);
        cfg.policy = policy;
        cfg.levels = vec![
            LevelConfig { codec: CodecKind::F32, share: 0.5 },
            LevelConfig { codec: CodecKind::Int8, share: 0.5 },
        ];
        cfg.surrogate_share = 0.1;
        cfg.max_approx_per_request = 1;
        let with = InferenceCache::new(cfg.clone(), mem(d), sur.clone()).unwrap();
        assert_eq!(with.memory().surrogate_table_bytes, builds);
        let mut tight = cfg.clone();
        tight.memory_budget_bytes = builds;
        let e = InferenceCache::new(tight, mem(d), sur.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("open the builds from disk"), "{e}");
        // A build of another dim, in any table (here the second), is a ShapeMismatch.
        let mut odd = sur.clone();
        odd[1] = surrogates(1, 50, d + 1).pop().unwrap();
        let e = InferenceCache::new(cfg.clone(), mem(d), odd).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        assert!(e.message().contains("table 1 were built from rows of dim 7"), "{e}");
        let mut zero = cfg.clone();
        zero.max_approx_per_request = 0;
        let capped_off = InferenceCache::new(zero, mem(d), sur.clone()).unwrap();
        let mut plain = cfg.clone();
        plain.memory_budget_bytes = 10_800; // the budget less builds and L3's 10 %: same levels
        let without = InferenceCache::new(plain, mem(d), vec![]).unwrap();
        let mut approx = 0;
        for r in trace.iter() {
            let run = |c: &InferenceCache| {
                let mut rows = vec![0.0; r.len() * d];
                let mut src = vec![Source::Store; r.len()];
                c.lookup(r, &one(r), &mut rows, Some(&mut src)).unwrap();
                (rows, src)
            };
            // Which surrogates are resident before the request (probe-time residency), with
            // their rows then: a commit may evict a surrogate (it is not a key of the request,
            // so nothing pins it), but the row served is the one read at probe time.
            let resident: Vec<Option<(Key, Option<Vec<f32>>)>> = r
                .iter()
                .map(|&k| {
                    let (t, id) = split_key(k);
                    let k = key_of(t, id);
                    let s = with.shards[with.shard_of(k)].read();
                    let alt = s.l3.as_ref().and_then(|l3| l3.peek(policy_key(k)))?.0;
                    let alt = key_of(t, alt);
                    let sh = with.shards[with.shard_of(alt)].read();
                    let mut v = vec![0.0; d];
                    Some((alt, sh.levels.iter().any(|level| level.get(alt, &mut v)).then_some(v)))
                })
                .collect();
            let (rows, src) = run(&with);
            check_rows(&with, r, &rows, &src);
            let n = src.iter().filter(|&&s| s == Source::Surrogate).count();
            assert!(n <= 1, "at most max_approx surrogates per request");
            approx += n;
            for (j, &s) in src.iter().enumerate() {
                if s == Source::Surrogate {
                    let (alt, row) = resident[j].clone().expect("a surrogate comes from L3");
                    let (t, id) = split_key(r[j]);
                    let k = key_of(t, id);
                    assert_ne!(alt, k);
                    let want = row.expect("the surrogate was resident at probe time");
                    assert_eq!(&rows[j * d..(j + 1) * d], &want[..], "the surrogate's own row");
                    let sh = with.shards[with.shard_of(k)].read();
                    assert!(
                        !sh.levels.iter().any(|level| level.slot_of(k).is_some()),
                        "not inserted"
                    );
                }
            }
            // max_approx = 0 is L1 + L2 alone, bit for bit (same level sizes: L3's share of
            // the budget is taken in both, so compare against capped_off, not `without`).
            let (a, sa) = run(&capped_off);
            assert!(sa.iter().all(|&s| s != Source::Surrogate));
            let (b, sb) = run(&without);
            assert_eq!((a, sa), (b, sb));
        }
        assert_eq!(capped_off.capacity(), without.capacity());
        assert!(approx > 0, "some surrogates served");
        let s = with.stats();
        assert_eq!(s.approximated as usize, approx);
        assert!(s.served_perfect >= s.perfect);
        let m = with.memory();
        assert!(m.l3_len <= m.l3_capacity && m.total_bytes <= cfg.memory_budget_bytes, "{m:?}");
    }

    #[test]
    fn lookup_ids_refuses_tables_and_ids_of_different_lengths() {
        let d = 4;
        let c = InferenceCache::new(CacheConfig::new(2, d, 10_000), mem(d), vec![]).unwrap();
        let mut out = vec![0.0; 2 * d];
        let e = c.lookup_ids(&[0], &[1, 2], &[0, 2], &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
        let e = c.lookup_ids(&[0, 2], &[1, 2], &[0, 2], &mut out, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownName);
        assert_eq!(c.stats().requests, 0);
    }
}
