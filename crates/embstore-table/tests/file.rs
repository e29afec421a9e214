//! The table file's header: strict parsing (no truncated integers, no silent defaults), memory
//! in proportion to the rows at load, rows written by older versions, and the save path's
//! clean-up.

use embstore_table::{ErrorKind, OnMiss, Optimizer, Store, TableConfig};

/// Saves a small table with admission on and returns the file's bytes.
fn saved(dir: &std::path::Path) -> Vec<u8> {
    let store = Store::new();
    let opt = Optimizer::Adam { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8 };
    let mut config = TableConfig::new("t", 4).with_optimizer(opt);
    config.admission_min_count = 2;
    let t = store.create_table(config).unwrap();
    t.assign(&[1, 2, 3], &[0.5; 12]).unwrap();
    let path = dir.join("t.embt");
    t.save(&path).unwrap();
    std::fs::read(&path).unwrap()
}

/// The file with its header text passed through `edit` (checksum recomputed).
fn with_header(bytes: &[u8], edit: impl Fn(&str) -> String) -> Vec<u8> {
    let n = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[12..12 + n]).unwrap();
    let new = edit(header);
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&(new.len() as u32).to_le_bytes());
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&crc32fast::hash(new.as_bytes()).to_le_bytes());
    out.extend_from_slice(&bytes[12 + n + 4..]);
    out
}

/// The file with its `k`-th row passed through `edit(meta, values, state)` (block checksum
/// recomputed). Rows of [`saved`]: 32 B of metadata, 4 values, 8 state floats.
fn with_row(bytes: &[u8], k: usize, edit: impl Fn(&mut [u8], &mut [u8], &mut [u8])) -> Vec<u8> {
    let n = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let mut out = bytes.to_vec();
    let (mut at, mut first) = (12 + n + 4, 0); // magic, header length, header, checksum
    loop {
        let rows = u32::from_le_bytes(out[at..at + 4].try_into().unwrap()) as usize;
        assert!(rows > 0, "the file has no row {k}");
        let block = at + 4..at + 4 + rows * (8 + 32 + 16 + 32);
        if k < first + rows {
            let (i, b) = (k - first, &mut out[block.clone()]);
            let (_, rest) = b.split_at_mut(rows * 8);
            let (meta, rest) = rest.split_at_mut(rows * 32);
            let (values, state) = rest.split_at_mut(rows * 16);
            edit(
                &mut meta[i * 32..][..32],
                &mut values[i * 16..][..16],
                &mut state[i * 32..][..32],
            );
            let crc = crc32fast::hash(&out[block.clone()]);
            out[block.end..block.end + 4].copy_from_slice(&crc.to_le_bytes());
            return out;
        }
        (at, first) = (block.end + 4, first + rows);
    }
}

fn load(dir: &std::path::Path, bytes: &[u8]) -> embstore_table::Result<usize> {
    let path = dir.join("edited.embt");
    std::fs::write(&path, bytes).unwrap();
    Store::new().load_table(&path, None).map(|t| t.len())
}

fn replace<'a>(key: &'a str, value: &'a str) -> impl Fn(&str) -> String + 'a {
    move |h: &str| {
        h.lines()
            .map(|l| {
                if l.starts_with(&format!("{key}=")) {
                    format!("{key}={value}")
                } else {
                    l.into()
                }
            })
            .map(|l| l + "\n")
            .collect()
    }
}

#[test]
fn the_unedited_header_loads() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    assert_eq!(load(dir.path(), &with_header(&bytes, |h| h.to_owned())).unwrap(), 3);
}

#[test]
fn header_integers_that_do_not_fit_are_corruption_not_truncated() {
    // admission_min_count is a u32: 4294967298 once loaded as 2.
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    let err = load(dir.path(), &with_header(&bytes, replace("admission_min_count", "4294967298")))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    assert!(err.message().contains("admission_min_count"), "{err}");
}

#[test]
fn header_booleans_must_be_true_or_false() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    let err = load(dir.path(), &with_header(&bytes, replace("huge_pages", "yes"))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
}

#[test]
fn header_missing_keys_are_corruption_not_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    for key in ["seed", "optimizer", "step", "non_finite"] {
        let drop_key = |h: &str| -> String {
            h.lines()
                .filter(|l| !l.starts_with(&format!("{key}=")))
                .map(|l| format!("{l}\n"))
                .collect()
        };
        let err = load(dir.path(), &with_header(&bytes, drop_key)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corruption, "{key}: {err}");
        assert!(err.message().contains(&format!("missing {key}")), "{err}");
    }
    // A parameter missing from the optimizer's spec is not silently defaulted either.
    let err =
        load(dir.path(), &with_header(&bytes, replace("optimizer", "adam lr=0.01"))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
}

#[test]
fn files_with_positional_optimizer_specs_still_load() {
    // Files written before the parameters were named: `adam 0.01 0.9 0.99 1e-8`.
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    let old = with_header(&bytes, replace("optimizer", "adam 0.01 0.9 0.99 0.00000001"));
    let old = with_header(&old, replace("initializer", "normal 0.0 0.01"));
    assert_eq!(load(dir.path(), &old).unwrap(), 3);
}

#[test]
fn a_huge_admission_sketch_in_a_file_costs_no_memory_at_load() {
    // A 295-byte file declaring a sketch of width 2^26 once made load_table touch 1 GiB.
    let dir = tempfile::tempdir().unwrap();
    let bytes = saved(dir.path());
    let path = dir.path().join("wide.embt");
    std::fs::write(&path, with_header(&bytes, replace("admission_sketch_width", "67108864")))
        .unwrap();
    let t = Store::new().load_table(&path, None).unwrap();
    assert_eq!(t.len(), 3);
    assert!(t.stats().bytes_reserved < 1 << 20, "{}", t.stats().bytes_reserved);
    // Reads of stored rows never make it either; the first unseen id does.
    t.lookup(&[1, 2], OnMiss::Error, &mut [0.0; 8], None).unwrap();
    assert!(t.stats().bytes_reserved < 1 << 20);
}

#[test]
fn loading_a_directory_is_a_storage_error_not_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::new().load_table(dir.path(), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
}

#[test]
fn a_failed_rename_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    // The target is a non-empty directory: the rename over it fails.
    let target = dir.path().join("taken");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("x"), b"x").unwrap();
    let t = Store::new().create_table(TableConfig::new("t", 2)).unwrap();
    t.assign(&[1], &[1.0, 2.0]).unwrap();
    let err = t.save(&target).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["taken"], "left behind: {names:?}");
}

#[test]
fn rows_with_non_finite_state_or_values_from_older_files_are_repaired_on_load() {
    // Older versions could store an Adagrad/Adam state (or values) at inf/NaN from finite
    // gradients; such a row then refused every later step, forever.
    let dir = tempfile::tempdir().unwrap();
    let bytes = with_row(&saved(dir.path()), 0, |_, _, state| {
        state[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    });
    let bytes = with_row(&bytes, 1, |_, values, _| {
        values[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let path = dir.path().join("old.embt");
    std::fs::write(&path, &bytes).unwrap();
    let t = Store::new().load_table(&path, None).unwrap();
    assert_eq!((t.len(), t.stats().repaired_on_load), (3, 2));
    let mut out = vec![0.0; 12];
    t.lookup(&[1, 2, 3], OnMiss::Error, &mut out, None).unwrap();
    assert!(out.iter().all(|v| v.is_finite()), "{out:?}");
    // The repaired rows train again; the row that was fine kept its values.
    assert_eq!(out.iter().filter(|&&v| v == 0.5).count(), 8, "{out:?}");
    assert_eq!(t.apply_gradients(&[1, 2, 3], &[0.1; 12], None).unwrap(), 3);
    t.lookup(&[1, 2, 3], OnMiss::Error, &mut out, None).unwrap();
    assert!(out.iter().all(|v| v.is_finite()), "{out:?}");
}

#[test]
fn a_replica_id_from_an_older_file_that_no_longer_fits_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = with_row(&saved(dir.path()), 0, |meta, _, _| {
        meta[8..12].copy_from_slice(&(1u32 << 31).to_le_bytes());
    });
    let err = load(dir.path(), &bytes).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corruption);
    assert!(err.message().contains("replica 2147483648"), "{}", err.message());
    assert!(err.message().contains("edited.embt"), "{}", err.message());
}
