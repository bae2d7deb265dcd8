//! What the `ferry` command tests share: running the binary with no configuration inherited
//! from the environment, and reading what it printed. Each test crate uses a part of it.
#![allow(dead_code)]
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

/// Runs `ferry cmd --database-url url args…` ([`ferry`]).
pub fn ferry_on(url: &str, cmd: &str, args: &[&str]) -> Output {
    let mut all = vec![cmd, "--database-url", url];
    all.extend_from_slice(args);
    ferry(&all)
}

/// What a run printed: its stderr, then its stdout.
pub fn printed(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
}

/// The run exited with `code` and every needle is on the first line it printed: everything a
/// user needs is there (clap may add its usage footer below).
#[track_caller]
pub fn assert_one_clear_line(o: &Output, code: i32, needles: &[&str]) {
    let text = printed(o);
    assert_eq!(o.status.code(), Some(code), "exit code for: {text}");
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    for n in needles {
        assert!(
            first.contains(n),
            "expected {n:?} on the first line of: {text}"
        );
    }
}

/// The run succeeded (exit 0) and printed every needle.
#[track_caller]
pub fn assert_ok(o: &Output, needles: &[&str]) {
    let text = printed(o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    for n in needles {
        assert!(text.contains(n), "expected {n:?} in: {text}");
    }
}
