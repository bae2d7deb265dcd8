//! The settings every SQLite store connection runs with: WAL, `synchronous = FULL` (a committed
//! intent survives a power loss) and `wal_autocheckpoint = 10000`; and the bundled SQLite's
//! statement-journal spill threshold of 16 MiB, set by the workspace's `.cargo/config.toml`
//! (docs/tuning.md, "Per store").
use ferry_store::sqlite::SqliteStore;
use ferry_store::ConnectOptions;
use ferry_testkit::TempDir;

#[tokio::test]
async fn every_pooled_connection_has_the_settings() {
    let dir = TempDir::new("ferry-sqlite-settings").unwrap();
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let opts = ConnectOptions {
        max_connections: 3,
        ..ConnectOptions::default()
    };
    let store = SqliteStore::connect(&url, &opts).await.unwrap();
    // three connections at once: each is a separate SQLite connection with its own settings
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(store.pool().acquire().await.unwrap());
    }
    for c in &mut conns {
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut **c)
            .await
            .unwrap();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut **c)
            .await
            .unwrap();
        let ckpt: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&mut **c)
            .await
            .unwrap();
        assert_eq!(journal, "wal");
        assert_eq!(ckpt, 10_000, "wal_autocheckpoint");
        assert_eq!(sync, 2, "synchronous = FULL");
    }
    drop(conns);
    let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert!(
        options.iter().any(|o| o == "STMTJRNL_SPILL=16777216"),
        "the bundled SQLite was built without .cargo/config.toml's LIBSQLITE3_FLAGS: {options:?}"
    );
}
