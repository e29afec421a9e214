//! Where a follower's tables stand: [`TableSync`] per table, the [`StatusView`] that reads
//! them and waits for a catch-up ([`CatchUpMark`]), and the state the table threads share.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_common::now_ms;
use parking_lot::Mutex;

/// Where one followed table stands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableSync {
    /// The table.
    pub table: String,
    /// The source's address.
    pub source: String,
    /// Whether the connection is up now.
    pub connected: bool,
    /// Whether the last round left nothing pending (every changed part pulled and applied)
    /// and finished recently (within the long-poll's wait plus 3 s: a link cut silently, with
    /// no reset, is not caught up even before its connection times out).
    pub caught_up: bool,
    /// Parts known changed at the source and not yet applied here.
    pub parts_pending: usize,
    /// Freshness: for each applied reply with new rows, now − the newest row's write time,
    /// over the last 4,096 replies (ms).
    pub lag_ms_p50: Option<f64>,
    pub lag_ms_p99: Option<f64>,
    /// When the last round finished (ms since the epoch; 0: never).
    pub last_round_ms: u64,
    /// Rounds finished (each asks for the change list once).
    pub rounds: u64,
    /// Pull requests, parts received, replies answered from the source's update cache.
    pub pulls: u64,
    pub parts: u64,
    pub parts_from_cache: u64,
    /// Parts whose rows came with the change list (no pull: one round trip fewer).
    pub parts_inline: u64,
    /// Parts listed as changed that were not pulled: this replica already held their shard
    /// version (it had their changes from another source, or from an earlier round).
    pub parts_skipped: u64,
    /// Rows (and tombstones) written here.
    pub rows_applied: u64,
    /// Frame bytes received and sent.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Errors (connection lost, a refused reply) and the last one.
    pub errors: u64,
    pub last_error: Option<String>,
    /// How late the last applied reply's newest row arrived (ms, on the source's clock; 0
    /// after a round that brought nothing), what congestion is judged by.
    pub reply_lag_ms: u64,
    /// Whether the link counts as congested now (prioritised pulls run beside the rounds),
    /// and how many times it became so.
    pub congested: bool,
    pub congestions: u64,
    /// Prioritised pulls made and the rows they took ahead of normal sync.
    pub prioritised_pulls: u64,
    pub prioritised_rows: u64,
}

/// What a follower's threads share: each table's status (a table the source creates later is
/// added), and how far the watch for new tables has come.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) tables: Mutex<Vec<Arc<Mutex<Status>>>>,
    /// Whether new tables are watched for (the follower follows every table).
    pub(super) watching: bool,
    /// Table lists asked for, and the number of the last one that was answered and whose new
    /// tables are followed.
    pub(super) lists_begun: AtomicU64,
    pub(super) lists_done: AtomicU64,
    /// Asks the watch for a table list now (a caller waits to catch up).
    pub(super) nudge: AtomicBool,
}

impl Shared {
    pub(super) fn tables(&self) -> Vec<Arc<Mutex<Status>>> {
        self.tables.lock().clone()
    }
}

/// Reads where a follower's tables stand ([`Follower::status_view`]).
#[derive(Clone, Debug)]
pub struct StatusView(pub(super) Arc<Shared>);

impl StatusView {
    /// Where each followed table stands.
    pub fn status(&self) -> Vec<TableSync> {
        self.0
            .tables()
            .iter()
            .map(|s| {
                let s = s.lock();
                let mut out = s.s.clone();
                (out.lag_ms_p50, out.lag_ms_p99) =
                    (quantile(&s.lags, 0.5), quantile(&s.lags, 0.99));
                out.caught_up &= now_ms().saturating_sub(out.last_round_ms) <= s.stale_ms;
                out
            })
            .collect()
    }

    /// A mark of now for [`StatusView::caught_up_after`]: the rounds each table has begun,
    /// and (following every table) the table lists asked for; the watch is asked for one now.
    pub fn mark(&self) -> CatchUpMark {
        let lists = self.0.watching.then(|| {
            self.0.nudge.store(true, Ordering::Relaxed);
            self.0.lists_begun.load(Ordering::Acquire)
        });
        let rounds = self.0.tables().iter().map(|s| s.lock().rounds_begun).collect();
        CatchUpMark { rounds, lists }
    }

    /// Whether every table is caught up by a round that *began* after `mark` was taken: its
    /// change list was asked for after the mark, so it covers every write the source made
    /// before it, and the round left nothing pending. (A round that began before the mark may
    /// have listed the source's changes before writes made just before it: it never counts.)
    /// Following every table, a table list asked for after the mark must have been answered
    /// too, so a table the source created before the mark is among them.
    pub fn caught_up_after(&self, mark: &CatchUpMark) -> bool {
        if mark.lists.is_some_and(|l| self.0.lists_done.load(Ordering::Acquire) <= l) {
            return false;
        }
        let status = self.status();
        let tables = self.0.tables();
        tables.iter().zip(&status).enumerate().all(|(i, (s, out))| {
            // A table found after the mark: any round counts (all began after it).
            let begun = mark.rounds.get(i).copied().unwrap_or(0);
            out.caught_up && s.lock().caught_up_round > begun
        })
    }

    /// Waits until every table is caught up (a round that left nothing pending and began
    /// after this call, so after the source's writes before it), or `timeout`; whether they
    /// all are.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let mark = self.mark();
        let deadline = Instant::now() + timeout;
        loop {
            let all = self.caught_up_after(&mark);
            if all || Instant::now() >= deadline {
                return all;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The rounds each followed table had begun at [`StatusView::mark`], and the table lists.
#[derive(Clone, Debug)]
pub struct CatchUpMark {
    pub(super) rounds: Vec<u64>,
    pub(super) lists: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct Status {
    pub(super) s: TableSync,
    pub(super) lags: VecDeque<f64>,
    /// A round that has not finished for this long means the link is stuck (a silent cut
    /// drops packets without a reset): `caught_up` then reads false (ms).
    pub(super) stale_ms: u64,
    /// Rounds begun: the number of the round whose change list was asked for last.
    pub(super) rounds_begun: u64,
    /// The number of the last round that finished with nothing pending (0: none).
    pub(super) caught_up_round: u64,
}

/// How long past the long-poll's wait a round may take before the table no longer counts as
/// caught up (ms).
pub(super) const ROUND_GRACE_MS: u64 = 3000;

/// One line per table for a directory's `status`: lag, pending parts, bytes in, source.
pub(super) fn report(all: &[Arc<Mutex<Status>>]) -> String {
    all.iter()
        .map(|s| {
            let s = s.lock();
            let p99 = quantile(&s.lags, 0.99).map_or("-".to_owned(), |v| format!("{v:.0}"));
            format!(
                "{} lag_p99_ms={p99} pending={} bytes_in={} source={} errors={};",
                s.s.table, s.s.parts_pending, s.s.bytes_in, s.s.source, s.s.errors
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn quantile(lags: &VecDeque<f64>, q: f64) -> Option<f64> {
    if lags.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = lags.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    Some(v[((v.len() - 1) as f64 * q).round() as usize])
}
