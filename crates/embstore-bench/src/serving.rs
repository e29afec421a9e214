//! `serving` — issue 9's benchmark 1, the paper's Table 4 on loopback: batches of random ids
//! looked up through the batch-query service (2 shards × 2 replicas, in this process, on
//! loopback) next to Redis (`redis-server`, a separate process, `MGET` of the same rows), closed
//! loop with each client count; average, p50 and p99 latency per batch and QPS.
//!
//! Dimensions: `--rows` rows of `--dim` float32 (1 KB at D 256), uniform random ids, batch sizes
//! `--batches`, clients `--clients`, `--seconds` per point after a 0.5 s warm-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions};
use embstore_server::Server;
use embstore_table::{shard_of_key, Store, TableConfig};

#[derive(clap::Args, Debug)]
pub(crate) struct ServingArgs {
    /// Rows in the table.
    #[arg(long, default_value_t = 200_000)]
    rows: u64,
    /// embedding_dim (256: 1 KB rows).
    #[arg(long, default_value_t = 256)]
    dim: usize,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "10,100,500")]
    batches: Vec<usize>,
    /// Concurrent clients (closed loop).
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    clients: Vec<usize>,
    /// Seconds timed per point.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// The redis-server binary ("" to skip Redis).
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// One JSON object per point instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Latencies of one point, in µs.
struct Point {
    system: &'static str,
    batch: usize,
    clients: usize,
    lat_us: Vec<f64>,
    seconds: f64,
}

impl Point {
    fn print(&self, json: bool) {
        let mut l = self.lat_us.clone();
        l.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)));
        let avg = l.iter().sum::<f64>() / l.len().max(1) as f64;
        let (p50, p99) = (q(0.5).copied().unwrap_or(0.0), q(0.99).copied().unwrap_or(0.0));
        let qps = l.len() as f64 / self.seconds;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "system": self.system, "batch": self.batch, "clients": self.clients,
                    "avg_ms": avg / 1e3, "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3,
                    "qps": qps, "batches": l.len(),
                })
            );
        } else {
            println!(
                "{:<10} batch {:>4} clients {:>2}: avg {:>7.3} ms  p50 {:>7.3} ms  p99 {:>7.3} ms  {:>8.0} batches/s",
                self.system, self.batch, self.clients, avg / 1e3, p50 / 1e3, p99 / 1e3, qps
            );
        }
    }
}

pub(crate) fn run(args: ServingArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run_async(args))
}

async fn run_async(args: ServingArgs) -> Result<(), String> {
    println!("{}", crate::machine_line());
    let d = args.dim;
    let mut rng = args.seed;
    let values: Vec<f32> = (0..args.rows as usize * d)
        .map(|_| (splitmix(&mut rng) >> 40) as f32 / 16_777_216.0)
        .collect();
    // Two shards, each one table; two replicas (servers) of each share it.
    let store = Store::new();
    let mut servers = Vec::new();
    let mut stops = Vec::new();
    let mut addrs = Vec::new();
    for s in 0..2usize {
        let t = store
            .create_table(TableConfig::new(format!("user{s}"), d))
            .map_err(|e| e.to_string())?;
        let ids: Vec<u64> = (0..args.rows).filter(|&k| shard_of_key(k, 2) == s).collect();
        let rows: Vec<f32> =
            ids.iter().flat_map(|&k| values[k as usize * d..][..d].iter().copied()).collect();
        t.assign(&ids, &rows).map_err(|e| e.to_string())?;
        for r in 0..2 {
            let server = Server::new(format!("s{s}r{r}"), 1 << 20);
            server.host("user", 1, s as u32, 2, t.clone()).map_err(|e| e.to_string())?;
            let listener =
                tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
            addrs.push(listener.local_addr().map_err(|e| e.to_string())?.to_string());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stops.push(tx);
            let srv = server.clone();
            servers.push(tokio::spawn(async move {
                let _ = embstore_server::serve(srv, listener, Default::default(), async {
                    let _ = rx.await;
                })
                .await;
            }));
        }
    }
    println!(
        "embstore: {} rows × D {d} ({} MB), 2 shards × 2 replicas on loopback, in this process",
        args.rows,
        (args.rows as usize * d * 4) >> 20
    );
    let client = Arc::new(
        Client::connect(&addrs, ClientOptions::default()).await.map_err(|e| e.to_string())?,
    );
    // Redis, a separate process, with the same rows as 8-byte keys.
    let redis = match args.redis_server.as_str() {
        "" => None,
        bin => Some(Redis::start(bin, &values, d).await?),
    };
    for &batch in &args.batches {
        for &clients in &args.clients {
            let c = client.clone();
            let rows = args.rows;
            let p = closed_loop(clients, batch, args.seconds, rows, args.seed, move |ids| {
                let c = c.clone();
                async move { c.lookup("user", &ids).await.map(|_| ()).map_err(|e| e.to_string()) }
            })
            .await?;
            Point { system: "embstore", batch, clients, lat_us: p, seconds: args.seconds }
                .print(args.json);
            if let Some(r) = &redis {
                let conn = r.conn.clone();
                let p = closed_loop(clients, batch, args.seconds, rows, args.seed, move |ids| {
                    let mut conn = conn.clone();
                    async move {
                        let keys: Vec<Vec<u8>> =
                            ids.iter().map(|k| k.to_le_bytes().to_vec()).collect();
                        let got: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                            .arg(&keys)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        if got.len() != keys.len() {
                            return Err("redis: short MGET".into());
                        }
                        Ok(())
                    }
                })
                .await?;
                Point { system: "redis", batch, clients, lat_us: p, seconds: args.seconds }
                    .print(args.json);
            }
        }
    }
    drop(redis);
    for tx in stops {
        let _ = tx.send(());
    }
    for s in servers {
        let _ = s.await;
    }
    Ok(())
}

/// `clients` tasks, each looking up batches of `batch` random ids back to back for 0.5 s of
/// warm-up and then `seconds`; the latencies of the timed batches, in µs.
async fn closed_loop<F, Fut>(
    clients: usize,
    batch: usize,
    seconds: f64,
    rows: u64,
    seed: u64,
    call: F,
) -> Result<Vec<f64>, String>
where
    F: Fn(Vec<u64>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let warm = Duration::from_millis(500);
    let timed = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let call = call.clone();
        tasks.spawn(async move {
            let mut rng = seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut lat = Vec::new();
            loop {
                let now = start.elapsed();
                if now >= warm + timed {
                    break;
                }
                let ids: Vec<u64> = (0..batch).map(|_| splitmix(&mut rng) % rows).collect();
                let t0 = Instant::now();
                call(ids).await?;
                if now >= warm {
                    lat.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok::<_, String>(lat)
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.map_err(|e| e.to_string())??);
    }
    Ok(all)
}

/// SplitMix64: the next of a seeded stream of 64-bit values.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A `redis-server` started for the benchmark on a free loopback port, killed when dropped.
struct Redis {
    child: std::process::Child,
    conn: redis::aio::MultiplexedConnection,
}

impl Redis {
    async fn start(bin: &str, values: &[f32], d: usize) -> Result<Self, String> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            l.local_addr().map_err(|e| e.to_string())?.port()
        };
        let child = std::process::Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e} (apt install redis-server)"))?;
        let mut r = Redis { child, conn: Self::connect(port).await? };
        let rows = values.len() / d;
        for chunk in (0..rows).collect::<Vec<_>>().chunks(1000) {
            let mut cmd = redis::cmd("MSET");
            for &k in chunk {
                let bytes: Vec<u8> =
                    values[k * d..][..d].iter().flat_map(|x| x.to_le_bytes()).collect();
                cmd.arg(&(k as u64).to_le_bytes()[..]).arg(bytes);
            }
            let () = cmd.query_async(&mut r.conn).await.map_err(|e| e.to_string())?;
        }
        println!("redis: the same {rows} rows as 8-byte keys, MGET per batch, port {port}");
        Ok(r)
    }

    async fn connect(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
        let start = Instant::now();
        loop {
            match client.get_multiplexed_async_connection().await {
                Ok(c) => return Ok(c),
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(format!("redis did not start: {e}")),
            }
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
