//! `embstore-bench index`: NeighborHash lookups against hashbrown and the random-access bound.
//!
//! Dimensions (defaults):
//! - table sizes: 1M (16 MiB) and 16M (256 MiB) slots; `--size 134217728` for 128M (2 GiB);
//! - load factor 0.8 (`--load-factor`), keys: random u64, payload = insertion index;
//! - queries: 8M per repetition, 90 % present keys (`--hit-ratio`) drawn uniformly and, in a
//!   second pass, Zipf(0.99) over the present keys; 10 % absent random keys;
//! - single thread; batched structures take batches of 4096 keys (`--batch`);
//! - 5 repetitions (`--reps`); each repetition runs every structure once, in rotating order, so
//!   machine noise spreads evenly; the median is reported.
//!
//! Structures (all on the same keys, in one process; every large array, hashbrown's included,
//! mapped with transparent huge pages):
//! - `embstore_scalar`: `NeighborHash::get` one key at a time;
//! - `embstore_batch`: `NeighborHash::get_batch` (AVX2 hashing; the table times its first
//!   batches and keeps the fastest of its pipeline's candidates: ring 64 or 128, prefetching into
//!   L1 or into L2 only; the report says which);
//! - `embstore_batch_4k`: the same over a table mapped without huge pages (full runs only);
//! - `hashbrown`: `hashbrown::HashMap<u64, u64>` with the same hash function (`fmix64`);
//! - `hashbrown_4k`: the same on the global allocator, as users get it (4 KiB pages where THP is
//!   `madvise`-only; full runs only);
//! - `random_access`: hash the key and read one u64 at that position of an array of the table's
//!   byte size — the least any hash lookup must do; `random_access_prefetch`: the same with the
//!   addresses prefetched 32 keys ahead into L2 (`_MM_HINT_T1`, which measured faster for this
//!   loop than prefetching into L1: 71 vs 63 MOPS at 64M slots, so the bound is the stronger one).
//!
//! - with `--reference DIR` (the authors' C++ NeighborHash headers, e.g.
//!   `../shared/peers/neighborhash`): `reference_scalar` (`find`), `reference_batch`
//!   (`amac_find<32>`) and `reference_batch_out` (`amac_find_with_index<32>` writing every answer,
//!   found or MISSING, into an output array, as `get_batch` does), timed by our harness
//!   `reference/nh_ref.cc` in a child process on the same keys and queries, alternately with ours
//!   (ours first in even repetitions, the reference first in odd ones); paired ratios
//!   ours / reference per repetition are reported. See `crate::nhref`.
//!
//! - with `--density`: no lookups; one index grows from empty to `--density-max` keys and its
//!   resident memory per key is sampled on the way (see `crate::density`).
//!
//! Equal work is checked: the checksum (sum of found payloads + number of misses) of every hash
//! table, the reference's included, must agree in every repetition, or the run fails.

use std::hash::BuildHasherDefault;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use embstore_common::{FmixHasher, SplitMix64};
use embstore_index::hash::{hash, hash_shift};
use embstore_index::{Config, NeighborHash, MISSING};
use rand::SeedableRng;
use rand_distr::Distribution;

use crate::huge::{anon_huge_kb, PageAlloc, PageArray};
use crate::nhref::{RefProc, Reference};

#[derive(Args, Debug)]
pub struct IndexArgs {
    /// Table size in slots (a power of two); repeat for several. Default: 1048576 and 16777216.
    #[arg(long = "size", value_name = "SLOTS")]
    sizes: Vec<usize>,
    /// Quick mode (the demo): 1M and 16M slots, 5 repetitions of 1M queries, no 4 KiB variants.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per structure, size and distribution (stdout) instead of tables.
    #[arg(long)]
    json: bool,
    /// Repetitions per structure (the median is reported).
    #[arg(long)]
    reps: Option<usize>,
    /// Queries per repetition.
    #[arg(long)]
    queries: Option<usize>,
    /// Which key distributions to query.
    #[arg(long, value_enum, default_value_t = DistArg::Both)]
    distribution: DistArg,
    /// Fraction of slots filled.
    #[arg(long, default_value_t = 0.8)]
    load_factor: f64,
    /// Fraction of queries for present keys.
    #[arg(long, default_value_t = 0.9)]
    hit_ratio: f64,
    /// Keys per batch for the batched structures.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Also measure get_batch at several AMAC ring widths, and scalar vs AVX2 hashing.
    #[arg(long)]
    ring_sweep: bool,
    /// Skip the 4 KiB-page variants (embstore_batch_4k, hashbrown_4k): saves memory and time.
    #[arg(long)]
    no_4k: bool,
    /// Seed for keys and queries.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also time the authors' reference NeighborHash (C++ headers in DIR, compiled with `$CXX`
    /// or g++), e.g. `../shared/peers/neighborhash`; skipped with a message if DIR or the
    /// compiler is missing.
    #[arg(long, value_name = "DIR")]
    reference: Option<PathBuf>,
    /// Instead of lookups: grow one index from empty and report its bytes per key (RSS) at
    /// log-spaced sizes from `--density-min` to `--density-max` keys, and their mean.
    #[arg(long)]
    density: bool,
    /// Smallest size sampled by `--density`, in keys.
    #[arg(long, default_value_t = 1_000_000)]
    density_min: usize,
    /// Largest size sampled by `--density`, in keys.
    #[arg(long, default_value_t = 100_000_000)]
    density_max: usize,
    /// Sizes sampled by `--density` per factor of 10.
    #[arg(long, default_value_t = 20)]
    density_points: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DistArg {
    Uniform,
    Zipf,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dist {
    Uniform,
    Zipf,
}

impl Dist {
    fn name(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipf => "zipf0.99",
        }
    }
}

/// `fmix64` as a `Hasher`, so that hashbrown hashes keys exactly as the index does.
type Fmix = FmixHasher;

type Brown = hashbrown::HashMap<u64, u64, BuildHasherDefault<Fmix>, PageAlloc>;

/// SplitMix64, for keys and query choices (also the cold-read benchmark's offsets).
pub(crate) type SplitMix = SplitMix64;

#[inline(always)]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching a valid reference's address never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
            (p as *const T).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Sum of found payloads plus number of misses: equal across structures means equal answers.
fn fold(acc: u64, payload: Option<u64>) -> u64 {
    acc.wrapping_add(payload.unwrap_or(1))
}

/// Lookups of one structure over one query stream; returns the checksum.
type Runner<'a> = Box<dyn Fn(&[u64]) -> u64 + 'a>;

struct Tables {
    slots: usize,
    keys: Vec<u64>,
    index: NeighborHash,
    index_4k: Option<NeighborHash>,
    brown: Brown,
    /// hashbrown on the global allocator, as users get it (full runs only).
    brown_4k: Option<hashbrown::HashMap<u64, u64, BuildHasherDefault<Fmix>>>,
    ra: PageArray,
    ra_shift: u32,
}

/// Progress goes to stderr so that `--json` output on stdout stays machine-readable.
fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("{msg}");
}

fn build(slots: usize, args: &IndexArgs, want_4k: bool) -> Result<Tables, String> {
    if !slots.is_power_of_two() || slots < 8 {
        return Err(format!("--size must be a power of two >= 8, got {slots}"));
    }
    let n = (slots as f64 * args.load_factor) as usize;
    let mut rng = SplitMix::new(args.seed ^ slots as u64);
    let keys: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
    let payloads: Vec<u64> = (0..n as u64).collect();
    let t = Instant::now();
    let config = Config { slots, max_load_factor: args.load_factor, huge_pages: true };
    let mut index = NeighborHash::with_config(config).map_err(|e| e.to_string())?;
    index.insert_batch(&keys, &payloads).map_err(|e| e.to_string())?;
    if index.capacity() != slots {
        return Err(format!("index grew to {} slots; lower --load-factor", index.capacity()));
    }
    progress(format_args!("  built embstore index: {:.1} s", t.elapsed().as_secs_f64()));
    let index_4k = if want_4k {
        let t = Instant::now();
        let mut i4k = NeighborHash::with_config(Config { huge_pages: false, ..config })
            .map_err(|e| e.to_string())?;
        i4k.insert_batch(&keys, &payloads).map_err(|e| e.to_string())?;
        progress(format_args!(
            "  built embstore index (4 KiB pages): {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        Some(i4k)
    } else {
        None
    };
    let t = Instant::now();
    let mut brown =
        Brown::with_capacity_and_hasher_in(n, Default::default(), PageAlloc { huge_pages: true });
    for (&k, &p) in keys.iter().zip(&payloads) {
        brown.insert(k, p);
    }
    progress(format_args!("  built hashbrown: {:.1} s", t.elapsed().as_secs_f64()));
    let brown_4k = want_4k.then(|| {
        let t = Instant::now();
        let mut m = hashbrown::HashMap::with_capacity_and_hasher(n, Default::default());
        for (&k, &p) in keys.iter().zip(&payloads) {
            m.insert(k, p);
        }
        progress(format_args!(
            "  built hashbrown (global allocator): {:.1} s",
            t.elapsed().as_secs_f64()
        ));
        m
    });
    // The random-access array has the index's byte size: two u64 per slot.
    let mut ra = PageArray::zeroed(slots * 2, true);
    for (i, x) in ra.as_mut_slice().iter_mut().enumerate() {
        *x = i as u64;
    }
    let ra_shift = 64 - (slots * 2).trailing_zeros();
    Ok(Tables { slots, keys, index, index_4k, brown, brown_4k, ra, ra_shift })
}

fn queries(t: &Tables, dist: Dist, count: usize, args: &IndexArgs) -> Vec<u64> {
    let mut rng = SplitMix::new(args.seed.wrapping_mul(31) ^ t.slots as u64 ^ dist as u64);
    let mut zrng = rand::rngs::SmallRng::seed_from_u64(args.seed ^ ZIPF_STREAM);
    let zipf = rand_distr::Zipf::new(t.keys.len() as f64, 0.99).expect("zipf parameters");
    let hit = (args.hit_ratio.clamp(0.0, 1.0) * u32::MAX as f64) as u64;
    (0..count)
        .map(|_| {
            if rng.next_u64() >> 32 >= hit {
                return rng.next_u64(); // absent: a fresh random key (2^-64 odds of a collision)
            }
            let i = match dist {
                Dist::Uniform => (rng.next_u64() % t.keys.len() as u64) as usize,
                Dist::Zipf => zipf.sample(&mut zrng) as usize - 1,
            };
            t.keys[i]
        })
        .collect()
}

/// Keeps the Zipf stream's seed apart from the key stream's.
const ZIPF_STREAM: u64 = 0x21bf_5eed;

fn runners<'a>(t: &'a Tables, batch: usize) -> Vec<(&'static str, Runner<'a>)> {
    let batched = move |index: &'a NeighborHash| -> Runner<'a> {
        Box::new(move |q: &[u64]| {
            let mut out = vec![0u64; batch];
            let mut sum = 0u64;
            for chunk in q.chunks(batch) {
                let out = &mut out[..chunk.len()];
                index.get_batch(chunk, out).expect("equal lengths");
                sum = out.iter().fold(sum, |s, &p| fold(s, (p != MISSING).then_some(p)));
            }
            sum
        })
    };
    let mut v: Vec<(&'static str, Runner<'a>)> = vec![
        (
            "embstore_scalar",
            Box::new(move |q: &[u64]| q.iter().fold(0, |s, &k| fold(s, t.index.get(k)))),
        ),
        ("embstore_batch", batched(&t.index)),
    ];
    if let Some(i4k) = &t.index_4k {
        v.push(("embstore_batch_4k", batched(i4k)));
    }
    v.push((
        "hashbrown",
        Box::new(move |q: &[u64]| q.iter().fold(0, |s, k| fold(s, t.brown.get(k).copied()))),
    ));
    if let Some(b4k) = &t.brown_4k {
        v.push((
            "hashbrown_4k",
            Box::new(move |q: &[u64]| q.iter().fold(0, |s, k| fold(s, b4k.get(k).copied()))),
        ));
    }
    let ra = t.ra.as_slice();
    let shift = t.ra_shift;
    v.push((
        "random_access",
        Box::new(move |q: &[u64]| {
            q.iter().fold(0u64, |s, &k| s.wrapping_add(ra[(hash(k) >> shift) as usize]))
        }),
    ));
    v.push((
        "random_access_prefetch",
        Box::new(move |q: &[u64]| {
            const AHEAD: usize = 32;
            let mut pos = vec![0u64; batch];
            let mut sum = 0u64;
            for chunk in q.chunks(batch) {
                let pos = &mut pos[..chunk.len()];
                hash_shift(chunk, shift, pos);
                for i in 0..pos.len() {
                    if let Some(&ahead) = pos.get(i + AHEAD) {
                        prefetch(&ra[ahead as usize]);
                    }
                    sum = sum.wrapping_add(ra[pos[i] as usize]);
                }
            }
            sum
        }),
    ));
    v
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

struct Row {
    structure: &'static str,
    mops: Vec<f64>,
    checksum: u64,
    apcl: Option<f64>,
}

/// Records one repetition's result of a structure; its checksum must not change.
fn record(row: &mut Row, rep: usize, mops: f64, sum: u64) -> Result<(), String> {
    row.mops.push(mops);
    if rep > 0 && sum != row.checksum {
        return Err(format!("{}: checksum changed between repetitions", row.structure));
    }
    row.checksum = sum;
    Ok(())
}

/// Runs every structure `reps` times, interleaved, and checks equal work. With a reference
/// harness, it runs one repetition alternately after ours (even `rep`) and before (odd).
fn measure(
    runs: &[(&'static str, Runner<'_>)],
    q: &[u64],
    reps: usize,
    mut reference: Option<&mut RefProc>,
) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = runs
        .iter()
        .map(|(name, _)| *name)
        .chain(reference.is_some().then_some(crate::nhref::NAMES).into_iter().flatten())
        .map(|name| Row { structure: name, mops: vec![], checksum: 0, apcl: None })
        .collect();
    if let Some(r) = reference.as_deref_mut() {
        r.set_queries(q)?;
    }
    for rep in 0..reps {
        for step in 0..2 {
            if (step == 0) == (rep % 2 == 1) {
                if let Some(r) = reference.as_deref_mut() {
                    let res = r.rep()?;
                    for (k, (mops, sum)) in res.into_iter().enumerate() {
                        record(&mut rows[runs.len() + k], rep, mops, sum)?;
                    }
                }
                continue;
            }
            for j in 0..runs.len() {
                let i = (j + rep) % runs.len(); // rotate the order each repetition
                let t = Instant::now();
                let sum = std::hint::black_box(runs[i].1(std::hint::black_box(q)));
                let secs = t.elapsed().as_secs_f64();
                record(&mut rows[i], rep, q.len() as f64 / secs / 1e6, sum)?;
            }
        }
    }
    check_checksums(&rows)?;
    Ok(rows)
}

/// Every hash table (all but the random-access bounds) must report the same checksum.
fn check_checksums(rows: &[Row]) -> Result<(), String> {
    let tables: Vec<&Row> = rows.iter().filter(|r| !r.structure.starts_with("random")).collect();
    if let Some(bad) = tables.iter().find(|r| r.checksum != tables[0].checksum) {
        return Err(format!(
            "checksum mismatch: {} = {} but {} = {} (unequal work)",
            bad.structure, bad.checksum, tables[0].structure, tables[0].checksum
        ));
    }
    Ok(())
}

/// The pairs reported as ours / theirs (per repetition, both timed in it).
const PAIRS: [(&str, &str); 5] = [
    ("embstore_scalar", "reference_scalar"),
    ("embstore_batch", "reference_batch"),
    ("embstore_batch", "reference_batch_out"),
    ("embstore_batch", "random_access_prefetch"),
    ("embstore_batch", "hashbrown"),
];

/// Per-repetition ratios `ours / theirs` (both ran in the same repetition), if both are there.
fn paired(rows: &[Row], ours: &str, theirs: &str) -> Option<Vec<f64>> {
    let a = rows.iter().find(|r| r.structure == ours)?;
    let b = rows.iter().find(|r| r.structure == theirs)?;
    Some(a.mops.iter().zip(&b.mops).map(|(x, y)| x / y).collect())
}

fn min_max(xs: &[f64]) -> (f64, f64) {
    (xs.iter().copied().fold(f64::INFINITY, f64::min), xs.iter().copied().fold(0.0, f64::max))
}

/// A table's batch tuning as the reports print it.
fn tuning_name(t: Option<embstore_index::BatchTuning>) -> String {
    match t {
        Some(t) => {
            format!("ring {}, prefetch into {}", t.ring, if t.prefetch_l2 { "L2" } else { "L1" })
        }
        None => "not chosen (the default: ring 64, prefetch into L1)".to_string(),
    }
}

fn human_size(slots: usize) -> String {
    match slots {
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s if s >= 1 << 10 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

pub fn run(args: IndexArgs) -> Result<(), String> {
    if args.density {
        if !args.json {
            println!("{}", crate::machine_line());
        }
        return crate::density::run(
            args.density_min,
            args.density_max,
            args.density_points,
            args.seed,
            args.json,
        );
    }
    let sizes = if !args.sizes.is_empty() { args.sizes.clone() } else { vec![1 << 20, 1 << 24] };
    let reps = args.reps.unwrap_or(5).max(1);
    let nq = args.queries.unwrap_or(if args.quick { 1_000_000 } else { 8_000_000 }).max(1);
    let batch = args.batch.max(1);
    let dists: &[Dist] = match args.distribution {
        DistArg::Uniform => &[Dist::Uniform],
        DistArg::Zipf => &[Dist::Zipf],
        DistArg::Both => &[Dist::Uniform, Dist::Zipf],
    };
    let reference = match &args.reference {
        Some(dir) => Reference::prepare(dir)?,
        None => None,
    };
    if !args.json {
        println!("{}", crate::machine_line());
        if let Some(r) = &reference {
            println!("reference: the authors' NeighborHash, harness built with {}", r.compiler);
        }
        println!(
            "load factor {:.2}, {:.0}% present keys, {nq} queries x {reps} reps (median), batch {batch}, \
             AVX2 hashing: {}",
            args.load_factor,
            args.hit_ratio * 100.0,
            embstore_index::hash::simd_available(),
        );
    }
    for &slots in &sizes {
        progress(format_args!(
            "size {} slots ({} MiB per table): building tables...",
            human_size(slots),
            (slots * 16) >> 20
        ));
        let huge_before = anon_huge_kb().unwrap_or(0);
        let t = build(slots, &args, !args.quick && !args.no_4k)?;
        let huge_kb = anon_huge_kb().unwrap_or(0).saturating_sub(huge_before);
        let stats = t.index.stats();
        let runs = runners(&t, batch);
        let mut refproc = match &reference {
            Some(r) => {
                let t0 = Instant::now();
                let p = r.start(&t.keys, slots, batch)?;
                progress(format_args!(
                    "  built the reference table: {:.1} s",
                    t0.elapsed().as_secs_f64()
                ));
                Some(p)
            }
            None => None,
        };
        for &dist in dists {
            progress(format_args!("  querying {} keys...", dist.name()));
            let q = queries(&t, dist, nq, &args);
            let mut rows = measure(&runs, &q, reps, refproc.as_mut())?;
            for r in rows.iter_mut().filter(|r| r.structure.starts_with("embstore")) {
                r.apcl = stats.apcl;
            }
            report(&args, &t, &stats, dist, &rows, huge_kb);
        }
        if args.ring_sweep {
            sweep(&t, &args, nq, reps)?;
        }
    }
    Ok(())
}

fn report(
    args: &IndexArgs,
    t: &Tables,
    stats: &embstore_index::Stats,
    dist: Dist,
    rows: &[Row],
    huge_kb: u64,
) {
    let med = |name: &str| rows.iter().find(|r| r.structure == name).map(|r| median(&r.mops));
    if args.json {
        for r in rows {
            let line = serde_json::json!({
                "bench": "index",
                "structure": r.structure,
                "size": t.slots,
                "keys": t.keys.len(),
                "distribution": dist.name(),
                "mops": median(&r.mops),
                "mops_runs": r.mops,
                "apcl": r.apcl,
                "longest_chain": r.structure.starts_with("embstore").then_some(stats.longest_chain),
                "load_factor": stats.load_factor,
                "hit_ratio": args.hit_ratio,
                "checksum": r.checksum,
                "batch": args.batch,
                "huge_pages": !r.structure.ends_with("_4k"),
                "batch_tuning": r.structure.starts_with("embstore_batch")
                    .then(|| tuning_name(t.index.batch_tuning())),
            });
            println!("{line}");
        }
        for (ours, theirs) in PAIRS {
            if let Some(r) = paired(rows, ours, theirs) {
                let (lo, hi) = min_max(&r);
                let line = serde_json::json!({
                    "bench": "index_paired_ratio",
                    "ours": ours,
                    "reference": theirs,
                    "size": t.slots,
                    "distribution": dist.name(),
                    "median": median(&r),
                    "min": lo,
                    "max": hi,
                    "ratios": r,
                });
                println!("{line}");
            }
        }
        return;
    }
    println!();
    println!(
        "size {} slots ({} MiB), {} keys, load {:.3}, APCL {:.3}, longest chain {}, \
         huge pages {} MiB — {}",
        human_size(t.slots),
        (t.slots * 16) >> 20,
        t.keys.len(),
        stats.load_factor,
        stats.apcl.unwrap_or(f64::NAN),
        stats.longest_chain,
        huge_kb >> 10,
        dist.name()
    );
    println!("  get_batch pipeline chosen by the table: {}", tuning_name(t.index.batch_tuning()));
    println!(
        "  {:<24} {:>8} {:>17} {:>13} {:>8}",
        "structure", "MOPS", "min..max", "vs hashbrown", "vs RA-pf"
    );
    let (brown, rapf) = (med("hashbrown"), med("random_access_prefetch"));
    for r in rows {
        let m = median(&r.mops);
        let lo = r.mops.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.mops.iter().copied().fold(0.0, f64::max);
        let ratio = |base: Option<f64>| base.map_or("-".to_string(), |b| format!("{:.2}x", m / b));
        println!(
            "  {:<24} {:>8.1} {:>8.1}..{:<8.1} {:>13} {:>8}",
            r.structure,
            m,
            lo,
            hi,
            ratio(brown),
            ratio(rapf)
        );
    }
    for (ours, theirs) in PAIRS {
        if let Some(r) = paired(rows, ours, theirs) {
            let (lo, hi) = min_max(&r);
            println!(
                "  paired {:<38} {:>6.3}x {:>6.3}..{:<6.3} (median, min..max of {} reps)",
                format!("{ours} / {theirs}"),
                median(&r),
                lo,
                hi,
                r.len()
            );
        }
    }
    // The goals are stated for 16M slots and more.
    let goal_size = t.slots >= 1 << 24;
    let pmed = |theirs: &str| paired(rows, "embstore_batch", theirs).map(|r| median(&r));
    if let (true, Some(bh), Some(bra)) =
        (goal_size, pmed("hashbrown"), pmed("random_access_prefetch"))
    {
        let mark = |ok: bool| if ok { "met" } else { "NOT met" };
        println!(
            "  goals (paired medians): batch/RA-prefetch {:.2} (>= 0.8: {}), batch/hashbrown {:.2} \
             (>= 4: {}), APCL {:.3} (<= 1.15: {})",
            bra,
            mark(bra >= 0.8),
            bh,
            mark(bh >= 4.0),
            stats.apcl.unwrap_or(f64::NAN),
            mark(stats.apcl.is_some_and(|a| a <= 1.15))
        );
    }
}

/// get_batch at several ring widths, prefetching into L1 and into L2 only, and hashing
/// throughput scalar vs AVX2.
fn sweep(t: &Tables, args: &IndexArgs, nq: usize, reps: usize) -> Result<(), String> {
    let q = queries(t, Dist::Uniform, nq, args);
    let batch = args.batch.max(1);
    let ring = |f: fn(&NeighborHash, &[u64], &mut [u64])| -> Runner<'_> {
        Box::new(move |q: &[u64]| {
            let mut out = vec![0u64; batch];
            let mut sum = 0u64;
            for chunk in q.chunks(batch) {
                let out = &mut out[..chunk.len()];
                f(&t.index, chunk, out);
                sum = out.iter().fold(sum, |s, &p| fold(s, (p != MISSING).then_some(p)));
            }
            sum
        })
    };
    macro_rules! width {
        ($w:literal) => {
            [
                (
                    concat!("ring_", stringify!($w), "_l1"),
                    ring(|i, c, o| {
                        i.get_batch_ring::<$w, false>(c, o).expect("equal lengths");
                    }),
                ),
                (
                    concat!("ring_", stringify!($w), "_l2"),
                    ring(|i, c, o| {
                        i.get_batch_ring::<$w, true>(c, o).expect("equal lengths");
                    }),
                ),
            ]
        };
    }
    let runs: Vec<(&'static str, Runner<'_>)> = [
        width!(8),
        width!(16),
        width!(32),
        width!(48),
        width!(64),
        width!(96),
        width!(128),
        width!(192),
        width!(256),
    ]
    .into_iter()
    .flatten()
    .collect();
    let rows = measure(&runs, &q, reps, None)?;
    let shift = 64 - t.slots.trailing_zeros();
    let hashers: Vec<(&'static str, Runner<'_>)> = vec![
        (
            "hash_scalar",
            Box::new(move |q: &[u64]| {
                let mut out = vec![0u64; q.len()];
                embstore_index::hash::hash_shift_scalar(q, shift, &mut out);
                out.iter().fold(0u64, |s, &x| s.wrapping_add(x))
            }),
        ),
        (
            "hash_simd",
            Box::new(move |q: &[u64]| {
                let mut out = vec![0u64; q.len()];
                hash_shift(q, shift, &mut out);
                out.iter().fold(0u64, |s, &x| s.wrapping_add(x))
            }),
        ),
    ];
    let hq = &q[..q.len().min(1 << 20)];
    let hrows = measure(&hashers, hq, reps * 5, None)?;
    for r in rows.iter().chain(&hrows) {
        if args.json {
            let line = serde_json::json!({
                "bench": "index_tuning", "structure": r.structure, "size": t.slots,
                "distribution": "uniform", "mops": median(&r.mops), "mops_runs": r.mops,
                "apcl": null,
            });
            println!("{line}");
        } else {
            println!("  tuning {:<14} {:>8.1} MOPS", r.structure, median(&r.mops));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: IndexArgs,
    }

    fn row(structure: &'static str, checksum: u64) -> Row {
        Row { structure, mops: vec![1.0], checksum, apcl: None }
    }

    #[test]
    fn checksum_mismatch_is_rejected() {
        let ok = [row("embstore_batch", 7), row("random_access", 3), row("reference_batch", 7)];
        assert!(check_checksums(&ok).is_ok());
        let bad = [row("embstore_batch", 7), row("reference_batch_out", 8)];
        let e = check_checksums(&bad).unwrap_err();
        assert!(e.contains("reference_batch_out"), "{e}");
    }

    #[test]
    fn paired_ratios_are_per_repetition() {
        let mut a = row("embstore_batch", 0);
        a.mops = vec![2.0, 3.0];
        let mut b = row("reference_batch", 0);
        b.mops = vec![4.0, 2.0];
        assert_eq!(paired(&[a, b], "embstore_batch", "reference_batch"), Some(vec![0.5, 1.5]));
    }

    /// A tiny run beside the reference: its three variants agree with ours on every checksum.
    #[test]
    fn reference_agrees_on_a_tiny_run() {
        let peer = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/peers/neighborhash");
        let cli = Cli::try_parse_from([
            "index",
            "--size",
            "4096",
            "--queries",
            "20000",
            "--reps",
            "2",
            "--batch",
            "1000",
            "--reference",
            peer.to_str().unwrap(),
        ])
        .unwrap();
        let Some(reference) = Reference::prepare(&peer).unwrap() else {
            eprintln!("skipped: no reference headers at {} or no C++ compiler", peer.display());
            return;
        };
        let t = build(4096, &cli.args, false).unwrap();
        let runs = runners(&t, cli.args.batch);
        let mut p = reference.start(&t.keys, 4096, cli.args.batch).unwrap();
        for dist in [Dist::Uniform, Dist::Zipf] {
            let q = queries(&t, dist, 20_000, &cli.args);
            let rows = measure(&runs, &q, 2, Some(&mut p)).unwrap();
            let sum = rows[0].checksum;
            for name in crate::nhref::NAMES {
                let r = rows.iter().find(|r| r.structure == name).expect(name);
                assert_eq!(r.mops.len(), 2);
                assert_eq!(r.checksum, sum, "{name}");
            }
            // A different query stream must give the harness a different answer: the checksum
            // is a real comparison, not a constant.
            let mut other = q.clone();
            other[0] = t.keys[100];
            other[1] = t.keys[200];
            p.set_queries(&other).unwrap();
            let theirs = p.rep().unwrap();
            let ours = runs[0].1(&other);
            assert!(theirs.iter().all(|&(_, s)| s == ours));
            assert_ne!(ours, sum);
        }
    }
}
