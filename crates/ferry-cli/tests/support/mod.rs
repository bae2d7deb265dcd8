//! What the `ferry` command tests share: running the binary with no configuration inherited
//! from the environment.
use std::process::{Command, Output};

/// Runs `ferry args…` to completion, with none of the environment variables a user's shell may
/// set for it (database URL, config file, alert thresholds).
pub fn ferry(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env_remove("FERRY_DATABASE_URL")
        .env_remove("FERRY_CONFIG")
        .env_remove("FERRY_OLDEST_WARNING")
        .env_remove("FERRY_OLDEST_CRITICAL")
        .output()
        .expect("run ferry")
}
