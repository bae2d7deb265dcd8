//! How deliveries are recorded: the gap policy and the version baseline.

/// What to do when v(n+1) of an aggregate arrives before v(n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// No per-aggregate tracking: only `(consumer, event_id)` dedupe. Cheapest (one insert);
    /// for unversioned messages or consumers that do not care about order.
    Off,
    /// Record the early event and return [`Verdict::Gap`](crate::Verdict::Gap) so the caller
    /// may apply it; the gap stays listed by `gaps()` until the missing versions arrive. The
    /// default: ferry delivers each aggregate in order, so a gap is an anomaly worth seeing but
    /// not worth stalling on.
    #[default]
    Report,
    /// Record nothing for the early event and return [`Verdict::Early`](crate::Verdict::Early):
    /// the caller skips the effect and has the message redelivered later (see the crate docs).
    HoldBack,
}

/// Where an aggregate's version sequence starts for a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Baseline {
    /// Versions start at 1 (ferry's outbox enforces it): a first delivery at v5 is a gap.
    #[default]
    FromOne,
    /// The first version this consumer sees of an aggregate starts its sequence: for
    /// consumers that attach to a stream mid-way (retention already dropped earlier versions).
    FirstSeen,
}

/// How [`record`](crate::postgres::record) treats versions. `Default`: `Report` from version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxConfig {
    /// Gap policy (default [`GapPolicy::Report`]).
    pub gap_policy: GapPolicy,
    /// Version baseline (default [`Baseline::FromOne`]).
    pub baseline: Baseline,
    /// Process replayed messages (`ferry replay`, header `ferry-replay`) again (default
    /// `false`: a replayed event is a [`Duplicate`](crate::Verdict::Duplicate) of its event id
    /// when this consumer recorded it before). When `true`, a delivery carrying a replay id is
    /// deduped by its event id within that replay ([`crate::Delivery::replay_key`]), without
    /// version tracking (a replay re-sends versions the mark already covers): each replay is
    /// applied once, and the aggregate's contiguous mark is left as it was.
    pub accept_replays: bool,
}

impl InboxConfig {
    /// A config with `gap_policy` and the default baseline.
    pub fn new(gap_policy: GapPolicy) -> Self {
        Self {
            gap_policy,
            baseline: Baseline::default(),
            accept_replays: false,
        }
    }

    /// The same config, processing replayed messages again ([`Self::accept_replays`]).
    pub fn with_accept_replays(mut self, accept: bool) -> Self {
        self.accept_replays = accept;
        self
    }

    /// The same config with `baseline`.
    pub fn with_baseline(mut self, baseline: Baseline) -> Self {
        self.baseline = baseline;
        self
    }
}
