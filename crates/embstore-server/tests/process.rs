//! A serving process as `embstore serve` runs it, started from Rust: a store directory served
//! on loopback, read through `embstore_client::Client` over gRPC and the framed path (TCP and
//! the Unix socket), and a follower of another process's sync port. Every test stops what it
//! starts, within a bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_client::{Client, ClientOptions, Transport};
use embstore_server::process::{Follow, FramedListen, ServeConfig, ServerProcess};
use embstore_table::disk::vfs::RealFs;
use embstore_table::{Store, TableConfig};

const D: usize = 4;

/// A store at `dir` with table `user`: ids 1..=3, row `[id; D]`.
fn store_dir(dir: &std::path::Path) {
    let store = Store::open_with(dir, 0, Arc::new(RealFs)).unwrap();
    let t = store.create_table(TableConfig::new("user", D)).unwrap();
    let rows: Vec<f32> = (1..=3).flat_map(|i| [i as f32; D]).collect();
    t.assign(&[1, 2, 3], &rows).unwrap();
    store.flush().unwrap();
}

/// A process running on a thread of its own; stopped (and joined, within 30 s) when dropped.
struct Running {
    process: Arc<ServerProcess>,
    done: Option<std::sync::mpsc::Receiver<embstore_common::Result<()>>>,
}

impl Running {
    fn start(config: ServeConfig) -> Self {
        let process = Arc::new(ServerProcess::start(config).unwrap());
        let (tx, done) = std::sync::mpsc::channel();
        let p = process.clone();
        std::thread::spawn(move || {
            let _ = tx.send(p.run(std::future::pending()));
        });
        Self { process, done: Some(done) }
    }

    fn stop(&mut self) {
        let Some(done) = self.done.take() else { return };
        self.process.stop();
        let result = done.recv_timeout(Duration::from_secs(30)).expect("run returns once stopped");
        result.unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.stop();
        } else if self.done.is_some() {
            self.process.stop();
        }
    }
}

/// Waits until `process` offers the framed path (its task has started).
fn wait_framed(process: &ServerProcess) {
    let t0 = Instant::now();
    while {
        let info = process.server().info();
        info.framed_port == 0 && info.framed_unix.is_empty()
    } {
        assert!(t0.elapsed() < Duration::from_secs(10), "the framed path never started");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `(transport, rows)` of `ids` in `user` read from `address` over `transport`.
fn lookup(address: &str, transport: Transport, ids: &[u64]) -> (&'static str, Vec<f32>, u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let options = ClientOptions { transport, ..ClientOptions::default() };
        let client = Client::connect(&[address.to_string()], options).await.unwrap();
        let rows = client.lookup("user", ids).await.unwrap();
        assert_eq!(rows.embedding_dim, D);
        let used = client.transport_to(address).unwrap();
        (used, rows.values, rows.version)
    })
}

fn expected(ids: &[u64]) -> Vec<f32> {
    ids.iter().flat_map(|&i| [if i <= 3 { i as f32 } else { 0.0 }; D]).collect()
}

#[test]
fn a_store_directory_is_served_over_grpc_and_the_framed_path() {
    let dir = tempfile::tempdir().unwrap();
    store_dir(&dir.path().join("store"));
    let socket = dir.path().join("framed.sock");
    let config = ServeConfig {
        framed_unix: Some(socket.clone()),
        ..ServeConfig::for_store(dir.path().join("store"), "127.0.0.1:0")
    };
    let mut running = Running::start(config);
    let p = running.process.clone();
    assert_eq!(p.tables(), vec!["user".to_string()]);
    assert!(p.address().starts_with("127.0.0.1:") && !p.address().ends_with(":0"));
    assert!(p.framed_address().is_some_and(|a| a.starts_with("127.0.0.1:")));
    assert_eq!((p.metrics_address(), p.sync_address()), (None, None));
    wait_framed(&p);
    let ids = [3, 1, 9];
    for (transport, via) in [(Transport::Grpc, "grpc"), (Transport::Framed, "framed-unix")] {
        let (used, values, version) = lookup(p.address(), transport, &ids);
        assert_eq!((used, version), (via, 1));
        assert_eq!(values, expected(&ids), "{via}");
    }
    running.stop();
    assert!(!socket.exists(), "the unix socket goes with the process");
    // Stopped: it ran once, and says so.
    let e = p.run(std::future::pending()).unwrap_err();
    assert!(e.to_string().contains("has run already"), "{e}");
}

#[test]
fn the_framed_path_on_tcp_and_without_it() {
    let dir = tempfile::tempdir().unwrap();
    store_dir(dir.path());
    let running = Running::start(ServeConfig::for_store(dir.path(), "127.0.0.1:0"));
    wait_framed(&running.process);
    let (used, values, _) = lookup(running.process.address(), Transport::Framed, &[2]);
    assert_eq!((used, values), ("framed", expected(&[2])));
    drop(running);

    let config = ServeConfig {
        framed_listen: FramedListen::Off,
        ..ServeConfig::for_store(dir.path(), "127.0.0.1:0")
    };
    let running = Running::start(config);
    assert_eq!(running.process.framed_address(), None);
    let (used, values, _) = lookup(running.process.address(), Transport::Auto, &[2]);
    assert_eq!((used, values), ("grpc", expected(&[2])));
}

#[test]
fn a_bad_config_is_refused_before_anything_serves() {
    let dir = tempfile::tempdir().unwrap();
    let e = ServerProcess::start(ServeConfig::for_store(dir.path(), "127.0.0.1:0")).unwrap_err();
    assert_eq!(e.kind(), embstore_common::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("holds no store (no MANIFEST)"), "{e}");
    store_dir(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = ServerProcess::start(ServeConfig::for_store(dir.path(), addr.as_str())).unwrap_err();
    assert_eq!(e.kind(), embstore_common::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains(&format!("cannot listen on {addr}")), "{e}");
}

#[test]
fn a_follower_serves_what_another_process_syncs_once_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    store_dir(dir.path());
    let mut primary = ServeConfig::for_store(dir.path(), "127.0.0.1:0");
    primary.sync.listen = Some("127.0.0.1:0".into());
    let primary = Running::start(primary);
    let source = primary.process.sync_address().expect("a sync port");

    let mut config =
        ServeConfig { catch_up_timeout: Duration::from_secs(20), ..Default::default() };
    config.sync.follow = Some(Follow::Source(source.clone()));
    let follower = Running::start(config);
    // The follower created the source's tables before it hosts them.
    assert_eq!(follower.process.tables(), vec!["user".to_string()]);
    let ids = [1, 2, 3];
    let t0 = Instant::now();
    loop {
        let (_, values, _) = lookup(follower.process.address(), Transport::Grpc, &ids);
        if values == expected(&ids) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the follower never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = follower.process.sync_status();
    assert!(status.iter().any(|s| s.table == "user" && s.source == source), "{status:?}");
    drop(follower);
    drop(primary);
}

/// A process that serves in a cluster and syncs through the same etcd keeps its naming key and
/// its sync member's key under one lease: both share its id, both come back together under a
/// new one when it is lost, and stopping the process revokes it, removing both at once.
#[test]
fn a_process_that_serves_and_syncs_keeps_both_keys_under_one_lease() {
    use embstore_cluster::testing::TestEtcd;
    use embstore_cluster::{Etcd, NAMING};

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let etcd_process = rt.block_on(TestEtcd::start()).unwrap();
    let endpoint = vec![etcd_process.endpoint.clone()];
    let etcd = {
        let _in = rt.enter();
        Etcd::connect(&endpoint, Duration::from_secs(2)).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    store_dir(dir.path());
    let mut config = ServeConfig::for_store(dir.path(), "127.0.0.1:0");
    config.etcd = Some(endpoint.clone());
    config.sync.listen = Some("127.0.0.1:0".into());
    config.sync.etcd = Some(endpoint);
    config.sync.dc = Some("dc1".into());
    let mut running = Running::start(config);
    let naming = format!("{NAMING}{}", running.process.address());
    // The lease of each key (`None`: the key is not there).
    let leases = || {
        rt.block_on(async {
            let named = etcd.get(&naming).await.unwrap().map(|kv| kv.lease);
            let synced = etcd.range_prefix(embstore_sync::discovery::PREFIX).await.unwrap();
            assert!(synced.len() <= 1, "{synced:?}");
            (named, synced.first().map(|kv| kv.lease))
        })
    };
    // Both registered (the naming key once `run` joined the cluster), within 20 s.
    let until = |want: &dyn Fn(Option<i64>, Option<i64>) -> bool| {
        let t0 = Instant::now();
        loop {
            let (a, b) = leases();
            if want(a, b) {
                return (a, b);
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "keys' leases: {a:?} {b:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (a, b) = until(&|a, b| a.is_some() && b.is_some());
    assert_eq!(a, b, "one lease for both keys");
    let first = a.unwrap();
    assert_ne!(first, 0);
    // The lease is lost (revoked behind the process's back): both keys come back, under one
    // new lease.
    rt.block_on(etcd.revoke(first)).unwrap();
    let (a, b) = until(&|a, b| a.is_some_and(|l| l != first) && b.is_some_and(|l| l != first));
    assert_eq!(a, b, "one new lease for both keys");
    // Stopping revokes it: both keys are gone at once.
    running.stop();
    assert_eq!(leases(), (None, None));
    drop(etcd_process);
}
