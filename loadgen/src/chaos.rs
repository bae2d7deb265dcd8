//! `--chaos`: SIGKILL a random relay process at intervals and start a replacement.
//!
//! A killed relay dies between any two instructions: mid-claim, after a broker ack but before
//! its SENT compare-and-set, holding slot leases. The replacement is a new owner; the dead
//! one's slots and claims are taken over when their leases expire, and anything it had sent but
//! not marked SENT is sent again with the same event id. The run must still end with zero lost
//! intents and zero ordering violations (duplicates are expected and reported).
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::relays::Processes;

/// Starts the chaos loop; it stops at `stop` and returns the number of kills.
pub fn start(
    procs: Arc<tokio::sync::Mutex<Processes>>,
    interval: Duration,
    stop: CancellationToken,
) -> JoinHandle<u64> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(interval) => {}
            }
            let mut p = procs.lock().await;
            if p.len() == 0 {
                continue;
            }
            let k = rand::thread_rng().gen_range(0..p.len());
            if let Err(e) = p.kill_and_restart(k).await {
                // The run's liveness check reports the missing relay; keep the chaos going.
                tracing::error!(relay = k, error = %e, "chaos: could not restart a killed relay");
            } else {
                tracing::info!(
                    relay = k,
                    kills = p.kills,
                    "chaos: killed and restarted a relay"
                );
            }
        }
        procs.lock().await.kills
    })
}
