//! Retry backoff: exponential with half jitter.
use std::time::Duration;

/// Exponential backoff with half jitter: attempt `n` (1-based) waits a uniform random time in
/// `[base·2^(n-1) / 2, base·2^(n-1)]`, capped at `max`. Half-jitter keeps a floor so a flapping
/// broker is not hammered, while still spreading a thundering herd of retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay of the first retry (default 200 ms: one broker round trip plus slack).
    pub base: Duration,
    /// Upper bound (default 60 s: keeps a failing aggregate's retry within the 5-minute alert).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// Delay before retry number `attempt` (1 = first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let ceiling = self.base.saturating_mul(1u32 << exp).min(self.max);
        let floor = ceiling / 2;
        let span = ceiling.saturating_sub(floor).as_micros() as u64;
        let jitter = if span == 0 {
            0
        } else {
            rand::random::<u64>() % (span + 1)
        };
        floor + Duration::from_micros(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = b.delay(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let d20 = b.delay(20);
            assert!(d20 >= Duration::from_millis(500) && d20 <= Duration::from_secs(1));
        }
    }
}
