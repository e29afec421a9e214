//! Model-based tests: NeighborHash against `std::collections::HashMap` over random operation
//! sequences, through growth and up to the maximum load factor, with the chain-invariant checker
//! after mutations. Seeds are printed so a failure can be replayed: proptest prints the minimal
//! failing sequence (and `PROPTEST_RNG_SEED=<n>` replays a run); the stress tests print their seed
//! and take `EMBSTORE_TEST_SEED=<n>`.

use std::collections::HashMap;

use embstore_common::SplitMix64;
use embstore_index::{Config, Error, ErrorKind, NeighborHash, MAX_PAYLOAD, MISSING};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u64),
    Remove(u64),
    Get(u64),
    InsertBatch(Vec<(u64, u64)>),
    GetBatch(Vec<u64>),
    Clear,
}

/// Keys that collide a lot (a small space), structured feature ids, extremes and anything.
fn key() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..48,
        2 => (0u64..64).prop_map(|j| j << 40),
        1 => (0u64..64).prop_map(|j| (j << 44) | 7),
        1 => Just(u64::MAX),
        1 => Just(0u64),
        2 => any::<u64>(),
    ]
}

fn payload() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, Just(MAX_PAYLOAD), 0..=MAX_PAYLOAD]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (key(), payload()).prop_map(|(k, p)| Op::Insert(k, p)),
        4 => key().prop_map(Op::Remove),
        3 => key().prop_map(Op::Get),
        1 => prop::collection::vec((key(), payload()), 0..40).prop_map(Op::InsertBatch),
        1 => prop::collection::vec(key(), 0..70).prop_map(Op::GetBatch),
        1 => Just(Op::Clear).prop_filter("rare", |_| true),
    ]
}

fn check_all(t: &NeighborHash, model: &HashMap<u64, u64>) -> Result<(), TestCaseError> {
    t.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(t.len(), model.len());
    for (&k, &v) in model {
        prop_assert_eq!(t.get(k), Some(v), "key {}", k);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_a_hashmap(
        ops in prop::collection::vec(op(), 1..250),
        lf in prop_oneof![Just(0.8), 0.5f64..0.95],
        slots in prop_oneof![Just(8usize), 8usize..300],
    ) {
        // Any slot count (rounded to whole cachelines): homes scale to it.
        let mut t = NeighborHash::with_config(Config { slots, max_load_factor: lf, ..Config::default() })
            .unwrap();
        prop_assert_eq!(t.capacity(), slots.next_multiple_of(4));
        let mut model = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(k, p) => prop_assert_eq!(t.insert(k, p).unwrap(), model.insert(k, p)),
                Op::Remove(k) => prop_assert_eq!(t.remove(k), model.remove(&k)),
                Op::Get(k) => prop_assert_eq!(t.get(k), model.get(&k).copied()),
                Op::InsertBatch(pairs) => {
                    let (keys, payloads): (Vec<u64>, Vec<u64>) = pairs.into_iter().unzip();
                    t.insert_batch(&keys, &payloads).unwrap();
                    model.extend(keys.into_iter().zip(payloads));
                }
                Op::GetBatch(keys) => {
                    let mut out = vec![0; keys.len()];
                    let found = t.get_batch(&keys, &mut out).unwrap();
                    let expect: Vec<u64> =
                        keys.iter().map(|k| model.get(k).copied().unwrap_or(MISSING)).collect();
                    prop_assert_eq!(&out, &expect);
                    prop_assert_eq!(found, expect.iter().filter(|&&p| p != MISSING).count());
                }
                Op::Clear => {
                    t.clear();
                    model.clear();
                }
            }
            prop_assert!(t.load_factor() <= lf.clamp(0.05, 0.95) + 1e-9);
            t.check_invariants().map_err(TestCaseError::fail)?;
        }
        check_all(&t, &model)?;
    }

    #[test]
    fn rejected_payloads_change_nothing(
        keys in prop::collection::vec(key(), 1..50),
        bad in (MAX_PAYLOAD + 1)..=u64::MAX,
    ) {
        let mut t = NeighborHash::new();
        let mut model = HashMap::new();
        for (i, &k) in keys.iter().enumerate() {
            t.insert(k, i as u64).unwrap();
            model.insert(k, i as u64);
        }
        let mut payloads: Vec<u64> = (0..keys.len() as u64).map(|p| p + 1).collect();
        let at = keys.len() / 2;
        payloads[at] = bad;
        prop_assert_eq!(
            t.insert_batch(&keys, &payloads),
            Err(payload_out_of_range(bad))
        );
        prop_assert_eq!(t.insert(keys[0], bad), Err(payload_out_of_range(bad)));
        check_all(&t, &model)?;
    }
}

/// A small, seedable generator for the stress tests (the shared SplitMix64; `below` by modulo,
/// as these tests have always drawn, so old seeds replay).
struct Rng(SplitMix64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The error an out-of-range payload gets: its kind and exact message.
fn payload_out_of_range(payload: u64) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("payload {payload} out of range: payloads must be < 2^52 ({})", MAX_PAYLOAD + 1),
    )
}

fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("EMBSTORE_TEST_SEED") {
        Ok(s) => vec![s.parse().expect("EMBSTORE_TEST_SEED must be a u64")],
        Err(_) => (0..count).map(|i| 0x5eed_0000 + i).collect(),
    }
}

/// Churn near the maximum load factor: inserts, overwrites and deletes at random in a table
/// held at 0.75–0.8 load, checked against the model and the invariants.
#[test]
fn churn_at_max_load_factor() {
    for seed in seeds(6) {
        eprintln!("churn_at_max_load_factor: seed {seed} (replay with EMBSTORE_TEST_SEED={seed})");
        let mut rng = Rng(SplitMix64::new(seed));
        let slots = 1 << 12;
        let mut t = NeighborHash::with_slots(slots).unwrap();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut keys: Vec<u64> = Vec::new();
        let structured = seed % 2 == 1;
        let max = (slots as f64 * 0.8) as usize;
        for step in 0..40_000u64 {
            let r = rng.below(100);
            if model.len() < max && (r < 55 || keys.is_empty()) {
                let k =
                    if structured { (rng.below(1 << 20) << 40) | rng.below(4) } else { rng.next() };
                let p = rng.below(MAX_PAYLOAD + 1);
                assert_eq!(t.insert(k, p).unwrap(), model.insert(k, p), "seed {seed} step {step}");
                keys.push(k);
            } else if r < 90 && !keys.is_empty() {
                let i = rng.below(keys.len() as u64) as usize;
                let k = keys.swap_remove(i);
                assert_eq!(t.remove(k), model.remove(&k), "seed {seed} step {step}");
            } else if !keys.is_empty() {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let p = rng.below(1000);
                assert_eq!(t.insert(k, p).unwrap(), model.insert(k, p), "seed {seed} step {step}");
            }
            if step % 4096 == 0 {
                t.check_invariants().unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            }
        }
        assert_eq!(t.capacity(), slots, "seed {seed}: never grew past the max load factor");
        t.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(t.len(), model.len(), "seed {seed}");
        let all: Vec<u64> = model.keys().copied().collect();
        let mut out = vec![0; all.len()];
        t.get_batch(&all, &mut out).unwrap();
        for (k, p) in all.iter().zip(&out) {
            assert_eq!(Some(p), model.get(k), "seed {seed} key {k}");
        }
    }
}

/// Growth from 8 slots to 2^17 and back down by deletes leaves every key reachable.
#[test]
fn growth_then_delete_everything() {
    for seed in seeds(2) {
        eprintln!("growth_then_delete_everything: seed {seed}");
        let mut rng = Rng(SplitMix64::new(seed));
        let mut t = NeighborHash::new();
        let keys: Vec<u64> = (0..100_000).map(|_| rng.next()).collect();
        let payloads: Vec<u64> = (0..100_000).collect();
        t.insert_batch(&keys, &payloads).unwrap();
        let mut model: HashMap<u64, u64> = keys.iter().copied().zip(payloads).collect();
        assert_eq!(t.len(), model.len());
        t.check_invariants().unwrap();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.remove(*k), model.remove(k), "seed {seed} at {i}");
            if i % 20_000 == 0 {
                t.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            }
        }
        assert!(t.is_empty());
        t.check_invariants().unwrap();
    }
}

/// Growth past 1 MiB of buckets goes in steps of 1.15x (non-power-of-two slot counts): after
/// every step all keys so far are found, by `get` and `get_batch`, absent keys are not, and the
/// chain invariants hold. Random keys for even seeds, `slot << 40 | n` for odd ones.
#[test]
fn growth_in_fine_steps_keeps_every_key() {
    for seed in seeds(2) {
        eprintln!("growth_in_fine_steps_keeps_every_key: seed {seed} (EMBSTORE_TEST_SEED={seed})");
        let mut rng = Rng(SplitMix64::new(seed));
        let structured = seed % 2 == 1;
        let mut t = NeighborHash::with_slots(1 << 16).unwrap();
        let mut keys: Vec<u64> = Vec::new();
        let mut capacities = vec![t.capacity()];
        while capacities.len() < 8 {
            let k = if structured { (rng.below(26) << 40) | keys.len() as u64 } else { rng.next() };
            if t.insert(k, keys.len() as u64).unwrap().is_some() {
                continue; // a repeated random key
            }
            keys.push(k);
            if t.capacity() != *capacities.last().unwrap() {
                let (old, new) = (*capacities.last().unwrap(), t.capacity());
                assert_eq!(new, (old * 23).div_ceil(20).next_multiple_of(4), "seed {seed}");
                assert_eq!(keys.len() - 1, (old as f64 * 0.8) as usize, "grew at the max load");
                t.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                let mut out = vec![0; keys.len()];
                assert_eq!(t.get_batch(&keys, &mut out), Ok(keys.len()), "seed {seed}");
                for (i, (&k, &p)) in keys.iter().zip(&out).enumerate() {
                    assert_eq!((p, t.get(k)), (i as u64, Some(i as u64)), "seed {seed} key {k}");
                }
                let absent: Vec<u64> = (0..1000).map(|_| rng.next() | 1 << 63).collect();
                let mut out = vec![0; absent.len()];
                let found = t.get_batch(&absent, &mut out).unwrap();
                assert_eq!(found, absent.iter().filter(|&&k| t.get(k).is_some()).count());
                capacities.push(new);
            }
        }
        eprintln!("  capacities {capacities:?}");
        assert!(capacities.iter().skip(1).all(|c| !c.is_power_of_two()));
    }
}
