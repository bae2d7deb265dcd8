//! TLS to the database, asked for in the URL (PostgreSQL `sslmode=require|verify-ca|verify-full`
//! with `sslrootcert=…`; MariaDB `ssl-mode=REQUIRED|VERIFY_CA|VERIFY_IDENTITY` with `ssl-ca=…`):
//! the store's connections are encrypted when asked, plaintext when `sslmode=disable`, and a
//! required TLS the server cannot give is refused with the cause named. Needs a PostgreSQL with
//! `ssl = on` (Debian's default, with its snakeoil certificate) on the machine running the test.
use std::time::Duration;

use ferry_store::mysql::MyStore;
use ferry_store::postgres::PgStore;
use ferry_store::{Backend, ConnectOptions};
use ferry_testkit::{env_url, TestDb};

/// `url` with one more query parameter.
fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

async fn open(url: &str) -> Result<PgStore, ferry_core::StoreError> {
    let opts = ConnectOptions {
        migrate: false,
        acquire_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    PgStore::connect(url, &opts).await
}

const ENCRYPTED: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

#[tokio::test]
async fn postgres_connections_are_encrypted_when_the_url_asks() {
    let Some(admin) = env_url(Backend::Postgres) else {
        return;
    };
    let plain = sqlx::PgPool::connect(&with(&admin, "sslmode=disable"))
        .await
        .unwrap();
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&plain)
        .await
        .unwrap();
    assert_eq!(ssl, "on", "this test needs a PostgreSQL with ssl = on");
    let cert: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(&plain)
        .await
        .unwrap();
    let db = TestDb::open(Backend::Postgres).await.unwrap();
    for (params, encrypted) in [
        ("sslmode=require".to_string(), true),
        (format!("sslmode=verify-ca&sslrootcert={cert}"), true),
        ("sslmode=disable".to_string(), false),
    ] {
        let store = open(&with(&db.url, &params)).await.unwrap();
        let ssl: bool = sqlx::query_scalar(ENCRYPTED)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(ssl, encrypted, "{params}");
    }
    db.cleanup().await;
}

/// MariaDB: `ssl-mode=REQUIRED` gives an encrypted connection when the server has TLS, and is
/// refused with the cause named when it has not (the test server's case here: `have_ssl` is
/// `DISABLED`); `ssl-mode=DISABLED` always connects in plaintext.
#[tokio::test]
async fn mariadb_tls_is_used_or_refused_as_the_url_asks() {
    let Some(url) = env_url(Backend::Mysql) else {
        return;
    };
    let opts = ConnectOptions {
        migrate: false,
        acquire_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let plain = MyStore::connect(&with(&url, "ssl-mode=DISABLED"), &opts)
        .await
        .unwrap();
    let cipher = "SELECT CAST(VARIABLE_VALUE AS CHAR) FROM information_schema.SESSION_STATUS \
                  WHERE VARIABLE_NAME = 'Ssl_cipher'";
    let none: String = sqlx::query_scalar(cipher)
        .fetch_one(plain.pool())
        .await
        .unwrap();
    assert_eq!(none, "", "ssl-mode=DISABLED is plaintext");
    let have: String = sqlx::query_scalar("SELECT CAST(@@have_ssl AS CHAR)")
        .fetch_one(plain.pool())
        .await
        .unwrap();
    match MyStore::connect(&with(&url, "ssl-mode=REQUIRED"), &opts).await {
        Ok(tls) if have == "YES" => {
            let used: String = sqlx::query_scalar(cipher)
                .fetch_one(tls.pool())
                .await
                .unwrap();
            assert_ne!(used, "", "ssl-mode=REQUIRED is encrypted");
        }
        Ok(_) => panic!("ssl-mode=REQUIRED connected to a server without TLS ({have})"),
        Err(e) => {
            assert_ne!(have, "YES", "the server has TLS, yet: {e}");
            assert!(e.to_string().contains("TLS"), "{e}");
        }
    }
}
