//! A server as a member of a cluster in etcd (docs/serving.md, "Membership"): it registers its
//! address under a lease, and every `every` it reconciles what it holds with the tables'
//! control records:
//!
//! - **repair**: slots of servers whose lease is gone go to live servers ([`repair`], the same
//!   answer on every server; written by compare-and-swap, so one write wins);
//! - **load**: a slot assigned here that this server does not hold is loaded from the recorded
//!   checkpoint (a restarted server, a server given a dead one's slot, a column a failed roll
//!   left without its version); a failed load is retried after a back-off;
//! - **drop leftovers**: versions of a table other than the one recorded, quiet for `quiet`
//!   (no lookup named them), are unloaded.
//!
//! A table whose roll is running is left to the roll's coordinator while the coordinator holds
//! the table's roll lock; a roll whose lock expired (its coordinator died) is treated as
//! stopped: the servers restore the recorded version, and the next `publish` starts over.
//! While etcd is away the server serves what it holds and reconciles again once etcd answers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_cluster::{
    controls, loads, members, put_control, register, register_under, repair, Etcd, LeaseKeeper,
};
use embstore_common::now_ms;
use parking_lot::Mutex;

use crate::{Server, State};

/// How a member joins and reconciles.
#[derive(Clone, Debug)]
pub struct MemberOptions {
    /// etcd's endpoints.
    pub etcd: Vec<String>,
    /// The name it registers under, and the address clients dial (usually both `host:port`).
    pub instance: String,
    pub addr: String,
    /// Its registration lasts this long after the last renewal (etcd's lease TTL).
    pub lease_ttl: Duration,
    /// How often it reconciles.
    pub every: Duration,
    /// A leftover version is dropped once no lookup named it for this long.
    pub quiet: Duration,
    /// A failed load of a slot is tried again after this long.
    pub retry_after: Duration,
    /// A lease the process already keeps (with its etcd client) to register under, with its
    /// other keys (its sync membership's): one lease and one renewal loop for all; `None`: a
    /// lease of its own, of `lease_ttl`.
    pub lease: Option<(Arc<Etcd>, Arc<LeaseKeeper>)>,
}

impl MemberOptions {
    /// Defaults: a 10 s lease, reconciling every second, leftovers dropped after 10 s quiet,
    /// failed loads retried after 30 s.
    pub fn new(etcd: Vec<String>, addr: &str) -> Self {
        Self {
            etcd,
            instance: addr.to_string(),
            addr: addr.to_string(),
            lease_ttl: Duration::from_secs(10),
            every: Duration::from_secs(1),
            quiet: Duration::from_secs(10),
            retry_after: Duration::from_secs(30),
            lease: None,
        }
    }
}

/// A registered member; [`Member::run`] reconciles until shutdown, then deregisters.
#[derive(Debug)]
pub struct Member {
    server: Arc<Server>,
    etcd: Arc<Etcd>,
    options: MemberOptions,
    registration: embstore_cluster::Registration,
    /// (table, version, shard) → when its last load failed.
    failed: Mutex<HashMap<(String, u64, u32), Instant>>,
}

impl Member {
    /// Registers `server` in etcd. Fails with `Unavailable` when etcd does not answer.
    pub async fn join(
        server: Arc<Server>,
        options: MemberOptions,
    ) -> embstore_common::Result<Self> {
        let (etcd, registration) = match &options.lease {
            Some((etcd, keeper)) => (
                etcd.clone(),
                register_under(keeper.clone(), &options.instance, &options.addr).await?,
            ),
            None => {
                let etcd = Arc::new(Etcd::connect(&options.etcd, Duration::from_secs(2))?);
                let r = register(etcd.clone(), &options.instance, &options.addr, options.lease_ttl)
                    .await?;
                (etcd, r)
            }
        };
        Ok(Self { server, etcd, options, registration, failed: Mutex::new(HashMap::new()) })
    }

    /// Reconciles every `every` until `shutdown` resolves, then deregisters (the naming key
    /// goes at once).
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(self.options.every) => self.reconcile().await,
            }
        }
        if let Ok(member) = Arc::try_unwrap(self) {
            member.registration.deregister().await;
        }
    }

    /// One round (see the module docs); errors from etcd end the round quietly.
    pub async fn reconcile(&self) {
        let (Ok(live), Ok(all)) = (members(&self.etcd).await, controls(&self.etcd).await) else {
            return;
        };
        self.server.set_controls(all.iter().map(|(c, _)| c.clone()).collect());
        let live: Vec<String> = live.into_iter().map(|(i, _)| i).collect();
        let mut load = loads(all.iter().map(|(c, _)| c));
        load.retain(|i, _| live.contains(i));
        // A running roll whose coordinator's lock is gone was abandoned (the coordinator died):
        // the servers restore the recorded version, and the next publish starts over.
        let Ok(locks) = self.etcd.range_prefix(embstore_cluster::ROLL_LOCK).await else {
            return;
        };
        let locked = |table: &str| {
            locks.iter().any(|kv| kv.key[embstore_cluster::ROLL_LOCK.len()..] == *table)
        };
        let me = &self.options.instance;
        for (mut c, revision) in all {
            if (c.rolling() && locked(&c.table)) || c.version == 0 {
                continue;
            }
            let fixes = repair(&c, &live, &mut load);
            if !fixes.is_empty() {
                for (s, r, to) in &fixes {
                    c.assignment[*s][*r] = to.clone();
                }
                if !matches!(put_control(&self.etcd, &c, revision).await, Ok(true)) {
                    continue; // another member wrote first: read again next round
                }
            }
            for (s, replicas) in c.assignment.iter().enumerate() {
                if !replicas.contains(me) || self.server.holds(&c.table, c.version, s as u32) {
                    continue;
                }
                let key = (c.table.clone(), c.version, s as u32);
                let retry = self.options.retry_after;
                if self.failed.lock().get(&key).is_some_and(|t| t.elapsed() < retry) {
                    continue;
                }
                let (server, c2) = (self.server.clone(), c.clone());
                let loaded = tokio::task::spawn_blocking(move || {
                    let ckpt = std::path::Path::new(&c2.checkpoint);
                    server.load(&c2.table, c2.version, s as u32, c2.num_shards, ckpt)
                })
                .await;
                if !matches!(loaded, Ok(Ok(()))) {
                    self.failed.lock().insert(key, Instant::now());
                }
            }
            self.drop_leftovers(&c.table, c.version);
        }
    }

    /// Unloads versions of `table` other than `version` that no lookup named for `quiet`.
    fn drop_leftovers(&self, table: &str, version: u64) {
        let quiet = self.options.quiet.as_millis() as u64;
        let now = now_ms();
        let stale: Vec<(u64, u32)> = self
            .server
            .tables
            .read()
            .get(table)
            .map(|held| {
                held.iter()
                    .filter(|h| h.version != version && h.state != State::Loading)
                    .filter(|h| {
                        let last = h.last_request_ms.load(std::sync::atomic::Ordering::Relaxed);
                        now.saturating_sub(last) >= quiet
                    })
                    .map(|h| (h.version, h.shard))
                    .collect()
            })
            .unwrap_or_default();
        for (v, s) in stale {
            self.server.unload(table, v, Some(s));
        }
    }
}
