//! The `/metrics` endpoint: [`Server::metrics_text`] sets the gauges of what is held and
//! renders the server's [`Metrics`](crate::metrics) in Prometheus' text format, and
//! [`serve_metrics`] answers `GET /metrics` with it (over TLS when asked).

use std::future::Future;
use std::sync::Arc;

use crate::hosting::Server;
use crate::tls::{Tls, TlsListener};

impl Server {
    /// The metrics in Prometheus' text format, with the gauges of what is held set now.
    pub fn metrics_text(&self) -> String {
        let m = &self.metrics;
        for f in [&m.held, &m.rows, &m.bytes, &m.disk, &m.disk_reads, &m.budget, &m.eviction_errors]
        {
            f.clear();
        }
        for f in [&m.cluster_version, &m.roll, &m.roll_to, &m.roll_seconds] {
            f.clear();
        }
        let of = |table: &str| vec![("table".to_string(), table.to_string())];
        for c in self.controls.read().iter() {
            m.cluster_version.get_or_create(&of(&c.table)).set(c.version as i64);
            if let Some(r) = &c.roll {
                let mut l = of(&c.table);
                let state = format!("{:?}", r.state).to_lowercase();
                l.extend([("state".to_string(), state), ("step".to_string(), r.step.clone())]);
                m.roll.get_or_create(&l).set(1);
                m.roll_to.get_or_create(&of(&c.table)).set(r.to_version as i64);
                let ms = r.updated_ms.saturating_sub(r.started_ms);
                m.roll_seconds.get_or_create(&of(&c.table)).set((ms / 1000) as i64);
            }
        }
        if let Some(t) = &self.tier {
            let kind = |k: &str| vec![("kind".to_string(), k.to_string())];
            m.budget.get_or_create(&kind("limit")).set(t.budget.limit() as i64);
            m.budget.get_or_create(&kind("used")).set(t.budget.used() as i64);
            if let Some(e) = t.budget.last_eviction_error() {
                let l = vec![("error".to_string(), e)];
                m.eviction_errors.get_or_create(&l).set(t.budget.eviction_errors() as i64);
            }
        }
        for (name, held) in self.tables.read().iter() {
            for h in held {
                let state = format!("{:?}", h.state).to_lowercase();
                let l = vec![("table".to_string(), name.clone()), ("state".to_string(), state)];
                m.held.get_or_create(&l).inc();
                let l = vec![
                    ("table".to_string(), name.clone()),
                    ("version".to_string(), h.version.to_string()),
                ];
                m.rows.get_or_create(&l).set(h.table.len() as i64);
                m.bytes.get_or_create(&of(name)).inc_by(h.table.bytes() as i64);
                m.disk.get_or_create(&of(name)).inc_by(h.table.disk_bytes() as i64);
                m.disk_reads.get_or_create(&of(name)).inc_by(h.table.disk_reads() as i64);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }
}

/// Serves `GET /metrics` (Prometheus text format: lookups by table and outcome, ids, a latency
/// histogram, versions, rows and bytes held) on `listener` until `shutdown` resolves.
pub async fn serve_metrics(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_metrics_with(server, listener, None, shutdown).await
}

/// [`serve_metrics`] over TLS when `tls` is given (the serving port's certificate, and with a
/// client CA, mutual TLS: Prometheus then scrapes with a client certificate). A connection
/// whose handshake fails or takes over 10 s is dropped; others are not held up by it.
pub async fn serve_metrics_with(
    server: Arc<Server>,
    listener: tokio::net::TcpListener,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let server = server.clone();
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                    server.metrics_text(),
                )
            }
        }),
    );
    match tls {
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await,
        Some(tls) => {
            let config = tls
                .rustls_config()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let listener = TlsListener::new(listener, config);
            axum::serve(listener, app).with_graceful_shutdown(shutdown).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosting::TierOptions;
    use embstore_table::{Store, TableConfig};

    #[test]
    fn metrics_show_the_last_eviction_error_of_the_budget() {
        // A store that shares the server's budget cannot evict onto its full disk: the
        // failure, counted with its message, is in /metrics.
        use embstore_table::disk::vfs::FaultFs;
        let root = tempfile::tempdir().unwrap();
        let budget = embstore_table::Budget::shared(64 << 10).unwrap();
        let tier = TierOptions { dir: root.path().join("data"), budget: budget.clone() };
        let s = Server::with_tier("tiered", 1 << 16, tier).unwrap();
        assert!(!s.metrics_text().contains("embstore_eviction_errors"));
        let fs = FaultFs::new(u64::MAX);
        let options = embstore_table::StoreOptions::default().with_shared_budget(budget.clone());
        let store = Store::open_with_options(root.path().join("s"), &options, Arc::new(fs.clone()))
            .unwrap();
        let t = store.create_table(TableConfig::new("t", 8)).unwrap();
        fs.set_full(true);
        let ids: Vec<u64> = (0..4000).collect();
        let mut out = vec![0.0; ids.len() * 8];
        let _ = t.lookup(&ids, embstore_table::OnMiss::Init, &mut out, None);
        assert!(budget.eviction_errors() > 0);
        let text = s.metrics_text();
        assert!(text.contains("embstore_eviction_errors{error=\""), "{text}");
        assert!(text.contains("No space left"), "{text}");
    }
}
