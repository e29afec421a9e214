//! Prioritised sync in a table: a source that scores its writes marks the top share
//! significant; a follower's prioritised pull takes only those rows, ahead of the rest, into its
//! significant store, which its lookups read; normal sync then supersedes every entry (P2) and
//! the follower holds the source's rows. Off (a rollback), prioritised pulls are refused both
//! ways and the significant stores are empty (P4).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_replication::{EkkoPriority, PriorityConfig};
use embstore_table::sync::Priority;
use embstore_table::{ErrorKind, OnMiss, Store, Table, TableConfig};

const D: usize = 4;
const PARTS: u32 = 16;

fn syncing(replica: u32) -> (Store, Arc<Table>) {
    common::syncing(replica, D, PARTS)
}

fn prioritise(t: &Table, k: f64) {
    let p = Priority { config: PriorityConfig::with_k(k), rule: Arc::new(EkkoPriority), model: 0 };
    t.set_priority(Some(p)).unwrap();
}

fn normal_sync(src: &Table, dst: &Table) {
    common::sync_all(src, dst)
}

fn prioritised_sync(src: &Table, dst: &Table) -> usize {
    (0..PARTS)
        .map(|p| {
            let tsvv = dst.sync_significant_knowledge(p).unwrap().1;
            let reply = src.sync_pull_prioritised(p, &tsvv).unwrap();
            dst.sync_apply_prioritised(&reply).unwrap()
        })
        .sum()
}

fn read(t: &Table, ids: &[u64]) -> (Vec<f32>, Vec<bool>) {
    let mut out = vec![0.0; ids.len() * D];
    let mut found = vec![false; ids.len()];
    t.lookup(ids, OnMiss::Zeros, &mut out, Some(&mut found)).unwrap();
    (out, found)
}

/// Gradients whose 1-norm grows with the id, so the top ids are the significant ones.
fn grads(ids: &[u64], scale: f32) -> Vec<f32> {
    ids.iter().flat_map(|&i| vec![scale * (1.0 + (i % 1000) as f32 / 100.0); D]).collect()
}

#[test]
fn significant_rows_go_ahead_and_normal_sync_supersedes_them() {
    let (_s, src) = syncing(1);
    let (_f, dst) = syncing(2);
    prioritise(&src, 90.0);
    let ids: Vec<u64> = (0..2_000).collect();
    // Two rounds of writes: the threshold is known from the first.
    for _ in 0..2 {
        for chunk in ids.chunks(250) {
            src.apply_gradients(chunk, &grads(chunk, 0.01), None).unwrap();
        }
    }
    let stats = src.priority_stats().unwrap();
    assert_eq!(stats.scored, 4_000);
    let share = stats.significant as f64 / stats.scored as f64;
    // The window fills during these writes: the share is near, not at, 10 %.
    assert!(share > 0.05 && share < 0.3, "{stats:?}");

    let taken = prioritised_sync(&src, &dst);
    assert!(taken > 0 && taken < ids.len() / 2, "{taken} rows taken ahead of 2,000");
    assert_eq!(dst.len(), 0, "nothing reached the store yet");
    assert_eq!(dst.priority_stats().unwrap().k, None, "the follower does not score");
    // Its lookups read the entries: exactly the source's values for the rows taken.
    let (want, _) = read(&src, &ids);
    let (got, found) = read(&dst, &ids);
    let mut hits = 0;
    for (i, f) in found.iter().enumerate() {
        if *f {
            hits += 1;
            assert_eq!(got[i * D..][..D], want[i * D..][..D], "id {i}");
        }
    }
    assert_eq!(hits, taken);
    // Nothing more to take ahead: the TSVV covers it.
    assert_eq!(prioritised_sync(&src, &dst), 0);

    normal_sync(&src, &dst);
    assert_eq!(dst.len(), ids.len());
    assert_eq!(read(&dst, &ids), read(&src, &ids));
    for p in 0..PARTS {
        let (svv, tsvv) = dst.sync_significant_knowledge(p).unwrap();
        assert!(tsvv.dominates(&svv));
        assert_eq!(svv, src.sync_significant_knowledge(p).unwrap().0, "the SVV arrived");
    }
    // P2: every entry superseded by the rows normal sync brought.
    assert_eq!(significant_entries(&dst), 0);
}

fn significant_entries(t: &Table) -> usize {
    t.priority_stats().unwrap().significant_entries
}

#[test]
fn priority_off_empties_the_significant_store_and_refuses_prioritised_pulls() {
    let (_s, src) = syncing(1);
    let (_f, dst) = syncing(2);
    prioritise(&src, 50.0);
    let ids: Vec<u64> = (0..400).collect();
    for _ in 0..3 {
        src.apply_gradients(&ids, &grads(&ids, 0.1), None).unwrap();
    }
    assert!(prioritised_sync(&src, &dst) > 0);
    assert!(significant_entries(&dst) > 0);
    dst.set_prioritised_sync(false).unwrap();
    assert_eq!(significant_entries(&dst), 0);
    for p in 0..PARTS {
        let (svv, tsvv) = dst.sync_significant_knowledge(p).unwrap();
        assert_eq!(svv, tsvv, "P4: tsvv = svv");
    }
    let tsvv = dst.sync_significant_knowledge(0).unwrap().1;
    let reply = src.sync_pull_prioritised(0, &tsvv).unwrap();
    assert_eq!(dst.sync_apply_prioritised(&reply).unwrap_err().kind(), ErrorKind::Unavailable);
    assert_eq!(dst.sync_pull_prioritised(0, &tsvv).unwrap_err().kind(), ErrorKind::Unavailable);
    assert_eq!(read(&dst, &ids).1.iter().filter(|f| **f).count(), 0);
    dst.set_prioritised_sync(true).unwrap();
    assert!(prioritised_sync(&src, &dst) > 0);
}

#[test]
fn a_bad_prioritised_reply_changes_nothing() {
    let (_s, src) = syncing(1);
    let (_f, dst) = syncing(2);
    prioritise(&src, 50.0);
    let ids: Vec<u64> = (0..400).collect();
    for _ in 0..3 {
        src.apply_gradients(&ids, &grads(&ids, 0.1), None).unwrap();
    }
    let p = (0..PARTS)
        .find(|&p| !src.sync_pull_prioritised(p, &Default::default()).unwrap().is_empty())
        .unwrap();
    let good = src.sync_pull_prioritised(p, &Default::default()).unwrap();
    let mut bad = good.clone();
    bad.sigv[0] = embstore_table::Version { timestamp: u64::MAX >> 1, replica: 1 };
    assert_eq!(dst.sync_apply_prioritised(&bad).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let mut bad = good.clone();
    bad.values[0] = f32::NAN;
    assert_eq!(dst.sync_apply_prioritised(&bad).unwrap_err().kind(), ErrorKind::NonFinite);
    let mut bad = good.clone();
    bad.sigv.pop();
    assert_eq!(dst.sync_apply_prioritised(&bad).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert_eq!(significant_entries(&dst), 0);
    assert_eq!(dst.sync_significant_knowledge(p).unwrap().1, Default::default());
    assert!(dst.sync_apply_prioritised(&good).unwrap() > 0);
}

/// A table that scores but does not sync scores nothing (and a local write supersedes an
/// entry taken ahead, P2).
#[test]
fn scoring_needs_sync_and_local_writes_supersede_entries() {
    let store = Store::with_replica(3).unwrap();
    let t = store.create_table(TableConfig::new("t", D)).unwrap();
    prioritise(&t, 90.0);
    t.apply_gradients(&[1, 2, 3], &grads(&[1, 2, 3], 0.1), None).unwrap();
    assert_eq!(t.priority_stats().unwrap().scored, 0);

    let (_s, src) = syncing(1);
    let (_f, dst) = syncing(2);
    prioritise(&src, 50.0);
    let ids: Vec<u64> = (0..400).collect();
    for _ in 0..3 {
        src.apply_gradients(&ids, &grads(&ids, 0.1), None).unwrap();
    }
    assert!(prioritised_sync(&src, &dst) > 0);
    let before = significant_entries(&dst);
    let (_, found) = read(&dst, &ids);
    let taken: Vec<u64> = ids.iter().copied().filter(|&i| found[i as usize]).collect();
    dst.apply_gradients(&taken[..1], &[0.5; D], None).unwrap();
    assert_eq!(significant_entries(&dst), before - 1);
}

/// An assignment scores by the 1-norm of its change: rows changed most are significant; an
/// import (rows with their own versions) is not scored.
#[test]
fn an_assignment_scores_by_its_change_and_an_import_is_not_scored() {
    let (_s, src) = syncing(1);
    prioritise(&src, 90.0);
    let ids: Vec<u64> = (0..1_000).collect();
    for round in 0..4 {
        // Row i changes by (i % 100 + 1) × round: the largest changes are the top ids mod 100.
        let values: Vec<f32> =
            ids.iter().flat_map(|&i| vec![((i % 100 + 1) * round) as f32; D]).collect();
        src.assign(&ids, &values).unwrap();
    }
    let s = src.priority_stats().unwrap();
    assert_eq!(s.scored, 4_000);
    assert!(s.significant > 0, "{s:?}");
    let before = s.scored;
    let meta: Vec<_> = src.export(1 << 20).flat_map(|c| c.meta).collect();
    let keys: Vec<u64> = src.export(1 << 20).flat_map(|c| c.ids).collect();
    src.import(&keys, &vec![1.0; keys.len() * D], None, Some(&meta)).unwrap();
    assert_eq!(src.priority_stats().unwrap().scored, before);
}

/// A pull of the whole table with one TSVV (the min over the follower's parts) takes the same
/// rows as part-by-part pulls, and every part learns the source's TSVV: the next pull is empty.
#[test]
fn a_whole_table_prioritised_pull_takes_what_part_by_part_pulls_take() {
    let (_s, src) = syncing(1);
    let (_a, by_part) = syncing(2);
    let (_b, whole) = syncing(3);
    prioritise(&src, 90.0);
    let ids: Vec<u64> = (0..2_000).collect();
    for _ in 0..3 {
        src.apply_gradients(&ids, &grads(&ids, 0.01), None).unwrap();
    }
    let taken = prioritised_sync(&src, &by_part);
    let mut n = 0;
    let mut sent = embstore_table::sync::PrioritisedSent::default();
    let known = src
        .sync_pull_prioritised_all(
            &whole.sync_tsvv_min().unwrap(),
            &mut sent,
            Duration::ZERO,
            &mut |r| {
                n += whole.sync_apply_prioritised(&r)?;
                Ok(())
            },
        )
        .unwrap();
    whole.sync_learn_tsvv_all(&known).unwrap();
    assert_eq!(n, taken);
    assert_eq!(read(&whole, &ids), read(&by_part, &ids));
    // Asked again on the same connection (what was sent is remembered), nothing is sent twice.
    let mut again = 0;
    src.sync_pull_prioritised_all(
        &whole.sync_tsvv_min().unwrap(),
        &mut sent,
        Duration::ZERO,
        &mut |r| {
            again += r.len();
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(again, 0, "nothing sent twice");
    // New writes: only they go.
    src.apply_gradients(&ids[..500], &grads(&ids[..500], 0.05), None).unwrap();
    let mut fresh = 0;
    src.sync_pull_prioritised_all(
        &whole.sync_tsvv_min().unwrap(),
        &mut sent,
        Duration::ZERO,
        &mut |r| {
            fresh += whole.sync_apply_prioritised(&r)?;
            Ok(())
        },
    )
    .unwrap();
    assert!(fresh > 0 && fresh <= 500, "{fresh}");
}

/// With nothing new since the last pull, a whole-table pull waits for a significant write (a
/// long-poll) and leaves with it as soon as it is written; with none, it leaves empty after
/// its wait.
#[test]
fn a_whole_table_prioritised_pull_waits_for_a_significant_write() {
    let (_s, src) = syncing(1);
    let (_b, whole) = syncing(2);
    prioritise(&src, 90.0);
    let ids: Vec<u64> = (0..2_000).collect();
    for _ in 0..3 {
        src.apply_gradients(&ids, &grads(&ids, 0.01), None).unwrap();
    }
    let mut sent = embstore_table::sync::PrioritisedSent::default();
    let mut pull = |wait: Duration| {
        let mut n = 0;
        let known = src
            .sync_pull_prioritised_all(&whole.sync_tsvv_min().unwrap(), &mut sent, wait, &mut |r| {
                n += whole.sync_apply_prioritised(&r)?;
                Ok(())
            })
            .unwrap();
        whole.sync_learn_tsvv_all(&known).unwrap();
        n
    };
    assert!(pull(Duration::ZERO) > 0);
    // Nothing new: empty after the wait (normal writes below the threshold do not end it).
    let t0 = Instant::now();
    assert_eq!(pull(Duration::from_millis(200)), 0);
    assert!(t0.elapsed() >= Duration::from_millis(200), "{:?}", t0.elapsed());
    // A significant write during the wait ends it with the row.
    std::thread::scope(|s| {
        let src = &src;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            src.apply_gradients(&ids[..500], &grads(&ids[..500], 0.05), None).unwrap();
        });
        let t0 = Instant::now();
        let n = pull(Duration::from_secs(30));
        assert!(n > 0, "the significant write came with the pull");
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}: not woken", t0.elapsed());
    });
}

/// Which of `ids` hold a significant write as their newest (their version is their sigv).
fn significant_now(t: &Table, ids: &[u64]) -> Vec<bool> {
    let sig = t.significant_versions(ids).unwrap();
    let meta = t.meta(ids).unwrap();
    sig.iter().zip(&meta).map(|(s, m)| m.is_some_and(|m| *s == Some(m.version))).collect()
}

/// New rows go ahead (the freshness term `p_u`): the table knows when it created a row, so a
/// row created a moment ago has a freshness near 1 where rows from before (here imported, with
/// their write counts) have at most 1/11, and its first writes beat the old rows' largest
/// gradients. Under the write-count rule a creation barely differs from a row written a few
/// times, and most new rows would not be significant.
#[test]
fn rows_created_a_moment_ago_go_ahead_of_old_rows_with_larger_gradients() {
    let (_s, src) = syncing(1);
    prioritise(&src, 95.0);
    let old: Vec<u64> = (0..4_000).collect();
    let meta =
        vec![
            embstore_table::RowMeta { update_count: 5, ..embstore_table::RowMeta::default() };
            old.len()
        ];
    src.import(&old, &vec![0.5; old.len() * D], None, Some(&meta)).unwrap();
    for _ in 0..5 {
        for chunk in old.chunks(500) {
            src.apply_gradients(chunk, &grads(chunk, 0.01), None).unwrap();
        }
    }
    assert_eq!(src.priority_stats().unwrap().young_rows, 0, "imported rows are not young");
    // New rows with a quarter of the old rows' mean gradient, written among old rows.
    let new: Vec<u64> = (1_000_000..1_000_100).collect();
    let g_mid = vec![0.01 * 1.5; new.len() * D];
    for round in 0..2 {
        src.apply_gradients(&new, &g_mid, None).unwrap();
        let sig = significant_now(&src, &new);
        let n = sig.iter().filter(|&&s| s).count();
        assert_eq!(n, new.len(), "round {round}: {n} of {} new rows significant", new.len());
        src.apply_gradients(&old[..500], &grads(&old[..500], 0.01), None).unwrap();
    }
    let stats = src.priority_stats().unwrap();
    assert_eq!(stats.young_rows, new.len(), "{stats:?}");
    let old_sig = significant_now(&src, &old[..500]).iter().filter(|&&s| s).count();
    assert!(old_sig < 150, "{old_sig} of 500 old rows' last writes significant");
}
