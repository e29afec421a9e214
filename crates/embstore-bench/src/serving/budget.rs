//! Shards larger than memory (memory-budgeted, with the NVMe tier): the table is
//! written to a durable store and checkpointed; then, for each of `--budget-fractions`, a
//! cluster of `SHARDS` servers (one replica each) loads its shard from the checkpoint — into
//! memory (fraction 0) or budgeted at that fraction of the shard's rows
//! (`Server::with_tier`, segments linked, footers read) — and serves closed-loop clients
//! batches of `--slo-batch` ids (uniform, or Zipf with `--zipf`): with uniform ids a row is
//! in memory with about the budget's probability, the worst case for a cache. Each point
//! follows 3 s of untimed lookups that warm the cache. Reported per point: the load time, average and p99 latency, QPS, the rows
//! read from disk per batch and the budget's bytes held. The segment reads bypass the page
//! cache (O_DIRECT) where the file system allows it.

use std::sync::Arc;
use std::time::Instant;

use embstore_client::{Client, ClientOptions};
use embstore_server::{Server, TierOptions};
use embstore_table::{Budget, Store, TableConfig};

use super::{closed_loop, Cluster, Peer, ServingArgs, Stats, SHARDS};

/// Seconds of lookups before each timed point.
const WARM_S: f64 = 3.0;

pub(crate) async fn run(args: &ServingArgs, values: &[f32]) -> Result<(), String> {
    let d = args.dim;
    let root = args.budget_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("embstore-bench-budget-{}", std::process::id()))
    });
    let result = run_in(args, values, d, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run_in(
    args: &ServingArgs,
    values: &[f32],
    d: usize,
    root: &std::path::Path,
) -> Result<(), String> {
    let e = |e: embstore_table::Error| e.to_string();
    let ckpt = root.join("ckpt");
    {
        let store = Store::open(root.join("store")).map_err(e)?;
        let t = store.create_table(TableConfig::new("user", d)).map_err(e)?;
        for (i, chunk) in values.chunks(d * 10_000).enumerate() {
            let ids: Vec<u64> =
                (0..(chunk.len() / d) as u64).map(|k| k + i as u64 * 10_000).collect();
            t.assign(&ids, chunk).map_err(e)?;
        }
        store.checkpoint(&ckpt, None).map_err(e)?;
    }
    let shard_bytes = values.len() as u64 * 4 / SHARDS as u64;
    println!(
        "\n== shards under a memory budget: {} rows × D {d}, {SHARDS} shards × 1 replica, \
         loaded from a checkpoint in {}; {} clients × batch {} of {} ids, {} s a point ==",
        args.rows,
        root.display(),
        args.clients.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("/"),
        args.slo_batch,
        if args.zipf > 0.0 { format!("Zipf({})", args.zipf) } else { "uniform".into() },
        args.seconds
    );
    println!(
        "{:<10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>11} {:>10}",
        "budget", "load s", "clients", "avg ms", "p99 ms", "QPS", "disk rows/b", "held MB"
    );
    for &fraction in &args.budget_fractions {
        let budget = (fraction > 0.0)
            .then(|| Budget::shared((shard_bytes as f64 * fraction) as u64))
            .transpose()
            .map_err(e)?;
        let names: Vec<String> = (0..SHARDS).map(|s| format!("budget-s{s}")).collect();
        let cluster = Cluster::start_with(&names, |name| match &budget {
            Some(b) => {
                let tier = TierOptions { dir: root.join(name), budget: b.clone() };
                Server::with_tier(name, 1 << 20, tier).map_err(|e| e.to_string())
            }
            None => Ok(Server::new(name, 1 << 20)),
        })
        .await?;
        // Each server gets a budget of its own: separate machines.
        let t0 = Instant::now();
        let mut loads = Vec::new();
        for (s, server) in cluster.servers.iter().enumerate() {
            let (server, ckpt) = (server.clone(), ckpt.clone());
            loads.push(tokio::task::spawn_blocking(move || {
                server.load("user", 1, s as u32, SHARDS as u32, &ckpt)
            }));
        }
        for l in loads {
            l.await.map_err(|e| e.to_string())?.map_err(e)?;
        }
        let load_s = t0.elapsed().as_secs_f64();
        let client = Client::connect(&cluster.addrs, ClientOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let peer = Peer::Served(Arc::new(client));
        let label =
            if fraction > 0.0 { format!("{:.0} %", fraction * 100.0) } else { "memory".into() };
        for &clients in &args.clients {
            // Warm the cache up first: the figures are of the steady state.
            closed_loop(&peer, clients, args.slo_batch, WARM_S, args).await?;
            let before = disk_reads(&cluster);
            let lat = closed_loop(&peer, clients, args.slo_batch, args.seconds, args).await?;
            let st = Stats::of(&lat, args.seconds);
            // The warm-up's reads count too: per batch over all batches of the point.
            let batches = lat.len() as f64 * (1.0 + 0.5 / args.seconds);
            let per_batch = (disk_reads(&cluster) - before) / batches.max(1.0);
            let held = budget.as_ref().map_or(shard_bytes as f64, |b| b.used() as f64) / 1e6;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "part": "budget", "budget_fraction": fraction, "load_s": load_s,
                        "clients": clients, "batch": args.slo_batch, "zipf": args.zipf, "avg_ms": st.avg_ms,
                        "p99_ms": st.p99_ms, "qps": st.qps, "disk_rows_per_batch": per_batch,
                        "held_mb_per_server": held,
                    })
                );
            } else {
                println!(
                    "{label:<10} {load_s:>8.2} {clients:>8} {:>9.3} {:>9.3} {:>9.0} {per_batch:>11.1} \
                     {held:>10.1}",
                    st.avg_ms, st.p99_ms, st.qps
                );
            }
        }
        cluster.stop().await;
    }
    Ok(())
}

/// Rows the cluster's servers read from disk so far (their tables' `cold_reads`).
fn disk_reads(cluster: &Cluster) -> f64 {
    cluster.servers.iter().map(|s| s.cold_reads() as f64).sum()
}
