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
    assert!(t.meta(&[1])[0].is_none());
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
    assert_eq!(t.evict_expired(), 0);
    let cutoff = t.meta(&[1])[0].unwrap().last_update_ms + 1;
    std::thread::sleep(Duration::from_millis(5));
    t.assign(&[2], &[5.0]).unwrap();
    assert_eq!(t.evict_older_than(cutoff), 2);
    assert_eq!(t.len(), 1);
    assert_eq!(rows_of(&t, &[2]), [5.0]);
    assert_eq!(t.stats().evicted, 2);
}

#[test]
fn versions_increase_and_count_updates() {
    let store = Store::with_replica(7);
    let t = store.create_table(TableConfig::new("t", 1)).unwrap();
    t.lookup(&[1], OnMiss::Init, &mut [0.0], None).unwrap();
    assert_eq!(t.meta(&[1])[0].unwrap().version.timestamp, 0, "an initial row has version 0");
    let mut last = t.meta(&[1])[0].unwrap().version;
    for i in 1..=50 {
        t.apply_gradients(&[1, 1], &[0.5, 0.5], None).unwrap();
        let m = t.meta(&[1])[0].unwrap();
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
    assert!(s.bytes >= 8000 * 16);
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
    assert_eq!(t.meta(&[1])[0].unwrap().update_count, 1);
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
    // A finite but huge gradient drives the Adagrad state to infinity: save and load keep it.
    t.apply_gradients(&[1, 2], &[2e19, 1.0, 1.0, 1.0], None).unwrap();
    t.save(&path).unwrap();
    let b = store.create_table(TableConfig::new("b", 2).with_optimizer(opt)).unwrap();
    b.assign(&[7], &[7.0, 7.0]).unwrap();
    assert_eq!(b.load(&path).unwrap(), 2);
    assert_eq!(b.export(10).map(|c| c.len()).sum::<usize>(), 2);
    assert!(b.meta(&[7])[0].is_none());
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
