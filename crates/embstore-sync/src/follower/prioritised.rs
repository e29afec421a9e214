//! The prioritised loop of a congested table link ([`Ahead`]): while the link counts as
//! congested, a second connection to the same source pulls, one pull after another (the
//! source holds a pull until it has a significant write to send, up to 100 ms), the significant
//! writes this replica lacks in any part (`PrioritisedPull` of the whole table, with the
//! pointwise min of its parts' TSVVs: a request of a few bytes), applying them into the
//! table's significant store (`Table::sync_apply_prioritised`), which reads consult. Normal
//! rounds go on beside it (eventual consistency does not depend on it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use embstore_common::{Error, Result};
use embstore_table::sync::PrioritisedReply;
use embstore_table::Table;
use parking_lot::Mutex;
use std::io::Write;

use super::link::{connect, Conn};
use super::status::Status;
use super::FollowOptions;
use crate::wire::{self, Kind};

/// The least time between two prioritised pulls. The source holds a pull that finds nothing
/// to send until a significant write arrives (up to 100 ms), so pulls follow each other at
/// once; this bounds the pace against a source that answers at once.
const EVERY: Duration = Duration::from_millis(20);

/// The prioritised loop of one table link, when it runs.
#[derive(Default)]
pub(super) struct Ahead {
    running: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Ahead {
    /// Starts the loop (if it is not running) against `addr` for table `t`.
    pub(super) fn start(
        &mut self,
        t: &Arc<Table>,
        addr: &str,
        options: &FollowOptions,
        status: &Arc<Mutex<Status>>,
    ) {
        if self.running.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (t, addr, options, status, flag) =
            (t.clone(), addr.to_owned(), options.clone(), status.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("embstore-ahead-{}", t.name()))
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let events = options.events.as_ref().and_then(|p| {
                        let mut p = p.clone().into_os_string();
                        p.push(".ahead");
                        std::fs::OpenOptions::new().create(true).append(true).open(p).ok()
                    });
                    let mut events = events.map(std::io::BufWriter::new);
                    let r = connect(&addr, &options, &[t.name().to_owned()]).and_then(
                        |(mut conn, _, _)| pull_ahead(&t, &mut conn, &flag, &status, &mut events),
                    );
                    if let Err(e) = r {
                        let mut s = status.lock();
                        s.s.errors += 1;
                        s.s.last_error = Some(format!("prioritised sync: {e}"));
                    }
                    for _ in 0..20 {
                        if flag.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            });
        if let Ok(h) = spawned {
            self.running = Some((stop, h));
        }
    }

    /// Stops the loop and waits for it (at most one long-poll's wait and a pull).
    pub(super) fn stop(&mut self) {
        if let Some((stop, h)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Appends one record per row of a prioritised reply to the events file's `.ahead` sibling
/// (`FollowOptions::events`): `time_us u64 | table u32 | part u32 | key u64 | ts u64`,
/// little-endian (the time in µs since the Unix epoch, the table as `table_id`, the row's
/// version timestamp), for measuring how soon rows taken ahead are served.
fn record(e: &mut impl Write, table: &str, reply: &PrioritisedReply) {
    let us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let id = super::table_id(table);
    for (k, m) in reply.keys.iter().zip(&reply.meta) {
        let mut rec = [0u8; 32];
        rec[..8].copy_from_slice(&us.to_le_bytes());
        rec[8..12].copy_from_slice(&id.to_le_bytes());
        rec[12..16].copy_from_slice(&reply.part.to_le_bytes());
        rec[16..24].copy_from_slice(&k.to_le_bytes());
        rec[24..].copy_from_slice(&m.version.timestamp.to_le_bytes());
        let _ = e.write_all(&rec);
    }
}

/// Prioritised rounds over `conn` until `stop`, at most one every [`EVERY`]: one pull of the whole
/// table with this replica's TSVV over every part (a few bytes, however many parts changed),
/// answered by the parts that have significant writes it lacks and the source's TSVV, which
/// every part then learns.
fn pull_ahead(
    t: &Table,
    conn: &mut Conn,
    stop: &AtomicBool,
    status: &Mutex<Status>,
    events: &mut Option<std::io::BufWriter<std::fs::File>>,
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let ask = [(wire::ALL_PARTS, t.sync_tsvv_min()?)];
        conn.send(Kind::PrioritisedPull, &wire::encode_pull(t.name(), &ask))?;
        let mut rows = 0usize;
        loop {
            let (kind, body) = conn.recv()?;
            match kind {
                Kind::PullDone => break,
                Kind::PrioritisedPart => {
                    let reply = wire::decode_prioritised(&body, t.dim())?;
                    if reply.part == wire::ALL_PARTS {
                        t.sync_learn_tsvv_all(&reply.tsvv)?;
                        continue;
                    }
                    rows += t.sync_apply_prioritised(&reply)?;
                    if let Some(e) = events.as_mut() {
                        record(e, t.name(), &reply);
                    }
                }
                k => return Err(Error::corrupt(format!("unexpected sync frame {k:?}"))),
            }
        }
        if let Some(e) = events.as_mut() {
            let _ = e.flush();
        }
        {
            let mut s = status.lock();
            s.s.prioritised_pulls += 1;
            s.s.prioritised_rows += rows as u64;
            s.s.bytes_in += std::mem::take(&mut conn.bytes_in);
            s.s.bytes_out += std::mem::take(&mut conn.bytes_out);
        }
        if let Some(rest) = EVERY.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Ok(())
}
