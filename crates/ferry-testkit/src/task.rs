//! A relay running on a task of its own, stopped through its cancellation token.
use std::future::Future;
use std::time::Duration;

use ferry_core::StoreError;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;

/// A run loop that ends when its token is cancelled (a `Relay::run`), spawned on the runtime.
/// Tests, the benches and loadgen start their in-process relays with it:
/// `RelayTask::spawn(|cancel| relay.run(cancel))`.
pub struct RelayTask {
    cancel: CancellationToken,
    handle: JoinHandle<Result<(), StoreError>>,
}

/// How a [`RelayTask`] ended.
pub type Joined = Result<Result<(), StoreError>, JoinError>;

impl RelayTask {
    /// Spawns `run(token)`.
    pub fn spawn<F>(run: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(run(cancel.clone()));
        Self { cancel, handle }
    }

    /// Asks it to stop (in-flight work finishes, claims are released).
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether it ended although nobody asked it to.
    pub fn stopped_unasked(&self) -> bool {
        self.handle.is_finished() && !self.cancel.is_cancelled()
    }

    /// Waits up to `timeout` for it to end (after [`Self::cancel`]); `None` if it did not.
    pub async fn join(self, timeout: Duration) -> Option<Joined> {
        tokio::time::timeout(timeout, self.handle).await.ok()
    }

    /// Cancels it and waits up to 30 s; panics unless it stopped cleanly.
    pub async fn stop(self) {
        self.cancel();
        self.join(Duration::from_secs(30))
            .await
            .expect("relay stops")
            .expect("relay task")
            .expect("relay run");
    }
}
