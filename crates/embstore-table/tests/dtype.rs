//! Tables of 16-bit rows (`Dtype::Bf16`, `Dtype::F16`): the rounding (to nearest, ties to even,
//! saturating) against an exhaustive reference; lookups, steps and imports store rounded
//! values while the optimizer state stays f32; the dtype and the rows survive a durable
//! reopen, a checkpoint, a table file and sync's text of the config; the rows take half the
//! bytes.

use proptest::prelude::*;

mod common;

use common::snapshot_of;
use embstore_table::{Dtype, OnMiss, Optimizer, Store, Table, TableConfig};

/// Every finite value of a 16-bit format, ascending, as (value, bits): from `widen`, the
/// format's exact bits-to-value map (shifting for bf16; for f16 computed here from the IEEE
/// layout, not by the code under test).
fn finite_values(dtype: Dtype) -> Finite {
    let widen = |h: u16| -> f64 {
        match dtype {
            Dtype::Bf16 => f32::from_bits((h as u32) << 16) as f64,
            _ => {
                let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
                let (e, m) = ((h >> 10) & 0x1f, (h & 0x3ff) as f64);
                match e {
                    0 => sign * m * 2f64.powi(-24),
                    31 => f64::NAN,
                    e => sign * (1.0 + m / 1024.0) * 2f64.powi(e as i32 - 15),
                }
            }
        }
    };
    let mut v: Finite =
        (0..=u16::MAX).map(|h| (widen(h), h)).filter(|(x, _)| x.is_finite()).collect();
    // -0.0 and 0.0 compare equal: keep +0 first (ties to even picks either; both read as 0).
    v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
    v
}

/// The reference rounding: the nearest finite value, ties to the even bit pattern, clamped to
/// the largest finite value.
fn reference(table: &[(f64, u16)], x: f32) -> f32 {
    let x = x as f64;
    let i = table.partition_point(|(v, _)| *v < x);
    if i == 0 {
        return table[0].0 as f32;
    }
    if i == table.len() {
        return table[table.len() - 1].0 as f32;
    }
    let (lo, hi) = (table[i - 1], table[i]);
    let (dlo, dhi) = (x - lo.0, hi.0 - x);
    let pick = if dlo < dhi {
        lo
    } else if dhi < dlo {
        hi
    } else if lo.1 & 1 == 0 {
        lo
    } else {
        hi
    };
    pick.0 as f32
}

/// The finite values of one 16-bit format (see [`finite_values`]).
type Finite = Vec<(f64, u16)>;

thread_local! {
    /// bf16's and f16's finite values, built once per test thread.
    static TABLES: (Finite, Finite) = (finite_values(Dtype::Bf16), finite_values(Dtype::F16));
}

fn finite_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits).prop_filter("finite", |x| x.is_finite()),
        -1.0f32..1.0,
        -70000.0f32..70000.0,
        -1e-4f32..1e-4,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn rounding_is_to_nearest_even_and_saturates(x in finite_f32()) {
        TABLES.with(|(bf, f16)| {
            for (dtype, table) in [(Dtype::Bf16, bf), (Dtype::F16, f16)] {
                let got = dtype.round(x);
                let want = reference(table, x);
                // Equal values (0.0 == -0.0 where a tiny value rounds to a signed zero).
                assert!(got == want, "{dtype:?}: round({x:e}) = {got:e}, want {want:e}");
                assert_eq!(dtype.round(got).to_bits(), got.to_bits(), "{dtype:?} is idempotent");
            }
        });
        prop_assert_eq!(Dtype::F32.round(x).to_bits(), x.to_bits());
    }

    /// The slice path (SIMD where the CPU has it, as rows are stored) rounds as the scalar
    /// reference does, at every length (whole vectors and remainders).
    #[test]
    fn slices_round_as_the_reference(xs in prop::collection::vec(finite_f32(), 0..40)) {
        TABLES.with(|(bf, f16)| {
            for (dtype, table) in [(Dtype::Bf16, bf), (Dtype::F16, f16)] {
                let mut got = xs.clone();
                dtype.round_slice(&mut got);
                for (g, &x) in got.iter().zip(&xs) {
                    let want = reference(table, x);
                    assert!(*g == want, "{dtype:?}: round({x:e}) = {g:e}, want {want:e}");
                }
            }
        });
    }
}

#[test]
fn ties_go_to_even() {
    // 1 + 2^-8 lies half-way between bf16's 1.0 and 1.0078125: the even one (1.0) wins; 1 +
    // 3·2^-8 lies between 1.0078125 (odd) and 1.015625 (even).
    assert_eq!(Dtype::Bf16.round(1.0 + 2f32.powi(-8)), 1.0);
    assert_eq!(Dtype::Bf16.round(1.0 + 3.0 * 2f32.powi(-8)), 1.015625);
    assert_eq!(Dtype::F16.round(1.0 + 2f32.powi(-11)), 1.0);
    assert_eq!(Dtype::F16.round(1e6), 65504.0);
    assert_eq!(Dtype::Bf16.round(f32::MAX), f32::from_bits(0x7f7f_0000));
}

fn config(dtype: Dtype, opt: Optimizer) -> TableConfig {
    TableConfig::new("t", 8).with_optimizer(opt).with_shards(2).with_dtype(dtype)
}

fn is_of(dtype: Dtype, xs: &[f32]) -> bool {
    xs.iter().all(|&x| dtype.round(x).to_bits() == x.to_bits())
}

#[test]
fn steps_are_computed_in_f32_and_stored_rounded() {
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let t = Table::new(config(dtype, Optimizer::Sgd { lr: 0.1 })).unwrap();
        let ids: Vec<u64> = (0..100).collect();
        let mut before = vec![0.0; 100 * 8];
        t.lookup(&ids, OnMiss::Init, &mut before, None).unwrap();
        assert!(is_of(dtype, &before), "{dtype:?}: initial values are rounded");
        let mut init = vec![0.0; 8];
        t.initial_row(5, &mut init);
        assert_eq!(init, before[5 * 8..][..8], "the stored row is the initial row");

        let grads: Vec<f32> = (0..800).map(|i| ((i % 13) as f32 - 6.0) * 0.0137).collect();
        t.apply_gradients(&ids, &grads, None).unwrap();
        let mut after = vec![0.0; 100 * 8];
        t.lookup(&ids, OnMiss::Error, &mut after, None).unwrap();
        for i in 0..800 {
            assert_eq!(after[i], dtype.round(before[i] - 0.1 * grads[i]), "{dtype:?} value {i}");
        }
    }
}

#[test]
fn optimizer_state_stays_f32() {
    let adam = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let (a, b) = (
        Table::new(config(Dtype::Bf16, adam)).unwrap(),
        Table::new(config(Dtype::F32, adam)).unwrap(),
    );
    let ids = [1u64, 2, 3];
    let grads: Vec<f32> = (0..24).map(|i| 0.001 + i as f32 * 1.234e-3).collect();
    for t in [&a, &b] {
        t.lookup(&ids, OnMiss::Init, &mut [0.0; 24], None).unwrap();
        t.apply_gradients(&ids, &grads, None).unwrap();
    }
    let (ra, rb) = (snapshot_of(&a), snapshot_of(&b));
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(x.2, y.2, "the Adam moments are the same f32 values");
        assert!(is_of(Dtype::Bf16, &x.1) && !is_of(Dtype::Bf16, &x.2));
    }
}

#[test]
fn imports_round_and_exports_read_back_as_f32() {
    let t = Table::new(config(Dtype::F16, Optimizer::Sgd { lr: 0.1 })).unwrap();
    let values: Vec<f32> = (0..16).map(|i| 0.1 * i as f32 + 1e-4).collect();
    t.assign(&[7, 8], &values).unwrap();
    let rows = snapshot_of(&t);
    let got: Vec<f32> = rows.iter().flat_map(|r| r.1.clone()).collect();
    let want: Vec<f32> = values.iter().map(|&x| Dtype::F16.round(x)).collect();
    assert_eq!(got, want);
}

#[test]
fn sixteen_bit_rows_take_half_the_value_bytes() {
    let ids: Vec<u64> = (0..20_000).collect();
    let used = |dtype| {
        let t = Table::new(config(dtype, Optimizer::Sgd { lr: 0.1 })).unwrap();
        t.lookup(&ids, OnMiss::Init, &mut vec![0.0; ids.len() * 8], None).unwrap();
        t.stats().bytes_used
    };
    let (full, bf, f16) = (used(Dtype::F32), used(Dtype::Bf16), used(Dtype::F16));
    assert_eq!(bf, f16);
    assert_eq!(full - bf, ids.len() * 8 * 2, "2 bytes saved per value");
}

#[test]
fn config_text_carries_the_dtype_and_f32_text_is_unchanged() {
    let f32_text = TableConfig::new("t", 8).to_text();
    assert!(!f32_text.contains("dtype"), "an f32 table's text is as before");
    assert_eq!(TableConfig::from_text(&f32_text).unwrap().dtype, Dtype::F32);
    let bf = TableConfig::new("t", 8).with_dtype(Dtype::Bf16);
    assert_eq!(TableConfig::from_text(&bf.to_text()).unwrap(), bf);
    let bad = bf.to_text().replace("dtype=bf16", "dtype=int8");
    let err = TableConfig::from_text(&bad).unwrap_err();
    assert!(err.message().contains("bad dtype"), "{}", err.message());
    assert_eq!(Dtype::from_name("BFloat16").unwrap(), Dtype::Bf16);
    let err = Dtype::from_name("int8").unwrap_err();
    assert!(err.message().contains("'fp32', 'bf16' or 'fp16'"), "{}", err.message());
}

fn train(t: &Table, rounds: u64) {
    for r in 0..rounds {
        let ids: Vec<u64> = (0..300).map(|i| (i * 7 + r * 13) % 500).collect();
        t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 300 * 8], None).unwrap();
        let grads: Vec<f32> = (0..2400).map(|i| ((i as u64 * 31 + r) % 17) as f32 * 0.01).collect();
        t.apply_gradients(&ids, &grads, None).unwrap();
    }
}

#[test]
fn a_durable_reopen_keeps_the_dtype_and_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let opt = Optimizer::Adagrad { lr: 0.05, eps: 1e-8, initial_accumulator_value: 0.0 };
    let want = {
        let store = Store::open(dir.path()).unwrap();
        let t = store.create_table(config(Dtype::Bf16, opt).with_seed(3)).unwrap();
        train(&t, 4);
        store.flush().unwrap();
        train(&t, 2); // after the flush: replayed from the later segments, or lost with close
        store.close().unwrap();
        snapshot_of(&t)
    };
    let store = Store::open(dir.path()).unwrap();
    let t = store.table("t").unwrap();
    assert_eq!(t.config().dtype, Dtype::Bf16);
    let got = snapshot_of(&t);
    assert_eq!(got, want, "the rows read back bit for bit");
    assert!(got.iter().all(|r| is_of(Dtype::Bf16, &r.1)));
    // And it keeps training as a bf16 table.
    train(&t, 1);
    assert!(snapshot_of(&t).iter().all(|r| is_of(Dtype::Bf16, &r.1)));

    // A checkpoint and a table file carry it too.
    let ckpt = dir.path().join("ckpt");
    store.checkpoint(&ckpt, None).unwrap();
    let file = dir.path().join("t.tbl");
    t.save(&file).unwrap();
    let want = snapshot_of(&t);
    store.close().unwrap();
    let restored = dir.path().join("restored");
    let from_ckpt = Store::restore(&ckpt, &restored, None, |_, _| {}).unwrap();
    assert_eq!(from_ckpt.table("t").unwrap().config().dtype, Dtype::Bf16);
    assert_eq!(snapshot_of(&from_ckpt.table("t").unwrap()), want);
    let mem = Store::new();
    let loaded = mem.load_table(&file, Some("copy")).unwrap();
    assert_eq!(loaded.config().dtype, Dtype::Bf16);
    assert_eq!(snapshot_of(&loaded), want);
}

#[test]
fn rows_evicted_to_disk_and_faulted_back_stay_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let options = embstore_table::StoreOptions::default().with_memory_budget(256 << 10);
    let fs = std::sync::Arc::new(embstore_table::disk::vfs::RealFs);
    let store = Store::open_with_options(dir.path(), &options, fs).unwrap();
    let t = store.create_table(config(Dtype::Bf16, Optimizer::Sgd { lr: 0.1 })).unwrap();
    let ids: Vec<u64> = (0..20_000).collect();
    let grads: Vec<f32> = (0..ids.len() * 8).map(|i| (i % 11) as f32 * 0.013).collect();
    t.apply_gradients(&ids, &grads, None).unwrap();
    assert!(t.stats().rows_on_disk > 0, "the budget sent rows to disk");
    let mut got = vec![0.0; ids.len() * 8];
    t.lookup(&ids, OnMiss::Error, &mut got, None).unwrap();
    let mut init = vec![0.0; 8];
    for (i, &id) in ids.iter().enumerate() {
        t.initial_row(id, &mut init);
        for j in 0..8 {
            let want = Dtype::Bf16.round(init[j] - 0.1 * grads[i * 8 + j]);
            assert_eq!(got[i * 8 + j], want, "id {id} value {j}");
        }
    }
}

#[test]
fn sync_ships_bf16_rows_to_a_follower_made_from_the_config_text() {
    use embstore_table::sync::{Changes, SyncOptions};
    let options = SyncOptions { parts: 4, ..SyncOptions::default() };
    let make = |replica, config: TableConfig| {
        let store = Store::with_replica(replica).unwrap();
        let t = store.create_table(config).unwrap();
        t.enable_sync(&options).unwrap();
        (store, t)
    };
    let (_p, primary) = make(1, config(Dtype::Bf16, Optimizer::Sgd { lr: 0.1 }));
    let text = primary.config().to_text();
    let (_f, follower) = make(2, TableConfig::from_text(&text).unwrap());
    assert_eq!(follower.config().dtype, Dtype::Bf16);
    train(&primary, 3);
    let Changes { parts, .. } = primary.sync_changes(0, 0).unwrap();
    for (part, _) in parts {
        let (vv, _) = follower.sync_knowledge(part).unwrap();
        follower.sync_apply(&primary.sync_pull(part, &vv, true).unwrap()).unwrap();
    }
    let (a, b) = (snapshot_of(&primary), snapshot_of(&follower));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.0, &x.1, &x.2), (y.0, &y.1, &y.2), "the follower's row is the primary's");
    }
}
