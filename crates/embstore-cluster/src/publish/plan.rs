//! Publish's planning, a pure function of what was read before the roll ([`plan`]): the next
//! version, its shard and replica counts, the assignment (kept and repaired, or fresh), and the
//! spare column. Nothing here reads etcd or a checkpoint, so every branch is unit-tested.
//!
//! - **Version**: one past every version recorded (served, or the target of the last roll,
//!   which may have failed).
//! - **Shards**: as asked; else from the checkpoint's size and the maximum shard size; else
//!   (the size unknown) the current count; a new table of unknown size is refused.
//! - **Replicas**: as asked; else as now; else 2.
//! - **Assignment**: the same shape keeps the current one, with dead servers' slots repaired;
//!   a new table or a new shape gets a fresh one.
//! - **Spare column**: only with an old version to keep serving at full capacity; per shard,
//!   the least loaded live server holding no replica of it; none at all when one shard has no
//!   such server.

use std::collections::HashMap;

use embstore_common::{Error, ErrorKind, Result};

use super::{shards_for, Publish};
use crate::{assign, least_loaded, repair, Control};

/// What a publish does, decided before it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishPlan {
    /// The version to serve.
    pub version: u64,
    pub num_shards: u32,
    pub replicas: u32,
    /// `assignment[s][r]`: the instance that will hold replica `r` of shard `s`.
    pub assignment: Vec<Vec<String>>,
    /// `columns[r][s]`: the same slots, column by column as the roll moves them.
    pub columns: Vec<Vec<String>>,
    /// `spare[s]`: the instance holding shard `s` of the new version while the columns move
    /// (empty: no spare column).
    pub spare: Vec<String>,
    /// Lines for the progress report, in the order they were decided (a kept shard count,
    /// repaired slots, a missing spare column).
    pub notes: Vec<String>,
}

/// Plans publishing `p` over `old` (the table's control record; a default one for a new
/// table), the `live` instances, and `load` (slots each instance holds for other tables).
/// Fails with `InvalidArgument` for a shard count that is not a power of two or a new table
/// whose size is unknown, and `Unavailable` when fewer servers are live than replicas asked.
pub fn plan(
    old: &Control,
    live: &[String],
    mut load: HashMap<String, usize>,
    p: &Publish,
) -> Result<PublishPlan> {
    let mut notes = Vec::new();
    let num_shards = shard_count(old, p, &mut notes)?;
    let replicas = p.replicas.or((old.replicas > 0).then_some(old.replicas)).unwrap_or(2);
    let assignment = assignment(old, num_shards, replicas, live, &mut load, &mut notes)?;
    let spare = match old.version {
        0 => Vec::new(),
        _ => spare_column(&assignment, live, &mut load, &mut notes),
    };
    let columns = (0..replicas as usize)
        .map(|r| assignment.iter().map(|shard| shard[r].clone()).collect())
        .collect();
    Ok(PublishPlan {
        version: next_version(old),
        num_shards,
        replicas,
        assignment,
        columns,
        spare,
        notes,
    })
}

/// One past every version `old` records: the one served and the last roll's target (a failed
/// roll's servers may still hold its version).
fn next_version(old: &Control) -> u64 {
    let recorded = old.roll.as_ref().map_or(0, |r| r.to_version);
    old.version.max(recorded) + 1
}

/// The new version's shard count (see the module docs).
fn shard_count(old: &Control, p: &Publish, notes: &mut Vec<String>) -> Result<u32> {
    match (p.num_shards, &p.checkpoint_bytes) {
        (Some(n), _) if n == 0 || !n.is_power_of_two() => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("the shard count must be a power of two, got {n}"),
        )),
        (Some(n), _) => Ok(n),
        (None, Some(Ok(bytes))) => Ok(shards_for(*bytes, p.max_shard_bytes)),
        (None, Some(Err(e))) if old.num_shards > 0 => {
            notes.push(format!(
                "cannot size the checkpoint here ({e}); keeping {} shards",
                old.num_shards
            ));
            Ok(old.num_shards)
        }
        // A new table whose checkpoint cannot be read: the read's own error.
        (None, Some(Err(e))) => Err(e.clone()),
        (None, None) if old.num_shards > 0 => {
            notes.push(format!("the checkpoint was not sized; keeping {} shards", old.num_shards));
            Ok(old.num_shards)
        }
        (None, None) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "table '{}' is new and its checkpoint was not sized: give the shard count \
                 (num_shards, --shards)",
                p.table
            ),
        )),
    }
}

/// The new version's assignment: `old`'s with dead servers' slots repaired when the shape is
/// the same, else a fresh one. `load` gains the slots given.
fn assignment(
    old: &Control,
    num_shards: u32,
    replicas: u32,
    live: &[String],
    load: &mut HashMap<String, usize>,
    notes: &mut Vec<String>,
) -> Result<Vec<Vec<String>>> {
    let same_shape = old.num_shards == num_shards
        && old.replicas == replicas
        && old.assignment.len() == num_shards as usize;
    if !same_shape {
        return assign(num_shards, replicas, live, load);
    }
    let mut a = old.assignment.clone();
    for i in a.iter().flatten() {
        *load.entry(i.clone()).or_insert(0) += 1;
    }
    for (s, r, to) in repair(old, live, load) {
        notes.push(format!("shard {s} replica {r}: {} is gone, {to} takes it", a[s][r]));
        a[s][r] = to;
    }
    Ok(a)
}

/// Per shard of `assignment`, the least loaded live instance holding no replica of it; empty
/// (with a note) when some shard has none. `load` gains the spare slots.
fn spare_column(
    assignment: &[Vec<String>],
    live: &[String],
    load: &mut HashMap<String, usize>,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let mut spare = Vec::new();
    for shard in assignment {
        let Some(i) = least_loaded(live, load, shard).cloned() else {
            notes.push(
                "no server is free for a spare column: capacity drops by one replica while a \
                 column moves"
                    .to_string(),
            );
            return Vec::new();
        };
        *load.entry(i.clone()).or_insert(0) += 1;
        spare.push(i);
    }
    spare
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Roll, RollState};

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|x| x.to_string()).collect()
    }

    /// A request whose checkpoint could not be read where it was sized.
    fn unreadable(num_shards: Option<u32>) -> Publish {
        let e = Error::new(ErrorKind::NotFound, "no checkpoint at /ckpt/2");
        Publish { checkpoint_bytes: Some(Err(e)), ..request(num_shards, None) }
    }

    fn request(num_shards: Option<u32>, checkpoint_bytes: Option<u64>) -> Publish {
        let checkpoint_bytes = checkpoint_bytes.map(Ok);
        Publish {
            table: "user".into(),
            checkpoint: "/ckpt/2".into(),
            num_shards,
            checkpoint_bytes,
            max_shard_bytes: 100,
            replicas: None,
            coordinator: "test".into(),
            drain_quiet: Duration::ZERO,
            drain_max: Duration::ZERO,
            load_timeout: Duration::ZERO,
            token: None,
            tls: None,
        }
    }

    /// The record of `version` served with `assignment[s][r]`.
    fn served(version: u64, assignment: &[&[&str]]) -> Control {
        Control {
            table: "user".into(),
            version,
            num_shards: assignment.len() as u32,
            replicas: assignment[0].len() as u32,
            checkpoint: "/ckpt/1".into(),
            assignment: assignment.iter().map(|s| names(s)).collect(),
            roll: None,
        }
    }

    fn columns_of(a: &[Vec<String>]) -> Vec<Vec<String>> {
        (0..a[0].len()).map(|r| a.iter().map(|s| s[r].clone()).collect()).collect()
    }

    #[test]
    fn a_new_table_gets_version_one_a_fresh_assignment_and_no_spare() {
        let old = Control { table: "user".into(), ..Default::default() };
        let live = names(&["a", "b", "c"]);
        let got = plan(&old, &live, HashMap::new(), &request(Some(2), None)).unwrap();
        assert_eq!((got.version, got.num_shards, got.replicas), (1, 2, 2));
        // Replica by replica over the least loaded, then the smallest name.
        assert_eq!(got.assignment, vec![names(&["a", "c"]), names(&["b", "a"])]);
        assert_eq!(got.columns, columns_of(&got.assignment));
        assert!(got.spare.is_empty(), "no old version to keep serving: {:?}", got.spare);
        assert!(got.notes.is_empty(), "{:?}", got.notes);
    }

    #[test]
    fn a_new_table_is_sized_from_its_checkpoint_and_refused_when_it_cannot_be() {
        let old = Control { table: "user".into(), ..Default::default() };
        let live = names(&["a", "b"]);
        // 250 bytes in shards of at most 100: 3, rounded up to a power of two.
        let got = plan(&old, &live, HashMap::new(), &request(None, Some(250))).unwrap();
        assert_eq!(got.num_shards, 4);
        assert_eq!(got.assignment.len(), 4);
        let e = plan(&old, &live, HashMap::new(), &request(None, None)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("give the shard count"), "{e}");
        // A checkpoint that cannot be read: the read's own error, kind and message.
        let e = plan(&old, &live, HashMap::new(), &unreadable(None)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(e.to_string(), "no checkpoint at /ckpt/2");
    }

    #[test]
    fn an_unreadable_checkpoint_keeps_the_shard_count() {
        let old = served(2, &[&["a", "b"], &["b", "a"]]);
        let live = names(&["a", "b"]);
        let got = plan(&old, &live, HashMap::new(), &unreadable(None)).unwrap();
        assert_eq!((got.version, got.num_shards, got.replicas), (3, 2, 2));
        assert_eq!(got.assignment, old.assignment, "the same shape keeps the assignment");
        assert_eq!(
            got.notes[0],
            "cannot size the checkpoint here (no checkpoint at /ckpt/2); keeping 2 shards"
        );
        let got = plan(&old, &live, HashMap::new(), &request(None, None)).unwrap();
        assert_eq!(got.num_shards, 2);
        assert_eq!(got.notes[0], "the checkpoint was not sized; keeping 2 shards");
        // A size that is known wins over the current count.
        let got = plan(&old, &live, HashMap::new(), &request(None, Some(50))).unwrap();
        assert_eq!(got.num_shards, 1);
    }

    #[test]
    fn a_new_shape_gets_a_fresh_assignment_and_a_spare_column() {
        let old = served(3, &[&["a", "b"], &["b", "a"]]);
        let live = names(&["a", "b", "c", "d"]);
        let got = plan(&old, &live, HashMap::new(), &request(Some(4), None)).unwrap();
        assert_eq!((got.version, got.num_shards, got.replicas), (4, 4, 2));
        // Fresh: two replicas per shard on two servers, two slots per server.
        assert_eq!(got.assignment.len(), 4);
        let mut per_server: HashMap<&String, usize> = HashMap::new();
        for shard in &got.assignment {
            assert!(shard.len() == 2 && shard[0] != shard[1], "{shard:?}");
            for i in shard {
                *per_server.entry(i).or_default() += 1;
            }
        }
        assert!(per_server.values().all(|&n| n == 2), "{per_server:?}");
        // A spare per shard, on a server holding no replica of it.
        assert_eq!(got.spare.len(), 4);
        for (shard, spare) in got.assignment.iter().zip(&got.spare) {
            assert!(!shard.contains(spare), "spare {spare} of {shard:?}");
        }
        assert!(got.notes.is_empty(), "{:?}", got.notes);
    }

    #[test]
    fn the_same_shape_repairs_the_slots_of_dead_servers() {
        let old = served(3, &[&["a", "b"], &["c", "a"]]);
        // b is gone; d holds nothing, so it takes b's slot.
        let live = names(&["a", "c", "d"]);
        let got = plan(&old, &live, HashMap::new(), &request(Some(2), None)).unwrap();
        assert_eq!(got.version, 4);
        assert_eq!(got.assignment, vec![names(&["a", "d"]), names(&["c", "a"])]);
        assert_eq!(got.columns, vec![names(&["a", "c"]), names(&["d", "a"])]);
        assert_eq!(got.notes, ["shard 0 replica 1: b is gone, d takes it"]);
    }

    #[test]
    fn the_spare_column_takes_the_least_loaded_server_free_of_each_shard() {
        let old = served(1, &[&["a"], &["b"]]);
        let live = names(&["a", "b", "c"]);
        // c holds five slots of other tables: a and b are less loaded.
        let load = HashMap::from([("c".to_string(), 5)]);
        let got = plan(&old, &live, load, &request(Some(2), None)).unwrap();
        assert_eq!(got.spare, names(&["b", "a"]));
        assert_eq!(got.replicas, 1, "replicas as now");
        // Without other load, c is the least loaded free server of both shards, once each:
        // the first spare raises its load to that of a and b.
        let got = plan(&old, &live, HashMap::new(), &request(Some(2), None)).unwrap();
        assert_eq!(got.spare, names(&["c", "a"]));
    }

    #[test]
    fn no_spare_column_when_a_shard_has_no_free_server() {
        let old = served(1, &[&["a", "b"]]);
        let live = names(&["a", "b"]);
        let got = plan(&old, &live, HashMap::new(), &request(Some(1), None)).unwrap();
        assert!(got.spare.is_empty(), "{:?}", got.spare);
        assert_eq!(got.notes.len(), 1);
        assert!(
            got.notes[0].starts_with("no server is free for a spare column"),
            "{:?}",
            got.notes
        );
    }

    #[test]
    fn the_next_version_passes_the_last_rolls_target() {
        let mut old = served(3, &[&["a"]]);
        old.roll = Some(Roll { to_version: 5, state: RollState::Failed, ..Default::default() });
        let got = plan(&old, &names(&["a", "b"]), HashMap::new(), &request(None, None)).unwrap();
        assert_eq!(got.version, 6);
    }

    #[test]
    fn bad_shard_counts_and_too_few_servers_are_refused() {
        let old = Control { table: "user".into(), ..Default::default() };
        let live = names(&["a", "b"]);
        for n in [0, 3, 6] {
            let e = plan(&old, &live, HashMap::new(), &request(Some(n), None)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{n}: {e}");
        }
        let three = Publish { replicas: Some(3), ..request(Some(1), None) };
        let e = plan(&old, &live, HashMap::new(), &three).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    }
}
