//! `publish` over a cluster in etcd: the roll of docs/serving.md with the layout read from, and
//! the progress recorded in, the table's control record.
//!
//! 1. Take the table's roll lock (one coordinator at a time; it expires with the coordinator).
//! 2. Read the control record and the live servers. The next version is one past every version
//!    recorded; its shard count is given, or follows from the checkpoint's size and the maximum
//!    shard size; the assignment is the current one with dead servers' slots repaired (or a
//!    fresh one for a new table or a new shape); the spare column is, per shard, the least
//!    loaded live server holding no replica of that shard.
//! 3. Record the roll as running, run it ([`crate::roll`]), recording each step.
//! 4. On success the record names the new version, its checkpoint and assignment; on failure
//!    the roll is recorded failed with its error, the version served stays the old one, and
//!    the servers restore what the roll took from them (they reload the recorded version).
//! 5. Each server drops, once they are quiet, the table's versions other than the one now
//!    served (leftovers of a failed roll; see `embstore_server::member`).

use std::sync::Arc;
use std::time::Duration;

use embstore_cluster::{
    assign, controls, least_loaded, loads, members, put_control, repair, roll_lock, Control, Etcd,
    Roll, RollState,
};
use embstore_common::{now_ms, Error, ErrorKind, Result};
use parking_lot::Mutex;

use crate::{roll, ClientTls, RollPlan};

/// What to publish, and how.
#[derive(Clone, Debug)]
pub struct Publish {
    pub table: String,
    /// The checkpoint to serve (a path on the servers).
    pub checkpoint: String,
    /// The new version's shard count (a power of two); `None`: from the checkpoint's size and
    /// `max_shard_bytes`, or the current count if the checkpoint cannot be read here.
    pub num_shards: Option<u32>,
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

async fn run(etcd: &Arc<Etcd>, p: &Publish, progress: &mut impl FnMut(&str)) -> Result<u64> {
    if let Some(n) = p.num_shards {
        if n == 0 || !n.is_power_of_two() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("the shard count must be a power of two, got {n}"),
            ));
        }
    }
    let live: Vec<(String, String)> = members(etcd).await?;
    let names: Vec<String> = live.iter().map(|(i, _)| i.clone()).collect();
    let addr = |instance: &str| {
        live.iter().find(|(i, _)| i == instance).map_or(instance.to_string(), |(_, a)| a.clone())
    };
    let all = controls(etcd).await?;
    let (old, revision) = all
        .iter()
        .find(|(c, _)| c.table == p.table)
        .cloned()
        .unwrap_or_else(|| (Control { table: p.table.clone(), ..Default::default() }, 0));
    let mut load = loads(all.iter().filter(|(c, _)| c.table != p.table).map(|(c, _)| c));
    let recorded = old.roll.as_ref().map_or(0, |r| r.to_version);
    let version = old.version.max(recorded) + 1;
    let num_shards = match p.num_shards {
        Some(n) => n,
        None => match embstore_table::checkpoint_table_bytes(
            std::path::Path::new(&p.checkpoint),
            &p.table,
        ) {
            Ok(bytes) => shards_for(bytes, p.max_shard_bytes),
            Err(e) if old.num_shards > 0 => {
                progress(&format!(
                    "cannot size the checkpoint here ({e}); keeping {} shards",
                    old.num_shards
                ));
                old.num_shards
            }
            Err(e) => return Err(e),
        },
    };
    // Replicas: as asked, else as now, else 2 (a new table).
    let replicas = p.replicas.or((old.replicas > 0).then_some(old.replicas)).unwrap_or(2);
    let same_shape = old.num_shards == num_shards
        && old.replicas == replicas
        && old.assignment.len() == num_shards as usize;
    let assignment = if same_shape {
        let mut a = old.assignment.clone();
        for i in a.iter().flatten() {
            *load.entry(i.clone()).or_insert(0) += 1;
        }
        for (s, r, to) in repair(&old, &names, &mut load) {
            progress(&format!("shard {s} replica {r}: {} is gone, {to} takes it", a[s][r]));
            a[s][r] = to;
        }
        a
    } else {
        assign(num_shards, replicas, &names, &mut load)?
    };
    let columns: Vec<Vec<String>> = (0..replicas as usize)
        .map(|r| assignment.iter().map(|shard| shard[r].clone()).collect())
        .collect();
    // A spare column only when there is an old version to keep serving at full capacity.
    let mut spare = Vec::new();
    if old.version > 0 {
        for shard in &assignment {
            match least_loaded(&names, &load, shard).cloned() {
                Some(i) => {
                    *load.entry(i.clone()).or_insert(0) += 1;
                    spare.push(i);
                }
                None => {
                    progress("no server is free for a spare column: capacity drops by one replica while a column moves");
                    spare.clear();
                    break;
                }
            }
        }
    }
    let started = now_ms();
    let mut record = old.clone();
    record.roll = Some(Roll {
        from_version: old.version,
        to_version: version,
        checkpoint: p.checkpoint.clone(),
        num_shards,
        columns: columns.clone(),
        spare: spare.clone(),
        state: RollState::Running,
        step: "started".into(),
        coordinator: p.coordinator.clone(),
        started_ms: started,
        updated_ms: started,
        error: String::new(),
    });
    if !put_control(etcd, &record, revision).await? {
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "the control record of table '{}' changed while the roll started; try again",
                p.table
            ),
        ));
    }
    progress(&format!(
        "table '{}': version {} -> {version}, {num_shards} shards x {replicas} replicas, spare column {:?}",
        p.table, old.version, spare
    ));
    let plan = RollPlan {
        table: p.table.clone(),
        version,
        checkpoint: p.checkpoint.clone(),
        old_version: (old.version > 0).then_some(old.version),
        old_num_shards: (old.version > 0).then_some(old.num_shards),
        columns: columns.iter().map(|c| c.iter().map(|i| addr(i)).collect()).collect(),
        spare: spare.iter().map(|i| addr(i)).collect(),
        drain_quiet: p.drain_quiet,
        drain_max: p.drain_max,
        load_timeout: p.load_timeout,
        token: p.token.clone(),
        tls: p.tls.clone(),
    };
    // Steps go to etcd from a task, so that the roll never waits on etcd.
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
                    let key = format!("{}{}", embstore_cluster::CONTROL, record.table);
                    if etcd.put(&key, &record.to_json(), 0).await.is_ok() {
                        written = now;
                    }
                }
            }
        })
    };
    let outcome = roll(&plan, |line| {
        *step.lock() = line.to_string();
        progress(line);
    })
    .await;
    recorder.abort();
    let mut done = record.clone();
    let r = done.roll.as_mut().expect("set above");
    r.step = step.lock().clone();
    r.updated_ms = now_ms();
    match &outcome {
        Ok(()) => {
            r.state = RollState::Done;
            done.version = version;
            done.num_shards = num_shards;
            done.replicas = replicas;
            done.checkpoint = p.checkpoint.clone();
            done.assignment = assignment;
        }
        Err(e) => {
            r.state = RollState::Failed;
            r.error = e.to_string();
        }
    }
    let key = format!("{}{}", embstore_cluster::CONTROL, p.table);
    etcd.put(&key, &done.to_json(), 0).await?;
    outcome.map(|()| version)
}
