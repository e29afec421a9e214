//! The framed lookup path byte by byte, as a client in another language would speak it
//! (docs/serving.md): HELLO and tokens, pipelined lookups answered in order, a malformed body
//! that leaves the connection usable, frames of another version or over the limit that close
//! it, and the Unix socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use embstore_proto::frame::{self, Kind, RowsHead, HEADER, ROWS_FIXED};
use embstore_proto::v1::{LookupRequest, ServerInfo};
use embstore_server::{FramedListener, Server, Tokens};
use embstore_table::{Store, TableConfig};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// A server of `user` (D 2, ids 1..=3, row `[id, 0.5]`) at version 7, max batch 64.
fn server() -> Arc<Server> {
    let s = Server::new("framed", 64);
    let store = Store::new();
    let t = store.create_table(TableConfig::new("user", 2)).unwrap();
    t.assign(&[1, 2, 3], &[1.0, 0.5, 2.0, 0.5, 3.0, 0.5]).unwrap();
    s.host("user", 7, 0, 1, t).unwrap();
    s
}

struct Serving {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Serving {
    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().unwrap();
    }
}

async fn serve(server: Arc<Server>, listener: FramedListener, tokens: Tokens) -> Serving {
    let (stop, mut rx) = watch::channel(false);
    let s = server.clone();
    let task = tokio::spawn(async move {
        embstore_server::serve_framed(s, listener, tokens, None, async move {
            let _ = rx.wait_for(|q| *q).await;
        })
        .await
    });
    let t0 = Instant::now();
    while server.info().framed_port == 0 && server.info().framed_unix.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Serving { stop, task }
}

async fn read_frame<S: AsyncRead + Unpin>(s: &mut S) -> Option<(frame::Header, Vec<u8>)> {
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h).await.ok()?;
    let h = frame::parse_header(&h).unwrap();
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).await.unwrap();
    Some((h, body))
}

/// The rows and found flags of a ROWS frame's body (`len` its length).
fn rows(body: &[u8]) -> (RowsHead, Vec<u8>, Vec<f32>) {
    let head = RowsHead::parse(body[..ROWS_FIXED].try_into().unwrap(), body.len() as u32).unwrap();
    let at = ROWS_FIXED + head.info_len as usize;
    let found = body[at..at + head.n as usize].to_vec();
    let values = body[head.prefix_len() - HEADER..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (head, found, values)
}

fn lookup(ids: &[u64], known_gen: u64) -> LookupRequest {
    LookupRequest {
        table: "user".into(),
        version: 7,
        shard: 0,
        num_shards: 1,
        ids: ids.to_vec(),
        known_gen,
        more_shards: vec![],
    }
}

async fn hello<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, token: &str) -> (Kind, Vec<u8>) {
    s.write_all(&frame::frame(
        Kind::Hello,
        0,
        &frame::encode_hello(token, frame::Service::Lookups, &[]),
    ))
    .await
    .unwrap();
    let (h, body) = read_frame(s).await.unwrap();
    (h.kind, body)
}

fn error(body: &[u8]) -> (tonic::Code, String) {
    let e = frame::decode_error(body).unwrap();
    (tonic::Code::from_i32(e.code), e.message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_pipelined_lookups_and_bad_frames() {
    let server = server();
    let tokens = Tokens { read: Some("r3ad".into()), admin: None };
    let serving =
        serve(server.clone(), FramedListener::tcp("127.0.0.1:0").await.unwrap(), tokens).await;
    let addr = format!("127.0.0.1:{}", server.info().framed_port);
    let connect = || tokio::net::TcpStream::connect(addr.clone());

    // No token, a wrong one, or a lookup before HELLO: refused, and the connection closed.
    for (token, want) in
        [("", tonic::Code::Unauthenticated), ("nope", tonic::Code::PermissionDenied)]
    {
        let mut c = connect().await.unwrap();
        let (kind, body) = hello(&mut c, token).await;
        assert_eq!((kind, error(&body).0), (Kind::Error, want), "{token:?}");
        assert!(read_frame(&mut c).await.is_none(), "the connection stays open");
    }
    let mut c = connect().await.unwrap();
    c.write_all(&frame::encode_lookup(&lookup(&[1], 0), 1)).await.unwrap();
    let (h, body) = read_frame(&mut c).await.unwrap();
    assert_eq!((h.kind, error(&body).0), (Kind::Error, tonic::Code::Unauthenticated));

    // HELLO with the token: the server's info, naming its framed port.
    let mut c = connect().await.unwrap();
    let (kind, body) = hello(&mut c, "r3ad").await;
    assert_eq!(kind, Kind::Info);
    let info = ServerInfo::decode(body.as_slice()).unwrap();
    assert_eq!((info.framed_port, info.held[0].version), (server.info().framed_port, 7));

    // Three lookups written before any answer is read: answered in order, by id; the first
    // carries the info (its known_gen is stale), the others not.
    let mut wire = frame::encode_lookup(&lookup(&[2, 9], 0), 10);
    wire.extend(frame::encode_lookup(&lookup(&[3], info.gen), 11));
    wire.extend(frame::encode_lookup(&lookup(&[], info.gen), 12));
    c.write_all(&wire).await.unwrap();
    let (h, body) = read_frame(&mut c).await.unwrap();
    let (head, found, values) = rows(&body);
    assert_eq!((h.kind, h.id, head.version, head.dim, head.n), (Kind::Rows, 10, 7, 2, 2));
    assert!(head.info_len > 0);
    assert_eq!((found, values), (vec![1, 0], vec![2.0, 0.5, 0.0, 0.0]));
    let (h, body) = read_frame(&mut c).await.unwrap();
    let (head, found, values) = rows(&body);
    assert_eq!((h.id, head.info_len, found, values), (11, 0, vec![1], vec![3.0, 0.5]));
    let (h, body) = read_frame(&mut c).await.unwrap();
    assert_eq!((h.id, rows(&body).0.n), (12, 0));

    // A malformed body (ids cut short), an unknown table, another version, too many ids: an
    // error each, and the connection goes on.
    let mut bad = frame::encode_lookup(&lookup(&[1, 2], 0), 20);
    bad.truncate(bad.len() - 3);
    let len = (bad.len() - HEADER) as u32;
    bad[4..8].copy_from_slice(&len.to_le_bytes());
    c.write_all(&bad).await.unwrap();
    let (h, body) = read_frame(&mut c).await.unwrap();
    assert_eq!((h.id, error(&body).0), (20, tonic::Code::InvalidArgument));
    let cases = [
        (LookupRequest { table: "item".into(), ..lookup(&[1], 0) }, tonic::Code::NotFound),
        (LookupRequest { version: 8, ..lookup(&[1], 0) }, tonic::Code::FailedPrecondition),
        (lookup(&[1; 65], 0), tonic::Code::ResourceExhausted),
    ];
    for (req, code) in cases {
        c.write_all(&frame::encode_lookup(&req, 21)).await.unwrap();
        let (_, body) = read_frame(&mut c).await.unwrap();
        let (got, message) = error(&body);
        assert_eq!(got, code, "{message}");
        // The details carry the server's info, as gRPC's do.
        let e = frame::decode_error(&body).unwrap();
        assert_eq!(ServerInfo::decode(e.details.as_slice()).unwrap().instance, "framed");
    }
    c.write_all(&frame::frame(Kind::Describe, 22, &[])).await.unwrap();
    let (h, _) = read_frame(&mut c).await.unwrap();
    assert_eq!((h.kind, h.id), (Kind::Info, 22));
    c.write_all(&frame::encode_lookup(&lookup(&[1], 0), 23)).await.unwrap();
    assert_eq!(rows(&read_frame(&mut c).await.unwrap().1).2, vec![1.0, 0.5]);

    // Another protocol version, or a frame over what any allowed batch needs: an error, then
    // the connection is closed.
    let mut v1 = frame::frame(Kind::Describe, 30, &[]);
    v1[1] = 1;
    c.write_all(&v1).await.unwrap();
    let (_, body) = read_frame(&mut c).await.unwrap();
    let (code, message) = error(&body);
    assert_eq!(code, tonic::Code::Unimplemented);
    assert!(message.contains("speaks version 2"), "{message}");
    assert!(read_frame(&mut c).await.is_none());
    let mut c = connect().await.unwrap();
    hello(&mut c, "r3ad").await;
    c.write_all(&frame::header(Kind::Lookup, 1 << 30, 31)).await.unwrap();
    let (_, body) = read_frame(&mut c).await.unwrap();
    assert_eq!(error(&body).0, tonic::Code::ResourceExhausted);
    assert!(read_frame(&mut c).await.is_none());

    // Every lookup was counted, as gRPC's are.
    let text = server.metrics_text();
    for line in [
        r#"embstore_lookups_total{table="user",outcome="ok"} 4"#,
        r#"embstore_lookups_total{table="user",outcome="resourceexhausted"} 1"#,
        r#"embstore_lookups_total{table="item",outcome="notfound"} 1"#,
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    serving.stop().await;
    assert_eq!(server.info().framed_port, 0, "a stopped path is no longer offered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_serves_and_never_replaces_what_is_not_a_dead_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embstore.sock");
    let server = server();
    let serving =
        serve(server.clone(), FramedListener::unix(&path).unwrap(), Tokens::default()).await;
    assert_eq!(server.info().framed_unix, path.display().to_string());
    let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
    assert_eq!(hello(&mut c, "").await.0, Kind::Info);
    c.write_all(&frame::encode_lookup(&lookup(&[3, 1], 0), 5)).await.unwrap();
    assert_eq!(rows(&read_frame(&mut c).await.unwrap().1).2, vec![3.0, 0.5, 1.0, 0.5]);
    // A second server cannot take a socket a live one answers on.
    let e = FramedListener::unix(&path).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    drop(c);
    serving.stop().await;
    assert!(!path.exists(), "the socket file is removed when serving stops");
    assert!(server.info().framed_unix.is_empty());
    // A file that is not a socket is never replaced.
    std::fs::write(&path, b"precious").unwrap();
    assert!(FramedListener::unix(&path).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    // A dead server's socket file is.
    std::fs::remove_file(&path).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    drop(FramedListener::unix(&path).unwrap());
}

/// The server offers its framed endpoint when `serve_framed` is called, not when its future
/// first runs: a client that reads the info at once finds it, and a connection made before
/// the accept loop runs waits in the listener's backlog and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_framed_path_is_offered_as_soon_as_serving_is_called() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embstore.sock");
    let (stop, rx) = watch::channel(false);
    let quit = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|q| *q).await;
    };
    let tcp = FramedListener::tcp("127.0.0.1:0").await.unwrap();
    let (s, q) = (server.clone(), quit(rx.clone()));
    let tcp = embstore_server::serve_framed(s, tcp, Tokens::default(), None, q);
    let unix = FramedListener::unix(&path).unwrap();
    let unix =
        embstore_server::serve_framed(server.clone(), unix, Tokens::default(), None, quit(rx));
    let info = server.info();
    assert_ne!(info.framed_port, 0, "the port is offered before serving runs");
    assert_eq!(info.framed_unix, path.display().to_string());
    let mut c =
        tokio::net::TcpStream::connect(format!("127.0.0.1:{}", info.framed_port)).await.unwrap();
    c.write_all(&frame::frame(
        Kind::Hello,
        0,
        &frame::encode_hello("", frame::Service::Lookups, &[]),
    ))
    .await
    .unwrap();
    let tasks = [tokio::spawn(tcp), tokio::spawn(unix)];
    let (h, _) =
        tokio::time::timeout(Duration::from_secs(30), read_frame(&mut c)).await.unwrap().unwrap();
    assert_eq!(h.kind, Kind::Info);
    let _ = stop.send(true);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!((server.info().framed_port, server.info().framed_unix), (0, String::new()));
}

/// DESCRIBE before HELLO says which server this is (its boot id, as its gRPC `ServerInfo`
/// names it) and nothing of what it holds, also to a client without the token; after HELLO,
/// DESCRIBE answers the whole info.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_before_hello_names_the_server_and_nothing_it_holds() {
    let server = server();
    let other = Server::new("other", 64);
    assert_eq!(server.boot_id().len(), 32);
    assert_ne!(server.boot_id(), other.boot_id());
    assert_eq!(server.info().boot_id, server.boot_id());
    let tokens = Tokens { read: Some("r3ad".into()), admin: None };
    let serving =
        serve(server.clone(), FramedListener::tcp("127.0.0.1:0").await.unwrap(), tokens).await;
    let addr = format!("127.0.0.1:{}", server.info().framed_port);
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    c.write_all(&frame::frame(Kind::Describe, 1, &[])).await.unwrap();
    let (h, body) = read_frame(&mut c).await.unwrap();
    assert_eq!((h.kind, h.id), (Kind::Info, 1));
    let info = ServerInfo::decode(body.as_slice()).unwrap();
    assert_eq!((info.boot_id.as_str(), info.instance.as_str()), (server.boot_id(), "framed"));
    assert!(info.held.is_empty() && info.framed_port == 0, "{info:?}");
    let (kind, body) = hello(&mut c, "r3ad").await;
    assert_eq!(kind, Kind::Info);
    let info = ServerInfo::decode(body.as_slice()).unwrap();
    assert_eq!((info.boot_id.as_str(), info.held.len()), (server.boot_id(), 1));
    serving.stop().await;
}
