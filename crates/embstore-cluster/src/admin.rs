//! The calls a roll's coordinator makes to one server's `Admin` service: [`AdminCall`] and
//! [`admin`], which makes one within a timeout and says why when the server refuses or the
//! transport fails.

use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::v1::ServerInfo;
use tonic::Code;

use crate::rpc::{channel, from_status, request, tls_cause, ClientTls};

/// The calls a roll's coordinator makes to one server's `Admin` service (served only by a
/// server started with admin calls enabled). Each returns the server's `ServerInfo` after
/// the change.
#[derive(Clone, Debug)]
pub enum AdminCall {
    /// Load shard `shard` of `num_shards` of `table` from the checkpoint at `checkpoint` (a
    /// path on the server's machine) as `version`.
    Load { table: String, version: u64, shard: u32, num_shards: u32, checkpoint: String },
    /// Mark `version` of `table` DRAINING (only shard `shard`, if given).
    Drain { table: String, version: u64, shard: Option<u32> },
    /// Stop serving `version` of `table` (only shard `shard`, if given).
    Unload { table: String, version: u64, shard: Option<u32> },
}

/// Makes `call` to the server at `addr`, within `timeout` (a load reads a whole shard), with
/// `token` if the server asks for one, over TLS when `tls` is given.
pub async fn admin(
    addr: &str,
    call: AdminCall,
    timeout: Duration,
    token: Option<&str>,
    tls: Option<&ClientTls>,
) -> Result<ServerInfo> {
    use embstore_proto::v1::admin_client::AdminClient;
    use embstore_proto::v1::{LoadRequest, VersionRequest};
    let mut rpc = AdminClient::new(channel(addr, timeout, tls)?);
    let call = async move {
        match call {
            AdminCall::Load { table, version, shard, num_shards, checkpoint } => {
                let msg = LoadRequest { table, version, shard, num_shards, checkpoint };
                rpc.load(request(msg, token)).await
            }
            AdminCall::Drain { table, version, shard } => {
                rpc.drain(request(VersionRequest { table, version, shard }, token)).await
            }
            AdminCall::Unload { table, version, shard } => {
                rpc.unload(request(VersionRequest { table, version, shard }, token)).await
            }
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(info)) => Ok(info.into_inner()),
        Ok(Err(status)) if status.code() == Code::Unimplemented => Err(Error::new(
            ErrorKind::Unsupported,
            format!("{addr} does not take admin calls (start it with --admin)"),
        )),
        Ok(Err(status)) => {
            let e = from_status(&status);
            match tls_cause(addr, &status, tls.is_some()).await {
                Some(cause) if e.kind() == ErrorKind::Unavailable => {
                    Err(Error::new(e.kind(), format!("{addr}: {cause}")))
                }
                _ => Err(e),
            }
        }
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            format!("admin call to {addr} passed its timeout of {timeout:?}"),
        )),
    }
}
