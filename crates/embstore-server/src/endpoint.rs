//! The `/metrics` endpoint: [`Server::metrics_text`] sets the gauges of what is held and
//! renders the server's [`Metrics`](crate::metrics) in Prometheus' text format, and
//! [`serve_metrics`] answers `GET /metrics` with it (over TLS when asked). The endpoint serves
//! any [`MetricsText`]: a server, or a process's registry of sources (the Python package's
//! training sessions), so every process has one way to be scraped.

use std::future::Future;
use std::sync::Arc;

use crate::hosting::Server;
use crate::tls::{ServerTls, TlsListener};

/// What a metrics endpoint serves: Prometheus' text format, rendered at each scrape (on a
/// blocking thread: a source may take a lock or call into Python).
pub trait MetricsText: Send + Sync + 'static {
    /// The metrics now.
    fn metrics_text(&self) -> String;
}

impl MetricsText for Server {
    fn metrics_text(&self) -> String {
        Server::metrics_text(self)
    }
}

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
        for f in [&m.sync_source, &m.follow_state, &m.follow_count] {
            f.clear();
        }
        m.follow_lag.clear();
        self.set_sync_metrics();
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
            // A table's sync state is the table's, whichever versions host it.
            if let Some(st) = held.iter().rev().find_map(|h| h.table.sync_stats()) {
                let what = [
                    ("pulls_cached", st.pulls_cached),
                    ("pulls_scanned", st.pulls_scanned),
                    ("rows_sent", st.rows_sent),
                    ("cached_rows", st.cached_rows as u64),
                    ("tombstones", st.tombstones as u64),
                    ("d_prop_ms", st.d_prop_ms),
                ];
                for (w, v) in what {
                    let l =
                        vec![("table".to_string(), name.clone()), ("what".to_string(), w.into())];
                    m.sync_source.get_or_create(&l).set(v as i64);
                }
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }
}

impl Server {
    /// Sets the gauges of the followed tables from the report given to `set_followed`.
    fn set_sync_metrics(&self) {
        let m = &self.metrics;
        let Some(report) = &*self.followed.read() else { return };
        for f in (report.0)() {
            let label = |k: &str, v: &str| (k.to_string(), v.to_string());
            let table = label("table", &f.table);
            for (q, ms) in [("0.5", f.lag_ms_p50), ("0.99", f.lag_ms_p99)] {
                if let Some(ms) = ms {
                    let l = vec![table.clone(), label("quantile", q)];
                    m.follow_lag.get_or_create(&l).set(ms / 1e3);
                }
            }
            let source = label("source", &f.source);
            let states = [
                ("connected", f.connected),
                ("caught_up", f.caught_up),
                ("congested", f.congested),
            ];
            for (state, on) in states {
                let l = vec![table.clone(), source.clone(), label("state", state)];
                m.follow_state.get_or_create(&l).set(i64::from(on));
            }
            let what = [
                ("parts_pending", f.parts_pending),
                ("rows_applied", f.rows_applied),
                ("bytes_in", f.bytes_in),
                ("errors", f.errors),
                ("congestions", f.congestions),
                ("prioritised_rows", f.prioritised_rows),
            ];
            for (w, v) in what {
                let l = vec![table.clone(), label("what", w)];
                m.follow_count.get_or_create(&l).set(v as i64);
            }
        }
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
    source: Arc<dyn MetricsText>,
    listener: tokio::net::TcpListener,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let source = source.clone();
            async move {
                let text = tokio::task::spawn_blocking(move || source.metrics_text())
                    .await
                    .unwrap_or_else(|e| format!("# embstore: the metrics source failed: {e}\n"));
                ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], text)
            }
        }),
    );
    match tls {
        None => axum::serve(listener, app).with_graceful_shutdown(shutdown).await,
        Some(tls) => {
            let mut config = tls
                .config()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            Arc::make_mut(&mut config).alpn_protocols = vec![b"http/1.1".to_vec()];
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

#[cfg(test)]
mod sync_tests {
    use super::*;
    use crate::hosting::Followed;
    use embstore_table::{Table, TableConfig};

    fn value(text: &str, metric: &str) -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(metric))?;
        line.rsplit(' ').next()?.parse().ok()
    }

    #[test]
    fn metrics_show_a_syncing_tables_source_side_and_the_followed_tables() {
        let s = Server::new("s", 1 << 16);
        let t = Arc::new(Table::new(TableConfig::new("item", 4)).unwrap());
        t.enable_sync(&embstore_table::sync::SyncOptions::default()).unwrap();
        t.assign(&[1, 2, 3], &[0.5; 12]).unwrap();
        s.host("item", 1, 0, 1, t.clone()).unwrap();
        let text = s.metrics_text();
        assert!(!text.contains("embstore_sync_lag_seconds{"), "{text}");
        // Nothing pulled yet; the update cache holds the three rows written.
        let cached = r#"embstore_sync_source{table="item",what="cached_rows"}"#;
        assert_eq!(value(&text, cached), Some(3.0), "{text}");
        let scanned = r#"embstore_sync_source{table="item",what="pulls_scanned"}"#;
        assert_eq!(value(&text, scanned), Some(0.0), "{text}");

        let rows = Arc::new(std::sync::atomic::AtomicU64::new(10));
        let r = rows.clone();
        s.set_followed(Box::new(move || {
            vec![Followed {
                table: "item".into(),
                source: "10.1.0.5:7100".into(),
                connected: true,
                caught_up: false,
                parts_pending: 7,
                lag_ms_p50: Some(30.0),
                lag_ms_p99: Some(1500.0),
                rows_applied: r.load(std::sync::atomic::Ordering::Relaxed),
                bytes_in: 4096,
                errors: 1,
                congested: true,
                congestions: 2,
                prioritised_rows: 40,
            }]
        }));
        let text = s.metrics_text();
        let lag = r#"embstore_sync_lag_seconds{table="item",quantile="0.99"}"#;
        assert_eq!(value(&text, lag), Some(1.5), "{text}");
        let lag = r#"embstore_sync_lag_seconds{table="item",quantile="0.5"}"#;
        assert_eq!(value(&text, lag), Some(0.03), "{text}");
        let state =
            r#"embstore_sync_follow_state{table="item",source="10.1.0.5:7100",state="caught_up"}"#;
        assert_eq!(value(&text, state), Some(0.0), "{text}");
        let state =
            r#"embstore_sync_follow_state{table="item",source="10.1.0.5:7100",state="connected"}"#;
        assert_eq!(value(&text, state), Some(1.0), "{text}");
        let pending = r#"embstore_sync_follow{table="item",what="parts_pending"}"#;
        assert_eq!(value(&text, pending), Some(7.0), "{text}");
        let ahead = r#"embstore_sync_follow{table="item",what="prioritised_rows"}"#;
        assert_eq!(value(&text, ahead), Some(40.0), "{text}");
        let state =
            r#"embstore_sync_follow_state{table="item",source="10.1.0.5:7100",state="congested"}"#;
        assert_eq!(value(&text, state), Some(1.0), "{text}");
        // Read again at each scrape.
        rows.store(25, std::sync::atomic::Ordering::Relaxed);
        let applied = r#"embstore_sync_follow{table="item",what="rows_applied"}"#;
        assert_eq!(value(&s.metrics_text(), applied), Some(25.0));
    }
}
