//! Relay metrics: counters, gauges and hdrhistogram latency distributions, exposed in the
//! Prometheus text format (0.0.4) on `GET /metrics`. Names follow `ferry_<noun>_<unit>`.
//!
//! The exposition is encoded by `prometheus-client`, the Prometheus project's own Rust client,
//! and served by hyper ([`serve`]). Why `prometheus-client` and not `metrics` with its
//! Prometheus exporter: its [`Registry`](prometheus_client::registry::Registry) is a plain value with no process-global recorder, so
//! each [`Metrics`] has its own and several relays in one process (loadgen, the tests) never
//! mix their numbers; it encodes the 0.0.4 text format this endpoint has always served; and it
//! leaves the hot path alone: workers keep updating plain atomics and hdrhistograms (which
//! loadgen merges in process), and a [`Collector`](prometheus_client::collector::Collector) reads them once per scrape, which is also
//! where the derived values (ages in seconds, the SLO ratio, the alert level) are computed.
//! The `metrics` exporter would replace hdrhistogram with its own summaries and bring its own
//! HTTP server.
//!
//! Each latency distribution (and the batch size) is a Prometheus histogram with fixed buckets,
//! computed from its hdrhistogram at scrape time: buckets add up across relays and windows,
//! which quantile gauges cannot.
//!
//! `metrics/state.rs` holds what the workers count into ([`Metrics`], [`Latency`], the alert
//! rules), `metrics/exposition.rs` how it is encoded at scrape time (every family's name and
//! help), and `metrics/endpoint.rs` the HTTP server and its client.
mod endpoint;
mod exposition;
mod state;

pub use endpoint::{
    get, live, ready, scrape, serve, ScrapeError, ServeConfig, DB_WITHIN, LIVE_WITHIN,
};
pub use exposition::{sample, BATCH_BUCKETS, LATENCY_BUCKETS};
pub use state::{alert_level, AlertThresholds, Latency, Metrics};
