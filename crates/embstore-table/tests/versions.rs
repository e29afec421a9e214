//! Versions in write order: a row's version is drawn inside its shard's write lock, so that in
//! every shard the order of versions is the order of writes. A reader that has seen a shard's
//! rows up to version `V` (as a replica that pulls "rows newer than V" has) then finds every
//! later write of that shard above `V`. When a call drew its version before taking the lock,
//! two concurrent writers could land in the other order, and the older version arrived after a
//! reader had moved past it: an update such a pull never ships.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_table::{Optimizer, RowMeta, Table, TableConfig};

const IDS: u64 = 64;
const DIM: usize = 4;

/// Every row's version, read under one shard lock (one shard, one chunk).
fn snapshot(table: &Table) -> HashMap<u64, RowMeta> {
    let mut out = HashMap::new();
    for chunk in table.export(usize::MAX) {
        out.extend(chunk.ids.iter().copied().zip(chunk.meta.iter().copied()));
    }
    out
}

/// Runs `writers` threads that each call `write` with a small batch of ids, and a reader that
/// takes snapshots; returns the first write found below a version an earlier snapshot had seen.
fn first_late_write(
    table: Arc<Table>,
    writers: usize,
    write: fn(&Table, &[u64], u64),
) -> Option<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && n < 2_000_000 {
                    let a = (n * 7 + w as u64 * 13) % IDS;
                    write(&table, &[a, (a + 1) % IDS], n);
                    n += 1;
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut found = None;
    let mut before = snapshot(&table);
    let mut rounds = 0;
    while found.is_none() && Instant::now() < deadline && rounds < 200_000 {
        let after = snapshot(&table);
        let seen = before.values().map(|m| m.version).max().unwrap();
        for (id, m) in &after {
            if m.update_count != before[id].update_count && m.version <= seen {
                found = Some(format!(
                    "id {id}: written after a reader saw version {seen:?}, with the older \
                     version {:?} (round {rounds})",
                    m.version
                ));
            }
        }
        before = after;
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    handles.into_iter().for_each(|h| h.join().unwrap());
    found
}

fn table() -> Arc<Table> {
    let config =
        TableConfig::new("t", DIM).with_optimizer(Optimizer::Sgd { lr: 0.01 }).with_shards(1);
    let table = Table::new(config).unwrap();
    let ids: Vec<u64> = (0..IDS).collect();
    table.assign(&ids, &vec![0.0; ids.len() * DIM]).unwrap();
    Arc::new(table)
}

#[test]
fn apply_gradients_lands_in_version_order_in_every_shard() {
    let late = first_late_write(table(), 3, |t, ids, _| {
        t.apply_gradients(ids, &vec![1e-3; ids.len() * DIM], None).unwrap();
    });
    assert_eq!(late, None);
}

#[test]
fn assign_lands_in_version_order_in_every_shard() {
    let late = first_late_write(table(), 3, |t, ids, n| {
        t.assign(ids, &vec![n as f32; ids.len() * DIM]).unwrap();
    });
    assert_eq!(late, None);
}
