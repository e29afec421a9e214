//! Rolling updates under load (the serving benchmark 3): a cluster of 2 shards × 2 replicas
//! (columns a and b) and a spare column, in this process, rolled from version v to v + 1
//! `--rolls` times as docs/serving.md describes — the spare column loads v + 1; each column in
//! turn drains v, waits until no lookup named v for `--drain-quiet-ms` (at most 5 s), and
//! server by server unloads v and loads v + 1; the spare column unloads — by direct
//! `Server::host`/`drain`/`unload` calls. A "load" builds the server's own table of the shard
//! (every server holds its own copy, as separate machines would) on the blocking pool.
//!
//! `--roll-clients` closed-loop clients read batches of `--slo-batch` random ids throughout.
//! Every row's first float is its version, so a batch whose rows carry two versions is
//! counted as mixed. Reported: QPS and p99 during the rolls vs the steady state before them,
//! the time of a roll, the servers' held bytes (their `embstore_bytes_in_memory`) and the
//! process's RSS at most during the rolls vs before, and mixed batches, with the protocol on
//! and off (`ClientOptions::consistent`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions};
use embstore_common::SplitMix64;
use embstore_server::Server;
use embstore_table::{now_ms, Table};

use super::{metric, table_of, Cluster, ServingArgs, Stats, REPLICAS, SHARDS};

/// Rolls per protocol setting.
const ROLLS: u64 = 3;

/// What one run (one protocol setting) measured.
struct Outcome {
    steady: Stats,
    during: Stats,
    roll_s: Vec<f64>,
    held_before: f64,
    held_peak: f64,
    rss_before: f64,
    rss_peak: f64,
    batches_rolling: usize,
    mixed_rolling: usize,
    batches: usize,
    mixed: usize,
    failed: usize,
}

pub(crate) async fn run(
    args: &ServingArgs,
    values: Arc<Vec<f32>>,
    shard_ids: &[Vec<u64>],
) -> Result<(), String> {
    println!(
        "\n== rolling updates under load: {SHARDS} shards × {REPLICAS} replicas + a spare column, \
         {ROLLS} rolls, {} clients × batch {}, drain quiet {} ms ==",
        args.roll_clients, args.slo_batch, args.drain_quiet_ms
    );
    let shard_ids = Arc::new(shard_ids.to_vec());
    for consistent in [true, false] {
        let o = run_one(args, values.clone(), shard_ids.clone(), consistent).await?;
        let protocol = if consistent { "on" } else { "off" };
        let table_bytes = values.len() as f64 * 4.0;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "part": "roll", "protocol": protocol,
                    "steady_qps": o.steady.qps, "steady_p99_ms": o.steady.p99_ms,
                    "steady_avg_ms": o.steady.avg_ms,
                    "rolling_qps": o.during.qps, "rolling_p99_ms": o.during.p99_ms,
                    "rolling_avg_ms": o.during.avg_ms, "roll_seconds": o.roll_s,
                    "held_before_bytes": o.held_before, "held_peak_bytes": o.held_peak,
                    "rss_before_bytes": o.rss_before, "rss_peak_bytes": o.rss_peak,
                    "table_bytes": table_bytes,
                    "batches_rolling": o.batches_rolling, "mixed_rolling": o.mixed_rolling,
                    "batches": o.batches, "mixed": o.mixed, "failed": o.failed,
                })
            );
            continue;
        }
        let mb = |b: f64| b / (1 << 20) as f64;
        println!("protocol {protocol}:");
        println!(
            "  steady:  {:>6.0} batches/s, avg {:.3} ms, p99 {:.3} ms",
            o.steady.qps, o.steady.avg_ms, o.steady.p99_ms
        );
        println!(
            "  rolling: {:>6.0} batches/s, avg {:.3} ms, p99 {:.3} ms ({:.2}× the steady QPS, \
             {:.2}× its p99)",
            o.during.qps,
            o.during.avg_ms,
            o.during.p99_ms,
            o.during.qps / o.steady.qps,
            o.during.p99_ms / o.steady.p99_ms
        );
        let rolls: Vec<String> = o.roll_s.iter().map(|s| format!("{s:.2}")).collect();
        println!("  a roll took {} s", rolls.join(", "));
        println!(
            "  servers' held bytes: {:.0} MB before, {:.0} MB at most while rolling: +{:.0} MB = \
             {:.3} of what they held, {:.2} table copies ({:.0} MB a copy; goal ≤ 1/{REPLICAS})",
            mb(o.held_before),
            mb(o.held_peak),
            mb(o.held_peak - o.held_before),
            (o.held_peak - o.held_before) / o.held_before,
            (o.held_peak - o.held_before) / table_bytes,
            mb(table_bytes)
        );
        println!(
            "  process RSS: {:.0} MB before, {:.0} MB at most: +{:.0} MB",
            mb(o.rss_before),
            mb(o.rss_peak),
            mb(o.rss_peak - o.rss_before)
        );
        println!(
            "  batches read while rolling: {}, mixing versions: {} ({:.2} %); in the whole run \
             (steady state too): {} of {} ({:.2} %); failed: {}",
            o.batches_rolling,
            o.mixed_rolling,
            100.0 * o.mixed_rolling as f64 / o.batches_rolling.max(1) as f64,
            o.mixed,
            o.batches,
            100.0 * o.mixed as f64 / o.batches.max(1) as f64,
            o.failed
        );
    }
    Ok(())
}

/// Shard `shard`'s rows at `version`: the benchmark's values with each row's first float set
/// to the version.
fn version_table(
    values: &[f32],
    ids: &[u64],
    dim: usize,
    version: u64,
) -> Result<Arc<Table>, String> {
    let mut rows = Vec::with_capacity(ids.len() * dim);
    for &k in ids {
        rows.extend_from_slice(&values[k as usize * dim..][..dim]);
        let at = rows.len() - dim;
        rows[at] = version as f32;
    }
    table_of(ids, &rows, dim)
}

/// One server "loads" shard `shard` of `version`: builds its table on the blocking pool and
/// hosts it.
async fn load(
    server: &Arc<Server>,
    values: &Arc<Vec<f32>>,
    shard_ids: &Arc<Vec<Vec<u64>>>,
    dim: usize,
    shard: usize,
    version: u64,
) -> Result<(), String> {
    let (values, shard_ids) = (values.clone(), shard_ids.clone());
    let table = tokio::task::spawn_blocking(move || {
        version_table(&values, &shard_ids[shard], dim, version)
    })
    .await
    .map_err(|e| e.to_string())??;
    server.host("user", version, shard as u32, SHARDS as u32, table).map_err(|e| e.to_string())
}

/// Waits until no lookup named `version` on `servers` for `quiet`, or 5 s have passed.
async fn wait_quiet(servers: &[Arc<Server>], version: u64, quiet: Duration) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let now = now_ms();
        let busy = servers.iter().any(|s| {
            s.info().held.iter().any(|h| {
                h.version == version
                    && h.last_request_ms > 0
                    && now.saturating_sub(h.last_request_ms) < quiet.as_millis() as u64
            })
        });
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process's resident set, in bytes.
fn rss() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0)
}

/// One batch read during the run: when it started (s since the run began), its latency (µs),
/// whether it mixed versions.
type Read = (f64, f64, bool);

async fn run_one(
    args: &ServingArgs,
    values: Arc<Vec<f32>>,
    shard_ids: Arc<Vec<Vec<u64>>>,
    consistent: bool,
) -> Result<Outcome, String> {
    let d = args.dim;
    // Servers 0..4: column a (shards 0, 1), column b; 4..6: the spare column.
    let names: Vec<String> = ["a", "b", "spare"]
        .iter()
        .flat_map(|c| (0..SHARDS).map(move |s| format!("{c}{s}")))
        .collect();
    let cluster = Cluster::start(&names).await?;
    let columns: Vec<Vec<Arc<Server>>> =
        cluster.servers.chunks(SHARDS).map(<[Arc<Server>]>::to_vec).collect();
    let (spare, serving) = columns.split_last().ok_or("no columns")?;
    for column in serving {
        for (s, server) in column.iter().enumerate() {
            load(server, &values, &shard_ids, d, s, 1).await?;
        }
    }
    let options = ClientOptions { consistent, ..ClientOptions::default() };
    let client =
        Arc::new(Client::connect(&cluster.addrs, options).await.map_err(|e| e.to_string())?);
    let held = {
        let servers = cluster.servers.clone();
        move || -> f64 {
            servers.iter().map(|s| metric(&s.metrics_text(), "embstore_bytes_in_memory")).sum()
        }
    };
    let (held_before, rss_before) = (held(), rss());

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = tokio::task::JoinSet::new();
    for c in 0..args.roll_clients {
        let (client, stop) = (client.clone(), stop.clone());
        let (batch, rows, seed) = (args.slo_batch, args.rows, args.seed);
        readers.spawn(async move {
            let mut rng =
                SplitMix64::new(seed ^ (c as u64 + 7).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (mut reads, mut failed) = (Vec::<Read>::new(), 0usize);
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<u64> = (0..batch).map(|_| rng.next_u64() % rows).collect();
                let t0 = Instant::now();
                let at = start.elapsed().as_secs_f64();
                match client.lookup("user", &ids).await {
                    Ok(r) => {
                        let lat = t0.elapsed().as_secs_f64() * 1e6;
                        let first = r.values[0];
                        let mixed = r
                            .values
                            .chunks(r.embedding_dim)
                            .zip(&r.found)
                            .any(|(row, &f)| f && row[0] != first);
                        reads.push((at, lat, mixed));
                    }
                    Err(_) => failed += 1,
                }
            }
            (reads, failed)
        });
    }
    // The servers' held bytes and the RSS, sampled every 20 ms.
    let sampler = {
        let stop = stop.clone();
        let held = held.clone();
        tokio::spawn(async move {
            let (mut h, mut r) = (0f64, 0f64);
            while !stop.load(Ordering::Relaxed) {
                h = h.max(held());
                r = r.max(rss());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (h, r)
        })
    };
    let warm = 0.5;
    tokio::time::sleep(Duration::from_secs_f64(warm + args.seconds)).await;
    let rolling_from = start.elapsed().as_secs_f64();
    let quiet = Duration::from_millis(args.drain_quiet_ms);
    let mut roll_s = Vec::new();
    for v in 1..=ROLLS {
        let t = Instant::now();
        for (s, server) in spare.iter().enumerate() {
            load(server, &values, &shard_ids, d, s, v + 1).await?;
        }
        for column in serving {
            for server in column {
                server.drain("user", v, None);
            }
            wait_quiet(column, v, quiet).await;
            for (s, server) in column.iter().enumerate() {
                server.unload("user", v, None);
                load(server, &values, &shard_ids, d, s, v + 1).await?;
            }
        }
        for server in spare {
            server.unload("user", v + 1, None);
        }
        roll_s.push(t.elapsed().as_secs_f64());
    }
    let rolling_to = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (mut reads, mut failed) = (Vec::new(), 0);
    while let Some(done) = readers.join_next().await {
        let (r, f) = done.map_err(|e| e.to_string())?;
        reads.extend(r);
        failed += f;
    }
    let (held_peak, rss_peak) = sampler.await.map_err(|e| e.to_string())?;
    cluster.stop().await;

    let window = |from: f64, to: f64| -> Vec<&Read> {
        reads.iter().filter(|r| r.0 >= from && r.0 < to).collect()
    };
    let steady: Vec<f64> = window(warm, rolling_from).iter().map(|r| r.1).collect();
    let rolling = window(rolling_from, rolling_to);
    let during: Vec<f64> = rolling.iter().map(|r| r.1).collect();
    Ok(Outcome {
        steady: Stats::of(&steady, rolling_from - warm),
        during: Stats::of(&during, rolling_to - rolling_from),
        roll_s,
        held_before,
        held_peak,
        rss_before,
        rss_peak,
        batches_rolling: rolling.len(),
        mixed_rolling: rolling.iter().filter(|r| r.2).count(),
        batches: reads.len(),
        mixed: reads.iter().filter(|r| r.2).count(),
        failed,
    })
}
