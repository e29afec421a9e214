//! A thin etcd v3 client over tonic: the calls coordination needs (ranges, puts, deletes,
//! compare-and-swap, leases) and nothing else. Each call tries the endpoints in turn and gives
//! up with `Unavailable` after the call timeout on each.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};
use embstore_proto::etcd::compare::{CompareResult, CompareTarget, TargetUnion};
use embstore_proto::etcd::kv_client::KvClient;
use embstore_proto::etcd::lease_client::LeaseClient;
use embstore_proto::etcd::request_op::Request as Op;
use embstore_proto::etcd::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use tonic::transport::Channel;

/// One key as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    /// The store revision of the key's last change: what [`Etcd::put_if`] compares.
    pub mod_revision: i64,
    /// The lease the key lives under (0: none).
    pub lease: i64,
}

/// A client of one etcd cluster (see the module docs).
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    timeout: Duration,
    /// The endpoint that answered last: calls start there.
    current: AtomicUsize,
}

/// The end of the range of keys starting with `prefix` (etcd's "prefix + 1").
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

impl Etcd {
    /// A client of the etcd members at `endpoints` (`http://host:port` or `host:port`; one
    /// string may list several, comma-separated). Connects lazily: a call fails with
    /// `Unavailable` when no member answers within `timeout`.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Self> {
        let endpoints: Vec<String> = endpoints
            .iter()
            .flat_map(|e| e.split(','))
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "no etcd endpoint given"));
        }
        let mut channels = Vec::with_capacity(endpoints.len());
        for e in &endpoints {
            let uri = if e.contains("://") { e.clone() } else { format!("http://{e}") };
            let ep = Channel::from_shared(uri).map_err(|err| {
                Error::new(ErrorKind::InvalidArgument, format!("bad etcd endpoint '{e}': {err}"))
            })?;
            channels.push(ep.connect_timeout(timeout).connect_lazy());
        }
        Ok(Self { endpoints, channels, timeout, current: AtomicUsize::new(0) })
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Runs `call` on each endpoint in turn, starting with the one that answered last, until
    /// one answers (an error from etcd itself, such as a compare that failed, is an answer).
    async fn call<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.channels.len();
        let first = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for k in 0..n {
            let i = (first + k) % n;
            match tokio::time::timeout(self.timeout, call(self.channels[i].clone())).await {
                Ok(Ok(resp)) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) if status.code() != tonic::Code::Unavailable => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("etcd {what} at {}: {}", self.endpoints[i], status.message()),
                    ));
                }
                Ok(Err(status)) => last = format!("{}: {}", self.endpoints[i], status.message()),
                Err(_) => last = format!("{}: no answer in {:?}", self.endpoints[i], self.timeout),
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("etcd {what}: {last}")))
    }

    /// The keys starting with `prefix`, in key order.
    pub async fn range_prefix(&self, prefix: &str) -> Result<Vec<Kv>> {
        let req = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        let resp = self
            .call("range", |ch| {
                let req = req.clone();
                async move { KvClient::new(ch).range(req).await }
            })
            .await?;
        Ok(resp
            .kvs
            .into_iter()
            .map(|kv| Kv {
                key: String::from_utf8_lossy(&kv.key).into_owned(),
                value: kv.value,
                mod_revision: kv.mod_revision,
                lease: kv.lease,
            })
            .collect())
    }

    /// The key `key`, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<Kv>> {
        let req = RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let resp = self
            .call("get", |ch| {
                let req = req.clone();
                async move { KvClient::new(ch).range(req).await }
            })
            .await?;
        Ok(resp.kvs.into_iter().next().map(|kv| Kv {
            key: key.to_string(),
            value: kv.value,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        }))
    }

    /// Sets `key` to `value`, under `lease` (0: none).
    pub async fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let req = PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
            prev_kv: false,
        };
        self.call("put", |ch| {
            let req = req.clone();
            async move { KvClient::new(ch).put(req).await }
        })
        .await
        .map(|_| ())
    }

    /// Sets `key` to `value` (under `lease`) only if its last change was at `mod_revision`
    /// (0: only if the key does not exist); whether it did. The compare-and-swap every
    /// coordinator writes with, so that two writers never both win.
    pub async fn put_if(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<bool> {
        let req = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: key.as_bytes().to_vec(),
                target_union: Some(TargetUnion::ModRevision(mod_revision)),
            }],
            success: vec![RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                    lease,
                    prev_kv: false,
                })),
            }],
            failure: vec![],
        };
        let resp = self
            .call("txn", |ch| {
                let req = req.clone();
                async move { KvClient::new(ch).txn(req).await }
            })
            .await?;
        Ok(resp.succeeded)
    }

    /// Deletes `key` (nothing if it does not exist).
    pub async fn delete(&self, key: &str) -> Result<()> {
        let req = DeleteRangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        self.call("delete", |ch| {
            let req = req.clone();
            async move { KvClient::new(ch).delete_range(req).await }
        })
        .await
        .map(|_| ())
    }

    /// A new lease that expires `ttl` after its last keep-alive; its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64> {
        let req = LeaseGrantRequest { ttl: ttl.as_secs().max(1) as i64, id: 0 };
        let resp = self
            .call("lease grant", |ch| async move { LeaseClient::new(ch).lease_grant(req).await })
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::new(ErrorKind::Unavailable, format!("etcd lease: {}", resp.error)));
        }
        Ok(resp.id)
    }

    /// Renews lease `id` once; `false` if it has expired (its keys are gone).
    pub async fn keep_alive(&self, id: i64) -> Result<bool> {
        use tokio_stream::StreamExt;
        let mut stream = self
            .call("lease keep-alive", |ch| async move {
                let once = tokio_stream::once(LeaseKeepAliveRequest { id });
                LeaseClient::new(ch).lease_keep_alive(once).await
            })
            .await?;
        match tokio::time::timeout(self.timeout, stream.next()).await {
            Ok(Some(Ok(resp))) => Ok(resp.ttl > 0),
            Ok(Some(Err(status))) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("etcd lease keep-alive: {}", status.message()),
            )),
            Ok(None) | Err(_) => {
                Err(Error::new(ErrorKind::Unavailable, "etcd lease keep-alive: no answer"))
            }
        }
    }

    /// Ends lease `id` now: its keys are deleted.
    pub async fn revoke(&self, id: i64) -> Result<()> {
        let req = LeaseRevokeRequest { id };
        self.call("lease revoke", |ch| async move { LeaseClient::new(ch).lease_revoke(req).await })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_range_ends_after_every_key_with_the_prefix() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert!(b"/a/zzz".to_vec() < prefix_end("/a/") && b"/a0".to_vec() >= prefix_end("/a/"));
    }
}
