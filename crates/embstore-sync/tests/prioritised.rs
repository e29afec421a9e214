//! Prioritised sync over TCP: a primary that scores its writes streams them to a follower
//! through a link too slow for them (a loopback proxy sharing one token bucket between its
//! connections). The follower finds the link congested, pulls the significant writes ahead
//! of the rest on a second connection, and serves them before normal sync brings them; once
//! the writes stop, normal sync catches up, every entry is superseded and the link calms.
mod common;
use common::rows;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_replication::{CongestionConfig, EkkoPriority, PriorityConfig};
use embstore_sync::{FollowOptions, Follower, ServeOptions, SyncServer};
use embstore_table::sync::{Priority, SyncOptions};
use embstore_table::{OnMiss, Store, TableConfig};

const D: usize = 16;

/// A TCP proxy to `to` whose connections share `bytes_per_s` in each direction (a token
/// bucket refilled every 10 ms), until `stop`.
fn slow_link(to: String, bytes_per_s: usize, stop: Arc<AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let bucket = Arc::new(parking_lot::Mutex::new((bytes_per_s / 100, Instant::now())));
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Ok((a, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            a.set_nonblocking(false).unwrap();
            let b = TcpStream::connect(&to).unwrap();
            for (mut from, mut into) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
                let (bucket, stop) = (bucket.clone(), stop.clone());
                std::thread::spawn(move || {
                    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
                    let mut buf = vec![0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        let n = match from.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => n,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                            Err(_) => break,
                        };
                        let mut sent = 0;
                        while sent < n && !stop.load(Ordering::Relaxed) {
                            let take = {
                                let mut b = bucket.lock();
                                if b.1.elapsed() >= Duration::from_millis(10) {
                                    *b = (bytes_per_s / 100, Instant::now());
                                }
                                let take = b.0.min(n - sent);
                                b.0 -= take;
                                take
                            };
                            if take == 0 {
                                std::thread::sleep(Duration::from_millis(2));
                                continue;
                            }
                            if into.write_all(&buf[sent..sent + take]).is_err() {
                                return;
                            }
                            sent += take;
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

#[test]
fn a_congested_link_carries_significant_writes_ahead_and_normal_sync_catches_up() {
    let store = Arc::new(Store::with_replica(1).unwrap());
    let t = store.create_table(TableConfig::new("items", D)).unwrap();
    let options = ServeOptions {
        token: None,
        sync: SyncOptions { parts: 64, ..SyncOptions::default() },
        tls: None,
    };
    let server = SyncServer::start(store.clone(), "127.0.0.1:0", options).unwrap();
    let p =
        Priority { config: PriorityConfig::with_k(95.0), rule: Arc::new(EkkoPriority), model: 0 };
    t.set_priority(Some(p)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // 150 KB/s: the writes below need about five times that (their rows compress to about
    // half: protocol 6).
    let link = slow_link(server.addr().to_string(), 150_000, stop.clone());
    let replica = Arc::new(Store::with_replica(2).unwrap());
    let congestion = CongestionConfig { timeout_ms: 400, late_rounds: 2, calm_ms: 1_000 };
    let options = FollowOptions {
        wait_ms: 200,
        retry_ms: 50,
        priority: Some(congestion),
        ..FollowOptions::default()
    };
    let f = Follower::start(replica.clone(), &link, options).unwrap();
    // 2.5 s of writes (longer, up to 10 s, until a row went ahead: on a loaded machine the
    // first prioritised answer may take longer to cross the link): 1,000 rows of 64 B every
    // 50 ms (~1.5 MB/s with their headers), gradients growing with the id so the significant
    // ones are the large ids.
    let started = Instant::now();
    let mut step = 0u64;
    let mut ahead_seen = false;
    while started.elapsed() < Duration::from_millis(2_500)
        || (!ahead_seen && started.elapsed() < Duration::from_secs(10))
    {
        let ids: Vec<u64> = (0..1_000).map(|i| step * 1_000 + i).collect();
        // Each element a little apart (up to 10 %), so that the rows do not compress away
        // (protocol 6 sends them zstd-compressed).
        let g: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                (0..D as u64).map(move |j| {
                    0.001 * (1 + i % 1_000) as f32 * (1.0 + ((i * 31 + j * 17) % 97) as f32 / 970.0)
                })
            })
            .collect();
        t.apply_gradients(&ids, &g, None).unwrap();
        step += 1;
        std::thread::sleep(Duration::from_millis(50));
        let s = &f.status()[0];
        if s.prioritised_rows > 0 {
            ahead_seen = true;
        }
    }
    let s = f.status()[0].clone();
    assert!(s.congestions >= 1, "the link was never found congested: {s:?}");
    assert!(ahead_seen && s.prioritised_rows > 0, "nothing went ahead: {s:?}");
    let stats = t.priority_stats().unwrap();
    assert!(stats.significant > 0, "{stats:?}");
    // A row taken ahead reads the primary's values at the replica.
    let r = replica.table("items").unwrap();
    // Normal sync catches up once the writes stop; the link calms, entries are superseded.
    assert!(f.wait_caught_up(Duration::from_secs(120)), "{:?}", f.status());
    assert_eq!(rows(&r), rows(&t));
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.status()[0].congested && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = f.status()[0].clone();
    assert!(!s.congested, "the link never calmed: {s:?}");
    assert_eq!(r.priority_stats().unwrap().significant_entries, 0, "P2 after catching up");
    let ids: Vec<u64> = (0..100).collect();
    let (mut a, mut b) = (vec![0.0; 100 * D], vec![0.0; 100 * D]);
    t.lookup(&ids, OnMiss::Zeros, &mut a, None).unwrap();
    r.lookup(&ids, OnMiss::Zeros, &mut b, None).unwrap();
    assert_eq!(a, b);
    assert!(server.stats().prioritised_pulls > 0);
    f.stop();
    stop.store(true, Ordering::Relaxed);
}
