//! A rollback's requests to a source's sync port ([`rollback`]): the manager pauses and
//! resumes its writes, a witness writes its diff there. Each request is one connection: HELLO,
//! then ROLLBACK answered by ROLLBACK_DONE (or an error).

use embstore_common::{Error, Result};

use super::link::connect;
use super::FollowOptions;
use crate::wire::{self, Kind};

/// Sends `request` to the sync port at `source` (with `options`' token and TLS); returns how
/// many tables (pause, resume) or rows (write) it changed there.
pub fn rollback(source: &str, options: &FollowOptions, request: &wire::Rollback) -> Result<u64> {
    let (mut conn, _replica, _infos) = connect(source, options, &[])?;
    conn.send(Kind::Rollback, &request.encode())?;
    let b = conn.expect(Kind::RollbackDone)?;
    let n: [u8; 8] = b
        .as_slice()
        .try_into()
        .map_err(|_| Error::corrupt("a ROLLBACK_DONE frame must hold 8 bytes"))?;
    Ok(u64::from_le_bytes(n))
}
