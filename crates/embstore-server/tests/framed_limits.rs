//! What one connection may take of the framed port ([`FramedLimits`]), tried as an adversary
//! would: a frame announced larger than anything before HELLO, connections that never say
//! HELLO or stall mid-frame, more connections than the cap, and a client that asks for a large
//! answer and never reads it. Deadlines are configured short here; every wait is bounded, and
//! generous against a loaded machine (a limit that fires late passes; one that never fires
//! fails).

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_proto::frame::{self, Kind, HEADER};
use embstore_proto::v1::LookupRequest;
use embstore_server::{FramedLimits, FramedListener, Server, Tokens};
use embstore_table::{Store, TableConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// The longest any limit here may take to act on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// A server of `user` (dim `dim`, ids 1..=3) at version 7, taking batches of `max_batch`.
fn server(dim: usize, max_batch: usize) -> Arc<Server> {
    let s = Server::new("limits", max_batch);
    let t = Store::new().create_table(TableConfig::new("user", dim)).unwrap();
    t.assign(&[1, 2, 3], &vec![0.5; 3 * dim]).unwrap();
    s.host("user", 7, 0, 1, t).unwrap();
    s
}

struct Serving {
    addr: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Serving {
    async fn start(server: &Arc<Server>, limits: FramedLimits) -> Self {
        let listener = FramedListener::tcp("127.0.0.1:0").await.unwrap();
        let (stop, mut rx) = watch::channel(false);
        let quit = async move {
            let _ = rx.wait_for(|q| *q).await;
        };
        let serve = embstore_server::serve_framed_with(
            server.clone(),
            listener,
            Tokens::default(),
            None,
            limits,
            quit,
        );
        let task = tokio::spawn(serve);
        let addr = format!("127.0.0.1:{}", server.info().framed_port);
        Self { addr, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().unwrap();
    }
}

fn lookup(ids: Vec<u64>) -> LookupRequest {
    LookupRequest {
        table: "user".into(),
        version: 7,
        shard: 0,
        num_shards: 1,
        ids,
        ..Default::default()
    }
}

/// The next frame, or `None` when the connection ends first (closed or reset).
async fn read_frame<S: AsyncRead + Unpin>(s: &mut S) -> Option<(frame::Header, Vec<u8>)> {
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h).await.ok()?;
    let h = frame::parse_header(&h).unwrap();
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).await.ok()?;
    Some((h, body))
}

/// Reads until the server closes the connection (within [`PATIENCE`]); the bytes read.
async fn until_closed<S: AsyncRead + Unpin>(s: &mut S) -> usize {
    let mut total = 0;
    let mut chunk = vec![0u8; 1 << 16];
    let t0 = Instant::now();
    loop {
        let left = PATIENCE.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return total,
            Ok(Ok(n)) => total += n,
            Err(_) => panic!("the server kept the connection open for {PATIENCE:?}"),
        }
    }
}

fn error_code(body: &[u8]) -> (tonic::Code, String) {
    let e = frame::decode_error(body).unwrap();
    (tonic::Code::from_i32(e.code), e.message)
}

async fn hello(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&frame::frame(
        Kind::Hello,
        0,
        &frame::encode_hello("", frame::Service::Lookups, &[]),
    ))
    .await
    .unwrap();
    let (h, _) = read_frame(&mut c).await.unwrap();
    assert_eq!(h.kind, Kind::Info);
    c
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < PATIENCE, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// A HELLO header that announces 10 MB is answered RESOURCE_EXHAUSTED and the connection
/// closed before any body is read; 100 clients doing it at once leave the server's memory as
/// it was (each used to cost the 10 MB it announced, zeroed, for as long as the client
/// waited). Also before HELLO: a lookup is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_announced_over_the_limit_before_hello_is_refused_without_allocating() {
    let server = server(2, 1 << 20);
    let serving = Serving::start(&server, FramedLimits::default()).await;
    let mut c = TcpStream::connect(&serving.addr).await.unwrap();
    c.write_all(&frame::header(Kind::Hello, 10_000_000, 1)).await.unwrap();
    let answer = tokio::time::timeout(PATIENCE, read_frame(&mut c)).await;
    let (h, body) = answer.expect("no answer to an oversized HELLO").unwrap();
    let (code, message) = error_code(&body);
    assert_eq!((h.kind, h.id, code), (Kind::Error, 1, tonic::Code::ResourceExhausted));
    assert!(message.contains("10000000 bytes before HELLO"), "{message}");
    assert!(message.contains("4096"), "{message}");
    assert_eq!(until_closed(&mut c).await, 0);

    let before = rss();
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut c = TcpStream::connect(&serving.addr).await.unwrap();
        c.write_all(&frame::header(Kind::Hello, 10_000_000, 1)).await.unwrap();
        clients.push(c);
    }
    for c in &mut clients {
        let (h, _) = tokio::time::timeout(PATIENCE, read_frame(c)).await.unwrap().unwrap();
        assert_eq!(h.kind, Kind::Error);
    }
    let grown = rss().saturating_sub(before);
    eprintln!("100 clients announcing 10 MB each: RSS {} MB -> {} MB", before >> 20, rss() >> 20);
    assert!(grown < 200 << 20, "RSS grew {} MB", grown >> 20);
    eventually("every refused connection closed", || server.framed_connections() == 0).await;
    let text = server.metrics_text();
    let line = r#"embstore_framed_closed_total{reason="frame_too_large_before_hello"} 101"#;
    assert!(text.contains(line), "no `{line}` in\n{text}");

    // A lookup before HELLO: refused, closed.
    let mut c = TcpStream::connect(&serving.addr).await.unwrap();
    c.write_all(&frame::encode_lookup(&lookup(vec![1]), 2)).await.unwrap();
    let (_, body) = read_frame(&mut c).await.unwrap();
    assert_eq!(error_code(&body).0, tonic::Code::Unauthenticated);
    assert_eq!(until_closed(&mut c).await, 0);
    serving.stop().await;
}

/// A connection that does not say HELLO within its deadline is closed, whether it sent
/// nothing or stalled mid-header; an authenticated one that stalls mid-frame is closed after
/// the frame deadline; an authenticated one that is merely idle (a client's pool) is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_stall_before_hello_or_mid_frame_are_closed() {
    let server = server(2, 64);
    let limits = FramedLimits {
        hello_within: Duration::from_millis(300),
        frame_within: Duration::from_millis(300),
        ..FramedLimits::default()
    };
    let serving = Serving::start(&server, limits).await;
    let idle = hello(&serving.addr).await;
    let mut silent = TcpStream::connect(&serving.addr).await.unwrap();
    let mut partial = TcpStream::connect(&serving.addr).await.unwrap();
    partial
        .write_all(
            &frame::frame(Kind::Hello, 0, &frame::encode_hello("", frame::Service::Lookups, &[]))
                [..5],
        )
        .await
        .unwrap();
    assert_eq!(until_closed(&mut silent).await, 0);
    assert_eq!(until_closed(&mut partial).await, 0);
    let mut stalled = hello(&serving.addr).await;
    stalled.write_all(&frame::encode_lookup(&lookup(vec![1, 2]), 3)[..20]).await.unwrap();
    assert_eq!(until_closed(&mut stalled).await, 0);
    let text = server.metrics_text();
    for line in [
        r#"embstore_framed_closed_total{reason="hello_deadline"} 2"#,
        r#"embstore_framed_closed_total{reason="frame_deadline"} 1"#,
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    // The idle pooled connection outlived every deadline and still answers.
    let mut idle = idle;
    idle.write_all(&frame::encode_lookup(&lookup(vec![1]), 4)).await.unwrap();
    let (h, _) = read_frame(&mut idle).await.unwrap();
    assert_eq!((h.kind, h.id), (Kind::Rows, 4));
    serving.stop().await;
}

/// Past the cap, a connection is answered UNAVAILABLE and closed; once one closes, a new one
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused() {
    let server = server(2, 64);
    let limits = FramedLimits { max_connections: 3, ..FramedLimits::default() };
    let serving = Serving::start(&server, limits).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(hello(&serving.addr).await);
    }
    assert_eq!(server.framed_connections(), 3);
    let mut over = TcpStream::connect(&serving.addr).await.unwrap();
    let (h, body) = tokio::time::timeout(PATIENCE, read_frame(&mut over)).await.unwrap().unwrap();
    let (code, message) = error_code(&body);
    assert_eq!((h.kind, code), (Kind::Error, tonic::Code::Unavailable));
    assert!(message.contains("limit of 3 connections"), "{message}");
    assert_eq!(until_closed(&mut over).await, 0);
    drop(held.pop());
    eventually("a closed connection leaves the count", || server.framed_connections() == 2).await;
    let mut again = hello(&serving.addr).await;
    again.write_all(&frame::encode_lookup(&lookup(vec![3]), 5)).await.unwrap();
    assert_eq!(read_frame(&mut again).await.unwrap().0.kind, Kind::Rows);
    let text = server.metrics_text();
    assert!(text.contains(r#"embstore_framed_closed_total{reason="over_cap"} 1"#), "{text}");
    assert!(text.contains("embstore_framed_connections 3"), "{text}");
    serving.stop().await;
}

/// A client that asks for a 51 MB answer and never reads it is disconnected once the write
/// deadline passes, and the connection (with its answer buffer) is gone; it never gets the
/// whole answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answer_is_closed_and_the_answer_dropped() {
    const DIM: usize = 128;
    const N: usize = 100_000;
    let server = server(DIM, N);
    let limits = FramedLimits {
        write_within: Duration::from_millis(300),
        write_per_8_mib: Duration::from_millis(100),
        ..FramedLimits::default()
    };
    assert_eq!(limits.write_deadline(N * DIM * 4), Duration::from_millis(300 + 7 * 100));
    let serving = Serving::start(&server, limits).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut c = socket.connect(serving.addr.parse().unwrap()).await.unwrap();
    c.write_all(&frame::frame(
        Kind::Hello,
        0,
        &frame::encode_hello("", frame::Service::Lookups, &[]),
    ))
    .await
    .unwrap();
    assert_eq!(read_frame(&mut c).await.unwrap().0.kind, Kind::Info);
    let ids: Vec<u64> = (0..N as u64).collect();
    c.write_all(&frame::encode_lookup(&lookup(ids), 6)).await.unwrap();
    // Not reading: the server gives up on the answer and drops the connection.
    eventually("the unread answer's connection closed", || server.framed_connections() == 0).await;
    let text = server.metrics_text();
    assert!(text.contains(r#"embstore_framed_closed_total{reason="write_deadline"} 1"#), "{text}");
    let answer = HEADER + N * DIM * 4;
    let got = until_closed(&mut c).await;
    assert!(got < answer, "the client read the whole answer ({got} bytes)");
    // The server serves on.
    let mut other = hello(&serving.addr).await;
    other.write_all(&frame::encode_lookup(&lookup(vec![2]), 7)).await.unwrap();
    assert_eq!(read_frame(&mut other).await.unwrap().0.kind, Kind::Rows);
    serving.stop().await;
}
