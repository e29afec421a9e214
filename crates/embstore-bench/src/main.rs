//! # embstore-bench
//!
//! embstore's load generator: named workloads, each measuring embstore next to its peers in the
//! same process and run, printing a readable table or (`--json`) one JSON object per line.
//! Results and the exact commands are recorded in `docs/benchmarks.md`.
//!
//! Workloads:
//! - `index` — NeighborHash batch and scalar lookups vs hashbrown and a random-access bound.
//! - `cold-reads` — batches of cold records read with O_DIRECT by each I/O engine vs the disk bound
//! - `iter` — iterative apps (MF, PageRank) on the parameter server, every specialisation
//!   against none (IterStore)
//! - `serving` — batch lookups through the batch-query service vs the same servers on RocksDB
//!   (`--features rocksdb`) and Redis `MGET`, where the time goes, throughput at a p99 SLO, and
//!   rolling updates under load, on loopback

use clap::{Parser, Subcommand};

mod cache;
mod cold;
mod density;
mod huge;
mod index;
mod iter;
mod nhref;
mod serving;

#[derive(Parser, Debug)]
#[command(
    name = "embstore-bench",
    version,
    about = "embstore benchmarks (peers measured side by side)"
)]
struct Cli {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand, Debug)]
enum Workload {
    /// The inference cache's lookup latency and throughput vs plain table lookups.
    Cache(cache::CacheArgs),
    /// NeighborHash lookups vs hashbrown and the random-access bound (MOPS, APCL).
    Index(index::IndexArgs),
    /// Cold-record batch reads (O_DIRECT): pread threads vs io_uring depths vs the disk bound.
    ColdReads(cold::ColdReadsArgs),
    /// Iterative apps (MF, PageRank) on the parameter server, every variant: time per
    /// iteration, preprocessing, bytes, objective.
    Iter(iter::IterArgs),
    /// The batch-query service (2 shards × 2 replicas) vs a RocksDB-backed server and Redis:
    /// latency, time breakdown, throughput at an SLO, rolling updates.
    Serving(serving::ServingArgs),
}

/// One line naming the machine: CPU model, cores, kernel THP setting.
pub(crate) fn machine_line() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "n/a".into());
    format!("machine: {cpu}, {cores} cores, THP {thp}")
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.workload {
        Workload::Cache(args) => cache::run(args),
        Workload::Index(args) => index::run(args),
        Workload::ColdReads(args) => cold::run(args),
        Workload::Serving(args) => serving::run(args),
        Workload::Iter(args) => iter::run(args),
    };
    if let Err(e) = result {
        eprintln!("embstore-bench: error: {e}");
        std::process::exit(2);
    }
}
