//! A parameter server over several processes (here: several `Cluster`s in one test process, on
//! loopback): the same values as one process, bit for bit, in every variant; BSP counts exact
//! across processes; pre-serialised prefetches and zero demand misses.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use embstore_ps::{Cluster, Consistency, Options, Ps, TableMasters, Worker};
use embstore_table::{Initializer, Optimizer, Table, TableConfig};

mod common;

fn tables() -> Vec<Arc<Table>> {
    common::delta_tables(&[("a", 4), ("b", 1)])
}

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let ls: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// Worker `g` (a global number) of the workload: reads depend on earlier clocks, deltas on
/// the reads.
fn workload(w: &Worker, g: u64, clock: u32) {
    let a: Vec<u64> = (0..30).map(|i| (i * 7 + g * 13) % 64).collect();
    let b: Vec<u64> = (0..8).map(|i| 1000 + (i * 3 + g) % 16).collect();
    let mut va = vec![0.0; a.len() * 4];
    w.read(0, &a, &mut va).unwrap();
    let mut vb = vec![0.0; b.len()];
    w.read(1, &b, &mut vb).unwrap();
    let s: f32 = vb.iter().sum::<f32>() * 1e-3;
    let da: Vec<f32> = va.iter().map(|x| -0.01 * x + s + clock as f32 * 1e-4).collect();
    w.update(0, &a, &da).unwrap();
    let db: Vec<f32> = (0..b.len()).map(|i| va[i * 4] * 0.1 + 0.5).collect();
    w.update(1, &b, &db).unwrap();
}

/// Reads rows of a table: `(table, keys, out)`.
type Read<'a> = &'a dyn Fn(usize, &[u64], &mut [f32]);

fn values(read: Read<'_>) -> Vec<Vec<f32>> {
    let keys = [(0..64u64).collect::<Vec<_>>(), (1000..1016u64).collect::<Vec<_>>()];
    keys.iter()
        .enumerate()
        .map(|(t, k)| {
            let mut v = vec![0.0; k.len() * [4, 1][t]];
            read(t, k, &mut v);
            v
        })
        .collect()
}

const CLOCKS: u32 = 6;

/// One process's run: `workers` threads, gathering as `gather` says.
fn run_process(ps: &Ps, rank: usize, gather: bool) {
    let w = ps.workers();
    if gather {
        ps.start_gather(true).unwrap();
        for i in 0..w {
            let worker = ps.worker(i).unwrap();
            workload(&worker, (rank * w + i) as u64, 1);
            worker.clock().unwrap();
        }
        ps.finish_gather().unwrap();
    }
    std::thread::scope(|s| {
        for i in 0..w {
            let worker = ps.worker(i).unwrap();
            s.spawn(move || {
                for c in 1..=CLOCKS {
                    workload(&worker, (rank * w + i) as u64, c);
                    worker.clock().unwrap();
                }
            });
        }
    });
}

fn cluster_run(p: usize, w: usize, opts: &Options) -> (Vec<Vec<f32>>, Vec<embstore_ps::Stats>) {
    let addrs = free_addrs(p);
    let clusters: Vec<Arc<Cluster>> = (0..p)
        .map(|r| {
            Cluster::start(r, addrs.clone(), Arc::new(TableMasters::new(tables()).unwrap()))
                .unwrap()
        })
        .collect();
    let stats = std::thread::scope(|s| {
        let hs: Vec<_> = clusters
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let m = c.masters().unwrap();
                let opts = opts.clone();
                s.spawn(move || {
                    let ps = Ps::new(Arc::new(m), w, opts.clone()).unwrap();
                    run_process(&ps, r, opts.static_store || opts.prefetch);
                    ps.stats()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every row, wherever it lives, read from process 0.
    let v = values(&|t, k, out| clusters[0].read_any(t, k, out).unwrap());
    for c in &clusters {
        c.stop();
    }
    (v, stats)
}

#[test]
fn processes_compute_what_one_process_does_bit_for_bit() {
    let (p, w) = (2, 2);
    let reference = {
        let t = tables();
        let ps = Ps::new(
            Arc::new(TableMasters::new(t.clone()).unwrap()),
            p * w,
            Options::variant("no-opt").unwrap(),
        )
        .unwrap();
        run_process(&ps, 0, false);
        values(&|i, k, out| t[i].lookup(k, Default::default(), out, None).unwrap())
    };
    for variant in ["all", "no-opt", "static", "prefetch", "all-but-prefetch"] {
        let opts = Options::variant(variant).unwrap();
        let (got, stats) = cluster_run(p, w, &opts);
        assert_eq!(got, reference, "{variant}");
        if variant == "all" {
            for s in &stats {
                assert_eq!(s.fetches, 0, "all: a demand miss after a complete prefetch: {s:?}");
                assert!(s.prefetch_requests > 0);
            }
        }
        if variant == "no-opt" {
            assert!(stats.iter().all(|s| s.fetches > 0));
        }
    }
}

#[test]
fn bsp_counts_are_exact_and_ssp_bounded_across_processes() {
    let (p, w) = (3, 2);
    for (variant, consistency) in [
        ("all", Consistency::Bsp),
        ("no-opt", Consistency::Bsp),
        ("all", Consistency::Ssp { slack: 1 }),
    ] {
        let addrs = free_addrs(p);
        let clusters: Vec<Arc<Cluster>> = (0..p)
            .map(|r| {
                let cfg = TableConfig::new("c", 1)
                    .with_optimizer(Optimizer::Delta)
                    .with_initializer(Initializer::Zeros);
                let t = vec![Arc::new(Table::new(cfg).unwrap())];
                Cluster::start(r, addrs.clone(), Arc::new(TableMasters::new(t).unwrap())).unwrap()
            })
            .collect();
        std::thread::scope(|s| {
            for (r, c) in clusters.iter().enumerate() {
                let m = c.masters().unwrap();
                s.spawn(move || {
                    let opts = Options { consistency, ..Options::variant(variant).unwrap() };
                    let ps = Ps::new(Arc::new(m), w, opts).unwrap();
                    std::thread::scope(|s2| {
                        for i in 0..w {
                            let worker = ps.worker(i).unwrap();
                            s2.spawn(move || {
                                for clock in 1..=8u32 {
                                    let mut v = [0.0f32; 2];
                                    worker.read(0, &[5, 6], &mut v).unwrap();
                                    let all = (p * w) as f32;
                                    let done = (clock - 1) as f32;
                                    if consistency == Consistency::Bsp {
                                        assert_eq!(
                                            v,
                                            [all * done, 2.0 * all * done],
                                            "{variant} rank {r} clock {clock}"
                                        );
                                    } else {
                                        // Its own updates, and everyone's up to clock - 2.
                                        let least = done + (all - 1.0) * (done - 1.0).max(0.0);
                                        assert!(
                                            v[0] >= least && v[0] <= all * done,
                                            "SSP rank {r} clock {clock}: {v:?}"
                                        );
                                    }
                                    worker.update(0, &[5, 6], &[1.0, 2.0]).unwrap();
                                    worker.clock().unwrap();
                                }
                            });
                        }
                    });
                });
            }
        });
        let mut v = [0.0f32; 2];
        clusters[1].read_any(0, &[5, 6], &mut v).unwrap();
        assert_eq!(v, [48.0, 96.0], "{variant}: 6 workers x 8 clocks");
        for c in &clusters {
            c.stop();
        }
    }
}

#[test]
fn placement_puts_every_row_on_a_process_that_reads_it_and_moves_existing_rows() {
    let (p, w) = (2, 2);
    let reference = {
        let t = tables();
        let ps = Ps::new(
            Arc::new(TableMasters::new(t.clone()).unwrap()),
            p * w,
            Options::variant("no-opt").unwrap(),
        )
        .unwrap();
        run_process(&ps, 0, false);
        values(&|i, k, out| t[i].lookup(k, Default::default(), out, None).unwrap())
    };
    let addrs = free_addrs(p);
    let clusters: Vec<Arc<Cluster>> = (0..p)
        .map(|r| {
            Cluster::start(r, addrs.clone(), Arc::new(TableMasters::new(tables()).unwrap()))
                .unwrap()
        })
        .collect();
    // The first clock runs unplanned and writes rows where their hash puts them; placement
    // then hands them to a process that reads them.
    let plans: Vec<(embstore_ps::PlanStats, Vec<embstore_ps::Log>)> = std::thread::scope(|s| {
        let hs: Vec<_> = clusters
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let m = c.masters().unwrap();
                s.spawn(move || {
                    let ps = Ps::new(Arc::new(m), w, Options::default()).unwrap();
                    ps.start_gather(false).unwrap();
                    std::thread::scope(|s2| {
                        for i in 0..w {
                            let worker = ps.worker(i).unwrap();
                            s2.spawn(move || {
                                workload(&worker, (r * w + i) as u64, 1);
                                worker.clock().unwrap();
                            });
                        }
                    });
                    let plan = ps.finish_gather().unwrap();
                    std::thread::scope(|s2| {
                        for i in 0..w {
                            let worker = ps.worker(i).unwrap();
                            s2.spawn(move || {
                                for c in 2..=CLOCKS {
                                    workload(&worker, (r * w + i) as u64, c);
                                    worker.clock().unwrap();
                                }
                            });
                        }
                    });
                    (plan, (0..w).map(|i| ps.gathered(i)).collect())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(plans.iter().map(|(p, _)| p.placement_moves).sum::<u64>() > 0, "no row moved");
    let mut per_process = vec![0usize; p];
    let mut all: std::collections::BTreeMap<(u32, u64), u64> = Default::default();
    for (r, (_, logs)) in plans.iter().enumerate() {
        for &(t, k, _) in logs.iter().flatten() {
            *all.entry((t, k)).or_insert(0) |= 1 << r;
        }
    }
    for (&(t, k), &mask) in &all {
        let o = clusters[0].owner(t as usize, k);
        assert_eq!(o, clusters[1].owner(t as usize, k), "the processes disagree on {k}");
        assert!(mask & (1 << o) != 0, "row {k} of table {t} placed on {o}, which does not read it");
        per_process[o] += 1;
    }
    let mean = all.len() as f64 / p as f64;
    let max = *per_process.iter().max().unwrap() as f64;
    assert!(max / mean <= 1.1, "rows per process {per_process:?}");
    let got = values(&|t, k, out| clusters[1].read_any(t, k, out).unwrap());
    assert_eq!(got, reference, "placement changed the values");
    for c in &clusters {
        c.stop();
    }
}

#[test]
fn a_cluster_serves_one_parameter_server() {
    let addrs = free_addrs(1);
    let c = Cluster::start(0, addrs, Arc::new(TableMasters::new(tables()).unwrap())).unwrap();
    let _m = c.masters().unwrap();
    let e = c.masters().unwrap_err();
    assert!(e.message().contains("one parameter server"), "{e}");
    c.stop();
}
