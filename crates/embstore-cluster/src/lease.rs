//! Leases and what lives under them: the [`LeaseKeeper`] of every registration, a server's
//! naming key ([`register`], listed by [`members`]) and a table's roll lock ([`roll_lock`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};

use crate::etcd::Etcd;
use crate::{NAMING, ROLL_LOCK};

/// The instances registered now, sorted, with the addresses to dial.
pub async fn members(etcd: &Etcd) -> Result<Vec<(String, String)>> {
    Ok(etcd
        .range_prefix(NAMING)
        .await?
        .into_iter()
        .map(|kv| {
            let instance = kv.key[NAMING.len()..].to_string();
            (instance, String::from_utf8_lossy(&kv.value).into_owned())
        })
        .collect())
}

/// A registration's keys and their latest values.
type Keys = Vec<(String, Vec<u8>)>;

/// A lease a task keeps alive, renewing it every TTL/3, until it is ended (revoked: its keys go
/// at once) or dropped (left to expire after the TTL): the one lease keeper of every etcd
/// registration (a server's naming key, a roll lock, a sync member).
///
/// A registration's keeper holds keys ([`LeaseKeeper::register`], [`LeaseKeeper::add`]): a lost
/// lease (etcd restarted, or the process stalled past the TTL) is replaced by a new one and
/// every key put under it again with its latest value ([`LeaseKeeper::set_value_of`]). So a
/// process that both serves and syncs keeps both its keys under one lease with one renewal
/// loop: they live, are lost and come back together, and one revoke removes both. A lock's
/// keeper holds no key, and a lost lease stays lost.
#[derive(Debug)]
pub struct LeaseKeeper {
    etcd: Arc<Etcd>,
    id: Arc<AtomicI64>,
    /// The keys put again under a new lease, with their latest values.
    keys: Arc<parking_lot::Mutex<Keys>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Grants a lease of `ttl`, puts `key` = `value` under it and keeps it (on the current
    /// tokio runtime); fails if etcd does not answer now.
    pub async fn register(etcd: Arc<Etcd>, key: &str, value: &[u8], ttl: Duration) -> Result<Self> {
        let keeper = Self::shared(etcd, ttl).await?;
        keeper.add(key, value).await?;
        Ok(keeper)
    }

    /// Grants a lease of `ttl` with no key yet, kept (on the current tokio runtime) as a
    /// registration's: the keys [`LeaseKeeper::add`] puts under it come back with a new lease
    /// when it is lost. Fails if etcd does not answer now.
    pub async fn shared(etcd: Arc<Etcd>, ttl: Duration) -> Result<Self> {
        let lease = etcd.grant(ttl).await?;
        Ok(Self::keep(etcd, lease, ttl, true))
    }

    /// Keeps lease `id` of `ttl` alive; with `again` (a registration), its keys are put again
    /// under a new lease when the lease is lost.
    fn keep(etcd: Arc<Etcd>, id: i64, ttl: Duration, again: bool) -> Self {
        let id = Arc::new(AtomicI64::new(id));
        let keys = Arc::new(parking_lot::Mutex::new(Keys::new()));
        let (e, current, latest) = (etcd.clone(), id.clone(), keys.clone());
        let task = tokio::spawn(async move {
            let every = (ttl / 3).max(Duration::from_millis(200));
            loop {
                tokio::time::sleep(every).await;
                // Errors: etcd away; try again next time (serving goes on meanwhile).
                let lost = matches!(e.keep_alive(current.load(Ordering::Relaxed)).await, Ok(false));
                if !(lost && again) {
                    continue;
                }
                let Ok(new) = e.grant(ttl).await else { continue };
                let keys = latest.lock().clone();
                let mut all = true;
                for (key, value) in &keys {
                    all &= e.put(key, value, new).await.is_ok();
                }
                if all {
                    current.store(new, Ordering::Relaxed);
                } else {
                    // Tried again at the next tick, under another new lease.
                    let _ = e.revoke(new).await;
                }
            }
        });
        Self { etcd, id, keys, task }
    }

    /// The lease's id now (it changes when a lost lease is replaced).
    pub fn id(&self) -> i64 {
        self.id.load(Ordering::Relaxed)
    }

    /// Puts `key` = `value` under the lease now, and again under a new lease if it is lost.
    pub async fn add(&self, key: &str, value: &[u8]) -> Result<()> {
        self.set_value_of(key, value);
        self.etcd.put(key, value, self.id()).await
    }

    /// The value the first key is put with again if the lease is lost (the caller puts a
    /// changed value itself, under [`LeaseKeeper::id`]).
    pub fn set_value(&self, value: &[u8]) {
        let mut keys = self.keys.lock();
        if let Some(first) = keys.first_mut() {
            first.1 = value.to_vec();
        }
    }

    /// The value `key` is put with again if the lease is lost (the caller puts a changed value
    /// itself, under [`LeaseKeeper::id`]); a key not held yet is added.
    pub fn set_value_of(&self, key: &str, value: &[u8]) {
        let mut keys = self.keys.lock();
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some(held) => held.1 = value.to_vec(),
            None => keys.push((key.to_owned(), value.to_vec())),
        }
    }

    /// Stops putting `key` again and deletes it now (the lease and its other keys stay).
    pub async fn remove(&self, key: &str) -> Result<()> {
        self.keys.lock().retain(|(k, _)| k != key);
        self.etcd.delete(key).await
    }

    /// Ends the lease now: its keys are deleted.
    pub async fn end(&self) {
        self.task.abort();
        let _ = self.etcd.revoke(self.id()).await;
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server's registration: its naming key lives while its lease is kept alive.
#[derive(Debug)]
pub struct Registration(Arc<LeaseKeeper>);

/// Registers `instance` (dialled at `addr`) under a lease of `ttl`, and keeps it registered:
/// the lease is renewed every `ttl / 3`, and the key registered again under a new lease if the
/// lease was lost (etcd restarted, or the process stalled past the TTL). Fails if etcd does
/// not answer now.
pub async fn register(
    etcd: Arc<Etcd>,
    instance: &str,
    addr: &str,
    ttl: Duration,
) -> Result<Registration> {
    let key = format!("{NAMING}{instance}");
    Ok(Registration(Arc::new(LeaseKeeper::register(etcd, &key, addr.as_bytes(), ttl).await?)))
}

/// [`register`] under a lease the process already keeps (with its sync membership's key):
/// one lease and one renewal loop for both.
pub async fn register_under(
    keeper: Arc<LeaseKeeper>,
    instance: &str,
    addr: &str,
) -> Result<Registration> {
    keeper.add(&format!("{NAMING}{instance}"), addr.as_bytes()).await?;
    Ok(Registration(keeper))
}

impl Registration {
    /// Ends the registration now: the lease is revoked, so the naming key (and any other key
    /// under the same lease) goes at once, not after the TTL.
    pub async fn deregister(self) {
        self.0.end().await;
    }
}

/// A held roll lock of one table (see [`roll_lock`]); released by [`RollLock::release`], or
/// by its lease expiring if the coordinator dies.
#[derive(Debug)]
pub struct RollLock(LeaseKeeper);

/// Takes table `table`'s roll lock for `coordinator`, under a lease of `ttl` kept alive while
/// held. Fails with `Locked`, naming the holder, if another coordinator holds it.
pub async fn roll_lock(
    etcd: Arc<Etcd>,
    table: &str,
    coordinator: &str,
    ttl: Duration,
) -> Result<RollLock> {
    let key = format!("{ROLL_LOCK}{table}");
    let lease = etcd.grant(ttl).await?;
    if !etcd.put_if(&key, coordinator.as_bytes(), 0, lease).await? {
        let _ = etcd.revoke(lease).await;
        let holder = etcd
            .get(&key)
            .await?
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .unwrap_or_else(|| "a coordinator that just finished".into());
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "a roll of table '{table}' is in progress, coordinated by {holder}; wait for it \
                 (if its coordinator died, its lock expires {}s after its last renewal)",
                ttl.as_secs()
            ),
        ));
    }
    Ok(RollLock(LeaseKeeper::keep(etcd, lease, ttl, false)))
}

impl RollLock {
    /// Releases the lock.
    pub async fn release(self) {
        self.0.end().await;
    }
}
