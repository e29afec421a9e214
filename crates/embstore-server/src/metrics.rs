//! The server's Prometheus metrics: lookups by table and outcome, ids, a latency histogram,
//! what is held (versions, rows, bytes in memory and on disk), the memory budget and its
//! eviction errors, and the tables' control records as a cluster member last read them;
//! the endpoint that answers `GET /metrics` with them is `endpoint.rs`.
//!
//! The gauges of what is held are set at each scrape (`Server::metrics_text`), never on a
//! lookup's path; a lookup only bumps its counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of a metric: (name, value) pairs.
type Labels = Vec<(String, String)>;

/// A gauge of seconds.
pub(crate) type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The server's Prometheus metrics (`/metrics`, see `serve_metrics`).
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Lookups by table and outcome (`ok` or the gRPC code's name).
    pub(crate) lookups: Family<Labels, Counter>,
    /// Ids looked up, by table.
    pub(crate) ids: Family<Labels, Counter>,
    /// Seconds a lookup took on the server, by table.
    pub(crate) seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Set at each scrape from what the server holds.
    pub(crate) held: Family<Labels, Gauge>,
    pub(crate) rows: Family<Labels, Gauge>,
    pub(crate) bytes: Family<Labels, Gauge>,
    pub(crate) disk: Family<Labels, Gauge>,
    pub(crate) disk_reads: Family<Labels, Gauge>,
    pub(crate) budget: Family<Labels, Gauge>,
    /// Failed evictions of budgeted shards, labelled with the last one's error.
    pub(crate) eviction_errors: Family<Labels, Gauge>,
    /// From the tables' control records, as a cluster member last read them.
    pub(crate) cluster_version: Family<Labels, Gauge>,
    pub(crate) roll: Family<Labels, Gauge>,
    pub(crate) roll_to: Family<Labels, Gauge>,
    pub(crate) roll_seconds: Family<Labels, Gauge>,
    /// The sync port side of the tables held, set at each scrape from their counters.
    pub(crate) sync_source: Family<Labels, Gauge>,
    /// Where each followed table stands, set at each scrape (see `Server::set_followed`).
    pub(crate) follow_lag: Family<Labels, FloatGauge>,
    pub(crate) follow_state: Family<Labels, Gauge>,
    pub(crate) follow_count: Family<Labels, Gauge>,
    /// Connections open on the framed path now (its cap counts them).
    pub(crate) framed_connections: Gauge,
    /// Framed connections the server closed for a limit, by reason.
    pub(crate) framed_closed: Family<Labels, Counter>,
    pub(crate) registry: Registry,
}

fn latency_histogram() -> Histogram {
    // 10 µs to ~0.3 s.
    Histogram::new(exponential_buckets(1e-5, 2.0, 16))
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut m = Self {
            lookups: Family::default(),
            ids: Family::default(),
            seconds: Family::new_with_constructor(latency_histogram),
            held: Family::default(),
            rows: Family::default(),
            bytes: Family::default(),
            disk: Family::default(),
            disk_reads: Family::default(),
            budget: Family::default(),
            eviction_errors: Family::default(),
            cluster_version: Family::default(),
            roll: Family::default(),
            roll_to: Family::default(),
            roll_seconds: Family::default(),
            sync_source: Family::default(),
            follow_lag: Family::default(),
            follow_state: Family::default(),
            follow_count: Family::default(),
            framed_connections: Gauge::default(),
            framed_closed: Family::default(),
            registry: Registry::with_prefix("embstore"),
        };
        let r = &mut m.registry;
        r.register("lookups", "Lookups by table and outcome", m.lookups.clone());
        r.register("lookup_ids", "Ids looked up, by table", m.ids.clone());
        r.register("lookup_seconds", "Server time of a lookup, by table", m.seconds.clone());
        r.register("versions_held", "Table versions held, by table and state", m.held.clone());
        r.register("rows_held", "Rows held, by table and version", m.rows.clone());
        r.register("bytes_in_memory", "Bytes of rows held in memory, by table", m.bytes.clone());
        r.register(
            "bytes_on_disk",
            "Bytes of segment files budgeted shards read from, by table",
            m.disk.clone(),
        );
        r.register(
            "disk_rows_read",
            "Rows the shards held now have read from disk, by table",
            m.disk_reads.clone(),
        );
        r.register(
            "memory_budget_bytes",
            "The memory budget of budgeted shards (kind=limit) and what they hold (kind=used)",
            m.budget.clone(),
        );
        r.register(
            "eviction_errors",
            "Evictions of budgeted shards that failed (a full disk), with the last one's error",
            m.eviction_errors.clone(),
        );
        r.register(
            "cluster_version",
            "The table version the cluster records in etcd, by table",
            m.cluster_version.clone(),
        );
        r.register(
            "roll",
            "The table's last roll: 1 for its state (running, done or failed) and step",
            m.roll.clone(),
        );
        r.register("roll_to_version", "The version the last roll moves to", m.roll_to.clone());
        r.register(
            "roll_seconds",
            "Seconds from the last roll's start to its last recorded step",
            m.roll_seconds.clone(),
        );
        r.register(
            "sync_source",
            "A held table's sync port side since this process started, by table and what \
             (pulls_cached, pulls_scanned, rows_sent, cached_rows, tombstones, d_prop_ms)",
            m.sync_source.clone(),
        );
        r.register(
            "sync_lag_seconds",
            "A followed table's freshness lag (now minus the newest applied row's write time) \
             over its recent replies, by table and quantile",
            m.follow_lag.clone(),
        );
        r.register(
            "sync_follow_state",
            "A followed table's state: 1 for connected, caught_up and congested (prioritised \
             pulls run), by table (and source)",
            m.follow_state.clone(),
        );
        r.register(
            "sync_follow",
            "A followed table since this process started, by table and what (parts_pending, \
             rows_applied, bytes_in, errors, congestions, prioritised_rows)",
            m.follow_count.clone(),
        );
        r.register(
            "framed_connections",
            "Connections open on the framed lookup path",
            m.framed_connections.clone(),
        );
        r.register(
            "framed_closed",
            "Framed connections the server closed for a limit, by reason (over_cap, \
             frame_too_large_before_hello, hello_deadline, frame_deadline, write_deadline)",
            m.framed_closed.clone(),
        );
        m
    }
}
