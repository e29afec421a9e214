//! Deterministic structure checks (fixed seeds, no timing): how many cachelines a successful
//! lookup probes (APCL) with random and with structured keys.

use embstore_common::SplitMix64;
use embstore_index::NeighborHash;

const SLOTS: usize = 1 << 20;

fn filled(keys: impl Iterator<Item = u64>, load: f64) -> NeighborHash {
    let mut t = NeighborHash::with_slots(SLOTS).unwrap();
    let n = (SLOTS as f64 * load) as usize;
    for (i, k) in keys.take(n).enumerate() {
        t.insert(k, i as u64).unwrap();
    }
    assert_eq!((t.len(), t.capacity()), (n, SLOTS));
    t
}

fn random_keys(seed: u64) -> impl Iterator<Item = u64> {
    let mut rng = SplitMix64::new(seed);
    std::iter::repeat_with(move || rng.next_u64())
}

#[test]
fn apcl_random_keys_at_load_079() {
    let seed = 0xa5c1_0079;
    eprintln!("seed {seed}");
    let s = filled(random_keys(seed), 0.79).stats();
    eprintln!("{s:?}");
    let apcl = s.apcl.unwrap();
    assert!(apcl <= 1.15, "APCL {apcl} > 1.15 (seed {seed})");
    assert!(apcl >= 1.0);
}

#[test]
fn apcl_structured_keys() {
    let cases: [(&str, Box<dyn Iterator<Item = u64>>); 3] = [
        ("j << 40", Box::new((0u64..).map(|j| j << 40))),
        ("j << 44", Box::new((0u64..).map(|j| j << 44))),
        ("dense 0..n", Box::new(0u64..)),
    ];
    for (name, keys) in cases {
        let t = filled(keys, 0.79);
        let s = t.stats();
        eprintln!("{name}: {s:?}");
        let apcl = s.apcl.unwrap();
        assert!(apcl <= 1.3, "{name}: APCL {apcl} > 1.3");
        assert!(s.longest_chain < 32, "{name}: longest chain {}", s.longest_chain);
        t.check_invariants().unwrap();
    }
}
