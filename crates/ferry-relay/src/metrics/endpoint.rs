//! The `/metrics` endpoint on hyper (HTTP/1.1), the `/healthz` and `/ready` probes beside it,
//! and the client that loadgen and the tests scrape it with.
//!
//! - `GET /healthz`: 200 `ok` while the relay's loops run (the sink watch ticks every second;
//!   no tick for [`LIVE_WITHIN`] means a blocked runtime), else 503 with the reason. A liveness
//!   probe: restarting the process is the cure for what it detects.
//! - `GET /ready`: 200 `ready` when the relay has started (its dispatch mode resolved), reached
//!   the database within [`DB_WITHIN`], and its sink is not stalled; else 503 with one line per
//!   failed condition. A relay that owns no slot because others own them all is waiting
//!   deliberately, and ready. Restarting does not cure what it detects: use it for a readiness
//!   gate (a rollout waits for it) and alerts, not to kill the process.
//!
//! A scrape is one small request; what the endpoint must not do is let a client that never
//! finishes its request (or sends garbage) hold it. So: the request head must arrive within
//! [`ServeConfig::header_read_timeout`] (hyper closes the connection otherwise), a whole
//! connection lives at most [`ServeConfig::connection_timeout`], at most
//! [`ServeConfig::max_connections`] are served at once (the rest wait in the listen backlog), a
//! request head is at most 16 KiB (hyper answers 431 past that) and there is no keep-alive.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::state::Metrics;

/// `/healthz` fails when the relay's loops have not ticked for this long.
pub const LIVE_WITHIN: Duration = Duration::from_secs(10);
/// `/ready` fails when no database operation has succeeded for this long (ownership heartbeats
/// and status counts succeed every few seconds while the database answers).
pub const DB_WITHIN: Duration = Duration::from_secs(30);

/// The request head's size limit: a scrape sends a few hundred bytes; hyper's smallest allowed
/// buffer is 8 KiB, and 16 KiB leaves room for long `User-Agent`s and proxies' headers.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Limits of the metrics endpoint. They bound what one client can hold, not the scrape itself
/// (rendering takes well under a millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeConfig {
    /// A connection whose request head has not arrived within this is closed (default 5 s:
    /// a scraper on the same network sends it at once; Prometheus' default scrape timeout is
    /// 10 s).
    pub header_read_timeout: Duration,
    /// A connection is closed after this however far it got, e.g. a client that sent its
    /// request but reads the answer a byte at a time (default 10 s).
    pub connection_timeout: Duration,
    /// Connections served at once; further ones wait in the listen backlog until one ends
    /// (default 64: each holds at most a 16 KiB head buffer and one rendered exposition).
    pub max_connections: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(10),
            max_connections: 64,
        }
    }
}

/// Serves `GET /metrics` (the Prometheus text format, 0.0.4) on `listener` until `cancel` fires;
/// other paths answer 404, other methods on `/metrics` 405. Connections still open when
/// `cancel` fires finish on their own (each within `connection_timeout`).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    config: ServeConfig,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let registry = Arc::new(metrics.registry());
    // at least one, or no connection would ever be served
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics endpoint listening");
    }
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (sock, peer) = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = listener.accept() => match r {
                Ok(a) => a,
                // per-connection errors (the peer reset before accept, EMFILE): keep serving
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (registry, metrics) = (registry.clone(), metrics.clone());
        let conn = http.serve_connection(
            TokioIo::new(sock),
            hyper::service::service_fn(move |req| {
                let (registry, metrics) = (registry.clone(), metrics.clone());
                async move { Ok::<_, Infallible>(respond(&req, &registry, &metrics)) }
            }),
        );
        let limit = config.connection_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(limit, conn).await {
                Ok(Ok(())) => {}
                // garbage, a head past the limit or its timeout: hyper already answered or closed
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection ended"),
                Err(_) => tracing::debug!(%peer, "metrics connection timed out"),
            }
        });
    }
}

/// The probes' verdicts at `now_us`: `Ok(())` or the failed conditions, one line each.
pub fn live(m: &Metrics, now_us: i64) -> Result<(), String> {
    let tick = m.loop_tick_us.load(std::sync::atomic::Ordering::Relaxed);
    if tick <= 0 {
        return Err("not started: the relay's loops have not run yet".into());
    }
    let quiet = Duration::from_micros((now_us - tick).max(0) as u64);
    if quiet >= LIVE_WITHIN {
        return Err(format!(
            "the relay's loops have not run for {}s (a blocked runtime)",
            quiet.as_secs()
        ));
    }
    Ok(())
}

/// `/ready`'s verdict at `now_us` (see the module docs).
pub fn ready(m: &Metrics, now_us: i64) -> Result<(), String> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut failed = Vec::new();
    if m.dispatch_resolved.load(Relaxed) == 0 {
        failed.push("starting: the dispatch mode is not resolved yet".to_string());
    }
    let db = m.db_ok_us.load(Relaxed);
    if db <= 0 {
        failed.push("the database has not answered yet".to_string());
    } else {
        let quiet = Duration::from_micros((now_us - db).max(0) as u64);
        if quiet >= DB_WITHIN {
            failed.push(format!(
                "no database operation has succeeded for {}s",
                quiet.as_secs()
            ));
        }
    }
    let limit = m.alerts.lock().expect("alerts lock").sink_stall;
    let unacked = m.sink_unacked(now_us);
    if unacked >= limit {
        failed.push(format!(
            "sink stalled: {} events have had no ack for {}s",
            m.sink_in_flight.load(Relaxed),
            unacked.as_secs()
        ));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

fn respond(
    req: &Request<Incoming>,
    registry: &Registry,
    metrics: &Metrics,
) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    let path = req.uri().path();
    if !matches!(path, "/metrics" | "/healthz" | "/ready") {
        return text(
            StatusCode::NOT_FOUND,
            "try GET /metrics, /healthz or /ready\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, format!("try GET {path}\n"));
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if path != "/metrics" {
        let now = ferry_core::now_micros();
        let (verdict, ok) = if path == "/healthz" {
            (live(metrics, now), "ok\n")
        } else {
            (ready(metrics, now), "ready\n")
        };
        return match verdict {
            Ok(()) => text(StatusCode::OK, ok.into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        };
    }
    let mut body = String::with_capacity(8192);
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut body, registry) {
        tracing::error!(error = %e, "metrics encoding failed");
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics encoding failed\n".into(),
        );
    }
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(prometheus_client::encoding::prometheus_text::CONTENT_TYPE),
    );
    r
}

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScrapeError {
    /// No answer within the time allowed.
    #[error("metrics endpoint {0} did not answer within {1:?}")]
    Timeout(SocketAddr, Duration),
    /// Connecting failed.
    #[error("cannot connect to metrics endpoint {0}: {1}")]
    Connect(SocketAddr, #[source] std::io::Error),
    /// The HTTP exchange failed.
    #[error("metrics endpoint {0}: {1}")]
    Http(SocketAddr, #[source] hyper::Error),
    /// An answer other than 200.
    #[error("metrics endpoint {0} answered {1}")]
    Status(SocketAddr, StatusCode),
    /// A body that is not UTF-8 text.
    #[error("metrics endpoint {0} sent a body that is not UTF-8")]
    NotText(SocketAddr),
}

/// `GET /metrics` from the endpoint at `addr`, the body as text; all of it within `timeout`.
/// One HTTP/1.1 exchange on its own connection (what the relay's endpoint serves).
pub async fn scrape(addr: SocketAddr, timeout: Duration) -> Result<String, ScrapeError> {
    match get(addr, "/metrics", timeout).await? {
        (StatusCode::OK, body) => Ok(body),
        (status, _) => Err(ScrapeError::Status(addr, status)),
    }
}

/// `GET path` from the endpoint at `addr`: the status and the body as text, within `timeout`
/// (a probe's answer, whatever its status).
pub async fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(StatusCode, String), ScrapeError> {
    tokio::time::timeout(timeout, get_once(addr, path))
        .await
        .map_err(|_| ScrapeError::Timeout(addr, timeout))?
}

async fn get_once(addr: SocketAddr, path: &str) -> Result<(StatusCode, String), ScrapeError> {
    let sock = TcpStream::connect(addr)
        .await
        .map_err(|e| ScrapeError::Connect(addr, e))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sock))
        .await
        .map_err(|e| ScrapeError::Http(addr, e))?;
    // drives the connection; ends when the exchange does (the endpoint closes it after answering)
    let driver = tokio::spawn(conn);
    let req = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("a static request is valid");
    let result = async {
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| ScrapeError::Http(addr, e))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ScrapeError::Http(addr, e))?
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::NotText(addr))?;
        Ok((status, text))
    }
    .await;
    driver.abort();
    result
}
