//! The database's cost of the run: row writes per event (PostgreSQL table statistics, SQLite's
//! estimate), dead tuples and sizes.
use std::time::Duration;

use ferry_inbox::InboxPool as Pool;
use ferry_store::Backend;
use serde::Serialize;
use sqlx::{Connection, Executor};

use super::database::Database;
use crate::error::{Error, Result};

/// The tables whose row writes are counted per event (`ferry_outbox_exception` holds per-row
/// state in cursor mode; cursors live in `ferry_slot_lease`).
pub const COST_TABLES: [&str; 3] = ["ferry_outbox", "ferry_outbox_exception", "ferry_slot_lease"];

/// `pg_stat_user_tables` counters of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableStats {
    /// Table name (in the run's schema).
    pub table: String,
    pub n_tup_ins: i64,
    /// Rows updated (HOT included).
    pub n_tup_upd: i64,
    pub n_tup_del: i64,
    /// Heap-only updates (no index maintenance).
    pub n_tup_hot_upd: i64,
    pub n_dead_tup: i64,
}

impl TableStats {
    /// The counters written since `before` (dead tuples: now).
    pub fn since(&self, before: TableStats) -> TableStats {
        TableStats {
            table: self.table.clone(),
            n_tup_ins: self.n_tup_ins - before.n_tup_ins,
            n_tup_upd: self.n_tup_upd - before.n_tup_upd,
            n_tup_del: self.n_tup_del - before.n_tup_del,
            n_tup_hot_upd: self.n_tup_hot_upd - before.n_tup_hot_upd,
            n_dead_tup: self.n_dead_tup,
        }
    }
}

/// What SQLite can tell cheaply about the writes of a run (it keeps no per-table counters).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SqliteWrites {
    /// Outbox rows: one INSERT each (over a run: the rows added, plus those purged).
    pub outbox_rows: i64,
    /// Row mode: sum of `claim_version` over the outbox = claim UPDATEs (of the rows still
    /// there: purged rows' claims went with them).
    pub outbox_claims: i64,
    /// Rows of `ferry_outbox_exception` (cursor mode's per-row state).
    pub exception_rows: i64,
    /// Sum of their `claim_version` (claim UPDATEs of exception rows).
    pub exception_claims: i64,
    /// Sum of `ferry_slot_lease.cursor_version`: cursor advances (one UPDATE per slot moved).
    pub cursor_versions: i64,
    /// Rows `--retention` purged over the run (one DELETE each; set by the run, 0 in a
    /// snapshot).
    pub purged_rows: i64,
}

impl SqliteWrites {
    /// The writes since `before`.
    pub fn since(&self, before: &SqliteWrites) -> SqliteWrites {
        SqliteWrites {
            outbox_rows: self.outbox_rows - before.outbox_rows,
            outbox_claims: self.outbox_claims - before.outbox_claims,
            exception_rows: self.exception_rows - before.exception_rows,
            exception_claims: self.exception_claims - before.exception_claims,
            cursor_versions: self.cursor_versions - before.cursor_versions,
            purged_rows: self.purged_rows - before.purged_rows,
        }
    }
}

/// PostgreSQL table statistics and sizes of the outbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PgCosts {
    /// `pg_total_relation_size('ferry_outbox')` (heap + indexes + TOAST), bytes.
    pub outbox_total_bytes: i64,
    pub outbox_table_bytes: i64,
    /// `pg_indexes_size('ferry_outbox')`, bytes.
    pub outbox_index_bytes: i64,
    /// `pg_total_relation_size('loadgen_orders')`, bytes.
    pub orders_total_bytes: i64,
    /// `pg_stat_user_tables.n_live_tup`.
    pub n_live_tup: i64,
    /// `pg_stat_user_tables.n_dead_tup`: the claim and ack updates' garbage.
    pub n_dead_tup: i64,
    pub n_tup_ins: i64,
    pub n_tup_upd: i64,
    /// Of which heap-only (no index maintenance).
    pub n_tup_hot_upd: i64,
    /// Autovacuum runs on the outbox.
    pub autovacuum_count: i64,
    /// Write counters of each of [`COST_TABLES`].
    pub tables: Vec<TableStats>,
}

impl Database {
    /// The outbox's size in bytes and where it comes from: PostgreSQL
    /// `pg_total_relation_size` (heap, indexes, TOAST); MariaDB the size of its InnoDB
    /// tablespace file (`ferry_outbox.ibd`, which never shrinks: deleted rows' space is reused);
    /// SQLite the pages of the table and its indexes (`dbstat`).
    pub async fn outbox_bytes(&self) -> Result<Option<i64>> {
        let stmt = match self.kind {
            Backend::Postgres => "SELECT pg_total_relation_size('ferry_outbox')::int8",
            Backend::Mysql => {
                "SELECT CAST(COALESCE(MAX(FILE_SIZE), -1) AS SIGNED) \
                 FROM information_schema.INNODB_SYS_TABLESPACES \
                 WHERE NAME = CONCAT(DATABASE(), '/ferry_outbox')"
            }
            Backend::Sqlite => {
                "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat \
                 WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = 'ferry_outbox')"
            }
        };
        let n = self.scalar(stmt, "measure the outbox's size").await?;
        Ok((n >= 0).then_some(n))
    }

    /// Where [`Self::outbox_bytes`] comes from.
    pub fn outbox_bytes_source(&self) -> &'static str {
        match self.kind {
            Backend::Postgres => "pg_total_relation_size('ferry_outbox'): heap, indexes, TOAST",
            Backend::Mysql => "the InnoDB tablespace file ferry_outbox.ibd (it never shrinks; purged rows' space is reused)",
            Backend::Sqlite => "dbstat: the pages of ferry_outbox and its indexes",
        }
    }

    /// PostgreSQL-side costs of the outbox; `None` on other backends. Uses a fresh
    /// connection: pooled backends flush their table statistics only about once a second (or
    /// when they exit), so read this after closing the pools for exact end-of-run figures.
    pub async fn pg_costs(&self) -> Result<Option<PgCosts>> {
        if self.kind != Backend::Postgres {
            return Ok(None);
        }
        let mut conn = ferry_store::postgres::connect_one(&self.url).await?;
        let r: (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size('ferry_outbox'), pg_relation_size('ferry_outbox'), \
               pg_indexes_size('ferry_outbox'), pg_total_relation_size('loadgen_orders'), \
               COALESCE(s.n_live_tup, 0), COALESCE(s.n_dead_tup, 0), COALESCE(s.n_tup_ins, 0), \
               COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_hot_upd, 0), COALESCE(s.autovacuum_count, 0) \
             FROM (SELECT 1) AS one \
             LEFT JOIN pg_stat_user_tables s ON s.relid = 'ferry_outbox'::regclass",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(Error::sql("read pg_stat_user_tables"))?;
        let mut tables = Vec::with_capacity(COST_TABLES.len());
        for t in COST_TABLES {
            let s: (i64, i64, i64, i64, i64) = sqlx::query_as(
                "SELECT COALESCE(s.n_tup_ins, 0), COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_del, 0), \
                   COALESCE(s.n_tup_hot_upd, 0), COALESCE(s.n_dead_tup, 0) \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN pg_stat_user_tables s ON s.relid = to_regclass($1)",
            )
            .bind(t)
            .fetch_one(&mut conn)
            .await
            .map_err(Error::sql(format!("read pg_stat_user_tables for {t}")))?;
            tables.push(TableStats {
                table: t.to_string(),
                n_tup_ins: s.0,
                n_tup_upd: s.1,
                n_tup_del: s.2,
                n_tup_hot_upd: s.3,
                n_dead_tup: s.4,
            });
        }
        let _ = conn.close().await;
        Ok(Some(PgCosts {
            outbox_total_bytes: r.0,
            outbox_table_bytes: r.1,
            outbox_index_bytes: r.2,
            orders_total_bytes: r.3,
            n_live_tup: r.4,
            n_dead_tup: r.5,
            n_tup_ins: r.6,
            n_tup_upd: r.7,
            n_tup_hot_upd: r.8,
            autovacuum_count: r.9,
            tables,
        }))
    }

    /// [`Self::pg_costs`] once the statistics have settled. A backend reports its table
    /// counters at most once a second, when idle up to 10 s later, at exit at once; so read
    /// this after the connections that wrote have been closed (relays stopped and their idle
    /// connections closed, the producers' pool closed): it rereads every 250 ms until two reads
    /// agree (at most ~5 s), for the exiting backends' reports to land. (`pg_stat_force_next_
    /// flush()` would not help here: it only affects the backend that calls it.) Returns the
    /// costs and whether they settled.
    pub async fn pg_costs_settled(&self, min_wait: Duration) -> Result<Option<(PgCosts, bool)>> {
        if self.kind != Backend::Postgres {
            return Ok(None);
        }
        tokio::time::sleep(min_wait).await;
        let mut last = self.pg_costs().await?.expect("postgres");
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.pg_costs().await?.expect("postgres");
            if now.tables == last.tables && now.n_dead_tup == last.n_dead_tup {
                return Ok(Some((now, true)));
            }
            last = now;
        }
        Ok(Some((last, false)))
    }

    /// SQLite's cheap write counts (see [`SqliteWrites`]); `None` on other backends.
    pub async fn sqlite_writes(&self) -> Result<Option<SqliteWrites>> {
        let Pool::Sqlite(p) = &self.pool else {
            return Ok(None);
        };
        let r: (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM ferry_outbox), \
               (SELECT COALESCE(SUM(claim_version), 0) FROM ferry_outbox), \
               (SELECT COUNT(*) FROM ferry_outbox_exception), \
               (SELECT COALESCE(SUM(claim_version), 0) FROM ferry_outbox_exception), \
               (SELECT COALESCE(SUM(cursor_version), 0) FROM ferry_slot_lease)",
        )
        .fetch_one(p)
        .await
        .map_err(Error::sql("count SQLite writes"))?;
        Ok(Some(SqliteWrites {
            outbox_rows: r.0,
            outbox_claims: r.1,
            exception_rows: r.2,
            exception_claims: r.3,
            cursor_versions: r.4,
            purged_rows: 0,
        }))
    }

    /// `n_dead_tup` of the outbox right now (PostgreSQL; sampled once a second).
    pub async fn pg_dead_tuples(&self) -> Option<i64> {
        if self.kind != Backend::Postgres {
            return None;
        }
        self.scalar(
            "SELECT COALESCE((SELECT n_dead_tup FROM pg_stat_user_tables \
               WHERE relid = 'ferry_outbox'::regclass), 0)",
            "sample n_dead_tup",
        )
        .await
        .ok()
    }

    /// `ANALYZE` the outbox, the slot leases and the business table (PostgreSQL; a no-op
    /// elsewhere). Returns
    /// whether it ran.
    pub async fn pg_analyze(&self) -> Result<bool> {
        let Pool::Postgres(p) = &self.pool else {
            return Ok(false);
        };
        p.execute("ANALYZE ferry_outbox, ferry_slot_lease, loadgen_orders")
            .await
            .map_err(Error::sql("ANALYZE"))?;
        Ok(true)
    }
}
