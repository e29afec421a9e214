//! The control plane (docs/serving.md, "Who holds what" and "A roll"): which servers are
//! alive, which (table, shard, replica) each should hold, and the rolls that move a table to
//! its next version. Shard and version facts still travel in the query protocol; nothing here
//! is read on a lookup's path.
//!
//! ## Parts
//! Files: `etcd.rs` (the client), `lease.rs` (the lease keeper, naming, roll locks),
//! `control.rs` (control records and placement), `admin.rs`, `roll.rs`, `publish.rs`
//! (`publish/plan.rs`), `rpc.rs`, `health.rs` (the model health detector),
//! `model_state.rs` (the model state in etcd); `testing.rs` (a test etcd, behind the
//! `test-harness` feature).
//!
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
//! - Model health (spec `ekko.md` §6): [`health`] judges a model from per-window rates of
//!   its live and baseline variants ([`RatioDetector`], behind the [`Detector`] trait) and
//!   keeps its corrupted intervals, from which a witness chooses the `t_max` it flushes its
//!   logs up to. Pure: no I/O, times come in as milliseconds.
//! - Model state: one [`ModelState`] record per model at `/embstore/model/{model}/state`
//!   (JSON): the last confident decision and its time, each witness's `t_max`, the corrupted
//!   intervals, the rollback flag and where traffic goes instead. [`put_state`] writes a
//!   decision only if its time is later than the stored one; [`record_t_max`] only raises a
//!   witness's `t_max`; [`begin_rollback`] refuses a second rollback of a model (`Locked`).
//!   All by compare-and-swap.
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

mod control;
pub mod health;
mod lease;
mod model_state;

pub use admin::{admin, AdminCall};
pub use control::{
    assign, control, controls, least_loaded, loads, put_control, repair, Control, Roll, RollState,
};
pub use etcd::{Etcd, Kv};
pub use health::{
    Decision, Detector, DetectorConfig, Health, Interval, RatioDetector, Report, Variant, Verdict,
};
pub use lease::{
    members, register, register_under, roll_lock, LeaseKeeper, Registration, RollLock,
};
pub use model_state::{
    begin_rollback, end_rollback, get_state, list_models, put_state, record_t_max, ModelState,
};
pub use publish::{publish, shards_for, Publish};
pub use roll::{roll, RollPlan};

/// Where live servers register: `NAMING + instance` → the address clients dial.
pub const NAMING: &str = "/embstore/naming/";
/// Per-table control records: `CONTROL + table` → [`Control`] as JSON.
pub const CONTROL: &str = "/embstore/control/";
/// Per-table roll locks: `ROLL_LOCK + table` → the coordinator's name, under its lease.
pub const ROLL_LOCK: &str = "/embstore/roll-lock/";
/// Per-model state: `MODEL + model + "/state"` → [`ModelState`] as JSON.
pub const MODEL: &str = "/embstore/model/";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{free_port, TestEtcd};
    use embstore_common::ErrorKind;
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

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
