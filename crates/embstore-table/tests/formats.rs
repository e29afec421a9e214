//! Old files still load: one checked-in file of each on-disk format of this crate at its first
//! version, read with today's public API and compared value for value.
//!
//! ## Parts
//! - `tests/fixtures/table-file-v1/user.embt` — [`Table::save`]'s one-table file (`EMBSTBL1`).
//! - `tests/fixtures/store-v1/` — a durable store kept in a directory: the `MANIFEST` log
//!   (`EMBMAN01`) and `seg/` segments (`EMBSEG01` … `EMBSEGND`) with a put segment and a
//!   removal segment, closed cleanly.
//! - `tests/fixtures/checkpoint-v1/` — a full checkpoint of that store ([`Store::checkpoint`]):
//!   the same layout plus a checkpoint record in the manifest.
//!
//! The fixtures are written once by `regenerate` (ignored; see `tests/fixtures/README.md`) and
//! then never rewritten: a change to a format that makes these files unreadable, or read
//! differently, fails here. Every fixture is copied to a temporary directory before it is
//! opened, because opening a store may write to it (recovery, lock files) and the checked-in
//! files must stay as they are.
//!
//! Rows and metadata are a pure function of their position (`row`), with versions fixed in the
//! past (imports may not run ahead of the clock), so the files hold no time of generation.

use std::path::{Path, PathBuf};

use embstore_table::{
    load_checkpoint_shard, OnMiss, Optimizer, RowMeta, Store, Table, TableConfig, Version,
};

/// Milliseconds of every fixture row's version: 2023-11-14T22:13:20Z.
const MS: u64 = 1_700_000_000_000;
/// The replica id stamped on every fixture row.
const REPLICA: u32 = 3;
/// The "user" table's ids: small, large and one above 2^32, in no particular order.
const USER_IDS: [u64; 5] = [7, 1, 42, 1 << 40, 123_456_789];
/// The id removed from "user" in the store's second segment.
const REMOVED: u64 = 42;
/// The "item" table's ids.
const ITEM_IDS: [u64; 3] = [5, 6, 900];
/// The "user" table's step counter.
const USER_STEP: u64 = 5;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn user_config() -> TableConfig {
    let opt = Optimizer::Adagrad { lr: 0.05, eps: 1e-8, initial_accumulator_value: 0.1 };
    TableConfig::new("user", 4).with_optimizer(opt).with_shards(2).with_seed(11)
}

fn item_config() -> TableConfig {
    TableConfig::new("item", 2).with_optimizer(Optimizer::Sgd { lr: 0.5 }).with_seed(13)
}

/// Row `i` of a table of width `d` (values) and `s` (state), and its metadata.
fn row(i: usize, d: usize, s: usize) -> (Vec<f32>, Vec<f32>, RowMeta) {
    let values = (0..d).map(|j| (i * 10 + j) as f32 * 0.25 - 1.0).collect();
    let state = (0..s).map(|j| 0.1 + (i * 10 + j) as f32 * 0.5).collect();
    let meta = RowMeta {
        version: Version { timestamp: (MS + i as u64) << 16 | 1, replica: REPLICA },
        update_count: i as u64 + 1,
        last_update_ms: MS + i as u64,
    };
    (values, state, meta)
}

/// Writes rows `row(0..)` for `ids` into `t`.
fn fill(t: &Table, ids: &[u64]) {
    let (d, s) = (t.dim(), t.state_dim());
    let (mut values, mut state, mut meta) = (vec![], vec![], vec![]);
    for i in 0..ids.len() {
        let (v, st, m) = row(i, d, s);
        values.extend(v);
        state.extend(st);
        meta.push(m);
    }
    t.import(ids, &values, Some(&state), Some(&meta)).unwrap();
}

/// Asserts that `t` holds exactly the rows `row(i)` for `ids[i]` where `keep(id)`, with the
/// config `config` and step `step`.
fn assert_rows(
    t: &Table,
    config: &TableConfig,
    ids: &[u64],
    keep: impl Fn(u64) -> bool,
    step: u64,
) {
    assert_eq!(t.config(), config, "config of table '{}'", config.name);
    assert_eq!(t.step(), step, "step of table '{}'", config.name);
    let kept: Vec<u64> = ids.iter().copied().filter(|&k| keep(k)).collect();
    assert_eq!(t.len(), kept.len(), "rows of table '{}'", config.name);
    let (d, s) = (t.dim(), t.state_dim());
    let metas = t.meta(ids).unwrap();
    let mut exported = std::collections::HashMap::new();
    for chunk in &mut t.export(1 << 10) {
        for (i, &id) in chunk.ids.iter().enumerate() {
            exported.insert(id, chunk.state[i * s..][..s].to_vec());
        }
    }
    for (i, &id) in ids.iter().enumerate() {
        let (values, state, meta) = row(i, d, s);
        if !keep(id) {
            assert_eq!(metas[i], None, "id {id} was removed");
            let mut out = vec![0.0; d];
            assert!(t.lookup(&[id], OnMiss::Error, &mut out, None).is_err(), "id {id}");
            continue;
        }
        let mut out = vec![0.0; d];
        t.lookup(&[id], OnMiss::Error, &mut out, None).unwrap();
        assert_eq!(out, values, "values of id {id}");
        assert_eq!(exported.get(&id), Some(&state), "optimizer state of id {id}");
        assert_eq!(metas[i], Some(meta), "metadata of id {id}");
    }
}

/// A copy of fixture `name` in a new temporary directory (see the module docs).
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join(name);
    copy_dir(&fixtures().join(name), &to);
    (tmp, to)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let entries = std::fs::read_dir(from)
        .unwrap_or_else(|e| panic!("fixture {} is missing: {e}", from.display()));
    for entry in entries {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn table_file_v1_loads_with_its_rows_state_metadata_and_step() {
    let (_tmp, dir) = copy_fixture("table-file-v1");
    let store = Store::new();
    let t = store.load_table(dir.join("user.embt"), None).unwrap();
    assert_eq!(store.tables(), vec!["user".to_string()]);
    assert_rows(&t, &user_config(), &USER_IDS, |_| true, USER_STEP);
}

#[test]
fn store_v1_opens_with_both_tables_and_the_removal_applied() {
    let (_tmp, dir) = copy_fixture("store-v1");
    let store = Store::open(&dir).unwrap();
    let mut names = store.tables();
    names.sort();
    assert_eq!(names, vec!["item".to_string(), "user".to_string()]);
    let user = store.table("user").unwrap();
    assert_rows(&user, &user_config(), &USER_IDS, |k| k != REMOVED, USER_STEP);
    let item = store.table("item").unwrap();
    assert_rows(&item, &item_config(), &ITEM_IDS, |_| true, 0);
    store.close().unwrap();
}

#[test]
fn checkpoint_v1_restores_and_loads_a_serving_shard() {
    let (_tmp, dir) = copy_fixture("checkpoint-v1");
    let dest = tempfile::tempdir().unwrap();
    let store = Store::restore(&dir, dest.path().join("restored"), None, |_, _| {}).unwrap();
    let mut names = store.tables();
    names.sort();
    assert_eq!(names, vec!["item".to_string(), "user".to_string()]);
    let user = store.table("user").unwrap();
    assert_rows(&user, &user_config(), &USER_IDS, |k| k != REMOVED, USER_STEP);
    assert_rows(&store.table("item").unwrap(), &item_config(), &ITEM_IDS, |_| true, 0);
    store.close().unwrap();

    // What a server of shard 1 of 2 loads: only that shard's keys.
    let part = load_checkpoint_shard(&dir, "user", 1, 2).unwrap();
    let mine = |k| k != REMOVED && embstore_table::shard_of_key(k, 2) == 1;
    assert_rows(&part, &user_config(), &USER_IDS, mine, USER_STEP);
}

/// Writes the fixtures anew (see `tests/fixtures/README.md`): only when a format gets a new
/// version, into a new `-vN` directory; the v1 files stay as they are.
#[test]
#[ignore = "writes tests/fixtures; run by hand when a format version changes"]
fn regenerate() {
    let root = fixtures();
    for name in ["table-file-v1", "store-v1", "checkpoint-v1"] {
        let _ = std::fs::remove_dir_all(root.join(name));
    }

    std::fs::create_dir_all(root.join("table-file-v1")).unwrap();
    let mem = Store::new();
    let t = mem.create_table(user_config()).unwrap();
    fill(&t, &USER_IDS);
    t.set_step(USER_STEP);
    t.save(root.join("table-file-v1/user.embt")).unwrap();

    let dir = root.join("store-v1");
    let store = Store::open(&dir).unwrap();
    let user = store.create_table(user_config()).unwrap();
    fill(&user, &USER_IDS);
    user.set_step(USER_STEP);
    fill(&store.create_table(item_config()).unwrap(), &ITEM_IDS);
    store.flush().unwrap();
    assert_eq!(user.remove(&[REMOVED]).unwrap(), 1);
    store.flush().unwrap();
    store.checkpoint(root.join("checkpoint-v1"), None).unwrap();
    store.close().unwrap();
    // The lock file is the running store's, not part of the format.
    std::fs::remove_file(dir.join("LOCK")).unwrap();
}
