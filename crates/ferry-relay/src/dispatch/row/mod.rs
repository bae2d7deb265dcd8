//! Row dispatch: per-row claims, one version of an aggregate per claim → send → outcome round
//! trip.
//!
//! Per worker ([`mod@worker`]): claim a batch (≤ B items, fenced by slot ownership: [`claim`]) →
//! send it to the sink and route each item's outcome ([`send`]) → apply the outcomes with the
//! store's batched compare-and-set ([`outcome`]). Up to `max_in_flight` batches per worker are
//! in flight at once (the next claim runs while a send is outstanding). This never reorders an
//! aggregate: the claim only returns events whose aggregate has no unfinished predecessor, so a
//! successor cannot even be claimed before its predecessor is SENT — whatever happens to the
//! predecessor's batch.
mod claim;
mod outcome;
mod send;
mod worker;

pub(crate) use worker::worker;
