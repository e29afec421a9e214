//! What other crates' tests need of the control plane: an `etcd` on loopback
//! ([`TestEtcd`]). Built only for this crate's tests and with the `test-harness` feature, which
//! the crates whose tests use it ask for in their dev-dependencies: no release build carries it.

use std::time::Duration;

use embstore_common::{Error, ErrorKind, Result};

use crate::Etcd;

/// An `etcd` process on loopback for tests, stopped (by PID) and its data removed on drop.
#[derive(Debug)]
pub struct TestEtcd {
    child: std::process::Child,
    dir: std::path::PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

/// A free loopback port (bound and released: another process may take it, rarely).
pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl TestEtcd {
    /// Starts `etcd` (Debian's `etcd-server`, which `make setup` installs) on two free
    /// loopback ports with its data in a fresh directory, and waits until it answers.
    pub async fn start() -> Result<Self> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Io, e.to_string());
        let (client, peer) = (free_port().map_err(io)?, free_port().map_err(io)?);
        let dir =
            std::env::temp_dir().join(format!("embstore-etcd-{}-{client}", std::process::id()));
        let endpoint = format!("http://127.0.0.1:{client}");
        let child = std::process::Command::new("etcd")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "cannot start etcd: {e} (apt-get install etcd-server; make setup does)"
                    ),
                )
            })?;
        let etcd = TestEtcd { child, dir, endpoint };
        let client =
            Etcd::connect(std::slice::from_ref(&etcd.endpoint), Duration::from_millis(500))?;
        let start = std::time::Instant::now();
        while client.get("/embstore/ping").await.is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(Error::new(ErrorKind::Unavailable, "etcd did not start in 20 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(etcd)
    }

    /// Stops it (SIGKILL) now.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
