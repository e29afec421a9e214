//! A directory on its own (a process that syncs but serves no cluster: its own thread, runtime
//! and lease) against an etcd on loopback: it registers, lists itself, comes back after its
//! lease is lost, and its stop removes its key at once. Every test stops what it starts.

use std::time::{Duration, Instant};

use embstore_cluster::testing::TestEtcd;
use embstore_cluster::Etcd;
use embstore_sync::discovery::{Directory, Member, DEFAULT_TTL, PREFIX};

#[test]
fn a_directory_on_its_own_registers_comes_back_after_a_lost_lease_and_leaves_at_stop() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let etcd_process = rt.block_on(TestEtcd::start()).unwrap();
    let endpoint = vec![etcd_process.endpoint.clone()];
    let etcd = {
        let _in = rt.enter();
        Etcd::connect(&endpoint, Duration::from_secs(2)).unwrap()
    };
    let me = Member {
        dc: "dc1".into(),
        replica: 7,
        addr: "127.0.0.1:7100".into(),
        primary: true,
        status: String::new(),
    };
    let dir = Directory::start(&endpoint, me.clone(), DEFAULT_TTL).unwrap();
    assert_eq!(dir.members(), vec![me]);
    let lease = || rt.block_on(etcd.range_prefix(PREFIX)).unwrap().first().map(|kv| kv.lease);
    let first = lease().expect("registered");
    // Lost behind its back: the key comes back under a new lease, within 20 s.
    rt.block_on(etcd.revoke(first)).unwrap();
    let t0 = Instant::now();
    while lease().is_none_or(|l| l == first) {
        assert!(t0.elapsed() < Duration::from_secs(20), "the key never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    dir.stop();
    assert_eq!(lease(), None, "stop revokes the lease");
    drop(etcd_process);
}
