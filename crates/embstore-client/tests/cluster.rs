//! A cluster in etcd, on loopback: etcd (Debian's `etcd-server`, started here) and four servers
//! in this process, each registered under a short lease. `publish` rolls versions through them
//! from checkpoints while a client that found them through etcd reads; a server that dies
//! loses its lease and its slot is served again by another; a publish that fails leaves the
//! old version served; with etcd stopped, lookups go on. The servers also serve the framed
//! lookup path; the scenario runs with clients on each transport.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions, Transport};
use embstore_cluster::testing::TestEtcd;
use embstore_cluster::{control, publish, Etcd, Publish, RollState};
use embstore_server::member::{Member, MemberOptions};
use embstore_server::{ServeOptions, Server};
use embstore_table::{ErrorKind, Store, TableConfig};
use tokio::sync::oneshot;

const D: usize = 4;
const ROWS: u64 = 2_000;

/// Writes a checkpoint of table "user" whose row `k` is `[version, k, k % 7, 1]`.
fn checkpoint(root: &std::path::Path, version: u64) -> String {
    let store_dir = root.join(format!("store-{version}"));
    let store = Store::open(&store_dir).unwrap();
    let t = store.create_table(TableConfig::new("user", D)).unwrap();
    let ids: Vec<u64> = (0..ROWS).collect();
    let values: Vec<f32> =
        ids.iter().flat_map(|&k| [version as f32, k as f32, (k % 7) as f32, 1.0]).collect();
    t.assign(&ids, &values).unwrap();
    let dest = root.join(format!("ckpt-{version}"));
    store.checkpoint(&dest, None).unwrap();
    dest.to_string_lossy().into_owned()
}

/// A server in this process, registered in etcd and reconciling.
struct Node {
    addr: String,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
    framed: tokio::task::JoinHandle<()>,
    member: tokio::task::JoinHandle<()>,
}

impl Node {
    async fn start(etcd: &str) -> Node {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = Server::new(addr.clone(), 1 << 16);
        let mut options = MemberOptions::new(vec![etcd.to_string()], &addr);
        options.lease_ttl = Duration::from_secs(2);
        options.every = Duration::from_millis(200);
        options.quiet = Duration::from_secs(2);
        options.retry_after = Duration::from_secs(1);
        let member = Arc::new(Member::join(server.clone(), options).await.unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let serve_options = ServeOptions { admin: true, ..Default::default() };
        let framed_listener = embstore_server::FramedListener::tcp("127.0.0.1:0").await.unwrap();
        let s = server.clone();
        let framed = tokio::spawn(async move {
            let forever = std::future::pending::<()>();
            let _ = embstore_server::serve_framed(
                s,
                framed_listener,
                Default::default(),
                None,
                forever,
            )
            .await;
        });
        while server.info().framed_port == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let serving = tokio::spawn(async move {
            let _ = embstore_server::serve(server, listener, serve_options, async {
                let _ = rx.await;
            })
            .await;
            let _ = done_tx.send(true);
        });
        let member = tokio::spawn(member.run(async move {
            let mut rx = done_rx;
            let _ = rx.wait_for(|d| *d).await;
        }));
        Node { addr, stop: Some(tx), serving, framed, member }
    }

    /// A crash: it stops answering and stops renewing its lease, without deregistering.
    fn crash(mut self) {
        self.member.abort();
        self.serving.abort();
        self.framed.abort();
        self.stop.take();
    }

    /// A clean shutdown: stops serving, then deregisters.
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.serving.await;
        self.framed.abort();
        let _ = self.member.await;
    }
}

fn request(table: &str, checkpoint: &str, num_shards: Option<u32>) -> Publish {
    Publish {
        table: table.into(),
        checkpoint: checkpoint.into(),
        num_shards,
        checkpoint_bytes: None,
        max_shard_bytes: 1 << 30,
        replicas: Some(2),
        coordinator: "test".into(),
        drain_quiet: Duration::from_millis(300),
        drain_max: Duration::from_secs(5),
        load_timeout: Duration::from_secs(30),
        token: None,
        tls: None,
    }
}

/// Checks a batch: every row is `[v, k, k % 7, 1]` for one `v`; returns it.
fn one_version(ids: &[u64], values: &[f32]) -> Option<u64> {
    let v = values[0];
    for (i, &k) in ids.iter().enumerate() {
        let row = &values[i * D..][..D];
        assert_eq!(&row[1..], &[k as f32, (k % 7) as f32, 1.0], "row of id {k}");
        if row[0] != v {
            return None;
        }
    }
    Some(v as u64)
}

async fn wait_for<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

mod a_cluster_in_etcd_publishes_rolls_repairs_and_outlives_etcd {
    use embstore_client::Transport;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grpc() {
        super::scenario(Transport::Grpc).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn framed() {
        super::scenario(Transport::Framed).await
    }
}

async fn scenario(transport: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd_process = TestEtcd::start().await.unwrap();
    let endpoint = etcd_process.endpoint.clone();
    let etcd =
        Arc::new(Etcd::connect(std::slice::from_ref(&endpoint), Duration::from_secs(2)).unwrap());
    let mut nodes = Vec::new();
    for _ in 0..4 {
        nodes.push(Node::start(&endpoint).await);
    }
    let say = |line: &str| eprintln!("publish: {line}");

    // Version 1 onto 2 shards × 2 replicas; a client that found the servers through etcd reads
    // the checkpoint's rows.
    let ck1 = checkpoint(dir.path(), 1);
    assert_eq!(publish(etcd.clone(), &request("user", &ck1, Some(2)), say).await.unwrap(), 1);
    let (c, _) = control(&etcd, "user").await.unwrap().unwrap();
    assert_eq!((c.version, c.num_shards, c.replicas), (1, 2, 2));
    assert_eq!(c.roll.as_ref().unwrap().state, RollState::Done);
    let options = ClientOptions {
        deadline: Duration::from_secs(10),
        max_restarts: 3,
        refresh_every: Duration::from_millis(200),
        transport,
        ..Default::default()
    };
    let client =
        Arc::new(Client::connect_etcd(std::slice::from_ref(&endpoint), options).await.unwrap());
    let ids: Vec<u64> = (0..ROWS + 10).collect();
    let rows = client.lookup("user", &ids).await.unwrap();
    assert_eq!(rows.version, 1);
    assert_eq!(rows.found.iter().filter(|f| **f).count() as u64, ROWS);
    assert_eq!(one_version(&ids[..ROWS as usize], &rows.values), Some(1));

    // Readers run while versions 2 and 3 roll through (a spare column on the free servers of
    // each shard): no batch mixes versions, none fails, and they end on version 3.
    let stop = Arc::new(AtomicBool::new(false));
    let (batches, mixed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (client, stop, batches, mixed) =
            (client.clone(), stop.clone(), batches.clone(), mixed.clone());
        readers.push(tokio::spawn(async move {
            let mut seed = r + 1;
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let ids: Vec<u64> =
                    (0..64).map(|i| (seed >> 20).wrapping_add(i * 31) % ROWS).collect();
                let rows = client.lookup("user", &ids).await.expect("a lookup failed mid-roll");
                match one_version(&ids, &rows.values) {
                    Some(v) => {
                        assert!(v >= last, "went back from version {last} to {v}");
                        last = v;
                    }
                    None => {
                        mixed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                batches.fetch_add(1, Ordering::Relaxed);
            }
            last
        }));
    }
    for v in [2, 3] {
        let ck = checkpoint(dir.path(), v);
        assert_eq!(publish(etcd.clone(), &request("user", &ck, Some(2)), say).await.unwrap(), v);
    }
    // A second publish while one runs is refused, naming the roll.
    let ck4 = checkpoint(dir.path(), 4);
    let lock = embstore_cluster::roll_lock(etcd.clone(), "user", "someone", Duration::from_secs(5))
        .await
        .unwrap();
    let e = publish(etcd.clone(), &request("user", &ck4, Some(2)), say).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Locked, "{e}");
    lock.release().await;
    // A version that fails to load (its checkpoint is not there) leaves version 3 served.
    let missing = dir.path().join("no-such-checkpoint").to_string_lossy().into_owned();
    assert!(publish(etcd.clone(), &request("user", &missing, Some(2)), say).await.is_err());
    let (c, _) = control(&etcd, "user").await.unwrap().unwrap();
    assert_eq!(c.version, 3);
    assert_eq!(c.roll.as_ref().unwrap().state, RollState::Failed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert_eq!(r.await.unwrap(), 3, "a reader did not end on version 3");
    }
    let (n, m) = (batches.load(Ordering::Relaxed), mixed.load(Ordering::Relaxed));
    eprintln!("{n} batches during two rolls and a failed publish, {m} mixed");
    assert!(n > 20, "too few batches ({n}) to say anything");
    assert_eq!(m, 0, "{m} of {n} batches mixed versions");

    // A coordinator that dies mid-roll: its record says running, its lock expires; a column
    // server it had emptied gets the recorded version back from its own reconciler.
    let (mut c, rev) = control(&etcd, "user").await.unwrap().unwrap();
    c.roll.as_mut().unwrap().state = RollState::Running;
    assert!(embstore_cluster::put_control(&etcd, &c, rev).await.unwrap());
    let emptied = c.assignment[1][0].clone();
    let unload =
        embstore_cluster::AdminCall::Unload { table: "user".into(), version: 3, shard: None };
    embstore_cluster::admin(&emptied, unload, Duration::from_secs(5), None, None).await.unwrap();
    wait_for("an abandoned roll's column restored", Duration::from_secs(20), || {
        let emptied = emptied.clone();
        async move {
            let ch = Client::connect(&[emptied], ClientOptions::default()).await.unwrap();
            ch.view()[0].1.as_ref().is_some_and(|i| i.held.iter().any(|h| h.version == 3))
        }
    })
    .await;

    // A server dies: lookups go on at once (other replicas), and once its lease expires its
    // slot goes to a live server, which loads it: every shard has 2 live replicas again.
    let dead = nodes.remove(0);
    let dead_addr = dead.addr.clone();
    dead.crash();
    let rows = client.lookup("user", &ids[..100]).await.unwrap();
    assert_eq!(one_version(&ids[..100], &rows.values), Some(3));
    let etcd2 = etcd.clone();
    let dead2 = dead_addr.clone();
    wait_for("the dead server's slot reassigned", Duration::from_secs(20), || {
        let (etcd, dead) = (etcd2.clone(), dead2.clone());
        async move {
            let (c, _) = control(&etcd, "user").await.unwrap().unwrap();
            c.assignment.iter().flatten().all(|i| *i != dead)
        }
    })
    .await;
    let c2 = client.clone();
    wait_for("both replicas of every shard served again", Duration::from_secs(20), || {
        let (c, dead_addr) = (c2.clone(), dead_addr.clone());
        async move {
            c.refresh().await;
            let mut replicas = [0usize; 2];
            for (addr, info) in c.view() {
                let Some(info) = info else { continue };
                if addr == dead_addr {
                    continue;
                }
                for h in info.held.iter().filter(|h| h.version == 3 && h.num_shards == 2) {
                    replicas[h.shard as usize] += 1;
                }
            }
            replicas == [2, 2]
        }
    })
    .await;

    // etcd stops: lookups go on from the client's view.
    etcd_process.stop();
    for _ in 0..20 {
        let rows = client.lookup("user", &ids[..200]).await.unwrap();
        assert_eq!(one_version(&ids[..200], &rows.values), Some(3));
    }
    for n in nodes {
        n.stop().await;
    }
}
