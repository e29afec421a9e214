//! The parameter server's invariants: BSP and SSP bounds, virtual iterations, every variant
//! computing the same values, overflow and re-planning, typed errors.

use std::sync::Arc;
use std::time::Duration;

use embstore_common::ErrorKind;
use embstore_ps::{Consistency, Options, Ps, Replan, TableMasters};
use embstore_table::{Initializer, Optimizer, Table, TableConfig};

mod common;
use common::delta_tables as tables;

fn ps(t: &[Arc<Table>], workers: usize, opts: Options) -> Ps {
    Ps::new(Arc::new(TableMasters::new(t.to_vec()).unwrap()), workers, opts).unwrap()
}

/// Runs `f(worker, clock)` on every worker in its own thread for clocks `from..=to`, each
/// ending with `clock()`.
fn run(ps: &Ps, from: u32, to: u32, f: &(dyn Fn(&embstore_ps::Worker, u32) + Sync)) {
    std::thread::scope(|s| {
        for w in 0..ps.workers() {
            let worker = ps.worker(w).unwrap();
            s.spawn(move || {
                for c in from..=to {
                    f(&worker, c);
                    worker.clock().unwrap();
                }
            });
        }
    });
}

fn zeros(name: &str) -> Vec<Arc<Table>> {
    let cfg = TableConfig::new(name, 2)
        .with_optimizer(Optimizer::Delta)
        .with_initializer(Initializer::Zeros);
    vec![Arc::new(Table::new(cfg).unwrap())]
}

#[test]
fn bsp_reads_see_exactly_every_earlier_clock_in_every_variant() {
    for variant in Options::variant_names() {
        let t = zeros("shared");
        let ps = ps(&t, 3, Options::variant(&variant).unwrap());
        ps.start_gather(true).unwrap();
        for w in 0..3 {
            let worker = ps.worker(w).unwrap();
            worker.read(0, &[5], &mut [0.0; 2]).unwrap();
            worker.update(0, &[5], &[1.0, 2.0]).unwrap();
            worker.clock().unwrap();
        }
        ps.finish_gather().unwrap();
        run(&ps, 1, 12, &|w, c| {
            let mut v = [0.0; 2];
            w.read(0, &[5], &mut v).unwrap();
            let want = 3.0 * (c - 1) as f32;
            assert_eq!(v, [want, 2.0 * want], "{variant}: worker {} clock {c}", w.id());
            w.update(0, &[5], &[1.0, 2.0]).unwrap();
            // Its own update is visible at once; the others' are not.
            w.read(0, &[5], &mut v).unwrap();
            assert_eq!(v, [want + 1.0, 2.0 * want + 2.0], "{variant}: own update");
        });
        let mut v = [0.0; 2];
        t[0].lookup(&[5], Default::default(), &mut v, None).unwrap();
        assert_eq!(v, [36.0, 72.0], "{variant}");
        assert_eq!(ps.stats().clocks, 12);
    }
}

#[test]
fn ssp_staleness_never_exceeds_the_slack_and_workers_run_ahead() {
    for variant in ["all", "no-opt"] {
        let slack = 2u32;
        let t = zeros("shared");
        let mut opts = Options::variant(variant).unwrap();
        opts.consistency = Consistency::Ssp { slack };
        let ps = ps(&t, 2, opts);
        ps.start_gather(true).unwrap();
        for w in 0..2 {
            let worker = ps.worker(w).unwrap();
            worker.read(0, &[1], &mut [0.0; 2]).unwrap();
            worker.update(0, &[1], &[1.0, 0.0]).unwrap();
            worker.clock().unwrap();
        }
        ps.finish_gather().unwrap();
        let ahead = std::sync::atomic::AtomicU32::new(0);
        let clocks = 30;
        run(&ps, 1, clocks, &|w, c| {
            if w.id() == 1 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let mut v = [0.0; 2];
            w.read(0, &[1], &mut v).unwrap();
            // Own updates: c - 1 of them; the other's: at least those of clocks < c - slack.
            let own = (c - 1) as f32;
            let least = own + c.saturating_sub(1 + slack) as f32;
            let most = own + clocks as f32;
            assert!(
                v[0] >= least && v[0] <= most,
                "{variant}: clock {c}: {} not in [{least}, {most}]",
                v[0]
            );
            let other = ps.clocks()[1 - w.id()];
            let lead = c.saturating_sub(other);
            assert!(lead <= slack, "{variant}: worker {} at {c}, the other at {other}", w.id());
            ahead.fetch_max(lead, std::sync::atomic::Ordering::Relaxed);
            w.update(0, &[1], &[1.0, 0.0]).unwrap();
        });
        assert!(ahead.into_inner() >= 1, "{variant}: the fast worker never ran ahead under SSP");
        let mut v = [0.0; 2];
        t[0].lookup(&[1], Default::default(), &mut v, None).unwrap();
        assert_eq!(v[0], 60.0);
    }
}

/// A deterministic iterative workload: worker `w` reads a fixed set of rows of two tables each
/// clock and pushes deltas computed from what it read (so a wrong read changes the result).
fn workload(w: &embstore_ps::Worker, clock: u32, shift: u64) {
    let id = w.id() as u64;
    let a: Vec<u64> = (0..40).map(|i| (i * 7 + id * 13 + shift) % 64).collect();
    let b: Vec<u64> = (0..10).map(|i| 1000 + (i * 3 + id + shift) % 16).collect();
    let mut va = vec![0.0; a.len() * 4];
    w.read(0, &a, &mut va).unwrap();
    let mut vb = vec![0.0; b.len()];
    w.read(1, &b, &mut vb).unwrap();
    let s: f32 = vb.iter().sum::<f32>() * 1e-3;
    let da: Vec<f32> = va.iter().map(|x| -0.01 * x + s + clock as f32 * 1e-4).collect();
    w.update(0, &a, &da).unwrap();
    let db: Vec<f32> = a.iter().take(b.len()).map(|&k| va[k as usize % 4] * 0.1 + 0.5).collect();
    w.update(1, &b, &db).unwrap();
    // Read again after the own update: the value must include it.
    let mut again = vec![0.0; 4];
    w.read(0, &a[..1], &mut again).unwrap();
}

fn final_values(t: &[Arc<Table>]) -> Vec<Vec<f32>> {
    let keys = [(0..64u64).collect::<Vec<_>>(), (1000..1016u64).collect::<Vec<_>>()];
    t.iter()
        .zip(&keys)
        .map(|(t, k)| {
            let mut v = vec![0.0; k.len() * t.dim()];
            t.lookup(k, Default::default(), &mut v, None).unwrap();
            v
        })
        .collect()
}

#[test]
fn every_variant_and_gathering_computes_the_same_values_bit_for_bit() {
    let reference = {
        let t = tables(&[("a", 4), ("b", 1)]);
        let ps = ps(&t, 2, Options::variant("no-opt").unwrap());
        run(&ps, 1, 8, &|w, c| workload(w, c, 0));
        final_values(&t)
    };
    for variant in Options::variant_names() {
        for gather in ["virtual", "first-iter", "missing", "false", "none"] {
            let t = tables(&[("a", 4), ("b", 1)]);
            let ps = ps(&t, 2, Options::variant(&variant).unwrap());
            let mut from = 1;
            match gather {
                "virtual" | "missing" | "false" => {
                    ps.start_gather(true).unwrap();
                    for w in 0..2 {
                        let worker = ps.worker(w).unwrap();
                        // Missing: worker 1 announces nothing; false: another pattern.
                        if gather == "virtual" || (gather == "missing" && w == 0) {
                            workload(&worker, 1, 0);
                        } else if gather == "false" {
                            workload(&worker, 1, 5);
                        }
                        worker.clock().unwrap();
                    }
                    let stats = ps.finish_gather().unwrap();
                    assert!(stats.rows > 0);
                    assert_eq!(
                        final_values(&t),
                        final_values(&tables(&[("a", 4), ("b", 1)])),
                        "virtual wrote"
                    );
                }
                "first-iter" => {
                    ps.start_gather(false).unwrap();
                    run(&ps, 1, 1, &|w, c| workload(w, c, 0));
                    ps.finish_gather().unwrap();
                    from = 2;
                }
                _ => {}
            }
            run(&ps, from, 8, &|w, c| workload(w, c, 0));
            assert_eq!(final_values(&t), reference, "{variant} with {gather} access information");
            let stats = ps.stats();
            if gather == "virtual"
                && variant.contains("prefetch")
                && !variant.starts_with("all-but")
            {
                assert_eq!(stats.fetches, 0, "{variant}: demand misses after a complete prefetch");
            }
            if gather == "virtual" && variant == "all" {
                assert_eq!(stats.fetches, 0, "all: demand misses after a complete prefetch");
                assert_eq!(stats.overflow, 0);
            }
            if gather == "false" && variant == "all" {
                assert!(stats.overflow > 0);
            }
        }
    }
}

#[test]
fn a_virtual_iteration_logs_exactly_the_accesses_of_a_real_one_and_writes_nothing() {
    let t = tables(&[("a", 4), ("b", 1)]);
    let p = ps(&t, 2, Options::default());
    p.start_gather(true).unwrap();
    for w in 0..2 {
        let worker = p.worker(w).unwrap();
        workload(&worker, 1, 0);
        worker.clock().unwrap();
    }
    let stats = p.finish_gather().unwrap();
    assert_eq!(t[0].len() + t[1].len(), 0, "a virtual iteration stored rows");
    let virtual_logs: Vec<_> = (0..2).map(|w| p.gathered(w)).collect();
    let t2 = tables(&[("a", 4), ("b", 1)]);
    let real = ps(&t2, 2, Options::default());
    real.start_gather(false).unwrap();
    run(&real, 1, 1, &|w, c| workload(w, c, 0));
    real.finish_gather().unwrap();
    for (w, log) in virtual_logs.iter().enumerate() {
        assert_eq!(*log, real.gathered(w), "worker {w}");
    }
    assert_eq!(stats.accesses, virtual_logs.iter().map(|l| l.len() as u64).sum::<u64>());
    let distinct: std::collections::HashSet<(u32, u64)> =
        virtual_logs.iter().flatten().map(|&(t, k, _)| (t, k)).collect();
    assert_eq!(stats.rows, distinct.len() as u64);
    assert!(stats.early_rows > 0 && stats.early_rows < stats.prefetch_rows);
    // Table a: an early and a normal request; table b is read after a (no early rows).
    assert_eq!(stats.prefetch_frames, 3);
}

#[test]
fn overflow_past_ten_percent_warns_and_auto_replans_with_the_same_values() {
    let reference = {
        let t = tables(&[("a", 4), ("b", 1)]);
        let ps = ps(&t, 2, Options::variant("no-opt").unwrap());
        run(&ps, 1, 4, &|w, c| workload(w, c, 0));
        run(&ps, 5, 12, &|w, c| workload(w, c, 9));
        final_values(&t)
    };
    for replan in [Replan::Warn, Replan::Auto] {
        let t = tables(&[("a", 4), ("b", 1)]);
        let opts = Options { replan, ..Options::default() };
        let ps = ps(&t, 2, opts);
        ps.start_gather(true).unwrap();
        for w in 0..2 {
            let worker = ps.worker(w).unwrap();
            workload(&worker, 1, 0);
            worker.clock().unwrap();
        }
        ps.finish_gather().unwrap();
        run(&ps, 1, 4, &|w, c| workload(w, c, 0));
        assert_eq!(ps.stats().overflow, 0);
        // The pattern drifts: most accesses now fall outside the plan.
        run(&ps, 5, 12, &|w, c| workload(w, c, 9));
        let stats = ps.stats();
        assert!(stats.overflow_warnings >= 1, "{replan:?}: {stats:?}");
        assert_eq!(final_values(&t), reference, "{replan:?}");
        if replan == Replan::Auto {
            assert_eq!(stats.replans, 1, "{stats:?}");
            let before = ps.stats().overflow;
            run(&ps, 13, 14, &|w, c| workload(w, c, 9));
            assert_eq!(ps.stats().overflow, before, "the new plan covers the new pattern");
        } else {
            assert_eq!(stats.replans, 0);
        }
    }
}

#[test]
fn bad_input_gets_typed_errors() {
    let cfg = TableConfig::new("adam", 2).with_optimizer(Optimizer::Adam {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    });
    let e = TableMasters::new(vec![Arc::new(Table::new(cfg).unwrap())]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("delta"), "{e}");
    let t = zeros("t");
    let p = ps(&t, 2, Options::default());
    assert_eq!(p.worker(2).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let w = p.worker(0).unwrap();
    assert_eq!(w.read(0, &[1, 2], &mut [0.0; 3]).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert_eq!(w.read(3, &[1], &mut [0.0; 2]).unwrap_err().kind(), ErrorKind::TableNotFound);
    assert_eq!(w.update(0, &[1], &[f32::NAN, 0.0]).unwrap_err().kind(), ErrorKind::NonFinite);
    assert_eq!(w.update(0, &[1], &[1.0]).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert!(p.finish_gather().is_err());
    w.update(0, &[1], &[1.0, 1.0]).unwrap();
    let e = p.start_gather(false).unwrap_err();
    assert!(e.message().contains("clock()"), "{e}");
    assert!(Options::variant("fast").is_err());
    assert!(
        Ps::new(Arc::new(TableMasters::new(zeros("z")).unwrap()), 0, Options::default()).is_err()
    );
}
