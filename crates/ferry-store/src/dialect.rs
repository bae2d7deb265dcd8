//! The SQL dialects of the three backends, for the statements written once for all of them
//! (the operator's purge, reconcile, requeue and skip): placeholders (`?` in bind order,
//! rewritten once to PostgreSQL's `$n` by [`numbered_placeholders`]), clocks, concatenation.

/// `sql` with each `?` replaced by `$1`, `$2`, … in order (PostgreSQL's placeholders): one
/// statement text for every backend. Every `?` counts, one inside a string literal too: keep
/// literals free of it.
pub fn numbered_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Pg,
    My,
    Lite,
}

impl Dialect {
    /// The backend's name ([`ferry_core::OutboxStore::backend`]).
    pub(crate) fn name(self) -> &'static str {
        ["postgres", "mysql", "sqlite"][self as usize]
    }

    /// "now" in a timestamp column, and the value to bind for it where the backend binds the
    /// process clock (SQLite stores µs).
    pub(crate) fn now_at(self) -> (&'static str, Option<i64>) {
        match self {
            Dialect::Pg => ("now()", None),
            Dialect::My => ("UTC_TIMESTAMP(6)", None),
            Dialect::Lite => ("?", Some(ferry_core::now_micros())),
        }
    }

    /// The locking clause of a read whose row a concurrent writer must wait for (SQLite: the
    /// transaction's write lock does).
    pub(crate) fn for_update(self) -> &'static str {
        if self == Dialect::Lite {
            ""
        } else {
            " FOR UPDATE"
        }
    }

    /// An expression for "now minus `?` µs" in the column's own representation.
    pub(crate) fn now_minus_param(self) -> &'static str {
        match self {
            Dialect::Pg => "(now() - ?::int8 * interval '1 microsecond')",
            Dialect::My => "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)",
            Dialect::Lite => "(? )", // the caller binds now - age (process clock)
        }
    }
    /// A timestamp column as µs since the epoch.
    pub(crate) fn micros(self, col: &str) -> String {
        match self {
            Dialect::Pg => format!("(extract(epoch from {col}) * 1000000)::int8"),
            Dialect::My => format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {col})"),
            Dialect::Lite => col.to_string(),
        }
    }
    /// "now" as µs since the epoch.
    pub(crate) fn now_micros(self) -> &'static str {
        match self {
            Dialect::Pg => "(extract(epoch from now()) * 1000000)::int8",
            Dialect::My => "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
            Dialect::Lite => "?",
        }
    }
    /// The statement that raises a topic's watermark (binds: topic, created_at µs, now µs); never
    /// lowers it, so concurrent purges leave the newest.
    pub(crate) fn retention_mark_upsert(self) -> &'static str {
        match self {
            Dialect::Pg => {
                "INSERT INTO ferry_retention_mark (topic, purged_created_at, purged_at) VALUES (?, ?, ?) \
                 ON CONFLICT (topic) DO UPDATE SET \
                 purged_created_at = GREATEST(ferry_retention_mark.purged_created_at, EXCLUDED.purged_created_at), \
                 purged_at = EXCLUDED.purged_at"
            }
            Dialect::My => {
                "INSERT INTO ferry_retention_mark (topic, purged_created_at, purged_at) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE purged_created_at = GREATEST(purged_created_at, VALUES(purged_created_at)), \
                 purged_at = VALUES(purged_at)"
            }
            Dialect::Lite => {
                "INSERT INTO ferry_retention_mark (topic, purged_created_at, purged_at) VALUES (?, ?, ?) \
                 ON CONFLICT (topic) DO UPDATE SET \
                 purged_created_at = MAX(purged_created_at, excluded.purged_created_at), \
                 purged_at = excluded.purged_at"
            }
        }
    }
    pub(crate) fn concat_param_id(self, col: &str) -> String {
        match self {
            Dialect::Pg => format!("(?::text || CAST({col} AS TEXT))"),
            Dialect::My => format!("CONCAT(?, {col})"),
            Dialect::Lite => format!("(? || CAST({col} AS TEXT))"),
        }
    }
}
