//! Servers on loopback, in this process: lookups through the client equal the tables' rows, a
//! batch never mixes two versions while versions roll through the replicas one column at a
//! time, and a replica that goes away is routed around.
//!
//! Every server also serves the framed lookup path, and every test runs twice: with lookups
//! over gRPC (`<test>::grpc`) and over the framed path (`<test>::framed`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions, Transport};
use embstore_server::Server;
use embstore_table::{shard_of_key, ErrorKind, OnMiss, Store, Table, TableConfig};
use tokio::sync::{oneshot, watch};

const D: usize = 4;

tokio::task_local! {
    /// The transport of the clients a test makes (`on_both_transports!`).
    static TRANSPORT: Transport;
}

fn transport() -> Transport {
    TRANSPORT.try_with(|t| *t).unwrap_or_default()
}

/// Runs each named test (an `async fn()`) twice, as `<name>::grpc` and `<name>::framed`.
macro_rules! on_both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn grpc() {
                super::TRANSPORT.scope(embstore_client::Transport::Grpc, super::$name()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn framed() {
                super::TRANSPORT.scope(embstore_client::Transport::Framed, super::$name()).await
            }
        }
    )*};
}

on_both_transports!(
    lookups_fan_out_to_the_shards_and_equal_the_tables_rows,
    a_batch_never_mixes_versions_while_versions_roll_through_the_replicas,
    with_the_protocol_off_the_checker_counts_mixed_batches,
    a_replica_that_goes_away_is_routed_around,
    metrics_count_lookups_by_outcome_and_say_what_is_held,
    tokens_guard_lookups_and_admin_calls,
    tls_and_mutual_tls_serve_and_refuse_what_they_should,
    an_answer_over_4_mib_is_read_and_a_batch_over_the_maximum_is_refused_and_counted,
    tls_mistakes_name_their_cause,
    a_batch_over_several_shards_of_one_server_is_one_request,
    one_request_per_server_holds_over_tls_from_shards_on_disk,
);

/// A running server (gRPC and the framed path): its address and what stops it.
struct Running {
    addr: String,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops the server; fails the test if serving ended in an error.
    async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.await.expect("serve returned an error");
        }
    }
}

async fn start(server: Arc<Server>) -> Running {
    start_with(server, Default::default()).await
}

async fn start_with(server: Arc<Server>, options: embstore_server::ServeOptions) -> Running {
    let framed = embstore_server::FramedListener::tcp("127.0.0.1:0").await.unwrap();
    start_on(server, options, vec![framed]).await
}

/// A running server: gRPC on a free loopback port, the framed path on the listeners in
/// `framed`. Clients learn the framed endpoints from the server's info: they are there once
/// `serve_framed` is called.
async fn start_on(
    server: Arc<Server>,
    options: embstore_server::ServeOptions,
    framed: Vec<embstore_server::FramedListener>,
) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, rx) = watch::channel(false);
    let quit = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|q| *q).await;
    };
    let (s, o, q) = (server.clone(), options.clone(), quit(rx.clone()));
    let grpc =
        tokio::spawn(async move { embstore_server::serve(s, listener, o, q).await.unwrap() });
    let mut tasks = vec![grpc];
    for l in framed {
        let (tokens, tls) = (options.tokens.clone(), options.tls.clone());
        let serve = embstore_server::serve_framed(server.clone(), l, tokens, tls, quit(rx.clone()));
        tasks.push(tokio::spawn(async move { serve.await.unwrap() }));
    }
    Running { addr, stop, tasks }
}

/// A server of `user` ids 0..10 over TLS with the test PKI's server pair (`mutual`: clients
/// need a certificate of its CA) and `tokens`; its address by the name in its certificate.
async fn start_tls(p: &Pki, mutual: bool, tokens: embstore_server::Tokens) -> (Running, String) {
    let server = Server::new("tls", 64);
    let ids: Vec<u64> = (0..10u64).collect();
    server.host("user", 1, 0, 1, shard_table(&ids, 0, 1, 1)).unwrap();
    let tls = embstore_server::ServerTls {
        cert_pem: p.server.0.clone().into_bytes(),
        key_pem: p.server.1.clone().into_bytes(),
        client_ca_pem: mutual.then(|| p.ca.clone().into_bytes()),
    };
    tls.check().unwrap();
    let options = embstore_server::ServeOptions { tls: Some(tls), tokens, admin: false };
    let running = start_with(server, options).await;
    let port = running.addr.rsplit(':').next().unwrap().to_owned();
    (running, format!("localhost:{port}"))
}

/// The rows of shard `shard` of `num_shards` among `ids`, each `[version, id, id % 7, 1]`.
fn shard_table(ids: &[u64], shard: usize, num_shards: usize, version: u64) -> Arc<Table> {
    let store = Store::new();
    let t = store.create_table(TableConfig::new("user", D)).unwrap();
    let mine: Vec<u64> =
        ids.iter().copied().filter(|&k| shard_of_key(k, num_shards) == shard).collect();
    let values: Vec<f32> =
        mine.iter().flat_map(|&k| [version as f32, k as f32, (k % 7) as f32, 1.0]).collect();
    t.assign(&mine, &values).unwrap();
    t
}

fn options() -> ClientOptions {
    ClientOptions {
        deadline: Duration::from_secs(10),
        max_restarts: 3,
        transport: transport(),
        ..Default::default()
    }
}

async fn lookups_fan_out_to_the_shards_and_equal_the_tables_rows() {
    let ids: Vec<u64> = (0..2000u64).map(|i| i * 7919 % 100_003).collect();
    // The reference: every row in one table.
    let whole = shard_table(&ids, 0, 1, 1);
    let mut running = Vec::new();
    for s in 0..2 {
        let server = Server::new(format!("s{s}"), 1 << 16);
        server.host("user", 1, s as u32, 2, shard_table(&ids, s, 2, 1)).unwrap();
        running.push(start(server).await);
    }
    let addrs: Vec<String> = running.iter().map(|r| r.addr.clone()).collect();
    let client = Client::connect(&addrs, options()).await.unwrap();
    // Ids present and absent, repeated, in any order.
    let mut query: Vec<u64> = ids.iter().step_by(3).copied().collect();
    query.extend([5, 6, u64::MAX, 0, ids[10], ids[10]]);
    let rows = client.lookup("user", &query).await.unwrap();
    let mut want = vec![0f32; query.len() * D];
    let mut found = vec![false; query.len()];
    whole.lookup(&query, OnMiss::Zeros, &mut want, Some(&mut found)).unwrap();
    assert_eq!((rows.values, rows.found, rows.version, rows.embedding_dim), (want, found, 1, D));
    // An empty batch, an unknown table, a batch over the servers' limit.
    assert!(client.lookup("user", &[]).await.unwrap().values.is_empty());
    let e = client.lookup("item", &[1]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TableNotFound, "{e}");
    let e = client.lookup("user", &vec![1u64; (1 << 17) + 5]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    // The servers still serve after the bad requests.
    assert!(client.lookup("user", &query[..5]).await.is_ok());
    for r in running {
        r.stop().await;
    }
}

/// `embstore_lookups_total{table="user",outcome="ok"}` of `server`.
fn ok_lookups(server: &Server) -> u64 {
    let text = server.metrics_text();
    let line = r#"embstore_lookups_total{table="user",outcome="ok"} "#;
    text.lines().find_map(|l| l.strip_prefix(line)).map_or(0, |n| n.parse().unwrap())
}

/// Two servers each hold all four shards of a version: a batch over every shard is one
/// request to one server; when that server goes away mid-batch, the request is split over the
/// other's shards in the same attempt, and the next batches are one request again.
async fn a_batch_over_several_shards_of_one_server_is_one_request() {
    let ids: Vec<u64> = (0..2000u64).map(|i| i * 7919 % 100_003).collect();
    let whole = shard_table(&ids, 0, 1, 1);
    let mut servers = Vec::new();
    let mut running = Vec::new();
    for r in 0..2 {
        let server = Server::new(format!("r{r}"), 1 << 16);
        for s in 0..4 {
            server.host("user", 1, s as u32, 4, shard_table(&ids, s, 4, 1)).unwrap();
        }
        running.push(start(server.clone()).await);
        servers.push(server);
    }
    let addrs: Vec<String> = running.iter().map(|r| r.addr.clone()).collect();
    let client = Client::connect(&addrs, options()).await.unwrap();
    let mut query: Vec<u64> = ids.iter().step_by(5).copied().collect();
    query.extend([5, u64::MAX, ids[3]]);
    let mut want = vec![0f32; query.len() * D];
    let mut found = vec![false; query.len()];
    whole.lookup(&query, OnMiss::Zeros, &mut want, Some(&mut found)).unwrap();
    for _ in 0..5 {
        let rows = client.lookup("user", &query).await.unwrap();
        assert_eq!((&rows.values, &rows.found, rows.version), (&want, &found, 1));
    }
    let counts: Vec<u64> = servers.iter().map(|s| ok_lookups(s)).collect();
    assert_eq!(counts.iter().sum::<u64>(), 5, "5 batches over 4 shards: {counts:?}");
    // The server asked first goes away; its shards are read from the other.
    let first = counts.iter().position(|&c| c > 0).unwrap();
    running.remove(first).stop().await;
    let other = &servers[1 - first];
    let before = ok_lookups(other);
    let rows = client.lookup("user", &query).await.unwrap();
    assert_eq!((&rows.values, &rows.found), (&want, &found));
    let after_failover = ok_lookups(other);
    assert!(after_failover > before, "{before} -> {after_failover}");
    for _ in 0..3 {
        let rows = client.lookup("user", &query).await.unwrap();
        assert_eq!(rows.values, want);
    }
    assert_eq!(ok_lookups(other), after_failover + 3);
    running.remove(0).stop().await;
}

/// One request per server where its shards live on disk under a memory budget and its ports
/// speak TLS: a server loads four shards of a checkpoint into a budget far smaller than them,
/// and 5 batches over all four shards are 5 requests, read (partly from disk) over TLS with
/// the rows of the checkpoint.
async fn one_request_per_server_holds_over_tls_from_shards_on_disk() {
    use embstore_client::ClientTls;
    let p = pki();
    let root = tempfile::tempdir().unwrap();
    let ids: Vec<u64> = (0..20_000u64).map(|i| i * 7919 % 1_000_003).collect();
    let whole = {
        let store = Store::open(root.path().join("store")).unwrap();
        let t = store.create_table(TableConfig::new("user", D)).unwrap();
        let values: Vec<f32> =
            ids.iter().flat_map(|&k| [1.0, k as f32, (k % 7) as f32, 1.0]).collect();
        t.assign(&ids, &values).unwrap();
        store.checkpoint(root.path().join("ckpt"), None).unwrap();
        shard_table(&ids, 0, 1, 1)
    };
    // 20,000 rows of 16 B values and their metadata in a 64 KiB budget: most stay on disk.
    let budget = embstore_table::Budget::shared(64 << 10).unwrap();
    let tier = embstore_server::TierOptions { dir: root.path().join("data"), budget };
    let server = Server::with_tier("tiered-tls", 1 << 16, tier).unwrap();
    for s in 0..4 {
        server.load("user", 1, s, 4, &root.path().join("ckpt")).unwrap();
    }
    let tls = embstore_server::ServerTls {
        cert_pem: p.server.0.clone().into_bytes(),
        key_pem: p.server.1.clone().into_bytes(),
        client_ca_pem: None,
    };
    let serve = embstore_server::ServeOptions { tls: Some(tls), ..Default::default() };
    let running = start_with(server.clone(), serve).await;
    let port = running.addr.rsplit(':').next().unwrap().to_owned();
    let trusting = ClientTls { ca_pem: p.ca.clone().into_bytes(), domain: None, identity: None };
    let addrs = vec![format!("localhost:{port}")];
    let client =
        Client::connect(&addrs, ClientOptions { tls: Some(trusting), ..options() }).await.unwrap();
    let mut query: Vec<u64> = ids.iter().step_by(7).copied().collect();
    query.extend([5, u64::MAX]);
    let mut want = vec![0f32; query.len() * D];
    let mut found = vec![false; query.len()];
    whole.lookup(&query, OnMiss::Zeros, &mut want, Some(&mut found)).unwrap();
    let before = ok_lookups(&server);
    for _ in 0..5 {
        let rows = client.lookup("user", &query).await.unwrap();
        assert_eq!((&rows.values, &rows.found, rows.version), (&want, &found, 1));
    }
    assert_eq!(ok_lookups(&server) - before, 5, "5 batches over 4 shards of one server");
    let text = server.metrics_text();
    let read = text
        .lines()
        .filter(|l| l.starts_with("embstore_disk_rows_read"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(read > 0.0, "no row was read from disk: {text}");
    running.stop().await;
}

async fn a_batch_never_mixes_versions_while_versions_roll_through_the_replicas() {
    let (batches, mixed) = roll_under_reads(true).await;
    println!("{batches} batches during three rolls, {mixed} mixing versions");
    assert!(batches >= 20, "only {batches} batches ran");
    assert_eq!(mixed, 0, "batches mixing versions");
}

/// The checker above catches mixing: with the protocol switched off (each server answers with
/// the newest version it holds), batches read while a column moves mix versions.
async fn with_the_protocol_off_the_checker_counts_mixed_batches() {
    let (batches, mixed) = roll_under_reads(false).await;
    println!("{batches} batches during three rolls, {mixed} mixing versions (protocol off)");
    assert!(mixed > 0, "no mixed batch in {batches}: the checker would not catch mixing");
}

/// Three rolls of a 2 × 2 cluster with a spare column under a reading client; returns the
/// batches read and how many mixed versions.
async fn roll_under_reads(consistent: bool) -> (u64, u64) {
    // 2 shards × 2 replicas (columns a, b) and a spare column, as docs/serving.md rolls them.
    let ids: Vec<u64> = (0..400u64).collect();
    let col = |name: &str| -> Vec<Arc<Server>> {
        (0..2).map(|s| Server::new(format!("{name}{s}"), 1 << 16)).collect()
    };
    let (a, b, spare) = (col("a"), col("b"), col("spare"));
    for column in [&a, &b] {
        for (s, server) in column.iter().enumerate() {
            server.host("user", 1, s as u32, 2, shard_table(&ids, s, 2, 1)).unwrap();
        }
    }
    let mut running = Vec::new();
    for server in a.iter().chain(&b).chain(&spare) {
        running.push(start(server.clone()).await);
    }
    let addrs: Vec<String> = running.iter().map(|r| r.addr.clone()).collect();
    let client =
        Arc::new(Client::connect(&addrs, ClientOptions { consistent, ..options() }).await.unwrap());

    let done = Arc::new(AtomicBool::new(false));
    let (batches, mixed, newest) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (client, done) = (client.clone(), done.clone());
        let (batches, mixed, newest) = (batches.clone(), mixed.clone(), newest.clone());
        let ids = ids.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut last = 0;
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                let batch: Vec<u64> = (0..64).map(|j| ids[((i * 64 + j) % 400) as usize]).collect();
                i += 1;
                let rows = client.lookup("user", &batch).await.expect("no failed batch");
                let versions: std::collections::HashSet<u32> =
                    rows.values.chunks(D).map(|r| r[0] as u32).collect();
                if versions.len() != 1 || !versions.contains(&(rows.version as u32)) {
                    mixed.fetch_add(1, Ordering::Relaxed);
                }
                assert!(rows.version >= last, "versions went back: {last} → {}", rows.version);
                last = rows.version;
                newest.store(last, Ordering::Relaxed);
                batches.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Roll v → v + 1 three times: the spare column loads v + 1; then each column in turn
    // drains v, waits, unloads v and loads v + 1; the spare column unloads.
    let drain = Duration::from_millis(40);
    for v in 1..=3u64 {
        for (s, server) in spare.iter().enumerate() {
            server.host("user", v + 1, s as u32, 2, shard_table(&ids, s, 2, v + 1)).unwrap();
        }
        tokio::time::sleep(drain).await;
        for column in [&a, &b] {
            for server in column.iter() {
                server.drain("user", v, None);
            }
            tokio::time::sleep(drain).await;
            for (s, server) in column.iter().enumerate() {
                server.unload("user", v, None);
                // A load takes a while: the column's shards move one after the other.
                tokio::time::sleep(drain).await;
                server.host("user", v + 1, s as u32, 2, shard_table(&ids, s, 2, v + 1)).unwrap();
            }
            tokio::time::sleep(drain).await;
        }
        for server in spare.iter() {
            server.unload("user", v + 1, None);
        }
        tokio::time::sleep(drain).await;
    }
    // Let the reader see the last version, then stop it.
    let wait = Instant::now();
    while newest.load(Ordering::Relaxed) < 4 && wait.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done.store(true, Ordering::Relaxed);
    reader.await.unwrap();
    if consistent {
        assert_eq!(newest.load(Ordering::Relaxed), 4, "the client must reach the last version");
    }
    for r in running {
        r.stop().await;
    }
    (batches.load(Ordering::Relaxed), mixed.load(Ordering::Relaxed))
}

async fn a_replica_that_goes_away_is_routed_around() {
    let ids: Vec<u64> = (0..100u64).collect();
    let mut running = Vec::new();
    for r in 0..2 {
        let server = Server::new(format!("r{r}"), 1 << 16);
        server.host("user", 1, 0, 1, shard_table(&ids, 0, 1, 1)).unwrap();
        running.push(start(server).await);
    }
    let addrs: Vec<String> = running.iter().map(|r| r.addr.clone()).collect();
    let client = Client::connect(&addrs, options()).await.unwrap();
    assert_eq!(client.lookup("user", &ids).await.unwrap().found, vec![true; 100]);
    running.remove(0).stop().await;
    for _ in 0..10 {
        let rows = client.lookup("user", &ids).await.unwrap();
        assert_eq!(rows.found, vec![true; 100]);
    }
    running.remove(0).stop().await;
    let e = client.lookup("user", &ids).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Connecting to no live server at all is a clear error.
    let e = Client::connect(
        &addrs,
        ClientOptions { deadline: Duration::from_secs(2), max_restarts: 1, ..options() },
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

async fn metrics_count_lookups_by_outcome_and_say_what_is_held() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ids: Vec<u64> = (0..50u64).collect();
    let server = Server::new("m", 64);
    server.host("user", 3, 0, 1, shard_table(&ids, 0, 1, 3)).unwrap();
    let running = start(server.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let metrics = tokio::spawn(embstore_server::serve_metrics(server, listener, async {
        let _ = rx.await;
    }));
    let client = Client::connect(std::slice::from_ref(&running.addr), options()).await.unwrap();
    for _ in 0..3 {
        client.lookup("user", &ids[..10]).await.unwrap();
    }
    assert!(client.lookup("user", &[1; 65]).await.is_err()); // over the limit of 64
    let mut conn = tokio::net::TcpStream::connect(metrics_addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for line in [
        r#"embstore_lookups_total{table="user",outcome="ok"} 3"#,
        r#"embstore_lookups_total{table="user",outcome="resourceexhausted"} 1"#,
        r#"embstore_lookup_ids_total{table="user"} 30"#,
        r#"embstore_lookup_seconds_count{table="user"} 3"#,
        r#"embstore_versions_held{table="user",state="ready"} 1"#,
        r#"embstore_rows_held{table="user",version="3"} 50"#,
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    let _ = tx.send(());
    metrics.await.unwrap().unwrap();
    running.stop().await;
}

async fn tokens_guard_lookups_and_admin_calls() {
    use embstore_cluster::{admin, AdminCall};
    let ids: Vec<u64> = (0..10u64).collect();
    let server = Server::new("t", 64);
    server.host("user", 1, 0, 1, shard_table(&ids, 0, 1, 1)).unwrap();
    let tokens = embstore_server::Tokens { read: Some("r3ad".into()), admin: Some("adm1n".into()) };
    let serve_options = embstore_server::ServeOptions { admin: true, tokens, tls: None };
    let running = start_with(server, serve_options).await;
    let addr = running.addr.clone();
    let addrs = vec![addr.clone()];
    let with = |token: Option<&str>| ClientOptions { token: token.map(String::from), ..options() };
    // No token, a wrong one: refused with PermissionDenied (not "unavailable").
    for token in [None, Some("nope")] {
        let e = Client::connect(&addrs, with(token)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{token:?}: {e}");
    }
    // The read token and the admin token both look up.
    for token in ["r3ad", "adm1n"] {
        let c = Client::connect(&addrs, with(Some(token))).await.unwrap();
        assert_eq!(c.lookup("user", &ids).await.unwrap().found, vec![true; 10]);
    }
    // Admin calls take only the admin token.
    let drain = || AdminCall::Drain { table: "user".into(), version: 1, shard: None };
    let t = Duration::from_secs(5);
    for token in [None, Some("r3ad"), Some("nope")] {
        let e = admin(&addr, drain(), t, token, None).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{token:?}: {e}");
    }
    assert!(admin(&addr, drain(), t, Some("adm1n"), None).await.is_ok());
    running.stop().await;
}

/// A CA, a server certificate for "localhost" and a client certificate, all PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki { ca: ca.pem(), server: leaf("localhost"), client: leaf("client") }
}

async fn tls_and_mutual_tls_serve_and_refuse_what_they_should() {
    use embstore_client::ClientTls;
    let p = pki();
    let ids: Vec<u64> = (0..10u64).collect();
    for mutual in [false, true] {
        let (running, addr) = start_tls(&p, mutual, Default::default()).await;
        let addrs = vec![addr];
        let quick = |tls: Option<ClientTls>| ClientOptions {
            deadline: Duration::from_secs(3),
            max_restarts: 0,
            tls,
            transport: transport(),
            ..Default::default()
        };
        let trusting = |identity: bool| ClientTls {
            ca_pem: p.ca.clone().into_bytes(),
            domain: None,
            identity: identity
                .then(|| (p.client.0.clone().into_bytes(), p.client.1.clone().into_bytes())),
        };
        // Plaintext against a TLS port: no answer, a clear error.
        let e = Client::connect(&addrs, quick(None)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        // A client that does not trust the CA (it trusts the server's own leaf as a CA).
        let wrong =
            ClientTls { ca_pem: p.client.0.clone().into_bytes(), domain: None, identity: None };
        assert!(Client::connect(&addrs, quick(Some(wrong))).await.is_err());
        // Trusting the CA: served; with mutual TLS, only with a client certificate.
        let c = Client::connect(&addrs, quick(Some(trusting(mutual)))).await.unwrap();
        assert_eq!(c.lookup("user", &ids).await.unwrap().found, vec![true; 10]);
        if mutual {
            assert!(Client::connect(&addrs, quick(Some(trusting(false)))).await.is_err());
        }
        running.stop().await;
    }
}

/// A lookup whose answer passes gRPC's default 4 MiB (40,000 ids at D 32: 5.1 MB) is read with
/// the default limits; a batch over the server's maximum is refused with `Capacity` and
/// counted as refused, also when its request alone passes 4 MiB (ids of 10 bytes on the wire).
async fn an_answer_over_4_mib_is_read_and_a_batch_over_the_maximum_is_refused_and_counted() {
    const DIM: usize = 32;
    let ids: Vec<u64> = (0..40_000u64).map(|i| i * 3 + 1).collect();
    let store = Store::new();
    let t = store.create_table(TableConfig::new("user", DIM)).unwrap();
    let values: Vec<f32> =
        ids.iter().flat_map(|&k| (0..DIM).map(move |j| (k + j as u64) as f32)).collect();
    t.assign(&ids, &values).unwrap();
    let server = Server::new("big", embstore_server::DEFAULT_MAX_BATCH);
    server.host("user", 1, 0, 1, t).unwrap();
    let running = start(server.clone()).await;
    let client = Client::connect(std::slice::from_ref(&running.addr), options()).await.unwrap();
    let rows = client.lookup("user", &ids).await.unwrap();
    assert_eq!(rows.values.len() * 4, ids.len() * DIM * 4);
    assert!(rows.values.len() * 4 > 4 << 20, "the answer must pass 4 MiB");
    assert_eq!(rows.values, values);
    assert!(rows.found.iter().all(|&f| f));
    // One id over the maximum, each id 10 bytes on the wire (a 10 MiB request).
    let over: Vec<u64> =
        (0..embstore_server::DEFAULT_MAX_BATCH as u64 + 1).map(|i| u64::MAX - i).collect();
    let e = client.lookup("user", &over).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("at most 1048576 ids"), "{e}");
    let text = server.metrics_text();
    for line in [
        r#"embstore_lookups_total{table="user",outcome="ok"} 1"#,
        r#"embstore_lookups_total{table="user",outcome="resourceexhausted"} 1"#,
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    // The server still serves.
    assert_eq!(client.lookup("user", &ids[..3]).await.unwrap().found, vec![true; 3]);
    running.stop().await;
}

/// Each TLS mistake names its cause instead of looking like a dead server: a plaintext client
/// at a TLS port, a client that does not trust the server's CA, a server certificate and key
/// given the wrong way round or not of one pair. A token with a trailing newline works.
async fn tls_mistakes_name_their_cause() {
    use embstore_client::ClientTls;
    let p = pki();
    let ids: Vec<u64> = (0..10u64).collect();
    let tokens = embstore_server::Tokens { read: Some("r3ad".into()), admin: None };
    let (running, addr) = start_tls(&p, false, tokens).await;
    let addrs = vec![addr];
    let quick = |tls: Option<ClientTls>| ClientOptions {
        deadline: Duration::from_secs(3),
        max_restarts: 0,
        token: Some("r3ad\n".into()),
        tls,
        transport: transport(),
        ..Default::default()
    };
    let e = Client::connect(&addrs, quick(None)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("server speaks tls"), "{e}");
    // An admin call too (what `embstore load`, `drain` and `publish` make).
    let drain =
        embstore_cluster::AdminCall::Drain { table: "user".into(), version: 1, shard: None };
    let e = embstore_cluster::admin(&addrs[0], drain, Duration::from_secs(3), None, None).await;
    assert!(e.unwrap_err().to_string().contains("server speaks tls"));
    // Trusting another CA, or the server's own CA's other leaf as a CA.
    for ca in [pki().ca, p.client.0.clone()] {
        let wrong = ClientTls { ca_pem: ca.into_bytes(), domain: None, identity: None };
        let e = Client::connect(&addrs, quick(Some(wrong))).await.unwrap_err();
        assert!(e.to_string().contains("tls handshake failed: unknown ca"), "{e}");
    }
    let right = ClientTls { ca_pem: p.ca.clone().into_bytes(), domain: None, identity: None };
    // The token read with its newline (as from a file) is the token.
    let c = Client::connect(&addrs, quick(Some(right.clone()))).await.unwrap();
    assert_eq!(c.lookup("user", &ids).await.unwrap().found, vec![true; 10]);
    running.stop().await;
    // A TLS client at a plaintext port.
    let plain = start(Server::new("plain", 64)).await;
    let e = Client::connect(std::slice::from_ref(&plain.addr), quick(Some(right))).await;
    let e = e.unwrap_err();
    assert!(e.to_string().contains("server does not speak tls"), "{e}");
    plain.stop().await;
    // A server given its certificate and key the wrong way round, or a key of another pair:
    // refused before serving, saying which.
    let pair = |cert: &str, key: &str| embstore_server::ServerTls {
        cert_pem: cert.as_bytes().to_vec(),
        key_pem: key.as_bytes().to_vec(),
        client_ca_pem: None,
    };
    let e = pair(&p.server.1, &p.server.0).check().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("swapped"), "{e}");
    let e = pair(&p.server.0, &p.client.1).check().unwrap_err();
    assert!(e.to_string().contains("key does not match the certificate"), "{e}");
}

/// With the default transport, a server whose framed port stops accepting (its process half
/// gone, a firewall) is read over gRPC, and the client says so; a client that insists on the
/// framed path gets `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_port_that_refuses_connections_falls_back_to_grpc() {
    let ids: Vec<u64> = (0..20u64).collect();
    let server = Server::new("half", 64);
    server.host("user", 1, 0, 1, shard_table(&ids, 0, 1, 1)).unwrap();
    let mut running = start(server).await;
    let addrs = vec![running.addr.clone()];
    let auto = Client::connect(&addrs, ClientOptions::default()).await.unwrap();
    let only_framed =
        Client::connect(&addrs, ClientOptions { transport: Transport::Framed, ..options() })
            .await
            .unwrap();
    assert_eq!(auto.transport_to(&addrs[0]), Some("framed"));
    assert_eq!(auto.lookup("user", &ids).await.unwrap().found, vec![true; 20]);
    // The framed path dies without withdrawing its port from the server's info.
    let framed = running.tasks.pop().unwrap();
    framed.abort();
    let _ = framed.await;
    assert_ne!(running_info_port(&auto, &addrs[0]), 0);
    assert_eq!(auto.lookup("user", &ids).await.unwrap().found, vec![true; 20]);
    assert_eq!(auto.transport_to(&addrs[0]), Some("grpc"));
    let e = only_framed.lookup("user", &ids).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    running.stop().await;
}

/// The framed port a client last saw in the server's info.
fn running_info_port(client: &Client, addr: &str) -> u32 {
    let view = client.view();
    let (_, info) = view.iter().find(|(a, _)| a == addr).unwrap();
    info.as_ref().unwrap().framed_port
}

/// `user` ids 0..20 as shard_table makes them, but hosted as version 1 whatever `mark` is:
/// a row's first value says which server answered it.
fn marked_server(name: &str, mark: u64) -> Arc<Server> {
    let ids: Vec<u64> = (0..20u64).collect();
    let server = Server::new(name, 64);
    server.host("user", 1, 0, 1, shard_table(&ids, 0, 1, mark)).unwrap();
    server
}

/// Reads `user` ids 0..20 through `client` and returns the servers' marks seen.
async fn marks(client: &Client) -> Vec<f32> {
    let ids: Vec<u64> = (0..20u64).collect();
    let rows = client.lookup("user", &ids).await.unwrap();
    assert_eq!(rows.found, vec![true; 20]);
    let mut m: Vec<f32> = rows.values.chunks(D).map(|r| r[0]).collect();
    m.dedup();
    m
}

/// A server whose advertised framed endpoint leads to another server (a Unix socket path
/// another server took, a framed port that a port mapping renumbers onto another server) is
/// read over gRPC: the client checks the endpoint's boot id against the gRPC port's before
/// sending its token or reading a row, and a client that insists on the framed path is told
/// why it may not. A client configured with TLS never takes the (plaintext) Unix socket: it
/// reads over the framed port with TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_endpoint_of_another_server_is_never_read_and_tls_is_kept() {
    use embstore_server::FramedListener;
    let dir = tempfile::tempdir().unwrap();
    let sock = |name: &str| dir.path().join(name);
    let auto = ClientOptions { transport: Transport::Auto, ..options() };
    let only_framed = ClientOptions { transport: Transport::Framed, ..options() };

    // The socket path A offers answers for B (B's socket moved there: the path was reused).
    let (a, b) = (marked_server("a", 1), marked_server("b", 2));
    let a_run = start_on(a, Default::default(), vec![FramedListener::unix(sock("a")).unwrap()]);
    let a_run = a_run.await;
    let b_run = start_on(b, Default::default(), vec![FramedListener::unix(sock("b")).unwrap()]);
    let b_run = b_run.await;
    std::fs::rename(sock("b"), sock("a")).unwrap();
    let addrs = vec![a_run.addr.clone()];
    let client = Client::connect(&addrs, auto.clone()).await.unwrap();
    assert_eq!(client.transport_to(&addrs[0]), Some("framed-unix"));
    assert_eq!(marks(&client).await, vec![1.0], "rows of another server were read");
    assert_eq!(client.transport_to(&addrs[0]), Some("grpc"));
    assert_eq!(marks(&client).await, vec![1.0]);
    let insisting = Client::connect(&addrs, only_framed.clone()).await.unwrap();
    let e = insisting.lookup("user", &[1]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("answers as another server"), "{e}");
    a_run.stop().await;
    b_run.stop().await;

    // A's framed port, as a port mapping renumbers it, is B's: A's framed path dies without
    // withdrawing its port, and B takes that port.
    let (a, b) = (marked_server("a", 1), marked_server("b", 2));
    let mut a_run = start(a.clone()).await;
    let port = a.info().framed_port;
    let framed = a_run.tasks.pop().unwrap();
    framed.abort();
    let _ = framed.await;
    let taken = FramedListener::tcp(&format!("127.0.0.1:{port}")).await.unwrap();
    let b_run = start_on(b, Default::default(), vec![taken]).await;
    assert_eq!(a.info().framed_port, port);
    let addrs = vec![a_run.addr.clone()];
    let client = Client::connect(&addrs, auto.clone()).await.unwrap();
    assert_eq!(client.transport_to(&addrs[0]), Some("framed"));
    assert_eq!(marks(&client).await, vec![1.0], "rows of another server were read");
    assert_eq!(client.transport_to(&addrs[0]), Some("grpc"));
    a_run.stop().await;
    b_run.stop().await;

    // TLS: A serves TLS on gRPC and its framed port and offers a Unix socket too (B's, again);
    // a TLS client reads A over its framed port, never over the socket.
    let p = pki();
    let a = marked_server("a", 1);
    let tls = embstore_server::ServerTls {
        cert_pem: p.server.0.clone().into_bytes(),
        key_pem: p.server.1.clone().into_bytes(),
        client_ca_pem: None,
    };
    let tls_options = embstore_server::ServeOptions { tls: Some(tls), ..Default::default() };
    let listeners = vec![
        FramedListener::tcp("127.0.0.1:0").await.unwrap(),
        FramedListener::unix(sock("a-tls")).unwrap(),
    ];
    let a_run = start_on(a.clone(), tls_options, listeners).await;
    let b_run = start_on(
        marked_server("b", 2),
        Default::default(),
        vec![FramedListener::unix(sock("b-tls")).unwrap()],
    )
    .await;
    std::fs::rename(sock("b-tls"), sock("a-tls")).unwrap();
    assert!(!a.info().framed_unix.is_empty() && a.info().framed_port != 0);
    let port = a_run.addr.rsplit(':').next().unwrap();
    let addrs = vec![format!("localhost:{port}")];
    let trusting = embstore_client::ClientTls {
        ca_pem: p.ca.clone().into_bytes(),
        domain: None,
        identity: None,
    };
    let client = Client::connect(&addrs, ClientOptions { tls: Some(trusting), ..auto }).await;
    let client = client.unwrap();
    assert_eq!(client.transport_to(&addrs[0]), Some("framed"));
    assert_eq!(marks(&client).await, vec![1.0]);
    assert_eq!(client.transport_to(&addrs[0]), Some("framed"), "the TLS framed port was used");
    a_run.stop().await;
    b_run.stop().await;
}

/// A framed port that accepts a connection but answers it late (its server busy: here its
/// runtime's only thread is held for 2 s) is waited for, not given up after a short connect
/// bound and left for gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_endpoint_that_answers_late_is_waited_for_not_left_for_grpc() {
    let server = marked_server("late", 1);
    let grpc = start_on(server.clone(), Default::default(), vec![]).await;
    let (blocked_tx, blocked_rx) = oneshot::channel();
    let (block_tx, block_rx) = oneshot::channel::<()>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let s = server.clone();
    let busy = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let l = embstore_server::FramedListener::tcp("127.0.0.1:0").await.unwrap();
            let stopped = async move {
                let _ = stop_rx.await;
            };
            let serve = tokio::spawn(embstore_server::serve_framed(
                s,
                l,
                Default::default(),
                None,
                stopped,
            ));
            let _ = block_rx.await;
            let _ = blocked_tx.send(());
            // Busy: nothing else on this runtime runs meanwhile.
            std::thread::sleep(Duration::from_secs(2));
            serve.await.unwrap().unwrap();
        });
    });
    let t0 = Instant::now();
    while server.info().framed_port == 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the framed path was not offered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let addrs = vec![grpc.addr.clone()];
    let patient = ClientOptions {
        deadline: Duration::from_secs(20),
        transport: Transport::Auto,
        ..options()
    };
    let client = Client::connect(&addrs, patient).await.unwrap();
    assert_eq!(client.transport_to(&addrs[0]), Some("framed"));
    block_tx.send(()).unwrap();
    blocked_rx.await.unwrap();
    assert_eq!(marks(&client).await, vec![1.0]);
    assert_eq!(client.transport_to(&addrs[0]), Some("framed"), "the late framed port was left");
    let _ = stop_tx.send(());
    tokio::task::spawn_blocking(move || busy.join().unwrap()).await.unwrap();
    grpc.stop().await;
}
