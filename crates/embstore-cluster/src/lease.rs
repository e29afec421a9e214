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

/// A lease a task keeps alive, renewing it every TTL/3, until it is ended (revoked: its keys go
/// at once) or dropped (left to expire after the TTL): the one lease keeper of every etcd
/// registration (a server's naming key, a roll lock, a sync member).
///
/// With a key (a registration), a lost lease (etcd restarted, or the process stalled past the
/// TTL) is replaced by a new one and the key put under it again with its latest value
/// ([`LeaseKeeper::set_value`]); without (a lock), a lost lease stays lost.
#[derive(Debug)]
pub struct LeaseKeeper {
    etcd: Arc<Etcd>,
    id: Arc<AtomicI64>,
    value: Arc<parking_lot::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Grants a lease of `ttl`, puts `key` = `value` under it and keeps it (on the current
    /// tokio runtime); fails if etcd does not answer now.
    pub async fn register(etcd: Arc<Etcd>, key: &str, value: &[u8], ttl: Duration) -> Result<Self> {
        let lease = etcd.grant(ttl).await?;
        etcd.put(key, value, lease).await?;
        Ok(Self::keep(etcd, lease, ttl, Some((key.to_owned(), value.to_vec()))))
    }

    /// Keeps lease `id` of `ttl` alive; with `again` (a key and its value), put again under a
    /// new lease when the lease is lost.
    fn keep(etcd: Arc<Etcd>, id: i64, ttl: Duration, again: Option<(String, Vec<u8>)>) -> Self {
        let id = Arc::new(AtomicI64::new(id));
        let (key, value) = match again {
            Some((k, v)) => (Some(k), v),
            None => (None, Vec::new()),
        };
        let value = Arc::new(parking_lot::Mutex::new(value));
        let (e, current, latest) = (etcd.clone(), id.clone(), value.clone());
        let task = tokio::spawn(async move {
            let every = (ttl / 3).max(Duration::from_millis(200));
            loop {
                tokio::time::sleep(every).await;
                // Errors: etcd away; try again next time (serving goes on meanwhile).
                let lost = matches!(e.keep_alive(current.load(Ordering::Relaxed)).await, Ok(false));
                if let (true, Some(key)) = (lost, &key) {
                    if let Ok(new) = e.grant(ttl).await {
                        let value = latest.lock().clone();
                        if e.put(key, &value, new).await.is_ok() {
                            current.store(new, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        Self { etcd, id, value, task }
    }

    /// The lease's id now (it changes when a lost lease is replaced).
    pub fn id(&self) -> i64 {
        self.id.load(Ordering::Relaxed)
    }

    /// The value the key is put with again if the lease is lost (the caller puts a changed
    /// value itself, under [`LeaseKeeper::id`]).
    pub fn set_value(&self, value: &[u8]) {
        *self.value.lock() = value.to_vec();
    }

    /// Ends the lease now: its keys are deleted.
    pub async fn end(self) {
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
pub struct Registration(LeaseKeeper);

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
    Ok(Registration(LeaseKeeper::register(etcd, &key, addr.as_bytes(), ttl).await?))
}

impl Registration {
    /// Ends the registration now (the naming key goes at once, not after the TTL).
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
    Ok(RollLock(LeaseKeeper::keep(etcd, lease, ttl, None)))
}

impl RollLock {
    /// Releases the lock.
    pub async fn release(self) {
        self.0.end().await;
    }
}
