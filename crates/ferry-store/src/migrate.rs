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

/// PostgreSQL migrations, in order.
pub const MIGRATIONS_POSTGRES: &[Migration] = &[Migration {
    version: 1,
    name: "outbox",
    sql: include_str!("../../../migrations/postgres/0001_outbox.sql"),
}];

/// MySQL/MariaDB migrations, in order.
pub const MIGRATIONS_MYSQL: &[Migration] = &[Migration {
    version: 1,
    name: "outbox",
    sql: include_str!("../../../migrations/mysql/0001_outbox.sql"),
}];

/// SQLite migrations, in order.
pub const MIGRATIONS_SQLITE: &[Migration] = &[Migration {
    version: 1,
    name: "outbox",
    sql: include_str!("../../../migrations/sqlite/0001_outbox.sql"),
}];
