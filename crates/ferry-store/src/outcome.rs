//! Fenced outcomes as data, shared by the SQL backends.
//!
//! Every state transition after a claim (ack, retry, quarantine, release, lease extension) is one
//! compare-and-set on the claim token, on `ferry_outbox` (row dispatch) or
//! `ferry_outbox_exception` (cursor dispatch's exception rows). What differs between backends is
//! only how the batch reaches the database (JSON array, `UNNEST` arrays, a statement per item) and
//! the dialect of the SET clause (the clock, placeholders); those stay in each backend. What is
//! the same everywhere — which tokens and per-item values a transition carries, and the order a
//! settle applies its four categories in — is written once here as an [`Outcome`].
use std::borrow::Cow;

use ferry_core::{ClaimToken, ExceptionOutcomes, LeaseExtension, RetryItem};

use crate::time::micros;

/// The transition an [`Outcome`] applies to the rows still `CLAIMED` under their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// `CLAIMED → SENT`.
    Ack,
    /// `CLAIMED → PENDING`, due after the item's delay, `attempts + 1`, `last_error` its text.
    Retry,
    /// `CLAIMED → QUARANTINED`, `attempts + 1`, `last_error` its text.
    Quarantine,
    /// `CLAIMED → PENDING`, due now.
    Release,
    /// The lease moves to now + `lease_us`.
    Extend {
        /// The new lease, µs from now (every item's delay too).
        lease_us: i64,
    },
}

/// One batch of one [`Transition`] (the parameters of a fenced outcome update): the tokens, and
/// per token the delay (µs) and text its SET clause reads. `items` is empty for `Ack` and
/// `Release`; a quarantine's delay is 0, an extension's text is empty.
#[derive(Debug, Clone)]
pub(crate) struct Outcome<'a> {
    pub(crate) to: Transition,
    pub(crate) tokens: Cow<'a, [ClaimToken]>,
    pub(crate) items: Vec<(i64, &'a str)>,
}

impl<'a> Outcome<'a> {
    /// `CLAIMED → SENT`.
    pub(crate) fn ack(tokens: &'a [ClaimToken]) -> Self {
        Self::plain(Transition::Ack, tokens)
    }

    /// `CLAIMED → PENDING` now.
    pub(crate) fn release(tokens: &'a [ClaimToken]) -> Self {
        Self::plain(Transition::Release, tokens)
    }

    fn plain(to: Transition, tokens: &'a [ClaimToken]) -> Self {
        Self {
            to,
            tokens: Cow::Borrowed(tokens),
            items: Vec::new(),
        }
    }

    /// `CLAIMED → PENDING` after each item's delay, with its error.
    pub(crate) fn retry(items: &'a [RetryItem]) -> Self {
        Self {
            to: Transition::Retry,
            tokens: items.iter().map(|i| i.token.clone()).collect(),
            items: items
                .iter()
                .map(|i| (micros(i.delay), i.error.as_str()))
                .collect(),
        }
    }

    /// `CLAIMED → QUARANTINED` with each item's reason.
    pub(crate) fn quarantine(items: &'a [(ClaimToken, String)]) -> Self {
        Self {
            to: Transition::Quarantine,
            tokens: items.iter().map(|i| i.0.clone()).collect(),
            items: items.iter().map(|i| (0, i.1.as_str())).collect(),
        }
    }

    /// The lease of `req.tokens` to now + `req.lease`.
    pub(crate) fn extend(req: &LeaseExtension<'a>) -> Self {
        let lease_us = micros(req.lease);
        Self {
            to: Transition::Extend { lease_us },
            tokens: Cow::Borrowed(req.tokens),
            items: vec![(lease_us, ""); req.tokens.len()],
        }
    }

    /// The four categories of a settle of exception rows, in the order every backend applies
    /// them: acked, retry, quarantine, release.
    pub(crate) fn settling(out: &'a ExceptionOutcomes) -> [Self; 4] {
        [
            Self::ack(&out.acked),
            Self::retry(&out.retry),
            Self::quarantine(&out.quarantine),
            Self::release(&out.release),
        ]
    }

    /// The per-item delays, in token order.
    pub(crate) fn delays(&self) -> Vec<i64> {
        self.items.iter().map(|i| i.0).collect()
    }

    /// The per-item texts, in token order.
    pub(crate) fn texts(&self) -> Vec<&'a str> {
        self.items.iter().map(|i| i.1).collect()
    }
}

/// The five fenced-outcome methods of [`ferry_core::RowDispatch`] (ack, retry, quarantine,
/// release, extend_lease), for an `impl RowDispatch` block of a store with an inherent
/// `async fn cas(&self, Outcome<'_>) -> Result<CasReport, StoreError>` on `ferry_outbox`: each
/// method hands its [`Outcome`] to it. A macro, not a blanket impl over a "has cas" trait:
/// `RowDispatch` belongs to ferry-core, and the orphan rule forbids `impl<S: …> RowDispatch for
/// S` here.
macro_rules! row_outcomes {
    () => {
        fn ack<'a>(
            &'a self,
            tokens: &'a [ferry_core::ClaimToken],
        ) -> ferry_core::BoxFuture<'a, Result<ferry_core::CasReport, ferry_core::StoreError>> {
            Box::pin(self.cas($crate::outcome::Outcome::ack(tokens)))
        }

        fn retry<'a>(
            &'a self,
            items: &'a [ferry_core::RetryItem],
        ) -> ferry_core::BoxFuture<'a, Result<ferry_core::CasReport, ferry_core::StoreError>> {
            Box::pin(self.cas($crate::outcome::Outcome::retry(items)))
        }

        fn quarantine<'a>(
            &'a self,
            items: &'a [(ferry_core::ClaimToken, String)],
        ) -> ferry_core::BoxFuture<'a, Result<ferry_core::CasReport, ferry_core::StoreError>> {
            Box::pin(self.cas($crate::outcome::Outcome::quarantine(items)))
        }

        fn release<'a>(
            &'a self,
            tokens: &'a [ferry_core::ClaimToken],
        ) -> ferry_core::BoxFuture<'a, Result<ferry_core::CasReport, ferry_core::StoreError>> {
            Box::pin(self.cas($crate::outcome::Outcome::release(tokens)))
        }

        fn extend_lease<'a>(
            &'a self,
            req: &'a ferry_core::LeaseExtension<'a>,
        ) -> ferry_core::BoxFuture<'a, Result<ferry_core::CasReport, ferry_core::StoreError>> {
            Box::pin(self.cas($crate::outcome::Outcome::extend(req)))
        }
    };
}
pub(crate) use row_outcomes;
