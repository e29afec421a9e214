//! The scheduler of batch calls: runs a call's shard tasks on the calling thread, helped by a
//! small shared pool.
//!
//! A call's shards are claimed one at a time from an atomic counter, by the calling thread and
//! by up to [`threads`] − 1 helper jobs queued on the pool. The caller never sleeps on a
//! hand-off: it works through the shards itself, and then waits only for shards that a helper
//! has claimed and is running. A helper job that starts after the caller has finished — because
//! the pool was busy with another table's big call, say — finds the call closed and returns
//! without touching it: a small call never waits behind work it does not need (a 4,096-id
//! lookup once stalled 301 ms behind another table's 4M-id lookups while its helper job sat in
//! the queue). If the pool cannot be started, every call runs on its calling thread.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use crate::{Error, Result};

/// Threads a batch call may use, the caller's included: the cores, or `EMBSTORE_THREADS` when
/// that variable is set (1: every call runs on the caller's thread alone).
pub fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("EMBSTORE_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
    })
}

/// Runs shard tasks on the caller plus an optional pool of helpers.
pub(crate) struct Scheduler {
    pool: Option<rayon::ThreadPool>,
    helpers: usize,
}

impl Scheduler {
    /// The process-wide scheduler: [`threads`] − 1 helpers, started on first use.
    pub(crate) fn global() -> &'static Scheduler {
        static GLOBAL: OnceLock<Scheduler> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let helpers = threads() - 1;
            Scheduler::new(helpers, || {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(helpers)
                    .thread_name(|i| format!("embstore-{i}"))
                    .build()
            })
        })
    }

    /// A scheduler with `helpers` helper threads in the pool `build` starts; if it fails to
    /// start, calls run on their calling thread alone.
    pub(crate) fn new(
        helpers: usize,
        build: impl FnOnce() -> std::result::Result<rayon::ThreadPool, rayon::ThreadPoolBuildError>,
    ) -> Self {
        let pool = match helpers {
            0 => None,
            _ => build().ok(),
        };
        let helpers = if pool.is_some() { helpers } else { 0 };
        Self { pool, helpers }
    }

    /// Whether calls get helpers (false when the pool failed to start or none was asked for).
    #[cfg(test)]
    pub(crate) fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Runs `task(0..n)`, each index once; the first error wins. With `parallel` and a pool,
    /// helpers claim indexes beside the caller; returns once every index has run.
    pub(crate) fn run<F>(&self, n: usize, parallel: bool, task: F) -> Result<()>
    where
        F: Fn(usize) -> Result<()> + Sync,
    {
        let helpers = self.helpers.min(n.saturating_sub(1));
        let pool = match &self.pool {
            Some(pool) if parallel && helpers > 0 && pool.current_thread_index().is_none() => pool,
            _ => return (0..n).try_for_each(task), // small call, no pool, or nested in a helper
        };
        let call = Call {
            next: AtomicUsize::new(0),
            n,
            first_error: Mutex::new(None),
            panic: Mutex::new(None),
            task,
        };
        let open = Arc::new(RwLock::new(true));
        // A helper catches a panic of the task (it would abort the process on a pool thread)
        // and hands it to the caller, which re-raises it once the call is closed.
        let work: &(dyn Fn() + Sync) = &|| {
            if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(|| call.work())) {
                call.panic.lock().get_or_insert(payload);
            }
        };
        // SAFETY: the `'static` lifetime is a promise kept by `Closer` below, not by the type
        // system: helpers call `work` only while holding `open`'s read lock and seeing `true`,
        // and `Closer` takes the write lock (waiting out every helper inside `work`) and sets
        // `false` before this frame — which owns `call` — ends, also when it unwinds. So `work`
        // is never called after the borrow ends.
        let work: &'static (dyn Fn() + Sync) = unsafe { std::mem::transmute(work) };
        let work = SendPtr(work);
        {
            let _closer = Closer(&open);
            for _ in 0..helpers {
                let open = open.clone();
                pool.spawn(move || {
                    let work = work;
                    let guard = open.read();
                    if *guard {
                        (work.0)();
                    }
                });
            }
            call.work();
        }
        if let Some(payload) = call.panic.into_inner() {
            std::panic::resume_unwind(payload);
        }
        call.first_error.into_inner().map_or(Ok(()), Err)
    }
}

/// One parallel call: indexes handed out by `next`.
struct Call<F> {
    next: AtomicUsize,
    n: usize,
    first_error: Mutex<Option<Error>>,
    /// A panic caught on a helper, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    task: F,
}

impl<F: Fn(usize) -> Result<()>> Call<F> {
    /// Claims and runs indexes until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if let Err(e) = (self.task)(i) {
                self.first_error.lock().get_or_insert(e);
            }
        }
    }
}

/// Closes a call when dropped: waits for helpers inside it, then turns late ones away.
struct Closer<'a>(&'a RwLock<bool>);

impl Drop for Closer<'_> {
    fn drop(&mut self) {
        *self.0.write() = false;
    }
}

/// The call's work function, sent to helper jobs (see the SAFETY comment in `run`).
#[derive(Clone, Copy)]
struct SendPtr(&'static (dyn Fn() + Sync));

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use super::*;

    fn named_pool(n: usize) -> std::result::Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("helper-{i}"))
            .build()
    }

    #[test]
    fn every_index_runs_once_and_the_first_error_wins() {
        let s = Scheduler::new(3, || named_pool(3));
        let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        s.run(64, true, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        let err = s.run(8, true, |i| match i {
            3 => Err(Error::invalid("three")),
            _ => Ok(()),
        });
        assert_eq!(err.unwrap_err().message(), "three");
    }

    #[test]
    fn a_panic_on_a_helper_reaches_the_caller_and_the_pool_survives() {
        let s = Scheduler::new(1, || named_pool(1));
        let caller = std::thread::current().id();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            s.run(64, true, |_| {
                if std::thread::current().id() != caller {
                    panic!("helper task failed");
                }
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            })
        }));
        // The caller is slow (64 × 5 ms), so the idle helper claims an index; its panic must come
        // back to the caller as a panic instead of aborting the process.
        let payload = result.expect_err("the helper's panic reached the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"helper task failed"));
        let ran = AtomicUsize::new(0);
        s.run(64, true, |_| {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(ran.into_inner(), 64);
    }

    #[test]
    fn pool_start_failure_falls_back_to_the_caller() {
        let s = Scheduler::new(2, || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .spawn_handler(|_| Err(std::io::Error::other("no threads here")))
                .build()
        });
        assert!(!s.has_pool());
        let caller = std::thread::current().id();
        let ran = AtomicUsize::new(0);
        s.run(16, true, |_| {
            assert_eq!(std::thread::current().id(), caller);
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert_eq!(ran.into_inner(), 16);
    }

    #[test]
    fn small_call_does_not_wait_for_a_busy_pool() {
        // One helper, kept busy for 2 s by another call's job; a second call must finish on its
        // caller long before that, and its queued helper job, when it finally runs, must not
        // touch the finished call.
        let s = Arc::new(Scheduler::new(1, || named_pool(1)));
        let release = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let busy = {
            let (s, release) = (s.clone(), release.clone());
            std::thread::spawn(move || {
                s.run(2, true, |_| {
                    if std::thread::current().name().is_some() {
                        // The helper holds its index until released (2 s at most).
                        let _ = started_tx.send(());
                        let start = Instant::now();
                        while !release.load(Ordering::Relaxed)
                            && start.elapsed() < Duration::from_secs(2)
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    } else {
                        // The caller is slow on its own index, so the helper claims the other.
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Ok(())
                })
            })
        };
        started_rx.recv_timeout(Duration::from_secs(10)).expect("the helper took a job");
        let start = Instant::now();
        s.run(4, true, |_| Ok(())).unwrap();
        let took = start.elapsed();
        release.store(true, Ordering::Relaxed);
        busy.join().unwrap().unwrap();
        assert!(took < Duration::from_millis(1000), "the small call waited {took:?}");
    }
}
