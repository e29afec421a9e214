//! The gRPC services over a [`Server`]: [`Serving`] (`Lookup`, `Describe`) and [`Admin`]
//! (`Load`, `Drain`, `Unload`, what a roll's coordinator calls), the lookup path behind them
//! (size checks, the named version, counting), [`to_status`] (the one mapping from table errors
//! to gRPC codes) and [`serve`], which runs them on a listener.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use embstore_common::{now_ms, shard_of_key};
use embstore_proto::frame::with_kind;
use embstore_proto::v1::admin_server::AdminServer;
use embstore_proto::v1::serving_server::ServingServer;
use embstore_proto::v1::{
    DescribeRequest, LoadRequest, LookupRequest, LookupResponse, ServerInfo, VersionRequest,
};
use prost::Message;
use tonic::{Code, Request, Response, Status};

use crate::hosting::{Hosted, Server, State};
use crate::tls::{ServerTls, Tokens};

/// Ids one lookup may carry, by default (a batch above the configured maximum gets
/// `RESOURCE_EXHAUSTED`): 1M ids of D 256 are a 1 GiB answer.
pub const DEFAULT_MAX_BATCH: usize = 1 << 20;

/// Bytes of a lookup request beyond its ids (table name, version, shard, framing) that a
/// server decodes: table names are short, 64 KiB is ample.
const REQUEST_SLACK: usize = 64 << 10;

/// The most bytes a server decodes of one lookup request of at most `max_batch` ids: each id
/// takes at most 10 bytes on the wire (a varint), so every batch within the maximum decodes
/// and is answered, or refused by the maximum, never by the transport.
pub fn request_limit(max_batch: usize) -> usize {
    max_batch.saturating_mul(10).saturating_add(REQUEST_SLACK)
}

/// The largest answer a server sends: a gRPC frame's length is 32 bits. A lookup whose rows
/// would pass it (over 4M ids at D 256) is refused as too large, before any row is read.
pub(crate) const MAX_ANSWER_BYTES: usize = u32::MAX as usize - (64 << 20);

/// Lookups of at most this many ids of a table in memory run on the I/O thread that received
/// them (about 100 µs of copying at D 256); larger ones and tiered tables' go to the blocking
/// pool.
const INLINE_LOOKUP_IDS: usize = 1024;
/// What a lookup reads: the hosted shards it names, the request's `shard` first, then its
/// `more_shards` in order (the same version of one table; with version 0, each shard's newest).
#[derive(Debug, Clone)]
pub(crate) struct Shards(Vec<Arc<Hosted>>);

impl Shards {
    /// The version the answer carries (the first shard's).
    pub(crate) fn version(&self) -> u64 {
        self.0[0].version
    }

    pub(crate) fn dim(&self) -> usize {
        self.0[0].table.dim()
    }

    fn may_block(&self) -> bool {
        self.0.iter().any(|h| h.table.may_block())
    }
}

impl Server {
    /// The hosted shards a request names, if this server serves every one of them.
    pub(crate) fn find(&self, req: &LookupRequest) -> Result<Shards, Status> {
        let tables = self.tables.read();
        let Some(held) = tables.get(&req.table) else {
            return Err(
                self.status(Code::NotFound, format!("table '{}' is not served here", req.table))
            );
        };
        if req.more_shards.len() >= req.num_shards as usize {
            return Err(self.status(
                Code::InvalidArgument,
                format!(
                    "a lookup names {} shards of a version of {} shards",
                    req.more_shards.len() + 1,
                    req.num_shards
                ),
            ));
        }
        let mut out = Vec::with_capacity(1 + req.more_shards.len());
        for &shard in std::iter::once(&req.shard).chain(&req.more_shards) {
            if out.iter().any(|h: &Arc<Hosted>| h.shard == shard) {
                return Err(self
                    .status(Code::InvalidArgument, format!("a lookup names shard {shard} twice")));
            }
            // Version 0: the newest version held for this shard (the protocol switched off,
            // for the checker and the benchmark: answers of one batch may then mix versions).
            let hosted = match req.version {
                0 => held
                    .iter()
                    .rev()
                    .find(|h| h.state != State::Loading && h.shard == shard)
                    .cloned(),
                v => held.iter().find(|h| h.version == v && h.shard == shard).cloned(),
            };
            match hosted {
                Some(h)
                    if h.state != State::Loading
                        && h.shard == shard
                        && h.num_shards == req.num_shards
                        && out
                            .first()
                            .is_none_or(|f: &Arc<Hosted>| f.table.dim() == h.table.dim()) =>
                {
                    h.last_request_ms.store(now_ms(), Ordering::Relaxed);
                    out.push(h);
                }
                _ => {
                    return Err(self.status(
                        Code::FailedPrecondition,
                        format!(
                            "version {} shard {shard} of {} of table '{}' is not served here",
                            req.version, req.num_shards, req.table
                        ),
                    ))
                }
            }
        }
        Ok(Shards(out))
    }

    /// A status of `code` carrying this server's `ServerInfo` in its details.
    pub(crate) fn status(&self, code: Code, message: String) -> Status {
        Status::with_details(code, message, self.info().encode_to_vec().into())
    }

    /// A lookup as the service answers it (for the tests, which call it without the service).
    #[cfg(test)]
    pub(crate) fn lookup(&self, req: &LookupRequest) -> Result<LookupResponse, Status> {
        self.lookup_in(req, self.target(req))
    }

    /// The hosted shards a lookup reads, after checking its size.
    pub(crate) fn target(&self, req: &LookupRequest) -> Result<Shards, Status> {
        if req.ids.len() > self.max_batch {
            return Err(self.status(
                Code::ResourceExhausted,
                format!("a lookup holds at most {} ids, got {}", self.max_batch, req.ids.len()),
            ));
        }
        let hosted = self.find(req)?;
        let answer = req.ids.len().saturating_mul(hosted.dim() * 4 + 1);
        if answer > MAX_ANSWER_BYTES {
            return Err(self.status(
                Code::ResourceExhausted,
                format!(
                    "the answer to {} ids of dim {} would be {answer} bytes, over the limit of \
                     {MAX_ANSWER_BYTES}: split the batch",
                    req.ids.len(),
                    hosted.dim()
                ),
            ));
        }
        Ok(hosted)
    }

    /// Answers `req` from `target` (what [`Server::target`] gave for it) and counts it.
    pub(crate) fn lookup_in(
        &self,
        req: &LookupRequest,
        target: Result<Shards, Status>,
    ) -> Result<LookupResponse, Status> {
        let start = std::time::Instant::now();
        let result = target.and_then(|hosted| self.read(req, &hosted));
        self.count(req, start, result.as_ref().err());
        result
    }

    /// Counts a lookup that began at `start` by its outcome (`failed`: its status), for both
    /// transports.
    pub(crate) fn count(
        &self,
        req: &LookupRequest,
        start: std::time::Instant,
        failed: Option<&Status>,
    ) {
        let table = vec![("table".to_string(), req.table.clone())];
        let outcome = match failed {
            None => "ok".to_string(),
            Some(s) => format!("{:?}", s.code()).to_lowercase(),
        };
        let mut labels = table.clone();
        labels.push(("outcome".to_string(), outcome));
        self.metrics.lookups.get_or_create(&labels).inc();
        if failed.is_none() {
            self.metrics.ids.get_or_create(&table).inc_by(req.ids.len() as u64);
            self.metrics.seconds.get_or_create(&table).observe(start.elapsed().as_secs_f64());
        }
    }

    pub(crate) fn read(
        &self,
        req: &LookupRequest,
        hosted: &Shards,
    ) -> Result<LookupResponse, Status> {
        let dim = hosted.dim();
        let mut values = vec![0f32; req.ids.len() * dim];
        let mut found = vec![false; req.ids.len()];
        self.read_into(req, hosted, &mut values, &mut found)?;
        let current = self.gen.load(Ordering::Acquire);
        Ok(LookupResponse {
            info: (req.known_gen != current).then(|| self.info()),
            version: hosted.version(),
            embedding_dim: dim as u32,
            values: embstore_proto::encode_rows(&values),
            found: found.into_iter().map(u8::from).collect(),
        })
    }

    /// Writes the rows of `req.ids` from `hosted` into `values` (`ids × dim`) and `found`: the
    /// one read both transports make. A lookup of several shards reads each shard's ids from
    /// its own rows (an id in a shard the request does not name is refused).
    pub(crate) fn read_into(
        &self,
        req: &LookupRequest,
        hosted: &Shards,
        values: &mut [f32],
        found: &mut [bool],
    ) -> Result<(), Status> {
        let failed = |e: embstore_common::Error| {
            with_kind(self.status(to_status(e.kind()), e.to_string()), e.kind())
        };
        let [one] = hosted.0.as_slice() else {
            return self.read_shards(req, hosted, values, found, failed);
        };
        one.table.lookup(&req.ids, values, found).map_err(failed)
    }

    fn read_shards(
        &self,
        req: &LookupRequest,
        hosted: &Shards,
        values: &mut [f32],
        found: &mut [bool],
        failed: impl Fn(embstore_common::Error) -> Status,
    ) -> Result<(), Status> {
        let (dim, num_shards) = (hosted.dim(), req.num_shards as usize);
        let mut by_shard = vec![(Vec::new(), Vec::new()); hosted.0.len()];
        for (pos, &id) in req.ids.iter().enumerate() {
            let s = shard_of_key(id, num_shards) as u32;
            let Some(i) = hosted.0.iter().position(|h| h.shard == s) else {
                return Err(self.status(
                    Code::InvalidArgument,
                    format!("id {id} is in shard {s}, which the lookup does not name"),
                ));
            };
            by_shard[i].0.push(id);
            by_shard[i].1.push(pos);
        }
        let mut rows = Vec::new();
        let mut hits = Vec::new();
        for (h, (ids, positions)) in hosted.0.iter().zip(&by_shard) {
            rows.clear();
            rows.resize(ids.len() * dim, 0f32);
            hits.clear();
            hits.resize(ids.len(), false);
            h.table.lookup(ids, &mut rows, &mut hits).map_err(&failed)?;
            for (j, &pos) in positions.iter().enumerate() {
                values[pos * dim..][..dim].copy_from_slice(&rows[j * dim..][..dim]);
                found[pos] = hits[j];
            }
        }
        Ok(())
    }

    /// Whether `req` (for `target`) runs on the I/O thread that received it: a small lookup of
    /// rows in memory takes microseconds (a hand-off to the blocking pool costs more); a large
    /// one, or one that may read from disk, goes off the I/O threads.
    pub(crate) fn inline(req: &LookupRequest, target: &Result<Shards, Status>) -> bool {
        target.as_ref().map_or(true, |h| req.ids.len() <= INLINE_LOOKUP_IDS && !h.may_block())
    }
}

/// The gRPC code of a table error (the one mapping, shared with the framed path); the kind
/// itself travels beside it in the status metadata (`frame::with_kind`).
pub use embstore_proto::frame::status_code as to_status;

/// The `Serving` service over a [`Server`].
#[derive(Debug, Clone)]
pub struct Serving(pub Arc<Server>);

#[tonic::async_trait]
impl embstore_proto::v1::serving_server::Serving for Serving {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let server = self.0.clone();
        let req = request.into_inner();
        let target = server.target(&req);
        if Server::inline(&req, &target) {
            return server.lookup_in(&req, target).map(Response::new);
        }
        tokio::task::spawn_blocking(move || server.lookup_in(&req, target))
            .await
            .map_err(|e| Status::internal(format!("lookup task failed: {e}")))?
            .map(Response::new)
    }

    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        Ok(Response::new(self.0.info()))
    }
}

/// The `Admin` service over a [`Server`]: what a roll's coordinator calls.
#[derive(Debug, Clone)]
pub struct Admin(pub Arc<Server>);

#[tonic::async_trait]
impl embstore_proto::v1::admin_server::Admin for Admin {
    async fn load(&self, request: Request<LoadRequest>) -> Result<Response<ServerInfo>, Status> {
        let server = self.0.clone();
        let r = request.into_inner();
        tokio::task::spawn_blocking(move || {
            let ckpt = std::path::Path::new(&r.checkpoint);
            server.load(&r.table, r.version, r.shard, r.num_shards, ckpt).map_err(|e| {
                let status =
                    server.status(to_status(e.kind()), format!("load of '{}': {e}", r.table));
                with_kind(status, e.kind())
            })?;
            Ok(Response::new(server.info()))
        })
        .await
        .map_err(|e| Status::internal(format!("load task failed: {e}")))?
    }

    async fn drain(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        self.change(request.into_inner(), Server::drain)
    }

    async fn unload(
        &self,
        request: Request<VersionRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        self.change(request.into_inner(), Server::unload)
    }
}

impl Admin {
    /// Applies `change` to the version `r` names; NOT_FOUND (with the ServerInfo) if this
    /// server does not hold it.
    fn change(
        &self,
        r: VersionRequest,
        change: fn(&Server, &str, u64, Option<u32>) -> bool,
    ) -> Result<Response<ServerInfo>, Status> {
        if !change(&self.0, &r.table, r.version, r.shard) {
            return Err(self.0.status(
                Code::NotFound,
                format!("version {} of table '{}' is not held here", r.version, r.table),
            ));
        }
        Ok(Response::new(self.0.info()))
    }
}

/// How [`serve`] serves: with `admin`, the [`Admin`] service too; the `tokens` it asks for;
/// TLS when `tls` is given. The default: lookups only, no tokens, plaintext.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    pub admin: bool,
    pub tokens: Tokens,
    pub tls: Option<ServerTls>,
}

/// Serves `server` on `listener` as `options` say until `shutdown` resolves (then stops
/// accepting and finishes the requests in flight).
pub async fn serve(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let ServeOptions { admin, tokens, tls } = options;
    use tokio_stream::StreamExt;
    // No Nagle: a small answer would otherwise wait for the client's delayed ACK (~40 ms).
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|c| {
            let _ = c.set_nodelay(true);
        })
    });
    use tonic::service::interceptor::InterceptedService;
    let t = tokens.clone();
    let admin = admin.then(|| {
        AdminServer::with_interceptor(Admin(server.clone()), move |req: Request<()>| {
            Tokens::check(&req, &t.for_admin()).map(|()| req)
        })
    });
    let t = tokens;
    // A batch of up to `max_batch` ids decodes whatever its ids; answers are as large as
    // `max_batch` ids of the table's dim make them (checked against MAX_ANSWER_BYTES).
    let limit = request_limit(server.max_batch);
    let serving = ServingServer::new(Serving(server))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    let serving = InterceptedService::new(serving, move |req: Request<()>| {
        Tokens::check(&req, &t.for_lookups()).map(|()| req)
    });
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(tls.cert_pem, tls.key_pem));
        if let Some(ca) = tls.client_ca_pem {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        builder = builder.tls_config(config)?;
    }
    builder
        .add_service(serving)
        .add_optional_service(admin)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hosting::RowSource;
    use embstore_proto::v1::State as WireState;
    use embstore_table::{Store, Table, TableConfig};

    pub(crate) fn table(ids: &[u64]) -> Arc<Table> {
        let store = Store::new();
        let t = store.create_table(TableConfig::new("t", 2)).unwrap();
        let values: Vec<f32> = ids.iter().flat_map(|&k| [k as f32, 0.5]).collect();
        t.assign(ids, &values).unwrap();
        t
    }

    pub(crate) fn req(version: u64, ids: Vec<u64>) -> LookupRequest {
        LookupRequest {
            table: "user".into(),
            version,
            shard: 0,
            num_shards: 1,
            ids,
            ..Default::default()
        }
    }

    /// A lookup may name several shards of one version held here: each id is read from its
    /// shard's rows, in the request's order; an id of a shard it does not name, a shard named
    /// twice, or one not held here is refused.
    #[test]
    fn a_lookup_reads_several_shards_of_a_version_in_one_answer() {
        let ids: Vec<u64> = (0..400).collect();
        let s = Server::new("a", 1 << 12);
        for shard in 0..3u32 {
            let mine: Vec<u64> =
                ids.iter().copied().filter(|&k| shard_of_key(k, 4) == shard as usize).collect();
            s.host("user", 7, shard, 4, table(&mine)).unwrap();
        }
        assert!(s.info().spans_shards);
        let in_012: Vec<u64> = ids.iter().copied().filter(|&k| shard_of_key(k, 4) < 3).collect();
        let mut query: Vec<u64> = in_012.iter().rev().step_by(3).copied().collect();
        query.push(in_012[0]);
        let many = |shard, more: Vec<u32>, ids: Vec<u64>| LookupRequest {
            shard,
            num_shards: 4,
            more_shards: more,
            ..req(7, ids)
        };
        let r = s.lookup(&many(2, vec![0, 1], query.clone())).unwrap();
        assert_eq!((r.version, r.embedding_dim, r.found.len()), (7, 2, query.len()));
        assert!(r.found.iter().all(|&f| f == 1));
        let want: Vec<f32> = query.iter().flat_map(|&k| [k as f32, 0.5]).collect();
        assert_eq!(r.values, embstore_proto::encode_rows(&want));
        let in_3 = ids.iter().copied().find(|&k| shard_of_key(k, 4) == 3).unwrap();
        let e = s.lookup(&many(0, vec![1], vec![in_3])).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("does not name"), "{e:?}");
        let e = s.lookup(&many(0, vec![1, 0], vec![])).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let e = s.lookup(&many(0, vec![3], vec![])).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("shard 3 of 4"), "{e:?}");
        let e = s.lookup(&many(0, vec![1, 2, 3, 0], vec![])).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }

    /// The request decoder and the lookup path take any bytes: a decode error, a typed status
    /// or rows — never a panic — and the server answers a good request afterwards. 2,000 cases
    /// of random bytes and of valid requests with a byte flipped; `EMBSTORE_TEST_SEED` replays.
    #[test]
    fn any_bytes_give_an_error_or_an_answer_never_a_panic() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed, TestRunner};
        let seed = std::env::var("EMBSTORE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x00f0_22ed);
        eprintln!("seed {seed} (EMBSTORE_TEST_SEED={seed} replays)");
        let mut runner = TestRunner::new(Config {
            cases: 2000,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            ..Config::default()
        });
        let s = Server::new("fuzz", 64);
        s.host("user", 7, 0, 1, table(&[1, 2])).unwrap();
        let strategy = (proptest::collection::vec(any::<u8>(), 0..256), any::<(usize, u8)>());
        runner
            .run(&strategy, |(bytes, (at, flip))| {
                let mut valid = req(7, vec![1, 2, 3]).encode_to_vec();
                let i = at % valid.len();
                valid[i] ^= flip;
                for wire in [bytes.as_slice(), valid.as_slice()] {
                    if let Ok(r) = LookupRequest::decode(wire) {
                        if let Ok(resp) = s.lookup(&r) {
                            prop_assert_eq!(resp.found.len(), r.ids.len());
                            prop_assert_eq!(resp.values.len(), r.ids.len() * 2 * 4);
                        }
                    }
                }
                prop_assert!(s.lookup(&req(7, vec![1])).is_ok());
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }

    #[test]
    fn lookups_answer_the_named_version_and_say_what_is_held_otherwise() {
        let s = Server::new("test", 4);
        s.host("user", 7, 0, 1, table(&[1, 2])).unwrap();
        let gen = s.info().gen;
        let r = s.lookup(&req(7, vec![2, 9])).unwrap();
        assert_eq!(r.version, 7);
        assert_eq!(embstore_proto::decode_rows(&r.values, 2, 2).unwrap(), [2.0, 0.5, 0.0, 0.0]);
        assert_eq!(r.found, [1, 0]);
        assert_eq!(r.info.unwrap().held[0].rows, 2);
        // A client that holds the current info gets none back; a stale one gets it.
        let current = LookupRequest { known_gen: gen, ..req(7, vec![1]) };
        assert!(s.lookup(&current).unwrap().info.is_none());
        let stale = LookupRequest { known_gen: gen - 1, ..req(7, vec![1]) };
        assert_eq!(s.lookup(&stale).unwrap().info.unwrap().gen, gen);
        // A version not held: FAILED_PRECONDITION, with the ServerInfo in the details.
        let e = s.lookup(&req(8, vec![1])).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        let info = ServerInfo::decode(e.details()).unwrap();
        assert_eq!((info.held[0].version, info.gen), (7, gen));
        // Another shard count: refused too.
        let mut r2 = req(7, vec![1]);
        r2.num_shards = 2;
        assert_eq!(s.lookup(&r2).unwrap_err().code(), Code::FailedPrecondition);
        assert_eq!(
            s.lookup(&LookupRequest { table: "x".into(), ..req(7, vec![]) }).unwrap_err().code(),
            Code::NotFound
        );
        assert_eq!(s.lookup(&req(7, vec![1; 5])).unwrap_err().code(), Code::ResourceExhausted);
        assert!(s.lookup(&req(7, vec![])).unwrap().values.is_empty());
        // Draining still serves; unloading does not; each change raises gen.
        assert!(s.drain("user", 7, None));
        assert_eq!(s.info().held[0].state(), WireState::Draining);
        assert!(s.lookup(&req(7, vec![1])).is_ok());
        assert!(s.unload("user", 7, None) && !s.unload("user", 7, None));
        assert_eq!(s.lookup(&req(7, vec![1])).unwrap_err().code(), Code::NotFound);
        assert!(s.info().gen >= gen + 2);
        assert!(s.host("user", 1, 2, 2, table(&[])).is_err());
        assert!(s.host("user", 1, 0, 3, table(&[])).is_err());
    }

    /// Rows of a dim too large to answer many of: every lookup would be refused first.
    #[derive(Debug)]
    struct Wide;

    impl RowSource for Wide {
        fn dim(&self) -> usize {
            1 << 22
        }
        fn len(&self) -> usize {
            0
        }
        fn bytes(&self) -> u64 {
            0
        }
        fn may_block(&self) -> bool {
            false
        }
        fn lookup(&self, _: &[u64], _: &mut [f32], _: &mut [bool]) -> embstore_common::Result<()> {
            panic!("a lookup whose answer no frame can carry must be refused before reading")
        }
    }

    /// A batch within the maximum whose answer passes what a gRPC frame carries (300 rows of
    /// 16 MiB) is refused before any row is read or buffered, and counted as refused, not ok.
    #[test]
    fn an_answer_no_frame_can_carry_is_refused_and_counted() {
        let s = Server::new("wide", 1 << 20);
        s.host("user", 1, 0, 1, Arc::new(Wide)).unwrap();
        let e = s.lookup(&req(1, (0..300).collect())).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("split the batch"), "{e:?}");
        let text = s.metrics_text();
        assert!(text.contains(r#"{table="user",outcome="resourceexhausted"} 1"#), "{text}");
        assert!(!text.contains(r#"outcome="ok""#), "{text}");
        // Sized from --max-batch: a request of that many ids of 10 bytes each decodes.
        let ids: Vec<u64> = vec![u64::MAX; 1000];
        let wire = LookupRequest { ids, ..req(1, vec![]) }.encoded_len();
        assert!(wire <= request_limit(1000), "{wire} > {}", request_limit(1000));
    }
}
