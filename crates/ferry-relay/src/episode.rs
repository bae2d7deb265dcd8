//! Retrying a step until it passes: which store errors can pass on their own
//! ([`is_transient`]) and how a run of failures is logged and paced ([`Episode`]).
use std::time::{Duration, Instant};

use ferry_core::StoreError;

/// Whether a store error can pass on its own (a lost or refused connection, a full disk, a
/// deadlock, a failover): everything but a bad schema, a bad argument and a taken owner id,
/// which no retry cures.
pub fn is_transient(e: &StoreError) -> bool {
    use ferry_core::StoreErrorKind as K;
    matches!(e.kind(), K::Unavailable | K::Conflict | K::Other)
}

/// A run of failures of one step that is retried until it passes: logged at WARN when it
/// begins and then at most once a minute, at INFO when it ends; the wait before each retry
/// doubles from 250 ms to 10 s.
pub struct Episode {
    what: &'static str,
    began: Option<(Instant, Instant, u32)>,
}

impl Episode {
    /// No failure yet of the step `what` (named in the log lines).
    pub fn new(what: &'static str) -> Self {
        Self { what, began: None }
    }

    /// Notes a failure; the wait before the next attempt.
    pub fn failed(&mut self, e: &StoreError) -> Duration {
        let now = Instant::now();
        let n = match &mut self.began {
            None => {
                self.began = Some((now, now, 1));
                tracing::warn!(error = %e, "{} failed; retrying until it passes (logged again every minute)", self.what);
                1
            }
            Some((since, last, n)) => {
                *n += 1;
                if now.duration_since(*last) >= Duration::from_secs(60) {
                    *last = now;
                    tracing::warn!(error = %e, attempts = *n, failing_secs = since.elapsed().as_secs(), "{} still failing", self.what);
                }
                *n
            }
        };
        (Duration::from_millis(250) * 2u32.saturating_pow(n.min(6) - 1))
            .min(Duration::from_secs(10))
    }

    /// Notes a success: the end of an episode, if one was running.
    pub fn ended(&mut self) {
        if let Some((since, _, n)) = self.began.take() {
            tracing::info!(
                attempts = n,
                after_secs = since.elapsed().as_secs(),
                "{} succeeds again",
                self.what
            );
        }
    }
}
