//! What recording a delivery decided.

/// The outcome of recording one delivery. Deliberately exhaustive: a new kind of verdict
/// must make every caller's `match` decide what to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// First delivery to this consumer (in order, when gaps are tracked): recorded. Apply the
    /// effect in the same transaction and commit.
    New,
    /// Already recorded for this consumer by a committed transaction: skip the effect.
    Duplicate,
    /// [`GapPolicy::Report`](crate::GapPolicy::Report): recorded although versions
    /// `expected..got` are missing. The caller may apply the effect; the aggregate is listed by
    /// `gaps()` until they arrive.
    Gap {
        /// The version that should have come next (highest contiguous + 1).
        expected: i64,
        /// The version that came.
        got: i64,
    },
    /// [`GapPolicy::HoldBack`](crate::GapPolicy::HoldBack): arrived before its predecessor.
    /// Nothing recorded: skip the effect and have the message redelivered later.
    Early {
        /// The version that should come next.
        expected: i64,
        /// The version that came.
        got: i64,
    },
    /// Gap tracking on, and this new event id carries a version already covered for this
    /// consumer: at or below the contiguous mark (applied, or skipped by `accept_gap`), or
    /// recorded ahead of a gap under another event id. Nothing recorded; skip the effect.
    Stale {
        /// The highest version applied contiguously for the aggregate.
        applied_through: i64,
    },
}

impl Verdict {
    /// True when the caller applies the effect: [`Verdict::New`] and [`Verdict::Gap`].
    pub fn should_apply(&self) -> bool {
        matches!(self, Verdict::New | Verdict::Gap { .. })
    }

    /// A short lowercase name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::New => "new",
            Verdict::Duplicate => "duplicate",
            Verdict::Gap { .. } => "gap",
            Verdict::Early { .. } => "early",
            Verdict::Stale { .. } => "stale",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_and_gap_apply() {
        assert!(Verdict::New.should_apply());
        assert!(Verdict::Gap {
            expected: 2,
            got: 3
        }
        .should_apply());
        assert!(!Verdict::Duplicate.should_apply());
        assert!(!Verdict::Early {
            expected: 2,
            got: 3
        }
        .should_apply());
        assert!(!Verdict::Stale { applied_through: 4 }.should_apply());
    }
}
