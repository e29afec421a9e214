//! `embstore-bench cold-reads`: the memory tier's cold reads — a batch of records at random
//! offsets of segment-like files, each read as the one or two aligned blocks that hold it,
//! with the page cache kept out (`O_DIRECT`) — by each read engine of embstore-table's
//! `disk::io`, and at each read alignment, side by side.
//!
//! Dimensions (defaults):
//! - data: 4 GiB (`--file-gib`) in 1 file (`--files`), created under `target/cold-reads`
//!   (`--dir`) and deleted at the end (`--keep` keeps it and reuses it next time); records of
//!   320 bytes (`--record-bytes`; D = 32 with Adagrad) at `4096 + i × record_bytes`, as in a
//!   segment (spec E.2);
//! - batches of 4,096 records (`--batch`) drawn uniformly over all records of all files, sorted by
//!   (file, offset) as the tier does (spec B.2); one read per record of one block, or two when
//!   the record straddles a boundary;
//! - alignments (`--align`, repeatable): 4 KiB pages (what the tier read before it sized reads
//!   to the device) and the files' own read alignment (`disk::io::read_alignment`: the device's
//!   logical block, 512 B on most disks), each engine at each;
//! - engines (`--engine`, repeatable): `pread:1` (sequential), `pread:4`, `pread:16` (threads),
//!   `uring:32`, `uring:128` (reads in flight);
//! - 5 repetitions (`--reps`) after one warm-up batch per engine; each repetition runs every
//!   engine at every alignment once on fresh random records, in rotating order; the median
//!   batch time is reported, with the bytes read per record.
//!
//! The disk bound: a batch cannot take less than `reads ÷ IOPS`, with the device's 4 KiB
//! random-read IOPS measured by fio (`--fio-iops`, see docs/benchmarks.md); the table shows each
//! engine's batch time as a multiple of it. Every record read is checked against the bytes
//! written (each u64 of a file holds its own offset, tagged with the file's number).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use embstore_table::disk::io::{
    self, AlignedBuf, PageRead, PreadPool, ReadEngine, Uring, MIN_ALIGN, PAGE,
};

use crate::index::SplitMix;

#[derive(Args, Debug)]
pub struct ColdReadsArgs {
    /// Total size of the data files, in GiB.
    #[arg(long, default_value_t = 4.0)]
    file_gib: f64,
    /// Number of files the data is split into (a batch draws records from all of them).
    #[arg(long, default_value_t = 1)]
    files: usize,
    /// Bytes per record (a multiple of 64; 320 = D 32 with Adagrad, 1088 = D 256 with SGD).
    #[arg(long, default_value_t = 320)]
    record_bytes: usize,
    /// Records per batch.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Repetitions per engine (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// An engine to measure, `pread:THREADS` or `uring:DEPTH`; repeat for several. Default:
    /// pread:1 pread:4 pread:16 uring:32 uring:128.
    #[arg(long = "engine", value_name = "KIND:N")]
    engines: Vec<String>,
    /// A read alignment in bytes (a power of two from 512 to 4096, at least the files' own);
    /// repeat for several. Default: 4096 and the files' read alignment.
    #[arg(long = "align", value_name = "BYTES")]
    aligns: Vec<usize>,
    /// The device's 4 KiB random-read IOPS (fio, O_DIRECT, deep queue): the bound each batch
    /// time is compared with.
    #[arg(long)]
    fio_iops: Option<f64>,
    /// Directory for the data files.
    #[arg(long, default_value = "target/cold-reads")]
    dir: PathBuf,
    /// Keep the data files (a later run with the same sizes reuses them).
    #[arg(long)]
    keep: bool,
    /// Print one JSON object per engine (stdout) instead of a table.
    #[arg(long)]
    json: bool,
    /// Seed for the records drawn.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// An engine as named on the command line.
#[derive(Clone, Copy, Debug)]
enum Spec {
    Pread(usize),
    Uring(u32),
}

impl Spec {
    fn parse(s: &str) -> Result<Spec, String> {
        let bad = || format!("--engine must be pread:THREADS or uring:DEPTH, got '{s}'");
        let (kind, n) = s.split_once(':').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        match kind {
            _ if n == 0 => Err(bad()),
            "pread" => Ok(Spec::Pread(n as usize)),
            "uring" => Ok(Spec::Uring(n)),
            _ => Err(bad()),
        }
    }

    fn name(self) -> String {
        match self {
            Spec::Pread(t) => format!("pread:{t}"),
            Spec::Uring(d) => format!("uring:{d}"),
        }
    }

    fn build(self) -> Result<Box<dyn ReadEngine>, String> {
        match self {
            Spec::Pread(t) => Ok(Box::new(PreadPool::new(t))),
            Spec::Uring(d) => Uring::new(d)
                .map(|u| Box::new(u) as Box<dyn ReadEngine>)
                .map_err(|e| format!("io_uring is not available: {e}")),
        }
    }
}

/// The data files; removed on drop unless kept.
struct DataFiles {
    paths: Vec<PathBuf>,
    files: Vec<File>,
    direct: bool,
    /// The largest read alignment of the files (`disk::io::read_alignment`).
    align: usize,
    records_per_file: u64,
    keep: bool,
}

impl Drop for DataFiles {
    fn drop(&mut self) {
        if !self.keep {
            for p in &self.paths {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// The u64 at byte `offset` of file `file`.
fn word(file: usize, offset: u64) -> u64 {
    offset ^ ((file as u64) << 48) ^ 0xc01d_0000_0000_0000
}

/// Creates (or, with `--keep`, reuses) the files: a header page, then the records.
fn create_files(args: &ColdReadsArgs) -> Result<DataFiles, String> {
    let total = (args.file_gib * (1u64 << 30) as f64) as u64;
    let per_file = total / args.files as u64;
    let records_per_file = per_file.saturating_sub(PAGE as u64) / args.record_bytes as u64;
    if records_per_file == 0 {
        return Err(format!("--file-gib {} holds no record per file", args.file_gib));
    }
    // Whole pages, so that every record's pages lie inside the file.
    let file_bytes =
        (PAGE as u64 + records_per_file * args.record_bytes as u64).next_multiple_of(PAGE as u64);
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let mut data = DataFiles {
        paths: Vec::new(),
        files: Vec::new(),
        direct: true,
        align: MIN_ALIGN,
        records_per_file,
        keep: args.keep,
    };
    for f in 0..args.files {
        let path = args.dir.join(format!("cold-{f}.seg"));
        data.paths.push(path.clone());
        let reuse =
            args.keep && std::fs::metadata(&path).map(|m| m.len() == file_bytes).unwrap_or(false);
        if !reuse {
            eprintln!("writing {} ({} MiB)...", path.display(), file_bytes >> 20);
            write_file(&path, f, file_bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let (file, direct) =
            io::open_direct(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        data.direct &= direct;
        data.align = data.align.max(io::read_alignment(&file));
        data.files.push(file);
    }
    Ok(data)
}

fn write_file(path: &Path, f: usize, bytes: u64) -> std::io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut out = File::create(path)?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < bytes {
        let n = CHUNK.min(bytes - at);
        for (k, w) in buf[..n as usize].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(f, at + 8 * k as u64).to_le_bytes());
        }
        out.write_all(&buf[..n as usize])?;
        at += n;
    }
    out.sync_all()?;
    // Drop the written pages from the page cache (the reads bypass it anyway).
    // SAFETY: a plain system call on an fd that `out` keeps open; no memory is passed.
    unsafe { libc::posix_fadvise(out.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// One batch: the records (file, byte offset) and the page reads that hold them.
struct Batch {
    records: Vec<(usize, u64)>,
    reqs: Vec<PageRead>,
}

fn draw(data: &DataFiles, args: &ColdReadsArgs, align: usize, rng: &mut SplitMix) -> Batch {
    let r = args.record_bytes as u64;
    let page = PAGE as u64;
    let block = align as u64;
    let mut records: Vec<(usize, u64)> = (0..args.batch)
        .map(|_| {
            let f = (rng.next_u64() % data.files.len() as u64) as usize;
            (f, page + (rng.next_u64() % data.records_per_file) * r)
        })
        .collect();
    records.sort_unstable();
    let reqs = records
        .iter()
        .map(|&(f, off)| {
            let first = off / block * block;
            let end = (off + r).next_multiple_of(block);
            PageRead { fd: data.files[f].as_raw_fd(), offset: first, len: (end - first) as usize }
        })
        .collect();
    Batch { records, reqs }
}

/// Buffers for `reqs`, touched so that page faults stay out of the timed reads (the tier reuses
/// its buffers).
fn buffers(reqs: &[PageRead]) -> Vec<AlignedBuf> {
    reqs.iter()
        .map(|r| {
            let mut b = AlignedBuf::new(r.len);
            b.fill(1);
            b
        })
        .collect()
}

/// Checks the first and last u64 of every record.
fn verify(batch: &Batch, bufs: &[AlignedBuf], record_bytes: usize) -> Result<(), String> {
    for ((&(f, off), r), b) in batch.records.iter().zip(&batch.reqs).zip(bufs) {
        for at in [off, off + record_bytes as u64 - 8] {
            let i = (at - r.offset) as usize;
            let got = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
            if got != word(f, at) {
                return Err(format!("file {f}: wrong bytes at offset {at}"));
            }
        }
    }
    Ok(())
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

pub fn run(args: ColdReadsArgs) -> Result<(), String> {
    if args.record_bytes == 0 || !args.record_bytes.is_multiple_of(64) {
        return Err(format!(
            "--record-bytes must be a positive multiple of 64, got {}",
            args.record_bytes
        ));
    }
    if args.files == 0 || args.batch == 0 || args.reps == 0 {
        return Err("--files, --batch and --reps must be at least 1".into());
    }
    let specs: Vec<Spec> = if args.engines.is_empty() {
        vec![Spec::Pread(1), Spec::Pread(4), Spec::Pread(16), Spec::Uring(32), Spec::Uring(128)]
    } else {
        args.engines.iter().map(|s| Spec::parse(s)).collect::<Result<_, _>>()?
    };
    let engines: Vec<Box<dyn ReadEngine>> =
        specs.iter().map(|s| s.build()).collect::<Result<_, _>>()?;
    let data = create_files(&args)?;
    let mut aligns = args.aligns.clone();
    if aligns.is_empty() {
        aligns = vec![PAGE, data.align];
        aligns.dedup();
    }
    if let Some(&a) =
        aligns.iter().find(|&&a| !a.is_power_of_two() || !(data.align..=PAGE).contains(&a))
    {
        return Err(format!(
            "--align must be a power of two from the files' read alignment ({} here) to {PAGE}, \
             got {a}",
            data.align
        ));
    }
    // Every (engine, alignment) pair, measured in turn.
    let variants: Vec<(usize, usize)> =
        (0..engines.len()).flat_map(|e| aligns.iter().map(move |&a| (e, a))).collect();
    let default = format!("{:?}", io::default_engine());
    if !args.json {
        println!("{}", crate::machine_line());
        println!(
            "{} file(s), {:.2} GiB, {} records of {} bytes; batches of {} random records, {} reps \
             (median); page cache kept out: {}; default engine here: {default}",
            args.files,
            args.file_gib,
            data.records_per_file * args.files as u64,
            args.record_bytes,
            args.batch,
            args.reps,
            if data.direct { "yes (O_DIRECT)" } else { "NO (O_DIRECT refused; buffered reads)" },
        );
    }

    let mut rng = SplitMix::new(args.seed);
    // Warm-up: rings and thread stacks exist before timing.
    for &(e, align) in &variants {
        let e = &engines[e];
        let b = draw(&data, &args, align, &mut rng);
        let mut bufs = buffers(&b.reqs);
        e.read_all(&b.reqs, &mut bufs).map_err(|err| format!("{e:?}: {err}"))?;
        verify(&b, &bufs, args.record_bytes)?;
    }
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    // Reads and bytes read, per variant.
    let mut moved: Vec<(u64, u64)> = vec![(0, 0); variants.len()];
    for rep in 0..args.reps {
        for k in 0..variants.len() {
            let v = (rep + k) % variants.len();
            let (e, align) = variants[v];
            let b = draw(&data, &args, align, &mut rng);
            moved[v].0 += b.reqs.len() as u64;
            moved[v].1 += b.reqs.iter().map(|r| r.len as u64).sum::<u64>();
            let mut bufs = buffers(&b.reqs);
            let t0 = Instant::now();
            engines[e]
                .read_all(&b.reqs, &mut bufs)
                .map_err(|err| format!("{:?}: {err}", engines[e]))?;
            ms[v].push(t0.elapsed().as_secs_f64() * 1e3);
            verify(&b, &bufs, args.record_bytes)?;
        }
    }

    let bound_ms = args.fio_iops.map(|iops| args.batch as f64 / iops * 1e3);
    if !args.json {
        println!(
            "reads per record: 1 (of 1 block, or 2 across a boundary); files' read alignment: \
             {} B; disk bound: {}",
            data.align,
            match (args.fio_iops, bound_ms) {
                (Some(iops), Some(b)) => format!("{b:.2} ms per batch ({iops:.0} IOPS, fio)"),
                _ => "not given (--fio-iops)".into(),
            }
        );
        println!();
        println!(
            "{:<11} {:>6} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9}",
            "engine",
            "align",
            "batch ms",
            "min ms",
            "max ms",
            "records/s",
            "IOPS",
            "B/record",
            "x bound"
        );
    }
    for ((&(e, align), runs), &(reads, bytes)) in variants.iter().zip(&ms).zip(&moved) {
        let spec = &specs[e];
        let bytes_per_record = bytes as f64 / reads as f64;
        let med = median(runs);
        let min = runs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = runs.iter().copied().fold(0.0, f64::max);
        let per_s = args.batch as f64 / (med / 1e3);
        let ratio = bound_ms.map(|b| med / b);
        if args.json {
            let line = serde_json::json!({
                "bench": "cold-reads",
                "engine": spec.name(),
                "align": align,
                "bytes_per_record": bytes_per_record,
                "batch_ms": med,
                "batch_ms_runs": runs,
                "records_per_s": per_s,
                "iops": per_s,
                "pages_per_read": bytes_per_record / PAGE as f64,
                "bound_ms": bound_ms,
                "ratio_to_bound": ratio,
                "fio_iops": args.fio_iops,
                "batch": args.batch,
                "record_bytes": args.record_bytes,
                "files": args.files,
                "file_bytes": data.records_per_file * args.record_bytes as u64 * args.files as u64,
                "o_direct": data.direct,
                "reps": args.reps,
            });
            println!("{line}");
        } else {
            println!(
                "{:<11} {align:>6} {med:>9.2} {min:>9.2} {max:>9.2} {per_s:>11.0} {per_s:>11.0} \
                 {bytes_per_record:>9.0} {:>9}",
                spec.name(),
                ratio.map_or("-".into(), |r| format!("{r:.2}")),
            );
        }
    }
    Ok(())
}
