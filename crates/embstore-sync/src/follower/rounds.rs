//! A table thread's pull rounds: the connection to the source it follows now, and the
//! protocol's round (`embstore_replication::round`: the change list, the parts to pull, the
//! pulls and the applied replies, with the neighbour book of what the source holds) over it,
//! repeated until stopped, with the table's status and the dissemination events.

use std::cell::Cell;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_common::{now_ms, Result};
use embstore_replication::{round, Book, Congestion, RoundOptions};
use embstore_table::sync::{check_parts, PartReply, Target};
use embstore_table::Table;
use parking_lot::Mutex;

use super::link::{connect, Conn, TableLink};
use super::prioritised::Ahead;
use super::status::Status;
use super::{table_id, FollowOptions, Source, LAG_SAMPLES, PARTS_PER_PULL};
use crate::wire;

/// Where applied replies are recorded ([`FollowOptions::events`]).
type Events = Option<BufWriter<std::fs::File>>;

pub(super) fn follow_table(
    target: &dyn Target,
    info: &wire::TableInfo,
    source: &Source,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Arc<Mutex<Status>>,
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
    let mut events = events;
    let mut book = Book::default();
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
            book = Book::default();
            current = Some(t.clone());
        }
        status.lock().s.source = addr.clone();
        let result = check_parts(&t, info.parts, &addr)
            .and_then(|_| connect(&addr, options, &[name.to_owned()]))
            .and_then(|(mut link, _, _)| {
                status.lock().s.connected = true;
                let here = (source, addr.as_str(), target);
                let r =
                    rounds(&t, &mut link, options, stop, status, (&mut book, &mut events), here);
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
    conn: &mut Conn,
    options: &FollowOptions,
    stop: &AtomicBool,
    status: &Arc<Mutex<Status>>,
    (book, events): (&mut Book, &mut Events),
    (source, addr, target): (&Source, &str, &dyn Target),
) -> Result<()> {
    let round_options = RoundOptions {
        wait_ms: options.wait_ms,
        skip_by_sv: options.skip_by_sv,
        parts_per_pull: PARTS_PER_PULL,
    };
    // Congestion, and the prioritised loop it starts (stopped with this connection's rounds).
    let mut congestion = options.priority.map(Congestion::new);
    let mut ahead = Ahead::default();
    let result = (|| {
        while !stop.load(Ordering::Relaxed) {
            if source.pick(t.name()).as_deref() != Some(addr) {
                return Ok(()); // the directory names another source now: switch to it
            }
            if !target.table(t.name()).is_some_and(|now| Arc::ptr_eq(&now, t)) {
                return Ok(()); // another version to write into now (a roll)
            }
            let round_no = {
                let mut s = status.lock();
                s.rounds_begun += 1;
                s.rounds_begun
            };
            let their_now = Cell::new(None);
            let mut link = TableLink {
                conn: &mut *conn,
                table: t.name(),
                dim: t.dim(),
                state_dim: t.state_dim(),
                their_now: &their_now,
            };
            // Each applied reply with rows is one observation of the link: how late its
            // newest row arrived.
            let mut judge = |lag: u64| {
                status.lock().s.reply_lag_ms = lag;
                if let Some(c) = &mut congestion {
                    let was = c.congested();
                    let now = c.observe(lag, now_ms());
                    if now && !was {
                        status.lock().s.congestions += 1;
                        ahead.start(t, addr, options, status);
                    } else if !now && was {
                        ahead.stop();
                    }
                    status.lock().s.congested = now;
                }
            };
            let mut any = false;
            let done = round(
                &mut &**t,
                &mut link,
                book,
                &round_options,
                &mut |reply, written, inline| {
                    if let Some(newest) = reply.meta.iter().map(|m| m.version.ms()).max() {
                        any = true;
                        judge(reply_lag(newest, their_now.get()));
                    }
                    seen(t, status, events, reply, written, inline)
                },
            )?;
            if !any {
                judge(0); // a round that brought nothing: the link keeps up
            }
            if let Some(e) = events.as_mut() {
                let _ = e.flush();
            }
            let mut s = status.lock();
            s.s.pulls += done.pulls;
            s.s.parts_skipped += done.skipped;
            s.s.parts_pending = done.pending;
            s.s.caught_up = done.pending == 0;
            if s.s.caught_up {
                s.caught_up_round = round_no;
            }
            s.s.last_round_ms = now_ms();
            s.s.rounds += 1;
            s.s.bytes_in += std::mem::take(&mut conn.bytes_in);
            s.s.bytes_out += std::mem::take(&mut conn.bytes_out);
        }
        Ok(())
    })();
    ahead.stop();
    status.lock().s.congested = false;
    result
}

/// How late a reply's newest row arrived (ms): the source's clock now (its clock at the
/// round's change list plus the time since) minus the row's write time. A link that cannot
/// carry the writes makes rounds longer and their rows older: what congestion is judged by.
fn reply_lag(newest_ms: u64, their_now: Option<(u64, Instant)>) -> u64 {
    let Some((now, listed)) = their_now else { return 0 };
    (now + listed.elapsed().as_millis() as u64).saturating_sub(newest_ms)
}

/// Notes an applied reply (`written` rows; `inline`: it came with a change list) in the
/// table's status and, for a whole part, in the events file.
fn seen(
    t: &Table,
    status: &Mutex<Status>,
    events: &mut Events,
    reply: &PartReply,
    written: usize,
    inline: bool,
) -> Result<()> {
    if let (Some(e), false) = (events.as_mut(), reply.partial) {
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
    let newest = reply.meta.iter().map(|m| m.version.ms()).max();
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use embstore_common::Result;
    use embstore_replication::{round, Book, Link, ListAsk, RoundOptions, Vv};
    use embstore_table::sync::{Changes, PartReply, SyncOptions};
    use embstore_table::{Store, Table, TableConfig};

    /// An in-memory link to a source table in this process that loses the first `lose`
    /// replies of its pulls (a network that dropped them, or a connection broken after the
    /// request): the production round must pull those parts again.
    struct Lossy<'a> {
        src: &'a Table,
        lose: usize,
        /// The open exchanges' replies, oldest first.
        open: VecDeque<VecDeque<PartReply>>,
    }

    impl Link for Lossy<'_> {
        type Reply = PartReply;

        fn list(&mut self, ask: &ListAsk) -> Result<Changes> {
            self.open.push_back(VecDeque::new());
            self.src.sync_changes(ask.epoch, ask.cursor)
        }

        fn pull(&mut self, parts: &[(u32, Vv)]) -> Result<()> {
            let mut replies = VecDeque::new();
            for (p, vv) in parts {
                let reply = self.src.sync_pull(*p, vv, false)?;
                if self.lose > 0 {
                    self.lose -= 1;
                    continue;
                }
                replies.push_back(reply);
            }
            self.open.push_back(replies);
            Ok(())
        }

        fn next(&mut self) -> Result<Option<PartReply>> {
            let Some(exchange) = self.open.front_mut() else {
                return Ok(None);
            };
            let reply = exchange.pop_front();
            if reply.is_none() {
                self.open.pop_front();
            }
            Ok(reply)
        }
    }

    fn syncing(replica: u32) -> (Store, std::sync::Arc<Table>) {
        let store = Store::with_replica(replica).unwrap();
        let t = store.create_table(TableConfig::new("t", 4).with_shards(4)).unwrap();
        t.enable_sync(&SyncOptions { parts: 16, ..SyncOptions::default() }).unwrap();
        (store, t)
    }

    fn rows(t: &Table) -> Vec<(u64, Vec<f32>)> {
        let mut out: Vec<_> = t
            .export(1 << 20)
            .flat_map(|c| {
                let v = c.values;
                c.ids.into_iter().enumerate().map(move |(i, k)| (k, v[i * 4..][..4].to_vec()))
            })
            .collect();
        out.sort_by_key(|r| r.0);
        out
    }

    /// A reply lost on the link leaves its part pending, and the next round pulls it again
    /// although the source does not list it again: then the follower holds the source's rows.
    #[test]
    fn a_lost_reply_is_pulled_again_in_the_next_round() {
        let (_s, src) = syncing(1);
        let (_f, dst) = syncing(2);
        let ids: Vec<u64> = (0..500).collect();
        src.apply_gradients(&ids, &vec![0.5; ids.len() * 4], None).unwrap();
        let mut link = Lossy { src: &src, lose: 1, open: VecDeque::new() };
        let (mut book, options) = (Book::default(), RoundOptions::default());
        let mut replies = 0;
        let first = round(&mut &*dst, &mut link, &mut book, &options, &mut |_, _, _| {
            replies += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((first.pulls, first.pending, replies), (1, 1, 15));
        assert_ne!(rows(&dst), rows(&src));
        let second = round(&mut &*dst, &mut link, &mut book, &options, &mut |_, _, _| Ok(()));
        let second = second.unwrap();
        assert_eq!((second.pulls, second.pending), (1, 0));
        assert!(second.written > 0);
        assert_eq!(rows(&dst), rows(&src));
        assert!(link.open.is_empty());
    }
}
