//! Perfect-hit rates of every L1 policy on the design note's synthetic Criteo-like trace.
//!
//! Dimensions (note §6.2): 26 tables, log-spaced sizes 10 … 200,000 rows, 200,000 contexts
//! with Zipf(1) popularity, co-access ρ = 0.7, 200,000 requests, one key per table; capacity
//! 5 % of the trace's unique keys (also shown as a share of all table rows). Each policy runs
//! in the three modes of the evaluator; with `--seeds K` the trace is drawn with seeds
//! 0..K and rates are reported as mean ± sd.
//!
//! ```text
//! cargo run --release -p embstore-cache --example perfect_hits -- \
//!     [--requests 200000] [--rho 0.7] [--drift 0] [--frac 0.05] [--seeds 1]
//! ```

use std::time::Instant;

use embstore_cache::{
    evaluate, Flush, GroupLfuConfig, LfuConfig, Mode, PolicyConfig, Report, Synthetic,
};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => match args.get(i + 1).map(|v| v.parse::<T>()) {
            Some(Ok(v)) => v,
            _ => {
                eprintln!("error: {name} needs a value");
                std::process::exit(2);
            }
        },
    }
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var =
        if v.len() > 1 { v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (m, var.sqrt())
}

fn main() -> Result<(), embstore_cache::Error> {
    let args: Vec<String> = std::env::args().collect();
    let base = Synthetic {
        num_requests: arg(&args, "--requests", 200_000),
        rho: arg(&args, "--rho", 0.7),
        drift: arg(&args, "--drift", 0.0),
        ..Synthetic::default()
    };
    let frac: f64 = arg(&args, "--frac", 0.05);
    let seeds: u64 = arg(&args, "--seeds", 1);
    let t = u8::try_from(base.num_tables).unwrap_or(u8::MAX);

    let group = |alpha: Option<f64>, pin: bool| {
        PolicyConfig::GroupLfu(GroupLfuConfig {
            max_score: t,
            pin_request: pin,
            age_alpha: alpha,
            ..GroupLfuConfig::default()
        })
    };
    let policies: Vec<(&str, PolicyConfig)> = vec![
        ("lru", PolicyConfig::Lru),
        ("lfu (no aging)", PolicyConfig::Lfu(LfuConfig { age_alpha: None })),
        ("lfu (aging a=2)", PolicyConfig::Lfu(LfuConfig::default())),
        ("ev-lfu-paper (compat)", PolicyConfig::EvLfuPaper { max_score: t }),
        ("ev-lfu no flush, no pin", group(None, false)),
        ("group-lfu pin only", group(None, true)),
        ("group-lfu pin+age a=0.5", group(Some(0.5), true)),
        ("group-lfu pin+age a=2 (default)", group(Some(2.0), true)),
        ("group-lfu pin+age a=4", group(Some(4.0), true)),
        (
            "group-lfu pin+incr. flush",
            PolicyConfig::GroupLfu(GroupLfuConfig {
                max_score: t,
                age_alpha: None,
                flush: Flush::Incremental { trigger: 0.95, rate: 0.30, batch: 64 },
                ..GroupLfuConfig::default()
            }),
        ),
        (
            "ev-arc",
            PolicyConfig::EvArc(embstore_cache::EvArcConfig { max_score: t, ..Default::default() }),
        ),
    ];
    let modes = [Mode::Online, Mode::Prefix, Mode::Replay];

    // results[policy][mode] = reports over seeds
    let mut results: Vec<Vec<Vec<Report>>> = vec![vec![Vec::new(); modes.len()]; policies.len()];
    let mut secs = vec![0.0f64; policies.len()];
    let total_rows: u64 = base.table_sizes().iter().sum();
    let mut processed_keys = 0.0f64; // key lookups made by one policy over all modes and seeds
    for seed in 0..seeds {
        let s = Synthetic { seed, ..base.clone() };
        let t0 = Instant::now();
        let trace = s.generate()?;
        let unique = trace.unique_keys();
        processed_keys += 4.0 * trace.keys().len() as f64; // online + prefix + 2 replay passes
        let cap = ((unique as f64 * frac).round() as usize).max(trace.max_request_len());
        println!(
            "seed {seed}: {} requests, {unique} unique keys, capacity {cap} = {:.1}% of unique keys, \
             {:.2}% of {total_rows} table rows (generated in {:.2}s)",
            trace.len(),
            100.0 * cap as f64 / unique as f64,
            100.0 * cap as f64 / total_rows as f64,
            t0.elapsed().as_secs_f64()
        );
        for (pi, (_, cfg)) in policies.iter().enumerate() {
            for (mi, &mode) in modes.iter().enumerate() {
                let t1 = Instant::now();
                results[pi][mi].push(evaluate(&trace, cfg, cap, mode)?);
                secs[pi] += t1.elapsed().as_secs_f64();
            }
        }
    }

    println!();
    println!(
        "{:<32} {:>36} {:>12} {:>22} {:>6} {:>6} {:>7} {:>7}",
        "policy",
        "perfect % on/pre/rep",
        "ind. % pre",
        "bound % on/pre/rep",
        "miss/r",
        "self%",
        "B/entry",
        "Mkey/s"
    );
    for (pi, (name, _)) in policies.iter().enumerate() {
        let stat = |mi: usize, f: &dyn Fn(&Report) -> f64| {
            mean_sd(&results[pi][mi].iter().map(f).collect::<Vec<_>>())
        };
        let fmt = |(m, sd): (f64, f64)| {
            if seeds > 1 {
                format!("{:.2}±{:.2}", 100.0 * m, 100.0 * sd)
            } else {
                format!("{:.2}", 100.0 * m)
            }
        };
        let perfect: Vec<String> = (0..3).map(|mi| fmt(stat(mi, &|r| r.perfect_hit))).collect();
        let bound: Vec<String> = (0..3)
            .map(|mi| format!("{:.1}", 100.0 * stat(mi, &|r| r.compulsory_bound).0))
            .collect();
        let pre = &results[pi][1];
        let self_pct = {
            let (e, s): (u64, u64) =
                pre.iter().fold((0, 0), |(e, s), r| (e + r.evictions, s + r.self_evictions));
            100.0 * s as f64 / e.max(1) as f64
        };
        println!(
            "{:<32} {:>36} {:>12} {:>22} {:>6.2} {:>6.1} {:>7.1} {:>7.1}",
            name,
            perfect.join(" / "),
            fmt(stat(1, &|r| r.individual_hit)),
            bound.join(" / "),
            stat(1, &|r| r.mean_misses).0,
            self_pct,
            pre[0].metadata_bytes_per_entry,
            processed_keys / 1e6 / secs[pi],
        );
    }
    println!(
        "\nperfect = all keys of a request resident at probe; bound = infinite cache (first \
         occurrences miss); miss/r, self% (evictions that took a key of the request being \
         committed) and ind. are prefix mode; Mkey/s = key lookups per second over all three modes."
    );
    Ok(())
}
