//! `serving` — the batch-query service's benchmarks, on loopback, peers side by side
//! in the same run and on the same cores:
//!
//! 1. **latency** — the paper's Table 4: batches of random ids looked up through the service
//!    (2 shards × 2 replicas), closed loop with each client count, over each transport: the
//!    framed path on TCP (`embstore`, the client's default), gRPC (`embstore-grpc`) and the
//!    framed path on Unix sockets (`embstore-unix`), the framed path to 2 servers that each
//!    hold both shards (`embstore-together`: one server, like Redis, answers a whole batch in
//!    one request); next to the same servers with their
//!    storage swapped for RocksDB (`--features rocksdb`, see [`rocks`]; `rocksdb` framed,
//!    `rocksdb-grpc`) and to Redis (`redis-server`, a separate process, `MGET` of the same
//!    rows); average, p50 and p99 latency per batch, QPS, and CPU time per looked-up row
//!    (this process's, servers and clients together, plus redis-server's for Redis).
//! 2. **breakdown** — where a batch's time goes: the servers' own time per shard call (their
//!    `embstore_lookup_seconds` histogram during the one-client runs), split by timing the
//!    storage lookup and the rows-to-bytes copy alone; the response's protobuf encoding; the
//!    client's decoding and scatter; the rest (gRPC, HTTP/2, loopback, scheduling).
//! 3. **slo** — the highest QPS at `--slo-batch` ids whose p99 stays under `--slo-ms`, raising
//!    the number of closed-loop clients (1, 2, 4, …) until p99 passes it.
//! 4. **budget** — see [`budget`]: shards loaded from a checkpoint under a memory budget (the
//!    NVMe tier) vs into memory: load time, and batch latency and QPS at each budget.
//! 5. **roll** — see [`roll`]: QPS and p99 during rolling updates vs steady state, the roll's
//!    time, the servers' extra memory, and batches mixing versions with the protocol on and off.
//!
//! Dimensions: `--rows` rows of `--dim` float32 (1 KB at D 256), uniform random ids, batch sizes
//! `--batches`, clients `--clients`, `--seconds` per point after a 0.5 s warm-up. The servers
//! run in this process, on one tokio runtime of 2 threads shared with the clients.

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions, Transport};
use embstore_common::SplitMix64;
use embstore_proto::v1::LookupResponse;
use embstore_server::{RowSource, Server};
use embstore_table::{shard_of_key, Store, Table, TableConfig};
use prost::Message;

mod budget;
#[cfg(feature = "rocksdb")]
mod rocks;
mod roll;

/// Shards and replicas of every cluster of the benchmark.
const SHARDS: usize = 2;
const REPLICAS: usize = 2;

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
    /// Parts to run: latency, breakdown, slo, budget, roll.
    #[arg(long, value_delimiter = ',', default_value = "latency,breakdown,slo,budget,roll")]
    parts: Vec<String>,
    /// The redis-server binary ("" to skip Redis).
    #[arg(long, default_value = "redis-server")]
    redis_server: String,
    /// Where the RocksDB-backed server keeps its databases (removed at the end); default: a
    /// fresh folder under the temporary directory. Needs `--features rocksdb`.
    #[arg(long)]
    rocksdb_dir: Option<std::path::PathBuf>,
    /// The SLO: p99 latency in ms.
    #[arg(long, default_value_t = 10.0)]
    slo_ms: f64,
    /// Memory budgets of the `budget` part, as fractions of each shard's rows (0: the shard
    /// loaded into memory, no budget).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5,0.2,0.1")]
    budget_fractions: Vec<f64>,
    /// Where the `budget` part writes its store, checkpoint and servers' data dirs (removed at
    /// the end): put it on the NVMe; default: a fresh folder under the temporary directory.
    #[arg(long)]
    budget_dir: Option<std::path::PathBuf>,
    /// Skew of the ids the clients look up: 0, uniform; s > 0, Zipf(s) over the rows in a
    /// fixed random order (rank r is row `r × 2654435761 mod rows`).
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Batch size of the SLO search and of the roll's load.
    #[arg(long, default_value_t = 500)]
    slo_batch: usize,
    /// Client counts tried for the SLO, in order, until p99 passes the SLO.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    slo_clients: Vec<usize>,
    /// Closed-loop clients reading during the rolls.
    #[arg(long, default_value_t = 8)]
    roll_clients: usize,
    /// A draining replica is unloaded once no lookup named its version for this long (ms).
    #[arg(long, default_value_t = 500)]
    drain_quiet_ms: u64,
    /// One JSON object per point instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ServingArgs {
    fn part(&self, name: &str) -> bool {
        self.parts.iter().any(|p| p == name)
    }
}

/// Summary of a set of latencies (µs) over `seconds`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub qps: f64,
    pub n: usize,
    /// CPU time per looked-up row (servers and clients; 0 where not measured).
    pub cpu_ns_per_row: f64,
}

impl Stats {
    pub(crate) fn of(lat_us: &[f64], seconds: f64) -> Self {
        let mut l = lat_us.to_vec();
        l.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        Stats {
            avg_ms: l.iter().sum::<f64>() / l.len().max(1) as f64 / 1e3,
            p50_ms: q(0.5) / 1e3,
            p99_ms: q(0.99) / 1e3,
            qps: l.len() as f64 / seconds,
            n: l.len(),
            cpu_ns_per_row: 0.0,
        }
    }
}

/// One measured point.
struct Point {
    part: &'static str,
    system: &'static str,
    batch: usize,
    clients: usize,
    stats: Stats,
}

impl Point {
    fn print(&self, json: bool) {
        let s = &self.stats;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "part": self.part, "system": self.system, "batch": self.batch,
                    "clients": self.clients, "avg_ms": s.avg_ms, "p50_ms": s.p50_ms,
                    "p99_ms": s.p99_ms, "qps": s.qps, "batches": s.n,
                    "cpu_ns_per_row": s.cpu_ns_per_row,
                })
            );
        } else {
            println!(
                "{:<13} batch {:>4} clients {:>2}: avg {:>7.3} ms  p50 {:>7.3} ms  p99 {:>7.3} ms  {:>8.0} batches/s  {:>6.0} ns CPU/row",
                self.system, self.batch, self.clients, s.avg_ms, s.p50_ms, s.p99_ms, s.qps, s.cpu_ns_per_row
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

/// Running servers on loopback, in this process.
pub(crate) struct Cluster {
    pub servers: Vec<Arc<Server>>,
    pub addrs: Vec<String>,
    stops: Vec<tokio::sync::watch::Sender<bool>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Unix sockets of the framed path (instead of TCP ports), removed when it stops.
    sockets: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Empty servers named `names`, each serving on a free loopback port.
    pub(crate) async fn start(names: &[String]) -> Result<Self, String> {
        Self::start_with(names, |name| Ok(Server::new(name, 1 << 20))).await
    }

    /// [`Cluster::start`] with servers made by `make` (given each name).
    pub(crate) async fn start_with(
        names: &[String],
        make: impl Fn(&str) -> Result<Arc<Server>, String>,
    ) -> Result<Self, String> {
        Self::start_on(names, make, false).await
    }

    /// [`Cluster::start_with`], the framed path on Unix sockets when `unix` (else on TCP).
    pub(crate) async fn start_on(
        names: &[String],
        make: impl Fn(&str) -> Result<Arc<Server>, String>,
        unix: bool,
    ) -> Result<Self, String> {
        let sockets = unix.then(tempfile::tempdir).transpose().map_err(|e| e.to_string())?;
        let mut c =
            Cluster { servers: vec![], addrs: vec![], stops: vec![], tasks: vec![], sockets };
        for name in names {
            let server = make(name)?;
            let listener =
                tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
            c.addrs.push(listener.local_addr().map_err(|e| e.to_string())?.to_string());
            let framed = match &c.sockets {
                Some(dir) => embstore_server::FramedListener::unix(dir.path().join(name)),
                None => embstore_server::FramedListener::tcp("127.0.0.1:0").await,
            };
            let framed = framed.map_err(|e| e.to_string())?;
            let (tx, rx) = tokio::sync::watch::channel(false);
            c.stops.push(tx);
            let quit = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                let _ = rx.wait_for(|q| *q).await;
            };
            let (srv, q) = (server.clone(), quit(rx.clone()));
            c.tasks.push(tokio::spawn(async move {
                let _ = embstore_server::serve(srv, listener, Default::default(), q).await;
            }));
            let (srv, q) = (server.clone(), quit(rx));
            c.tasks.push(tokio::spawn(async move {
                let _ =
                    embstore_server::serve_framed(srv, framed, Default::default(), None, q).await;
            }));
            let t0 = Instant::now();
            while server.info().framed_port == 0 && server.info().framed_unix.is_empty() {
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err("the framed lookup path did not start".into());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            c.servers.push(server);
        }
        Ok(c)
    }

    /// `SHARDS` × `REPLICAS` servers, replica r of shard s hosting `shards[s]` as version 1 of
    /// table "user" (replicas of a shard share its rows).
    async fn hosting(
        prefix: &str,
        shards: &[Arc<dyn RowSource>],
        unix: bool,
    ) -> Result<Self, String> {
        let names: Vec<String> = (0..SHARDS)
            .flat_map(|s| (0..REPLICAS).map(move |r| format!("{prefix}-s{s}r{r}")))
            .collect();
        let c = Self::start_on(&names, |name| Ok(Server::new(name, 1 << 20)), unix).await?;
        for (i, server) in c.servers.iter().enumerate() {
            let s = i / REPLICAS;
            server
                .host("user", 1, s as u32, SHARDS as u32, shards[s].clone())
                .map_err(|e| e.to_string())?;
        }
        Ok(c)
    }

    /// `REPLICAS` servers, each hosting every shard of `shards` as version 1 of table "user"
    /// (a batch's ids fall in several shards of one server: one request per server).
    async fn hosting_together(prefix: &str, shards: &[Arc<dyn RowSource>]) -> Result<Self, String> {
        let names: Vec<String> = (0..REPLICAS).map(|r| format!("{prefix}-r{r}")).collect();
        let c = Self::start_on(&names, |name| Ok(Server::new(name, 1 << 20)), false).await?;
        for server in &c.servers {
            for (s, rows) in shards.iter().enumerate() {
                server
                    .host("user", 1, s as u32, SHARDS as u32, rows.clone())
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(c)
    }

    pub(crate) async fn stop(self) {
        for tx in self.stops {
            let _ = tx.send(true);
        }
        for t in self.tasks {
            let _ = t.await;
        }
        drop(self.sockets);
    }
}

/// The lookup time of `servers` so far: seconds and lookups, summed over them.
fn server_time(servers: &[Arc<Server>]) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for s in servers {
        sum += metric(&s.metrics_text(), "embstore_lookup_seconds_sum");
        count += metric(&s.metrics_text(), "embstore_lookup_seconds_count");
    }
    (sum, count)
}

/// The sum of the values of metric `name` (every label set) in Prometheus text.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(['{', ' '])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the clients look rows up in.
#[derive(Clone)]
enum Peer {
    /// The batch-query service, through the Rust client.
    Served(Arc<Client>),
    /// Redis, one `MGET` per batch.
    Redis(redis::aio::MultiplexedConnection),
}

impl Peer {
    async fn lookup(&self, ids: Vec<u64>) -> Result<(), String> {
        match self {
            Peer::Served(c) => c.lookup("user", &ids).await.map(|_| ()).map_err(|e| e.to_string()),
            Peer::Redis(conn) => {
                let mut conn = conn.clone();
                let keys: Vec<Vec<u8>> = ids.iter().map(|k| k.to_le_bytes().to_vec()).collect();
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
        }
    }
}

/// A system under test: its name, how to reach it, and its servers (for their own timings).
struct System {
    name: &'static str,
    peer: Peer,
    cluster: Option<Cluster>,
    /// The servers it reads from (for their own timings).
    servers: Vec<Arc<Server>>,
    /// The shards' rows, for timing the storage alone.
    shards: Vec<Arc<dyn RowSource>>,
}

async fn run_async(args: ServingArgs) -> Result<(), String> {
    println!("{}", crate::machine_line());
    let d = args.dim;
    let mut rng = SplitMix64::new(args.seed);
    let values: Vec<f32> =
        (0..args.rows as usize * d).map(|_| (rng.next_u64() >> 40) as f32 / 16_777_216.0).collect();
    let shard_ids: Vec<Vec<u64>> = (0..SHARDS)
        .map(|s| (0..args.rows).filter(|&k| shard_of_key(k, SHARDS) == s).collect())
        .collect();
    let shard_rows = |s: usize| -> Vec<f32> {
        shard_ids[s].iter().flat_map(|&k| values[k as usize * d..][..d].iter().copied()).collect()
    };
    let mut systems = Vec::new();
    // Killed when dropped, after the parts that use it.
    let mut redis = None;
    if args.part("latency") || args.part("breakdown") || args.part("slo") {
        // embstore: each shard one table, shared by its two replicas (servers).
        let mut shards: Vec<Arc<dyn RowSource>> = Vec::new();
        for (s, ids) in shard_ids.iter().enumerate() {
            let t = Store::new()
                .create_table(TableConfig::new(format!("user{s}"), d))
                .map_err(|e| e.to_string())?;
            t.assign(ids, &shard_rows(s)).map_err(|e| e.to_string())?;
            shards.push(t);
        }
        let cluster = Cluster::hosting("mem", &shards, false).await?;
        let client = Client::connect(&cluster.addrs, ClientOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let grpc = client_with(&cluster.addrs, Transport::Grpc).await?;
        let unix = Cluster::hosting("unix", &shards, true).await?;
        let unix_client = client_with(&unix.addrs, Transport::Framed).await?;
        let together = Cluster::hosting_together("together", &shards).await?;
        let together_client = client_with(&together.addrs, Transport::Framed).await?;
        println!(
            "embstore: {} rows × D {d} ({} MB), {SHARDS} shards × {REPLICAS} replicas on loopback, \
             in this process",
            args.rows,
            (args.rows as usize * d * 4) >> 20
        );
        let (servers, unix_servers) = (cluster.servers.clone(), unix.servers.clone());
        systems.push(System {
            name: "embstore",
            peer: Peer::Served(Arc::new(client)),
            servers: servers.clone(),
            cluster: Some(cluster),
            shards: shards.clone(),
        });
        systems.push(System {
            name: "embstore-grpc",
            peer: Peer::Served(Arc::new(grpc)),
            servers,
            cluster: None,
            shards: shards.clone(),
        });
        systems.push(System {
            name: "embstore-unix",
            peer: Peer::Served(Arc::new(unix_client)),
            servers: unix_servers,
            cluster: Some(unix),
            shards: shards.clone(),
        });
        systems.push(System {
            name: "embstore-together",
            peer: Peer::Served(Arc::new(together_client)),
            servers: together.servers.clone(),
            cluster: Some(together),
            shards,
        });
        if let Some((rocks, rocks_grpc)) = rocks_system(&args, &shard_ids, &shard_rows).await? {
            systems.push(rocks);
            systems.push(rocks_grpc);
        }
        // Redis, a separate process, with the same rows as 8-byte keys.
        if !args.redis_server.is_empty() {
            let r = Redis::start(&args.redis_server, &values, d).await?;
            let peer = Peer::Redis(r.conn.clone());
            let (cluster, servers, shards) = (None, vec![], vec![]);
            systems.push(System { name: "redis", peer, cluster, servers, shards });
            redis = Some(r);
        }
    }
    let mut server_us: Vec<(&str, usize, f64)> = Vec::new();
    let mut e2e: Vec<(&str, usize, f64)> = Vec::new();
    if args.part("latency") {
        println!("\n== latency: closed loop, {} s a point ==", args.seconds);
        let mut table = Vec::new();
        for &batch in &args.batches {
            for &clients in &args.clients {
                let mut row = Vec::new();
                for sys in &systems {
                    let before = server_time(&sys.servers);
                    let cpu0 = cpu_seconds(redis.as_ref());
                    let lat = closed_loop(&sys.peer, clients, batch, args.seconds, &args).await?;
                    let cpu = cpu_seconds(redis.as_ref()) - cpu0;
                    let mut stats = Stats::of(&lat, args.seconds);
                    // The warm-up's batches are not in `lat`: scale by the timed share.
                    let timed = args.seconds / (args.seconds + 0.5);
                    stats.cpu_ns_per_row = cpu * timed * 1e9 / (stats.n * batch).max(1) as f64;
                    if clients == 1 {
                        e2e.push((sys.name, batch, stats.avg_ms * 1e3));
                        if !sys.servers.is_empty() {
                            let (s0, n0) = before;
                            let (s1, n1) = server_time(&sys.servers);
                            server_us.push((sys.name, batch, (s1 - s0) / (n1 - n0).max(1.0) * 1e6));
                        }
                    }
                    Point { part: "latency", system: sys.name, batch, clients, stats }
                        .print(args.json);
                    row.push((sys.name, stats));
                }
                table.push((batch, clients, row));
            }
        }
        if !args.json {
            print_latency_table(&table);
        }
    }
    if args.part("breakdown") {
        breakdown(&args, &systems, &server_us, &e2e)?;
    }
    if args.part("slo") {
        println!(
            "\n== throughput at the SLO: batch {}, p99 < {} ms, closed loop with more and more \
             clients ==",
            args.slo_batch, args.slo_ms
        );
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for sys in &systems {
            let mut best: Option<(usize, Stats)> = None;
            for &clients in &args.slo_clients {
                let lat =
                    closed_loop(&sys.peer, clients, args.slo_batch, args.seconds, &args).await?;
                let stats = Stats::of(&lat, args.seconds);
                Point { part: "slo", system: sys.name, batch: args.slo_batch, clients, stats }
                    .print(args.json);
                if stats.p99_ms >= args.slo_ms {
                    break;
                }
                if best.is_none_or(|(_, b)| stats.qps > b.qps) {
                    best = Some((clients, stats));
                }
            }
            match best {
                Some((clients, s)) if !args.json => println!(
                    "{:<9} at the SLO: {:.0} batches/s ({:.0} per core of {cores}) with {clients} \
                     clients, p99 {:.3} ms",
                    sys.name,
                    s.qps,
                    s.qps / cores as f64,
                    s.p99_ms
                ),
                Some((clients, s)) => println!(
                    "{}",
                    serde_json::json!({
                        "part": "slo_best", "system": sys.name, "batch": args.slo_batch,
                        "clients": clients, "qps": s.qps, "qps_per_core": s.qps / cores as f64,
                        "p99_ms": s.p99_ms, "cores": cores,
                    })
                ),
                None => println!("{:<9} at the SLO: no client count met it", sys.name),
            }
        }
    }
    for sys in systems {
        if let Some(c) = sys.cluster {
            c.stop().await;
        }
    }
    drop(redis);
    // Each database removed its own folder when dropped; this removes their (empty) parent.
    let _ = std::fs::remove_dir(rocksdb_dir(&args));
    if args.part("budget") {
        budget::run(&args, &values).await?;
    }
    if args.part("roll") {
        roll::run(&args, Arc::new(values), &shard_ids).await?;
    }
    Ok(())
}

/// Where the RocksDB-backed servers keep their databases.
fn rocksdb_dir(args: &ServingArgs) -> std::path::PathBuf {
    args.rocksdb_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("embstore-bench-rocksdb-{}", std::process::id()))
    })
}

/// The RocksDB-backed servers: the same server with each shard's rows in a RocksDB database.
#[cfg(feature = "rocksdb")]
async fn rocks_system(
    args: &ServingArgs,
    shard_ids: &[Vec<u64>],
    shard_rows: &dyn Fn(usize) -> Vec<f32>,
) -> Result<Option<(System, System)>, String> {
    let dir = rocksdb_dir(args);
    let d = args.dim;
    let mut shards: Vec<Arc<dyn RowSource>> = Vec::new();
    let start = Instant::now();
    for (s, ids) in shard_ids.iter().enumerate() {
        // The block cache: the shard's rows and keys, plus 25 % for block and entry overhead.
        let cache = ids.len() * (d * 4 + 8) * 5 / 4;
        let db =
            rocks::RocksRows::create(&dir.join(format!("shard{s}")), ids, &shard_rows(s), d, cache)
                .map_err(|e| e.to_string())?;
        println!(
            "rocksdb: shard {s}: {} rows, block cache {} MB, {} MB in it after one read of every key",
            ids.len(),
            cache >> 20,
            db.bytes() >> 20
        );
        shards.push(Arc::new(db));
    }
    let cluster = Cluster::hosting("rocks", &shards, false).await?;
    let client = Client::connect(&cluster.addrs, ClientOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let grpc = client_with(&cluster.addrs, Transport::Grpc).await?;
    println!(
        "rocksdb: the embstore server with its storage swapped for RocksDB 7.8 ({SHARDS} shards × \
         {REPLICAS} replicas, a database per shard under {}), loaded in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    let rocks_grpc = System {
        name: "rocksdb-grpc",
        peer: Peer::Served(Arc::new(grpc)),
        servers: cluster.servers.clone(),
        cluster: None,
        shards: shards.clone(),
    };
    let rocks = System {
        name: "rocksdb",
        peer: Peer::Served(Arc::new(client)),
        servers: cluster.servers.clone(),
        cluster: Some(cluster),
        shards,
    };
    Ok(Some((rocks, rocks_grpc)))
}

/// A client of `addrs` whose lookups take `transport`.
async fn client_with(addrs: &[String], transport: Transport) -> Result<Client, String> {
    Client::connect(addrs, ClientOptions { transport, ..ClientOptions::default() })
        .await
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "rocksdb"))]
async fn rocks_system(
    _args: &ServingArgs,
    _shard_ids: &[Vec<u64>],
    _shard_rows: &dyn Fn(usize) -> Vec<f32>,
) -> Result<Option<(System, System)>, String> {
    println!("rocksdb: skipped (build with --features rocksdb: `make bench-serving` does)");
    Ok(None)
}

/// One row of the latency table: batch, clients, and each system's figures.
type LatencyRow<'a> = (usize, usize, Vec<(&'a str, Stats)>);

/// The latency points as one table: a row per batch and client count, with the ratios to
/// embstore.
fn print_latency_table(table: &[LatencyRow<'_>]) {
    println!("\nbatch clients | system: avg / p99 ms, QPS, avg ÷ embstore's");
    for (batch, clients, row) in table {
        let base = row.iter().find(|(n, _)| *n == "embstore").map(|(_, s)| s.avg_ms);
        let cells: Vec<String> = row
            .iter()
            .map(|(name, s)| {
                let ratio = base.map_or(String::new(), |b| format!(", {:.2}×", s.avg_ms / b));
                format!("{name} {:.3} / {:.3}, {:.0}{ratio}", s.avg_ms, s.p99_ms, s.qps)
            })
            .collect();
        println!("{batch:>5} {clients:>7} | {}", cells.join(" | "));
    }
}

/// Where a batch's time goes, per batch size and served system (see the module docs).
fn breakdown(
    args: &ServingArgs,
    systems: &[System],
    server_us: &[(&str, usize, f64)],
    e2e: &[(&str, usize, f64)],
) -> Result<(), String> {
    println!(
        "\n== where the time goes (µs per batch, one client; shard calls run in parallel, so \
         server figures are per shard call, ~batch/{SHARDS} ids) =="
    );
    println!(
        "system    batch | end-to-end | server (in situ) | storage lookup | rows→bytes | \
         protobuf encode | client decode+scatter | rest (gRPC, HTTP/2, loopback, scheduling)"
    );
    let d = args.dim;
    for sys in systems.iter().filter(|s| !s.shards.is_empty()) {
        for &batch in &args.batches {
            let mut rng = SplitMix64::new(args.seed ^ 0x5eed);
            let batches: Vec<Vec<u64>> = (0..256)
                .map(|_| (0..batch).map(|_| rng.next_u64() % args.rows).collect())
                .collect();
            // Shard 0's part of each batch, as one server sees it.
            let parts: Vec<Vec<u64>> = batches
                .iter()
                .map(|b| b.iter().copied().filter(|&k| shard_of_key(k, SHARDS) == 0).collect())
                .collect();
            let rows = &sys.shards[0];
            let lookup = time_each(&parts, |ids| {
                let mut out = vec![0f32; ids.len() * d];
                let mut found = vec![false; ids.len()];
                rows.lookup(ids, &mut out, &mut found).map_err(|e| e.to_string())?;
                Ok(std::hint::black_box(out.len()))
            })?;
            let answers: Vec<(Vec<f32>, Vec<u8>)> = parts
                .iter()
                .map(|ids| {
                    let mut out = vec![0f32; ids.len() * d];
                    let mut found = vec![false; ids.len()];
                    let _ = rows.lookup(ids, &mut out, &mut found);
                    (out, found.into_iter().map(u8::from).collect())
                })
                .collect();
            let to_bytes = time_each(&answers, |(v, _)| {
                Ok(std::hint::black_box(embstore_proto::encode_rows(v)).len())
            })?;
            let responses: Vec<LookupResponse> = answers
                .iter()
                .map(|(v, f)| LookupResponse {
                    info: None,
                    version: 1,
                    embedding_dim: d as u32,
                    values: embstore_proto::encode_rows(v),
                    found: f.clone(),
                })
                .collect();
            let encode =
                time_each(&responses, |r| Ok(std::hint::black_box(r.encode_to_vec()).len()))?;
            // The client decodes every shard's answer of a batch and scatters it into place.
            let wires: Vec<Vec<u8>> = responses.iter().map(|r| r.encode_to_vec()).collect();
            let decode = time_each(&wires, |w| {
                let mut out = vec![0f32; batch * d];
                for _ in 0..SHARDS {
                    let r = LookupResponse::decode(&w[..]).map_err(|e| e.to_string())?;
                    let n = r.found.len();
                    let rows = embstore_proto::decode_rows(&r.values, n, d).ok_or("bad rows")?;
                    for j in 0..n {
                        out[(j * SHARDS) % batch * d..][..d].copy_from_slice(&rows[j * d..][..d]);
                    }
                }
                Ok(std::hint::black_box(out.len()))
            })?;
            let find = |v: &[(&str, usize, f64)]| {
                v.iter().find(|(n, b, _)| *n == sys.name && *b == batch).map(|x| x.2)
            };
            let (Some(total), Some(server)) = (find(e2e), find(server_us)) else {
                println!("{:<9} {batch:>5} | (run the latency part with 1 client first)", sys.name);
                continue;
            };
            let rest = total - server - encode - decode;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "part": "breakdown", "system": sys.name, "batch": batch,
                        "end_to_end_us": total, "server_us": server, "lookup_us": lookup,
                        "rows_to_bytes_us": to_bytes, "encode_us": encode, "decode_us": decode,
                        "rest_us": rest,
                    })
                );
            } else {
                println!(
                    "{:<9} {batch:>5} | {total:>10.1} | {server:>16.1} | {lookup:>14.1} | \
                     {to_bytes:>10.1} | {encode:>15.1} | {decode:>21.1} | {rest:>8.1} ({:.0} %)",
                    sys.name,
                    100.0 * rest / total
                );
            }
        }
    }
    Ok(())
}

/// Mean µs of `f` over `items`, cycling through them for at least 0.3 s after one warm pass.
fn time_each<T>(
    items: &[T],
    mut f: impl FnMut(&T) -> Result<usize, String>,
) -> Result<f64, String> {
    for x in items {
        f(x)?;
    }
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < Duration::from_millis(300) {
        for x in items {
            f(x)?;
        }
        n += items.len();
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// CPU seconds (user + system) of this process and, when given, of redis-server: the CPU a
/// lookup costs on both sides, for every system measured here.
fn cpu_seconds(redis: Option<&Redis>) -> f64 {
    let ticks = |path: &str| -> f64 {
        let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
        // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        (t(11) + t(12)) / 100.0
    };
    let mine = ticks("/proc/self/stat");
    mine + redis.map_or(0.0, |r| ticks(&format!("/proc/{}/stat", r.child.id())))
}

/// `clients` tasks, each looking up batches of `batch` random ids back to back for 0.5 s of
/// warm-up and then `seconds`; the latencies of the timed batches, in µs.
async fn closed_loop(
    peer: &Peer,
    clients: usize,
    batch: usize,
    seconds: f64,
    args: &ServingArgs,
) -> Result<Vec<f64>, String> {
    let warm = Duration::from_millis(500);
    let timed = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let peer = peer.clone();
        let (rows, seed, s) = (args.rows, args.seed, args.zipf);
        tasks.spawn(async move {
            let seed = seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut ids = Ids::new(rows, s, seed)?;
            let mut rng = SplitMix64::new(seed);
            let mut lat = Vec::new();
            loop {
                let now = start.elapsed();
                if now >= warm + timed {
                    break;
                }
                let ids: Vec<u64> = (0..batch).map(|_| ids.next(&mut rng)).collect();
                let t0 = Instant::now();
                peer.lookup(ids).await?;
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

/// The ids a client looks up: uniform over `0..rows`, or Zipf(s) over them in a fixed random
/// order (see `--zipf`).
struct Ids {
    rows: u64,
    zipf: Option<(rand_distr::Zipf<f64>, rand::rngs::SmallRng)>,
}

impl Ids {
    fn new(rows: u64, s: f64, seed: u64) -> Result<Self, String> {
        use rand::SeedableRng;
        let zipf = if s > 0.0 {
            let z = rand_distr::Zipf::new(rows as f64, s).map_err(|e| format!("--zipf: {e}"))?;
            Some((z, rand::rngs::SmallRng::seed_from_u64(seed)))
        } else {
            None
        };
        Ok(Self { rows, zipf })
    }

    fn next(&mut self, rng: &mut SplitMix64) -> u64 {
        use rand_distr::Distribution;
        match &mut self.zipf {
            None => rng.next_u64() % self.rows,
            Some((z, r)) => {
                let rank = z.sample(r) as u64 - 1;
                ((rank as u128 * 2_654_435_761) % self.rows as u128) as u64
            }
        }
    }
}

/// A table holding `ids` with `values` (`ids.len() × dim`).
pub(crate) fn table_of(ids: &[u64], values: &[f32], dim: usize) -> Result<Arc<Table>, String> {
    let t = Store::new().create_table(TableConfig::new("user", dim)).map_err(|e| e.to_string())?;
    t.assign(ids, values).map_err(|e| e.to_string())?;
    Ok(t)
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
