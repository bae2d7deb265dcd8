//! The `/metrics` endpoint: it answers a scrape, 404 elsewhere, and neither a slow client (a
//! request head trickled a byte at a time, never finished) nor a garbage one (random bytes, a
//! huge header) keeps it from answering the next scrape; those connections are closed.
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferry_relay::metrics::{get, sample, scrape, serve, ServeConfig};
use ferry_relay::Metrics;
use rand::{RngCore, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a scrape that must answer may take: generous for 2 shared cores (an answer takes
/// milliseconds), and far below "never", which is what a blocked endpoint gives.
const PROMPT: Duration = Duration::from_secs(5);

struct Endpoint {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn start(config: ServeConfig) -> Endpoint {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::default());
    let cancel = CancellationToken::new();
    tokio::spawn(serve(listener, metrics.clone(), config, cancel.clone()));
    Endpoint {
        addr,
        metrics,
        cancel,
    }
}

/// Sends `request` (ignoring a write the server cut short by closing) and reads until the
/// server closes: what came back, empty for a plain close or a reset. Panics if the server
/// keeps the connection open past `within`.
async fn exchange(addr: SocketAddr, request: Vec<u8>, within: Duration) -> String {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let _ = sock.write_all(&request).await;
    read_until_closed(&mut sock, within).await
}

/// `exchange` of a bodiless HTTP/1.1 request `method_and_path` (e.g. `GET /metrics`), answered
/// within [`PROMPT`].
async fn request(addr: SocketAddr, method_and_path: &str) -> String {
    let request = format!("{method_and_path} HTTP/1.1\r\nHost: x\r\n\r\n");
    exchange(addr, request.into_bytes(), PROMPT).await
}

async fn read_until_closed(sock: &mut TcpStream, within: Duration) -> String {
    let mut buf = Vec::new();
    match tokio::time::timeout(within, sock.read_to_end(&mut buf)).await {
        Ok(_) => String::from_utf8_lossy(&buf).into_owned(),
        Err(_) => panic!(
            "the endpoint kept the connection open for {within:?}; got so far: {:?}",
            String::from_utf8_lossy(&buf)
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_and_answers_404_elsewhere() {
    let ep = start(ServeConfig::default()).await;
    ep.metrics.sent.store(7, Ordering::Relaxed);
    ep.metrics.order_regressions.store(2, Ordering::Relaxed);
    let text = scrape(ep.addr, PROMPT).await.unwrap();
    assert_eq!(sample(&text, "ferry_sent_total"), Some(7.0));
    assert_eq!(sample(&text, "ferry_alert_level"), Some(0.0));
    // the order net's counter, as a counter
    assert_eq!(sample(&text, "ferry_order_regressions_total"), Some(2.0));
    assert!(
        text.contains("# TYPE ferry_order_regressions_total counter"),
        "{text}"
    );

    let head = request(ep.addr, "GET /metrics").await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    let other = request(ep.addr, "GET /health").await;
    assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
    let post = request(ep.addr, "POST /metrics").await;
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
}

/// A responder that serves one connection at a time, or has no head timeout, fails this: the
/// trickling client would hold it, the scrape would not answer within [`PROMPT`] and the
/// trickling connection would never be closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_garbage_client_does_not_hold_the_endpoint() {
    let header_read_timeout = Duration::from_secs(1);
    let ep = start(ServeConfig {
        header_read_timeout,
        ..ServeConfig::default()
    })
    .await;
    ep.metrics.sent.store(3, Ordering::Relaxed);

    // slow: the request line a byte every 50 ms, the head never finished
    let mut slow = TcpStream::connect(ep.addr).await.unwrap();
    slow.write_all(b"G").await.unwrap();
    let trickle = {
        let (mut rd, mut wr) = slow.into_split();
        let writer = tokio::spawn(async move {
            for b in b"ET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "
                .iter()
                .cycle()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if wr.write_all(&[*b]).await.is_err() {
                    return; // closed by the endpoint
                }
            }
        });
        let reader = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = rd.read_to_end(&mut buf).await;
            String::from_utf8_lossy(&buf).into_owned()
        });
        (writer, reader)
    };

    // garbage: random bytes, then a head end so a lenient parser cannot wait for more
    let mut junk = vec![0u8; 4096];
    rand::rngs::StdRng::seed_from_u64(11).fill_bytes(&mut junk);
    junk.extend_from_slice(b"\r\n\r\n");
    let garbage = tokio::spawn(exchange(ep.addr, junk, PROMPT));
    // a huge header: 1 MiB in one header line (the endpoint takes 16 KiB of head)
    let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Huge: ".to_vec();
    huge.resize(huge.len() + (1 << 20), b'a');
    huge.extend_from_slice(b"\r\n\r\n");
    let huge = tokio::spawn(exchange(ep.addr, huge, PROMPT));

    // while those are open (the trickle goes on for a second), a scrape answers
    let text = scrape(ep.addr, PROMPT)
        .await
        .expect("a scrape answers next to a slow and a garbage client");
    assert_eq!(sample(&text, "ferry_sent_total"), Some(3.0));

    // the garbage connections are answered with hyper's error status (or closed, if the reset
    // of a connection it stopped reading from wins), never a 200
    for (what, answer, status) in [
        ("garbage", garbage.await.unwrap(), "HTTP/1.1 400 "),
        ("huge header", huge.await.unwrap(), "HTTP/1.1 431 "),
    ] {
        assert!(
            answer.is_empty() || answer.starts_with(status),
            "{what}: {answer:?}"
        );
    }
    // the trickling client is cut off at the head timeout (hyper closes without an answer)
    let (writer, reader) = trickle;
    let answer = tokio::time::timeout(header_read_timeout + PROMPT, reader)
        .await
        .expect("the slow client's connection was closed")
        .unwrap();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "slow: {answer:?}"
    );
    writer.abort();
}

/// Many slow clients take every connection slot; a scrape then waits for the head timeout to
/// free one (it is queued in the listen backlog, not refused), and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_waits_for_a_free_slot_and_answers() {
    let ep = start(ServeConfig {
        header_read_timeout: Duration::from_millis(500),
        max_connections: 2,
        ..ServeConfig::default()
    })
    .await;
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(ep.addr).await.unwrap();
        s.write_all(b"GET /met").await.unwrap();
        holders.push(s);
    }
    let asked = std::time::Instant::now();
    let text = scrape(ep.addr, PROMPT)
        .await
        .expect("a scrape answers once a slot frees");
    assert!(sample(&text, "ferry_alert_level").is_some());
    // the holders' head timeout (500 ms from their connect) had to free a slot first
    assert!(
        asked.elapsed() >= Duration::from_millis(300),
        "answered after {:?}: the connection limit did not hold the scrape back",
        asked.elapsed()
    );
    for mut s in holders {
        read_until_closed(&mut s, PROMPT).await;
    }
}

/// `/healthz` answers 200 while the relay's loops tick and 503 once they stop; `/ready` answers
/// 503 until the relay has started and reached the database, 200 then, and 503 again (naming
/// each cause) when the database has not answered for 30 s or the sink has stalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_follow_the_relay_state() {
    use hyper::StatusCode;
    let ep = start(ServeConfig::default()).await;
    let m = &ep.metrics;
    let probe = |path: &'static str| async move { get(ep.addr, path, PROMPT).await.unwrap() };
    let (s, body) = probe("/healthz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (s, body) = probe("/ready").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("starting") && body.contains("database"),
        "{body}"
    );
    let now = ferry_core::now_micros();
    m.loop_tick_us.store(now, Ordering::Relaxed);
    m.dispatch_resolved.store(1, Ordering::Relaxed);
    m.db_ok_us.store(now, Ordering::Relaxed);
    assert_eq!(probe("/healthz").await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(probe("/ready").await, (StatusCode::OK, "ready\n".into()));
    // the loops stopped ticking 11 s ago: not alive
    m.loop_tick_us.store(now - 11_000_000, Ordering::Relaxed);
    let (s, body) = probe("/healthz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("have not run for 11s"), "{body}");
    // the database quiet for 31 s and the sink stalled for 40 s: both named
    m.db_ok_us.store(now - 31_000_000, Ordering::Relaxed);
    m.sink_in_flight.store(5, Ordering::Relaxed);
    m.sink_busy_since_us
        .store(now - 40_000_000, Ordering::Relaxed);
    let (s, body) = probe("/ready").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("no database operation has succeeded for 31s"),
        "{body}"
    );
    assert!(
        body.contains("sink stalled: 5 events have had no ack for 40s"),
        "{body}"
    );
    let post = request(ep.addr, "POST /ready").await;
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
}
