//! Model-based tests: a table against a `HashMap` of rows stepped by the same optimizer formula,
//! through random batches (duplicates, misses, removes, re-inserts into freed slots, clears).
//! The optimizer formulas themselves are checked against torch in the Python parity tests.

use std::collections::HashMap;

use embstore_table::{Initializer, OnMiss, Optimizer, Table, TableConfig};
use proptest::prelude::*;

const D: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Lookup(Vec<u64>),
    Apply(Vec<u64>, Vec<f32>),
    Assign(Vec<u64>, Vec<f32>),
    Remove(Vec<u64>),
    Contains(Vec<u64>),
    Clear,
    /// Creates the rows of ids `BULK + start..BULK + start + n` (a lookup): enough rows for a
    /// one-shard table to pass the size at which sparse shards compact.
    Fill(u64, u64),
    /// Removes the ids `BULK + start..BULK + start + n`: may leave a shard sparse (compaction).
    Drop(u64, u64),
}

const BULK: u64 = 1 << 32;

fn ids() -> impl Strategy<Value = Vec<u64>> {
    // A small key space (many duplicates and re-hits) plus the extremes.
    prop::collection::vec(prop_oneof![0u64..40, Just(u64::MAX), Just(1 << 63)], 0..24)
}

fn rows(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-4.0f32..4.0, n * D)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => ids().prop_map(Op::Lookup),
        4 => ids().prop_flat_map(|k| { let n = k.len(); (Just(k), rows(n)) }).prop_map(|(k, g)| Op::Apply(k, g)),
        1 => ids().prop_flat_map(|k| { let n = k.len(); (Just(k), rows(n)) }).prop_map(|(k, v)| Op::Assign(k, v)),
        2 => ids().prop_map(Op::Remove),
        1 => ids().prop_map(Op::Contains),
        1 => Just(Op::Clear),
        1 => (0u64..4000, 0u64..9000).prop_map(|(s, n)| Op::Fill(s, n)),
        1 => (0u64..4000, 0u64..9000).prop_map(|(s, n)| Op::Drop(s, n)),
    ]
}

struct Model {
    opt: Optimizer,
    rows: HashMap<u64, (Vec<f32>, Vec<f32>)>,
    step: u64,
}

fn optimizers() -> impl Strategy<Value = Optimizer> {
    prop_oneof![
        Just(Optimizer::Sgd { lr: 0.1 }),
        Just(Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.1 }),
        Just(Optimizer::RowWiseAdagrad { lr: 0.1, eps: 1e-8, initial_accumulator_value: 0.0 }),
        Just(Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 }),
        Just(Optimizer::Ftrl {
            lr: 0.1,
            beta: 1.0,
            l1: 0.01,
            l2: 0.01,
            initial_accumulator_value: 0.0
        }),
    ]
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_model(
        opt in optimizers(),
        shards in prop_oneof![Just(1usize), Just(4), Just(16)],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let config = TableConfig::new("t", D)
            .with_optimizer(opt)
            .with_shards(shards)
            .with_seed(9)
            .with_initializer(Initializer::Uniform { low: -1.0, high: 1.0 });
        let table = Table::new(config).unwrap();
        let sd = table.state_dim();
        let mut m = Model { opt, rows: HashMap::new(), step: 0 };
        let init = |k: u64| {
            let mut v = vec![0.0; D];
            table.initial_row(k, &mut v);
            let mut s = vec![0.0; sd];
            opt.init_state(&mut s);
            (v, s)
        };
        for op in ops {
            match op {
                Op::Lookup(ks) => {
                    let mut out = vec![0.0; ks.len() * D];
                    let mut found = vec![false; ks.len()];
                    table.lookup(&ks, OnMiss::Init, &mut out, Some(&mut found)).unwrap();
                    let mut seen = std::collections::HashSet::new();
                    for (i, &k) in ks.iter().enumerate() {
                        // An id repeated in one batch is a miss each time it is read before
                        // the batch's inserts; only its first occurrence decides.
                        if seen.insert(k) {
                            prop_assert_eq!(found[i], m.rows.contains_key(&k));
                        }
                    }
                    for &k in &ks {
                        let r = m.rows.entry(k).or_insert_with(|| init(k));
                        let i = ks.iter().position(|&x| x == k).unwrap();
                        prop_assert!(close(&out[i * D..][..D], &r.0), "lookup {} {:?} {:?}", k, &out[i*D..][..D], r.0);
                    }
                }
                Op::Apply(ks, g) => {
                    table.apply_gradients(&ks, &g, None).unwrap();
                    if ks.is_empty() { continue; }
                    m.step += 1;
                    let mut sums: Vec<(u64, Vec<f32>)> = Vec::new();
                    for (i, &k) in ks.iter().enumerate() {
                        match sums.iter_mut().find(|(x, _)| *x == k) {
                            Some((_, s)) => s.iter_mut().zip(&g[i * D..][..D]).for_each(|(a, b)| *a += b),
                            None => sums.push((k, g[i * D..][..D].to_vec())),
                        }
                    }
                    for (k, s) in sums {
                        let r = m.rows.entry(k).or_insert_with(|| init(k));
                        assert!(m.opt.step(&mut r.0, &mut r.1, &s, m.opt.lr(), m.step));
                    }
                }
                Op::Assign(ks, v) => {
                    table.assign(&ks, &v).unwrap();
                    for (i, &k) in ks.iter().enumerate() {
                        let r = m.rows.entry(k).or_insert_with(|| init(k));
                        r.0.copy_from_slice(&v[i * D..][..D]);
                    }
                }
                Op::Remove(ks) => {
                    let n = table.remove(&ks).unwrap();
                    let mut expect = 0;
                    for k in ks { expect += m.rows.remove(&k).is_some() as usize; }
                    prop_assert_eq!(n, expect);
                }
                Op::Contains(ks) => {
                    let mut out = vec![false; ks.len()];
                    table.contains(&ks, &mut out).unwrap();
                    for (i, k) in ks.iter().enumerate() {
                        prop_assert_eq!(out[i], m.rows.contains_key(k));
                    }
                }
                Op::Clear => {
                    table.clear().unwrap();
                    m.rows.clear();
                    m.step = 0;
                }
                Op::Fill(start, n) => {
                    let ks: Vec<u64> = (BULK + start..BULK + start + n).collect();
                    table.lookup(&ks, OnMiss::Init, &mut vec![0.0; ks.len() * D], None).unwrap();
                    for k in ks {
                        m.rows.entry(k).or_insert_with(|| init(k));
                    }
                }
                Op::Drop(start, n) => {
                    let ks: Vec<u64> = (BULK + start..BULK + start + n).collect();
                    let removed = table.remove(&ks).unwrap();
                    let expect = ks.iter().filter(|k| m.rows.remove(k).is_some()).count();
                    prop_assert_eq!(removed, expect);
                }
            }
            prop_assert_eq!(table.len(), m.rows.len());
        }
        // Every row, its state and nothing else is exported.
        let mut seen = 0;
        for chunk in table.export(7) {
            for (i, k) in chunk.ids.iter().enumerate() {
                let r = &m.rows[k];
                prop_assert!(close(&chunk.values[i * D..][..D], &r.0));
                prop_assert!(close(&chunk.state[i * sd..][..sd], &r.1));
                seen += 1;
            }
        }
        prop_assert_eq!(seen, m.rows.len());
    }
}
