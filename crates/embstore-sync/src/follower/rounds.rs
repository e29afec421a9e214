//! A table thread's pull rounds (Ekko's four steps): the change list, the parts to pull,
//! the pulls and the applied replies, with the neighbour book of what the source holds.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_common::{now_ms, Error, Result};
use embstore_replication::Sv;
use embstore_table::sync::{check_parts, Target};
use embstore_table::Table;
use parking_lot::Mutex;

use super::link::{connect, Link};
use super::status::Status;
use super::{table_id, FollowOptions, Source, LAG_SAMPLES, PARTS_PER_PULL};
use crate::wire::{self, Kind};

/// What a follower knows of its source's parts (the neighbour book).
#[derive(Default)]
pub(super) struct Book {
    pub(super) epoch: u64,
    pub(super) cursor: u64,
    pub(super) their_sv: HashMap<u32, Sv>,
    pub(super) pending: BTreeSet<u32>,
    /// Where applied replies are recorded ([`FollowOptions::events`]).
    pub(super) events: Option<BufWriter<std::fs::File>>,
}

pub(super) fn follow_table(
    target: &dyn Target,
    info: &wire::TableInfo,
    source: &Source,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Mutex<Status>,
) {
    let events = options.events.as_ref().and_then(|p| {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(p);
        match f {
            Ok(f) => Some(BufWriter::new(f)),
            Err(e) => {
                status.lock().s.last_error = Some(format!("cannot open {}: {e}", p.display()));
                None
            }
        }
    });
    let mut book = Book { events, ..Book::default() };
    let mut current: Option<Arc<Table>> = None;
    let name = info.name.as_str();
    while !stop.load(Ordering::Relaxed) {
        let (addr, t) = match (source.pick(name), target.table(name)) {
            (Some(addr), Some(t)) => (addr, t),
            (addr, _) => {
                let mut s = status.lock();
                s.s.last_error = Some(if addr.is_some() {
                    "no version of this table that syncs is held here".into()
                } else {
                    "no sync source is registered for this table".into()
                });
                s.s.caught_up = false;
                drop(s);
                std::thread::sleep(Duration::from_millis(options.retry_ms));
                continue;
            }
        };
        if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &t)) {
            // A new version to write into (a roll loaded it): its knowledge is its own, so
            // start over with the source's complete change list.
            book = Book { events: book.events.take(), ..Book::default() };
            current = Some(t.clone());
        }
        status.lock().s.source = addr.clone();
        let result = check_parts(&t, info.parts, &addr)
            .and_then(|_| connect(&addr, options, &[name.to_owned()]))
            .and_then(|(mut link, _, _)| {
                status.lock().s.connected = true;
                let here = (source, addr.as_str(), target);
                let r = rounds(&t, &mut link, options, stop, status, &mut book, here);
                let mut s = status.lock();
                s.s.bytes_in += link.bytes_in;
                s.s.bytes_out += link.bytes_out;
                r
            });
        let mut s = status.lock();
        s.s.connected = false;
        if let Err(e) = result {
            s.s.errors += 1;
            s.s.last_error = Some(e.to_string());
            s.s.caught_up = false;
        }
        drop(s);
        // Sleep in small steps so that a stop is seen quickly.
        let until = Instant::now() + Duration::from_millis(options.retry_ms);
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub(super) fn rounds(
    t: &Arc<Table>,
    link: &mut Link,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Mutex<Status>,
    book: &mut Book,
    (source, addr, target): (&Source, &str, &dyn Target),
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        if source.pick(t.name()).as_deref() != Some(addr) {
            return Ok(()); // the directory names another source now: switch to it
        }
        if !target.table(t.name()).is_some_and(|now| Arc::ptr_eq(&now, t)) {
            return Ok(()); // another version to write into now (a roll)
        }
        let round = {
            let mut s = status.lock();
            s.rounds_begun += 1;
            s.rounds_begun
        };
        let list = wire::List {
            table: t.name().to_owned(),
            epoch: book.epoch,
            cursor: book.cursor,
            // With parts pending (a failed pull), ask without waiting.
            wait_ms: if book.pending.is_empty() { options.wait_ms } else { 0 },
        };
        link.send(Kind::List, &list.encode())?;
        let (changes, _their_now) = wire::decode_changed(&link.expect(Kind::Changed)?)?;
        if changes.epoch != book.epoch {
            // The source restarted (or this is the first round): its list is complete.
            book.their_sv.clear();
            book.pending.clear();
        }
        for (p, sv) in &changes.parts {
            book.their_sv.insert(*p, *sv);
            book.pending.insert(*p);
        }
        let listed: Vec<u32> = changes.parts.iter().map(|(p, _)| *p).collect();
        // The rows of small changes come with the list: those parts are done.
        pull_replies(t, link, status, book, true)?;
        let inlined: BTreeSet<u32> =
            listed.into_iter().filter(|p| !book.pending.contains(p)).collect();
        (book.epoch, book.cursor) = (changes.epoch, changes.upto);
        if !options.skip_by_sv {
            // Every part, every round: what a replica without shard versions must do (but
            // those that just came with the list).
            book.pending.extend((0..t.sync_parts()?).filter(|p| !inlined.contains(p)));
            book.their_sv.clear();
        }
        let mut todo = Vec::new();
        for &p in &book.pending {
            let mine = t.sync_knowledge(p)?.1;
            if !book.their_sv.get(&p).is_some_and(|sv| mine.succeq(sv)) {
                todo.push(p);
            }
        }
        let skipped = (book.pending.len() - todo.len()) as u64;
        book.pending = todo.iter().copied().collect();
        // Every pull request goes out at once (they are small), then the replies are read in
        // order: a round costs one round trip for the list and one for all the pulls.
        let batches: Vec<&[u32]> = todo.chunks(PARTS_PER_PULL).collect();
        for batch in &batches {
            let parts = batch
                .iter()
                .map(|&p| Ok((p, t.sync_knowledge(p)?.0)))
                .collect::<Result<Vec<_>>>()?;
            link.send(Kind::Pull, &wire::encode_pull(t.name(), &parts))?;
        }
        for _ in &batches {
            pull_replies(t, link, status, book, false)?;
        }
        if let Some(e) = book.events.as_mut() {
            let _ = e.flush();
        }
        let mut s = status.lock();
        s.s.pulls += todo.len().div_ceil(PARTS_PER_PULL) as u64;
        s.s.parts_skipped += skipped;
        s.s.parts_pending = book.pending.len();
        s.s.caught_up = book.pending.is_empty();
        if s.s.caught_up {
            s.caught_up_round = round;
        }
        s.s.last_round_ms = now_ms();
        s.s.rounds += 1;
        s.s.bytes_in += std::mem::take(&mut link.bytes_in);
        s.s.bytes_out += std::mem::take(&mut link.bytes_out);
    }
    Ok(())
}

/// Reads and applies `Part`s up to `PullDone`: a pull's replies, or (`inline`) those that came
/// with a change list.
pub(super) fn pull_replies(
    t: &Table,
    link: &mut Link,
    status: &Mutex<Status>,
    book: &mut Book,
    inline: bool,
) -> Result<()> {
    loop {
        let (kind, body) = link.recv()?;
        match kind {
            Kind::PullDone => return Ok(()),
            Kind::Part => {
                let reply = wire::decode_part(&body, t.dim(), t.state_dim())?;
                let newest = reply.meta.iter().map(|m| m.version.ms()).max();
                let written = t.sync_apply(&reply)?;
                if !reply.partial {
                    book.pending.remove(&reply.part);
                    if let Some(e) = book.events.as_mut() {
                        let newest = t.sync_knowledge(reply.part)?.0.max_timestamp();
                        let us = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_micros() as u64);
                        let mut rec = [0u8; 24];
                        rec[..8].copy_from_slice(&us.to_le_bytes());
                        rec[8..12].copy_from_slice(&table_id(t.name()).to_le_bytes());
                        rec[12..16].copy_from_slice(&reply.part.to_le_bytes());
                        rec[16..].copy_from_slice(&newest.to_le_bytes());
                        let _ = e.write_all(&rec);
                    }
                }
                let mut s = status.lock();
                s.s.parts += u64::from(!reply.partial);
                s.s.parts_from_cache += u64::from(!reply.partial && reply.from_cache);
                s.s.parts_inline += u64::from(!reply.partial && inline);
                s.s.rows_applied += written as u64;
                if let (Some(newest), true) = (newest, written > 0) {
                    let lag = now_ms().saturating_sub(newest) as f64;
                    if s.lags.len() == LAG_SAMPLES {
                        s.lags.pop_front();
                    }
                    s.lags.push_back(lag);
                }
            }
            k => return Err(Error::corrupt(format!("unexpected sync frame {k:?} in a pull"))),
        }
    }
}
