//! Cursor dispatch: reads past a per-slot cursor, several versions of an aggregate per batch,
//! one row write per event.
//!
//! Per worker ([`mod@worker`]): read committed intents of its slots past in-memory positions (no
//! write) → send the batch ([`send`]) → route each item's outcome → advance ([`advance`]) the
//! slots' durable cursors with one fenced compare-and-set, writing exception rows for items
//! that were not acked in the same transaction. Up to `max_in_flight` batches are in flight;
//! their advances run strictly in read order, one at a time, while the worker reads and sends
//! on. Ordering rules (docs/architecture.md, "Why several versions per batch cannot reorder"):
//! * an aggregate is busy from the read that takes it until its items in that batch are all
//!   acked, or, if one was not, until the batch's advance committed its exception rows; a read
//!   is cut, per slot, before the first event of a busy aggregate ([`read`]), so a later batch
//!   never sends a version whose predecessor may still fail;
//! * within a batch, the hold rule ([`crate::route`]) stops an aggregate at its first item that
//!   was not acked; the rest become held exceptions, resent after it;
//! * events whose aggregate has an open exception are not sent by the cursor path at all: they
//!   become held exceptions, sent by the exception path ([`exceptions`]) in version order;
//! * events of a paused topic ([`paused`]) are not sent either: they become held exceptions
//!   that the exception path leaves alone until the topic is resumed.
//!
//! A fenced or failed advance resets the worker: it waits for its other sends, forgets its
//! in-memory positions and reloads the durable cursors. Everything after them is read and sent
//! again (same event ids): duplicates the consumer's Inbox absorbs, never a loss.
//!
//! [`state`] is what a worker keeps in memory between its steps.
mod advance;
mod exceptions;
mod paused;
mod read;
mod send;
mod state;
mod worker;

pub(crate) use worker::worker;
