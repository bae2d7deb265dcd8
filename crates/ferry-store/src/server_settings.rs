//! Server settings that are harmful to ferry ([`ferry_core::OutboxStore::server_warnings`]):
//! one statement per backend reads the values, a pure function per backend judges them. Only
//! harmful values are reported (a crash can lose committed intents, the outbox is never
//! vacuumed, cursor dispatch could reorder an aggregate); memory sizes are not.
//! docs/operations.md, "Server settings", has the table and the reasons.
use ferry_core::{DispatchMode, SettingWarning, StoreError};
use sqlx::{MySqlPool, PgPool};

use crate::error::db_err;

/// The PostgreSQL values [`pg_warnings`] judges, as this session sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgSettings {
    /// `autovacuum` (`on` / `off`).
    pub(crate) autovacuum: String,
    /// `track_counts`: autovacuum decides from these counts.
    pub(crate) track_counts: String,
    /// `fsync`.
    pub(crate) fsync: String,
    /// `full_page_writes`.
    pub(crate) full_page_writes: String,
    /// `ferry_outbox`'s `autovacuum_enabled` storage parameter; `None` when it is not set.
    pub(crate) outbox_autovacuum_enabled: Option<bool>,
    /// The outbox's identity sequence (schema-qualified).
    pub(crate) seq_name: String,
    /// Its `CACHE`.
    pub(crate) seq_cache: i64,
    /// The stored dispatch mode.
    pub(crate) mode: DispatchMode,
}

/// One statement, no parameters: the session's view of the server-wide settings (`SHOW`
/// values), the outbox's `autovacuum_enabled` (cast by PostgreSQL's own boolean rules, so
/// `off`, `false`, `0` all read as false) and its sequence's cache, and the stored mode.
const PG_SETTINGS: &str = "SELECT current_setting('autovacuum'), current_setting('track_counts'), \
       current_setting('fsync'), current_setting('full_page_writes'), \
       (SELECT o.option_value::bool FROM pg_class c CROSS JOIN LATERAL pg_options_to_table(c.reloptions) o \
         WHERE c.oid = 'ferry_outbox'::regclass AND o.option_name = 'autovacuum_enabled'), \
       pg_get_serial_sequence('ferry_outbox', 'seq'), \
       (SELECT s.seqcache FROM pg_sequence s \
         WHERE s.seqrelid = pg_get_serial_sequence('ferry_outbox', 'seq')::regclass), \
       (SELECT d.mode FROM ferry_dispatch d WHERE d.id = 1)";

type PgRow = (
    String,
    String,
    String,
    String,
    Option<bool>,
    String,
    i64,
    String,
);

/// Reads [`PgSettings`] in one round trip.
pub(crate) async fn read_pg(pool: &PgPool) -> Result<PgSettings, StoreError> {
    let r: PgRow = sqlx::query_as(PG_SETTINGS)
        .fetch_one(pool)
        .await
        .map_err(|e| db_err("server settings", e))?;
    Ok(PgSettings {
        autovacuum: r.0,
        track_counts: r.1,
        fsync: r.2,
        full_page_writes: r.3,
        outbox_autovacuum_enabled: r.4,
        seq_name: r.5,
        seq_cache: r.6,
        mode: r
            .7
            .parse()
            .map_err(|e: String| StoreError::new(ferry_core::StoreErrorKind::Other, e))?,
    })
}

const RELOAD: &str = "and reload the configuration (SELECT pg_reload_conf())";
const UNTIL_WRAPAROUND: &str =
    "(until transaction id wraparound forces a vacuum of the whole table)";

fn warning(setting: &str, value: impl Into<String>, message: String) -> SettingWarning {
    SettingWarning {
        setting: setting.to_string(),
        value: value.into(),
        message,
    }
}

/// The harmful PostgreSQL settings among `s`, each with one sentence saying why and the fix.
pub(crate) fn pg_warnings(s: &PgSettings) -> Vec<SettingWarning> {
    let mut w = Vec::new();
    if s.autovacuum == "off" {
        w.push(warning(
            "autovacuum",
            &s.autovacuum,
            format!(
                "autovacuum = off: nothing vacuums or analyzes ferry_outbox {UNTIL_WRAPAROUND}, so \
                 the dead row versions of claims and purges pile up and the planner's statistics \
                 go stale; set autovacuum = on {RELOAD}"
            ),
        ));
    }
    if s.track_counts == "off" {
        w.push(warning(
            "track_counts",
            &s.track_counts,
            format!(
                "track_counts = off: autovacuum cannot tell when ferry_outbox needs vacuuming or \
                 analyzing, so it never does {UNTIL_WRAPAROUND}; set track_counts = on {RELOAD}"
            ),
        ));
    }
    if s.outbox_autovacuum_enabled == Some(false) {
        w.push(warning(
            "ferry_outbox.autovacuum_enabled",
            "false",
            format!(
                "ferry_outbox has autovacuum_enabled = false: autovacuum skips it \
                 {UNTIL_WRAPAROUND}, so the dead row versions of claims and purges pile up and its \
                 statistics go stale; run ALTER TABLE ferry_outbox RESET (autovacuum_enabled)"
            ),
        ));
    }
    if s.fsync == "off" {
        w.push(warning(
            "fsync",
            &s.fsync,
            format!(
                "fsync = off: a power failure or operating-system crash can lose or corrupt \
                 committed transactions beyond repair, including intents a relay has already \
                 sent; set fsync = on {RELOAD}"
            ),
        ));
    }
    if s.full_page_writes == "off" {
        w.push(warning(
            "full_page_writes",
            &s.full_page_writes,
            format!(
                "full_page_writes = off: a power failure or operating-system crash in the middle \
                 of a page write can leave a torn page that WAL replay cannot repair, corrupting \
                 committed intents, possibly silently; set full_page_writes = on {RELOAD}"
            ),
        ));
    }
    if s.mode == DispatchMode::Cursor && s.seq_cache > 1 {
        let (name, n) = (&s.seq_name, s.seq_cache);
        w.push(warning(
            &format!("{name}.cache"),
            n.to_string(),
            format!(
                "the outbox sequence {name} has CACHE {n} in cursor dispatch: each session draws \
                 from a block of {n} values of its own, so an aggregate's later version can get \
                 a lower seq and be sent first (and relays refuse to start); run ALTER SEQUENCE \
                 {name} CACHE 1"
            ),
        ));
    }
    w
}

/// The MariaDB values [`mysql_warnings`] judges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MySettings {
    /// `innodb_flush_log_at_trx_commit` (global only).
    pub(crate) flush_log_at_trx_commit: i64,
}

/// Reads [`MySettings`] in one round trip.
pub(crate) async fn read_mysql(pool: &MySqlPool) -> Result<MySettings, StoreError> {
    let v: i64 =
        sqlx::query_scalar("SELECT CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS SIGNED)")
            .fetch_one(pool)
            .await
            .map_err(|e| db_err("server settings", e))?;
    Ok(MySettings {
        flush_log_at_trx_commit: v,
    })
}

/// The harmful MariaDB settings among `s`. `innodb_flush_log_at_trx_commit` 1 (the default)
/// and 3 flush the redo log at every commit; 0 and 2 flush it about once a second.
pub(crate) fn mysql_warnings(s: &MySettings) -> Vec<SettingWarning> {
    let v = s.flush_log_at_trx_commit;
    let crash = match v {
        0 => "a crash of the server",
        2 => "a power failure or operating-system crash",
        _ => return Vec::new(),
    };
    vec![warning(
        "innodb_flush_log_at_trx_commit",
        v.to_string(),
        format!(
            "innodb_flush_log_at_trx_commit = {v}: the redo log is flushed about once a second, \
             so {crash} can lose the last second of committed transactions, including intents a \
             relay has already sent; run SET GLOBAL innodb_flush_log_at_trx_commit = 1 and set it \
             in the server's configuration file"
        ),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy_pg() -> PgSettings {
        PgSettings {
            autovacuum: "on".into(),
            track_counts: "on".into(),
            fsync: "on".into(),
            full_page_writes: "on".into(),
            outbox_autovacuum_enabled: None,
            seq_name: "app.ferry_outbox_seq_seq".into(),
            seq_cache: 1,
            mode: DispatchMode::Cursor,
        }
    }

    fn settings(w: &[SettingWarning]) -> Vec<&str> {
        w.iter().map(|w| w.setting.as_str()).collect()
    }

    #[test]
    fn a_healthy_postgres_server_gets_no_warning() {
        assert_eq!(pg_warnings(&healthy_pg()), vec![]);
        // set explicitly to true is as good as unset
        let s = PgSettings {
            outbox_autovacuum_enabled: Some(true),
            ..healthy_pg()
        };
        assert_eq!(pg_warnings(&s), vec![]);
    }

    /// The server-wide settings cannot be flipped on a shared test server: their rules and
    /// wording are checked here, over values.
    #[test]
    fn each_harmful_postgres_setting_is_named_with_its_value_reason_and_fix() {
        let cases: [(PgSettings, &str, &[&str]); 6] = [
            (
                PgSettings {
                    autovacuum: "off".into(),
                    ..healthy_pg()
                },
                "autovacuum",
                &[
                    "autovacuum = off",
                    "dead row versions",
                    "autovacuum = on",
                    "pg_reload_conf",
                ],
            ),
            (
                PgSettings {
                    track_counts: "off".into(),
                    ..healthy_pg()
                },
                "track_counts",
                &[
                    "track_counts = off",
                    "autovacuum cannot tell",
                    "track_counts = on",
                ],
            ),
            (
                PgSettings {
                    outbox_autovacuum_enabled: Some(false),
                    ..healthy_pg()
                },
                "ferry_outbox.autovacuum_enabled",
                &[
                    "autovacuum_enabled = false",
                    "skips it",
                    "ALTER TABLE ferry_outbox RESET (autovacuum_enabled)",
                ],
            ),
            (
                PgSettings {
                    fsync: "off".into(),
                    ..healthy_pg()
                },
                "fsync",
                &["fsync = off", "lose or corrupt committed", "fsync = on"],
            ),
            (
                PgSettings {
                    full_page_writes: "off".into(),
                    ..healthy_pg()
                },
                "full_page_writes",
                &[
                    "full_page_writes = off",
                    "torn page",
                    "full_page_writes = on",
                ],
            ),
            (
                PgSettings {
                    seq_cache: 20,
                    ..healthy_pg()
                },
                "app.ferry_outbox_seq_seq.cache",
                &[
                    "app.ferry_outbox_seq_seq has CACHE 20",
                    "lower seq",
                    "ALTER SEQUENCE app.ferry_outbox_seq_seq CACHE 1",
                ],
            ),
        ];
        for (s, setting, needles) in cases {
            let w = pg_warnings(&s);
            assert_eq!(settings(&w), vec![setting], "{w:?}");
            for n in needles {
                assert!(w[0].message.contains(n), "{n:?} not in {:?}", w[0].message);
            }
            // one sentence
            assert!(!w[0].message.contains(". "), "{:?}", w[0].message);
        }
    }

    #[test]
    fn a_cached_sequence_is_harmful_only_in_cursor_dispatch() {
        let s = PgSettings {
            seq_cache: 20,
            mode: DispatchMode::Row,
            ..healthy_pg()
        };
        assert_eq!(pg_warnings(&s), vec![]);
    }

    #[test]
    fn several_harmful_postgres_settings_are_all_reported() {
        let s = PgSettings {
            autovacuum: "off".into(),
            fsync: "off".into(),
            outbox_autovacuum_enabled: Some(false),
            ..healthy_pg()
        };
        assert_eq!(
            settings(&pg_warnings(&s)),
            vec!["autovacuum", "ferry_outbox.autovacuum_enabled", "fsync"]
        );
    }

    #[test]
    fn innodb_flush_log_at_trx_commit_is_harmful_at_0_and_2_only() {
        for v in [1, 3] {
            let w = mysql_warnings(&MySettings {
                flush_log_at_trx_commit: v,
            });
            assert_eq!(w, vec![], "{v}");
        }
        for (v, crash) in [(0, "a crash of the server"), (2, "operating-system crash")] {
            let w = mysql_warnings(&MySettings {
                flush_log_at_trx_commit: v,
            });
            assert_eq!(settings(&w), vec!["innodb_flush_log_at_trx_commit"]);
            assert_eq!(w[0].value, v.to_string());
            for n in [
                &format!("innodb_flush_log_at_trx_commit = {v}:") as &str,
                crash,
                "SET GLOBAL innodb_flush_log_at_trx_commit = 1",
            ] {
                assert!(w[0].message.contains(n), "{n:?} not in {:?}", w[0].message);
            }
        }
    }
}
