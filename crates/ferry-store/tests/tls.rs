//! TLS to the database, asked for in the URL (PostgreSQL `sslmode=require|verify-ca|verify-full`
//! with `sslrootcert=…`; MariaDB `ssl-mode=REQUIRED|VERIFY_CA|VERIFY_IDENTITY` with `ssl-ca=…`):
//! the store's connections are encrypted when asked, plaintext when `sslmode=disable`, and a
//! required TLS the server cannot give is refused with the cause named. Needs a PostgreSQL with
//! `ssl = on` (Debian's default, with its snakeoil certificate) on the machine running the test.
//! For MariaDB with TLS, the test starts a throwaway `mariadbd` of its own (a temporary data
//! directory, a certificate authority made with `openssl`, a free loopback port), so the shared
//! server's settings stay as they are.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// A `mariadbd` with TLS on a free loopback port, its data and certificates in a temporary
/// directory; killed and removed on drop.
struct TlsMariaDb {
    child: Child,
    dir: ferry_testkit::TempDir,
    port: u16,
}

impl Drop for TlsMariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority `name` in `dir` (`<name>.pem`, `<name>.key`).
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", &format!("/CN=ferry test {name}"), "-keyout"])
        .args([&key, Path::new("-out"), &pem]));
    pem
}

impl TlsMariaDb {
    /// `None` (the test is skipped) when this machine has no MariaDB server binary, unless
    /// `FERRY_REQUIRE_DBS=1`.
    fn start() -> Option<Self> {
        let mariadbd = std::env::var("FERRY_TEST_MARIADBD")
            .unwrap_or_else(|_| "/usr/sbin/mariadbd".to_string());
        if !Path::new(&mariadbd).exists() {
            if std::env::var("FERRY_REQUIRE_DBS").as_deref() == Ok("1") {
                panic!("{mariadbd} not found but FERRY_REQUIRE_DBS=1 (set FERRY_TEST_MARIADBD)");
            }
            eprintln!("skipped: {mariadbd} not found");
            return None;
        }
        let dir = ferry_testkit::TempDir::new("ferry-tls-mariadb").unwrap();
        let d = dir.path();
        let ca = make_ca(d, "ca");
        let (key, csr, cert, ext) = (
            d.join("server.key"),
            d.join("server.csr"),
            d.join("server.pem"),
            d.join("ext.cnf"),
        );
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
            ])
            .args([Path::new("-keyout"), &key, Path::new("-out"), &csr]));
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial", "-in"])
            .args([&csr, Path::new("-CA"), &ca, Path::new("-CAkey")])
            .arg(d.join("ca.key"))
            .args([Path::new("-extfile"), &ext, Path::new("-out"), &cert]));
        let user = std::env::var("USER").unwrap_or_else(|_| "root".to_string());
        let data = d.join("data");
        run(Command::new("mariadb-install-db")
            .args(["--no-defaults", "--auth-root-authentication-method=normal"])
            .arg(format!("--user={user}"))
            .arg(format!("--datadir={}", data.display())));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&mariadbd)
            .arg("--no-defaults")
            .arg(format!("--user={user}"))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--ssl-ca={}", ca.display()))
            .arg(format!("--ssl-cert={}", cert.display()))
            .arg(format!("--ssl-key={}", key.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{mariadbd}: {e}"));
        Some(Self { child, dir, port })
    }

    fn url(&self, db: &str, params: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}?{params}", self.port)
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

/// MariaDB with TLS: `ssl-mode=REQUIRED`, `VERIFY_CA` and `VERIFY_IDENTITY` (with the server's
/// CA in `ssl-ca`) give encrypted connections; `VERIFY_CA` with a CA that did not sign the
/// server's certificate is refused; `DISABLED` is plaintext. The store runs its migrations over
/// the encrypted connection.
#[tokio::test]
async fn mariadb_connections_are_encrypted_when_the_url_asks() {
    if env_url(Backend::Mysql).is_none() {
        return;
    }
    let Some(server) = TlsMariaDb::start() else {
        return;
    };
    let mut opts = ConnectOptions {
        migrate: false,
        acquire_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let cipher = "SELECT CAST(VARIABLE_VALUE AS CHAR) FROM information_schema.SESSION_STATUS \
                  WHERE VARIABLE_NAME = 'Ssl_cipher'";
    // the server takes a moment to start
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let plain = loop {
        match MyStore::connect(&server.url("mysql", "ssl-mode=DISABLED"), &opts).await {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() > deadline => panic!("mariadbd: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let none: String = sqlx::query_scalar(cipher)
        .fetch_one(plain.pool())
        .await
        .unwrap();
    assert_eq!(none, "", "ssl-mode=DISABLED is plaintext");
    sqlx::query("CREATE DATABASE ferry_tls")
        .execute(plain.pool())
        .await
        .unwrap();
    // the first encrypted store migrates the outbox
    opts.migrate = true;
    let ca = server.ca().display().to_string();
    for params in [
        "ssl-mode=REQUIRED".to_string(),
        format!("ssl-mode=VERIFY_CA&ssl-ca={ca}"),
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
    ] {
        let store = MyStore::connect(&server.url("ferry_tls", &params), &opts)
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
        let used: String = sqlx::query_scalar(cipher)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_ne!(used, "", "{params} is encrypted");
        store.pool().close().await;
    }
    let other = make_ca(server.dir.path(), "other-ca");
    let params = format!("ssl-mode=VERIFY_CA&ssl-ca={}", other.display());
    let refused = MyStore::connect(&server.url("ferry_tls", &params), &opts).await;
    let e = refused
        .err()
        .unwrap_or_else(|| panic!("{params}: a certificate from another CA was accepted"));
    assert!(
        e.to_string().to_lowercase().contains("certificate"),
        "{params}: {e}"
    );
}
