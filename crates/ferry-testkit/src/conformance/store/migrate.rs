//! Migrations: applied once under concurrency, and a newer schema refused.

use crate::db::TestDb;

/// The versions of the backend's embedded migrations.
fn embedded_versions(db: &TestDb) -> Vec<i64> {
    let all = match db.backend {
        ferry_store::Backend::Postgres => ferry_store::MIGRATIONS_POSTGRES,
        ferry_store::Backend::Mysql => ferry_store::MIGRATIONS_MYSQL,
        _ => ferry_store::MIGRATIONS_SQLITE,
    };
    all.iter().map(|m| m.version).collect()
}

/// Two concurrent migrations of a migrated database apply nothing twice.
pub async fn concurrent_migrations_apply_once(db: TestDb) {
    // The TestDb is migrated already; two more concurrent runs must wait for the lock and do nothing.
    let (a, b) = tokio::join!(
        ferry_store::migrate_url(&db.url),
        ferry_store::migrate_url(&db.url)
    );
    assert_eq!(a.unwrap(), Vec::<i64>::new());
    assert_eq!(b.unwrap(), Vec::<i64>::new());
    assert_eq!(
        db.count("ferry_schema_migrations").await,
        embedded_versions(&db).len() as i64
    );
    assert_eq!(db.count("ferry_slot_lease").await, 256);
}

/// Two concurrent migrations of a fresh database apply every version exactly once between them.
pub async fn fresh_concurrent_migrations(db: TestDb) {
    // Drop the schema and migrate twice at once from scratch.
    db.exec("DROP VIEW IF EXISTS ferry_outbox_cursor_view")
        .await
        .unwrap();
    for t in ["ferry_outbox_exception", "ferry_dispatch"] {
        db.exec(&format!("DROP TABLE IF EXISTS {t}")).await.unwrap();
    }
    for t in [
        "ferry_outbox",
        "ferry_slot_lease",
        "ferry_relay_member",
        "ferry_schema_migrations",
    ] {
        db.exec(&format!("DROP TABLE {t}")).await.unwrap();
    }
    let (a, b) = tokio::join!(
        ferry_store::migrate_url(&db.url),
        ferry_store::migrate_url(&db.url)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut all = a.clone();
    all.extend(b.clone());
    all.sort_unstable();
    assert_eq!(
        all,
        embedded_versions(&db),
        "each version applied by exactly one migrate (got {a:?} and {b:?})"
    );
    assert!(
        a.is_empty() || b.is_empty(),
        "one migrate applied everything, the other waited for its lock (got {a:?} and {b:?})"
    );
    assert_eq!(db.count("ferry_slot_lease").await, 256);
}

/// A database migrated by a newer ferry (a version this build does not know) is refused with a
/// message naming both versions, and nothing is applied.
pub async fn a_newer_schema_is_refused(db: TestDb) {
    let newer = embedded_versions(&db).into_iter().max().unwrap() + 1;
    db.exec(&format!(
        "INSERT INTO ferry_schema_migrations (version, name{}) VALUES ({newer}, 'from_the_future'{})",
        if db.backend == ferry_store::Backend::Sqlite { ", applied_at" } else { "" },
        if db.backend == ferry_store::Backend::Sqlite { ", 0" } else { "" },
    ))
    .await
    .unwrap();
    let e = ferry_store::migrate_url(&db.url).await.unwrap_err();
    assert_eq!(e.kind(), ferry_core::StoreErrorKind::Schema, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("migration {newer}"))
            && msg.contains(&format!("up to {}", newer - 1)),
        "{msg}"
    );
    db.exec(&format!(
        "DELETE FROM ferry_schema_migrations WHERE version = {newer}"
    ))
    .await
    .unwrap();
    assert_eq!(
        ferry_store::migrate_url(&db.url).await.unwrap(),
        Vec::<i64>::new()
    );
}
