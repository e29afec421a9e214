//! `embstore-bench cache`: per-request latency and throughput of `InferenceCache::lookup`
//! against a plain in-memory table lookup of the same ids (docs/benchmarks.md, "The inference cache", benchmark 5).
//!
//! The synthetic Criteo-like trace (26 tables, Zipf contexts, ρ 0.7) gives the requests; every
//! key's row lives in an in-memory `embstore_table` store (the backing store). Measured, after
//! warming on the first half of the trace, over requests of the second half:
//! - `table`: one `Table::lookup` per table (26 calls of 1 id), as a model without a cache does;
//! - `table-batch`: the same, one call per table for a batch of requests;
//! - `cache` at budgets of 5 % and 100 % of the unique keys' fp32 bytes (f32 L1 only), and the
//!   5 % budget split f32/int8, batch 1 and batch 256.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use embstore_cache::{
    split_key, Backing, CacheConfig, CodecKind, InferenceCache, LevelConfig, PolicyConfig,
    Synthetic,
};
use embstore_table::{OnMiss, Store, Table, TableConfig};

#[derive(Args, Debug)]
pub(crate) struct CacheArgs {
    /// Requests in the trace (half warm the caches, half are measured).
    #[arg(long, default_value_t = 200_000)]
    requests: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16)]
    dim: usize,
    /// Requests per batch for the batched figures.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// The cache's policy (`group_assoc`, the default, `group_lfu`, `lru`, `lfu`).
    #[arg(long, default_value = "group_assoc")]
    policy: String,
    /// `group_assoc`'s replacement rule fixed (`group`, `group_admission`, `clock`); default:
    /// the adaptive choice among them.
    #[arg(long)]
    rule: Option<String>,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

struct Tables(Vec<Arc<Table>>);

impl Backing for Tables {
    fn read(&self, table: usize, ids: &[u64], out: &mut [f32]) -> Result<(), String> {
        self.0[table].lookup(ids, OnMiss::Zeros, out, None).map_err(|e| e.to_string())
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 0.5)
}

/// (p50 µs, p99 µs, requests/s) of `f` over `requests` one at a time.
fn per_request(requests: &[&[u64]], mut f: impl FnMut(&[u64])) -> (f64, f64, f64) {
    let mut lat = Vec::with_capacity(requests.len());
    let start = Instant::now();
    for r in requests {
        let t = Instant::now();
        f(r);
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let rps = requests.len() as f64 / start.elapsed().as_secs_f64();
    (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99), rps)
}

pub(crate) fn run(args: CacheArgs) -> Result<(), String> {
    let d = args.dim;
    let trace = Synthetic { num_requests: args.requests, ..Default::default() }
        .generate()
        .map_err(|e| e.to_string())?;
    let t = 26;
    let mut policy = PolicyConfig::parse(&args.policy, t as u8).map_err(|e| e.to_string())?;
    if let Some(name) = &args.rule {
        let rule = embstore_cache::policy::Rule::parse(name)
            .ok_or_else(|| format!("unknown rule '{name}' (group, group_admission, clock)"))?;
        match &mut policy {
            PolicyConfig::GroupAssoc(c) => c.rule = Some(rule),
            _ => return Err("--rule applies to group_assoc only".into()),
        }
    }
    eprintln!(
        "cache bench: {} requests, {} unique keys, D = {d}, policy {} (rule {})",
        trace.len(),
        trace.unique_keys(),
        policy.name(),
        args.rule.as_deref().unwrap_or("adaptive")
    );
    let store = Store::new();
    let mut tables = Vec::new();
    for i in 0..t {
        tables.push(
            store.create_table(TableConfig::new(format!("t{i}"), d)).map_err(|e| e.to_string())?,
        );
    }
    let mut by_table: Vec<Vec<u64>> = vec![Vec::new(); t];
    for &k in trace.keys() {
        let (ti, id) = split_key(k);
        by_table[usize::from(ti)].push(id);
    }
    for (ti, ids) in by_table.iter_mut().enumerate() {
        ids.sort_unstable();
        ids.dedup();
        let vals: Vec<f32> = ids
            .iter()
            .flat_map(|&id| (0..d).map(move |j| ((id as f32) * 0.001 + j as f32) * 0.01))
            .collect();
        tables[ti].assign(ids, &vals).map_err(|e| e.to_string())?;
    }
    let backing = Arc::new(Tables(tables.clone()));
    let half = trace.len() / 2;
    let warm: Vec<&[u64]> = (0..half).map(|i| trace.request(i)).collect();
    let measured: Vec<&[u64]> = (half..trace.len()).map(|i| trace.request(i)).collect();
    let full_bytes = trace.unique_keys() * 4 * d;
    let mut rows = vec![0f32; t * d * args.batch];
    let mut report = serde_json::Map::new();
    let mut lines = Vec::new();

    // Plain table lookups.
    let mut ids = vec![0u64; 1];
    let mut p = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.reps {
        let (a, b, c) = per_request(&measured, |r| {
            for &k in r {
                let (ti, id) = split_key(k);
                ids[0] = id;
                tables[usize::from(ti)].lookup(&ids, OnMiss::Zeros, &mut rows[..d], None).unwrap();
            }
        });
        p.0.push(a);
        p.1.push(b);
        p.2.push(c);
    }
    let table = (median(p.0), median(p.1), median(p.2));
    lines.push(format!(
        "table (26 calls/request)      p50 {:7.2} µs  p99 {:7.2} µs  {:9.0} req/s",
        table.0, table.1, table.2
    ));
    report.insert(
        "table".into(),
        serde_json::json!({"p50_us": table.0, "p99_us": table.1, "rps": table.2}),
    );

    // Plain table lookups, batched: one call per table per batch.
    let mut rps = Vec::new();
    for _ in 0..args.reps {
        let start = Instant::now();
        for chunk in measured.chunks(args.batch) {
            for (ti, table) in tables.iter().enumerate() {
                let ids: Vec<u64> = chunk.iter().map(|r| split_key(r[ti]).1).collect();
                table.lookup(&ids, OnMiss::Zeros, &mut rows[..ids.len() * d], None).unwrap();
            }
        }
        rps.push(measured.len() as f64 / start.elapsed().as_secs_f64());
    }
    let tb = median(rps);
    lines.push(format!("table, batch {:4}             {:>36.0} req/s", args.batch, tb));
    report.insert("table_batch".into(), serde_json::json!({"rps": tb}));

    let configs: [(&str, f64, Vec<LevelConfig>); 3] = [
        ("cache f32 5%", 0.05, vec![LevelConfig { codec: CodecKind::F32, share: 1.0 }]),
        (
            "cache f32/int8 5%",
            0.05,
            vec![
                LevelConfig { codec: CodecKind::F32, share: 0.5 },
                LevelConfig { codec: CodecKind::Int8, share: 0.5 },
            ],
        ),
        ("cache f32 all-fits", 1.6, vec![LevelConfig { codec: CodecKind::F32, share: 1.0 }]),
    ];
    for (name, frac, tiers) in configs {
        let mut cfg = CacheConfig::new(t, d, (full_bytes as f64 * frac) as usize);
        cfg.levels = tiers;
        cfg.policy = policy.clone();
        let (mut a, mut b, mut c, mut bat, mut perfect) = (vec![], vec![], vec![], vec![], 0.0);
        for _ in 0..args.reps {
            let cache = InferenceCache::new(cfg.clone(), backing.clone(), vec![])
                .map_err(|e| e.to_string())?;
            for chunk in warm.chunks(args.batch) {
                let keys: Vec<u64> = chunk.iter().flat_map(|r| r.iter().copied()).collect();
                let offs: Vec<usize> = (0..=chunk.len()).map(|i| i * t).collect();
                cache
                    .lookup(&keys, &offs, &mut rows[..keys.len() * d], None)
                    .map_err(|e| e.to_string())?;
            }
            cache.reset_stats();
            let offs = [0, t];
            let (x, y, z) = per_request(&measured, |r| {
                cache.lookup(r, &offs, &mut rows[..t * d], None).unwrap();
            });
            let s = cache.stats();
            perfect = s.perfect as f64 / s.requests as f64;
            a.push(x);
            b.push(y);
            c.push(z);
            let start = Instant::now();
            for chunk in measured.chunks(args.batch) {
                let keys: Vec<u64> = chunk.iter().flat_map(|r| r.iter().copied()).collect();
                let offs: Vec<usize> = (0..=chunk.len()).map(|i| i * t).collect();
                cache.lookup(&keys, &offs, &mut rows[..keys.len() * d], None).unwrap();
            }
            bat.push(measured.len() as f64 / start.elapsed().as_secs_f64());
        }
        let (p50, p99, r1, rb) = (median(a), median(b), median(c), median(bat));
        lines.push(format!(
            "{name:<29} p50 {p50:7.2} µs  p99 {p99:7.2} µs  {r1:9.0} req/s; batch {}: {rb:9.0} req/s; perfect {:.1} %",
            args.batch,
            perfect * 100.0
        ));
        report.insert(name.into(), serde_json::json!({"p50_us": p50, "p99_us": p99, "rps": r1, "batch_rps": rb, "perfect_hit": perfect, "budget_fraction": frac}));
    }
    if args.json {
        println!("{}", serde_json::Value::Object(report));
    } else {
        println!("{}", crate::machine_line());
        println!(
            "synthetic rho 0.7, {} measured requests of 26 keys, D = {d}, medians of {}",
            measured.len(),
            args.reps
        );
        for l in lines {
            println!("{l}");
        }
    }
    Ok(())
}
