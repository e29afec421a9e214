//! The control plane (docs/serving.md, "Who holds what" and "A roll"): which servers are
//! alive, which (table, shard, replica) each should hold, and the rolls that move a table to
//! its next version. Shard and version facts still travel in the query protocol; nothing here
//! is read on a lookup's path.
//!
//! ## Parts
//! - [`Etcd`] — a thin etcd v3 client (ranges, puts, compare-and-swap, leases).
//! - Naming: [`register`] puts `/embstore/naming/{instance}` under a lease that a task keeps
//!   alive (a server that dies loses it after the TTL); [`members`] lists the live ones;
//!   [`Registration::deregister`] ends it at shutdown.
//! - Control: one [`Control`] record per table at `/embstore/control/{table}` (JSON): the
//!   version served, its shard count, replicas and checkpoint, the assignment
//!   `[shard][replica] → instance`, and the state of the table's last roll ([`Roll`]).
//!   Written with compare-and-swap only ([`put_control`]).
//! - Placement: [`assign`] spreads a new table's slots over the live servers; [`repair`] gives
//!   the slots of dead servers to live ones. Both are deterministic, so every server computes
//!   the same answer from the same facts.
//! - [`roll_lock`]: one roll per table at a time (a key under the coordinator's lease).
//! - [`LeaseKeeper`]: the one keeper of every lease above (and of the sync members'), renewing
//!   it and registering its key again when it was lost.
//! - The roll coordinator: [`admin`] makes one [`AdminCall`] to a server (`admin.rs`);
//!   [`roll`] carries out a [`RollPlan`] over a fixed cluster (`roll.rs`); [`publish`] rolls
//!   a table over the cluster in etcd, its plan decided first by a pure function
//!   (`publish.rs`, `publish/plan.rs`).
//! - [`rpc`] — calling a server, for the roll here and the data-plane client alike: a channel
//!   (TLS), a request with its token, [`rpc::from_status`], and why a connect failed.
//!
//! ## Invariants
//! - A replica of a shard is never assigned twice to one server (a server holds each shard of
//!   a version once).
//! - While a table's roll is [`RollState::Running`], only its coordinator writes its record.

mod admin;
pub mod etcd;
mod publish;
mod roll;
pub mod rpc;
#[cfg(any(test, feature = "test-harness"))]
pub mod testing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

pub use admin::{admin, AdminCall};
pub use etcd::{Etcd, Kv};
pub use publish::{publish, shards_for, Publish};
pub use roll::{roll, RollPlan};

/// Where live servers register: `NAMING + instance` → the address clients dial.
pub const NAMING: &str = "/embstore/naming/";
/// Per-table control records: `CONTROL + table` → [`Control`] as JSON.
pub const CONTROL: &str = "/embstore/control/";
/// Per-table roll locks: `ROLL_LOCK + table` → the coordinator's name, under its lease.
pub const ROLL_LOCK: &str = "/embstore/roll-lock/";

/// A table's control record (see the crate docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    pub table: String,
    /// The version every assigned replica should serve (0: none yet).
    pub version: u64,
    pub num_shards: u32,
    pub replicas: u32,
    /// The checkpoint `version` is loaded from (a path on the servers).
    pub checkpoint: String,
    /// `assignment[s][r]`: the instance holding replica `r` of shard `s`.
    pub assignment: Vec<Vec<String>>,
    /// The table's last roll, if any.
    #[serde(default)]
    pub roll: Option<Roll>,
}

/// A roll's record: what it does and how far it got.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roll {
    pub from_version: u64,
    pub to_version: u64,
    pub checkpoint: String,
    pub num_shards: u32,
    /// `columns[r][s]`: the server moving replica `r` of shard `s` to the new version.
    pub columns: Vec<Vec<String>>,
    /// `spare[s]`: the server holding shard `s` of the new version during the roll (empty: a
    /// roll without a spare column).
    pub spare: Vec<String>,
    pub state: RollState,
    /// The step it is at (or stopped at), as `publish` prints it.
    pub step: String,
    pub coordinator: String,
    pub started_ms: u64,
    pub updated_ms: u64,
    /// Why it failed.
    #[serde(default)]
    pub error: String,
}

/// Where a roll is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RollState {
    #[default]
    Running,
    Done,
    Failed,
}

impl Control {
    /// Whether a roll of this table is under way (its coordinator alone writes the record).
    pub fn rolling(&self) -> bool {
        self.roll.as_ref().is_some_and(|r| r.state == RollState::Running)
    }

    /// The record as stored.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and integers always serializes.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// A stored record; `Corruption` if it is not one.
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                ErrorKind::Corruption,
                format!("etcd key {key} is not a control record: {e}"),
            )
        })
    }
}

/// The instances registered now, sorted, with the addresses to dial.
pub async fn members(etcd: &Etcd) -> Result<Vec<(String, String)>> {
    Ok(etcd
        .range_prefix(NAMING)
        .await?
        .into_iter()
        .map(|kv| {
            let instance = kv.key[NAMING.len()..].to_string();
            (instance, String::from_utf8_lossy(&kv.value).into_owned())
        })
        .collect())
}

/// Every table's control record, with its revision (for [`put_control`]).
pub async fn controls(etcd: &Etcd) -> Result<Vec<(Control, i64)>> {
    etcd.range_prefix(CONTROL)
        .await?
        .into_iter()
        .map(|kv| Ok((Control::from_json(&kv.key, &kv.value)?, kv.mod_revision)))
        .collect()
}

/// Table `table`'s control record and its revision, if it has one.
pub async fn control(etcd: &Etcd, table: &str) -> Result<Option<(Control, i64)>> {
    let key = format!("{CONTROL}{table}");
    match etcd.get(&key).await? {
        Some(kv) => Ok(Some((Control::from_json(&key, &kv.value)?, kv.mod_revision))),
        None => Ok(None),
    }
}

/// Writes `c` if its record is still at `revision` (0: if it has none); whether it did.
pub async fn put_control(etcd: &Etcd, c: &Control, revision: i64) -> Result<bool> {
    etcd.put_if(&format!("{CONTROL}{}", c.table), &c.to_json(), revision, 0).await
}

/// Slots held per instance over `controls` (the replicas assigned, and a running roll's spare
/// column): the load [`assign`] and [`repair`] balance.
pub fn loads<'a>(controls: impl IntoIterator<Item = &'a Control>) -> HashMap<String, usize> {
    let mut load = HashMap::new();
    for c in controls {
        for i in c.assignment.iter().flatten() {
            *load.entry(i.clone()).or_insert(0) += 1;
        }
        if let Some(r) = c.roll.as_ref().filter(|r| r.state == RollState::Running) {
            for i in &r.spare {
                *load.entry(i.clone()).or_insert(0) += 1;
            }
        }
    }
    load
}

/// The live instance with the least load (then the smallest name) among those not in `taken`.
pub fn least_loaded<'a>(
    live: &'a [String],
    load: &HashMap<String, usize>,
    taken: &[String],
) -> Option<&'a String> {
    live.iter()
        .filter(|i| !taken.contains(i))
        .min_by_key(|i| (load.get(*i).copied().unwrap_or(0), (*i).clone()))
}

/// An assignment `[shard][replica] → instance` of `num_shards` × `replicas` slots over `live`
/// instances, replica by replica so that each column spreads over the least loaded servers
/// first; `load` is updated. Fails with `Unavailable` when fewer than `replicas` servers are
/// live (a server holds a shard once).
pub fn assign(
    num_shards: u32,
    replicas: u32,
    live: &[String],
    load: &mut HashMap<String, usize>,
) -> Result<Vec<Vec<String>>> {
    if live.len() < replicas as usize {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "{replicas} replicas need {replicas} live servers, {} are registered",
                live.len()
            ),
        ));
    }
    let mut out = vec![Vec::with_capacity(replicas as usize); num_shards as usize];
    for _ in 0..replicas {
        for shard in out.iter_mut() {
            let Some(pick) = least_loaded(live, load, shard).cloned() else {
                unreachable!("fewer live servers than replicas was refused above")
            };
            *load.entry(pick.clone()).or_insert(0) += 1;
            shard.push(pick);
        }
    }
    Ok(out)
}

/// The slots of `c`'s assignment whose instance is not `live`, each given to the least loaded
/// live instance that holds no replica of that shard: `(shard, replica, instance)`; `load` is
/// updated. Slots no live server can take are left out.
pub fn repair(
    c: &Control,
    live: &[String],
    load: &mut HashMap<String, usize>,
) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (s, replicas) in c.assignment.iter().enumerate() {
        let mut taken: Vec<String> =
            replicas.iter().filter(|i| live.contains(i)).cloned().collect();
        for (r, instance) in replicas.iter().enumerate() {
            if live.contains(instance) {
                continue;
            }
            if let Some(pick) = least_loaded(live, load, &taken).cloned() {
                *load.entry(pick.clone()).or_insert(0) += 1;
                taken.push(pick.clone());
                out.push((s, r, pick));
            }
        }
    }
    out
}

/// A lease a task keeps alive, renewing it every TTL/3, until it is ended (revoked: its keys go
/// at once) or dropped (left to expire after the TTL): the one lease keeper of every etcd
/// registration (a server's naming key, a roll lock, a sync member).
///
/// With a key (a registration), a lost lease (etcd restarted, or the process stalled past the
/// TTL) is replaced by a new one and the key put under it again with its latest value
/// ([`LeaseKeeper::set_value`]); without (a lock), a lost lease stays lost.
#[derive(Debug)]
pub struct LeaseKeeper {
    etcd: Arc<Etcd>,
    id: Arc<AtomicI64>,
    value: Arc<parking_lot::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Grants a lease of `ttl`, puts `key` = `value` under it and keeps it (on the current
    /// tokio runtime); fails if etcd does not answer now.
    pub async fn register(etcd: Arc<Etcd>, key: &str, value: &[u8], ttl: Duration) -> Result<Self> {
        let lease = etcd.grant(ttl).await?;
        etcd.put(key, value, lease).await?;
        Ok(Self::keep(etcd, lease, ttl, Some((key.to_owned(), value.to_vec()))))
    }

    /// Keeps lease `id` of `ttl` alive; with `again` (a key and its value), put again under a
    /// new lease when the lease is lost.
    fn keep(etcd: Arc<Etcd>, id: i64, ttl: Duration, again: Option<(String, Vec<u8>)>) -> Self {
        let id = Arc::new(AtomicI64::new(id));
        let (key, value) = match again {
            Some((k, v)) => (Some(k), v),
            None => (None, Vec::new()),
        };
        let value = Arc::new(parking_lot::Mutex::new(value));
        let (e, current, latest) = (etcd.clone(), id.clone(), value.clone());
        let task = tokio::spawn(async move {
            let every = (ttl / 3).max(Duration::from_millis(200));
            loop {
                tokio::time::sleep(every).await;
                // Errors: etcd away; try again next time (serving goes on meanwhile).
                let lost = matches!(e.keep_alive(current.load(Ordering::Relaxed)).await, Ok(false));
                if let (true, Some(key)) = (lost, &key) {
                    if let Ok(new) = e.grant(ttl).await {
                        let value = latest.lock().clone();
                        if e.put(key, &value, new).await.is_ok() {
                            current.store(new, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        Self { etcd, id, value, task }
    }

    /// The lease's id now (it changes when a lost lease is replaced).
    pub fn id(&self) -> i64 {
        self.id.load(Ordering::Relaxed)
    }

    /// The value the key is put with again if the lease is lost (the caller puts a changed
    /// value itself, under [`LeaseKeeper::id`]).
    pub fn set_value(&self, value: &[u8]) {
        *self.value.lock() = value.to_vec();
    }

    /// Ends the lease now: its keys are deleted.
    pub async fn end(self) {
        self.task.abort();
        let _ = self.etcd.revoke(self.id()).await;
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server's registration: its naming key lives while its lease is kept alive.
#[derive(Debug)]
pub struct Registration(LeaseKeeper);

/// Registers `instance` (dialled at `addr`) under a lease of `ttl`, and keeps it registered:
/// the lease is renewed every `ttl / 3`, and the key registered again under a new lease if the
/// lease was lost (etcd restarted, or the process stalled past the TTL). Fails if etcd does
/// not answer now.
pub async fn register(
    etcd: Arc<Etcd>,
    instance: &str,
    addr: &str,
    ttl: Duration,
) -> Result<Registration> {
    let key = format!("{NAMING}{instance}");
    Ok(Registration(LeaseKeeper::register(etcd, &key, addr.as_bytes(), ttl).await?))
}

impl Registration {
    /// Ends the registration now (the naming key goes at once, not after the TTL).
    pub async fn deregister(self) {
        self.0.end().await;
    }
}

/// A held roll lock of one table (see [`roll_lock`]); released by [`RollLock::release`], or
/// by its lease expiring if the coordinator dies.
#[derive(Debug)]
pub struct RollLock(LeaseKeeper);

/// Takes table `table`'s roll lock for `coordinator`, under a lease of `ttl` kept alive while
/// held. Fails with `Locked`, naming the holder, if another coordinator holds it.
pub async fn roll_lock(
    etcd: Arc<Etcd>,
    table: &str,
    coordinator: &str,
    ttl: Duration,
) -> Result<RollLock> {
    let key = format!("{ROLL_LOCK}{table}");
    let lease = etcd.grant(ttl).await?;
    if !etcd.put_if(&key, coordinator.as_bytes(), 0, lease).await? {
        let _ = etcd.revoke(lease).await;
        let holder = etcd
            .get(&key)
            .await?
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .unwrap_or_else(|| "a coordinator that just finished".into());
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "a roll of table '{table}' is in progress, coordinated by {holder}; wait for it \
                 (if its coordinator died, its lock expires {}s after its last renewal)",
                ttl.as_secs()
            ),
        ));
    }
    Ok(RollLock(LeaseKeeper::keep(etcd, lease, ttl, None)))
}

impl RollLock {
    /// Releases the lock.
    pub async fn release(self) {
        self.0.end().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{free_port, TestEtcd};

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    #[test]
    fn assign_spreads_slots_and_never_puts_a_shard_twice_on_one_server() {
        for (servers, shards, replicas) in [(4, 2, 2), (5, 2, 2), (2, 4, 2), (3, 1, 3), (6, 4, 1)] {
            let live = names(servers);
            let mut load = HashMap::new();
            let a = assign(shards, replicas, &live, &mut load).unwrap();
            assert_eq!(a.len(), shards as usize);
            for s in &a {
                assert_eq!(s.len(), replicas as usize);
                let mut d = s.clone();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), s.len(), "a shard twice on one server: {a:?}");
            }
            let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
            assert!(max - min <= 1 || servers > (shards * replicas) as usize, "{load:?}");
        }
        assert!(assign(1, 3, &names(2), &mut HashMap::new()).is_err());
    }

    #[test]
    fn repair_moves_only_dead_slots_to_servers_without_that_shard() {
        let live = names(4);
        let mut load = HashMap::new();
        let assignment = assign(2, 2, &live, &mut load).unwrap();
        let c = Control { table: "t".into(), assignment: assignment.clone(), ..Default::default() };
        assert!(repair(&c, &live, &mut load.clone()).is_empty());
        let dead = assignment[0][1].clone();
        let alive: Vec<String> = live.iter().filter(|i| **i != dead).cloned().collect();
        let mut load = loads([&c]);
        load.remove(&dead);
        let fixes = repair(&c, &alive, &mut load);
        assert_eq!(fixes.len(), 1);
        let (s, r, to) = &fixes[0];
        assert_eq!((*s, *r), (0, 1));
        assert!(!assignment[0].contains(to) && alive.contains(to));
        // The same facts give the same answer (every server computes it).
        let mut load2 = loads([&c]);
        load2.remove(&dead);
        assert_eq!(repair(&c, &alive, &mut load2), fixes);
    }

    #[test]
    fn a_control_record_round_trips_and_garbage_is_corruption() {
        let c = Control {
            table: "user".into(),
            version: 3,
            num_shards: 2,
            replicas: 2,
            checkpoint: "/c".into(),
            assignment: vec![vec!["a".into(), "b".into()], vec!["c".into(), "d".into()]],
            roll: Some(Roll { to_version: 4, state: RollState::Failed, ..Default::default() }),
        };
        assert_eq!(Control::from_json("k", &c.to_json()).unwrap(), c);
        let e = Control::from_json("k", b"{not json").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
    }

    #[tokio::test]
    async fn etcd_keys_leases_and_compare_and_swap() {
        let server = TestEtcd::start().await.unwrap();
        let etcd = Arc::new(
            Etcd::connect(std::slice::from_ref(&server.endpoint), Duration::from_secs(2)).unwrap(),
        );
        assert!(etcd.put_if("/t/a", b"1", 0, 0).await.unwrap());
        assert!(!etcd.put_if("/t/a", b"2", 0, 0).await.unwrap(), "created twice");
        let rev = etcd.get("/t/a").await.unwrap().unwrap().mod_revision;
        assert!(etcd.put_if("/t/a", b"2", rev, 0).await.unwrap());
        assert!(!etcd.put_if("/t/a", b"3", rev, 0).await.unwrap(), "a stale revision won");
        etcd.put("/t/b", b"x", 0).await.unwrap();
        etcd.put("/u", b"y", 0).await.unwrap();
        let keys: Vec<String> =
            etcd.range_prefix("/t/").await.unwrap().into_iter().map(|k| k.key).collect();
        assert_eq!(keys, ["/t/a", "/t/b"]);
        etcd.delete("/t/b").await.unwrap();
        assert!(etcd.get("/t/b").await.unwrap().is_none());

        // Registration: present while alive, gone at once on deregister.
        let reg =
            register(etcd.clone(), "s1", "127.0.0.1:1", Duration::from_secs(2)).await.unwrap();
        assert_eq!(members(&etcd).await.unwrap(), [("s1".to_string(), "127.0.0.1:1".to_string())]);
        tokio::time::sleep(Duration::from_secs(3)).await; // past the TTL: kept alive
        assert_eq!(members(&etcd).await.unwrap().len(), 1);
        reg.deregister().await;
        assert!(members(&etcd).await.unwrap().is_empty());

        // A lease not kept alive expires with its keys.
        let lease = etcd.grant(Duration::from_secs(1)).await.unwrap();
        etcd.put("/t/leased", b"x", lease).await.unwrap();
        assert!(etcd.keep_alive(lease).await.unwrap());
        let start = std::time::Instant::now();
        while etcd.get("/t/leased").await.unwrap().is_some() {
            assert!(start.elapsed() < Duration::from_secs(10), "the lease never expired");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!etcd.keep_alive(lease).await.unwrap());

        // One roll lock per table.
        let lock = roll_lock(etcd.clone(), "user", "p1", Duration::from_secs(5)).await.unwrap();
        let e = roll_lock(etcd.clone(), "user", "p2", Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Locked);
        assert!(e.to_string().contains("p1"), "{e}");
        lock.release().await;
        roll_lock(etcd.clone(), "user", "p2", Duration::from_secs(5))
            .await
            .unwrap()
            .release()
            .await;
    }

    #[tokio::test]
    async fn a_dead_etcd_is_unavailable_not_a_hang() {
        let port = free_port().unwrap();
        let etcd =
            Etcd::connect(&[format!("127.0.0.1:{port}")], Duration::from_millis(300)).unwrap();
        let start = std::time::Instant::now();
        assert_eq!(etcd.get("/x").await.unwrap_err().kind(), ErrorKind::Unavailable);
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(
            Etcd::connect(&[" ".into()], Duration::from_secs(1)).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
}
