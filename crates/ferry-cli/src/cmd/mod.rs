//! One module per subcommand: its arguments and what it does. Settings that merge the config
//! file, the environment and flags are resolved by the rules of [`crate::config`] (`ferry
//! relay`'s in `relay/settings.rs`).
use std::sync::Arc;

use clap::Args;
use ferry_core::{Limits, OutboxStore};
use ferry_store::{redact_url, Backend, ConnectOptions};

use crate::config::ConfigError;

pub mod enqueue;
pub mod lab;
pub mod migrate;
pub mod pause;
pub mod purge;
pub mod quarantine;
pub mod reconcile;
pub mod relay;
pub mod replay;
pub mod status;

/// `status` at a warning; `reconcile` with unknown or quarantined intents. Distinct from 2
/// (bad usage or configuration), so that a monitoring check can tell a finding from its own
/// mistake.
pub const EXIT_WARNING: u8 = 4;
/// `status` at a critical alert; `reconcile` with business rows that have no intent.
pub const EXIT_CRITICAL: u8 = 5;

/// A failure with its exit code.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Self {
            code: 2,
            message: e.0,
        }
    }
}

impl From<ferry_core::StoreError> for Failure {
    fn from(e: ferry_core::StoreError) -> Self {
        let code = if e.kind() == ferry_core::StoreErrorKind::InvalidInput {
            2
        } else {
            1
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

pub fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

/// `--operator`, for the commands that act on the outbox's delivery as an operator
/// (quarantine `requeue` and `skip`, `pause`, `resume`).
#[derive(Args, Debug)]
pub struct OperatorArg {
    /// Who is acting (recorded; resume only prints it) [default: $USER].
    #[arg(long)]
    operator: Option<String>,
}

impl OperatorArg {
    /// The operator's name: `--operator`, else `$USER`, else `unknown-operator`.
    pub fn name(self) -> String {
        self.operator
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "unknown-operator".into())
    }
}

/// The database a subcommand works on.
pub struct Database {
    pub url: String,
    pub backend: Backend,
    pub limits: Limits,
}

impl Database {
    /// Connects, applying the migrations first when `migrate`.
    pub async fn open(
        &self,
        migrate: bool,
        measure_contention: bool,
    ) -> Result<Arc<dyn OutboxStore>, Failure> {
        let opts = ConnectOptions {
            migrate,
            limits: self.limits,
            measure_contention,
            ..Default::default()
        };
        self.open_store(&opts)
            .await
            .map_err(|e| self.open_failure(&e))
    }

    /// Opens the store with `opts`, the error as the store reports it (its kind says whether
    /// it can pass). A SQLite file that does not exist is not created: only `ferry migrate`
    /// creates one. A mistyped path would otherwise become a new, empty outbox: `status` would
    /// report it healthy and a relay would deliver nothing from the application's real one.
    /// The error can pass (`Unavailable`): a relay waits, logging, until the application (or
    /// `ferry migrate`) creates the file; the other commands end with it.
    pub async fn open_store(
        &self,
        opts: &ConnectOptions,
    ) -> Result<Arc<dyn OutboxStore>, ferry_core::StoreError> {
        if let Some(path) = self.missing_sqlite_file() {
            return Err(ferry_core::StoreError::new(
                ferry_core::StoreErrorKind::Unavailable,
                format!(
                    "no SQLite database at {}: nothing was created (only `ferry migrate` creates one)",
                    path.display()
                ),
            ));
        }
        ferry_store::connect(&self.url, opts).await
    }

    /// The file a SQLite URL names, when it does not exist. `None`: another backend, an
    /// in-memory database, an existing file, or a URL the store will refuse with its own error.
    fn missing_sqlite_file(&self) -> Option<std::path::PathBuf> {
        use std::str::FromStr;
        if self.backend != Backend::Sqlite
            || self.url.contains(":memory:")
            || self.url.contains("mode=memory")
        {
            return None;
        }
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url).ok()?;
        let path = opts.get_filename();
        (!path.exists()).then(|| path.to_path_buf())
    }

    /// The failure an open error ends a command with (exit 1, the URL without its password).
    pub fn open_failure(&self, e: &ferry_core::StoreError) -> Failure {
        fail(1, format!("{} ({})", e, redact_url(&self.url)))
    }

    /// [`Self::open`] for a long-running command: errors that can pass (the server down or
    /// restarting, too many connections, a full disk) are retried with backoff, logged when they
    /// begin and then once a minute, until the store opens or SIGTERM/SIGINT (`None`); others
    /// (authentication, a malformed URL, a schema to migrate) end the command at once.
    pub async fn open_retrying(
        &self,
        migrate: bool,
        measure_contention: bool,
    ) -> Result<Option<Arc<dyn OutboxStore>>, Failure> {
        let opts = ConnectOptions {
            migrate,
            limits: self.limits,
            measure_contention,
            ..Default::default()
        };
        // listening from the start: a signal during a connection attempt (which can take the
        // pool's acquire timeout) stops the wait too, instead of killing the process
        let stop = tokio_util::sync::CancellationToken::new();
        let listener = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminated() => {}
                }
                stop.cancel();
            })
        };
        let _listening = AbortOnDrop(listener);
        let mut episode = ferry_relay::Episode::new("opening the database");
        loop {
            let attempt = tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                r = self.open_store(&opts) => r,
            };
            match attempt {
                Ok(s) => {
                    episode.ended();
                    return Ok(Some(s));
                }
                // the server down or restarting, too many connections, a full disk
                Err(e) if e.kind() == ferry_core::StoreErrorKind::Unavailable => {
                    let wait = episode.failed(&e);
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Err(e) => return Err(self.open_failure(&e)),
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves at SIGTERM (never on platforms without it).
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    }
    #[cfg(not(unix))]
    std::future::pending::<()>().await
}

/// An age in µs as seconds with one decimal, or `-`.
pub fn fmt_age(us: Option<i64>) -> String {
    match us {
        None => "-".into(),
        Some(us) => format!("{:.1}s", us as f64 / 1e6),
    }
}
