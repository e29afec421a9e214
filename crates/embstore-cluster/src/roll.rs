//! A roll of one table to a new version over a fixed cluster ([`RollPlan`], [`roll`]): the
//! spare column loads, columns move one at a time (drain, wait until quiet, unload, load), the
//! spare column unloads. Every column not yet moved serves the old version, so clients read
//! one complete version throughout.

use std::time::Duration;

use embstore_common::{now_ms, Error, ErrorKind, Result};
use embstore_proto::v1::serving_client::ServingClient;
use embstore_proto::v1::{DescribeRequest, ServerInfo};

use crate::admin::{admin, AdminCall};
use crate::rpc::{channel, request, ClientTls};

/// A roll of one table to a new version over a fixed cluster (docs/serving.md, "A roll"):
/// `columns[r][s]` is the server of replica `r` of shard `s`, `spare[s]` the spare column's.
#[derive(Clone, Debug)]
pub struct RollPlan {
    pub table: String,
    /// The version to serve, and the checkpoint (a path on the servers) it comes from.
    pub version: u64,
    pub checkpoint: String,
    /// The version the columns serve now (unloaded as each column moves); `None`: nothing.
    pub old_version: Option<u64>,
    /// The old version's shard count, when known: a column's server then drains and unloads
    /// only its own shard of it (it may hold others, taken over from a dead server); `None`
    /// (unknown, or a re-sharding roll): the whole old version there.
    pub old_num_shards: Option<u32>,
    pub columns: Vec<Vec<String>>,
    /// One server per shard that holds the new version while the columns move (1/R extra
    /// memory, no loss of capacity); empty: no spare column (the first version of a table, or
    /// too few servers — capacity then drops by one replica while a column moves).
    pub spare: Vec<String>,
    /// A draining replica is unloaded once no lookup named the old version there for this
    /// long, or after `drain_max` in all.
    pub drain_quiet: Duration,
    pub drain_max: Duration,
    /// The longest one load may take.
    pub load_timeout: Duration,
    /// The admin token, if the servers ask for one.
    pub token: Option<String>,
    /// TLS towards the servers, if they serve it.
    pub tls: Option<ClientTls>,
}

impl RollPlan {
    /// An admin call to `addr` with the plan's token and TLS.
    async fn call(&self, addr: &str, call: AdminCall, timeout: Duration) -> Result<ServerInfo> {
        admin(addr, call, timeout, self.token.as_deref(), self.tls.as_ref()).await
    }
}

/// Runs `plan`: the spare column loads the new version; then, column by column, each server
/// drains the old version, waits until it is quiet, unloads it and loads the new one; then the
/// spare column unloads. `progress` gets a line per step. On an error the roll stops where it
/// is and says which step failed: every column not yet moved still serves the old version, so
/// clients keep reading one complete version throughout.
pub async fn roll(plan: &RollPlan, mut progress: impl FnMut(&str)) -> Result<()> {
    let shards = plan.shard_count()?;
    for (s, addr) in plan.spare.iter().enumerate() {
        progress(&format!("spare {addr}: load version {} shard {s}/{shards}", plan.version));
        let load = plan.load(s, shards);
        plan.call(addr, load, plan.load_timeout).await.map_err(at(format!("spare {addr}")))?;
    }
    for (r, column) in plan.columns.iter().enumerate() {
        move_column(plan, r, column, shards, &mut progress).await?;
    }
    for (s, addr) in plan.spare.iter().enumerate() {
        progress(&format!("spare {addr}: unload version {}", plan.version));
        let call = AdminCall::Unload {
            table: plan.table.clone(),
            version: plan.version,
            shard: Some(s as u32),
        };
        plan.call(addr, call, QUICK).await.map_err(at(format!("spare {addr}")))?;
    }
    progress(&format!("done: table '{}' at version {}", plan.table, plan.version));
    Ok(())
}

/// The longest a drain or an unload may take.
const QUICK: Duration = Duration::from_secs(10);

/// An error at step `what`, saying so.
fn at(what: String) -> impl Fn(Error) -> Error {
    move |e: Error| Error::new(e.kind(), format!("{what}: {e}"))
}

impl RollPlan {
    /// The shard count the plan names: the spare column's when there is one, else the first
    /// column's. Fails with `InvalidArgument` unless it is a power of two and every column
    /// (and the spare column) has one server per shard.
    fn shard_count(&self) -> Result<usize> {
        let shards = match self.spare.len() {
            0 => self.columns.first().map_or(0, Vec::len),
            n => n,
        };
        if shards == 0 || !shards.is_power_of_two() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("a column must have a power-of-two number of servers, got {shards}"),
            ));
        }
        if let Some(bad) = self.columns.iter().find(|c| c.len() != shards) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("every column needs {shards} servers (one per shard), got {bad:?}"),
            ));
        }
        if !self.spare.is_empty() && self.spare.len() != shards {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the spare column needs {shards} servers (one per shard), got {:?}",
                    self.spare
                ),
            ));
        }
        Ok(shards)
    }

    /// The load of shard `shard` of `shards` of the new version.
    fn load(&self, shard: usize, shards: usize) -> AdminCall {
        AdminCall::Load {
            table: self.table.clone(),
            version: self.version,
            shard: shard as u32,
            num_shards: shards as u32,
            checkpoint: self.checkpoint.clone(),
        }
    }

    /// The old version's shard a column's server holds at position `s`, if the count is
    /// known and the same (else the whole old version there is drained and unloaded).
    fn old_shard(&self, s: usize, shards: usize) -> Option<u32> {
        self.old_num_shards.filter(|&n| n as usize == shards).map(|_| s as u32)
    }
}

/// Moves column `r` to the new version: each server drains the old version, the column waits
/// until it is quiet, then each server unloads the old version and loads the new one.
async fn move_column(
    plan: &RollPlan,
    r: usize,
    column: &[String],
    shards: usize,
    progress: &mut impl FnMut(&str),
) -> Result<()> {
    if let Some(old) = plan.old_version {
        for (s, addr) in column.iter().enumerate() {
            progress(&format!("column {r} {addr}: drain version {old}"));
            let call = AdminCall::Drain {
                table: plan.table.clone(),
                version: old,
                shard: plan.old_shard(s, shards),
            };
            match plan.call(addr, call, QUICK).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::TableNotFound => continue, // not held
                Err(e) => return Err(at(format!("column {r} {addr}"))(e)),
            }
        }
        let token = plan.token.as_deref();
        let (quiet, max, tls) = (plan.drain_quiet, plan.drain_max, plan.tls.as_ref());
        wait_quiet(&plan.table, old, column, quiet, max, token, tls).await;
    }
    for (s, addr) in column.iter().enumerate() {
        if let Some(old) = plan.old_version {
            let call = AdminCall::Unload {
                table: plan.table.clone(),
                version: old,
                shard: plan.old_shard(s, shards),
            };
            match plan.call(addr, call, QUICK).await {
                Ok(_) => progress(&format!("column {r} {addr}: unloaded version {old}")),
                Err(e) if e.kind() == ErrorKind::TableNotFound => {}
                Err(e) => return Err(at(format!("column {r} {addr}"))(e)),
            }
        }
        progress(&format!("column {r} {addr}: load version {} shard {s}/{shards}", plan.version));
        plan.call(addr, plan.load(s, shards), plan.load_timeout)
            .await
            .map_err(at(format!("column {r} {addr}")))?;
    }
    Ok(())
}

/// Waits until no lookup named `version` of `table` on any of `servers` for `quiet`, or
/// `max` has passed.
async fn wait_quiet(
    table: &str,
    version: u64,
    servers: &[String],
    quiet: Duration,
    max: Duration,
    token: Option<&str>,
    tls: Option<&ClientTls>,
) {
    let start = std::time::Instant::now();
    let quiet_ms = quiet.as_millis() as u64;
    while start.elapsed() < max {
        let mut busy = false;
        for addr in servers {
            let Ok(ch) = channel(addr, Duration::from_secs(2), tls) else { continue };
            let req = request(DescribeRequest {}, token);
            let Ok(info) = ServingClient::new(ch).describe(req).await else {
                continue;
            };
            let now = now_ms();
            busy |= info.into_inner().held.iter().any(|h| {
                h.table == table
                    && h.version == version
                    && h.last_request_ms > 0
                    && now.saturating_sub(h.last_request_ms) < quiet_ms
            });
        }
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
