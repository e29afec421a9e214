//! Old files still load: one checked-in surrogate file of each format version, read with
//! today's public API and compared entry by entry.
//!
//! ## Parts
//! - `tests/fixtures/surrogate-v1/user.surr` — format 1, the first: one checksummed run of
//!   header, ids, alternatives and f16 distances. Read whole by [`Surrogates::load`];
//!   [`SurrogateFile::open`] refuses it with a Corrupt error that says to load and save it.
//! - `tests/fixtures/surrogate-v2/user.surr` — format 2 (what [`Surrogates::save`] writes
//!   today): 4 KiB blocks that [`SurrogateFile`] reads one at a time.
//!
//! Both hold the same build of six rows in three pairs and one zero row (a zero row has no
//! surrogate under cosine). The fixtures are written once by `regenerate` (ignored; see
//! `tests/fixtures/README.md`) and never rewritten, so a format change that makes them
//! unreadable, or read differently, fails here.

use std::path::{Path, PathBuf};

use embstore_cache::surrogate::{self, Metric, SurrogateConfig, NONE};
use embstore_cache::{ErrorKind, SurrogateFile, Surrogates};

/// The table checkpoint version (step) the build is stamped with.
const VERSION: u64 = 77;
/// Row width.
const DIM: usize = 3;

/// The rows: ids with their values, three close pairs and a zero row.
fn rows() -> (Vec<u64>, Vec<f32>) {
    let ids = vec![10, 11, 20, 21, 30, 31, 1 << 40];
    #[rustfmt::skip]
    let values = vec![
        1.0, 0.0, 0.0,    0.98, 0.1, 0.0,
        0.0, 1.0, 0.0,    0.0, 0.97, 0.15,
        0.0, 0.0, 1.0,    0.1, 0.1, 0.99,
        0.0, 0.0, 0.0,
    ];
    (ids, values)
}

fn config() -> SurrogateConfig {
    SurrogateConfig { k: 3, metric: Metric::Cosine, max_dist: 0.25, popularity: true }
}

/// What every fixture must answer: id → (surrogate, distance) or none. The distances are the
/// f16 values stored (rounded up from the exact cosine distance).
fn expected() -> Vec<(u64, Option<(u64, f32)>)> {
    vec![
        (10, Some((11, 0.005_168_915))),
        (11, Some((10, 0.005_168_915))),
        (20, Some((21, 0.011_749_268))),
        (21, Some((20, 0.011_749_268))),
        (30, Some((31, 0.010_055_542))),
        (31, Some((30, 0.010_055_542))),
        (1 << 40, None),
        (12, None), // not in the build
    ]
}

fn fixture(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/surrogate-v{version}/user.surr"))
}

/// Checks a build read from a fixture against [`expected`].
fn assert_build(s: &Surrogates) {
    assert_eq!(s.len(), 7);
    assert_eq!(s.ids(), &[10, 11, 20, 21, 30, 31, 1 << 40]);
    assert_eq!((s.dim(), s.version(), *s.config()), (DIM, VERSION, config()));
    for (id, want) in expected() {
        assert_eq!(s.get(id), want, "id {id}");
    }
}

#[test]
fn surrogate_v1_loads_whole_and_is_refused_block_by_block() {
    assert_build(&Surrogates::load(fixture(1)).unwrap());
    let e = SurrogateFile::open(fixture(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corruption);
    assert!(e.message().contains("format version 1 cannot be read block by block"), "{e}");
}

#[test]
fn surrogate_v2_loads_whole_and_block_by_block() {
    assert_build(&Surrogates::load(fixture(2)).unwrap());
    let f = SurrogateFile::open(fixture(2)).unwrap();
    assert_eq!((f.len(), f.dim(), f.version(), *f.config()), (7, DIM, VERSION, config()));
    for (id, want) in expected() {
        assert_eq!(f.get(id).unwrap(), want, "id {id}");
    }
}

/// Format 1, written here because the crate no longer writes it: magic, version 1, metric,
/// popularity, 2 B zero, dim, k, max_dist, 4 B zero, version, count n, ids u64 x n, alternatives
/// u64 x n, f16 distances x n, crc32 of everything before it (little-endian throughout; see
/// [`Surrogates::load`]).
fn encode_v1(s: &Surrogates) -> Vec<u8> {
    let cfg = s.config();
    let mut b = Vec::new();
    b.extend_from_slice(b"EMBSURR1");
    b.extend_from_slice(&1u32.to_le_bytes());
    let metric = match cfg.metric {
        Metric::Cosine => 0,
        Metric::L2 => 1,
    };
    b.extend_from_slice(&[metric, u8::from(cfg.popularity), 0, 0]);
    b.extend_from_slice(&(s.dim() as u32).to_le_bytes());
    b.extend_from_slice(&(cfg.k as u32).to_le_bytes());
    b.extend_from_slice(&cfg.max_dist.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&s.version().to_le_bytes());
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    let entries: Vec<(u64, f32)> =
        s.ids().iter().map(|&id| s.get(id).unwrap_or((NONE, f32::INFINITY))).collect();
    s.ids().iter().for_each(|id| b.extend_from_slice(&id.to_le_bytes()));
    entries.iter().for_each(|(alt, _)| b.extend_from_slice(&alt.to_le_bytes()));
    for (_, d) in &entries {
        b.extend_from_slice(&half::f16::from_f32(*d).to_bits().to_le_bytes());
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Writes the fixtures anew (see `tests/fixtures/README.md`): only when a format gets a new
/// version, into a new `-vN` directory; the old files stay as they are.
#[test]
#[ignore = "writes tests/fixtures; run by hand when a format version changes"]
fn regenerate() {
    let (ids, values) = rows();
    let s = surrogate::build(&ids, &values, DIM, None, &config(), VERSION).unwrap();
    for (id, _) in expected() {
        println!("{id} -> {:?}", s.get(id));
    }
    for v in [1, 2] {
        std::fs::create_dir_all(fixture(v).parent().unwrap()).unwrap();
    }
    std::fs::write(fixture(1), encode_v1(&s)).unwrap();
    s.save(fixture(2)).unwrap();
}
