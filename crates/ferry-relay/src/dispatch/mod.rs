//! The two dispatch modes, side by side. Both run one worker per shard over the slots the
//! process owns, send through the same sink and route outcomes with the same pure function
//! ([`crate::route`]); they differ in how a batch is taken and how its outcome is made durable.
//!
//! | step | [`row`] | [`cursor`] |
//! | --- | --- | --- |
//! | loop | `row/worker.rs` | `cursor/worker.rs` |
//! | take a batch | `row/claim.rs`: claim due rows (a row write each) | `cursor/read.rs`: read past the slot positions (no write), cut at busy aggregates |
//! | send | `row/send.rs` (lease renewed while outstanding) | `cursor/send.rs` |
//! | route | [`crate::route`], one version per aggregate | [`crate::route`], the hold rule on |
//! | make it durable | `row/outcome.rs`: a compare-and-set per row on its claim token | `cursor/advance.rs`: one fenced cursor compare-and-set per batch, exception rows for what was not acked |
//! | what was not acked | the row goes back to PENDING or QUARANTINED | `cursor/exceptions.rs`: the per-row protocol on exception rows |
//!
//! docs/architecture.md ("Data flow", "Dispatch modes") argues why neither loses or reorders.
pub(crate) mod cursor;
pub(crate) mod row;
