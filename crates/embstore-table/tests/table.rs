//! Behaviour tests: typed errors that change nothing, admission, expiry, versions, concurrent
//! callers, save/load and corrupt files.

use std::sync::Arc;
use std::time::Duration;

use embstore_table::{
    ErrorKind, Initializer, NonFinite, OnMiss, Optimizer, Store, Table, TableConfig,
};

fn table(d: usize, opt: Optimizer) -> Table {
    Table::new(TableConfig::new("t", d).with_optimizer(opt).with_shards(4)).unwrap()
}

fn rows_of(t: &Table, ids: &[u64]) -> Vec<f32> {
    let mut out = vec![0.0; ids.len() * t.dim()];
    t.lookup(ids, OnMiss::Error, &mut out, None).unwrap();
    out
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let t = table(2, Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 });
    t.assign(&[1, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let before: Vec<_> = t.export(100).collect();
    fn kind<T: std::fmt::Debug>(r: embstore_table::Result<T>) -> ErrorKind {
        r.unwrap_err().kind()
    }
    assert_eq!(kind(t.apply_gradients(&[1, 2], &[1.0; 3], None)), ErrorKind::ShapeMismatch);
    assert_eq!(
        kind(t.apply_gradients(&[1, 2], &[1.0, f32::NAN, 0.0, 0.0], None)),
        ErrorKind::NonFinite
    );
    assert_eq!(kind(t.apply_gradients(&[1], &[1.0, 1.0], Some(-1.0))), ErrorKind::InvalidArgument);
    assert_eq!(kind(t.assign(&[1], &[f32::INFINITY, 0.0])), ErrorKind::NonFinite);
    assert_eq!(kind(t.lookup(&[1], OnMiss::Init, &mut [0.0; 3], None)), ErrorKind::ShapeMismatch);
    assert_eq!(
        kind(t.lookup(&[1, 99], OnMiss::Error, &mut [0.0; 4], None)),
        ErrorKind::KeyNotFound
    );
    let after: Vec<_> = t.export(100).collect();
    assert_eq!(before, after);
    assert_eq!(t.step(), 0);
    // Empty batches are fine and do nothing.
    t.lookup(&[], OnMiss::Init, &mut [], None).unwrap();
    assert_eq!(t.apply_gradients(&[], &[], None).unwrap(), 0);
    assert_eq!(t.step(), 0);
}

#[test]
fn invalid_configs_are_rejected() {
    let bad = [
        TableConfig::new("t", 0),
        TableConfig::new("t", 4097),
        TableConfig::new("t", 4).with_shards(3),
        TableConfig::new("", 4),
        TableConfig::new("a\nb", 4),
        TableConfig::new("t", 4).with_optimizer(Optimizer::Sgd { lr: f32::NAN }),
    ];
    for c in bad {
        assert_eq!(Table::new(c.clone()).unwrap_err().kind(), ErrorKind::InvalidArgument, "{c:?}");
    }
}

#[test]
fn non_finite_skip_steps_the_finite_ids() {
    let mut c = TableConfig::new("t", 1).with_optimizer(Optimizer::Sgd { lr: 1.0 });
    c.non_finite = NonFinite::Skip;
    c.initializer = Initializer::Zeros;
    let t = Table::new(c).unwrap();
    assert_eq!(t.apply_gradients(&[1, 2], &[f32::NAN, 1.0], None).unwrap(), 1);
    assert_eq!(rows_of(&t, &[2]), [-1.0]);
    assert!(t.meta(&[1]).unwrap()[0].is_none());
    assert_eq!(t.stats().skipped_non_finite, 1);
}

#[test]
fn serving_lookups_store_nothing() {
    let t = table(3, Optimizer::default());
    let mut out = vec![1.0; 6];
    let mut found = vec![true; 2];
    t.lookup(&[5, 6], OnMiss::Zeros, &mut out, Some(&mut found)).unwrap();
    assert_eq!(out, [0.0; 6]);
    assert_eq!(found, [false, false]);
    assert!(t.is_empty());
    t.lookup(&[5], OnMiss::Init, &mut out[..3], None).unwrap();
    let mut init = vec![0.0; 3];
    t.initial_row(5, &mut init);
    assert_eq!(&out[..3], init.as_slice());
    assert_eq!(t.len(), 1);
    let s = t.stats();
    assert_eq!((s.hits, s.misses, s.inserts, s.rows), (0, 3, 1, 1));
}

#[test]
fn admission_waits_for_the_minimum_count() {
    let mut c = TableConfig::new("t", 2).with_optimizer(Optimizer::Sgd { lr: 1.0 });
    c.admission_min_count = 3;
    let t = Table::new(c).unwrap();
    let mut out = [0.0; 2];
    let mut init = [0.0; 2];
    t.initial_row(42, &mut init);
    for _ in 0..2 {
        t.lookup(&[42], OnMiss::Init, &mut out, None).unwrap();
        assert_eq!(out, init);
        assert!(t.is_empty());
        // Gradients for a row the forward pass never stored are dropped.
        assert_eq!(t.apply_gradients(&[42], &[1.0, 1.0], None).unwrap(), 0);
    }
    t.lookup(&[42], OnMiss::Init, &mut out, None).unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t.apply_gradients(&[42], &[1.0, 1.0], None).unwrap(), 1);
    assert_eq!(rows_of(&t, &[42]), [init[0] - 1.0, init[1] - 1.0]);
    assert_eq!(t.stats().dropped_unadmitted, 2);
}

#[test]
fn expiry_removes_rows_not_updated_since_the_cutoff() {
    let mut c = TableConfig::new("t", 1);
    c.ttl = Some(Duration::from_secs(3600));
    let t = Table::new(c).unwrap();
    t.assign(&[1, 2, 3], &[1.0, 2.0, 3.0]).unwrap();
    assert_eq!(t.evict_expired().unwrap(), 0);
    let cutoff = t.meta(&[1]).unwrap()[0].unwrap().last_update_ms + 1;
    std::thread::sleep(Duration::from_millis(5));
    t.assign(&[2], &[5.0]).unwrap();
    assert_eq!(t.evict_older_than(cutoff).unwrap(), 2);
    assert_eq!(t.len(), 1);
    assert_eq!(rows_of(&t, &[2]), [5.0]);
    assert_eq!(t.stats().evicted, 2);
}

#[test]
fn versions_increase_and_count_updates() {
    let store = Store::with_replica(7).unwrap();
    let t = store.create_table(TableConfig::new("t", 1)).unwrap();
    t.lookup(&[1], OnMiss::Init, &mut [0.0], None).unwrap();
    assert_eq!(
        t.meta(&[1]).unwrap()[0].unwrap().version.timestamp,
        0,
        "an initial row has version 0"
    );
    let mut last = t.meta(&[1]).unwrap()[0].unwrap().version;
    for i in 1..=50 {
        t.apply_gradients(&[1, 1], &[0.5, 0.5], None).unwrap();
        let m = t.meta(&[1]).unwrap()[0].unwrap();
        assert!(m.version > last);
        assert_eq!((m.version.replica, m.update_count), (7, i));
        last = m.version;
    }
}

#[test]
fn concurrent_writers_and_readers_lose_no_update() {
    // lr 1 and gradients of 1 keep the arithmetic exact, so any lost update shows.
    let t = Arc::new({
        let c = TableConfig::new("t", 4)
            .with_optimizer(Optimizer::Sgd { lr: 1.0 })
            .with_initializer(Initializer::Zeros)
            .with_shards(8);
        Table::new(c).unwrap()
    });
    let ids: Vec<u64> = (0..3000).collect();
    let threads: Vec<_> = (0..4)
        .map(|w| {
            let (t, ids) = (t.clone(), ids.clone());
            std::thread::spawn(move || {
                let mut out = vec![0.0; ids.len() * 4];
                for _ in 0..25 {
                    t.lookup(&ids, OnMiss::Init, &mut out, None).unwrap();
                    if w % 2 == 0 {
                        t.apply_gradients(&ids, &vec![1.0; ids.len() * 4], None).unwrap();
                    } else {
                        // A row is never seen half-stepped: all 4 values agree.
                        for r in out.chunks(4) {
                            assert!(r.iter().all(|&v| v == r[0]), "torn row {r:?}");
                        }
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|h| h.join().unwrap());
    assert!(rows_of(&t, &ids).iter().all(|&v| v == -50.0));
    assert_eq!(t.step(), 50);
}

#[test]
fn save_load_round_trip_and_corrupt_files_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.embt");
    let store = Store::new();
    let opt = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8 };
    let t = store.create_table(TableConfig::new("user", 8).with_optimizer(opt)).unwrap();
    let ids: Vec<u64> = (0..40_000).map(|i| i * 7919).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; ids.len() * 8], None).unwrap();
    t.apply_gradients(&ids[..100], &vec![0.25; 800], None).unwrap();
    assert_eq!(t.save(&path).unwrap(), 40_000);

    let copy = store.load_table(&path, Some("copy")).unwrap();
    assert_eq!(copy.step(), 1);
    assert_eq!(copy.config().optimizer, opt);
    let a: Vec<_> = t.export(1 << 20).collect();
    let b: Vec<_> = copy.export(1 << 20).collect();
    let sorted = |c: &[embstore_table::RowChunk]| {
        let mut v: Vec<_> = c
            .iter()
            .flat_map(|c| {
                c.ids.iter().enumerate().map(move |(i, &k)| {
                    (
                        k,
                        c.values[i * 8..][..8].to_vec(),
                        c.state[i * 16..][..16].to_vec(),
                        c.meta[i],
                    )
                })
            })
            .map(|(k, v, s, m)| (k, format!("{v:?}{s:?}{m:?}")))
            .collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&a), sorted(&b));

    // Flip one byte in the middle, truncate, and append: each is Corruption, the table unchanged.
    let bytes = std::fs::read(&path).unwrap();
    let bad_path = dir.path().join("bad.embt");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    for bad in [
        flipped,
        bytes[..bytes.len() - 9].to_vec(),
        [bytes.clone(), vec![0]].concat(),
        b"junk".to_vec(),
    ] {
        std::fs::write(&bad_path, bad).unwrap();
        assert_eq!(copy.load(&bad_path).unwrap_err().kind(), ErrorKind::Corruption);
        assert_eq!(copy.len(), 40_000);
        assert_eq!(
            store.load_table(&bad_path, Some("x")).unwrap_err().kind(),
            ErrorKind::Corruption
        );
        assert!(store.table("x").is_err());
    }
    // A file of another layout is refused before anything changes.
    let other = store.create_table(TableConfig::new("other", 4)).unwrap();
    other.assign(&[1], &[1.0; 4]).unwrap();
    assert_eq!(other.load(&path).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert_eq!(other.len(), 1);
    assert_eq!(copy.load(dir.path().join("missing")).unwrap_err().kind(), ErrorKind::Io);
}

#[test]
fn store_names_tables() {
    let store = Store::new();
    store.create_table(TableConfig::new("b", 2)).unwrap();
    store.create_table(TableConfig::new("a", 2)).unwrap();
    assert_eq!(
        store.create_table(TableConfig::new("a", 3)).unwrap_err().kind(),
        ErrorKind::TableExists
    );
    assert_eq!(store.tables(), ["a", "b"]);
    store.drop_table("a").unwrap();
    assert_eq!(store.table("a").unwrap_err().kind(), ErrorKind::TableNotFound);
    assert_eq!(store.drop_table("a").unwrap_err().kind(), ErrorKind::TableNotFound);
}

#[test]
fn stats_count_rows_and_balance() {
    let t = table(4, Optimizer::default());
    let ids: Vec<u64> = (0..8000).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 8000 * 4], None).unwrap();
    t.lookup(&ids[..100], OnMiss::Init, &mut vec![0.0; 400], None).unwrap();
    let s = t.stats();
    assert_eq!((s.rows, s.inserts, s.hits, s.misses), (8000, 8000, 100, 8000));
    assert_eq!(s.rows_per_shard.len(), 4);
    assert!(s.rows_per_shard.iter().all(|&n| (1700..2300).contains(&n)), "{:?}", s.rows_per_shard);
    assert!(s.bytes_reserved >= 8000 * 16 && s.bytes_used >= 8000 * 16);
    assert_eq!(t.remove(&ids[..10]).unwrap(), 10);
    // Freed slots are reused.
    t.lookup(&[100_000], OnMiss::Init, &mut [0.0; 4], None).unwrap();
    assert_eq!(t.len(), 7991);
}

#[test]
fn summed_duplicate_gradients_that_overflow_are_rejected() {
    let t = table(2, Optimizer::Sgd { lr: 1.0 });
    t.assign(&[5, 6], &[1.0; 4]).unwrap();
    let before: Vec<_> = t.export(10).collect();
    let err = t.apply_gradients(&[6, 5, 5], &[1.0, 1.0, 3e38, 3e38, 3e38, 3e38], None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NonFinite, "{err}");
    assert!(err.message().contains("summed gradient for id 5"), "{err}");
    assert_eq!(t.export(10).collect::<Vec<_>>(), before);
    assert_eq!(t.step(), 0);
}

#[test]
fn the_first_missing_id_is_named_in_batch_order() {
    let t = table(1, Optimizer::default());
    t.assign(&[1], &[0.0]).unwrap();
    let ids: Vec<u64> = (0..5000).rev().collect(); // large: runs the shards in parallel
    let err = t.lookup(&ids, OnMiss::Error, &mut vec![0.0; 5000], None).unwrap_err();
    assert_eq!(err.message(), "id 4999 is not stored in table 't'");
}

#[test]
fn assign_and_import_metadata_and_state() {
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.5 };
    let t = table(2, opt);
    t.assign(&[1], &[1.0, 1.0]).unwrap();
    assert_eq!(t.meta(&[1]).unwrap()[0].unwrap().update_count, 1);
    t.apply_gradients(&[1], &[1.0, 1.0], None).unwrap();
    // import without state resets it to the optimizer's initial state.
    t.import(&[1], &[2.0, 2.0], None, None).unwrap();
    let c: Vec<_> = t.export(10).collect();
    assert_eq!(c[0].state, [0.5, 0.5]);
    // A version more than a day ahead of the clock is refused.
    let far = embstore_table::RowMeta {
        version: embstore_table::Version { timestamp: u64::MAX, replica: 0 },
        ..Default::default()
    };
    let err = t.import(&[1], &[3.0, 3.0], None, Some(&[far])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(rows_of(&t, &[1]), [2.0, 2.0]);
}

#[test]
fn loads_restore_what_was_saved_and_refuse_other_optimizers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.embt");
    let store = Store::new();
    let opt = Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 };
    let t = store.create_table(TableConfig::new("a", 2).with_optimizer(opt)).unwrap();
    t.apply_gradients(&[1, 2], &[2e3, 1.0, 1.0, 1.0], None).unwrap();
    t.save(&path).unwrap();
    let b = store.create_table(TableConfig::new("b", 2).with_optimizer(opt)).unwrap();
    b.assign(&[7], &[7.0, 7.0]).unwrap();
    assert_eq!(b.load(&path).unwrap(), 2);
    assert_eq!(b.export(10).map(|c| c.len()).sum::<usize>(), 2);
    assert!(b.meta(&[7]).unwrap()[0].is_none());
    // Adam and FTRL both keep 2·D floats of state, but they are not the same state.
    let adam = Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8 };
    let ftrl =
        Optimizer::Ftrl { lr: 0.1, beta: 1.0, l1: 0.0, l2: 0.0, initial_accumulator_value: 0.0 };
    let x = store.create_table(TableConfig::new("x", 2).with_optimizer(adam)).unwrap();
    x.assign(&[1], &[1.0, 1.0]).unwrap();
    x.save(&path).unwrap();
    let y = store.create_table(TableConfig::new("y", 2).with_optimizer(ftrl)).unwrap();
    assert_eq!(y.load(&path).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert!(y.is_empty());
    // A name that is taken is refused before anything is read into the store.
    assert_eq!(store.load_table(&path, Some("a")).unwrap_err().kind(), ErrorKind::TableExists);
}

#[test]
fn concurrent_saves_to_one_path_never_publish_a_mixed_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = Arc::new(dir.path().join("t.embt"));
    let store = Arc::new(Store::new());
    for name in ["a", "b"] {
        let t = store.create_table(TableConfig::new(name, 4)).unwrap();
        let ids: Vec<u64> = (0..50_000).collect();
        t.lookup(&ids, OnMiss::Init, &mut vec![0.0; ids.len() * 4], None).unwrap();
    }
    for round in 0..4 {
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let (store, path) = (store.clone(), path.clone());
                std::thread::spawn(move || store.table(name).unwrap().save(&*path).unwrap())
            })
            .collect();
        threads.into_iter().for_each(|h| assert_eq!(h.join().unwrap(), 50_000));
        let name = format!("check{round}");
        assert_eq!(store.load_table(&*path, Some(&name)).unwrap().len(), 50_000);
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "temporary files left behind");
}

#[test]
fn finite_gradient_whose_square_overflows_writes_nothing_non_finite() {
    // 2e19 is finite, its square is not: once it stored NaN rows (FTRL) or froze a row for good
    // (row-wise Adagrad, Adagrad: an infinite accumulator).
    let ftrl =
        Optimizer::Ftrl { lr: 0.1, beta: 1.0, l1: 0.0, l2: 0.0, initial_accumulator_value: 0.0 };
    for opt in [
        ftrl,
        Optimizer::RowWiseAdagrad { lr: 0.1, eps: 1e-8, initial_accumulator_value: 0.0 },
        Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 },
        Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
    ] {
        let t = table(2, opt);
        t.assign(&[1, 2], &[0.5; 4]).unwrap();
        let before: Vec<_> = t.export(10).collect();
        let err = t.apply_gradients(&[1, 2], &[2e19, 1.0, 1.0, 1.0], None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NonFinite, "{opt}: {err}");
        assert_eq!(t.export(10).collect::<Vec<_>>(), before, "{opt}");
        // With on_non_finite = skip, id 1 is skipped and id 2 stepped; all stays finite.
        let mut c = TableConfig::new("s", 2).with_optimizer(opt);
        c.non_finite = NonFinite::Skip;
        let s = Table::new(c).unwrap();
        s.assign(&[1, 2], &[0.5; 4]).unwrap();
        assert_eq!(s.apply_gradients(&[1, 2], &[2e19, 1.0, 1.0, 1.0], None).unwrap(), 1);
        for chunk in s.export(10) {
            assert!(chunk.values.iter().chain(&chunk.state).all(|v| v.is_finite()), "{opt}");
        }
        assert_eq!(rows_of(&s, &[1]), [0.5, 0.5], "{opt}");
        assert_eq!(s.stats().skipped_non_finite, 1);
    }
}

#[test]
fn ftrl_per_call_lr_zero_is_refused() {
    // lr = 0 (the first step of a warm-up schedule) divided by zero and wrote NaN rows.
    let ftrl =
        Optimizer::Ftrl { lr: 0.1, beta: 1.0, l1: 0.0, l2: 0.0, initial_accumulator_value: 0.0 };
    let t = table(2, ftrl);
    t.assign(&[1], &[0.5; 2]).unwrap();
    let err = t.apply_gradients(&[1], &[1.0, 1.0], Some(0.0)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().contains("ftrl: lr"), "{err}");
    assert_eq!(rows_of(&t, &[1]), [0.5, 0.5]);
    assert_eq!(t.step(), 0);
    // SGD may take lr = 0: a step that changes nothing.
    let sgd = table(2, Optimizer::Sgd { lr: 0.1 });
    sgd.assign(&[1], &[0.5; 2]).unwrap();
    sgd.apply_gradients(&[1], &[1.0, 1.0], Some(0.0)).unwrap();
    assert_eq!(rows_of(&sgd, &[1]), [0.5, 0.5]);
}

#[test]
fn adam_step_counter_past_2_pow_31_writes_finite_rows() {
    // `t as i32` wrapped negative past 2^31 and Adam wrote NaN rows.
    let t = table(2, Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 });
    t.assign(&[1], &[0.5; 2]).unwrap();
    t.set_step((1 << 31) - 2);
    for _ in 0..4 {
        t.apply_gradients(&[1], &[1.0, -1.0], None).unwrap();
    }
    assert_eq!(t.step(), (1 << 31) + 2);
    let row = rows_of(&t, &[1]);
    assert!(row.iter().all(|v| v.is_finite()) && row[0] < 0.5 && row[1] > 0.5, "{row:?}");
}

#[test]
fn stats_is_cheap_and_index_stats_scans() {
    let t = table(4, Optimizer::default());
    let ids: Vec<u64> = (0..20_000).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 80_000], None).unwrap();
    let s = t.stats();
    assert_eq!(s.rows, 20_000);
    assert!(s.bytes_used <= s.bytes_reserved, "{s:?}");
    assert_eq!(s.bytes_used, 20_000 * (4 * 4 + 16 + 16));
    let i = t.index_stats();
    assert_eq!(i.len, 20_000);
    assert!(i.apcl.unwrap() >= 1.0 && i.longest_chain >= 1);
}

#[test]
fn small_tables_cost_memory_in_proportion_to_their_rows() {
    // With huge pages on, every shard holding one row once faulted in a 2 MiB page per arena:
    // 100 tables × 1,000 rows with Adam took 3.2 GiB (44× the raw bytes).
    let store = Store::new();
    let opt = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let mut reserved = 0;
    for i in 0..10 {
        let t =
            store.create_table(TableConfig::new(format!("t{i}"), 64).with_optimizer(opt)).unwrap();
        let ids: Vec<u64> = (0..1000).map(|k| k * 7919 + i).collect();
        t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 64_000], None).unwrap();
        reserved += t.stats().bytes_reserved;
    }
    let raw = 10 * 1000 * (64 + 128) * 4;
    assert!(reserved as f64 <= 1.5 * raw as f64, "{reserved} bytes reserved for {raw} raw");
    // A crafted num_shards = 1024 costs little more.
    let t = Table::new(TableConfig::new("wide", 64).with_optimizer(opt).with_shards(1024)).unwrap();
    let ids: Vec<u64> = (0..1000).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 64_000], None).unwrap();
    assert!(t.stats().bytes_reserved < 8 * raw / 10, "{:?}", t.stats().bytes_reserved);
}

#[test]
fn memory_returns_after_removing_most_rows() {
    let t = table(8, Optimizer::Adagrad { lr: 0.1, eps: 1e-10, initial_accumulator_value: 0.0 });
    let ids: Vec<u64> = (0..200_000).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; 1_600_000], None).unwrap();
    let full = t.stats().bytes_reserved;
    let gone: Vec<u64> = ids.iter().copied().filter(|k| k % 10 != 0).collect();
    assert_eq!(t.remove(&gone).unwrap(), 180_000);
    let after = t.stats();
    assert_eq!(after.rows, 20_000);
    assert!(after.bytes_reserved * 4 < full, "{} of {full}", after.bytes_reserved);
    // The survivors kept their values, and the table still works.
    let kept: Vec<u64> = ids.iter().copied().filter(|k| k % 10 == 0).collect();
    let mut want = vec![0.0; kept.len() * 8];
    for (k, row) in kept.iter().zip(want.chunks_mut(8)) {
        t.initial_row(*k, row);
    }
    assert_eq!(rows_of(&t, &kept), want);
    t.apply_gradients(&kept, &vec![1.0; kept.len() * 8], None).unwrap();
    t.clear().unwrap();
    assert!(t.stats().bytes_reserved < 64 * 1024, "{}", t.stats().bytes_reserved);
}

#[test]
fn many_small_shards_give_memory_back() {
    // Shards under 4,096 slots never compacted: a 256-shard table kept all its memory after
    // losing 90% of its rows.
    let adam = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let t = Table::new(TableConfig::new("wide", 32).with_optimizer(adam).with_shards(256)).unwrap();
    let ids: Vec<u64> = (0..256_000).collect();
    t.lookup(&ids, OnMiss::Init, &mut vec![0.0; ids.len() * 32], None).unwrap();
    let full = t.stats().bytes_reserved;
    let gone: Vec<u64> = ids.iter().copied().filter(|k| k % 10 != 0).collect();
    t.remove(&gone).unwrap();
    let after = t.stats().bytes_reserved;
    assert!(after * 3 < full, "{after} of {full} bytes after removing 90% of the rows");
    let rest: Vec<u64> = ids.iter().copied().filter(|k| k % 10 == 0).collect();
    t.remove(&rest).unwrap();
    assert!(t.stats().bytes_reserved * 20 < after, "{} bytes, no rows", t.stats().bytes_reserved);
}

#[test]
fn an_imported_version_from_a_fast_clock_does_not_delay_expiry_of_local_writes() {
    // Importing a row stamped an hour ahead pushed the table's clock an hour ahead: every later
    // local write carried a last-update time in the future and expired an hour late.
    let t = table(2, Optimizer::Sgd { lr: 0.1 });
    let now = embstore_table::now_ms();
    let ahead = embstore_table::Version { timestamp: (now + 3_600_000) << 16, replica: 9 };
    let meta = embstore_table::RowMeta { version: ahead, update_count: 1, last_update_ms: 0 };
    t.import(&[1], &[1.0, 1.0], None, Some(&[meta])).unwrap();
    t.apply_gradients(&[2], &[1.0, 1.0], None).unwrap();
    let local = t.meta(&[2]).unwrap()[0].unwrap();
    assert!(local.last_update_ms <= embstore_table::now_ms() + 1000, "{local:?}");
    // The imported row still only moves forward.
    t.apply_gradients(&[1], &[1.0, 1.0], None).unwrap();
    assert!(t.meta(&[1]).unwrap()[0].unwrap().version > ahead);
    assert_eq!(t.evict_older_than(now + 60_000).unwrap(), 1);
}

#[test]
fn sgd_takes_gradients_whose_square_would_overflow() {
    // The 1.8e19 limit protects optimizers that square the gradient; SGD does not.
    let t = table(2, Optimizer::Sgd { lr: 1e-20 });
    t.assign(&[1], &[0.0, 0.0]).unwrap();
    assert_eq!(t.apply_gradients(&[1], &[4e19, -4e19], None).unwrap(), 1);
    let row = rows_of(&t, &[1]);
    assert!((row[0] + 0.4).abs() < 1e-6 && (row[1] - 0.4).abs() < 1e-6, "{row:?}");
}

#[test]
fn a_dropped_table_refuses_further_calls() {
    let store = Store::new();
    let t = store.create_table(TableConfig::new("gone", 2)).unwrap();
    t.assign(&[1], &[1.0, 1.0]).unwrap();
    store.drop_table("gone").unwrap();
    let err = t.apply_gradients(&[1], &[1.0, 1.0], None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TableNotFound);
    assert_eq!(
        t.lookup(&[1], OnMiss::Zeros, &mut [0.0; 2], None).unwrap_err().kind(),
        ErrorKind::TableNotFound
    );
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(t.save(dir.path().join("gone.embt")).unwrap_err().kind(), ErrorKind::TableNotFound);
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "save left a file");
}

#[test]
fn import_chunk_refuses_another_optimizer_and_keeps_the_step() {
    let adam = Optimizer::Adam { lr: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8 };
    let ftrl =
        Optimizer::Ftrl { lr: 0.1, beta: 1.0, l1: 0.0, l2: 0.0, initial_accumulator_value: 0.0 };
    let a = table(2, adam);
    for _ in 0..3 {
        a.apply_gradients(&[1, 2], &[1.0; 4], None).unwrap();
    }
    let chunks: Vec<_> = a.export(10).collect();
    assert_eq!(chunks[0].step, 3);
    let f = table(2, ftrl);
    let err = f.import_chunk(&chunks[0]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(f.is_empty());
    let b = table(2, adam);
    chunks.iter().for_each(|c| b.import_chunk(c).unwrap());
    assert_eq!(b.step(), 3);
    a.apply_gradients(&[1], &[1.0; 2], None).unwrap();
    b.apply_gradients(&[1], &[1.0; 2], None).unwrap();
    assert_eq!(rows_of(&a, &[1]), rows_of(&b, &[1]));
}
