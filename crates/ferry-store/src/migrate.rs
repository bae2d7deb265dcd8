//! Embedded migrations.

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version (the file's `NNNN` prefix).
    pub version: i64,
    /// Name (the rest of the file name).
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// The [`Migration`] of `migrations/<file>.sql` (`file`: `<backend>/NNNN_name`).
macro_rules! migration {
    ($version:literal, $name:literal, $file:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/", $file, ".sql")),
        }
    };
}

/// PostgreSQL migrations, in order.
pub const MIGRATIONS_POSTGRES: &[Migration] = &[
    migration!(1, "outbox", "postgres/0001_outbox"),
    migration!(2, "hot_claims", "postgres/0002_hot_claims"),
    migration!(3, "cursor", "postgres/0003_cursor"),
    migration!(4, "status_cache", "postgres/0004_status_cache"),
    migration!(5, "plain_insert", "postgres/0005_plain_insert"),
    migration!(6, "gated_notify", "postgres/0006_gated_notify"),
    migration!(7, "member_instance", "postgres/0007_member_instance"),
    migration!(8, "seq_order", "postgres/0008_seq_order"),
    migration!(9, "cursor_fillfactor", "postgres/0009_cursor_fillfactor"),
    migration!(10, "member_sink", "postgres/0010_member_sink"),
    migration!(11, "binary_payload", "postgres/0011_binary_payload"),
    migration!(12, "operator_action", "postgres/0012_operator_action"),
    migration!(13, "pause", "postgres/0013_pause"),
    migration!(14, "retention_mark", "postgres/0014_retention_mark"),
    migration!(15, "uuid_v7", "postgres/0015_uuid_v7"),
    migration!(16, "key_by_default", "postgres/0016_key_by_default"),
];

/// MySQL/MariaDB migrations, in order.
pub const MIGRATIONS_MYSQL: &[Migration] = &[
    migration!(1, "outbox", "mysql/0001_outbox"),
    migration!(2, "due_index", "mysql/0002_due_index"),
    migration!(3, "cursor", "mysql/0003_cursor"),
    migration!(4, "plain_insert", "mysql/0004_plain_insert"),
    migration!(5, "status_cache", "mysql/0005_status_cache"),
    migration!(6, "member_instance", "mysql/0006_member_instance"),
    migration!(7, "gate_hold", "mysql/0007_gate_hold"),
    migration!(8, "member_sink", "mysql/0008_member_sink"),
    migration!(9, "binary_payload", "mysql/0009_binary_payload"),
    migration!(10, "operator_action", "mysql/0010_operator_action"),
    migration!(11, "pause", "mysql/0011_pause"),
    migration!(12, "retention_mark", "mysql/0012_retention_mark"),
    migration!(
        13,
        "predecessor_by_state",
        "mysql/0013_predecessor_by_state"
    ),
];

/// SQLite migrations, in order.
pub const MIGRATIONS_SQLITE: &[Migration] = &[
    migration!(1, "outbox", "sqlite/0001_outbox"),
    migration!(2, "cursor", "sqlite/0002_cursor"),
    migration!(3, "plain_insert", "sqlite/0003_plain_insert"),
    migration!(4, "member_instance", "sqlite/0004_member_instance"),
    migration!(5, "member_sink", "sqlite/0005_member_sink"),
    migration!(7, "operator_action", "sqlite/0007_operator_action"),
    migration!(8, "pause", "sqlite/0008_pause"),
    migration!(9, "retention_mark", "sqlite/0009_retention_mark"),
];

// ---------------------------------------------------------------- the runner
//
// One runner for every embedded migration set (the outbox's here, the Inbox's in ferry-inbox):
// take the backend's lock, create the tracking table, apply what is missing in order, record each
// version. `lock_key` and `table` are fixed constants of the calling crate.

use std::collections::HashSet;

use ferry_core::{StoreError, StoreErrorKind};
use sqlx::{Connection, Executor, MySqlConnection, PgConnection, SqliteConnection};

use crate::error::{db_err, Ctx};

/// The lock key and tracking table of the outbox's own migrations (every backend's store).
pub(crate) const OUTBOX_LOCK: &str = "ferry_migrate";
/// See [`OUTBOX_LOCK`].
pub(crate) const OUTBOX_TABLE: &str = "ferry_schema_migrations";

fn check_table(table: &str) -> Result<(), StoreError> {
    crate::operator::validate_identifier("migrations table", table)
}

/// Reads which versions `$table` holds, then applies the rest of `$migrations` in order on
/// `$conn`, recording each with `$record` (an INSERT binding version, name, then `$extra`).
/// Evaluates to the versions applied; `?` returns from the enclosing fn or async block.
macro_rules! apply_pending {
    ($conn:expr, $table:expr, $migrations:expr, $record:expr $(, $extra:expr)*) => {{
        let done: HashSet<i64> = sqlx::query_scalar(&format!("SELECT version FROM {}", $table))
            .fetch_all($conn)
            .await
            .map_err(|e| db_err("migrate: read applied", e))?
            .into_iter()
            .collect();
        // A version this build does not know: a newer ferry migrated the database, and this
        // one cannot tell what that migration changed.
        let known = $migrations.iter().map(|m| m.version).max().unwrap_or(0);
        if let Some(newer) = done.iter().copied().filter(|v| *v > known).max() {
            return Err(StoreError::new(
                StoreErrorKind::Schema,
                format!(
                    "{} records migration {newer}, but this ferry knows migrations up to {known}: \
                     a newer ferry migrated this database; run that version (or a later one)",
                    $table
                ),
            ));
        }
        let mut applied = Vec::new();
        for m in $migrations.iter().filter(|m| !done.contains(&m.version)) {
            sqlx::raw_sql(m.sql)
                .execute($conn)
                .await
                .map_err(|e| db_err(&format!("migration {:04}_{}", m.version, m.name), e))?;
            sqlx::query(&$record)
                .bind(m.version)
                .bind(m.name)
                $(.bind($extra))*
                .execute($conn)
                .await
                .map_err(|e| db_err("migrate: record", e))?;
            applied.push(m.version);
        }
        applied
    }};
}

/// PostgreSQL: everything in one transaction under `pg_advisory_xact_lock(hashtext(lock_key ||
/// ':' || current_schema()))`. DDL is transactional, so a migration applies fully or not at all,
/// and a concurrent run waits for the lock and then finds nothing to do.
pub async fn apply_postgres(
    conn: &mut PgConnection,
    lock_key: &str,
    table: &str,
    migrations: &[Migration],
) -> Result<Vec<i64>, StoreError> {
    check_table(table)?;
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| db_err("migrate: begin", e))?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1 || ':' || current_schema()))")
        .bind(lock_key)
        .execute(&mut *tx)
        .await
        .map_err(|e| db_err("migrate: lock", e))?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (version BIGINT PRIMARY KEY, \
         name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .execute(&mut *tx)
    .await
    .map_err(|e| db_err(&format!("migrate: create {table}"), e))?;
    let applied = apply_pending!(
        &mut *tx,
        table,
        migrations,
        format!("INSERT INTO {table} (version, name) VALUES ($1, $2)")
    );
    tx.commit().await.ctx("migrate: commit")?;
    Ok(applied)
}

/// MySQL/MariaDB: under `GET_LOCK(lock_key:<database>, 300)` on this connection. DDL is not
/// transactional, so every statement is idempotent (`IF NOT EXISTS`), a migration that died
/// half-way is simply re-run, and its version row is written last.
pub async fn apply_mysql(
    conn: &mut MySqlConnection,
    lock_key: &str,
    table: &str,
    migrations: &[Migration],
) -> Result<Vec<i64>, StoreError> {
    check_table(table)?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, ':', DATABASE()), 300)")
        .bind(lock_key)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_err("migrate: lock", e))?;
    if got != Some(1) {
        return Err(StoreError::new(
            StoreErrorKind::Conflict,
            format!("migrate: another migration held the {lock_key} lock for 300 s"),
        ));
    }
    let result = async {
        conn.execute(
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (version BIGINT PRIMARY KEY, \
                 name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))"
            )
            .as_str(),
        )
        .await
        .map_err(|e| db_err(&format!("migrate: create {table}"), e))?;
        let applied = apply_pending!(
            &mut *conn,
            table,
            migrations,
            format!("INSERT INTO {table} (version, name) VALUES (?, ?)")
        );
        Ok(applied)
    }
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT(?, ':', DATABASE()))")
        .bind(lock_key)
        .execute(&mut *conn)
        .await;
    result
}

/// SQLite: one `BEGIN IMMEDIATE` transaction: the write lock serialises concurrent runs, and
/// SQLite DDL is transactional. (`lock_key` is unused: the database lock is the lock.)
pub async fn apply_sqlite(
    conn: &mut SqliteConnection,
    _lock_key: &str,
    table: &str,
    migrations: &[Migration],
) -> Result<Vec<i64>, StoreError> {
    check_table(table)?;
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| db_err("migrate: begin", e))?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, \
         name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
    ))
    .execute(&mut *tx)
    .await
    .map_err(|e| db_err(&format!("migrate: create {table}"), e))?;
    let applied = apply_pending!(
        &mut *tx,
        table,
        migrations,
        format!("INSERT INTO {table} (version, name, applied_at) VALUES (?, ?, ?)"),
        ferry_core::now_micros()
    );
    tx.commit().await.ctx("migrate: commit")?;
    Ok(applied)
}
