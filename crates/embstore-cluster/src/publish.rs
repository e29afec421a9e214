//! `publish` over a cluster in etcd: the roll of docs/serving.md with the layout read from, and
//! the progress recorded in, the table's control record.
//!
//! 1. Take the table's roll lock (one coordinator at a time; it expires with the coordinator).
//! 2. Read the control record and the live servers, and plan ([`plan`], a pure function of
//!    them and the request). The next version is one past every version
//!    recorded; its shard count is given, or follows from the checkpoint's size (measured by
//!    the caller, [`Publish::checkpoint_bytes`]) and the maximum shard size; the assignment is
//!    the current one with dead servers' slots repaired (or a fresh one for a new table or a
//!    new shape); the spare column is, per shard, the least loaded live server holding no
//!    replica of that shard.
//! 3. Record the roll as running, run it ([`roll`](fn@crate::roll)), recording each step.
//! 4. On success the record names the new version, its checkpoint and assignment; on failure
//!    the roll is recorded failed with its error, the version served stays the old one, and
//!    the servers restore what the roll took from them (they reload the recorded version).
//! 5. Each server drops, once they are quiet, the table's versions other than the one now
//!    served (leftovers of a failed roll; see `embstore_server::member`).

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use embstore_common::{now_ms, Error, ErrorKind, Result};
use parking_lot::Mutex;

use crate::roll::{roll, RollPlan};
use crate::rpc::ClientTls;
use crate::{controls, loads, members, put_control, roll_lock, Control, Etcd, Roll, RollState};

mod plan;

use plan::{plan, PublishPlan};

/// What to publish, and how.
#[derive(Clone, Debug)]
pub struct Publish {
    pub table: String,
    /// The checkpoint to serve (a path on the servers).
    pub checkpoint: String,
    /// The new version's shard count (a power of two); `None`: from `checkpoint_bytes` and
    /// `max_shard_bytes`, or the current count if the checkpoint's size is unknown.
    pub num_shards: Option<u32>,
    /// The bytes of the table in the checkpoint as the caller measured them (the table crate's
    /// `checkpoint_table_bytes`: the control plane does not read checkpoints): `Err` when the
    /// checkpoint could not be read there, `None` when it was not measured (a shard count is
    /// given).
    pub checkpoint_bytes: Option<Result<u64>>,
    /// The largest shard an automatic shard count allows.
    pub max_shard_bytes: u64,
    /// Replicas per shard; `None`: as now, or 2 for a new table.
    pub replicas: Option<u32>,
    /// Who coordinates (named in the lock and the record).
    pub coordinator: String,
    pub drain_quiet: Duration,
    pub drain_max: Duration,
    pub load_timeout: Duration,
    /// The admin token, if the servers ask for one.
    pub token: Option<String>,
    pub tls: Option<ClientTls>,
}

/// The shard count of a table of `bytes` with shards of at most `max_shard_bytes`: the least
/// power of two that fits, at least 1.
pub fn shards_for(bytes: u64, max_shard_bytes: u64) -> u32 {
    let need = bytes.div_ceil(max_shard_bytes.max(1)).max(1);
    need.next_power_of_two().min(1 << 16) as u32
}

/// Publishes `p` (see the module docs); returns the version now served. Fails with `Locked`
/// while another roll of the table runs, `Unavailable` when etcd or too many servers are away,
/// and with the failed step's error (the old version still served) otherwise.
pub async fn publish(etcd: Arc<Etcd>, p: &Publish, mut progress: impl FnMut(&str)) -> Result<u64> {
    let lock = roll_lock(etcd.clone(), &p.table, &p.coordinator, Duration::from_secs(10)).await?;
    let result = run(&etcd, p, &mut progress).await;
    lock.release().await;
    result
}

/// Under the roll lock: read the state, plan, record the roll as running, run it, record how
/// it ended.
async fn run(etcd: &Arc<Etcd>, p: &Publish, progress: &mut impl FnMut(&str)) -> Result<u64> {
    let state = State::read(etcd, &p.table).await?;
    let planned = plan(&state.old, &state.instances(), state.load.clone(), p)?;
    for note in &planned.notes {
        progress(note);
    }
    let record = start(etcd, p, &state, &planned).await?;
    progress(&format!(
        "table '{}': version {} -> {}, {} shards x {} replicas, spare column {:?}",
        p.table,
        state.old.version,
        planned.version,
        planned.num_shards,
        planned.replicas,
        planned.spare
    ));
    let (outcome, step) =
        roll_recorded(etcd, &record, &state.roll_plan(p, &planned), progress).await;
    finish(etcd, p, record, &planned, step, &outcome).await?;
    outcome.map(|()| planned.version)
}

/// What a publish reads before it plans.
#[derive(Debug)]
struct State {
    /// The table's control record (a default one for a new table) and its revision (0: none),
    /// which the roll's first write compares against.
    old: Control,
    revision: i64,
    /// The live servers: (instance, address).
    live: Vec<(String, String)>,
    /// Slots each instance holds for the other tables.
    load: HashMap<String, usize>,
}

impl State {
    async fn read(etcd: &Etcd, table: &str) -> Result<Self> {
        let live = members(etcd).await?;
        let all = controls(etcd).await?;
        let (old, revision) = all
            .iter()
            .find(|(c, _)| c.table == table)
            .cloned()
            .unwrap_or_else(|| (Control { table: table.to_string(), ..Default::default() }, 0));
        let load = loads(all.iter().filter(|(c, _)| c.table != table).map(|(c, _)| c));
        Ok(Self { old, revision, live, load })
    }

    /// The live instances' names.
    fn instances(&self) -> Vec<String> {
        self.live.iter().map(|(i, _)| i.clone()).collect()
    }

    /// The address clients dial for `instance` (its name, if it is not live).
    fn addr(&self, instance: &str) -> String {
        self.live
            .iter()
            .find(|(i, _)| i == instance)
            .map_or(instance.to_string(), |(_, a)| a.clone())
    }

    /// The roll that carries out `planned`, over the servers' addresses.
    fn roll_plan(&self, p: &Publish, planned: &PublishPlan) -> RollPlan {
        let old = (self.old.version > 0).then_some(self.old.version);
        let addrs = |instances: &[String]| instances.iter().map(|i| self.addr(i)).collect();
        RollPlan {
            table: p.table.clone(),
            version: planned.version,
            checkpoint: p.checkpoint.clone(),
            old_version: old,
            old_num_shards: old.map(|_| self.old.num_shards),
            columns: planned.columns.iter().map(|c| addrs(c)).collect(),
            spare: addrs(&planned.spare),
            drain_quiet: p.drain_quiet,
            drain_max: p.drain_max,
            load_timeout: p.load_timeout,
            token: p.token.clone(),
            tls: p.tls.clone(),
        }
    }
}

/// Records the roll as running (compare-and-swap against the record read); returns the
/// record. Fails with `Locked` if the record changed since.
async fn start(etcd: &Etcd, p: &Publish, state: &State, planned: &PublishPlan) -> Result<Control> {
    let started = now_ms();
    let mut record = state.old.clone();
    record.roll = Some(Roll {
        from_version: state.old.version,
        to_version: planned.version,
        checkpoint: p.checkpoint.clone(),
        num_shards: planned.num_shards,
        columns: planned.columns.clone(),
        spare: planned.spare.clone(),
        state: RollState::Running,
        step: "started".into(),
        coordinator: p.coordinator.clone(),
        started_ms: started,
        updated_ms: started,
        error: String::new(),
    });
    if !put_control(etcd, &record, state.revision).await? {
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "the control record of table '{}' changed while the roll started; try again",
                p.table
            ),
        ));
    }
    Ok(record)
}

/// Runs `plan`, passing each step to `progress` and, from a task every 500 ms, to `record` in
/// etcd (so that the roll never waits on etcd); returns how it ended and its last step.
async fn roll_recorded(
    etcd: &Arc<Etcd>,
    record: &Control,
    plan: &RollPlan,
    progress: &mut impl FnMut(&str),
) -> (Result<()>, String) {
    let step = Arc::new(Mutex::new(String::new()));
    let recorder = {
        let (etcd, step, mut record) = (etcd.clone(), step.clone(), record.clone());
        tokio::spawn(async move {
            let mut written = String::new();
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let now = step.lock().clone();
                if now != written {
                    if let Some(r) = record.roll.as_mut() {
                        r.step = now.clone();
                        r.updated_ms = now_ms();
                    }
                    let key = format!("{}{}", crate::CONTROL, record.table);
                    if etcd.put(&key, &record.to_json(), 0).await.is_ok() {
                        written = now;
                    }
                }
            }
        })
    };
    let outcome = roll(plan, |line| {
        *step.lock() = line.to_string();
        progress(line);
    })
    .await;
    recorder.abort();
    let last = step.lock().clone();
    (outcome, last)
}

/// Records how the roll ended: on success the record names the new version, its checkpoint
/// and assignment; on failure the roll is marked failed with its error and the version served
/// stays the old one.
async fn finish(
    etcd: &Etcd,
    p: &Publish,
    record: Control,
    planned: &PublishPlan,
    step: String,
    outcome: &Result<()>,
) -> Result<()> {
    let mut done = record;
    let r = done.roll.as_mut().expect("set when the roll started");
    r.step = step;
    r.updated_ms = now_ms();
    match outcome {
        Ok(()) => {
            r.state = RollState::Done;
            done.version = planned.version;
            done.num_shards = planned.num_shards;
            done.replicas = planned.replicas;
            done.checkpoint = p.checkpoint.clone();
            done.assignment = planned.assignment.clone();
        }
        Err(e) => {
            r.state = RollState::Failed;
            r.error = e.to_string();
        }
    }
    let key = format!("{}{}", crate::CONTROL, p.table);
    etcd.put(&key, &done.to_json(), 0).await
}
