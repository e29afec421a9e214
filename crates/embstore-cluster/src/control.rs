//! Per-table control records and placement: [`Control`] (JSON at `CONTROL + table`, written
//! by compare-and-swap only) with its [`Roll`], and the deterministic [`assign`] / [`repair`]
//! every server computes alike from the same facts.

use std::collections::HashMap;

use embstore_common::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::etcd::Etcd;
use crate::CONTROL;

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
