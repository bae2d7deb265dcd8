//! The send step: a batch's events to the sink in a task of its own, checked against the
//! worker's order net as they are handed over.
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_core::{ClaimedEvent, Outcome};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::context::Ctx;
use crate::order_watch::{self, OrderWatch};

/// A batch's send task. It stores its outcomes *before* it notifies the worker, so a worker
/// woken by the notification always finds them (`JoinHandle::is_finished` may still be false
/// for a moment after the task's last statement: waiting on it lost wake-ups).
pub(super) struct Send {
    pub(super) task: JoinHandle<()>,
    pub(super) outcomes: Arc<Mutex<Option<Vec<Outcome>>>>,
}

impl Send {
    /// The outcomes, waiting for the task if needed (a panicked send yields none: every item
    /// then counts as unknown).
    pub(super) async fn outcomes(self) -> Vec<Outcome> {
        let _ = self.task.await;
        self.outcomes
            .lock()
            .ok()
            .and_then(|mut o| o.take())
            .unwrap_or_default()
    }
}

/// Starts sending `to_send`; the task notifies `done` once its outcomes are stored.
pub(super) fn start_send(
    ctx: &Ctx,
    watch: &Arc<Mutex<OrderWatch>>,
    done: &Arc<Notify>,
    to_send: Vec<ClaimedEvent>,
) -> Send {
    let sink = ctx.sink.clone();
    let metrics = ctx.metrics.clone();
    let watch = watch.clone();
    let done = done.clone();
    let outcomes = Arc::new(Mutex::new(None));
    let slot = outcomes.clone();
    let task = tokio::spawn(async move {
        ferry_core::failpoint::hit("relay-after-claim");
        metrics.note_misrouted(&to_send);
        order_watch::check_send(&watch, &metrics, &to_send);
        let t = Instant::now();
        let out = sink.send_batch(&to_send).await;
        metrics.send_latency.record(t.elapsed());
        if let Ok(mut s) = slot.lock() {
            *s = Some(out);
        }
        done.notify_one();
    });
    Send { task, outcomes }
}
