//! A witness whose disk fills while it flushes: the flush fails with an I/O error and the file
//! is cut back to its last good block (nothing half-written stays in it); once there is room
//! the next flush writes the healthy store whole, and a restart finds all of it. The disk is
//! "full" through the process's file-size limit (RLIMIT_FSIZE), so this test has a binary of
//! its own: the limit holds for every thread of the process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use embstore_table::{ErrorKind, Store, Table};

const D: usize = 16;
const PARTS: u32 = 8;
const BUCKET_MS: u64 = 20;

fn syncing(replica: u32) -> (Store, Arc<Table>) {
    common::syncing(replica, D, PARTS)
}

fn sync(src: &Table, dst: &Table) {
    common::sync_all(src, dst)
}

fn next_bucket() -> u64 {
    std::thread::sleep(Duration::from_millis(2 * BUCKET_MS + 5));
    embstore_common::clock::now_ms()
}

fn set_file_limit(bytes: u64) {
    let lim = libc::rlimit { rlim_cur: bytes, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid struct; raising the soft limit back stays under the hard
    // limit, which is left as it was (infinite).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
}

#[test]
fn a_flush_that_meets_a_full_disk_fails_cleanly_and_the_next_one_writes_it_whole() {
    // SAFETY: ignoring SIGXFSZ, so that a write past the limit fails with EFBIG instead of
    // ending the process.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = tempfile::tempdir().unwrap();
    let (_ps, primary) = syncing(1);
    let (_ws, witness) = syncing(2);
    witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap();
    let file = dir.path().join("t.witness");
    let ids: Vec<u64> = (0..100).collect();
    primary.assign(&ids, &vec![1.0; ids.len() * D]).unwrap();
    sync(&primary, &witness);
    witness.witness_flush(next_bucket(), &[]).unwrap().unwrap();
    let good = std::fs::metadata(&file).unwrap().len();

    // The disk fills: 100 more rows do not fit.
    let more: Vec<u64> = (100..200).collect();
    primary.assign(&more, &vec![2.0; more.len() * D]).unwrap();
    sync(&primary, &witness);
    set_file_limit(good + 1000);
    let e = witness.witness_flush(next_bucket(), &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("witness file"), "{e}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), good, "cut back to the good blocks");

    // Room again: the next flush (even with nothing new) writes the healthy store whole.
    set_file_limit(libc::RLIM_INFINITY);
    let t_max = witness.witness_flush(next_bucket(), &[]).unwrap();
    assert!(t_max.is_some(), "a stale file is written whole");
    drop((_ws, witness));
    let (_ws, witness) = syncing(3);
    let st = witness.witness_start(BUCKET_MS, Some(dir.path())).unwrap();
    assert_eq!(st.restored_rows, 200, "{st:?}");
}
