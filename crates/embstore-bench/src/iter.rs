//! `embstore-bench iter {mf,pagerank}`: iterative applications on the parameter server
//! (`embstore-ps`, after IterStore), each variant in the same run: time per iteration (median
//! of iterations 2..N, median over runs), preprocessing, bytes to and from the masters, and
//! the objective, which every variant must compute alike (docs/benchmarks.md, "IterStore").
//!
//! - `mf`: SGD matrix factorisation on MovieLens-100k (RecBole's `ml-100k.inter`), rank 256 by
//!   default, lr 0.01, λ 0.05; ratings split over workers by user; one clock per epoch; every
//!   rating reads its user and item rows and updates both.
//! - `lda`: collapsed Gibbs sampling LDA on the man pages (`python/benchmarks/lib/iterdata.py`),
//!   K 100, α 0.1, β 0.01, words seen at least 5 times; rows: documents' and words' topic
//!   counts and the summation row, updated by ±1 deltas (exact in f32); a worker owns its
//!   documents; the objective is log p(w | z).
//! - `pagerank`: edge-wise power iteration (damping 0.85, dangling mass spread uniformly) on
//!   an edge list (`python/benchmarks/lib/iterdata.py`: the Debian dependency graph); worker
//!   `w` owns the nodes `v % W == w` and reads the ranks of their in-neighbours; one clock per
//!   iteration.

use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Subcommand};
use embstore_ps::{Cluster, Masters, Options, Ps, TableMasters, Worker};
use embstore_table::{Initializer, OnMiss, Optimizer, Table, TableConfig};
use serde_json::json;

#[derive(Args, Debug)]
pub(crate) struct IterArgs {
    #[command(subcommand)]
    app: App,
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Iterations (clocks) per run; the first is excluded from the time per iteration.
    #[arg(long, default_value_t = 6)]
    iters: u32,
    /// Runs per variant (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Variants, comma-separated: no-opt, all, all(first-iter), a specialisation (static,
    /// prefetch, thread-caches, placement) alone, or all-but-<one>; "every" runs them all.
    #[arg(long, default_value = "no-opt,all,all(first-iter)")]
    variants: String,
    /// Print one JSON object per variant instead of a table.
    #[arg(long)]
    json: bool,
    /// Rows a worker's static thread cache holds at most (default: every row it updates);
    /// the others' updates go to a hash map per worker.
    #[arg(long)]
    thread_cache_rows: Option<usize>,
    /// Processes on loopback (each with `--workers` threads; rows hashed over them). 1: one
    /// process, no wire.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// (internal) This process's number in a multi-process run.
    #[arg(long, hide = true)]
    process_rank: Option<usize>,
    /// (internal) Every process's address, comma-separated.
    #[arg(long, hide = true)]
    addrs: Option<String>,
}

#[derive(Subcommand, Debug)]
enum App {
    /// SGD matrix factorisation on MovieLens-100k.
    Mf {
        /// RecBole's `ml-100k.inter`.
        #[arg(long, default_value = ".data/ml-100k/ml-100k.inter")]
        data: String,
        /// Factors per row.
        #[arg(long, default_value_t = 256)]
        rank: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Collapsed Gibbs sampling LDA on the man-page corpus.
    Lda {
        /// `docname<TAB>tokens` per line, `#` comments (`make iter-data`).
        #[arg(long, default_value = ".data/iter/manpages-tokens.txt")]
        docs: String,
        /// Topics.
        #[arg(long, default_value_t = 100)]
        topics: usize,
        /// Words seen fewer times are left out.
        #[arg(long, default_value_t = 5)]
        min_count: usize,
        #[command(flatten)]
        common: Common,
    },
    /// PageRank by edge-wise power iteration.
    Pagerank {
        /// Edge list, `src<TAB>dst` per line, `#` comments.
        #[arg(long, default_value = ".data/iter/debian-graph.tsv")]
        edges: String,
        #[command(flatten)]
        common: Common,
    },
}

pub(crate) fn run(args: IterArgs) -> Result<(), String> {
    match args.app {
        App::Mf { data, rank, common } => {
            let ratings = load_ratings(&data)?;
            let app = Mf::new(ratings, rank, common.workers * common.processes);
            bench(&app, &common)
        }
        App::Lda { docs, topics, min_count, common } => {
            let (docs, vocab) = load_corpus(&docs, min_count)?;
            if topics == 0 || topics > usize::from(u16::MAX) {
                return Err(format!("--topics must be in 1..=65535, got {topics}"));
            }
            let app = Lda::new(docs, vocab, topics, common.workers * common.processes);
            bench(&app, &common)
        }
        App::Pagerank { edges, common } => {
            let g = load_graph(&edges)?;
            let app = PageRank::new(g, common.workers * common.processes);
            bench(&app, &common)
        }
    }
}

/// Reads rows of a table: `(table, keys, out)`.
type Read<'a> = &'a dyn Fn(usize, &[u64], &mut [f32]);

/// An iterative application on the parameter server.
trait IterApp: Sync {
    fn name(&self) -> String;
    /// The tables, fresh.
    fn tables(&self) -> Vec<Arc<Table>>;
    /// One iteration of worker `w`, worker `g` of all processes' (without the clock).
    fn iteration(&self, w: &Worker, g: usize) -> Result<(), String>;
    /// The objective after the run, from the rows `read(table, keys, out)` gives.
    fn objective(&self, read: Read<'_>) -> f64;
}

fn e(err: embstore_common::Error) -> String {
    err.to_string()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

struct RunResult {
    per_iter: f64,
    gather_s: f64,
    plan: Option<embstore_ps::PlanStats>,
    stats: embstore_ps::Stats,
    objective: f64,
    /// Bytes this process sent to the others (multi-process runs).
    wire_bytes: u64,
}

fn run_once(app: &dyn IterApp, variant: &str, c: &Common) -> Result<RunResult, String> {
    let (name, first_iter) = match variant.strip_suffix("(first-iter)") {
        Some(v) => (v, true),
        None => (variant, false),
    };
    let mut opts = Options::variant(name).map_err(e)?;
    opts.thread_cache_rows = c.thread_cache_rows;
    let tables = app.tables();
    let local = Arc::new(TableMasters::new(tables.clone()).map_err(e)?);
    let rank = c.process_rank.unwrap_or(0);
    let cluster = match &c.addrs {
        Some(addrs) => {
            let addrs: Vec<std::net::SocketAddr> = addrs
                .split(',')
                .map(|a| a.parse().map_err(|err| format!("--addrs: {a:?}: {err}")))
                .collect::<Result<_, String>>()?;
            Some(Cluster::start(rank, addrs, local.clone()).map_err(e)?)
        }
        None => None,
    };
    let masters: Arc<dyn Masters> = match &cluster {
        Some(cl) => Arc::new(cl.masters().map_err(e)?),
        None => local,
    };
    let ps = Ps::new(masters, c.workers, opts).map_err(e)?;
    let gather = name != "no-opt";
    let t = Instant::now();
    let mut from = 1;
    if gather && !first_iter {
        ps.start_gather(true).map_err(e)?;
        for w in 0..c.workers {
            let worker = ps.worker(w).map_err(e)?;
            app.iteration(&worker, rank * c.workers + w)?;
            worker.clock().map_err(e)?;
        }
    } else if gather {
        ps.start_gather(false).map_err(e)?;
        run_clocks(app, &ps, rank, 1)?;
        from = 2;
    }
    let plan = if gather { Some(ps.finish_gather().map_err(e)?) } else { None };
    let gather_s = t.elapsed().as_secs_f64();
    let mut stamps = vec![Instant::now()];
    for _ in from..=c.iters {
        run_clocks(app, &ps, rank, 1)?;
        stamps.push(Instant::now());
    }
    // Iterations 2..N: the first real iteration pays first touches.
    let mut per: Vec<f64> = stamps
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .skip(usize::from(from == 1))
        .collect();
    let stats = ps.stats();
    let (objective, wire_bytes) = match &cluster {
        Some(cl) => {
            let sent = cl.bytes().0;
            let objective = if rank == 0 {
                app.objective(&|t, k, out| cl.read_any(t, k, out).expect("read"))
            } else {
                f64::NAN
            };
            // Every process serves its rows until process 0 has read them.
            cl.sync(u32::MAX).map_err(e)?;
            cl.stop();
            (objective, sent)
        }
        None => (
            app.objective(&|t, k, out| {
                tables[t].lookup(k, OnMiss::Init, out, None).expect("lookup");
            }),
            0,
        ),
    };
    Ok(RunResult { per_iter: median(&mut per), gather_s, plan, stats, objective, wire_bytes })
}

/// Runs `n` clocks on every worker of this process, each in its own thread.
fn run_clocks(app: &dyn IterApp, ps: &Ps, rank: usize, n: u32) -> Result<(), String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ps.workers())
            .map(|w| {
                let worker = ps.worker(w).map_err(e);
                let g = rank * ps.workers() + w;
                s.spawn(move || -> Result<(), String> {
                    let worker = worker?;
                    for _ in 0..n {
                        app.iteration(&worker, g)?;
                        worker.clock().map_err(e)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a worker panicked".to_string())?)
    })
}

/// A run in fresh processes: `processes` copies of this binary (on loopback when more than
/// one); process 0's figures (and every process's bytes sent).
fn run_processes(variant: &str, c: &Common) -> Result<RunResult, String> {
    let listeners: Vec<std::net::TcpListener> = (0..c.processes)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map_err(|err| err.to_string()))
        .collect::<Result<_, _>>()?;
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.to_string()).unwrap_or_default())
        .collect();
    drop(listeners);
    let exe = std::env::current_exe().map_err(|err| err.to_string())?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // Drop the options this parent sets itself.
    let mut clean = Vec::new();
    let mut skip = false;
    for a in args.drain(..) {
        if skip {
            skip = false;
            continue;
        }
        if ["--variants", "--runs", "--process-rank", "--addrs"].contains(&a.as_str()) {
            skip = true;
            continue;
        }
        if a == "--json" || a.starts_with("--variants=") || a.starts_with("--runs=") {
            continue;
        }
        clean.push(a);
    }
    if std::env::var_os("EMBSTORE_BENCH_CHILD").is_some() {
        return Err("a child process of a multi-process run would start more processes".into());
    }
    let children: Vec<std::process::Child> = (0..c.processes)
        .map(|r| {
            std::process::Command::new(&exe)
                .args(&clean)
                .args([
                    "--variants",
                    variant,
                    "--runs",
                    "1",
                    "--json",
                    "--process-rank",
                    &r.to_string(),
                ])
                .args(if c.processes > 1 {
                    vec!["--addrs".to_string(), addrs.join(",")]
                } else {
                    vec![]
                })
                .env("EMBSTORE_BENCH_CHILD", "1")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|err| format!("spawn: {err}"))
        })
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::new();
    for (r, ch) in children.into_iter().enumerate() {
        let out = ch.wait_with_output().map_err(|err| err.to_string())?;
        if !out.status.success() {
            return Err(format!("process {r} of {variant} failed: {}", out.status));
        }
        let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").to_string();
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|err| format!("process {r}: {err}: {line:?}"))?;
        outs.push(v);
    }
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let r0 = &outs[0];
    let stats = embstore_ps::Stats {
        fetches: outs.iter().map(|v| f(v, "fetches") as u64).sum(),
        overflow: outs.iter().map(|v| f(v, "overflow") as u64).sum(),
        bytes_read: (f(r0, "mb_read_per_iter") * 1e6 * f64::from(c.iters)) as u64,
        bytes_pushed: (f(r0, "mb_pushed_per_iter") * 1e6 * f64::from(c.iters)) as u64,
        wait_s: f(r0, "wait_s"),
        ..Default::default()
    };
    let plan = r0["plan"].as_object().map(|p| {
        let g = |k: &str| p.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        embstore_ps::PlanStats {
            rows: g("rows") as u64,
            bytes: g("bytes") as u64,
            early_rows: g("early_rows") as u64,
            prefetch_frames: g("prefetch_frames") as u64,
            thread_cache_rows: g("thread_cache_rows") as u64,
            contention_rows: g("contention_rows") as u64,
            accesses: g("accesses") as u64,
            placement_moves: g("placement_moves") as u64,
            merge_s: g("merge_s"),
            thread_cache_s: g("thread_cache_s"),
            static_s: g("static_s"),
            placement_s: g("placement_s"),
            ..Default::default()
        }
    });
    Ok(RunResult {
        per_iter: f(r0, "s_per_iter"),
        gather_s: f(r0, "preprocess_s"),
        plan,
        stats,
        objective: f(r0, "objective"),
        wire_bytes: outs
            .iter()
            .map(|v| f(v, "wire_mb_per_iter") * 1e6 * f64::from(c.iters))
            .sum::<f64>() as u64,
    })
}

fn bench(app: &dyn IterApp, c: &Common) -> Result<(), String> {
    let variants: Vec<String> = if c.variants == "every" {
        let mut v = Options::variant_names();
        v.insert(2, "all(first-iter)".into());
        v
    } else {
        c.variants.split(',').map(|s| s.trim().to_string()).collect()
    };
    if !c.json {
        println!("{}", crate::machine_line());
        println!(
            "{}: {} processes x {} workers, {} iterations, {} runs",
            app.name(),
            c.processes,
            c.workers,
            c.iters,
            c.runs
        );
        println!(
            "{:<26} {:>10} {:>8} {:>9} {:>10} {:>10} {:>10} {:>9} {:>14}",
            "variant",
            "s/iter",
            "vs no-opt",
            "prep s",
            "MB read/it",
            "MB push/it",
            "MB wire/it",
            "fetches",
            "objective"
        );
    }
    let mut base = None;
    let mut objective0 = None;
    // Every run in a fresh process (runs in one process would inherit each other's memory),
    // the variants in turn within each round (the guest's speed drifts: a variant's runs are
    // spread over the whole measurement), after one run that is thrown away (the first
    // seconds of load run slower here).
    let one = |v: &str| -> Result<RunResult, String> {
        if c.process_rank.is_none() {
            run_processes(v, c)
        } else {
            run_once(app, v, c)
        }
    };
    if c.process_rank.is_none() {
        if let Some(v) = variants.first() {
            one(v)?;
        }
    }
    let mut all_runs: Vec<Vec<RunResult>> = variants.iter().map(|_| Vec::new()).collect();
    for _ in 0..c.runs {
        for (v, runs) in variants.iter().zip(all_runs.iter_mut()) {
            runs.push(one(v)?);
        }
    }
    for (v, runs) in variants.iter().zip(all_runs) {
        let mut per: Vec<f64> = runs.iter().map(|r| r.per_iter).collect();
        let per_iter = median(&mut per);
        let mut prep: Vec<f64> = runs.iter().map(|r| r.gather_s).collect();
        let prep = median(&mut prep);
        let r = &runs[0];
        let iters = f64::from(c.iters);
        let read_mb = r.stats.bytes_read as f64 / iters / 1e6;
        let push_mb = r.stats.bytes_pushed as f64 / iters / 1e6;
        let wire_mb = r.wire_bytes as f64 / iters / 1e6;
        if v == "no-opt" {
            base = Some(per_iter);
        }
        let speedup = base.map_or(f64::NAN, |b| b / per_iter);
        let same = objective0.get_or_insert(r.objective);
        let agrees = r.objective.is_nan() && same.is_nan()
            || (r.objective - *same).abs() <= 1e-6 * same.abs().max(1e-30);
        if c.json {
            let plan = r.plan.as_ref().map(|p| {
                json!({"rows": p.rows, "bytes": p.bytes, "early_rows": p.early_rows,
                       "prefetch_frames": p.prefetch_frames, "thread_cache_rows": p.thread_cache_rows,
                       "contention_rows": p.contention_rows, "accesses": p.accesses,
                       "merge_s": p.merge_s, "thread_cache_s": p.thread_cache_s, "static_s": p.static_s,
                       "placement_moves": p.placement_moves, "placement_s": p.placement_s})
            });
            println!(
                "{}",
                json!({
                    "app": app.name(), "variant": v, "workers": c.workers, "iters": c.iters,
                    "processes": c.processes, "rank": c.process_rank, "wire_mb_per_iter": wire_mb,
                    "runs": c.runs, "s_per_iter": per_iter, "s_per_iter_runs": per,
                    "speedup_vs_no_opt": speedup, "preprocess_s": prep, "plan": plan,
                    "mb_read_per_iter": read_mb, "mb_pushed_per_iter": push_mb,
                    "fetches": r.stats.fetches, "overflow": r.stats.overflow,
                    "wait_s": r.stats.wait_s, "objective": r.objective,
                    "objective_agrees": agrees, "machine": crate::machine_line(),
                })
            );
        } else {
            println!(
                "{:<26} {:>10.4} {:>8.2}x {:>9.3} {:>10.2} {:>10.2} {:>10.2} {:>9} {:>14.8}{}",
                v,
                per_iter,
                speedup,
                prep,
                read_mb,
                push_mb,
                wire_mb,
                r.stats.fetches,
                r.objective,
                if agrees { "" } else { "  (DIFFERS)" }
            );
        }
        if !agrees {
            return Err(format!("{v}: objective {} differs from {}", r.objective, same));
        }
    }
    Ok(())
}

/// A dot product in 8 lanes (vectorises; a plain `sum()` of products does not).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

// --- MF --------------------------------------------------------------------------------------

fn load_ratings(path: &str) -> Result<Vec<(u64, u64, f32)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("{path}: {err} (run `make data` to fetch MovieLens-100k)"))?;
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 3 {
            continue;
        }
        let p = |s: &str| s.trim().parse::<f64>().map_err(|err| format!("{path}: {line:?}: {err}"));
        out.push((p(f[0])? as u64, p(f[1])? as u64, p(f[2])? as f32));
    }
    Ok(out)
}

struct Mf {
    /// Per worker: its ratings (by user).
    parts: Vec<Vec<(u64, u64, f32)>>,
    rank: usize,
    lr: f32,
    lambda: f32,
}

impl Mf {
    fn new(ratings: Vec<(u64, u64, f32)>, rank: usize, workers: usize) -> Self {
        let mut parts = vec![Vec::new(); workers];
        for r in ratings {
            parts[r.0 as usize % workers].push(r);
        }
        Self { parts, rank, lr: 0.01, lambda: 0.05 }
    }
}

impl IterApp for Mf {
    fn name(&self) -> String {
        format!("mf (MovieLens-100k, rank {})", self.rank)
    }

    fn tables(&self) -> Vec<Arc<Table>> {
        ["L", "R"]
            .iter()
            .map(|n| {
                let cfg = TableConfig::new(*n, self.rank)
                    .with_optimizer(Optimizer::Delta)
                    .with_initializer(Initializer::Normal { mean: 0.0, std: 0.1 })
                    .with_seed(1);
                Arc::new(Table::new(cfg).expect("table"))
            })
            .collect()
    }

    fn iteration(&self, w: &Worker, g: usize) -> Result<(), String> {
        let d = self.rank;
        let (mut l, mut r) = (vec![0.0f32; d], vec![0.0f32; d]);
        let (mut dl, mut dr) = (vec![0.0f32; d], vec![0.0f32; d]);
        for &(u, i, rating) in &self.parts[g] {
            w.read(0, &[u], &mut l).map_err(e)?;
            w.read(1, &[i], &mut r).map_err(e)?;
            let pred = dot(&l, &r);
            let err = rating - pred;
            let (a, b) = (self.lr * err, self.lr * self.lambda);
            for (((dl, dr), &l), &r) in dl.iter_mut().zip(dr.iter_mut()).zip(&l).zip(&r) {
                *dl = a * r - b * l;
                *dr = a * l - b * r;
            }
            w.update(0, &[u], &dl).map_err(e)?;
            w.update(1, &[i], &dr).map_err(e)?;
        }
        Ok(())
    }

    fn objective(&self, read: Read<'_>) -> f64 {
        // Training RMSE over every rating; every row read once (one request per owner).
        let d = self.rank;
        let rows = |table: usize, ids: Vec<u64>| {
            let mut ids = ids;
            ids.sort_unstable();
            ids.dedup();
            let mut v = vec![0.0f32; ids.len() * d];
            read(table, &ids, &mut v);
            (ids, v)
        };
        let all = || self.parts.iter().flatten();
        let (us, uv) = rows(0, all().map(|r| r.0).collect());
        let (is, iv) = rows(1, all().map(|r| r.1).collect());
        let row = |ids: &[u64], v: &'_ [f32], k: u64| -> Vec<f32> {
            let i = ids.binary_search(&k).expect("read");
            v[i * d..(i + 1) * d].to_vec()
        };
        let (mut se, mut n) = (0.0f64, 0usize);
        for &(u, i, rating) in all() {
            let pred = dot(&row(&us, &uv, u), &row(&is, &iv, i));
            se += f64::from(rating - pred).powi(2);
            n += 1;
        }
        (se / n.max(1) as f64).sqrt()
    }
}

// --- PageRank --------------------------------------------------------------------------------

struct Graph {
    nodes: usize,
    /// In-neighbours of each node.
    incoming: Vec<Vec<u64>>,
    out_degree: Vec<u32>,
}

fn load_graph(path: &str) -> Result<Graph, String> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        format!("{path}: {err} (run `make iter-data` to build the Debian dependency graph)")
    })?;
    let mut edges = Vec::new();
    let mut nodes = 0usize;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut f = line.split('\t');
        let mut next = || -> Result<u64, String> {
            f.next()
                .ok_or_else(|| format!("{path}: {line:?}: need src<TAB>dst"))?
                .trim()
                .parse::<u64>()
                .map_err(|err| format!("{path}: {line:?}: {err}"))
        };
        let (s, t) = (next()?, next()?);
        nodes = nodes.max(s.max(t) as usize + 1);
        edges.push((s, t));
    }
    let mut incoming = vec![Vec::new(); nodes];
    let mut out_degree = vec![0u32; nodes];
    for (s, t) in edges {
        incoming[t as usize].push(s);
        out_degree[s as usize] += 1;
    }
    Ok(Graph { nodes, incoming, out_degree })
}

struct PageRank {
    g: Graph,
    workers: usize,
    damping: f32,
}

impl PageRank {
    fn new(g: Graph, workers: usize) -> Self {
        Self { g, workers, damping: 0.85 }
    }
}

impl IterApp for PageRank {
    fn name(&self) -> String {
        format!("pagerank ({} nodes)", self.g.nodes)
    }

    fn tables(&self) -> Vec<Arc<Table>> {
        let n = self.g.nodes as f32;
        let dangling = self.g.out_degree.iter().filter(|&&d| d == 0).count() as f32;
        [("rank", 1.0 / n), ("dangling", dangling / n)]
            .iter()
            .map(|(name, v)| {
                let cfg = TableConfig::new(*name, 1)
                    .with_optimizer(Optimizer::Delta)
                    .with_initializer(Initializer::Constant { value: *v });
                Arc::new(Table::new(cfg).expect("table"))
            })
            .collect()
    }

    fn iteration(&self, w: &Worker, g: usize) -> Result<(), String> {
        let n = self.g.nodes as f32;
        let mut dangling = [0.0f32];
        w.read(1, &[0], &mut dangling).map_err(e)?;
        let base = (1.0 - self.damping) / n + self.damping * dangling[0] / n;
        let mine: Vec<u64> = (g as u64..self.g.nodes as u64).step_by(self.workers).collect();
        let mut old = vec![0.0f32; mine.len()];
        w.read(0, &mine, &mut old).map_err(e)?;
        let mut deltas = Vec::with_capacity(mine.len());
        let mut dangling_delta = 0.0f32;
        let mut r = Vec::new();
        for (j, &v) in mine.iter().enumerate() {
            let ins = &self.g.incoming[v as usize];
            r.resize(ins.len(), 0.0);
            w.read(0, ins, &mut r).map_err(e)?;
            let sum: f32 =
                ins.iter().zip(&r).map(|(&u, &x)| x / self.g.out_degree[u as usize] as f32).sum();
            let new = base + self.damping * sum;
            deltas.push(new - old[j]);
            if self.g.out_degree[v as usize] == 0 {
                dangling_delta += new - old[j];
            }
        }
        // Updates after every read: a Jacobi step, as power iteration is.
        w.update(0, &mine, &deltas).map_err(e)?;
        w.update(1, &[0], &[dangling_delta]).map_err(e)?;
        Ok(())
    }

    fn objective(&self, read: Read<'_>) -> f64 {
        // The sum of the ranks (1 for an exact power iteration) and the top rank, as one
        // number every variant must reproduce: Σ r + top.
        let keys: Vec<u64> = (0..self.g.nodes as u64).collect();
        let mut r = vec![0.0f32; keys.len()];
        read(0, &keys, &mut r);
        let sum: f64 = r.iter().map(|&x| f64::from(x)).sum();
        let top = r.iter().copied().fold(0.0f32, f32::max);
        sum + f64::from(top)
    }
}

// --- LDA -------------------------------------------------------------------------------------

/// `ln Γ(x)` for `x > 0` (Stirling's series after shifting `x` past 8; ~1e-12 relative).
fn ln_gamma(mut x: f64) -> f64 {
    let mut shift = 0.0;
    while x < 8.0 {
        shift -= x.ln();
        x += 1.0;
    }
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    let series = inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 / 1680.0)));
    shift + (x - 0.5) * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI).ln() + series
}

/// A small, fast generator (xorshift64*), seeded per worker and clock.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(embstore_common::rand::SplitMix64::new(seed).next_u64() | 1)
    }
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Collapsed Gibbs sampling LDA: rows are documents' and words' topic counts and the
/// summation row (the count of every topic), all updated by ±1 deltas; a worker owns its
/// documents' tokens and their sampled topics.
struct Lda {
    /// Per document: its words (ids below `vocab`).
    docs: Vec<Vec<u32>>,
    vocab: usize,
    topics: usize,
    workers: usize,
    alpha: f32,
    beta: f32,
    /// Per global worker: its tokens' topics, document by document (a worker's own state).
    z: Vec<std::sync::Mutex<Vec<Vec<u16>>>>,
    /// The counts of the initial assignment: (doc rows, word rows, summation row).
    init: (Vec<f32>, Vec<f32>, Vec<f32>),
}

/// Tables of the LDA app: documents, words, the summation row.
const DOC: usize = 0;
const WORD: usize = 1;
const SUM: usize = 2;
/// Word rows' keys sit after the documents' in their own table; the summation row's key.
const SUM_KEY: u64 = 0;

fn load_corpus(path: &str, min_count: usize) -> Result<(Vec<Vec<u32>>, usize), String> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        format!("{path}: {err} (run `make iter-data` to build the man-page corpus)")
    })?;
    let docs_raw: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_once('\t').map_or("", |(_, t)| t).split(' ').filter(|t| !t.is_empty()).collect()
        })
        .collect();
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for d in &docs_raw {
        for t in d {
            *counts.entry(t).or_insert(0) += 1;
        }
    }
    let mut vocab: Vec<&str> =
        counts.iter().filter(|(_, &c)| c >= min_count).map(|(w, _)| *w).collect();
    vocab.sort_unstable();
    let id: std::collections::HashMap<&str, u32> =
        vocab.iter().enumerate().map(|(i, w)| (*w, i as u32)).collect();
    let docs =
        docs_raw.iter().map(|d| d.iter().filter_map(|t| id.get(t).copied()).collect()).collect();
    Ok((docs, vocab.len()))
}

impl Lda {
    fn new(docs: Vec<Vec<u32>>, vocab: usize, topics: usize, workers: usize) -> Self {
        let k = topics;
        let mut z = vec![Vec::new(); workers];
        let (mut nd, mut nw, mut ns) =
            (vec![0.0f32; docs.len() * k], vec![0.0f32; vocab * k], vec![0.0f32; k]);
        for (d, words) in docs.iter().enumerate() {
            let mut rng = Rng::new(0x1DA ^ d as u64);
            let zd: Vec<u16> = words
                .iter()
                .map(|&w| {
                    let t = ((rng.next_f64() * k as f64) as usize).min(k - 1);
                    nd[d * k + t] += 1.0;
                    nw[w as usize * k + t] += 1.0;
                    ns[t] += 1.0;
                    t as u16
                })
                .collect();
            z[d % workers].push(zd);
        }
        Self {
            docs,
            vocab,
            topics,
            workers,
            alpha: 0.1,
            beta: 0.01,
            z: z.into_iter().map(std::sync::Mutex::new).collect(),
            init: (nd, nw, ns),
        }
    }
}

impl IterApp for Lda {
    fn name(&self) -> String {
        let tokens: usize = self.docs.iter().map(Vec::len).sum();
        format!(
            "lda ({} docs, {} words, {} tokens, K {})",
            self.docs.len(),
            self.vocab,
            tokens,
            self.topics
        )
    }

    fn tables(&self) -> Vec<Arc<Table>> {
        let k = self.topics;
        let make = |name: &str| {
            let cfg = TableConfig::new(name, k)
                .with_optimizer(Optimizer::Delta)
                .with_initializer(Initializer::Zeros);
            Arc::new(Table::new(cfg).expect("table"))
        };
        let (doc, word, sum) = (make("doc"), make("word"), make("sum"));
        // The initial assignment's counts (the same on every process: each reads its own).
        let dk: Vec<u64> = (0..self.docs.len() as u64).collect();
        doc.assign(&dk, &self.init.0).expect("assign");
        let wk: Vec<u64> = (0..self.vocab as u64).collect();
        word.assign(&wk, &self.init.1).expect("assign");
        sum.assign(&[SUM_KEY], &self.init.2).expect("assign");
        vec![doc, word, sum]
    }

    fn iteration(&self, w: &Worker, g: usize) -> Result<(), String> {
        let k = self.topics;
        let virtual_ = w.in_virtual_gather();
        let mut z = self.z[g].lock().map_err(|_| "a worker panicked".to_string())?;
        let mut rng = Rng::new((g as u64) << 32 | u64::from(w.clock_now()));
        let (alpha, beta, vbeta) = (self.alpha, self.beta, self.vocab as f32 * self.beta);
        let (mut nd, mut nw, mut ns) = (vec![0.0f32; k], vec![0.0f32; k], vec![0.0f32; k]);
        let mut p = vec![0.0f32; k];
        let mut delta = vec![0.0f32; k];
        for (j, d) in (g..self.docs.len()).step_by(self.workers).enumerate() {
            w.read(DOC, &[d as u64], &mut nd).map_err(e)?;
            let mut doc_delta = vec![0.0f32; k];
            for (i, &word) in self.docs[d].iter().enumerate() {
                w.read(WORD, &[u64::from(word)], &mut nw).map_err(e)?;
                w.read(SUM, &[SUM_KEY], &mut ns).map_err(e)?;
                let old = z[j][i] as usize;
                let mut total = 0.0f32;
                for t in 0..k {
                    let own = f32::from(t == old);
                    let (a, b, c) = (nd[t] - own, (nw[t] - own).max(0.0), (ns[t] - own).max(0.0));
                    total += (a + alpha) * (b + beta) / (c + vbeta);
                    p[t] = total;
                }
                let u = rng.next_f64() as f32 * total;
                let new = p.partition_point(|&x| x <= u).min(k - 1);
                if virtual_ || new == old {
                    // The same accesses either way: a virtual pass announces them all.
                    delta.fill(0.0);
                } else {
                    delta.fill(0.0);
                    delta[old] = -1.0;
                    delta[new] = 1.0;
                    nd[old] -= 1.0;
                    nd[new] += 1.0;
                    doc_delta[old] -= 1.0;
                    doc_delta[new] += 1.0;
                    z[j][i] = new as u16;
                }
                w.update(WORD, &[u64::from(word)], &delta).map_err(e)?;
                w.update(SUM, &[SUM_KEY], &delta).map_err(e)?;
            }
            w.update(DOC, &[d as u64], &doc_delta).map_err(e)?;
        }
        Ok(())
    }

    fn objective(&self, read: Read<'_>) -> f64 {
        // log p(w | z) = Σ_k [lnΓ(Vβ) − lnΓ(n_k + Vβ)] + Σ_k Σ_w [lnΓ(n_wk + β) − lnΓ(β)].
        let k = self.topics;
        let (beta, vbeta) = (f64::from(self.beta), self.vocab as f64 * f64::from(self.beta));
        let keys: Vec<u64> = (0..self.vocab as u64).collect();
        let mut nw = vec![0.0f32; keys.len() * k];
        read(WORD, &keys, &mut nw);
        let mut ns = vec![0.0f32; k];
        read(SUM, &[SUM_KEY], &mut ns);
        let mut ll = 0.0;
        for &n in &ns {
            ll += ln_gamma(vbeta) - ln_gamma(f64::from(n) + vbeta);
        }
        let lg_beta = ln_gamma(beta);
        for &n in &nw {
            if n != 0.0 {
                ll += ln_gamma(f64::from(n) + beta) - lg_beta;
            }
        }
        ll
    }
}
