//! Waiting on a condition instead of sleeping a fixed time.
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`wait_until`] re-checks its condition: often enough that a test does not wait
/// noticeably longer than the condition takes, rarely enough not to load the database.
const EVERY: Duration = Duration::from_millis(20);

/// Polls `cond` every `every` until it holds (`true`) or `timeout` passes (`false`).
pub async fn poll_until<F, Fut>(timeout: Duration, every: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `cond` every 20 ms until it holds; panics with "timed out after {timeout:?} waiting for
/// {what}" after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(what, timeout, EVERY, cond).await
}

/// [`wait_until`] polling every `every` (a server view that refreshes slowly, such as InnoDB's
/// `INNODB_TRX` cache, needs a slower poll).
pub async fn wait_until_every<F, Fut>(what: &str, timeout: Duration, every: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        poll_until(timeout, every, cond).await,
        "timed out after {timeout:?} waiting for {what}"
    );
}
