//! The cache's keys: a table and a raw 64-bit id, and the u64 the policies know them by.

/// One key of the cache: table `t` and its raw id as one u128, `t << 64 | id` (every id bit
/// is the caller's).
pub(super) type Key = u128;

/// The key of row `id` of table `table`.
#[inline]
pub(super) fn key_of(table: u16, id: u64) -> Key {
    u128::from(table) << 64 | u128::from(id)
}

/// The table of `key`.
#[inline]
pub(super) fn table_of(key: Key) -> u16 {
    (key >> 64) as u16
}

/// The raw id of `key`.
#[inline]
pub(super) fn id_of(key: Key) -> u64 {
    key as u64
}

/// Table `t`'s constant: `(t + 1)` times 2^64/φ (odd, so distinct tables get distinct
/// constants), spread over all 64 bits; one multiply on the lookup path.
#[inline]
pub(super) fn table_salt(table: u16) -> u64 {
    (u64::from(table) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The u64 the policies know `key` by: its id XOR its table's constant, so for one table a
/// bijection of the ids (see the module docs for keys of two tables).
#[inline]
pub(super) fn policy_key(key: Key) -> u64 {
    id_of(key) ^ table_salt(table_of(key))
}

/// The key of table `table` whose policy key is `pk` (the inverse of [`policy_key`]).
#[inline]
pub(super) fn key_from_policy(table: u16, pk: u64) -> Key {
    key_of(table, pk ^ table_salt(table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::testing::*;
    use crate::cache::*;
    use crate::codec::CodecKind;
    use crate::trace::SplitMix64;
    use embstore_policy::index::fmix64;

    /// Raw 64-bit ids, as int64 users (TorchRec, HugeCTR: hashed, negative) and uint64 users
    /// have them: -1 (= 2^64 - 1 as uint64), -2, -2^63, 2^63 - 1, 2^48, a hashed id are cached and
    /// served exactly, and the same raw id in two tables is two keys with two rows. (Before,
    /// the cache's keys were `table << 48 | id`: no id at or past 2^48 could be given.)
    #[test]
    fn any_64_bit_id_is_cached_and_served_exactly_in_each_table() {
        let d = 4;
        let ids: [u64; 7] =
            [-1i64 as u64, -2i64 as u64, i64::MIN as u64, i64::MAX as u64, 1 << 48, fmix64(42), 0];
        for policy in slot_policies(2) {
            for two_levels in [false, true] {
                let mut cfg = CacheConfig::new(2, d, 100_000);
                cfg.policy = policy.clone();
                if two_levels {
                    cfg.levels = vec![
                        LevelConfig { codec: CodecKind::F32, share: 0.5 },
                        LevelConfig { codec: CodecKind::Int8, share: 0.5 },
                    ];
                }
                let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
                for round in 0..2 {
                    for &id in &ids {
                        let (tables, both) = ([0u16, 1], [id, id]);
                        let mut rows = vec![0.0; 2 * d];
                        let mut src = [Source::Store; 2];
                        c.lookup_ids(&tables, &both, &[0, 2], &mut rows, Some(&mut src)).unwrap();
                        let want = if round == 0 { Source::Store } else { Source::L1 };
                        let ctx = format!("{}, two levels {two_levels}, id {id:#x}", policy.name());
                        assert_eq!(src, [want; 2], "{ctx}");
                        assert_eq!(&rows[..d], &row_of(0, id, d)[..], "{ctx}");
                        assert_eq!(&rows[d..], &row_of(1, id, d)[..], "{ctx}");
                    }
                }
                assert_eq!(c.stats().perfect, ids.len() as u64, "{}", policy.name());
            }
        }
    }

    /// Random wide ids through evictions, demotions and drops (a budget of a few dozen entries,
    /// two levels, three tables; seed printed): every row is exactly what its source promises.
    #[test]
    fn wide_ids_through_eviction_and_demotion_keep_their_rows() {
        let seed = 0x64_b175;
        println!("seed {seed:#x}");
        let (t, d) = (3usize, 4);
        let mut rng = SplitMix64::new(seed);
        let pool: Vec<u64> = (0..1_000).map(|_| rng.next_u64()).collect();
        for policy in slot_policies(t as u8) {
            let mut cfg = CacheConfig::new(t, d, 12_000);
            cfg.policy = policy.clone();
            cfg.levels = vec![
                LevelConfig { codec: CodecKind::F32, share: 0.5 },
                LevelConfig { codec: CodecKind::Int8, share: 0.5 },
            ];
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let mut seen = [0u64; 4];
            for _ in 0..400 {
                let batch = 1 + rng.below(3) as usize;
                let tables: Vec<u16> = (0..batch * t).map(|j| (j % t) as u16).collect();
                // A small pool per table, skewed: hits, misses, evictions and demotions.
                let ids: Vec<u64> = (0..batch * t)
                    .map(|_| {
                        let top = rng.below(pool.len() as u64) + 1;
                        pool[rng.below(top) as usize]
                    })
                    .collect();
                let offsets: Vec<usize> = (0..=batch).map(|r| r * t).collect();
                let mut rows = vec![0.0; ids.len() * d];
                let mut src = vec![Source::Store; ids.len()];
                c.lookup_ids(&tables, &ids, &offsets, &mut rows, Some(&mut src)).unwrap();
                for j in 0..ids.len() {
                    seen[src[j] as usize] += 1;
                    let want = promised(&c, tables[j], ids[j], src[j]);
                    assert_eq!(&rows[j * d..(j + 1) * d], &want[..], "{} {j}", policy.name());
                }
            }
            let s = c.stats();
            assert!(seen[0] > 0 && seen[1] > 0 && seen[3] > 0, "{}: {seen:?}", policy.name());
            assert!(s.l1_evictions > 0 && s.demotions > 0 && s.drops > 0, "{s:?}");
        }
    }

    /// Two keys of different tables whose ids differ by exactly their tables' constants share
    /// one policy key: each is still served only its own row (a probe checks the slot's table),
    /// in separate requests and in one, while one holds the entry and after.
    #[test]
    fn keys_sharing_a_policy_key_are_never_served_each_others_row() {
        let d = 4;
        let a = 0x1234_5678_9abc_def0u64;
        let b = a ^ table_salt(0) ^ table_salt(1);
        assert_eq!(policy_key(key_of(0, a)), policy_key(key_of(1, b)));
        for policy in slot_policies(2) {
            let mut cfg = CacheConfig::new(2, d, 100_000);
            cfg.policy = policy.clone();
            let c = InferenceCache::new(cfg, mem(d), vec![]).unwrap();
            let requests: [[u64; 2]; 5] = [[a, 7], [5, b], [a, b], [a, 7], [5, b]];
            let mut sources = Vec::new();
            for ids in requests {
                let mut rows = vec![0.0; 2 * d];
                let mut src = [Source::Store; 2];
                c.lookup_ids(&[0, 1], &ids, &[0, 2], &mut rows, Some(&mut src)).unwrap();
                assert_eq!(&rows[..d], &row_of(0, ids[0], d)[..], "{}", policy.name());
                assert_eq!(&rows[d..], &row_of(1, ids[1], d)[..], "{}", policy.name());
                sources.push(src);
            }
            // (0, a) was cached first and keeps the entry; (1, b) is served from the store.
            assert_eq!(sources[2], [Source::L1, Source::Store], "{}", policy.name());
            assert_eq!(sources[3], [Source::L1, Source::L1], "{}", policy.name());
            assert_eq!(sources[4][1], Source::Store, "{}", policy.name());
        }
    }
}
