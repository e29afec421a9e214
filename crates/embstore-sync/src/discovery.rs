//! Finding sources through etcd: every replica that syncs registers under a lease, and a
//! follower picks, per table, whom to pull from.
//!
//! Keys: `/embstore/sync/<dc>/<replica>` → `key=value` lines: `addr` (its sync port, empty for
//! a follower that serves no one), `role` (`primary` for a store that trains, else `replica`)
//! and `status` (what it reports about its tables, refreshed every second). A member whose
//! process dies loses its lease after the TTL, and with it its key.
//!
//! A [`Directory`] runs one of two ways: on its own ([`Directory::start`]: a thread, a small
//! runtime, an etcd client and a lease of its own, for a process that only syncs), or inside a
//! process that also serves in a cluster ([`Directory::start_under`]: a task on the process's
//! runtime, with its etcd client, its key under the process's one lease, whose keeper renews
//! both registrations and puts both back when the lease is lost).
//!
//! Source choice ([`choose_source`], WAN-aware): in each data centre one replica per table is
//! the *leader*, chosen by rendezvous hashing over the live replicas of that DC that have a
//! sync port (so leadership spreads over tables, and needs no election). The leader pulls from
//! a primary, across the WAN; every other replica of the DC pulls from its leader, so each row
//! crosses each WAN link once. When a leader dies its lease expires and the next choice moves
//! to the new leader: failover takes the TTL plus one refresh. Two replicas that briefly
//! disagree about the leader only pull twice; correctness holds for any source graph.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use embstore_cluster::etcd::Etcd;
use embstore_cluster::LeaseKeeper;
use embstore_common::{fmix64, Error, Result};
use parking_lot::{Mutex, RwLock};

/// The key prefix of sync members.
pub const PREFIX: &str = "/embstore/sync/";
/// How long a dead member stays listed (the lease TTL).
pub const DEFAULT_TTL: Duration = Duration::from_secs(2);
/// How often a member refreshes its status and re-reads the members (its lease is renewed
/// every third of the TTL).
const REFRESH: Duration = Duration::from_millis(500);

/// A replica that syncs, as registered in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its data centre.
    pub dc: String,
    /// Its replica id.
    pub replica: u32,
    /// Its sync port (`host:port`), or empty when it serves no one.
    pub addr: String,
    /// Whether it is a store that trains (a source of new writes).
    pub primary: bool,
    /// What it reports about its tables (free text).
    pub status: String,
}

impl Member {
    fn key(&self) -> String {
        format!("{PREFIX}{}/{}", self.dc, self.replica)
    }

    fn value(&self) -> String {
        let role = if self.primary { "primary" } else { "replica" };
        format!("addr={}\nrole={role}\nstatus={}", self.addr, self.status.replace('\n', " "))
    }

    fn parse(key: &str, value: &[u8]) -> Option<Self> {
        let (dc, replica) = key.strip_prefix(PREFIX)?.rsplit_once('/')?;
        let text = std::str::from_utf8(value).ok()?;
        let field = |k: &str| {
            text.lines().find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
        };
        Some(Self {
            dc: dc.to_owned(),
            replica: replica.parse().ok()?,
            addr: field("addr")?.to_owned(),
            primary: field("role")? == "primary",
            status: field("status").unwrap_or("").to_owned(),
        })
    }
}

/// The rendezvous weight of `replica` for `table`.
fn weight(table: &str, replica: u32) -> u64 {
    let h = table
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    fmix64(h ^ fmix64(u64::from(replica)))
}

/// The leader of `table` in data centre `dc`: the live non-primary replica there with a sync
/// port and the largest rendezvous weight.
pub fn leader<'a>(members: &'a [Member], dc: &str, table: &str) -> Option<&'a Member> {
    members
        .iter()
        .filter(|m| m.dc == dc && !m.primary && !m.addr.is_empty())
        .max_by_key(|m| (weight(table, m.replica), m.replica))
}

/// Whom replica `me` of data centre `dc` pulls `table` from: its DC's leader, unless it is
/// the leader itself (or its DC has none), then a primary (the one with the largest weight).
pub fn choose_source(members: &[Member], me: u32, dc: &str, table: &str) -> Option<String> {
    if let Some(l) = leader(members, dc, table) {
        if l.replica != me {
            return Some(l.addr.clone());
        }
    }
    members
        .iter()
        .filter(|m| m.primary && !m.addr.is_empty() && m.replica != me)
        .max_by_key(|m| (weight(table, m.replica), m.replica))
        .map(|m| m.addr.clone())
}

/// A live view of the members, kept by a loop that also registers this replica.
pub struct Directory {
    members: RwLock<Vec<Member>>,
    /// This replica's registration (its status is refreshed from `report`).
    me: Mutex<Member>,
    report: Mutex<Option<Box<dyn Fn() -> String + Send>>>,
    stop: Arc<AtomicBool>,
    runner: Mutex<Option<Runner>>,
    error: Mutex<Option<String>>,
}

/// Where a directory's loop runs.
enum Runner {
    /// Its own thread (with its own runtime and lease).
    Thread(JoinHandle<()>),
    /// A task on a process's runtime, under the process's lease: says here when it ended.
    Task(mpsc::Receiver<()>),
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory").field("me", &*self.me.lock()).finish_non_exhaustive()
    }
}

impl Directory {
    /// Registers `me` in the etcd at `endpoints` under a lease of `ttl`, and keeps a view of
    /// every member; fails when etcd cannot be reached.
    pub fn start(endpoints: &[String], me: Member, ttl: Duration) -> Result<Arc<Self>> {
        let rt = runtime()?;
        let etcd = {
            let _in = rt.enter(); // the client's connections live on this runtime
            Arc::new(Etcd::connect(endpoints, Duration::from_secs(2))?)
        };
        let ttl = ttl.max(Duration::from_secs(1));
        let lease = rt.block_on(LeaseKeeper::register(
            etcd.clone(),
            &me.key(),
            me.value().as_bytes(),
            ttl,
        ))?;
        let members = rt.block_on(list(&etcd))?;
        let dir = Self::new(members, me);
        let d = dir.clone();
        let t = std::thread::Builder::new()
            .name("embstore-sync-etcd".into())
            .spawn(move || rt.block_on(d.run(&etcd, &lease, true)))
            .map_err(|e| Error::io("cannot start the etcd thread", e))?;
        *dir.runner.lock() = Some(Runner::Thread(t));
        Ok(dir)
    }

    /// Registers `me` under the lease `lease` that a process keeps (with its other keys: one
    /// lease, one renewal loop), through its etcd client, and keeps a view of every member
    /// from a task on the current tokio runtime; fails when etcd cannot be reached. Its
    /// [`stop`](Self::stop) deletes its key; ending the lease (the process's) removes it too.
    pub async fn start_under(
        etcd: Arc<Etcd>,
        lease: Arc<LeaseKeeper>,
        me: Member,
    ) -> Result<Arc<Self>> {
        lease.add(&me.key(), me.value().as_bytes()).await?;
        let members = list(&etcd).await?;
        let dir = Self::new(members, me);
        let (done, ended) = mpsc::channel();
        let d = dir.clone();
        tokio::spawn(async move {
            d.run(&etcd, &lease, false).await;
            let _ = done.send(());
        });
        *dir.runner.lock() = Some(Runner::Task(ended));
        Ok(dir)
    }

    fn new(members: Vec<Member>, me: Member) -> Arc<Self> {
        Arc::new(Self {
            members: RwLock::new(members),
            me: Mutex::new(me),
            report: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
            runner: Mutex::new(None),
            error: Mutex::new(None),
        })
    }

    /// Sets what this replica reports in its `status` (called every refresh).
    pub fn set_report(&self, report: Box<dyn Fn() -> String + Send>) {
        *self.report.lock() = Some(report);
    }

    /// Every [`REFRESH`]: this member's status put under its lease (which the keeper renews,
    /// and registers again if it was lost), and the members read; at stop, the lease ended
    /// (`own`) or this member's key deleted (a lease the process keeps).
    async fn run(&self, etcd: &Etcd, lease: &LeaseKeeper, own: bool) {
        while !self.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(REFRESH).await;
            if let Some(r) = self.report.lock().as_ref() {
                self.me.lock().status = r();
            }
            let me = self.me.lock().clone();
            let value = me.value();
            lease.set_value_of(&me.key(), value.as_bytes());
            let step = async {
                etcd.put(&me.key(), value.as_bytes(), lease.id()).await?;
                list(etcd).await
            };
            match step.await {
                Ok(m) => {
                    *self.members.write() = m;
                    *self.error.lock() = None;
                }
                Err(e) => *self.error.lock() = Some(e.to_string()),
            }
        }
        if own {
            lease.end().await;
        } else {
            let key = self.me.lock().key();
            let _ = lease.remove(&key).await;
        }
    }

    /// The members as last read.
    pub fn members(&self) -> Vec<Member> {
        self.members.read().clone()
    }

    /// This replica's registration.
    pub fn me(&self) -> Member {
        self.me.lock().clone()
    }

    /// The last error talking to etcd, if the last refresh failed.
    pub fn error(&self) -> Option<String> {
        self.error.lock().clone()
    }

    /// Whom to pull `table` from now.
    pub fn source(&self, table: &str) -> Option<String> {
        let me = self.me.lock().clone();
        choose_source(&self.members.read(), me.replica, &me.dc, table)
    }

    /// Deregisters (revokes its own lease, or deletes its key under a process's) and stops
    /// its loop; call it outside async code. A loop on a process's runtime is waited for at
    /// most 4 refreshes (it ends within one; a runtime shut down already ends it anyway).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        match self.runner.lock().take() {
            Some(Runner::Thread(t)) => {
                let _ = t.join();
            }
            Some(Runner::Task(ended)) => {
                let _ = ended.recv_timeout(REFRESH * 4);
            }
            None => {}
        }
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn list(etcd: &Etcd) -> Result<Vec<Member>> {
    let kvs = etcd.range_prefix(PREFIX).await?;
    Ok(kvs.iter().filter_map(|kv| Member::parse(&kv.key, &kv.value)).collect())
}

/// Every sync member registered in the etcd at `endpoints` (for `embstore status`).
pub fn members(endpoints: &[String]) -> Result<Vec<Member>> {
    let rt = runtime()?;
    let _in = rt.enter();
    let etcd = Etcd::connect(endpoints, Duration::from_secs(2))?;
    rt.block_on(list(&etcd))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the etcd runtime", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(dc: &str, replica: u32, addr: &str, primary: bool) -> Member {
        Member { dc: dc.into(), replica, addr: addr.into(), primary, status: String::new() }
    }

    #[test]
    fn a_member_reads_back_as_written() {
        let a = Member { status: "items lag 3\nms".into(), ..m("dc2", 7, "10.0.0.2:7100", false) };
        let back = Member::parse(&a.key(), a.value().as_bytes()).unwrap();
        assert_eq!(back, Member { status: "items lag 3 ms".into(), ..a });
        assert!(Member::parse("/other/x/1", b"addr=a\nrole=primary").is_none());
        assert!(Member::parse("/embstore/sync/dc1/notanumber", b"addr=a\nrole=primary").is_none());
    }

    #[test]
    fn each_dc_has_one_leader_per_table_that_pulls_from_a_primary_and_failover_moves_it() {
        let mut all = vec![m("dc1", 1, "p:1", true)];
        for dc in 2..=4 {
            for k in 0..3 {
                all.push(m(&format!("dc{dc}"), dc * 10 + k, &format!("r{dc}{k}:1"), false));
            }
        }
        // A follower without a sync port is never a leader.
        all.push(m("dc2", 99, "", false));
        let mut leaders = std::collections::BTreeSet::new();
        for table in ["user", "item", "ads", "geo", "query", "video"] {
            for dc in 2..=4u32 {
                let dcn = format!("dc{dc}");
                let l = leader(&all, &dcn, table).unwrap();
                leaders.insert(l.replica);
                // The leader pulls from the primary; the others of its DC from the leader.
                assert_eq!(choose_source(&all, l.replica, &dcn, table).as_deref(), Some("p:1"));
                for r in all.iter().filter(|r| r.dc == dcn && r.replica != l.replica) {
                    assert_eq!(choose_source(&all, r.replica, &dcn, table), Some(l.addr.clone()));
                }
            }
            // A primary has no other primary to pull from.
            assert_eq!(choose_source(&all, 1, "dc1", table), None);
        }
        assert!(leaders.len() > 3, "leadership spreads over tables: {leaders:?}");
        // The leader dies: the next one takes over, and the survivors agree on it.
        let l = leader(&all, "dc3", "item").unwrap().replica;
        let rest: Vec<Member> = all.iter().filter(|r| r.replica != l).cloned().collect();
        let l2 = leader(&rest, "dc3", "item").unwrap().clone();
        assert_ne!(l2.replica, l);
        for r in rest.iter().filter(|r| r.dc == "dc3" && r.replica != l2.replica) {
            assert_eq!(choose_source(&rest, r.replica, "dc3", "item"), Some(l2.addr.clone()));
        }
        // No primary registered: the leader has no source yet.
        let none: Vec<Member> = rest.iter().filter(|r| !r.primary).cloned().collect();
        assert_eq!(choose_source(&none, l2.replica, "dc3", "item"), None);
    }
}
