//! A process's `/metrics` endpoint from Python (`embstore.metrics.serve`): the server's own
//! endpoint ([`embstore_server::serve_metrics_with`]) over a Python callable that renders the
//! process's registered sources, so a training process is scraped as a server is, TLS and all.

use std::sync::Arc;

use embstore_server::MetricsText;
use embstore_table::{Error, ErrorKind};
use pyo3::prelude::*;

use crate::detached;
use crate::tls::serving_tls;
use crate::to_py_err;

/// A Python callable returning Prometheus' text format, called (with the GIL) at each scrape.
struct PySource(Py<PyAny>);

impl MetricsText for PySource {
    fn metrics_text(&self) -> String {
        Python::attach(|py| match self.0.call0(py).and_then(|v| v.extract::<String>(py)) {
            Ok(text) => text,
            Err(e) => format!("# embstore: the metrics source failed: {e}\n"),
        })
    }
}

/// `GET /metrics` on `listen` (`host:port`; port 0 picks one), answered with `source()`, over
/// TLS when a certificate and key are given (with a client CA: mutual TLS), until `stop()` or
/// the object is dropped.
#[pyclass(module = "embstore._native", name = "MetricsEndpoint")]
pub(crate) struct PyMetricsEndpoint {
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    address: String,
}

#[pymethods]
impl PyMetricsEndpoint {
    #[new]
    #[pyo3(signature = (listen, source, tls_cert=None, tls_key=None, tls_client_ca=None))]
    fn new(
        py: Python<'_>,
        listen: String,
        source: Py<PyAny>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        tls_client_ca: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        if !source.bind(py).is_callable() {
            return Err(to_py_err(Error::new(
                ErrorKind::InvalidArgument,
                "source must be a callable returning the metrics text",
            )));
        }
        let tls = serving_tls(tls_cert, tls_key, tls_client_ca)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("embstore-metrics")
            .enable_all()
            .build()
            .map_err(|e| to_py_err(Error::io("cannot start the metrics runtime", e)))?;
        let listener = detached(py, || runtime.block_on(tokio::net::TcpListener::bind(&listen)))
            .map_err(|e| {
                to_py_err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("cannot listen for metrics on {listen}: {e}"),
                ))
            })?;
        let address = listener
            .local_addr()
            .map_err(|e| to_py_err(Error::io("the metrics listener's address", e)))?
            .to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let source: Arc<dyn MetricsText> = Arc::new(PySource(source));
        runtime.spawn(embstore_server::serve_metrics_with(source, listener, tls, async move {
            let _ = stopped.await;
        }));
        Ok(Self { runtime: Some(runtime), stop: Some(stop), address })
    }

    /// `host:port` the endpoint listens on.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Stop listening (scrapes in progress finish); a no-op when stopped.
    fn stop(&mut self, py: Python<'_>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            // A scrape waiting for the GIL held here finishes once it is released.
            detached(py, || rt.shutdown_timeout(std::time::Duration::from_secs(5)));
        }
    }
}
