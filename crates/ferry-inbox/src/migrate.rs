//! Embedded inbox migrations (`crates/ferry-inbox/migrations/<backend>/NNNN_name.sql`),
//! tracked in `ferry_inbox_migrations`.
use ferry_store::Migration;

/// PostgreSQL inbox migrations, in order.
pub const MIGRATIONS_POSTGRES: &[Migration] = &[Migration {
    version: 1,
    name: "inbox",
    sql: include_str!("../migrations/postgres/0001_inbox.sql"),
}];

/// MySQL/MariaDB inbox migrations, in order.
pub const MIGRATIONS_MYSQL: &[Migration] = &[Migration {
    version: 1,
    name: "inbox",
    sql: include_str!("../migrations/mysql/0001_inbox.sql"),
}];

/// SQLite inbox migrations, in order.
pub const MIGRATIONS_SQLITE: &[Migration] = &[Migration {
    version: 1,
    name: "inbox",
    sql: include_str!("../migrations/sqlite/0001_inbox.sql"),
}];
