//! One module per subcommand: its arguments and what it does. Settings that merge the config
//! file, the environment and flags are resolved in [`crate::config`].
use std::sync::Arc;

use ferry_core::{Limits, OutboxStore};
use ferry_store::{redact_url, Backend, ConnectOptions};

use crate::config::ConfigError;

pub mod enqueue;
pub mod lab;
pub mod migrate;
pub mod purge;
pub mod quarantine;
pub mod reconcile;
pub mod relay;
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
        ferry_store::connect(&self.url, &opts)
            .await
            .map_err(|e| fail(1, format!("{} ({})", e, redact_url(&self.url))))
    }
}

/// An age in µs as seconds with one decimal, or `-`.
pub fn fmt_age(us: Option<i64>) -> String {
    match us {
        None => "-".into(),
        Some(us) => format!("{:.1}s", us as f64 / 1e6),
    }
}
